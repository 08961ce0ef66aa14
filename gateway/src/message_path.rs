//! The gateway's message path, one for every ingress. A message arrives as a [`Letter`]
//! ([`Handler::deliver`]) and goes through:
//! 1. **screening** (`Gateway::screen`): the checks that need no state (a header, the
//!    identity [`Posture`]), so nothing is kept for a message that fails them;
//! 2. **posting** to its node's [`Mailbox`] (order, the `per_node_queue` bound, a newer
//!    identified heartbeat superseding a waiting one, copies refused), once the node has a
//!    slot; slots are bounded by [`GatewayOptions::max_nodes`] and swept when idle;
//! 3. at its turn, one at a time per node and different nodes concurrently,
//!    **admission** ([`crate::admission`]: boot, sequence, freshness, rate limit; its glue
//!    to the gateway's state is `message_path/admit.rs`), the
//!    **writes** (`writer.rs`: kubelet's apiserver calls, diffed against the
//!    [`ApiserverView`]) and the **follow-up** (the node's certificate recorded, a full
//!    status report asked for).
//!
//! What the apiserver holds is not in the slot but in the shared view, kept by a watch
//! ([`Gateway::watch`]) and by the answers to writes.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use edgebeat_hw::Clock;
use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{self as pb, Answer, agent_message::Kind};
use edgebeat_transports::ingress::{CertificateId, Letter, NodeMap, Peer, Turn, UsageOutbox};
use tokio::time::Instant;

use crate::apiserver::Apiserver;
use crate::enrollment::Enrollment;
use crate::enrollment::gate::EnrollmentGate;
use crate::metrics::Counters;
use crate::resource_metrics::Samples;
use crate::sites::{PartitionRule, SiteTracker};
use crate::view::ApiserverView;
pub use crate::writer::{LeaseState, StatusError, validate_status};
use crate::writer::{NodeWrites, Writer, retry};
use edgebeat_transports::ingress::RejectReason;

pub use options::{DEFAULT_MAX_NODES, DEFAULT_PER_NODE_QUEUE, GatewayOptions};

use slots::{Handling, SlotCell};

/// The gateway: a [`Handler`] for every transport.
pub struct Gateway {
    writer: Writer,
    clock: Arc<dyn Clock>,
    options: GatewayOptions,
    started: Instant,
    /// At most [`GatewayOptions::max_nodes`].
    slots: Mutex<NodeMap<String, Arc<SlotCell>>>,
    /// Messages refused because [`GatewayOptions::max_nodes`] was reached (for the log).
    fleet_full: AtomicU64,
    messages: AtomicU64,
    /// Times the broker gave this replica's MQTT session to another client
    /// ([`Gateway::mqtt_sessions_taken_over`]).
    mqtt_sessions_taken_over: Arc<AtomicU64>,
    /// Enrollment and rotation of node certificates, once [`Gateway::enable_enrollment`]
    /// turned them on.
    enrollment: OnceLock<Arc<Enrollment>>,
    /// The limits certificate requests meet first.
    enrollment_gate: EnrollmentGate,
    /// Counters of what the gateway did.
    pub counters: Arc<Counters>,
    /// The sites of the managed fleet ([`crate::sites`]), followed by [`Gateway::watch`].
    sites: Arc<Mutex<SiteTracker>>,
    /// Wakes the site loop when a bridge notification arrives.
    sites_wake: Arc<tokio::sync::Notify>,
    /// The latest resource usage of each node held ([`crate::resource_metrics`]).
    resource_samples: Arc<Samples>,
    /// Where admitted samples go for the other replicas, once
    /// [`Gateway::share_usage`] made it.
    usage_outbox: OnceLock<UsageOutbox>,
}

/// Usage samples waiting in the outbox for the MQTT ingress to share ([`UsageOutbox`]):
/// 1,024, five seconds of a 10,000-node fleet's samples (one per node every 20 s).
const USAGE_OUTBOX: usize = 1024;

