//! The apiserver writer: kubelet's calls for one admitted message, against what the
//! [`ApiserverView`] says the apiserver holds.
//!
//! - Register: kubelet `registerWithAPIServer` (`pkg/kubelet/kubelet_node_status.go`): POST
//!   the Node; on AlreadyExists GET it and reconcile the default labels.
//! - Status: kubelet `patchNodeStatus` (`staging/src/k8s.io/component-helpers/node/util/
//!   status.go: PatchNodeStatus`): a strategic-merge PATCH of `nodes/{name}/status`.
//! - Lease: kubelet's lease controller (`staging/src/k8s.io/component-helpers/apimachinery/
//!   lease/controller.go`): PUT with the last known resourceVersion, GET only after a 409.
//! - Events: kubelet's `Rebooted` and condition events (`pkg/kubelet/events`).
//!
//! Per node the writer keeps only [`NodeWrites`] (a few flags and the last renewTime); what
//! the apiserver holds lives in the shared view, so every replica diffs against the same
//! state. Calls go through [`Apiserver`] (priorities, bounded concurrency, backoff).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use edgebeat_hw::Clock;
use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{self as pb, Answer, ConditionStatus, EventType, NodeConditionType};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;

use crate::apiserver::{Apiserver, answers};
use crate::bodies;
use crate::metrics::Counters;
use crate::metrics::{NodeMetrics, NodeSeries};
use crate::resource_metrics::Endpoint;
use crate::view::{ApiserverView, NodeRecord};
use edgebeat_transports::ingress::RejectReason;

mod journal;
mod lease;
mod register;
use journal::Timed;
pub use journal::{LATE, usable};
pub use lease::LeaseState;

/// [`Answer::Retry`]: not written now, `reason` for the agent's log.
pub(crate) fn retry(reason: impl Into<String>) -> Answer {
    Answer::Retry {
        reason: reason.into(),
    }
}

/// [`Answer::Rejected`]: refused for good, `reason` for the agent's log.
pub(crate) fn rejected(reason: impl Into<String>) -> Answer {
    Answer::Rejected {
        reason: reason.into(),
    }
}

pub use crate::restriction::StatusError;

/// Checks a reported NodeStatus: only condition types an agent may report (kubelet's four
/// and [`NodeConditionType::HEALTH`], [`NodeConditionType::from_name`]),
/// each at most once, each True or False (Unknown belongs to the node lifecycle
/// controller), with a reason.
///
/// Errors: the [`StatusError`] naming the offending condition.
pub fn validate_status(status: &pb::NodeStatus) -> Result<(), StatusError> {
    let mut seen = Vec::with_capacity(status.conditions.len());
    for c in &status.conditions {
        let Some(type_) = NodeConditionType::from_name(&c.r#type) else {
            return Err(StatusError::UnknownConditionType {
                type_: c.r#type.clone(),
            });
        };
        if seen.contains(&type_) {
            return Err(StatusError::DuplicateCondition { type_ });
        }
        seen.push(type_);
        if !ConditionStatus::parse(&c.status).is_some_and(ConditionStatus::is_reported) {
            return Err(StatusError::ConditionStatus {
                type_,
                status: c.status.clone(),
            });
        }
        if c.reason.is_empty() {
            return Err(StatusError::NoReason { type_ });
        }
    }
    Ok(())
}

/// kubelet's event for a condition of `type_` that is written with `status` where the
/// apiserver held `before` (`None`: the condition is new): the setters of
/// `pkg/kubelet/nodestatus/setters.go` record one on every status change, and for a new
/// condition only for the pressure ones (they start `Unknown`; a new Ready records none).
fn condition_event_reason(
    type_: NodeConditionType,
    status: ConditionStatus,
    before: Option<ConditionStatus>,
) -> Option<&'static str> {
    let changed = match before {
        Some(held) => held != status,
        None => type_ != NodeConditionType::Ready,
    };
    changed.then(|| type_.event_reason(status)).flatten()
}

/// The event a written condition records, as (event type, reason): kubelet's conditions as
/// [`condition_event_reason`]; a health condition, like node-problem-detector's, with its
/// own reason whenever its status changes or it first appears True — `Warning` when True.
fn condition_event(
    type_: NodeConditionType,
    status: ConditionStatus,
    reason: &str,
    before: Option<ConditionStatus>,
) -> Option<(EventType, String)> {
    if type_.is_kubelets() {
        return condition_event_reason(type_, status, before)
            .map(|r| (EventType::Normal, r.to_owned()));
    }
    let changed = match before {
        Some(held) => held != status,
        None => status.is_true(),
    };
    let kind = if status.is_true() {
        EventType::Warning
    } else {
        EventType::Normal
    };
    (changed && !reason.is_empty()).then(|| (kind, reason.to_owned()))
}

