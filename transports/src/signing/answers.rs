//! The gateway's signed answers: what lets an agent that signs its messages (MQTT, through a
//! broker that is a third party) trust what comes back on its ack topic.
//!
//! An answer travels as a [`SignedAnswer`]: the encoded [`GatewayMessage`], the signature of
//! the gateway's answer key over [`ANSWER_CONTEXT`] `||` those bytes, and the key's
//! certificate chain. The agent verifies chain and signature with rustls-webpki, already in
//! its binary: a certificate valid for [`ANSWER_SIGNER_NAME`] that carries the extended key
//! usage serverAuth (required: a certificate without extended key usage is refused), issued
//! by a trust anchor of the agent. An enrolled agent's anchors are the *answer CAs* it learnt
//! at enrollment (`IssuedCertificate.answer_cas`): CAs the site CA issued for the gateway's
//! answer keys alone, so that no certificate the site CA issued directly (a node's, one
//! made by mistake with the gateway's name) can ever sign an answer, whatever it carries.
//! Which node, boot and request an answer is for is inside the signed bytes
//! (`Ack.node_name`, `Ack.boot_tag`, `Ack.seq`), for the agent to check.

use std::sync::Arc;

use edgebeat_proto::{GatewayMessage, SharedUsageBatch, SignedAnswer, SignedUsage};
use prost::Message as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::Signer;

use super::{load_key, tls};
use crate::tls::TlsError;

/// Domain separation prefix of every answer signature: `"edgebeat.v1 signed answer"` and a
/// NUL byte (26 bytes). Neither a message signature ([`super::SIGNING_CONTEXT`]) nor a TLS
/// handshake signature can pass as an answer signature.
pub const ANSWER_CONTEXT: &[u8] = b"edgebeat.v1 signed answer\0";

/// Domain separation prefix of the signature over replicas' shared usage samples
/// ([`AnswerSigner::seal_usage`]): `"edgebeat.v1 shared usage"` and a NUL byte (25 bytes).
/// An answer signature never passes as one, nor the reverse.
pub const USAGE_CONTEXT: &[u8] = b"edgebeat.v1 shared usage\0";

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

