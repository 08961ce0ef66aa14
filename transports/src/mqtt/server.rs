//! The gateway's MQTT ingress: one shared subscription, a worker task per active node.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use edgebeat_proto::{
    AgentMessage, GatewayMessage, Header, MAX_AGENT_MESSAGE_BYTES, gateway_message,
};
use prost::Message;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, SubscribeReasonCode};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{
    CONNECT_TIMEOUT_SECS, DEFAULT_KEEPALIVE, DEFAULT_SHARE_GROUP, DEFAULT_TOPIC_PREFIX,
    MESSAGE_KINDS, WILL_KIND, acks_topic, check_keepalive, check_level, check_prefix, disconnect,
    gateway_filter, next_event, parse_node_topic,
};
use crate::ingress::{Handler, Peer, TransportKind};

/// [`Handler::rejected`] reason: the payload is larger than `max_packet_bytes`.
pub const REJECT_TOO_LARGE: &str = "message too large";
/// [`Handler::rejected`] reason: the payload is not a protobuf `AgentMessage`.
pub const REJECT_MALFORMED: &str = "malformed message";
/// [`Handler::rejected`] reason: the topic's node or kind disagrees with the message (its
/// header's node name, its kind); counts as a foreign message.
pub const REJECT_MISMATCH: &str = "topic/node mismatch";
/// [`Handler::rejected`] reason: a topic under the subscription that is not
/// `P/nodes/{node}/{register|status|lease|will}`.
pub const REJECT_UNKNOWN_TOPIC: &str = "unknown topic";
/// [`Handler::rejected`] reason: the node's worker queue was full; the message is dropped so
/// that one node's flood cannot starve the others.
pub const REJECT_QUEUE_FULL: &str = "per-node queue full";

/// Headroom above `max_packet_bytes` for the PUBLISH header (topic, properties) in the
/// Maximum Packet Size announced to the broker, so that payloads a little over the limit
/// still arrive and are counted as rejected. Larger packets the broker drops itself.
const PACKET_HEADROOM: usize = 4096;

/// Capacity of rumqttc's request queue (acks from all workers). Workers wait for room, the
/// event loop never does.
const REQUEST_QUEUE: usize = 256;

/// A node's worker ends after this long without messages (a new one starts on demand).
const WORKER_IDLE: Duration = Duration::from_secs(300);

/// Reconnect delays to the broker: 200 ms doubling with jitter to 7 s.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(7);

/// Settings of the gateway's MQTT ingress.
#[derive(Debug, Clone)]
pub struct MqttIngressOptions {
    /// Broker host name or address.
    pub host: String,
    /// Broker port (1883 for plain MQTT).
    pub port: u16,
    /// MQTT client identifier; unique per replica (a pod name), or replicas take each
    /// other's session over.
    pub client_id: String,
    /// Username and password for the broker, if it wants them.
    pub credentials: Option<(String, String)>,
    /// Prefix of every topic (default [`DEFAULT_TOPIC_PREFIX`]).
    pub topic_prefix: String,
    /// Shared-subscription group (default [`DEFAULT_SHARE_GROUP`]); replicas in one group
    /// split the messages between them.
    pub share_group: String,
    /// MQTT keepalive (default [`DEFAULT_KEEPALIVE`], 30 s; at least 5 s).
    pub keepalive: Duration,
    /// Largest accepted payload in bytes (default [`MAX_AGENT_MESSAGE_BYTES`]).
    pub max_packet_bytes: usize,
    /// Messages waiting per node (default 8); when full, new ones are dropped and reported
    /// as [`REJECT_QUEUE_FULL`].
    pub per_node_queue: usize,
    /// Set to `true` when the broker has granted the shared subscription, `false` when the
    /// connection is lost: a readiness signal (tests wait on it; `/readyz` can report it).
    pub subscribed: Option<Arc<tokio::sync::watch::Sender<bool>>>,
}

impl MqttIngressOptions {
    /// Options for the broker at `host:port` as client `client_id`, with the defaults
    /// documented on each field.
    pub fn new(host: impl Into<String>, port: u16, client_id: impl Into<String>) -> Self {
        Self {
            host: host.into(),
            port,
            client_id: client_id.into(),
            credentials: None,
            topic_prefix: DEFAULT_TOPIC_PREFIX.to_owned(),
            share_group: DEFAULT_SHARE_GROUP.to_owned(),
            keepalive: DEFAULT_KEEPALIVE,
            max_packet_bytes: MAX_AGENT_MESSAGE_BYTES,
            per_node_queue: 8,
            subscribed: None,
        }
    }

