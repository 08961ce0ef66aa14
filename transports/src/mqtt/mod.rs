//! MQTT 5 transport through a broker (rumqttc's v5 client).
//!
//! Topics, under a configurable prefix `P` (default [`DEFAULT_TOPIC_PREFIX`]):
//!
//! | topic                        | direction        | payload                          | notes |
//! |------------------------------|------------------|----------------------------------|-------|
//! | `P/nodes/{node}/register`    | agent → gateway  | protobuf `AgentMessage`          | QoS 1 |
//! | `P/nodes/{node}/status`      | agent → gateway  | protobuf `AgentMessage`          | QoS 1 |
//! | `P/nodes/{node}/lease`       | agent → gateway  | protobuf `AgentMessage`          | QoS 1, Message Expiry Interval |
//! | `P/nodes/{node}/will`        | broker → gateway | protobuf `Header` (Last Will)    | QoS 1 |
//! | `P/acks/{node}`              | gateway → agent  | protobuf `GatewayMessage`        | QoS 1 |
//! | `P/certificates/{node}`      | agent → gateways | protobuf `NodeCertificate`       | QoS 1, retained; only with signing |
//! | `P/usage`                    | gateway → gateways | protobuf `SignedUsage` (`SharedUsageBatch` unsigned) | QoS 0, No Local; only when sharing usage |
//!
//! With signing (agent: a node key; gateway: a site CA, see [`crate::signing`]) every
//! agent payload is a `SignedMessage` instead of a bare `AgentMessage`, and the agent
//! publishes its certificate chain, retained, before each Register; every gateway replica
//! subscribes to `P/certificates/+` without a share group, so each holds every node's
//! certificate, including those published before it started.
//!
//! Only certificates are retained: a retained heartbeat would be stale by the time anyone read it. The
//! whole `AgentMessage` oneof is the payload on every agent topic, so the gateway has one
//! decoder; the topic only routes, and the gateway checks that it agrees with the message.
//! Gateways subscribe with the shared subscription `$share/{group}/P/nodes/+/+`, so replicas
//! split the fleet (see [`gateway_filter`]). A node's usage samples
//! (`LeaseRenewal.usage`), which every replica serves as kubelet's resource metrics, are
//! what replicas tell each other: each publishes the samples it admitted, in batches, on
//! `P/usage` and subscribes to [`usage_filter`] without a share group and with No Local
//! (MQTT 5 §3.8.3.1), so each holds every node's latest sample. Where the replicas sign
//! their answers, a batch is signed with the replica's answer key
//! ([`crate::signing::AnswerSigner::seal_usage`]) and the others take only one that
//! verifies: the broker's ACL is not trusted for it.
//!
//! Both sides own one rumqttc `EventLoop` in one task and keep its `poll()` future alive
//! across `select!` iterations (see `next_event`), so an unrelated branch winning never
//! cancels a half-written packet.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rumqttc::Outgoing;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop};

#[cfg(feature = "mqtt-uplink")]
mod client;
/// Certificate requests over MQTT (enrollment and rotation), agent side.
#[cfg(all(feature = "mqtt-uplink", feature = "mqtt-tls"))]
pub mod enroll;
#[cfg(feature = "mqtt-ingress")]
mod server;

#[cfg(feature = "mqtt-uplink")]
pub use client::{
    DEFAULT_AGENT_KEEPALIVE, DEFAULT_USER_TIMEOUT, MqttUplinkError, MqttUplinkOptions,
    default_client_id, run_uplink,
};
#[cfg(feature = "mqtt-ingress")]
pub use server::{
    DEFAULT_MAX_CLOCK_SKEW, MAX_USAGE_BATCH_BYTES, MqttIngressError, MqttIngressOptions,
    REJECT_BAD_SIGNATURE, REJECT_CERTIFICATE, REJECT_CERTIFICATE_EXPIRED, REJECT_CLOCK,
    REJECT_MALFORMED, REJECT_MISMATCH, REJECT_TOO_LARGE, REJECT_UNKNOWN_SIGNER,
    REJECT_UNKNOWN_TOPIC, REJECT_UNSIGNED, SignaturePolicy, USAGE_LINGER, serve,
};

