//! The gateway's side of every transport: where a message came from, and the handler that
//! answers it.

use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{
    AgentMessage, Answer, GatewayMessage, HeaderForm, SharedUsage, gateway_message,
};

mod mailbox;
pub use mailbox::{Letter, Mailbox, Posted, Reply, Sending, Turn};

/// Which transport carried a message (a metric label and log field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// The gRPC `Heartbeat.Connect` stream.
    Grpc,
    /// MQTT through a broker.
    Mqtt,
}

impl TransportKind {
    /// Lower-case name: `grpc` or `mqtt`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::Mqtt => "mqtt",
        }
    }
}

/// What a message asked, noted before it goes to the [`Handler`], to shape the answer: the
/// one answering rule of every ingress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    seq: u64,
    boot_tag: u32,
    quiet: bool,
}

impl Asked {
    /// What `message` asks: its `Header.seq` (0 without a header), its boot
    /// ([`edgebeat_proto::Header::named_boot_tag`]), and whether it is quiet
    /// ([`AgentMessage::is_quiet`]).
    pub fn of(message: &AgentMessage) -> Self {
        Self {
            seq: message.header().map_or(0, |h| h.seq),
            boot_tag: message
                .header()
                .map_or(0, edgebeat_proto::Header::named_boot_tag),
            quiet: message.is_quiet(),
        }
    }

    /// The boot of the message asked, as its boot tag: what a signed answer binds
    /// (`Ack.boot_tag`).
    pub fn boot_tag(self) -> u32 {
        self.boot_tag
    }

    /// The answer to send for `answer`, or `None`:
    /// - no answer from the handler (a replay: the sender, if genuine, had its answer
    ///   already, and a replayed message must not make the gateway speak on a node's
    ///   link) is none on the wire;
    /// - an accepted `Register` says quiet messages may now be compact
    ///   ([`HeaderForm::CompactBootTag`], whatever form the handler put in its
    ///   [`Answer::Registered`]): every ingress restores what they leave out, gRPC
    ///   from the stream's `Register`, MQTT from the topic; and MQTT may name the boot by
    ///   `Header.boot_tag`, which the gateway's admission resolves;
    /// - a quiet message that was written gets no answer, nothing on the link
    ///   ([`edgebeat_proto::answer_needed`]).
    pub fn answer(self, answer: Option<Answer>) -> Option<GatewayMessage> {
        let mut answer = answer?;
        if let Answer::Registered { headers, .. } = &mut answer {
            *headers = HeaderForm::CompactBootTag;
        }
        let needed = edgebeat_proto::answer_needed(self.quiet, &answer);
        needed.then(|| GatewayMessage {
            kind: Some(gateway_message::Kind::Ack(answer.into_ack(self.seq))),
        })
    }
}

/// Where a message came from, as far as the transport knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Transport that carried it.
    pub transport: TransportKind,
    /// Remote socket address (gRPC) or `None` (MQTT: the broker is the socket peer).
    pub remote: Option<SocketAddr>,
    /// Node name the transport authenticated (mTLS `system:node:<name>`, or a verified MQTT
    /// message signature), when it did. `None` means "unidentified"; the gateway decides
    /// whether that is allowed.
    pub identity: Option<NodeName>,
    /// The message's `Header.wall_time_ms` is covered by the authentication and was checked
    /// against the gateway's clock by the transport (a signed MQTT message inside its clock
    /// window), so the gateway may order boots by it. False for everything else.
    pub wall_time_verified: bool,
    /// The certificate that authenticated [`Peer::identity`] (the mTLS client certificate,
    /// or the one an MQTT signature verified with), when there is an identity.
    pub certificate: Option<CertificateId>,
}

pub use crate::tls::CertificateId;

impl Peer {
    /// A peer of `transport` at `remote` with no identity (nothing authenticated yet).
    pub fn unidentified(transport: TransportKind, remote: Option<SocketAddr>) -> Self {
        Self {
            transport,
            remote,
            identity: None,
            wall_time_verified: false,
            certificate: None,
        }
    }
}

