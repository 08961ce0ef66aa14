//! Per-node admission: whether one agent message may go on to the apiserver writer. No I/O,
//! no transport: it sees a message's [`Provenance`] (who the transport authenticated, and
//! whether the signed wall time was checked), its [`pb::Header`] and the gateway's monotonic
//! clock, and keeps the small state one node needs ([`NodeAdmission`]).
//!
//! Checks, cheapest and stateless first, so that nothing an attacker sends costs a genuine
//! node anything:
//!
//! 1. **Identity** ([`check_identity`], before any per-node state exists): the header names
//!    a valid node; an identified message speaks only for its own node (the rule of the
//!    NodeRestriction admission plugin, `plugin/pkg/admission/noderestriction/admission.go`);
//!    under [`Posture::Identified`] a message without an identity is refused.
//! 2. **Identified nodes stay identified**: once a node has spoken with its identity, an
//!    unidentified message in its name is someone else's and is refused. So in a gateway
//!    that lets unidentified agents in (a fleet moving to mTLS or signatures), unidentified
//!    input can never move an identified node's boot or sequence.
//! 3. **Boot and sequence** (replay): a message of the current boot must carry a `seq`
//!    above the last accepted one. A new boot ID starts a new sequence; the boot it replaces
//!    is remembered for one of its renew intervals (its renewals'
//!    `leaseDurationSeconds` × 0.25, 10 s by default; at most
//!    [`AdmissionPolicy::old_boot_memory`]) so that its late or replayed messages are
//!    refused, and then forgotten, so that no single message can lock a node out for
//!    longer than that: a displaced genuine node, whose refused renewals go unanswered
//!    (replays get no answer) and whose next renewal comes one interval later, is back
//!    within two of its renew intervals, half its lease duration. When the
//!    transport verified the message's wall time ([`Provenance::wall_time_verified`]), a
//!    boot whose message is older than the current boot's last one is an earlier boot
//!    replayed and is refused. A `seq` further ahead of the boot's clock than the age limit
//!    (at least 1 s) is refused and not recorded: the agent's CLOCK_BOOTTIME cannot run
//!    ahead of real time, and accepting it would make the genuine messages after it look
//!    replayed, then stale. A quiet MQTT message may name its boot by `Header.boot_tag`
//!    instead of its boot ID: it is taken as the current boot when the tag matches it, and
//!    otherwise refused as [`RejectReason::UnknownBoot`] without touching any state (the
//!    agent's next message carries the boot ID), so a tag can never start or move a boot.
//!    (The gateway first completes such a header from the Node's `status.nodeInfo.bootID`
//!    when that has the tag: the apiserver's word, not the sender's.)
//! 4. **Rate limit**: a token bucket per node ([`TokenBucket`]). It comes after the replay
//!    check, so replaying an old message cannot drain a node's tokens, and a rate-limited
//!    message's `seq` is recorded anyway, so it cannot be replayed later.
//! 5. **Freshness** of heartbeats ([`Freshness`]): a Lease renewal or status report older
//!    than [`AdmissionPolicy::max_age`] is dropped, never written late: a late heartbeat
//!    would reset the node lifecycle controller's probe time and hide a dead node
//!    (`pkg/controller/nodelifecycle/node_lifecycle_controller.go: tryUpdateNodeHealth`).

use edgebeat_proto::registration::NodeName;
use std::time::Duration;

use edgebeat_proto as pb;
use edgebeat_transports::ingress::Rejection;
use tokio::time::Instant;

use crate::freshness::Freshness;
use crate::restriction::TokenBucket;
use edgebeat_transports::ingress::RejectReason;

/// Superseded boot IDs remembered per node (at most; each for
/// [`AdmissionPolicy::old_boot_memory`]).
const OLD_BOOTS: usize = 4;

/// Least lead over the boot clock refused as "from the future" (1 s; otherwise the age
/// limit): a lead up to the age limit at most makes later genuine messages look that old,
/// never stale.
const FUTURE_SLACK: Duration = Duration::from_secs(1);

