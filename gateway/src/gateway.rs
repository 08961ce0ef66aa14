//! The gateway core: checks each agent message (shape, identity, boot, sequence, freshness)
//! and writes Node, status and Lease through kube-rs exactly as kubelet would.
//!
//! Per node it keeps a small state slot (boot ID, last sequence number, the Lease returned by
//! the last write, the conditions the apiserver holds); one node's messages are handled one
//! at a time, different nodes concurrently. The slot is a cache of the apiserver: it is
//! refreshed with one Node GET when this gateway has not written for the node within
//! [`GatewayOptions::knowledge_ttl`], because the node lifecycle controller may have set the
//! node Unknown meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use edgebeat_hw::Clock;
use edgebeat_proto::{self as pb, Ack, AckCode, agent_message::Kind};
use edgebeat_transports::ingress::{Handler, Peer};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};
use tokio::time::Instant;

use crate::admission::{
    AdmissionPolicy, NodeAdmission, Posture, Provenance, Verdict, check_identity,
};
use crate::apiserver::{Apiserver, WriteLimits};
use crate::metrics::{NodeMetrics, NodeSeries, RejectReason, clock_skew_seconds};
use crate::patch::{self, KnownCondition};

/// Gateway behaviour settings.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// Oldest heartbeat (Lease renewal or status report) still written, measured on the
    /// agent's boot clock against the freshest message seen from that boot (default 5 s).
    /// Older ones are dropped, never written late: a late heartbeat would hide a dead node
    /// (the node lifecycle controller stamps a renewal with its own clock,
    /// `pkg/controller/nodelifecycle/node_lifecycle_controller.go: tryUpdateNodeHealth`). A
    /// renewal whose write cannot start within this budget is abandoned too.
    pub max_renewal_age: Duration,
    /// Clock-drift allowance for that measurement, in parts per million (default 1000).
    pub drift_ppm: u64,
    /// How long this gateway trusts what it knows of a node without writing to it (default
    /// 40 s, the node lifecycle controller's grace period before it writes Unknown). Past
    /// that, the next message costs one Node GET.
    pub knowledge_ttl: Duration,
    /// Messages per second one node may send on average (default 2; a kubelet-like node
    /// sends about 0.1). Beyond it messages are rejected before any apiserver call.
    pub per_node_rate: f64,
    /// Burst of messages one node may send at once (default 20: a reconnect sends a
    /// Register, a status report and a renewal, and retries up to 5 times each).
    pub per_node_burst: f64,
    /// Write as each node (`Impersonate-User: system:node:<name>`, `Impersonate-Group:
    /// system:nodes`; default false), so the apiserver's Node authorizer and NodeRestriction
    /// apply too. See [`crate::apiserver`].
    pub impersonate_nodes: bool,
    /// Whether messages without a node identity are let in (default
    /// [`Posture::Identified`]: they are refused, whichever ingress carried them).
    pub posture: Posture,
    /// Most nodes this replica keeps state for (default 10,000). A message for a further
    /// node is refused ([`RejectReason::FleetFull`], logged, counted) before anything is
    /// allocated for it, so made-up node names cannot grow the gateway's memory without
    /// bound; size it to the fleet a replica serves.
    pub max_nodes: usize,
    /// How long a superseded boot ID's messages are refused (default 30 s: the default
    /// lease duration less one renew interval). See [`crate::admission`].
    pub old_boot_memory: Duration,
    /// Apiserver calls in flight at once, Lease calls first (see [`crate::apiserver`]).
    pub write_limits: WriteLimits,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        Self {
            max_renewal_age: Duration::from_secs(5),
            drift_ppm: 1000,
            knowledge_ttl: Duration::from_secs(40),
            per_node_rate: 2.0,
            per_node_burst: 20.0,
            impersonate_nodes: false,
            posture: Posture::Identified,
            max_nodes: DEFAULT_MAX_NODES,
            old_boot_memory: Duration::from_secs(30),
            write_limits: WriteLimits::default(),
        }
    }
}

/// Default [`GatewayOptions::max_nodes`].
pub const DEFAULT_MAX_NODES: usize = 10_000;

impl GatewayOptions {
    fn admission(&self) -> AdmissionPolicy {
        AdmissionPolicy {
            posture: self.posture,
            max_age: self.max_renewal_age,
            drift_ppm: self.drift_ppm,
            rate: self.per_node_rate,
            burst: self.per_node_burst,
            old_boot_memory: self.old_boot_memory,
        }
    }
}

/// Counters the gateway keeps, for logs, tests and `/metrics` (see [`crate::metrics`]).
#[derive(Debug, Default)]
pub struct Counters {
    /// Lease renewals written.
    pub lease_renewals: AtomicU64,
    /// Lease renewals that could not be written (apiserver errors, too late to write).
    pub lease_failures: AtomicU64,
    /// Heartbeats (renewals and status reports) dropped as stale.
    pub stale_renewals: AtomicU64,
    /// Status PATCHes written.
    pub status_reports: AtomicU64,
    /// Messages rejected, by [`RejectReason`] (indexed by `RejectReason as usize`); see
    /// [`Counters::rejections`] and [`Counters::rejected`].
    pub rejected_by_reason: [AtomicU64; RejectReason::ALL.len()],
    /// Nodes created or reconciled.
    pub registrations: AtomicU64,
}

