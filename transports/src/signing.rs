//! End-to-end message signatures for transports through a third party (MQTT brokers).
//!
//! TLS to a broker authenticates the broker, not the publisher: anyone who can publish on a
//! node's topics (a misconfigured ACL, a compromised broker, another tenant) could speak for
//! that node. So an agent signs each message with the private key of its node client
//! certificate (kubelet's: CN=`system:node:<name>`, O=`system:nodes`), and the gateway
//! verifies it against that certificate, which it checks against the site CA.
//!
//! Wire shapes (`edgebeat.v1`): a signed message is a [`SignedMessage`] whose
//! `signed_message` holds the encoded [`AgentMessage`](edgebeat_proto::AgentMessage) and
//! whose `signature` is over [`SIGNING_CONTEXT`] `||` `signed_message`; the certificate
//! travels as a [`NodeCertificate`] (DER chain, leaf first).
//!
//! Keys: ECDSA P-256 (kubelet's own client-certificate key type; ECDSA with SHA-256, ASN.1
//! DER signatures of about 71 bytes) and Ed25519 (64-byte signatures). The crypto is
//! rustls' ring provider for signing, rustls-webpki (through rustls) for the certificate
//! chain, and ring for each message's signature; nothing here is hand-rolled but the
//! framing.
//!
//! Replays are refused by what the signed bytes carry: the header's per-boot `seq`, which
//! each gateway replica requires to increase for a boot it remembers, and `wall_time_ms`,
//! which the MQTT ingress requires within a clock window of its own clock
//! (`SignaturePolicy::max_clock_skew`, 30 s), so that a replica that does not remember the
//! boot (restarted, never saw it) takes a recorded message only within that window.

use edgebeat_proto::{NodeCertificate, SignedMessage};
use prost::Message as _;
use rustls::SignatureScheme;
use rustls::sign::Signer;

use std::time::Duration;

use crate::tls::{self, TlsError};

/// Domain separation prefix of every signature: `"edgebeat.v1 signed message"` and a NUL
/// byte (27 bytes). A signature made for anything else (a TLS handshake with the same key)
/// can never pass as a message signature, nor the other way round.
pub const SIGNING_CONTEXT: &[u8] = b"edgebeat.v1 signed message\0";

/// Signature schemes an agent may sign with, in order of preference: Ed25519, then ECDSA
/// P-256 with SHA-256.
const SCHEMES: [SignatureScheme; 2] = [
    SignatureScheme::ED25519,
    SignatureScheme::ECDSA_NISTP256_SHA256,
];

/// The bytes a signature covers: [`SIGNING_CONTEXT`] followed by the encoded message.
fn signed_bytes(message: &[u8]) -> Vec<u8> {
    with_context(SIGNING_CONTEXT, message)
}

/// `context` followed by `message`: what a signature of that context covers.
fn with_context(context: &[u8], message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(context.len() + message.len());
    out.extend_from_slice(context);
    out.extend_from_slice(message);
    out
}

/// The signer of a certificate chain (`cert_pem`, leaf first) and its private key
/// (`key_pem`), in one of [`SCHEMES`].
///
/// Errors: [`TlsError::In`] `certificate` or `key` when either PEM does not parse, or
/// `key` with [`TlsError::UnsupportedKey`] when the key is neither ECDSA P-256 nor Ed25519.
fn load_key(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<
    (
        Box<dyn Signer>,
        Vec<rustls::pki_types::CertificateDer<'static>>,
    ),
    TlsError,
> {
    let chain = tls::parse_certificates(cert_pem).map_err(TlsError::part("certificate"))?;
    let key = tls::parse_private_key(key_pem).map_err(TlsError::part("key"))?;
    let key =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(TlsError::part("key"))?;
    let signer = key.choose_scheme(&SCHEMES).ok_or_else(|| {
        TlsError::UnsupportedKey {
            algorithm: format!("{:?}", key.algorithm()),
        }
        .in_part("key")
    })?;
    Ok((signer, chain))
}

mod answers;
pub use answers::{
    ANSWER_CONTEXT, ANSWER_SIGNER_NAME, AnswerError, AnswerRefusals, AnswerSigner,
    AnswerSignerError, AnswerVerifier, USAGE_CONTEXT, public_key_info, unseal_answer, unseal_usage,
};

/// Signs agent messages with the node's private key (agent side).
pub struct MessageSigner {
    signer: Box<dyn Signer>,
    certificate: Vec<u8>,
}

impl std::fmt::Debug for MessageSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageSigner")
            .field("scheme", &self.signer.scheme())
            .field(
                "certificate",
                &format_args!("{} bytes", self.certificate.len()),
            )
            .finish()
    }
}

