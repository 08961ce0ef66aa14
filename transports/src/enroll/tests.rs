#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

struct Site {
    ca_der: Vec<u8>,
    ca_pem: String,
    ca_key_spki: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
}

fn site() -> Site {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "edgebeat site CA");
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Site {
        ca_der: cert.der().to_vec(),
        ca_pem: cert.pem(),
        ca_key_spki: {
            use rcgen::PublicKeyData as _;
            key.subject_public_key_info()
        },
        issuer: Issuer::new(params, key),
    }
}

fn header(seq: u64) -> Header {
    Header {
        node_name: "plant-3-01".into(),
        boot_id: vec![7; 16],
        seq,
        wall_time_ms: 1_800_000_000_000,
        boot_tag: 0,
    }
}

#[test]
fn tokens_read_back_as_written_and_bad_ones_say_why() {
    let token = BootstrapToken::new("abcdef", "0123456789abcdef", [0xab; 32]).unwrap();
    let text = token.to_string();
    assert_eq!(
        text,
        format!("abcdef.0123456789abcdef.sha256:{}", "ab".repeat(32))
    );
    assert_eq!(
        format!("{text}\n").parse::<BootstrapToken>(),
        Ok(token.clone())
    );
    assert!(
        !format!("{token:?}").contains("0123456789abcdef"),
        "secret not in Debug"
    );
    let pin = "00".repeat(32);
    for (bad, why) in [
        ("abcdef.0123456789abcdef".to_owned(), "three parts"),
        (format!("abcde.0123456789abcdef.sha256:{pin}"), "id"),
        (format!("ABCDEF.0123456789abcdef.sha256:{pin}"), "id"),
        (format!("abcdef.0123456789abcde.sha256:{pin}"), "secret"),
        (format!("abcdef.0123456789abcdef.md5:{pin}"), "sha256:"),
        ("abcdef.0123456789abcdef.sha256:00".to_owned(), "64 hex"),
    ] {
        let err = bad.parse::<BootstrapToken>().unwrap_err().to_string();
        assert!(err.contains(why), "{bad}: {err}");
    }
}

#[test]
fn a_token_proof_binds_node_csr_time_and_sequence() {
    let secret = b"0123456789abcdef";
    let proof = token_proof(secret, &header(5), b"csr");
    assert!(verify_token_proof(secret, &header(5), b"csr", &proof));
    assert!(!verify_token_proof(
        b"0123456789abcdeg",
        &header(5),
        b"csr",
        &proof
    ));
    assert!(!verify_token_proof(secret, &header(6), b"csr", &proof));
    assert!(!verify_token_proof(secret, &header(5), b"CSR", &proof));
    let mut other_node = header(5);
    other_node.node_name = "plant-4-01".into();
    assert!(!verify_token_proof(secret, &other_node, b"csr", &proof));
    let mut later = header(5);
    later.wall_time_ms += 1;
    assert!(!verify_token_proof(secret, &later, b"csr", &proof));
}

/// The pin is kubeadm's discovery hash: SHA-256 of the CA's DER SubjectPublicKeyInfo.
#[test]
fn the_pin_is_the_hash_of_the_ca_public_key_info() {
    let site = site();
    let expected = ring::digest::digest(&ring::digest::SHA256, &site.ca_key_spki);
    assert_eq!(ca_pin(&site.ca_der).unwrap().as_slice(), expected.as_ref());
    assert!(matches!(ca_pin(b"junk"), Err(EnrollError::Certificate(_))));
}

/// The request parses as PKCS#10 with kubelet's subject, this key, and a signature that
/// verifies: what the gateway and a Kubernetes signer check.
#[test]
fn a_certificate_request_is_kubelets_pkcs10() {
    use x509_parser::prelude::FromDer as _;
    let key = NodeKeyPair::generate().unwrap();
    let csr = key.certificate_request("plant-3-01").unwrap();
    let (rest, parsed) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&csr).unwrap();
    assert!(rest.is_empty());
    let info = &parsed.certification_request_info;
    assert_eq!(
        info.subject.to_string(),
        "O=system:nodes, CN=system:node:plant-3-01"
    );
    assert_eq!(
        info.subject_pki.subject_public_key.data.as_ref(),
        key.public_key()
    );
    ring::signature::UnparsedPublicKey::new(
        &ring::signature::ECDSA_P256_SHA256_ASN1,
        key.public_key(),
    )
    .verify(info.raw, parsed.signature_value.data.as_ref())
    .unwrap();
    // The key round-trips through its PEM.
    let pem = key.to_pem();
    let der = crate::tls::parse_private_key(pem.as_bytes()).unwrap();
    let again = NodeKeyPair::from_pkcs8(der.secret_der()).unwrap();
    assert_eq!(again.public_key(), key.public_key());
}

