//! Admission's glue in the message path: the checks a message meets before its node's
//! mailbox ([`Gateway::screen`]: header, identity), and at its turn
//! ([`Gateway::admit`]: [`NodeAdmission::admit`]'s verdict turned into an answer, and what an
//! admitted message teaches: the Lease duration, the usage sample, the clock skew). The
//! rules themselves are [`crate::admission`]'s, with no I/O; this file applies them to a
//! [`Gateway`]'s state.

use std::sync::atomic::Ordering;
use std::time::Duration;

use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{self as pb, Answer, agent_message::Kind};
use edgebeat_transports::ingress::Peer;
use tokio::time::Instant;

use super::Gateway;
use super::slots::{NodeSlot, SlotCell};
use crate::admission::{NodeAdmission, Provenance, Verdict, check_identity};
use crate::metrics::clock_skew_seconds;
use crate::writer::rejected;
use edgebeat_transports::ingress::RejectReason;

impl Gateway {
    /// Counts and logs (one line per node per interval, [`crate::metrics`]'s rejection log)
    /// a renewal's usage sample refused ([`crate::resource_metrics::SampleRefused`]): an
    /// agent reporting more than its node holds. The renewal itself is written.
    pub(super) fn usage_refused(
        &self,
        name: &str,
        refused: &crate::resource_metrics::SampleRefused,
    ) {
        self.counters.count_rejection(RejectReason::Invalid);
        if let edgebeat_transports::log_limit::LogLine::Write { suppressed, others } = self
            .counters
            .rejection_log
            .check("usage", name, tokio::time::Instant::now())
        {
            tracing::warn!(node = name, %refused, suppressed, other_sources = others, "usage sample refused; the renewal is written without it");
        }
    }

    /// The boot ID that `header`'s [`pb::Header::boot_tag`] names, from the Node watch's
    /// `status.nodeInfo.bootID`, when the header names its boot by tag only, `admission`
    /// does not hold that boot, and the Node's bootID has that tag. `None` otherwise.
    pub(super) fn boot_of_tag(
        &self,
        admission: &NodeAdmission,
        name: &str,
        header: &pb::Header,
    ) -> Option<Vec<u8>> {
        if !header.boot_id.is_empty() || admission.holds_boot_tag(header.boot_tag) {
            return None;
        }
        let boot_id = pb::boot_id_to_bytes(&self.writer.view.boot_id(name)?);
        (pb::boot_tag(&boot_id) == header.boot_tag).then_some(boot_id)
    }

    /// The checks of `message` from `peer` that need no per-node state, so nothing is
    /// kept for a message that fails them: it has a header, its identity suits the
    /// [`Posture`] and its node name ([`check_identity`]), and it is not unidentified for
    /// a node the cluster records as speaking with a certificate. Returns the node's name,
    /// validated: the [`NodeName`] its slot, admission and writes carry from here.
    ///
    /// Errors: the answer that refuses it (counted).
    pub(super) fn screen(
        &self,
        peer: &Peer,
        message: &pb::AgentMessage,
    ) -> Result<NodeName, Answer> {
        let Some(header) = message.header() else {
            return Err(self.no_header());
        };
        let name = match check_identity(self.options.posture, &header.node_name, provenance(peer)) {
            Ok(name) => name,
            Err(rejection) => {
                return Err(self.reject(rejection.reason, rejection.detail.into_owned()));
            }
        };
        if peer.identity.is_none() && self.writer.view.certificate(&name).is_some() {
            // The cluster records that the node speaks with a certificate: whoever sends
            // this without one is not the node, whatever this replica remembers.
            return Err(self.reject(
                RejectReason::Unauthenticated,
                format!("unidentified message for node {name:?}, which speaks with its identity"),
            ));
        }
        Ok(name)
    }

    /// Refuses a message without a header (or of a kind this version does not know).
    pub(super) fn no_header(&self) -> Answer {
        self.reject(
            RejectReason::Malformed,
            "malformed: no header or unknown message kind".into(),
        )
    }

