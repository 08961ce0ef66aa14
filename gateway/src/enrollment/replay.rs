//! The replay window: the latest boot and sequence accepted from each node, so a request
//! seen before gets no answer.

use std::collections::HashMap;

use edgebeat_proto::Header;
use jiff::Timestamp;

use super::Enrollment;

/// The latest request accepted from each node (its boot ID, sequence number, and when),
/// and when entries older than the replay window were last dropped.
#[derive(Default)]
pub(super) struct Seen {
    latest: HashMap<String, (Vec<u8>, u64, Timestamp)>,
    swept: Option<Timestamp>,
}

impl Enrollment {
    /// Records `header`'s boot and sequence for its node; false when not above the last
    /// one of the same boot (a replay).
    pub(super) fn first_time(&self, header: &Header) -> bool {
        let now = self.now();
        let window = jiff::SignedDuration::try_from(self.options.max_clock_skew * 2)
            .unwrap_or(jiff::SignedDuration::MAX);
        let mut seen = self.seen.lock();
        // Entries past the window are dropped once a window, not scanned per request:
        // the map holds at most two windows' worth of nodes.
        if seen.swept.is_none_or(|t| now.duration_since(t) >= window) {
            seen.latest
                .retain(|_, (_, _, at)| now.duration_since(*at) < window);
            seen.swept = Some(now);
        }
        match seen.latest.get(&header.node_name) {
            Some((boot, seq, at))
                if *boot == header.boot_id
                    && header.seq <= *seq
                    && now.duration_since(*at) < window =>
            {
                false
            }
            _ => {
                seen.latest.insert(
                    header.node_name.clone(),
                    (header.boot_id.clone(), header.seq, now),
                );
                true
            }
        }
    }
}
