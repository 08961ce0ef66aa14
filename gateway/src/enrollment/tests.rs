#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::csr::check_csr;
use super::*;
use edgebeat_proto::NodeCertificate;
use edgebeat_transports::enroll::NodeKeyPair;
use prost::Message as _;
use rustls::pki_types::UnixTime;

#[test]
fn a_node_request_passes_and_its_csr_name_is_the_keys() {
    let key = NodeKeyPair::generate().unwrap();
    let csr = key.certificate_request("plant-3-01").unwrap();
    check_csr(&csr, "plant-3-01").unwrap();
    let name = csr_name(&csr, "plant-3-01");
    assert!(name.starts_with("edgebeat-") && name.len() == "edgebeat-".len() + 32);
    // The same key asks again: the same CSR object; another node or key: another one.
    let again = key.certificate_request("plant-3-01").unwrap();
    assert_eq!(csr_name(&again, "plant-3-01"), name);
    assert_ne!(csr_name(&csr, "plant-3-02"), name);
    let other = NodeKeyPair::generate().unwrap();
    assert_ne!(
        csr_name(
            &other.certificate_request("plant-3-01").unwrap(),
            "plant-3-01"
        ),
        name
    );
}

/// A request for another node, other names, other usages, or with a broken signature is
/// rejected, naming why.
#[test]
fn requests_asking_for_more_are_rejected() {
    let key = NodeKeyPair::generate().unwrap();
    let csr = key.certificate_request("plant-3-01").unwrap();
    assert_eq!(
        check_csr(&csr, "plant-4-01").unwrap_err().reason,
        CsrRejectReason::CsrSubject
    );
    let mut broken = csr.clone();
    let last = broken.len() - 1;
    broken[last] ^= 1;
    let rejected = check_csr(&broken, "plant-3-01").unwrap_err();
    assert!(
        rejected.reason == CsrRejectReason::Csr
            && rejected.detail.starts_with("the CSR does not verify"),
        "{:?}: {}",
        rejected.reason,
        rejected.detail
    );
    // rcgen's requests, with what a node may not ask for.
    let rcgen_key = rcgen::KeyPair::generate().unwrap();
    let request = |edit: &dyn Fn(&mut rcgen::CertificateParams)| {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:plant-3-01");
        edit(&mut params);
        params.serialize_request(&rcgen_key).unwrap().der().to_vec()
    };
    check_csr(&request(&|_| {}), "plant-3-01").unwrap();
    let names = request(&|p| {
        p.subject_alt_names = vec![rcgen::SanType::DnsName(
            "kube-apiserver".try_into().unwrap(),
        )]
    });
    assert_eq!(
        check_csr(&names, "plant-3-01").unwrap_err().reason,
        CsrRejectReason::CsrNames
    );
    let usages =
        request(&|p| p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth]);
    assert_eq!(
        check_csr(&usages, "plant-3-01").unwrap_err().reason,
        CsrRejectReason::CsrUsages
    );
    let masters = request(&|p| {
        p.distinguished_name
            .push(rcgen::DnType::OrganizationalUnitName, "system:masters")
    });
    assert_eq!(
        check_csr(&masters, "plant-3-01").unwrap_err().reason,
        CsrRejectReason::CsrSubject
    );
}

/// The site CA signs a node certificate that the site CA's verifier takes as the node's
/// identity, and its answer key verifies as agents check it.
#[test]
fn the_site_ca_signs_node_certificates_and_its_answer_key() {
    let now = 1_800_000_000;
    let ca = SiteCa::generate(now).unwrap();
    let again = SiteCa::from_pem(&ca.ca.cert_pem, &ca.key_pem_for_tests()).unwrap();
    assert_eq!(again.ca.cert_der, ca.ca.cert_der);
    let key = NodeKeyPair::generate().unwrap();
    let csr = key.certificate_request("plant-3-01").unwrap();
    let public_key = check_csr(&csr, "plant-3-01").unwrap();
    let pem = ca
        .sign_node("plant-3-01", public_key, now, Duration::from_secs(3600))
        .unwrap();
    let chain = edgebeat_transports::tls::parse_certificates(pem.as_bytes()).unwrap();
    let verifier = CertificateVerifier::from_pem(ca.ca.cert_pem.as_bytes()).unwrap();
    let published = NodeCertificate {
        certificate_chain: vec![chain[0].to_vec()],
    }
    .encode_to_vec();
    let at = UnixTime::since_unix_epoch(Duration::from_secs(1_800_000_100));
    let node_key = verifier.verify("plant-3-01", &published, at).unwrap();
    assert_eq!(node_key.node(), "plant-3-01");
    let after = UnixTime::since_unix_epoch(Duration::from_secs(1_800_003_700 + 300));
    assert!(
        matches!(
            verifier.verify("plant-3-01", &published, after),
            Err(edgebeat_transports::signing::SignatureError::Certificate(why))
                if why.contains("expired")
        ),
        "lifetime"
    );
    // The answer key is checked as agents check it, at this moment.
    let real_now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    let mut ca = SiteCa::generate(real_now).unwrap();
    ca.answer_signer(real_now).unwrap();
    // The answer key comes from the answer CA, which travels in its chain.
    let identity = ca.gateway_identity(real_now).unwrap();
    let chain = edgebeat_transports::tls::parse_certificates(identity.cert_pem.as_bytes()).unwrap();
    assert_eq!(chain.len(), 2);
    assert_eq!(vec![chain[1].to_vec()], ca.answer_cas());
    assert_ne!(chain[1].to_vec(), ca.ca.cert_der, "not the site CA");
    // The Secret keeps the answer CAs; a rotation adds one behind, then retires the first.
    let stored = SiteCa::from_secret(&ca.to_secret()).unwrap();
    assert_eq!(stored.answer_cas(), ca.answer_cas());
    let first = ca.answer_cas();
    assert_eq!(
        ca.rotate_answer_ca(real_now).unwrap(),
        ca::AnswerCaRotation::Added
    );
    let both = ca.answer_cas();
    assert_eq!((both.len(), &both[..1]), (2, &first[..]));
    let stored = SiteCa::from_secret(&ca.to_secret()).unwrap();
    assert_eq!(stored.answer_cas(), both);
    assert_eq!(
        ca.rotate_answer_ca(real_now).unwrap(),
        ca::AnswerCaRotation::Retired
    );
    assert_eq!(ca.answer_cas(), both[1..].to_vec());
    let chain = edgebeat_transports::tls::parse_certificates(
        ca.gateway_identity(real_now).unwrap().cert_pem.as_bytes(),
    )
    .unwrap();
    assert_eq!(
        chain[1].to_vec(),
        both[1],
        "replicas now sign with the new one"
    );
}