/// `status.nodeInfo.bootID` of a reported status (empty when absent).
pub(crate) fn boot_id_of(status: &pb::NodeStatus) -> &str {
    status
        .node_info
        .as_ref()
        .map(|i| i.boot_id.as_str())
        .unwrap_or_default()
}

/// Whether a status write records kubelet's `Rebooted` event for a changed boot ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reboot {
    /// Registration: compare with the Node just read; the board booted at `booted`
    /// (`Register.uptime_ms` before the receipt), when known.
    Record { booted: Option<Timestamp> },
    /// A status report: never (see [`Writer::register`]).
    Ignore,
}

/// What the writer keeps per node, beside the shared view (in the node's slot).
#[derive(Default)]
pub(crate) struct NodeWrites {
    /// This replica registered the node, or read it, for the boot it last saw: a repeated
    /// Register of that boot (a gRPC reconnect) costs no apiserver call.
    registered: bool,
    /// Last successful write for this node. Without a Node watch the view is trusted for
    /// `knowledge_ttl` after it.
    pub(crate) last_write: Option<Instant>,
    /// Last renewTime written for this Lease (or seen written by another replica).
    last_renew: Option<Timestamp>,
    /// This node's per-node metric series (removed with the slot).
    pub(crate) series: NodeSeries,
    /// This replica wrote the node's whole status (or created the Node) since it took the
    /// node: the status names it where it serves resource metrics.
    pub(crate) status_written: bool,
}

/// The writer (see the module docs), shared by every message handler.
pub(crate) struct Writer {
    pub(crate) api: Apiserver,
    pub(crate) view: Arc<ApiserverView>,
    clock: Arc<dyn Clock>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) node_metrics: NodeMetrics,
    knowledge_ttl: Duration,
    event_seq: AtomicU64,
    /// Where this replica serves resource metrics, named in every status it writes
    /// ([`crate::resource_metrics::Endpoint`]); `None` when it serves none.
    pub(crate) resource_metrics: Option<Endpoint>,
}

impl Writer {
    pub(crate) fn new(
        api: Apiserver,
        clock: Arc<dyn Clock>,
        counters: Arc<Counters>,
        knowledge_ttl: Duration,
    ) -> Self {
        Self {
            api,
            view: Arc::new(ApiserverView::new()),
            node_metrics: NodeMetrics::new(clock.clone()),
            clock,
            counters,
            knowledge_ttl,
            event_seq: AtomicU64::new(0),
            resource_metrics: None,
        }
    }

    /// The NodeStatus to write for a reported `status`: the agent's, naming this replica
    /// when it serves resource metrics ([`Endpoint::apply`]).
    pub(crate) fn node_status(
        &self,
        status: &pb::NodeStatus,
        conditions: Vec<k8s_openapi::api::core::v1::NodeCondition>,
    ) -> k8s_openapi::api::core::v1::NodeStatus {
        let mut node_status = bodies::node_status(status, conditions);
        if let Some(endpoint) = &self.resource_metrics {
            endpoint.apply(&mut node_status);
        }
        node_status
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.clock.unix_now().timestamp()
    }

    /// Rejects a message: counted by reason, logged.
    pub(crate) fn reject(&self, why: RejectReason, reason: String) -> Answer {
        self.counters.count_rejection(why);
        let now = tokio::time::Instant::now();
        if let edgebeat_transports::log_limit::LogLine::Write { suppressed, .. } =
            self.counters.rejection_log.check(why.as_str(), "", now)
        {
            tracing::warn!(why = why.as_str(), %reason, suppressed, "message rejected");
        }
        rejected(reason)
    }

    /// What the view holds for `name`, if it can be trusted: a managed Node's record while
    /// the Node watch follows; otherwise for `knowledge_ttl` after this replica's last
    /// write (the node lifecycle controller may have written Unknown since).
    fn known(&self, w: &NodeWrites, name: &NodeName) -> Option<NodeRecord> {
        let record = self.view.node(name)?;
        let fresh = (record.managed && self.view.nodes_watched())
            || (w.registered
                && w.last_write
                    .is_some_and(|t| t.elapsed() <= self.knowledge_ttl));
        fresh.then_some(record)
    }

