#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384, PKCS_ED25519, SignatureAlgorithm,
};
use rustls::pki_types::UnixTime;

use super::*;

struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca() -> Pki {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "edgebeat test site CA");
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Pki {
        ca_pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

fn node(pki: &Pki, name: &str, alg: &'static SignatureAlgorithm) -> (String, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{name}"));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate_for(alg).unwrap();
    let cert = params.signed_by(&key, &pki.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn now() -> UnixTime {
    UnixTime::now()
}

#[test]
fn signed_messages_verify_and_tampering_does_not() {
    let pki = ca();
    let verifier = CertificateVerifier::from_pem(pki.ca_pem.as_bytes()).unwrap();
    for alg in [&PKCS_ECDSA_P256_SHA256, &PKCS_ED25519] {
        let (cert, key) = node(&pki, "edge-1", alg);
        let signer = MessageSigner::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let node_key = verifier
            .verify("edge-1", signer.certificate(), now())
            .unwrap();
        assert_eq!(node_key.node(), "edge-1");
        let payload = signer.seal(b"an encoded AgentMessage".to_vec()).unwrap();
        let (message, signature) = unseal(&payload).unwrap();
        assert_eq!(message, b"an encoded AgentMessage");
        node_key.verify(&message, &signature, now()).unwrap();
        let mut tampered = message.clone();
        tampered[0] ^= 1;
        assert_eq!(
            node_key.verify(&tampered, &signature, now()),
            Err(SignatureError::BadSignature),
            "{alg:?}"
        );
        // The context is part of what is signed: the bare message does not verify.
        let bare = signer.signer.sign(&message).unwrap();
        assert_eq!(
            node_key.verify(&message, &bare, now()),
            Err(SignatureError::BadSignature)
        );
        let overhead = payload.len() - message.len();
        assert!(
            overhead <= 76,
            "{alg:?}: {overhead} bytes of signature framing"
        );
    }
}

#[test]
fn plain_messages_are_not_signed_messages() {
    let plain = edgebeat_proto::AgentMessage {
        kind: Some(edgebeat_proto::agent_message::Kind::Lease(
            edgebeat_proto::LeaseRenewal::default(),
        )),
    };
    assert_eq!(unseal(&plain.encode_to_vec()), None);
    assert_eq!(unseal(b"\xff\xff"), None);
    let signed = SignedMessage {
        signed_message: plain.encode_to_vec(),
        signature: vec![1; 64],
    };
    let decoded = edgebeat_proto::AgentMessage::decode(signed.encode_to_vec().as_slice());
    assert_eq!(
        decoded.map(|m| m.kind),
        Ok(None),
        "never mistaken for a plain message"
    );
}

#[test]
fn certificates_are_checked_against_the_site_ca_and_the_topic_node() {
    let pki = ca();
    let verifier = CertificateVerifier::from_pem(pki.ca_pem.as_bytes()).unwrap();
    let (cert, key) = node(&pki, "edge-1", &PKCS_ECDSA_P256_SHA256);
    let signer = MessageSigner::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let refused = |r: Result<NodeKey, SignatureError>| match r {
        Err(SignatureError::Certificate(why)) => why,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(
        refused(verifier.verify("edge-2", signer.certificate(), now()))
            .contains("published for node \"edge-2\"")
    );
    let other_site = ca();
    let (cert, key) = node(&other_site, "edge-1", &PKCS_ECDSA_P256_SHA256);
    let foreign = MessageSigner::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let why = refused(verifier.verify("edge-1", foreign.certificate(), now()));
    // Same CA name, other key: found by name, refused by signature.
    assert!(why.contains("invalid peer certificate"), "{why}");
    // Past notAfter (rcgen's default validity ends in 4096).
    let later = UnixTime::since_unix_epoch(Duration::from_secs(4_200_000_000 * 30));
    let why = refused(verifier.verify("edge-1", signer.certificate(), later));
    assert!(why.contains("certificate expired"), "{why}");
    assert!(refused(verifier.verify("edge-1", b"junk", now())).contains("NodeCertificate"));
    assert!(refused(verifier.verify("edge-1", &[], now())).contains("empty"));
}

#[test]
fn a_key_past_its_not_after_stops_verifying() {
    let pki = ca();
    let verifier = CertificateVerifier::from_pem(pki.ca_pem.as_bytes()).unwrap();
    let (cert, key) = node(&pki, "edge-1", &PKCS_ED25519);
    let signer = MessageSigner::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let node_key = verifier
        .verify("edge-1", signer.certificate(), now())
        .unwrap();
    let payload = signer.seal(b"m".to_vec()).unwrap();
    let (message, signature) = unseal(&payload).unwrap();
    let after = UnixTime::since_unix_epoch(Duration::from_secs(
        u64::try_from(node_key.not_after()).unwrap() + 1,
    ));
    assert_eq!(
        node_key.verify(&message, &signature, after),
        Err(SignatureError::Expired)
    );
}

#[test]
fn keys_that_cannot_sign_compactly_are_refused_with_the_fix() {
    let pki = ca();
    let (cert, key) = node(&pki, "edge-1", &PKCS_ECDSA_P384_SHA384);
    let err = MessageSigner::from_pem(cert.as_bytes(), key.as_bytes()).unwrap_err();
    assert!(
        matches!(&err, TlsError::In { part: "key", source } if matches!(**source, TlsError::UnsupportedKey { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("ECDSA P-256"), "{err}");
    let err = MessageSigner::from_pem(b"junk", key.as_bytes()).unwrap_err();
    assert!(err.to_string().starts_with("certificate: "), "{err}");
}
