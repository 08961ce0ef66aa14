//! Node certificates without hands, the agent's half: enrollment with a bootstrap token,
//! rotation before expiry, and the live swap of the transport's identity.
//!
//! kubelet's TLS bootstrap and `rotateCertificates` (`pkg/kubelet/certificate/bootstrap/
//! bootstrap.go`, client-go `util/certificate/certificate_manager.go`), over edgebeat's
//! transports (wire shapes: `edgebeat_transports::enroll`):
//!
//! 1. **At start** the certificate in `certDir` ([`CURRENT_FILE`], else [`PREVIOUS_FILE`])
//!    is the node's identity. Without one, the agent makes a P-256 key (kept in
//!    [`PENDING_KEY_FILE`] until its certificate comes, so a restart during a manual
//!    approval asks for the same CSR), reads the token of `bootstrapTokenFile` and sends a
//!    certificate request proved by it: to `transport.enrollmentEndpoint` over gRPC, through
//!    the broker over MQTT. The answer must verify against the site CA the token pins
//!    (kubeadm's `discovery-token-ca-cert-hash`). Pending (manual approval) or unanswered:
//!    it asks again after 2 s doubling to 60 s, with jitter; the token file is read again
//!    each time, so a used-up token can be replaced in place.
//! 2. **Rotation** (`rotateCertificates`, on by default): at a uniformly random 70–90 % of
//!    the certificate's lifetime (`certificate_manager.go: nextRotationDeadline`), or at
//!    once when the gateway says it is due (`Ack.certificate_due`, for boards whose clock
//!    cannot be trusted), the agent makes a new key and sends a request signed by its
//!    current key and certificate; the answer must verify against the site CA. A rotation
//!    the gateway refuses (the certificate expired longer than its grace ago, the Node
//!    deleted) falls back to the bootstrap token, if one is still there.
//! 3. **Writing**: certificate and key as one PEM file, written to a temporary file,
//!    `fsync`ed, renamed over [`CURRENT_FILE`], the directory `fsync`ed; the one it replaces
//!    becomes [`PREVIOUS_FILE`], kept until the new one has carried an accepted `Register`.
//!    A power cut leaves either pair whole, never a certificate without its key.
//! 4. **Swap**: the transport is stopped and started again with the new identity on the
//!    same uplink: the loops' requests wait in it meanwhile, so the Lease goes on (gRPC makes
//!    a new connection with the new certificate; MQTT republishes the retained certificate
//!    and signs with the new key).
//!
//! The server is verified against `transport.caFile` when given, else against the site CA
//! the enrollment brought: the gateway's gRPC listener by the name of the certificate it
//! issues itself ([`edgebeat_transports::signing::ANSWER_SIGNER_NAME`]), a broker by its
//! host name.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use edgebeat_hw::Clock;
use edgebeat_proto::Header;
use edgebeat_transports::enroll::{self, AnswerTrust, Answered, BootstrapToken, NodeKeyPair};
use edgebeat_transports::signing::MessageSigner;
use edgebeat_transports::tls::{self, ClientTls, TlsIdentity};
use edgebeat_transports::uplink::{RegisterFn, Uplink, UplinkDriver};
use rustls_pki_types::UnixTime;
use tokio_util::sync::CancellationToken;

use crate::config::{ManagedCertificates, TransportConfig};
use crate::error::AgentError;
use crate::header::HeaderFactory;
use crate::metrics::{AgentMetrics, CertificateRequestKind};

