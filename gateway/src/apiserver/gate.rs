//! The apiserver's call slots and backoff gates (see the [`apiserver`](super) module docs):
//! which calls may go ([`Priority`], [`Ticket`]), how an outcome moves a gate ([`Gate`],
//! [`trouble`]), and the recording of each call's outcome ([`Recording`]).

use parking_lot::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::Apiserver;

/// First and largest wait of the backoff gate (see the module docs).
pub(super) const GATE_BACKOFF_MIN: Duration = Duration::from_millis(200);
pub(super) const GATE_BACKOFF_MAX: Duration = Duration::from_secs(4);

/// How many apiserver calls the gateway makes at once.
#[derive(Debug, Clone, Copy)]
pub struct WriteLimits {
    /// Requests in flight at once (default 256); Node, status and Event calls may hold at
    /// most half.
    pub max_inflight: usize,
}

impl Default for WriteLimits {
    fn default() -> Self {
        Self { max_inflight: 256 }
    }
}

/// Which slots a call may take (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Priority {
    /// Lease GET, PUT, POST: every slot.
    Lease,
    /// Everything else: at most half the slots.
    Other,
}

/// The error of a call not sent because the apiserver is being backed off from: it
/// answered 429, 5xx or nothing recently, and this call is not the probe. Carried as
/// [`kube::Error::Service`].
#[derive(Debug, thiserror::Error)]
#[error("not sent: backing off from the apiserver for {0:?} more")]
pub struct BackingOff(pub Duration);

/// The backoff gate's state.
#[derive(Debug)]
pub(super) struct Gate {
    pub(super) failing: bool,
    pub(super) probing: bool,
    pub(super) retry_at: Instant,
    pub(super) backoff: Duration,
    /// When the gate last reopened after trouble.
    pub(super) reopened: Option<Instant>,
    /// When a call last met trouble.
    pub(super) last_trouble: Option<Instant>,
}

/// How a call's outcome moved its gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Moved {
    /// The first trouble closed it.
    Closed,
    /// A success reopened it.
    Reopened,
    /// Nothing new.
    Not,
}

impl Gate {
    pub(super) fn new() -> Self {
        Self {
            failing: false,
            probing: false,
            retry_at: Instant::now(),
            backoff: GATE_BACKOFF_MIN,
            reopened: None,
            last_trouble: None,
        }
    }

    /// Takes one call's outcome: `None` for an apiserver that works, `Some(retry_after)`
    /// for trouble. Only the probe's trouble (or the first trouble) moves the next try:
    /// failures of calls that were already in flight when the gate closed say nothing new.
    pub(super) fn observe(&mut self, trouble: Option<Duration>, probe: bool) -> Moved {
        match trouble {
            None => {
                let moved = if self.failing {
                    self.reopened = Some(Instant::now());
                    Moved::Reopened
                } else {
                    Moved::Not
                };
                self.failing = false;
                self.backoff = GATE_BACKOFF_MIN;
                moved
            }
            Some(_) if self.failing && !probe => {
                self.last_trouble = Some(Instant::now());
                Moved::Not
            }
            Some(retry_after) => {
                self.last_trouble = Some(Instant::now());
                let (wait, moved) = if self.failing {
                    ((self.backoff * 2).min(GATE_BACKOFF_MAX), Moved::Not)
                } else {
                    (GATE_BACKOFF_MIN, Moved::Closed)
                };
                self.backoff = wait;
                self.failing = true;
                // A Retry-After longer than GATE_BACKOFF_MAX is not honoured: a Lease not
                // renewed for 40 s is a NotReady node, and one probe costs the apiserver
                // little.
                self.retry_at = Instant::now() + wait.max(retry_after.min(GATE_BACKOFF_MAX));
                moved
            }
        }
    }
}

/// What a call may do, by its gate.
pub(super) enum Ticket<'a> {
    /// The gate is open.
    Open,
    /// The gate is closed and this call is its probe; dropping it unresolved frees the
    /// probe for another call.
    Probe(&'a Mutex<Gate>),
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if let Ticket::Probe(gate) = self {
            gate.lock().probing = false;
        }
    }
}

/// A call being recorded: records its outcome in its gate, and, for the Lease gate, tells an
/// outage's start and end ([`outage`]); a call dropped before its answer (its caller's
/// deadline passed) counts as "no answer".
pub(super) struct Recording<'a> {
    pub(super) api: &'a Apiserver,
    pub(super) priority: Priority,
    pub(super) probe: bool,
    pub(super) recorded: bool,
}

impl Recording<'_> {
    pub(super) fn record<T>(&mut self, result: &Result<T, kube::Error>) {
        self.recorded = true;
        let error = || match result {
            Err(error) => edgebeat_transports::observe::error_report(error),
            Ok(_) => String::new(),
        };
        self.api
            .observe(self.priority, trouble(result), self.probe, error);
    }
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        if !self.recorded {
            self.api
                .observe(self.priority, Some(Duration::ZERO), self.probe, || {
                    "no answer before the caller's deadline".to_owned()
                });
        }
    }
}

/// Whether `error` says the apiserver is in trouble (429, 5xx, no answer, or a call not
/// sent while backing off), not that it refused this call (a 403, a 409, a 422).
pub fn is_trouble(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        _ => true,
    }
}

/// Whether a call's result says the apiserver is in trouble: `Some(Retry-After)` for 429,
/// `Some(0)` for 5xx and for no answer; `None` for success and any other answer (a 404 or
/// 409 is an apiserver that works).
pub(super) fn trouble<T>(result: &Result<T, kube::Error>) -> Option<Duration> {
    match result {
        Err(error) if is_trouble(error) => Some(match error {
            kube::Error::Api(status) => status
                .details
                .as_ref()
                .map(|d| Duration::from_secs(u64::from(d.retry_after_seconds)))
                .unwrap_or_default(),
            _ => Duration::ZERO,
        }),
        _ => None,
    }
}
