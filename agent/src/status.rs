//! NodeStatus computation: a pure function of host facts, the previous result and the boot
//! clock, mirroring kubelet's setters (`pkg/kubelet/nodestatus/setters.go`) and its eviction
//! manager's pressure conditions (`pkg/kubelet/eviction/eviction_manager.go`).

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

use edgebeat_hw::HostFacts;
use edgebeat_proto::{self as pb, NodeConditionType};

use crate::config::{AgentConfig, EvictionSignal};

pub(crate) use crate::condition::within_transition_period;
pub use crate::condition::{Condition, MessageCarry};
use crate::quantity::{Amount, format_binary, format_millicores};
pub use edgebeat_proto::{ConditionReason, ConditionStatus};

/// `nodeInfo.kubeletVersion` the agent reports: the kubelet release it follows (v1.36, its
/// minor version; kubelet reports its own build, e.g. `v1.36.3`), tagged with edgebeat's own
/// version so `kubectl get nodes -o wide` tells edgebeat nodes and their releases apart.
pub const KUBELET_VERSION: &str = concat!("v1.36.0-edgebeat.", env!("CARGO_PKG_VERSION"));

/// When each pressure signal last crossed its threshold, as time since boot: the memory of
/// kubelet's `nodeConditionsLastObservedAt` that implements the transition period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PressureObserved {
    /// memory.available below threshold.
    pub memory: Option<Duration>,
    /// nodefs/imagefs available or inodesFree below threshold.
    pub disk: Option<Duration>,
    /// pid.available below threshold.
    pub pid: Option<Duration>,
}

/// A computed NodeStatus plus the state the next computation needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputedStatus {
    /// `status.capacity`: resource → canonical quantity.
    pub capacity: BTreeMap<String, String>,
    /// `status.allocatable`: capacity − systemReserved − kubeReserved − hard-eviction
    /// reservation (− hugepages for memory), floored at 0.
    pub allocatable: BTreeMap<String, String>,
    /// The enabled health conditions ([`crate::health`]) in
    /// [`NodeConditionType::HEALTH`] order, then MemoryPressure, DiskPressure,
    /// PIDPressure, Ready — Ready last.
    pub conditions: Vec<Condition>,
    /// `status.addresses`: (type, address), InternalIP first then Hostname.
    pub addresses: Vec<(&'static str, String)>,
    /// `status.nodeInfo`.
    pub node_info: pb::NodeSystemInfo,
    /// Pressure memory for hysteresis.
    pub observed: PressureObserved,
    /// When each health condition's signal was last seen, by condition type (the
    /// hysteresis memory of [`crate::health`]).
    pub health_observed: BTreeMap<NodeConditionType, Duration>,
}

