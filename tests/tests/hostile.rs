//! Bad input at the gateway: malformed, foreign, replayed and stale messages are rejected and
//! counted, nothing is written for them, and a legitimate node keeps renewing meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use edgebeat_gateway::message_path::GatewayOptions;
use edgebeat_proto::{self as pb, AckCode, agent_message::Kind};
use edgebeat_tests::harness::{Cluster, Transport, fixture, gateway_options, wait_for};
use edgebeat_tests::messages::{BOOT, register, renewal};
use edgebeat_transports::grpc::{GrpcUplinkOptions, run_uplink};
use edgebeat_transports::ingress::{Handler as _, Peer, RejectReason, TransportKind};
use edgebeat_transports::uplink::{Uplink, UplinkError, channel};
use http::Method;
use tokio_util::sync::CancellationToken;

const T: Duration = Duration::from_secs(10);

/// A hand-driven uplink: registers `node` with `seq` on connect, then sends what the test says.
async fn raw_uplink(
    cluster: &Cluster,
    node: &'static str,
    seq: u64,
) -> (Uplink, CancellationToken) {
    let (uplink, driver) = channel(4);
    let cancel = CancellationToken::new();
    let register: edgebeat_transports::uplink::RegisterFn = Arc::new(move || register(node, seq));
    let cluster_url = cluster.grpc_url.clone();
    let stop = cancel.clone();
    tokio::spawn(async move {
        let mut driver = driver;
        run_uplink(
            GrpcUplinkOptions::new(cluster_url),
            register,
            &mut driver,
            stop,
        )
        .await
    });
    let mut registered = uplink.registered();
    tokio::time::timeout(T, registered.wait_for(|r| *r))
        .await
        .unwrap()
        .unwrap();
    (uplink, cancel)
}

