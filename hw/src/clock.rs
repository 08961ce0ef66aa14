//! [`Clock`]: wall clock and boot-time clock behind one tiny trait so tests replace it, and
//! [`UnixTime`], the one conversion of a wall-clock reading to Unix time.

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

    /// [`Clock::now`] as Unix time ([`UnixTime`]: never before the epoch).
    fn unix_now(&self) -> UnixTime {
        UnixTime::from(self.now())
    }
}

/// A wall-clock reading as Unix time: the time since 1970-01-01T00:00:00Z (POSIX
/// `time(2)`, `clock_gettime(CLOCK_REALTIME)`), in every unit the project writes it in.
/// The one rule for it:
///
/// - a reading **before the epoch** is the epoch (zero): only a deliberately set clock
///   reads earlier (a board without an RTC boots at the epoch plus its uptime, or at its
///   last saved time), and nothing edgebeat writes has a meaning before it;
/// - the units truncate toward the epoch (1.9999 s is 1 s in [`UnixTime::seconds`]), as
///   `SystemTime` → `time_t` and Kubernetes' whole-second times do;
/// - a value past what the unit's `i64` holds is `i64::MAX` (saturates); a
///   [`jiff::Timestamp`](UnixTime::timestamp) past year 9999 is `Timestamp::MAX`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixTime(Duration);

impl From<SystemTime> for UnixTime {
    fn from(t: SystemTime) -> Self {
        Self(t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default())
    }
}

impl UnixTime {
    /// The epoch itself, 1970-01-01T00:00:00Z.
    pub const EPOCH: Self = Self(Duration::ZERO);

    /// The time since the epoch.
    pub fn duration(self) -> Duration {
        self.0
    }

    /// Whole seconds since the epoch (truncated; `time_t`, x509 validity, Unix-seconds
    /// fields).
    pub fn seconds(self) -> i64 {
        i64::try_from(self.0.as_secs()).unwrap_or(i64::MAX)
    }

    /// Whole milliseconds since the epoch (truncated; `Header.wall_time_ms`).
    pub fn millis(self) -> i64 {
        i64::try_from(self.0.as_millis()).unwrap_or(i64::MAX)
    }

    /// Whole microseconds since the epoch (truncated; a Lease's `renewTime` precision).
    pub fn micros(self) -> i64 {
        i64::try_from(self.0.as_micros()).unwrap_or(i64::MAX)
    }

    /// Seconds since the epoch with their fraction (Prometheus timestamps, gauges).
    pub fn seconds_f64(self) -> f64 {
        self.0.as_secs_f64()
    }

    /// This time with its fraction of a second dropped (Kubernetes' `Time` is whole
    /// seconds).
    #[must_use]
    pub fn whole_seconds(self) -> Self {
        Self(Duration::from_secs(self.0.as_secs()))
    }

    /// `by` earlier, and at the epoch at the earliest.
    #[must_use]
    pub fn saturating_sub(self, by: Duration) -> Self {
        Self(self.0.saturating_sub(by))
    }

    /// Back to a wall-clock reading. Every `UnixTime` comes from one (or is earlier), so
    /// this is never out of range; if it were, the epoch.
    pub fn system_time(self) -> SystemTime {
        SystemTime::UNIX_EPOCH
            .checked_add(self.0)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }

    /// As a [`jiff::Timestamp`] (nanosecond precision), `Timestamp::MAX` past year 9999.
    #[cfg(feature = "jiff")]
    pub fn timestamp(self) -> jiff::Timestamp {
        jiff::SignedDuration::try_from(self.0)
            .ok()
            .and_then(|d| jiff::Timestamp::from_duration(d).ok())
            .unwrap_or(jiff::Timestamp::MAX)
    }
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
    fn unix_time_before_the_epoch_is_the_epoch() {
        let before = SystemTime::UNIX_EPOCH - Duration::from_secs(86_400);
        assert_eq!(UnixTime::from(before), UnixTime::EPOCH);
        assert_eq!(UnixTime::from(before).seconds(), 0);
        assert_eq!(UnixTime::from(before).millis(), 0);
        assert_eq!(UnixTime::from(before).micros(), 0);
        assert_eq!(UnixTime::from(before).seconds_f64(), 0.0);
        // Just before, too.
        let just = SystemTime::UNIX_EPOCH - Duration::from_nanos(1);
        assert_eq!(UnixTime::from(just).millis(), 0);
        assert_eq!(UnixTime::from(SystemTime::UNIX_EPOCH), UnixTime::EPOCH);
    }

    #[test]
    fn unix_time_truncates_toward_the_epoch() {
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 999_999_999);
        let unix = UnixTime::from(t);
        assert_eq!(unix.system_time(), t, "nothing lost on the way back");
        assert_eq!(unix.seconds(), 1_700_000_000);
        assert_eq!(unix.millis(), 1_700_000_000_999);
        assert_eq!(unix.micros(), 1_700_000_000_999_999);
        assert_eq!(unix.duration(), Duration::new(1_700_000_000, 999_999_999));
        assert_eq!(
            unix.whole_seconds().duration(),
            Duration::from_secs(1_700_000_000)
        );
        assert!((unix.seconds_f64() - 1_700_000_001.0).abs() < 1e-3);
        // Half a millisecond is no millisecond.
        let half = UnixTime::from(SystemTime::UNIX_EPOCH + Duration::from_micros(1_500));
        assert_eq!((half.millis(), half.micros()), (1, 1_500));
    }

    #[test]
    fn unix_time_far_ahead_saturates() {
        let far = UnixTime(Duration::MAX);
        assert_eq!(far.seconds(), i64::MAX);
        assert_eq!(far.millis(), i64::MAX);
        assert_eq!(far.micros(), i64::MAX);
        // Year 2262 and later: past i64 nanoseconds, not past these units.
        let year_3000 = UnixTime(Duration::from_secs(32_503_680_000));
        assert_eq!(year_3000.micros(), 32_503_680_000_000_000);
        assert_eq!(
            UnixTime::EPOCH.saturating_sub(Duration::from_secs(60)),
            UnixTime::EPOCH
        );
        assert_eq!(
            UnixTime::EPOCH.saturating_sub(Duration::MAX).system_time(),
            SystemTime::UNIX_EPOCH
        );
        assert_eq!(
            year_3000.saturating_sub(Duration::from_secs(60)).seconds(),
            32_503_679_940
        );
    }

    #[cfg(feature = "jiff")]
    #[test]
    fn unix_time_as_a_timestamp_keeps_nanoseconds_and_saturates_past_9999() {
        let t = UnixTime(Duration::new(1_700_000_000, 123_456_789));
        assert_eq!(t.timestamp().as_nanosecond(), 1_700_000_000_123_456_789);
        assert_eq!(UnixTime::EPOCH.timestamp(), jiff::Timestamp::UNIX_EPOCH);
        let year_10000 = UnixTime(Duration::from_secs(253_402_300_800));
        assert_eq!(year_10000.timestamp(), jiff::Timestamp::MAX);
        assert_eq!(UnixTime(Duration::MAX).timestamp(), jiff::Timestamp::MAX);
    }

    #[test]
    fn every_clock_reads_unix_time_the_same_way() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_747_214_400_250);
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(at, Duration::ZERO));
        assert_eq!(clock.unix_now(), UnixTime::from(at));
        assert_eq!(clock.unix_now().millis(), 1_747_214_400_250);
        let real = SystemClock.unix_now().seconds();
        assert!(real > 1_700_000_000, "{real}");
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