/// Two signers are equal when they hold the same certificate chain and signature scheme:
/// they then sign for the same key.
impl PartialEq for MessageSigner {
    fn eq(&self, other: &Self) -> bool {
        self.certificate == other.certificate && self.signer.scheme() == other.signer.scheme()
    }
}

impl MessageSigner {
    /// A signer for the node whose client certificate chain (`cert_pem`, leaf first) and
    /// private key (`key_pem`: PKCS#8, or SEC1 for EC keys) are given, as in the agent's
    /// `transport.certFile` and `transport.keyFile`.
    ///
    /// Errors: [`TlsError`] (in part `certificate` or `key`) when either PEM does not
    /// parse, or the key is neither ECDSA P-256 nor Ed25519 ([`TlsError::UnsupportedKey`]:
    /// RSA and P-384 signatures cost more bytes on a metered link than the whole Lease
    /// renewal they would sign).
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        let (signer, chain) = load_key(cert_pem, key_pem)?;
        let certificate = NodeCertificate {
            certificate_chain: chain.iter().map(|c| c.as_ref().to_vec()).collect(),
        }
        .encode_to_vec();
        Ok(Self {
            signer,
            certificate,
        })
    }

    /// Wraps an encoded `AgentMessage` into an encoded [`SignedMessage`], about 75 bytes
    /// (ECDSA P-256) or 68 bytes (Ed25519) larger.
    ///
    /// Errors: [`TlsError::Signing`] when the signing itself fails (ring reports no
    /// detail).
    pub fn seal(&self, message: Vec<u8>) -> Result<Vec<u8>, TlsError> {
        let signature = self
            .signer
            .sign(&signed_bytes(&message))
            .map_err(TlsError::Signing)?;
        Ok(SignedMessage {
            signed_message: message,
            signature,
        }
        .encode_to_vec())
    }

    /// The encoded [`NodeCertificate`] (the certificate chain given to
    /// [`MessageSigner::from_pem`]) that verifiers need.
    pub fn certificate(&self) -> &[u8] {
        &self.certificate
    }
}

/// Splits a payload into `(signed_message, signature)` when it is a [`SignedMessage`];
/// `None` when it is not one (a plain `AgentMessage`, whose fields 8 and 9 are reserved,
/// decodes here with both empty) or does not decode at all.
pub fn unseal(payload: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let signed = SignedMessage::decode(payload).ok()?;
    if signed.signed_message.is_empty() && signed.signature.is_empty() {
        return None;
    }
    Some((signed.signed_message, signed.signature))
}

/// A signed wall time outside the clock window: `ahead_ms` ahead of the gateway's clock
/// (behind when negative, saturated at `i64`'s ends), outside ±`max`.
///
/// Its text is what the gateway logs, e.g. "signed wall time is 3600.0 s ahead of the
/// gateway's clock, outside its ±30 s window: set this node's clock (NTP, or an RTC)".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "signed wall time is {:.1} s {} the gateway's clock, outside its ±{} s window: set this node's clock (NTP, or an RTC)",
    self.seconds(),
    if self.ahead_ms >= 0 { "ahead of" } else { "behind" },
    self.max.as_secs()
)]
pub struct ClockSkew {
    /// Milliseconds the message's wall time is ahead of the gateway's clock; negative when
    /// behind.
    pub ahead_ms: i64,
    /// The window's half-width.
    pub max: Duration,
}

impl ClockSkew {
    // For a message: tenths of a second suffice (the cast's precision loss is harmless).
    fn seconds(&self) -> f64 {
        self.ahead_ms.unsigned_abs() as f64 / 1000.0
    }
}

