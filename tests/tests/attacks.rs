//! Six ways around node identity, probed from outside against the real ingress code over
//! real sockets: each attack must fail to change a genuine node's objects, to delay its
//! renewals past its lease duration, or to grow the gateway's per-node state past its bound.
//!
//! 1. An unidentified ingress (plaintext gRPC) beside signed MQTT.
//! 2. A forged boot ID that locked a genuine node out for good.
//! 3. `register_again` reflected to the agent by a message with a random signature.
//! 4. Per-node state for made-up node names before any check.
//! 5. TLS handshake slots filled by idle sockets.
//! 6. Replays of an accepted message draining the node's rate limit.
//!
//! Beside them, the MQTT side of a backlog: queued signed renewals superseded by a newer one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use edgebeat_gateway::GatewayOptions;
use edgebeat_gateway::metrics::RejectReason;
use edgebeat_proto::{self as pb, AckCode, agent_message::Kind};
use edgebeat_tests::harness::{Cluster, Transport, fixture, gateway_options, wait_for};
use edgebeat_tests::messages::{BOOT, register, renewal};
use edgebeat_tests::pki::Ca;
use edgebeat_tests::spy::Spy;
use edgebeat_transports::grpc::{GrpcServerOptions, serve};
use prost::Message as _;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(20);
const FACTS: &str = "rpi4-cgroup1";
const PREFIX: &str = "edgebeat/v1";

/// Sends `messages` on one gRPC stream to `url` (plain HTTP/2) and returns the acks.
async fn grpc_send(url: &str, messages: Vec<pb::AgentMessage>) -> Vec<pb::Ack> {
    let expected = messages.len();
    let channel = tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = pb::heartbeat_client::HeartbeatClient::new(channel);
    let mut acks = client
        .connect(futures_util::stream::iter(messages))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while out.len() < expected {
        let next = tokio::time::timeout(DEADLINE, acks.message())
            .await
            .unwrap();
        match next.unwrap() {
            Some(pb::GatewayMessage {
                kind: Some(pb::gateway_message::Kind::Ack(ack)),
            }) => out.push(ack),
            Some(_) => {}
            None => break,
        }
    }
    out
}

fn ready_status(cluster: &Cluster, node: &str) -> Option<String> {
    cluster
        .standin
        .node(node)?
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status)
}

/// 1. A gateway whose nodes are identified (signed MQTT) also serving plaintext gRPC (what
///    the binary now refuses to start with, and the default manifests never run): nothing
///    that listener carries is written, for the genuine node or for a made-up one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unidentified_listener_cannot_write_beside_signed_mqtt() {
    let site = Ca::new("edgebeat site CA");
    let cluster = Cluster::start_mqtt_secure(&site, true, gateway_options())
        .await
        .unwrap();
    let cert = site.node("edge-a");
    let agent = cluster
        .start_agent(cluster.secure_agent_config("edge-a", &fixture(FACTS), &cert))
        .unwrap();
    cluster
        .wait_for_renewals("edge-a", 2, DEADLINE)
        .await
        .unwrap();
    assert_eq!(ready_status(&cluster, "edge-a").as_deref(), Some("True"));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(serve(
        listener,
        cluster.gateway().clone(),
        GrpcServerOptions::default(),
        stop.clone().cancelled_owned(),
    ));
    let mut forged_status = register("edge-a", u64::MAX / 2);
    if let Some(Kind::Register(r)) = forged_status.kind.take() {
        let mut status = r.status.unwrap();
        status.conditions[0].status = "False".into();
        status.conditions[0].reason = "KubeletNotReady".into();
        forged_status.kind = Some(Kind::Status(pb::StatusReport {
            header: r.header,
            status: Some(status),
            unchanged: false,
        }));
    }
    let mut forged = vec![forged_status, renewal("edge-a", u64::MAX / 2 + 1)];
    forged.extend((0..50).map(|i| register(&format!("made-up-{i}"), 1)));
    let acks = grpc_send(&url, forged).await;
    assert_eq!(acks.len(), 52);
    assert!(
        acks.iter()
            .all(|a| AckCode::try_from(a.code) == Ok(AckCode::Rejected)),
        "{acks:?}"
    );
    assert_eq!(cluster.rejections(RejectReason::Unauthenticated), 52);
    assert_eq!(
        cluster.gateway().tracked_nodes(),
        1,
        "only edge-a has state"
    );
    assert!(cluster.standin.node("made-up-0").is_none());
    cluster
        .wait_for_renewals("edge-a", 2, DEADLINE)
        .await
        .unwrap();
    assert_eq!(ready_status(&cluster, "edge-a").as_deref(), Some("True"));
    stop.cancel();
    agent.stop().await.unwrap();
}

