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
//! Beside them, the MQTT side of a backlog: queued signed renewals superseded by a newer one,
//! and copies queued behind a renewal refused without an answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use edgebeat_gateway::message_path::GatewayOptions;
use edgebeat_proto::{self as pb, AckCode, agent_message::Kind};
use edgebeat_tests::harness::{Cluster, Transport, fixture, gateway_options, wait_for};
use edgebeat_tests::messages::{BOOT, register, renewal};
use edgebeat_tests::pki::Ca;
use edgebeat_tests::spy::Spy;
use edgebeat_transports::grpc::{GrpcServerOptions, serve};
use edgebeat_transports::ingress::RejectReason;
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
            journal: Vec::new(),
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
    // Paced so the node's mailbox never fills (that is a broker-ACL matter).
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

/// A node of a secure MQTT cluster whose agent ran and stopped, a spy on its ack topic,
/// and the node's own signed renewals to publish in its place: the setting of the backlog
/// tests.
struct Backlog {
    site: Ca,
    cluster: Cluster,
    lease_topic: String,
    acks_topic: String,
    spy: Spy,
    /// The agent's boot clock now, microseconds: the next renewals' sequence numbers.
    now_us: u64,
    /// The node's renewal of sequence number `seq` in the agent's boot (the fixture's boot
    /// ID), signed with its key.
    signed: Box<dyn Fn(u64) -> Vec<u8>>,
}

impl Backlog {
    async fn start(node: &'static str) -> Self {
        use edgebeat_hw::Clock as _;
        let site = Ca::new("edgebeat site CA");
        let cluster = Cluster::start_mqtt_secure(&site, true, gateway_options())
            .await
            .unwrap();
        let cert = site.node(node);
        let agent = cluster
            .start_agent(cluster.secure_agent_config(node, &fixture(FACTS), &cert))
            .unwrap();
        cluster.wait_for_renewals(node, 2, DEADLINE).await.unwrap();
        agent.stop().await.unwrap();
        let acks_topic = format!("{PREFIX}/acks/{node}");
        let lease_topic = format!("{PREFIX}/nodes/{node}/lease");
        let spy = Spy::connect(&cluster, &site.client("spy", None), &[&acks_topic]).await;
        let signer = edgebeat_transports::signing::MessageSigner::from_pem(
            cert.cert_pem.as_bytes(),
            cert.key_pem.as_bytes(),
        )
        .unwrap();
        let boot =
            std::fs::read_to_string(fixture(FACTS).join("proc/sys/kernel/random/boot_id")).unwrap();
        let now_us = u64::try_from(edgebeat_hw::SystemClock.boottime().as_micros()).unwrap();
        let wall_ms = jiff::Timestamp::now().as_millisecond();
        let signed = Box::new(move |seq: u64| {
            let mut message = renewal(node, seq);
            if let Some(Kind::Lease(l)) = message.kind.as_mut() {
                let header = l.header.as_mut().unwrap();
                header.boot_id = pb::boot_id_to_bytes(boot.trim());
                header.wall_time_ms = wall_ms;
            }
            signer.seal(message.encode_to_vec()).unwrap()
        });
        Self {
            site,
            cluster,
            lease_topic,
            acks_topic,
            spy,
            now_us,
            signed,
        }
    }
}

/// Not an attack, the MQTT side of a backlog: signed renewals queued for one node while
/// its previous one is being written (a slow apiserver) are not all written; a newer one
/// supersedes the queued one, which is answered as superseded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_writes_only_the_newest_signed_renewal() {
    const NODE: &str = "edge-s";
    let Backlog {
        site,
        cluster,
        lease_topic,
        acks_topic,
        mut spy,
        now_us,
        signed,
    } = Backlog::start(NODE).await;
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