/// Computes the NodeStatus for `facts` at boot-clock time `now`, carrying condition
/// transitions and pressure hysteresis over from `previous` (kubelet's setters run on the
/// previous Node object the same way).
///
/// Rules: pressure conditions turn True when a hard threshold is crossed and stay True until
/// `evictionPressureTransitionPeriod` has passed since it was last crossed; Ready is False
/// with reason `KubeletNotReady` when cpu, memory, pods or ephemeral-storage capacity is
/// missing; `lastTransitionTime` is kept while a condition's status is unchanged.
pub fn compute(
    facts: &HostFacts,
    config: &AgentConfig,
    previous: Option<&ComputedStatus>,
    now: Duration,
) -> ComputedStatus {
    let capacity = capacity(facts, config);
    let allocatable = allocatable(facts, config, &capacity);
    let prev_observed = previous.map(|p| p.observed).unwrap_or_default();
    let observed = thresholds_met(facts, config).observed(prev_observed, now);
    let period = config.eviction_pressure_transition_period;
    let held = |at: Option<Duration>| within_transition_period(at, now, period);

    let before = |type_: NodeConditionType| {
        previous.and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
    };
    let kubelets = |type_, status, reason, message| {
        Condition::next(
            before(type_),
            type_,
            status,
            reason,
            message,
            MessageCarry::Fresh,
            now,
        )
    };
    let mut conditions = Vec::with_capacity(4);
    let mut push =
        |type_: NodeConditionType, pressure: bool, texts: [(ConditionReason, &'static str); 2]| {
            let (status, (reason, message)) = if pressure {
                (ConditionStatus::True, texts[0])
            } else {
                (ConditionStatus::False, texts[1])
            };
            conditions.push(kubelets(type_, status, reason, message.to_owned()));
        };
    let pressures = [observed.memory, observed.disk, observed.pid];
    for ((type_, texts), at) in PRESSURE_CONDITIONS.into_iter().zip(pressures) {
        push(type_, held(at), texts);
    }
    let (status, reason, message) = ready(&capacity);
    conditions.push(kubelets(NodeConditionType::Ready, status, reason, message));
    let mut health_observed = previous
        .map(|p| p.health_observed.clone())
        .unwrap_or_default();
    // Health conditions first, Ready last: the order `kubectl describe node` shows beside
    // node-problem-detector's conditions.
    let mut health = crate::health::conditions(
        facts,
        &config.health,
        period,
        previous.map_or(&[], |p| p.conditions.as_slice()),
        &mut health_observed,
        now,
    );
    health.append(&mut conditions);
    let conditions = health;

    ComputedStatus {
        capacity,
        allocatable,
        conditions,
        addresses: addresses(facts, config),
        node_info: node_info(facts),
        observed,
        health_observed,
    }
}

impl ComputedStatus {
    /// Each condition as (type, True?), for the agent's `edgebeat_agent_node_condition`.
    pub fn condition_states(&self) -> impl Iterator<Item = (&'static str, bool)> + '_ {
        self.conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status == ConditionStatus::True))
    }
}

/// kubelet's `nodeStatusHasChanged` for what the agent computes: true when anything but the
/// heartbeat differs. Transition times move only with a status change, so comparing
/// everything else is equivalent.
pub fn has_changed(old: &ComputedStatus, new: &ComputedStatus) -> bool {
    old.capacity != new.capacity
        || old.allocatable != new.allocatable
        || old.addresses != new.addresses
        || old.node_info != new.node_info
        || old.conditions.len() != new.conditions.len()
        || old.conditions.iter().zip(&new.conditions).any(|(a, b)| {
            a.type_ != b.type_
                || a.status != b.status
                || a.reason != b.reason
                || a.message != b.message
        })
}

/// kubelet's pressure conditions, in its order: the type, then the reason and message
/// under pressure and without (`pkg/kubelet/nodestatus/setters.go`: `MemoryPressureCondition`,
/// `DiskPressureCondition`, `PIDPressureCondition`).
const PRESSURE_CONDITIONS: [(NodeConditionType, [(ConditionReason, &str); 2]); 3] = [
    (
        NodeConditionType::MemoryPressure,
        [
            (
                ConditionReason::KubeletHasInsufficientMemory,
                "kubelet has insufficient memory available",
            ),
            (
                ConditionReason::KubeletHasSufficientMemory,
                "kubelet has sufficient memory available",
            ),
        ],
    ),
    (
        NodeConditionType::DiskPressure,
        [
            (
                ConditionReason::KubeletHasDiskPressure,
                "kubelet has disk pressure",
            ),
            (
                ConditionReason::KubeletHasNoDiskPressure,
                "kubelet has no disk pressure",
            ),
        ],
    ),
    (
        NodeConditionType::PidPressure,
        [
            (
                ConditionReason::KubeletHasInsufficientPid,
                "kubelet has insufficient PID available",
            ),
            (
                ConditionReason::KubeletHasSufficientPid,
                "kubelet has sufficient PID available",
            ),
        ],
    ),
];

/// Ready's status, reason and message: True unless cpu, memory, pods or
/// ephemeral-storage capacity is missing (kubelet's `ReadyCondition`, which names them).
fn ready(capacity: &BTreeMap<String, String>) -> (ConditionStatus, ConditionReason, String) {
    let missing: Vec<&str> = ["cpu", "memory", "pods", "ephemeral-storage"]
        .into_iter()
        .filter(|r| !capacity.contains_key(*r))
        .collect();
    if missing.is_empty() {
        (
            ConditionStatus::True,
            ConditionReason::KubeletReady,
            "kubelet is posting ready status".into(),
        )
    } else {
        let message = format!(
            "missing node capacity for resources: {}",
            missing.join(", ")
        );
        (
            ConditionStatus::False,
            ConditionReason::KubeletNotReady,
            message,
        )
    }
}