/// 2. Where no identity exists at all (an explicitly unidentified gateway), one message with
///    a fresh boot ID used to lock the genuine node out until a restart, and then for
///    `old_boot_memory` (30 s by default), longer than a short lease (35.6 s measured
///    against a 10 s lease). Now a displaced boot is remembered for one of its own renew
///    intervals (here 250 ms, the harness's 1 s lease), and its refused renewals go
///    unanswered, so the genuine node's Lease never goes older than its duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_boot_id_displaces_a_node_for_less_than_its_lease() {
    let cluster = Cluster::start_with(Transport::Grpc, gateway_options())
        .await
        .unwrap();
    let agent = cluster
        .start_agent(cluster.agent_config("edge-l", &fixture(FACTS)))
        .unwrap();
    cluster
        .wait_for_renewals("edge-l", 2, DEADLINE)
        .await
        .unwrap();
    let before = cluster.standin.requests().len();
    let mut forged = renewal("edge-l", 1);
    if let Some(Kind::Lease(l)) = forged.kind.as_mut() {
        l.header.as_mut().unwrap().boot_id = pb::boot_id_to_bytes(BOOT);
    }
    let acks = grpc_send(&cluster.grpc_url, vec![forged]).await;
    assert_eq!(
        acks.len(),
        1,
        "the forged boot is taken (nothing tells it apart)"
    );
    cluster
        .wait_for_renewals("edge-l", 8, DEADLINE)
        .await
        .unwrap();
    let requests = cluster.standin.requests();
    let gap = edgebeat_tests::requests::longest_renewal_gap(&requests[before..], "edge-l")
        .expect("renewals after the forgery");
    assert!(
        gap < Duration::from_secs(1),
        "the genuine Lease went {gap:?} unrenewed, longer than its 1 s duration"
    );
    agent.stop().await.unwrap();
}

/// 3. Messages with random signature bytes on a node's topic used to be answered
///    `register_again` on its ack topic, which the agent obeyed. Now they get no answer at
///    all (an answer could only ever tell the agent its Node is gone), and the node neither
///    registers again nor misses a renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_signatures_are_never_answered() {
    let site = Ca::new("edgebeat site CA");
    let cluster = Cluster::start_mqtt_secure(&site, true, gateway_options())
        .await
        .unwrap();
    let cert = site.node("edge-r");
    let acks_topic = format!("{PREFIX}/acks/edge-r");
    let lease_topic = format!("{PREFIX}/nodes/edge-r/lease");
    // Listening from before the agent starts: renewals written are not answered (they are
    // quiet), but its Register and first status report are, so the spy sees genuine acks.
    let mut spy = Spy::connect(&cluster, &site.client("spy", None), &[&acks_topic]).await;
    let agent = cluster
        .start_agent(cluster.secure_agent_config("edge-r", &fixture(FACTS), &cert))
        .unwrap();
    cluster
        .wait_for_renewals("edge-r", 2, DEADLINE)
        .await
        .unwrap();
    let registrations = cluster.gateway().counters.registrations.get();
    const FORGED: u64 = 60;
    for seq in 1..=FORGED {
        let forged = pb::SignedMessage {
            signed_message: renewal("edge-r", seq).encode_to_vec(),
            signature: vec![0x5a; 64],
        };
        spy.publish(&lease_topic, forged.encode_to_vec(), false)
            .await;
    }
    cluster
        .wait_for_rejections(RejectReason::BadSignature, FORGED, DEADLINE)
        .await;
    // Genuine renewals (and their acks) went on meanwhile.
    cluster
        .wait_for_renewals("edge-r", 3, DEADLINE)
        .await
        .unwrap();
    let answered: Vec<u64> = spy
        .received_on(&acks_topic)
        .iter()
        .map(|p| {
            edgebeat_tests::spy::verified_ack(p, &site.cert_pem)
                .expect("every answer is signed")
                .seq
        })
        .collect();
    assert!(!answered.is_empty(), "the spy sees the genuine acks");
    assert!(
        answered.iter().all(|seq| *seq > FORGED),
        "a forged message was answered: {answered:?}"
    );
    assert_eq!(
        cluster.gateway().counters.registrations.get(),
        registrations,
        "the node did not register again"
    );
    agent.stop().await.unwrap();
}

