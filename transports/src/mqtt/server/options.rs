//! The MQTT ingress's settings ([`MqttIngressOptions`]), what it asks of signed messages
//! ([`SignaturePolicy`]), and the rumqttc options they make.

use std::time::Duration;

use rumqttc::v5::MqttOptions;
use std::sync::Arc;

use edgebeat_proto::MAX_AGENT_MESSAGE_BYTES;

use super::super::{
    CONNECT_TIMEOUT_SECS, DEFAULT_KEEPALIVE, DEFAULT_SHARE_GROUP, DEFAULT_TOPIC_PREFIX, brokers,
    check_connection, check_keepalive, check_level, check_prefix,
};
use super::{MqttIngressError, PACKET_HEADROOM};
use crate::ingress::UsageOutbox;
use crate::signing::{AnswerSigner, AnswerVerifier, CertificateVerifier};
use crate::tls::ClientTls;

/// Settings of the gateway's MQTT ingress.
#[derive(Debug, Clone)]
pub struct MqttIngressOptions {
    /// Broker host name or address.
    pub host: String,
    /// Broker port (1883 for plain MQTT).
    pub port: u16,
    /// Further nodes of the same broker cluster, `(host, port)` (default none). After a
    /// lost or failed connection the next attempt goes to the next broker of `host:port`
    /// and these, in turn, as the agent's [`MqttUplinkOptions::failover`](super::super::MqttUplinkOptions::failover) does: a
    /// replica whose broker node died subscribes again on another node of the cluster, with
    /// the same TLS settings and credentials, and the cluster's shared subscription spreads
    /// the fleet over it and the other replicas.
    pub failover: Vec<(String, u16)>,
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
    /// Set to `true` when the broker has granted the shared subscription, `false` when the
    /// connection is lost: a readiness signal (tests wait on it; `/readyz` can report it).
    pub subscribed: Option<Arc<tokio::sync::watch::Sender<bool>>>,
    /// TLS to the broker (`mqtts://`; default off): the broker must chain to the CA, and the
    /// client certificate, when set, is presented.
    pub tls: Option<ClientTls>,
    /// End-to-end signature checks (default off); see [`SignaturePolicy`].
    pub signatures: Option<SignaturePolicy>,
    /// Follow the site brokers' bridge notifications (default on): subscribe, without a
    /// share group, to `P/sites/#` ([`sites_filter`](super::super::sites_filter)) and hand each site's uplink
    /// state to [`Handler::site_uplink`]. The broker's ACL must let the gateway read it,
    /// and only the site bridges write it.
    pub site_uplinks: bool,
    /// Signs every answer to a signed message (default off; required by agents that sign,
    /// see [`crate::signing::AnswerSigner`]): the answer then binds the node and boot it
    /// answers (`Ack.node_name`, `Ack.boot_tag`). Answers to unsigned messages stay plain.
    pub answer_signer: Option<Arc<AnswerSigner>>,
    /// Shares usage samples with the other replicas (default off): publishes the samples
    /// sent into this outbox in batches on `P/usage` ([`usage_topic`](super::super::usage_topic), QoS 0, while
    /// subscribed; a batch closes [`USAGE_LINGER`] after its first sample or at
    /// [`MAX_USAGE_BATCH_BYTES`]), signed with [`MqttIngressOptions::answer_signer`] when
    /// there is one, and subscribes, without a share group and with No Local, to
    /// `P/usage`, handing the other replicas' samples to [`Handler::shared_usage`].
    pub usage_sharing: Option<UsageOutbox>,
    /// Verifies the other replicas' usage batches (default none): with it, only a batch
    /// signed by a gateway's answer key chaining to its trust anchors (the site CA) is
    /// taken, so that nobody else on the broker can tell a replica any node's usage;
    /// without it (an ingress that verifies no signatures either) batches are taken as
    /// they come.
    pub usage_verifier: Option<AnswerVerifier>,
    /// Counts the times the broker ended this ingress's session because another client
    /// connected with its client ID (MQTT 5 DISCONNECT, reason code 0x8E Session taken
    /// over, MQTT 5.0 §3.14.2.1), each also an ERROR in the log (default none).
    pub sessions_taken_over: Option<Arc<std::sync::atomic::AtomicU64>>,
}