/// Replays of a signed renewal that reach a node's queue behind it used to be answered: the
/// node's next genuine renewal superseded each queued copy, and each drew a signed
/// `superseded` answer on the node's ack topic (seen in CI as two answers to one renewal
/// in test 9). Now a copy of a message already queued is refused at once, unanswered:
/// the renewal gets exactly one answer however many copies follow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_queued_behind_a_renewal_get_no_answer() {
    const NODE: &str = "edge-q";
    const COPIES: usize = 5;
    let Backlog {
        site,
        cluster,
        lease_topic,
        acks_topic,
        mut spy,
        now_us,
        signed,
    } = Backlog::start(NODE).await;
    // A write takes 500 ms: the copies arrive while the first renewal is queued or being
    // written, and the next genuine one after them.
    cluster.standin.set_latency(Duration::from_millis(500));
    let replayed_before = cluster.rejections(RejectReason::Replayed);
    let (first, next) = (now_us, now_us + 1);
    let original = signed(first);
    for _ in 0..=COPIES {
        spy.publish(&lease_topic, original.clone(), false).await;
    }
    spy.publish(&lease_topic, signed(next), false).await;
    // Answers are published in the order they were decided: every answer to the first
    // renewal precedes the next one's.
    let mut answered_first = Vec::new();
    loop {
        let payload = spy.next_on(&acks_topic).await;
        let ack = edgebeat_tests::spy::verified_ack(&payload, &site.cert_pem)
            .expect("every answer is signed");
        if ack.seq == next {
            assert_eq!(AckCode::try_from(ack.code), Ok(AckCode::Ok), "{ack:?}");
            break;
        }
        if ack.seq == first {
            answered_first.push((ack.code, ack.reason));
        }
    }
    assert_eq!(
        answered_first.len(),
        1,
        "one answer to the renewal, none to its copies: {answered_first:?}"
    );
    assert!(
        cluster.rejections(RejectReason::Replayed) >= replayed_before + COPIES as u64,
        "every copy refused as replayed"
    );
}

// ---------------------------------------------------------------------------------------
// Identity both ways: what identity rests on (the gateway's answers, the broker's retained
// certificates, TLS handshake slots) forged, rolled back or starved. Each attack must leave
// the genuine node's Lease renewed within its duration and write nothing forged.

/// `Header.seq` of a node's signed message as published on its topic.
fn seq_of(payload: &[u8]) -> u64 {
    let (signed, _) = edgebeat_transports::signing::unseal(payload).expect("a signed message");
    pb::AgentMessage::decode(signed.as_slice())
        .unwrap()
        .header()
        .unwrap()
        .seq
}

/// 7. Answers on `…/acks/<node>` used to be taken from anyone who could publish there:
///    one `node_not_found` answering a pending renewal's sequence number (readable in clear
///    on the lease topic) stopped the agent for good. Now the agent that signs takes only
///    answers the gateway signed for its node and boot: forged plain answers, and answers
///    signed with a node's key (a compromised node), change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_answers_cannot_stop_a_node() {
    let site = Ca::new("edgebeat site CA");
    let cluster = Cluster::start_mqtt_secure(&site, true, gateway_options())
        .await
        .unwrap();
    let cert = site.node("edge-f");
    let mut config = cluster.secure_agent_config("edge-f", &fixture(FACTS), &cert);
    config.healthz_bind_address = Some("127.0.0.1:0".parse().unwrap());
    let agent = cluster.start_agent(config).unwrap();
    cluster
        .wait_for_renewals("edge-f", 2, DEADLINE)
        .await
        .unwrap();
    let lease_topic = format!("{PREFIX}/nodes/edge-f/lease");
    let acks_topic = format!("{PREFIX}/acks/edge-f");
    let mut spy = Spy::connect(&cluster, &site.client("spy", None), &[&lease_topic]).await;
    // A compromised node's key signs answers too: its certificate is the site CA's.
    let rogue = site.node("edge-rogue");
    let rogue_key = edgebeat_transports::tls::parse_private_key(rogue.key_pem.as_bytes()).unwrap();
    let rogue_signer = rustls::crypto::ring::sign::any_supported_type(&rogue_key)
        .unwrap()
        .choose_scheme(&[rustls::SignatureScheme::ECDSA_NISTP256_SHA256])
        .unwrap();
    let rogue_chain: Vec<Vec<u8>> =
        edgebeat_transports::tls::parse_certificates(rogue.cert_pem.as_bytes())
            .unwrap()
            .iter()
            .map(|c| c.to_vec())
            .collect();
    let before = cluster.standin.requests().len();
    for _ in 0..20 {
        // Everything a signed answer binds is readable on the lease topic: node, boot
        // (its tag) and the pending sequence number.
        let renewal = spy.next_on(&lease_topic).await;
        let (signed, _) = edgebeat_transports::signing::unseal(&renewal).unwrap();
        let header = pb::AgentMessage::decode(signed.as_slice())
            .unwrap()
            .header()
            .cloned()
            .unwrap();
        let forged = pb::GatewayMessage {
            kind: Some(pb::gateway_message::Kind::Ack(pb::Ack {
                node_name: "edge-f".into(),
                boot_tag: header.named_boot_tag(),
                ..pb::Answer::NodeNotFound {
                    reason: "forged".into(),
                }
                .into_ack(header.seq)
            })),
        };
        spy.publish(&acks_topic, forged.encode_to_vec(), false)
            .await;
        let signed_message = forged.encode_to_vec();
        let mut covered = edgebeat_transports::signing::ANSWER_CONTEXT.to_vec();
        covered.extend_from_slice(&signed_message);
        let by_a_node = pb::SignedAnswer {
            signed_message,
            signature: rogue_signer.sign(&covered).unwrap(),
            certificate_chain: rogue_chain.clone(),
        };
        spy.publish(&acks_topic, by_a_node.encode_to_vec(), false)
            .await;
    }
    cluster
        .wait_for_renewals("edge-f", 8, DEADLINE)
        .await
        .unwrap();
    assert_eq!(
        edgebeat_tests::harness::agent_sample(&agent, "edgebeat_agent_node_not_found").await,
        0.0
    );
    let requests = cluster.standin.requests();
    let gap = edgebeat_tests::requests::longest_renewal_gap(&requests[before..], "edge-f").unwrap();
    assert!(gap < Duration::from_secs(1), "Lease unrenewed for {gap:?}");
    assert_eq!(cluster.gateway().counters.nodes_not_found.get(), 0);
    agent.stop().await.unwrap();
}

