//! The TLS handshakes in progress on the gRPC listener, and which one gives way when there is
//! no room for another: I/O-free, so the rule is tested without sockets.
//!
//! A full listener that refused new connections could be kept full by anyone who opens
//! sockets and stalls (slowloris): 1,100 idle sockets from 40 addresses left genuine agents
//! 0 handshakes in 20. So a new connection is always let in, and when the listener is full
//! (or its address is) the oldest incomplete handshake gives way, a socket that has not yet
//! sent a whole ClientHello before one that has. A genuine agent sends its ClientHello at
//! once and finishes in a few round trips, so it is never the oldest for long; a staller
//! has to open connections faster than [`max`](Handshakes::new) per handshake time to push
//! one out, and every socket it opens is dropped after the ClientHello deadline anyway.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

/// How far a handshake has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Waiting for a whole ClientHello.
    Hello,
    /// ClientHello received, the rest of the handshake under way.
    Handshake,
}

/// One handshake in progress: its address and how to make it give way.
#[derive(Debug)]
struct Entry {
    ip: IpAddr,
    stage: Stage,
    evict: CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// By id, which grows with every connection: in age order.
    entries: BTreeMap<u64, Entry>,
    /// Ids still at [`Stage::Hello`], oldest first.
    hello: BTreeSet<u64>,
    /// Ids by address, oldest first.
    by_address: HashMap<IpAddr, BTreeSet<u64>>,
}

impl State {
    /// Removes `id`; returns its entry.
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        self.hello.remove(&id);
        if let Some(ids) = self.by_address.get_mut(&entry.ip) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_address.remove(&entry.ip);
            }
        }
        Some(entry)
    }

    /// The handshake to give way among `ids` (oldest first): the oldest still waiting for
    /// its ClientHello, else the oldest.
    fn victim<'a>(&self, mut ids: impl Iterator<Item = &'a u64> + Clone) -> Option<u64> {
        ids.clone()
            .find(|id| self.hello.contains(id))
            .or_else(|| ids.next())
            .copied()
    }
}

/// The handshakes in progress, at most `max` in all and `per_address` from one IP address.
#[derive(Debug)]
pub(super) struct Handshakes {
    state: Mutex<State>,
    max: usize,
    per_address: usize,
}

/// One connection's place among the [`Handshakes`], given back on drop.
#[derive(Debug)]
pub(super) struct Ticket {
    handshakes: Arc<Handshakes>,
    id: u64,
    /// Fires when the handshake must give way to a newer connection.
    pub(super) evicted: CancellationToken,
}

impl Handshakes {
    /// Room for `max` handshakes, `per_address` from one address (both at least 1).
    pub(super) fn new(max: usize, per_address: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            max: max.max(1),
            per_address: per_address.max(1),
        })
    }

    /// Lets in a connection from `ip`, making room first when its address or the listener
    /// is full (see the module docs). Returns its ticket and how many handshakes were made
    /// to give way (their tickets' `evicted` fired).
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr) -> (Ticket, usize) {
        let mut state = self.state.lock();
        let mut evicted = 0;
        let from_ip = state.by_address.get(&ip).map_or(0, BTreeSet::len);
        if from_ip >= self.per_address
            && let Some(id) = state
                .by_address
                .get(&ip)
                .and_then(|ids| state.victim(ids.iter()))
            && let Some(entry) = state.remove(id)
        {
            entry.evict.cancel();
            evicted += 1;
        }
        if state.entries.len() >= self.max
            && let Some(id) = state.victim(state.entries.keys())
            && let Some(entry) = state.remove(id)
        {
            entry.evict.cancel();
            evicted += 1;
        }
        let id = state.next_id;
        state.next_id += 1;
        let evict = CancellationToken::new();
        state.entries.insert(
            id,
            Entry {
                ip,
                stage: Stage::Hello,
                evict: evict.clone(),
            },
        );
        state.hello.insert(id);
        state.by_address.entry(ip).or_default().insert(id);
        let ticket = Ticket {
            handshakes: self.clone(),
            id,
            evicted: evict,
        };
        (ticket, evicted)
    }

    /// Handshakes in progress: (all, waiting for a ClientHello).
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let state = self.state.lock();
        (state.entries.len(), state.hello.len())
    }
}

impl Ticket {
    /// The whole ClientHello arrived: from now on this handshake gives way only after every
    /// one still waiting for theirs.
    pub(super) fn hello_received(&self) {
        let mut state = self.handshakes.state.lock();
        state.hello.remove(&self.id);
        if let Some(entry) = state.entries.get_mut(&self.id) {
            entry.stage = Stage::Handshake;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.handshakes.state.lock().remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn a_full_listener_lets_the_newest_in_and_the_oldest_stalled_give_way() {
        let handshakes = Handshakes::new(3, 8);
        let (genuine, _) = handshakes.admit(ip(1));
        genuine.hello_received();
        let (stalled_a, _) = handshakes.admit(ip(2));
        let (stalled_b, _) = handshakes.admit(ip(3));
        assert_eq!(handshakes.counts(), (3, 2));
        // Full: the oldest still without a ClientHello gives way, not the older genuine one.
        let (newest, evicted) = handshakes.admit(ip(4));
        assert_eq!(evicted, 1);
        assert!(stalled_a.evicted.is_cancelled());
        assert!(!genuine.evicted.is_cancelled() && !stalled_b.evicted.is_cancelled());
        assert_eq!(handshakes.counts(), (3, 2));
        // With every handshake past its ClientHello, the oldest gives way.
        stalled_b.hello_received();
        newest.hello_received();
        let (fifth, evicted) = handshakes.admit(ip(5));
        assert_eq!(evicted, 1);
        assert!(genuine.evicted.is_cancelled());
        assert!(!fifth.evicted.is_cancelled());
        // A ticket given back frees its place; one evicted already is not counted twice.
        drop((stalled_a, genuine));
        assert_eq!(handshakes.counts(), (3, 1));
        drop(stalled_b);
        assert_eq!(handshakes.counts(), (2, 1));
    }

    #[test]
    fn an_address_at_its_limit_makes_room_from_its_own() {
        let handshakes = Handshakes::new(100, 2);
        let (other, _) = handshakes.admit(ip(9));
        let (first, _) = handshakes.admit(ip(1));
        let (second, _) = handshakes.admit(ip(1));
        let (third, evicted) = handshakes.admit(ip(1));
        assert_eq!(evicted, 1);
        assert!(first.evicted.is_cancelled());
        assert!(!other.evicted.is_cancelled() && !second.evicted.is_cancelled());
        assert!(!third.evicted.is_cancelled());
        assert_eq!(handshakes.counts(), (3, 3));
    }
}
