//! The agent's two loops, as kubelet runs them: the status loop (`syncNodeStatus`) and the
//! Lease loop (the lease controller). Each is a free `async fn` of exactly what it reads
//! ([`StatusLoop`], [`LeaseLoop`]), wired in one place, [`Agent::run`]; both send through
//! the one send-with-retry of [`Sender`].

use super::{ATTEMPTS_PER_TICK, NODE_NOT_FOUND, ack_timeout, jittered};
use crate::config::AgentConfig;
use crate::header::HeaderFactory;
use crate::metrics::{AgentMetrics, MessageKind};
use crate::status::{ComputedStatus, Journal, compute, has_changed};
use crate::systemd::Liveness;
use edgebeat_hw::{Clock, HostRoot, ReadOptions, read_host_facts};
use edgebeat_proto as pb;
use edgebeat_proto::agent_message::Kind;
use edgebeat_transports::backoff::{RETRY_MAX, RETRY_MIN};
use edgebeat_transports::uplink::{Uplink, UplinkError, reconnect_backoff};
use parking_lot::Mutex;
use prost::Message as _;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What every message goes out through: the uplink, the headers it carries, and the
/// metrics that count its bytes and outcomes. Shared by both loops (one header sequence).
#[derive(Clone, Copy)]
pub(super) struct Sender<'a> {
    pub(super) uplink: &'a Uplink,
    pub(super) headers: &'a HeaderFactory,
    pub(super) metrics: &'a AgentMetrics,
}

/// What the status loop reads: the configuration (periods, thresholds, the answer
/// timeout), the host, the boot clock, and the latest computed status it keeps for
/// `Register` and `/view`.
pub(super) struct StatusLoop<'a> {
    pub(super) config: &'a AgentConfig,
    pub(super) root: &'a HostRoot,
    pub(super) options: &'a ReadOptions,
    pub(super) clock: &'a dyn Clock,
    pub(super) latest: &'a Mutex<ComputedStatus>,
    /// Transitions not yet written: carried by every full report (and `Register`) until
    /// one is.
    pub(super) journal: &'a Mutex<Journal>,
    pub(super) send: Sender<'a>,
}

/// What the Lease loop reads: `nodeLeaseDurationSeconds` and the renew interval
/// ([`AgentConfig::lease_renew_interval`]), the clock its metrics stamp, and the liveness
/// it reports to the systemd watchdog.
pub(super) struct LeaseLoop<'a> {
    pub(super) lease_duration_seconds: u32,
    /// The host whose resource usage rides on every second renewal.
    pub(super) root: &'a HostRoot,
    pub(super) renew_interval: Duration,
    pub(super) clock: &'a dyn Clock,
    pub(super) liveness: &'a Liveness,
    pub(super) send: Sender<'a>,
}