/// 8. A node's certificate on the broker used to be all a restarted replica knew of it:
///    an older valid certificate of the node, or an empty payload, retained on
///    `…/certificates/<node>`, and then any gateway restart, made the replica refuse every
///    genuine message (0 Lease writes for a minute and more). Now the certificate a node
///    speaks with is recorded on its Node: a rolled-back copy is refused against the
///    record, and a replica without a current copy asks the node, in a signed answer, to
///    publish it again. Over two restarts the Lease stays renewed within its duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_or_cleared_certificates_survive_a_gateway_restart() {
    const NODE: &str = "edge-k";
    let site = Ca::new("edgebeat site CA");
    let mut cluster = Cluster::start_mqtt_secure(&site, true, gateway_options())
        .await
        .unwrap();
    let (old, current) = (site.node_from(NODE, 2024), site.node_from(NODE, 2025));
    let mut config = cluster.secure_agent_config(NODE, &fixture(FACTS), &current);
    // Renewals every second: a gateway restart fits in the 4 s lease.
    config.node_lease_duration_seconds = 4;
    let agent = cluster.start_agent(config).unwrap();
    cluster.wait_for_renewals(NODE, 2, DEADLINE).await.unwrap();
    let recorded = |cluster: &Cluster| {
        cluster
            .standin
            .node(NODE)
            .and_then(|n| n.metadata.annotations)
            .and_then(|a| a.get("edgebeat.io/node-certificate-not-before").cloned())
    };
    wait_for("the certificate recorded on the Node", DEADLINE, || {
        recorded(&cluster).as_deref() == Some("2025-01-01T00:00:00Z")
    })
    .await;
    let certificate_topic = format!("{PREFIX}/certificates/{NODE}");
    let spy = Spy::connect(&cluster, &site.client("spy", None), &[]).await;
    let old_chain = pb::NodeCertificate {
        certificate_chain: edgebeat_transports::tls::parse_certificates(old.cert_pem.as_bytes())
            .unwrap()
            .iter()
            .map(|c| c.to_vec())
            .collect(),
    };
    for retained in [old_chain.encode_to_vec(), Vec::new()] {
        let rolled_back = !retained.is_empty();
        spy.publish(&certificate_topic, retained, true).await;
        let before = cluster.standin.requests().len();
        cluster.restart_gateway(gateway_options()).await.unwrap();
        if rolled_back {
            // The restarted replica read the retained copy, and refused it.
            cluster
                .wait_for_rejections(RejectReason::Certificate, 1, DEADLINE)
                .await;
        }
        cluster.wait_for_renewals(NODE, 6, DEADLINE).await.unwrap();
        let requests = cluster.standin.requests();
        let gap = edgebeat_tests::requests::longest_renewal_gap(&requests[before..], NODE).unwrap();
        assert!(
            gap < Duration::from_secs(4),
            "rolled back: {rolled_back}; Lease unrenewed for {gap:?}"
        );
    }
    assert_eq!(recorded(&cluster).as_deref(), Some("2025-01-01T00:00:00Z"));
    agent.stop().await.unwrap();
}

