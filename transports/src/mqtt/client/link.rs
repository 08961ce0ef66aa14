//! The protocol side of the agent's MQTT connection: topics, the current session, what each
//! request is published as, and what each incoming packet means.

use super::{
    CERTIFICATE_REPUBLISH_MIN_INTERVAL, LEASE_TOPIC_ALIAS, LeaseAlias, MqttUplinkOptions,
    REGISTER_TIMEOUT_MAX, Timer, Topics,
};
use crate::uplink::{
    AfterAck, HeaderForm, RegisterFn, Request, Session, UplinkDriver, UplinkError,
    reconnect_backoff,
};
use edgebeat_proto::{Ack, Answer, GatewayMessage, Header, MessageKind, gateway_message};
use prost::Message as _;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{
    LastWill, Packet, Publish, PublishProperties, SubscribeReasonCode,
};
use rumqttc::v5::{AsyncClient, Event};
use std::time::Duration;

/// Why a message could not be sealed: signing fails only with a signer (`mqtt-tls`).
#[cfg(feature = "mqtt-tls")]
type SealError = crate::tls::TlsError;
#[cfg(not(feature = "mqtt-tls"))]
type SealError = std::convert::Infallible;

/// The connection's protocol side: topics, the client handle and the current [`Session`]
/// (`None` while not connected).
pub(super) struct Link {
    pub(super) topics: Topics,
    pub(super) client: AsyncClient,
    pub(super) register: RegisterFn,
    pub(super) session: Option<Session>,
    /// The gateway accepted our Register on an earlier broker connection; a reconnect to the
    /// broker does not undo that (see `Session::resumed`).
    pub(super) resume: bool,
    /// ... and what it said quiet messages may leave out.
    pub(super) resume_form: HeaderForm,
    pub(super) register_timeouts: Box<dyn Iterator<Item = Duration> + Send>,
    pub(super) register_timeout: Duration,
    pub(super) lease_properties: PublishProperties,
    /// The Lease topic's Topic Alias on this broker connection.
    pub(super) lease_alias: LeaseAlias,
    pub(super) max_packet_bytes: usize,
    #[cfg(feature = "mqtt-tls")]
    pub(super) signer: Option<std::sync::Arc<crate::signing::MessageSigner>>,
    /// Verifies the gateway's signed answers; with it, nothing else on the ack topic is
    /// taken.
    #[cfg(feature = "mqtt-tls")]
    pub(super) answers: Option<std::sync::Arc<crate::signing::AnswerVerifier>>,
    /// The node this link speaks for (signed answers must name it).
    pub(super) node: String,
    /// The boot tag of the last Register sent (signed answers must name it).
    pub(super) boot_tag: Option<u32>,
    /// When the certificate was last published (see [`Link::publish_certificate`]).
    pub(super) certificate_published: Option<tokio::time::Instant>,
    /// When the current (or last) broker connection was accepted (CONNACK).
    pub(super) connected_at: Option<tokio::time::Instant>,
}

impl Link {
    pub(super) fn new(
        options: &MqttUplinkOptions,
        node: &str,
        topics: Topics,
        client: AsyncClient,
        register: RegisterFn,
    ) -> Self {
        let expiry = u32::try_from(options.lease_expiry.as_secs()).unwrap_or(u32::MAX);
        Self {
            topics,
            client,
            register,
            session: None,
            resume: false,
            resume_form: HeaderForm::Full,
            register_timeouts: register_timeouts(options.register_timeout),
            register_timeout: options.register_timeout,
            lease_properties: PublishProperties {
                message_expiry_interval: Some(expiry),
                ..PublishProperties::default()
            },
            lease_alias: LeaseAlias::Unavailable,
            max_packet_bytes: options.max_packet_bytes,
            #[cfg(feature = "mqtt-tls")]
            signer: options.signer.clone(),
            #[cfg(feature = "mqtt-tls")]
            answers: options.answers.clone(),
            node: node.to_owned(),
            boot_tag: None,
            certificate_published: None,
            connected_at: None,
        }
    }

    /// The payload of an encoded `AgentMessage`: itself, or a `SignedMessage` with a signer.
    ///
    /// Errors: the signer's message when signing fails.
    /// Whether messages are signed on this link.
    pub(super) fn signs(&self) -> bool {
        #[cfg(feature = "mqtt-tls")]
        return self.signer.is_some();
        #[cfg(not(feature = "mqtt-tls"))]
        false
    }

