//! TLS for every transport: rustls on ring (never aws-lc), PEM material for both sides,
//! and the kubelet-style node identity carried by a client certificate.
//!
//! The settings types are always here; what uses rustls needs feature `grpc-tls` or
//! `mqtt-tls` (always on with the ingress features), and [`node_identity`] an ingress
//! feature.
//!
//! A node's identity is what the apiserver's node authorizer accepts
//! (`pkg/auth/nodeidentifier/default.go`): user `system:node:<nodeName>` **and** group
//! `system:nodes`, i.e. a client certificate whose subject has CN=`system:node:<name>` and
//! O=`system:nodes`. Without the group it is not a node.

use std::fmt;

#[cfg(feature = "tls")]
use rustls::pki_types::pem::PemObject as _;
#[cfg(feature = "tls")]
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Prefix of a node's user name (the certificate's CN): `system:node:<nodeName>`.
pub const NODE_USER_PREFIX: &str = "system:node:";

/// The group every node belongs to (the certificate's O).
pub const NODES_GROUP: &str = "system:nodes";

/// The user name of node `name`: `system:node:<name>` ([`NODE_USER_PREFIX`] and the name,
/// unchecked), as the apiserver's node authorizer reads it
/// (`pkg/auth/nodeidentifier/default.go`): a node certificate's CN, the user the gateway
/// impersonates. [`node_identity`] reads it back from a certificate.
pub fn node_user(name: &str) -> String {
    format!("{NODE_USER_PREFIX}{name}")
}

/// Which certificate a node speaks with: the SHA-256 of its leaf certificate (DER) and its
/// notBefore. The gateway records it for every identified node in the cluster (the Node's
/// annotations), so that every replica, restarted or not, knows that the node speaks with
/// an identity, and which certificate is its newest.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CertificateId {
    /// SHA-256 of the leaf certificate's DER bytes.
    pub sha256: [u8; 32],
    /// The leaf's notBefore, Unix seconds.
    pub not_before: i64,
}

impl CertificateId {
    /// The SHA-256 as 64 lower-case hex digits.
    pub fn sha256_hex(&self) -> String {
        self.sha256.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether a certificate `self` may replace `recorded`, the one the cluster records for
    /// the node: the same one, or one issued later (a rotation). An older one (a retained
    /// copy rolled back, an old key replayed) may not.
    pub fn may_replace(&self, recorded: &CertificateId) -> bool {
        self.sha256 == recorded.sha256 || self.not_before > recorded.not_before
    }
}

impl std::fmt::Debug for CertificateId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sha256:{} notBefore={}",
            &self.sha256_hex()[..16],
            self.not_before
        )
    }
}