/// Which agents the gateway lets in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posture {
    /// Every message must carry a node identity (mTLS node certificate, or a verified MQTT
    /// signature); anything else is refused as [`RejectReason::Unauthenticated`]. The
    /// default.
    Identified,
    /// Messages without an identity are let in (e.g. while a fleet moves to mTLS or
    /// signatures): anyone who can reach an ingress can then speak for any node that has
    /// not spoken with its identity. Named loudly on purpose: the gateway binary needs
    /// `--allow-unidentified-agents` for it, warns at start and exports it in `/metrics`.
    AllowUnidentified,
}

/// What the transport established about one message, whichever transport carried it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provenance<'a> {
    /// The node the transport authenticated, or `None`.
    pub identity: Option<&'a str>,
    /// `Header.wall_time_ms` is authenticated and was checked against the gateway's clock.
    pub wall_time_verified: bool,
}

/// The admission rules' settings (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct AdmissionPolicy {
    /// Whether unidentified messages are let in.
    pub posture: Posture,
    /// Oldest heartbeat still admitted, measured on the agent's boot clock ([`Freshness`]).
    pub max_age: Duration,
    /// Clock-drift allowance of the age measurement, parts per million.
    pub drift_ppm: u64,
    /// Messages per second one node may send on average.
    pub rate: f64,
    /// Messages one node may send at once.
    pub burst: f64,
    /// The longest a superseded boot's messages are refused (default 30 s); a boot whose
    /// renew interval is known is remembered for that interval when shorter (see the
    /// module docs).
    pub old_boot_memory: Duration,
}

/// A boot's renew interval until one of its renewals says otherwise: kubelet's default,
/// `nodeLeaseDurationSeconds` 40 × 0.25.
const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// What an admitted message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// Its age on the agent's boot clock (0 for the first message of a boot).
    pub age: Duration,
    /// The first message of a boot this replica has seen (the node rebooted, or this
    /// replica did not know it).
    pub new_boot: bool,
}

/// The outcome of [`NodeAdmission::admit`]: a stale heartbeat is neither admitted nor a
/// rejection (it is counted apart, as `stale_heartbeats`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Go on to the writer.
    Admit(Admitted),
    /// A heartbeat older than [`AdmissionPolicy::max_age`]: drop it.
    Stale(Duration),
    /// Rejected: the metric label and a text for logs and the ack.
    Reject(Rejection),
}

/// The stateless checks (rule 1 of the module docs), run before any per-node state is
/// looked up or made: the header's node name is a valid Node name, an identified message
/// speaks for its own node, and under [`Posture::Identified`] it has an identity. Returns
/// the name as a [`NodeName`] (the one rule, [`edgebeat_proto::registration::is_node_name`]):
/// what the gateway carries from here to the apiserver call.
///
/// Errors: the [`Rejection`] (`Malformed`, `Foreign` or `Unauthenticated`).
pub fn check_identity(
    posture: Posture,
    node: &str,
    provenance: Provenance<'_>,
) -> Result<NodeName, Rejection> {
    let Ok(name) = NodeName::new(node) else {
        return Err(Rejection::new(
            RejectReason::Malformed,
            format!("malformed: {node:?} is not a valid node name"),
        ));
    };
    match provenance.identity {
        Some(identity) if identity != node => Err(Rejection::new(
            RejectReason::Foreign,
            format!("node {identity:?} may not speak for node {node:?}"),
        )),
        None if posture == Posture::Identified => Err(Rejection::new(
            RejectReason::Unauthenticated,
            format!(
                "unidentified message for node {node:?}: this gateway requires node identities"
            ),
        )),
        _ => Ok(name),
    }
}

