//! The gateway's signed answers: what lets an agent that signs its messages (MQTT, through a
//! broker that is a third party) trust what comes back on its ack topic.
//!
//! An answer travels as a [`SignedAnswer`]: the encoded [`GatewayMessage`], the signature of
//! the gateway's answer key over [`ANSWER_CONTEXT`] `||` those bytes, and the key's
//! certificate chain. The agent verifies the chain against the site CA with rustls (a
//! server certificate valid for [`ANSWER_SIGNER_NAME`], the check a TLS client makes of a
//! server) and the signature with rustls-webpki, both already in its binary. A node's
//! certificate (client authentication, no names) never passes: a node can sign its own
//! messages but never an answer. Which node, boot and request an answer is for is inside the
//! signed bytes (`Ack.node_name`, `Ack.boot_tag`, `Ack.seq`), for the agent to check.

use std::sync::Arc;

use edgebeat_proto::{GatewayMessage, SignedAnswer};
use prost::Message as _;
use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::Signer;

use super::{load_key, tls};
use crate::tls::TlsError;

/// Domain separation prefix of every answer signature: `"edgebeat.v1 signed answer"` and a
/// NUL byte (26 bytes). Neither a message signature ([`super::SIGNING_CONTEXT`]) nor a TLS
/// handshake signature can pass as an answer signature.
pub const ANSWER_CONTEXT: &[u8] = b"edgebeat.v1 signed answer\0";

/// The DNS name the certificate of a gateway's answer key must be valid for (a subject
/// alternative name, with extended key usage serverAuth): `edgebeat-gateway`.
pub const ANSWER_SIGNER_NAME: &str = "edgebeat-gateway";

/// Signs the gateway's answers with its answer key (gateway side).
pub struct AnswerSigner {
    signer: Box<dyn Signer>,
    chain: Vec<Vec<u8>>,
}

impl std::fmt::Debug for AnswerSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerSigner")
            .field("scheme", &self.signer.scheme())
            .field("chain", &format_args!("{} certificates", self.chain.len()))
            .finish()
    }
}

impl AnswerSigner {
    /// A signer with the gateway's answer certificate chain (`cert_pem`, leaf first) and its
    /// private key (`key_pem`), checked against the CA(s) in `site_ca_pem` the way agents
    /// will check it: a serverAuth certificate chaining to the site CA, valid now for
    /// [`ANSWER_SIGNER_NAME`], whose key signs what [`AnswerVerifier`] verifies.
    ///
    /// Errors: [`TlsError`] when a PEM does not parse (in part `certificate`, `key` or
    /// `site CA`), the key is neither ECDSA P-256 nor Ed25519, or agents would refuse what
    /// it signs ([`TlsError::AnswersRefused`], naming why).
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8], site_ca_pem: &[u8]) -> Result<Self, TlsError> {
        let (signer, chain) = load_key(cert_pem, key_pem)?;
        let signer = Self {
            signer,
            chain: chain.iter().map(|c| c.as_ref().to_vec()).collect(),
        };
        let probe = signer.seal(&GatewayMessage::default())?;
        AnswerVerifier::from_pem(site_ca_pem)
            .map_err(TlsError::part("site CA"))?
            .verify(&probe, UnixTime::now())
            .map_err(TlsError::AnswersRefused)?;
        Ok(signer)
    }

    /// The encoded [`SignedAnswer`] of `message`: the message, about 71 (ECDSA P-256) or 64
    /// (Ed25519) bytes of signature, and the certificate chain.
    ///
    /// Errors: [`TlsError::Signing`] when the signing itself fails (ring reports no
    /// detail).
    pub fn seal(&self, message: &GatewayMessage) -> Result<Vec<u8>, TlsError> {
        let signed_message = message.encode_to_vec();
        let signature = self
            .signer
            .sign(&super::with_context(ANSWER_CONTEXT, &signed_message))
            .map_err(TlsError::Signing)?;
        Ok(SignedAnswer {
            signed_message,
            signature,
            certificate_chain: self.chain.clone(),
        }
        .encode_to_vec())
    }
}

