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
//!    renewal, for a Node that still exists).
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
//!    for `kubectl certificate approve` (the agent asks again with backoff).
//! 5. **Signing.** Under the gateway's own signer name it signs with the site CA
//!    ([`ca::SiteCa`]) and writes `status.certificate` through `/status`; under another
//!    (cert-manager, kube-controller-manager) it waits for that signer.
//!
//! The answer is signed ([`edgebeat_transports::signing::AnswerSigner`]) and binds the
//! node, boot and sequence it answers; a granted one carries the chain with the site CA
//! last, which an enrolling agent checks against its token's pin.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use edgebeat_hw::Clock;
use edgebeat_proto::{
    Answer, CertificateRequest, ConditionStatus, GatewayMessage, Header, IssuedCertificate,
    NodeCertificate, gateway_message,
};
use edgebeat_transports::enroll;
use edgebeat_transports::ingress::TransportKind;
use edgebeat_transports::signing::{AnswerSigner, CertificateVerifier};
use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prost::Message as _;
use rustls::pki_types::UnixTime;

pub mod answer_ca;
pub mod ca;
pub mod gate;
pub mod tokens;

use ca::SiteCa;

/// The signer name of the certificates the gateway signs itself:
/// `edgebeat.io/node-client`.
pub const DEFAULT_SIGNER_NAME: &str = "edgebeat.io/node-client";

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

/// Why the enrollment side could not start or do something.
#[derive(Debug, thiserror::Error)]
pub enum EnrollmentError {
    /// The site CA cannot be made, read or used.
    #[error("site CA: {0}")]
    Ca(String),
    /// The site CA's or the gateway's answer key's TLS material cannot be used.
    #[error("site CA: {0}")]
    CaTls(#[from] edgebeat_transports::tls::TlsError),
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
    /// `spec.signerName` of the CSRs ([`DEFAULT_SIGNER_NAME`]: the gateway signs).
    pub signer_name: String,
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
            approval: Approval::Auto,
            lifetime: Duration::from_secs(365 * 24 * 3600),
            grace: Duration::from_secs(30 * 24 * 3600),
            max_clock_skew: Duration::from_secs(30),
        }
    }
}

/// How a request was proved.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Proof {
    /// A bootstrap token, by id.
    Token(String),
    /// The node's certificate.
    Certificate,
}

impl Proof {
    fn as_str(&self) -> &'static str {
        match self {
            Self::Token(_) => "token",
            Self::Certificate => "certificate",
        }
    }
}

/// A request refused: the metric label and why, for the log and the answer.
#[derive(Debug)]
struct Refused {
    reason: &'static str,
    detail: String,
}

fn refuse(reason: &'static str, detail: impl Into<String>) -> Refused {
    Refused {
        reason,
        detail: detail.into(),
    }
}

/// What became of one request.
enum Outcome {
    Issued(Vec<Vec<u8>>),
    Pending(String),
    Refused(Refused),
    /// A replay, or something that names no request: no answer.
    Silent(&'static str),
}

/// The latest request accepted from each node (its boot ID, sequence number, and when),
/// and when entries older than the replay window were last dropped.
#[derive(Default)]
struct Seen {
    latest: HashMap<String, (Vec<u8>, u64, Timestamp)>,
    swept: Option<Timestamp>,
}

/// A request's signed bytes and signature, when it came as a SignedMessage.
type Signed = (Vec<u8>, Vec<u8>);

/// Labels of `edgebeat_gateway_certificate_requests_total`: `proof` and `outcome`.
type OutcomeLabels = [(&'static str, &'static str); 2];

/// Counters of requests by proof and outcome, and the CSRs waiting, for `/metrics` (see
/// [`EnrollmentCounters::register`]).
#[derive(Debug, Default)]
pub struct EnrollmentCounters {
    by_outcome: Family<OutcomeLabels, Counter>,
    /// Names of CSRs answered pending and not issued since.
    pending: Mutex<HashSet<String>>,
    pending_gauge: Gauge,
    /// Which refused requests are also logged (every one is counted).
    refusal_log: edgebeat_transports::log_limit::LogLimiter,
}

impl EnrollmentCounters {
    /// Counts one request proved by `proof` (`token`, `certificate`, `unknown`) that came
    /// to `outcome` (`issued`, `pending`, a refusal reason, `rate_limited`).
    pub fn count(&self, proof: &'static str, outcome: &'static str) {
        self.by_outcome
            .get_or_create(&[("proof", proof), ("outcome", outcome)])
            .inc();
    }

