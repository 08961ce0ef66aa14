//! One certificate request, from its payload to its signed answer: opening it, the checks
//! in order (node, clock window, replay, proof, the PKCS#10 request, Kubernetes), and what
//! became of it.

use edgebeat_proto::{
    Answer, CertificateRequest, GatewayMessage, Header, IssuedCertificate, gateway_message,
};
use edgebeat_transports::ingress::TransportKind;
use prost::Message as _;

use super::Enrollment;
use super::csr::{check_csr, csr_name};
use super::proof::Proof;
use super::rejection::{CsrRejectReason, CsrRejection, Unissued};

/// What became of one request.
enum Outcome {
    /// Issued: the certificate chain, DER, the leaf first.
    Issued(Vec<Vec<u8>>),
    /// Pending, answered `Answer::Retry` with the text.
    Pending(String),
    /// Rejected, answered `Answer::Rejected` with the detail.
    Rejected(CsrRejection),
    /// Rejected without an answer: a replay, or something that names no request.
    Unanswered(CsrRejectReason),
}

impl From<Unissued> for Outcome {
    fn from(unissued: Unissued) -> Self {
        match unissued {
            Unissued::Rejected(rejection) => Self::Rejected(rejection),
            Unissued::Pending(why) => Self::Pending(why),
        }
    }
}

/// A request's signed bytes and signature, when it came as a SignedMessage.
type Signed = (Vec<u8>, Vec<u8>);

impl Enrollment {
    /// Handles one certificate request `payload` that came by `transport` (MQTT: on the
    /// topic of `topic_node`, which must be the request's node) and returns the answer to
    /// send (an encoded SignedAnswer), or `None` for a replay or anything that names no
    /// request (see the module docs).
    pub async fn handle(
        &self,
        transport: TransportKind,
        topic_node: Option<&str>,
        payload: &[u8],
    ) -> Option<Vec<u8>> {
        let (request, signed) = match open(payload) {
            Ok(opened) => opened,
            Err(why) => {
                self.counters
                    .count("unknown", CsrRejectReason::Malformed.as_str());
                tracing::debug!(%why, transport = transport.as_str(), "certificate request rejected");
                return None;
            }
        };
        let header = request.header.clone().unwrap_or_default();
        let proof_label = if signed.is_some() {
            "certificate"
        } else {
            "token"
        };
        let outcome = self
            .decide(transport, topic_node, &request, &header, signed)
            .await;
        let answer = match outcome {
            Outcome::Unanswered(reason) => {
                self.counters.count(proof_label, reason.as_str());
                tracing::debug!(node = %header.node_name, reason = reason.as_str(), "certificate request not answered");
                return None;
            }
            Outcome::Issued(chain) => {
                self.counters.count(proof_label, "issued");
                tracing::info!(node = %header.node_name, proof = proof_label, transport = transport.as_str(), "node certificate issued");
                gateway_message::Kind::Certificate(IssuedCertificate {
                    seq: header.seq,
                    node_name: header.node_name.clone(),
                    boot_tag: header.named_boot_tag(),
                    certificate_chain: chain,
                    answer_cas: self.answer_cas.clone(),
                })
            }
            Outcome::Pending(why) => {
                self.counters.count(proof_label, "pending");
                tracing::info!(node = %header.node_name, %why, "certificate request pending");
                ack(&header, Answer::Retry { reason: why })
            }
            Outcome::Rejected(rejected) => {
                let reason = rejected.reason.as_str();
                self.counters.count(proof_label, reason);
                if let edgebeat_transports::log_limit::LogLine::Write { suppressed, others } = self
                    .counters
                    .rejection_log
                    .check(reason, &header.node_name, tokio::time::Instant::now())
                {
                    tracing::warn!(node = %header.node_name, reason, detail = %rejected.detail, transport = transport.as_str(), suppressed, other_sources = others, "certificate request rejected");
                }
                ack(
                    &header,
                    Answer::Rejected {
                        reason: rejected.detail,
                    },
                )
            }
        };
        let message = GatewayMessage { kind: Some(answer) };
        match self.answers.seal(&message) {
            Ok(sealed) => Some(sealed),
            Err(error) => {
                tracing::error!(%error, "certificate answer not sent: it could not be signed");
                None
            }
        }
    }

    async fn decide(
        &self,
        transport: TransportKind,
        topic_node: Option<&str>,
        request: &CertificateRequest,
        header: &Header,
        signed: Option<Signed>,
    ) -> Outcome {
        let node = header.node_name.as_str();
        if !edgebeat_transports::tls::is_node_name(node) || topic_node.is_some_and(|t| t != node) {
            return Outcome::Unanswered(CsrRejectReason::Foreign);
        }
        let now = self.clock.now();
        let since_epoch = edgebeat_hw::UnixTime::from(now).duration();
        if edgebeat_transports::signing::check_clock_window(
            header.wall_time_ms,
            since_epoch,
            self.options.max_clock_skew,
        )
        .is_err()
        {
            return Outcome::Unanswered(CsrRejectReason::ClockSkew);
        }
        // Refused early without a proof's cost (a token read), recorded only once proved.
        if self.replayed(header) {
            return Outcome::Unanswered(CsrRejectReason::Replayed);
        }
        let proof = match &signed {
            Some((signed_bytes, signature)) => {
                match self
                    .prove_by_certificate(request, node, signed_bytes, signature, now)
                    .await
                {
                    Ok(()) => Proof::Certificate,
                    Err(rejected) => return Outcome::Rejected(rejected),
                }
            }
            None => match self.prove_by_token(request, header).await {
                Ok(id) => Proof::Token(id),
                Err(unissued) => return unissued.into(),
            },
        };
        if !self.first_time(header) {
            return Outcome::Unanswered(CsrRejectReason::Replayed);
        }
        let public_key = match check_csr(&request.csr, node) {
            Ok(key) => key,
            Err(rejected) => return Outcome::Rejected(rejected),
        };
        if let Err(rejected) = self.check_managed(node).await {
            return Outcome::Rejected(rejected);
        }
        match self
            .through_kubernetes(transport, node, &request.csr, public_key, &proof)
            .await
        {
            Ok(Some(chain)) => Outcome::Issued(chain),
            Ok(None) => Outcome::Pending(format!(
                "pending: the CertificateSigningRequest {} waits for approval (kubectl certificate approve) or its signer",
                csr_name(&request.csr, node)
            )),
            Err(unissued) => unissued.into(),
        }
    }
}

/// The Ack of `answer` to the request of `header`, bound to its node and boot.
fn ack(header: &Header, answer: Answer) -> gateway_message::Kind {
    let mut ack = answer.into_ack(header.seq);
    ack.node_name.clone_from(&header.node_name);
    ack.boot_tag = header.named_boot_tag();
    gateway_message::Kind::Ack(ack)
}

/// The request in `payload`, and its `(signed bytes, signature)` when it came as a
/// SignedMessage (proved by a certificate).
fn open(payload: &[u8]) -> Result<(CertificateRequest, Option<Signed>), String> {
    let (bytes, signed) = match edgebeat_transports::signing::unseal(payload) {
        Some((signed, signature)) => (signed.clone(), Some((signed, signature))),
        None => (payload.to_vec(), None),
    };
    let request = CertificateRequest::decode(bytes.as_slice()).map_err(|e| e.to_string())?;
    if request.header.is_none() || request.csr.is_empty() {
        return Err("a request without header or CSR".into());
    }
    Ok((request, signed))
}
