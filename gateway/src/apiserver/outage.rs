//! An apiserver outage told once: what the gateway logs while its writes fail.
//!
//! When the apiserver stops taking Lease writes (429, 5xx, no answer: the troubles that
//! close the Lease calls' backoff gate, see [`crate::apiserver`]; trouble with status
//! patches alone, a failing webhook, is no outage of heartbeats and each failure is told on
//! its own), every node's renewal fails on every try: 10,000
//! nodes would write thousands of lines a second, each saying the same thing. So an outage
//! is told in three kinds of line ([`OutageLog`], I/O-free; the caller passes tokio's time,
//! so tests pause it, and writes the line):
//!
//! - **one ERROR** at the first trouble, naming the apiserver and the error;
//! - **a summary** (WARN) at most every [`SUMMARY_EVERY`] while it lasts, on the next
//!   renewal that fails: renewals not written and nodes affected since the outage began,
//!   and the oldest Lease age among them (how close they are to `nodeLeaseDurationSeconds`
//!   and the node lifecycle controller's grace period);
//! - **one INFO** when writes succeed again, with the outage's length and totals.
//!
//! A node's own failure is then a DEBUG line; outside an outage (a 403, a 422: the node's
//! problem, not the apiserver's) it stays a WARN of its own.
//!
//! Memory: one name per node affected, for as long as the outage lasts (the nodes a
//! replica holds, at most `--max-nodes`).

use std::collections::HashSet;
use std::time::Duration;

use jiff::SignedDuration;
use tokio::time::Instant;

/// Longest time between two summary lines of one outage.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(30);

/// The outage being told, if any (see the module docs).
#[derive(Debug, Default)]
pub struct OutageLog {
    outage: Option<Outage>,
}

#[derive(Debug)]
struct Outage {
    began: Instant,
    last_line: Instant,
    renewals_failed: u64,
    nodes: HashSet<Box<str>>,
    oldest_lease: Option<SignedDuration>,
}

/// A line to write about the outage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutageLine {
    /// The outage began (ERROR).
    Began,
    /// It goes on (WARN).
    Summary(Totals),
    /// Writes succeed again (INFO).
    Ended(Totals),
}

/// What an outage cost so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Totals {
    /// Since it began.
    pub lasted: Duration,
    /// Lease renewals not written.
    pub renewals_failed: u64,
    /// Nodes whose renewals were not written.
    pub nodes: usize,
    /// The oldest age of those nodes' Leases (their last written `renewTime`) seen when a
    /// renewal failed; `None` when none was known.
    pub oldest_lease: Option<SignedDuration>,
}

impl OutageLog {
    /// Whether an outage is going on.
    pub fn ongoing(&self) -> bool {
        self.outage.is_some()
    }

    /// The apiserver was in trouble at `now`: [`OutageLine::Began`] for the first trouble
    /// of an outage, nothing while one goes on.
    pub fn trouble(&mut self, now: Instant) -> Option<OutageLine> {
        if self.outage.is_some() {
            return None;
        }
        self.outage = Some(Outage {
            began: now,
            last_line: now,
            renewals_failed: 0,
            nodes: HashSet::new(),
            oldest_lease: None,
        });
        Some(OutageLine::Began)
    }

    /// `node`'s renewal was not written at `now`, its Lease last renewed `lease_age` ago
    /// (when known): `None` outside an outage (the caller tells it on its own), else
    /// `Some` with a [`OutageLine::Summary`] when the last line is [`SUMMARY_EVERY`] old,
    /// or `Some(None)` for a failure the outage's lines stand for.
    pub fn renewal_failed(
        &mut self,
        node: &str,
        lease_age: Option<SignedDuration>,
        now: Instant,
    ) -> Option<Option<OutageLine>> {
        let outage = self.outage.as_mut()?;
        outage.renewals_failed += 1;
        if !outage.nodes.contains(node) {
            outage.nodes.insert(node.into());
        }
        if let Some(age) = lease_age {
            outage.oldest_lease = Some(outage.oldest_lease.map_or(age, |o| o.max(age)));
        }
        if now.duration_since(outage.last_line) < SUMMARY_EVERY {
            return Some(None);
        }
        outage.last_line = now;
        Some(Some(OutageLine::Summary(outage.totals(now))))
    }

    /// Writes succeed again at `now`: [`OutageLine::Ended`] once, ending the outage.
    pub fn recovered(&mut self, now: Instant) -> Option<OutageLine> {
        let outage = self.outage.take()?;
        Some(OutageLine::Ended(outage.totals(now)))
    }
}

impl Outage {
    fn totals(&self, now: Instant) -> Totals {
        Totals {
            lasted: now.duration_since(self.began),
            renewals_failed: self.renewals_failed,
            nodes: self.nodes.len(),
            oldest_lease: self.oldest_lease,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_outage_is_one_error_then_a_summary_every_30_s_then_one_info() {
        let mut log = OutageLog::default();
        let t0 = Instant::now();
        // Outside an outage a node's failure is its own.
        assert_eq!(log.renewal_failed("edge-1", None, t0), None);
        assert_eq!(log.recovered(t0), None);

        assert_eq!(log.trouble(t0), Some(OutageLine::Began));
        assert_eq!(log.trouble(t0 + Duration::from_secs(1)), None);
        // 10,000 nodes failing every 10 s for 60 s: 60,000 failures, two summaries.
        let mut lines = Vec::new();
        for tick in 0..60u64 {
            for node in 0..1000 {
                let age = SignedDuration::from_secs(i64::try_from(tick).unwrap_or(0) + 1);
                let name = format!("edge-{}", (tick % 10) * 1000 + node);
                let now = t0 + Duration::from_secs(tick);
                if let Some(Some(line)) = log.renewal_failed(&name, Some(age), now) {
                    lines.push((tick, line));
                }
            }
        }
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(
            lines[0],
            (
                30,
                OutageLine::Summary(Totals {
                    lasted: Duration::from_secs(30),
                    renewals_failed: 30_001,
                    nodes: 10_000,
                    oldest_lease: Some(SignedDuration::from_secs(31)),
                })
            )
        );
        assert_eq!(
            log.recovered(t0 + Duration::from_secs(61)),
            Some(OutageLine::Ended(Totals {
                lasted: Duration::from_secs(61),
                renewals_failed: 60_000,
                nodes: 10_000,
                oldest_lease: Some(SignedDuration::from_secs(60)),
            }))
        );
        assert!(!log.ongoing());
        assert_eq!(log.recovered(t0 + Duration::from_secs(62)), None);
        // The next outage is news again.
        assert_eq!(
            log.trouble(t0 + Duration::from_secs(90)),
            Some(OutageLine::Began)
        );
    }
}
