//! The `edgebeat.v1` wire contract: protobuf messages shared by every transport.
//!
//! The Rust code in `src/gen/` is generated from `edgebeat/v1/heartbeat.proto` by
//! `tonic-prost-build` (through the pure-Rust `protox` compiler) and committed, so building
//! needs no `protoc`. The test `tests/generated.rs` fails when the committed code is stale;
//! run it with `EDGEBEAT_REGENERATE=1` to rewrite it.
//!
//! Features: `grpc-client` adds the tonic client for the `Heartbeat` service (agent side),
//! `grpc-server` the tonic server (gateway side). Without either, only the messages are
//! compiled, which is all an MQTT-only agent needs.
//!
//! Modules, one a line:
//! - `v1`: the generated `edgebeat.v1` messages (and the `Heartbeat` client and server behind features), re-exported at the crate root.
//! - [`answer`]: the gateway's answer to one message as a type ([`Answer`]), from and to an `Ack`.
//! - `conditions`: the words of NodeConditions and their Events ([`NodeConditionType`], [`EventType`]).
//! - [`registration`]: what a registration may carry; the Node name ([`registration::NodeName`]).
//! - `codec`: tonic's codec with buffers sized to edgebeat's messages (features `grpc-*`).

// Production functions of at most 100 lines (clippy.toml's too-many-lines-threshold,
// issue 51): a longer one is split into named steps. Tests are exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

/// The `edgebeat.v1` package: messages, and the `Heartbeat` service behind features.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    include!("gen/edgebeat.v1.rs");
}

pub use v1::*;

pub mod answer;
mod conditions;
pub mod registration;

pub use answer::{AckError, Answer, HeaderForm};
pub use conditions::{ConditionReason, ConditionStatus, EventType, NodeConditionType};

/// The codec of the generated `Heartbeat` client and server: prost, with buffers sized to
/// edgebeat's messages instead of tonic's 8 KiB default.
///
/// tonic keeps one encode and one decode buffer per stream for its whole life; every
/// agent holds one stream, so a gateway with 10,000 agents held 160 MB of them (measured
/// with heaptrack: `tonic/src/codec/decode.rs` and `encode.rs`, 8 KiB each per stream). A
/// renewal is tens of bytes and a full NodeStatus well under 2 KiB; a buffer grows when a
/// message needs it (up to [`MAX_AGENT_MESSAGE_BYTES`]), so nothing larger is refused.
#[cfg(any(feature = "grpc-client", feature = "grpc-server"))]
pub mod codec {
    use tonic::codec::{BufferSettings, Codec};
    use tonic_prost::ProstCodec;

    /// Initial size of a stream's encode and decode buffer, in bytes (512 B).
    pub const BUFFER_BYTES: usize = 512;

    /// Encoded bytes after which an encoder yields to the runtime (tonic's default,
    /// 32 KiB).
    pub const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

    /// [`ProstCodec`] with [`BUFFER_BYTES`] buffers.
    #[derive(Debug, Clone, Copy)]
    pub struct SmallBufferCodec<T, U>(std::marker::PhantomData<(T, U)>);

    impl<T, U> Default for SmallBufferCodec<T, U> {
        fn default() -> Self {
            Self(std::marker::PhantomData)
        }
    }

    impl<T, U> Codec for SmallBufferCodec<T, U>
    where
        T: prost::Message + Send + 'static,
        U: prost::Message + Default + Send + 'static,
    {
        type Encode = T;
        type Decode = U;
        type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
        type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

        fn encoder(&mut self) -> Self::Encoder {
            ProstCodec::<T, U>::raw_encoder(BufferSettings::new(
                BUFFER_BYTES,
                YIELD_THRESHOLD_BYTES,
            ))
        }

        fn decoder(&mut self) -> Self::Decoder {
            ProstCodec::<T, U>::raw_decoder(BufferSettings::new(
                BUFFER_BYTES,
                YIELD_THRESHOLD_BYTES,
            ))
        }
    }
}

/// Largest encoded [`AgentMessage`] a receiver accepts, in bytes (64 KiB).
///
/// A full NodeStatus is well under 2 KiB; the limit only has to stop abuse. Every decode
/// path (gRPC max message size, MQTT max packet size) uses this value.
pub const MAX_AGENT_MESSAGE_BYTES: usize = 64 * 1024;

/// Most entries of `StatusReport.journal` (64): the agent keeps no more, the gateway takes
/// the newest 64 of a longer one.
pub const MAX_JOURNAL_ENTRIES: usize = 64;

/// Oldest transition a journal carries (30 days before its message): the agent drops
/// older ones, the gateway skips them.
pub const MAX_JOURNAL_AGE: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// Length of a binary boot ID in [`Header::boot_id`], in bytes (a UUID).
pub const BOOT_ID_BYTES: usize = 16;

