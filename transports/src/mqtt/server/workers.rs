//! The gateway's per-node queues: each node's messages handled in order, one at a time,
//! by a short-lived task that exists only while the node has messages waiting.

use super::*;
use edgebeat_proto::BootSeq;

use crate::ingress::NodeMap;

/// A message for a node's queue: decoded, and verified when signatures are checked.
pub(super) struct Work {
    /// Boxed: a queue slot costs a pointer, not the largest message kind.
    pub(super) message: Box<AgentMessage>,
    /// The certificate its signature verified with: it speaks for its node, and is answered
    /// with a signed answer.
    pub(super) certificate: Option<CertificateId>,
}

/// A node's messages waiting to be handled, in order.
#[derive(Default)]
pub(super) struct NodeQueue {
    pub(super) queue: std::collections::VecDeque<Work>,
    /// A task is draining the queue (at most one per node, so messages are handled in
    /// order, one at a time).
    pub(super) draining: bool,
    /// That task holds a message taken from the queue: with it a node has at most
    /// `per_node_queue` + 1 messages in the gateway, however the tasks are scheduled.
    pub(super) handling: bool,
    pub(super) last_message: Option<Instant>,
    /// Where the newest signed message taken for the node's queue stands (queued, or
    /// dropped because the queue was full). The agent never sends
    /// a sequence number twice in a boot, so a signed message of that boot it does not
    /// supersede ([`BootSeq::supersedes`]) is a copy (a replay, or a QoS 1 redelivery):
    /// refused unanswered before it takes a queue slot.
    pub(super) newest_signed: Option<BootSeq>,
}

/// The nodes' queues, shared by the event loop (which fills them) and the short-lived
/// tasks that drain them.
pub(super) type Queues = Arc<std::sync::Mutex<NodeMap<NodeName, NodeQueue>>>;

/// The per-node queues, owned by the event-loop task. A node costs a map entry while it
/// is known and a task only while it has messages waiting: no task, channel or buffer per
/// idle node.
pub(super) struct Workers<H> {
    pub(super) handler: Arc<H>,
    pub(super) client: AsyncClient,
    pub(super) prefix: String,
    pub(super) queue: usize,
    pub(super) node_queues: Option<Arc<std::sync::atomic::AtomicUsize>>,
    pub(super) nodes: Queues,
    pub(super) signatures: Option<Arc<Signatures>>,
    /// Signs the answers to signed messages.
    pub(super) answer_signer: Option<Arc<AnswerSigner>>,
    /// When each node was last asked for its certificate ([`Workers::ask_certificate`]):
    /// only nodes the cluster records as identified, forgotten after
    /// [`CERTIFICATE_ASK_INTERVAL`].
    pub(super) certificate_asked: HashMap<NodeName, Instant>,
    /// Certificate requests being handled ([`ENROLLMENTS_IN_FLIGHT`] at most).
    pub(super) enrollments: Arc<tokio::sync::Semaphore>,
}

/// Least time between two requests to one node for its certificate, 30 s (the agent's own
/// cadence for republishing it unasked): what anyone who can publish in a node's name can
/// cost that node's link is one signed answer per 30 s per replica.
const CERTIFICATE_ASK_INTERVAL: Duration = Duration::from_secs(30);

