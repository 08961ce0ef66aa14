//! The gateway's MQTT ingress: one shared subscription; each message classified, verified
//! and decoded in the event loop, then delivered to the handler's per-node mailbox.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Filter, Packet, SubscribeReasonCode};
use rumqttc::v5::{AsyncClient, Event};
use tokio::time::Instant;

use super::{certificates_filter, disconnect, ends_backoff, gateway_filter, next_event};
use crate::ingress::{Handler, RejectReason, Rejection, UsageOutbox};
use crate::signing::AnswerSigner;

mod classify;
mod options;
mod verify;
mod workers;
pub use options::{DEFAULT_MAX_CLOCK_SKEW, MqttIngressOptions, SignaturePolicy};
use verify::Signatures;
use workers::Workers;

/// Rejection: the payload is larger than `max_packet_bytes`.
pub const REJECT_TOO_LARGE: Rejection = Rejection {
    reason: RejectReason::TooLarge,
    detail: Cow::Borrowed("message too large"),
};
/// Rejection: the payload is not a protobuf `AgentMessage`.
pub const REJECT_MALFORMED: Rejection = Rejection {
    reason: RejectReason::Malformed,
    detail: Cow::Borrowed("malformed message"),
};
/// Rejection: the topic's node or kind disagrees with the message (its
/// header's node name, its kind); counts as a foreign message.
pub const REJECT_MISMATCH: Rejection = Rejection {
    reason: RejectReason::Foreign,
    detail: Cow::Borrowed("topic/node mismatch"),
};
/// Rejection: a topic under the subscription that is not
/// `P/nodes/{node}/{register|status|lease|will}`.
pub const REJECT_UNKNOWN_TOPIC: Rejection = Rejection {
    reason: RejectReason::Malformed,
    detail: Cow::Borrowed("unknown topic"),
};
/// Rejection: signatures are required, or the node signs, and the payload is
/// a bare `AgentMessage` (not answered).
pub const REJECT_UNSIGNED: Rejection = Rejection {
    reason: RejectReason::Unsigned,
    detail: Cow::Borrowed("unsigned message"),
};
/// Rejection: the signature does not verify with the node's certificate
/// (tampered, or signed by someone else; not answered).
pub const REJECT_BAD_SIGNATURE: Rejection = Rejection {
    reason: RejectReason::BadSignature,
    detail: Cow::Borrowed("bad signature"),
};
/// Rejection: no verified certificate is held for the node (not answered: a
/// genuine agent publishes its certificate again when a request goes unanswered).
pub const REJECT_UNKNOWN_SIGNER: Rejection = Rejection {
    reason: RejectReason::UnknownSigner,
    detail: Cow::Borrowed("no certificate for the signer"),
};
/// Rejection: the certificate that verified the node's messages has
/// expired (not answered).
pub const REJECT_CERTIFICATE_EXPIRED: Rejection = Rejection {
    reason: RejectReason::Certificate,
    detail: Cow::Borrowed("node certificate expired"),
};
/// Rejection: a verified message's `wall_time_ms` is further than
/// [`SignaturePolicy::max_clock_skew`] from the gateway's clock: a recorded message replayed
/// later, or an agent whose clock is wrong (not answered: a replay must not make the gateway
/// speak on the node's link; the log says by how much the clock is off).
pub const REJECT_CLOCK: Rejection = Rejection {
    reason: RejectReason::ClockSkew,
    detail: Cow::Borrowed("signed time outside the clock window"),
};
/// Rejection: a certificate published on `P/certificates/{node}` was
/// refused (not from the site CA, expired, not `node`'s identity, older than the one held).
pub const REJECT_CERTIFICATE: Rejection = Rejection {
    reason: RejectReason::Certificate,
    detail: Cow::Borrowed("node certificate refused"),
};

/// Rejection: a payload on `P/sites/{site}/uplink` other than
/// Mosquitto's bridge notifications `1` and `0`, or a site that is not a zone or
/// `region/zone` of label values.
pub const REJECT_UPLINK: Rejection = Rejection {
    reason: RejectReason::Malformed,
    detail: Cow::Borrowed("site uplink notification: not 0 or 1, or not a zone"),
};

/// Headroom above `max_packet_bytes` for the PUBLISH header (topic, properties) in the
/// Maximum Packet Size announced to the broker, so that payloads a little over the limit
/// still arrive and are counted as rejected. Larger packets the broker drops itself.
const PACKET_HEADROOM: usize = 4096;