/// 9. Replays used to be answered: thousands of a node's freshest signed renewal drew as
///    many `replayed` answers on its ack topic (its metered link), and the agent took them
///    as the fate of renewals that had been written; stale replays drew `clock_skew`. Now a
///    replay gets no answer at all, and the agent counts no failed renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_get_no_answer() {
    use edgebeat_hw::Clock as _;
    const NODE: &str = "edge-y";
    let site = Ca::new("edgebeat site CA");
    let cluster = Cluster::start_mqtt_secure(&site, true, gateway_options())
        .await
        .unwrap();
    let cert = site.node(NODE);
    let mut config = cluster.secure_agent_config(NODE, &fixture(FACTS), &cert);
    config.healthz_bind_address = Some("127.0.0.1:0".parse().unwrap());
    let agent = cluster.start_agent(config).unwrap();
    cluster.wait_for_renewals(NODE, 2, DEADLINE).await.unwrap();
    let lease_topic = format!("{PREFIX}/nodes/{NODE}/lease");
    let acks_topic = format!("{PREFIX}/acks/{NODE}");
    let mut spy = Spy::connect(
        &cluster,
        &site.client("spy", None),
        &[&lease_topic, &acks_topic],
    )
    .await;
    let captured = spy.next_on(&lease_topic).await;
    let mut replayed = vec![seq_of(&captured)];
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    for _ in 0..300 {
        tick.tick().await;
        spy.publish(&lease_topic, captured.clone(), false).await;
    }
    // Stale ones: the node's own key on a renewal of its boot signed a minute ago.
    let signer = edgebeat_transports::signing::MessageSigner::from_pem(
        cert.cert_pem.as_bytes(),
        cert.key_pem.as_bytes(),
    )
    .unwrap();
    let boot =
        std::fs::read_to_string(fixture(FACTS).join("proc/sys/kernel/random/boot_id")).unwrap();
    let now_us = u64::try_from(edgebeat_hw::SystemClock.boottime().as_micros()).unwrap();
    let minute_ago = jiff::Timestamp::now().as_millisecond() - 60_000;
    for i in 0..100 {
        let mut message = renewal(NODE, now_us + i);
        if let Some(Kind::Lease(l)) = message.kind.as_mut() {
            let header = l.header.as_mut().unwrap();
            header.boot_id = pb::boot_id_to_bytes(boot.trim());
            header.wall_time_ms = minute_ago;
        }
        replayed.push(now_us + i);
        tick.tick().await;
        spy.publish(
            &lease_topic,
            signer.seal(message.encode_to_vec()).unwrap(),
            false,
        )
        .await;
    }
    cluster
        .wait_for_rejections(RejectReason::ClockSkew, 100, DEADLINE)
        .await;
    wait_for("the replays refused", DEADLINE, || {
        cluster.rejections(RejectReason::Replayed)
            + cluster.rejections(RejectReason::QueueFull)
            + cluster.rejections(RejectReason::Superseded)
            >= 300
    })
    .await;
    cluster.wait_for_renewals(NODE, 4, DEADLINE).await.unwrap();
    let answered: Vec<u64> = spy
        .received_on(&acks_topic)
        .iter()
        .filter_map(|p| edgebeat_tests::spy::verified_ack(p, &site.cert_pem))
        .map(|ack| ack.seq)
        .filter(|seq| replayed.contains(seq))
        .collect();
    assert!(answered.is_empty(), "replays answered: {answered:?}");
    assert_eq!(
        edgebeat_tests::harness::agent_sample(
            &agent,
            "edgebeat_agent_lease_renewals_total{result=\"failed\"}"
        )
        .await,
        0.0
    );
    agent.stop().await.unwrap();
}

