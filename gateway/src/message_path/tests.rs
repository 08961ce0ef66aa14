use super::slots::{NodeSlot, SLOT_IDLE, SWEEP_EVERY};
use super::*;
use crate::admission::Posture;
use edgebeat_proto::registration::NodeName;
use edgebeat_transports::ingress::{Handler, Reply, Sending, TransportKind};
use prometheus_client::registry::Registry;

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
    let answer = gateway.handle(&peer, register("edge-old", 1, 2_500)).await;
    assert!(
        matches!(answer, Some(Answer::Rejected { .. })),
        "{answer:?}"
    );
    gateway.handle(&peer, register("edge-fast", 1, -750)).await;
    // A replayed message (seq not increasing) does not move the skew.
    gateway.handle(&peer, register("edge-old", 1, 99_000)).await;
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
        gateway.handle(&peer, register("edge-fast", seq, 0)).await;
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
            .handle(&Peer::unidentified(transport, None), register("edge-1"))
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
        small.handle(&peer, register(node)).await;
    }
    assert_eq!(small.tracked_nodes(), 2);
    assert_eq!(small.counters.rejections(RejectReason::FleetFull), 2);
    // Known nodes still get in (a replay is refused without an answer); idle ones make
    // room.
    let answer = small.handle(&peer, register("n1")).await;
    assert_eq!(answer, None, "a replay gets no answer");
    assert_eq!(small.counters.rejections(RejectReason::Replayed), 1);
    // An identified node is never kept out by unidentified ones: it takes the slot of the
    // one heard from longest ago.
    let identified = Peer {
        identity: Some(NodeName::new("n9").unwrap()),
        ..peer.clone()
    };
    small.handle(&identified, register("n9")).await;
    assert_eq!(small.tracked_nodes(), 2);
    assert_eq!(small.counters.rejections(RejectReason::FleetFull), 2);
    tokio::time::advance(SLOT_IDLE + Duration::from_secs(1)).await;
    small.handle(&peer, register("n5")).await;
    assert_eq!(small.counters.rejections(RejectReason::FleetFull), 2);
}

/// A replay is refused without an answer, whether it comes as a copy of the newest
/// message posted (refused before it waits) or is superseded while it waits: a
/// `superseded` answer would let anyone who can copy a node's messages make the gateway
/// speak on the node's link.
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
    gateway.handle(&peer, lease(5)).await;
    assert_eq!(
        gateway.handle(&peer, lease(5)).await,
        None,
        "a copy: no answer"
    );
    assert_eq!(gateway.counters.rejections(RejectReason::Replayed), 1);
    // Its turn come, a superseded replay is refused as the replay it is; a superseded
    // genuine message is answered superseded.
    let cell = gateway.slots.lock().get("edge-1").unwrap().clone();
    assert_eq!(gateway.superseded(&cell, &lease(4)).await, None);
    assert_eq!(gateway.counters.rejections(RejectReason::Replayed), 2);
    assert_eq!(gateway.counters.rejections(RejectReason::Superseded), 0);
    assert_eq!(
        gateway.superseded(&cell, &lease(6)).await,
        Some(Answer::superseded(pb::MessageKind::Lease))
    );
    assert_eq!(gateway.counters.rejections(RejectReason::Superseded), 1);
    assert!(
        gateway.handle(&peer, lease(6)).await.is_some(),
        "the newer one is answered"
    );
}

/// Records the sequence number of each letter answered, in the order answered.
struct Recorded {
    seq: u64,
    answered: Arc<tokio::sync::watch::Sender<Vec<u64>>>,
}

impl Reply for Recorded {
    fn send(self: Box<Self>, answer: Option<Answer>) -> Sending {
        self.send_now(answer);
        Box::pin(std::future::ready(()))
    }
    fn send_now(self: Box<Self>, answer: Option<Answer>) {
        assert!(answer.is_some(), "every letter here is answered");
        self.answered.send_modify(|seqs| seqs.push(self.seq));
    }
}