/// Capacity of rumqttc's request queue (acks from all nodes). Tasks handling messages wait
/// for room, the event loop never does.
const REQUEST_QUEUE: usize = 256;

/// Certificate requests handled at once (each may wait for the apiserver); beyond it a
/// request is dropped and counted ([`RejectReason::QueueFull`]), and its agent asks again
/// later.
const ENROLLMENTS_IN_FLIGHT: usize = 64;

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
    /// The TLS material cannot work (unparsable PEM, key not matching the certificate).
    #[error("MQTT TLS: {0}")]
    Tls(#[source] crate::tls::TlsError),
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
/// message to `handler` and publishes its `Ack` to `P/acks/{node}` (QoS 1), except for a
/// quiet renewal that was written ([`edgebeat_proto::answer_needed`]).
///
/// Each message is checked before the handler sees it, in this order: the topic is
/// `P/nodes/{node}/{kind}` with a known kind (else [`REJECT_UNKNOWN_TOPIC`]) and the payload
/// is at most `max_packet_bytes` ([`REJECT_TOO_LARGE`]); then the signature policy
/// (below), the payload decodes ([`REJECT_MALFORMED`]) and the topic's node
/// and kind are the message's header node name and kind ([`REJECT_MISMATCH`]). All of that
/// runs in the event-loop task, before anything of the message reaches the handler; a
/// message that passed is delivered ([`Handler::deliver`]) and answered through its
/// [`Reply`](crate::ingress::Reply). Rejections go to [`Handler::rejected`] and serving goes on. The [`Peer`] has
/// `transport: Mqtt, remote: None`: the broker is the socket peer and says nothing about who
/// published, so `identity` is `Some(node)` (and `wall_time_verified` true) only for a
/// message whose signature verified.
///
/// With [`MqttIngressOptions::signatures`] the ingress also subscribes (without a share
/// group) to `P/certificates/+`, verifies each retained or new certificate against the site
/// CA for the node its topic names ([`REJECT_CERTIFICATE`] when refused, including one older
/// than the one held) and keeps the node's key; a certificate is handled in arrival order,
/// before the messages published after it. A `SignedMessage` is verified with the key
/// before decoding: no key held ([`REJECT_UNKNOWN_SIGNER`]), a signature that does not
/// verify ([`REJECT_BAD_SIGNATURE`]), a certificate past notAfter
/// ([`REJECT_CERTIFICATE_EXPIRED`]) and a bare message where signatures are required or the
/// node signs ([`REJECT_UNSIGNED`]) are refused without an answer (a forger
/// must not be able to make the gateway speak on a node's ack topic). A verified message
/// whose signed wall time is outside [`SignaturePolicy::max_clock_skew`] is refused
/// ([`REJECT_CLOCK`], answered); within it, replays are the handler's to refuse by the
/// per-boot `seq`. Node names in topics must be valid node names ([`REJECT_MALFORMED`]).
///
/// With [`MqttIngressOptions::site_uplinks`] (the default) the ingress also subscribes,
/// without a share group, to `P/sites/#`: each site bridge's notification
/// (`P/sites/{site}/uplink`, `1` or `0`, retained) goes to [`Handler::site_uplink`]; any
/// other payload or topic there is refused ([`REJECT_UPLINK`]).
///
/// With [`MqttIngressOptions::usage_sharing`] the ingress publishes the outbox's samples
/// in batches on `P/usage` while subscribed (signed by the answer key when it has one) and
/// subscribes, without a share group and with No Local, to `P/usage`: each sample of
/// another replica's batch goes to [`Handler::shared_usage`]. A batch larger than 64 KiB
/// ([`REJECT_TOO_LARGE`]), one that does not decode ([`REJECT_MALFORMED`]) and, with
/// [`MqttIngressOptions::usage_verifier`], one unsigned ([`REJECT_UNSIGNED`]), signed by
/// no gateway's answer key ([`REJECT_CERTIFICATE`]) or badly ([`REJECT_BAD_SIGNATURE`]) is
/// refused whole; a sample naming no valid node ([`REJECT_MALFORMED`]) alone.
///
/// Last Wills (`P/nodes/{node}/will`) are logged at info level and otherwise ignored: the
/// broker publishes them when a connection dies, which says nothing about the node itself,
/// so the gateway never writes `Unknown` or `NotReady` because of one (the node's Lease
/// simply stops being renewed, exactly as with kubelet).
///
/// The event loop never waits for a handler: delivering takes no time (the gateway posts
/// the message to the node's mailbox, handled in order, one at a time per node, by a task
/// that exists only while the mailbox holds letters), and answers that find rumqttc's
/// request queue full wait in the handling task. Broker connection errors are
/// logged and retried with jittered backoff (200 ms doubling to 7 s; only a connection that
/// subscribed and lasted 7 s starts it over, so a broker that accepts and drops the replica
/// is not redialled every 200 ms), each retry on the next broker of
/// [`MqttIngressOptions::failover`] when there are several; on shutdown the ingress sends
/// DISCONNECT.
///
/// Errors: [`MqttIngressError::InvalidOption`] before connecting,
/// [`MqttIngressError::SubscribeRefused`] when the broker refuses the subscription, or with
/// [`MqttIngressOptions::failover`] when every broker of the list refused it in a row (one
/// node refusing while others may grant, say one not yet joined to the cluster, sends the
/// replica on to the next, as a lost connection does).
pub async fn serve<H: Handler>(
    options: MqttIngressOptions,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), MqttIngressError> {
    options.check()?;
    let (filter, filters) = subscriptions(&options);
    let mut outbox = options.usage_sharing.as_ref().map(UsageOutbox::subscribe);
    crate::tls::install_ring_provider();
    let brokers = options.brokers();
    let mut broker = 0;
    let (client, eventloop) = AsyncClient::new(
        options.mqtt_options(&options.host, options.port)?,
        REQUEST_QUEUE,
    );
    let mut workers = workers(&options, handler, client.clone());
    let mut backoff = reconnect_backoff();
    let mut link = Link::default();
    let mut next = next_event(eventloop);
    let mut batch = UsageBatch::default();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            shared = shared_sample(&mut outbox) => {
                // Not subscribed, the others would not hear it (QoS 0): dropped, the
                // node's next sample follows.
                if link.subscribed && batch.add(shared) {
                    batch.publish(&client, &options.topic_prefix, options.answer_signer.as_deref());
                }
            }
            () = batch.closes(), if batch.is_open() => {
                batch.publish(&client, &options.topic_prefix, options.answer_signer.as_deref());
            }
            (mut eventloop, result) = &mut next => {
                let lost = match result {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        tracing::info!(%filter, "connected to the MQTT broker; subscribing");
                        link.connected_at = Some(tokio::time::Instant::now());
                        subscribe(&client, &filters);
                        None
                    }
                    Ok(Event::Incoming(Packet::SubAck(suback))) => {
                        let refused = link.suback(&suback, &filters, brokers.len(), &options)?;
                        if refused.is_some() {
                            // A node that refuses while others may grant (one not yet
                            // joined, one with another ACL): on to the next.
                            eventloop.clean();
                        }
                        refused
                    }
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        workers.dispatch(&publish, options.max_packet_bytes);
                        None
                    }
                    Ok(_) => None,
                    Err(error) => Some(link.lost(&error, &options)),
                };
                let Some(error) = lost else {
                    next = next_event(eventloop);
                    continue;
                };
                if let Some(subscribed) = &options.subscribed {
                    subscribed.send_replace(false);
                }
                if ends_backoff(link.subscribed, link.connected_at.take(), crate::backoff::RETRY_MAX) {
                    backoff = reconnect_backoff();
                }
                link.subscribed = false;
                let delay = backoff.next().unwrap_or(crate::backoff::RETRY_MAX);
                let (host, port) = &brokers[broker];
                tracing::warn!(%error, ?delay, broker = %format_args!("{host}:{port}"), "MQTT connection lost; reconnecting");
                tokio::select! {
                    () = &mut shutdown => return Ok(()),
                    () = tokio::time::sleep(delay) => {}
                }
                if brokers.len() > 1 {
                    // The next node of the cluster, on the same event loop: the client
                    // every waiting reply holds stays the one that sends.
                    broker = (broker + 1) % brokers.len();
                    let (host, port) = &brokers[broker];
                    eventloop.options = options.mqtt_options(host, *port)?;
                    tracing::info!(broker = %format_args!("{host}:{port}"), "MQTT: trying the next broker");
                }
                // rumqttc reconnects on this poll.
                next = next_event(eventloop);
            }
        }
    }
    // Messages being handled finish; their acks may not make it out any more.
    drop(workers);
    disconnect(&client, next).await;
    Ok(())
}