/// The node's certificate and its key, one PEM file in `certDir` (kubelet keeps
/// `kubelet-client-current.pem` the same way).
pub const CURRENT_FILE: &str = "edgebeat-client-current.pem";
/// The pair [`CURRENT_FILE`] replaced, kept until the new one has carried an accepted
/// message.
pub const PREVIOUS_FILE: &str = "edgebeat-client-previous.pem";
/// A key whose certificate has not come yet (PKCS#8 PEM).
pub const PENDING_KEY_FILE: &str = "edgebeat-client-pending.key";
/// The site CA (PEM) the enrollment brought.
pub const CA_FILE: &str = "ca.crt";
/// The answer CAs (PEM bundle) the last certificate answer named: the only issuers of the
/// gateway's answer keys the agent trusts (absent while the gateway names none).
pub const ANSWER_CAS_FILE: &str = "answer-ca.crt";

/// Rotation happens at a uniformly random point in this fraction of the certificate's
/// lifetime (client-go `certificate_manager.go: nextRotationDeadline`: 70–90 %).
pub const ROTATION_WINDOW: (f64, f64) = (0.7, 0.9);
/// First delay before asking again after a pending or unanswered request: 2 s, doubling
/// with jitter up to [`REQUEST_RETRY_MAX`].
pub const REQUEST_RETRY_MIN: Duration = Duration::from_secs(2);
/// Longest delay between two certificate requests: 60 s (a fleet waiting for a manual
/// approval asks about once a minute per board).
pub const REQUEST_RETRY_MAX: Duration = Duration::from_secs(60);
/// Time allowed for one request's answer (the gateway creates, approves and signs a CSR
/// meanwhile): 30 s.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest bootstrap token file, bytes (1 KiB; a token is 88 characters).
const MAX_TOKEN_FILE_BYTES: u64 = 1024;