impl Counters {
    /// Counts one rejection for `why`.
    pub fn count_rejection(&self, why: RejectReason) {
        self.rejected_by_reason[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Rejections counted so far, all reasons.
    pub fn rejected(&self) -> u64 {
        RejectReason::ALL
            .iter()
            .map(|why| self.rejections(*why))
            .sum()
    }

    /// Rejections counted for `why` so far.
    pub fn rejections(&self, why: RejectReason) -> u64 {
        self.rejected_by_reason[why as usize].load(Ordering::Relaxed)
    }
}

/// A node silent this long loses its slot (what the gateway knows is re-read on its next
/// message): keeps memory bounded by the nodes actually heard from.
const SLOT_IDLE: Duration = Duration::from_secs(15 * 60);

/// Idle slots are swept once per this many messages.
const SWEEP_EVERY: u64 = 4096;

#[derive(Default)]
struct NodeSlot {
    /// Last message for this node; idle slots are evicted after [`SLOT_IDLE`].
    last_seen: Option<Instant>,
    /// Boot, sequence, identity, rate limit and freshness ([`crate::admission`]).
    admission: NodeAdmission,
    /// The slot reflects the apiserver (set by registration or a Node GET).
    registered: bool,
    /// Last successful write for this node; knowledge older than `knowledge_ttl` is stale.
    last_write: Option<Instant>,
    /// Ask the agent for a full status report with the next ack.
    resend_status: bool,
    uid: Option<String>,
    /// nodeInfo.bootID the apiserver holds (for the Rebooted event).
    known_boot_id: Option<String>,
    latest_lease: Option<Lease>,
    last_renew: Option<Timestamp>,
    conditions: BTreeMap<String, KnownCondition>,
    /// This node's per-node metric series (removed with the slot).
    series: NodeSeries,
}

/// The gateway: a [`Handler`] for every transport.
pub struct Gateway {
    api: Apiserver,
    clock: Arc<dyn Clock>,
    options: GatewayOptions,
    started: Instant,
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<NodeSlot>>>>,
    /// Messages refused because [`GatewayOptions::max_nodes`] was reached (for the log).
    fleet_full: AtomicU64,
    /// When the slots were last swept because they were full.
    last_full_sweep: Mutex<Instant>,
    event_seq: AtomicU64,
    messages: AtomicU64,
    /// Counters of what the gateway did.
    pub counters: Arc<Counters>,
    node_metrics: NodeMetrics,
}

fn ack(seq: u64, code: AckCode, reason: impl Into<String>) -> Ack {
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

/// Condition types the agent may report; anything else (NetworkUnavailable, made-up types)
/// is refused: the gateway never writes a condition kubelet would not.
const CONDITION_TYPES: [&str; 4] = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"];

/// Checks a reported NodeStatus: only kubelet's four conditions, each at most once, each
/// True or False (Unknown belongs to the node lifecycle controller), with a reason.
///
/// Errors: a message naming the offending condition.
pub fn validate_status(status: &pb::NodeStatus) -> Result<(), String> {
    let mut seen = Vec::with_capacity(4);
    for c in &status.conditions {
        if !CONDITION_TYPES.contains(&c.r#type.as_str()) {
            return Err(format!(
                "malformed: condition type {:?} is not one kubelet reports",
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

impl Gateway {
    /// A gateway writing through `client` (whose rate limit bounds apiserver QPS), stamping
    /// times from `clock`.
    pub fn new(client: kube::Client, clock: Arc<dyn Clock>, options: GatewayOptions) -> Self {
        Self {
            api: Apiserver::with_limits(client, options.impersonate_nodes, options.write_limits),
            node_metrics: NodeMetrics::new(clock.clone()),
            clock,
            options,
            started: Instant::now(),
            slots: Mutex::new(HashMap::new()),
            fleet_full: AtomicU64::new(0),
            last_full_sweep: Mutex::new(Instant::now()),
            event_seq: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            counters: Arc::new(Counters::default()),
        }
    }

    /// The slot of node `name`, made if there is room for it (fewer than
    /// [`GatewayOptions::max_nodes`] slots, after dropping idle ones); `None` otherwise.
    fn slot(&self, name: &str) -> Option<Arc<tokio::sync::Mutex<NodeSlot>>> {
        let mut slots = match self.slots.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if self.messages.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            self.sweep(&mut slots);
        }
        if let Some(slot) = slots.get(name) {
            return Some(slot.clone());
        }
        if slots.len() >= self.options.max_nodes {
            // At most one scan of the whole map per second: a flood of new names must not
            // cost a scan each.
            let mut last = self
                .last_full_sweep
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.elapsed() >= Duration::from_secs(1) {
                *last = Instant::now();
                drop(last);
                self.sweep(&mut slots);
            }
            if slots.len() >= self.options.max_nodes {
                return None;
            }
        }
        Some(slots.entry(name.to_owned()).or_default().clone())
    }

    /// Drops the slots of nodes silent for [`SLOT_IDLE`]. A slot in use (locked) is never
    /// idle; try_lock skips it. An evicted node's metric series go with it.
    fn sweep(&self, slots: &mut HashMap<String, Arc<tokio::sync::Mutex<NodeSlot>>>) {
        let now = Instant::now();
        slots.retain(|name, slot| {
            let keep = slot.try_lock().map_or(true, |s| {
                s.last_seen
                    .is_some_and(|t| now.duration_since(t) < SLOT_IDLE)
            });
            if !keep {
                self.node_metrics.remove(name);
            }
            keep
        });
    }

    /// Registers the gateway's metrics (see [`crate::metrics`]) in `registry`: the
    /// [`Counters`] and `tracked_nodes` through a collector read at scrape time (it holds a
    /// weak reference: a dropped gateway reports nothing), and the per-node families.
    pub fn register_metrics(self: &Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(GatewayCollector(Arc::downgrade(self))));
        registry.register_with_unit(
            "edgebeat_gateway_node_lease_age",
            "Gateway wall clock minus the renewTime this replica last wrote for the node's Lease",
            Unit::Seconds,
            self.node_metrics.lease_age.clone(),
        );
        registry.register_with_unit(
            "edgebeat_gateway_node_clock_skew",
            "Gateway wall clock minus the agent's header wall time at receipt of its last accepted message; positive when the agent's clock is behind",
            Unit::Seconds,
            self.node_metrics.clock_skew.clone(),
        );
    }

    /// Number of nodes the gateway currently keeps state for.
    pub fn tracked_nodes(&self) -> usize {
        match self.slots.lock() {
            Ok(g) => g.len(),
            Err(poisoned) => poisoned.into_inner().len(),
        }
    }

    fn now(&self) -> Timestamp {
        Timestamp::try_from(self.clock.now()).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn reject(&self, seq: u64, why: RejectReason, reason: String) -> Ack {
        self.counters.count_rejection(why);
        tracing::warn!(why = why.as_str(), %reason, "message rejected");
        ack(seq, AckCode::Rejected, reason)
    }

    /// Refuses a message for a node this replica has no room for; logs the first refusal
    /// and every 1,000th after it (a fleet too large for one replica is an operator's
    /// problem to see, not a log flood).
    fn fleet_full(&self, seq: u64, name: &str) -> Ack {
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
        ack(
            seq,
            AckCode::Retry,
            format!(
                "this gateway replica is full ({} nodes)",
                self.options.max_nodes
            ),
        )
    }

    async fn handle_message(&self, peer: &Peer, message: pb::AgentMessage) -> Ack {
        let Some(header) = message.header() else {
            return self.reject(
                0,
                RejectReason::Malformed,
                "malformed: no header or unknown message kind".into(),
            );
        };
        let seq = header.seq;
        let name = header.node_name.as_str();
        let provenance = Provenance {
            identity: peer.identity.as_deref(),
            wall_time_verified: peer.wall_time_verified,
        };
        // Stateless checks first: nothing is allocated for a message that fails them.
        if let Err(refusal) = check_identity(self.options.posture, name, provenance) {
            return self.reject(seq, refusal.reason, refusal.detail);
        }
        let received = Instant::now();
        let received_wall = self.clock.now();
        let agent_wall_ms = header.wall_time_ms;
        let Some(slot) = self.slot(name) else {
            return self.fleet_full(seq, name);
        };
        let mut slot = slot.lock().await;
        let heartbeat = matches!(message.kind, Some(Kind::Lease(_) | Kind::Status(_)));
        let policy = self.options.admission();
        let age = match slot.admission.admit(
            &policy,
            header,
            provenance,
            heartbeat,
            self.started,
            received,
        ) {
            // Only admitted messages keep a slot alive: refused ones must not keep state
            // (or a lockout) from being swept.
            Verdict::Admit(admitted) => {
                slot.last_seen = Some(received);
                admitted.age
            }
            Verdict::Reject(refusal) => return self.reject(seq, refusal.reason, refusal.detail),
            Verdict::Stale(age) => {
                slot.last_seen = Some(received);
                self.counters.stale_renewals.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    node = name,
                    ?age,
                    kind = message.kind_name(),
                    "dropping a stale heartbeat"
                );
                return ack(seq, AckCode::Rejected, format!("stale: {age:?} old"));
            }
        };
        if slot.registered
            && slot
                .last_write
                .is_none_or(|t| received.duration_since(t) > self.options.knowledge_ttl)
        {
            // The controller may have written Unknown since: learn the node again.
            slot.registered = false;
        }
        // Only messages that passed the replay and staleness checks: an old one would read
        // as skew.
        if let Some(skew) = clock_skew_seconds(received_wall, agent_wall_ms) {
            slot.series
                .clock_skew
                .get_or_insert_with(|| self.node_metrics.clock_skew(name))
                .set(skew);
        }
        // Writes must start before the heartbeat would be stale (at least half a second, so a
        // fresh one always gets its attempt).
        let deadline = received
            + self
                .options
                .max_renewal_age
                .saturating_sub(age)
                .max(Duration::from_millis(500));
        let mut answer = match &message.kind {
            Some(Kind::Register(register)) => self.register(&mut slot, name, seq, register).await,
            Some(Kind::Status(report)) => {
                self.report(&mut slot, name, seq, report.status.as_ref())
                    .await
            }
            Some(Kind::Lease(renewal)) => {
                self.renew(
                    &mut slot,
                    name,
                    seq,
                    renewal.lease_duration_seconds,
                    &renewal.lease_state,
                    deadline,
                )
                .await
            }
            None => self.reject(
                seq,
                RejectReason::Malformed,
                "malformed: unknown message kind".into(),
            ),
        };
        if AckCode::try_from(answer.code) == Ok(AckCode::Ok) {
            slot.last_write = Some(Instant::now());
            if slot.resend_status {
                slot.resend_status = false;
                answer.resend_status = true;
            }
        }
        answer
    }

    /// kubelet `registerWithAPIServer`: POST the Node (unless `skip_create`, kubelet's
    /// `registerNode: false`); on AlreadyExists GET it and reconcile the default labels
    /// (PATCH only if they differ); emit `Rebooted` when the boot ID changed.
    async fn register(
        &self,
        slot: &mut NodeSlot,
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
            .and_then(|()| crate::restriction::validate_register(register))
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
        if slot.registered && slot.known_boot_id.as_deref() == Some(new_boot) {
            return registered(AckCode::Ok);
        }
        let now = self.now();
        let existing = if register.skip_create {
            match self.api.get_node_opt(name).await {
                Ok(Some(node)) => node,
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
            let conditions = patch::conditions(status, seq, now, &slot.conditions);
            let node = patch::initial_node(name, register, patch::node_status(status, conditions));
            match self.api.create_node(&node).await {
                Ok(created) => {
                    slot.uid = created.metadata.uid.clone();
                    self.remember(slot, &created, now, name).await;
                    slot.known_boot_id = Some(new_boot.to_owned());
                    slot.registered = true;
                    self.counters.registrations.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(node = name, "registered node");
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
        seed(slot, &existing);
        if let Err(e) = self.reconcile_labels(name, &existing, register).await {
            return ack(seq, AckCode::Retry, format!("reconciling node labels: {e}"));
        }
        self.observe_boot(slot, name, new_boot, now).await;
        slot.registered = true;
        self.counters.registrations.fetch_add(1, Ordering::Relaxed);
        registered(AckCode::Ok)
    }

    /// kubelet's reboot detection (`MachineInfo` setter): a Warning `Rebooted` event when
    /// the boot ID differs from the one the apiserver holds.
    async fn observe_boot(&self, slot: &mut NodeSlot, name: &str, boot: &str, now: Timestamp) {
        if let Some(old) = slot.known_boot_id.as_deref()
            && !old.is_empty()
            && old != boot
        {
            self.event(
                name,
                "Warning",
                "Rebooted",
                format!("Node {name} has been rebooted, boot id: {boot}"),
                now,
            )
            .await;
        }
        slot.known_boot_id = Some(boot.to_owned());
    }

    /// kubelet `updateDefaultLabels`: force the labels kubelet computes (hostname, os, arch
    /// and their beta forms) to the agent's values; patch only when something differs.
    async fn reconcile_labels(
        &self,
        name: &str,
        existing: &Node,
        register: &pb::Register,
    ) -> Result<(), kube::Error> {
        const DEFAULT_LABELS: [&str; 5] = [
            "kubernetes.io/hostname",
            "kubernetes.io/os",
            "kubernetes.io/arch",
            "beta.kubernetes.io/os",
            "beta.kubernetes.io/arch",
        ];
        let current = existing.metadata.labels.clone().unwrap_or_default();
        let wanted: BTreeMap<String, String> = DEFAULT_LABELS
            .iter()
            .filter_map(|k| {
                register
                    .labels
                    .get(*k)
                    .map(|v| ((*k).to_owned(), v.clone()))
            })
            .filter(|(k, v)| current.get(k) != Some(v))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let body = serde_json::json!({ "metadata": { "labels": wanted } });
        self.api.patch_node_status(name, body).await.map(|_| ())
    }

    /// Takes what the apiserver returned after a write as this replica's knowledge, and
    /// records kubelet's condition events (`NodeReady`, `NodeHasSufficientMemory`, …) for
    /// every condition whose status changed from what was known. A condition seen for the
    /// first time records nothing, as kubelet's setters do when they append one.
    async fn remember(&self, slot: &mut NodeSlot, written: &Node, now: Timestamp, name: &str) {
        for c in written
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
        {
            let Some(known) = slot.conditions.get(&c.type_) else {
                continue;
            };
            if known.status != c.status
                && let Some(reason) = transition_reason(&c.type_, &c.status)
            {
                self.event(
                    name,
                    "Normal",
                    reason,
                    format!("Node {name} status is now: {reason}"),
                    now,
                )
                .await;
            }
        }
        seed_conditions(slot, written);
    }

    /// kubelet `patchNodeStatus`: strategic-merge PATCH of `nodes/{name}/status`.
    async fn report(
        &self,
        slot: &mut NodeSlot,
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
        if let Err(answer) = self.ensure_known(slot, name, seq).await {
            return answer;
        }
        let now = self.now();
        let conditions = patch::conditions(status, seq, now, &slot.conditions);
        let body = match patch::status_patch(&patch::node_status(status, conditions), None) {
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
                slot.uid = node.metadata.uid.clone().or(slot.uid.take());
                self.remember(slot, &node, now, name).await;
                if let Some(info) = &status.node_info {
                    self.observe_boot(slot, name, &info.boot_id, now).await;
                }
                // This report is the full status: nothing left to resend.
                slot.resend_status = false;
                self.counters.status_reports.fetch_add(1, Ordering::Relaxed);
                ack(seq, AckCode::Ok, "")
            }
            Err(e) => match api_code(&e) {
                Some(404) => self.forget(slot, seq),
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
    fn renew_time(&self, slot: &mut NodeSlot) -> Timestamp {
        let now = self.now();
        let micros = Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now);
        let t = match slot.last_renew {
            Some(last) if micros <= last => last
                .checked_add(jiff::SignedDuration::from_micros(1))
                .unwrap_or(micros),
            _ => micros,
        };
        slot.last_renew = Some(t);
        t
    }

    /// Raises the last renewTime known for this Lease to `t` (written by another replica or
    /// before a restart), so the next one is later still.
    fn saw_renew_time(slot: &mut NodeSlot, t: Option<Timestamp>) {
        if let Some(t) = t
            && slot.last_renew.is_none_or(|last| last < t)
        {
            slot.last_renew = Some(t);
        }
    }

    /// kubelet's lease controller: PUT the Lease with a fresh renewTime and the
    /// resourceVersion of the last write (no GET on the happy path); on 409 or with nothing
    /// known, GET (or create when missing) and retry; up to 5 attempts, each started before
    /// `deadline`.
    ///
    /// The last write is known from this replica's cache or from the agent's echoed
    /// `lease_state` (see [`LeaseState`]), whichever is newer.
    async fn renew(
        &self,
        slot: &mut NodeSlot,
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
        if let Err(answer) = self.ensure_known(slot, name, seq).await {
            return answer;
        }
        let now = self.now();
        // The echo is agent input: one from the future (beyond clock skew) is ignored.
        let mut echoed = LeaseState::decode(lease_state).filter(|s| {
            s.renew_time
                <= now
                    .checked_add(jiff::SignedDuration::from_secs(5))
                    .unwrap_or(now)
        });
        Self::saw_renew_time(slot, echoed.as_ref().map(|s| s.renew_time));
        let mut last_error = String::new();
        for _ in 0..5 {
            let Some(budget) = deadline
                .checked_duration_since(Instant::now())
                .filter(|b| !b.is_zero())
            else {
                last_error = "too late to write this renewal; waiting for a fresh one".into();
                break;
            };
            let cached = slot.latest_lease.take();
            let cached_time = cached
                .as_ref()
                .and_then(|l| l.spec.as_ref()?.renew_time.as_ref())
                .map(|t| t.0);
            let base = match (cached, echoed.take(), slot.uid.clone()) {
                // The echo is newer than this replica's cache: another replica wrote last.
                (cached, Some(state), Some(uid))
                    if cached
                        .as_ref()
                        .and_then(|l| l.metadata.resource_version.as_deref())
                        != Some(state.resource_version.as_str())
                        && cached_time.is_none_or(|t| t < state.renew_time) =>
                {
                    let mut lease = patch::new_lease(name, &uid, duration, state.renew_time);
                    lease.metadata.resource_version = Some(state.resource_version);
                    lease
                }
                (Some(lease), _, _) => lease,
                (None, _, _) => {
                    match tokio::time::timeout(budget, self.api.get_lease_opt(name)).await {
                        Ok(Ok(Some(lease))) => {
                            Self::saw_renew_time(
                                slot,
                                lease
                                    .spec
                                    .as_ref()
                                    .and_then(|s| s.renew_time.as_ref())
                                    .map(|t| t.0),
                            );
                            lease
                        }
                        Ok(Ok(None)) => return self.create_lease(slot, name, seq, duration).await,
                        Ok(Err(e)) => {
                            last_error = format!("reading lease: {e}");
                            continue;
                        }
                        Err(_) => {
                            last_error = "reading lease: deadline passed".into();
                            break;
                        }
                    }
                }
            };
            let renew = self.renew_time(slot);
            let lease = patch::renewed_lease(base, name, slot.uid.as_deref(), duration, renew);
            match tokio::time::timeout(budget, self.api.replace_lease(name, &lease)).await {
                Ok(Ok(written)) => return self.renewed(slot, name, seq, written, renew),
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
        slot: &mut NodeSlot,
        name: &str,
        seq: u64,
        written: Lease,
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
        slot.latest_lease = Some(written);
        self.counters.lease_renewals.fetch_add(1, Ordering::Relaxed);
        slot.series
            .lease_age
            .get_or_insert_with(|| self.node_metrics.lease_age(name))
            .renewed(renew);
        Ack {
            lease_state: state.encode(),
            ..ack(seq, AckCode::Ok, "")
        }
    }

    /// Makes sure this replica knows the node as the apiserver has it: a Node GET the first
    /// time it sees a node it did not register (after a restart, or when a shared
    /// subscription hands it another replica's node) and when its knowledge is older than
    /// `knowledge_ttl`. Seeds the UID, boot ID and condition times; when the apiserver holds
    /// an Unknown condition (the controller's, after an outage) the next ack asks the agent
    /// for a full status report, so the node is Ready again within seconds, not at the next
    /// report period.
    ///
    /// Errors: the [`Ack`] to answer with — `register_again` when the Node does not exist.
    async fn ensure_known(&self, slot: &mut NodeSlot, name: &str, seq: u64) -> Result<(), Ack> {
        if slot.registered {
            return Ok(());
        }
        match self.api.get_node_opt(name).await {
            Ok(Some(node)) => {
                seed(slot, &node);
                if slot.conditions.values().any(|c| c.status == "Unknown") {
                    slot.resend_status = true;
                }
                slot.registered = true;
                Ok(())
            }
            Ok(None) => Err(self.forget(slot, seq)),
            Err(e) => Err(ack(seq, AckCode::Retry, format!("reading node: {e}"))),
        }
    }

    /// The Node is gone: forget it and ask the agent to register again.
    fn forget(&self, slot: &mut NodeSlot, seq: u64) -> Ack {
        slot.registered = false;
        slot.uid = None;
        slot.latest_lease = None;
        slot.conditions.clear();
        Ack {
            register_again: true,
            ..ack(seq, AckCode::Retry, "node not found: register first")
        }
    }

    /// Creates the Lease with an ownerReference to the Node, whose UID is read fresh (kubelet
    /// `SetNodeOwnerFunc`): a cached UID could belong to a deleted Node, and the garbage
    /// collector would delete the new Lease at once.
    async fn create_lease(&self, slot: &mut NodeSlot, name: &str, seq: u64, duration: i32) -> Ack {
        let uid = match self.api.get_node(name).await {
            Ok(node) => match node.metadata.uid {
                Some(uid) => uid,
                None => return ack(seq, AckCode::Retry, "node has no uid yet"),
            },
            Err(e) if api_code(&e) == Some(404) => return self.forget(slot, seq),
            // kubelet skips creation this round when the owner Node cannot be read.
            Err(e) => {
                return ack(
                    seq,
                    AckCode::Retry,
                    format!("reading node for the lease owner: {e}"),
                );
            }
        };
        slot.uid = Some(uid.clone());
        let renew = self.renew_time(slot);
        match self
            .api
            .create_lease(&patch::new_lease(name, &uid, duration, renew))
            .await
        {
            Ok(created) => self.renewed(slot, name, seq, created, renew),
            Err(e) => {
                self.counters.lease_failures.fetch_add(1, Ordering::Relaxed);
                ack(seq, AckCode::Retry, format!("creating lease: {e}"))
            }
        }
    }

    async fn event(&self, name: &str, type_: &str, reason: &str, message: String, now: Timestamp) {
        let unique = self.event_seq.fetch_add(1, Ordering::Relaxed);
        let event = patch::node_event(name, type_, reason, message, now, unique);
        if let Err(error) = self.api.create_event(name, &event).await {
            tracing::warn!(node = name, reason, %error, "could not record event");
        }
    }
}

/// Reads [`Counters`] and [`Gateway::tracked_nodes`] at scrape time.
struct GatewayCollector(Weak<Gateway>);

impl std::fmt::Debug for GatewayCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatewayCollector")
    }
}

impl Collector for GatewayCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(gateway) = self.0.upgrade() else {
            return Ok(());
        };
        let c = &gateway.counters;
        let counters = [
            (
                "edgebeat_gateway_lease_renewals",
                "Lease renewals written.",
                &c.lease_renewals,
            ),
            (
                "edgebeat_gateway_lease_failures",
                "Lease renewals that could not be written (apiserver errors, too late to write).",
                &c.lease_failures,
            ),
            (
                "edgebeat_gateway_stale_heartbeats",
                "Heartbeats (Lease renewals and status reports) dropped as stale.",
                &c.stale_renewals,
            ),
            (
                "edgebeat_gateway_status_reports",
                "Node status PATCHes written.",
                &c.status_reports,
            ),
            (
                "edgebeat_gateway_registrations",
                "Nodes created or reconciled.",
                &c.registrations,
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value.load(Ordering::Relaxed));
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        let mut metric = encoder.encode_descriptor(
            "edgebeat_gateway_rejected_messages",
            "Messages rejected, by reason (see edgebeat_gateway::metrics::RejectReason).",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for why in RejectReason::ALL {
            let counter = ConstCounter::new(c.rejections(why));
            counter.encode(metric.encode_family(&[("reason", why.as_str())])?)?;
        }
        let gauges = [
            (
                "edgebeat_gateway_tracked_nodes",
                "Nodes this gateway replica keeps state for (silent ones are dropped after 15 min).",
                gateway.tracked_nodes(),
            ),
            (
                "edgebeat_gateway_max_nodes",
                "Most nodes this replica keeps state for (--max-nodes); messages of further nodes are refused with reason fleet_full.",
                gateway.options.max_nodes,
            ),
            (
                "edgebeat_gateway_apiserver_backing_off",
                "1 while the gateway backs off from the apiserver (it answered 429, 5xx or nothing; one probe request at a time), else 0.",
                usize::from(gateway.api.backing_off()),
            ),
            (
                "edgebeat_gateway_unidentified_agents_allowed",
                "1 when messages without a node identity are let in (--allow-unidentified-agents), else 0.",
                usize::from(gateway.options.posture == Posture::AllowUnidentified),
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

/// Takes the UID, boot ID and condition times of `node` as this replica's knowledge.
fn seed(slot: &mut NodeSlot, node: &Node) {
    slot.uid = node.metadata.uid.clone();
    seed_conditions(slot, node);
    if let Some(info) = node.status.as_ref().and_then(|s| s.node_info.as_ref()) {
        slot.known_boot_id = Some(info.boot_id.clone());
    }
}

/// Takes the condition statuses and transition times the apiserver holds.
fn seed_conditions(slot: &mut NodeSlot, node: &Node) {
    for c in node
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
    {
        if let Some(t) = &c.last_transition_time {
            slot.conditions.insert(
                c.type_.clone(),
                KnownCondition {
                    status: c.status.clone(),
                    last_transition: t.0,
                },
            );
        }
    }
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

/// Checks a Node name is a DNS-1123 subdomain, as the apiserver requires.
///
/// Errors: a message naming the problem.
pub fn validate_node_name(name: &str) -> Result<(), String> {
    if edgebeat_transports::tls::is_node_name(name) {
        Ok(())
    } else {
        Err(format!("malformed: {name:?} is not a valid node name"))
    }
}

impl Handler for Gateway {
    async fn handle(&self, peer: &Peer, message: pb::AgentMessage) -> Ack {
        self.handle_message(peer, message).await
    }

    fn rejected(&self, peer: &Peer, why: RejectReason, detail: &str) {
        self.counters.count_rejection(why);
        tracing::warn!(transport = peer.transport.as_str(), remote = ?peer.remote, why = why.as_str(), detail, "message refused by the transport");
    }
}

/// Builds the kube-rs client the gateway writes with: `config` with a 10 s read/write
/// timeout (kubelet's heartbeat client timeout), kube's own 429/5xx retries off, and, when
/// `qps` is not 0, a client-side rate limit of `qps` requests per second (tower
/// `RateLimitLayer`). The default is 0: kubelet's heartbeat client has no client-side limit
/// (`cmd/kubelet/app/server.go`), and a fixed rate shared by a whole fleet expires nodes
/// once the fleet outgrows it; the gateway bounds concurrency and backs off on 429/5xx
/// instead ([`crate::apiserver`]).
///
/// Errors: kube's error when the config cannot produce a client (bad TLS material).
pub fn kube_client(mut config: kube::Config, qps: u64) -> Result<kube::Client, kube::Error> {
    config.read_timeout = Some(Duration::from_secs(10));
    // No retries inside the client: a heartbeat retried late would be written late and hide
    // a dead node. The agent retries with a fresh message instead (kubelet's own loops).
    config.default_retry = false;
    config.write_timeout = Some(Duration::from_secs(10));
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(if qps == 0 {
        builder.build()
    } else {
        let limit = tower::limit::RateLimitLayer::new(qps, Duration::from_secs(1));
        builder.with_layer(&limit).build()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgebeat_transports::ingress::TransportKind;

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
    fn only_kubelets_conditions_are_accepted() {
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
        for bad in [
            vec![cond("NetworkUnavailable", "False", "RouteCreated")],
            vec![cond("Ready", "Unknown", "KubeletReady")],
            vec![cond("Ready", "True", "")],
            vec![cond("Ready", "True", "A"), cond("Ready", "False", "B")],
        ] {
            assert!(validate_status(&status(bad.clone())).is_err(), "{bad:?}");
        }
    }

    struct FixedClock(std::time::SystemTime);
    impl Clock for FixedClock {
        fn now(&self) -> std::time::SystemTime {
            self.0
        }
        fn boottime(&self) -> Duration {
            Duration::ZERO
        }
    }

    fn scrape(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    /// Skew is recorded on receipt (before any apiserver call: this Register has no status
    /// and is rejected without one), and an evicted node's series disappear with its slot.
    #[tokio::test(start_paused = true)]
    async fn skew_is_recorded_per_node_and_evicted_with_the_slot() {
        let now = std::time::UNIX_EPOCH + Duration::from_millis(1_800_000_000_000);
        // Never contacted: every message here is answered before any apiserver call.
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        let gateway = Arc::new(Gateway::new(
            client,
            Arc::new(FixedClock(now)),
            GatewayOptions {
                posture: Posture::AllowUnidentified,
                ..GatewayOptions::default()
            },
        ));
        let mut registry = Registry::default();
        gateway.register_metrics(&mut registry);
        let peer = Peer::unidentified(TransportKind::Grpc, None);
        let register = |node: &str, seq, behind_ms: i64| pb::AgentMessage {
            kind: Some(Kind::Register(pb::Register {
                header: Some(pb::Header {
                    node_name: node.into(),
                    boot_id: vec![7; 16],
                    seq,
                    wall_time_ms: 1_800_000_000_000 - behind_ms,
                }),
                status: None,
                ..Default::default()
            })),
        };
        let answer = gateway
            .handle_message(&peer, register("edge-old", 1, 2_500))
            .await;
        assert_eq!(AckCode::try_from(answer.code), Ok(AckCode::Rejected));
        gateway
            .handle_message(&peer, register("edge-fast", 1, -750))
            .await;
        // A replayed message (seq not increasing) does not move the skew.
        gateway
            .handle_message(&peer, register("edge-old", 1, 99_000))
            .await;
        let out = scrape(&registry);
        for line in [
            "edgebeat_gateway_node_clock_skew_seconds{node=\"edge-old\"} 2.5\n",
            "edgebeat_gateway_node_clock_skew_seconds{node=\"edge-fast\"} -0.75\n",
            "edgebeat_gateway_rejected_messages_total{reason=\"malformed\"} 2\n",
            "edgebeat_gateway_rejected_messages_total{reason=\"replayed\"} 1\n",
            "edgebeat_gateway_rejected_messages_total{reason=\"foreign\"} 0\n",
            "edgebeat_gateway_tracked_nodes 2\n",
            "edgebeat_gateway_lease_renewals_total 0\n",
        ] {
            assert!(out.contains(line), "missing {line:?} in\n{out}");
        }
        assert!(
            !out.contains("edgebeat_gateway_node_lease_age_seconds{"),
            "no renewal written, no age"
        );

        // edge-old goes silent past SLOT_IDLE; edge-fast keeps talking until a sweep.
        tokio::time::advance(SLOT_IDLE + Duration::from_secs(1)).await;
        for seq in 2..SWEEP_EVERY + 2 {
            gateway
                .handle_message(&peer, register("edge-fast", seq, 0))
                .await;
        }
        assert_eq!(gateway.tracked_nodes(), 1);
        let out = scrape(&registry);
        assert!(!out.contains("edge-old"), "{out}");
        assert!(out.contains("edgebeat_gateway_node_clock_skew_seconds{node=\"edge-fast\"} 0.0\n"));
    }

    /// Whatever ingress carried it, a message without a node identity is refused under the
    /// default posture before any state is kept for its node; and a replica keeps state for
    /// at most `max_nodes` nodes.
    #[tokio::test(start_paused = true)]
    async fn the_posture_and_the_fleet_bound_hold_before_any_state() {
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        let gateway = Gateway::new(
            client.clone(),
            Arc::new(FixedClock(std::time::UNIX_EPOCH)),
            GatewayOptions::default(),
        );
        let register = |node: &str| pb::AgentMessage {
            kind: Some(Kind::Register(pb::Register {
                header: Some(pb::Header {
                    node_name: node.into(),
                    boot_id: vec![1; 16],
                    seq: 1,
                    wall_time_ms: 0,
                }),
                ..Default::default()
            })),
        };
        for transport in [TransportKind::Grpc, TransportKind::Mqtt] {
            let answer = gateway
                .handle_message(&Peer::unidentified(transport, None), register("edge-1"))
                .await;
            assert_eq!(AckCode::try_from(answer.code), Ok(AckCode::Rejected));
        }
        assert_eq!(
            gateway.counters.rejections(RejectReason::Unauthenticated),
            2
        );
        assert_eq!(
            gateway.tracked_nodes(),
            0,
            "nothing kept for a refused message"
        );

        let small = Gateway::new(
            client,
            Arc::new(FixedClock(std::time::UNIX_EPOCH)),
            GatewayOptions {
                posture: Posture::AllowUnidentified,
                max_nodes: 2,
                ..GatewayOptions::default()
            },
        );
        let peer = Peer::unidentified(TransportKind::Grpc, None);
        for node in ["n1", "n2", "n3", "n4"] {
            small.handle_message(&peer, register(node)).await;
        }
        assert_eq!(small.tracked_nodes(), 2);
        assert_eq!(small.counters.rejections(RejectReason::FleetFull), 2);
        // Known nodes still get in; idle ones make room.
        let answer = small.handle_message(&peer, register("n1")).await;
        assert!(answer.reason.contains("replayed"), "{}", answer.reason);
        tokio::time::advance(SLOT_IDLE + Duration::from_secs(1)).await;
        small.handle_message(&peer, register("n5")).await;
        assert_eq!(small.counters.rejections(RejectReason::FleetFull), 2);
    }

    #[test]
    fn node_names_follow_dns_1123() {
        for ok in ["edge-01", "a", "node.example.com"] {
            assert!(validate_node_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Edge", "-a", "a-", "a_b", &"a".repeat(254)] {
            assert!(validate_node_name(bad).is_err(), "{bad}");
        }
    }
}
