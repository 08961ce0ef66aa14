//! The node identity the enrollment brings: certificate, key, site CA and answer CAs, with
//! its validity and rotation deadline, and what the transport and the requests make of it.

use edgebeat_transports::enroll::{self, NodeKeyPair};
use edgebeat_transports::signing::MessageSigner;
use edgebeat_transports::tls::{self, TlsIdentity};

use super::CertificateError;

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
    pub(super) fn answer_cas_pem(&self) -> String {
        self.answer_cas
            .iter()
            .map(|der| enroll::pem("CERTIFICATE", der))
            .collect()
    }

    /// The identity the gateway issued for `key`: the chain's first certificate, the site
    /// CA `ca` (DER), the answer CAs `answer_cas` (DER) it named.
    ///
    /// Errors: as [`NodeIdentity::from_pem`].
    pub(super) fn issued(
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
    pub(super) fn pair_pem(&self) -> String {
        format!("{}{}", self.cert_pem, self.key_pem)
    }

    /// When to rotate: `fraction` of the way from notBefore to notAfter, Unix seconds.
    pub fn rotation_deadline(&self, fraction: f64) -> i64 {
        let life = (self.not_after - self.not_before).max(0);
        let offset = (life as f64 * fraction) as i64;
        self.not_before + offset
    }

    /// The TLS client identity: this certificate and key.
    pub(super) fn tls_identity(&self) -> TlsIdentity {
        TlsIdentity {
            cert_pem: self.cert_pem.clone().into_bytes(),
            key_pem: self.key_pem.clone().into_bytes(),
        }
    }

    /// Signs certificate requests proved by this identity.
    pub(super) fn signer(&self) -> Result<MessageSigner, CertificateError> {
        MessageSigner::from_pem(self.cert_pem.as_bytes(), self.key_pem.as_bytes())
            .map_err(|e| CertificateError::Key(e.to_string()))
    }
}
