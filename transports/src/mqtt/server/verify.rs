//! What a PUBLISH must pass before it is handled: its signature and certificate (signed
//! MQTT), the signed clock window, and which refusals are answered.

use super::*;

/// A message refused by [`open`]: the reason for [`Handler::rejected`], and the [`Ack`] to
/// send the agent, if any.
#[derive(Debug, PartialEq)]
pub(super) struct Refusal {
    pub(super) reason: Rejection,
    pub(super) ack: Option<Ack>,
}

impl Refusal {
    pub(super) fn silent(reason: Rejection) -> Self {
        Self { reason, ack: None }
    }

    /// A refusal answered to the agent that sent message `seq` (a verified one), so that it
    /// learns why.
    pub(super) fn answered(reason: Rejection, seq: u64) -> Self {
        let answer = Answer::Rejected {
            reason: reason.detail.to_owned(),
        };
        Self {
            reason,
            ack: Some(answer.into_ack(seq)),
        }
    }
}

/// Reads one message of `node` and `kind` under the signature policy: verifies a
/// `SignedMessage` with `key` (the node's certificate, when held) at `now`, decodes the
/// `AgentMessage`, checks that its header's node name and its kind agree with the topic, and
/// that a signed message's `wall_time_ms` is within [`SignaturePolicy::max_clock_skew`] of
/// `now`. Returns the message and whether it was signed (its identity is then `node`).
///
/// Nothing that fails verification is answered: an answer on the node's ack topic is
/// something the genuine agent reads, so a forger must not be able to cause one (no key
/// held, a signature that does not verify, an expired certificate, an unsigned message where
/// signatures are required or the node is known to sign). The one refusal answered is a
/// message whose signature verified but whose signed wall time is outside the clock window:
/// the node itself sent it, and its agent needs to learn that its clock is wrong. A genuine
/// agent whose certificate this replica lost gets no answer either; it publishes its
/// certificate again when a request goes unanswered (the MQTT uplink).
pub(super) fn open(
    node: &str,
    kind: MessageKind,
    payload: &[u8],
    policy: Option<&SignaturePolicy>,
    key: Option<&NodeKey>,
    now: UnixTime,
) -> Result<(AgentMessage, bool), Refusal> {
    let decode = |bytes: &[u8]| {
        let mut message =
            AgentMessage::decode(bytes).map_err(|_| Refusal::silent(REJECT_MALFORMED))?;
        // A quiet message may leave its node name to the topic (`HeaderForm::Compact`); a
        // signed one is still bound to the node, by the key of the topic's node.
        message.complete_node_name(node);
        let header_node = message.header().map(|h| h.node_name.as_str());
        if header_node != Some(node) || message.message_kind() != Some(kind) {
            return Err(Refusal::silent(REJECT_MISMATCH));
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
        .map(|m| (m, false));
    };
    let Some((signed, signature)) = signing::unseal(payload) else {
        // Unsigned: refused where signatures are required, and for a node that signs (an
        // unsigned message in its name is someone else's).
        if policy.required || key.is_some() {
            return Err(Refusal::silent(REJECT_UNSIGNED));
        }
        return decode(payload).map(|m| (m, false));
    };
    let Some(key) = key else {
        return Err(Refusal::silent(REJECT_UNKNOWN_SIGNER));
    };
    match key.verify(&signed, &signature, now) {
        Ok(()) => {
            let message = decode(&signed)?;
            let sent_ms = message.header().map_or(0, |h| h.wall_time_ms);
            let now_ms = i64::try_from(now.as_secs())
                .unwrap_or(i64::MAX)
                .saturating_mul(1000);
            let skew_ms = i64::try_from(policy.max_clock_skew.as_millis()).unwrap_or(i64::MAX);
            let ahead_ms = sent_ms.saturating_sub(now_ms);
            if ahead_ms.saturating_abs() > skew_ms {
                let seq = message.header().map_or(0, |h| h.seq);
                let mut refusal = Refusal::answered(REJECT_CLOCK, seq);
                if let Some(ack) = refusal.ack.as_mut() {
                    ack.reason = clock_skew_reason(ahead_ms, policy.max_clock_skew);
                }
                return Err(refusal);
            }
            Ok((message, true))
        }
        Err(SignatureError::Expired) => Err(Refusal::silent(REJECT_CERTIFICATE_EXPIRED)),
        Err(SignatureError::BadSignature | SignatureError::Certificate(_)) => {
            Err(Refusal::silent(REJECT_BAD_SIGNATURE))
        }
    }
}

/// The answer to a signed message whose wall time is `ahead_ms` ahead of the gateway's
/// clock (behind when negative), outside the window `max`: the agent logs it, so it says by
/// how much and what to fix, e.g. "signed wall time is 3600.0 s ahead of the gateway's
/// clock, outside its ±30 s window: set this node's clock (NTP, or an RTC)".
pub(super) fn clock_skew_reason(ahead_ms: i64, max: Duration) -> String {
    #[allow(clippy::cast_precision_loss)] // for a message: tenths of a second suffice
    let seconds = ahead_ms.unsigned_abs() as f64 / 1000.0;
    let side = if ahead_ms >= 0 { "ahead of" } else { "behind" };
    format!(
        "signed wall time is {seconds:.1} s {side} the gateway's clock, outside its ±{} s window: set this node's clock (NTP, or an RTC)",
        max.as_secs()
    )
}

/// The [`Peer`] of an MQTT message: an identity, and a verified wall time, only when its
/// signature verified (its wall time was then checked against the clock window too).
pub(super) fn peer(identity: Option<&NodeName>) -> Peer {
    Peer {
        transport: TransportKind::Mqtt,
        remote: None,
        identity: identity.cloned(),
        wall_time_verified: identity.is_some(),
    }
}

/// The signature policy and the verified certificate of every node this replica has seen,
/// shared by the drain tasks. An entry only exists for a certificate the site CA issued, so the
/// map is bounded by the site's fleet.
pub(super) struct Signatures {
    pub(super) policy: SignaturePolicy,
    pub(super) keys: std::sync::RwLock<HashMap<String, Arc<NodeKey>>>,
}

impl Signatures {
    pub(super) fn key(&self, node: &str) -> Option<Arc<NodeKey>> {
        let keys = self
            .keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        keys.get(node).cloned()
    }

    /// Verifies and stores `node`'s published certificate. A certificate older (by
    /// notBefore) than the one held is refused, so a replayed old certificate cannot roll a
    /// rotated key back.
    pub(super) fn learn(&self, node: &str, payload: &[u8]) -> Result<(), String> {
        let key = self
            .policy
            .verifier
            .verify(node, payload, UnixTime::now())
            .map_err(|e| e.to_string())?;
        let mut keys = self
            .keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(held) = keys.get(node)
            && held.not_before() > key.not_before()
        {
            return Err("older than the certificate held for the node".into());
        }
        keys.insert(node.to_owned(), Arc::new(key));
        Ok(())
    }
}
