//! The certificate pieces the site CA ([`super::ca`]) and the answer CAs
//! ([`super::answer_ca`]) share: the gateway's identity, a CA's issuer, validity windows.

use std::time::Duration;

use rcgen::{Issuer, KeyPair};

use super::EnrollmentError;

/// The gateway's own certificate from the site CA, and its key (PEM both).
#[derive(Clone)]
pub struct GatewayIdentity {
    /// The certificate (DNS name
    /// [`ANSWER_SIGNER_NAME`](edgebeat_transports::signing::ANSWER_SIGNER_NAME),
    /// serverAuth), then the answer CA that issued it.
    pub cert_pem: String,
    /// Its private key, PKCS#8.
    pub key_pem: String,
}

impl std::fmt::Debug for GatewayIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayIdentity").finish_non_exhaustive()
    }
}

/// A CA certificate with its key, able to issue: the site CA's ([`super::ca::SiteCa`]) and
/// each answer CA's ([`super::answer_ca::AnswerCa`]).
pub struct IssuingCa {
    /// The CA certificate, DER.
    pub cert_der: Vec<u8>,
    /// The CA certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM (kept to write it back into the site CA's Secret).
    pub(super) key_pem: String,
    /// rcgen's issuer of the two.
    pub(super) issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for IssuingCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuingCa").finish_non_exhaustive()
    }
}

impl IssuingCa {
    /// The CA of a certificate and its key, both PEM.
    ///
    /// Errors: [`EnrollmentError::Ca`] when either does not parse or the certificate is not
    /// a CA's; [`EnrollmentError::CaTls`] when the certificate's PEM does not parse.
    pub(super) fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, EnrollmentError> {
        let key = KeyPair::from_pem(key_pem).map_err(ca_error)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(ca_error)?;
        let cert_der = edgebeat_transports::tls::parse_certificates(cert_pem.as_bytes())
            .map_err(EnrollmentError::CaTls)?
            .into_iter()
            .next()
            .ok_or_else(|| EnrollmentError::Ca("no certificate".into()))?
            .to_vec();
        Ok(Self {
            cert_der,
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            issuer,
        })
    }
}

/// `(notBefore, notAfter)` for `lifetime` from `from` (Unix seconds).
pub(super) fn validity(
    from: i64,
    lifetime: Duration,
) -> Result<(time::OffsetDateTime, time::OffsetDateTime), EnrollmentError> {
    let start = time::OffsetDateTime::from_unix_timestamp(from)
        .map_err(|e| EnrollmentError::Ca(e.to_string()))?;
    let end = start
        + time::Duration::try_from(lifetime).map_err(|e| EnrollmentError::Ca(e.to_string()))?;
    Ok((start, end))
}

/// An rcgen error as [`EnrollmentError::Ca`].
pub(super) fn ca_error(e: rcgen::Error) -> EnrollmentError {
    EnrollmentError::Ca(e.to_string())
}
