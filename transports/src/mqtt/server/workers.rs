//! What the event loop does with each PUBLISH: classify, verify and decode it, then
//! deliver it to the handler ([`Handler::deliver`], the gateway's per-node mailbox) with
//! the way back to the node ([`AckReply`]). No per-node state is kept here.

use super::super::acks_topic;
use super::classify::{Inbound, classify};
use super::verify::{Signatures, nobody, open, open_usage, peer};
use super::{REJECT_CERTIFICATE, REJECT_MALFORMED};
use crate::ingress::{Asked, Handler, Letter, RejectReason, Reply, Sending};
use crate::log_limit::LogLine;
use crate::signing::{AnswerSigner, AnswerVerifier};
use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{Answer, GatewayMessage, gateway_message};
use prost::Message as _;
use rumqttc::v5::AsyncClient;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Publish;
use rustls::pki_types::UnixTime;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The ingress's state, owned by the event-loop task.
pub(super) struct Workers<H> {
    pub(super) handler: Arc<H>,
    pub(super) client: AsyncClient,
    /// Shared by every [`AckReply`]: a reply costs a reference count, not a copy.
    pub(super) prefix: Arc<str>,
    pub(super) signatures: Option<Arc<Signatures>>,
    /// Signs the answers to signed messages.
    pub(super) answer_signer: Option<Arc<AnswerSigner>>,
    /// Verifies the other replicas' usage batches ([`MqttIngressOptions::usage_verifier`]).
    pub(super) usage_verifier: Option<AnswerVerifier>,
    /// When each node was last asked for its certificate ([`Workers::ask_certificate`]):
    /// only nodes the cluster records as identified, forgotten after
    /// [`CERTIFICATE_ASK_INTERVAL`].
    pub(super) certificate_asked: HashMap<NodeName, Instant>,
    /// Certificate requests being handled ([`ENROLLMENTS_IN_FLIGHT`] at most).
    pub(super) enrollments: Arc<tokio::sync::Semaphore>,
    /// Bounds the lines of what anyone on the broker can publish unsigned (site uplink
    /// notifications, Last Wills): one per site or node per 10 s, four of them, and one
    /// for the rest ([`crate::log_limit`]).
    pub(super) log_limit: crate::log_limit::LogLimiter,
}

/// The way back to the node that published a message: its ack topic `P/acks/{node}`
/// (QoS 1), the answer signed ([`seal`]) when the message was.
pub(super) struct AckReply {
    client: AsyncClient,
    prefix: Arc<str>,
    node: NodeName,
    asked: Asked,
    /// Set only for a signed message.
    signer: Option<Arc<AnswerSigner>>,
}

impl AckReply {
    /// The topic and payload of `answer`, or `None` when nothing is sent (see
    /// [`Asked::answer`]) or signing failed (logged).
    fn message(&self, answer: Option<Answer>) -> Option<(String, Vec<u8>)> {
        let reply = self.asked.answer(answer)?;
        let payload = seal(self.signer.as_deref(), &self.node, self.asked, reply)?;
        Some((acks_topic(&self.prefix, &self.node), payload))
    }
}

impl Reply for AckReply {
    /// Waits for room in rumqttc's request queue ([`REQUEST_QUEUE`]): the handling task
    /// waits, the event loop does not.
    fn send(self: Box<Self>, answer: Option<Answer>) -> Sending {
        Box::pin(async move {
            let Some((topic, payload)) = self.message(answer) else {
                return;
            };
            if let Err(error) = self
                .client
                .publish(&topic, QoS::AtLeastOnce, false, payload)
                .await
            {
                // The ingress is shutting down.
                tracing::debug!(%error, %topic, "ack not sent");
            }
        })
    }

    fn send_now(self: Box<Self>, answer: Option<Answer>) {
        let Some((topic, payload)) = self.message(answer) else {
            return;
        };
        if let Err(error) = self
            .client
            .try_publish(&topic, QoS::AtLeastOnce, false, payload)
        {
            tracing::debug!(%error, %topic, "answer not sent: request queue full");
        }
    }
}

/// Least time between two requests to one node for its certificate, 30 s (the agent's own
/// cadence for republishing it unasked): what anyone who can publish in a node's name can
/// cost that node's link is one signed answer per 30 s per replica.
const CERTIFICATE_ASK_INTERVAL: Duration = Duration::from_secs(30);