fn code(answer: &pb::Answer) -> AckCode {
    answer.code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_rejected_counted_and_others_keep_renewing() {
    let cluster = Cluster::start(Transport::Grpc).await.unwrap();
    let good = cluster
        .start_agent(cluster.agent_config("nuc-lab-03", &fixture("nuc-hybrid")))
        .unwrap();
    let (uplink, cancel) = raw_uplink(&cluster, "rogue-01", 1_000_000).await;

    let no_kind = uplink
        .send(pb::AgentMessage { kind: None }, T)
        .await
        .unwrap();
    assert_eq!(code(&no_kind), AckCode::Rejected);
    assert!(
        no_kind.reason().starts_with("malformed"),
        "{}",
        no_kind.reason()
    );

    let bad_name = uplink
        .send(renewal("Not_A_Node!", 2_000_000), T)
        .await
        .unwrap();
    assert_eq!(code(&bad_name), AckCode::Rejected);

    let ok = uplink
        .send(renewal("rogue-01", 3_000_000), T)
        .await
        .unwrap();
    assert_eq!(code(&ok), AckCode::Ok, "{}", ok.reason());
    // A replay, and an older message (reordered), are refused without an answer: the
    // sender, if genuine, had its answer already.
    let unanswered = Duration::from_millis(500);
    for seq in [3_000_000, 2_500_000] {
        let replay = uplink.send(renewal("rogue-01", seq), unanswered).await;
        assert_eq!(replay, Err(UplinkError::Timeout(unanswered)), "seq {seq}");
    }
    cluster
        .wait_for_rejections(RejectReason::Replayed, 2, T)
        .await;

    // The legitimate node kept renewing throughout.
    let before = cluster
        .standin
        .requests()
        .iter()
        .filter(|r| r.method == Method::PUT && r.path.ends_with("/leases/nuc-lab-03"))
        .count();
    cluster
        .standin
        .wait_until(T, "good node renews", |v| {
            v.requests()
                .iter()
                .filter(|r| r.method == Method::PUT && r.path.ends_with("/leases/nuc-lab-03"))
                .count()
                > before + 2
        })
        .await
        .unwrap();
    cancel.cancel();
    good.stop().await.unwrap();
    let rejected = cluster.gateway().counters.rejected();
    assert_eq!(rejected, 4, "each bad message counted once");
    let rogue_writes = cluster
        .standin
        .requests()
        .iter()
        .filter(|r| {
            r.path.contains("/leases")
                && r.method != Method::GET
                && String::from_utf8_lossy(&r.body).contains("\"rogue-01\"")
        })
        .count();
    assert_eq!(
        rogue_writes, 1,
        "only the one valid renewal was written (it created the lease)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_renewals_are_dropped_not_written() {
    // No delay tolerated at all: any renewal whose boot clock advanced less than the
    // gateway's clock since the reference message is stale.
    let options = GatewayOptions {
        max_renewal_age: Duration::ZERO,
        drift_ppm: 0,
        ..edgebeat_tests::harness::gateway_options()
    };
    let cluster = Cluster::start_with(Transport::Grpc, options).await.unwrap();
    let (uplink, cancel) = raw_uplink(&cluster, "late-01", 1_000_000_000).await;
    // Sent "1 µs after" registration by the agent's clock, but it arrives later than that.
    let late = uplink
        .send(renewal("late-01", 1_000_000_001), T)
        .await
        .unwrap();
    assert_eq!(code(&late), AckCode::Rejected);
    assert!(late.reason().starts_with("stale"), "{}", late.reason());
    // Claims 0.5 s elapsed on the agent, more than has passed: the least delayed message
    // so far, so fresh (and within the 1 s a message may lead the boot clock).
    let fresh = uplink
        .send(renewal("late-01", 1_000_500_000), T)
        .await
        .unwrap();
    assert_eq!(code(&fresh), AckCode::Ok, "{}", fresh.reason());
    cancel.cancel();
    assert_eq!(cluster.gateway().counters.stale_renewals.get(), 1);
    let lease_writes = cluster
        .standin
        .requests()
        .iter()
        .filter(|r| r.path.contains("/leases") && r.method != Method::GET)
        .count();
    assert_eq!(
        lease_writes, 1,
        "one create for the fresh renewal, nothing for the stale one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_node_is_rate_limited_and_others_keep_renewing() {
    // Default per-node limits (2/s, burst 20), as in production.
    let cluster = Cluster::start_with(Transport::Grpc, GatewayOptions::default())
        .await
        .unwrap();
    let mut config = cluster.agent_config("nuc-lab-03", &fixture("nuc-hybrid"));
    config.node_lease_duration_seconds = 8; // renew every 2 s: within the default limit
    config.node_status_report_frequency = Duration::from_secs(3600);
    let good = cluster.start_agent(config).unwrap();
    let (uplink, cancel) = raw_uplink(&cluster, "flood-01", 1_000_000).await;
    cluster.wait_for_renewals("nuc-lab-03", 1, T).await.unwrap();
    let mut limited = 0;
    for i in 0..300u64 {
        let ack = uplink
            .send(renewal("flood-01", 2_000_000 + i), T)
            .await
            .unwrap();
        if ack.reason().starts_with("rate limited") {
            limited += 1;
        }
    }
    assert!(
        limited >= 250,
        "most of the flood is refused: {limited} of 300"
    );
    let flood_writes = cluster
        .standin
        .requests()
        .iter()
        .filter(|r| {
            r.path.ends_with("/leases/flood-01")
                || (r.method == Method::POST
                    && r.path.ends_with("/leases")
                    && String::from_utf8_lossy(&r.body).contains("\"flood-01\""))
        })
        .count();
    assert!(
        flood_writes <= 30,
        "the flood reached the apiserver only within its burst: {flood_writes}"
    );
    // The well-behaved node keeps renewing after the flood.
    cluster.wait_for_renewals("nuc-lab-03", 2, T).await.unwrap();
    cancel.cancel();
    good.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_labels_are_refused_at_registration() {
    use edgebeat_transports::ingress::{Handler, Peer, TransportKind};
    let cluster = Cluster::start(Transport::Grpc).await.unwrap();
    let peer = Peer::unidentified(TransportKind::Grpc, None);
    let mut message = register("rpi4-edge-01", 5_000_000);
    let Some(Kind::Register(r)) = message.kind.as_mut() else {
        unreachable!()
    };
    r.labels.insert(
        "node-role.kubernetes.io/control-plane".into(),
        String::new(),
    );
    let ack = cluster.gateway().handle(&peer, message).await.unwrap();
    assert_eq!(code(&ack), AckCode::Rejected);
    assert!(
        ack.reason()
            .contains("node-role.kubernetes.io/control-plane"),
        "{}",
        ack.reason()
    );
    assert!(
        cluster
            .standin
            .requests()
            .iter()
            .all(edgebeat_tests::requests::is_gateway_own_read),
        "refused before any apiserver call (the gateway's watches and /version aside)"
    );
    // The same registration with a label a node may set is accepted.
    let mut message = register("rpi4-edge-01", 6_000_000);
    let Some(Kind::Register(r)) = message.kind.as_mut() else {
        unreachable!()
    };
    r.labels
        .insert("node.kubernetes.io/edge".into(), "true".into());
    let ack = cluster.gateway().handle(&peer, message).await.unwrap();
    assert_eq!(code(&ack), AckCode::Ok, "{}", ack.reason());
    let labels = cluster
        .standin
        .node("rpi4-edge-01")
        .unwrap()
        .metadata
        .labels
        .unwrap();
    assert_eq!(labels["node.kubernetes.io/edge"], "true");
}

/// A backlog (here a slow apiserver) never writes a renewal that a newer one from the same
/// node already supersedes: three renewals queued for one identified node cost two Lease
/// writes, the first (already under way) and the newest, and the middle one is answered
/// as superseded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_superseded_by_a_newer_one_is_not_written() {
    use edgebeat_transports::ingress::{Handler, Peer, TransportKind};
    const NODE: &str = "rpi4-edge-01";
    let cluster = Cluster::start(Transport::Grpc).await.unwrap();
    let peer = Peer {
        identity: Some(NODE.parse().unwrap()),
        ..Peer::unidentified(TransportKind::Grpc, None)
    };
    let gateway = cluster.gateway().clone();
    assert_eq!(
        code(
            &gateway
                .handle(&peer, register(NODE, 1_000_000))
                .await
                .unwrap()
        ),
        AckCode::Ok
    );
    assert_eq!(
        code(
            &gateway
                .handle(&peer, renewal(NODE, 1_100_000))
                .await
                .unwrap()
        ),
        AckCode::Ok,
        "the Lease exists"
    );
    cluster.standin.set_latency(Duration::from_millis(300));
    let before = cluster.standin.requests().len();
    // join! polls in order: the first takes the node's slot, the others queue behind it.
    let (first, middle, newest) = tokio::join!(
        gateway.handle(&peer, renewal(NODE, 1_200_000)),
        gateway.handle(&peer, renewal(NODE, 1_300_000)),
        gateway.handle(&peer, renewal(NODE, 1_400_000)),
    );
    let (first, middle, newest) = (first.unwrap(), middle.unwrap(), newest.unwrap());
    assert_eq!(code(&first), AckCode::Ok);
    assert_eq!(code(&middle), AckCode::Rejected);
    assert!(
        middle.reason().contains("superseded"),
        "{}",
        middle.reason()
    );
    assert_eq!(code(&newest), AckCode::Ok);
    let puts = cluster.standin.requests()[before..]
        .iter()
        .filter(|r| edgebeat_tests::requests::is_lease_put(r, NODE))
        .count();
    assert_eq!(
        puts, 2,
        "the first and the newest renewal written, not the middle one"
    );
    assert_eq!(
        gateway
            .counters
            .rejections(edgebeat_transports::ingress::RejectReason::Superseded),
        1
    );
}

/// A quiet renewal that was written is not answered at all (nothing goes back on the
/// link); one the gateway could not write is answered RETRY, so the agent tries again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_renewals_are_answered_only_when_not_written() {
    let cluster = Cluster::start(Transport::Grpc).await.unwrap();
    let (uplink, cancel) = raw_uplink(&cluster, "quiet-01", 1_000_000).await;
    let quiet = |seq| {
        let mut message = renewal("quiet-01", seq);
        if let Some(Kind::Lease(l)) = message.kind.as_mut() {
            l.quiet = true;
        }
        message
    };
    // The Lease exists first (a loud renewal creates it), so the quiet one is a PUT.
    let loud = uplink
        .send(renewal("quiet-01", 1_500_000), T)
        .await
        .unwrap();
    assert_eq!(code(&loud), AckCode::Ok, "{}", loud.reason());
    let written = cluster.standin.requests().len();
    let silence = uplink.send(quiet(2_000_000), Duration::from_secs(2)).await;
    assert_eq!(
        silence,
        Err(edgebeat_transports::uplink::UplinkError::Timeout(
            Duration::from_secs(2)
        )),
        "no answer to a written renewal"
    );
    assert!(
        cluster.standin.requests()[written..]
            .iter()
            .any(|r| edgebeat_tests::requests::is_lease_renewed(r, "quiet-01")),
        "the silent renewal was written"
    );
    cluster
        .standin
        .inject(edgebeat_tests::standin::FaultRule::status(
            Some(Method::PUT),
            "/leases/quiet-01",
            503,
            10,
        ));
    let refused = uplink.send(quiet(3_000_000), T).await.unwrap();
    assert_eq!(code(&refused), AckCode::Retry, "{}", refused.reason());
    cancel.cancel();
}

/// Over plain MQTT, a quiet renewal leaves to the topic what the topic says: no node name,
/// no wall time (unsigned, it serves no check), and names its boot by tag. The tag and seq
/// serve the replay checks, and the gateway writes the Lease from it. Read off the broker by a plain subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_quiet_renewals_leave_the_node_name_to_the_topic() {
    use prost::Message as _;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    let cluster = Cluster::start(Transport::Mqtt).await.unwrap();
    let broker = cluster.broker.as_ref().unwrap();
    let mut options = MqttOptions::new("compact-sniffer", broker.host(), broker.port());
    options.set_keep_alive(Duration::from_secs(30));
    let (client, mut events) = AsyncClient::new(options, 16);
    let topic = format!(
        "{}/nodes/rpi4-edge-01/lease",
        edgebeat_transports::mqtt::DEFAULT_TOPIC_PREFIX
    );
    client.subscribe(&topic, QoS::AtMostOnce).await.unwrap();
    // Subscribed before the agent starts, so its first renewals are seen.
    tokio::time::timeout(T, async {
        loop {
            if let Ok(Event::Incoming(Packet::SubAck(_))) = events.poll().await {
                return;
            }
        }
    })
    .await
    .unwrap();
    let agent = cluster
        .start_agent(cluster.agent_config("rpi4-edge-01", &fixture("rpi4-cgroup1")))
        .unwrap();
    let compact = tokio::time::timeout(T, async {
        loop {
            let Ok(Event::Incoming(Packet::Publish(p))) = events.poll().await else {
                continue;
            };
            let message = pb::AgentMessage::decode(p.payload.as_ref()).unwrap();
            if message.is_quiet() {
                return message;
            }
        }
    })
    .await
    .unwrap();
    let header = compact.header().unwrap();
    assert_eq!(
        (header.node_name.as_str(), header.wall_time_ms),
        ("", 0),
        "{header:?}"
    );
    // The boot is named by its 4-byte tag (`Ack.boot_tags`), the one of the host's boot ID.
    let boot_id =
        std::fs::read_to_string(fixture("rpi4-cgroup1").join("proc/sys/kernel/random/boot_id"))
            .unwrap();
    assert!(header.boot_id.is_empty(), "{header:?}");
    assert_eq!(
        header.boot_tag,
        pb::boot_tag(&pb::boot_id_to_bytes(boot_id.trim()))
    );
    assert!(header.seq > 0);
    // The gateway takes the node from the topic and keeps writing the Lease.
    cluster
        .wait_for_renewals("rpi4-edge-01", 3, T)
        .await
        .unwrap();
    agent.stop().await.unwrap();
}

/// A quiet renewal that names its boot by tag (`Header.boot_tag`, MQTT's compact form) is
/// written when the gateway holds that boot, or when the Node's `status.nodeInfo.bootID`
/// has the tag (a restarted replica, from its Node watch, without asking). Another boot's
/// tag is answered RETRY with `send_boot_id`, changes nothing, and the renewal that then
/// carries the boot ID is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_tag_names_a_boot_the_gateway_holds_or_asks_for() {
    const NODE: &str = "tagged-01";
    const REBOOTED: &str = "a3d1c0de-7b4e-4f1a-9c2d-5e6f7a8b9c0d";
    let mut cluster = Cluster::start(Transport::Grpc).await.unwrap();
    let peer = Peer::unidentified(TransportKind::Mqtt, None);
    let with_boot = |seq, boot: &str| {
        let mut m = renewal(NODE, seq);
        if let Some(Kind::Lease(l)) = &mut m.kind {
            l.quiet = true;
            if let Some(h) = &mut l.header {
                h.boot_id = pb::boot_id_to_bytes(boot);
            }
        }
        m
    };
    let tagged = |seq, boot: &str| {
        let mut m = with_boot(seq, boot);
        m.tag_boot();
        assert!(m.header().unwrap().boot_id.is_empty());
        m
    };
    let gateway = cluster.gateway().clone();
    let ack = gateway
        .handle(&peer, register(NODE, 1_000_000))
        .await
        .unwrap();
    assert!(matches!(ack, pb::Answer::Registered { .. }), "{ack:?}");
    let ack = gateway
        .handle(&peer, tagged(2_000_000, BOOT))
        .await
        .unwrap();
    assert_eq!(
        code(&ack),
        AckCode::Ok,
        "the boot it holds: {}",
        ack.reason()
    );

    // A fresh replica holds no boot; its Node watch has the Node's bootID.
    cluster.restart_gateway(gateway_options()).await.unwrap();
    let gateway = cluster.gateway().clone();
    wait_for("the Node watch to list", T, || {
        gateway.view().nodes_watched()
    })
    .await;
    let ack = gateway
        .handle(&peer, tagged(3_000_000, BOOT))
        .await
        .unwrap();
    assert_eq!(
        code(&ack),
        AckCode::Ok,
        "from the Node watch: {}",
        ack.reason()
    );
    assert_eq!(gateway.counters.rejections(RejectReason::UnknownBoot), 0);

    // The node rebooted and its status is not written yet: the tag names no boot known.
    let ack = gateway
        .handle(&peer, tagged(1_000, REBOOTED))
        .await
        .unwrap();
    assert_eq!(
        (code(&ack), matches!(ack, pb::Answer::SendBootId { .. })),
        (AckCode::Retry, true),
        "{}",
        ack.reason()
    );
    assert_eq!(gateway.counters.rejections(RejectReason::UnknownBoot), 1);
    let ack = gateway
        .handle(&peer, with_boot(2_000, REBOOTED))
        .await
        .unwrap();
    assert_eq!(
        code(&ack),
        AckCode::Ok,
        "with its boot ID: {}",
        ack.reason()
    );
    let ack = gateway
        .handle(&peer, tagged(3_000, REBOOTED))
        .await
        .unwrap();
    assert_eq!(code(&ack), AckCode::Ok, "then by tag: {}", ack.reason());
    // The earlier boot's tag, though the Node still reports that boot, is a replay: refused
    // without an answer.
    let ack = gateway.handle(&peer, tagged(4_000_000, BOOT)).await;
    assert_eq!(ack, None);
    assert_eq!(gateway.counters.rejections(RejectReason::Replayed), 1);
}
