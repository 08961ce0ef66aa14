//! Node certificates without hands: the gateway's side of enrollment and rotation.
//!
//! A [`CertificateRequest`] arrives on the enrollment endpoint (the gRPC Enrollment service,
//! or MQTT `P/nodes/<node>/csr`), proved by a bootstrap token or by the node's certificate
//! (see its wire docs). [`Enrollment::handle`] checks it the way kube-apiserver and
//! kube-controller-manager together check a kubelet's (`pkg/kubelet/certificate/bootstrap`,
//! `pkg/controller/certificates/approver/sarapprove.go`, `.../signer/signer.go`), and every
//! certificate goes through Kubernetes:
//!
//! 1. **Proof.** The clock window (signed wall time within `max_clock_skew`) and the
//!    per-boot sequence (a replay gets no answer), then either the token (its Secret
//!    [`tokens::token_secret_name`]: not expired, its node names cover the node, uses left,
//!    the HMAC proof) or the certificate (the site CA's, the node's own identity, the
//!    request signed with its key; one that expired less than `grace` ago still proves a
//!    renewal, for a Node that still exists). The sequence is recorded only once the proof
//!    verified, so an unproved request cannot move a node's replay window.
//! 2. **The request.** PKCS#10 with a valid self-signature (proof of the key), subject
//!    exactly O=`system:nodes`, CN=`system:node:<node>`, no subject alternative names, no
//!    usage but digital signature and client auth, a P-256 or Ed25519 key.
//! 3. **A `certificates.k8s.io/v1` CertificateSigningRequest**, named after the key and
//!    the node (`edgebeat-<hash>`), so a retried request finds its own; labelled with the
//!    token that proved it, annotated with the node, transport and proof; a new CSR counts
//!    one use of the token, recorded in its Secret ([`tokens::USAGE_COUNT_KEY`]), so the
//!    count outlives CSRs that the garbage collector deletes. `kubectl get csr` shows every enrollment and rotation.
//! 4. **Approval** through the `/approval` subresource: with [`Approval::Auto`] every
//!    proved request; with [`Approval::Manual`] rotations only, first enrollments waiting
//!    for `kubectl certificate approve` (the agent asks again with backoff). Under
//!    [`KUBELET_SIGNER_NAME`] kube-controller-manager approves, the gateway never.
//! 5. **Signing.** Under the gateway's own signer name it signs with the site CA
//!    ([`ca::SiteCa`]) and writes `status.certificate` through `/status`; under another
//!    (cert-manager, kube-controller-manager) it waits for that signer.
//!
//! The answer is signed ([`edgebeat_transports::signing::AnswerSigner`]) and binds the
//! node, boot and sequence it answers; a granted one carries the chain with the site CA
//! last, which an enrolling agent checks against its token's pin.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use edgebeat_hw::Clock;
use edgebeat_transports::enroll;
use edgebeat_transports::signing::{AnswerSigner, CertificateVerifier};

pub mod answer_ca;
pub mod ca;
pub mod gate;
pub mod tokens;

mod clock;
mod csr;
mod handle;
mod lifecycle;
mod metrics;
mod proof;
mod rejection;
mod replay;
mod uses;
mod x509;

use ca::SiteCa;
use replay::Seen;

pub use csr::csr_name;
pub use metrics::EnrollmentCounters;
pub use rejection::CsrRejectReason;

/// The signer name of the certificates the gateway signs itself:
/// `edgebeat.io/node-client`.
pub const DEFAULT_SIGNER_NAME: &str = "edgebeat.io/node-client";

/// kubelet's client signer, `kubernetes.io/kube-apiserver-client-kubelet`
/// (`staging/src/k8s.io/api/certificates/v1/types.go`: `KubeAPIServerClientKubeletSignerName`):
/// kube-controller-manager approves its requests (`pkg/controller/certificates/approver/
/// sarapprove.go`: a requester allowed to create `certificatesigningrequests/nodeclient`)
/// and signs them with the cluster's signing CA, so the gateway neither approves nor signs.
pub const KUBELET_SIGNER_NAME: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// The least `spec.expirationSeconds` the API accepts (`pkg/apis/certificates/validation`:
/// 600 s, 10 minutes).
pub const MIN_EXPIRATION_SECONDS: u64 = 600;

/// Label on a CertificateSigningRequest: the bootstrap token that proved it.
pub const TOKEN_LABEL: &str = "edgebeat.io/bootstrap-token";

/// Annotation on a CertificateSigningRequest: the node it is for.
pub const NODE_ANNOTATION: &str = "edgebeat.io/node";

/// Annotation on a CertificateSigningRequest: the transport it came by (`grpc`, `mqtt`).
pub const TRANSPORT_ANNOTATION: &str = "edgebeat.io/transport";

