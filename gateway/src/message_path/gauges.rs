//! What a [`Gateway`] exports on `/metrics` ([`crate::metrics`]): its counters, the
//! replica's gauges read at scrape time, and the per-node families.

use std::sync::Arc;

use prometheus_client::registry::Registry;

use super::Gateway;
use crate::admission::Posture;
use crate::metrics::ReplicaGauges;

impl Gateway {
    /// Registers the gateway's metrics (see [`crate::metrics`]) in `registry`: the
    /// [`Counters`], the gauges read at scrape time (`tracked_nodes` and the settings,
    /// through a collector holding a weak reference: a dropped gateway reports nothing),
    /// and the per-node families.
    pub fn register_metrics(self: &Arc<Self>, registry: &mut Registry) {
        let gateway = Arc::downgrade(self);
        crate::metrics::register(
            registry,
            &self.counters,
            self.options
                .per_node_metrics
                .then_some(&self.writer.node_metrics),
            move || gateway.upgrade().map(|g| g.replica_gauges()),
        );
        if let Some(enrollment) = self.enrollment.get() {
            enrollment.counters.register(registry);
        }
    }

    /// What the scrape-time gauges read now.
    pub(super) fn replica_gauges(&self) -> ReplicaGauges {
        ReplicaGauges {
            tracked_nodes: self.tracked_nodes(),
            max_nodes: self.options.max_nodes,
            backing_off: self.writer.api.backing_off(),
            unidentified_allowed: self.options.posture == Posture::AllowUnidentified,
            per_node_metrics: self.options.per_node_metrics,
            sites: crate::sites::figures(&self.sites),
            sites_held: self.sites.lock().is_held(),
            mqtt_sessions_taken_over: self
                .mqtt_sessions_taken_over
                .load(std::sync::atomic::Ordering::Relaxed),
            certificate_lifetime: self.enrollment.get().map(|e| e.lifetime()),
            fleet: self
                .writer
                .view
                .fleet_summary(self.clock.unix_now().timestamp()),
        }
    }

    /// Number of nodes the gateway currently keeps state for.
    pub fn tracked_nodes(&self) -> usize {
        self.slots.lock().len()
    }
}