/// Why TLS material (PEM certificates and keys, a trust anchor, a rustls configuration, a
/// signing key) is unusable. `Display` is the message for a person, e.g. `client
/// certificate: no PEM CERTIFICATE block found`; [`TlsError::In`] says which part of a
/// configuration it was.
#[cfg(feature = "tls")]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The text is not PEM.
    #[error("not valid PEM: {0}")]
    Pem(#[source] rustls::pki_types::pem::Error),
    /// The PEM holds no `CERTIFICATE` block.
    #[error("no PEM CERTIFICATE block found")]
    NoCertificate,
    /// The PEM holds no private key block (PKCS#8, PKCS#1 RSA or SEC1 EC).
    #[error("no PEM PRIVATE KEY block found (PKCS#8, RSA or EC)")]
    NoPrivateKey,
    /// The private key block does not parse.
    #[error("not a valid PEM private key: {0}")]
    PrivateKey(#[source] rustls::pki_types::pem::Error),
    /// A certificate rustls-webpki refuses as a trust anchor.
    #[error("not a usable CA certificate: {0}")]
    TrustAnchor(#[source] rustls::Error),
    /// rustls refused the configuration, e.g. a key that does not belong to its
    /// certificate, or a key type it cannot sign with.
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
    /// rustls could not build a certificate verifier from the trust anchors.
    #[error("{0}")]
    Verifier(#[from] rustls::client::VerifierBuilderError),
    /// A key that cannot sign edgebeat messages: only ECDSA P-256 and Ed25519 (RSA and
    /// P-384 signatures cost more bytes on a metered link than the renewal they sign).
    #[error(
        "a {algorithm} key cannot sign messages; use an ECDSA P-256 (kubelet's default) or Ed25519 key"
    )]
    UnsupportedKey {
        /// The key's algorithm as rustls names it, e.g. `RSA`.
        algorithm: String,
    },
    /// The signing operation failed (ring reports no detail).
    #[error("signing failed: {0}")]
    Signing(#[source] rustls::Error),
    /// `source`, in the part of a configuration named `part`: `CA`, `client certificate`,
    /// `client key`, `certificate`, `key`, `client CA`, `site CA`…
    #[error("{part}: {source}")]
    In {
        /// Which part.
        part: &'static str,
        /// What is wrong with it.
        #[source]
        source: Box<TlsError>,
    },
}

#[cfg(feature = "tls")]
impl TlsError {
    /// `self`, in the part named `part` ([`TlsError::In`]).
    pub fn in_part(self, part: &'static str) -> Self {
        Self::In {
            part,
            source: Box::new(self),
        }
    }

    /// A closure for `map_err`: errors convertible into [`TlsError`], in the part `part`.
    pub fn part<E: Into<Self>>(part: &'static str) -> impl FnOnce(E) -> Self {
        move |e| e.into().in_part(part)
    }
}

/// Makes ring the process-wide default rustls [`rustls::crypto::CryptoProvider`], so no
/// code path picks (or panics choosing between) providers. Idempotent; a provider installed
/// earlier is left in place.
#[cfg(feature = "tls")]
pub fn install_ring_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A certificate chain and its private key, both PEM (the first certificate is the leaf).
#[derive(Clone, PartialEq, Eq)]
pub struct TlsIdentity {
    /// PEM certificate chain, leaf first.
    pub cert_pem: Vec<u8>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

impl fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsIdentity")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &format_args!("<redacted>"))
            .finish()
    }
}

/// TLS settings of a client: the agent's gRPC uplink (`https://`), either side's MQTT
/// connection to the broker (`mqtts://`).
#[derive(Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM CA certificate(s) the server's certificate (gateway, broker) must chain to. The
    /// server name checked is the endpoint's host (a DNS name or an IP address SAN).
    pub ca_pem: Vec<u8>,
    /// Client certificate and key presented to the server (mTLS); for a node identity the
    /// certificate's subject is CN=`system:node:<nodeName>`, O=`system:nodes`.
    pub client_identity: Option<TlsIdentity>,
}

#[cfg(feature = "tls")]
impl ClientTls {
    /// A rustls client configuration on the ring provider: the server must chain to
    /// `ca_pem`; the client certificate, when set, is presented. TLS 1.2 and 1.3.
    ///
    /// Errors: [`TlsError::In`] naming the part (`CA`, `client certificate`, `client key`,
    /// or the pair) that is unusable.
    pub fn rustls_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let roots = root_store(&self.ca_pem).map_err(TlsError::part("CA"))?;
        let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
        match &self.client_identity {
            None => Ok(builder.with_no_client_auth()),
            Some(identity) => {
                let certs = parse_certificates(&identity.cert_pem)
                    .map_err(TlsError::part("client certificate"))?;
                let key =
                    parse_private_key(&identity.key_pem).map_err(TlsError::part("client key"))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(TlsError::part("client certificate and key"))
            }
        }
    }
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("client_identity", &self.client_identity)
            .finish()
    }
}

/// TLS settings of the gateway's gRPC server.
#[derive(Clone, PartialEq, Eq)]
pub struct GrpcServerTls {
    /// PEM server certificate chain, leaf first.
    pub cert_pem: Vec<u8>,
    /// PEM private key of the server certificate.
    pub key_pem: Vec<u8>,
    /// PEM CA certificate(s) client certificates must chain to. With it, clients present a
    /// certificate (mTLS; optional only when node identity is not required) and the
    /// transport reads the node identity from it; without it, TLS is server-side only.
    pub client_ca_pem: Option<Vec<u8>>,
}