/// Default topic prefix, `edgebeat/v1` (the wire package's version).
pub const DEFAULT_TOPIC_PREFIX: &str = "edgebeat/v1";

/// Default shared-subscription group of gateway replicas, `edgebeat-gateway`.
pub const DEFAULT_SHARE_GROUP: &str = "edgebeat-gateway";

/// Default MQTT keepalive of the gateway's ingress, 30 s (the agent's is
/// `DEFAULT_AGENT_KEEPALIVE`, 30 min, as `TCP_USER_TIMEOUT` watches its path).
///
/// Tuned for flaky links: the broker declares a silent client dead after 1.5 × keepalive
/// (45 s, then the Last Will goes out) and rumqttc after a ping unanswered for one keepalive,
/// so a dead cellular link is noticed about one lease duration (40 s) later, while a few
/// seconds of lost signal (which TCP retransmission rides out) does not tear the session down
/// and make every agent of a cell re-register at once. A ping costs 2 bytes each way.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(30);

/// Time allowed for TCP connect plus CONNECT/CONNACK, 10 s (rumqttc's default of 5 s is short
/// for a congested cellular uplink).
pub(crate) const CONNECT_TIMEOUT_SECS: u64 = 10;

/// Longest the gateway's ingress waits at shutdown for its DISCONNECT to go out (the agent
/// waits less: `client::DISCONNECT_TIMEOUT`).
#[cfg(feature = "mqtt-ingress")]
pub(crate) const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether `error` is the broker ending the session because another client connected with
/// the same client ID (MQTT 5 DISCONNECT reason code 0x8E, Session taken over, MQTT 5.0
/// §3.14.2.1): the gateway's ingress and the agent log it as an ERROR, since it repeats for
/// as long as the other client keeps reconnecting.
pub(crate) fn session_taken_over(error: &rumqttc::v5::ConnectionError) -> bool {
    matches!(
        error,
        rumqttc::v5::ConnectionError::MqttState(rumqttc::v5::StateError::ServerDisconnect {
            reason_code: rumqttc::v5::mqttbytes::v5::DisconnectReasonCode::SessionTakenOver,
            ..
        })
    )
}

#[cfg(test)]
mod session_tests {
    use rumqttc::v5::mqttbytes::v5::DisconnectReasonCode;
    use rumqttc::v5::{ConnectionError, StateError};

    #[test]
    fn only_the_brokers_session_taken_over_is_a_takeover() {
        let disconnect = |reason_code| {
            ConnectionError::MqttState(StateError::ServerDisconnect {
                reason_code,
                reason_string: None,
            })
        };
        assert!(super::session_taken_over(&disconnect(
            DisconnectReasonCode::SessionTakenOver
        )));
        for other in [
            DisconnectReasonCode::ServerShuttingDown,
            DisconnectReasonCode::KeepAliveTimeout,
            DisconnectReasonCode::NotAuthorized,
        ] {
            assert!(!super::session_taken_over(&disconnect(other)), "{other:?}");
        }
        assert!(!super::session_taken_over(&ConnectionError::MqttState(
            StateError::ConnectionAborted
        )));
    }
}

/// Last segment of the Last Will topic, `P/nodes/{node}/will`.
pub const WILL_KIND: &str = "will";

/// Topic of one agent message kind (`register`, `status`, `lease`) or of the Last Will
/// (`will`): `{prefix}/nodes/{node}/{kind}`.
pub fn node_topic(prefix: &str, node: &str, kind: &str) -> String {
    // Joined, not `format!`: one allocation of the right size on every publish.
    [prefix, "/nodes/", node, "/", kind].concat()
}