    /// Requests counted for `proof` and `outcome`.
    pub fn get(&self, proof: &'static str, outcome: &'static str) -> u64 {
        self.by_outcome
            .get_or_create(&[("proof", proof), ("outcome", outcome)])
            .get()
    }

    /// CSRs this replica answered pending that it has not seen issued since.
    pub fn pending(&self) -> usize {
        self.pending.lock().len()
    }

    /// Registers `edgebeat_gateway_certificate_requests_total{proof, outcome}` and
    /// `edgebeat_gateway_certificate_signing_requests_pending` in `registry`.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "edgebeat_gateway_certificate_requests",
            "Node certificate requests (enrollments proved by a bootstrap token, rotations proved by a certificate) by outcome: issued, pending, rate_limited or the reason refused",
            self.by_outcome.clone(),
        );
        registry.register(
            "edgebeat_gateway_certificate_signing_requests_pending",
            "CertificateSigningRequests this replica answered pending (waiting for kubectl certificate approve or their signer) and has not seen issued since",
            self.pending_gauge.clone(),
        );
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
    verifier: CertificateVerifier,
    answers: Arc<AnswerSigner>,
    /// The answer CAs (DER) certificate answers name (`IssuedCertificate.answer_cas`).
    answer_cas: Vec<Vec<u8>>,
    identity: ca::GatewayIdentity,
    clock: Arc<dyn Clock>,
    /// Latest `(boot ID, seq)` accepted per node, and when: replays are refused for
    /// twice the clock window, after which the window refuses them.
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
        let now = clock_seconds(clock.as_ref());
        let ca = SiteCa::load_or_create(client.clone(), &options.namespace, now).await?;
        let identity = ca.gateway_identity(now)?;
        let answers = Arc::new(
            AnswerSigner::from_pem(
                identity.cert_pem.as_bytes(),
                identity.key_pem.as_bytes(),
                ca.cert_pem.as_bytes(),
            )
            .map_err(EnrollmentError::CaTls)?,
        );
        let ca_der = ca.cert_der.clone();
        let answer_cas = ca.answer_cas();
        let verifier = CertificateVerifier::from_pem(ca.cert_pem.as_bytes())
            .map_err(EnrollmentError::CaTls)?;
        Ok(Self {
            client,
            options,
            ca: Some(ca),
            ca_der,
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
    /// fleet moves to enrollment) and the site CA.
    pub fn node_ca_pem(&self, extra: Option<Vec<u8>>) -> Vec<u8> {
        let mut bundle = extra.unwrap_or_default();
        bundle.extend_from_slice(self.ca_pem().as_bytes());
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
                self.counters.count("unknown", "malformed");
                tracing::debug!(%why, transport = transport.as_str(), "certificate request refused");
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
            Outcome::Silent(why) => {
                self.counters.count(proof_label, why);
                tracing::debug!(node = %header.node_name, why, "certificate request not answered");
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
            Outcome::Refused(refused) => {
                self.counters.count(proof_label, refused.reason);
                if let edgebeat_transports::log_limit::LogLine::Write { suppressed, others } =
                    self.counters.refusal_log.check(
                        refused.reason,
                        &header.node_name,
                        tokio::time::Instant::now(),
                    )
                {
                    tracing::warn!(node = %header.node_name, reason = refused.reason, detail = %refused.detail, transport = transport.as_str(), suppressed, other_sources = others, "certificate request refused");
                }
                ack(
                    &header,
                    Answer::Rejected {
                        reason: refused.detail,
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
            return Outcome::Silent("foreign");
        }
        let now = self.clock.now();
        let now_ms = i64::try_from(
            now.duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis(),
        )
        .unwrap_or(i64::MAX);
        let skew = i64::try_from(self.options.max_clock_skew.as_millis()).unwrap_or(i64::MAX);
        if (header.wall_time_ms - now_ms).abs() > skew {
            return Outcome::Silent("clock_skew");
        }
        if !self.first_time(header) {
            return Outcome::Silent("replayed");
        }
        let proof = match &signed {
            Some((signed_bytes, signature)) => {
                match self
                    .prove_by_certificate(request, node, signed_bytes, signature, now)
                    .await
                {
                    Ok(()) => Proof::Certificate,
                    Err(refused) => return Outcome::Refused(refused),
                }
            }
            None => match self.prove_by_token(request, header).await {
                Ok(id) => Proof::Token(id),
                Err(Err(pending)) => return Outcome::Pending(pending),
                Err(Ok(refused)) => return Outcome::Refused(refused),
            },
        };
        let public_key = match check_csr(&request.csr, node) {
            Ok(key) => key,
            Err(refused) => return Outcome::Refused(refused),
        };
        match self
            .through_kubernetes(transport, node, &request.csr, public_key, &proof)
            .await
        {
            Ok(Some(chain)) => Outcome::Issued(chain),
            Ok(None) => Outcome::Pending(format!(
                "pending: the CertificateSigningRequest {} waits for approval (kubectl certificate approve) or its signer",
                csr_name(&request.csr, node)
            )),
            Err(Ok(refused)) => Outcome::Refused(refused),
            Err(Err(pending)) => Outcome::Pending(pending),
        }
    }

    /// Records `header`'s boot and sequence for its node; false when not above the last
    /// one of the same boot (a replay).
    fn first_time(&self, header: &Header) -> bool {
        let now = self.now();
        let window = jiff::SignedDuration::try_from(self.options.max_clock_skew * 2)
            .unwrap_or(jiff::SignedDuration::MAX);
        let mut seen = self.seen.lock();
        // Entries past the window are dropped once a window, not scanned per request:
        // the map holds at most two windows' worth of nodes.
        if seen.swept.is_none_or(|t| now.duration_since(t) >= window) {
            seen.latest
                .retain(|_, (_, _, at)| now.duration_since(*at) < window);
            seen.swept = Some(now);
        }
        match seen.latest.get(&header.node_name) {
            Some((boot, seq, at))
                if *boot == header.boot_id
                    && header.seq <= *seq
                    && now.duration_since(*at) < window =>
            {
                false
            }
            _ => {
                seen.latest.insert(
                    header.node_name.clone(),
                    (header.boot_id.clone(), header.seq, now),
                );
                true
            }
        }
    }

    /// This replica's clock, as a timestamp.
    fn now(&self) -> Timestamp {
        Timestamp::from_second(clock_seconds(self.clock.as_ref())).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// The token proof: the token's id when it holds. `Err(Ok(_))` refuses,
    /// `Err(Err(_))` says to ask again (the apiserver unreachable).
    async fn prove_by_token(
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

    /// Whether CSR `name` exists (a token's use already counted, when a request is asked
    /// again). An apiserver error counts as "no": the request is then refused as over its
    /// limit, and asked again later.
    async fn csr_exists(&self, name: &str) -> bool {
        let csrs: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        matches!(csrs.get_metadata_opt(name).await, Ok(Some(_)))
    }

    /// Counts a CSR just created with token `id`, and adds the uses not yet recorded to
    /// the token's Secret ([`tokens::record_uses`]): one writer at a time per replica, each
    /// write carrying every use made meanwhile, so a storm of enrollments with one token
    /// costs a few Secret writes a second rather than one (and its conflicts) per
    /// enrollment. With several replicas a token can overshoot its limit by the uses the
    /// others have not yet written (the requests in flight there).
    async fn token_used(&self, id: &str) {
        *self
            .unrecorded_uses
            .lock()
            .entry(id.to_owned())
            .or_default() += 1;
        self.flush_uses(id).await;
    }

    /// Writes token `id`'s unrecorded uses to its Secret, until none are left (see
    /// [`Enrollment::token_used`]); a failure is logged and left for the next use.
    async fn flush_uses(&self, id: &str) {
        let _recording = self.recording_uses.lock().await;
        loop {
            let pending = self.unrecorded_uses.lock().get(id).copied().unwrap_or(0);
            if pending == 0 {
                return;
            }
            match tokens::record_uses(self.client.clone(), &self.options.namespace, id, pending)
                .await
            {
                Ok(_) => {
                    let mut unrecorded = self.unrecorded_uses.lock();
                    if let Some(n) = unrecorded.get_mut(id) {
                        *n = n.saturating_sub(pending);
                        if *n == 0 {
                            unrecorded.remove(id);
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(token = id, %error, "the token's uses could not be recorded; trying again with its next use");
                    return;
                }
            }
        }
    }

    /// The certificate proof: the request signed with the key of a site-CA certificate of
    /// `node` that is valid, or expired less than `grace` ago for a Node that still exists.
    async fn prove_by_certificate(
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

    /// The CertificateSigningRequest's life: create (or find), approve, sign (or wait).
    /// `Ok(Some(chain))` once issued, `Ok(None)` while waiting for approval or the signer;
    /// `Err(Ok(_))` refuses (denied, failed), `Err(Err(_))` asks again (the apiserver).
    async fn through_kubernetes(
        &self,
        transport: TransportKind,
        node: &str,
        csr_der: &[u8],
        public_key: rcgen::PublicKey,
        proof: &Proof,
    ) -> Result<Option<Vec<Vec<u8>>>, Result<Refused, String>> {
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        let name = csr_name(csr_der, node);
        let apiserver = |what: &str, e: kube::Error| Err(format!("{what} {name}: {e}"));
        // Created first (a new request is the common case: one call), read when it exists
        // (a retry while pending, or after a lost answer).
        let wanted = self.new_csr(&name, transport, node, csr_der, proof);
        let mut csr = match api.create(&PostParams::default(), &wanted).await {
            Ok(created) => {
                if let Proof::Token(id) = proof {
                    self.token_used(id).await;
                }
                created
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                api.get(&name).await.map_err(|e| apiserver("reading", e))?
            }
            Err(e) => return Err(apiserver("creating", e)),
        };
        let conditions = |csr: &CertificateSigningRequest, type_: &str| {
            csr.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == type_ && ConditionStatus::from_api(&c.status).is_true())
                })
        };
        if conditions(&csr, "Denied") || conditions(&csr, "Failed") {
            return Err(Ok(refuse(
                "denied",
                format!("the CertificateSigningRequest {name} was denied or failed"),
            )));
        }
        if !conditions(&csr, "Approved") {
            let approve = self.options.approval == Approval::Auto || *proof == Proof::Certificate;
            if !approve {
                self.pending(&name, true);
                return Ok(None);
            }
            csr = self
                .approve(&api, csr, proof)
                .await
                .map_err(|e| apiserver("approving", e))?;
        }
        let issued = csr
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .filter(|c| !c.0.is_empty())
            .cloned();
        let pem = match (issued, &self.ca) {
            (Some(pem), _) => pem.0,
            (None, Some(ca)) if self.options.signer_name == DEFAULT_SIGNER_NAME => {
                let now = clock_seconds(self.clock.as_ref());
                // The signer's own lifetime, shorter when the CSR asks for less (which the
                // API lets a CSR ask down to its 600 s minimum).
                let lifetime = csr
                    .spec
                    .expiration_seconds
                    .and_then(|s| u64::try_from(s).ok())
                    .map_or(self.options.lifetime, Duration::from_secs)
                    .min(self.options.lifetime);
                let pem = ca
                    .sign_node(node, public_key, now, lifetime)
                    .map_err(|e| Ok(refuse("signing", e.to_string())))?;
                csr.status.get_or_insert_default().certificate =
                    Some(ByteString(pem.clone().into_bytes()));
                api.replace_status(&name, &PostParams::default(), &csr)
                    .await
                    .map_err(|e| apiserver("signing", e))?;
                pem.into_bytes()
            }
            (None, _) => {
                self.pending(&name, true);
                return Ok(None);
            }
        };
        self.pending(&name, false);
        let mut chain: Vec<Vec<u8>> = edgebeat_transports::tls::parse_certificates(&pem)
            .map_err(|e| Ok(refuse("signing", format!("status.certificate: {e}"))))?
            .into_iter()
            .map(|c| c.to_vec())
            .collect();
        if chain.last() != Some(&self.ca_der) {
            chain.push(self.ca_der.clone());
        }
        Ok(Some(chain))
    }

    fn pending(&self, name: &str, pending: bool) {
        let mut set = self.counters.pending.lock();
        if pending {
            set.insert(name.to_owned());
        } else {
            set.remove(name);
        }
        self.counters
            .pending_gauge
            .set(i64::try_from(set.len()).unwrap_or(i64::MAX));
    }

    fn new_csr(
        &self,
        name: &str,
        transport: TransportKind,
        node: &str,
        csr_der: &[u8],
        proof: &Proof,
    ) -> CertificateSigningRequest {
        let mut labels = std::collections::BTreeMap::new();
        if let Proof::Token(id) = proof {
            labels.insert(TOKEN_LABEL.to_owned(), id.clone());
        }
        let annotations = [
            (NODE_ANNOTATION, node),
            (TRANSPORT_ANNOTATION, transport.as_str()),
            (PROOF_ANNOTATION, proof.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        CertificateSigningRequest {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(enroll::pem("CERTIFICATE REQUEST", csr_der).into_bytes()),
                signer_name: self.options.signer_name.clone(),
                // The API refuses less than 600 s (`certificates.k8s.io/v1` validation); a
                // shorter --certificate-lifetime (tests, demos) is the signer's to apply.
                expiration_seconds: i32::try_from(
                    self.options.lifetime.as_secs().max(MIN_EXPIRATION_SECONDS),
                )
                .ok(),
                usages: Some(vec!["digital signature".into(), "client auth".into()]),
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        }
    }

    async fn approve(
        &self,
        api: &Api<CertificateSigningRequest>,
        mut csr: CertificateSigningRequest,
        proof: &Proof,
    ) -> Result<CertificateSigningRequest, kube::Error> {
        let message = match proof {
            Proof::Token(id) => format!("Approved by edgebeat-gateway: bootstrap token {id}"),
            Proof::Certificate => {
                "Approved by edgebeat-gateway: a rotation proved by the node's certificate".into()
            }
        };
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(self.now());
        let status = csr
            .status
            .get_or_insert_with(CertificateSigningRequestStatus::default);
        status
            .conditions
            .get_or_insert_default()
            .push(CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: ConditionStatus::True.as_str().into(),
                reason: Some("EdgebeatAutoApproved".into()),
                message: Some(message),
                last_update_time: Some(now.clone()),
                last_transition_time: Some(now),
            });
        let name = csr.metadata.name.clone().unwrap_or_default();
        api.replace_subresource("approval", &name, &PostParams::default(), &csr)
            .await
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

/// The deterministic name of the CertificateSigningRequest of `csr_der` for `node`:
/// `edgebeat-` and 32 hex digits of SHA-256 over the node name and the request's public
/// key, so a retried request (same key) finds its own CSR and a rotation (new key) makes a
/// new one.
pub fn csr_name(csr_der: &[u8], node: &str) -> String {
    use x509_parser::prelude::FromDer as _;
    let key = x509_parser::certification_request::X509CertificationRequest::from_der(csr_der)
        .map(|(_, csr)| csr.certification_request_info.subject_pki.raw.to_vec())
        .unwrap_or_else(|_| csr_der.to_vec());
    let mut input = node.as_bytes().to_vec();
    input.push(0);
    input.extend_from_slice(&key);
    let digest = ring::digest::digest(&ring::digest::SHA256, &input);
    format!("edgebeat-{}", &enroll::hex(digest.as_ref())[..32])
}

/// Checks a PKCS#10 request for `node` (see the module docs, step 2) and returns its
/// public key.
fn check_csr(csr_der: &[u8], node: &str) -> Result<rcgen::PublicKey, Refused> {
    use x509_parser::prelude::FromDer as _;
    let (_, parsed) =
        x509_parser::certification_request::X509CertificationRequest::from_der(csr_der)
            .map_err(|e| refuse("csr", format!("the CSR does not parse: {e}")))?;
    let subject: Vec<(String, String)> = parsed
        .certification_request_info
        .subject
        .iter_attributes()
        .map(|a| {
            (
                a.attr_type().to_id_string(),
                a.as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let wanted = [
        (
            "2.5.4.10".to_owned(),
            edgebeat_transports::tls::NODES_GROUP.to_owned(),
        ),
        (
            "2.5.4.3".to_owned(),
            format!("{}{node}", edgebeat_transports::tls::NODE_USER_PREFIX),
        ),
    ];
    let mut sorted = subject.clone();
    sorted.sort();
    let mut expected = wanted.to_vec();
    expected.sort();
    if sorted != expected {
        return Err(refuse(
            "csr_subject",
            format!(
                "the CSR's subject must be exactly O=system:nodes, CN=system:node:{node}, not {subject:?}"
            ),
        ));
    }
    let request = rcgen::CertificateSigningRequestParams::from_der(&csr_der.to_vec().into())
        .map_err(|e| refuse("csr", format!("the CSR does not verify: {e}")))?;
    if !request.params.subject_alt_names.is_empty() {
        return Err(refuse(
            "csr_names",
            "the CSR asks for subject alternative names",
        ));
    }
    let usages_ok = request
        .params
        .key_usages
        .iter()
        .all(|u| *u == rcgen::KeyUsagePurpose::DigitalSignature)
        && request
            .params
            .extended_key_usages
            .iter()
            .all(|u| *u == rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    if !usages_ok || request.params.is_ca != rcgen::IsCa::NoCa {
        return Err(refuse(
            "csr_usages",
            "the CSR asks for usages beyond digital signature and client auth",
        ));
    }
    let alg = request.public_key.algorithm();
    if alg != &rcgen::PKCS_ECDSA_P256_SHA256 && alg != &rcgen::PKCS_ED25519 {
        return Err(refuse(
            "csr_key",
            "the CSR's key is neither ECDSA P-256 nor Ed25519",
        ));
    }
    Ok(request.public_key)
}

/// `clock`'s now, Unix seconds.
fn clock_seconds(clock: &dyn Clock) -> i64 {
    i64::try_from(
        clock
            .now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs(),
    )
    .unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
