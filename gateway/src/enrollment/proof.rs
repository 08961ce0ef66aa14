//! Who asks: the proof of a request, by a bootstrap token (with uses left) or by the
//! node's certificate.

use std::time::Duration;

use edgebeat_proto::{CertificateRequest, Header, NodeCertificate};
use edgebeat_transports::enroll;
use kube::Api;
use prost::Message as _;
use rustls::pki_types::UnixTime;

use super::csr::csr_name;
use super::refusal::{Refused, refuse};
use super::{Enrollment, EnrollmentError, tokens};

/// How a request was proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Proof {
    /// A bootstrap token, by id.
    Token(String),
    /// The node's certificate.
    Certificate,
}

impl Proof {
    pub(super) fn as_str(&self) -> &'static str {
        match self {
            Self::Token(_) => "token",
            Self::Certificate => "certificate",
        }
    }
}

impl Enrollment {
    /// The token proof: the token's id when it holds. `Err(Ok(_))` refuses,
    /// `Err(Err(_))` says to ask again (the apiserver unreachable).
    pub(super) async fn prove_by_token(
        &self,
        request: &CertificateRequest,
        header: &Header,
    ) -> Result<String, Result<Refused, String>> {
        let node = header.node_name.as_str();
        if request.token_id.is_empty() {
            return Err(Ok(refuse(
                "unproved",
                "neither a bootstrap token nor a node certificate proves the request",
            )));
        }
        let token = match tokens::read_token(
            self.client.clone(),
            &self.options.namespace,
            &request.token_id,
        )
        .await
        {
            Ok(Some(token)) => token,
            Ok(None) => return Err(Ok(refuse("token_unknown", "unknown bootstrap token"))),
            Err(EnrollmentError::Apiserver(e)) => {
                return Err(Err(format!("reading the bootstrap token: {e}")));
            }
            Err(e) => return Err(Ok(refuse("token_unknown", e.to_string()))),
        };
        if !enroll::verify_token_proof(token.secret(), header, &request.csr, &request.token_proof) {
            return Err(Ok(refuse(
                "bad_proof",
                "the token proof does not verify (another secret, or a request altered)",
            )));
        }
        if token.expires <= self.now() {
            return Err(Ok(refuse(
                "token_expired",
                format!("bootstrap token {} expired at {}", token.id, token.expires),
            )));
        }
        if !token.allows(node) {
            return Err(Ok(refuse(
                "token_node",
                format!(
                    "bootstrap token {} does not cover node {node:?} (it covers {})",
                    token.id,
                    token.nodes.join(", ")
                ),
            )));
        }
        // Uses: those its Secret records, and those this replica made since. A retry of a
        // request whose CSR exists already (pending approval) is not a new use.
        let unrecorded = self
            .unrecorded_uses
            .lock()
            .get(&token.id)
            .copied()
            .unwrap_or(0);
        let used = token.used.saturating_add(unrecorded);
        let own = csr_name(&request.csr, node);
        if used >= token.usage_limit && !self.csr_exists(&own).await {
            return Err(Ok(refuse(
                "token_used_up",
                format!(
                    "bootstrap token {} has enrolled its {} nodes",
                    token.id, token.usage_limit
                ),
            )));
        }
        Ok(token.id)
    }

    /// The certificate proof: the request signed with the key of a site-CA certificate of
    /// `node` that is valid, or expired less than `grace` ago for a Node that still exists.
    pub(super) async fn prove_by_certificate(
        &self,
        request: &CertificateRequest,
        node: &str,
        signed: &[u8],
        signature: &[u8],
        now: std::time::SystemTime,
    ) -> Result<(), Refused> {
        use x509_parser::prelude::FromDer as _;

        let leaf = request
            .certificate_chain
            .first()
            .ok_or_else(|| refuse("unproved", "a signed request without its certificate"))?;
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(leaf).map_err(|e| {
            refuse(
                "certificate",
                format!("the certificate does not parse: {e}"),
            )
        })?;
        let not_after = cert.validity().not_after.timestamp();
        let now_s = i64::try_from(
            now.duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs(),
        )
        .unwrap_or(i64::MAX);
        let grace = i64::try_from(self.options.grace.as_secs()).unwrap_or(i64::MAX);
        let expired = now_s > not_after;
        if expired && now_s - not_after > grace {
            return Err(refuse(
                "certificate_expired",
                format!(
                    "the node's certificate expired more than {} days ago; enroll it again with a bootstrap token",
                    self.options.grace.as_secs() / 86_400
                ),
            ));
        }
        // An expired certificate is checked as of its last valid second.
        let at = if expired { not_after - 1 } else { now_s };
        let at = UnixTime::since_unix_epoch(Duration::from_secs(u64::try_from(at).unwrap_or(0)));
        let published = NodeCertificate {
            certificate_chain: request.certificate_chain.clone(),
        }
        .encode_to_vec();
        let key = self
            .verifier
            .verify(node, &published, at)
            .map_err(|e| refuse("certificate", e.to_string()))?;
        key.verify(signed, signature, at)
            .map_err(|e| refuse("bad_signature", e.to_string()))?;
        if expired {
            let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
            match nodes.get_opt(node).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(refuse(
                        "certificate_expired",
                        format!(
                            "the certificate expired and Node {node} no longer exists; enroll it again with a bootstrap token"
                        ),
                    ));
                }
                Err(e) => return Err(refuse("apiserver", format!("reading Node {node}: {e}"))),
            }
        }
        Ok(())
    }
}