impl Gateway {
    /// A gateway writing through `client` (whose rate limit bounds apiserver QPS), stamping
    /// times from `clock`.
    pub fn new(client: kube::Client, clock: Arc<dyn Clock>, options: GatewayOptions) -> Self {
        let counters = Arc::new(Counters::default());
        let mut writer = Writer::new(
            match &options.apiserver_url {
                Some(url) => {
                    Apiserver::with_limits(client, options.impersonate_nodes, options.write_limits)
                        .named(url)
                }
                None => {
                    Apiserver::with_limits(client, options.impersonate_nodes, options.write_limits)
                }
            },
            clock.clone(),
            counters.clone(),
            options.knowledge_ttl,
        );
        writer.resource_metrics = options.resource_metrics;
        let max_nodes = options.max_nodes;
        Self {
            writer,
            clock,
            enrollment_gate: EnrollmentGate::new(options.enrollment_limits),
            slots: Mutex::new(NodeMap::new(options.max_nodes)),
            options,
            started: Instant::now(),
            fleet_full: AtomicU64::new(0),
            mqtt_sessions_taken_over: Arc::new(AtomicU64::new(0)),
            messages: AtomicU64::new(0),
            enrollment: OnceLock::new(),
            counters,
            sites: Arc::new(Mutex::new(SiteTracker::new(PartitionRule::default()))),
            sites_wake: Arc::new(tokio::sync::Notify::new()),
            resource_samples: Arc::new(Samples::new(max_nodes)),
            usage_outbox: OnceLock::new(),
        }
    }

    /// The latest resource usage of each node this replica holds, from the agents' Lease
    /// renewals: what the resource metrics server serves
    /// ([`crate::resource_metrics::serve`]).
    pub fn resource_samples(&self) -> Arc<Samples> {
        self.resource_samples.clone()
    }

    /// The outbox of the usage samples this replica admits, for the other replicas (the
    /// MQTT ingress's [`MqttIngressOptions::usage_sharing`]): made on the first call, after
    /// which every sample recorded from a renewal goes there too. Call it before serving.
    ///
    /// [`MqttIngressOptions::usage_sharing`]: edgebeat_transports::mqtt::MqttIngressOptions::usage_sharing
    pub fn share_usage(&self) -> UsageOutbox {
        self.usage_outbox
            .get_or_init(|| tokio::sync::broadcast::channel(USAGE_OUTBOX).0)
            .clone()
    }

    /// The count of the MQTT ingress's [`MqttIngressOptions::sessions_taken_over`], served
    /// as `edgebeat_gateway_mqtt_sessions_taken_over_total`.
    ///
    /// [`MqttIngressOptions::sessions_taken_over`]: edgebeat_transports::mqtt::MqttIngressOptions::sessions_taken_over
    pub fn mqtt_sessions_taken_over(&self) -> Arc<AtomicU64> {
        self.mqtt_sessions_taken_over.clone()
    }

    /// Turns on enrollment and rotation of node certificates through `enrollment`
    /// ([`Handler::request_certificate`] then answers; see [`crate::enrollment`]). Call it
    /// once, before serving and before [`Gateway::register_metrics`]; later calls are
    /// ignored.
    pub fn enable_enrollment(&self, enrollment: Arc<Enrollment>) {
        let _ = self.enrollment.set(enrollment);
    }

    /// Whether a node speaking with `certificate` is due for a new one by this gateway's
    /// clock: enrollment is on and 80 % of the lifetime this gateway issues has passed
    /// since its notBefore (the agent's own deadline is at 70–90 %; this is for boards whose
    /// clock cannot tell, `Ack.certificate_due`).
    fn certificate_due(&self, certificate: Option<CertificateId>) -> bool {
        let (Some(enrollment), Some(certificate)) = (self.enrollment.get(), certificate) else {
            return false;
        };
        let lifetime = enrollment.options().lifetime.as_secs_f64();
        let now = self.clock.unix_now().seconds_f64();
        let age = now - certificate.not_before as f64;
        age > lifetime * 0.8
    }

    /// What this replica knows the apiserver holds for its Nodes and Leases.
    pub fn view(&self) -> &Arc<ApiserverView> {
        &self.writer.view
    }

