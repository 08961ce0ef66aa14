//! Who asks: the proof of a request, by a bootstrap token (with uses left) or by the
//! node's certificate.

use std::time::Duration;

use edgebeat_proto::{CertificateRequest, Header, NodeCertificate};
use edgebeat_transports::enroll;
use kube::Api;
use prost::Message as _;
use rustls::pki_types::UnixTime;

use super::csr::csr_name;
use super::rejection::{CsrRejectReason, CsrRejection, Unissued, reject};
use super::{Enrollment, EnrollmentError, KUBELET_SIGNER_NAME, tokens};

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
    /// The token proof: the token's id when it holds. [`Unissued::Rejected`] rejects,
    /// [`Unissued::Pending`] says to ask again (the apiserver unreachable).
    pub(super) async fn prove_by_token(
        &self,
        request: &CertificateRequest,
        header: &Header,
    ) -> Result<String, Unissued> {
        let node = header.node_name.as_str();
        if request.token_id.is_empty() {
            return Err(reject(
                CsrRejectReason::Unproved,
                "neither a bootstrap token nor a node certificate proves the request",
            )
            .into());
        }
        let token = match tokens::read_token(
            self.client.clone(),
            &self.options.namespace,
            &request.token_id,
        )
        .await
        {
            Ok(Some(token)) => token,
            Ok(None) => {
                return Err(
                    reject(CsrRejectReason::TokenUnknown, "unknown bootstrap token").into(),
                );
            }
            Err(EnrollmentError::Apiserver(e)) => {
                return Err(Unissued::Pending(format!(
                    "reading the bootstrap token: {e}"
                )));
            }
            Err(e) => return Err(reject(CsrRejectReason::TokenUnknown, e.to_string()).into()),
        };
        if !enroll::verify_token_proof(token.secret(), header, &request.csr, &request.token_proof) {
            return Err(reject(
                CsrRejectReason::BadProof,
                "the token proof does not verify (another secret, or a request altered)",
            )
            .into());
        }
        if token.expires <= self.now() {
            return Err(reject(
                CsrRejectReason::TokenExpired,
                format!("bootstrap token {} expired at {}", token.id, token.expires),
            )
            .into());
        }
        if !token.allows(node) {
            return Err(reject(
                CsrRejectReason::TokenNode,
                format!(
                    "bootstrap token {} does not cover node {node:?} (it covers {})",
                    token.id,
                    token.nodes.join(", ")
                ),
            )
            .into());
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
            return Err(reject(
                CsrRejectReason::TokenUsedUp,
                format!(
                    "bootstrap token {} has enrolled its {} nodes",
                    token.id, token.usage_limit
                ),
            )
            .into());
        }
        Ok(token.id)
    }

    /// Under kubelet's signer ([`KUBELET_SIGNER_NAME`]), whose certificates kube-apiserver
    /// accepts as the node: refuses a node whose Node exists without
    /// [`MANAGED_LABEL`](crate::bodies::MANAGED_LABEL). A bootstrap token whose names cover
    /// it, or a worker's own kubelet certificate (which the signer CA also verifies, even
    /// expired within `--certificate-grace`), would otherwise get a fresh credential of a
    /// node edgebeat does not run. A Node not there yet (a first enrollment) passes.
    ///
    /// # Errors
    /// [`CsrRejectReason::NodeNotManaged`], or [`CsrRejectReason::Apiserver`] when the Node
    /// cannot be read (the agent asks again).
    pub(super) async fn check_managed(&self, node: &str) -> Result<(), CsrRejection> {
        if self.options.signer_name != KUBELET_SIGNER_NAME {
            return Ok(());
        }
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        match nodes.get_opt(node).await {
            Ok(None) => Ok(()),
            Ok(Some(found)) if crate::view::NodeRecord::of(&found).managed => Ok(()),
            Ok(Some(_)) => Err(reject(
                CsrRejectReason::NodeNotManaged,
                format!(
                    "Node {node} exists and is not managed by edgebeat (no label {}={}): under signer {KUBELET_SIGNER_NAME} its certificate would be that node's apiserver credential",
                    crate::bodies::MANAGED_LABEL.0,
                    crate::bodies::MANAGED_LABEL.1
                ),
            )),
            Err(e) => Err(reject(
                CsrRejectReason::Apiserver,
                format!("reading Node {node}: {e}"),
            )),
        }
    }

    /// The certificate proof: the request signed with the key of a certificate of `node`
    /// from the site CA (or the CA of another signer, [`super::EnrollmentOptions::signer_ca_pem`])
    /// that is valid, or expired less than `grace` ago for a Node that still exists.
    pub(super) async fn prove_by_certificate(
        &self,
        request: &CertificateRequest,
        node: &str,
        signed: &[u8],
        signature: &[u8],
        now: std::time::SystemTime,
    ) -> Result<(), CsrRejection> {
        use x509_parser::prelude::FromDer as _;

        let leaf = request.certificate_chain.first().ok_or_else(|| {
            reject(
                CsrRejectReason::Unproved,
                "a signed request without its certificate",
            )
        })?;
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(leaf).map_err(|e| {
            reject(
                CsrRejectReason::Certificate,
                format!("the certificate does not parse: {e}"),
            )
        })?;
        let not_after = cert.validity().not_after.timestamp();
        let now_s = edgebeat_hw::UnixTime::from(now).seconds();
        let grace = i64::try_from(self.options.grace.as_secs()).unwrap_or(i64::MAX);
        let expired = now_s > not_after;
        if expired && now_s - not_after > grace {
            return Err(reject(
                CsrRejectReason::CertificateExpired,
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
            .map_err(|e| reject(CsrRejectReason::Certificate, e.to_string()))?;
        key.verify(signed, signature, at)
            .map_err(|e| reject(CsrRejectReason::BadSignature, e.to_string()))?;
        if expired {
            let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
            match nodes.get_opt(node).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(reject(
                        CsrRejectReason::CertificateExpired,
                        format!(
                            "the certificate expired and Node {node} no longer exists; enroll it again with a bootstrap token"
                        ),
                    ));
                }
                Err(e) => {
                    return Err(reject(
                        CsrRejectReason::Apiserver,
                        format!("reading Node {node}: {e}"),
                    ));
                }
            }
        }
        Ok(())
    }
}
