//! The MQTT transport against a real Mosquitto (Debian's `mosquitto` package), one broker
//! per test on a free loopback port.
#![cfg(all(feature = "mqtt-uplink", feature = "mqtt-ingress"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgebeat_proto::{
    AgentMessage, Answer, Header, HeaderForm, LeaseRenewal, Register, ResourceUsage, SharedUsage,
    StatusReport, agent_message::Kind,
};
use edgebeat_transports::ingress::{Handler, Peer, RejectReason, Rejection, TransportKind};
use edgebeat_transports::mqtt::{
    self, MqttIngressError, MqttIngressOptions, MqttUplinkError, MqttUplinkOptions,
};
use edgebeat_transports::uplink::{self, RegisterFn, Uplink, UplinkError};
use prost::Message;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use broker::Mosquitto;

const PREFIX: &str = "edgebeat/v1";
/// Upper bound for anything that should happen "soon" (reconnects included).
const DEADLINE: Duration = Duration::from_secs(20);
const BOOT_ID: [u8; 16] = [0x0f; 16];

// ---------------------------------------------------------------------------------------
// An agent's messages.

struct Node {
    name: String,
    seq: AtomicU64,
}

impl Node {
    fn new(name: &str) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            seq: AtomicU64::new(1),
        })
    }

    fn header(&self) -> Header {
        Header {
            node_name: self.name.clone(),
            boot_id: BOOT_ID.to_vec(),
            seq: self.seq.fetch_add(1, Ordering::SeqCst),
            wall_time_ms: 1_780_000_000_000,
            boot_tag: 0,
        }
    }

    fn register(&self) -> AgentMessage {
        AgentMessage {
            kind: Some(Kind::Register(Register {
                header: Some(self.header()),
                ..Register::default()
            })),
        }
    }

    fn lease(&self) -> AgentMessage {
        AgentMessage {
            kind: Some(Kind::Lease(LeaseRenewal {
                header: Some(self.header()),
                lease_duration_seconds: 40,
                lease_state: Vec::new(),
                quiet: false,
                usage: None,
            })),
        }
    }

    fn status(&self) -> AgentMessage {
        AgentMessage {
            kind: Some(Kind::Status(StatusReport {
                header: Some(self.header()),
                status: None,
                unchanged: false,
                journal: Vec::new(),
            })),
        }
    }

    fn register_fn(self: &Arc<Self>) -> RegisterFn {
        let me = self.clone();
        Arc::new(move || me.register())
    }
}

fn seq_of(message: &AgentMessage) -> u64 {
    message.header().unwrap().seq
}

// ---------------------------------------------------------------------------------------
// A gateway's handler that records everything.

#[derive(Debug, Clone)]
struct Seen {
    peer: Peer,
    node: String,
    kind: &'static str,
    seq: u64,
}

struct Recorder {
    seen: Mutex<Vec<Seen>>,
    rejected: Mutex<Vec<(RejectReason, String)>>,
    /// Other replicas' usage samples ([`Handler::shared_usage`]).
    shared: Mutex<Vec<SharedUsage>>,
    changes: watch::Sender<u64>,
    /// Messages of this node wait for a permit before they are handled.
    hold: Option<(String, Arc<tokio::sync::Semaphore>)>,
}

impl Recorder {
    fn new() -> Arc<Self> {
        Self::sharing(watch::channel(0).0)
    }

    /// A recorder that signals its changes on `changes` (shared by replicas).
    fn sharing(changes: watch::Sender<u64>) -> Arc<Self> {
        Arc::new(Self {
            seen: Mutex::new(Vec::new()),
            rejected: Mutex::new(Vec::new()),
            shared: Mutex::new(Vec::new()),
            changes,
            hold: None,
        })
    }

    /// A recorder whose handling of `node` waits for permits on the returned semaphore.
    fn holding(node: &str) -> (Arc<Self>, Arc<tokio::sync::Semaphore>) {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let recorder = Arc::new(Self {
            seen: Mutex::new(Vec::new()),
            rejected: Mutex::new(Vec::new()),
            shared: Mutex::new(Vec::new()),
            changes: watch::channel(0).0,
            hold: Some((node.to_owned(), gate.clone())),
        });
        (recorder, gate)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn rejected(&self) -> Vec<(RejectReason, String)> {
        self.rejected.lock().unwrap().clone()
    }

    fn count(&self, node: &str, kind: &str) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.node == node && s.kind == kind)
            .count()
    }

    /// Waits (up to [`DEADLINE`]) until `condition` holds, re-checking on every message.
    async fn until(&self, what: &str, broker: &Mosquitto, condition: impl Fn(&Self) -> bool) {
        let mut changes = self.changes.subscribe();
        let waited = tokio::time::timeout(DEADLINE, changes.wait_for(|_| condition(self))).await;
        if let Err(e) = waited {
            panic!(
                "{e} waiting for {what}; seen {:?}, rejected {:?}\nbroker log:\n{}",
                self.seen(),
                self.rejected(),
                broker.log()
            );
        }
    }
}

/// The [`Recorder`]'s answer to the renewal with `Header.seq` `seq`.
fn renewed(seq: u64) -> Answer {
    Answer::Renewed {
        lease_state: format!("rv-{seq}").into_bytes(),
        resend_status: false,
    }
}