/// The ingress's shared subscription (returned alone too, for the log) and every filter it
/// subscribes with: certificates with signatures, the sites' bridge notifications with
/// [`MqttIngressOptions::site_uplinks`], the other replicas' usage batches (not its own)
/// with [`MqttIngressOptions::usage_sharing`].
fn subscriptions(options: &MqttIngressOptions) -> (String, Vec<Filter>) {
    let filter = gateway_filter(&options.topic_prefix, &options.share_group);
    let mut filters = vec![Filter::new(filter.clone(), QoS::AtLeastOnce)];
    if options.signatures.is_some() {
        filters.push(Filter::new(
            certificates_filter(&options.topic_prefix),
            QoS::AtLeastOnce,
        ));
    }
    if options.site_uplinks {
        filters.push(Filter::new(
            super::sites_filter(&options.topic_prefix),
            QoS::AtLeastOnce,
        ));
    }
    if options.usage_sharing.is_some() {
        filters.push(Filter {
            nolocal: true,
            ..Filter::new(super::usage_filter(&options.topic_prefix), QoS::AtMostOnce)
        });
    }
    (filter, filters)
}

/// The handlers of what the ingress receives, answering through `client`.
fn workers<H>(options: &MqttIngressOptions, handler: Arc<H>, client: AsyncClient) -> Workers<H> {
    Workers {
        handler,
        client,
        prefix: options.topic_prefix.as_str().into(),
        answer_signer: options.answer_signer.clone(),
        usage_verifier: options.usage_verifier.clone(),
        certificate_asked: HashMap::new(),
        enrollments: Arc::new(tokio::sync::Semaphore::new(ENROLLMENTS_IN_FLIGHT)),
        log_limit: crate::log_limit::LogLimiter::default(),
        signatures: options.signatures.clone().map(|policy| {
            Arc::new(Signatures {
                policy,
                keys: parking_lot::RwLock::default(),
            })
        }),
    }
}