/// Topic the gateway answers one node on: `{prefix}/acks/{node}`.
pub fn acks_topic(prefix: &str, node: &str) -> String {
    // Joined, not `format!`: the gateway builds one for every answer.
    [prefix, "/acks/", node].concat()
}

/// Topic a node's certificate chain is published on (retained): `{prefix}/certificates/{node}`.
pub fn certificate_topic(prefix: &str, node: &str) -> String {
    format!("{prefix}/certificates/{node}")
}

/// Filter every gateway replica subscribes to (no share group) when verifying signatures:
/// `{prefix}/certificates/+`.
pub fn certificates_filter(prefix: &str) -> String {
    format!("{prefix}/certificates/+")
}

/// The node of `{prefix}/certificates/{node}`; `None` for any other topic.
pub fn parse_certificate_topic<'t>(prefix: &str, topic: &'t str) -> Option<&'t str> {
    let node = topic.strip_prefix(prefix)?.strip_prefix("/certificates/")?;
    (!node.is_empty() && !node.contains('/')).then_some(node)
}

/// Topic the gateway replicas share their usage samples on (a `SignedUsage`, or a plain
/// `SharedUsageBatch` where nothing is signed): `{prefix}/usage`.
pub fn usage_topic(prefix: &str) -> String {
    [prefix, "/usage"].concat()
}

/// Filter every gateway replica that shares usage subscribes to (no share group, No
/// Local): the topic itself, [`usage_topic`].
pub fn usage_filter(prefix: &str) -> String {
    usage_topic(prefix)
}

/// Whether `topic` is `{prefix}/usage`.
pub fn is_usage_topic(prefix: &str, topic: &str) -> bool {
    topic.strip_prefix(prefix) == Some("/usage")
}

/// Topic of a site's uplink state, `{prefix}/sites/{site}/uplink` (`site` is a zone, or
/// `region/zone`): what a site broker's Mosquitto bridge publishes as its
/// `notification_topic` — retained `1` when the bridge connects, and through its Last Will
/// `0` when the cluster's broker loses it (Mosquitto `mosquitto.conf(5)`: `notifications`,
/// `notification_topic`).
pub fn uplink_topic(prefix: &str, site: &str) -> String {
    format!("{prefix}/sites/{site}/uplink")
}

/// Filter every gateway replica subscribes to (no share group, so each gets the retained
/// state of every site): `{prefix}/sites/#`.
pub fn sites_filter(prefix: &str) -> String {
    format!("{prefix}/sites/#")
}

/// The site of `{prefix}/sites/{site}/uplink`, when `site` is a zone or `region/zone`
/// whose parts are label values (at most 63 characters of `A-Za-z0-9-_.`, alphanumeric at
/// both ends: Kubernetes' label value syntax); `None` for any other topic under
/// `{prefix}/sites/`, and for topics outside it.
pub fn parse_uplink_topic<'t>(prefix: &str, topic: &'t str) -> Option<&'t str> {
    let site = topic
        .strip_prefix(prefix)?
        .strip_prefix("/sites/")?
        .strip_suffix("/uplink")?;
    let label_value = |v: &str| {
        let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        !v.is_empty()
            && v.len() <= 63
            && edge(v.chars().next())
            && edge(v.chars().last())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let mut parts = site.split('/');
    let valid = parts.next().is_some_and(label_value)
        && parts.next().is_none_or(label_value)
        && parts.next().is_none();
    valid.then_some(site)
}

/// Shared-subscription filter of gateway replicas: `$share/{group}/{prefix}/nodes/+/+`.
pub fn gateway_filter(prefix: &str, group: &str) -> String {
    format!("$share/{group}/{prefix}/nodes/+/+")
}

