//! Answer CAs: CAs the site CA issues for the gateway's answer keys alone, so that an
//! enrolled agent can trust answers from them and from nothing else the site CA issued.
//!
//! An answer CA is a CA certificate (basic constraints CA with path length 0, key usage
//! keyCertSign, extended key usage serverAuth, a name constraint permitting the one DNS
//! name [`ANSWER_SIGNER_NAME`]: a technically constrained CA),
//! issued by the site CA, with an ECDSA P-256 key kept beside the site CA's in its Secret.
//! Each replica issues itself a fresh answer key from the first answer CA at start (the
//! key never leaves the process); agents learn the answer CAs from every certificate
//! answer (`IssuedCertificate.answer_cas`) and then verify answers against them alone
//! (`edgebeat_transports::signing::AnswerVerifier::pinned`).
//!
//! **Rotation** (`edgebeat-gateway answer-ca rotate`, README "Rotating the answer CA"): the
//! first run adds a second answer CA behind the first: replicas keep signing with the first
//! and name both, so every agent that rotates or enrolls meanwhile learns the new one. The
//! second run retires the first: replicas restarted then sign with the new one and name it
//! alone, and agents drop the old one at their next certificate answer. Between the two,
//! answers from either are taken: that is the overlap.

use std::time::Duration;

use edgebeat_transports::signing::ANSWER_SIGNER_NAME;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};

use super::EnrollmentError;
use super::x509::{GatewayIdentity, IssuingCa, ca_error, validity};

/// Validity of an answer CA: 10 years, as the site CA's.
const ANSWER_CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Validity of the answer key's certificate a replica issues itself at start (its key
/// lives in memory only and dies with the process): 5 years.
const ANSWER_KEY_LIFETIME: Duration = Duration::from_secs(5 * 365 * 24 * 3600);

/// One answer CA with its key.
#[derive(Debug)]
pub struct AnswerCa {
    /// Its certificate and key.
    pub ca: IssuingCa,
}

impl AnswerCa {
    /// A new answer CA issued by `site` (the site CA's issuer), CN=`edgebeat answer CA`,
    /// valid 10 years from an hour before `now` (Unix seconds).
    ///
    /// Errors: [`EnrollmentError::Ca`] when rcgen cannot make it.
    pub fn generate(site: &Issuer<'static, KeyPair>, now: i64) -> Result<Self, EnrollmentError> {
        let key = KeyPair::generate().map_err(ca_error)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(ca_error)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "edgebeat answer CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        // Every certificate of an answer's chain must carry serverAuth (the agent requires
        // it, not merely allows it), the CA included: a technically constrained CA.
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: vec![GeneralSubtree::DnsName(ANSWER_SIGNER_NAME.to_owned())],
            excluded_subtrees: Vec::new(),
        });
        params.use_authority_key_identifier_extension = true;
        let (not_before, not_after) = validity(now - 3600, ANSWER_CA_LIFETIME)?;
        params.not_before = not_before;
        params.not_after = not_after;
        let cert = params.signed_by(&key, site).map_err(ca_error)?;
        Self::from_pem(&cert.pem(), &key.serialize_pem())
    }

    /// The answer CA of a certificate and key, both PEM.
    ///
    /// Errors: [`EnrollmentError::Ca`] when either does not parse or the certificate is not
    /// a CA's.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, EnrollmentError> {
        Ok(Self {
            ca: IssuingCa::from_pem(cert_pem, key_pem)?,
        })
    }

    /// A certificate for a gateway replica, issued now by this answer CA: a fresh P-256 key
    /// that never leaves the process, a server certificate (extended key usage serverAuth)
    /// for the DNS name [`ANSWER_SIGNER_NAME`], valid 5 years from 5 minutes before `now`;
    /// its PEM is the chain, this answer CA after it.
    ///
    /// Errors: [`EnrollmentError::Ca`] when it cannot be made.
    pub fn issue_answer_key(&self, now: i64) -> Result<GatewayIdentity, EnrollmentError> {
        let key = KeyPair::generate().map_err(ca_error)?;
        let mut params =
            CertificateParams::new(vec![ANSWER_SIGNER_NAME.to_owned()]).map_err(ca_error)?;
        params
            .distinguished_name
            .push(DnType::CommonName, ANSWER_SIGNER_NAME);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let (not_before, not_after) = validity(now - 300, ANSWER_KEY_LIFETIME)?;
        params.not_before = not_before;
        params.not_after = not_after;
        let cert = params.signed_by(&key, &self.ca.issuer).map_err(ca_error)?;
        Ok(GatewayIdentity {
            cert_pem: format!("{}{}", cert.pem(), self.ca.cert_pem),
            key_pem: key.serialize_pem(),
        })
    }
}

/// The answer CAs of two PEM bundles (certificates, keys), in order.
///
/// Errors: [`EnrollmentError::Ca`] when the bundles do not parse or do not pair up.
pub fn from_bundles(certs_pem: &str, keys_pem: &str) -> Result<Vec<AnswerCa>, EnrollmentError> {
    let blocks = |pem: &str, label: &str| -> Vec<String> {
        let end = format!("-----END {label}-----");
        pem.split_inclusive(end.as_str())
            .filter(|block| block.contains(&end))
            .map(|block| format!("{}\n", block.trim()))
            .collect()
    };
    let certs = blocks(certs_pem, "CERTIFICATE");
    let keys = blocks(keys_pem, "PRIVATE KEY");
    if certs.is_empty() || certs.len() != keys.len() {
        return Err(EnrollmentError::Ca(format!(
            "{} answer CA certificates for {} keys",
            certs.len(),
            keys.len()
        )));
    }
    certs
        .iter()
        .zip(&keys)
        .map(|(cert, key)| AnswerCa::from_pem(cert, key))
        .collect()
}
