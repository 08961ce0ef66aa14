//! The TLS handshakes in progress on the gRPC listener, and which one gives way when there is
//! no room for another: I/O-free, so the rule is tested without sockets.
//!
//! A full listener that refused new connections could be kept full by anyone who opens
//! sockets and stalls (slowloris): 1,100 idle sockets from 40 addresses left genuine agents
//! 0 handshakes in 20. So a new connection is always let in, and when the listener is full
//! (or its address is) an incomplete handshake gives way: one that has not yet sent a whole
//! ClientHello before one that has, and among those the oldest of the address holding the
//! most (the rule [`crate::observe`] uses for its connections). A genuine agent sends its
//! ClientHello at once and finishes in a few round trips; a staller fills its own address
//! first, so an agent alone on its address is pushed out only once no address holds two
//! stalled handshakes, however fast the staller reopens its sockets. Every socket is
//! dropped after the ClientHello deadline anyway.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

/// One handshake in progress: its address and how to make it give way.
#[derive(Debug)]
struct Entry {
    ip: IpAddr,
    evict: CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// By id, which grows with every connection: in age order.
    entries: BTreeMap<u64, Entry>,
    /// Ids by address, oldest first.
    by_address: HashMap<IpAddr, BTreeSet<u64>>,
    /// Ids still waiting for their whole ClientHello by address, oldest first.
    hello_by_address: HashMap<IpAddr, BTreeSet<u64>>,
}

/// Takes `id` out of `ip`'s set in `map`, dropping the set once empty.
fn forget(map: &mut HashMap<IpAddr, BTreeSet<u64>>, ip: IpAddr, id: u64) {
    if let Some(ids) = map.get_mut(&ip) {
        ids.remove(&id);
        if ids.is_empty() {
            map.remove(&ip);
        }
    }
}

/// The oldest id of the address holding the most in `map` (of those, the one whose oldest
/// came first).
fn oldest_of_busiest(map: &HashMap<IpAddr, BTreeSet<u64>>) -> Option<u64> {
    map.values()
        .filter_map(|ids| Some((ids.len(), *ids.first()?)))
        .max_by(|(len_a, first_a), (len_b, first_b)| len_a.cmp(len_b).then(first_b.cmp(first_a)))
        .map(|(_, first)| first)
}

impl State {
    /// Removes `id`; returns its entry.
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        forget(&mut self.by_address, entry.ip, id);
        forget(&mut self.hello_by_address, entry.ip, id);
        Some(entry)
    }

    /// The handshake of `ip` to give way: its oldest still waiting for its ClientHello,
    /// else its oldest.
    fn victim_of(&self, ip: IpAddr) -> Option<u64> {
        let oldest = |map: &HashMap<IpAddr, BTreeSet<u64>>| map.get(&ip)?.first().copied();
        oldest(&self.hello_by_address).or_else(|| oldest(&self.by_address))
    }

    /// The handshake to give way on a full listener: the oldest still waiting for its
    /// ClientHello of the address holding the most such, else the oldest of the address
    /// holding the most handshakes.
    fn victim(&self) -> Option<u64> {
        oldest_of_busiest(&self.hello_by_address).or_else(|| oldest_of_busiest(&self.by_address))
    }

    /// Handshakes still waiting for their ClientHello.
    #[cfg(test)]
    fn hello_count(&self) -> usize {
        self.hello_by_address.values().map(BTreeSet::len).sum()
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
            && let Some(id) = state.victim_of(ip)
            && let Some(entry) = state.remove(id)
        {
            entry.evict.cancel();
            evicted += 1;
        }
        if state.entries.len() >= self.max
            && let Some(id) = state.victim()
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
                evict: evict.clone(),
            },
        );
        state.by_address.entry(ip).or_default().insert(id);
        state.hello_by_address.entry(ip).or_default().insert(id);
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
        (state.entries.len(), state.hello_count())
    }
}

impl Ticket {
    /// The whole ClientHello arrived: from now on this handshake gives way only after every
    /// one still waiting for theirs.
    pub(super) fn hello_received(&self) {
        let mut state = self.handshakes.state.lock();
        let Some(ip) = state.entries.get(&self.id).map(|entry| entry.ip) else {
            return;
        };
        forget(&mut state.hello_by_address, ip, self.id);
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
    fn an_agent_alone_on_its_address_outlasts_stallers_reopening_from_many() {
        let handshakes = Handshakes::new(8, 8);
        // Its ClientHello not read yet (its task not run): as stalled as the flood, for now.
        let (genuine, _) = handshakes.admit(ip(1));
        let mut flood = Vec::new();
        let mut evictions = 0;
        for n in 0..1_000u16 {
            let (ticket, evicted) = handshakes.admit(ip(2 + (n % 3) as u8));
            evictions += evicted;
            flood.push(ticket);
            flood.retain(|t| !t.evicted.is_cancelled());
        }
        assert_eq!(evictions, 1_000 - 7);
        assert!(!genuine.evicted.is_cancelled());
        assert_eq!(handshakes.counts(), (8, 8));
        // Once no address holds two, the oldest stalled handshake gives way, wherever it is.
        drop(flood.drain(1..));
        let others: Vec<_> = (20..26).map(|last| handshakes.admit(ip(last))).collect();
        assert!(others.iter().all(|(_, evicted)| *evicted == 0));
        let (_, evicted) = handshakes.admit(ip(30));
        assert_eq!(evicted, 1);
        assert!(genuine.evicted.is_cancelled());
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