/// 4. Messages for made-up node names used to get a worker task (and 5 minutes of memory) each
///    before any check. With signatures required, nothing is kept for a message that does
///    not verify; without them, at most `max_nodes` queues and slots exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_node_names_get_no_state() {
    let site = Ca::new("edgebeat site CA");
    let cluster = Cluster::start_mqtt_secure(&site, true, gateway_options())
        .await
        .unwrap();
    let spy = Spy::connect(&cluster, &site.client("spy", None), &[]).await;
    const NAMES: u64 = 500;
    for i in 0..NAMES {
        let node = format!("made-up-{i}");
        let topic = format!("{PREFIX}/nodes/{node}/lease");
        let payload = if i % 2 == 0 {
            renewal(&node, 1).encode_to_vec()
        } else {
            pb::SignedMessage {
                signed_message: renewal(&node, 1).encode_to_vec(),
                signature: vec![1; 64],
            }
            .encode_to_vec()
        };
        spy.publish(&topic, payload, false).await;
    }
    cluster
        .wait_for_rejections(RejectReason::Unsigned, NAMES / 2, DEADLINE)
        .await;
    cluster
        .wait_for_rejections(RejectReason::UnknownSigner, NAMES / 2, DEADLINE)
        .await;
    let replica = cluster.replicas[0].as_ref().unwrap();
    assert_eq!(replica.mqtt_node_queues.load(Ordering::Relaxed), 0);
    assert_eq!(cluster.gateway().tracked_nodes(), 0);

    // Unidentified MQTT (the explicit opt-in): bounded by max_nodes.
    let options = GatewayOptions {
        max_nodes: 20,
        ..gateway_options()
    };
    let open = Cluster::start_with(Transport::Mqtt, options).await.unwrap();
    let broker = open.broker.as_ref().unwrap();
    let mut mqtt = rumqttc::v5::MqttOptions::new("flooder", broker.host(), broker.port());
    mqtt.set_outgoing_inflight_upper_limit(64);
    let (client, mut eventloop) = rumqttc::v5::AsyncClient::new(mqtt, 64);
    let driver = tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
    for i in 0..200 {
        let node = format!("made-up-{i}");
        client
            .publish(
                format!("{PREFIX}/nodes/{node}/lease"),
                rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
                false,
                renewal(&node, 1).encode_to_vec(),
            )
            .await
            .unwrap();
    }
    wait_for("fleet_full rejections", DEADLINE, || {
        open.gateway().counters.rejections(RejectReason::FleetFull) >= 180
    })
    .await;
    let replica = open.replicas[0].as_ref().unwrap();
    assert!(replica.mqtt_node_queues.load(Ordering::Relaxed) <= 20);
    assert!(open.gateway().tracked_nodes() <= 20);
    driver.abort();
}

