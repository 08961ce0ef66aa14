//! A node's mailbox: the one place where a node's messages wait, in order, for the
//! gateway. Every ingress hands it [`Letter`]s ([`super::Handler::deliver`]); the gateway
//! keeps one per node, beside that node's admission state, and handles the letters one at
//! a time. The rules of waiting live here, free of I/O and unit-tested without sockets (as
//! rumqttc's `MqttState` keeps MQTT's): the order, the bound, which letter a newer one
//! supersedes, and which is a copy.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use edgebeat_proto::{AgentMessage, Answer, BootSeq, MessageKind};
use tokio::time::Instant;

use super::{Peer, RejectReason};

/// One message on its way to the gateway: who sent it, what, when the ingress took it,
/// and where its answer goes.
pub struct Letter {
    /// Where it came from, as far as the transport knows.
    pub peer: Peer,
    /// The decoded message, with its header completed by the transport (compact headers
    /// restored). Boxed: a waiting letter costs a pointer, not the largest message kind.
    pub message: Box<AgentMessage>,
    /// When the ingress took it: the heartbeat's freshness budget
    /// (`GatewayOptions::max_renewal_age`) runs from here, time spent waiting included.
    pub received: Instant,
    /// Where the answer goes, once.
    pub reply: Box<dyn Reply>,
}

impl Letter {
    /// A letter of `message` from `peer`, received now, answered through `reply`.
    pub fn new(peer: Peer, message: AgentMessage, reply: impl Reply) -> Self {
        Self {
            peer,
            message: Box::new(message),
            received: Instant::now(),
            reply: Box::new(reply),
        }
    }

    /// The letter's kind and place in its boot when it may supersede or be superseded:
    /// an identified message (the transport authenticated its node, so nobody else could
    /// have sent it) with a header. Unidentified letters take part in neither rule: anyone
    /// may have sent them, and they must not cost the node a write.
    fn identified_at(&self) -> Option<(Option<MessageKind>, BootSeq)> {
        self.peer.identity.as_ref()?;
        let header = self.message.header()?;
        Some((self.message.message_kind(), header.boot_seq()))
    }
}

impl std::fmt::Debug for Letter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Letter")
            .field("peer", &self.peer)
            .field("kind", &self.message.kind_name())
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

/// A future a [`Reply`] returns, boxed: replies of every transport wait in one mailbox.
pub type Sending = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Where a letter's answer goes: the transport's way back to the agent (a gRPC stream's
/// next `GatewayMessage`, an MQTT PUBLISH on the node's ack topic). `None` is no answer
/// (a replay), and sends nothing. Dropping a reply unsent is no answer too.
pub trait Reply: Send + Sync + 'static {
    /// Sends `answer`, waiting for room on the link when there is none (the handling task
    /// waits; the transport's other work does not).
    fn send(self: Box<Self>, answer: Option<Answer>) -> Sending;

    /// Sends `answer` without waiting, from code that must not wait (an ingress's event
    /// loop): when the link has no room it is dropped and logged, and the agent's own
    /// timeout and retry cover it.
    fn send_now(self: Box<Self>, answer: Option<Answer>);
}

/// The answer goes back to a task awaiting the receiver (a gRPC stream, a direct call).
impl Reply for tokio::sync::oneshot::Sender<Option<Answer>> {
    fn send(self: Box<Self>, answer: Option<Answer>) -> Sending {
        self.send_now(answer);
        Box::pin(std::future::ready(()))
    }

    fn send_now(self: Box<Self>, answer: Option<Answer>) {
        // The receiver gone is an agent gone: nobody to answer.
        let _ = (*self).send(answer);
    }
}

/// What posting a letter did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Posted {
    /// No letter was being handled: the caller starts handling this mailbox's letters
    /// ([`Mailbox::next_turn`] until `None`). Otherwise the running handler reaches it.
    pub start: bool,
    /// How many waiting letters the new one superseded (marked, see [`Turn::Superseded`]).
    pub superseded: usize,
    /// How many superseded letters were dropped unanswered to keep at most `capacity` of
    /// them waiting for their answer (a node pouring out heartbeats faster than one is
    /// handled).
    pub dropped: usize,
}

/// A letter's turn, from [`Mailbox::next_turn`].
#[derive(Debug)]
pub enum Turn {
    /// Handle it.
    Handle(Letter),
    /// A newer heartbeat of its kind and boot was posted while it waited: answer it
    /// `superseded` ([`Answer::superseded`]) and do not handle it, unless it is a replay
    /// (which gets no answer: anyone who can copy a node's messages must not make the
    /// gateway speak on the node's link). Answered at its turn, by whoever holds the
    /// node's state and so can tell a replay.
    Superseded(Letter),
}

/// A letter waiting, and whether a newer one superseded it.
#[derive(Debug)]
struct Waiting {
    letter: Letter,
    superseded: bool,
}