/// Splits a payload into `(signed_message, signature, certificate_chain)` when it is a
/// [`SignedAnswer`]; `None` when it is not one (a plain `GatewayMessage`, whose fields 8 to
/// 10 are reserved, decodes here with all three empty) or does not decode at all.
pub fn unseal_answer(payload: &[u8]) -> Option<SignedAnswer> {
    let signed = SignedAnswer::decode(payload).ok()?;
    (!signed.signed_message.is_empty() || !signed.signature.is_empty()).then_some(signed)
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The payload is not a [`SignedAnswer`] (a plain, unauthenticated `GatewayMessage`).
    #[error("not a signed answer")]
    Unsigned,
    /// The certificate chain is not a gateway answer key's from the site CA (unknown CA,
    /// expired, not for server authentication, not valid for [`ANSWER_SIGNER_NAME`]).
    #[error("answer certificate refused: {0}")]
    Certificate(String),
    /// The signature does not verify with the certificate's key.
    #[error("bad answer signature")]
    BadSignature,
    /// The signed bytes are no `GatewayMessage`.
    #[error("signed answer does not decode: {0}")]
    Malformed(String),
}

/// Verifies the gateway's signed answers against the site CA (agent side).
#[derive(Debug, Clone)]
pub struct AnswerVerifier {
    verifier: Arc<rustls::client::WebPkiServerVerifier>,
}

impl PartialEq for AnswerVerifier {
    /// Verifiers are compared by identity: two built from the same PEM are different values.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.verifier, &other.verifier)
    }
}

impl AnswerVerifier {
    /// A verifier trusting the CA certificate(s) in `ca_pem` (the site CA that issues the
    /// gateway's answer key).
    ///
    /// Errors: [`TlsError`] when the PEM holds no usable CA certificate.
    pub fn from_pem(ca_pem: &[u8]) -> Result<Self, TlsError> {
        Self::from_roots(tls::root_store(ca_pem)?)
    }

    /// A verifier trusting the one CA certificate `ca_der` (DER).
    ///
    /// Errors: [`TlsError::TrustAnchor`] when it is not usable as a trust anchor.
    pub fn from_der(ca_der: &[u8]) -> Result<Self, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(ca_der.to_vec()))
            .map_err(TlsError::TrustAnchor)?;
        Self::from_roots(roots)
    }

    fn from_roots(roots: rustls::RootCertStore) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()?;
        Ok(Self { verifier })
    }

    /// The [`GatewayMessage`] of an encoded [`SignedAnswer`] `payload`, once its chain
    /// leads to the site CA and is valid at `now` for [`ANSWER_SIGNER_NAME`] with
    /// serverAuth, and its signature over [`ANSWER_CONTEXT`] `||` the message verifies
    /// with the leaf's key. Whom it answers (`Ack.node_name`, `boot_tag`, `seq`) is the
    /// caller's to check.
    ///
    /// Errors: [`AnswerError`] saying which check failed.
    pub fn verify(&self, payload: &[u8], now: UnixTime) -> Result<GatewayMessage, AnswerError> {
        let signed = unseal_answer(payload).ok_or(AnswerError::Unsigned)?;
        let mut chain = signed
            .certificate_chain
            .into_iter()
            .map(CertificateDer::from);
        let leaf = chain
            .next()
            .ok_or_else(|| AnswerError::Certificate("empty certificate chain".into()))?;
        let intermediates: Vec<_> = chain.collect();
        let name = ServerName::try_from(ANSWER_SIGNER_NAME)
            .map_err(|e| AnswerError::Certificate(e.to_string()))?;
        self.verifier
            .verify_server_cert(&leaf, &intermediates, &name, &[], now)
            .map_err(|e| AnswerError::Certificate(e.to_string()))?;
        let key = webpki::EndEntityCert::try_from(&leaf)
            .map_err(|e| AnswerError::Certificate(e.to_string()))?;
        let message = super::with_context(ANSWER_CONTEXT, &signed.signed_message);
        let verified = [webpki::ring::ECDSA_P256_SHA256, webpki::ring::ED25519]
            .into_iter()
            .any(|algorithm| {
                key.verify_signature(algorithm, &message, &signed.signature)
                    .is_ok()
            });
        if !verified {
            return Err(AnswerError::BadSignature);
        }
        GatewayMessage::decode(signed.signed_message.as_slice())
            .map_err(|e| AnswerError::Malformed(e.to_string()))
    }
}