/// Which hard eviction thresholds are crossed now ([`thresholds_met`]).
struct Met {
    memory: bool,
    disk: bool,
    pid: bool,
}

impl Met {
    /// When each threshold was last seen crossed: `now` where it is crossed, else as in
    /// `previous`.
    fn observed(&self, previous: PressureObserved, now: Duration) -> PressureObserved {
        let at = |met: bool, before: Option<Duration>| if met { Some(now) } else { before };
        PressureObserved {
            memory: at(self.memory, previous.memory),
            disk: at(self.disk, previous.disk),
            pid: at(self.pid, previous.pid),
        }
    }
}

/// Which hard eviction thresholds the facts cross (`evictionHard`, operator LessThan).
/// A signal that cannot be observed crosses nothing, as in kubelet.
fn thresholds_met(facts: &HostFacts, config: &AgentConfig) -> Met {
    let below = |signal, observed: Option<u64>, capacity: Option<u64>| -> bool {
        match (config.eviction_hard.get(&signal), observed, capacity) {
            (Some(threshold), Some(value), Some(cap)) => value < threshold.resolve(cap),
            _ => false,
        }
    };
    let mem = &facts.memory;
    let nodefs = facts.nodefs.as_ref();
    let imagefs = facts.imagefs.as_ref();
    Met {
        memory: below(
            EvictionSignal::MemoryAvailable,
            mem.available_bytes,
            Some(mem.total_bytes),
        ),
        disk: below(
            EvictionSignal::NodeFsAvailable,
            nodefs.map(|f| f.available_bytes),
            nodefs.map(|f| f.capacity_bytes),
        ) || below(
            EvictionSignal::NodeFsInodesFree,
            nodefs.map(|f| f.inodes_free),
            nodefs.map(|f| f.inodes),
        ) || below(
            EvictionSignal::ImageFsAvailable,
            imagefs.map(|f| f.available_bytes),
            imagefs.map(|f| f.capacity_bytes),
        ) || below(
            EvictionSignal::ImageFsInodesFree,
            imagefs.map(|f| f.inodes_free),
            imagefs.map(|f| f.inodes),
        ),
        pid: below(
            EvictionSignal::PidAvailable,
            facts.pid.as_ref().map(|p| p.available()),
            facts.pid.as_ref().map(|p| p.max_pid),
        ),
    }
}

/// Hugepage resource name for a page size: `hugepages-2Mi`, `hugepages-1Gi`.
fn hugepage_resource(page_size_bytes: u64) -> String {
    format!("hugepages-{}", format_binary(page_size_bytes))
}

/// `status.capacity` (kubelet `CapacityFromMachineInfo` and the MachineInfo setter).
fn capacity(facts: &HostFacts, config: &AgentConfig) -> BTreeMap<String, String> {
    let mut cap = BTreeMap::new();
    if facts.logical_cpus > 0 {
        cap.insert(
            "cpu".to_owned(),
            format_millicores(u64::from(facts.logical_cpus) * 1000),
        );
    }
    if facts.memory.total_bytes > 0 {
        cap.insert("memory".to_owned(), format_binary(facts.memory.total_bytes));
    }
    let mut pods = config.max_pods;
    if config.pods_per_core > 0 {
        pods = pods.min(facts.logical_cpus.saturating_mul(config.pods_per_core));
    }
    cap.insert("pods".to_owned(), pods.to_string());
    if let Some(nodefs) = &facts.nodefs {
        cap.insert(
            "ephemeral-storage".to_owned(),
            format_binary(nodefs.capacity_bytes),
        );
    }
    for hp in &facts.hugepages {
        cap.insert(
            hugepage_resource(hp.page_size_bytes),
            format_binary(hp.page_size_bytes.saturating_mul(hp.pages)),
        );
    }
    cap
}

