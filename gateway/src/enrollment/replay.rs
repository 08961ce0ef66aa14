//! The replay window: the latest boot and sequence accepted from each node, so a request
//! seen before gets no answer. Only a request whose proof (bootstrap token or node
//! certificate) verified is recorded: an unproved one with a victim's boot ID and sequence
//! 2^64 − 1 would otherwise make every genuine request of that boot a "replay".

use std::collections::HashMap;

use edgebeat_proto::Header;
use jiff::Timestamp;

use super::Enrollment;
use crate::admission::LastAccepted;

/// The latest request accepted from each node (its boot ID and sequence number, and when),
/// and when entries older than the replay window were last dropped.
#[derive(Default)]
pub(super) struct Seen {
    latest: HashMap<String, (LastAccepted, Timestamp)>,
    swept: Option<Timestamp>,
}

impl Enrollment {
    /// Whether `header`'s boot and sequence are not above the last ones recorded for its
    /// node (a replay); records nothing, so that a request refused later (its proof does
    /// not verify) cannot move the window.
    pub(super) fn replayed(&self, header: &Header) -> bool {
        let now = self.now();
        let window = self.replay_window();
        let seen = self.seen.lock();
        seen.latest
            .get(&header.node_name)
            .is_some_and(|(last, at)| {
                last.replayed_by(&header.boot_id, header.seq) && now.duration_since(*at) < window
            })
    }

    /// How long an accepted request's boot and sequence are remembered: twice the clock
    /// window, beyond which the clock window refuses a recording anyway.
    fn replay_window(&self) -> jiff::SignedDuration {
        jiff::SignedDuration::try_from(self.options.max_clock_skew * 2)
            .unwrap_or(jiff::SignedDuration::MAX)
    }

    /// Records `header`'s boot and sequence for its node, once its proof verified; false
    /// when not above the last one of the same boot (a replay, e.g. of a request proved
    /// at the same time).
    pub(super) fn first_time(&self, header: &Header) -> bool {
        let now = self.now();
        let window = self.replay_window();
        let mut seen = self.seen.lock();
        // Entries past the window are dropped once a window, not scanned per request:
        // the map holds at most two windows' worth of nodes.
        if seen.swept.is_none_or(|t| now.duration_since(t) >= window) {
            seen.latest
                .retain(|_, (_, at)| now.duration_since(*at) < window);
            seen.swept = Some(now);
        }
        match seen.latest.get(&header.node_name) {
            Some((last, at))
                if last.replayed_by(&header.boot_id, header.seq)
                    && now.duration_since(*at) < window =>
            {
                false
            }
            _ => {
                seen.latest.insert(
                    header.node_name.clone(),
                    (LastAccepted::new(header.boot_id.clone(), header.seq), now),
                );
                true
            }
        }
    }
}