/// Encodes a textual boot ID (`/proc/sys/kernel/random/boot_id`, e.g.
/// `"0f8fad5b-d9cb-469f-a165-70867728950e"`) into the 16-byte form of [`Header::boot_id`].
///
/// A string that is not a hyphenated or plain 32-hex-digit UUID is carried as its UTF-8
/// bytes instead, so nothing is lost; [`boot_id_to_string`] reverses both forms.
pub fn boot_id_to_bytes(boot_id: &str) -> Vec<u8> {
    let hex: Vec<u8> = boot_id.bytes().filter(|b| *b != b'-').collect();
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    if hex.len() == 2 * BOOT_ID_BYTES && boot_id.len() <= 36 {
        let mut out = Vec::with_capacity(BOOT_ID_BYTES);
        for pair in hex.chunks_exact(2) {
            match (nibble(pair[0]), nibble(pair[1])) {
                (Some(hi), Some(lo)) => out.push(hi << 4 | lo),
                _ => return boot_id.as_bytes().to_vec(),
            }
        }
        return out;
    }
    boot_id.as_bytes().to_vec()
}

/// Renders [`Header::boot_id`] as kubelet reports `nodeInfo.bootID`: 16 bytes become the
/// lower-case hyphenated UUID (8-4-4-4-12), anything else is read as UTF-8 (lossy).
pub fn boot_id_to_string(bytes: &[u8]) -> String {
    if bytes.len() != BOOT_ID_BYTES {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let mut s = String::with_capacity(36);
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        s.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
    }
    s
}

/// [`Header::boot_tag`] of a boot ID (`boot_id` as [`Header::boot_id`] carries it): the
/// low 32 bits of its 64-bit FNV-1a hash. The [`fnv`] crate's hasher is FNV-1a 64 with the
/// standard offset basis and prime, fed the bytes alone (no length prefix), as the contract
/// (`edgebeat/v1/heartbeat.proto`) specifies.
pub fn boot_tag(boot_id: &[u8]) -> u32 {
    use std::hash::Hasher as _;
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(boot_id);
    // Truncation is the rule: the low 32 bits.
    hasher.finish() as u32
}

impl Header {
    /// The tag of the boot this header names: [`Header::boot_tag`] when it carries no boot
    /// ID, else the tag of its boot ID ([`boot_tag`]). Two headers of one boot have the same
    /// one, whichever way each names the boot.
    pub fn named_boot_tag(&self) -> u32 {
        if self.boot_id.is_empty() {
            self.boot_tag
        } else {
            boot_tag(&self.boot_id)
        }
    }

    /// The header's [`BootSeq`].
    pub fn boot_seq(&self) -> BootSeq {
        BootSeq {
            boot_tag: self.named_boot_tag(),
            seq: self.seq,
        }
    }
}

/// Where a message stands in its node's sequence: the boot it names
/// ([`Header::named_boot_tag`]) and its [`Header::seq`] (the agent's boot clock, never sent
/// twice in a boot). It carries the one rule of superseding ([`BootSeq::supersedes`]),
/// which the gateway's per-node mailbox applies (`edgebeat_transports::ingress::Mailbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BootSeq {
    /// [`Header::named_boot_tag`].
    pub boot_tag: u32,
    /// [`Header::seq`], microseconds on the agent's boot clock.
    pub seq: u64,
}

impl BootSeq {
    /// Whether a heartbeat at `self` supersedes one of the same kind at `older` that waits
    /// ahead of it: the same boot and a higher sequence number. A copy (a replay, a QoS 1
    /// redelivery: the same sequence number), an older message and another boot's never
    /// do, so only the node's own newer message can cost a queued one its write.
    pub fn supersedes(self, older: Self) -> bool {
        self.boot_tag == older.boot_tag && self.seq > older.seq
    }
}

impl AgentMessage {
    /// The [`Header`] of whichever message this is, or `None` when the `kind` is unset or
    /// unknown to this version (a newer agent) or the header is missing.
    pub fn header(&self) -> Option<&Header> {
        match self.kind.as_ref()? {
            agent_message::Kind::Register(m) => m.header.as_ref(),
            agent_message::Kind::Status(m) => m.header.as_ref(),
            agent_message::Kind::Lease(m) => m.header.as_ref(),
        }
    }

    /// Whether this message asks to be answered only with news (see [`Answer::is_news`]): a
    /// quiet [`LeaseRenewal`] or an unchanged [`StatusReport`].
    pub fn is_quiet(&self) -> bool {
        match &self.kind {
            Some(agent_message::Kind::Lease(l)) => l.quiet,
            Some(agent_message::Kind::Status(s)) => s.unchanged,
            _ => false,
        }
    }

    fn quiet_header_mut(&mut self) -> Option<&mut Header> {
        match &mut self.kind {
            Some(agent_message::Kind::Lease(l)) if l.quiet => l.header.as_mut(),
            Some(agent_message::Kind::Status(s)) if s.unchanged => s.header.as_mut(),
            _ => None,
        }
    }