/// The clock window, the one rule for every message whose `Header::wall_time_ms` the
/// gateway trusts (signed MQTT messages, certificate requests): `wall_time_ms` (milliseconds
/// since the Unix epoch, chosen by the sender, so any `i64`) must lie within ±`max` of `now`
/// (the gateway's clock, as the time since the Unix epoch). The arithmetic is exact (128
/// bits): no value panics or wraps into the window.
///
/// # Errors
///
/// [`ClockSkew`] when it lies outside, with by how much.
pub fn check_clock_window(
    wall_time_ms: i64,
    now: Duration,
    max: Duration,
) -> Result<(), ClockSkew> {
    // Exact in 128 bits: any i64 minus any u64 of milliseconds fits, so no value wraps
    // into the window; only the reported distance saturates at i64's ends.
    let now_ms = i128::try_from(now.as_millis()).unwrap_or(i128::MAX);
    let max_ms = i128::try_from(max.as_millis()).unwrap_or(i128::MAX);
    let ahead = i128::from(wall_time_ms).saturating_sub(now_ms);
    if ahead.saturating_abs() > max_ms {
        let ahead_ms = i64::try_from(ahead).unwrap_or(if ahead < 0 { i64::MIN } else { i64::MAX });
        return Err(ClockSkew { ahead_ms, max });
    }
    Ok(())
}

#[cfg(feature = "node-identity")]
pub use verify::{CertificateVerifier, NodeKey, SignatureError};

#[cfg(feature = "node-identity")]
mod verify {
    use std::sync::Arc;

    use super::signed_bytes;
    use crate::tls::{self, TlsError};
    use edgebeat_proto::NodeCertificate;
    use prost::Message as _;
    use rustls::pki_types::{CertificateDer, UnixTime};
    use rustls::server::danger::ClientCertVerifier;
    use x509_parser::prelude::{FromDer as _, X509Certificate};

    /// Checks node certificates against the site CA (gateway side).
    #[derive(Debug, Clone)]
    pub struct CertificateVerifier {
        verifier: Arc<dyn ClientCertVerifier>,
    }

    impl CertificateVerifier {
        /// A verifier trusting the CA certificate(s) in `ca_pem` (the site CA that signs
        /// node client certificates).
        ///
        /// Errors: [`TlsError`] when the PEM holds no usable CA certificate.
        pub fn from_pem(ca_pem: &[u8]) -> Result<Self, TlsError> {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let roots = tls::root_store(ca_pem)?;
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()?;
            Ok(Self { verifier })
        }

        /// Verifies an encoded [`NodeCertificate`] published for `node` at `now`: the chain
        /// leads to a CA of the verifier's bundle (the site CA, and any other that issues
        /// node certificates), every certificate is within its validity period, the leaf
        /// may be used for client authentication (rustls-webpki, as for an mTLS handshake),
        /// and its subject is `node`'s identity ([`tls::node_identity`]).
        ///
        /// Errors: [`SignatureError::Certificate`] saying which check failed.
        pub fn verify(
            &self,
            node: &str,
            payload: &[u8],
            now: UnixTime,
        ) -> Result<NodeKey, SignatureError> {
            let refuse = |why: String| SignatureError::Certificate(why);
            let published = NodeCertificate::decode(payload)
                .map_err(|e| refuse(format!("not a NodeCertificate: {e}")))?;
            let mut chain = published
                .certificate_chain
                .into_iter()
                .map(CertificateDer::from);
            let leaf = chain
                .next()
                .ok_or_else(|| refuse("empty certificate chain".into()))?;
            let intermediates: Vec<_> = chain.collect();
            self.verifier
                .verify_client_cert(&leaf, &intermediates, now)
                .map_err(|e| refuse(format!("{e}")))?;
            let identity = tls::node_identity(&leaf).map_err(|e| refuse(e.to_string()))?;
            if identity != node {
                return Err(refuse(format!(
                    "certificate of node {identity:?} published for node {node:?}"
                )));
            }
            let (_, cert) = X509Certificate::from_der(&leaf)
                .map_err(|e| refuse(format!("does not parse: {e}")))?;
            let spki = cert.public_key();
            let algorithm: &'static dyn ring::signature::VerificationAlgorithm =
                if spki.algorithm.algorithm == x509_parser::oid_registry::OID_SIG_ED25519 {
                    &ring::signature::ED25519
                } else if spki.algorithm.algorithm
                    == x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY
                    && spki
                        .algorithm
                        .parameters
                        .as_ref()
                        .and_then(|p| p.as_oid().ok())
                        == Some(x509_parser::oid_registry::OID_EC_P256)
                {
                    // rustls' ECDSA signer writes ASN.1 DER signatures.
                    &ring::signature::ECDSA_P256_SHA256_ASN1
                } else {
                    return Err(refuse(
                        "the key is neither ECDSA P-256 nor Ed25519; it cannot sign messages"
                            .into(),
                    ));
                };
            let id = tls::certificate_id(&leaf).map_err(|e| refuse(e.to_string()))?;
            Ok(NodeKey {
                node: identity,
                public_key: spki.subject_public_key.data.to_vec(),
                algorithm,
                id,
                not_after: cert.validity().not_after.timestamp(),
            })
        }
    }

