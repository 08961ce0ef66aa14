//! The replica's clock as Unix seconds and as a timestamp.

use edgebeat_hw::Clock;
use jiff::Timestamp;

use super::Enrollment;

impl Enrollment {
    /// This replica's clock, as a timestamp.
    pub(super) fn now(&self) -> Timestamp {
        Timestamp::from_second(clock_seconds(self.clock.as_ref())).unwrap_or(Timestamp::UNIX_EPOCH)
    }
}

/// `clock`'s now, Unix seconds.
pub(super) fn clock_seconds(clock: &dyn Clock) -> i64 {
    i64::try_from(
        clock
            .now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs(),
    )
    .unwrap_or(i64::MAX)
}
