use super::verify::OpenError;
use super::*;
use edgebeat_proto::{LeaseRenewal, StatusReport, agent_message::Kind};

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

/// Another replica's sample decodes on its topic; one too large, undecodable or for a node
/// name the apiserver would refuse is rejected with its reason.
#[test]
fn shared_usage_is_taken_from_its_topic_only_when_it_decodes() {
    let largest = edgebeat_proto::SharedUsage {
        usage: Some(edgebeat_proto::ResourceUsage {
            cpu_usage_ms: u64::MAX,
            memory_working_set_kib: u64::MAX,
        }),
        sampled_ms: i64::MIN,
    };
    let bytes = largest.encode_to_vec();
    assert_eq!(bytes.len(), 35, "the largest encoding");
    assert!(bytes.len() <= classify::MAX_SHARED_USAGE_BYTES);
    assert_eq!(
        classify("p", b"p/usage/n1", &bytes, 1024),
        Ok(Inbound::Usage {
            node: "n1",
            usage: largest
        })
    );
    let cases: [(&[u8], &[u8], Rejection); 3] = [
        (b"p/usage/n1", &[0u8; 65], REJECT_TOO_LARGE),
        (b"p/usage/n1", &[0xff, 0xff, 0xff], REJECT_MALFORMED),
        (b"p/usage/Edge_1", &bytes, REJECT_MALFORMED),
    ];
    for (topic, payload, reason) in cases {
        assert_eq!(
            classify("p", topic, payload, 1024),
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
    assert!(ok.check().is_ok());
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
