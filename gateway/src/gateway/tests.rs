use super::*;
use edgebeat_proto::registration::NodeName;
use edgebeat_transports::ingress::TransportKind;

/// Slots are taken in arrival order; each `superseded` call is the moment a heartbeat
/// holds the slot.
#[test]
fn only_a_newer_heartbeat_of_the_same_boot_supersedes() {
    let cell = SlotCell::default();
    let (boot, next_boot) = (pb::boot_tag(&[1; 16]), pb::boot_tag(&[2; 16]));
    let wait = |kind, boot_tag, seq| {
        Waiting::new(&cell, kind, BootSeq { boot_tag, seq }).expect("a heartbeat")
    };
    let (lease, status) = (MessageKind::Lease, MessageKind::Status);
    // A Register is never counted: it is never superseded.
    assert!(
        Waiting::new(
            &cell,
            MessageKind::Register,
            BootSeq {
                boot_tag: boot,
                seq: 1
            }
        )
        .is_none()
    );
    // A replay (lower sequence) queued behind a genuine renewal supersedes nothing.
    let genuine = wait(lease, boot, 10);
    let replay = wait(lease, boot, 5);
    assert!(!genuine.superseded());
    assert!(!replay.superseded(), "nothing behind it");
    // A backlog of three: the first two are superseded by the newest.
    let a = wait(lease, boot, 20);
    let b = wait(lease, boot, 30);
    let c = wait(lease, boot, 40);
    assert!(a.superseded());
    assert!(b.superseded());
    assert!(!c.superseded());
    // Status reports are counted apart from renewals.
    let renewal = wait(lease, boot, 50);
    let report = wait(status, boot, 51);
    assert!(!renewal.superseded());
    assert!(!report.superseded());
    // After a reboot (lower sequence numbers, nothing waiting) the new boot takes over.
    let x = wait(lease, next_boot, 1);
    let y = wait(lease, next_boot, 2);
    assert!(x.superseded());
    assert!(!y.superseded());
    // A heartbeat of an older boot behind one of the current boot supersedes nothing.
    let current = wait(lease, next_boot, 3);
    let _old = wait(lease, boot, 99);
    assert!(!current.superseded());
}

struct FixedClock(std::time::SystemTime);
impl Clock for FixedClock {
    fn now(&self) -> std::time::SystemTime {
        self.0
    }
    fn boottime(&self) -> Duration {
        Duration::ZERO
    }
}

fn scrape(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
    out
}