/// A node's letters waiting to be handled, in arrival order, at most one handled at a
/// time. Latest wins among identified heartbeats: a Lease renewal or status report
/// supersedes the waiting ones of its kind and boot with a lower sequence number, so after
/// a backlog (a slow apiserver) only the newest is written, one write per node and kind,
/// not one per message. A Register is never superseded (each one re-registers). A
/// superseded letter keeps its place until its turn ([`Turn::Superseded`]), but no longer
/// counts against the capacity.
#[derive(Debug, Default)]
pub struct Mailbox {
    letters: VecDeque<Waiting>,
    /// Someone handles this mailbox's letters (the one whose post said `start`), until
    /// [`Mailbox::next_turn`] finds none: at most one at a time, so letters are handled in order.
    draining: bool,
    /// A letter was handed out by [`Mailbox::next_turn`] and its handler has not come back.
    handling: bool,
    /// Where the newest identified letter posted stands (waiting, handled, or rejected as
    /// [`RejectReason::QueueFull`]): what a copy ([`RejectReason::Replayed`], see
    /// [`Mailbox::post`]) compares with.
    newest: Option<BootSeq>,
}

impl Mailbox {
    /// Posts `letter`, which may wait behind at most `capacity` others still to be handled
    /// (the one being handled not counted), plus at most `capacity` superseded ones waiting
    /// for their answer: a node has at most 2 × `capacity` + 1 letters in the gateway.
    ///
    /// # Errors
    ///
    /// Why the letter is rejected, with the letter given back (boxed: rejections are rare,
    /// posts are not):
    /// - [`RejectReason::Replayed`]: an identified letter of the boot of the newest
    ///   identified one posted, which it does not supersede ([`BootSeq::supersedes`]): the
    ///   agent never sends a sequence number twice in a boot, so it is a copy (a replay, or
    ///   an MQTT QoS 1 redelivery), rejected before it takes a place.
    /// - [`RejectReason::QueueFull`]: the mailbox holds its capacity already (letters
    ///   waiting plus the one being handled): one node's flood cannot grow the gateway's
    ///   memory or starve other nodes. A letter rejected as full still counts as the newest
    ///   posted: the agent never sends its sequence number again.
    ///
    /// Neither is answered: a copy's sender, if genuine, had or will have its answer; a full
    /// mailbox's sender is flooding.
    pub fn post(
        &mut self,
        letter: Letter,
        capacity: usize,
    ) -> Result<Posted, (RejectReason, Box<Letter>)> {
        let identified = letter.identified_at();
        if let Some((_, at)) = identified {
            match self.newest {
                Some(newest) if newest.boot_tag == at.boot_tag && !at.supersedes(newest) => {
                    return Err((RejectReason::Replayed, Box::new(letter)));
                }
                _ => self.newest = Some(at),
            }
        }
        // Which waiting letters this one supersedes: identified heartbeats of its kind and
        // boot with a lower sequence number, not superseded already.
        let supersedes = |waiting: &Waiting| {
            !waiting.superseded
                && matches!(
                    (identified, waiting.letter.identified_at()),
                    (Some((Some(kind), newer)), Some((Some(k), older)))
                        if kind.heartbeat_index().is_some() && k == kind && newer.supersedes(older)
                )
        };
        // Only letters still to be handled count against the capacity, the ones this one
        // supersedes no longer: a newer heartbeat always has room, so after a backlog it is
        // the newest that is written. Nothing is marked for a letter rejected.
        let live = self.letters.iter().filter(|w| !w.superseded).count();
        let superseded = self.letters.iter().filter(|w| supersedes(w)).count();
        if live - superseded + usize::from(self.handling) > capacity {
            return Err((RejectReason::QueueFull, Box::new(letter)));
        }
        for waiting in self.letters.iter_mut() {
            if supersedes(waiting) {
                waiting.superseded = true;
            }
        }
        // Superseded letters wait for their answer, at most `capacity` of them: beyond, the
        // oldest is dropped unanswered (its agent's timeout covers it; a newer one waits).
        let waiting_answer = self.letters.iter().filter(|w| w.superseded).count();
        let dropped = waiting_answer.saturating_sub(capacity);
        let mut excess = dropped;
        self.letters.retain(|w| {
            let drop = w.superseded && excess > 0;
            excess -= usize::from(drop);
            !drop
        });
        let start = !self.draining;
        self.draining = true;
        self.letters.push_back(Waiting {
            letter,
            superseded: false,
        });
        Ok(Posted {
            start,
            superseded,
            dropped,
        })
    }

    /// The next letter to handle, marking the mailbox as handling it; `None` when none is
    /// waiting, and the mailbox is then idle (the next [`Mailbox::post`] says `start`).
    /// Only the one who started handling calls it, after the previous letter was answered.
    pub fn next_turn(&mut self) -> Option<Turn> {
        let Some(waiting) = self.letters.pop_front() else {
            self.draining = false;
            self.handling = false;
            self.letters.shrink_to_fit();
            return None;
        };
        self.handling = true;
        Some(if waiting.superseded {
            Turn::Superseded(waiting.letter)
        } else {
            Turn::Handle(waiting.letter)
        })
    }

    /// Handling stopped abnormally (the handler panicked or its task was cancelled): the
    /// next [`Mailbox::post`] starts handling again, the waiting letters included.
    pub fn stopped(&mut self) {
        self.draining = false;
        self.handling = false;
    }

    /// Whether a letter waits or is being handled: a busy mailbox's node is never evicted.
    pub fn is_busy(&self) -> bool {
        self.draining || !self.letters.is_empty()
    }

    /// Letters waiting, superseded ones included (not counting the one being handled).
    pub fn len(&self) -> usize {
        self.letters.len()
    }

    /// Whether no letter is waiting.
    pub fn is_empty(&self) -> bool {
        self.letters.is_empty()
    }
}

#[cfg(test)]
mod tests;