/// Status loop (kubelet `syncNodeStatus` every `nodeStatusUpdateFrequency`): compute, then
/// report when registered and (never reported | changed | report period elapsed | the
/// gateway asked), the report period counted from when the last report was sent and drawn
/// as [`next_report_period`] says. Up to [`ATTEMPTS_PER_TICK`] attempts per report. When only the period is
/// due, the report says `unchanged` instead of carrying the whole status (the gateway
/// refreshes the heartbeat times, or asks for the whole status when its copy differs); its
/// answer-less wait counts towards the next computation. Returns when `cancel` fires.
pub(super) async fn status_loop(s: StatusLoop<'_>, cancel: CancellationToken) {
    let uplink = s.send.uplink;
    let mut registered = uplink.registered();
    let mut last_reported: Option<ComputedStatus> = None;
    let mut last_report_at: Option<Instant> = None;
    let frequency = s.config.node_status_report_frequency;
    let mut report_period = frequency;
    let mut requests = uplink.status_requests();
    let mut served_request = *requests.borrow_and_update();
    let mut watch_registration = true;
    let mut watch_requests = true;
    let journal = || s.journal.lock();
    loop {
        let mut waited = Duration::ZERO;
        let (root, options) = (s.root.clone(), s.options.clone());
        match tokio::task::spawn_blocking(move || read_host_facts(&root, &options)).await {
            Ok(Ok(facts)) => {
                let previous = latest(s.latest);
                let now = s.clock.boottime();
                let next = compute(&facts, s.config, Some(&previous), now);
                journal().observe(&previous, &next, now);
                s.send
                    .metrics
                    .observe_health(&facts, next.condition_states());
                *s.latest.lock() = next;
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "reading host facts failed; keeping the last status")
            }
            Err(error) => tracing::warn!(%error, "host facts task failed"),
        }
        if *registered.borrow() {
            let latest = latest(s.latest);
            let pending = journal().clone();
            let request = *requests.borrow_and_update();
            // Only the period is due: the gateway has this very status (and every
            // transition: a flap while the link was down still goes out whole).
            let unchanged = request == served_request
                && pending.is_empty()
                && last_reported
                    .as_ref()
                    .is_some_and(|l| !has_changed(l, &latest));
            let due = !unchanged || last_report_at.is_none_or(|t| t.elapsed() >= report_period);
            let started = Instant::now();
            let reported = due && report(&s, &latest, unchanged, &pending).await;
            if due && unchanged {
                waited = started.elapsed();
            }
            if reported {
                if !unchanged {
                    last_reported = Some(latest);
                    journal().written(pending.len());
                }
                // When it was sent, as kubelet's `lastStatusReportTime` (set as its PATCH
                // returns, milliseconds after): an unchanged report's silence is waited
                // after sending, and counting from its end would push the next report a
                // whole period later whenever the report frequency equals the update one.
                last_report_at = Some(started);
                report_period = next_report_period(frequency, !unchanged);
                served_request = request;
            }
        }
        // An unchanged report's silence was part of the wait.
        let delay = jittered(s.config.node_status_update_frequency).saturating_sub(waited);
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
            changed = requests.changed(), if watch_requests => {
                if changed.is_err() { watch_requests = false; }
            }
            changed = registered.changed(), if watch_registration => {
                if changed.is_err() { watch_registration = false; }
            }
        }
    }
}

/// How long after a report the next periodic one is due (kubelet
/// `pkg/kubelet/kubelet_node_status.go: isUpdateStatusPeriodExpired`, since v1.34): after a
/// report of a change (or the first), `frequency` plus a one-time delay drawn from
/// [−frequency/2, +frequency/2) (`calculateDelay`), so nodes that changed together (a site's
/// link back, a fleet restarted) do not report together again; after a periodic report,
/// `frequency` itself.
pub(super) fn next_report_period(frequency: Duration, changed: bool) -> Duration {
    if changed {
        frequency.mul_f64(0.5 + fastrand::f64())
    } else {
        frequency
    }
}

/// The status `latest` holds.
pub(super) fn latest(latest: &Mutex<ComputedStatus>) -> ComputedStatus {
    latest.lock().clone()
}

/// Counts registrations and lost registrations (`registered` turning true / false) in
/// `metrics` until `cancel` fires; see [`crate::metrics`] for what that does and does not
/// see.
pub(super) async fn count_registrations(
    metrics: &AgentMetrics,
    mut registered: watch::Receiver<bool>,
    cancel: &CancellationToken,
) {
    // The channel starts false: a registration that happened before this first look still
    // counts.
    let mut last = false;
    loop {
        let now = *registered.borrow_and_update();
        if now != last {
            metrics.registration_changed(now);
            last = now;
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = registered.changed() => if changed.is_err() { return },
        }
    }
}