    /// A node's verified certificate, ready to check its signatures: the certificate was
    /// parsed and checked once; each message costs only the signature check.
    #[derive(Clone)]
    pub struct NodeKey {
        node: edgebeat_proto::registration::NodeName,
        /// The subjectPublicKey bits: an uncompressed P-256 point or 32 Ed25519 bytes.
        public_key: Vec<u8>,
        algorithm: &'static dyn ring::signature::VerificationAlgorithm,
        /// The leaf's SHA-256 and notBefore.
        id: tls::CertificateId,
        /// notAfter of the leaf, Unix seconds.
        not_after: i64,
    }

    impl std::fmt::Debug for NodeKey {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("NodeKey")
                .field("node", &self.node)
                .field("algorithm", &self.algorithm)
                .field("not_after", &self.not_after)
                .finish_non_exhaustive()
        }
    }

    impl NodeKey {
        /// The node the certificate names.
        pub fn node(&self) -> &str {
            &self.node
        }

        /// notBefore of the certificate, in Unix seconds (a rotated certificate has a later
        /// one).
        pub fn not_before(&self) -> i64 {
            self.id.not_before
        }

        /// Which certificate this is (SHA-256 and notBefore).
        pub fn certificate_id(&self) -> tls::CertificateId {
            self.id
        }

        /// notAfter of the certificate, in Unix seconds.
        pub fn not_after(&self) -> i64 {
            self.not_after
        }

        /// Verifies `signature` over [`SIGNING_CONTEXT`] `||` `signed_message` at `now`.
        ///
        /// Errors: [`SignatureError::Expired`] once the certificate's notAfter has passed
        /// (checked on every message, not only when the certificate arrived), and
        /// [`SignatureError::BadSignature`] when the signature does not verify (tampered
        /// message, another key).
        pub fn verify(
            &self,
            signed_message: &[u8],
            signature: &[u8],
            now: UnixTime,
        ) -> Result<(), SignatureError> {
            let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
            if now > self.not_after {
                return Err(SignatureError::Expired);
            }
            ring::signature::UnparsedPublicKey::new(self.algorithm, &self.public_key)
                .verify(&signed_bytes(signed_message), signature)
                .map_err(|_| SignatureError::BadSignature)
        }
    }

    /// Why a signed message or a node certificate was refused.
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    pub enum SignatureError {
        /// The certificate is not a usable node certificate from the site CA (unknown CA,
        /// expired or not yet valid, not for client authentication, another node's, an
        /// unsupported key type, malformed).
        #[error("node certificate refused: {0}")]
        Certificate(String),
        /// The certificate that verified the node's messages has expired since.
        #[error("node certificate expired")]
        Expired,
        /// The signature does not verify with the node's key.
        #[error("bad signature")]
        BadSignature,
    }
}

#[cfg(test)]
mod clock_window_tests;

#[cfg(all(test, feature = "node-identity"))]
mod tests;
