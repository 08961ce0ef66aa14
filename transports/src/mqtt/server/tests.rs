use super::classify::{Inbound, classify};
use super::verify::OpenError;
use super::verify::{open, open_usage};
use super::*;
use crate::ingress::{Asked, RejectReason, Rejection};
use crate::signing;
use crate::signing::{AnswerSigner, AnswerVerifier, CertificateVerifier, NodeKey};
use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{AgentMessage, Header, MessageKind};
use edgebeat_proto::{LeaseRenewal, StatusReport, agent_message::Kind};
use rustls::pki_types::UnixTime;
use std::time::Duration;

fn lease(node: &str) -> AgentMessage {
    AgentMessage {
        kind: Some(Kind::Lease(LeaseRenewal {
            header: Some(Header {
                node_name: node.into(),
                seq: 1,
                ..Header::default()
            }),
            lease_duration_seconds: 40,
            lease_state: Vec::new(),
            quiet: false,
            usage: None,
        })),
    }
}

#[test]
fn a_matching_message_is_accepted() {
    let bytes = lease("n1").encode_to_vec();
    assert_eq!(
        classify("p", b"p/nodes/n1/lease", &bytes, 1024),
        Ok(Inbound::Message {
            node: NodeName::new("n1").unwrap(),
            kind: MessageKind::Lease
        })
    );
    assert_eq!(
        open(
            "n1",
            MessageKind::Lease,
            &bytes,
            None,
            None,
            UnixTime::now()
        ),
        Ok((lease("n1"), None))
    );
    assert_eq!(
        classify("p", b"p/certificates/n1", &bytes, 1024),
        Ok(Inbound::Certificate { node: "n1" })
    );
}

#[test]
fn rejections_name_their_reason() {
    let bytes = lease("n1").encode_to_vec();
    let cases: [(&[u8], &[u8], usize, Rejection); 4] = [
        (b"p/nodes/n1/lease", &bytes, 4, REJECT_TOO_LARGE),
        (b"p/certificates/n1", &bytes, 4, REJECT_TOO_LARGE),
        (b"p/nodes/n1/bogus", &bytes, 1024, REJECT_UNKNOWN_TOPIC),
        (b"p/nodes/n1/lease/x", &bytes, 1024, REJECT_UNKNOWN_TOPIC),
    ];
    for (topic, payload, max, reason) in cases {
        assert_eq!(
            classify("p", topic, payload, max),
            Err(reason),
            "{}",
            String::from_utf8_lossy(topic)
        );
    }
    assert_eq!(
        classify("p", &[0xff], &bytes, 1024),
        Err(REJECT_UNKNOWN_TOPIC)
    );
    for bad in [&b"p/nodes/Edge_1/lease"[..], b"p/certificates/-x"] {
        assert_eq!(classify("p", bad, &bytes, 1024), Err(REJECT_MALFORMED));
    }
    let status = AgentMessage {
        kind: Some(Kind::Status(StatusReport {
            header: Some(Header {
                node_name: "n1".into(),
                ..Header::default()
            }),
            status: None,
            unchanged: false,
            journal: Vec::new(),
        })),
    }
    .encode_to_vec();
    let cases: [(&str, MessageKind, &[u8], Rejection); 5] = [
        ("n2", MessageKind::Lease, &bytes, REJECT_MISMATCH),
        ("n1", MessageKind::Status, &bytes, REJECT_MISMATCH),
        ("n1", MessageKind::Lease, &status, REJECT_MISMATCH),
        // No kind, no header (what an empty payload decodes to).
        ("n1", MessageKind::Lease, b"", REJECT_MISMATCH),
        (
            "n1",
            MessageKind::Lease,
            &[0xff, 0xff, 0xff],
            REJECT_MALFORMED,
        ),
    ];
    for (node, kind, payload, reason) in cases {
        assert_eq!(
            open(node, kind, payload, None, None, UnixTime::now()),
            Err(OpenError::silent(reason)),
            "{node}/{kind:?}"
        );
    }
}