/// Annotation on a CertificateSigningRequest: how it was proved (`token`, `certificate`).
pub const PROOF_ANNOTATION: &str = "edgebeat.io/proof";

/// The UTF-8 text under `key` in `secret`'s `data`; `None` when absent or not UTF-8.
fn secret_text(secret: &k8s_openapi::api::core::v1::Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

/// Why the enrollment side could not start or do something.
#[derive(Debug, thiserror::Error)]
pub enum EnrollmentError {
    /// The site CA cannot be made, read or used.
    #[error("site CA: {0}")]
    Ca(String),
    /// The site CA's or the gateway's answer key's TLS material cannot be used.
    #[error("site CA: {0}")]
    CaTls(#[from] edgebeat_transports::tls::TlsError),
    /// The gateway's answer key from the site CA cannot sign answers agents take.
    #[error("site CA: the gateway's answer key: {0}")]
    AnswerSigner(#[from] edgebeat_transports::signing::AnswerSignerError),
    /// A bootstrap token cannot be made or read.
    #[error("bootstrap token: {0}")]
    Token(String),
    /// An apiserver call failed.
    #[error("apiserver: {0}")]
    Apiserver(#[from] kube::Error),
}

/// Who approves first enrollments (`--csr-approval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval {
    /// The gateway approves every proved request (a valid token for the node with uses
    /// left, or the node's certificate).
    Auto,
    /// The gateway approves rotations (proved by the node's certificate); first
    /// enrollments wait for `kubectl certificate approve`.
    Manual,
}

/// How the gateway enrolls and rotates node certificates.
#[derive(Debug, Clone)]
pub struct EnrollmentOptions {
    /// Namespace of the token Secrets and the site CA Secret (the gateway's own).
    pub namespace: String,
    /// `spec.signerName` of the CSRs ([`DEFAULT_SIGNER_NAME`]: the gateway signs;
    /// [`KUBELET_SIGNER_NAME`]: kube-controller-manager approves and signs).
    pub signer_name: String,
    /// The CA (PEM) of another signer's certificates: node certificates are verified
    /// against it too, on every ingress and as rotation proofs. `None` for the gateway's
    /// own signer.
    pub signer_ca_pem: Option<Vec<u8>>,
    /// Who approves first enrollments.
    pub approval: Approval,
    /// Lifetime of a node certificate (`spec.expirationSeconds`; default 1 year,
    /// kube-controller-manager's `--cluster-signing-duration`).
    pub lifetime: Duration,
    /// How long after its notAfter a certificate still proves a renewal (default 30
    /// days): a board that was offline when its certificate expired renews it when back,
    /// for a Node that still exists; past it, it needs a new token.
    pub grace: Duration,
    /// Largest difference between a request's `wall_time_ms` and the gateway's clock
    /// (default 30 s).
    pub max_clock_skew: Duration,
}

impl Default for EnrollmentOptions {
    fn default() -> Self {
        Self {
            namespace: "edgebeat-system".to_owned(),
            signer_name: DEFAULT_SIGNER_NAME.to_owned(),
            signer_ca_pem: None,
            approval: Approval::Auto,
            lifetime: Duration::from_secs(365 * 24 * 3600),
            grace: Duration::from_secs(30 * 24 * 3600),
            max_clock_skew: Duration::from_secs(30),
        }
    }
}

/// The enrollment side of one gateway replica (see the module docs).
pub struct Enrollment {
    client: kube::Client,
    options: EnrollmentOptions,
    /// The site CA with its key, when the gateway signs (its own signer name).
    ca: Option<SiteCa>,
    /// The site CA certificate (DER) agents are given and proofs are checked against.
    ca_der: Vec<u8>,
    /// The CAs of node certificates (PEM): another signer's
    /// ([`EnrollmentOptions::signer_ca_pem`]), then the site CA.
    node_cas: Vec<u8>,
    /// Verifies node certificates against `node_cas`.
    verifier: CertificateVerifier,
    answers: Arc<AnswerSigner>,
    /// The answer CAs (DER) certificate answers name (`IssuedCertificate.answer_cas`).
    answer_cas: Vec<Vec<u8>>,
    identity: ca::GatewayIdentity,
    clock: Arc<dyn Clock>,
    /// Latest `(boot ID, seq)` accepted per node, and when: replays are rejected for
    /// twice the clock window, after which the window rejects them.
    seen: Mutex<Seen>,
    /// Uses of each bootstrap token this replica made and has not yet added to the token's
    /// Secret, by token id (see [`Enrollment::flush_uses`]).
    unrecorded_uses: Mutex<HashMap<String, u32>>,
    /// Held while uses are written to a token's Secret.
    recording_uses: tokio::sync::Mutex<()>,
    /// Requests and outcomes, for `/metrics`.
    pub counters: EnrollmentCounters,
}

impl std::fmt::Debug for Enrollment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enrollment")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Enrollment {
    /// The lifetime of the certificates it issues (`--certificate-lifetime`; a CSR may
    /// ask for less).
    pub fn lifetime(&self) -> Duration {
        self.options.lifetime
    }

    /// The enrollment side signing with the site CA of the Secret [`ca::SITE_CA_SECRET`]
    /// (made if absent), which also issues the gateway's answer key.
    ///
    /// Errors: [`EnrollmentError`] when the CA cannot be loaded or made.
    pub async fn with_site_ca(
        client: kube::Client,
        options: EnrollmentOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, EnrollmentError> {
        let now = clock.unix_now().seconds();
        let ca = SiteCa::load_or_create(client.clone(), &options.namespace, now).await?;
        let identity = ca.gateway_identity(now)?;
        let answers = Arc::new(AnswerSigner::from_pem(
            identity.cert_pem.as_bytes(),
            identity.key_pem.as_bytes(),
            ca.ca.cert_pem.as_bytes(),
        )?);
        let ca_der = ca.ca.cert_der.clone();
        let answer_cas = ca.answer_cas();
        let mut node_cas = options.signer_ca_pem.clone().unwrap_or_default();
        node_cas.extend_from_slice(ca.ca.cert_pem.as_bytes());
        let verifier = CertificateVerifier::from_pem(&node_cas).map_err(EnrollmentError::CaTls)?;
        Ok(Self {
            client,
            options,
            ca: Some(ca),
            ca_der,
            node_cas,
            verifier,
            answers,
            answer_cas,
            identity,
            clock,
            seen: Mutex::default(),
            unrecorded_uses: Mutex::default(),
            recording_uses: tokio::sync::Mutex::default(),
            counters: EnrollmentCounters::default(),
        })
    }

    /// The site CA (PEM) this replica checks proofs against and gives agents.
    pub fn ca_pem(&self) -> String {
        enroll::pem("CERTIFICATE", &self.ca_der)
    }

    /// This replica's own certificate and key from the site CA (see
    /// [`SiteCa::gateway_identity`]): its answer key, and its gRPC serving certificate
    /// when none is given.
    pub fn gateway_identity(&self) -> &ca::GatewayIdentity {
        &self.identity
    }

    /// The CA bundle node certificates are verified against on every ingress: `extra` (the
    /// CA of hand-made node certificates, `--grpc-client-ca` or `--mqtt-node-ca`, while a
    /// fleet moves to enrollment), the CA of another signer
    /// ([`EnrollmentOptions::signer_ca_pem`]) and the site CA.
    pub fn node_ca_pem(&self, extra: Option<Vec<u8>>) -> Vec<u8> {
        let mut bundle = extra.unwrap_or_default();
        bundle.extend_from_slice(&self.node_cas);
        bundle
    }

    /// TLS of a gRPC listener with this replica's own certificate ([`ANSWER_SIGNER_NAME`]
    /// from the site CA, which enrolled agents verify under that name) and client
    /// certificates from [`Enrollment::node_ca_pem`] of `extra`.
    ///
    /// [`ANSWER_SIGNER_NAME`]: edgebeat_transports::signing::ANSWER_SIGNER_NAME
    pub fn grpc_server_tls(
        &self,
        extra: Option<Vec<u8>>,
    ) -> edgebeat_transports::tls::GrpcServerTls {
        edgebeat_transports::tls::GrpcServerTls {
            cert_pem: self.identity.cert_pem.clone().into_bytes(),
            key_pem: self.identity.key_pem.clone().into_bytes(),
            client_ca_pem: Some(self.node_ca_pem(extra)),
        }
    }

    /// The answer CAs (DER) this replica names in its certificate answers, the one it signs
    /// with first.
    pub fn answer_cas(&self) -> &[Vec<u8>] {
        &self.answer_cas
    }

    /// The options this replica enrolls with.
    pub fn options(&self) -> &EnrollmentOptions {
        &self.options
    }

    /// The answer key this replica signs with (also for its MQTT answers).
    pub fn answer_signer(&self) -> Arc<AnswerSigner> {
        self.answers.clone()
    }

    /// The pin of the site CA ([`enroll::ca_pin`]), for bootstrap tokens.
    ///
    /// Errors: [`EnrollmentError::Ca`] (cannot happen for a CA that loaded).
    pub fn pin(&self) -> Result<[u8; 32], EnrollmentError> {
        enroll::ca_pin(&self.ca_der).map_err(|e| EnrollmentError::Ca(e.to_string()))
    }
}

#[cfg(test)]
mod tests;
