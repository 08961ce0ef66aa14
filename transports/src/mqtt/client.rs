//! The agent's MQTT uplink: one rumqttc v5 client and event loop, owned by one task.

use std::time::Duration;

use edgebeat_proto::{MAX_AGENT_MESSAGE_BYTES, MessageKind};
use rumqttc::v5::{AsyncClient, MqttOptions};
use tokio_util::sync::CancellationToken;

use super::{
    CONNECT_TIMEOUT_SECS, DEFAULT_TOPIC_PREFIX, WILL_KIND, acks_topic, certificate_topic,
    check_connection, check_keepalive, check_level, check_prefix, disconnect_within, ends_backoff,
    next_event, node_topic,
};
use crate::uplink::{RegisterFn, UplinkDriver, reconnect_backoff, refuse_while_waiting};

/// Capacity of rumqttc's own request queue. Requests are only handed to it while connected
/// and with `try_*` (a full queue refuses the message instead of delaying it), so this only
/// has to absorb one burst: the subscription, a Register and the agent loops' messages.
const REQUEST_QUEUE: usize = 16;

/// Longest the agent waits at shutdown for the broker to close the connection after its
/// DISCONNECT, 500 ms: a broker on a working link does within a round trip, and the agent
/// must exit well within a second of SIGTERM, connected or not, so that `TimeoutStopSec`
/// never has to kill it (deploy/systemd/edgebeat-agent.service).
const DISCONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Cap of the growing wait for an answer to Register before sending it again.
const REGISTER_TIMEOUT_MAX: Duration = Duration::from_secs(60);

/// Least time between two certificate publications caused by unanswered requests (see
/// [`Link::publish_certificate`]): 30 s, so a gateway that lost the certificate learns it
/// again within a few renew intervals and an unreachable one costs at most one retained
/// publish per 30 s.
const CERTIFICATE_REPUBLISH_MIN_INTERVAL: Duration = Duration::from_secs(30);

mod link;
use link::{Link, last_will};

pub use crate::endpoint::MQTT_AGENT_KEEPALIVE as DEFAULT_AGENT_KEEPALIVE;

/// Default [`MqttUplinkOptions::user_timeout`], 20 s: the gRPC uplink's `TCP_USER_TIMEOUT`
/// (twice its keepalive timeout). With renewals every 10 s, a path that died without a reset
/// is noticed within 30 s, inside one `nodeLeaseDurationSeconds` (40 s).
pub const DEFAULT_USER_TIMEOUT: Duration = Duration::from_secs(20);