/// `status.allocatable` (kubelet `GetNodeAllocatableReservation`, `hardEvictionReservation`).
fn allocatable(
    facts: &HostFacts,
    config: &AgentConfig,
    capacity: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let reserved = |resource: &str| -> u64 {
        config.system_reserved.get(resource).copied().unwrap_or(0)
            + config.kube_reserved.get(resource).copied().unwrap_or(0)
    };
    let eviction = |signal: EvictionSignal, cap: u64| {
        config
            .eviction_hard
            .get(&signal)
            .map_or(0, |a: &Amount| a.resolve(cap))
    };
    let mut out = capacity.clone();
    if capacity.contains_key("cpu") {
        let millis = u64::from(facts.logical_cpus) * 1000;
        out.insert(
            "cpu".into(),
            format_millicores(millis.saturating_sub(reserved("cpu"))),
        );
    }
    if capacity.contains_key("memory") {
        let cap = facts.memory.total_bytes;
        let hugepages: u64 = facts
            .hugepages
            .iter()
            .map(|h| h.page_size_bytes.saturating_mul(h.pages))
            .sum();
        let v = cap
            .saturating_sub(reserved("memory"))
            .saturating_sub(eviction(EvictionSignal::MemoryAvailable, cap))
            .saturating_sub(hugepages);
        out.insert("memory".into(), format_binary(v));
    }
    if let Some(nodefs) = &facts.nodefs {
        let cap = nodefs.capacity_bytes;
        let v = cap
            .saturating_sub(reserved("ephemeral-storage"))
            .saturating_sub(eviction(EvictionSignal::NodeFsAvailable, cap));
        out.insert("ephemeral-storage".into(), format_binary(v));
    }
    out
}

/// `status.addresses` without a cloud provider (kubelet `NodeAddress` setter,
/// `pkg/kubelet/nodestatus/setters.go`): the configured `nodeIP`, else the hostname if it
/// is an IP, else the default-route interface's address; then the Hostname entry. The
/// hostname is `nodeName` when set (kubelet's `--hostname-override`), else the
/// lower-cased OS hostname.
fn addresses(facts: &HostFacts, config: &AgentConfig) -> Vec<(&'static str, String)> {
    let hostname = config
        .node_name
        .as_ref()
        .map(|n| n.to_string())
        .or_else(|| facts.hostname.as_deref().map(str::to_lowercase));
    let ip: Option<IpAddr> = config
        .node_ip
        .or_else(|| hostname.as_deref().and_then(|h| h.parse().ok()))
        .or(facts.default_route_ip);
    let mut out = Vec::with_capacity(2);
    if let Some(ip) = ip {
        out.push(("InternalIP", ip.to_string()));
    }
    if let Some(h) = hostname {
        out.push(("Hostname", h));
    }
    out
}

fn node_info(facts: &HostFacts) -> pb::NodeSystemInfo {
    pb::NodeSystemInfo {
        machine_id: facts.machine_id.clone().unwrap_or_default(),
        system_uuid: facts.system_uuid.clone().unwrap_or_default(),
        boot_id: facts.boot_id.clone(),
        kernel_version: facts.kernel_version.clone().unwrap_or_default(),
        os_image: facts.os_image.clone(),
        container_runtime_version: String::new(),
        kubelet_version: KUBELET_VERSION.to_owned(),
        operating_system: facts.operating_system.to_owned(),
        architecture: facts.architecture.to_owned(),
    }
}

impl ComputedStatus {
    /// The wire form, with each condition's transition made relative to `now` (boot clock):
    /// `seconds_since_transition = now − last_transition`, whole seconds.
    pub fn to_proto(&self, now: Duration) -> pb::NodeStatus {
        pb::NodeStatus {
            capacity: self.capacity.clone().into_iter().collect(),
            allocatable: self.allocatable.clone().into_iter().collect(),
            conditions: self
                .conditions
                .iter()
                .map(|c| pb::NodeCondition {
                    r#type: c.type_.as_str().to_owned(),
                    status: c.status.as_str().to_owned(),
                    reason: c.reason.as_str().to_owned(),
                    message: c.message.clone(),
                    seconds_since_transition: now.saturating_sub(c.last_transition).as_secs(),
                })
                .collect(),
            addresses: self
                .addresses
                .iter()
                .map(|(t, a)| pb::NodeAddress {
                    r#type: (*t).to_owned(),
                    address: a.clone(),
                })
                .collect(),
            node_info: Some(self.node_info.clone()),
            kubelet_endpoint_port: 0,
        }
    }