/// The replay rule (rule 3 of the module docs) for one node: the boot and sequence number
/// of its last accepted message. A message of the same boot (by boot ID, never by the
/// 32-bit tag alone) whose `seq` is not above the recorded one is a copy of a message
/// already accepted, or one overtaken by it: a replay. A message of any other boot is not
/// a replay by this rule, since a new boot starts its own sequence; whether a superseded
/// boot may come back is [`NodeAdmission`]'s memory of old boots. Admission and enrollment
/// (`enrollment/replay.rs`, with its own expiry) both ask it. The rule is edgebeat's own
/// (kubelet's requests carry no sequence number); the mailbox's
/// [`pb::BootSeq::supersedes`] is its complement for queued messages of one boot.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LastAccepted {
    boot_id: Vec<u8>,
    seq: u64,
}

impl LastAccepted {
    /// The last accepted message was of boot `boot_id` (the agent's boot ID, bytes) with
    /// sequence number `seq` (microseconds on its boot clock).
    pub fn new(boot_id: Vec<u8>, seq: u64) -> Self {
        Self { boot_id, seq }
    }

    /// Whether a message of boot `boot_id` with sequence number `seq` replays the last
    /// accepted one: the same boot ID and `seq` at or below the recorded one.
    pub fn replayed_by(&self, boot_id: &[u8], seq: u64) -> bool {
        boot_id == self.boot_id.as_slice() && seq <= self.seq
    }
}

/// One node's admission state: its current boot and sequence, recently superseded boots,
/// whether it has spoken with its identity, its rate-limit bucket and age estimator.
#[derive(Debug, Default)]
pub struct NodeAdmission {
    /// The current boot and the last admitted sequence number in it.
    last: LastAccepted,
    /// Superseded boots, each with the instant it is forgotten.
    old_boots: Vec<(Vec<u8>, Instant)>,
    /// The current boot's renew interval, from its last admitted renewal.
    renew_interval: Option<Duration>,
    /// Latest verified `wall_time_ms` accepted (any boot): orders boots against replays.
    last_wall_ms: i64,
    identified: bool,
    bucket: TokenBucket,
    freshness: Option<Freshness>,
}

impl NodeAdmission {
    /// Whether this node has spoken with its identity (its unidentified messages are then
    /// refused).
    pub fn identified(&self) -> bool {
        self.identified
    }

    /// Notes the `leaseDurationSeconds` of an admitted renewal of the current boot: one
    /// quarter of it is how long the boot is remembered once superseded (see the module
    /// docs). Values ≤ 0 are ignored.
    pub fn lease_duration_seconds(&mut self, seconds: i32) {
        if let Ok(seconds) = u64::try_from(seconds)
            && seconds > 0
        {
            self.renew_interval = Some(Duration::from_millis(seconds.saturating_mul(250)));
        }
    }

    /// Whether `tag` ([`pb::Header::boot_tag`]) names the boot this node is in.
    pub fn holds_boot_tag(&self, tag: u32) -> bool {
        !self.last.boot_id.is_empty() && pb::boot_tag(&self.last.boot_id) == tag
    }

    /// Whether `header` names this node's current boot (by ID or by tag) with a sequence
    /// number at or below the last admitted one: a copy of a message already admitted (or
    /// one overtaken by it), which [`NodeAdmission::admit`] rejects as
    /// [`RejectReason::Replayed`]. Checked before admission only to decide whether a
    /// rejection may be answered: a replay is never answered.
    pub fn is_replay(&self, header: &pb::Header) -> bool {
        self.named_boot(header)
            .is_some_and(|boot| self.last.replayed_by(boot, header.seq))
    }

    /// The boot `header` names: its boot ID, or this node's current boot when it names it
    /// by a matching tag; `None` for a tag of no boot this replica holds.
    fn named_boot<'a>(&'a self, header: &'a pb::Header) -> Option<&'a [u8]> {
        if !header.boot_id.is_empty() {
            Some(&header.boot_id)
        } else if self.holds_boot_tag(header.boot_tag) {
            Some(&self.last.boot_id)
        } else {
            None
        }
    }

