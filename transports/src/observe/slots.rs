//! Which connection a full server closes for a new one ([`Slots`]), I/O free.

use std::sync::Arc;

/// Most connections served at once (a scraper and a prober need two); a further one makes
/// room for itself ([`Slots`]).
pub const MAX_CONNECTIONS: usize = 32;

/// Most connections from one IP address; a further one closes that address's oldest.
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 4;

/// A server's connections by peer address, and which to close for a new one: one of the new
/// one's own address when it holds `per_address` ([`MAX_CONNECTIONS_PER_ADDRESS`] for the
/// observe server), else, when `max` ([`MAX_CONNECTIONS`]) are open, one of the address
/// that holds the most. So one address flooding a server closes its own connections, never
/// everyone else's (a limit that refused new connections would let it keep the others out).
///
/// A connection whose server marked its [`Succeeded`] (the resource metrics server does at
/// a `200`) is closed last: the one closed is the oldest connection not yet marked (of the
/// new one's address, or of the address holding the most connections not yet marked);
/// only when every candidate is marked, the oldest of them. So connections churned by many
/// addresses displace each other, not a scraper's long-lived connection that is being
/// served. A server that marks none (the observe server) closes the oldest, as before.
///
/// I/O free: `H` is what closes a connection (a task's `AbortHandle` in a server).
#[derive(Debug)]
pub struct Slots<H = tokio::task::AbortHandle> {
    /// In the order connections came: the first of an address is its oldest.
    open: Vec<Slot<H>>,
    max: usize,
    per_address: usize,
}

/// One open connection of [`Slots`].
#[derive(Debug)]
struct Slot<H> {
    ip: std::net::IpAddr,
    handle: H,
    succeeded: Succeeded,
}

/// Whether a connection has been served a success (for the resource metrics server: a
/// `200` to an authenticated and authorized request), which [`Slots`] reads when it must
/// close one. Shared between the server's accept loop and the connection's task: clones
/// mark the same connection. Unmarked at first; a mark is never taken back.
#[derive(Debug, Clone, Default)]
pub struct Succeeded(Arc<std::sync::atomic::AtomicBool>);

impl Succeeded {
    /// Marks the connection as served a success.
    pub fn mark(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether [`Succeeded::mark`] was called on this connection.
    pub fn is_marked(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl<H> Default for Slots<H> {
    /// The observe server's limits.
    fn default() -> Self {
        Self::new(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_ADDRESS)
    }
}

impl<H> Slots<H> {
    /// None open, at most `max` at once and `per_address` from one address (each at least
    /// 1).
    pub fn new(max: usize, per_address: usize) -> Self {
        Self {
            open: Vec::new(),
            max: max.max(1),
            per_address: per_address.max(1),
        }
    }
}

/// A handle that names its connection ([`Slots::remove`]).
pub trait SlotId {
    /// What names a connection.
    type Id: PartialEq;
    /// The connection's identity.
    fn slot_id(&self) -> Self::Id;
}

impl SlotId for tokio::task::AbortHandle {
    type Id = tokio::task::Id;
    fn slot_id(&self) -> tokio::task::Id {
        self.id()
    }
}

impl<H: SlotId> Slots<H> {
    /// Removes and returns the connections to close before one from `ip` is taken (none,
    /// or one; see [`Slots`] for which).
    pub fn make_room(&mut self, ip: std::net::IpAddr) -> Vec<H> {
        let own = self.open.iter().filter(|slot| slot.ip == ip).count();
        let victim = if own >= self.per_address {
            self.oldest_of(ip, false)
                .or_else(|| self.oldest_of(ip, true))
        } else if self.open.len() >= self.max {
            let unmarked = self
                .busiest(false)
                .and_then(|busiest| self.oldest_of(busiest, false));
            unmarked.or_else(|| {
                self.busiest(true)
                    .and_then(|busiest| self.oldest_of(busiest, true))
            })
        } else {
            None
        };
        victim
            .map(|i| vec![self.open.remove(i).handle])
            .unwrap_or_default()
    }

    /// Where the oldest connection from `ip` is: of those not marked [`Succeeded`], or of
    /// all when `marked_too`.
    fn oldest_of(&self, ip: std::net::IpAddr, marked_too: bool) -> Option<usize> {
        self.open
            .iter()
            .position(|slot| slot.ip == ip && (marked_too || !slot.succeeded.is_marked()))
    }

    /// The address holding the most connections not marked [`Succeeded`] (of all, when
    /// `marked_too`); of those, the one whose oldest came first. `None` when it holds none.
    fn busiest(&self, marked_too: bool) -> Option<std::net::IpAddr> {
        let candidates = || {
            self.open
                .iter()
                .filter(move |slot| marked_too || !slot.succeeded.is_marked())
        };
        let mut best: Option<(usize, std::net::IpAddr)> = None;
        for slot in candidates() {
            let n = candidates().filter(|other| other.ip == slot.ip).count();
            if best.is_none_or(|(most, _)| n > most) {
                best = Some((n, slot.ip));
            }
        }
        best.map(|(_, ip)| ip)
    }

    /// Records a connection from `ip`, closed by `handle`, whose server marks `succeeded`
    /// when it serves it a success (a clone of the one given to the connection).
    pub fn insert(&mut self, ip: std::net::IpAddr, handle: H, succeeded: Succeeded) {
        self.open.push(Slot {
            ip,
            handle,
            succeeded,
        });
    }

    /// Forgets the connection `id` (it ended).
    pub fn remove(&mut self, id: H::Id) {
        self.open.retain(|slot| slot.handle.slot_id() != id);
    }

    /// Connections open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}