fn answer_signer(site: &Site) -> crate::signing::AnswerSigner {
    let mut params =
        CertificateParams::new(vec![crate::signing::ANSWER_SIGNER_NAME.to_owned()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &site.issuer).unwrap();
    crate::signing::AnswerSigner::from_pem(
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
        site.ca_pem.as_bytes(),
    )
    .unwrap()
}

fn issued(site: &Site, seq: u64) -> edgebeat_proto::GatewayMessage {
    edgebeat_proto::GatewayMessage {
        kind: Some(edgebeat_proto::gateway_message::Kind::Certificate(
            edgebeat_proto::IssuedCertificate {
                seq,
                node_name: "plant-3-01".into(),
                boot_tag: 9,
                certificate_chain: vec![b"leaf".to_vec(), site.ca_der.clone()],
                answer_cas: Vec::new(),
            },
        )),
    }
}

#[test]
fn a_granted_answer_is_read_by_pin_or_by_ca_and_only_for_its_request() {
    let (site, other) = (site(), site());
    let signer = answer_signer(&site);
    let now = rustls::pki_types::UnixTime::now();
    let pin = ca_pin(&site.ca_der).unwrap();
    let payload = signer.seal(&issued(&site, 5)).unwrap();
    let expected = Answered::Issued {
        chain: vec![b"leaf".to_vec(), site.ca_der.clone()],
        ca: site.ca_der.clone(),
        answer_cas: Vec::new(),
    };
    let read = |trust, seq| read_answer(&payload, trust, "plant-3-01", 9, seq, now);
    assert_eq!(read(AnswerTrust::Pin(pin), 5), Ok(expected.clone()));
    assert_eq!(
        read(AnswerTrust::Ca(site.ca_pem.as_bytes()), 5),
        Ok(expected)
    );
    assert_eq!(
        read(AnswerTrust::Pin([0; 32]), 5),
        Err(ReadAnswerError::NotPinned),
        "another CA"
    );
    assert_eq!(
        read(AnswerTrust::Pin(pin), 6),
        Err(ReadAnswerError::OtherRequest),
        "another request"
    );
    // Another site's gateway signing an answer that names this site's CA: refused.
    let forged = answer_signer(&other).seal(&issued(&site, 5)).unwrap();
    assert!(matches!(
        read_answer(&forged, AnswerTrust::Pin(pin), "plant-3-01", 9, 5, now),
        Err(ReadAnswerError::Unverified(
            crate::signing::AnswerError::Certificate(_)
        ))
    ));
    // A refusal reads as such once the CA is known; before, it cannot be verified.
    let mut ack = edgebeat_proto::Answer::Rejected {
        reason: "token used up".into(),
    }
    .into_ack(5);
    ack.node_name = "plant-3-01".into();
    ack.boot_tag = 9;
    let refused = signer
        .seal(&edgebeat_proto::GatewayMessage {
            kind: Some(edgebeat_proto::gateway_message::Kind::Ack(ack)),
        })
        .unwrap();
    assert_eq!(
        read_answer(
            &refused,
            AnswerTrust::Ca(site.ca_pem.as_bytes()),
            "plant-3-01",
            9,
            5,
            now
        ),
        Ok(Answered::Rejected("token used up".into()))
    );
    assert!(matches!(
        read_answer(&refused, AnswerTrust::Pin(pin), "plant-3-01", 9, 5, now),
        Ok(Answered::Pending(_))
    ));
}

/// A TLS client that knows only the pin accepts a server whose chain holds the pinned CA,
/// and no other.
#[test]
fn a_pinned_client_trusts_only_a_server_of_the_pinned_ca() {
    use std::sync::Arc;
    let handshake = |site: &Site, pin: [u8; 32]| {
        let mut params = CertificateParams::new(vec!["broker.plant".to_owned()]).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().unwrap();
        let leaf = params.signed_by(&key, &site.issuer).unwrap();
        let chain = vec![
            CertificateDer::from(leaf.der().to_vec()),
            CertificateDer::from(site.ca_der.clone()),
        ];
        let server_key = crate::tls::parse_private_key(key.serialize_pem().as_bytes()).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, server_key)
        .unwrap();
        let mut server = rustls::ServerConnection::new(Arc::new(server)).unwrap();
        let mut client = rustls::ClientConnection::new(
            Arc::new(PinnedCaVerifier::client_config(pin).unwrap()),
            rustls::pki_types::ServerName::try_from("broker.plant").unwrap(),
        )
        .unwrap();
        for _ in 0..10 {
            let mut wire = Vec::new();
            client.write_tls(&mut wire).unwrap();
            server.read_tls(&mut wire.as_slice()).unwrap();
            server.process_new_packets().map_err(|e| e.to_string())?;
            let mut wire = Vec::new();
            server.write_tls(&mut wire).unwrap();
            client.read_tls(&mut wire.as_slice()).unwrap();
            client.process_new_packets().map_err(|e| e.to_string())?;
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        Err("handshake did not finish".to_owned())
    };
    let site = site();
    let pin = ca_pin(&site.ca_der).unwrap();
    assert_eq!(handshake(&site, pin), Ok(()));
    let err = handshake(&site, [1; 32]).unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
}

/// The validity read from the DER is the certificate's, for UTCTime and GeneralizedTime.
#[test]
fn certificate_validity_is_read_from_the_der() {
    let site = site();
    for (before, after) in [
        ((2024, 3, 1), (2026, 11, 25)),
        ((2049, 12, 31), (2051, 1, 2)),
    ] {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.not_before = rcgen::date_time_ymd(before.0, before.1, before.2);
        params.not_after = rcgen::date_time_ymd(after.0, after.1, after.2);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &site.issuer).unwrap();
        let (nb, na) = certificate_validity(cert.der()).unwrap();
        assert_eq!(nb, params.not_before.unix_timestamp());
        assert_eq!(na, params.not_after.unix_timestamp());
    }
    assert_eq!(certificate_validity(b"junk"), None);
}