/// How the ingress treats signed messages ([`crate::signing`]).
#[derive(Debug, Clone)]
pub struct SignaturePolicy {
    /// Checks certificates published on `P/certificates/{node}` against the site CA.
    pub verifier: CertificateVerifier,
    /// Refuse unsigned messages ([`REJECT_UNSIGNED`]). When false, unsigned messages are
    /// handed on with no identity (a fleet moving to signatures), signed ones with theirs;
    /// an unsigned message for a node whose certificate is held is still refused.
    pub required: bool,
    /// Largest difference between a signed message's `Header.wall_time_ms` and the gateway's
    /// clock (default [`DEFAULT_MAX_CLOCK_SKEW`], 30 s); beyond it: [`REJECT_CLOCK`].
    ///
    /// The per-boot `seq` stops replays only where a replica remembers the boot; a replica
    /// that does not (restarted, slot evicted, never saw it) would take a recorded message
    /// as new. The signed wall time bounds every replay to this window. It asks agents for
    /// a roughly right clock, which TLS to the broker (certificate validity) asks already.
    pub max_clock_skew: Duration,
}

/// Default [`SignaturePolicy::max_clock_skew`], 30 s: NTP-synchronised boards are within
/// milliseconds; a replay is accepted at most this long after it was recorded.
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);

impl SignaturePolicy {
    /// A policy verifying against `verifier`, refusing unsigned messages when `required`,
    /// with the default clock window.
    pub fn new(verifier: CertificateVerifier, required: bool) -> Self {
        Self {
            verifier,
            required,
            max_clock_skew: DEFAULT_MAX_CLOCK_SKEW,
        }
    }
}

impl MqttIngressOptions {
    /// Options for the broker at `host:port` as client `client_id`, with the defaults
    /// documented on each field.
    pub fn new(host: impl Into<String>, port: u16, client_id: impl Into<String>) -> Self {
        Self {
            host: host.into(),
            port,
            failover: Vec::new(),
            client_id: client_id.into(),
            credentials: None,
            topic_prefix: DEFAULT_TOPIC_PREFIX.to_owned(),
            share_group: DEFAULT_SHARE_GROUP.to_owned(),
            keepalive: DEFAULT_KEEPALIVE,
            max_packet_bytes: MAX_AGENT_MESSAGE_BYTES,
            subscribed: None,
            tls: None,
            signatures: None,
            answer_signer: None,
            site_uplinks: true,
            usage_sharing: None,
            usage_verifier: None,
            sessions_taken_over: None,
        }
    }

    pub(super) fn check(&self) -> Result<(), MqttIngressError> {
        let invalid = |option, reason| MqttIngressError::InvalidOption { option, reason };
        check_prefix(&self.topic_prefix).map_err(|r| invalid("topic_prefix", r))?;
        check_level(&self.share_group).map_err(|r| invalid("share_group", r))?;
        check_keepalive(self.keepalive).map_err(|r| invalid("keepalive", r))?;
        check_connection(&self.client_id, &self.host, &self.failover)
            .map_err(|(option, reason)| invalid(option, reason))?;
        if self.max_packet_bytes == 0 || self.max_packet_bytes > u32::MAX as usize / 2 {
            return Err(invalid("max_packet_bytes", "must be > 0 and < 2 GiB"));
        }
        Ok(())
    }

    /// Every broker, `host:port` first, then [`Self::failover`].
    pub(super) fn brokers(&self) -> Vec<(String, u16)> {
        brokers(&self.host, self.port, &self.failover)
    }

    /// rumqttc's options for the broker at `host:port` (the server name TLS checks is
    /// `host`).
    pub(super) fn mqtt_options(
        &self,
        host: &str,
        port: u16,
    ) -> Result<MqttOptions, MqttIngressError> {
        let mut mqtt = MqttOptions::new(&self.client_id, host, port);
        if let Some(tls) = &self.tls {
            let config = tls.rustls_config().map_err(MqttIngressError::Tls)?;
            mqtt.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(Arc::new(config)),
            ));
        }
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
        // One connection carries every node's acks: Nagle's algorithm would hold an ack
        // back until the broker's (delayed, up to 40 ms) TCP ACK of the previous one.
        let mut network = mqtt.network_options();
        network.set_tcp_nodelay(true);
        mqtt.set_network_options(network);
        Ok(mqtt)
    }
}
