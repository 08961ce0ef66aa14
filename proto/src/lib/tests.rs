use super::*;
use prost::Message;

#[test]
fn quiet_renewals_are_answered_only_with_news() {
    let ok = Answer::Renewed {
        lease_state: vec![1, 2, 3],
        resend_status: false,
    };
    assert!(!answer_needed(true, &ok), "written: silence");
    assert!(answer_needed(false, &ok));
    for news in [
        Answer::Retry { reason: "x".into() },
        Answer::Rejected { reason: "x".into() },
        ok.clone().and_resend_status(),
        Answer::NodeNotFound { reason: "x".into() },
    ] {
        assert!(answer_needed(true, &news), "{news:?}");
    }
    let quiet = AgentMessage {
        kind: Some(agent_message::Kind::Lease(LeaseRenewal {
            quiet: true,
            ..Default::default()
        })),
    };
    assert!(quiet.is_quiet());
    assert!(!AgentMessage::default().is_quiet());
}

#[test]
fn boot_id_round_trips_through_16_bytes() {
    let text = "0f8fad5b-d9cb-469f-a165-70867728950e";
    let bytes = boot_id_to_bytes(text);
    assert_eq!(bytes.len(), 16);
    assert_eq!(bytes[0], 0x0f);
    assert_eq!(boot_id_to_string(&bytes), text);
}

#[test]
fn non_uuid_boot_id_is_kept_as_text() {
    for text in ["not-a-uuid", "", "0f8fad5b-d9cb-469f-a165-70867728950z"] {
        assert_eq!(boot_id_to_string(&boot_id_to_bytes(text)), text);
    }
}

/// A whole header, as an agent fills it.
fn full_header() -> Header {
    Header {
        node_name: "edge-0001".into(),
        boot_id: boot_id_to_bytes("0f8fad5b-d9cb-469f-a165-70867728950e"),
        seq: 86_400_000_000,
        wall_time_ms: 1_780_000_000_000,
        boot_tag: 0,
    }
}

/// A Lease renewal with `header`, quiet or not.
fn renewal_with(header: &Header, quiet: bool) -> AgentMessage {
    AgentMessage {
        kind: Some(agent_message::Kind::Lease(LeaseRenewal {
            header: Some(header.clone()),
            lease_duration_seconds: 40,
            lease_state: Vec::new(),
            quiet,
            usage: None,
        })),
    }
}

#[test]
fn a_compact_quiet_renewal_is_a_sequence_number() {
    let full = full_header();
    let renewal = |quiet| renewal_with(&full, quiet);
    let mut compact = renewal(true);
    compact.compact_header();
    assert!(
        compact.encoded_len() <= 20,
        "{} bytes",
        compact.encoded_len()
    );
    assert!(compact.complete_header(&full));
    let back = compact.header().unwrap();
    assert_eq!(
        (&*back.node_name, &back.boot_id, back.seq),
        ("edge-0001", &full.boot_id, full.seq)
    );
    // Not quiet: left whole; a full header is never overwritten.
    let mut loud = renewal(false);
    loud.compact_header();
    assert_eq!(loud, renewal(false));
    assert!(!loud.complete_header(&Header::default()));
}

#[test]
fn a_topic_compact_renewal_keeps_boot_and_seq() {
    let full = full_header();
    let renewal = |quiet| renewal_with(&full, quiet);
    let whole = renewal(true).encoded_len();
    let mut plain = renewal(true);
    plain.compact_header_for_topic(false);
    // Node name (9 + 2) and wall time (6 + 1) left out.
    assert_eq!(whole - plain.encoded_len(), 18);
    let mut signed = renewal(true);
    signed.compact_header_for_topic(true);
    assert_eq!(signed.header().unwrap().wall_time_ms, full.wall_time_ms);
    assert!(signed.complete_node_name("edge-0001"));
    assert_eq!(signed, renewal(true));
    assert!(plain.complete_node_name("edge-0001"));
    let back = plain.header().unwrap();
    assert_eq!(
        (&*back.node_name, &back.boot_id, back.seq, back.wall_time_ms),
        ("edge-0001", &full.boot_id, full.seq, 0)
    );
    // A header that names its node is never rewritten, and loud messages stay whole.
    assert!(!renewal(true).complete_node_name("other"));
    let mut loud = renewal(false);
    loud.compact_header_for_topic(false);
    assert_eq!(loud, renewal(false));
}