/// Settings of the agent's MQTT uplink.
#[derive(Debug, Clone, PartialEq)]
pub struct MqttUplinkOptions {
    /// Broker host name or address.
    pub host: String,
    /// Broker port (1883 for plain MQTT).
    pub port: u16,
    /// Further brokers of the same cluster, `(host, port)` (default none). After a lost or
    /// failed connection the next attempt goes to the next broker of `host:port` and these,
    /// in turn, as an MQTT client's list of server URIs is used (Paho's `serverURIs`): a
    /// dead cluster node costs one failed attempt, not every attempt until it returns.
    /// They share the TLS settings and credentials; each must be a node of one cluster,
    /// so that gateways subscribed on any node receive what the agent publishes on another.
    pub failover: Vec<(String, u16)>,
    /// MQTT client identifier (default `None`: `edgebeat-agent-{node}`, see
    /// [`default_client_id`]). Must be unique per broker: a second connection with the same
    /// id takes the session over.
    pub client_id: Option<String>,
    /// Username and password for the broker, if it wants them.
    pub credentials: Option<(String, String)>,
    /// Prefix of every topic (default [`DEFAULT_TOPIC_PREFIX`]); see [the module docs](super).
    pub topic_prefix: String,
    /// MQTT keepalive (default [`DEFAULT_AGENT_KEEPALIVE`], 30 min; at least 5 s): rumqttc's
    /// PINGREQ cadence, and the broker drops a client silent for 1.5 × this. Not what
    /// notices a dead path while renewals flow: see `user_timeout`.
    pub keepalive: Duration,
    /// The socket's `TCP_USER_TIMEOUT` (tcp(7); default [`DEFAULT_USER_TIMEOUT`], 20 s; at
    /// least 1 s; `None`: the kernel's default, ~15 min of retransmissions): the longest a
    /// sent renewal may stay unacknowledged by the broker's TCP before the kernel drops the
    /// connection and the uplink makes a new one. Quiet renewals go at QoS 0, which nothing
    /// answers, so this is what notices a path that died without a reset (a cellular NAT
    /// that forgot the mapping, a cut cable) while renewals flow, at no cost on the wire. Set
    /// through edgebeat's patched rumqttc (`vendor/rumqttc/EDGEBEAT-PATCH.md`).
    pub user_timeout: Option<Duration>,
    /// Message Expiry Interval of Lease renewals (default 10 s, kubelet's renew interval;
    /// at least 1 s, fractions dropped): the broker discards a renewal it could not deliver
    /// in time instead of handing a gateway a backlog of stale ones. Set it to the renew
    /// interval or less. Register and status messages carry no expiry.
    pub lease_expiry: Duration,
    /// First reconnect delay (default 200 ms); doubles with jitter up to `backoff_max`.
    pub backoff_min: Duration,
    /// Largest reconnect delay (default 7 s, kubelet's lease backoff cap).
    pub backoff_max: Duration,
    /// Largest encoded message sent or ack accepted, in bytes (default
    /// [`MAX_AGENT_MESSAGE_BYTES`], the gateway's limit). A larger message is not sent: the
    /// caller gets an [`Answer::Rejected`] made locally, whose reason says so.
    pub max_packet_bytes: usize,
    /// How long to wait for the gateway's answer to Register before sending it again
    /// (default 5 s), doubling with jitter up to 60 s and starting over on every connection.
    /// Over a broker a Register can vanish while the connection stays up (no gateway
    /// subscribed at that moment, a gateway restart), and the agent's loops wait for
    /// registration, so it is resent rather than awaited forever.
    pub register_timeout: Duration,
    /// TLS to the broker (`mqtts://`; default off): the broker must chain to the CA; the
    /// client certificate, when set, is presented (the broker may map it to a username and
    /// ACL).
    #[cfg(feature = "mqtt-tls")]
    pub tls: Option<crate::tls::ClientTls>,
    /// Signs every message end to end with the node's key (default off; see
    /// [`crate::signing`]): payloads become `SignedMessage`s and the certificate chain is
    /// published, retained, on `P/certificates/{node}` before each Register. Set with the
    /// client certificate by [`MqttUplinkOptions::set_tls`].
    #[cfg(feature = "mqtt-tls")]
    pub signer: Option<std::sync::Arc<crate::signing::MessageSigner>>,
    /// Verifies the gateway's answers (default off; set with [`Self::signer`] by
    /// [`MqttUplinkOptions::set_tls`], against the TLS CA, or against another CA by
    /// [`MqttUplinkOptions::set_gateway_ca`]): with it, the link takes only a
    /// [`SignedAnswer`](edgebeat_proto::SignedAnswer) that verifies, for its own node and
    /// boot (see [`crate::signing::AnswerVerifier`]), and obeys it; nothing else on the ack
    /// topic.
    #[cfg(feature = "mqtt-tls")]
    pub answers: Option<std::sync::Arc<crate::signing::AnswerVerifier>>,
    /// Where the answers [`MqttUplinkOptions::answers`] refuses are counted (shared by every
    /// verifier these options build; set with
    /// [`MqttUplinkOptions::count_answer_refusals`]).
    #[cfg(feature = "mqtt-tls")]
    pub answer_refusals: std::sync::Arc<crate::signing::AnswerRefusals>,
}

/// The MQTT client identifier of `node`'s agent when none is configured:
/// `edgebeat-agent-{node}`.
pub fn default_client_id(node: &str) -> String {
    format!("edgebeat-agent-{node}")
}