    fn check(&self) -> Result<(), MqttIngressError> {
        let invalid = |option, reason| MqttIngressError::InvalidOption { option, reason };
        check_prefix(&self.topic_prefix).map_err(|r| invalid("topic_prefix", r))?;
        check_level(&self.share_group).map_err(|r| invalid("share_group", r))?;
        check_keepalive(self.keepalive).map_err(|r| invalid("keepalive", r))?;
        if self.client_id.is_empty() {
            return Err(invalid("client_id", "must not be empty"));
        }
        if self.host.is_empty() {
            return Err(invalid("host", "must not be empty"));
        }
        if self.max_packet_bytes == 0 || self.max_packet_bytes > u32::MAX as usize / 2 {
            return Err(invalid("max_packet_bytes", "must be > 0 and < 2 GiB"));
        }
        if self.per_node_queue == 0 {
            return Err(invalid("per_node_queue", "must be > 0"));
        }
        Ok(())
    }

    fn mqtt_options(&self) -> MqttOptions {
        let mut mqtt = MqttOptions::new(&self.client_id, &self.host, self.port);
        let max_packet = self.max_packet_bytes.saturating_add(PACKET_HEADROOM);
        mqtt.set_keep_alive(self.keepalive)
            .set_clean_start(true)
            .set_connection_timeout(CONNECT_TIMEOUT_SECS)
            // rumqttc preallocates one slot per possible in-flight packet id (65 536 by
            // default, ~13 MB); acks in flight across every node this replica serves.
            .set_outgoing_inflight_upper_limit(1024)
            .set_max_packet_size(u32::try_from(max_packet).ok());
        if let Some((username, password)) = &self.credentials {
            mqtt.set_credentials(username, password);
        }
        mqtt
    }
}

/// Why the MQTT ingress stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum MqttIngressError {
    /// An option cannot work; checked before connecting.
    #[error("invalid MQTT ingress option {option}: {reason}")]
    InvalidOption {
        /// The option's field name.
        option: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The broker refused the shared subscription (no shared-subscription support, not
    /// authorized): this replica would never receive a message.
    #[error("the broker refused the subscription {filter}: {reason}")]
    SubscribeRefused {
        /// The topic filter.
        filter: String,
        /// The broker's reason code.
        reason: String,
    },
}

/// Serves agents through the broker until `shutdown` resolves: subscribes to
/// `$share/{share_group}/P/nodes/+/+` (QoS 1) on every CONNACK (clean start), hands each
/// message to `handler` and publishes its `Ack` to `P/acks/{node}` (QoS 1).
///
/// Each message is checked before the handler sees it, in this order: the topic is
/// `P/nodes/{node}/{kind}` with a known kind (else [`REJECT_UNKNOWN_TOPIC`]); the payload is
/// at most `max_packet_bytes` ([`REJECT_TOO_LARGE`]) and decodes ([`REJECT_MALFORMED`]); the
/// topic's node and kind are the message's header node name and kind ([`REJECT_MISMATCH`]).
/// Rejections go to [`Handler::rejected`] and serving goes on. The [`Peer`] is
/// `{ transport: Mqtt, remote: None, identity: None }`: the broker is the socket peer and
/// says nothing about who published.
///
/// Last Wills (`P/nodes/{node}/will`) are logged at info level and otherwise ignored: the
/// broker publishes them when a connection dies, which says nothing about the node itself,
/// so the gateway never writes `Unknown` or `NotReady` because of one (the node's Lease
/// simply stops being renewed, exactly as with kubelet).
///
/// The event loop never waits for a handler: each node has a worker task with a queue of
/// `per_node_queue` messages (full: [`REJECT_QUEUE_FULL`]) that handles that node's messages
/// in order, one at a time; different nodes are handled concurrently. Workers end after
/// 5 minutes without messages. Broker connection errors are logged and retried with jittered
/// backoff (200 ms doubling to 7 s); on shutdown the ingress sends DISCONNECT.
///
/// Errors: [`MqttIngressError::InvalidOption`] before connecting,
/// [`MqttIngressError::SubscribeRefused`] when the broker refuses the subscription.
pub async fn serve<H: Handler>(
    options: MqttIngressOptions,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), MqttIngressError> {
    options.check()?;
    let filter = gateway_filter(&options.topic_prefix, &options.share_group);
    let (client, eventloop) = AsyncClient::new(options.mqtt_options(), REQUEST_QUEUE);
    let mut workers = Workers {
        handler,
        client: client.clone(),
        prefix: options.topic_prefix.clone(),
        queue: options.per_node_queue,
        nodes: HashMap::new(),
    };
    let mut backoff = reconnect_backoff();
    let mut next = next_event(eventloop);
    let mut sweep = tokio::time::interval(WORKER_IDLE / 5);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = sweep.tick() => workers.evict_idle(),
            (eventloop, result) = &mut next => match result {
                Ok(event) => {
                    next = next_event(eventloop);
                    match event {
                        Event::Incoming(Packet::ConnAck(_)) => {
                            tracing::info!(%filter, "connected to the MQTT broker; subscribing");
                            backoff = reconnect_backoff();
                            subscribe(&client, &filter);
                        }
                        Event::Incoming(Packet::SubAck(suback)) => {
                            if let Some(code) = suback
                                .return_codes
                                .iter()
                                .find(|c| !matches!(c, SubscribeReasonCode::Success(_)))
                            {
                                return Err(MqttIngressError::SubscribeRefused {
                                    filter,
                                    reason: format!("{code:?}"),
                                });
                            }
                            if let Some(subscribed) = &options.subscribed {
                                subscribed.send_replace(true);
                            }
                        }
                        Event::Incoming(Packet::Publish(publish)) => {
                            workers.dispatch(&publish, options.max_packet_bytes);
                        }
                        _ => {}
                    }
                }
                Err(error) => {
                    if let Some(subscribed) = &options.subscribed {
                        subscribed.send_replace(false);
                    }
                    let delay = backoff.next().unwrap_or(BACKOFF_MAX);
                    tracing::warn!(%error, ?delay, broker = %options.host, "MQTT connection lost; reconnecting");
                    tokio::select! {
                        () = &mut shutdown => return Ok(()),
                        () = tokio::time::sleep(delay) => {}
                    }
                    // rumqttc reconnects on this poll.
                    next = next_event(eventloop);
                }
            },
        }
    }
    // Workers finish what they hold; their acks may not make it out any more.
    drop(workers);
    disconnect(&client, next).await;
    Ok(())
}