/// Answers agent messages. Implemented by the gateway; transports call it.
pub trait Handler: Send + Sync + 'static {
    /// Handles one decoded message from `peer` and returns the [`Answer`] to send back (the
    /// transport encodes it as the `Ack` of the message's `Header.seq`, see [`Asked`]), or
    /// `None` for a message rejected without an answer (a replay). Messages of one
    /// connection are handled in order, one at a time.
    fn handle(
        &self,
        peer: &Peer,
        message: AgentMessage,
    ) -> impl Future<Output = Option<Answer>> + Send;

    /// Takes one message without waiting (the ingress's event loop calls it) and answers
    /// it later through the letter's [`Reply`]: every ingress hands its messages here. The
    /// gateway posts it to the node's [`Mailbox`], where it waits in order, one handled at
    /// a time per node; a newer heartbeat may supersede it there.
    ///
    /// The default, for handlers that keep no per-node state (benchmarks' ack-only
    /// handlers), handles each letter at once in a task of its own, through
    /// [`Handler::handle`], with no per-node order.
    fn deliver(self: Arc<Self>, letter: Letter) {
        tokio::spawn(async move {
            let Letter {
                peer,
                message,
                reply,
                ..
            } = letter;
            let answer = self.handle(&peer, *message).await;
            reply.send(answer).await;
        });
    }

    /// Called when the transport rejected something from `peer` before the handler could see
    /// a message (undecodable, oversized, unauthenticated, a failed TLS handshake, a bad
    /// signature); the transport drops it and keeps serving. `reason` is the metric label,
    /// `detail` a short text for logs.
    fn rejected(&self, peer: &Peer, reason: RejectReason, detail: &str);

    /// Handles one certificate request (the enrollment endpoint's `payload`: an encoded
    /// `CertificateRequest`, or a `SignedMessage` of one; see
    /// [`edgebeat_proto::CertificateRequest`]) from `peer`, which over MQTT came on the topic
    /// of node `topic_node`; returns the answer to send back (an encoded `SignedAnswer`), or
    /// `None` to send nothing (a replay, the rate limit). The default handles none: a
    /// gateway without enrollment answers nothing.
    fn request_certificate(
        &self,
        peer: &Peer,
        topic_node: Option<&str>,
        payload: Vec<u8>,
    ) -> impl Future<Output = Option<Vec<u8>>> + Send {
        let _ = (peer, topic_node, payload);
        std::future::ready(None)
    }

    /// The certificate the cluster records for `node` (see [`CertificateId`]), if any: a
    /// transport that learns certificates from a third party (MQTT's retained copies)
    /// never believes one older than it. The default records nothing.
    fn recorded_certificate(&self, node: &str) -> Option<CertificateId> {
        let _ = node;
        None
    }

    /// The uplink of `site` (a zone, or `region/zone`) is `up` or down, as the site
    /// broker's bridge notifications say (MQTT: `P/sites/{site}/uplink`, see
    /// [`crate::mqtt::uplink_topic`]; a retained state cleared counts as up). Called in
    /// arrival order, for the retained state
    /// when the ingress subscribes and for every change after; must not block. The default
    /// ignores it.
    fn site_uplink(&self, site: &str, up: bool) {
        let _ = (site, up);
    }

    /// A usage sample another replica admitted and shared (MQTT: in a batch on `P/usage`,
    /// see [`crate::mqtt::usage_topic`]), of the node `usage.node_name` (a valid node name),
    /// its batch verified as a gateway's where the replicas sign
    /// ([`crate::mqtt::MqttIngressOptions::usage_verifier`]). Called in arrival order in the
    /// ingress's event loop; must not block. The default ignores it.
    fn shared_usage(&self, usage: SharedUsage) {
        let _ = usage;
    }
}