/// A site CA (PEM) and an answer key it issued (serverAuth, valid for the gateway's name).
fn site_with_answer_key() -> (String, AnswerSigner) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "edgebeat site CA");
    let key = KeyPair::generate().unwrap();
    let ca_pem = params.self_signed(&key).unwrap().pem();
    let issuer = Issuer::new(params, key);
    let mut params = CertificateParams::new(vec![signing::ANSWER_SIGNER_NAME.to_owned()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let signer = AnswerSigner::from_pem(
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
        ca_pem.as_bytes(),
    )
    .unwrap();
    (ca_pem, signer)
}

/// Where the replicas sign, a batch is taken only signed by an answer key of the site CA:
/// a plain one is refused as unsigned, one signed by another site's answer key as a
/// certificate refused, one whose bytes were changed as a bad signature. Where nothing is
/// signed, a plain batch is taken and garbage is refused as malformed.
#[test]
fn a_shared_usage_batch_is_taken_only_signed_by_a_gateway_of_the_site() {
    let (ca_pem, signer) = site_with_answer_key();
    let (_, stranger) = site_with_answer_key();
    let verifier = AnswerVerifier::from_pem(ca_pem.as_bytes()).unwrap();
    let now = rustls::pki_types::UnixTime::now();
    let batch = edgebeat_proto::SharedUsageBatch {
        samples: vec![edgebeat_proto::SharedUsage {
            usage: Some(edgebeat_proto::ResourceUsage {
                cpu_usage_ms: 1_500,
                memory_working_set_kib: 4,
            }),
            sampled_ms: 1_790_000_000_000,
            node_name: "edge-1".into(),
        }],
    };
    let sealed = signer.seal_usage(&batch).unwrap();
    assert_eq!(
        open_usage(Some(&verifier), &sealed, now),
        Ok(batch.samples.clone())
    );
    // What a batch costs between replicas (BENCHMARKS.md, "Resource metrics"): a sample of
    // a 20-character node name with a 9-digit CPU count, and what signing adds to a batch.
    let sample = |i: u64| edgebeat_proto::SharedUsage {
        usage: Some(edgebeat_proto::ResourceUsage {
            cpu_usage_ms: 123_456_789 + i,
            memory_working_set_kib: 1_048_576,
        }),
        sampled_ms: 1_790_000_000_000,
        node_name: format!("plant-3-board-{i:06}"),
    };
    let hundred = edgebeat_proto::SharedUsageBatch {
        samples: (0..100).map(sample).collect(),
    };
    let plain = hundred.encode_to_vec().len();
    let signing = signer.seal_usage(&hundred).unwrap().len() - plain;
    println!("100 samples: {plain} B plain, {signing} B of signature and certificate chain");
    assert!(plain <= 100 * 48, "{plain} B for 100 samples");
    assert!(signing <= 1_024, "{signing} B of signature and chain");
    let reason = |payload: &[u8]| open_usage(Some(&verifier), payload, now).map_err(|r| r.reason);
    assert_eq!(reason(&batch.encode_to_vec()), Err(RejectReason::Unsigned));
    assert_eq!(
        reason(&stranger.seal_usage(&batch).unwrap()),
        Err(RejectReason::Certificate)
    );
    let mut tampered = edgebeat_proto::SignedUsage::decode(sealed.as_slice()).unwrap();
    let last = tampered.signed_batch.len() - 1;
    tampered.signed_batch[last] ^= 1;
    assert_eq!(
        reason(&tampered.encode_to_vec()),
        Err(RejectReason::BadSignature)
    );
    // An answer signature never passes for signed usage: same key, other context.
    let answer = edgebeat_proto::SignedAnswer::decode(
        signer
            .seal(&edgebeat_proto::GatewayMessage::default())
            .unwrap()
            .as_slice(),
    )
    .unwrap();
    let forged = edgebeat_proto::SignedUsage {
        signed_batch: answer.signed_message,
        signature: answer.signature,
        certificate_chain: answer.certificate_chain,
    };
    assert_eq!(
        reason(&forged.encode_to_vec()),
        Err(RejectReason::BadSignature)
    );
    assert_eq!(reason(&[0xff, 0xff, 0xff]), Err(RejectReason::Malformed));
    assert_eq!(
        open_usage(None, &batch.encode_to_vec(), now),
        Ok(batch.samples.clone())
    );
    assert_eq!(
        open_usage(None, &[0xff, 0xff, 0xff], now),
        Err(REJECT_MALFORMED)
    );
}

/// Another replica's batch is taken on `P/usage` up to 64 KiB, to be opened in the event
/// loop; one larger is rejected as too large, and the per-node topic of earlier versions
/// (`P/usage/{node}`) is no topic of the ingress.
#[test]
fn shared_usage_is_taken_from_its_topic_up_to_its_limit() {
    let bytes = vec![0u8; classify::MAX_SHARED_USAGE_BYTES];
    assert_eq!(classify("p", b"p/usage", &bytes, 1024), Ok(Inbound::Usage));
    let cases: [(&[u8], Vec<u8>, Rejection); 2] = [
        (
            b"p/usage",
            vec![0u8; classify::MAX_SHARED_USAGE_BYTES + 1],
            REJECT_TOO_LARGE,
        ),
        (b"p/usage/n1", vec![0u8; 8], REJECT_UNKNOWN_TOPIC),
    ];
    for (topic, payload, reason) in cases {
        assert_eq!(
            classify("p", topic, &payload, 1024),
            Err(reason),
            "{}",
            String::from_utf8_lossy(topic)
        );
    }
}

#[test]
fn wills_are_recognised_even_when_garbled() {
    let header = Header {
        node_name: "n1".into(),
        seq: 9,
        ..Header::default()
    };
    assert_eq!(
        classify("p", b"p/nodes/n1/will", &header.encode_to_vec(), 1024),
        Ok(Inbound::Will {
            node: "n1",
            header: Some(header)
        })
    );
    assert_eq!(
        classify("p", b"p/nodes/n1/will", &[0xff, 0xff], 1024),
        Ok(Inbound::Will {
            node: "n1",
            header: None
        })
    );
}

#[test]
fn options_are_checked_before_connecting() {
    let ok = MqttIngressOptions::new("127.0.0.1", 1883, "gw-0");
    ok.check().unwrap();
    let mut o = ok.clone();
    o.share_group = "a/b".into();
    assert!(matches!(
        o.check(),
        Err(MqttIngressError::InvalidOption {
            option: "share_group",
            ..
        })
    ));
    // The connection settings the uplink shares (mqtt::check_connection).
    let mut o = ok.clone();
    o.failover = vec![(String::new(), 1883)];
    assert!(matches!(
        o.check(),
        Err(MqttIngressError::InvalidOption {
            option: "failover",
            ..
        })
    ));
    let mut o = ok;
    o.max_packet_bytes = 0;
    assert!(matches!(
        o.check(),
        Err(MqttIngressError::InvalidOption {
            option: "max_packet_bytes",
            ..
        })
    ));
}

/// Signature policy: what is refused, with which reason and which answer.
#[test]
fn signed_messages_are_verified_before_decoding() {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf.distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    leaf.distinguished_name
        .push(DnType::CommonName, "system:node:n1");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let leaf_key = KeyPair::generate().unwrap();
    let cert_pem = leaf.signed_by(&leaf_key, &issuer).unwrap().pem();
    let signer = crate::signing::MessageSigner::from_pem(
        cert_pem.as_bytes(),
        leaf_key.serialize_pem().as_bytes(),
    )
    .unwrap();
    let verifier = CertificateVerifier::from_pem(ca_pem.as_bytes()).unwrap();
    let key = verifier
        .verify("n1", signer.certificate(), UnixTime::now())
        .unwrap();
    let required = SignaturePolicy::new(verifier, true);
    let plain = lease("n1").encode_to_vec();
    let sealed = signer.seal(plain.clone()).unwrap();
    // The test messages say wall_time_ms 0: the gateway's clock at the epoch is in the
    // clock window (and before notAfter).
    let now = UnixTime::since_unix_epoch(Duration::ZERO);
    let open_with = |payload: &[u8], policy: &SignaturePolicy, key: Option<&NodeKey>| {
        open("n1", MessageKind::Lease, payload, Some(policy), key, now)
    };
    let id = Some(key.certificate_id());
    assert_eq!(
        open_with(&sealed, &required, Some(&key)),
        Ok((lease("n1"), id))
    );
    // Nothing that fails verification is answered: a forger must not be able to make
    // the gateway speak on the node's ack topic.
    assert_eq!(
        open_with(&plain, &required, None),
        Err(OpenError::silent(REJECT_UNSIGNED))
    );
    assert_eq!(
        open_with(&plain, &required, Some(&key)),
        Err(OpenError::silent(REJECT_UNSIGNED))
    );
    // No key held: what the (unverified) message asked comes along, so that a node the
    // cluster knows can be asked for its certificate.
    let unknown = open_with(&sealed, &required, None).unwrap_err();
    assert_eq!(unknown.rejection, REJECT_UNKNOWN_SIGNER);
    assert_eq!(unknown.unverified, Some(Asked::of(&lease("n1"))));
    // Tampering: flip a bit of the signed message inside the envelope.
    let mut tampered = edgebeat_proto::SignedMessage::decode(sealed.as_slice()).unwrap();
    let last = tampered.signed_message.len() - 1;
    tampered.signed_message[last] ^= 1;
    assert_eq!(
        open_with(&tampered.encode_to_vec(), &required, Some(&key)),
        Err(OpenError::silent(REJECT_BAD_SIGNATURE))
    );
    // Random bytes where the signature goes (the forged-ack reflection attack).
    let forged = edgebeat_proto::SignedMessage {
        signed_message: plain.clone(),
        signature: vec![0x5a; 64],
    };
    assert_eq!(
        open_with(&forged.encode_to_vec(), &required, Some(&key)),
        Err(OpenError::silent(REJECT_BAD_SIGNATURE))
    );
    // A genuine signature on a message recorded 31 s ago (by the gateway's clock): a
    // replay, or a node with a wrong clock. Not answered either; the log says by how much.
    let later = UnixTime::since_unix_epoch(Duration::from_secs(31));
    let stale = open(
        "n1",
        MessageKind::Lease,
        &sealed,
        Some(&required),
        Some(&key),
        later,
    )
    .unwrap_err();
    assert_eq!(
        (stale.rejection.reason, stale.unverified),
        (REJECT_CLOCK.reason, None)
    );
    assert_eq!(
        stale.rejection.detail,
        "signed wall time is 31.0 s behind the gateway's clock, outside its ±30 s window: set this node's clock (NTP, or an RTC)"
    );
    let within = UnixTime::since_unix_epoch(Duration::from_secs(29));
    assert!(
        open(
            "n1",
            MessageKind::Lease,
            &sealed,
            Some(&required),
            Some(&key),
            within
        )
        .is_ok()
    );
    // While a fleet moves to signatures, unsigned messages pass without an identity.
    let optional = SignaturePolicy {
        required: false,
        ..required.clone()
    };
    assert_eq!(open_with(&plain, &optional, None), Ok((lease("n1"), None)));
    assert_eq!(
        open_with(&plain, &optional, Some(&key)),
        Err(OpenError::silent(REJECT_UNSIGNED)),
        "not for a node that signs"
    );
    assert_eq!(
        open_with(&sealed, &optional, Some(&key)),
        Ok((lease("n1"), id))
    );
    // A gateway that does not verify reads signed messages, without an identity.
    assert_eq!(
        open("n1", MessageKind::Lease, &sealed, None, None, now),
        Ok((lease("n1"), None))
    );
}

#[test]
fn site_uplink_notifications_are_zones_and_zero_or_one() {
    fn up<'t>(topic: &'t str, payload: &[u8]) -> Result<Inbound<'t>, Rejection> {
        classify("p", topic.as_bytes(), payload, 1024)
    }
    assert_eq!(
        up("p/sites/plant-a/uplink", b"0"),
        Ok(Inbound::Uplink {
            site: "plant-a",
            up: Some(false)
        })
    );
    assert_eq!(
        up("p/sites/eu-west/plant.a_1/uplink", b"1"),
        Ok(Inbound::Uplink {
            site: "eu-west/plant.a_1",
            up: Some(true)
        })
    );
    // A retained state cleared.
    assert_eq!(
        up("p/sites/plant-a/uplink", b""),
        Ok(Inbound::Uplink {
            site: "plant-a",
            up: None
        })
    );
    for (topic, payload) in [
        ("p/sites/plant-a/uplink", &b"up"[..]),
        ("p/sites/plant-a/uplink", b"10"),
        ("p/sites/-plant/uplink", b"1"),
        ("p/sites/a/b/c/uplink", b"1"),
        ("p/sites//uplink", b"1"),
        ("p/sites/plant-a/state", b"1"),
        ("p/sites/plant-a", b"1"),
    ] {
        assert_eq!(up(topic, payload), Err(REJECT_UPLINK), "{topic}");
    }
}
