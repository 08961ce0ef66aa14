//! [`Clock`]: wall clock and boot-time clock behind one tiny trait so tests replace it.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nix::time::{ClockId, clock_gettime};

/// Wall clock and boot-time clock behind one tiny trait so tests replace it.
pub trait Clock: Send + Sync + 'static {
    /// Wall-clock time. Edge boards often lack an RTC, so never send this to the apiserver
    /// as a timestamp; the gateway stamps times with its own clock.
    fn now(&self) -> SystemTime;
    /// Time since boot including suspend (CLOCK_BOOTTIME), monotonic, survives process
    /// restarts within one boot.
    fn boottime(&self) -> Duration;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> SystemTime {
        (**self).now()
    }

    fn boottime(&self) -> Duration {
        (**self).boottime()
    }
}

/// The real clocks: [`SystemTime::now`] and `clock_gettime(CLOCK_BOOTTIME)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn boottime(&self) -> Duration {
        // CLOCK_BOOTTIME exists since Linux 2.6.39; CLOCK_MONOTONIC (which stops during
        // suspend) is only a defensive fallback so this never panics.
        clock_gettime(ClockId::CLOCK_BOOTTIME)
            .or_else(|_| clock_gettime(ClockId::CLOCK_MONOTONIC))
            .map(Duration::from)
            .unwrap_or_default()
    }
}

/// A clock that moves only when told to, for tests: starts at the given readings and changes
/// through [`ManualClock::advance`] and [`ManualClock::set_now`]. Share it with `Arc`.
#[derive(Debug)]
pub struct ManualClock {
    readings: Mutex<(SystemTime, Duration)>,
}

impl ManualClock {
    /// A clock reading `now` as wall time and `boottime` since boot.
    pub fn new(now: SystemTime, boottime: Duration) -> Self {
        Self {
            readings: Mutex::new((now, boottime)),
        }
    }

    /// Moves both clocks forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut readings = self.lock();
        readings.0 += by;
        readings.1 += by;
    }

    /// Sets the wall clock only (an NTP step, possibly backwards); boot time is unchanged.
    pub fn set_now(&self, now: SystemTime) {
        self.lock().0 = now;
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, (SystemTime, Duration)> {
        self.readings.lock()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        self.lock().0
    }

    fn boottime(&self) -> Duration {
        self.lock().1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_boottime_is_monotonic_and_nonzero() {
        let clock = SystemClock;
        let first = clock.boottime();
        let second = clock.boottime();
        assert!(first > Duration::ZERO);
        assert!(second >= first);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_747_214_400);
        let clock = Arc::new(ManualClock::new(start, Duration::from_secs(60)));
        let shared: Arc<dyn Clock> = clock.clone();
        assert_eq!(shared.now(), start);
        clock.advance(Duration::from_millis(1500));
        assert_eq!(shared.now(), start + Duration::from_millis(1500));
        assert_eq!(shared.boottime(), Duration::from_millis(61_500));
        clock.set_now(start - Duration::from_secs(3600));
        assert_eq!(shared.now(), start - Duration::from_secs(3600));
        assert_eq!(shared.boottime(), Duration::from_millis(61_500));
    }
}