impl<H: Handler> Workers<H> {
    /// Classifies, verifies and decodes one PUBLISH in the event-loop task, then hands it
    /// to its node's queue. Everything that can be refused is refused here, so nothing is
    /// allocated for a node before one of its messages passed: a queue exists only for a
    /// node with a verified message (or, when signatures are not checked, any well-formed
    /// one, up to `max_nodes` queues). Certificates are verified here too, in arrival
    /// order, so a node's messages after its certificate are verified with it.
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
                            tracing::warn!(%node, %why, "node certificate refused");
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
                tracing::info!(site, up, "site uplink notification");
                self.handler.site_uplink(site, up);
                return;
            }
            Ok(Inbound::CertificateRequest { node }) => {
                self.request_certificate(node, publish.payload.to_vec());
                return;
            }
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
            Err(refused) => {
                tracing::debug!(topic = ?publish.topic, detail = refused.detail, "MQTT message rejected");
                self.handler
                    .rejected(&nobody(), refused.reason, refused.detail);
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
            Err(refusal) => {
                tracing::debug!(%node, detail = refusal.detail(), "MQTT message refused");
                self.handler
                    .rejected(&nobody(), refusal.reason.reason, refusal.detail());
                if let Some(asked) = refusal.unverified {
                    self.ask_certificate(&node, asked);
                }
                return;
            }
        };
        let signed = certificate.is_some();
        let mut nodes = self
            .nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(entry) = nodes.get_or_make(
            node.as_str(),
            || (node.clone(), NodeQueue::default()),
            evict_idle,
            |_| false,
        ) else {
            let max_nodes = nodes.max();
            drop(nodes);
            tracing::debug!(%node, max_nodes, "MQTT message dropped: no room for another node");
            self.handler.rejected(
                &nobody(),
                RejectReason::FleetFull,
                "no room for another node's queue",
            );
            return;
        };
        entry.last_message = Some(Instant::now());
        if signed && let Some(header) = message.header() {
            let at = header.boot_seq();
            match entry.newest_signed {
                Some(newest) if newest.boot_tag == at.boot_tag && !at.supersedes(newest) => {
                    drop(nodes);
                    tracing::debug!(%node, seq = at.seq, "MQTT message refused: a copy of one already queued");
                    self.handler.rejected(
                        &peer(&node, certificate),
                        RejectReason::Replayed,
                        "replayed: a copy of a message already queued",
                    );
                    return;
                }
                _ => entry.newest_signed = Some(at),
            }
        }
        // A signed heartbeat supersedes the queued signed ones of its kind and boot with a
        // lower sequence number, not yet handed to the gateway: only the newest renewal or
        // status report of a node is written after a backlog. Unsigned messages supersede
        // nothing (anyone may have sent them), and neither does a replayed signed one (its
        // sequence number is not above the genuine queued message's).
        let mut superseded = Vec::new();
        if signed
            && let Some(kind) = message.message_kind()
            && kind.heartbeat_index().is_some()
            && let Some(newer) = message.header().map(edgebeat_proto::Header::boot_seq)
        {
            entry.queue.retain(|queued| {
                let older = queued.certificate.is_some()
                    && queued.message.message_kind() == Some(kind)
                    && queued
                        .message
                        .header()
                        .is_some_and(|h| newer.supersedes(h.boot_seq()));
                if older {
                    superseded.push(Asked::of(&queued.message));
                }
                !older
            });
        }
        if entry.queue.len() + usize::from(entry.handling) > self.queue {
            drop(nodes);
            tracing::debug!(%node, "MQTT message dropped: the node's queue is full");
            self.handler.rejected(
                &nobody(),
                REJECT_QUEUE_FULL.reason,
                REJECT_QUEUE_FULL.detail,
            );
            return;
        }
        let kind = message.message_kind();
        entry.queue.push_back(Work {
            message: Box::new(message),
            certificate,
        });
        let start = !entry.draining;
        entry.draining = true;
        let count = nodes.len();
        drop(nodes);
        for asked in superseded {
            self.handler.rejected(
                &peer(&node, certificate),
                RejectReason::Superseded,
                "a newer heartbeat of the node was queued",
            );
            if let Some(kind) = kind {
                self.answer(&node, asked, Answer::superseded(kind), true);
            }
        }
        if let Some(gauge) = &self.node_queues {
            gauge.store(count, std::sync::atomic::Ordering::Relaxed);
        }
        if start {
            self.drain(node);
        }
    }

    /// Publishes `answer` to the message `asked` on `node`'s ack topic from the event loop,
    /// signed when `signed` (the message was), without waiting: when rumqttc's queue is full
    /// the answer is dropped (the agent times out and retries).
    pub(super) fn answer(&self, node: &NodeName, asked: Asked, answer: Answer, signed: bool) {
        let Some(reply) = asked.answer(Some(answer)) else {
            return;
        };
        let signer = self.answer_signer.as_deref().filter(|_| signed);
        let Some(payload) = seal(signer, node, asked, reply) else {
            return;
        };
        if let Err(error) = self.client.try_publish(
            acks_topic(&self.prefix, node),
            QoS::AtLeastOnce,
            false,
            payload,
        ) {
            tracing::debug!(%error, %node, "refusal not answered: request queue full");
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
        self.answer(node, asked, answer, true);
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
                REJECT_QUEUE_FULL.reason,
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

    /// Starts the task that handles `node`'s queued messages in order and ends when the
    /// queue is empty.
    pub(super) fn drain(&self, node: NodeName) {
        let handler = self.handler.clone();
        let client = self.client.clone();
        let signer = self.answer_signer.clone();
        let topic = acks_topic(&self.prefix, &node);
        let nodes = self.nodes.clone();
        tokio::spawn(async move {
            // Should the handler panic, the node's queue is not left marked as drained
            // forever (never drained again, never evicted).
            let mut reset = DrainGuard {
                nodes: nodes.clone(),
                node: node.clone(),
                armed: true,
            };
            loop {
                let work = {
                    let mut nodes = nodes
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let Some(entry) = nodes.get_mut(node.as_str()) else {
                        return;
                    };
                    match entry.queue.pop_front() {
                        Some(work) => {
                            entry.handling = true;
                            work
                        }
                        None => {
                            entry.draining = false;
                            entry.handling = false;
                            entry.queue.shrink_to_fit();
                            // Cleared under the lock: a new drain task may start the moment
                            // it is released, and the guard must not clear its flags.
                            reset.armed = false;
                            return;
                        }
                    }
                };
                let peer = peer(&node, work.certificate);
                let asked = Asked::of(&work.message);
                let ack = Box::pin(handler.handle(&peer, *work.message)).await;
                let Some(reply) = asked.answer(ack) else {
                    continue;
                };
                let signer = signer.as_deref().filter(|_| work.certificate.is_some());
                let Some(payload) = seal(signer, &node, asked, reply) else {
                    continue;
                };
                if let Err(error) = client
                    .publish(&topic, QoS::AtLeastOnce, false, payload)
                    .await
                {
                    // The ingress is shutting down.
                    tracing::debug!(%error, %topic, "ack not sent");
                }
            }
        });
    }

    /// Forgets nodes silent for [`WORKER_IDLE`] with nothing queued or being handled.
    pub(super) fn evict_idle(&mut self) {
        let mut nodes = self
            .nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        evict_idle(&mut nodes);
        if let Some(gauge) = &self.node_queues {
            gauge.store(nodes.len(), std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Clears a node's `draining` and `handling` flags when its drain task ends abnormally (a
/// handler panic); the normal path clears them under the lock and disarms it.
pub(super) struct DrainGuard {
    pub(super) nodes: Queues,
    pub(super) node: NodeName,
    pub(super) armed: bool,
}

impl Drop for DrainGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut nodes = self
            .nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = nodes.get_mut(self.node.as_str()) {
            entry.draining = false;
            entry.handling = false;
        }
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

pub(super) fn evict_idle(nodes: &mut NodeMap<NodeName, NodeQueue>) {
    nodes.retain(|_, q| q.draining || q.last_message.is_some_and(|t| t.elapsed() < WORKER_IDLE));
}