impl Handler for Recorder {
    async fn handle(&self, peer: &Peer, message: AgentMessage) -> Option<Answer> {
        let header = message.header().cloned().unwrap_or_default();
        let kind = message.kind_name();
        if let Some((node, gate)) = &self.hold
            && *node == header.node_name
        {
            gate.acquire().await.unwrap().forget();
        }
        self.seen.lock().unwrap().push(Seen {
            peer: peer.clone(),
            node: header.node_name,
            kind,
            seq: header.seq,
        });
        self.changes.send_modify(|n| *n += 1);
        // A renewal's Lease state names the renewal, so a test can tell its answer.
        Some(match kind {
            "register" => Answer::Registered {
                headers: HeaderForm::Full,
                resend_status: false,
                certificate_due: false,
            },
            "lease" => Answer::Renewed {
                lease_state: format!("rv-{}", header.seq).into_bytes(),
                resend_status: false,
            },
            _ => Answer::WRITTEN,
        })
    }

    fn rejected(&self, _peer: &Peer, reason: RejectReason, detail: &str) {
        self.rejected
            .lock()
            .unwrap()
            .push((reason, detail.to_owned()));
        self.changes.send_modify(|n| *n += 1);
    }

    fn shared_usage(&self, usage: SharedUsage) {
        self.shared.lock().unwrap().push(usage);
        self.changes.send_modify(|n| *n += 1);
    }
}

// ---------------------------------------------------------------------------------------
// Starting both halves.

fn uplink_options(broker: &Mosquitto) -> MqttUplinkOptions {
    let mut options = MqttUplinkOptions::new(broker.host(), broker.port());
    options.backoff_min = Duration::from_millis(50);
    options.backoff_max = Duration::from_millis(500);
    options.register_timeout = Duration::from_millis(500);
    options
}

struct Agent {
    uplink: Uplink,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), MqttUplinkError>>,
}

fn start_agent(options: MqttUplinkOptions, node: &Arc<Node>) -> Agent {
    let (uplink, driver) = uplink::channel(8);
    let cancel = CancellationToken::new();
    let (name, register, stop) = (node.name.clone(), node.register_fn(), cancel.clone());
    let task = tokio::spawn(async move {
        let mut driver = driver;
        mqtt::run_uplink(options, name, register, &mut driver, stop).await
    });
    Agent {
        uplink,
        cancel,
        task,
    }
}

impl Agent {
    async fn until_registered(&self, broker: &Mosquitto) {
        let mut registered = self.uplink.registered();
        let waited = tokio::time::timeout(DEADLINE, registered.wait_for(|r| *r)).await;
        if let Err(e) = waited {
            panic!(
                "agent never registered ({e})\nbroker log:\n{}",
                broker.log()
            );
        }
    }
}

struct Gateway {
    cancel: CancellationToken,
    task: JoinHandle<Result<(), MqttIngressError>>,
}

fn start_gateway(options: MqttIngressOptions, handler: &Arc<Recorder>) -> Gateway {
    let cancel = CancellationToken::new();
    let task = tokio::spawn(mqtt::serve(
        options,
        handler.clone(),
        cancel.clone().cancelled_owned(),
    ));
    Gateway { cancel, task }
}

impl Gateway {
    async fn stop(self) {
        self.cancel.cancel();
        let result = tokio::time::timeout(DEADLINE, self.task).await;
        assert!(matches!(result, Ok(Ok(Ok(())))), "{result:?}");
    }
}

