use super::super::ends_backoff;
use super::link::{Link, last_will};
use super::*;
use crate::uplink::RegisterFn;
use edgebeat_proto::AgentMessage;
use edgebeat_proto::{Header, MessageKind};
use prost::Message as _;
use rumqttc::v5::AsyncClient;
use rumqttc::v5::mqttbytes::QoS;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn only_a_lasting_registered_connection_ends_the_backoff() {
    let max = Duration::from_secs(7);
    let at = tokio::time::Instant::now();
    // Accepted and dropped at once: the backoff keeps growing.
    assert!(!ends_backoff(true, Some(at), max));
    tokio::time::advance(max).await;
    assert!(ends_backoff(true, Some(at), max));
    // Never registered, or never accepted: nothing to end.
    assert!(!ends_backoff(false, Some(at), max));
    assert!(!ends_backoff(true, None, max));
}

#[test]
fn options_are_checked_before_connecting() {
    let ok = MqttUplinkOptions::new("127.0.0.1", 1883);
    assert_eq!(ok.client_id_of("edge-1"), "edgebeat-agent-edge-1");
    ok.check("edge-1").unwrap();
    let err = |o: &MqttUplinkOptions, node: &str| match o.check(node) {
        Err(MqttUplinkError::InvalidOption { option, .. }) => option,
        Err(MqttUplinkError::Tls(_) | MqttUplinkError::SigningKey(_)) => "tls",
        Ok(()) => "ok",
    };
    assert_eq!(err(&ok, "a/b"), "node_name");
    assert_eq!(err(&ok, "+"), "node_name");
    let mut o = ok.clone();
    o.lease_expiry = Duration::from_millis(999);
    assert_eq!(err(&o, "edge-1"), "lease_expiry");
    let mut o = ok.clone();
    o.keepalive = Duration::from_secs(1);
    assert_eq!(err(&o, "edge-1"), "keepalive");
    let mut o = ok.clone();
    o.topic_prefix = "edgebeat/v1/".into();
    assert_eq!(err(&o, "edge-1"), "topic_prefix");
    let mut o = ok.clone();
    o.failover = vec![("b1".into(), 1883), (String::new(), 1883)];
    assert_eq!(err(&o, "edge-1"), "failover");
    let mut o = ok.clone();
    o.client_id = Some(String::new());
    assert_eq!(err(&o, "edge-1"), "client_id");
    let mut o = ok;
    o.backoff_min = Duration::from_secs(8);
    assert_eq!(err(&o, "edge-1"), "backoff_min");
}

#[test]
fn each_kind_has_its_topic() {
    let t = Topics::new("p", "n");
    assert_eq!(t.for_kind(MessageKind::Register), "p/nodes/n/register");
    assert_eq!(t.for_kind(MessageKind::Status), "p/nodes/n/status");
    assert_eq!(t.for_kind(MessageKind::Lease), "p/nodes/n/lease");
    assert_eq!(t.will, "p/nodes/n/will");
    assert_eq!(t.acks, "p/acks/n");
}

#[test]
fn lease_expiry_is_whole_seconds_rounded_down() {
    let mut o = MqttUplinkOptions::new("h", 1);
    o.lease_expiry = Duration::from_millis(10_900);
    let (client, _eventloop) = AsyncClient::new(o.mqtt_options("c", "h", 1).unwrap(), 1);
    let register: RegisterFn = std::sync::Arc::new(AgentMessage::default);
    let link = Link::new(&o, "n", Topics::new("p", "n"), client, register);
    assert_eq!(link.lease_properties.message_expiry_interval, Some(10));
}

#[test]
fn will_carries_the_register_header() {
    let register: RegisterFn = std::sync::Arc::new(|| AgentMessage {
        kind: Some(edgebeat_proto::agent_message::Kind::Register(
            edgebeat_proto::Register {
                header: Some(Header {
                    node_name: "n".into(),
                    boot_id: vec![1; 16],
                    seq: 42,
                    ..Header::default()
                }),
                ..Default::default()
            },
        )),
    });
    let will = last_will(&Topics::new("p", "n"), "n", &register);
    assert_eq!(will.topic, "p/nodes/n/will".as_bytes());
    assert!(!will.retain);
    assert_eq!(will.qos, QoS::AtLeastOnce);
    let header = Header::decode(will.message.as_ref()).unwrap();
    assert_eq!((header.node_name.as_str(), header.seq), ("n", 42));
    // Without a header the node name still identifies the session.
    let empty: RegisterFn = std::sync::Arc::new(AgentMessage::default);
    let will = last_will(&Topics::new("p", "n"), "n", &empty);
    assert_eq!(
        Header::decode(will.message.as_ref()).unwrap().node_name,
        "n"
    );
}