/// The ingress's connection to its brokers, across reconnects.
#[derive(Debug, Default)]
struct Link {
    /// When the current connection was accepted: only a lasting, subscribed connection
    /// starts the backoff over when it is lost (`ends_backoff`).
    connected_at: Option<Instant>,
    /// Whether the current connection's subscription was granted.
    subscribed: bool,
    /// SUBACKs refused in a row, by as many brokers ([`Link::suback`]).
    refusals: usize,
}

impl Link {
    /// The broker's answer to the subscription: granted (told to
    /// [`MqttIngressOptions::subscribed`]; `None`), or refused by this broker while others
    /// of the `brokers` may grant (`Some`: the reason, and on to the next).
    ///
    /// Errors: [`MqttIngressError::SubscribeRefused`] from one broker, or from every node
    /// of the cluster in a row: the site's configuration (ACL, no shared subscriptions),
    /// which retrying will not mend.
    fn suback(
        &mut self,
        suback: &rumqttc::v5::mqttbytes::v5::SubAck,
        filters: &[Filter],
        brokers: usize,
        options: &MqttIngressOptions,
    ) -> Result<Option<String>, MqttIngressError> {
        let refused = suback
            .return_codes
            .iter()
            .find(|c| !matches!(c, SubscribeReasonCode::Success(_)));
        let Some(code) = refused else {
            self.refusals = 0;
            self.subscribed = true;
            if let Some(subscribed) = &options.subscribed {
                subscribed.send_replace(true);
            }
            return Ok(None);
        };
        let names: Vec<&str> = filters.iter().map(|f| f.path.as_str()).collect();
        let refused = MqttIngressError::SubscribeRefused {
            filter: names.join(", "),
            reason: format!("{code:?}"),
        };
        self.refusals += 1;
        if self.refusals >= brokers {
            return Err(refused);
        }
        Ok(Some(refused.to_string()))
    }