/// Why a managed certificate could not be read, asked for or taken.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// A certificate or key that does not parse or cannot be used (a file in `certDir`, an
    /// issued chain).
    #[error("unusable certificate: {0}")]
    Unusable(String),
    /// TLS material that does not parse or cannot be used (a file in `certDir`, an issued
    /// chain, the site CA).
    #[error("unusable certificate: {0}")]
    Tls(#[from] tls::TlsError),
    /// `bootstrapTokenFile` cannot be read or holds no token.
    #[error("bootstrapTokenFile {}: {reason}", file.display())]
    Token {
        /// The file.
        file: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The node key cannot be made, stored or used for a request.
    #[error("node key: {0}")]
    Key(String),
    /// No answer came: the gateway or broker unreachable, the request over the gateway's
    /// limits, a timeout.
    #[error("no answer: {0}")]
    Unanswered(String),
    /// An answer came but was not taken (see [`enroll::ReadAnswerError`]).
    #[error(transparent)]
    Answer(#[from] enroll::ReadAnswerError),
}

/// A node identity from the enrollment: the node certificate, its key, and the site CA.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    /// The node certificate, PEM (CN=`system:node:<node>`, O=`system:nodes`).
    pub cert_pem: String,
    /// Its private key, PKCS#8 PEM.
    key_pem: String,
    /// The site CA, PEM.
    pub ca_pem: String,
    /// The answer CAs (DER) the gateway named with this certificate: the agent takes the
    /// gateway's answers (and, over gRPC without `transport.caFile`, its server
    /// certificate) only from keys they issued. Empty: from the site CA.
    pub answer_cas: Vec<Vec<u8>>,
    /// notBefore, Unix seconds.
    pub not_before: i64,
    /// notAfter, Unix seconds.
    pub not_after: i64,
}

impl std::fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeIdentity")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl NodeIdentity {
    /// The identity of a certificate file's PEM (the certificate first, then the key) and
    /// the site CA's PEM.
    ///
    /// Errors: [`CertificateError::Tls`] when either does not parse,
    /// [`CertificateError::Unusable`] when the key is not PKCS#8 or the certificate's
    /// validity cannot be read.
    pub fn from_pem(pair_pem: &str, ca_pem: &str) -> Result<Self, CertificateError> {
        let unusable = |why: &str| CertificateError::Unusable(why.to_owned());
        let certs = tls::parse_certificates(pair_pem.as_bytes()).map_err(CertificateError::Tls)?;
        let leaf = certs.first().ok_or_else(|| unusable("no certificate"))?;
        let key =
            match tls::parse_private_key(pair_pem.as_bytes()).map_err(CertificateError::Tls)? {
                rustls_pki_types::PrivateKeyDer::Pkcs8(key) => key,
                _ => return Err(unusable("the key is not PKCS#8")),
            };
        tls::parse_certificates(ca_pem.as_bytes())
            .map_err(CertificateError::Tls)?
            .first()
            .ok_or_else(|| unusable("no site CA"))?;
        let (not_before, not_after) = enroll::certificate_validity(leaf)
            .ok_or_else(|| unusable("unreadable certificate validity"))?;
        Ok(Self {
            cert_pem: enroll::pem("CERTIFICATE", leaf),
            key_pem: enroll::pem("PRIVATE KEY", key.secret_pkcs8_der()),
            ca_pem: ca_pem.to_owned(),
            answer_cas: Vec::new(),
            not_before,
            not_after,
        })
    }

    /// The same identity, trusting answers from `answer_cas` (DER) alone.
    #[must_use]
    pub fn with_answer_cas(mut self, answer_cas: Vec<Vec<u8>>) -> Self {
        self.answer_cas = answer_cas;
        self
    }

    /// The answer CAs as one PEM bundle.
    fn answer_cas_pem(&self) -> String {
        self.answer_cas
            .iter()
            .map(|der| enroll::pem("CERTIFICATE", der))
            .collect()
    }

    /// The identity the gateway issued for `key`: the chain's first certificate, the site
    /// CA `ca` (DER), the answer CAs `answer_cas` (DER) it named.
    ///
    /// Errors: as [`NodeIdentity::from_pem`].
    fn issued(
        chain: &[Vec<u8>],
        ca: &[u8],
        answer_cas: Vec<Vec<u8>>,
        key: &NodeKeyPair,
    ) -> Result<Self, CertificateError> {
        let leaf = chain
            .first()
            .ok_or_else(|| CertificateError::Unusable("an empty chain".into()))?;
        let pair = format!("{}{}", enroll::pem("CERTIFICATE", leaf), key.to_pem());
        Ok(Self::from_pem(&pair, &enroll::pem("CERTIFICATE", ca))?.with_answer_cas(answer_cas))
    }

    /// The certificate file's content: the certificate, then the key.
    fn pair_pem(&self) -> String {
        format!("{}{}", self.cert_pem, self.key_pem)
    }

    /// When to rotate: `fraction` of the way from notBefore to notAfter, Unix seconds.
    pub fn rotation_deadline(&self, fraction: f64) -> i64 {
        let life = (self.not_after - self.not_before).max(0);
        #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
        let offset = (life as f64 * fraction) as i64;
        self.not_before + offset
    }

    /// The TLS client identity: this certificate and key.
    fn tls_identity(&self) -> TlsIdentity {
        TlsIdentity {
            cert_pem: self.cert_pem.clone().into_bytes(),
            key_pem: self.key_pem.clone().into_bytes(),
        }
    }

    /// Signs certificate requests proved by this identity.
    fn signer(&self) -> Result<MessageSigner, CertificateError> {
        MessageSigner::from_pem(self.cert_pem.as_bytes(), self.key_pem.as_bytes())
            .map_err(|e| CertificateError::Key(e.to_string()))
    }
}

/// The files of `certDir` (see the module docs).
#[derive(Debug, Clone)]
pub struct CertStore {
    dir: PathBuf,
}

