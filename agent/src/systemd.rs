//! systemd service notifications (`sd_notify`), for a unit with `Type=notify` and,
//! optionally, `WatchdogSec=`.
//!
//! Only when `$NOTIFY_SOCKET` is set (systemd sets it for `Type=notify` and
//! `NotifyAccess=`); otherwise nothing is sent and nothing runs. Messages go out through the
//! `sd-notify` crate (a datagram on that socket); a failed send is logged, never fatal.
//!
//! Exact behaviour:
//! - `READY=1` once, as soon as the agent runs: its configuration is valid, its identity
//!   loaded and its loops started. Never "the gateway answered": a board that boots while
//!   its site is offline must still finish booting (`multi-user.target` waits for the units
//!   it wants, systemd.target(5); `systemctl is-system-running` and A/B updaters that judge
//!   a boot by it would otherwise wait forever), and a package's `systemctl start` must not
//!   hang until the gateway answers.
//! - `STATUS=` says whether the gateway has accepted the registration
//!   ([`Uplink::registered`](edgebeat_transports::uplink::Uplink::registered)):
//!   [`STATUS_REGISTERING`] or [`STATUS_REGISTERED`], sent with `READY=1` and on every
//!   change, so `systemctl status edgebeat-agent` shows it (as does `/metrics`,
//!   `edgebeat_agent_registered`).
//! - `WATCHDOG=1` every `$WATCHDOG_USEC / 2` (systemd sets `$WATCHDOG_USEC` from
//!   `WatchdogSec=`; when `$WATCHDOG_PID` names another process there are no pings),
//!   starting at `READY=1`, while the Lease loop is **making progress**: it is waiting for a
//!   registration (the transport is connecting or backing off), or it finished a renewal tick —
//!   successful or not — at most [`Liveness::bound`] ago (66 s with the defaults: the longest
//!   pause between ticks, 14 s, plus a tick whose 5 attempts all wait their longest, 5 ×
//!   10.4 s, a quiet renewal's silence of one jittered renew interval). So a
//!   hung agent (a loop stuck, the runtime thread blocked) stops pinging and systemd restarts
//!   it `WatchdogSec` after the last ping, while an agent that cannot reach the gateway,
//!   broker or apiserver keeps pinging and keeps retrying: a restart would not bring the
//!   link back, and would only hold the unit in "activating" until it did.
//! - `STOPPING=1` when the agent shuts down (SIGTERM, Ctrl-C).
//!
//! The notifier runs on the agent's runtime thread, like the loops: if that thread is
//! blocked, the pings stop too. Whether renewals *succeed* is for Kubernetes to judge (the
//! Node goes NotReady) and for `/metrics` (`edgebeat_agent_lease_renewals_total{result}`,
//! `edgebeat_agent_last_lease_renewal_timestamp_seconds`) to show.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// `STATUS=` while the gateway has not accepted the agent's registration (since start, or
/// since the connection was lost).
pub const STATUS_REGISTERING: &str =
    "registering with the gateway: not answered yet (the agent keeps trying)";
/// `STATUS=` while the gateway holds the agent's registration.
pub const STATUS_REGISTERED: &str = "registered with the gateway";

/// A notification for the service manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// `READY=1`: start-up finished (the agent runs; see the module docs).
    Ready,
    /// `STATUS=`: one of [`STATUS_REGISTERING`] and [`STATUS_REGISTERED`].
    Status(&'static str),
    /// `WATCHDOG=1`: still healthy.
    Watchdog,
    /// `STOPPING=1`: shutting down.
    Stopping,
}

/// Progress of the Lease loop, which it reports with atomic stores and the notifier reads.
#[derive(Debug)]
pub struct Liveness {
    base: Instant,
    /// Milliseconds after `base` of the last progress, plus one; 0 = none yet.
    progress_ms: AtomicU64,
    /// The loop is waiting for a registration (not stuck: the transport is connecting).
    waiting: AtomicBool,
    /// Longest time between two progress reports of a healthy loop.
    bound: Duration,
}

impl Liveness {
    /// A loop that reports progress at least every `bound` while it runs ticks.
    pub fn new(bound: Duration) -> Self {
        Self {
            base: Instant::now(),
            progress_ms: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
            bound,
        }
    }

    /// Longest silence of a loop that is not stuck.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// The loop finished a tick (or stopped waiting) now.
    pub fn progress(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.progress_ms.store(ms + 1, Ordering::Relaxed);
    }

    /// The loop starts (`true`) or stops (`false`) waiting for a registration; stopping
    /// counts as progress.
    pub fn waiting(&self, waiting: bool) {
        if !waiting {
            self.progress();
        }
        self.waiting.store(waiting, Ordering::Relaxed);
    }

    /// Whether the loop is making progress at `now`: waiting for a registration, or its last
    /// progress (or `since`, if later) at most [`Liveness::bound`] ago.
    pub fn healthy(&self, now: Instant, since: Instant) -> bool {
        if self.waiting.load(Ordering::Relaxed) {
            return true;
        }
        let last = match self.progress_ms.load(Ordering::Relaxed) {
            0 => since,
            ms => (self.base + Duration::from_millis(ms - 1)).max(since),
        };
        now.saturating_duration_since(last) <= self.bound
    }
}

/// Where notifications go, read from the environment once at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Systemd {
    /// Half of `$WATCHDOG_USEC` when the watchdog is on for this process.
    pub watchdog_period: Option<Duration>,
}

impl Systemd {
    /// `Some` when `$NOTIFY_SOCKET` is set (the agent runs under systemd with
    /// `Type=notify`), with the watchdog period from `$WATCHDOG_USEC`/`$WATCHDOG_PID`.
    pub fn from_env() -> Option<Self> {
        std::env::var_os("NOTIFY_SOCKET")?;
        let watchdog_period = sd_notify::watchdog_enabled()
            .filter(|d| !d.is_zero())
            .map(|d| d / 2);
        Some(Self { watchdog_period })
    }