#[test]
fn a_boot_tag_names_the_boot_in_five_bytes() {
    let full = full_header();
    // FNV-1a 64 of the empty input is the offset basis; of "a", a published vector.
    assert_eq!(boot_tag(b""), 0x8422_2325);
    assert_eq!(boot_tag(b"a"), 0x8601_ec8c); // of 0xaf63dc4c8601ec8c
    let mut plain = renewal_with(&full, true);
    plain.compact_header_for_topic(false);
    let mut tagged = plain.clone();
    tagged.tag_boot();
    // 18 bytes of boot ID become 5 of tag.
    assert_eq!(plain.encoded_len() - tagged.encoded_len(), 13);
    let header = tagged.header().unwrap();
    assert!(header.boot_id.is_empty());
    assert_eq!(header.named_boot_tag(), full.named_boot_tag());
    assert_eq!(header.seq, full.seq);
    // Loud messages keep their boot ID.
    let mut loud = renewal_with(&full, false);
    loud.tag_boot();
    assert_eq!(loud, renewal_with(&full, false));
}

#[test]
fn lease_renewal_is_tens_of_bytes() {
    let msg = AgentMessage {
        kind: Some(agent_message::Kind::Lease(LeaseRenewal {
            header: Some(Header {
                node_name: "edge-0001".into(),
                boot_id: boot_id_to_bytes("0f8fad5b-d9cb-469f-a165-70867728950e"),
                seq: 86_400_000_000 * 30,
                wall_time_ms: 1_780_000_000_000,
                boot_tag: 0,
            }),
            lease_duration_seconds: 40,
            lease_state: Vec::new(),
            quiet: true,
            usage: None,
        })),
    };
    let len = msg.encoded_len();
    assert!(len < 64, "renewal is {len} bytes");
    let back = AgentMessage::decode(msg.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back, msg);
    assert_eq!(back.kind_name(), "lease");
}

#[test]
fn unknown_fields_and_kinds_do_not_break_decoding() {
    // Field 99 (varint) appended to an empty AgentMessage: a newer agent's kind.
    let bytes = [0xf8, 0x06, 0x01];
    let msg = AgentMessage::decode(bytes.as_slice()).unwrap();
    assert!(msg.header().is_none());
    assert_eq!(msg.kind_name(), "unknown");
    assert_eq!(msg.message_kind(), None);
}

#[test]
fn condition_types_are_spelt_as_the_api_kubelets_four_first() {
    for t in NodeConditionType::KUBELET
        .iter()
        .chain(&NodeConditionType::HEALTH)
    {
        assert_eq!(NodeConditionType::from_name(t.as_str()), Some(*t));
    }
    assert_eq!(NodeConditionType::PidPressure.as_str(), "PIDPressure");
    assert_eq!(NodeConditionType::KUBELET[3], NodeConditionType::Ready);
    assert!(NodeConditionType::Ready.is_kubelets());
    assert!(!NodeConditionType::UnderVoltage.is_kubelets());
    // Other writers' types are not edgebeat's to report.
    assert_eq!(NodeConditionType::from_name("NetworkUnavailable"), None);
    assert_eq!(NodeConditionType::from_name("ready"), None);
    assert!(NodeConditionType::Ready == "Ready");
    // ALL is KUBELET then HEALTH, and a type's discriminant is its place in it.
    assert!(
        NodeConditionType::KUBELET
            .iter()
            .chain(&NodeConditionType::HEALTH)
            .eq(NodeConditionType::ALL.iter())
    );
    for (i, t) in NodeConditionType::ALL.into_iter().enumerate() {
        assert_eq!(t as usize, i);
    }
}