/// Where a replica puts the usage samples it admits for the other replicas (each names its
/// node, `SharedUsage.node_name`): a broadcast channel the MQTT ingress publishes from
/// ([`crate::mqtt::MqttIngressOptions::usage_sharing`]). Lossy by design: a sample that
/// finds the channel full or the broker away is dropped, and the next, 20 s later, takes
/// its place.
pub type UsageOutbox = tokio::sync::broadcast::Sender<SharedUsage>;

/// A message rejected, by a transport or by the gateway: its [`RejectReason`] (the metric
/// label) and a detail for logs and, when the rejection is answered, for the answer
/// (`Answer::Rejected`'s reason). Transports name theirs as constants with a fixed detail
/// (e.g. the MQTT ingress's `REJECT_MALFORMED`); where the detail names the case (a node
/// name, a sequence number, by how much a clock is off) it is an owned text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The metric label.
    pub reason: RejectReason,
    /// What exactly was wrong, for logs and answers: a fixed text (`unknown topic`,
    /// borrowed) or one naming the case (`seq 7 ≤ last accepted 9`, owned).
    pub detail: Cow<'static, str>,
}

impl Rejection {
    /// A rejection for `reason` with `detail` (a `&'static str` or a `String`).
    pub fn new(reason: RejectReason, detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}

/// Why a message was rejected, by a transport or by the gateway: the `reason` label of the
/// gateway's `edgebeat_gateway_rejected_messages_total`. A fixed set, so the series are
/// bounded; the detail of each case goes to logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RejectReason {
    /// Does not decode, or lacks what every message needs (header, kind, status); an
    /// unknown MQTT topic.
    Malformed,
    /// Larger than the decode limit (64 KiB).
    TooLarge,
    /// Decodes but is rejected by validation, NodeRestriction or the apiserver (422).
    Invalid,
    /// Speaks for another node than its authenticated identity, or its MQTT topic names
    /// another node than its header.
    Foreign,
    /// A sequence number not above the last accepted one of its boot, or an earlier boot.
    Replayed,
    /// Over the per-node message rate.
    RateLimited,
    /// Dropped because the node's mailbox was full (a flood from that node, see
    /// [`Mailbox`]), or, over MQTT, because too many certificate requests were in flight.
    QueueFull,
    /// No node identity where one is required: a gRPC stream without a node's client
    /// certificate, any message without an identity when the gateway requires identities,
    /// or an unidentified message for a node that has spoken with its identity.
    Unauthenticated,
    /// gRPC: the TLS handshake failed (unknown CA, expired, no certificate, not TLS).
    TlsHandshake,
    /// MQTT: unsigned while signatures are required.
    Unsigned,
    /// MQTT: the signature does not verify with the node's certificate.
    BadSignature,
    /// MQTT: signed, but no verified certificate is held for the node.
    UnknownSigner,
    /// MQTT: a verified message whose signed wall time is outside the clock window (a
    /// recorded message replayed later, or an agent with a wrong clock).
    ClockSkew,
    /// MQTT: a node certificate refused (wrong CA, expired, another node's), or a message
    /// signed under a certificate that has expired since.
    Certificate,
    /// A message for a node this replica has no room for: it already keeps state for its
    /// configured fleet size (`--max-nodes`), so a new node name is rejected before anything
    /// is allocated for it.
    FleetFull,
    /// A Lease renewal or status report not written because a newer one of the same kind
    /// from the same (identified) node was already waiting: after a backlog only the newest
    /// is written. Not a fault of the sender; logged at debug level only.
    Superseded,
    /// A quiet MQTT message named its boot by `Header.boot_tag`, and this replica does not
    /// hold that boot for the node: answered RETRY with `Ack.send_boot_id`, and the agent's
    /// next message teaches it the boot. Routine after a reboot or a replica start (once per
    /// replica and boot); logged at debug level only.
    UnknownBoot,
}

