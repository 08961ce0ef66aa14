//! Node certificates without hands, on the wire: bootstrap tokens and the proof a request
//! carries, the PKCS#10 request an agent builds for a key made on the board, the pin that
//! lets a board with nothing but a token trust the site CA, and reading the gateway's
//! signed answer. Both sides use it; what the gateway does with a request (a Kubernetes
//! CertificateSigningRequest, approval, signing) is the gateway's.
//!
//! The scheme is kubelet's TLS bootstrap and certificate rotation
//! (`pkg/kubelet/certificate/bootstrap/bootstrap.go`, client-go
//! `util/certificate/certificate_manager.go`) with kubeadm's discovery by CA hash
//! (`discovery-token-ca-cert-hash`), over edgebeat's transports: see
//! [`CertificateRequest`](edgebeat_proto::CertificateRequest) for the wire shapes.
//!
//! In pieces: the bootstrap token and its proof (`token`), the node key and its PKCS#10
//! request (`key`), hand-made DER and PEM (`der`), the answer's reading (`answer`) and TLS
//! by the pin (`pinned`); the requests themselves and the pin are here.

mod answer;
mod der;
mod key;
mod pinned;
mod token;

pub use answer::{AnswerTrust, Answered, ReadAnswerError, read_answer};
pub use der::{certificate_validity, pem};
pub use key::NodeKeyPair;
pub use pinned::PinnedCaVerifier;
pub use token::{
    BootstrapToken, ENROLL_CONTEXT, TOKEN_ID_LEN, TOKEN_SECRET_LEN, hex, token_proof,
    verify_token_proof,
};

use edgebeat_proto::{CertificateRequest, Header};
use prost::Message as _;
use rustls::pki_types::CertificateDer;

use self::der::der;

/// The last level of the MQTT topic certificate requests go to:
/// `P/nodes/{node}/csr`.
pub const CSR_KIND: &str = "csr";

/// Why enrollment material could not be read or made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnrollError {
    /// A bootstrap token is not `<id>.<secret>.sha256:<hex>` as described on
    /// [`BootstrapToken`].
    #[error(
        "bootstrap token: {0}; expected <6 of [a-z0-9]>.<16 of [a-z0-9]>.sha256:<64 hex digits> (edgebeat-gateway token create prints one)"
    )]
    Token(&'static str),
    /// A certificate does not parse as X.509 DER.
    #[error("certificate: {0}")]
    Certificate(String),
    /// The node key cannot be made, read or used (ring reports no detail).
    #[error("node key: {0}")]
    Key(String),
}

/// SHA-256 of a certificate's SubjectPublicKeyInfo (DER, its outer SEQUENCE included): the
/// pin a bootstrap token carries, computed as kubeadm's `discovery-token-ca-cert-hash`
/// (`x509.MarshalPKIXPublicKey` of the CA's key).
///
/// Errors: [`EnrollError::Certificate`] when `cert_der` does not parse.
pub fn ca_pin(cert_der: &[u8]) -> Result<[u8; 32], EnrollError> {
    let cert = CertificateDer::from(cert_der);
    let anchor = webpki::anchor_from_trusted_cert(&cert)
        .map_err(|e| EnrollError::Certificate(format!("{e:?}")))?;
    // webpki keeps the SPKI's contents: put its SEQUENCE header back.
    let spki = der(0x30, anchor.subject_public_key_info.as_ref());
    let digest = ring::digest::digest(&ring::digest::SHA256, &spki);
    let mut pin = [0u8; 32];
    pin.copy_from_slice(digest.as_ref());
    Ok(pin)
}

/// The encoded [`CertificateRequest`] proved by a bootstrap `token`: the payload for the
/// enrollment endpoint.
pub fn token_request(token: &BootstrapToken, header: Header, csr: Vec<u8>) -> Vec<u8> {
    let token_proof = token.proof(&header, &csr);
    CertificateRequest {
        header: Some(header),
        csr,
        token_id: token.id.clone(),
        token_proof,
        certificate_chain: Vec::new(),
    }
    .encode_to_vec()
}

/// The request proved by the node's certificate: a
/// [`SignedMessage`](edgebeat_proto::SignedMessage) of the [`CertificateRequest`] carrying
/// `signer`'s certificate chain, signed with its key (which may have expired, within the
/// gateway's grace period).
///
/// Errors: [`EnrollError::Key`] when signing fails.
pub fn certificate_request(
    signer: &crate::signing::MessageSigner,
    header: Header,
    csr: Vec<u8>,
) -> Result<Vec<u8>, EnrollError> {
    let chain = edgebeat_proto::NodeCertificate::decode(signer.certificate())
        .map_err(|e| EnrollError::Certificate(e.to_string()))?
        .certificate_chain;
    let request = CertificateRequest {
        header: Some(header),
        csr,
        token_id: String::new(),
        token_proof: Vec::new(),
        certificate_chain: chain,
    };
    signer
        .seal(request.encode_to_vec())
        .map_err(|e| EnrollError::Key(e.to_string()))
}

#[cfg(test)]
mod tests;