    /// Whether the gateway's answers are verified (signed answers) on this link.
    pub(super) fn verifies_answers(&self) -> bool {
        #[cfg(feature = "mqtt-tls")]
        return self.answers.is_some();
        #[cfg(not(feature = "mqtt-tls"))]
        false
    }

    pub(super) fn payload(&self, message: Vec<u8>) -> Result<Vec<u8>, SealError> {
        #[cfg(feature = "mqtt-tls")]
        if let Some(signer) = &self.signer {
            return signer.seal(message);
        }
        Ok(message)
    }

    /// Publishes the certificate chain (retained) when signing, so that every gateway
    /// replica can verify what follows. Besides before each Register, the agent publishes it
    /// again when a request went unanswered (at most every
    /// [`CERTIFICATE_REPUBLISH_MIN_INTERVAL`]): a gateway replica that lost the certificate
    /// (a broker that dropped the retained copy) refuses signed messages without an answer,
    /// since it cannot tell them from forgeries.
    pub(super) fn publish_certificate(&mut self) {
        #[cfg(feature = "mqtt-tls")]
        if let Some(signer) = &self.signer {
            match self.client.try_publish(
                &self.topics.certificate,
                QoS::AtLeastOnce,
                true,
                signer.certificate().to_vec(),
            ) {
                // Stamped only when queued, so a full queue does not delay the next try.
                Ok(()) => self.certificate_published = Some(tokio::time::Instant::now()),
                Err(error) => tracing::warn!(
                    %error,
                    "could not queue the certificate; it goes with the next Register or unanswered request"
                ),
            }
        }
    }

    pub(super) fn on_event(&mut self, event: Event, driver: &UplinkDriver) -> Timer {
        match event {
            Event::Incoming(Packet::ConnAck(connack)) => {
                // Aliases are per connection: the first quiet renewal sets it again.
                let allowed = connack
                    .properties
                    .as_ref()
                    .and_then(|p| p.topic_alias_max)
                    .is_some_and(|max| max >= LEASE_TOPIC_ALIAS);
                self.lease_alias = if allowed {
                    LeaseAlias::Unset
                } else {
                    LeaseAlias::Unavailable
                };
                self.connected_at = Some(tokio::time::Instant::now());
                tracing::info!(topic = %self.topics.acks, "connected to the MQTT broker");
                self.register_timeouts = register_timeouts(self.register_timeout);
                // Subscribed before Register goes out: the broker handles packets of one
                // connection in order, so the answer cannot arrive before the subscription.
                if let Err(error) = self
                    .client
                    .try_subscribe(&self.topics.acks, QoS::AtLeastOnce)
                {
                    tracing::warn!(%error, "could not queue the acks subscription");
                }
                driver.connected();
                let authenticated = self.verifies_answers();
                if self.resume {
                    self.session = Some(
                        Session::resumed(self.resume_form)
                            .with_authenticated_answers(authenticated),
                    );
                    return Timer::Disarm;
                }
                self.session = Some(Session::new().with_authenticated_answers(authenticated));
                Timer::Arm(self.send_register())
            }
            Event::Incoming(Packet::Publish(publish)) => self.on_publish(&publish, driver),
            Event::Incoming(Packet::SubAck(suback)) => {
                for code in &suback.return_codes {
                    if !matches!(code, SubscribeReasonCode::Success(_)) {
                        tracing::error!(
                            topic = %self.topics.acks,
                            ?code,
                            "the broker refused the acks subscription; no answer will arrive"
                        );
                    }
                }
                Timer::Keep
            }
            _ => Timer::Keep,
        }
    }

    pub(super) fn on_publish(&mut self, publish: &Publish, driver: &UplinkDriver) -> Timer {
        if publish.topic != self.topics.acks.as_bytes() {
            tracing::debug!(topic = ?publish.topic, "ignoring a message on an unexpected topic");
            return Timer::Keep;
        }
        if self.session.is_none() {
            return Timer::Keep;
        }
        let Some(ack) = self.read_ack(&publish.payload) else {
            return Timer::Keep;
        };
        let Some(session) = self.session.as_mut() else {
            return Timer::Keep;
        };
        let was_registered = session.registered();
        match session.on_ack(ack, driver) {
            AfterAck::Nothing if session.registered() && !was_registered => {
                self.register_timeouts = register_timeouts(self.register_timeout);
                Timer::Disarm
            }
            AfterAck::Nothing => Timer::Keep,
            AfterAck::RegisterAfter(delay) => Timer::Arm(delay),
            AfterAck::PublishCertificate => {
                tracing::info!(
                    "a gateway replica holds no current copy of this node's certificate; publishing it again"
                );
                self.publish_certificate();
                Timer::Keep
            }
        }
    }