    /// The Ready condition, if computed.
    pub fn ready(&self) -> Option<&Condition> {
        self.conditions
            .iter()
            .find(|c| c.type_ == NodeConditionType::Ready)
    }
}

/// Most transitions a [`Journal`] holds, 64: beyond it the oldest is dropped (and counted).
/// A pressure condition flaps at most once per `evictionPressureTransitionPeriod` (5 min),
/// so 64 covers hours of an outage; a board cut off longer keeps the latest.
pub const JOURNAL_ENTRIES: usize = pb::MAX_JOURNAL_ENTRIES;

/// Oldest transition the journal keeps, [`pb::MAX_JOURNAL_AGE`] (30 days): older ones are
/// dropped (and counted), as the gateway would refuse them.
pub const JOURNAL_MAX_AGE: Duration = pb::MAX_JOURNAL_AGE;

/// The condition transitions this agent has computed and not yet had written
/// (`StatusReport.journal`), oldest first, on the boot clock: normally the one a report is
/// about to carry, and while the link is down every transition made meanwhile, so the
/// gateway records each at its true time when the link returns
/// ([`ComputedStatus::to_proto`]'s `seconds_since_transition` says only the last).
///
/// Held in memory only: what a board saw before it rebooted goes with the boot (the
/// reboot itself reaches the gateway as `Register.uptime_ms`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Journal {
    entries: VecDeque<Condition>,
    dropped: u64,
}

impl Journal {
    /// Records every condition of `after` whose status differs from the same type's in
    /// `before` (a type new in `after` is no transition: the whole status carries it), after
    /// forgetting what is older than [`JOURNAL_MAX_AGE`] at `now` (boot clock).
    pub fn observe(&mut self, before: &ComputedStatus, after: &ComputedStatus, now: Duration) {
        self.forget_older_than(now);
        for c in &after.conditions {
            let changed = before
                .conditions
                .iter()
                .find(|b| b.type_ == c.type_)
                .is_some_and(|b| b.status != c.status);
            if changed {
                if self.entries.len() == JOURNAL_ENTRIES {
                    self.entries.pop_front();
                    self.dropped += 1;
                }
                self.entries.push_back(c.clone());
            }
        }
    }

    /// Transitions held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Transitions dropped because the journal was full, since the agent started.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The wire form at boot-clock time `now`: each transition's `ms_ago = now −` its time,
    /// in milliseconds.
    pub fn to_proto(&self, now: Duration) -> Vec<pb::ConditionTransition> {
        self.entries
            .iter()
            .map(|c| pb::ConditionTransition {
                ms_ago: u64::try_from(now.saturating_sub(c.last_transition).as_millis())
                    .unwrap_or(u64::MAX),
                r#type: c.type_.as_str().to_owned(),
                status: c.status.as_str().to_owned(),
                reason: c.reason.as_str().to_owned(),
                message: c.message.clone(),
                boot_ms: u64::try_from(c.last_transition.as_millis()).unwrap_or(u64::MAX),
            })
            .collect()
    }

    /// Forgets transitions more than [`JOURNAL_MAX_AGE`] before `now` (boot clock): the
    /// gateway would not take them.
    fn forget_older_than(&mut self, now: Duration) {
        while self
            .entries
            .front()
            .is_some_and(|c| now.saturating_sub(c.last_transition) > JOURNAL_MAX_AGE)
        {
            self.entries.pop_front();
            self.dropped += 1;
        }
    }

    /// Forgets the oldest `count` transitions: a report carrying them was written.
    pub fn written(&mut self, count: usize) {
        self.entries.drain(..count.min(self.entries.len()));
    }
}

#[cfg(test)]
mod tests;