    /// Sends `notice` to `$NOTIFY_SOCKET`.
    pub fn send(notice: Notice) {
        use sd_notify::NotifyState;
        let state = match notice {
            Notice::Ready => NotifyState::Ready,
            Notice::Status(status) => NotifyState::Status(status),
            Notice::Watchdog => NotifyState::Watchdog,
            Notice::Stopping => NotifyState::Stopping,
        };
        if let Err(error) = sd_notify::notify(&[state]) {
            tracing::warn!(%error, ?notice, "sd_notify failed");
        }
    }
}

/// Sends `READY=1`, `WATCHDOG=1` and `STOPPING=1` through `send` as the module docs say,
/// until `cancel` fires. `watchdog_period` is half of `$WATCHDOG_USEC` (`None`: no pings).
pub async fn notify(
    send: impl Fn(Notice),
    watchdog_period: Option<Duration>,
    mut registered: watch::Receiver<bool>,
    liveness: &Liveness,
    cancel: &CancellationToken,
) {
    if cancel.is_cancelled() {
        send(Notice::Stopping);
        return;
    }
    let status = |registered: bool| {
        Notice::Status(if registered {
            STATUS_REGISTERED
        } else {
            STATUS_REGISTERING
        })
    };
    let mut was_registered = *registered.borrow_and_update();
    send(status(was_registered));
    send(Notice::Ready);
    tracing::info!(
        registered = was_registered,
        "told systemd the agent is ready"
    );
    let ready_at = Instant::now();
    // Without a watchdog the ticks never come.
    let mut ticks = tokio::time::interval(watchdog_period.unwrap_or(Duration::MAX));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watching = true;
    let mut was_healthy = true;
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            changed = registered.changed(), if watching => {
                // The uplink is gone (shutting down): nothing more to say of it.
                watching = changed.is_ok();
                let now = *registered.borrow_and_update();
                if watching && now != was_registered {
                    send(status(now));
                    was_registered = now;
                }
            }
            now = ticks.tick(), if watchdog_period.is_some() => {
                let healthy = liveness.healthy(now, ready_at);
                if healthy {
                    send(Notice::Watchdog);
                } else if was_healthy {
                    tracing::error!(bound = ?liveness.bound(), "the Lease loop made no progress; no longer pinging the systemd watchdog");
                }
                was_healthy = healthy;
            }
        }
    }
    send(Notice::Stopping);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test(start_paused = true)]
    async fn healthy_while_waiting_or_within_the_bound_of_the_last_progress() {
        let t0 = Instant::now();
        let live = Liveness::new(Duration::from_secs(64));
        assert!(
            live.healthy(t0 + Duration::from_secs(64), t0),
            "counts from `since`"
        );
        assert!(!live.healthy(t0 + Duration::from_secs(65), t0));
        tokio::time::advance(Duration::from_secs(30)).await;
        live.progress();
        assert!(live.healthy(t0 + Duration::from_secs(94), t0));
        assert!(!live.healthy(t0 + Duration::from_secs(95), t0));
        live.waiting(true);
        assert!(
            live.healthy(t0 + Duration::from_secs(1000), t0),
            "waiting is not stuck"
        );
        tokio::time::advance(Duration::from_secs(100)).await;
        live.waiting(false);
        assert!(live.healthy(t0 + Duration::from_secs(194), t0));
        assert!(!live.healthy(t0 + Duration::from_secs(195), t0));
    }

    #[tokio::test(start_paused = true)]
    async fn ready_at_once_registration_in_status_then_pings_while_the_loop_progresses() {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = sent.clone();
        let (registered_tx, registered) = watch::channel(false);
        let liveness = Arc::new(Liveness::new(Duration::from_secs(40)));
        let cancel = CancellationToken::new();
        // The Lease loop waits for a registration (the gateway unreachable at boot).
        liveness.waiting(true);
        let task = {
            let liveness = liveness.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                notify(
                    move |n| log.lock().unwrap().push(n),
                    Some(Duration::from_secs(10)),
                    registered,
                    &liveness,
                    &cancel,
                )
                .await
            })
        };
        let count = |n: Notice| sent.lock().unwrap().iter().filter(|s| **s == n).count();
        // Paused time: the clock moves only when every task is idle, so after each sleep
        // the notifier has handled everything due until then.
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            *sent.lock().unwrap(),
            [
                Notice::Status(STATUS_REGISTERING),
                Notice::Ready,
                Notice::Watchdog
            ],
            "ready without the gateway: an offline board finishes booting"
        );
        // An hour offline: still pinging (waiting is not hanging), no second READY.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(count(Notice::Watchdog), 361);

        registered_tx.send_replace(true);
        liveness.waiting(false);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            sent.lock().unwrap().last(),
            Some(&Notice::Status(STATUS_REGISTERED))
        );
        // A tick every 10 s: a ping every 10 s.
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            liveness.progress();
        }
        assert_eq!(count(Notice::Watchdog), 367);
        // The loop hangs: pings go on for the bound (+ 10 … + 40 s after the last
        // progress), then stop.
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(count(Notice::Watchdog), 371);
        // The registration is lost: said, and waiting is not hanging: pings resume.
        registered_tx.send_replace(false);
        liveness.waiting(true);
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert_eq!(count(Notice::Watchdog), 381);
        assert_eq!(count(Notice::Status(STATUS_REGISTERING)), 2);

        cancel.cancel();
        task.await.unwrap();
        assert_eq!(sent.lock().unwrap().last(), Some(&Notice::Stopping));
        assert_eq!(count(Notice::Ready), 1);
    }
}
