//! What a PUBLISH must pass before it is handled: its signature and certificate (signed
//! MQTT), the signed clock window, and which rejections are answered.

use super::{
    REJECT_BAD_SIGNATURE, REJECT_CERTIFICATE_EXPIRED, REJECT_CLOCK, REJECT_MALFORMED,
    REJECT_MISMATCH, REJECT_UNKNOWN_SIGNER, REJECT_UNSIGNED, SignaturePolicy,
};
use crate::ingress::{Asked, CertificateId, Peer, RejectReason, Rejection, TransportKind};
use crate::signing;
use crate::signing::{AnswerVerifier, NodeKey, SignatureError};
use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{AgentMessage, MessageKind};
use prost::Message as _;
use rustls::pki_types::UnixTime;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Why [`open`] did not take a message: its [`Rejection`] (the reason for
/// [`Handler::rejected`], and its detail for the log) and, for a signed message whose
/// signer is unknown, what it asked. Nothing that fails verification is answered here (see
/// [`open`]).
#[derive(Debug, PartialEq)]
pub(super) struct OpenError {
    /// The reason and its detail: a transport's fixed one (`REJECT_*`), or with a detail
    /// of its own where that says more (by how much a clock is off).
    pub(super) rejection: Rejection,
    /// A signed message for a node whose key this replica does not hold: what the message
    /// (unverified) asked, so that the caller may ask the node for its certificate.
    pub(super) unverified: Option<Asked>,
}

impl OpenError {
    /// An error of `rejection` alone, which leads to nothing sent to the node (no
    /// [`OpenError::unverified`]).
    pub(super) fn silent(rejection: Rejection) -> Self {
        Self {
            rejection,
            unverified: None,
        }
    }
}

/// Reads one message of `node` and `kind` under the signature policy: verifies a
/// `SignedMessage` with `key` (the node's certificate, when held) at `now`, decodes the
/// `AgentMessage`, checks that its header's node name and its kind agree with the topic, and
/// that a signed message's `wall_time_ms` is within [`SignaturePolicy::max_clock_skew`] of
/// `now`. Returns the message and, when its signature verified, the certificate it verified
/// with (its identity is then `node`).
///
/// Nothing rejected here is answered: an answer on the node's ack topic is something the
/// genuine agent reads, so a forger must not be able to cause one (no key held, a signature
/// that does not verify, an expired certificate, an unsigned message where signatures are
/// required or the node is known to sign), nor a replay (a signed message outside the clock
/// window is a recording, or a node whose clock is wrong: its agent learns that from its
/// own clock check, `ClockUnsynchronized`, and from the unanswered requests). The one
/// exception is the caller's: a signed message for a node whose key this replica does not
/// hold carries what it asked ([`OpenError::unverified`]), so that the node can be asked,
/// in a signed answer, for its certificate.
pub(super) fn open(
    node: &str,
    kind: MessageKind,
    payload: &[u8],
    policy: Option<&SignaturePolicy>,
    key: Option<&NodeKey>,
    now: UnixTime,
) -> Result<(AgentMessage, Option<CertificateId>), OpenError> {
    let decode = |bytes: &[u8]| {
        let mut message =
            AgentMessage::decode(bytes).map_err(|_| OpenError::silent(REJECT_MALFORMED))?;
        // A quiet message may leave its node name to the topic (`HeaderForm::Compact`); a
        // signed one is still bound to the node, by the key of the topic's node.
        message.complete_node_name(node);
        let header_node = message.header().map(|h| h.node_name.as_str());
        if header_node != Some(node) || message.message_kind() != Some(kind) {
            return Err(OpenError::silent(REJECT_MISMATCH));
        }
        Ok(message)
    };
    let Some(policy) = policy else {
        // Not verifying: a signing agent's message is read without its signature, and
        // carries no identity, exactly like an unsigned one.
        return match signing::unseal(payload) {
            Some((signed, _)) => decode(&signed),
            None => decode(payload),
        }
        .map(|m| (m, None));
    };
    let Some((signed, signature)) = signing::unseal(payload) else {
        // Unsigned: rejected where signatures are required, and for a node that signs (an
        // unsigned message in its name is someone else's).
        if policy.required || key.is_some() {
            return Err(OpenError::silent(REJECT_UNSIGNED));
        }
        return decode(payload).map(|m| (m, None));
    };
    let Some(key) = key else {
        return Err(OpenError {
            rejection: REJECT_UNKNOWN_SIGNER,
            unverified: decode(&signed).ok().map(|m| Asked::of(&m)),
        });
    };
    match key.verify(&signed, &signature, now) {
        Ok(()) => {
            let message = decode(&signed)?;
            let sent_ms = message.header().map_or(0, |h| h.wall_time_ms);
            let now = Duration::from_secs(now.as_secs());
            if let Err(skew) = signing::check_clock_window(sent_ms, now, policy.max_clock_skew) {
                return Err(OpenError::silent(Rejection {
                    detail: skew.to_string().into(),
                    ..REJECT_CLOCK
                }));
            }
            Ok((message, Some(key.certificate_id())))
        }
        Err(SignatureError::Expired) => Err(OpenError::silent(REJECT_CERTIFICATE_EXPIRED)),
        Err(SignatureError::BadSignature | SignatureError::Certificate(_)) => {
            Err(OpenError::silent(REJECT_BAD_SIGNATURE))
        }
    }
}

/// The [`Peer`] of an MQTT message of `node`: an identity, its certificate and a verified
/// wall time only when its signature verified with `certificate` (its wall time was then
/// checked against the clock window too).
pub(super) fn peer(node: &NodeName, certificate: Option<CertificateId>) -> Peer {
    Peer {
        transport: TransportKind::Mqtt,
        remote: None,
        identity: certificate.map(|_| node.clone()),
        wall_time_verified: certificate.is_some(),
        certificate,
    }
}

/// The [`Peer`] of something that names no node it could be credited to (an unknown topic,
/// a refused certificate): no identity.
pub(super) fn nobody() -> Peer {
    Peer::unidentified(TransportKind::Mqtt, None)
}

/// The signature policy and the verified certificate of every node this replica has seen,
/// kept by the event loop. An entry only exists for a certificate the site CA issued, so the
/// map is bounded by the site's fleet.
pub(super) struct Signatures {
    pub(super) policy: SignaturePolicy,
    pub(super) keys: parking_lot::RwLock<HashMap<String, Arc<NodeKey>>>,
}

impl Signatures {
    pub(super) fn key(&self, node: &str) -> Option<Arc<NodeKey>> {
        let keys = self.keys.read();
        keys.get(node).cloned()
    }

    /// Verifies and stores `node`'s published certificate. A certificate older (by
    /// notBefore) than the one held is refused, so a replayed old certificate cannot roll a
    /// rotated key back; so is one that may not replace `recorded`, the certificate the
    /// cluster records for the node ([`CertificateId::may_replace`]), so that neither can a
    /// rolled-back retained copy read after a restart.
    pub(super) fn learn(
        &self,
        node: &str,
        payload: &[u8],
        recorded: Option<CertificateId>,
    ) -> Result<(), String> {
        let key = self
            .policy
            .verifier
            .verify(node, payload, UnixTime::now())
            .map_err(|e| e.to_string())?;
        if let Some(recorded) = recorded
            && !key.certificate_id().may_replace(&recorded)
        {
            return Err(format!(
                "older than the certificate the cluster records for the node ({recorded:?})"
            ));
        }
        let mut keys = self.keys.write();
        if let Some(held) = keys.get(node)
            && held.not_before() > key.not_before()
        {
            return Err("older than the certificate held for the node".into());
        }
        keys.insert(node.to_owned(), Arc::new(key));
        Ok(())
    }
}

/// The samples of another replica's batch (`P/usage`, [`Inbound::Usage`]): with a
/// `verifier` (the replicas sign), only a [`edgebeat_proto::SignedUsage`] whose chain and
/// signature verify at `now` ([`AnswerVerifier::verify_usage`]); without one (nothing is
/// signed), the plain `SharedUsageBatch`, or the batch inside a signed one unverified.
///
/// Errors: the rejection for the batch as a whole: [`REJECT_UNSIGNED`] for a plain batch
/// where batches are signed, [`REJECT_CERTIFICATE`] for a chain that is no gateway answer
/// key's, [`REJECT_BAD_SIGNATURE`], [`REJECT_MALFORMED`] for bytes that do not decode.
pub(super) fn open_usage(
    verifier: Option<&AnswerVerifier>,
    payload: &[u8],
    now: rustls::pki_types::UnixTime,
) -> Result<Vec<edgebeat_proto::SharedUsage>, Rejection> {
    use signing::AnswerError;
    let batch = match verifier {
        Some(verifier) => verifier
            .verify_usage(payload, now)
            .map_err(|error| match error {
                AnswerError::Unsigned => {
                    Rejection::new(RejectReason::Unsigned, "shared usage batch not signed")
                }
                AnswerError::Certificate(_) => Rejection::new(
                    RejectReason::Certificate,
                    format!("shared usage batch: {error}"),
                ),
                AnswerError::BadSignature => Rejection::new(
                    RejectReason::BadSignature,
                    "shared usage batch: bad signature",
                ),
                AnswerError::Malformed(_) => REJECT_MALFORMED,
            })?,
        None => {
            let signed = signing::unseal_usage(payload);
            let bytes = signed
                .as_ref()
                .map_or(payload, |s| s.signed_batch.as_slice());
            edgebeat_proto::SharedUsageBatch::decode(bytes).map_err(|_| REJECT_MALFORMED)?
        }
    };
    Ok(batch.samples)
}