/// An answer CA of `site`, as the gateway makes one (path length 0, the one name), its
/// certificate (DER, PEM) and issuer.
fn answer_ca(site: &Site) -> (Vec<u8>, String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params
        .distinguished_name
        .push(DnType::CommonName, "edgebeat answer CA");
    params.name_constraints = Some(rcgen::NameConstraints {
        permitted_subtrees: vec![rcgen::GeneralSubtree::DnsName(
            crate::signing::ANSWER_SIGNER_NAME.to_owned(),
        )],
        excluded_subtrees: Vec::new(),
    });
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &site.issuer).unwrap();
    (cert.der().to_vec(), cert.pem(), Issuer::new(params, key))
}

/// A signer of answers whose certificate `issuer` issues for `names` with `usages`, valid
/// until the start of `until_year`; its chain is that certificate then `chain_tail` (PEM).
/// Not checked as the gateway checks its own: forgeries are made with it too.
fn signer_from(
    issuer: &Issuer<'static, KeyPair>,
    names: &[&str],
    usages: Vec<ExtendedKeyUsagePurpose>,
    until_year: i32,
    chain_tail: &str,
) -> crate::signing::AnswerSigner {
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    params.extended_key_usages = usages;
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(until_year, 1, 1);
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    crate::signing::AnswerSigner::unchecked(
        format!("{}{chain_tail}", cert.pem()).as_bytes(),
        key.serialize_pem().as_bytes(),
    )
    .unwrap()
}

/// Unix time at the start of `year` (UTC).
fn year(year: i32) -> rustls::pki_types::UnixTime {
    let days = (1970..year)
        .map(|y| {
            if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 {
                366
            } else {
                365
            }
        })
        .sum::<u64>();
    rustls::pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(days * 86_400))
}