impl<H: Handler> Workers<H> {
    /// Opens another replica's batch ([`open_usage`]) and hands each sample for a valid
    /// node name to the handler; a refused batch, or a sample naming no valid node, is
    /// reported to [`Handler::rejected`].
    fn shared_usage(&self, payload: &[u8]) {
        match open_usage(
            self.usage_verifier.as_ref(),
            payload,
            rustls::pki_types::UnixTime::now(),
        ) {
            Ok(samples) => {
                for sample in samples {
                    if crate::tls::is_node_name(&sample.node_name) {
                        self.handler.shared_usage(sample);
                    } else {
                        self.handler.rejected(
                            &nobody(),
                            REJECT_MALFORMED.reason,
                            "shared usage sample of no valid node name",
                        );
                    }
                }
            }
            Err(rejection) => {
                self.handler
                    .rejected(&nobody(), rejection.reason, &rejection.detail);
            }
        }
    }

    /// Classifies, verifies and decodes one PUBLISH in the event-loop task, then delivers
    /// it ([`Handler::deliver`]). Everything the transport can reject is rejected here,
    /// before the handler sees anything of the message. Certificates are verified here
    /// too, in arrival order, so a node's messages after its certificate are verified with
    /// it.
    pub(super) fn dispatch(&mut self, publish: &Publish, max_bytes: usize) {
        let (node, kind) = match classify(&self.prefix, &publish.topic, &publish.payload, max_bytes)
        {
            Ok(Inbound::Message { node, kind }) => (node, kind),
            Ok(Inbound::Certificate { node }) => {
                // Not verifying, or a retained certificate being cleared: the key held
                // stays until a newer certificate replaces it.
                if let Some(signatures) = &self.signatures
                    && !publish.payload.is_empty()
                {
                    let recorded = self.handler.recorded_certificate(node);
                    match signatures.learn(node, &publish.payload, recorded) {
                        Ok(()) => tracing::debug!(%node, "node certificate verified"),
                        Err(why) => {
                            // Counted and logged (within bounds) by the handler.
                            self.handler
                                .rejected(&nobody(), REJECT_CERTIFICATE.reason, &why);
                        }
                    }
                }
                return;
            }
            Ok(Inbound::Uplink { site, up }) => {
                // A retained state cleared (the bridge removed): nothing says the site is
                // down any more.
                let up = up.unwrap_or(true);
                if let LogLine::Write { suppressed, others } =
                    self.log_limit.check("uplink", site, Instant::now())
                {
                    tracing::info!(
                        site,
                        up,
                        suppressed,
                        other_sites = others,
                        "site uplink notification"
                    );
                }
                self.handler.site_uplink(site, up);
                return;
            }
            Ok(Inbound::Usage) => {
                self.shared_usage(&publish.payload);
                return;
            }
            Ok(Inbound::CertificateRequest { node }) => {
                self.request_certificate(node, publish.payload.to_vec());
                return;
            }
            Ok(Inbound::Will { node, header }) => {
                if let LogLine::Write { suppressed, others } =
                    self.log_limit.check("will", node, Instant::now())
                {
                    tracing::info!(
                        node,
                        boot_id = header
                            .as_ref()
                            .map(|h| edgebeat_proto::boot_id_to_string(&h.boot_id)),
                        seq = header.as_ref().map(|h| h.seq),
                        suppressed,
                        other_nodes = others,
                        "the broker lost an agent's connection (Last Will)"
                    );
                }
                return;
            }
            Err(rejection) => {
                tracing::debug!(topic = ?publish.topic, detail = &*rejection.detail, "MQTT message rejected");
                self.handler
                    .rejected(&nobody(), rejection.reason, &rejection.detail);
                return;
            }
        };
        let policy = self.signatures.as_deref().map(|s| &s.policy);
        let key = self.signatures.as_deref().and_then(|s| s.key(&node));
        let (message, certificate) = match open(
            &node,
            kind,
            &publish.payload,
            policy,
            key.as_deref(),
            UnixTime::now(),
        ) {
            Ok(opened) => opened,
            Err(error) => {
                let rejection = &error.rejection;
                tracing::debug!(%node, detail = &*rejection.detail, "MQTT message rejected");
                self.handler
                    .rejected(&nobody(), rejection.reason, &rejection.detail);
                if let Some(asked) = error.unverified {
                    self.ask_certificate(&node, asked);
                }
                return;
            }
        };
        let reply = self.reply(node, Asked::of(&message), certificate.is_some());
        let peer = peer(&reply.node, certificate);
        self.handler
            .clone()
            .deliver(Letter::new(peer, message, reply));
    }

