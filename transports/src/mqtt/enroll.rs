//! The agent's certificate requests over MQTT: one short connection of its own that
//! publishes the request on `P/nodes/{node}/csr` and waits on `P/acks/{node}` for the answer.
//! A request is rare (enrollment once, a rotation every few months), so it does not share the
//! heartbeat connection, whose session state it would have to thread through.

use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event};

use super::{CONNECT_TIMEOUT_SECS, MqttUplinkOptions, acks_topic, default_client_id, node_topic};

/// Why a certificate request got no answer over MQTT.
#[derive(Debug, thiserror::Error)]
pub enum MqttEnrollmentError {
    /// The options cannot work (TLS material, a broker).
    #[error("MQTT certificate request: {0}")]
    Options(String),
    /// The TLS material cannot work.
    #[error("MQTT certificate request: {0}")]
    Tls(#[source] crate::tls::TlsError),
    /// The broker could not be reached, or no answer taken by `accept` came in time: ask
    /// again later.
    #[error("no answer to the certificate request: {0}")]
    Unanswered(String),
}

/// Publishes one certificate request `payload` for `node` through the broker of `options`
/// (its first broker, its credentials; TLS with `tls` when given, else as `options` says)
/// and returns the first payload on the node's ack topic that `accept` takes (the caller
/// checks it is the signed answer to this request), within `timeout`. The connection's
/// client ID is the agent's with `-csr` appended, so it never takes the heartbeat
/// session over.
///
/// Errors: [`MqttEnrollmentError::Options`] for options that cannot work,
/// [`MqttEnrollmentError::Unanswered`] otherwise.
pub async fn request_certificate(
    options: &MqttUplinkOptions,
    node: &str,
    tls: Option<rustls::ClientConfig>,
    payload: Vec<u8>,
    accept: impl Fn(&[u8]) -> bool,
    timeout: Duration,
) -> Result<Vec<u8>, MqttEnrollmentError> {
    let client_id = format!(
        "{}-csr",
        options
            .client_id
            .clone()
            .unwrap_or_else(|| default_client_id(node))
    );
    let mut mqtt = rumqttc::v5::MqttOptions::new(client_id, &options.host, options.port);
    mqtt.set_clean_start(true)
        .set_connection_timeout(CONNECT_TIMEOUT_SECS)
        .set_keep_alive(Duration::from_secs(60))
        .set_outgoing_inflight_upper_limit(4)
        .set_max_packet_size(u32::try_from(options.max_packet_bytes).ok());
    if let Some((username, password)) = &options.credentials {
        mqtt.set_credentials(username, password);
    }
    let tls = match tls {
        Some(config) => Some(config),
        None => options
            .tls
            .as_ref()
            .map(crate::tls::ClientTls::rustls_config)
            .transpose()
            .map_err(MqttEnrollmentError::Tls)?,
    };
    if let Some(config) = tls {
        crate::tls::install_ring_provider();
        mqtt.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Rustls(std::sync::Arc::new(config)),
        ));
    }
    let (client, mut eventloop) = AsyncClient::new(mqtt, 8);
    let acks = acks_topic(&options.topic_prefix, node);
    let csr = node_topic(&options.topic_prefix, node, crate::enroll::CSR_KIND);
    let exchange = async {
        let mut payload = Some(payload);
        loop {
            let event = eventloop
                .poll()
                .await
                .map_err(|e| MqttEnrollmentError::Unanswered(e.to_string()))?;
            match event {
                Event::Incoming(Packet::ConnAck(_)) => {
                    client
                        .subscribe(&acks, QoS::AtLeastOnce)
                        .await
                        .map_err(|e| MqttEnrollmentError::Unanswered(e.to_string()))?;
                }
                // Subscribed before the request goes out, so its answer cannot be missed.
                Event::Incoming(Packet::SubAck(_)) => {
                    if let Some(payload) = payload.take() {
                        client
                            .publish(&csr, QoS::AtLeastOnce, false, payload)
                            .await
                            .map_err(|e| MqttEnrollmentError::Unanswered(e.to_string()))?;
                    }
                }
                Event::Incoming(Packet::Publish(publish))
                    if publish.topic == acks.as_bytes() && accept(&publish.payload) =>
                {
                    return Ok(publish.payload.to_vec());
                }
                _ => {}
            }
        }
    };
    let result = tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(MqttEnrollmentError::Unanswered(format!(
                "none within {timeout:?}"
            )))
        });
    let _ = client.try_disconnect();
    result
}