/// 5. Idle TCP connections from one address used to fill every TLS handshake slot, and
///    every new mTLS connection was refused while they lasted. Now one address gets
///    `max_handshakes_per_address` slots (8 here) and a genuine agent elsewhere connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_from_one_address_cannot_starve_handshakes() {
    let site = Ca::new("edgebeat site CA");
    let grpc = GrpcServerOptions {
        max_handshakes: 64,
        max_handshakes_per_address: 8,
        ..edgebeat_tests::harness::mtls_options(&site)
    };
    let cluster = Cluster::start_grpc_with(grpc, gateway_options())
        .await
        .unwrap();
    let addr: std::net::SocketAddr = cluster
        .grpc_url
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    // 100 idle sockets from 127.0.0.2 (another address on loopback), each reopened as soon
    // as the gateway closes it: more than every slot, all the time. Stopped at the end.
    let flood = CancellationToken::new();
    for _ in 0..100 {
        let flood = flood.clone();
        tokio::spawn(async move {
            while !flood.is_cancelled() {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
                let Ok(mut stream) = socket.connect(addr).await else {
                    continue;
                };
                let mut sink = [0u8; 64];
                tokio::select! {
                    () = flood.cancelled() => {}
                    _ = tokio::io::AsyncReadExt::read(&mut stream, &mut sink) => {}
                }
            }
        });
    }
    cluster
        .wait_for_rejections(RejectReason::TlsHandshake, 92, DEADLINE)
        .await;
    let cert = site.node("edge-h");
    let mut config = cluster.agent_config("edge-h", &fixture(FACTS));
    config
        .transport
        .as_mut()
        .unwrap()
        .set_tls(edgebeat_agent::config::ClientTls {
            ca_pem: site.cert_pem.clone().into_bytes(),
            client_identity: Some(edgebeat_agent::config::TlsIdentity {
                cert_pem: cert.cert_pem.clone().into_bytes(),
                key_pem: cert.key_pem.clone().into_bytes(),
            }),
        })
        .unwrap();
    let agent = cluster.start_agent(config).unwrap();
    cluster
        .wait_for_renewals("edge-h", 2, DEADLINE)
        .await
        .unwrap();
    flood.cancel();
    agent.stop().await.unwrap();
}

/// 6. Replaying one accepted renewal used to take the node's rate-limit tokens, so the
///    genuine messages were refused. Replays are now refused before the rate limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_do_not_drain_the_rate_limit() {
    let site = Ca::new("edgebeat site CA");
    let options = GatewayOptions {
        per_node_rate: 20.0,
        per_node_burst: 20.0,
        ..gateway_options()
    };
    let cluster = Cluster::start_mqtt_secure(&site, true, options)
        .await
        .unwrap();
    let cert = site.node("edge-p");
    let agent = cluster
        .start_agent(cluster.secure_agent_config("edge-p", &fixture(FACTS), &cert))
        .unwrap();
    cluster
        .wait_for_renewals("edge-p", 2, DEADLINE)
        .await
        .unwrap();
    let lease_topic = format!("{PREFIX}/nodes/edge-p/lease");
    let mut spy = Spy::connect(&cluster, &site.client("spy", None), &[&lease_topic]).await;
    let captured = spy.next_on(&lease_topic).await;
    // Paced so the node's ingress queue never fills (that is a broker-ACL matter).
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    for _ in 0..150 {
        tick.tick().await;
        spy.publish(&lease_topic, captured.clone(), false).await;
    }
    // Each replay is refused as replayed, dropped when a burst from the broker meets a
    // full queue of that node (a flood is a broker-ACL matter, see the README), or
    // superseded in the queue by the node's next genuine renewal.
    wait_for("150 replays refused", DEADLINE, || {
        cluster.rejections(RejectReason::Replayed)
            + cluster.rejections(RejectReason::QueueFull)
            + cluster.rejections(RejectReason::Superseded)
            >= 150
    })
    .await;
    assert!(cluster.rejections(RejectReason::Replayed) >= 140);
    cluster
        .wait_for_renewals("edge-p", 2, DEADLINE)
        .await
        .unwrap();
    assert_eq!(cluster.rejections(RejectReason::RateLimited), 0);
    agent.stop().await.unwrap();
}