    /// The [`Ack`] an ack-topic payload carries, or `None` (logged at debug level) for
    /// anything else. With signed answers only a [`SignedAnswer`](edgebeat_proto::SignedAnswer)
    /// that verifies, for this node and the boot of its last Register, is taken: anyone
    /// allowed to publish on the broker can publish here.
    pub(super) fn read_ack(&self, payload: &[u8]) -> Option<Ack> {
        #[cfg(feature = "mqtt-tls")]
        let message = match &self.answers {
            Some(verifier) => match verifier.verify(payload, rustls::pki_types::UnixTime::now()) {
                Ok(message) => Ok(message),
                Err(error) => {
                    tracing::debug!(%error, bytes = payload.len(), "ignoring an answer that does not verify");
                    return None;
                }
            },
            None => GatewayMessage::decode(payload),
        };
        #[cfg(not(feature = "mqtt-tls"))]
        let message = GatewayMessage::decode(payload);
        let ack = match message {
            Ok(GatewayMessage {
                kind: Some(gateway_message::Kind::Ack(ack)),
            }) => ack,
            Ok(_) => {
                tracing::debug!("ignoring a gateway message that is not an ack");
                return None;
            }
            Err(error) => {
                tracing::debug!(%error, bytes = payload.len(), "ignoring a malformed ack");
                return None;
            }
        };
        if self.verifies_answers()
            && (ack.node_name != self.node || Some(ack.boot_tag) != self.boot_tag)
        {
            tracing::debug!(node = %ack.node_name, "ignoring a signed answer for another node or boot");
            return None;
        }
        Some(ack)
    }

    /// Publishes a fresh Register; returns how long to wait for its answer.
    pub(super) fn send_register(&mut self) -> Duration {
        let timeout = self
            .register_timeouts
            .next()
            .unwrap_or(REGISTER_TIMEOUT_MAX);
        if self.session.is_none() {
            return timeout;
        }
        let message = (self.register)();
        let seq = message.header().map(|h| h.seq);
        self.boot_tag = message.header().map(edgebeat_proto::Header::named_boot_tag);
        let payload = match self.payload(message.encode_to_vec()) {
            Ok(payload) => payload,
            Err(error) => {
                tracing::error!(%error, "could not sign Register; retrying");
                return timeout;
            }
        };
        self.publish_certificate();
        if payload.len() > self.max_packet_bytes {
            tracing::error!(
                bytes = payload.len(),
                limit = self.max_packet_bytes,
                "Register is larger than max_packet_bytes; the gateway will reject it"
            );
        }
        if let Err(error) =
            self.client
                .try_publish(&self.topics.register, QoS::AtLeastOnce, false, payload)
        {
            tracing::warn!(%error, "could not queue Register; retrying");
        }
        if let Some(session) = self.session.as_mut() {
            session.register_sent(seq);
        }
        timeout
    }