impl RejectReason {
    /// Every reason, in label order.
    pub const ALL: [Self; 17] = [
        Self::Malformed,
        Self::TooLarge,
        Self::Invalid,
        Self::Foreign,
        Self::Replayed,
        Self::RateLimited,
        Self::QueueFull,
        Self::Unauthenticated,
        Self::TlsHandshake,
        Self::Unsigned,
        Self::BadSignature,
        Self::UnknownSigner,
        Self::ClockSkew,
        Self::Certificate,
        Self::FleetFull,
        Self::Superseded,
        Self::UnknownBoot,
    ];

    /// The label value, snake_case: `malformed`, `too_large`, `bad_signature`…
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::TooLarge => "too_large",
            Self::Invalid => "invalid",
            Self::Foreign => "foreign",
            Self::Replayed => "replayed",
            Self::RateLimited => "rate_limited",
            Self::QueueFull => "queue_full",
            Self::Unauthenticated => "unauthenticated",
            Self::TlsHandshake => "tls_handshake",
            Self::Unsigned => "unsigned",
            Self::BadSignature => "bad_signature",
            Self::UnknownSigner => "unknown_signer",
            Self::ClockSkew => "clock_skew",
            Self::Certificate => "certificate",
            Self::FleetFull => "fleet_full",
            Self::Superseded => "superseded",
            Self::UnknownBoot => "unknown_boot",
        }
    }
}

/// Least time between two sweeps of a full [`NodeMap`] for a new node, 1 s.
pub const FULL_SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Per-node state bounded to `max` nodes, the one bounding rule of the gateway's per-node
/// slots and mailboxes (`--max-nodes`): a known node is always
/// found; a new one gets an entry only while there is room. When the map is full, a new
/// node makes room by one sweep of the idle entries (the caller's rule of idle), at most
/// once per [`FULL_SWEEP_INTERVAL`], so a flood of made-up names costs one scan of the map
/// per second, not one each. Keys are Node names (`K` borrows as `str`).
#[derive(Debug)]
pub struct NodeMap<K, V> {
    entries: std::collections::HashMap<K, V>,
    max: usize,
    last_full_sweep: Option<tokio::time::Instant>,
}

impl<K: std::hash::Hash + Eq + std::borrow::Borrow<str>, V> NodeMap<K, V> {
    /// An empty map of at most `max` nodes.
    pub fn new(max: usize) -> Self {
        Self {
            entries: std::collections::HashMap::new(),
            max,
            last_full_sweep: None,
        }
    }

    /// Most nodes the map holds.
    pub fn max(&self) -> usize {
        self.max
    }

    /// How many nodes have an entry.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no node has an entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry of `node`.
    pub fn get(&self, node: &str) -> Option<&V> {
        self.entries.get(node)
    }

    /// The entry of `node`, mutable.
    pub fn get_mut(&mut self, node: &str) -> Option<&mut V> {
        self.entries.get_mut(node)
    }

    /// Removes the entry of `node`.
    pub fn remove(&mut self, node: &str) -> Option<V> {
        self.entries.remove(node)
    }

    /// Keeps the entries for which `keep` holds (a sweep).
    pub fn retain(&mut self, keep: impl FnMut(&K, &mut V) -> bool) {
        self.entries.retain(keep);
    }