/// Skew is recorded on receipt (before any apiserver call: this Register has no status
/// and is rejected without one), and an evicted node's series disappear with its slot.
#[tokio::test(start_paused = true)]
async fn skew_is_recorded_per_node_and_evicted_with_the_slot() {
    let now = std::time::UNIX_EPOCH + Duration::from_millis(1_800_000_000_000);
    // Never contacted: every message here is answered before any apiserver call.
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let gateway = Arc::new(Gateway::new(
        client,
        Arc::new(FixedClock(now)),
        GatewayOptions {
            posture: Posture::AllowUnidentified,
            ..GatewayOptions::default()
        },
    ));
    let mut registry = Registry::default();
    gateway.register_metrics(&mut registry);
    let peer = Peer::unidentified(TransportKind::Grpc, None);
    let register = |node: &str, seq, behind_ms: i64| pb::AgentMessage {
        kind: Some(Kind::Register(pb::Register {
            header: Some(pb::Header {
                node_name: node.into(),
                boot_id: vec![7; 16],
                seq,
                wall_time_ms: 1_800_000_000_000 - behind_ms,
                boot_tag: 0,
            }),
            status: None,
            ..Default::default()
        })),
    };
    let answer = gateway
        .handle_message(&peer, register("edge-old", 1, 2_500))
        .await;
    assert!(
        matches!(answer, Some(Answer::Rejected { .. })),
        "{answer:?}"
    );
    gateway
        .handle_message(&peer, register("edge-fast", 1, -750))
        .await;
    // A replayed message (seq not increasing) does not move the skew.
    gateway
        .handle_message(&peer, register("edge-old", 1, 99_000))
        .await;
    let out = scrape(&registry);
    for line in [
        "edgebeat_gateway_node_clock_skew_seconds{node=\"edge-old\"} 2.5\n",
        "edgebeat_gateway_node_clock_skew_seconds{node=\"edge-fast\"} -0.75\n",
        "edgebeat_gateway_rejected_messages_total{reason=\"malformed\"} 2\n",
        "edgebeat_gateway_rejected_messages_total{reason=\"replayed\"} 1\n",
        "edgebeat_gateway_rejected_messages_total{reason=\"foreign\"} 0\n",
        "edgebeat_gateway_tracked_nodes 2\n",
        "edgebeat_gateway_lease_renewals_total 0\n",
        "# HELP edgebeat_gateway_lease_renewals Lease renewals written.\n",
        "# HELP edgebeat_gateway_tracked_nodes Nodes this gateway replica keeps state for (silent ones are dropped after 15 min).\n",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    assert!(
        !out.contains(".."),
        "a help text ends in one period:\n{out}"
    );
    assert!(
        !out.contains("edgebeat_gateway_node_lease_age_seconds{"),
        "no renewal written, no age"
    );

    // edge-old goes silent past SLOT_IDLE; edge-fast keeps talking until a sweep.
    tokio::time::advance(SLOT_IDLE + Duration::from_secs(1)).await;
    for seq in 2..SWEEP_EVERY + 2 {
        gateway
            .handle_message(&peer, register("edge-fast", seq, 0))
            .await;
    }
    assert_eq!(gateway.tracked_nodes(), 1);
    let out = scrape(&registry);
    assert!(!out.contains("edge-old"), "{out}");
    assert!(out.contains("edgebeat_gateway_node_clock_skew_seconds{node=\"edge-fast\"} 0.0\n"));
}

/// Whatever ingress carried it, a message without a node identity is refused under the
/// default posture before any state is kept for its node; and a replica keeps state for
/// at most `max_nodes` nodes.
#[tokio::test(start_paused = true)]
async fn the_posture_and_the_fleet_bound_hold_before_any_state() {
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let gateway = Gateway::new(
        client.clone(),
        Arc::new(FixedClock(std::time::UNIX_EPOCH)),
        GatewayOptions::default(),
    );
    let register = |node: &str| pb::AgentMessage {
        kind: Some(Kind::Register(pb::Register {
            header: Some(pb::Header {
                node_name: node.into(),
                boot_id: vec![1; 16],
                seq: 1,
                wall_time_ms: 0,
                boot_tag: 0,
            }),
            ..Default::default()
        })),
    };
    for transport in [TransportKind::Grpc, TransportKind::Mqtt] {
        let answer = gateway
            .handle_message(&Peer::unidentified(transport, None), register("edge-1"))
            .await;
        assert!(
            matches!(answer, Some(Answer::Rejected { .. })),
            "{answer:?}"
        );
    }
    assert_eq!(
        gateway.counters.rejections(RejectReason::Unauthenticated),
        2
    );
    assert_eq!(
        gateway.tracked_nodes(),
        0,
        "nothing kept for a refused message"
    );

    let small = Gateway::new(
        client,
        Arc::new(FixedClock(std::time::UNIX_EPOCH)),
        GatewayOptions {
            posture: Posture::AllowUnidentified,
            max_nodes: 2,
            ..GatewayOptions::default()
        },
    );
    let peer = Peer::unidentified(TransportKind::Grpc, None);
    for node in ["n1", "n2", "n3", "n4"] {
        small.handle_message(&peer, register(node)).await;
    }
    assert_eq!(small.tracked_nodes(), 2);
    assert_eq!(small.counters.rejections(RejectReason::FleetFull), 2);
    // Known nodes still get in (a replay is refused without an answer); idle ones make
    // room.
    let answer = small.handle_message(&peer, register("n1")).await;
    assert_eq!(answer, None, "a replay gets no answer");
    assert_eq!(small.counters.rejections(RejectReason::Replayed), 1);
    // An identified node is never kept out by unidentified ones: it takes the slot of the
    // one heard from longest ago.
    let identified = Peer {
        identity: Some(NodeName::new("n9").unwrap()),
        ..peer.clone()
    };
    small.handle_message(&identified, register("n9")).await;
    assert_eq!(small.tracked_nodes(), 2);
    assert_eq!(small.counters.rejections(RejectReason::FleetFull), 2);
    tokio::time::advance(SLOT_IDLE + Duration::from_secs(1)).await;
    small.handle_message(&peer, register("n5")).await;
    assert_eq!(small.counters.rejections(RejectReason::FleetFull), 2);
}

/// A replay waiting for a node's slot with a newer heartbeat behind it is superseded, but
/// refused as the replay it is, without an answer: a `superseded` answer would let anyone
/// who can copy a node's messages make the gateway speak on the node's link.
#[tokio::test(start_paused = true)]
async fn a_superseded_replay_gets_no_answer() {
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let gateway = Arc::new(Gateway::new(
        client,
        Arc::new(FixedClock(std::time::UNIX_EPOCH)),
        GatewayOptions::default(),
    ));
    let peer = Peer {
        identity: Some(NodeName::new("edge-1").unwrap()),
        ..Peer::unidentified(TransportKind::Grpc, None)
    };
    let header = |seq| pb::Header {
        node_name: "edge-1".into(),
        boot_id: vec![1; 16],
        seq,
        wall_time_ms: 0,
        boot_tag: 0,
    };
    let lease = move |seq| pb::AgentMessage {
        kind: Some(Kind::Lease(pb::LeaseRenewal {
            header: Some(header(seq)),
            lease_duration_seconds: 40,
            ..Default::default()
        })),
    };
    // Admitted (the write itself fails: no apiserver), so seq 5 is the last accepted.
    gateway.handle_message(&peer, lease(5)).await;
    let cell = gateway.slots.lock().unwrap().get("edge-1").unwrap().clone();
    let held = cell.state.lock().await;
    let spawn = |seq| {
        let (gateway, peer) = (gateway.clone(), peer.clone());
        tokio::spawn(async move { gateway.handle_message(&peer, lease(seq)).await })
    };
    let replay = spawn(5);
    while cell.waiting[0].load(Ordering::Acquire) < 1 {
        tokio::task::yield_now().await;
    }
    let newer = spawn(6);
    while cell.waiting[0].load(Ordering::Acquire) < 2 {
        tokio::task::yield_now().await;
    }
    drop(held);
    assert_eq!(replay.await.unwrap(), None, "a replay gets no answer");
    assert_eq!(gateway.counters.rejections(RejectReason::Replayed), 1);
    assert_eq!(gateway.counters.rejections(RejectReason::Superseded), 0);
    assert!(newer.await.unwrap().is_some(), "the newer one is answered");
}