    /// Records kubelet's condition events (`NodeReady`, `NodeHasSufficientMemory`, …) for
    /// every condition whose status in `written` differs from `before` (what the apiserver
    /// held before the write), and with [`Reboot::Record`] kubelet's `Rebooted` event when
    /// the boot ID did, stamped with the boot time when the agent said its uptime. A type
    /// with transitions in `journal` records one event per transition instead, each at its
    /// true time (a late one says how late and how long it lasted). A condition new to the Node records its event too, except Ready, as
    /// kubelet's setters do when they append one. Only the types an agent reports count:
    /// another writer's condition (the gateway's own `SiteUnreachable`, a CNI's
    /// `NetworkUnavailable`, node-problem-detector's) is theirs to record, and the view
    /// does not keep it, so it would look new at every write. Then takes `written` into the
    /// view.
    async fn remember(
        &self,
        before: &NodeRecord,
        written: &Node,
        now: Timestamp,
        name: &NodeName,
        reboot: Reboot,
        journal: &[Timed<'_>],
    ) {
        self.journal_events(before, now, name, journal).await;
        for (type_, c) in written
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .filter_map(|c| Some((NodeConditionType::from_name(&c.type_)?, c)))
            .filter(|(type_, _)| !journal.iter().any(|t| t.type_ == *type_))
        {
            let held = before.conditions.get(type_).map(|k| k.status);
            let reason = c.reason.as_deref().unwrap_or_default();
            let status = ConditionStatus::from_api(&c.status);
            if let Some((kind, reason)) = condition_event(type_, status, reason, held) {
                self.condition_event(name, kind, &reason, now).await;
            }
        }
        let boot = written
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.as_str());
        if let (Reboot::Record { booted }, Some(old), Some(new)) =
            (reboot, before.boot_id.as_deref(), boot)
            && !old.is_empty()
            && old != new
        {
            self.event(
                name,
                EventType::Warning,
                "Rebooted",
                format!("Node {name} has been rebooted, boot id: {new}"),
                booted.unwrap_or(now),
            )
            .await;
        }
        self.view.observe_node(written);
    }