    /// Leaves only `seq` in the header of a quiet message ([`AgentMessage::is_quiet`]), for
    /// a gRPC stream whose gateway accepted `compact_headers` (see
    /// [`HeaderForm::Compact`]): the stream's `Register` gave node name and boot ID. Other
    /// messages are unchanged.
    pub fn compact_header(&mut self) {
        if let Some(h) = self.quiet_header_mut() {
            h.node_name.clear();
            h.boot_id.clear();
            h.wall_time_ms = 0;
        }
    }

    /// Restores a header left compact by [`AgentMessage::compact_header`] from the
    /// stream's `Register` header: node name and boot ID, when both are empty. Returns
    /// whether it did.
    pub fn complete_header(&mut self, register: &Header) -> bool {
        match self.quiet_header_mut() {
            Some(h) if h.node_name.is_empty() && h.boot_id.is_empty() => {
                h.node_name.clone_from(&register.node_name);
                h.boot_id.clone_from(&register.boot_id);
                true
            }
            _ => false,
        }
    }

    /// Leaves out of a quiet message's header what its MQTT topic already says
    /// (`{prefix}/nodes/{node}/{kind}`): the node name, and, unless the message is `signed`,
    /// the wall time (it only serves the signed clock window and the skew metric, which
    /// skips 0). The boot ID and `seq` stay: replay checks need them. For an MQTT
    /// connection whose gateway accepted `Register` with [`HeaderForm::Compact`]. Other
    /// messages are unchanged.
    pub fn compact_header_for_topic(&mut self, signed: bool) {
        if let Some(h) = self.quiet_header_mut() {
            h.node_name.clear();
            if !signed {
                h.wall_time_ms = 0;
            }
        }
    }

    /// Names the boot of a quiet message by [`Header::boot_tag`] instead of its boot ID
    /// (16 bytes less on the wire, 13 fewer encoded), for an MQTT connection whose gateway
    /// accepted `Register` with [`HeaderForm::CompactBootTag`]. The receiver restores nothing: it
    /// matches the tag against the boot it holds ([`Header::named_boot_tag`]). Other
    /// messages, and headers without a boot ID, are unchanged.
    pub fn tag_boot(&mut self) {
        if let Some(h) = self.quiet_header_mut()
            && !h.boot_id.is_empty()
        {
            h.boot_tag = boot_tag(&h.boot_id);
            h.boot_id.clear();
        }
    }

    /// Restores the node name that [`AgentMessage::compact_header_for_topic`] left out of a
    /// quiet message published under `node`'s topic. Returns whether it did (a quiet
    /// message with an empty node name).
    pub fn complete_node_name(&mut self, node: &str) -> bool {
        match self.quiet_header_mut() {
            Some(h) if h.node_name.is_empty() => {
                node.clone_into(&mut h.node_name);
                true
            }
            _ => false,
        }
    }

    /// What the message carries; `None` for a message with no kind (malformed).
    pub fn message_kind(&self) -> Option<MessageKind> {
        match &self.kind {
            Some(agent_message::Kind::Register(_)) => Some(MessageKind::Register),
            Some(agent_message::Kind::Status(_)) => Some(MessageKind::Status),
            Some(agent_message::Kind::Lease(_)) => Some(MessageKind::Lease),
            None => None,
        }
    }

    /// [`MessageKind::as_str`] of the message, or `unknown`, for logs.
    pub fn kind_name(&self) -> &'static str {
        self.message_kind().map_or("unknown", MessageKind::as_str)
    }
}

/// The three kinds of [`AgentMessage`]. Each has its MQTT topic level
/// (`P/nodes/{node}/{kind}`), its `kind` metric label and its name in logs, all
/// [`MessageKind::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// [`Register`]: kubelet's node registration.
    Register,
    /// [`StatusReport`]: a NodeStatus update.
    Status,
    /// [`LeaseRenewal`]: a node Lease renewal.
    Lease,
}

impl MessageKind {
    /// Every kind.
    pub const ALL: [Self; 3] = [Self::Register, Self::Status, Self::Lease];

    /// `register`, `status` or `lease`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Register => "register",
            Self::Status => "status",
            Self::Lease => "lease",
        }
    }

    /// The kind named `name` ([`MessageKind::as_str`]), e.g. an MQTT topic level; `None`
    /// for any other text.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The heartbeats (Lease renewals, then status reports), the kinds a newer message
    /// of the same kind supersedes ([`BootSeq::supersedes`]).
    pub const HEARTBEATS: [Self; 2] = [Self::Lease, Self::Status];

    /// The kind's place in [`MessageKind::HEARTBEATS`]; `None` for a Register (never
    /// superseded: each one is the agent's registration).
    pub fn heartbeat_index(self) -> Option<usize> {
        Self::HEARTBEATS.iter().position(|k| *k == self)
    }
}

/// Whether the gateway sends `answer` for a message that was `quiet`
/// ([`AgentMessage::is_quiet`], taken before the message was handled): always for other
/// messages, only with news ([`Answer::is_news`]) for quiet ones.
pub fn answer_needed(quiet: bool, answer: &Answer) -> bool {
    !quiet || answer.is_news()
}

#[cfg(test)]
#[path = "lib/tests.rs"]
mod tests;