/// Splits `{prefix}/nodes/{node}/{kind}` into `(node, kind)`; `None` for any other topic.
pub fn parse_node_topic<'t>(prefix: &str, topic: &'t str) -> Option<(&'t str, &'t str)> {
    let rest = topic.strip_prefix(prefix)?.strip_prefix("/nodes/")?;
    let (node, kind) = rest.split_once('/')?;
    if node.is_empty() || kind.is_empty() || kind.contains('/') {
        return None;
    }
    Some((node, kind))
}

pub(crate) use crate::endpoint::{
    check_mqtt_keepalive as check_keepalive, check_topic_level as check_level,
    check_topic_prefix as check_prefix,
};

/// One `EventLoop::poll()` that owns the event loop and hands it back with the result.
pub(crate) type NextEvent =
    Pin<Box<dyn Future<Output = (EventLoop, Result<Event, ConnectionError>)> + Send>>;

/// Whether a lost connection starts the reconnect backoff over: only one that carried the
/// client (the agent registered, the gateway subscribed) and stayed up at least
/// `backoff_max`. A broker that accepts and then drops the client at once (a duplicate
/// client ID, a cluster node kicking the session) keeps the backoff growing instead of
/// being redialled every `backoff_min`.
pub(crate) fn ends_backoff(
    registered: bool,
    connected_at: Option<tokio::time::Instant>,
    backoff_max: Duration,
) -> bool {
    registered && connected_at.is_some_and(|t| t.elapsed() >= backoff_max)
}

/// The connection settings both MQTT clients share, checked once for both: `client_id`,
/// `host` and every `failover` host non-empty. Errors: `(option, reason)` for the
/// client's `InvalidOption`.
pub(crate) fn check_connection(
    client_id: &str,
    host: &str,
    failover: &[(String, u16)],
) -> Result<(), (&'static str, &'static str)> {
    if client_id.is_empty() {
        return Err(("client_id", "must not be empty"));
    }
    if host.is_empty() {
        return Err(("host", "must not be empty"));
    }
    if failover.iter().any(|(host, _)| host.is_empty()) {
        return Err(("failover", "a host must not be empty"));
    }
    Ok(())
}

/// The brokers of a cluster list, as both sides dial them: `host:port` first, then
/// `failover` in order (the next after each lost or failed connection).
pub(crate) fn brokers(host: &str, port: u16, failover: &[(String, u16)]) -> Vec<(String, u16)> {
    std::iter::once((host.to_owned(), port))
        .chain(failover.iter().cloned())
        .collect()
}

/// Starts the next `poll()`. The future is kept across `select!` iterations and only
/// replaced once it completed: dropping `poll()` halfway could lose a packet rumqttc had
/// already taken from its queue and counted as in flight.
pub(crate) fn next_event(mut eventloop: EventLoop) -> NextEvent {
    Box::pin(async move {
        let result = eventloop.poll().await;
        (eventloop, result)
    })
}

/// Sends DISCONNECT (normal disconnection: the broker discards the Last Will) and drives the
/// event loop until the broker closed the connection or [`DISCONNECT_TIMEOUT`] passed.
///
/// Waiting for the broker's close (rather than dropping the socket as soon as DISCONNECT is
/// flushed) avoids a TCP reset racing the DISCONNECT when unread data is pending.
#[cfg(feature = "mqtt-ingress")]
pub(crate) async fn disconnect(client: &AsyncClient, next: NextEvent) {
    disconnect_within(client, next, DISCONNECT_TIMEOUT).await;
}