/// One node's flood waits in its mailbox, `per_node_queue` letters behind the one being
/// handled, the rest refused as `queue_full`; other nodes are handled meanwhile, and the
/// waiting letters are handled in order once the node's handling moves.
#[tokio::test(start_paused = true)]
async fn a_flooding_node_waits_in_its_mailbox() {
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let gateway = Arc::new(Gateway::new(
        client,
        Arc::new(FixedClock(std::time::UNIX_EPOCH)),
        GatewayOptions {
            posture: Posture::AllowUnidentified,
            per_node_queue: 4,
            ..GatewayOptions::default()
        },
    ));
    let peer = Peer::unidentified(TransportKind::Mqtt, None);
    // No status: each is answered (refused) without an apiserver call.
    let register = |node: &str, seq| pb::AgentMessage {
        kind: Some(Kind::Register(pb::Register {
            header: Some(pb::Header {
                node_name: node.into(),
                boot_id: vec![1; 16],
                seq,
                wall_time_ms: 0,
                boot_tag: 0,
            }),
            ..Default::default()
        })),
    };
    gateway.handle(&peer, register("flood", 1)).await;
    let cell = gateway.slots.lock().get("flood").unwrap().clone();
    let held = cell.state.lock().await;
    let answered = Arc::new(tokio::sync::watch::channel(Vec::new()).0);
    let deliver = |seq| {
        let reply = Recorded {
            seq,
            answered: answered.clone(),
        };
        gateway
            .clone()
            .deliver(Letter::new(peer.clone(), register("flood", seq), reply));
    };
    deliver(10);
    // The handling task took it and waits for the node's state.
    for _ in 0..1000 {
        if cell.mailbox.lock().is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(
        cell.mailbox.lock().is_empty(),
        "the handling task never ran"
    );
    for seq in 11..20 {
        deliver(seq);
    }
    assert_eq!(gateway.counters.rejections(RejectReason::QueueFull), 5);
    assert!(
        gateway.handle(&peer, register("good", 1)).await.is_some(),
        "another node is handled meanwhile"
    );
    assert!(answered.borrow().is_empty());
    drop(held);
    let mut seen = answered.subscribe();
    let all = tokio::time::timeout(Duration::from_secs(60), seen.wait_for(|s| s.len() == 5)).await;
    if let Err(elapsed) = all {
        panic!("{elapsed}: answered {:?}", answered.borrow());
    }
    assert_eq!(*answered.borrow(), [10, 11, 12, 13, 14], "in order");
}

/// A message's future, which tokio copies as its task is spawned and finished, is not as
/// large as a registration's: the rare, large writes are boxed (`Gateway::write`). Prints
/// the sizes BENCHMARKS.md quotes:
/// `cargo test --release -p edgebeat-gateway --lib a_message_future_is_smaller_than_a_registration -- --nocapture`.
#[tokio::test]
async fn a_message_future_is_smaller_than_a_registration() {
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let gateway = Gateway::new(
        client,
        Arc::new(FixedClock(std::time::UNIX_EPOCH)),
        GatewayOptions::default(),
    );
    let cell = SlotCell::new(NodeName::new("n").unwrap());
    let mut slot = NodeSlot::default();
    let writer = &gateway.writer;
    let register = std::mem::size_of_val(&writer.register(
        &mut slot.writes,
        &cell.name,
        &pb::Register::default(),
    ));
    let report = std::mem::size_of_val(&writer.report(&mut slot.writes, &cell.name, None, &[]));
    let renew =
        std::mem::size_of_val(&writer.renew(&mut slot.writes, &cell.name, 40, &[], Instant::now()));
    let message = std::mem::size_of_val(&gateway.handle_letters(&cell));
    eprintln!(
        "future bytes: message {message}, registration {register}, status report {report}, renewal {renew}"
    );
    assert!(
        message < register && message < report,
        "a message's future ({message} bytes) holds a registration's ({register}) or a status report's ({report}) inline"
    );
}
