//! What keeps certificate requests from crowding out heartbeats: a token bucket per source
//! (a gRPC client's IP address, an MQTT topic's node name) and one for all, and a bound on
//! requests in flight. The enrollment listener needs no client certificate, so anyone who
//! reaches it can send requests; each costs a signature check and up to a few apiserver
//! calls, and the gate rejects (without an answer: the agent asks again with backoff) what
//! goes over the limits before any of that.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use tokio::time::Instant;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::restriction::TokenBucket;

/// Limits of the [`EnrollmentGate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EnrollmentLimits {
    /// Requests per second one source may send on average (default 5: a site behind one
    /// NAT address enrolls a few boards a second; a board asks at most every 2 s).
    pub per_source_rate: f64,
    /// Requests one source may send at once (default 20).
    pub per_source_burst: f64,
    /// Requests per second for all sources together (default 100).
    pub rate: f64,
    /// Requests at once for all sources together (default 500).
    pub burst: f64,
    /// Requests handled at once (default 64); more wait for none, they are rejected.
    pub max_in_flight: usize,
}

impl Default for EnrollmentLimits {
    fn default() -> Self {
        Self {
            per_source_rate: 5.0,
            per_source_burst: 20.0,
            rate: 100.0,
            burst: 500.0,
            max_in_flight: 64,
        }
    }
}

/// Where a request came from, for its bucket.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// A gRPC client's IP address.
    Address(IpAddr),
    /// An MQTT request's node (its topic; the broker is every request's socket peer).
    Node(String),
    /// Nothing to tell sources apart by.
    Unknown,
}

/// Most sources remembered at once; past it the map is cleared (a flood from many
/// addresses then meets the total limit alone, which still holds).
const MAX_SOURCES: usize = 65_536;

/// The gate (see the module docs).
#[derive(Debug)]
pub struct EnrollmentGate {
    limits: EnrollmentLimits,
    sources: Mutex<HashMap<Source, TokenBucket>>,
    total: Mutex<TokenBucket>,
    in_flight: Semaphore,
}

impl EnrollmentGate {
    /// A gate with `limits`.
    pub fn new(limits: EnrollmentLimits) -> Self {
        Self {
            limits,
            sources: Mutex::default(),
            total: Mutex::default(),
            in_flight: Semaphore::new(limits.max_in_flight.max(1)),
        }
    }

    /// Lets one request from `source` through at `now`: a permit held while it is
    /// handled, or `None` when a limit rejects it.
    pub fn admit(&self, source: Source, now: Instant) -> Option<SemaphorePermit<'_>> {
        let l = self.limits;
        // The slot first, so a request rejected for it uses up no tokens.
        let permit = self.in_flight.try_acquire().ok()?;
        {
            let mut sources = self.sources.lock();
            if sources.len() >= MAX_SOURCES && !sources.contains_key(&source) {
                sources.clear();
            }
            if !sources
                .entry(source)
                .or_default()
                .take(now, l.per_source_rate, l.per_source_burst)
            {
                return None;
            }
        }
        if !self.total.lock().take(now, l.rate, l.burst) {
            return None;
        }
        Some(permit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_source_over_its_burst_is_rejected_and_others_go_on() {
        let gate = EnrollmentGate::new(EnrollmentLimits {
            per_source_burst: 3.0,
            ..EnrollmentLimits::default()
        });
        let now = Instant::now();
        let flood = Source::Address([10, 0, 0, 1].into());
        let admitted = (0..10)
            .filter(|_| gate.admit(flood.clone(), now).is_some())
            .count();
        assert_eq!(admitted, 3);
        assert!(gate.admit(Source::Node("edge-02".into()), now).is_some());
        let later = now + std::time::Duration::from_secs(1);
        assert!(gate.admit(flood, later).is_some(), "refilled at its rate");
    }

    #[test]
    fn the_total_and_the_requests_in_flight_bound_everyone() {
        let gate = EnrollmentGate::new(EnrollmentLimits {
            burst: 5.0,
            max_in_flight: 2,
            ..EnrollmentLimits::default()
        });
        let now = Instant::now();
        let held: Vec<_> = (0..5u8)
            .filter_map(|i| gate.admit(Source::Address([10, 0, 0, i].into()), now))
            .collect();
        assert_eq!(held.len(), 2, "two in flight at once");
        drop(held);
        let more = (5..20u8)
            .filter_map(|i| gate.admit(Source::Address([10, 0, 0, i].into()), now))
            .count();
        assert_eq!(more, 3, "five in all within the burst");
    }
}