/// One status report: the whole status, or with `unchanged` the periodic report of a
/// status the gateway already has (`StatusReport.unchanged`, answered only with news).
/// A full report carries `journal`, the transitions not yet written, timed at each attempt.
/// Returns whether it was written (counted in `edgebeat_agent_status_reports_total`).
pub(super) async fn report(
    s: &StatusLoop<'_>,
    status: &ComputedStatus,
    unchanged: bool,
    journal: &Journal,
) -> bool {
    let ok = try_report(s, status, unchanged, journal).await;
    s.send.metrics.status_report(ok);
    ok
}

async fn try_report(
    s: &StatusLoop<'_>,
    status: &ComputedStatus,
    unchanged: bool,
    journal: &Journal,
) -> bool {
    let message = |_: &()| {
        let now = s.clock.boottime();
        let report = pb::AgentMessage {
            kind: Some(Kind::Status(pb::StatusReport {
                header: Some(s.send.headers.next()),
                status: (!unchanged).then(|| status.to_proto(now)),
                unchanged,
                journal: if unchanged {
                    Vec::new()
                } else {
                    journal.to_proto(now)
                },
            })),
        };
        (report, ack_timeout(s.config))
    };
    let settle = |_: &mut (), answer: &Result<pb::Answer, UplinkError>| match answer {
        // Silence: written.
        Err(UplinkError::Timeout(_)) if unchanged => Some(true),
        // The gateway wants the whole status: the loop sends it at once (the request
        // raised `status_requests`).
        Ok(pb::Answer::ResendStatus { .. }) if unchanged => Some(false),
        _ => None,
    };
    send_with_retry(s.send, &STATUS_ATTEMPTS, &mut (), message, settle, true)
        .await
        .unwrap_or(false)
}

/// Sends a message up to [`ATTEMPTS_PER_TICK`] times, as kubelet's status update and lease
/// controller each retry within one tick. Every attempt is a new message with a fresh
/// `Header.seq` and how long to wait for its answer (`message(state)`); the bytes of every
/// message the transport took are counted under `attempts.kind`. `settle` reads each
/// answer first, may update `state` for the next attempt (the echoed Lease state), and may
/// end the tick with its own value (a quiet message's silence, a request for the whole
/// status). Otherwise `OK` ends it with `ok`, `RETRY` tries again, and anything else
/// (rejected, Node gone, a transport error) ends it with `None`, as does the last failed
/// attempt.
pub(super) async fn send_with_retry<S, T>(
    send: Sender<'_>,
    attempts: &Attempts,
    state: &mut S,
    message: impl Fn(&S) -> (pb::AgentMessage, Duration),
    settle: impl Fn(&mut S, &Result<pb::Answer, UplinkError>) -> Option<T>,
    ok: T,
) -> Option<T> {
    for attempt in 0..ATTEMPTS_PER_TICK {
        let (message, wait) = message(state);
        let bytes = message.encoded_len();
        let answer = send.uplink.send(message, wait).await;
        if taken(&answer) {
            send.metrics.bytes_sent(attempts.kind, bytes);
        }
        if let Some(settled) = settle(state, &answer) {
            return Some(settled);
        }
        match outcome(answer) {
            Outcome::Ok => return Some(ok),
            Outcome::Retry(why) => {
                tracing::debug!(attempt, %why, "{} not written; retrying", attempts.what)
            }
            Outcome::GiveUp(why) => {
                tracing::warn!(%why, "{} failed", attempts.what);
                return None;
            }
            // The agent is shutting down: nothing went wrong.
            Outcome::Stopped => {
                tracing::debug!("{} not sent: the uplink stopped", attempts.what);
                return None;
            }
        }
    }
    tracing::warn!("{}", attempts.exhausted);
    None
}

