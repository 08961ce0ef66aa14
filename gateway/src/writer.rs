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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use edgebeat_hw::Clock;
use edgebeat_proto::{self as pb, Ack, AckCode, HEALTH_CONDITION_TYPES, KUBELET_CONDITION_TYPES};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;

use crate::apiserver::Apiserver;
use crate::gateway::Counters;
use crate::metrics::{NodeMetrics, NodeSeries, RejectReason};
use crate::patch;
use crate::patch::MANAGED_LABEL;
use crate::view::{ApiserverView, NodeRecord};

/// An [`Ack`] for `seq`.
pub(crate) fn ack(seq: u64, code: AckCode, reason: impl Into<String>) -> Ack {
    Ack {
        seq,
        code: code.into(),
        reason: reason.into(),
        ..Default::default()
    }
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// Checks a reported NodeStatus: only condition types an agent may report (kubelet's four
/// and [`edgebeat_proto::HEALTH_CONDITION_TYPES`], [`patch::KnownConditions::reportable`]),
/// each at most once, each True or False (Unknown belongs to the node lifecycle
/// controller), with a reason.
///
/// Errors: a message naming the offending condition.
pub fn validate_status(status: &pb::NodeStatus) -> Result<(), String> {
    let mut seen = Vec::with_capacity(status.conditions.len());
    for c in &status.conditions {
        if !patch::KnownConditions::reportable(&c.r#type) {
            return Err(format!(
                "malformed: condition type {:?} is not one kubelet or edgebeat reports",
                c.r#type
            ));
        }
        if seen.contains(&c.r#type.as_str()) {
            return Err(format!("malformed: condition {} appears twice", c.r#type));
        }
        seen.push(c.r#type.as_str());
        if c.status != "True" && c.status != "False" {
            return Err(format!(
                "malformed: condition {} has status {:?}; only True or False",
                c.r#type, c.status
            ));
        }
        if c.reason.is_empty() {
            return Err(format!("malformed: condition {} has no reason", c.r#type));
        }
    }
    Ok(())
}

/// kubelet's event for a condition of `type_` that is written with `status` where the
/// apiserver held `before` (`None`: the condition is new): the setters of
/// `pkg/kubelet/nodestatus/setters.go` record one on every status change, and for a new
/// condition only for the pressure ones (they start `Unknown`; a new Ready records none).
fn condition_event_reason(type_: &str, status: &str, before: Option<&str>) -> Option<&'static str> {
    let changed = match before {
        Some(held) => held != status,
        None => type_ != "Ready",
    };
    changed.then(|| transition_reason(type_, status)).flatten()
}

/// The event a written condition records, as (event type, reason): kubelet's conditions as
/// [`condition_event_reason`]; a health condition, like node-problem-detector's, with its
/// own reason whenever its status changes or it first appears True — `Warning` when True.
fn condition_event(
    type_: &str,
    status: &str,
    reason: &str,
    before: Option<&str>,
) -> Option<(&'static str, String)> {
    if KUBELET_CONDITION_TYPES.contains(&type_) {
        return condition_event_reason(type_, status, before).map(|r| ("Normal", r.to_owned()));
    }
    let changed = match before {
        Some(held) => held != status,
        None => status == "True",
    };
    let kind = if status == "True" {
        "Warning"
    } else {
        "Normal"
    };
    (changed && !reason.is_empty()).then(|| (kind, reason.to_owned()))
}

/// kubelet's event reason for a condition reaching `status` (`pkg/kubelet/events`).
fn transition_reason(type_: &str, status: &str) -> Option<&'static str> {
    Some(match (type_, status) {
        ("Ready", "True") => "NodeReady",
        ("Ready", _) => "NodeNotReady",
        ("MemoryPressure", "True") => "NodeHasInsufficientMemory",
        ("MemoryPressure", "False") => "NodeHasSufficientMemory",
        ("DiskPressure", "True") => "NodeHasDiskPressure",
        ("DiskPressure", "False") => "NodeHasNoDiskPressure",
        ("PIDPressure", "True") => "NodeHasInsufficientPID",
        ("PIDPressure", "False") => "NodeHasSufficientPID",
        _ => return None,
    })
}

/// The gateway's Lease state, echoed by the agent (`LeaseRenewal.lease_state`): the
/// resourceVersion and renewTime of the last successful write. Encoding: renewTime as
/// 8 bytes big-endian microseconds since the epoch, then the resourceVersion as UTF-8
/// (at most 64 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseState {
    /// `metadata.resourceVersion` returned by the last write.
    pub resource_version: String,
    /// `spec.renewTime` of the last write.
    pub renew_time: Timestamp,
}

impl LeaseState {
    /// The wire form (see the type docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.resource_version.len());
        out.extend_from_slice(&self.renew_time.as_microsecond().to_be_bytes());
        out.extend_from_slice(self.resource_version.as_bytes());
        out
    }

    /// Parses the wire form; `None` for empty or malformed input (the agent's echo is not
    /// trusted: a bad one only costs a GET).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let (time, rv) = bytes.split_first_chunk::<8>()?;
        if rv.is_empty() || rv.len() > 64 {
            return None;
        }
        let resource_version = std::str::from_utf8(rv).ok()?.to_owned();
        let renew_time = Timestamp::from_microsecond(i64::from_be_bytes(*time)).ok()?;
        Some(Self {
            resource_version,
            renew_time,
        })
    }
}

/// Whether a status write records kubelet's `Rebooted` event for a changed boot ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reboot {
    /// Registration: compare with the Node just read.
    Record,
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
        }
    }

    pub(crate) fn now(&self) -> Timestamp {
        Timestamp::try_from(self.clock.now()).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// Refuses a message: counted by reason, logged.
    pub(crate) fn reject(&self, seq: u64, why: RejectReason, reason: String) -> Ack {
        self.counters.count_rejection(why);
        tracing::warn!(why = why.as_str(), %reason, "message refused");
        ack(seq, AckCode::Rejected, reason)
    }

    /// What the view holds for `name`, if it can be trusted: a managed Node's record while
    /// the Node watch follows; otherwise for `knowledge_ttl` after this replica's last
    /// write (the node lifecycle controller may have written Unknown since).
    fn known(&self, w: &NodeWrites, name: &str) -> Option<NodeRecord> {
        let record = self.view.node(name)?;
        let fresh = (record.managed && self.view.nodes_watched())
            || (w.registered
                && w.last_write
                    .is_some_and(|t| t.elapsed() <= self.knowledge_ttl));
        fresh.then_some(record)
    }

    /// kubelet `registerWithAPIServer`: POST the Node (unless `skip_create`, kubelet's
    /// `registerNode: false`, or `registration_completed`: the agent's process registered
    /// before, and a Node missing now was deleted, answered `node_not_found`, as kubelet
    /// registers once per process); on AlreadyExists GET it and reconcile the default labels
    /// (PATCH only if they differ). When the boot ID differs from the one the apiserver
    /// holds, the status is written at once with the `Rebooted` event, as kubelet's
    /// `MachineInfo` setter does in its first status update after start. Only registration
    /// records `Rebooted` (an agent registers first after every start), comparing with the
    /// Node just read from the apiserver: a replica sharing the fleet that handles the next
    /// message of the new boot, before its watch has delivered the write, records nothing.
    pub(crate) async fn register(
        &self,
        w: &mut NodeWrites,
        name: &str,
        seq: u64,
        register: &pb::Register,
    ) -> Ack {
        let Some(status) = register.status.as_ref() else {
            return self.reject(
                seq,
                RejectReason::Malformed,
                "malformed: Register without status".into(),
            );
        };
        if let Err(why) = validate_status(status)
            .and_then(|()| crate::restriction::validate_status_limits(status))
            .and_then(|()| pb::registration::validate_register(register))
        {
            return self.reject(seq, RejectReason::Invalid, why);
        }
        let new_boot = status
            .node_info
            .as_ref()
            .map(|i| i.boot_id.as_str())
            .unwrap_or_default();
        let registered = |code| Ack {
            registered: true,
            ..ack(seq, code, "")
        };
        let known = self.known(w, name);
        // A new connection of a process this replica registered: nothing to write. A new
        // process (even of the same boot) registers in full, with kubelet's start events.
        if register.registration_completed
            && w.registered
            && known.as_ref().and_then(|k| k.boot_id.as_deref()) == Some(new_boot)
        {
            return registered(AckCode::Ok);
        }
        let now = self.now();
        let existing = if register.skip_create || register.registration_completed {
            match self.api.get_node_opt(name).await {
                Ok(Some(node)) => node,
                // The agent registered it before, on another connection: deleted since.
                Ok(None) if register.registration_completed => {
                    return self.forget(w, name, seq);
                }
                Ok(None) => {
                    return ack(
                        seq,
                        AckCode::Retry,
                        "node does not exist and registerNode is false",
                    );
                }
                Err(e) => return ack(seq, AckCode::Retry, format!("reading node: {e}")),
            }
        } else {
            let before = known.map(|k| k.conditions).unwrap_or_default();
            let conditions = patch::conditions(status, now, &before);
            let node = patch::initial_node(name, register, patch::node_status(status, conditions));
            match self.api.create_node(&node).await {
                Ok(created) => {
                    self.view.observe_node(&created);
                    w.registered = true;
                    self.counters.registrations.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(node = name, "registered node");
                    self.start_events(name, status, now).await;
                    return registered(AckCode::Ok);
                }
                Err(e) if api_code(&e) == Some(409) => match self.api.get_node(name).await {
                    Ok(node) => node,
                    Err(e) => {
                        return ack(seq, AckCode::Retry, format!("reading existing node: {e}"));
                    }
                },
                Err(e) => return ack(seq, AckCode::Retry, format!("creating node: {e}")),
            }
        };
        self.view.observe_node(&existing);
        if let Err(e) = self.reconcile_labels(name, &existing, register).await {
            return ack(seq, AckCode::Retry, format!("reconciling node labels: {e}"));
        }
        if !register.registration_completed
            && let Err(e) = self.reconcile_hugepages(name, &existing, status).await
        {
            return ack(seq, AckCode::Retry, format!("reconciling hugepages: {e}"));
        }
        let held = NodeRecord::of(&existing);
        if held.boot_id.as_deref().is_some_and(|b| b != new_boot) {
            // A new boot: write it now, with its event (see above).
            let answer = self
                .write_status(w, name, seq, status, &held, now, Reboot::Record)
                .await;
            if answer.node_not_found && !register.registration_completed {
                // Deleted while this first registration was under way: it creates the
                // Node when retried.
                return ack(seq, AckCode::Retry, "node deleted during registration");
            }
            if AckCode::try_from(answer.code) != Ok(AckCode::Ok) {
                return answer;
            }
        }
        w.registered = true;
        self.counters.registrations.fetch_add(1, Ordering::Relaxed);
        if !register.registration_completed {
            self.start_events(name, status, now).await;
        }
        registered(AckCode::Ok)
    }

    /// kubelet's condition events of a start: at registration its setters run on a fresh
    /// `initialNode`, where every pressure condition is new (`Unknown`, then its status), so
    /// each records its event — `NodeHasSufficientMemory`, `NodeHasNoDiskPressure`,
    /// `NodeHasSufficientPID` or the insufficient forms — while a new Ready records none
    /// (`pkg/kubelet/nodestatus/setters.go`; `initialNode` in
    /// `pkg/kubelet/kubelet_node_status.go`). Recorded once per agent process (not for a
    /// `Register` with `registration_completed`).
    async fn start_events(&self, name: &str, status: &pb::NodeStatus, now: Timestamp) {
        for c in &status.conditions {
            if let Some((kind, reason)) = condition_event(&c.r#type, &c.status, &c.reason, None) {
                self.condition_event(name, kind, &reason, now).await;
            }
        }
    }

    /// kubelet `reconcileHugePageResource` (`pkg/kubelet/kubelet_node_status.go`), run when
    /// a starting kubelet finds its Node already there: a `hugepages-<size>` in the Node's
    /// capacity that the host no longer has (the agent does not report it) is removed from
    /// capacity and allocatable, with a strategic-merge `null`. Only then: status reports,
    /// like kubelet's, never remove a key.
    ///
    /// Errors: the PATCH's.
    async fn reconcile_hugepages(
        &self,
        name: &str,
        existing: &Node,
        status: &pb::NodeStatus,
    ) -> Result<(), kube::Error> {
        let held = existing.status.as_ref();
        let gone: Vec<&String> = held
            .and_then(|s| s.capacity.as_ref())
            .into_iter()
            .flat_map(|c| c.keys())
            .filter(|k| k.starts_with("hugepages-") && !status.capacity.contains_key(*k))
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        tracing::info!(node = name, resources = ?gone, "removing huge page resources no longer supported");
        let removed: serde_json::Map<String, serde_json::Value> = gone
            .iter()
            .map(|k| ((*k).clone(), serde_json::Value::Null))
            .collect();
        let body = serde_json::json!({
            "status": { "capacity": removed, "allocatable": removed }
        });
        let node = self.api.patch_node_status(name, body).await?;
        self.view.observe_node(&node);
        Ok(())
    }

    /// kubelet `updateDefaultLabels`: force the labels kubelet computes (hostname, os, arch
    /// and their beta forms, and edgebeat's `edgebeat.io/container-runtime`) to the agent's
    /// values, plus [`MANAGED_LABEL`] (the selector of
    /// the gateway's watch); patch only when something differs.
    async fn reconcile_labels(
        &self,
        name: &str,
        existing: &Node,
        register: &pb::Register,
    ) -> Result<(), kube::Error> {
        let current = existing.metadata.labels.clone().unwrap_or_default();
        let wanted: BTreeMap<String, String> = pb::registration::DEFAULT_LABEL_KEYS
            .iter()
            .filter_map(|k| {
                register
                    .labels
                    .get(*k)
                    .map(|v| ((*k).to_owned(), v.clone()))
            })
            .chain([(MANAGED_LABEL.0.to_owned(), MANAGED_LABEL.1.to_owned())])
            .filter(|(k, v)| current.get(k) != Some(v))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let body = serde_json::json!({ "metadata": { "labels": wanted } });
        let node = self.api.patch_node_status(name, body).await?;
        self.view.observe_node(&node);
        Ok(())
    }

    /// Records kubelet's condition events (`NodeReady`, `NodeHasSufficientMemory`, …) for
    /// every condition whose status in `written` differs from `before` (what the apiserver
    /// held before the write), and with [`Reboot::Record`] kubelet's `Rebooted` event when
    /// the boot ID did. A condition new to the Node records its event too, except Ready, as
    /// kubelet's setters do when they append one. Then takes `written` into the view.
    async fn remember(
        &self,
        before: &NodeRecord,
        written: &Node,
        now: Timestamp,
        name: &str,
        reboot: Reboot,
    ) {
        for c in written
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
        {
            let held = before.conditions.get(&c.type_).map(|k| k.status.as_str());
            let reason = c.reason.as_deref().unwrap_or_default();
            if let Some((kind, reason)) = condition_event(&c.type_, &c.status, reason, held) {
                self.condition_event(name, kind, &reason, now).await;
            }
        }
        let boot = written
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.as_str());
        if let (Reboot::Record, Some(old), Some(new)) = (reboot, before.boot_id.as_deref(), boot)
            && !old.is_empty()
            && old != new
        {
            self.event(
                name,
                "Warning",
                "Rebooted",
                format!("Node {name} has been rebooted, boot id: {new}"),
                now,
            )
            .await;
        }
        self.view.observe_node(written);
    }

    /// kubelet `patchNodeStatus`: strategic-merge PATCH of `nodes/{name}/status`.
    pub(crate) async fn report(
        &self,
        w: &mut NodeWrites,
        name: &str,
        seq: u64,
        status: Option<&pb::NodeStatus>,
    ) -> Ack {
        let Some(status) = status else {
            return self.reject(
                seq,
                RejectReason::Malformed,
                "malformed: StatusReport without status".into(),
            );
        };
        if let Err(why) = validate_status(status)
            .and_then(|()| crate::restriction::validate_status_limits(status))
        {
            return self.reject(seq, RejectReason::Invalid, why);
        }
        let held = match self.ensure_known(w, name, seq).await {
            Ok(held) => held,
            Err(answer) => return answer,
        };
        let now = self.now();
        self.write_status(w, name, seq, status, &held, now, Reboot::Ignore)
            .await
    }

    /// An unchanged periodic status report (`StatusReport.unchanged`): what kubelet's
    /// periodic update amounts to when nothing changed, a PATCH that refreshes every
    /// condition's `lastHeartbeatTime` (kubelet's two-way merge patch of an unchanged node
    /// carries only those). Written only when the apiserver's conditions are the agent's
    /// (none `Unknown`): otherwise, or with no condition known, the answer asks for the
    /// whole status (`resend_status`) and nothing is written.
    pub(crate) async fn report_unchanged(&self, w: &mut NodeWrites, name: &str, seq: u64) -> Ack {
        let held = match self.ensure_known(w, name, seq).await {
            Ok(held) => held,
            Err(answer) => return answer,
        };
        // Only conditions the agent reports: others (a CNI's NetworkUnavailable) are not
        // ours. kubelet's four must all be there; a health condition is refreshed when the
        // Node has it (the last whole status had it: one it stopped reporting was deleted).
        let reported = |t: &str| {
            held.conditions
                .get(t)
                .is_some_and(|c| c.status.is_reported())
        };
        let as_reported = KUBELET_CONDITION_TYPES.iter().all(|t| reported(t));
        if !as_reported {
            return Ack {
                resend_status: true,
                ..ack(
                    seq,
                    AckCode::Retry,
                    "the apiserver's status differs: send it whole",
                )
            };
        }
        let now = patch::whole_seconds(self.now());
        let conditions: Vec<serde_json::Value> = KUBELET_CONDITION_TYPES
            .iter()
            .chain(HEALTH_CONDITION_TYPES.iter().filter(|t| reported(t)))
            .map(|t| serde_json::json!({ "type": t, "lastHeartbeatTime": Time(now) }))
            .collect();
        let body = serde_json::json!({ "status": { "conditions": conditions } });
        match self.api.patch_node_status(name, body).await {
            Ok(node) => {
                self.view.observe_node(&node);
                self.counters.status_reports.fetch_add(1, Ordering::Relaxed);
                ack(seq, AckCode::Ok, "")
            }
            Err(e) => match api_code(&e) {
                Some(404) => self.forget(w, name, seq),
                _ => ack(seq, AckCode::Retry, format!("patching node status: {e}")),
            },
        }
    }

    /// The status PATCH itself, diffed against `held`.
    #[allow(clippy::too_many_arguments)]
    async fn write_status(
        &self,
        w: &mut NodeWrites,
        name: &str,
        seq: u64,
        status: &pb::NodeStatus,
        held: &NodeRecord,
        now: Timestamp,
        reboot: Reboot,
    ) -> Ack {
        let conditions = patch::conditions(status, now, &held.conditions);
        // A health condition the agent no longer reports (turned off, or its signal gone
        // from the host) is deleted rather than left to look current.
        let dropped = HEALTH_CONDITION_TYPES.iter().copied().filter(|t| {
            held.conditions.contains_key(t) && !status.conditions.iter().any(|c| c.r#type == *t)
        });
        let body = match patch::status_patch(&patch::node_status(status, conditions), None)
            .map(|body| patch::delete_conditions(body, dropped))
        {
            Ok(b) => b,
            Err(e) => {
                return self.reject(
                    seq,
                    RejectReason::Malformed,
                    format!("cannot encode status: {e}"),
                );
            }
        };
        match self.api.patch_node_status(name, body).await {
            Ok(node) => {
                self.remember(held, &node, now, name, reboot).await;
                self.counters.status_reports.fetch_add(1, Ordering::Relaxed);
                ack(seq, AckCode::Ok, "")
            }
            Err(e) => match api_code(&e) {
                Some(404) => self.forget(w, name, seq),
                // The apiserver refuses the content itself: resending it will not help.
                Some(code @ (400 | 403 | 413 | 415 | 422)) => self.reject(
                    seq,
                    RejectReason::Invalid,
                    format!("apiserver refused the status ({code}): {e}"),
                ),
                _ => ack(seq, AckCode::Retry, format!("patching node status: {e}")),
            },
        }
    }

    /// renewTime from the gateway clock with microsecond precision, strictly after the last
    /// one written for this Lease: the node lifecycle controller counts a renewal only when
    /// its renewTime is later than the last one it saw (`tryUpdateNodeHealth`), and
    /// `MicroTime` carries exactly six fractional digits (`apimachinery/pkg/apis/meta/v1/
    /// micro_time.go`).
    fn renew_time(&self, w: &mut NodeWrites) -> Timestamp {
        let now = self.now();
        let micros = Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now);
        let t = match w.last_renew {
            Some(last) if micros <= last => last
                .checked_add(jiff::SignedDuration::from_micros(1))
                .unwrap_or(micros),
            _ => micros,
        };
        w.last_renew = Some(t);
        t
    }

    /// Raises the last renewTime known for this Lease to `t` (written by another replica or
    /// before a restart), so the next one is later still.
    fn saw_renew_time(w: &mut NodeWrites, t: Option<Timestamp>) {
        if let Some(t) = t
            && w.last_renew.is_none_or(|last| last < t)
        {
            w.last_renew = Some(t);
        }
    }

    /// kubelet's lease controller: PUT the Lease with a fresh renewTime and the
    /// resourceVersion of the last write (no GET on the happy path); on 409 or with nothing
    /// known, GET (or create when missing) and retry; up to 5 attempts, each started before
    /// `deadline`.
    ///
    /// The last write is known from the view (this replica's writes and the Lease watch) or
    /// from the agent's echoed `lease_state` (see [`LeaseState`]), whichever is newer. A
    /// Lease the view knows to hold more than kubelet sets (annotations, other labels) is
    /// read whole first, so the PUT drops nothing; the echo alone, with the view knowing
    /// nothing of the Lease, is trusted to be of a plain one (the gateway wrote it).
    pub(crate) async fn renew(
        &self,
        w: &mut NodeWrites,
        name: &str,
        seq: u64,
        duration: i32,
        lease_state: &[u8],
        deadline: Instant,
    ) -> Ack {
        if duration <= 0 {
            return self.reject(
                seq,
                RejectReason::Invalid,
                format!("leaseDurationSeconds must be > 0, got {duration}"),
            );
        }
        let uid = match self.ensure_known(w, name, seq).await {
            Ok(held) => held.uid,
            Err(answer) => return answer,
        };
        let now = self.now();
        // The echo is agent input: one from the future (beyond clock skew) is ignored.
        let mut echoed = LeaseState::decode(lease_state).filter(|s| {
            s.renew_time
                <= now
                    .checked_add(jiff::SignedDuration::from_secs(5))
                    .unwrap_or(now)
        });
        Self::saw_renew_time(w, echoed.as_ref().map(|s| s.renew_time));
        let mut held = self.view.lease(name);
        Self::saw_renew_time(w, held.as_ref().and_then(|h| h.renew_time));
        let mut last_error = String::new();
        for _ in 0..5 {
            let Some(budget) = deadline
                .checked_duration_since(Instant::now())
                .filter(|b| !b.is_zero())
            else {
                last_error = "too late to write this renewal; waiting for a fresh one".into();
                break;
            };
            let held_now = held.take();
            let held_time = held_now.as_ref().and_then(|h| h.renew_time);
            // What to PUT against: the newer of the view and the echo, rebuilt when the
            // Lease is plain; otherwise (or with nothing known) read it.
            let rebuilt = match (held_now, echoed.take(), uid.as_deref()) {
                (held, Some(state), Some(uid))
                    if held.as_ref().is_none_or(|h| h.plain)
                        && held.as_ref().map(|h| &*h.resource_version)
                            != Some(state.resource_version.as_str())
                        && held_time.is_none_or(|t| t < state.renew_time) =>
                {
                    Some(rebuilt_lease(
                        name,
                        uid,
                        duration,
                        &state.resource_version,
                        Some(state.renew_time),
                    ))
                }
                (Some(h), _, Some(uid)) if h.plain => Some(rebuilt_lease(
                    name,
                    uid,
                    duration,
                    &h.resource_version,
                    h.renew_time,
                )),
                _ => None,
            };
            let base = match rebuilt {
                Some(lease) => lease,
                None => match tokio::time::timeout(budget, self.api.get_lease_opt(name)).await {
                    Ok(Ok(Some(lease))) => {
                        self.view.observe_lease(&lease);
                        Self::saw_renew_time(
                            w,
                            lease
                                .spec
                                .as_ref()
                                .and_then(|s| s.renew_time.as_ref())
                                .map(|t| t.0),
                        );
                        lease
                    }
                    Ok(Ok(None)) => return self.create_lease(w, name, seq, duration).await,
                    Ok(Err(e)) => {
                        last_error = format!("reading lease: {e}");
                        continue;
                    }
                    Err(_) => {
                        last_error = "reading lease: deadline passed".into();
                        break;
                    }
                },
            };
            let renew = self.renew_time(w);
            let lease = patch::renewed_lease(base, name, uid.as_deref(), duration, renew);
            match tokio::time::timeout(budget, self.api.replace_lease(name, &lease)).await {
                Ok(Ok(written)) => return self.renewed(w, name, seq, &written, renew),
                Ok(Err(e)) => {
                    last_error = format!("updating lease: {e}");
                    match api_code(&e) {
                        // Conflict or gone: fall back to GET (kubelet backoffEnsureLease).
                        Some(409) | Some(404) => continue,
                        _ => break,
                    }
                }
                Err(_) => {
                    last_error = "updating lease: deadline passed".into();
                    break;
                }
            }
        }
        self.counters.lease_failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(node = name, error = %last_error, "lease renewal failed");
        ack(seq, AckCode::Retry, last_error)
    }

    fn renewed(
        &self,
        w: &mut NodeWrites,
        name: &str,
        seq: u64,
        written: &Lease,
        renew: Timestamp,
    ) -> Ack {
        let state = LeaseState {
            resource_version: written
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default(),
            renew_time: renew,
        };
        self.view.observe_lease(written);
        self.counters.lease_renewals.fetch_add(1, Ordering::Relaxed);
        w.series
            .lease_age
            .get_or_insert_with(|| self.node_metrics.lease_age(name))
            .renewed(renew);
        Ack {
            lease_state: state.encode(),
            ..ack(seq, AckCode::Ok, "")
        }
    }

    /// Makes sure the view knows the node as the apiserver has it ([`Self::known`]);
    /// otherwise one Node GET — the first time a replica without a Node watch sees a node,
    /// or when its knowledge is older than `knowledge_ttl`, or a node the watch has not
    /// delivered yet. An `Unknown` condition found there (the controller's, after an
    /// outage) makes the next ack ask the agent for a full status report, so the node is
    /// Ready again within seconds, not at the next report period.
    ///
    /// Errors: the [`Ack`] to answer with — `node_not_found` when the Node does not exist.
    async fn ensure_known(
        &self,
        w: &mut NodeWrites,
        name: &str,
        seq: u64,
    ) -> Result<NodeRecord, Ack> {
        if let Some(held) = self.known(w, name) {
            return Ok(held);
        }
        match self.api.get_node_opt(name).await {
            Ok(Some(node)) => {
                self.view.observe_node(&node);
                w.registered = true;
                Ok(NodeRecord::of(&node))
            }
            Ok(None) => Err(self.forget(w, name, seq)),
            Err(e) => Err(ack(seq, AckCode::Retry, format!("reading node: {e}"))),
        }
    }

    /// The Node is gone although the agent registered it (only a registered agent sends
    /// what leads here): someone deleted it. Forget it, and tell the agent, which stops
    /// sending until restarted instead of creating it again (kubelet registers once per
    /// process: `registrationCompleted` in `pkg/kubelet/kubelet_node_status.go`).
    fn forget(&self, w: &mut NodeWrites, name: &str, seq: u64) -> Ack {
        w.registered = false;
        self.view.forget_node(name);
        self.view.forget_lease(name);
        self.counters
            .nodes_not_found
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            node = name,
            "the Node was deleted; its agent stops until it is restarted"
        );
        Ack {
            node_not_found: true,
            ..ack(
                seq,
                AckCode::Retry,
                "node not found: it was deleted; restart the agent to register it again",
            )
        }
    }

    /// Creates the Lease with an ownerReference to the Node, whose UID is read fresh (kubelet
    /// `SetNodeOwnerFunc`): a cached UID could belong to a deleted Node, and the garbage
    /// collector would delete the new Lease at once.
    async fn create_lease(&self, w: &mut NodeWrites, name: &str, seq: u64, duration: i32) -> Ack {
        let uid = match self.api.get_node(name).await {
            Ok(node) => {
                self.view.observe_node(&node);
                match node.metadata.uid {
                    Some(uid) => uid,
                    None => return ack(seq, AckCode::Retry, "node has no uid yet"),
                }
            }
            Err(e) if api_code(&e) == Some(404) => return self.forget(w, name, seq),
            // kubelet skips creation this round when the owner Node cannot be read.
            Err(e) => {
                return ack(
                    seq,
                    AckCode::Retry,
                    format!("reading node for the lease owner: {e}"),
                );
            }
        };
        let renew = self.renew_time(w);
        match self
            .api
            .create_lease(&patch::new_lease(name, &uid, duration, renew))
            .await
        {
            Ok(created) => self.renewed(w, name, seq, &created, renew),
            Err(e) => {
                self.counters.lease_failures.fetch_add(1, Ordering::Relaxed);
                ack(seq, AckCode::Retry, format!("creating lease: {e}"))
            }
        }
    }

    /// kubelet `recordNodeStatusEvent`: a `Normal` event `reason` with "Node X status is now:
    /// reason".
    async fn condition_event(&self, name: &str, kind: &str, reason: &str, now: Timestamp) {
        self.event(
            name,
            kind,
            reason,
            format!("Node {name} status is now: {reason}"),
            now,
        )
        .await;
    }

    async fn event(&self, name: &str, type_: &str, reason: &str, message: String, now: Timestamp) {
        let unique = self.event_seq.fetch_add(1, Ordering::Relaxed);
        let event = patch::node_event(name, type_, reason, message, now, unique);
        if let Err(error) = self.api.create_event(name, &event).await {
            tracing::warn!(node = name, reason, %error, "could not record event");
        }
    }
}

