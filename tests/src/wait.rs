//! The one way the tests wait for something to happen: [`eventually`].
//!
//! A check is asked again until it is done or a deadline passes; on failure the message
//! names what was awaited, the deadline, and the last thing the check saw, so a timed-out
//! test says where it stopped: `<what>: not within <deadline>; last seen: <value>`.
//!
//! A check answers with a [`Seen`]: `bool`, `Option<T>` (`None` not yet), or `Result<T, E>`
//! (`Err` not yet, carrying what was seen; the `Err` is what the failure message quotes).
//! [`until`] is the same wait returning the failure as an error ([`NotWithin`]) and woken
//! by the caller's own signal (a watch, a notification) where there is one, instead of
//! polling; the other waits of the crate (the stand-in's `wait_until`, a process's log
//! lines, [`crate::harness::wait_for`]) are built on it. [`blocking`] is the same for the
//! synchronous start-up of the control plane and kubelet fixtures.
//!
//! A fixed sleep is not a wait: the tests sleep only where they measure a window ("nothing
//! happens for 3 s"), and say so where they do.

use std::fmt::{self, Debug};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The shortest pause between two checks of [`eventually`].
pub const POLL: Duration = Duration::from_millis(20);

/// The longest pause between two checks of [`eventually`].
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// What a check answered: done (with its value) or not yet (with what it saw).
pub trait Seen {
    /// The value a done check gives.
    type Done;
    /// Done with its value, or not yet with what was seen, as the failure message shows it.
    ///
    /// # Errors
    /// Not done yet: the observation, formatted.
    fn done(self) -> Result<Self::Done, String>;
}

impl Seen for bool {
    type Done = ();
    fn done(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("false".to_owned())
        }
    }
}

impl<T> Seen for Option<T> {
    type Done = T;
    fn done(self) -> Result<T, String> {
        self.ok_or_else(|| "None".to_owned())
    }
}

impl<T, E: Debug> Seen for Result<T, E> {
    type Done = T;
    fn done(self) -> Result<T, String> {
        self.map_err(|e| format!("{e:?}"))
    }
}

/// A wait whose deadline passed first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotWithin {
    /// What was awaited.
    pub what: String,
    /// How long it was awaited.
    pub deadline: Duration,
    /// The last observation, formatted ([`Seen::done`]).
    pub last: String,
}

impl fmt::Display for NotWithin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: not within {:?}; last seen: {}",
            self.what, self.deadline, self.last
        )
    }
}

impl std::error::Error for NotWithin {}

/// Asks `check` until it is done, for at most `deadline`, and gives its value; between two
/// checks it waits for `wake` (a change signal: the stand-in's store, a process's log
/// lines; for [`eventually`], a pause). `wake` is called before each check, so a signal
/// registered there sees a change during the check. A last check is made at the deadline.
///
/// Plain closures returning futures (not async closures): the wait's future is then
/// `Send` wherever the closures' are, so a waiting task can be spawned.
///
/// # Errors
/// The deadline passed first: [`NotWithin`], with the last observation.
pub async fn until<S, Check, Checked, Wake, Woken>(
    what: &str,
    deadline: Duration,
    mut check: Check,
    mut wake: Wake,
) -> Result<S::Done, NotWithin>
where
    S: Seen,
    Check: FnMut() -> Checked,
    Checked: Future<Output = S>,
    Wake: FnMut() -> Woken,
    Woken: Future<Output = ()>,
{
    let end = Instant::now() + deadline;
    loop {
        let woken = wake();
        let last = match check().await.done() {
            Ok(done) => return Ok(done),
            Err(last) => last,
        };
        if Instant::now() >= end {
            return Err(NotWithin {
                what: what.to_owned(),
                deadline,
                last,
            });
        }
        let _ = tokio::time::timeout_at(end, woken).await;
    }
}

/// A `wake` for [`until`] where nothing signals a change: a pause of `period` (a port an
/// external process opens, a metric scraped over HTTP).
/// The pause starts when the wait begins, after the check.
pub fn every(period: Duration) -> impl FnMut() -> Pause {
    move || Box::pin(async move { tokio::time::sleep(period).await })
}

/// The future of [`every`]: a pause, started when first polled.
pub type Pause = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Asks `check` until it is done, for at most `deadline`, and gives its value. It pauses
/// [`POLL`] between checks, or as long as the last check took (at most 1 s), so a slow
/// check (a kubectl call, an HTTP request) takes at most half of the time.
///
/// A check is a closure returning a future (`|| async { ... }`), or a ready value for a
/// synchronous one (`|| std::future::ready(...)`).
///
/// # Panics
/// When `deadline` passes first: `<what>: not within <deadline>; last seen: <value>`.
pub async fn eventually<S, Check, Checked>(
    what: &str,
    deadline: Duration,
    mut check: Check,
) -> S::Done
where
    S: Seen,
    Check: FnMut() -> Checked,
    Checked: Future<Output = S>,
{
    // How long the last check took (µs).
    let took = AtomicU64::new(micros(POLL));
    let took = &took;
    let timed = || {
        let checked = check();
        async move {
            let started = Instant::now();
            let seen = checked.await;
            took.store(micros(started.elapsed()), Ordering::Relaxed);
            seen
        }
    };
    // Lazy: the pause is read and starts when first polled, after the check.
    let pause = || async move {
        let took = Duration::from_micros(took.load(Ordering::Relaxed));
        tokio::time::sleep(took.clamp(POLL, MAX_PAUSE)).await;
    };
    match until(what, deadline, timed, pause).await {
        Ok(done) => done,
        Err(e) => panic!("{e}"),
    }
}

/// [`until`] for code that cannot await (a fixture started from synchronous code): asks
/// `check` every `pause`, blocking the thread between checks.
///
/// # Errors
/// The deadline passed first: [`NotWithin`], with the last observation.
pub fn blocking<S: Seen>(
    what: &str,
    deadline: Duration,
    pause: Duration,
    mut check: impl FnMut() -> S,
) -> Result<S::Done, NotWithin> {
    let end = Instant::now() + deadline;
    loop {
        let last = match check().done() {
            Ok(done) => return Ok(done),
            Err(last) => last,
        };
        let now = Instant::now();
        if now >= end {
            return Err(NotWithin {
                what: what.to_owned(),
                deadline,
                last,
            });
        }
        std::thread::sleep(pause.min(end - now));
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_done_check_gives_its_value() {
        let mut asked = 0;
        let value = eventually("the third ask", Duration::from_secs(5), || {
            asked += 1;
            std::future::ready(if asked >= 3 { Ok(asked) } else { Err(asked) })
        })
        .await;
        assert_eq!(value, 3);
    }

    #[tokio::test]
    async fn a_timed_out_wait_quotes_what_it_last_saw() {
        let mut asked = 0;
        let err = until(
            "a count of ten",
            Duration::from_millis(50),
            || {
                asked += 1;
                std::future::ready(Err::<(), _>(format!("{asked} so far")))
            },
            every(POLL),
        )
        .await
        .unwrap_err();
        assert_eq!(err.last, format!("\"{asked} so far\""));
        assert_eq!(
            err.to_string(),
            format!("a count of ten: not within 50ms; last seen: \"{asked} so far\"")
        );
    }

    #[tokio::test]
    #[should_panic(expected = "Ready: not within 30ms; last seen: None")]
    async fn eventually_panics_with_the_last_observation() {
        eventually("Ready", Duration::from_millis(30), || {
            std::future::ready(None::<()>)
        })
        .await;
    }
}