/// 10. Idle sockets, or sockets that sent one byte and stalled, from many addresses (each
///     under the per-address limit) used to hold every TLS handshake slot: genuine new
///     mTLS connections succeeded 2 times in 18, then 0 in 20. Then a full listener let a
///     new connection in and the oldest incomplete handshake gave way, but a genuine
///     connection whose ClientHello was not read yet could be that oldest once 128 flood
///     sockets reopened before its task ran (1 in 18 reset in CI). Now the handshake that
///     gives way is the oldest of the address holding the most: every genuine handshake
///     succeeds while the flood goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_sockets_from_many_addresses_cannot_starve_handshakes() {
    const ADDRESSES: u8 = 40;
    const PER_ADDRESS: usize = 7;
    let site = Ca::new("edgebeat site CA");
    // Scaled down from the defaults (1,024 and 32) with the same shape: 280 stalled
    // sockets, each address under its limit, more than the listener's 128 slots.
    let grpc = GrpcServerOptions {
        max_handshakes: 128,
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
    let flood = CancellationToken::new();
    for host in 0..ADDRESSES {
        for n in 0..PER_ADDRESS {
            let flood = flood.clone();
            let source = std::net::SocketAddr::from(([127, 0, 1, 2 + host], 0));
            // Half stay silent, half send one byte of a ClientHello and stall; each is
            // reopened as soon as the gateway closes it.
            let trickle = n % 2 == 1;
            tokio::spawn(async move {
                while !flood.is_cancelled() {
                    let socket = tokio::net::TcpSocket::new_v4().unwrap();
                    socket.bind(source).unwrap();
                    let Ok(mut stream) = socket.connect(addr).await else {
                        // Out of ports for a moment: no busy loop beside the gateway.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    if trickle {
                        let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, &[0x16]).await;
                    }
                    let mut sink = [0u8; 64];
                    tokio::select! {
                        () = flood.cancelled() => {}
                        _ = tokio::io::AsyncReadExt::read(&mut stream, &mut sink) => {}
                    }
                }
            });
        }
    }
    cluster
        .wait_for_rejections(RejectReason::TlsHandshake, 200, DEADLINE)
        .await;
    let cert = site.node("edge-t");
    let config = std::sync::Arc::new(
        edgebeat_transports::tls::ClientTls {
            ca_pem: site.cert_pem.clone().into_bytes(),
            client_identity: Some(edgebeat_transports::tls::TlsIdentity {
                cert_pem: cert.cert_pem.into_bytes(),
                key_pem: cert.key_pem.into_bytes(),
            }),
        }
        .rustls_config()
        .unwrap(),
    );
    let mut failed = Vec::new();
    for attempt in 0..18 {
        let config = config.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            let mut socket = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
            socket
                .set_read_timeout(Some(Duration::from_secs(5)))
                .map_err(|e| e.to_string())?;
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let mut tls = rustls::ClientConnection::new(config, name).map_err(|e| e.to_string())?;
            while tls.is_handshaking() {
                tls.complete_io(&mut socket).map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(())
        })
        .await
        .unwrap();
        if let Err(why) = outcome {
            failed.push((attempt, why));
        }
    }
    flood.cancel();
    assert!(failed.is_empty(), "genuine handshakes failed: {failed:?}");
}

/// 11. With `--allow-unidentified-agents`, "a node that spoke with its identity refuses
///     unidentified messages" used to hold only until the gateway restarted: right after a
///     restart a plaintext NotReady for a live node with a certificate was written. Now the
///     Node's recorded certificate says so to every replica, restarted or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identified_node_stays_identified_across_a_gateway_restart() {
    const NODE: &str = "edge-u";
    let site = Ca::new("edgebeat site CA");
    // mTLS with the certificate optional: the unsafe posture, explicitly.
    let grpc = GrpcServerOptions {
        require_node_identity: false,
        ..edgebeat_tests::harness::mtls_options(&site)
    };
    let mut cluster = Cluster::start_grpc_with(grpc, gateway_options())
        .await
        .unwrap();
    let cert = site.node(NODE);
    let agent = cluster
        .start_agent(identified_config(&cluster, NODE, &site, &cert))
        .unwrap();
    cluster.wait_for_renewals(NODE, 2, DEADLINE).await.unwrap();
    wait_for("the certificate recorded on the Node", DEADLINE, || {
        cluster
            .standin
            .node(NODE)
            .and_then(|n| n.metadata.annotations)
            .is_some_and(|a| a.contains_key("edgebeat.io/node-certificate-sha256"))
    })
    .await;
    cluster.restart_gateway(gateway_options()).await.unwrap();
    let (forger, stop) = unidentified_uplink(&cluster, &site, "edge-forger").await;
    let answer = forger
        .send(not_ready(NODE, u64::MAX / 2), DEADLINE)
        .await
        .unwrap();
    assert_eq!(answer.code(), AckCode::Rejected, "{}", answer.reason());
    assert!(cluster.rejections(RejectReason::Unauthenticated) >= 1);
    cluster.wait_for_renewals(NODE, 3, DEADLINE).await.unwrap();
    assert_eq!(ready_status(&cluster, NODE).as_deref(), Some("True"));
    stop.cancel();
    agent.stop().await.unwrap();
}