fn subscribe(client: &AsyncClient, filter: &str) {
    if let Err(error) = client.try_subscribe(filter, QoS::AtLeastOnce) {
        // The queue is full of acks: wait for room without blocking the event loop.
        tracing::debug!(%error, "request queue full; subscribing from a task");
        let client = client.clone();
        let filter = filter.to_owned();
        tokio::spawn(async move {
            if let Err(error) = client.subscribe(filter, QoS::AtLeastOnce).await {
                tracing::warn!(%error, "could not queue the subscription");
            }
        });
    }
}

fn reconnect_backoff() -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(BACKOFF_MIN)
        .with_max_delay(BACKOFF_MAX)
        .without_max_times()
        .build()
}

/// What one PUBLISH under the subscription is.
// Lives on the stack for one dispatch and the message moves on as is: boxing it would cost
// an allocation per message for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq)]
enum Inbound<'t> {
    /// A message for the handler, from `node`.
    Message {
        node: &'t str,
        message: AgentMessage,
    },
    /// A Last Will: the broker lost `node`'s connection.
    Will {
        node: &'t str,
        header: Option<Header>,
    },
}

/// Classifies one PUBLISH: a checked message, a Last Will, or the rejection reason.
fn classify<'t>(
    prefix: &str,
    topic: &'t [u8],
    payload: &[u8],
    max_bytes: usize,
) -> Result<Inbound<'t>, &'static str> {
    let topic = std::str::from_utf8(topic).map_err(|_| REJECT_UNKNOWN_TOPIC)?;
    let (node, kind) = parse_node_topic(prefix, topic).ok_or(REJECT_UNKNOWN_TOPIC)?;
    if kind == WILL_KIND {
        let header = Header::decode(payload).ok();
        return Ok(Inbound::Will { node, header });
    }
    if !MESSAGE_KINDS.contains(&kind) {
        return Err(REJECT_UNKNOWN_TOPIC);
    }
    if payload.len() > max_bytes {
        return Err(REJECT_TOO_LARGE);
    }
    let message = AgentMessage::decode(payload).map_err(|_| REJECT_MALFORMED)?;
    let header_node = message.header().map(|h| h.node_name.as_str());
    if header_node != Some(node) || message.kind_name() != kind {
        return Err(REJECT_MISMATCH);
    }
    Ok(Inbound::Message { node, message })
}

fn peer() -> Peer {
    Peer {
        transport: TransportKind::Mqtt,
        remote: None,
        identity: None,
    }
}

struct Worker {
    tx: mpsc::Sender<AgentMessage>,
    last_message: Instant,
}