    /// Every entry.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter()
    }

    /// The entry of `node`, made with `make` when it has none and there is room. When the
    /// map is full, `sweep` runs first, unless a full map was swept less than
    /// [`FULL_SWEEP_INTERVAL`] ago; then `make_room` may free one entry (say, give an
    /// identified node the slot of an unidentified one; `|_| false` for none).
    ///
    /// Errors: `None` when the map stays full: the caller rejects the message
    /// (`FleetFull`), and nothing is kept for the node.
    pub fn get_or_make(
        &mut self,
        node: &str,
        make: impl FnOnce() -> (K, V),
        sweep: impl FnOnce(&mut Self),
        make_room: impl FnOnce(&mut Self) -> bool,
    ) -> Option<&mut V> {
        if !self.entries.contains_key(node) {
            if self.entries.len() >= self.max {
                let now = tokio::time::Instant::now();
                if self
                    .last_full_sweep
                    .is_none_or(|at| now.duration_since(at) >= FULL_SWEEP_INTERVAL)
                {
                    self.last_full_sweep = Some(now);
                    sweep(self);
                }
                if self.entries.len() >= self.max && !make_room(self) {
                    return None;
                }
            }
            let (key, value) = make();
            self.entries.insert(key, value);
        }
        self.entries.get_mut(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full map makes room by a sweep at most once per second, and then by the caller's
    /// own rule; a known node is always found.
    #[tokio::test(start_paused = true)]
    async fn a_full_node_map_sweeps_at_most_once_a_second() {
        // Values say whether the node is busy (1) or idle (0); the sweep drops idle ones.
        let mut map: NodeMap<String, u32> = NodeMap::new(2);
        let sweeps = std::cell::Cell::new(0);
        let get = |map: &mut NodeMap<String, u32>, node: &str, evict: bool| {
            map.get_or_make(
                node,
                || (node.to_owned(), 1),
                |m| {
                    sweeps.set(sweeps.get() + 1);
                    m.retain(|_, busy| *busy > 0);
                },
                |m| evict && m.remove("a").is_some(),
            )
            .is_some()
        };
        assert!(get(&mut map, "a", false));
        assert!(get(&mut map, "b", false));
        assert!(!get(&mut map, "c", false), "full: nothing idle");
        assert!(
            !get(&mut map, "d", false),
            "no second sweep within a second"
        );
        assert!(get(&mut map, "a", false), "a known node is found");
        assert!(get(&mut map, "e", true), "the caller's rule made room");
        assert_eq!(map.len(), 2);
        assert!(map.get("a").is_none() && map.get("e").is_some());
        if let Some(b) = map.get_mut("b") {
            *b = 0;
        }
        tokio::time::advance(FULL_SWEEP_INTERVAL).await;
        assert!(
            get(&mut map, "f", false),
            "a sweep a second later dropped b"
        );
        assert!(map.get("b").is_none() && map.len() == 2);
        assert_eq!(sweeps.get(), 2);
    }
    use edgebeat_proto::{Ack, Header, LeaseRenewal, Register, agent_message};

    fn answered(message: &AgentMessage, answer: Answer) -> Option<Ack> {
        match Asked::of(message).answer(Some(answer))?.kind? {
            gateway_message::Kind::Ack(ack) => Some(ack),
            gateway_message::Kind::Certificate(_) => None,
        }
    }

    #[test]
    fn an_accepted_register_allows_compact_headers_and_written_quiet_messages_are_silent() {
        let header = Some(Header {
            seq: 5,
            ..Header::default()
        });
        let register = AgentMessage {
            kind: Some(agent_message::Kind::Register(Register {
                header: header.clone(),
                ..Register::default()
            })),
        };
        let accepted = Answer::Registered {
            headers: HeaderForm::Full,
            resend_status: false,
            certificate_due: false,
        };
        let accepted_ack = answered(&register, accepted).unwrap();
        assert_eq!(accepted_ack.seq, 5, "answers the message's seq");
        assert!(accepted_ack.compact_headers && accepted_ack.boot_tags);
        let refused = answered(
            &register,
            Answer::Retry {
                reason: "later".into(),
            },
        )
        .unwrap();
        assert!(!refused.compact_headers && !refused.boot_tags && !refused.registered);

        let quiet = AgentMessage {
            kind: Some(agent_message::Kind::Lease(LeaseRenewal {
                header,
                quiet: true,
                ..LeaseRenewal::default()
            })),
        };
        assert_eq!(answered(&quiet, Answer::WRITTEN), None, "written: silence");
        let retry = Answer::Retry {
            reason: "later".into(),
        };
        assert_eq!(
            answered(&quiet, retry.clone()),
            Some(retry.into_ack(5)),
            "news is answered"
        );
        assert_eq!(Asked::of(&register).answer(None), None, "no answer: none");
    }
}