    pub(super) fn send(&mut self, request: Request) {
        if self.session.is_none() {
            let _ = request.reply.send(Err(UplinkError::NotConnected));
            return;
        }
        let mut message = request.message;
        let signs = self.signs();
        if let Some(session) = self.session.as_mut() {
            let form = session.header_form();
            if form != HeaderForm::Full {
                // The topic names the node; a signed message keeps its wall time for the
                // gateway's clock window.
                message.compact_header_for_topic(signs);
            }
            // A replica that asked for the boot ID learns it from this message.
            if !session.take_boot_id_request() && form == HeaderForm::CompactBootTag {
                message.tag_boot();
            }
        }
        let seq = message.header().map_or(0, |h| h.seq);
        let Some(kind) = message.message_kind() else {
            let _ = request
                .reply
                .send(Ok(local_reject("message has no kind".into())));
            return;
        };
        let topic = self.topics.for_kind(kind);
        let payload = match self.payload(message.encode_to_vec()) {
            Ok(payload) => payload,
            Err(error) => {
                let _ = request.reply.send(Ok(local_reject(error.to_string())));
                return;
            }
        };
        if payload.len() > self.max_packet_bytes {
            let reason = format!(
                "not sent: {} bytes exceed max_packet_bytes ({})",
                payload.len(),
                self.max_packet_bytes
            );
            let _ = request.reply.send(Ok(local_reject(reason)));
            return;
        }
        let quiet = message.is_quiet();
        let queued = if quiet {
            // A quiet message (a renewal, an unchanged status report): QoS 0, as a lost one
            // only delays by one period and nothing queues QoS 0 messages for an absent
            // gateway (so no expiry either); a renewal's topic as a Topic Alias once set on
            // this connection. One PUBLISH up, nothing but TCP's ACK down (whose absence
            // `user_timeout` notices).
            let lease = kind == MessageKind::Lease;
            let (topic, alias) = match self.lease_alias {
                LeaseAlias::Set if lease => ("", Some(LEASE_TOPIC_ALIAS)),
                LeaseAlias::Unset if lease => (topic, Some(LEASE_TOPIC_ALIAS)),
                _ => (topic, None),
            };
            let queued = self.client.try_publish_with_properties(
                topic,
                QoS::AtMostOnce,
                false,
                payload,
                PublishProperties {
                    topic_alias: alias,
                    ..PublishProperties::default()
                },
            );
            if queued.is_ok() && lease && self.lease_alias == LeaseAlias::Unset {
                self.lease_alias = LeaseAlias::Set;
            }
            queued
        } else if kind == MessageKind::Lease {
            self.client.try_publish_with_properties(
                topic,
                QoS::AtLeastOnce,
                false,
                payload,
                self.lease_properties.clone(),
            )
        } else {
            self.client
                .try_publish(topic, QoS::AtLeastOnce, false, payload)
        };
        match (queued, self.session.as_mut()) {
            (Ok(()), Some(session)) => {
                let unanswered = session.track(seq, request.reply, quiet);
                let due = self
                    .certificate_published
                    .is_none_or(|t| t.elapsed() >= CERTIFICATE_REPUBLISH_MIN_INTERVAL);
                if unanswered > 0 && due {
                    tracing::debug!(
                        unanswered,
                        "requests went unanswered; publishing the certificate again"
                    );
                    self.publish_certificate();
                }
            }
            (Ok(()), None) => {
                let _ = request.reply.send(Err(UplinkError::NotConnected));
            }
            (Err(error), _) => {
                // rumqttc's queue is full (the broker stopped acknowledging): refuse rather
                // than wait, the caller retries with a fresh message.
                tracing::debug!(%error, kind = kind.as_str(), "MQTT request queue full; message refused");
                let _ = request.reply.send(Err(UplinkError::NotConnected));
            }
        }
    }

    /// Ends the current broker connection's session, if any; returns whether it was
    /// registered. A registration survives (the next connection resumes it); pending
    /// requests fail.
    pub(super) fn close(&mut self, _driver: &UplinkDriver) -> Option<bool> {
        let mut session = self.session.take()?;
        let registered = session.registered();
        self.resume = registered;
        self.resume_form = session.header_form();
        session.fail_pending();
        Some(registered)
    }
}

pub(super) fn register_timeouts(first: Duration) -> Box<dyn Iterator<Item = Duration> + Send> {
    Box::new(reconnect_backoff(first, REGISTER_TIMEOUT_MAX.max(first)))
}

/// The Last Will: the `Header` of a fresh Register (node name, boot ID, and a seq lower than
/// any message of the coming connection), QoS 1, not retained.
pub(super) fn last_will(topics: &Topics, node_name: &str, register: &RegisterFn) -> LastWill {
    let header = register().header().cloned().unwrap_or_else(|| Header {
        node_name: node_name.to_owned(),
        ..Header::default()
    });
    LastWill::new(
        topics.will.clone(),
        header.encode_to_vec(),
        QoS::AtLeastOnce,
        false,
        None,
    )
}

/// An answer made by the agent itself for a message it did not send.
pub(super) fn local_reject(reason: String) -> Answer {
    Answer::Rejected { reason }
}