fn ack_for(seq: u64) -> edgebeat_proto::GatewayMessage {
    let mut ack = edgebeat_proto::Answer::NodeNotFound {
        reason: "gone".into(),
    }
    .into_ack(seq);
    ack.node_name = "plant-3-01".into();
    ack.boot_tag = 9;
    edgebeat_proto::GatewayMessage {
        kind: Some(edgebeat_proto::gateway_message::Kind::Ack(ack)),
    }
}

/// The three certificates the site CA might issue with the gateway's name, refused as
/// answer keys by an agent that learnt its answer CAs, each counted; a key from the answer
/// CA taken. Trusting the site CA alone (an agent that learnt none), serverAuth is now
/// required: a certificate without extended key usage no longer signs an answer.
#[test]
fn only_a_key_from_an_answer_ca_signs_answers() {
    use crate::signing::{ANSWER_SIGNER_NAME, AnswerError, AnswerRefusals, AnswerVerifier};
    use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    let site = site();
    let (answer_ca_der, answer_ca_pem, answer_issuer) = answer_ca(&site);
    let refusals = std::sync::Arc::new(AnswerRefusals::default());
    let pinned = AnswerVerifier::pinned(std::slice::from_ref(&answer_ca_der))
        .unwrap()
        .counting(refusals.clone());
    let by_site_ca = AnswerVerifier::from_pem(site.ca_pem.as_bytes()).unwrap();
    let now = year(2026);
    let message = ack_for(5);
    let forged = [
        ("serverAuth", vec![ServerAuth]),
        ("no extended key usage", vec![]),
        ("a node's clientAuth", vec![ClientAuth]),
    ];
    for (what, usages) in forged {
        let signer = signer_from(
            &site.issuer,
            &[ANSWER_SIGNER_NAME],
            usages.clone(),
            2040,
            "",
        );
        let payload = signer.seal(&message).unwrap();
        let refused = pinned.verify(&payload, now);
        assert!(
            matches!(refused, Err(AnswerError::Certificate(_))),
            "{what}: {refused:?}"
        );
        let legacy = by_site_ca.verify(&payload, now);
        if usages == [ServerAuth] {
            assert_eq!(
                legacy,
                Ok(message.clone()),
                "the site CA's own serverAuth key"
            );
        } else {
            assert!(
                matches!(legacy, Err(AnswerError::Certificate(_))),
                "{what}: {legacy:?}"
            );
        }
    }
    assert_eq!(
        refusals.counts(),
        [0, 3, 0, 0],
        "each refusal counted as `certificate`"
    );
    // The real answer key: from the answer CA, with the CA in its chain, so that an agent
    // trusting the site CA verifies it too.
    let real = signer_from(
        &answer_issuer,
        &[ANSWER_SIGNER_NAME],
        vec![ServerAuth],
        2040,
        &answer_ca_pem,
    );
    let payload = real.seal(&message).unwrap();
    assert_eq!(pinned.verify(&payload, now), Ok(message.clone()));
    assert_eq!(by_site_ca.verify(&payload, now), Ok(message.clone()));
    // The answer CA issues for the gateway's name alone (its name constraint).
    let elsewhere = signer_from(
        &answer_issuer,
        &["gateway.example"],
        vec![ServerAuth],
        2040,
        "",
    );
    assert!(matches!(
        pinned.verify(&elsewhere.seal(&message).unwrap(), now),
        Err(AnswerError::Certificate(_))
    ));
    assert_eq!(refusals.counts(), [0, 4, 0, 0]);
}

