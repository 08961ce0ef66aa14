//! The enrollment metrics: requests by proof and outcome, and the CSRs answered pending.

use edgebeat_transports::observe::register_family;
use parking_lot::Mutex;
use std::collections::HashSet;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::Enrollment;

/// Labels of `edgebeat_gateway_certificate_requests_total`: `proof` and `outcome`.
type OutcomeLabels = [(&'static str, &'static str); 2];

/// Counters of requests by proof and outcome, and the CSRs waiting, for `/metrics` (see
/// [`EnrollmentCounters::register`]).
#[derive(Debug, Default)]
pub struct EnrollmentCounters {
    by_outcome: Family<OutcomeLabels, Counter>,
    /// Names of CSRs answered pending and not issued since.
    pending: Mutex<HashSet<String>>,
    pending_gauge: Gauge,
    /// Which rejected requests are also logged (every one is counted).
    pub(super) rejection_log: edgebeat_transports::log_limit::LogLimiter,
}

impl EnrollmentCounters {
    /// Counts one request proved by `proof` (`token`, `certificate`, `unknown`) that came
    /// to `outcome` (`issued`, `pending`, or a [`CsrRejectReason`](super::CsrRejectReason)'s label).
    pub fn count(&self, proof: &'static str, outcome: &'static str) {
        self.by_outcome
            .get_or_create(&[("proof", proof), ("outcome", outcome)])
            .inc();
    }

    /// Requests counted for `proof` and `outcome`.
    pub fn get(&self, proof: &'static str, outcome: &'static str) -> u64 {
        self.by_outcome
            .get_or_create(&[("proof", proof), ("outcome", outcome)])
            .get()
    }

    /// CSRs this replica answered pending that it has not seen issued since.
    pub fn pending(&self) -> usize {
        self.pending.lock().len()
    }

    /// Registers `edgebeat_gateway_certificate_requests_total{proof, outcome}` and
    /// `edgebeat_gateway_certificate_signing_requests_pending` in `registry`.
    #[rustfmt::skip]
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        register_family(registry, "edgebeat_gateway_certificate_requests", "Node certificate requests (enrollments proved by a bootstrap token, rotations proved by a certificate) by outcome: issued, pending or the reason rejected", None, self.by_outcome.clone());
        register_family(registry, "edgebeat_gateway_certificate_signing_requests_pending", "CertificateSigningRequests this replica answered pending (waiting for kubectl certificate approve or their signer) and has not seen issued since", None, self.pending_gauge.clone());
    }
}

impl Enrollment {
    pub(super) fn pending(&self, name: &str, pending: bool) {
        let mut set = self.counters.pending.lock();
        if pending {
            set.insert(name.to_owned());
        } else {
            set.remove(name);
        }
        self.counters
            .pending_gauge
            .set(i64::try_from(set.len()).unwrap_or(i64::MAX));
    }
}