/// Why an [`AnswerSigner`] cannot be made ([`AnswerSigner::from_pem`]).
#[derive(Debug, thiserror::Error)]
pub enum AnswerSignerError {
    /// A PEM does not parse (in part `certificate`, `key` or `site CA`), or the key is
    /// neither ECDSA P-256 nor Ed25519.
    #[error(transparent)]
    Material(#[from] TlsError),
    /// The key signs what agents would refuse, naming why (not from the site CA, not
    /// serverAuth, not valid for [`ANSWER_SIGNER_NAME`] or not valid now).
    #[error("agents would refuse its answers: {0}")]
    Refused(#[source] AnswerError),
}

impl AnswerSigner {
    /// A signer with the gateway's answer certificate chain (`cert_pem`, leaf first) and its
    /// private key (`key_pem`), checked against the CA(s) in `site_ca_pem` the way agents
    /// will check it: a serverAuth certificate chaining to the site CA, valid now for
    /// [`ANSWER_SIGNER_NAME`], whose key signs what [`AnswerVerifier`] verifies.
    ///
    /// # Errors
    /// [`AnswerSignerError::Material`] when a PEM does not parse (in part `certificate`,
    /// `key` or `site CA`) or the key is neither ECDSA P-256 nor Ed25519;
    /// [`AnswerSignerError::Refused`] when agents would refuse what it signs, naming why.
    pub fn from_pem(
        cert_pem: &[u8],
        key_pem: &[u8],
        site_ca_pem: &[u8],
    ) -> Result<Self, AnswerSignerError> {
        let (signer, chain) = load_key(cert_pem, key_pem)?;
        let signer = Self {
            signer,
            chain: chain.iter().map(|c| c.as_ref().to_vec()).collect(),
        };
        let probe = signer.seal(&GatewayMessage::default())?;
        AnswerVerifier::from_pem(site_ca_pem)
            .map_err(TlsError::part("site CA"))?
            .verify(&probe, UnixTime::now())
            .map_err(AnswerSignerError::Refused)?;
        Ok(signer)
    }

    /// A signer of any certificate chain (`cert_pem`, leaf first) and key, unchecked: for
    /// tests that forge answers.
    ///
    /// Errors: as [`AnswerSigner::from_pem`] for the PEMs.
    #[cfg(test)]
    pub(crate) fn unchecked(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        let (signer, chain) = load_key(cert_pem, key_pem)?;
        Ok(Self {
            signer,
            chain: chain.iter().map(|c| c.as_ref().to_vec()).collect(),
        })
    }

    /// The encoded [`SignedAnswer`] of `message`: the message, about 71 (ECDSA P-256) or 64
    /// (Ed25519) bytes of signature, and the certificate chain.
    ///
    /// Errors: [`TlsError::Signing`] when the signing itself fails (ring reports no
    /// detail).
    pub fn seal(&self, message: &GatewayMessage) -> Result<Vec<u8>, TlsError> {
        let signed_message = message.encode_to_vec();
        let signature = self.sign(ANSWER_CONTEXT, &signed_message)?;
        Ok(SignedAnswer {
            signed_message,
            signature,
            certificate_chain: self.chain.clone(),
        }
        .encode_to_vec())
    }

    /// The encoded [`SignedUsage`] of `batch`: the samples this replica shares with the
    /// others (MQTT `P/usage`), signed over [`USAGE_CONTEXT`] `||` the encoded batch, with
    /// the answer key's certificate chain; the others take it through
    /// [`AnswerVerifier::verify_usage`].
    ///
    /// Errors: [`TlsError::Signing`] when the signing itself fails (ring reports no
    /// detail).
    pub fn seal_usage(&self, batch: &SharedUsageBatch) -> Result<Vec<u8>, TlsError> {
        let signed_batch = batch.encode_to_vec();
        let signature = self.sign(USAGE_CONTEXT, &signed_batch)?;
        Ok(SignedUsage {
            signed_batch,
            signature,
            certificate_chain: self.chain.clone(),
        }
        .encode_to_vec())
    }

    fn sign(&self, context: &[u8], bytes: &[u8]) -> Result<Vec<u8>, TlsError> {
        self.signer
            .sign(&super::with_context(context, bytes))
            .map_err(TlsError::Signing)
    }
}

/// The DER SubjectPublicKeyInfo of the certificate `der` (its key, whatever names it
/// carries), as rustls-webpki reads it for a trust anchor.
///
/// Errors: [`TlsError::TrustAnchor`] when the certificate does not parse.
pub fn public_key_info(der: &[u8]) -> Result<Vec<u8>, TlsError> {
    let certificate = CertificateDer::from(der);
    let anchor = webpki::anchor_from_trusted_cert(&certificate).map_err(|e| {
        TlsError::TrustAnchor(rustls::Error::InvalidCertificate(
            rustls::CertificateError::Other(rustls::OtherError(Arc::new(e))),
        ))
    })?;
    Ok(anchor.subject_public_key_info.to_vec())
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
    /// The certificate chain is not a gateway answer key's (issued by no trusted answer CA or
    /// site CA, expired, without the extended key usage serverAuth, not valid for
    /// [`ANSWER_SIGNER_NAME`]).
    #[error("answer certificate refused: {0}")]
    Certificate(String),
    /// The signature does not verify with the certificate's key.
    #[error("bad answer signature")]
    BadSignature,
    /// The signed bytes are no `GatewayMessage`.
    #[error("signed answer does not decode: {0}")]
    Malformed(String),
}

/// The object identifier of extended key usage `id-kp-serverAuth` (1.3.6.1.5.5.7.3.1,
/// RFC 5280 section 4.2.1.12), DER content bytes: an answer certificate must carry it.
/// rustls' server verifier takes a certificate with no extended key usage at all as fit for
/// any use (`KeyUsage::server_auth` is "required if present"); answers require it.
const EKU_SERVER_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01];

/// Verifies the gateway's signed answers (agent side), against its trust anchors: the answer
/// CAs learnt at enrollment ([`AnswerVerifier::pinned`]), else the site CA.
#[derive(Debug, Clone)]
pub struct AnswerVerifier {
    anchors: Arc<[rustls::pki_types::TrustAnchor<'static>]>,
    refusals: Arc<AnswerRefusals>,
}

impl PartialEq for AnswerVerifier {
    /// Verifiers are compared by identity: two built from the same PEM are different values.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.anchors, &other.anchors)
    }
}

/// Answers an agent refused, by [`AnswerError`] (shared by every verifier an agent builds,
/// so that a rotation's new verifier keeps counting; the agent serves them as
/// `edgebeat_agent_answers_refused_total{reason}`).
#[derive(Debug, Default)]
pub struct AnswerRefusals {
    counts: [std::sync::atomic::AtomicU64; 4],
}

/// Counts are not settings: any two compare equal, so that the options holding them (an
/// agent's parsed configuration) compare by what was configured.
impl PartialEq for AnswerRefusals {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl AnswerRefusals {
    /// The `reason` label of each count, in the order of [`AnswerRefusals::counts`].
    pub const REASONS: [&'static str; 4] = ["unsigned", "certificate", "signature", "malformed"];

    /// Counts one refusal for `error`.
    pub fn count(&self, error: &AnswerError) {
        let index = match error {
            AnswerError::Unsigned => 0,
            AnswerError::Certificate(_) => 1,
            AnswerError::BadSignature => 2,
            AnswerError::Malformed(_) => 3,
        };
        self.counts[index].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The counts, in the order of [`AnswerRefusals::REASONS`].
    pub fn counts(&self) -> [u64; 4] {
        std::array::from_fn(|i| self.counts[i].load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl AnswerVerifier {
    /// A verifier trusting the CA certificate(s) in `ca_pem`: the site CA, for an agent that
    /// has learnt no answer CA (configured by hand, or enrolled by a gateway that names
    /// none), or `transport.gatewayCAFile`.
    ///
    /// Errors: [`TlsError`] when the PEM holds no usable CA certificate.
    pub fn from_pem(ca_pem: &[u8]) -> Result<Self, TlsError> {
        Ok(Self::from_anchors(tls::root_store(ca_pem)?.roots))
    }

    /// A verifier trusting the one CA certificate `ca_der` (DER).
    ///
    /// Errors: [`TlsError::TrustAnchor`] when it is not usable as a trust anchor.
    pub fn from_der(ca_der: &[u8]) -> Result<Self, TlsError> {
        Self::pinned(std::slice::from_ref(&ca_der.to_vec()))
    }

    /// A verifier trusting only the answer CAs `answer_cas` (DER), the CAs the site CA
    /// issued for the gateway's answer keys, as an enrolled agent learnt them
    /// (`IssuedCertificate.answer_cas`): a certificate the site CA issued directly, a node's
    /// or any other, never signs an answer then, whatever names and key usages it carries.
    ///
    /// Errors: [`TlsError::TrustAnchor`] when one is not usable as a trust anchor,
    /// [`TlsError::NoCertificate`] when there is none.
    pub fn pinned(answer_cas: &[Vec<u8>]) -> Result<Self, TlsError> {
        if answer_cas.is_empty() {
            return Err(TlsError::NoCertificate);
        }
        let mut roots = rustls::RootCertStore::empty();
        for der in answer_cas {
            roots
                .add(CertificateDer::from(der.clone()))
                .map_err(TlsError::TrustAnchor)?;
        }
        Ok(Self::from_anchors(roots.roots))
    }

    fn from_anchors(anchors: Vec<rustls::pki_types::TrustAnchor<'static>>) -> Self {
        Self {
            anchors: anchors.into(),
            refusals: Arc::default(),
        }
    }

    /// The same verifier, counting its refusals in `refusals`.
    #[must_use]
    pub fn counting(mut self, refusals: Arc<AnswerRefusals>) -> Self {
        self.refusals = refusals;
        self
    }

    /// The [`GatewayMessage`] of an encoded [`SignedAnswer`] `payload`, once its chain
    /// leads to one of the trust anchors and its leaf is valid at `now`, carries the extended
    /// key usage serverAuth (required, not merely allowed) and is valid for
    /// [`ANSWER_SIGNER_NAME`], and its signature over [`ANSWER_CONTEXT`] `||` the message
    /// verifies with the leaf's key. Whom it answers (`Ack.node_name`, `boot_tag`, `seq`) is
    /// the caller's to check. Each refusal is counted ([`AnswerVerifier::counting`]).
    ///
    /// Errors: [`AnswerError`] saying which check failed.
    pub fn verify(&self, payload: &[u8], now: UnixTime) -> Result<GatewayMessage, AnswerError> {
        self.check(payload, now)
            .inspect_err(|error| self.refusals.count(error))
    }

    fn check(&self, payload: &[u8], now: UnixTime) -> Result<GatewayMessage, AnswerError> {
        let signed = unseal_answer(payload).ok_or(AnswerError::Unsigned)?;
        self.check_signed(
            ANSWER_CONTEXT,
            &signed.signed_message,
            &signed.signature,
            signed.certificate_chain,
            now,
        )?;
        GatewayMessage::decode(signed.signed_message.as_slice())
            .map_err(|e| AnswerError::Malformed(e.to_string()))
    }

    /// The [`SharedUsageBatch`] of an encoded [`SignedUsage`] `payload` (another replica's
    /// samples, MQTT `P/usage`), checked as [`AnswerVerifier::verify`] checks an answer but
    /// over [`USAGE_CONTEXT`]: a certificate of a gateway's answer key chaining to a trust
    /// anchor, valid at `now`. Which nodes the samples are for is inside the signed bytes
    /// (`SharedUsage.node_name`). Refusals are not counted here: the gateway counts them as
    /// rejected messages.
    ///
    /// Errors: [`AnswerError`] saying which check failed ([`AnswerError::Unsigned`] for a
    /// plain `SharedUsageBatch`, [`AnswerError::Malformed`] for bytes that decode as
    /// neither).
    pub fn verify_usage(
        &self,
        payload: &[u8],
        now: UnixTime,
    ) -> Result<SharedUsageBatch, AnswerError> {
        let signed =
            SignedUsage::decode(payload).map_err(|e| AnswerError::Malformed(e.to_string()))?;
        if signed.signed_batch.is_empty() && signed.signature.is_empty() {
            return Err(AnswerError::Unsigned);
        }
        self.check_signed(
            USAGE_CONTEXT,
            &signed.signed_batch,
            &signed.signature,
            signed.certificate_chain,
            now,
        )?;
        SharedUsageBatch::decode(signed.signed_batch.as_slice())
            .map_err(|e| AnswerError::Malformed(e.to_string()))
    }

    /// Checks that `signature` over `context || signed` verifies with the leaf of
    /// `certificate_chain`, a gateway answer key's certificate valid at `now`.
    fn check_signed(
        &self,
        context: &[u8],
        signed: &[u8],
        signature: &[u8],
        certificate_chain: Vec<Vec<u8>>,
        now: UnixTime,
    ) -> Result<(), AnswerError> {
        let mut chain = certificate_chain.into_iter().map(CertificateDer::from);
        let leaf = chain
            .next()
            .ok_or_else(|| AnswerError::Certificate("empty certificate chain".into()))?;
        let intermediates: Vec<_> = chain.collect();
        let refused = |e: webpki::Error| AnswerError::Certificate(e.to_string());
        let key = webpki::EndEntityCert::try_from(&leaf).map_err(refused)?;
        key.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &self.anchors,
            &intermediates,
            now,
            webpki::KeyUsage::required(EKU_SERVER_AUTH),
            None,
            None,
        )
        .map_err(refused)?;
        let name = ServerName::try_from(ANSWER_SIGNER_NAME)
            .map_err(|e| AnswerError::Certificate(e.to_string()))?;
        key.verify_is_valid_for_subject_name(&name)
            .map_err(refused)?;
        let message = super::with_context(context, signed);
        let verified = [webpki::ring::ECDSA_P256_SHA256, webpki::ring::ED25519]
            .into_iter()
            .any(|algorithm| key.verify_signature(algorithm, &message, signature).is_ok());
        if verified {
            Ok(())
        } else {
            Err(AnswerError::BadSignature)
        }
    }
}

/// Splits a payload into its parts when it is a [`SignedUsage`]; `None` when it is not one
/// (a plain `SharedUsageBatch`, whose fields 8 to 10 are reserved, decodes here with all
/// three empty) or does not decode at all.
pub fn unseal_usage(payload: &[u8]) -> Option<SignedUsage> {
    let signed = SignedUsage::decode(payload).ok()?;
    (!signed.signed_batch.is_empty() || !signed.signature.is_empty()).then_some(signed)
}