/// 12. With `--allow-unidentified-agents`, made-up names over an unidentified connection
///     used to fill `--max-nodes`, and a genuine new node with a certificate was then
///     refused (`fleet_full`) for as long as they lasted. Now an identified node takes the
///     place of an unidentified one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_names_cannot_keep_an_identified_node_out() {
    let site = Ca::new("edgebeat site CA");
    let grpc = GrpcServerOptions {
        require_node_identity: false,
        ..edgebeat_tests::harness::mtls_options(&site)
    };
    let options = GatewayOptions {
        max_nodes: 64,
        ..gateway_options()
    };
    let cluster = Cluster::start_grpc_with(grpc, options).await.unwrap();
    let (forger, stop) = unidentified_uplink(&cluster, &site, "made-up-first").await;
    for i in 0..100 {
        let _ = forger
            .send(register(&format!("made-up-{i}"), 10 + i), DEADLINE)
            .await;
    }
    assert_eq!(cluster.gateway().tracked_nodes(), 64);
    assert!(cluster.rejections(RejectReason::FleetFull) >= 36);
    let cert = site.node("edge-n");
    let agent = cluster
        .start_agent(identified_config(&cluster, "edge-n", &site, &cert))
        .unwrap();
    cluster
        .wait_for_renewals("edge-n", 3, DEADLINE)
        .await
        .unwrap();
    assert_eq!(cluster.gateway().tracked_nodes(), 64);
    stop.cancel();
    agent.stop().await.unwrap();
}

/// An agent of an mTLS cluster for `node`, with `cert` as its identity.
fn identified_config(
    cluster: &Cluster,
    node: &str,
    site: &Ca,
    cert: &edgebeat_tests::pki::Leaf,
) -> edgebeat_agent::AgentConfig {
    let mut config = cluster.agent_config(node, &fixture(FACTS));
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
    config
}

/// A hand-driven gRPC uplink over TLS without a client certificate (unidentified),
/// registered as `node`: what anyone who can reach an unsafe listener has.
async fn unidentified_uplink(
    cluster: &Cluster,
    site: &Ca,
    node: &'static str,
) -> (edgebeat_transports::uplink::Uplink, CancellationToken) {
    use edgebeat_transports::grpc::{GrpcUplinkOptions, run_uplink};
    let (uplink, driver) = edgebeat_transports::uplink::channel(4);
    let cancel = CancellationToken::new();
    let mut options = GrpcUplinkOptions::new(cluster.grpc_url.clone());
    options.tls = Some(edgebeat_transports::tls::ClientTls {
        ca_pem: site.cert_pem.clone().into_bytes(),
        client_identity: None,
    });
    let register_fn: edgebeat_transports::uplink::RegisterFn =
        std::sync::Arc::new(move || register(node, 1));
    let stop = cancel.clone();
    tokio::spawn(async move {
        let mut driver = driver;
        run_uplink(options, register_fn, &mut driver, stop).await
    });
    let mut registered = uplink.registered();
    tokio::time::timeout(DEADLINE, registered.wait_for(|r| *r))
        .await
        .unwrap()
        .unwrap();
    (uplink, cancel)
}

/// A status report for `node` saying it is not Ready (a forger's).
fn not_ready(node: &str, seq: u64) -> pb::AgentMessage {
    let mut message = register(node, seq);
    let Some(Kind::Register(r)) = message.kind.take() else {
        unreachable!()
    };
    let mut status = r.status.unwrap();
    status.conditions[0].status = "False".into();
    status.conditions[0].reason = "KubeletNotReady".into();
    message.kind = Some(Kind::Status(pb::StatusReport {
        header: r.header,
        status: Some(status),
        unchanged: false,
        journal: Vec::new(),
    }));
    message
}

/// Connects to `cluster`'s broker over TLS with `identity` (none: no client certificate)
/// asking for `client_id`, and keeps the connection polled until the task is aborted;
/// returns whether the broker took it (its CONNACK came within the deadline).
async fn connect_as(
    cluster: &Cluster,
    identity: Option<&edgebeat_tests::pki::Leaf>,
    client_id: &str,
) -> (bool, tokio::task::JoinHandle<()>) {
    let security = cluster.mqtt_security().unwrap();
    let broker = cluster.broker.as_ref().unwrap();
    connect_to(broker.port(), &security.site_ca_pem, identity, client_id).await
}

