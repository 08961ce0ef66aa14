//! What `/metrics` encodes ([`Exposition`]), in which content type, and one call to
//! register a family ([`register_family`]).

use std::sync::OnceLock;

use prometheus_client::registry::{Metric, Registry, Unit};

/// Registers `metric` in `registry` as the family `name` with `help`, in `unit` when one is
/// given (prometheus-client then appends `_<unit>` to the name, and `_total` to a counter's).
/// One call for [`Registry::register`] and [`Registry::register_with_unit`], so that a
/// binary's families read as a table, one a line.
pub fn register_family(
    registry: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    metric: impl Metric,
) {
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, metric),
        None => registry.register(name, help, metric),
    }
}

/// Content type of `/metrics`: prometheus-client writes the OpenMetrics 1.0 text format
/// (which Prometheus asks for first and parses natively).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `/metrics` encodes: a [`Registry`], or a [`OnceLock`] of one for a process that
/// answers probes before its metrics exist (`/metrics` answers `503` until it is set).
pub trait Exposition: Send + Sync + 'static {
    /// The registry to encode, if there is one yet.
    fn registry(&self) -> Option<&Registry>;
}

impl Exposition for Registry {
    fn registry(&self) -> Option<&Registry> {
        Some(self)
    }
}

impl Exposition for OnceLock<Registry> {
    fn registry(&self) -> Option<&Registry> {
        self.get()
    }
}