/// Lease loop (kubelet's lease controller): once registered, renew every
/// `nodeLeaseDurationSeconds` × 0.25 with jitter 0.04; up to [`ATTEMPTS_PER_TICK`] attempts
/// per tick; after a failed tick retry with backoff from 200 ms doubling to 7 s, or as soon
/// as the transport makes a connection ([`Uplink::connections`]). Returns when `cancel`
/// fires.
///
/// Renewals are quiet (`LeaseRenewal.quiet`): the gateway answers only when one was not
/// written, so each attempt waits for an answer until the next renewal is due, and silence
/// means written. A gateway that answers anyway (an older one) is waited for as before.
pub(super) async fn lease_loop(l: LeaseLoop<'_>, cancel: CancellationToken) {
    let uplink = l.send.uplink;
    let mut registered = uplink.registered();
    let mut connections = uplink.connections();
    let mut backoff = None;
    let mut lease_state = Vec::new();
    let mut ticks: u64 = 0;
    loop {
        // Lease only after the Node exists (its ownerReference needs the Node).
        if !*registered.borrow_and_update() {
            l.liveness.waiting(true);
            while !*registered.borrow_and_update() {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    changed = registered.changed() => if changed.is_err() { return },
                }
            }
            l.liveness.waiting(false);
        }
        connections.borrow_and_update();
        // The resource usage on every second tick, the first included.
        let with_usage = ticks.is_multiple_of(USAGE_EVERY_NTH_RENEWAL);
        ticks = ticks.wrapping_add(1);
        let delay = if let Some(waited) = renew(&l, &mut lease_state, with_usage).await {
            backoff = None;
            // A quiet renewal's silence was already the wait.
            if waited {
                Duration::ZERO
            } else {
                jittered(l.renew_interval)
            }
        } else {
            backoff
                .get_or_insert_with(|| reconnect_backoff(RETRY_MIN, RETRY_MAX))
                .next()
                .unwrap_or(RETRY_MAX)
        };
        // After a failed tick, a connection coming up ends the backoff: the link is back,
        // and the Lease has gone unrenewed since the failure.
        let failing = backoff.is_some();
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
            Ok(()) = connections.changed(), if failing => {}
        }
    }
}

/// Renewals that carry the node's resource usage: one in this many (every 20 s at kubelet's
/// 10 s renew interval). metrics-server's rate needs two samples of different times, and at
/// 12 B a sample, every second renewal costs about 52 KB a node-day (BENCHMARKS.md
/// "kubectl top node").
const USAGE_EVERY_NTH_RENEWAL: u64 = 2;

/// The node's resource usage now, for a renewal; `None` when the host says nothing.
fn resource_usage(root: &HostRoot) -> Option<pb::ResourceUsage> {
    let usage = edgebeat_hw::read_resource_usage(root);
    if usage == edgebeat_hw::ResourceUsage::default() {
        return None;
    }
    Some(pb::ResourceUsage {
        cpu_usage_ms: usage.cpu_usage_ms.unwrap_or(0),
        memory_working_set_kib: usage.memory_working_set_bytes.unwrap_or(0) / 1024,
    })
}

/// One renewal tick: `Some(waited)` when written — `waited` when that was learnt from the
/// gateway's silence until the next renewal was due — `None` when every attempt failed.
/// `lease_state` is the gateway's opaque Lease state from the last answered renewal (only
/// an older gateway answers written quiet renewals), echoed so any gateway replica can PUT
/// without a GET.
/// With `with_usage`, each attempt carries the node's resource usage read as it is sent.
pub(super) async fn renew(
    l: &LeaseLoop<'_>,
    lease_state: &mut Vec<u8>,
    with_usage: bool,
) -> Option<bool> {
    let written = try_renew(l, lease_state, with_usage).await;
    l.liveness.progress();
    l.send
        .metrics
        .lease_renewal(written.is_some(), l.clock.now());
    written
}