/// As [`connect_as`], to the broker's listener on `port` of 127.0.0.1 whose certificate
/// chains to `ca_pem`.
async fn connect_to(
    port: u16,
    ca_pem: &str,
    identity: Option<&edgebeat_tests::pki::Leaf>,
    client_id: &str,
) -> (bool, tokio::task::JoinHandle<()>) {
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};
    let tls = edgebeat_transports::tls::ClientTls {
        ca_pem: ca_pem.as_bytes().to_vec(),
        client_identity: identity.map(|leaf| edgebeat_transports::tls::TlsIdentity {
            cert_pem: leaf.cert_pem.clone().into_bytes(),
            key_pem: leaf.key_pem.clone().into_bytes(),
        }),
    };
    let mut options = MqttOptions::new(client_id, "127.0.0.1", port);
    options.set_transport(rumqttc::Transport::tls_with_config(
        rumqttc::TlsConfiguration::Rustls(Arc::new(tls.rustls_config().unwrap())),
    ));
    let (_client, mut eventloop) = AsyncClient::new(options, 16);
    let (accepted_tx, accepted) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let _client = _client;
        let mut accepted_tx = Some(accepted_tx);
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    accepted_tx.take().map(|tx| tx.send(true));
                }
                Ok(_) => {}
                Err(_) => {
                    accepted_tx.take().map(|tx| tx.send(false));
                    // Reconnecting as a persistent intruder would, at its own pace.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
    let taken = tokio::time::timeout(DEADLINE, accepted)
        .await
        .is_ok_and(|r| r.unwrap_or(false));
    (taken, task)
}

/// 7. MQTT gives a client ID to whoever connects last: a client reusing the gateway's or an
///    agent's client ID once took its session over and over (every node got 0–1 Lease
///    writes in 30 s). On the broker posture the README asks for (client certificates
///    required, each client's ID its certificate's identity: Mosquitto's
///    `require_certificate`, `use_identity_as_username`, `use_username_as_clientid`), a
///    client without a certificate is refused, and one with another node's certificate
///    asking for the gateway's or the agent's ID gets its own identity as its ID: no session
///    is taken, and the agent's Lease never goes older than its duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_can_take_the_gateways_or_an_agents_mqtt_session() {
    let site = Ca::new("edgebeat site CA");
    let cluster = Cluster::start_mqtt_secure(&site, true, gateway_options())
        .await
        .unwrap();
    let cert = site.node("edge-t");
    let agent = cluster
        .start_agent(cluster.secure_agent_config("edge-t", &fixture(FACTS), &cert))
        .unwrap();
    cluster
        .wait_for_renewals("edge-t", 2, DEADLINE)
        .await
        .unwrap();
    let before = cluster.standin.requests().len();
    // The IDs the gateway and the agent ask for, and the identities the broker gives them.
    let victims = [
        "edgebeat-gateway-0",
        "edgebeat-gateway",
        "edgebeat-agent-edge-t",
        "system:node:edge-t",
    ];
    let (anonymous, task) = connect_as(&cluster, None, victims[0]).await;
    task.abort();
    assert!(!anonymous, "a client without a certificate is refused");
    let intruder = site.node("edge-x");
    let mut intruders = Vec::new();
    for round in 0..3 {
        for victim in victims {
            let (taken, task) = connect_as(&cluster, Some(&intruder), victim).await;
            assert!(taken, "round {round}: another node's certificate connects");
            intruders.push(task);
        }
    }
    let sent = cluster.standin.requests().len();
    cluster
        .wait_for_renewals("edge-t", 6, DEADLINE)
        .await
        .unwrap();
    let requests = cluster.standin.requests();
    let gap = edgebeat_tests::requests::longest_renewal_gap(&requests[before..], "edge-t")
        .expect("renewals through the attack");
    let log = cluster.broker.as_ref().unwrap().log();
    for victim in ["edgebeat-gateway", "system:node:edge-t"] {
        assert!(
            !log.contains(&format!("Client {victim} already connected")),
            "{victim}'s session was taken:\n{log}"
        );
    }
    assert!(
        log.contains("as system:node:edge-x"),
        "the intruder got its own identity as its client ID:\n{log}"
    );
    assert!(
        gap < Duration::from_secs(1),
        "the genuine Lease went {gap:?} unrenewed, longer than its 1 s duration"
    );
    assert!(requests.len() > sent);
    for task in intruders {
        task.abort();
    }
    agent.stop().await.unwrap();
}

