//! Message headers: node name, boot ID and the per-boot sequence number.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use edgebeat_hw::Clock;
use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{Header, boot_id_to_bytes};

/// Builds [`Header`]s with a strictly increasing per-boot `seq`.
///
/// `seq` is CLOCK_BOOTTIME in microseconds, raised to the last value + 1 when the clock has
/// not moved: it never repeats within a boot, not even across agent restarts, and the
/// gateway can read elapsed time from differences of it (see `heartbeat.proto`).
pub struct HeaderFactory {
    node_name: NodeName,
    boot_id: Vec<u8>,
    clock: Arc<dyn Clock>,
    last: AtomicU64,
}

impl HeaderFactory {
    /// A factory for `node_name` on the boot `boot_id` (textual UUID), reading `clock`.
    pub fn new(node_name: NodeName, boot_id: &str, clock: Arc<dyn Clock>) -> Self {
        Self {
            node_name,
            boot_id: boot_id_to_bytes(boot_id),
            clock,
            last: AtomicU64::new(0),
        }
    }

    /// The node name in every header.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// A fresh header: next `seq`, current wall clock in ms since the epoch (0 if the clock
    /// is before 1970).
    pub fn next(&self) -> Header {
        let now = u64::try_from(self.clock.boottime().as_micros()).unwrap_or(u64::MAX);
        let mut last = self.last.load(Ordering::Relaxed);
        let seq = loop {
            let candidate = now.max(last + 1);
            match self.last.compare_exchange_weak(
                last,
                candidate,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break candidate,
                Err(actual) => last = actual,
            }
        };
        let wall_time_ms = self.clock.unix_now().millis();
        Header {
            node_name: self.node_name.as_str().to_owned(),
            boot_id: self.boot_id.clone(),
            seq,
            wall_time_ms,
            // Named by boot_id; the MQTT uplink may name it by tag (`AgentMessage::tag_boot`).
            boot_tag: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    struct Frozen;
    impl Clock for Frozen {
        fn now(&self) -> SystemTime {
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)
        }
        fn boottime(&self) -> Duration {
            Duration::from_secs(42)
        }
    }

    #[test]
    fn seq_strictly_increases_even_when_the_clock_stands_still() {
        let f = HeaderFactory::new(
            "edge-01".parse().unwrap(),
            "0f8fad5b-d9cb-469f-a165-70867728950e",
            Arc::new(Frozen),
        );
        let a = f.next();
        let b = f.next();
        assert_eq!(a.seq, 42_000_000);
        assert_eq!(b.seq, 42_000_001);
        assert_eq!(a.wall_time_ms, 1_700_000_000_123);
        assert_eq!(a.boot_id.len(), 16);
        assert_eq!(a.node_name, "edge-01");
    }
}