impl fmt::Debug for GrpcServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcServerTls")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &format_args!("<redacted>"))
            .field(
                "client_ca_pem",
                &self
                    .client_ca_pem
                    .as_ref()
                    .map(|pem| format!("{} bytes", pem.len())),
            )
            .finish()
    }
}

#[cfg(feature = "tls")]
impl GrpcServerTls {
    /// Checks the material before serving, so a bad file fails at start-up with a precise
    /// message instead of at the first connection: every PEM parses, the key belongs to the
    /// certificate, and the client CA (when set) holds at least one usable certificate.
    ///
    /// Errors: [`TlsError::In`] naming the part (`certificate`, `key`, `client CA`).
    pub fn check(&self) -> Result<(), TlsError> {
        self.rustls_config(false).map(|_| ())
    }

    /// The rustls server configuration on the ring provider, offering ALPN `h2` (gRPC).
    /// With a client CA, client certificates must chain to it; they are mandatory when
    /// `require_client_cert`, optional otherwise.
    ///
    /// Errors: as [`GrpcServerTls::check`].
    pub fn rustls_config(
        &self,
        require_client_cert: bool,
    ) -> Result<rustls::ServerConfig, TlsError> {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let certs = parse_certificates(&self.cert_pem).map_err(TlsError::part("certificate"))?;
        let key = parse_private_key(&self.key_pem).map_err(TlsError::part("key"))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match &self.client_ca_pem {
            None => builder.with_no_client_auth(),
            Some(pem) => {
                let roots = root_store(pem).map_err(TlsError::part("client CA"))?;
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.into(),
                    provider,
                );
                let verifier = if require_client_cert {
                    verifier
                } else {
                    verifier.allow_unauthenticated()
                };
                builder.with_client_cert_verifier(
                    verifier.build().map_err(TlsError::part("client CA"))?,
                )
            }
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(TlsError::part("certificate and key"))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

/// The trust anchors of a PEM file of CA certificates.
///
/// Errors: as [`parse_certificates`], or [`TlsError::TrustAnchor`] when a certificate is
/// not usable as a trust anchor.
#[cfg(feature = "tls")]
pub fn root_store(pem: &[u8]) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in parse_certificates(pem)? {
        roots.add(cert).map_err(TlsError::TrustAnchor)?;
    }
    Ok(roots)
}

/// Parses every `CERTIFICATE` block of a PEM file.
///
/// Errors: [`TlsError::Pem`] when the text is not PEM, [`TlsError::NoCertificate`] when
/// it holds no certificate.
#[cfg(feature = "tls")]
pub fn parse_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(TlsError::Pem)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    Ok(certs)
}

/// Parses the first private key (PKCS#8, PKCS#1 RSA or SEC1 EC) of a PEM file.
///
/// Errors: [`TlsError::NoPrivateKey`] when there is none, [`TlsError::PrivateKey`] when
/// it is malformed.
#[cfg(feature = "tls")]
pub fn parse_private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoPrivateKey,
        other => TlsError::PrivateKey(other),
    })
}

/// Why a client certificate is not a node identity ([`node_identity`], [`certificate_id`]).
/// `Display` is the short reason logged, counted and sent in the `UNAUTHENTICATED` status.
#[cfg(feature = "node-identity")]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The DER does not parse as an X.509 certificate (x509-parser's reason).
    #[error("client certificate does not parse: {0}")]
    Unparsable(String),
    /// A CN or O attribute of `subject` is not a string.
    #[error("client certificate subject {subject} has a non-string value")]
    NonStringValue {
        /// The subject, as x509-parser prints it.
        subject: String,
    },
    /// `subject` has no CN, or more than one.
    #[error(
        "client certificate subject {subject} must have exactly one CN ({NODE_USER_PREFIX}<nodeName>)"
    )]
    CommonNames {
        /// The subject, as x509-parser prints it.
        subject: String,
    },
    /// The CN lacks the `system:node:` prefix.
    #[error(
        "client certificate CN {common_name:?} is not a node identity ({NODE_USER_PREFIX}<nodeName>)"
    )]
    NotANodeUser {
        /// The CN.
        common_name: String,
    },
    /// The name after `system:node:` is not a valid Node name.
    #[error("client certificate CN {common_name:?} does not name a valid node")]
    InvalidNodeName {
        /// The CN.
        common_name: String,
    },
    /// No O is `system:nodes`.
    #[error(
        "client certificate for {common_name:?} lacks O={NODES_GROUP} (has {organizations:?}): not a node"
    )]
    NotInNodesGroup {
        /// The CN.
        common_name: String,
        /// The O values it has.
        organizations: Vec<String>,
    },
}