    /// Admission of a message (whose header is `header`) under its node's slot
    /// ([`NodeAdmission::admit`]): boot, sequence, freshness, rate limit; then what an
    /// admitted message teaches (the Lease duration, the clock skew). Returns the
    /// heartbeat's age.
    ///
    /// Errors: the answer to a refused message, `None` for a replay.
    pub(super) fn admit(
        &self,
        cell: &SlotCell,
        slot: &mut NodeSlot,
        peer: &Peer,
        message: &pb::AgentMessage,
        header: &pb::Header,
        received: Instant,
    ) -> Result<Duration, Option<Answer>> {
        let name = cell.name.as_str();
        let provenance = provenance(peer);
        let heartbeat = matches!(message.kind, Some(Kind::Lease(_) | Kind::Status(_)));
        // A boot named by tag that this replica does not hold (a shared subscription gave
        // it the node's first message since the node rebooted or the replica started): the
        // Node's status.nodeInfo.bootID, which the Node watch holds once the node's status
        // was written in this boot, names it without a round trip to the agent.
        let from_view;
        let header = match self.boot_of_tag(&slot.admission, name, header) {
            Some(boot_id) => {
                from_view = pb::Header {
                    boot_id,
                    ..header.clone()
                };
                &from_view
            }
            None => header,
        };
        let verdict = slot.admission.admit(
            &self.options.admission(),
            header,
            provenance,
            heartbeat,
            self.started,
            received,
        );
        let age = match verdict {
            // Only admitted messages keep a slot alive: refused ones must not keep state
            // (or a lockout) from being swept.
            Verdict::Admit(admitted) => {
                slot.last_seen = Some(received);
                if provenance.identity.is_some() {
                    cell.identified.store(true, Ordering::Relaxed);
                }
                admitted.age
            }
            Verdict::Reject(rejection) if rejection.reason == RejectReason::UnknownBoot => {
                // Not a fault: this replica has not seen the boot yet. The answer asks for
                // the boot ID, which the agent's retry carries.
                self.counters.count_rejection(RejectReason::UnknownBoot);
                tracing::debug!(
                    node = name,
                    "boot tag of a boot this replica does not hold; asking for the boot ID"
                );
                return Err(Some(Answer::SendBootId {
                    reason: rejection.detail.into_owned(),
                }));
            }
            Verdict::Reject(rejection) if rejection.reason == RejectReason::Replayed => {
                // No answer: the genuine sender had its answer, and a replay must not make
                // the gateway speak on the node's link (nor fail a request it still waits
                // for).
                self.counters.count_rejection(RejectReason::Replayed);
                tracing::debug!(node = name, detail = %rejection.detail, "replay rejected without an answer");
                return Err(None);
            }
            Verdict::Reject(rejection) => {
                return Err(Some(
                    self.reject(rejection.reason, rejection.detail.into_owned()),
                ));
            }
            Verdict::Stale(age) => {
                slot.last_seen = Some(received);
                self.counters.stale_renewals.inc();
                tracing::info!(
                    node = name,
                    ?age,
                    kind = message.kind_name(),
                    "dropping a stale heartbeat"
                );
                return Err(Some(rejected(format!("stale: {age:?} old"))));
            }
        };
        // Only messages that passed the replay and staleness checks: an old one would read
        // as skew.
        // The gateway's wall clock when the message arrived, not after its wait.
        let now = self.clock.now();
        let received_wall = now.checked_sub(received.elapsed()).unwrap_or(now);
        if let Some(Kind::Lease(renewal)) = &message.kind {
            slot.admission
                .lease_duration_seconds(renewal.lease_duration_seconds);
            if let Some(usage) = &renewal.usage {
                // Sampled as it was sent: its age before the receipt.
                let sampled = received_wall.checked_sub(age).unwrap_or(received_wall);
                let capacity = self.writer.view.managed_capacity(name).flatten();
                match self
                    .resource_samples
                    .record_usage(name, usage, sampled, capacity)
                {
                    Ok(Some(shared)) => {
                        if let Some(outbox) = self.usage_outbox.get() {
                            // No receiver (the broker away) is no error: samples are lossy.
                            let _ = outbox.send(shared);
                        }
                    }
                    Ok(None) => {}
                    // The renewal stands; only its usage is refused, counted and logged
                    // within bounds.
                    Err(refused) => self.usage_refused(name, &refused),
                }
            }
        }
        if let Some(skew) = clock_skew_seconds(received_wall, header.wall_time_ms) {
            slot.writes
                .series
                .clock_skew
                .get_or_insert_with(|| self.writer.node_metrics.clock_skew(name))
                .set(skew);
        }
        Ok(age)
    }
}

/// What the transport vouches for about a message from `peer` ([`Provenance`]).
pub(super) fn provenance(peer: &Peer) -> Provenance<'_> {
    Provenance {
        identity: peer.identity.as_deref(),
        wall_time_verified: peer.wall_time_verified,
    }
}