/// A plain node Lease (see [`crate::view::LeaseRecord::plain`]) rebuilt from what the view
/// or the agent's echo holds, at `resource_version`.
fn rebuilt_lease(
    name: &str,
    uid: &str,
    duration: i32,
    resource_version: &str,
    renew_time: Option<Timestamp>,
) -> Lease {
    let mut lease = patch::new_lease(name, uid, duration, renew_time.unwrap_or_default());
    lease.metadata.resource_version = Some(resource_version.to_owned());
    lease
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_state_round_trips_and_rejects_garbage() {
        let state = LeaseState {
            resource_version: "884213".into(),
            renew_time: "2026-11-21T10:00:00.123456Z".parse().unwrap(),
        };
        let bytes = state.encode();
        assert_eq!(bytes.len(), 14, "8 bytes of time + the resourceVersion");
        assert_eq!(LeaseState::decode(&bytes), Some(state));
        assert_eq!(LeaseState::decode(&[]), None);
        assert_eq!(LeaseState::decode(&[0; 8]), None, "no resourceVersion");
        assert_eq!(LeaseState::decode(&[0; 80]), None, "too long");
        let mut bad = vec![0; 8];
        bad.extend_from_slice(&[0xff, 0xfe]);
        assert_eq!(LeaseState::decode(&bad), None, "not UTF-8");
    }

    #[test]
    fn events_follow_kubelets_setters() {
        let r = condition_event_reason;
        let health =
            |status, reason, before| condition_event("ThermalPressure", status, reason, before);
        assert_eq!(
            health("True", "TemperatureAboveTripPoint", None),
            Some(("Warning", "TemperatureAboveTripPoint".to_owned()))
        );
        assert_eq!(
            health("False", "TemperatureNormal", None),
            None,
            "new and fine"
        );
        assert_eq!(
            health("False", "TemperatureNormal", Some("True")),
            Some(("Normal", "TemperatureNormal".to_owned()))
        );
        assert_eq!(health("True", "CPUThermallyThrottled", Some("True")), None);
        assert_eq!(
            r("MemoryPressure", "False", None),
            Some("NodeHasSufficientMemory")
        );
        assert_eq!(
            r("Ready", "True", None),
            None,
            "a new Ready records nothing"
        );
        assert_eq!(r("Ready", "True", Some("Unknown")), Some("NodeReady"));
        assert_eq!(
            r("DiskPressure", "True", Some("False")),
            Some("NodeHasDiskPressure")
        );
        assert_eq!(r("PIDPressure", "False", Some("False")), None, "unchanged");
    }

    #[test]
    fn only_kubelets_and_the_health_conditions_are_accepted() {
        let cond = |t: &str, s: &str, r: &str| pb::NodeCondition {
            r#type: t.into(),
            status: s.into(),
            reason: r.into(),
            ..Default::default()
        };
        let status = |c: Vec<pb::NodeCondition>| pb::NodeStatus {
            conditions: c,
            ..Default::default()
        };
        assert!(validate_status(&status(vec![cond("Ready", "True", "KubeletReady")])).is_ok());
        assert!(
            validate_status(&status(vec![cond(
                "ReadonlyFilesystem",
                "True",
                "FilesystemIsReadOnly"
            )]))
            .is_ok()
        );
        for bad in [
            vec![cond("NetworkUnavailable", "False", "RouteCreated")],
            vec![cond("Ready", "Unknown", "KubeletReady")],
            vec![cond("Ready", "True", "")],
            vec![cond("Ready", "True", "A"), cond("Ready", "False", "B")],
        ] {
            assert!(validate_status(&status(bad.clone())).is_err(), "{bad:?}");
        }
    }
}
