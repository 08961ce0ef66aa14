//! The PKCS#10 request: its checks (subject, names, usages, key) and the name of its
//! CertificateSigningRequest.

use edgebeat_transports::enroll;

use super::rejection::{CsrRejectReason, CsrRejection, reject};

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
pub(super) fn check_csr(csr_der: &[u8], node: &str) -> Result<rcgen::PublicKey, CsrRejection> {
    use x509_parser::prelude::FromDer as _;
    let (_, parsed) =
        x509_parser::certification_request::X509CertificationRequest::from_der(csr_der)
            .map_err(|e| reject(CsrRejectReason::Csr, format!("the CSR does not parse: {e}")))?;
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
            edgebeat_transports::tls::node_user(node),
        ),
    ];
    let mut sorted = subject.clone();
    sorted.sort();
    let mut expected = wanted.to_vec();
    expected.sort();
    if sorted != expected {
        return Err(reject(
            CsrRejectReason::CsrSubject,
            format!(
                "the CSR's subject must be exactly O={}, CN={}, not {subject:?}",
                edgebeat_transports::tls::NODES_GROUP,
                edgebeat_transports::tls::node_user(node),
            ),
        ));
    }
    let request = rcgen::CertificateSigningRequestParams::from_der(&csr_der.to_vec().into())
        .map_err(|e| {
            reject(
                CsrRejectReason::Csr,
                format!("the CSR does not verify: {e}"),
            )
        })?;
    if !request.params.subject_alt_names.is_empty() {
        return Err(reject(
            CsrRejectReason::CsrNames,
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
        return Err(reject(
            CsrRejectReason::CsrUsages,
            "the CSR asks for usages beyond digital signature and client auth",
        ));
    }
    let alg = request.public_key.algorithm();
    if alg != &rcgen::PKCS_ECDSA_P256_SHA256 && alg != &rcgen::PKCS_ED25519 {
        return Err(reject(
            CsrRejectReason::CsrKey,
            "the CSR's key is neither ECDSA P-256 nor Ed25519",
        ));
    }
    Ok(request.public_key)
}