impl CertStore {
    /// The store in `dir`, made (mode 0700) if missing.
    ///
    /// Errors: the I/O error making it.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    /// The identity in [`CURRENT_FILE`], else in [`PREVIOUS_FILE`] (a file that does not
    /// parse is logged and passed over), with the answer CAs of [`ANSWER_CAS_FILE`]; `None`
    /// when neither holds one.
    pub fn load(&self) -> Option<NodeIdentity> {
        let ca = self.read(CA_FILE)?;
        let answer_cas = self.read(ANSWER_CAS_FILE).map_or_else(Vec::new, |pem| {
            tls::parse_certificates(pem.as_bytes())
                .map(|certs| certs.iter().map(|c| c.to_vec()).collect())
                .unwrap_or_else(|error| {
                    tracing::warn!(file = %self.dir.join(ANSWER_CAS_FILE).display(), %error, "unusable answer CAs; trusting answers from the site CA until the next certificate");
                    Vec::new()
                })
        });
        [CURRENT_FILE, PREVIOUS_FILE].into_iter().find_map(|name| {
            let pair = self.read(name)?;
            NodeIdentity::from_pem(&pair, &ca)
                .inspect_err(|error| {
                    tracing::warn!(file = %self.dir.join(name).display(), %error, "unusable node certificate; passed over");
                })
                .ok()
                .map(|identity| identity.with_answer_cas(answer_cas.clone()))
        })
    }

    /// Stores `identity` as [`CURRENT_FILE`] (and its CA), the one it replaces as
    /// [`PREVIOUS_FILE`], and forgets the pending key.
    ///
    /// Errors: the I/O error; the files are then as before, or with the new pair whole.
    pub fn save(&self, identity: &NodeIdentity) -> std::io::Result<()> {
        write_atomically(&self.dir, CA_FILE, identity.ca_pem.as_bytes(), 0o644)?;
        if identity.answer_cas.is_empty() {
            remove_if_present(&self.dir.join(ANSWER_CAS_FILE))?;
        } else {
            write_atomically(
                &self.dir,
                ANSWER_CAS_FILE,
                identity.answer_cas_pem().as_bytes(),
                0o644,
            )?;
        }
        let current = self.dir.join(CURRENT_FILE);
        if current.exists() {
            std::fs::rename(&current, self.dir.join(PREVIOUS_FILE))?;
        }
        write_atomically(
            &self.dir,
            CURRENT_FILE,
            identity.pair_pem().as_bytes(),
            0o600,
        )?;
        remove_if_present(&self.dir.join(PENDING_KEY_FILE))
    }

    /// Deletes [`PREVIOUS_FILE`], once the current pair has carried an accepted message.
    ///
    /// Errors: the I/O error (other than the file being gone already).
    pub fn forget_previous(&self) -> std::io::Result<()> {
        remove_if_present(&self.dir.join(PREVIOUS_FILE))
    }

    /// The key waiting for its certificate, or a new one (stored first, so that a restart
    /// asks for the same certificate signing request).
    ///
    /// Errors: the key cannot be made or stored.
    fn pending_key(&self) -> Result<NodeKeyPair, CertificateError> {
        if let Some(pem) = self.read(PENDING_KEY_FILE) {
            match tls::parse_private_key(pem.as_bytes()) {
                Ok(rustls_pki_types::PrivateKeyDer::Pkcs8(der)) => {
                    match NodeKeyPair::from_pkcs8(der.secret_pkcs8_der()) {
                        Ok(key) => return Ok(key),
                        Err(error) => {
                            tracing::warn!(%error, "unusable pending key; making another")
                        }
                    }
                }
                _ => tracing::warn!("unusable pending key; making another"),
            }
        }
        let key = NodeKeyPair::generate().map_err(|e| CertificateError::Key(e.to_string()))?;
        write_atomically(&self.dir, PENDING_KEY_FILE, key.to_pem().as_bytes(), 0o600)
            .map_err(|e| CertificateError::Key(format!("storing the pending key: {e}")))?;
        Ok(key)
    }