/// The per-node workers, owned by the event-loop task.
struct Workers<H> {
    handler: Arc<H>,
    client: AsyncClient,
    prefix: String,
    queue: usize,
    nodes: HashMap<String, Worker>,
}

impl<H: Handler> Workers<H> {
    fn dispatch(&mut self, publish: &Publish, max_bytes: usize) {
        let (node, message) =
            match classify(&self.prefix, &publish.topic, &publish.payload, max_bytes) {
                Ok(Inbound::Message { node, message }) => (node, message),
                Ok(Inbound::Will { node, header }) => {
                    tracing::info!(
                        node,
                        boot_id = header
                            .as_ref()
                            .map(|h| edgebeat_proto::boot_id_to_string(&h.boot_id)),
                        seq = header.as_ref().map(|h| h.seq),
                        "the broker lost an agent's connection (Last Will)"
                    );
                    return;
                }
                Err(reason) => {
                    tracing::debug!(topic = ?publish.topic, reason, "MQTT message rejected");
                    self.handler.rejected(&peer(), reason);
                    return;
                }
            };
        let alive = self.nodes.get(node).is_some_and(|w| !w.tx.is_closed());
        if !alive {
            // New node, or its worker died (a handler panicked): start one.
            let worker = self.spawn(node);
            self.nodes.insert(node.to_owned(), worker);
        }
        let Some(worker) = self.nodes.get_mut(node) else {
            return;
        };
        worker.last_message = Instant::now();
        // Full, or (rarely) the worker died just now: a new one starts with the next message.
        if worker.tx.try_send(message).is_err() {
            tracing::debug!(node, "MQTT message dropped: the node's queue is full");
            self.handler.rejected(&peer(), REJECT_QUEUE_FULL);
        }
    }

    fn spawn(&self, node: &str) -> Worker {
        let (tx, mut rx) = mpsc::channel::<AgentMessage>(self.queue);
        let handler = self.handler.clone();
        let client = self.client.clone();
        let topic = acks_topic(&self.prefix, node);
        tokio::spawn(async move {
            let peer = peer();
            while let Some(message) = rx.recv().await {
                let ack = handler.handle(&peer, message).await;
                let reply = GatewayMessage {
                    kind: Some(gateway_message::Kind::Ack(ack)),
                };
                if let Err(error) = client
                    .publish(&topic, QoS::AtLeastOnce, false, reply.encode_to_vec())
                    .await
                {
                    // The ingress is shutting down.
                    tracing::debug!(%error, %topic, "ack not sent");
                }
            }
        });
        Worker {
            tx,
            last_message: Instant::now(),
        }
    }

    /// Drops workers idle for [`WORKER_IDLE`] with nothing queued; each ends once it has
    /// finished what it holds.
    fn evict_idle(&mut self) {
        self.nodes.retain(|_, w| {
            w.last_message.elapsed() < WORKER_IDLE || w.tx.capacity() < w.tx.max_capacity()
        });
    }
}

#[cfg(test)]
mod tests {
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
            })),
        }
    }

    #[test]
    fn a_matching_message_is_accepted() {
        let bytes = lease("n1").encode_to_vec();
        assert_eq!(
            classify("p", b"p/nodes/n1/lease", &bytes, 1024),
            Ok(Inbound::Message {
                node: "n1",
                message: lease("n1")
            })
        );
    }

    #[test]
    fn rejections_name_their_reason() {
        let bytes = lease("n1").encode_to_vec();
        let status = AgentMessage {
            kind: Some(Kind::Status(StatusReport {
                header: Some(Header {
                    node_name: "n1".into(),
                    ..Header::default()
                }),
                status: None,
            })),
        }
        .encode_to_vec();
        let cases: [(&[u8], &[u8], usize, &str); 8] = [
            (b"p/nodes/n2/lease", &bytes, 1024, REJECT_MISMATCH),
            (b"p/nodes/n1/status", &bytes, 1024, REJECT_MISMATCH),
            (b"p/nodes/n1/lease", &status, 1024, REJECT_MISMATCH),
            // No kind, no header (what an empty payload decodes to).
            (b"p/nodes/n1/lease", b"", 1024, REJECT_MISMATCH),
            (
                b"p/nodes/n1/lease",
                &[0xff, 0xff, 0xff],
                1024,
                REJECT_MALFORMED,
            ),
            (b"p/nodes/n1/lease", &bytes, 4, REJECT_TOO_LARGE),
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
        let mut o = ok;
        o.per_node_queue = 0;
        assert!(o.check().is_err());
    }
}