#[test]
fn condition_statuses_parse_strictly_or_as_held() {
    use ConditionStatus::{False, True, Unknown};
    for s in ConditionStatus::ALL {
        assert_eq!(ConditionStatus::parse(s.as_str()), Some(s));
        assert_eq!(ConditionStatus::ALL[s as usize], s);
    }
    assert_eq!(ConditionStatus::parse("true"), None);
    assert_eq!(ConditionStatus::from_api("maybe"), Unknown);
    assert!(True.is_reported() && False.is_reported() && !Unknown.is_reported());
    assert_eq!(ConditionStatus::from_bool(false), False);
    assert_eq!(EventType::Warning.as_str(), "Warning");
}

/// kubelet's event reasons (`pkg/kubelet/events/event.go`) for its four conditions; the
/// health conditions have none of kubelet's.
#[test]
fn kubelets_event_reasons_follow_the_status() {
    use ConditionStatus::{False, True, Unknown};
    use NodeConditionType as T;
    assert_eq!(T::Ready.event_reason(True), Some("NodeReady"));
    assert_eq!(T::Ready.event_reason(Unknown), Some("NodeNotReady"));
    assert_eq!(
        T::MemoryPressure.event_reason(False),
        Some("NodeHasSufficientMemory")
    );
    assert_eq!(
        T::DiskPressure.event_reason(True),
        Some("NodeHasDiskPressure")
    );
    assert_eq!(
        T::PidPressure.event_reason(True),
        Some("NodeHasInsufficientPID")
    );
    assert_eq!(T::PidPressure.event_reason(Unknown), None);
    assert_eq!(T::UnderVoltage.event_reason(True), None);
}

#[test]
fn message_kinds_name_their_topic_level() {
    for kind in MessageKind::ALL {
        assert_eq!(MessageKind::from_name(kind.as_str()), Some(kind));
    }
    assert_eq!(MessageKind::from_name("will"), None);
    assert_eq!(MessageKind::from_name("Lease"), None);
    let renewal = AgentMessage {
        kind: Some(agent_message::Kind::Lease(LeaseRenewal::default())),
    };
    assert_eq!(renewal.message_kind(), Some(MessageKind::Lease));
    assert_eq!(renewal.kind_name(), "lease");
}

/// Only the node's own newer message of the same boot supersedes: never a copy, an older
/// message or another boot's, whichever way each header names its boot.
#[test]
fn only_a_newer_message_of_the_same_boot_supersedes() {
    let by_id = |seq| Header {
        boot_id: vec![7; 16],
        seq,
        ..Default::default()
    };
    let by_tag = |seq| Header {
        boot_tag: boot_tag(&[7; 16]),
        seq,
        ..Default::default()
    };
    let other_boot = Header {
        boot_id: vec![8; 16],
        seq: 99,
        ..Default::default()
    };
    assert!(by_tag(11).boot_seq().supersedes(by_id(10).boot_seq()));
    assert!(
        !by_tag(10).boot_seq().supersedes(by_id(10).boot_seq()),
        "a copy"
    );
    assert!(
        !by_id(9).boot_seq().supersedes(by_tag(10).boot_seq()),
        "older"
    );
    assert!(!other_boot.boot_seq().supersedes(by_id(10).boot_seq()));
    assert_eq!(MessageKind::Register.heartbeat_index(), None);
    assert_eq!(MessageKind::Lease.heartbeat_index(), Some(0));
    assert!(
        Answer::superseded(MessageKind::Status)
            .reason()
            .contains("a newer status")
    );
}

/// What the resource usage adds to a renewal that carries it, for a board up 30 days on 4
/// cores at 50 % with 1 GiB in its working set: 12 bytes, so at every second renewal of
/// kubelet's 10 s (4,320 a day) 51,840 B a node-day, within the 0.1 MB budget.
#[test]
fn resource_usage_adds_12_bytes_to_a_renewal() {
    let header = full_header();
    let plain = renewal_with(&header, true);
    let mut with_usage = plain.clone();
    if let Some(agent_message::Kind::Lease(renewal)) = &mut with_usage.kind {
        renewal.usage = Some(ResourceUsage {
            cpu_usage_ms: 30 * 86_400 * 2 * 1_000,
            memory_working_set_kib: 1024 * 1024,
        });
    }
    assert_eq!(with_usage.encoded_len() - plain.encoded_len(), 12);
}