impl MqttUplinkOptions {
    /// Options for the broker at `host:port`, with the defaults documented on each field.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
            failover: Vec::new(),
            client_id: None,
            credentials: None,
            topic_prefix: DEFAULT_TOPIC_PREFIX.to_owned(),
            keepalive: DEFAULT_AGENT_KEEPALIVE,
            user_timeout: Some(DEFAULT_USER_TIMEOUT),
            lease_expiry: Duration::from_secs(10),
            backoff_min: crate::backoff::RETRY_MIN,
            backoff_max: crate::backoff::RETRY_MAX,
            max_packet_bytes: MAX_AGENT_MESSAGE_BYTES,
            register_timeout: Duration::from_secs(5),
            #[cfg(feature = "mqtt-tls")]
            tls: None,
            #[cfg(feature = "mqtt-tls")]
            signer: None,
            #[cfg(feature = "mqtt-tls")]
            answers: None,
            #[cfg(feature = "mqtt-tls")]
            answer_refusals: std::sync::Arc::default(),
        }
    }

    /// TLS to the broker (`mqtts://`) with `tls`, checked now: rustls must accept the CA
    /// and, when set, the client certificate and key. A client certificate also makes the
    /// uplink sign every message with its key ([`MqttUplinkOptions::signer`], loaded here
    /// once) and take only signed answers, verified against the CA of `tls`
    /// ([`MqttUplinkOptions::answers`]; another with [`MqttUplinkOptions::set_gateway_ca`]).
    ///
    /// Errors: [`MqttUplinkError::Tls`] naming the unusable part (`CA`, `client
    /// certificate`, `client key`, or the pair), [`MqttUplinkError::SigningKey`] when the
    /// key cannot sign messages (neither ECDSA P-256 nor Ed25519). Nothing is changed then.
    #[cfg(feature = "mqtt-tls")]
    pub fn set_tls(&mut self, tls: crate::tls::ClientTls) -> Result<(), MqttUplinkError> {
        tls.rustls_config().map_err(MqttUplinkError::Tls)?;
        let (signer, answers) = match &tls.client_identity {
            Some(client) => (
                Some(std::sync::Arc::new(
                    crate::signing::MessageSigner::from_pem(&client.cert_pem, &client.key_pem)
                        .map_err(MqttUplinkError::SigningKey)?,
                )),
                Some(std::sync::Arc::new(
                    crate::signing::AnswerVerifier::from_pem(&tls.ca_pem)
                        .map_err(|e| MqttUplinkError::Tls(e.in_part("CA")))?
                        .counting(self.answer_refusals.clone()),
                )),
            ),
            None => (None, None),
        };
        self.tls = Some(tls);
        self.signer = signer;
        self.answers = answers;
        Ok(())
    }

    /// Verifies the gateway's signed answers against the CA certificate(s) in `ca_pem` (the
    /// site CA) instead of the broker's TLS CA: for a site whose broker certificate comes
    /// from another CA. Call it after [`MqttUplinkOptions::set_tls`].
    ///
    /// Errors: [`MqttUplinkError::Tls`] when the PEM holds no usable CA certificate.
    #[cfg(feature = "mqtt-tls")]
    pub fn set_gateway_ca(&mut self, ca_pem: &[u8]) -> Result<(), MqttUplinkError> {
        self.set_answer_verifier(
            crate::signing::AnswerVerifier::from_pem(ca_pem),
            "gateway CA",
        )
    }

    /// Takes answers verified by `verifier` (counting into [`Self::answer_refusals`]).
    ///
    /// Errors: [`MqttUplinkError::Tls`] in `part` when `verifier` is an error.
    #[cfg(feature = "mqtt-tls")]
    fn set_answer_verifier(
        &mut self,
        verifier: Result<crate::signing::AnswerVerifier, crate::tls::TlsError>,
        part: &'static str,
    ) -> Result<(), MqttUplinkError> {
        let verifier = verifier
            .map_err(|e| MqttUplinkError::Tls(e.in_part(part)))?
            .counting(self.answer_refusals.clone());
        self.answers = Some(std::sync::Arc::new(verifier));
        Ok(())
    }

    /// Verifies the gateway's signed answers against the answer CAs `answer_cas` (DER)
    /// alone, as an enrolled agent learnt them (see
    /// [`crate::signing::AnswerVerifier::pinned`]). Call it after
    /// [`MqttUplinkOptions::set_tls`].
    ///
    /// Errors: [`MqttUplinkError::Tls`] (part `answer CAs`) when one is unusable or there is
    /// none.
    #[cfg(feature = "mqtt-tls")]
    pub fn set_answer_cas(&mut self, answer_cas: &[Vec<u8>]) -> Result<(), MqttUplinkError> {
        self.set_answer_verifier(
            crate::signing::AnswerVerifier::pinned(answer_cas),
            "answer CAs",
        )
    }

    /// Counts the answers refused from now on in `refusals`, by the verifier set now and
    /// those set later.
    #[cfg(feature = "mqtt-tls")]
    pub fn count_answer_refusals(
        &mut self,
        refusals: std::sync::Arc<crate::signing::AnswerRefusals>,
    ) {
        self.answers = self
            .answers
            .take()
            .map(|verifier| std::sync::Arc::new((*verifier).clone().counting(refusals.clone())));
        self.answer_refusals = refusals;
    }

    /// The client identifier used for `node`: [`Self::client_id`] or
    /// [`default_client_id`].
    fn client_id_of(&self, node: &str) -> String {
        self.client_id
            .clone()
            .unwrap_or_else(|| default_client_id(node))
    }

    fn check(&self, node_name: &str) -> Result<(), MqttUplinkError> {
        let invalid = |option, reason| MqttUplinkError::InvalidOption { option, reason };
        check_level(node_name).map_err(|r| invalid("node_name", r))?;
        check_prefix(&self.topic_prefix).map_err(|r| invalid("topic_prefix", r))?;
        check_keepalive(self.keepalive).map_err(|r| invalid("keepalive", r))?;
        check_connection(&self.client_id_of(node_name), &self.host, &self.failover)
            .map_err(|(option, reason)| invalid(option, reason))?;
        if self.lease_expiry < Duration::from_secs(1) {
            return Err(invalid("lease_expiry", "must be at least 1 s"));
        }
        if self.lease_expiry.as_secs() > u64::from(u32::MAX) {
            return Err(invalid("lease_expiry", "must fit in 32-bit seconds"));
        }
        if self.backoff_min.is_zero() || self.backoff_min > self.backoff_max {
            return Err(invalid("backoff_min", "must be > 0 and <= backoff_max"));
        }
        if self.register_timeout.is_zero() {
            return Err(invalid("register_timeout", "must be > 0"));
        }
        if self
            .user_timeout
            .is_some_and(|t| t < Duration::from_secs(1))
        {
            return Err(invalid("user_timeout", "must be at least 1 s"));
        }
        if self.max_packet_bytes == 0 || u32::try_from(self.max_packet_bytes).is_err() {
            return Err(invalid(
                "max_packet_bytes",
                "must be > 0 and fit in 32 bits",
            ));
        }
        Ok(())
    }

    /// Every broker, `host:port` first, then [`Self::failover`].
    fn brokers(&self) -> Vec<(String, u16)> {
        super::brokers(&self.host, self.port, &self.failover)
    }

    /// rumqttc's options for the broker at `host:port` as `client_id` (the server name TLS
    /// checks is `host`).
    fn mqtt_options(
        &self,
        client_id: &str,
        host: &str,
        port: u16,
    ) -> Result<MqttOptions, MqttUplinkError> {
        let mut mqtt = MqttOptions::new(client_id, host, port);
        #[cfg(feature = "mqtt-tls")]
        if let Some(tls) = &self.tls {
            crate::tls::install_ring_provider();
            let config = tls.rustls_config().map_err(MqttUplinkError::Tls)?;
            mqtt.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(std::sync::Arc::new(config)),
            ));
        }
        mqtt.set_keep_alive(self.keepalive)
            // A fresh session on every connect: nothing queued at the broker while away.
            .set_clean_start(true)
            .set_connection_timeout(CONNECT_TIMEOUT_SECS)
            // rumqttc preallocates one slot per possible in-flight packet id (65 536 by
            // default, ~13 MB); an agent has at most a status report, a renewal and a Register in flight.
            .set_outgoing_inflight_upper_limit(16)
            .set_max_packet_size(u32::try_from(self.max_packet_bytes).ok());
        let mut network = rumqttc::NetworkOptions::new();
        network.set_tcp_user_timeout(self.user_timeout);
        mqtt.set_network_options(network);
        if let Some((username, password)) = &self.credentials {
            mqtt.set_credentials(username, password);
        }
        Ok(mqtt)
    }
}