async fn try_renew(l: &LeaseLoop<'_>, lease_state: &mut Vec<u8>, with_usage: bool) -> Option<bool> {
    // Each attempt echoes the newest Lease state, which an answer may have replaced.
    let message = |state: &Vec<u8>| {
        let renewal = pb::AgentMessage {
            kind: Some(Kind::Lease(pb::LeaseRenewal {
                header: Some(l.send.headers.next()),
                lease_duration_seconds: i32::try_from(l.lease_duration_seconds).unwrap_or(i32::MAX),
                lease_state: state.clone(),
                quiet: true,
                usage: with_usage.then(|| resource_usage(l.root)).flatten(),
            })),
        };
        // Silence until the next renewal is due means written.
        (renewal, jittered(l.renew_interval))
    };
    let settle = |state: &mut Vec<u8>, answer: &Result<pb::Answer, UplinkError>| {
        // Silence until the next renewal was due: written.
        if matches!(answer, Err(UplinkError::Timeout(_))) {
            return Some(true);
        }
        if let Ok(pb::Answer::Renewed { lease_state, .. }) = answer {
            state.clone_from(lease_state);
        }
        None
    };
    send_with_retry(l.send, &LEASE_ATTEMPTS, lease_state, message, settle, false).await
}

/// How [`send_with_retry`] counts and logs the attempts of one kind of message.
pub(super) struct Attempts {
    /// Under which kind its bytes are counted.
    kind: MessageKind,
    /// Its name in the logs ("status report", "lease renewal").
    what: &'static str,
    /// What is logged when every attempt failed: kubelet's own words for each.
    exhausted: &'static str,
}

/// Status reports: kubelet's `updateNodeStatus` words when every attempt failed
/// (`pkg/kubelet/kubelet_node_status.go`).
const STATUS_ATTEMPTS: Attempts = Attempts {
    kind: MessageKind::Status,
    what: "status report",
    exhausted: "update node status exceeds retry count",
};

/// Lease renewals: the lease controller's words when every attempt failed
/// (`staging/src/k8s.io/component-helpers/apimachinery/lease/controller.go`).
const LEASE_ATTEMPTS: Attempts = Attempts {
    kind: MessageKind::Lease,
    what: "lease renewal",
    exhausted: "failed 5 attempts to update lease",
};
// The lease controller's message names the count.
const _: () = assert!(ATTEMPTS_PER_TICK == 5);

/// Whether the transport took the message (it was answered, timed out, or lost with its
/// connection), as opposed to refusing it unsent.
pub(super) fn taken(answer: &Result<pb::Answer, UplinkError>) -> bool {
    !matches!(answer, Err(UplinkError::NotConnected | UplinkError::Closed))
}

pub(super) enum Outcome {
    Ok,
    Retry(String),
    GiveUp(String),
    /// The transport task ended ([`UplinkError::Closed`]): a clean shutdown, not a failure.
    Stopped,
}

pub(super) fn outcome(result: Result<pb::Answer, UplinkError>) -> Outcome {
    match result {
        // The agent stops sending (see `stop_when_node_not_found`).
        Ok(pb::Answer::NodeNotFound { .. }) => Outcome::GiveUp(NODE_NOT_FOUND.into()),
        Ok(pb::Answer::Rejected { reason }) => {
            Outcome::GiveUp(format!("rejected by the gateway: {reason}"))
        }
        Ok(
            pb::Answer::Retry { reason }
            | pb::Answer::ResendStatus { reason }
            | pb::Answer::SendBootId { reason }
            | pb::Answer::SendCertificate { reason },
        ) => Outcome::Retry(reason),
        Ok(
            pb::Answer::Written { .. } | pb::Answer::Registered { .. } | pb::Answer::Renewed { .. },
        ) => Outcome::Ok,
        // Timeouts, lost connections and contradictory answers are retried within the tick
        // (kubelet retries immediately); with no connection at all there is nothing to
        // retry on.
        Err(e @ (UplinkError::Timeout(_) | UplinkError::Disconnected | UplinkError::BadAck(_))) => {
            Outcome::Retry(e.to_string())
        }
        Err(UplinkError::Closed) => Outcome::Stopped,
        Err(e) => Outcome::GiveUp(e.to_string()),
    }
}