/// Not an attack, the MQTT side of a backlog: signed renewals queued for one node while
/// its previous one is being written (a slow apiserver) are not all written; a newer one
/// supersedes the queued one, which is answered as superseded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_writes_only_the_newest_signed_renewal() {
    use edgebeat_hw::Clock as _;
    const NODE: &str = "edge-s";
    let site = Ca::new("edgebeat site CA");
    let cluster = Cluster::start_mqtt_secure(&site, true, gateway_options())
        .await
        .unwrap();
    let cert = site.node(NODE);
    let agent = cluster
        .start_agent(cluster.secure_agent_config(NODE, &fixture(FACTS), &cert))
        .unwrap();
    cluster.wait_for_renewals(NODE, 2, DEADLINE).await.unwrap();
    agent.stop().await.unwrap();

    let acks_topic = format!("{PREFIX}/acks/{NODE}");
    let lease_topic = format!("{PREFIX}/nodes/{NODE}/lease");
    let mut spy = Spy::connect(&cluster, &site.client("spy", None), &[&acks_topic]).await;
    let signer = edgebeat_transports::signing::MessageSigner::from_pem(
        cert.cert_pem.as_bytes(),
        cert.key_pem.as_bytes(),
    )
    .unwrap();
    // The agent's boot (the fixture's boot ID) and boot clock, as its next renewals.
    let boot =
        std::fs::read_to_string(fixture(FACTS).join("proc/sys/kernel/random/boot_id")).unwrap();
    let now_us = u64::try_from(edgebeat_hw::SystemClock.boottime().as_micros()).unwrap();
    let wall_ms = jiff::Timestamp::now().as_millisecond();
    let signed = |seq: u64| {
        let mut message = renewal(NODE, seq);
        if let Some(Kind::Lease(l)) = message.kind.as_mut() {
            let header = l.header.as_mut().unwrap();
            header.boot_id = pb::boot_id_to_bytes(boot.trim());
            header.wall_time_ms = wall_ms;
        }
        signer.seal(message.encode_to_vec()).unwrap()
    };
    cluster.standin.set_latency(Duration::from_millis(500));
    let before = cluster.standin.requests().len();
    let seqs = [now_us, now_us + 1, now_us + 2];
    for seq in seqs {
        spy.publish(&lease_topic, signed(seq), false).await;
    }
    let mut acks = std::collections::BTreeMap::new();
    while acks.len() < 3 {
        let payload = tokio::time::timeout(DEADLINE, spy.next_on(&acks_topic))
            .await
            .expect("three acks");
        let ack = edgebeat_tests::spy::verified_ack(&payload, &site.cert_pem)
            .expect("every answer is signed");
        if seqs.contains(&ack.seq) {
            acks.insert(ack.seq, ack);
        }
    }
    let code = |seq: u64| AckCode::try_from(acks[&seq].code).unwrap();
    let superseded =
        |seq: u64| code(seq) == AckCode::Rejected && acks[&seq].reason.contains("superseded");
    // One node's messages reach the gateway one at a time, and a write takes 500 ms here:
    // an older renewal already with the gateway is written, a queued one is superseded
    // (all three may have been queued at once), and the newest is always written.
    assert_eq!(code(seqs[2]), AckCode::Ok, "{acks:?}");
    assert!(
        superseded(seqs[0]) || superseded(seqs[1]),
        "a renewal queued behind one being written is superseded: {acks:?}"
    );
    for seq in &seqs[..2] {
        assert!(code(*seq) == AckCode::Ok || superseded(*seq), "{acks:?}");
    }
    let written = seqs.iter().filter(|s| code(**s) == AckCode::Ok).count();
    let puts = cluster.standin.requests()[before..]
        .iter()
        .filter(|r| edgebeat_tests::requests::is_lease_put(r, NODE))
        .count();
    assert_eq!(
        puts, written,
        "one Lease write per renewal answered OK, none for the superseded"
    );
}