/// A certificate answer names the answer CAs, and an agent keeps them: through a rotation
/// (a second CA added, then the first retired) answers from both are taken during the
/// overlap, and after it only the new one's. A certificate answer that names the site CA
/// itself, or CAs that did not issue its own key, is refused.
#[test]
fn answer_cas_rotate_with_an_overlap() {
    use crate::signing::{ANSWER_SIGNER_NAME, AnswerError, AnswerVerifier};
    use ExtendedKeyUsagePurpose::ServerAuth;
    let site = site();
    let (a_der, a_pem, a_issuer) = answer_ca(&site);
    let (b_der, b_pem, b_issuer) = answer_ca(&site);
    let by_a = signer_from(
        &a_issuer,
        &[ANSWER_SIGNER_NAME],
        vec![ServerAuth],
        2040,
        &a_pem,
    );
    let by_b = signer_from(
        &b_issuer,
        &[ANSWER_SIGNER_NAME],
        vec![ServerAuth],
        2040,
        &b_pem,
    );
    let now = year(2026);
    let naming = |seq, answer_cas: &[&Vec<u8>]| {
        let mut message = issued(&site, seq);
        if let Some(edgebeat_proto::gateway_message::Kind::Certificate(c)) = message.kind.as_mut() {
            c.answer_cas = answer_cas.iter().map(|d| (*d).clone()).collect();
        }
        message
    };
    let learnt = |payload: &[u8], trust| match read_answer(payload, trust, "plant-3-01", 9, 5, now)
    {
        Ok(Answered::Issued { answer_cas, .. }) => Ok(answer_cas),
        other => Err(other),
    };
    // Enrollment (the token's pin) by a replica signing with A, which names A alone.
    let pin = ca_pin(&site.ca_der).unwrap();
    let enrolled = by_a.seal(&naming(5, &[&a_der])).unwrap();
    assert_eq!(
        learnt(&enrolled, AnswerTrust::Pin(pin)),
        Ok(vec![a_der.clone()])
    );
    // Rotation, step 1: B added behind A. A rotation answer signed with A names both.
    let known = vec![a_der.clone()];
    let both = by_a.seal(&naming(5, &[&a_der, &b_der])).unwrap();
    let known = learnt(&both, AnswerTrust::AnswerCas(&known)).unwrap();
    assert_eq!(known, vec![a_der.clone(), b_der.clone()]);
    // The overlap: replicas still on A and replicas already on B are both taken.
    let overlap = AnswerVerifier::pinned(&known).unwrap();
    let ack = ack_for(6);
    assert_eq!(
        overlap.verify(&by_a.seal(&ack).unwrap(), now),
        Ok(ack.clone())
    );
    assert_eq!(
        overlap.verify(&by_b.seal(&ack).unwrap(), now),
        Ok(ack.clone())
    );
    // Step 2: A retired. An answer signed with B names B alone; A is refused after it.
    let retired = by_b.seal(&naming(5, &[&b_der])).unwrap();
    let known = learnt(&retired, AnswerTrust::AnswerCas(&known)).unwrap();
    assert_eq!(known, vec![b_der.clone()]);
    let after = AnswerVerifier::pinned(&known).unwrap();
    assert!(matches!(
        after.verify(&by_a.seal(&ack).unwrap(), now),
        Err(AnswerError::Certificate(_))
    ));
    assert_eq!(
        after.verify(&by_b.seal(&ack).unwrap(), now),
        Ok(ack.clone())
    );
    // A replica's own key rotates too (a new one at each start): the old one is taken
    // until its certificate expires, and refused after.
    let old_key = signer_from(
        &b_issuer,
        &[ANSWER_SIGNER_NAME],
        vec![ServerAuth],
        2027,
        &b_pem,
    );
    let sealed = old_key.seal(&ack).unwrap();
    assert_eq!(after.verify(&sealed, year(2026)), Ok(ack.clone()));
    assert!(matches!(
        after.verify(&sealed, year(2028)),
        Err(AnswerError::Certificate(_))
    ));
    // A key the site CA issued directly cannot name answer CAs: not the site CA itself,
    // nor one that did not issue it.
    let direct = signer_from(
        &site.issuer,
        &[ANSWER_SIGNER_NAME],
        vec![ServerAuth],
        2040,
        "",
    );
    for named in [&site.ca_der, &a_der] {
        let forged = direct.seal(&naming(5, &[named])).unwrap();
        let read = learnt(&forged, AnswerTrust::Pin(pin));
        assert!(
            matches!(
                read,
                Err(Err(
                    ReadAnswerError::Malformed(_) | ReadAnswerError::Unverified(_)
                ))
            ),
            "{read:?}"
        );
    }
}