/// 7, the gateway's side. On a broker that binds client IDs to certificate identities, the
/// gateway's replicas, which share one certificate in `deploy/`, would share one ID and take
/// each other's session. On the listener of their own README asks for
/// (`per_listener_settings`, certificates of a CA only gateways hold, the IDs they ask for
/// kept), two `edgebeat-gateway` binaries with one certificate and `--mqtt-client-id`s of
/// their own both stay subscribed, while no client without a gateway certificate gets in
/// there, and one on the agents' listener asking for a replica's ID gets its own identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_replicas_keep_their_sessions_on_a_listener_of_their_own() {
    use edgebeat_tests::broker::{Broker, BrokerTls};
    use edgebeat_tests::harness::http_get;
    use edgebeat_tests::process::GatewayProcess;
    let site = Ca::new("edgebeat site CA");
    let gateways = Ca::new("edgebeat gateways CA");
    let server = site.server();
    let broker = Broker::start_tls_with_gateways(
        BrokerTls {
            require_certificate: true,
            bind_client_ids: true,
            ca_pem: site.cert_pem.clone(),
            cert_pem: server.cert_pem,
            key_pem: server.key_pem,
        },
        &gateways.cert_pem,
    )
    .await
    .unwrap();
    let gateway_port = broker.gateway_port().unwrap();
    let standin = edgebeat_tests::standin::StandIn::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let certificate = gateways.client("edgebeat-gateway", None);
    let answers = site.answers();
    let file = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let site_ca = file("site-ca.crt", &site.cert_pem);
    let (cert, key) = (
        file("gateway.crt", &certificate.cert_pem),
        file("gateway.key", &certificate.key_pem),
    );
    let (answer_cert, answer_key) = (
        file("answers.crt", &answers.cert_pem),
        file("answers.key", &answers.key_pem),
    );
    let replica = |id: &str| {
        GatewayProcess::start(
            [
                "--server".to_owned(),
                standin.url(),
                format!("--mqtt-endpoint=mqtts://127.0.0.1:{gateway_port}"),
                format!("--mqtt-ca-file={site_ca}"),
                format!("--mqtt-cert-file={cert}"),
                format!("--mqtt-key-file={key}"),
                format!("--mqtt-client-id={id}"),
                format!("--mqtt-node-ca={site_ca}"),
                format!("--mqtt-answer-cert-file={answer_cert}"),
                format!("--mqtt-answer-key-file={answer_key}"),
                "--metrics-listen=127.0.0.1:0".to_owned(),
            ],
            &dir.path().join(format!("{id}.log")),
        )
        .unwrap()
    };
    let mut replicas = [replica("edgebeat-gateway-a"), replica("edgebeat-gateway-b")];
    let mut health = Vec::new();
    for replica in &mut replicas {
        health.push(
            replica
                .address("serving /healthz, /readyz and /metrics")
                .await
                .unwrap(),
        );
    }
    let all_ready = || {
        let health = health.clone();
        async move {
            for addr in health {
                if http_get(addr, "/readyz").await.map(|a| a.0).ok() != Some(200) {
                    return false;
                }
            }
            true
        }
    };
    edgebeat_tests::wait::eventually("both replicas subscribed", DEADLINE, all_ready).await;

    let intruder = site.node("edge-x");
    let mut intruders = Vec::new();
    for victim in ["edgebeat-gateway-a", "edgebeat-gateway-b"] {
        let (anonymous, task) = connect_to(gateway_port, &site.cert_pem, None, victim).await;
        task.abort();
        assert!(
            !anonymous,
            "a client without a certificate on the gateways' listener"
        );
        let (node, task) = connect_to(gateway_port, &site.cert_pem, Some(&intruder), victim).await;
        task.abort();
        assert!(!node, "a node certificate on the gateways' listener");
        let (connected, task) =
            connect_to(broker.port(), &site.cert_pem, Some(&intruder), victim).await;
        assert!(connected, "a node certificate on the agents' listener");
        intruders.push(task);
    }
    assert!(all_ready().await, "both replicas still subscribed");
    let log = broker.log();
    for victim in ["edgebeat-gateway-a", "edgebeat-gateway-b"] {
        assert!(
            !log.contains(&format!("Client {victim} already connected")),
            "{victim}'s session was taken:\n{log}"
        );
        assert!(
            log.contains(&format!("as {victim}")),
            "{victim} connected with the ID it asked for:\n{log}"
        );
    }
    assert!(
        log.contains("as system:node:edge-x"),
        "the intruder got its own identity as its client ID:\n{log}"
    );
    for task in intruders {
        task.abort();
    }
    for replica in &mut replicas {
        assert!(replica.terminate().await.unwrap().success());
    }
}