    /// The way back to `node` for the message `asked`, signed when `signed`.
    fn reply(&self, node: NodeName, asked: Asked, signed: bool) -> AckReply {
        AckReply {
            client: self.client.clone(),
            prefix: self.prefix.clone(),
            node,
            asked,
            signer: self.answer_signer.clone().filter(|_| signed),
        }
    }

    /// Asks `node`, in a signed answer to the message `asked` whose signature could not be
    /// checked (this replica holds no key for the node), to publish its certificate again
    /// ([`Answer::SendCertificate`]): only for a node the cluster records as identified (a
    /// genuine node whose retained certificate is missing or was refused as rolled back;
    /// made-up names get nothing, and no state), at most once per
    /// [`CERTIFICATE_ASK_INTERVAL`] per node.
    pub(super) fn ask_certificate(&mut self, node: &NodeName, asked: Asked) {
        if self.answer_signer.is_none() || self.handler.recorded_certificate(node).is_none() {
            return;
        }
        let now = Instant::now();
        self.certificate_asked
            .retain(|_, at| now.duration_since(*at) < CERTIFICATE_ASK_INTERVAL);
        if self.certificate_asked.contains_key(node.as_str()) {
            return;
        }
        self.certificate_asked.insert(node.clone(), now);
        tracing::info!(%node, "no current certificate held for the node; asking it to publish its certificate again");
        let answer = Answer::SendCertificate {
            reason: "this gateway replica holds no current certificate for the node".into(),
        };
        Box::new(self.reply(node.clone(), asked, true)).send_now(Some(answer));
    }

    /// Hands a certificate request on `node`'s topic to the handler in a task of its own
    /// (the handler may wait for the apiserver) and publishes its answer, if any, on the
    /// node's ack topic; at most [`ENROLLMENTS_IN_FLIGHT`] at once, beyond which the request
    /// is dropped and counted (the agent asks again later).
    pub(super) fn request_certificate(&self, node: &str, payload: Vec<u8>) {
        let Ok(permit) = self.enrollments.clone().try_acquire_owned() else {
            tracing::debug!(node, "certificate request dropped: too many in flight");
            self.handler.rejected(
                &nobody(),
                RejectReason::QueueFull,
                "too many certificate requests in flight",
            );
            return;
        };
        let (handler, client) = (self.handler.clone(), self.client.clone());
        let (topic, node) = (acks_topic(&self.prefix, node), node.to_owned());
        tokio::spawn(async move {
            let answer = handler
                .request_certificate(&nobody(), Some(&node), payload)
                .await;
            drop(permit);
            if let Some(answer) = answer
                && let Err(error) = client
                    .publish(&topic, QoS::AtLeastOnce, false, answer)
                    .await
            {
                tracing::debug!(%error, %topic, "certificate answer not sent");
            }
        });
    }
}

/// The payload of `reply`, the answer to `asked` from `node`: a [`signing::AnswerSigner`]'s
/// signed answer, bound to the node and boot it answers, with `signer`, else the plain
/// encoded message. `None` (logged) when signing fails.
pub(super) fn seal(
    signer: Option<&AnswerSigner>,
    node: &str,
    asked: Asked,
    mut reply: GatewayMessage,
) -> Option<Vec<u8>> {
    let Some(signer) = signer else {
        return Some(reply.encode_to_vec());
    };
    if let Some(gateway_message::Kind::Ack(ack)) = reply.kind.as_mut() {
        node.clone_into(&mut ack.node_name);
        ack.boot_tag = asked.boot_tag();
    }
    match signer.seal(&reply) {
        Ok(payload) => Some(payload),
        Err(error) => {
            tracing::error!(%error, node, "answer not sent: it could not be signed");
            None
        }
    }
}
