//! A raw MQTT 5 client over TLS: what an attacker with a certificate the broker accepts
//! (a misconfigured ACL, another tenant, a compromised device) can do on the broker. Used by
//! the security and attack suites.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use edgebeat_transports::tls::{ClientTls, TlsIdentity};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};

use crate::harness::Cluster;
use crate::pki::Leaf;

/// How long a spy waits for its subscription or a message.
const DEADLINE: Duration = Duration::from_secs(20);

/// Spies made so far (their client IDs).
static SPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A raw MQTT 5 client over TLS with `identity` (a site certificate the broker accepts):
/// what an attacker on the broker can do. Panics on connection failures (a test helper).
pub struct Spy {
    client: AsyncClient,
    publishes: tokio::sync::mpsc::UnboundedReceiver<(String, Vec<u8>)>,
    task: tokio::task::JoinHandle<()>,
}

impl Spy {
    /// Connects as `identity` and subscribes to `subscribe` (waiting for the SUBACK when
    /// there is any). Each spy has its own client ID.
    pub async fn connect(cluster: &Cluster, identity: &Leaf, subscribe: &[&str]) -> Self {
        let security = cluster.mqtt_security().unwrap();
        let tls = ClientTls {
            ca_pem: security.site_ca_pem.clone().into_bytes(),
            client_identity: Some(TlsIdentity {
                cert_pem: identity.cert_pem.clone().into_bytes(),
                key_pem: identity.key_pem.clone().into_bytes(),
            }),
        };
        Self::connect_with(cluster, tls, subscribe).await
    }

    /// Connects to the broker of an enrolling cluster ([`Cluster::start_enrolling`]) with
    /// its broker CA and no client certificate, as anyone the broker lets in.
    pub async fn connect_anonymous(cluster: &Cluster, subscribe: &[&str]) -> Self {
        let site = cluster.enrolling.as_ref().unwrap();
        let tls = ClientTls {
            ca_pem: site.broker_ca_pem.clone().unwrap().into_bytes(),
            client_identity: None,
        };
        Self::connect_with(cluster, tls, subscribe).await
    }

    async fn connect_with(cluster: &Cluster, tls: ClientTls, subscribe: &[&str]) -> Self {
        let broker = cluster.broker.as_ref().unwrap();
        let mut options = MqttOptions::new(
            format!(
                "spy-{}",
                SPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
            broker.host(),
            broker.port(),
        );
        options.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Rustls(Arc::new(tls.rustls_config().unwrap())),
        ));
        options.set_outgoing_inflight_upper_limit(16);
        let (client, mut eventloop) = AsyncClient::new(options, 64);
        let (connected_tx, connected) = tokio::sync::oneshot::channel();
        let (tx, publishes) = tokio::sync::mpsc::unbounded_channel();
        let filters: Vec<String> = subscribe.iter().map(|s| (*s).to_owned()).collect();
        let subscriber = client.clone();
        let task = tokio::spawn(async move {
            let mut connected_tx = Some(connected_tx);
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        for filter in &filters {
                            subscriber
                                .subscribe(filter.clone(), QoS::AtLeastOnce)
                                .await
                                .unwrap();
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(tx) = connected_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let topic = String::from_utf8_lossy(&p.topic).into_owned();
                        let _ = tx.send((topic, p.payload.to_vec()));
                    }
                    Ok(_) => {}
                    Err(error) => panic!("spy connection failed: {error}"),
                }
            }
        });
        if !subscribe.is_empty() {
            tokio::time::timeout(DEADLINE, connected)
                .await
                .expect("spy subscribed")
                .unwrap();
        }
        Self {
            client,
            publishes,
            task,
        }
    }

    /// Publishes `payload` on `topic` (QoS 1).
    pub async fn publish(&self, topic: &str, payload: Vec<u8>, retain: bool) {
        self.client
            .publish(topic.to_owned(), QoS::AtLeastOnce, retain, payload)
            .await
            .unwrap();
    }

    /// The next message seen on `topic` (panics after 20 s).
    pub async fn next_on(&mut self, topic: &str) -> Vec<u8> {
        tokio::time::timeout(DEADLINE, async {
            loop {
                let (t, payload) = self.publishes.recv().await.expect("spy running");
                if t == topic {
                    return payload;
                }
            }
        })
        .await
        .expect("a message on the topic")
    }
}

impl Spy {
    /// Every message received so far on `topic`, without waiting.
    pub fn received_on(&mut self, topic: &str) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Ok((t, payload)) = self.publishes.try_recv() {
            if t == topic {
                out.push(payload);
            }
        }
        out
    }
}

/// The [`Ack`](edgebeat_proto::Ack) of a payload on a node's ack topic when it is a signed
/// answer that verifies against `site_ca_pem` (as an agent that signs reads it); `None`
/// for anything else (a plain `GatewayMessage`, a forgery).
pub fn verified_ack(payload: &[u8], site_ca_pem: &str) -> Option<edgebeat_proto::Ack> {
    let verifier =
        edgebeat_transports::signing::AnswerVerifier::from_pem(site_ca_pem.as_bytes()).ok()?;
    let message = verifier
        .verify(payload, rustls::pki_types::UnixTime::now())
        .ok()?;
    match message.kind? {
        edgebeat_proto::gateway_message::Kind::Ack(ack) => Some(ack),
        edgebeat_proto::gateway_message::Kind::Certificate(_) => None,
    }
}

impl Drop for Spy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