    /// A file of the store as text; `None` when absent or unreadable (logged).
    fn read(&self, name: &str) -> Option<String> {
        let path = self.dir.join(name);
        match edgebeat_hw::read_bounded(&path, edgebeat_hw::MAX_PEM_FILE_BYTES) {
            Ok(bytes) => String::from_utf8(bytes).ok(),
            Err(edgebeat_hw::BoundedReadError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            Err(error) => {
                tracing::warn!(file = %path.display(), %error, "unreadable");
                None
            }
        }
    }
}

/// Writes `bytes` as `dir/name` so that a crash leaves the old file or the new one, whole:
/// a temporary file in `dir` (mode `mode`), `fsync`, rename over `name`, `fsync` of `dir`.
///
/// Errors: the I/O error of any step (the temporary file is removed).
pub fn write_atomically(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let temporary = dir.join(format!(".{name}.tmp"));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, dir.join(name))?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Reads the bootstrap token of `file` (surrounding whitespace ignored).
///
/// Errors: [`CertificateError::Token`] naming the file.
pub fn read_token(file: &Path) -> Result<BootstrapToken, CertificateError> {
    let token = |reason: String| CertificateError::Token {
        file: file.to_owned(),
        reason,
    };
    let bytes =
        edgebeat_hw::read_bounded(file, MAX_TOKEN_FILE_BYTES).map_err(|e| token(e.to_string()))?;
    String::from_utf8_lossy(&bytes)
        .trim()
        .parse::<BootstrapToken>()
        .map_err(|e| token(e.to_string()))
}

/// One agent's certificate manager: how it asks and whom it trusts.
pub struct Manager<'a> {
    /// The settings.
    pub managed: &'a ManagedCertificates,
    /// The transport as configured (`caFile`'s CA, no client identity).
    pub transport: &'a TransportConfig,
    /// Headers of the requests (the agent's own: node, boot, sequence).
    pub headers: &'a HeaderFactory,
    /// Wall time for validity and the rotation deadline.
    pub clock: &'a dyn Clock,
    /// Counts requests and holds the certificate's expiry.
    pub metrics: &'a AgentMetrics,
    /// The store in `certDir`.
    pub store: CertStore,
}

/// What one request came to.
enum Attempt {
    Issued(NodeIdentity),
    Pending(String),
    Refused(String),
}