/// A plain rumqttc client: publishes raw bytes and, with `filter`, forwards what it
/// receives. Returns once the broker acknowledged the connection (and the subscription).
async fn raw_client(
    broker: &Mosquitto,
    id: &str,
    filter: Option<&str>,
) -> (AsyncClient, mpsc::UnboundedReceiver<Publish>) {
    let (client, mut eventloop) =
        AsyncClient::new(MqttOptions::new(id, broker.host(), broker.port()), 64);
    if let Some(filter) = filter {
        client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
    }
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let (tx, rx) = mpsc::unbounded_channel();
    let want_suback = filter.is_some();
    tokio::spawn(async move {
        let mut ready_tx = Some(ready_tx);
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) if !want_suback => {
                    ready_tx.take().map(|r| r.send(()));
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    ready_tx.take().map(|r| r.send(()));
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    tokio::time::timeout(DEADLINE, ready)
        .await
        .expect("raw client ready")
        .expect("raw client event loop");
    (client, rx)
}

async fn next_publish(rx: &mut mpsc::UnboundedReceiver<Publish>, broker: &Mosquitto) -> Publish {
    match tokio::time::timeout(DEADLINE, rx.recv()).await {
        Ok(Some(p)) => p,
        other => panic!("no publish: {other:?}\nbroker log:\n{}", broker.log()),
    }
}

fn topic(p: &Publish) -> String {
    String::from_utf8_lossy(&p.topic).into_owned()
}

// ---------------------------------------------------------------------------------------
// Tests.

/// Uplink ↔ ingress through the broker: Register goes first, a lease gets its Ack (with
/// the gateway's lease state), and the gateway sees an MQTT peer with no address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uplink_and_ingress_exchange_register_and_lease_acks() {
    let broker = Mosquitto::start().await;
    let handler = Recorder::new();
    let gateway = start_gateway(
        MqttIngressOptions::new(broker.host(), broker.port(), "gw-0"),
        &handler,
    );
    let node = Node::new("edge-0001");
    let agent = start_agent(uplink_options(&broker), &node);
    agent.until_registered(&broker).await;

    let lease = node.lease();
    let seq = seq_of(&lease);
    let ack = agent
        .uplink
        .send(lease, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(ack, renewed(seq));
    let ack = agent
        .uplink
        .send(node.status(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(ack, Answer::WRITTEN);

    let seen = handler.seen();
    assert_eq!(seen[0].kind, "register", "{seen:?}");
    let kinds: Vec<_> = seen.iter().map(|s| s.kind).collect();
    assert_eq!(kinds, ["register", "lease", "status"]);
    for s in &seen {
        assert_eq!(s.node, "edge-0001");
        assert_eq!(s.peer, Peer::unidentified(TransportKind::Mqtt, None));
    }
    assert!(handler.rejected().is_empty());

    agent.cancel.cancel();
    assert!(matches!(agent.task.await, Ok(Ok(()))));
    gateway.stop().await;
}

/// Lease renewals carry a Message Expiry Interval (so the broker never delivers a stale
/// backlog); Register and status carry none; nothing is retained. Also measures a
/// renewal's size on the wire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_publishes_carry_message_expiry() {
    let broker = Mosquitto::start().await;
    let (_spy, mut spied) = raw_client(&broker, "spy", Some(&format!("{PREFIX}/nodes/+/+"))).await;
    let node = Node::new("edge-0002");
    let mut options = uplink_options(&broker);
    options.lease_expiry = Duration::from_secs(7);
    options.register_timeout = Duration::from_secs(60);
    let agent = start_agent(options, &node);

    // Connected once Register shows up (no gateway here: nobody answers).
    let register = next_publish(&mut spied, &broker).await;
    assert_eq!(
        topic(&register),
        format!("{PREFIX}/nodes/edge-0002/register")
    );
    assert_eq!(
        AgentMessage::decode(register.payload.as_ref())
            .unwrap()
            .kind_name(),
        "register"
    );

    let lease = node.lease();
    let lease_bytes = lease.encoded_len();
    let answer = agent.uplink.send(lease, Duration::from_millis(200)).await;
    assert_eq!(
        answer,
        Err(UplinkError::Timeout(Duration::from_millis(200)))
    );
    let status = node.status();
    let _ = agent.uplink.send(status, Duration::from_millis(200)).await;

    let lease = next_publish(&mut spied, &broker).await;
    assert_eq!(topic(&lease), format!("{PREFIX}/nodes/edge-0002/lease"));
    let expiry = lease
        .properties
        .as_ref()
        .and_then(|p| p.message_expiry_interval);
    // Mosquitto forwards the remaining lifetime: 7, or 6 if a second boundary passed.
    assert!(matches!(expiry, Some(6 | 7)), "{:?}", lease.properties);
    let status = next_publish(&mut spied, &broker).await;
    assert_eq!(topic(&status), format!("{PREFIX}/nodes/edge-0002/status"));
    for p in [&register, &lease, &status] {
        assert_eq!(p.qos, QoS::AtLeastOnce);
        assert!(!p.retain);
    }
    for p in [&register, &status] {
        assert_eq!(
            p.properties
                .as_ref()
                .and_then(|p| p.message_expiry_interval),
            None
        );
    }

    // PUBLISH on the wire: fixed header (1 + remaining-length varint), topic (2 + len),
    // packet id (2), properties (length byte + expiry property 5), payload.
    let topic_len = lease.topic.len();
    let remaining = 2 + topic_len + 2 + 1 + 5 + lease_bytes;
    let wire = 1 + if remaining < 128 { 1 } else { 2 } + remaining;
    assert_eq!(lease.payload.len(), lease_bytes);
    assert!(lease_bytes < 64, "renewal payload {lease_bytes} bytes");
    eprintln!(
        "lease renewal: payload {lease_bytes} B, topic {topic_len} B, PUBLISH {wire} B on the wire"
    );

    agent.cancel.cancel();
    assert!(matches!(agent.task.await, Ok(Ok(()))));
}

/// Two gateway replicas on the shared subscription split the messages: each one is
/// handled exactly once in total, and both replicas get some.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_subscription_splits_messages_between_replicas() {
    let broker = Mosquitto::start().await;
    let changes = watch::channel(0).0;
    let a = Recorder::sharing(changes.clone());
    let b = Recorder::sharing(changes);
    let replica = |id: &str| MqttIngressOptions::new(broker.host(), broker.port(), id);
    let gw_a = start_gateway(replica("gw-a"), &a);
    let gw_b = start_gateway(replica("gw-b"), &b);
    let (publisher, _) = raw_client(&broker, "publisher", None).await;
    let probes = |a: &Recorder, b: &Recorder| a.count("probe", "lease") + b.count("probe", "lease");

    // Both replicas are subscribed once each has handled a probe (the broker hands
    // messages round-robin to the subscribed members of a group). A probe published before
    // any replica subscribed is lost, so one that is not handled within a second is
    // followed by another.
    let probe = Node::new("probe");
    let mut sent = 0;
    while a.count("probe", "lease") == 0 || b.count("probe", "lease") == 0 {
        assert!(sent < 100, "a replica never got a probe\n{}", broker.log());
        let before = probes(&a, &b);
        publisher
            .publish(
                mqtt::node_topic(PREFIX, "probe", "lease"),
                QoS::AtLeastOnce,
                false,
                probe.lease().encode_to_vec(),
            )
            .await
            .unwrap();
        sent += 1;
        let mut changes = a.changes.subscribe();
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            changes.wait_for(|_| probes(&a, &b) > before),
        )
        .await;
    }

    const PER_NODE: u64 = 10;
    let nodes: Vec<_> = (0..4).map(|i| Node::new(&format!("edge-{i:04}"))).collect();
    for _ in 0..PER_NODE {
        for node in &nodes {
            let kind = if node.seq.load(Ordering::SeqCst) % 2 == 0 {
                node.status()
            } else {
                node.lease()
            };
            publisher
                .publish(
                    mqtt::node_topic(PREFIX, &node.name, kind.kind_name()),
                    QoS::AtLeastOnce,
                    false,
                    kind.encode_to_vec(),
                )
                .await
                .unwrap();
        }
    }
    let fleet = |r: &Recorder| -> Vec<(String, u64)> {
        r.seen()
            .into_iter()
            .filter(|s| s.node != "probe")
            .map(|s| (s.node, s.seq))
            .collect()
    };
    let expected = nodes.len() * PER_NODE as usize;
    a.until("all messages handled", &broker, |a| {
        fleet(a).len() + fleet(&b).len() >= expected
    })
    .await;
    let (from_a, from_b) = (fleet(&a), fleet(&b));
    let unique: HashSet<_> = from_a.iter().chain(&from_b).cloned().collect();
    assert_eq!(from_a.len() + from_b.len(), nodes.len() * PER_NODE as usize);
    assert_eq!(unique.len(), nodes.len() * PER_NODE as usize, "duplicates");
    assert!(
        !from_a.is_empty() && !from_b.is_empty(),
        "a got {}, b got {}",
        from_a.len(),
        from_b.len()
    );
    eprintln!(
        "replica a handled {}, replica b {}",
        from_a.len(),
        from_b.len()
    );
    assert!(a.rejected().is_empty() && b.rejected().is_empty());
    gw_a.stop().await;
    gw_b.stop().await;
}

/// A site CA (PEM) and an answer key it issued (serverAuth, valid for the gateway's name),
/// as a replica signs its answers and shared samples with.
fn site_with_answer_key() -> (String, Arc<edgebeat_transports::signing::AnswerSigner>) {
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
    let name = edgebeat_transports::signing::ANSWER_SIGNER_NAME.to_owned();
    let mut params = CertificateParams::new(vec![name]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let signer = edgebeat_transports::signing::AnswerSigner::from_pem(
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
        ca_pem.as_bytes(),
    )
    .unwrap();
    (ca_pem, Arc::new(signer))
}

/// Two replicas sharing usage, each signing its batches with its answer key of the site CA
/// and verifying the other's, hear each other's samples through the broker (`P/usage`),
/// never their own (No Local). What anyone else on the broker publishes there is refused
/// whole: a plain batch as unsigned, one signed by another site's answer key as a
/// certificate refused, garbage as malformed; and sharing goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_signed_usage_samples_with_each_other_not_themselves() {
    let broker = Mosquitto::start().await;
    let changes = watch::channel(0).0;
    let (a, b) = (
        Recorder::sharing(changes.clone()),
        Recorder::sharing(changes),
    );
    let (ca_pem, signer) = site_with_answer_key();
    let outbox_a = tokio::sync::broadcast::channel(16).0;
    let outbox_b = tokio::sync::broadcast::channel(16).0;
    let replica = |id: &str, outbox: &edgebeat_transports::ingress::UsageOutbox| {
        let mut options = MqttIngressOptions::new(broker.host(), broker.port(), id);
        options.usage_sharing = Some(outbox.clone());
        options.answer_signer = Some(signer.clone());
        options.usage_verifier = Some(
            edgebeat_transports::signing::AnswerVerifier::from_pem(ca_pem.as_bytes()).unwrap(),
        );
        options
    };
    let gw_a = start_gateway(replica("gw-a", &outbox_a), &a);
    let gw_b = start_gateway(replica("gw-b", &outbox_b), &b);
    let sample = |node: &str, cpu_usage_ms: u64| SharedUsage {
        usage: Some(ResourceUsage {
            cpu_usage_ms,
            memory_working_set_kib: 2048,
        }),
        sampled_ms: 1_790_000_000_000,
        node_name: node.to_owned(),
    };
    let shared = |r: &Recorder| r.shared.lock().unwrap().clone();
    // Until both replicas are subscribed, samples are not shared (QoS 0, only while
    // subscribed): each sends one again when the other has none within 1.5 s (a batch
    // waits up to 1 s for others).
    let both = |a: &Recorder, b: &Recorder| !shared(a).is_empty() && !shared(b).is_empty();
    let mut changes = a.changes.subscribe();
    for _ in 0..20 {
        if both(&a, &b) {
            break;
        }
        let _ = outbox_a.send(sample("edge-a", 1));
        let _ = outbox_b.send(sample("edge-b", 2));
        let _ = tokio::time::timeout(
            mqtt::USAGE_LINGER + Duration::from_millis(500),
            changes.wait_for(|_| both(&a, &b)),
        )
        .await;
    }
    assert!(
        shared(&b).iter().all(|s| *s == sample("edge-a", 1)) && !shared(&b).is_empty(),
        "b holds a's samples only: {:?}\n{}",
        shared(&b),
        broker.log()
    );
    assert!(
        shared(&a).iter().all(|s| *s == sample("edge-b", 2)) && !shared(&a).is_empty(),
        "a holds b's samples only: {:?}",
        shared(&a)
    );

    let forged = edgebeat_proto::SharedUsageBatch {
        samples: vec![sample("edge-a", u64::MAX / 2)],
    };
    let (_, stranger) = site_with_answer_key();
    let (publisher, _) = raw_client(&broker, "intruder", None).await;
    let intrusions = [
        (forged.encode_to_vec(), RejectReason::Unsigned),
        (
            stranger.seal_usage(&forged).unwrap(),
            RejectReason::Certificate,
        ),
        (vec![0xff, 0xff, 0xff], RejectReason::Malformed),
    ];
    for (payload, reason) in intrusions {
        publisher
            .publish(mqtt::usage_topic(PREFIX), QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
        b.until(
            &format!("the intruder's batch refused as {reason:?}"),
            &broker,
            |b| b.rejected().iter().any(|(r, _)| *r == reason),
        )
        .await;
    }
    assert!(
        shared(&b).iter().all(|s| *s == sample("edge-a", 1)),
        "nothing of the intruder's taken: {:?}",
        shared(&b)
    );
    let before = shared(&b).len();
    let _ = outbox_a.send(sample("edge-a", 3));
    b.until("a's next sample after it", &broker, |b| {
        b.shared.lock().unwrap().len() > before
    })
    .await;
    assert_eq!(shared(&b).last(), Some(&sample("edge-a", 3)));
    gw_a.stop().await;
    gw_b.stop().await;
}

/// Malformed, oversized, mismatched and unknown-topic publishes are reported through
/// `Handler::rejected`, and a legitimate node keeps getting acks meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_publishes_are_rejected_and_good_nodes_keep_going() {
    let broker = Mosquitto::start().await;
    let handler = Recorder::new();
    let mut options = MqttIngressOptions::new(broker.host(), broker.port(), "gw-0");
    options.max_packet_bytes = 1024;
    let gateway = start_gateway(options, &handler);
    let good = Node::new("good");
    let agent = start_agent(uplink_options(&broker), &good);
    agent.until_registered(&broker).await;
    let ack = agent
        .uplink
        .send(good.lease(), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(ack.is_written(), "{ack:?}");

    let (publisher, _) = raw_client(&broker, "intruder", None).await;
    let intruder = Node::new("intruder");
    let bad: [(String, Vec<u8>, Rejection); 5] = [
        (
            mqtt::node_topic(PREFIX, "evil", "lease"),
            vec![0xff, 0xff, 0xff],
            mqtt::REJECT_MALFORMED,
        ),
        (
            mqtt::node_topic(PREFIX, "good", "lease"),
            intruder.lease().encode_to_vec(),
            mqtt::REJECT_MISMATCH,
        ),
        (
            mqtt::node_topic(PREFIX, "intruder", "status"),
            intruder.lease().encode_to_vec(),
            mqtt::REJECT_MISMATCH,
        ),
        (
            mqtt::node_topic(PREFIX, "evil", "lease"),
            vec![0x0a; 2000],
            mqtt::REJECT_TOO_LARGE,
        ),
        (
            mqtt::node_topic(PREFIX, "evil", "bogus"),
            intruder.lease().encode_to_vec(),
            mqtt::REJECT_UNKNOWN_TOPIC,
        ),
    ];
    for (topic, payload, _) in &bad {
        publisher
            .publish(topic.clone(), QoS::AtLeastOnce, false, payload.clone())
            .await
            .unwrap();
    }
    handler
        .until("every bad publish rejected", &broker, |h| {
            h.rejected().len() >= bad.len()
        })
        .await;
    let mut reasons = handler.rejected();
    let mut expected: Vec<_> = bad
        .iter()
        .map(|(_, _, r)| (r.reason, r.detail.to_string()))
        .collect();
    reasons.sort();
    expected.sort();
    assert_eq!(reasons, expected);

    for _ in 0..3 {
        let lease = good.lease();
        let seq = seq_of(&lease);
        let ack = agent
            .uplink
            .send(lease, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(ack, renewed(seq));
    }
    assert!(
        handler.seen().iter().all(|s| s.node == "good"),
        "nothing foreign reached the handler"
    );
    agent.cancel.cancel();
    gateway.stop().await;
}

/// A stand-in for a broker node without shared subscriptions (an RMQTT node without its
/// shared-subscription plugin; Mosquitto 2.0 grants every subscription): accepts MQTT 5
/// connections and answers every SUBSCRIBE with `SharedSubscriptionsNotSupported` (0x9E),
/// written with rumqttc's own codec. Returns its port and the count of refused SUBSCRIBEs.
async fn refusing_broker() -> (u16, watch::Receiver<u64>) {
    use rumqttc::v5::mqttbytes::v5::SubscribeReasonCode;
    use rumqttc::v5::mqttbytes::v5::{ConnAck, ConnectReturnCode, SubAck};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (count, refused) = watch::channel(0u64);
    let count = Arc::new(count);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = bytes::BytesMut::new();
                loop {
                    let packet = match Packet::read(&mut buf, None) {
                        Ok(packet) => packet,
                        Err(rumqttc::v5::mqttbytes::Error::InsufficientBytes(_)) => {
                            match socket.read_buf(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(_) => continue,
                            }
                        }
                        Err(_) => return,
                    };
                    let answer = match packet {
                        Packet::Connect(..) => Packet::ConnAck(ConnAck {
                            session_present: false,
                            code: ConnectReturnCode::Success,
                            properties: None,
                        }),
                        Packet::Subscribe(s) => {
                            count.send_modify(|n| *n += 1);
                            Packet::SubAck(SubAck {
                                pkid: s.pkid,
                                return_codes: vec![
                                    SubscribeReasonCode::SharedSubscriptionsNotSupported;
                                    s.filters.len()
                                ],
                                properties: None,
                            })
                        }
                        Packet::PingReq(_) => {
                            Packet::PingResp(rumqttc::v5::mqttbytes::v5::PingResp)
                        }
                        _ => continue,
                    };
                    let mut out = bytes::BytesMut::new();
                    if answer.write(&mut out, None).is_err()
                        || socket.write_all(&out).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (port, refused)
}

/// A broker node that refuses the shared subscription while the next node of the list
/// grants it: the replica moves on to the next node, as after a lost connection, and
/// serves from there. Only every node refusing in a row ends the ingress (a site's
/// configuration, which retrying will not mend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_refused_by_one_broker_subscribes_on_the_next() {
    let (refusing, refused) = refusing_broker().await;
    let granting = Mosquitto::start().await;
    let handler = Recorder::new();
    let subscribed = Arc::new(tokio::sync::watch::channel(false).0);
    let mut options = MqttIngressOptions::new("127.0.0.1", refusing, "gw-0");
    options.failover = vec![(granting.host().to_owned(), granting.port())];
    options.subscribed = Some(subscribed.clone());
    let gateway = start_gateway(options, &handler);
    let mut granted = subscribed.subscribe();
    let waited = tokio::time::timeout(DEADLINE, granted.wait_for(|s| *s)).await;
    // The timeout is the check; the watch itself outlives the wait.
    let _ = waited.expect("never subscribed on the second broker");
    assert_eq!(*refused.borrow(), 1, "the first node refused once");
    let node = Node::new("edge-0001");
    let agent = start_agent(uplink_options(&granting), &node);
    agent.until_registered(&granting).await;
    assert!(!gateway.task.is_finished(), "the ingress keeps serving");
    gateway.stop().await;

    // The only broker refusing: the configuration, reported.
    let alone = start_gateway(
        MqttIngressOptions::new("127.0.0.1", refusing, "gw-1"),
        &handler,
    );
    let result = tokio::time::timeout(DEADLINE, alone.task).await;
    assert!(
        matches!(
            result,
            Ok(Ok(Err(MqttIngressError::SubscribeRefused { .. })))
        ),
        "{result:?}"
    );
}

/// A node that refuses and a node that is down are not every node refusing: the replica
/// keeps going round the list (the count is of refusals in a row), so the second node's
/// return finds it still trying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_and_a_dead_node_do_not_stop_the_replica() {
    let (refusing, refused) = refusing_broker().await;
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut options = MqttIngressOptions::new("127.0.0.1", refusing, "gw-0");
    options.failover = vec![("127.0.0.1".to_owned(), down)];
    let mut gateway = start_gateway(options, &Recorder::new());
    // Three rounds of refused, then down (the backoff doubles from 200 ms: about 6 s).
    let mut refusals = refused.clone();
    tokio::select! {
        waited = tokio::time::timeout(DEADLINE, refusals.wait_for(|n| *n >= 3)) => {
            let _ = waited.unwrap_or_else(|e| panic!("refused {} times: {e}", *refused.borrow()));
        }
        ended = &mut gateway.task => panic!("the replica gave up: {ended:?}"),
    }
    gateway.stop().await;
}

/// The event loop never waits for the handler: while one node's messages are stuck in
/// the handler, another node's are answered, and the stuck ones are all delivered once
/// the handler moves. (How many of a node's messages may wait, and in which order they
/// are handled, is the gateway's mailbox: `gateway::tests::a_flooding_node_waits_in_its_mailbox`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_node_does_not_starve_others() {
    let broker = Mosquitto::start().await;
    let (handler, gate) = Recorder::holding("flood");
    let options = MqttIngressOptions::new(broker.host(), broker.port(), "gw-0");
    let gateway = start_gateway(options, &handler);
    let good = Node::new("good");
    let agent = start_agent(uplink_options(&broker), &good);
    agent.until_registered(&broker).await;

    let (publisher, _) = raw_client(&broker, "flood", None).await;
    let flood = Node::new("flood");
    const FLOOD: usize = 30;
    for _ in 0..FLOOD {
        publisher
            .publish(
                mqtt::node_topic(PREFIX, "flood", "lease"),
                QoS::AtLeastOnce,
                false,
                flood.lease().encode_to_vec(),
            )
            .await
            .unwrap();
    }
    for _ in 0..3 {
        let ack = agent
            .uplink
            .send(good.lease(), Duration::from_secs(5))
            .await
            .unwrap();
        assert!(ack.is_written(), "{ack:?}");
    }
    assert_eq!(
        handler.count("flood", "lease"),
        0,
        "the flood is still stuck"
    );
    // Released, every flood message is handled.
    gate.add_permits(FLOOD);
    handler
        .until("the flood handled", &broker, |h| {
            h.count("flood", "lease") == FLOOD
        })
        .await;
    assert!(handler.rejected().is_empty(), "{:?}", handler.rejected());
    agent.cancel.cancel();
    gateway.stop().await;
}

/// A broker restart is a new connection to the broker, not to the gateway: the uplink
/// reconnects and keeps its registration (no second Register), and heartbeats get acks
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uplink_reconnects_after_broker_restart_without_registering_again() {
    let mut broker = Mosquitto::start().await;
    let handler = Recorder::new();
    let gateway = start_gateway(
        MqttIngressOptions::new(broker.host(), broker.port(), "gw-0"),
        &handler,
    );
    let node = Node::new("edge-0005");
    let agent = start_agent(uplink_options(&broker), &node);
    agent.until_registered(&broker).await;
    let registers_before = handler.count("edge-0005", "register");
    assert!(
        agent
            .uplink
            .send(node.lease(), Duration::from_secs(5))
            .await
            .is_ok()
    );

    broker.restart().await;
    // Renew until a renewal is acknowledged through the new connections (the gateway's and
    // the agent's own reconnects race; refused attempts are the agent's normal retries).
    let acked = tokio::time::timeout(DEADLINE, async {
        loop {
            let lease = node.lease();
            let seq = seq_of(&lease);
            if let Ok(ack) = agent.uplink.send(lease, Duration::from_secs(1)).await
                && ack.is_written()
            {
                assert_eq!(ack, renewed(seq));
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await; // the agent's retry pacing
        }
    })
    .await;
    if let Err(e) = acked {
        panic!(
            "no renewal acknowledged after the broker restart ({e})\n{}",
            broker.log()
        );
    }
    assert_eq!(
        handler.count("edge-0005", "register"),
        registers_before,
        "no second Register"
    );
    assert!(*agent.uplink.registered().borrow());

    agent.cancel.cancel();
    assert!(matches!(agent.task.await, Ok(Ok(()))));
    gateway.stop().await;
}

/// With no broker, requests are refused at once and never queued: after the broker comes
/// up, the gateway sees Register first and none of the refused messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_refused_not_queued_while_disconnected() {
    let mut broker = Mosquitto::start().await;
    broker.stop();
    let node = Node::new("edge-0007");
    let agent = start_agent(uplink_options(&broker), &node);
    let mut refused = Vec::new();
    for _ in 0..3 {
        let lease = node.lease();
        refused.push(seq_of(&lease));
        let answer = agent.uplink.send(lease, Duration::from_secs(5)).await;
        assert_eq!(answer, Err(UplinkError::NotConnected));
    }

    broker.restart().await;
    let handler = Recorder::new();
    let gateway = start_gateway(
        MqttIngressOptions::new(broker.host(), broker.port(), "gw-0"),
        &handler,
    );
    agent.until_registered(&broker).await;
    let ack = agent
        .uplink
        .send(node.lease(), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(ack.is_written(), "{ack:?}");
    let seen = handler.seen();
    assert_eq!(seen[0].kind, "register", "{seen:?}");
    assert!(
        seen.iter().all(|s| !refused.contains(&s.seq)),
        "a refused message was delivered late: {seen:?}"
    );
    agent.cancel.cancel();
    gateway.stop().await;
}

/// A clean shutdown sends DISCONNECT, so the broker discards the Last Will; an abrupt end
/// (task aborted, socket closed) makes the broker publish it, with the session's Header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_will_only_on_abrupt_disconnect() {
    let broker = Mosquitto::start().await;
    let (_spy, mut spied) = raw_client(&broker, "spy", Some(&format!("{PREFIX}/nodes/+/+"))).await;

    let clean = Node::new("clean");
    let agent = start_agent(uplink_options(&broker), &clean);
    let first = next_publish(&mut spied, &broker).await;
    assert_eq!(topic(&first), format!("{PREFIX}/nodes/clean/register"));
    agent.cancel.cancel();
    let stopped = tokio::time::timeout(DEADLINE, agent.task).await;
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");

    let abrupt = Node::new("abrupt");
    let agent = start_agent(uplink_options(&broker), &abrupt);
    // Everything the spy gets from here on: the broker delivers to one subscriber in
    // order, so a will of "clean" (published when its connection ended) would come first.
    let mut received = Vec::new();
    loop {
        let p = next_publish(&mut spied, &broker).await;
        let t = topic(&p);
        received.push(t.clone());
        if t == format!("{PREFIX}/nodes/abrupt/register") {
            break;
        }
    }
    agent.task.abort();
    assert!(agent.task.await.unwrap_err().is_cancelled());
    let will = loop {
        let p = next_publish(&mut spied, &broker).await;
        let t = topic(&p);
        received.push(t.clone());
        if t.ends_with("/will") {
            break p;
        }
    };
    assert_eq!(topic(&will), format!("{PREFIX}/nodes/abrupt/will"));
    assert!(!will.retain);
    let header = Header::decode(will.payload.as_ref()).unwrap();
    assert_eq!(header.node_name, "abrupt");
    assert_eq!(header.boot_id, BOOT_ID);
    assert!(
        !received.iter().any(|t| t.contains("/clean/will")),
        "clean shutdown published a will: {received:?}"
    );
}

// ---------------------------------------------------------------------------------------

/// A tiny Mosquitto launcher (the fuller one lives in `edgebeat-tests`, which this crate
/// cannot depend on).
mod broker {
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    pub struct Mosquitto {
        child: Option<Child>,
        port: u16,
        dir: PathBuf,
    }

    impl Mosquitto {
        /// Starts Mosquitto on a free loopback port (retrying if another process grabs
        /// the port between our probe and Mosquitto's bind).
        pub async fn start() -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "edgebeat-mqtt-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let mut broker = Self {
                child: None,
                port: 0,
                dir,
            };
            for _ in 0..5 {
                broker.port = std::net::TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
                    .port();
                if broker.spawn().await {
                    return broker;
                }
            }
            panic!("Mosquitto did not start:\n{}", broker.log());
        }

        pub fn host(&self) -> &str {
            "127.0.0.1"
        }

        pub fn port(&self) -> u16 {
            self.port
        }

        pub fn log(&self) -> String {
            std::fs::read_to_string(self.dir.join("mosquitto.log")).unwrap_or_default()
        }

        /// Kills the broker (like a crash: no goodbye to clients).
        pub fn stop(&mut self) {
            if let Some(mut child) = self.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }

        /// Stops and starts again on the same port.
        pub async fn restart(&mut self) {
            self.stop();
            assert!(
                self.spawn().await,
                "Mosquitto did not restart:\n{}",
                self.log()
            );
        }

        async fn spawn(&mut self) -> bool {
            let config = self.dir.join("mosquitto.conf");
            // `user root`: when run as root, Mosquitto would otherwise switch to the
            // `mosquitto` user, who cannot write the log in our temp dir (no effect
            // otherwise).
            std::fs::write(
                &config,
                format!(
                    "listener {} 127.0.0.1\nallow_anonymous true\npersistence false\n\
                     max_queued_messages 1000\nuser root\nlog_dest file {}\nlog_type all\n",
                    self.port,
                    self.dir.join("mosquitto.log").display()
                ),
            )
            .unwrap();
            let binary = ["mosquitto", "/usr/sbin/mosquitto"]
                .into_iter()
                .find(|b| {
                    Command::new(b)
                        .arg("-h")
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status()
                        .is_ok()
                })
                .expect("mosquitto not found: apt-get install mosquitto");
            let child = Command::new(binary)
                .arg("-c")
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            self.child = Some(child);
            // Waiting for an external process to listen: poll its port (with short sleeps,
            // nothing to subscribe to), give up if it exits.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while tokio::time::Instant::now() < deadline {
                if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                    .await
                    .is_ok()
                {
                    return true;
                }
                let exited = self
                    .child
                    .as_mut()
                    .is_none_or(|c| c.try_wait().ok().flatten().is_some());
                if exited {
                    self.child = None;
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            self.stop();
            false
        }
    }

    impl Drop for Mosquitto {
        fn drop(&mut self) {
            self.stop();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// MQTT gives a client ID to whoever connects last: a client connecting with a replica's
/// client ID takes its session. Mosquitto 2.0.11 (Debian's) closes the replica's connection
/// without the MQTT 5 DISCONNECT reason 0x8E (Session taken over) that brokers such as
/// EMQX and HiveMQ send, so the replica sees a connection lost like any other and counts no
/// takeover; the broker's log names it. This test holds that finding: it fails the day the
/// broker tells, and the replica then counts it (`sessions_taken_over`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_takes_a_session_over_without_saying_so() {
    let broker = Mosquitto::start().await;
    let handler = Recorder::new();
    let taken = Arc::new(AtomicU64::new(0));
    let (subscribed_tx, mut subscribed) = watch::channel(false);
    let mut options = MqttIngressOptions::new(broker.host(), broker.port(), "gw-victim");
    options.sessions_taken_over = Some(taken.clone());
    options.subscribed = Some(Arc::new(subscribed_tx));
    let gateway = start_gateway(options, &handler);
    tokio::time::timeout(DEADLINE, subscribed.wait_for(|s| *s))
        .await
        .expect("the replica subscribed")
        .unwrap();
    let (_thief, _) = raw_client(&broker, "gw-victim", None).await;
    tokio::time::timeout(DEADLINE, subscribed.wait_for(|s| !*s))
        .await
        .expect("the replica lost its session")
        .unwrap();
    assert!(
        broker
            .log()
            .contains("Client gw-victim already connected, closing old connection."),
        "{}",
        broker.log()
    );
    assert_eq!(
        taken.load(Ordering::Relaxed),
        0,
        "Mosquitto now says Session taken over: the replica counts it; say so in deploy/README.md's EdgebeatGatewayMqttSessionTakenOver\n{}",
        broker.log()
    );
    gateway.stop().await;
}
