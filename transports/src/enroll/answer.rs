//! Reading the gateway's signed answer to a certificate request: what was answered, and
//! whether to take it, by the trust an agent holds at first enrollment or at rotation.

use prost::Message as _;

use super::ca_pin;

/// What the gateway answered a certificate request, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered {
    /// Granted: the new certificate chain (DER, leaf first, the site CA last), and the site
    /// CA (DER) it was verified against.
    Issued {
        /// DER certificates, the new one first.
        chain: Vec<Vec<u8>>,
        /// The site CA, DER.
        ca: Vec<u8>,
        /// The answer CAs the gateway named (`IssuedCertificate.answer_cas`, DER), each
        /// checked to have issued the answer key of this very answer or to come with it:
        /// the only issuers of answers to trust from now on (see
        /// [`crate::signing::AnswerVerifier::pinned`]). Empty from a gateway without them.
        answer_cas: Vec<Vec<u8>>,
    },
    /// Not now (pending approval, the apiserver unreachable): ask again later.
    Pending(String),
    /// Rejected for good as it stands (`Answer::Rejected`: a token that does not cover the
    /// node, used up, expired; a CSR the gateway will not sign): a new token, or a fix, is
    /// needed.
    Rejected(String),
}

/// How an agent trusts the gateway's answer to its certificate request.
#[derive(Debug, Clone, Copy)]
pub enum AnswerTrust<'a> {
    /// First enrollment: only the pin of its bootstrap token. The granted answer carries the
    /// site CA (the chain's last certificate), which must have the pin; then the answer is
    /// verified against it. Anything else (pending, refused) cannot be verified yet and is
    /// taken as "ask again later".
    Pin([u8; 32]),
    /// Rotation by an agent that has learnt no answer CA: the site CA it already trusts,
    /// whose PEM this is.
    Ca(&'a [u8]),
    /// Rotation: the answer CAs (DER) the agent learnt at enrollment or at its last
    /// rotation; only an answer key they issued is taken.
    AnswerCas(&'a [Vec<u8>]),
}

/// Why an answer to a certificate request was not taken (the agent ignores it and asks
/// again later).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadAnswerError {
    /// The trusted CA's PEM is unusable.
    #[error("the site CA: {0}")]
    Ca(String),
    /// The answer does not verify against the trusted CA (unsigned, another key, a bad
    /// signature, an expired or foreign answer certificate).
    #[error("unverified answer: {0}")]
    Unverified(#[from] crate::signing::AnswerError),
    /// An issued chain whose CA is not the one the bootstrap token pins.
    #[error("the issued chain's CA is not the bootstrap token's")]
    NotPinned,
    /// A verified answer, but to another node, boot or request (on a shared ack topic,
    /// someone else's; keep waiting for this one's).
    #[error("an answer to another request")]
    OtherRequest,
    /// A verified answer that makes no sense (no CA in an issued chain, an unknown kind, a
    /// contradictory Ack).
    #[error("malformed answer: {0}")]
    Malformed(String),
}

/// Reads the gateway's answer `payload` (a [`SignedAnswer`](edgebeat_proto::SignedAnswer))
/// to the certificate request of `node` with `boot_tag` and `seq`, trusting it as `trust`
/// says (see [`AnswerTrust`]) at `now`.
///
/// Errors: [`ReadAnswerError`] when the answer does not verify or is not for this request.
pub fn read_answer(
    payload: &[u8],
    trust: AnswerTrust<'_>,
    node: &str,
    boot_tag: u32,
    seq: u64,
    now: rustls::pki_types::UnixTime,
) -> Result<Answered, ReadAnswerError> {
    use edgebeat_proto::gateway_message::Kind;
    use edgebeat_proto::{Answer, GatewayMessage};

    let malformed = |what: &str| ReadAnswerError::Malformed(what.to_owned());
    let verifier = match trust {
        AnswerTrust::Ca(pem) => crate::signing::AnswerVerifier::from_pem(pem)
            .map_err(|e| ReadAnswerError::Ca(e.to_string()))?,
        AnswerTrust::AnswerCas(answer_cas) => crate::signing::AnswerVerifier::pinned(answer_cas)
            .map_err(|e| ReadAnswerError::Ca(e.to_string()))?,
        AnswerTrust::Pin(pin) => {
            // The claim, unverified until its CA has the pin and its signature verifies.
            let signed = crate::signing::unseal_answer(payload)
                .ok_or(crate::signing::AnswerError::Unsigned)?;
            let claimed = GatewayMessage::decode(signed.signed_message.as_slice())
                .map_err(|e| ReadAnswerError::Malformed(e.to_string()))?;
            let Some(Kind::Certificate(issued)) = claimed.kind else {
                return Ok(Answered::Pending(
                    "an answer that cannot be verified before the site CA is known".into(),
                ));
            };
            let ca = issued
                .certificate_chain
                .last()
                .ok_or_else(|| malformed("an issued certificate without its CA"))?;
            if ca_pin(ca).map_err(|_| ReadAnswerError::NotPinned)? != pin {
                return Err(ReadAnswerError::NotPinned);
            }
            crate::signing::AnswerVerifier::from_der(ca)
                .map_err(|e| ReadAnswerError::Ca(e.to_string()))?
        }
    };
    let message = verifier.verify(payload, now)?;
    match message.kind {
        Some(Kind::Certificate(issued)) => {
            if issued.node_name != node || issued.boot_tag != boot_tag || issued.seq != seq {
                return Err(ReadAnswerError::OtherRequest);
            }
            if issued.certificate_chain.len() < 2 {
                return Err(malformed("an issued chain without the site CA"));
            }
            let ca = issued
                .certificate_chain
                .last()
                .cloned()
                .ok_or_else(|| malformed("an issued certificate without its CA"))?;
            if !issued.answer_cas.is_empty() {
                // The answer CAs named must include the issuer of this answer's key, and
                // none may be the site CA: a certificate the site CA issued directly can
                // then neither sign this answer nor name CAs of its own.
                let site_key = crate::signing::public_key_info(&ca)
                    .map_err(|e| ReadAnswerError::Malformed(format!("site CA: {e}")))?;
                for answer_ca in &issued.answer_cas {
                    if crate::signing::public_key_info(answer_ca)
                        .map_err(|e| ReadAnswerError::Malformed(format!("answer CA: {e}")))?
                        == site_key
                    {
                        return Err(malformed("the site CA named as an answer CA"));
                    }
                }
                crate::signing::AnswerVerifier::pinned(&issued.answer_cas)
                    .map_err(|e| ReadAnswerError::Malformed(format!("answer CAs: {e}")))?
                    .verify(payload, now)?;
            }
            Ok(Answered::Issued {
                chain: issued.certificate_chain,
                ca,
                answer_cas: issued.answer_cas,
            })
        }
        Some(Kind::Ack(ack)) => {
            if ack.node_name != node || ack.boot_tag != boot_tag || ack.seq != seq {
                return Err(ReadAnswerError::OtherRequest);
            }
            match Answer::try_from(ack).map_err(|e| ReadAnswerError::Malformed(e.to_string()))? {
                Answer::Rejected { reason } => Ok(Answered::Rejected(reason)),
                other => Ok(Answered::Pending(other.reason().to_owned())),
            }
        }
        None => Err(malformed("an answer of an unknown kind")),
    }
}