    /// One condition event per journal transition, at its true time, in order (the status
    /// before each is the one the apiserver held, then the journal's previous of the type).
    async fn journal_events(
        &self,
        before: &NodeRecord,
        now: Timestamp,
        name: &NodeName,
        journal: &[Timed<'_>],
    ) {
        for (i, t) in journal.iter().enumerate() {
            let type_ = t.type_;
            let held = journal[..i]
                .iter()
                .rev()
                .find(|p| p.type_ == type_)
                .map(|p| p.status)
                .or_else(|| before.conditions.get(type_).map(|k| k.status));
            let Some((kind, reason)) = condition_event(type_, t.status, &t.entry.reason, held)
            else {
                continue;
            };
            let mut message = format!("Node {name} status is now: {reason}");
            let late = now.duration_since(t.at);
            if late > LATE {
                let lasted = journal[i + 1..]
                    .iter()
                    .find(|n| n.type_ == type_)
                    .map(|n| n.at.duration_since(t.at));
                message.push_str(&format!(
                    " (at {}{}; reported {} later, after the node's link was down)",
                    bodies::whole_seconds(t.at),
                    lasted.map_or(String::new(), |d| format!(", for {}", journal::human(d))),
                    journal::human(late),
                ));
            }
            let mut event = bodies::node_event(name, kind, &reason, message, t.at, 0);
            event.metadata.name = Some(t.name.clone());
            match self.api.create_event(name, &event).await {
                Ok(_) => {}
                // Recorded already: by another replica, or for an earlier send.
                Err(e) if answers::is_already_exists(&e) => {}
                Err(error) => self.event_failed(name, &reason, &error),
            }
        }
    }

    /// The entries of `journal` to take ([`usable`]); the others are counted as `invalid`
    /// and logged.
    pub(crate) fn usable_journal<'a>(
        &self,
        name: &NodeName,
        journal: &'a [pb::ConditionTransition],
    ) -> Vec<&'a pb::ConditionTransition> {
        let (taken, skipped) = usable(journal);
        for why in skipped {
            self.counters.count_rejection(RejectReason::Invalid);
            tracing::warn!(node = name.as_str(), %why, "journal entry skipped");
        }
        taken
    }

    /// kubelet `patchNodeStatus`: strategic-merge PATCH of `nodes/{name}/status`, with the
    /// report's `journal` of transitions timed on this replica's clock ([`validate_journal`]).
    pub(crate) async fn report(
        &self,
        w: &mut NodeWrites,
        name: &NodeName,
        status: Option<&pb::NodeStatus>,
        journal: &[pb::ConditionTransition],
    ) -> Answer {
        let journal = self.usable_journal(name, journal);
        let Some(status) = status else {
            return self.reject(
                RejectReason::Malformed,
                "malformed: StatusReport without status".into(),
            );
        };
        if let Err(why) = validate_status(status)
            .and_then(|()| crate::restriction::validate_status_limits(status))
        {
            return self.reject(RejectReason::Invalid, why.to_string());
        }
        let held = match self.ensure_known(w, name).await {
            Ok(held) => held,
            Err(answer) => return answer,
        };
        let now = self.now();
        let journal = journal::timed(&journal, now, &held.conditions, name, boot_id_of(status));
        self.write_status(w, name, status, &held, now, Reboot::Ignore, &journal)
            .await
    }

    /// An unchanged periodic status report (`StatusReport.unchanged`): what kubelet's
    /// periodic update amounts to when nothing changed, a PATCH that refreshes every
    /// condition's `lastHeartbeatTime` (kubelet's two-way merge patch of an unchanged node
    /// carries only those). Written only when the apiserver's conditions are the agent's
    /// (none `Unknown`): otherwise, or with no condition known, the answer asks for the
    /// whole status (`resend_status`) and nothing is written.
    pub(crate) async fn report_unchanged(&self, w: &mut NodeWrites, name: &NodeName) -> Answer {
        let held = match self.ensure_known(w, name).await {
            Ok(held) => held,
            Err(answer) => return answer,
        };
        // Only conditions the agent reports: others (a CNI's NetworkUnavailable) are not
        // ours. kubelet's four must all be there; a health condition is refreshed when the
        // Node has it (the last whole status had it: one it stopped reporting was deleted).
        let reported = |t: &NodeConditionType| {
            held.conditions
                .get(*t)
                .is_some_and(|c| c.status.is_reported())
        };
        let as_reported = NodeConditionType::KUBELET.iter().all(reported);
        if !as_reported {
            return Answer::ResendStatus {
                reason: "the apiserver's status differs: send it whole".into(),
            };
        }
        let now = bodies::whole_seconds(self.now());
        let conditions: Vec<serde_json::Value> = NodeConditionType::KUBELET
            .iter()
            .chain(NodeConditionType::HEALTH.iter().filter(|t| reported(t)))
            .map(|t| serde_json::json!({ "type": t.as_str(), "lastHeartbeatTime": Time(now) }))
            .collect();
        let body = serde_json::json!({ "status": { "conditions": conditions } });
        match self.api.patch_node_status(name, body).await {
            Ok(node) => {
                self.view.observe_node(&node);
                self.counters.status_reports.inc();
                Answer::WRITTEN
            }
            Err(e) if answers::is_not_found(&e) => self.forget(w, name),
            Err(e) => retry(format!("patching node status: {e}")),
        }
    }

    /// The status PATCH itself, diffed against `held`.
    #[allow(clippy::too_many_arguments)]
    async fn write_status(
        &self,
        w: &mut NodeWrites,
        name: &NodeName,
        status: &pb::NodeStatus,
        held: &NodeRecord,
        now: Timestamp,
        reboot: Reboot,
        journal: &[Timed<'_>],
    ) -> Answer {
        let mut conditions = bodies::conditions(status, now, &held.conditions);
        journal::transitions(&mut conditions, journal, &held.conditions);
        // A health condition the agent no longer reports (turned off, or its signal gone
        // from the host) is deleted rather than left to look current.
        let dropped = NodeConditionType::HEALTH
            .into_iter()
            .filter(|t| {
                held.conditions.contains_key(*t)
                    && !status.conditions.iter().any(|c| *t == c.r#type.as_str())
            })
            .map(NodeConditionType::as_str);
        // A Node registered before this replica served resource metrics (or whose
        // annotation was removed) gets metrics-server's path with the status that names the
        // replica: no request of its own, and no Register needed (an MQTT agent never
        // registers again while it runs).
        let annotation = (self.resource_metrics.is_some() && !held.resource_metrics_path)
            .then(|| register::resource_metrics_annotation(name));
        let body =
            match bodies::status_patch(&self.node_status(status, conditions), annotation.as_ref())
                .map(|body| bodies::delete_conditions(body, dropped))
            {
                Ok(b) => b,
                Err(e) => {
                    return self.reject(
                        RejectReason::Malformed,
                        format!("cannot encode status: {e}"),
                    );
                }
            };
        match self.api.patch_node_status(name, body).await {
            Ok(node) => {
                self.remember(held, &node, now, name, reboot, journal).await;
                self.counters.status_reports.inc();
                w.status_written = true;
                Answer::WRITTEN
            }
            Err(e) if answers::is_not_found(&e) => self.forget(w, name),
            Err(e) => match answers::refused_content(&e) {
                // The apiserver refuses the content itself: resending it will not help.
                Some(code) => self.reject(
                    RejectReason::Invalid,
                    format!("apiserver refused the status ({code}): {e}"),
                ),
                None => retry(format!("patching node status: {e}")),
            },
        }
    }

    /// Makes sure the view knows the node as the apiserver has it ([`Self::known`]);
    /// otherwise one Node GET — the first time a replica without a Node watch sees a node,
    /// or when its knowledge is older than `knowledge_ttl`, or a node the watch has not
    /// delivered yet. An `Unknown` condition found there (the controller's, after an
    /// outage) makes the next ack ask the agent for a full status report, so the node is
    /// Ready again within seconds, not at the next report period.
    ///
    /// Errors: the [`Answer`] to answer with — [`Answer::NodeNotFound`] when the Node does
    /// not exist.
    async fn ensure_known(
        &self,
        w: &mut NodeWrites,
        name: &NodeName,
    ) -> Result<NodeRecord, Answer> {
        if let Some(held) = self.known(w, name) {
            return Ok(held);
        }
        match self.api.get_node_opt(name).await {
            Ok(Some(node)) => {
                self.view.observe_node(&node);
                w.registered = true;
                Ok(NodeRecord::of(&node))
            }
            Ok(None) => Err(self.forget(w, name)),
            Err(e) => Err(retry(format!("reading node: {e}"))),
        }
    }

    /// The Node is gone although the agent registered it (only a registered agent sends
    /// what leads here): someone deleted it. Forget it, and tell the agent, which stops
    /// sending until restarted instead of creating it again (kubelet registers once per
    /// process: `registrationCompleted` in `pkg/kubelet/kubelet_node_status.go`).
    fn forget(&self, w: &mut NodeWrites, name: &NodeName) -> Answer {
        w.registered = false;
        self.view.forget_node(name);
        self.view.forget_lease(name);
        self.counters.nodes_not_found.inc();
        tracing::warn!(
            node = name.as_str(),
            "the Node was deleted; its agent stops until it is restarted"
        );
        Answer::NodeNotFound {
            reason: "node not found: it was deleted; restart the agent to register it again".into(),
        }
    }

    /// kubelet `recordNodeStatusEvent`: a `Normal` event `reason` with "Node X status is now:
    /// reason".
    async fn condition_event(
        &self,
        name: &NodeName,
        kind: EventType,
        reason: &str,
        now: Timestamp,
    ) {
        self.event(
            name,
            kind,
            reason,
            format!("Node {name} status is now: {reason}"),
            now,
        )
        .await;
    }

    async fn event(
        &self,
        name: &NodeName,
        type_: EventType,
        reason: &str,
        message: String,
        now: Timestamp,
    ) {
        let unique = self.event_seq.fetch_add(1, Ordering::Relaxed);
        let event = bodies::node_event(name, type_, reason, message, now, unique);
        if let Err(error) = self.api.create_event(name, &event).await {
            self.event_failed(name, reason, &error);
        }
    }

    /// An Event not recorded: a WARN, or DEBUG during an apiserver outage, whose own lines
    /// say it ([`crate::apiserver::outage`]).
    fn event_failed(&self, name: &NodeName, reason: &str, error: &kube::Error) {
        if self.api.in_outage() {
            tracing::debug!(node = name.as_str(), reason, %error, "could not record event");
        } else {
            tracing::warn!(node = name.as_str(), reason, %error, "could not record event");
        }
    }
}

#[cfg(test)]
mod tests;