/// The [`CertificateId`](CertificateId) of a leaf certificate (DER): its
/// SHA-256 and notBefore.
///
/// Errors: [`IdentityError::Unparsable`] when the certificate does not parse.
#[cfg(feature = "node-identity")]
pub fn certificate_id(leaf_der: &[u8]) -> Result<CertificateId, IdentityError> {
    use x509_parser::prelude::{FromDer as _, X509Certificate};

    let (_, cert) = X509Certificate::from_der(leaf_der)
        .map_err(|e| IdentityError::Unparsable(e.to_string()))?;
    let digest = ring::digest::digest(&ring::digest::SHA256, leaf_der);
    let mut sha256 = [0u8; 32];
    sha256.copy_from_slice(digest.as_ref());
    Ok(CertificateId {
        sha256,
        not_before: cert.validity().not_before.timestamp(),
    })
}

/// The notAfter of a certificate (DER), Unix seconds; `None` when it does not parse.
#[cfg(feature = "node-identity")]
pub fn not_after(leaf_der: &[u8]) -> Option<i64> {
    use x509_parser::prelude::{FromDer as _, X509Certificate};

    let (_, cert) = X509Certificate::from_der(leaf_der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// The node name a client certificate (DER, the leaf of the verified chain) authenticates:
/// `<name>` when the subject has exactly one CN, `system:node:<name>` with `<name>` a valid
/// node name, and an O equal to `system:nodes` (other O values may be present, as other
/// groups are for the apiserver).
///
/// Only identity is read here; chain, validity period and key usage were checked by rustls
/// during the handshake.
///
/// Errors: the [`IdentityError`] naming what is missing.
#[cfg(feature = "node-identity")]
pub fn node_identity(
    leaf_der: &[u8],
) -> Result<edgebeat_proto::registration::NodeName, IdentityError> {
    use x509_parser::prelude::{FromDer as _, X509Certificate};

    let (_, cert) = X509Certificate::from_der(leaf_der)
        .map_err(|e| IdentityError::Unparsable(e.to_string()))?;
    let subject = cert.subject();
    let text = |attr: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        attr.as_str()
            .map(str::to_owned)
            .map_err(|_| IdentityError::NonStringValue {
                subject: subject.to_string(),
            })
    };
    let common_names = subject
        .iter_common_name()
        .map(text)
        .collect::<Result<Vec<_>, _>>()?;
    let [common_name] = common_names.as_slice() else {
        return Err(IdentityError::CommonNames {
            subject: subject.to_string(),
        });
    };
    let Some(name) = common_name.strip_prefix(NODE_USER_PREFIX) else {
        return Err(IdentityError::NotANodeUser {
            common_name: common_name.clone(),
        });
    };
    let Ok(name) = edgebeat_proto::registration::NodeName::new(name) else {
        return Err(IdentityError::InvalidNodeName {
            common_name: common_name.clone(),
        });
    };
    let organizations = subject
        .iter_organization()
        .map(text)
        .collect::<Result<Vec<_>, _>>()?;
    if !organizations.iter().any(|o| o == NODES_GROUP) {
        return Err(IdentityError::NotInNodesGroup {
            common_name: common_name.clone(),
            organizations,
        });
    }
    Ok(name)
}

/// A Node name as the apiserver validates it (a DNS-1123 subdomain): the one rule, in
/// [`edgebeat_proto::registration::is_node_name`], that the agent's config, the gateway and
/// the certificate check share.
pub use edgebeat_proto::registration::is_node_name;

#[cfg(all(test, feature = "node-identity"))]
mod tests;