    /// Follows the Nodes and Leases this gateway manages ([`crate::view`]) through
    /// `client`, until dropped; spawn it beside the ingresses. `client` should have no read
    /// timeout shorter than the watch's (kube-runtime asks the apiserver for 290 s), see
    /// [`watch_client`].
    ///
    /// It also follows the fleet's sites ([`crate::site_status::follow`]): every replica reads
    /// the same watched Leases, reaches the same verdict and writes the same bytes, so a
    /// cut-off site is recorded once.
    pub fn watch(&self, client: kube::Client) -> impl Future<Output = ()> + Send + 'static {
        let view = self.writer.view.clone();
        let clock = self.clock.clone();
        let sites = crate::site_status::follow(
            view.clone(),
            self.writer.api.clone(),
            self.sites.clone(),
            self.sites_wake.clone(),
            move || clock.unix_now().timestamp(),
        );
        async move {
            tokio::join!(
                view.clone().watch_nodes(client.clone()),
                view.watch_leases(client),
                sites
            );
        }
    }

    fn reject(&self, why: RejectReason, reason: String) -> Answer {
        self.writer.reject(why, reason)
    }

    /// Refuses a message for a node this replica has no room for; logs the first refusal
    /// and every 1,000th after it (a fleet too large for one replica is an operator's
    /// problem to see, not a log flood).
    fn fleet_full(&self, name: &str) -> Answer {
        self.counters.count_rejection(RejectReason::FleetFull);
        let refused = self.fleet_full.fetch_add(1, Ordering::Relaxed);
        if refused.is_multiple_of(1000) {
            tracing::error!(
                node = name,
                max_nodes = self.options.max_nodes,
                refused = refused + 1,
                "this replica keeps state for --max-nodes nodes already; messages of further nodes are refused (raise --max-nodes with the memory limit, or add replicas)"
            );
        }
        retry(format!(
            "this gateway replica is full ({} nodes)",
            self.options.max_nodes
        ))
    }

    /// Posts `letter` to its node's [`Mailbox`], after [`Gateway::screen`] and once the
    /// node has a slot ([`Gateway::slot`]); refusals are answered (or, for a copy or a
    /// full mailbox, counted and dropped unanswered) at once. Returns the node's slot when
    /// its letters must now be handled ([`Gateway::handle_letters`]).
    fn post(&self, letter: Letter) -> Option<Arc<SlotCell>> {
        let name = match self.screen(&letter.peer, &letter.message) {
            Ok(name) => name,
            Err(answer) => {
                letter.reply.send_now(Some(answer));
                return None;
            }
        };
        let Some(cell) = self.slot(&name, letter.peer.identity.is_some()) else {
            let answer = self.fleet_full(&name);
            letter.reply.send_now(Some(answer));
            return None;
        };
        let posted = cell
            .mailbox
            .lock()
            .post(letter, self.options.per_node_queue);
        match posted {
            Ok(posted) => {
                for _ in 0..posted.dropped {
                    // Superseded, and dropped unanswered: the node sends faster than one
                    // of its letters is handled.
                    self.counters.count_rejection(RejectReason::Superseded);
                }
                posted.start.then_some(cell)
            }
            Err((why, letter)) => {
                self.counters.count_rejection(why);
                tracing::debug!(
                    transport = letter.peer.transport.as_str(),
                    node = ?letter.peer.identity,
                    why = why.as_str(),
                    "message rejected unanswered: a copy of one already posted, or the node's mailbox is full"
                );
                None
            }
        }
    }

    /// Handles `cell`'s letters in order until none is left, answering each: called by
    /// whoever's post started the handling, and by nobody else meanwhile.
    async fn handle_letters(&self, cell: &SlotCell) {
        let mut handling = Handling { cell, armed: true };
        loop {
            let Some(turn) = cell.mailbox.lock().next_turn() else {
                // Idle under the lock: the next post starts handling again.
                handling.armed = false;
                return;
            };
            let (letter, answer) = match turn {
                Turn::Handle(letter) => {
                    let answer = self.handle_letter(cell, &letter).await;
                    (letter, answer)
                }
                Turn::Superseded(letter) => {
                    let answer = self.superseded(cell, &letter.message).await;
                    (letter, answer)
                }
            };
            letter.reply.send(answer).await;
        }
    }

    /// The answer to a letter superseded while it waited: `superseded`, never written (a
    /// backlog, say a slow apiserver, then costs one write per node, not one per message),
    /// or none for a replay (the answer would cost the node's link, and the genuine
    /// message had its own).
    async fn superseded(&self, cell: &SlotCell, message: &pb::AgentMessage) -> Option<Answer> {
        let replay = match message.header() {
            Some(header) => cell.state.lock().await.admission.is_replay(header),
            None => false,
        };
        if replay {
            self.counters.count_rejection(RejectReason::Replayed);
            return None;
        }
        self.counters.count_rejection(RejectReason::Superseded);
        message.message_kind().map(Answer::superseded)
    }

    /// Handles one letter whose turn came (see the module docs): admission, the writes,
    /// and what follows a write. `None` for a replay, which gets no answer.
    async fn handle_letter(&self, cell: &SlotCell, letter: &Letter) -> Option<Answer> {
        let (peer, message) = (&letter.peer, &*letter.message);
        let Some(header) = message.header() else {
            return Some(self.no_header());
        };
        let mut slot = cell.state.lock().await;
        let age = match self.admit(cell, &mut slot, peer, message, header, letter.received) {
            Ok(age) => age,
            Err(answer) => return answer,
        };
        // Writes must start before the heartbeat would be stale (at least half a second, so a
        // fresh one always gets its attempt).
        let deadline = letter.received
            + self
                .options
                .max_renewal_age
                .saturating_sub(age)
                .max(Duration::from_millis(500));
        let name = &cell.name;
        let answer = self.write(&mut slot.writes, name, message, deadline).await;
        Some(
            self.follow_up(&mut slot.writes, name, peer, message, answer)
                .await,
        )
    }

    /// The apiserver calls of an admitted message ([`Writer`]): kubelet's registration,
    /// status update or Lease renewal, each starting before `deadline`.
    ///
    /// A registration's and a full status report's futures are boxed: they are rare and
    /// the largest (about 14.6 and 7.9 KB at rustc 1.95, against 4.5 KB for a renewal), and
    /// inline they would set the size of every message's future, which tokio copies as a
    /// task is spawned and finished (`Core::set_stage`).
    async fn write(
        &self,
        writes: &mut NodeWrites,
        name: &NodeName,
        message: &pb::AgentMessage,
        deadline: Instant,
    ) -> Answer {
        match &message.kind {
            Some(Kind::Register(register)) => {
                Box::pin(self.writer.register(writes, name, register)).await
            }
            Some(Kind::Status(report)) if report.unchanged => {
                self.writer.report_unchanged(writes, name).await
            }
            Some(Kind::Status(report)) => {
                Box::pin(
                    self.writer
                        .report(writes, name, report.status.as_ref(), &report.journal),
                )
                .await
            }
            Some(Kind::Lease(renewal)) => {
                self.writer
                    .renew(
                        writes,
                        name,
                        renewal.lease_duration_seconds,
                        &renewal.lease_state,
                        deadline,
                    )
                    .await
            }
            None => self.reject(
                RejectReason::Malformed,
                "malformed: unknown message kind".into(),
            ),
        }
    }

    /// What follows a written message: the node's certificate recorded on its Node, a full
    /// status report asked for when the apiserver holds a condition at Unknown, and a
    /// Register told whether its certificate is due.
    async fn follow_up(
        &self,
        writes: &mut NodeWrites,
        name: &NodeName,
        peer: &Peer,
        message: &pb::AgentMessage,
        mut answer: Answer,
    ) -> Answer {
        if let Answer::Registered {
            certificate_due, ..
        } = &mut answer
        {
            *certificate_due = self.certificate_due(peer.certificate);
        }
        if !answer.is_written() {
            return answer;
        }
        writes.last_write = Some(Instant::now());
        if let Some(certificate) = peer.certificate {
            self.record_certificate(name, certificate).await;
        }
        // The apiserver holds a condition at Unknown (the node lifecycle controller's, seen
        // by the watch or a read): ask for a full status report, which repairs it within one
        // renew interval, as kubelet's next status update would.
        if !matches!(message.kind, Some(Kind::Status(_)))
            && self.writer.view.node_has_unknown_condition(name)
        {
            return answer.and_resend_status();
        }
        // A node this replica took from another (a reconnect after a replica's death, a
        // rebalanced subscription) while serving resource metrics: its whole status, asked
        // for at once, names this replica, where metrics-server then finds its samples.
        if self.writer.resource_metrics.is_some()
            && !writes.status_written
            && matches!(message.kind, Some(Kind::Lease(_)))
        {
            return answer.and_resend_status();
        }
        answer
    }

    /// Records on its Node that `name` speaks with `certificate`, when the view knows the
    /// Node and records none or an older one ([`CertificateId::may_replace`]). A failure is
    /// logged and tried again with the node's next message.
    async fn record_certificate(&self, name: &NodeName, certificate: CertificateId) {
        let Some(node) = self.writer.view.node(name) else {
            return;
        };
        if node
            .certificate
            .is_some_and(|held| held == certificate || !certificate.may_replace(&held))
        {
            return;
        }
        if let Err(error) = self.writer.record_certificate(name, certificate).await {
            tracing::warn!(node = name.as_str(), %error, "could not record the node's certificate; trying again with its next message");
        }
    }
}

mod admit;
mod gauges;
mod handler;
mod options;
mod slots;

#[cfg(test)]
mod tests;