impl Manager<'_> {
    fn now(&self) -> i64 {
        self.clock
            .now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    }

    /// The CA of `transport.caFile`, when given.
    fn ca_file(&self) -> Option<&[u8]> {
        self.transport.tls().map(|t| t.ca_pem.as_slice())
    }

    /// The transport with `identity` as its TLS client identity, verifying the server
    /// against `caFile` or else the site CA (see the module docs).
    ///
    /// Errors: [`AgentError::Certificates`] when the transport cannot use it.
    pub fn configure(&self, identity: &NodeIdentity) -> Result<TransportConfig, AgentError> {
        let mut transport = self.transport.clone();
        #[cfg(feature = "grpc")]
        let gateway_ca = match (&self.transport, identity.answer_cas.is_empty()) {
            // The gateway's own gRPC certificate comes from an answer CA, like its answers.
            (TransportConfig::Grpc(_), false) => identity.answer_cas_pem(),
            _ => identity.ca_pem.clone(),
        };
        #[cfg(not(feature = "grpc"))]
        let gateway_ca = identity.ca_pem.clone();
        let server_ca = self
            .ca_file()
            .map_or_else(|| gateway_ca.into_bytes(), <[u8]>::to_vec);
        let tls = ClientTls {
            ca_pem: server_ca,
            client_identity: Some(identity.tls_identity()),
        };
        #[cfg(feature = "grpc")]
        let trusts_site_ca = self.ca_file().is_none();
        transport
            .set_tls(tls)
            .map_err(|e| AgentError::Certificates(e.to_string()))?;
        match &mut transport {
            #[cfg(feature = "grpc")]
            TransportConfig::Grpc(g) => {
                if trusts_site_ca {
                    g.tls_server_name =
                        Some(edgebeat_transports::signing::ANSWER_SIGNER_NAME.to_owned());
                }
            }
            #[cfg(feature = "mqtt")]
            TransportConfig::Mqtt(m) => {
                #[cfg(feature = "mqtt-tls")]
                if identity.answer_cas.is_empty() {
                    m.set_gateway_ca(identity.ca_pem.as_bytes())
                } else {
                    m.set_answer_cas(&identity.answer_cas)
                }
                .map_err(|e| AgentError::Certificates(e.to_string()))?;
                let _ = m;
            }
        }
        Ok(transport)
    }

    /// Asks until a certificate is issued, proved by `current` while the gateway takes it
    /// and else by the bootstrap token (see the module docs); `None` when `cancel` fires.
    pub async fn obtain(
        &self,
        current: Option<&NodeIdentity>,
        cancel: &CancellationToken,
    ) -> Option<NodeIdentity> {
        let kind = if current.is_some() {
            CertificateRequestKind::Rotation
        } else {
            CertificateRequestKind::Enrollment
        };
        let mut by_certificate = current;
        let mut delays =
            edgebeat_transports::backoff::reconnect_backoff(REQUEST_RETRY_MIN, REQUEST_RETRY_MAX);
        loop {
            let attempt = match self.store.pending_key() {
                Ok(key) => match by_certificate {
                    Some(identity) => self.by_certificate(identity, &key).await,
                    None => self.by_token(&key).await,
                },
                Err(e) => Err(e),
            };
            match attempt {
                Ok(Attempt::Issued(identity)) => match self.store.save(&identity) {
                    Ok(()) => {
                        self.metrics.certificate_request(kind, "issued");
                        self.metrics.certificate_expires(identity.not_after);
                        tracing::info!(
                            node = self.headers.node_name(),
                            not_after = identity.not_after,
                            dir = %self.store.dir.display(),
                            "node certificate issued and stored"
                        );
                        return Some(identity);
                    }
                    Err(error) => {
                        self.metrics.certificate_request(kind, "failed");
                        tracing::error!(%error, dir = %self.store.dir.display(), "the issued certificate could not be stored; asking again");
                    }
                },
                Ok(Attempt::Pending(why)) => {
                    self.metrics.certificate_request(kind, "pending");
                    tracing::info!(node = self.headers.node_name(), %why, "certificate request pending; asking again later");
                }
                Ok(Attempt::Refused(why)) => {
                    self.metrics.certificate_request(kind, "refused");
                    if by_certificate.take().is_some() {
                        tracing::warn!(node = self.headers.node_name(), %why, "rotation refused; asking with the bootstrap token");
                        continue;
                    }
                    tracing::error!(node = self.headers.node_name(), %why, file = %self.managed.bootstrap_token_file.display(), "enrollment refused: the bootstrap token does not cover this node, is used up or expired; put a new one in the file");
                }
                Err(error) => {
                    self.metrics.certificate_request(kind, "failed");
                    tracing::warn!(node = self.headers.node_name(), %error, "certificate request failed; asking again later");
                }
            }
            let delay = delays.next().unwrap_or(REQUEST_RETRY_MAX);
            tokio::select! {
                () = cancel.cancelled() => return None,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// One request proved by the bootstrap token, its answer verified against the pin.
    async fn by_token(&self, key: &NodeKeyPair) -> Result<Attempt, CertificateError> {
        let token = read_token(&self.managed.bootstrap_token_file)?;
        let header = self.headers.next();
        let csr = key
            .certificate_request(self.headers.node_name())
            .map_err(|e| CertificateError::Key(e.to_string()))?;
        let payload = enroll::token_request(&token, header.clone(), csr);
        let trust = AnswerTrust::Pin(token.ca_pin);
        let answer = self.send(payload, &header, trust, None).await?;
        self.attempt(answer, key)
    }

    /// One request proved by `identity`, its answer verified against its site CA.
    async fn by_certificate(
        &self,
        identity: &NodeIdentity,
        key: &NodeKeyPair,
    ) -> Result<Attempt, CertificateError> {
        let header = self.headers.next();
        let csr = key
            .certificate_request(self.headers.node_name())
            .map_err(|e| CertificateError::Key(e.to_string()))?;
        let payload = enroll::certificate_request(&identity.signer()?, header.clone(), csr)
            .map_err(|e| CertificateError::Key(e.to_string()))?;
        let trust = if identity.answer_cas.is_empty() {
            AnswerTrust::Ca(identity.ca_pem.as_bytes())
        } else {
            AnswerTrust::AnswerCas(&identity.answer_cas)
        };
        let answer = self.send(payload, &header, trust, Some(identity)).await?;
        self.attempt(answer, key)
    }

    fn attempt(&self, answer: Answered, key: &NodeKeyPair) -> Result<Attempt, CertificateError> {
        Ok(match answer {
            Answered::Issued {
                chain,
                ca,
                answer_cas,
            } => Attempt::Issued(NodeIdentity::issued(&chain, &ca, answer_cas, key)?),
            Answered::Pending(why) => Attempt::Pending(why),
            Answered::Refused(why) => Attempt::Refused(why),
        })
    }

    /// Sends `payload` over the configured transport's enrollment path and reads the
    /// answer to `header` as `trust` says. `identity`: the site CA is known (rotation).
    async fn send(
        &self,
        payload: Vec<u8>,
        header: &Header,
        trust: AnswerTrust<'_>,
        identity: Option<&NodeIdentity>,
    ) -> Result<Answered, CertificateError> {
        #[cfg(not(feature = "mqtt"))]
        let _ = identity;
        let node = self.headers.node_name();
        let boot_tag = header.named_boot_tag();
        let seq = header.seq;
        let now = || {
            UnixTime::since_unix_epoch(
                self.clock
                    .now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default(),
            )
        };
        let read = |answer: &[u8]| {
            enroll::read_answer(answer, trust, node, boot_tag, seq, now()).inspect_err(|error| {
                if let enroll::ReadAnswerError::Unverified(refused) = error {
                    self.metrics.answers_refused().count(refused);
                }
            })
        };
        match self.transport {
            #[cfg(feature = "grpc")]
            TransportConfig::Grpc(_) => {
                let endpoint = self.managed.enrollment_endpoint.as_deref().ok_or_else(|| {
                    CertificateError::Unanswered("no transport.enrollmentEndpoint".into())
                })?;
                let tls = self.transport.tls();
                let answer = edgebeat_transports::grpc::enroll::request_certificate(
                    endpoint,
                    tls,
                    payload,
                    REQUEST_TIMEOUT,
                )
                .await
                .map_err(|e| CertificateError::Unanswered(e.to_string()))?;
                Ok(read(&answer)?)
            }
            #[cfg(feature = "mqtt")]
            TransportConfig::Mqtt(options) => {
                #[cfg(feature = "mqtt-tls")]
                {
                    let tls = match (self.ca_file(), identity) {
                        (Some(_), _) => None,
                        (None, Some(identity)) => Some(
                            ClientTls {
                                ca_pem: identity.ca_pem.clone().into_bytes(),
                                client_identity: None,
                            }
                            .rustls_config()
                            .map_err(CertificateError::Tls)?,
                        ),
                        (None, None) => match trust {
                            AnswerTrust::Pin(pin) => Some(
                                enroll::PinnedCaVerifier::client_config(pin)
                                    .map_err(CertificateError::Tls)?,
                            ),
                            AnswerTrust::Ca(_) | AnswerTrust::AnswerCas(_) => None,
                        },
                    };
                    let answer = edgebeat_transports::mqtt::enroll::request_certificate(
                        options,
                        node,
                        tls,
                        payload,
                        |answer| read(answer).is_ok(),
                        REQUEST_TIMEOUT,
                    )
                    .await
                    .map_err(|e| CertificateError::Unanswered(e.to_string()))?;
                    Ok(read(&answer)?)
                }
                #[cfg(not(feature = "mqtt-tls"))]
                {
                    let _ = (options, payload, identity, read);
                    Err(CertificateError::Unanswered(
                        "this build has no MQTT TLS".into(),
                    ))
                }
            }
        }
    }

    /// Waits until `identity` is due for rotation: its deadline at a random point of
    /// [`ROTATION_WINDOW`], or the gateway's word (`due` changed since it was last seen: a
    /// word that came before this call, with the first Register, counts). Wakes at most hourly to
    /// look at the wall clock again (a board's clock may jump at NTP sync). `false` when
    /// `cancel` fires first.
    pub async fn wait_due(
        &self,
        identity: &NodeIdentity,
        due: &mut tokio::sync::watch::Receiver<u64>,
        cancel: &CancellationToken,
    ) -> bool {
        let (low, high) = ROTATION_WINDOW;
        let deadline = identity.rotation_deadline(low + (high - low) * fastrand::f64());
        loop {
            let left = deadline - self.now();
            if left <= 0 {
                tracing::info!(
                    node = self.headers.node_name(),
                    not_after = identity.not_after,
                    "node certificate due for rotation"
                );
                return true;
            }
            let nap = Duration::from_secs(u64::try_from(left).unwrap_or(0).min(3600));
            tokio::select! {
                () = cancel.cancelled() => return false,
                () = tokio::time::sleep(nap) => {}
                changed = due.changed() => {
                    if changed.is_ok() {
                        tracing::info!(node = self.headers.node_name(), "the gateway says the node certificate is due; rotating");
                        return true;
                    }
                }
            }
        }
    }
}

/// Runs `transport` with a managed identity (see the module docs) until `cancel` fires:
/// obtains one first if `certDir` holds none, then runs the transport with it, rotating
/// and swapping it live when due.
///
/// Errors: [`AgentError::Certificates`] when `certDir` cannot be used; the transport's own
/// errors at start.
pub async fn run(
    manager: Manager<'_>,
    node: &str,
    register: RegisterFn,
    uplink: &Uplink,
    driver: &mut UplinkDriver,
    cancel: CancellationToken,
) -> Result<(), AgentError> {
    let mut identity = match manager.store.load() {
        Some(identity) => identity,
        None => {
            tracing::info!(node, dir = %manager.store.dir.display(), "no node certificate yet: enrolling with the bootstrap token");
            match manager.obtain(None, &cancel).await {
                Some(identity) => identity,
                None => return Ok(()),
            }
        }
    };
    let mut due = uplink.certificate_due();
    loop {
        manager.metrics.certificate_expires(identity.not_after);
        let transport = manager.configure(&identity)?;
        let instance = cancel.child_token();
        let running = transport.run(node, register.clone(), driver, instance.clone());
        tokio::pin!(running);
        let next = async {
            // The previous pair goes once the current one is accepted.
            if uplink.registered().wait_for(|r| *r).await.is_ok()
                && let Err(error) = manager.store.forget_previous()
            {
                tracing::warn!(%error, "the previous node certificate could not be deleted");
            }
            if !manager.managed.rotate_certificates {
                return std::future::pending().await;
            }
            if !manager.wait_due(&identity, &mut due, &cancel).await {
                return None;
            }
            manager.obtain(Some(&identity), &cancel).await
        };
        let next = tokio::select! {
            result = &mut running => return result,
            next = next => next,
        };
        instance.cancel();
        let stopped = running.await;
        match next {
            Some(new) if !cancel.is_cancelled() => {
                tracing::info!(
                    node,
                    not_after = new.not_after,
                    "node certificate rotated; reconnecting with it"
                );
                identity = new;
                // What the gateway said of the old certificate is not about the new one.
                due.mark_unchanged();
            }
            _ => return stopped,
        }
    }
}

#[cfg(test)]
mod tests;
