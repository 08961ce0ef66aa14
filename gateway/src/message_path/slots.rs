//! The per-node slots of a [`Gateway`]: each node's mailbox and the state its letters are
//! handled with, at most [`super::GatewayOptions::max_nodes`], swept when idle.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use edgebeat_proto::registration::NodeName;
use edgebeat_transports::ingress::{Mailbox, NodeMap};
use tokio::time::Instant;

use super::Gateway;
use crate::admission::NodeAdmission;
use crate::writer::NodeWrites;

/// A node silent this long loses its slot (what the gateway knows is re-read on its next
/// message): keeps memory bounded by the nodes actually heard from.
pub(super) const SLOT_IDLE: Duration = Duration::from_secs(15 * 60);

/// Idle slots are swept once per this many messages.
pub(super) const SWEEP_EVERY: u64 = 4096;

/// A node's mailbox and the state its letters are handled with.
pub(super) struct SlotCell {
    /// The node's name, validated at [`Gateway::screen`]: what its admission and writes
    /// carry to the apiserver call.
    pub(super) name: NodeName,
    /// The node's letters waiting, from every ingress ([`Mailbox`]).
    pub(super) mailbox: Mutex<Mailbox>,
    /// An identified message of this node was admitted: the slot is never given up for
    /// an unidentified node's (see [`Gateway::slot`]).
    pub(super) identified: std::sync::atomic::AtomicBool,
    /// Locked by whoever handles the mailbox's letters (one at a time), and tried by
    /// sweeps.
    pub(super) state: tokio::sync::Mutex<NodeSlot>,
}

impl SlotCell {
    /// The slot of `name`: an empty mailbox, not yet identified, its state new.
    pub(super) fn new(name: NodeName) -> Self {
        Self {
            name,
            mailbox: Mutex::default(),
            identified: std::sync::atomic::AtomicBool::new(false),
            state: tokio::sync::Mutex::default(),
        }
    }
}

/// Marks a node's mailbox as no longer handled when its handling stops abnormally (a
/// panic, or a cancelled [`Handler::handle`] call that was handling it), so that the next
/// letter starts handling again; the normal end disarms it.
pub(super) struct Handling<'a> {
    pub(super) cell: &'a SlotCell,
    pub(super) armed: bool,
}

impl Drop for Handling<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.cell.mailbox.lock().stopped();
        }
    }
}

#[derive(Default)]
pub(super) struct NodeSlot {
    /// Last message for this node; idle slots are evicted after [`SLOT_IDLE`].
    pub(super) last_seen: Option<Instant>,
    /// Boot, sequence, identity, rate limit and freshness ([`crate::admission`]).
    pub(super) admission: NodeAdmission,
    /// The writer's per-node flags and metric series ([`crate::writer`]).
    pub(super) writes: NodeWrites,
}

impl Gateway {
    /// The slot of node `name`, made if there is room for it (fewer than
    /// [`GatewayOptions::max_nodes`] slots, after dropping idle ones, or, for an
    /// `identified` message, after giving up the slot of a node never identified: made-up
    /// names that filled the replica must not keep a genuine node out); `None` otherwise.
    pub(super) fn slot(&self, name: &NodeName, identified: bool) -> Option<Arc<SlotCell>> {
        let mut slots = self.slots.lock();
        if self.messages.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            self.sweep(&mut slots);
        }
        slots
            .get_or_make(
                name,
                || (name.to_string(), Arc::new(SlotCell::new(name.clone()))),
                |slots| self.sweep(slots),
                |slots| identified && self.evict_unidentified(slots),
            )
            .map(|slot| slot.clone())
    }

    /// Drops the slot, not in use, of the node never identified that was heard from
    /// longest ago; returns whether there was one. Only for an identified message, so it
    /// costs anyone without an identity nothing to trigger.
    pub(super) fn evict_unidentified(&self, slots: &mut NodeMap<String, Arc<SlotCell>>) -> bool {
        let oldest = slots
            .iter()
            .filter(|(_, cell)| {
                !cell.identified.load(Ordering::Relaxed)
                    && Arc::strong_count(cell) == 1
                    && !cell.mailbox.lock().is_busy()
            })
            .filter_map(|(name, cell)| Some((name, cell.state.try_lock().ok()?.last_seen)))
            .min_by_key(|(_, last_seen)| *last_seen)
            .map(|(name, _)| name.clone());
        let Some(name) = oldest else {
            return false;
        };
        slots.remove(&name);
        self.writer.node_metrics.remove(&name);
        self.resource_samples.remove(&name);
        tracing::debug!(node = %name, "gave an unidentified node's slot to an identified one");
        true
    }

    /// Drops the slots of nodes silent for [`SLOT_IDLE`]. A slot in use (locked) is never
    /// idle; try_lock skips it. An evicted node's metric series go with it.
    pub(super) fn sweep(&self, slots: &mut NodeMap<String, Arc<SlotCell>>) {
        let now = Instant::now();
        // Samples, shared ones included, of nodes no replica heard from in as long.
        let cutoff = self.clock.unix_now().saturating_sub(SLOT_IDLE);
        self.resource_samples.forget_before(cutoff.system_time());
        slots.retain(|name, slot| {
            // A cell a message holds (between lookup and post) or with letters is in use.
            let keep = Arc::strong_count(slot) > 1
                || slot.mailbox.lock().is_busy()
                || slot.state.try_lock().map_or(true, |s| {
                    s.last_seen
                        .is_some_and(|t| now.duration_since(t) < SLOT_IDLE)
                });
            if !keep {
                self.writer.node_metrics.remove(name);
                self.resource_samples.remove(name);
            }
            keep
        });
    }
}
