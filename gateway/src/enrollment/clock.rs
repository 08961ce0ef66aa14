//! The replica's clock as a timestamp, in whole seconds.

use jiff::Timestamp;

use super::Enrollment;

impl Enrollment {
    /// This replica's clock, as a timestamp in whole seconds
    /// ([`edgebeat_hw::UnixTime::whole_seconds`]).
    pub(super) fn now(&self) -> Timestamp {
        self.clock.unix_now().whole_seconds().timestamp()
    }
}