/// Why the MQTT uplink could not start.
#[derive(Debug, thiserror::Error)]
pub enum MqttUplinkError {
    /// An option (or the node name) cannot work; checked before connecting.
    #[error("invalid MQTT uplink option {option}: {reason}")]
    InvalidOption {
        /// The option's field name (`node_name` for the node name).
        option: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The TLS material cannot work (unparsable PEM, key not matching the certificate).
    #[cfg(feature = "mqtt-tls")]
    #[error("MQTT TLS: {0}")]
    Tls(#[source] crate::tls::TlsError),
    /// The client certificate's key cannot sign messages end to end (see
    /// [`crate::signing::MessageSigner::from_pem`]).
    #[cfg(feature = "mqtt-tls")]
    #[error("cannot sign MQTT messages with the client key: {0}")]
    SigningKey(#[source] crate::tls::TlsError),
}

/// Topics of one node.
struct Topics {
    register: String,
    status: String,
    lease: String,
    will: String,
    acks: String,
    /// Where the certificate chain is published when signing.
    #[cfg_attr(not(feature = "mqtt-tls"), allow(dead_code))]
    certificate: String,
}

impl Topics {
    fn new(prefix: &str, node: &str) -> Self {
        Self {
            register: node_topic(prefix, node, MessageKind::Register.as_str()),
            status: node_topic(prefix, node, MessageKind::Status.as_str()),
            lease: node_topic(prefix, node, MessageKind::Lease.as_str()),
            will: node_topic(prefix, node, WILL_KIND),
            acks: acks_topic(prefix, node),
            certificate: certificate_topic(prefix, node),
        }
    }

    fn for_kind(&self, kind: MessageKind) -> &str {
        match kind {
            MessageKind::Register => &self.register,
            MessageKind::Status => &self.status,
            MessageKind::Lease => &self.lease,
        }
    }
}

/// The Topic Alias of the Lease topic (the only one aliased: it carries most messages).
const LEASE_TOPIC_ALIAS: u16 = 1;

/// Where the Lease topic's Topic Alias stands on the current broker connection (aliases
/// are per connection, MQTT 5 §3.3.2.3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseAlias {
    /// The broker allows no alias (CONNACK Topic Alias Maximum 0 or absent).
    Unavailable,
    /// Allowed, not yet set: the next quiet renewal sends topic and alias.
    Unset,
    /// Set: quiet renewals send the alias with an empty topic.
    Set,
}

/// Runs the agent's MQTT connection until `cancel` fires or every
/// [`crate::uplink::Uplink`] handle is dropped.
///
/// On every CONNACK (clean start) it starts a new [`Session`], subscribes to
/// `P/acks/{node}` and then publishes `register()`; it publishes Register again when
/// registration was refused (with [`Session`]'s backoff), or when no answer came within `register_timeout` (doubling). Requests go to the topic of their kind
/// (QoS 1, not retained; Lease renewals with a Message Expiry Interval of `lease_expiry`)
/// and are answered by the acks the gateway publishes back. Quiet Lease renewals
/// (`LeaseRenewal.quiet`, answered only with news) go at QoS 0 without expiry, their topic
/// replaced by a Topic Alias after the first one on each connection when the broker allows
/// aliases (CONNACK Topic Alias Maximum ≥ 1; Mosquitto's default is 10). The Last Will
/// (`P/nodes/{node}/will`, the `Header` of a fresh `register()`, refreshed before each
/// connection attempt) tells gateways about a connection that died.
///
/// A message is only handed to rumqttc while connected: before the CONNACK and while
/// backing off (jittered exponential, `backoff_min` to `backoff_max`) requests are refused
/// with [`UplinkError::NotConnected`], and what rumqttc kept to resend after a lost
/// connection is discarded, since a late heartbeat would hide a dead node. A lost connection
/// fails pending requests with [`UplinkError::Disconnected`]. A message larger than
/// `max_packet_bytes`, or with no kind, is answered with an [`Answer::Rejected`] made locally
/// (it would be rejected by the gateway anyway). Malformed ack payloads are logged at debug
/// level and ignored.
///
/// On shutdown it sends DISCONNECT (so the broker discards the Last Will) and waits up to
/// 500 ms for the broker to close the connection.
///
/// With a [`MqttUplinkOptions::signer`], every message goes out as a `SignedMessage`, and
/// the certificate chain is published (QoS 1, retained) on `P/certificates/{node}` before
/// each Register.
///
/// Errors: [`MqttUplinkError::InvalidOption`] when an option or `node_name` cannot work
/// (checked before connecting), [`MqttUplinkError::Tls`] when the TLS material cannot.
pub async fn run_uplink(
    options: MqttUplinkOptions,
    node_name: String,
    register: RegisterFn,
    driver: &mut UplinkDriver,
    cancel: CancellationToken,
) -> Result<(), MqttUplinkError> {
    options.check(&node_name)?;
    let topics = Topics::new(&options.topic_prefix, &node_name);
    let brokers = options.brokers();
    let client_id = options.client_id_of(&node_name);
    let mut broker = 0;
    let mut mqtt = options.mqtt_options(&client_id, &brokers[0].0, brokers[0].1)?;
    mqtt.set_last_will(last_will(&topics, &node_name, &register));
    let (client, eventloop) = AsyncClient::new(mqtt, REQUEST_QUEUE);
    let mut link = Link::new(&options, &node_name, topics, client, register);
    let mut backoff = reconnect_backoff(options.backoff_min, options.backoff_max);
    let mut next = next_event(eventloop);
    let register_timer = tokio::time::sleep(Duration::MAX);
    tokio::pin!(register_timer);
    let mut timer_armed = false;
    loop {
        let change = tokio::select! {
            () = cancel.cancelled() => break,
            () = &mut register_timer, if timer_armed => Timer::Arm(link.send_register()),
            request = driver.requests.recv() => {
                let Some(request) = request else { break };
                link.send(request);
                Timer::Keep
            }
            (mut eventloop, result) = &mut next => match result {
                Ok(event) => {
                    next = next_event(eventloop);
                    link.on_event(event, driver)
                }
                Err(error) => {
                    let was_registered = link.close(driver).unwrap_or(false);
                    // rumqttc keeps unacknowledged publishes and queued requests to resend
                    // on a resumed session; these heartbeats are stale by now.
                    eventloop.pending.clear();
                    if ends_backoff(was_registered, link.connected_at, options.backoff_max) {
                        backoff = reconnect_backoff(options.backoff_min, options.backoff_max);
                    }
                    let delay = backoff.next().unwrap_or(options.backoff_max);
                    let (host, port) = &brokers[broker];
                    if super::session_taken_over(&error) {
                        tracing::error!(
                            "another client connected with this agent's MQTT client ID and the broker gave it the session (MQTT 5 reason 0x8E, Session taken over): renewals are lost while it does; bind client IDs to authenticated identities on the broker"
                        );
                    }
                    tracing::warn!(%error, ?delay, broker = %format_args!("{host}:{port}"), "MQTT connection lost; reconnecting");
                    if !refuse_while_waiting(&mut driver.requests, delay, &cancel).await {
                        return Ok(());
                    }
                    let will = last_will(&link.topics, &node_name, &link.register);
                    if brokers.len() > 1 {
                        // The next broker of the cluster, on a new client and event loop
                        // (rumqttc's options name one broker).
                        broker = (broker + 1) % brokers.len();
                        let (host, port) = &brokers[broker];
                        let mut mqtt = options.mqtt_options(&client_id, host, *port)?;
                        mqtt.set_last_will(will);
                        let (client, fresh) = AsyncClient::new(mqtt, REQUEST_QUEUE);
                        link.client = client;
                        tracing::info!(broker = %format_args!("{host}:{port}"), "MQTT: trying the next broker");
                        eventloop = fresh;
                    } else {
                        eventloop.options.set_last_will(will);
                    }
                    // rumqttc (re)connects on this poll.
                    next = next_event(eventloop);
                    Timer::Disarm
                }
            },
        };
        match change {
            Timer::Keep => {}
            Timer::Disarm => timer_armed = false,
            Timer::Arm(delay) => {
                register_timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + delay);
                timer_armed = true;
            }
        }
    }
    if link.close(driver).is_some() {
        disconnect_within(&link.client, next, DISCONNECT_TIMEOUT).await;
    }
    Ok(())
}

/// What to do with the Register timer.
#[derive(Debug, PartialEq, Eq)]
enum Timer {
    Keep,
    Disarm,
    Arm(Duration),
}

#[cfg(test)]
#[path = "client/tests.rs"]
mod tests;