/// As `disconnect`, waiting at most `timeout` for the broker's close.
pub(crate) async fn disconnect_within(
    client: &AsyncClient,
    mut next: NextEvent,
    timeout: Duration,
) {
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let request = client.disconnect();
    tokio::pin!(request);
    let mut requested = false;
    let mut sent = false;
    loop {
        tokio::select! {
            () = &mut deadline => {
                tracing::debug!(sent, "MQTT disconnect did not finish in time");
                return;
            }
            result = &mut request, if !requested => {
                requested = true;
                if result.is_err() {
                    return;
                }
            }
            (eventloop, result) = &mut next => match result {
                Ok(Event::Outgoing(Outgoing::Disconnect)) => {
                    sent = true;
                    next = next_event(eventloop);
                }
                Ok(_) => next = next_event(eventloop),
                // Before DISCONNECT went out this is a broken connection (nothing more to
                // do); after it, the broker closing its end: done either way. Polling again
                // would reconnect.
                Err(_) => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_follow_the_contract() {
        assert_eq!(
            node_topic("edgebeat/v1", "edge-1", "lease"),
            "edgebeat/v1/nodes/edge-1/lease"
        );
        assert_eq!(
            acks_topic("edgebeat/v1", "edge-1"),
            "edgebeat/v1/acks/edge-1"
        );
        assert_eq!(
            certificate_topic("edgebeat/v1", "edge-1"),
            "edgebeat/v1/certificates/edge-1"
        );
        assert_eq!(
            parse_certificate_topic("edgebeat/v1", "edgebeat/v1/certificates/edge-1"),
            Some("edge-1")
        );
        for bad in [
            "edgebeat/v1/certificates/",
            "edgebeat/v1/certificates/a/b",
            "x/certificates/a",
        ] {
            assert_eq!(parse_certificate_topic("edgebeat/v1", bad), None, "{bad}");
        }
        assert_eq!(certificates_filter("p"), "p/certificates/+");
        assert_eq!(usage_topic("p"), "p/usage");
        assert_eq!(usage_filter("p"), "p/usage");
        assert!(is_usage_topic("p", "p/usage"));
        for bad in [
            "p/usage/",
            "p/usage/a",
            "q/usage",
            "pp/usage",
            "p/certificates/a",
        ] {
            assert!(!is_usage_topic("p", bad), "{bad}");
        }
        assert_eq!(
            gateway_filter("edgebeat/v1", "edgebeat-gateway"),
            "$share/edgebeat-gateway/edgebeat/v1/nodes/+/+"
        );
    }

    #[test]
    fn node_topics_parse_back() {
        let p = "site/a";
        assert_eq!(
            parse_node_topic(p, "site/a/nodes/n1/status"),
            Some(("n1", "status"))
        );
        assert_eq!(
            parse_node_topic(p, "site/a/nodes/n1/will"),
            Some(("n1", "will"))
        );
        for bad in [
            "site/a/nodes/n1",
            "site/a/nodes//lease",
            "site/a/nodes/n1/",
            "site/a/nodes/n1/lease/x",
            "site/b/nodes/n1/lease",
            "site/ab/nodes/n1/lease",
            "site/a/acks/n1",
        ] {
            assert_eq!(parse_node_topic(p, bad), None, "{bad}");
        }
    }

    #[test]
    fn prefixes_and_levels_are_checked() {
        check_prefix("edgebeat/v1").unwrap();
        for (bad, err) in [
            ("", "must not be empty"),
            ("$SYS/x", "must not start with '$' (reserved by MQTT)"),
            ("/a", "must not start or end with '/'"),
            ("a/", "must not start or end with '/'"),
            ("a/+/b", "must not contain '+', '#' or NUL"),
            ("a/#", "must not contain '+', '#' or NUL"),
        ] {
            assert_eq!(check_prefix(bad), Err(err), "{bad}");
        }
        check_level("edge-0001.site").unwrap();
        assert_eq!(check_level(""), Err("must not be empty"));
        for bad in ["a/b", "+", "#", "a\0"] {
            assert_eq!(
                check_level(bad),
                Err("must not contain '/', '+', '#' or NUL"),
                "{bad:?}"
            );
        }
        assert_eq!(
            check_keepalive(Duration::from_secs(4)),
            Err("must be at least 5 s")
        );
        check_keepalive(Duration::from_secs(30)).unwrap();
        assert_eq!(
            check_keepalive(Duration::from_secs(70_000)),
            Err("must be at most 65535 s")
        );
    }
}