    /// Rules 2–5 of the module docs for one message with `header`, received at `now` (the
    /// gateway's monotonic clock; `origin` is the fixed instant [`Freshness`] measures
    /// from). `heartbeat` says whether it is a Lease renewal or status report (only those
    /// can be stale). [`check_identity`] must have passed.
    pub fn admit(
        &mut self,
        policy: &AdmissionPolicy,
        header: &pb::Header,
        provenance: Provenance<'_>,
        heartbeat: bool,
        origin: Instant,
        now: Instant,
    ) -> Verdict {
        let seq = header.seq;
        if self.identified && provenance.identity.is_none() {
            return Verdict::Reject(Rejection::new(
                RejectReason::Unauthenticated,
                "unidentified message for a node that speaks with its identity",
            ));
        }
        if !self.identified && provenance.identity.is_some() {
            // The node's first identified message outranks whatever unidentified messages
            // set before it (a boot, a sequence far ahead): they could have been anyone's.
            *self = Self {
                bucket: self.bucket,
                ..Self::default()
            };
        }
        self.old_boots.retain(|(_, until)| now < *until);
        if header.boot_id.is_empty() && !self.holds_boot_tag(header.boot_tag) {
            return Verdict::Reject(Rejection::new(
                RejectReason::UnknownBoot,
                "this replica does not hold the boot of this boot tag: send the boot ID",
            ));
        }
        // Named by a matching tag: the current boot.
        let new_boot = !header.boot_id.is_empty() && self.last.boot_id != header.boot_id;
        if new_boot {
            if provenance.wall_time_verified
                && !self.last.boot_id.is_empty()
                && header.wall_time_ms < self.last_wall_ms
            {
                return Verdict::Reject(Rejection::new(
                    RejectReason::Replayed,
                    "replayed: a message of an earlier boot (older than the current boot's last)",
                ));
            }
            if self.old_boots.iter().any(|(b, _)| *b == header.boot_id) {
                return Verdict::Reject(Rejection::new(
                    RejectReason::Replayed,
                    "replayed: a message of an earlier boot",
                ));
            }
            let old = std::mem::replace(&mut self.last.boot_id, header.boot_id.clone());
            let old_interval = self.renew_interval.take();
            if !old.is_empty() {
                if self.old_boots.len() == OLD_BOOTS {
                    self.old_boots.remove(0);
                }
                let memory = old_interval
                    .unwrap_or(DEFAULT_RENEW_INTERVAL)
                    .min(policy.old_boot_memory);
                self.old_boots.push((old, now + memory));
            }
            self.freshness = None;
        } else if self.is_replay(header) {
            return Verdict::Reject(Rejection::new(
                RejectReason::Replayed,
                format!(
                    "replayed or reordered: seq {seq} ≤ last accepted {}",
                    self.last.seq
                ),
            ));
        } else if let Some(ahead) = self
            .freshness
            .as_ref()
            .map(|f| f.ahead(seq, now))
            .filter(|ahead| *ahead > policy.max_age.max(FUTURE_SLACK))
        {
            // `seq` is the agent's boot clock: a message from further in the future than
            // the age limit is not the agent's (accepted, it would make every genuine
            // message look replayed, then stale).
            return Verdict::Reject(Rejection::new(
                RejectReason::Invalid,
                format!("seq is {ahead:?} ahead of this boot's clock"),
            ));
        }
        // Recorded before the rate limit: a refused message cannot be replayed later.
        self.last.seq = seq;
        if provenance.wall_time_verified {
            self.last_wall_ms = self.last_wall_ms.max(header.wall_time_ms);
        }
        if provenance.identity.is_some() {
            self.identified = true;
        }
        if !self.bucket.take(now, policy.rate, policy.burst) {
            return Verdict::Reject(Rejection::new(
                RejectReason::RateLimited,
                format!(
                    "rate limited: node {:?} sends more than {}/s",
                    header.node_name, policy.rate
                ),
            ));
        }
        let age = match &mut self.freshness {
            Some(f) => f.observe(seq, now, policy.drift_ppm),
            None => {
                self.freshness = Some(Freshness::new(origin, seq, now));
                Duration::ZERO
            }
        };
        if heartbeat && age > policy.max_age {
            return Verdict::Stale(age);
        }
        Verdict::Admit(Admitted { age, new_boot })
    }
}

#[cfg(test)]
mod tests;