    /// The connection lost with `error`: what to log. A session taken over by another
    /// client with this replica's client ID is counted
    /// ([`MqttIngressOptions::sessions_taken_over`]) and logged as an error, with the fix.
    fn lost(
        &mut self,
        error: &rumqttc::v5::ConnectionError,
        options: &MqttIngressOptions,
    ) -> String {
        // Down is not refusing: the count is of refusals in a row.
        self.refusals = 0;
        if super::session_taken_over(error) {
            if let Some(count) = &options.sessions_taken_over {
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            tracing::error!(
                client_id = %options.client_id,
                "another client connected with this replica's MQTT client ID and the broker gave it the session (MQTT 5 reason 0x8E, Session taken over): this replica hears no node until it connects again, and again loses it while the other client keeps reconnecting; bind client IDs to authenticated identities on the broker (README, \"MQTT broker\")"
            );
        }
        error.to_string()
    }
}

/// Subscribes to every filter in one SUBSCRIBE, so one SUBACK grants (or refuses) them all.
fn subscribe(client: &AsyncClient, filters: &[Filter]) {
    if let Err(error) = client.try_subscribe_many(filters.to_vec()) {
        // The queue is full of acks: wait for room without blocking the event loop.
        tracing::debug!(%error, "request queue full; subscribing from a task");
        let client = client.clone();
        let filters = filters.to_vec();
        tokio::spawn(async move {
            if let Err(error) = client.subscribe_many(filters).await {
                tracing::warn!(%error, "could not queue the subscription");
            }
        });
    }
}

/// The next sample of the outbox, skipping what it dropped while the event loop was busy
/// (lossy by design); never, without an outbox or once it is closed.
async fn shared_sample(
    outbox: &mut Option<tokio::sync::broadcast::Receiver<edgebeat_proto::SharedUsage>>,
) -> edgebeat_proto::SharedUsage {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let Some(receiver) = outbox else {
            return std::future::pending().await;
        };
        match receiver.recv().await {
            Ok(sample) => return sample,
            Err(RecvError::Lagged(dropped)) => {
                tracing::debug!(dropped, "usage samples not shared: the outbox overflowed");
            }
            Err(RecvError::Closed) => *outbox = None,
        }
    }
}

/// Longest a shared sample waits for others to travel with, 1 s: one signature and one
/// PUBLISH per second at most under a steady flow (10,000 nodes sample every 20 s, 500 a
/// second), where a sample served to metrics-server is up to 60 s old anyway.
pub const USAGE_LINGER: Duration = Duration::from_secs(1);

/// Encoded samples a batch closes at, 32 KiB: at least 112 samples of the longest node
/// names (253 characters), with room under the 64 KiB a replica takes for the signature and
/// the certificate chain.
pub const MAX_USAGE_BATCH_BYTES: usize = 32 * 1024;

/// The samples waiting to be shared together, and when the batch closes.
#[derive(Default)]
struct UsageBatch {
    batch: edgebeat_proto::SharedUsageBatch,
    bytes: usize,
    closes: Option<Instant>,
}

impl UsageBatch {
    /// Adds `sample`; whether the batch is full ([`MAX_USAGE_BATCH_BYTES`]). The first
    /// sample opens it for [`USAGE_LINGER`].
    fn add(&mut self, sample: edgebeat_proto::SharedUsage) -> bool {
        self.bytes += prost::length_delimiter_len(sample.encoded_len()) + 1 + sample.encoded_len();
        self.batch.samples.push(sample);
        self.closes
            .get_or_insert_with(|| Instant::now() + USAGE_LINGER);
        self.bytes >= MAX_USAGE_BATCH_BYTES
    }

    fn is_open(&self) -> bool {
        self.closes.is_some()
    }

    /// When the open batch closes; never when none is open.
    async fn closes(&self) {
        match self.closes {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    /// Publishes the batch on `P/usage` (QoS 0) without waiting, signed by `signer` when
    /// there is one, and empties it: a full request queue, or a failed signature, drops it
    /// (each node's next sample follows in 20 s).
    fn publish(&mut self, client: &AsyncClient, prefix: &str, signer: Option<&AnswerSigner>) {
        let batch = std::mem::take(&mut self.batch);
        self.bytes = 0;
        self.closes = None;
        let samples = batch.samples.len();
        let payload = match signer.map(|signer| signer.seal_usage(&batch)) {
            None => batch.encode_to_vec(),
            Some(Ok(sealed)) => sealed,
            Some(Err(error)) => {
                tracing::warn!(%error, samples, "usage samples not shared: signing failed");
                return;
            }
        };
        let topic = super::usage_topic(prefix);
        if let Err(error) = client.try_publish(topic, QoS::AtMostOnce, false, payload) {
            tracing::debug!(%error, samples, "usage samples not shared: request queue full");
        }
    }
}

fn reconnect_backoff() -> impl Iterator<Item = Duration> {
    // Reconnect delays to the broker: 200 ms doubling with jitter to 7 s.
    crate::backoff::reconnect_backoff(crate::backoff::RETRY_MIN, crate::backoff::RETRY_MAX)
}

#[cfg(test)]
mod tests;
