//! What a [`super::Gateway`] is built with: its limits and its identity posture.

use std::time::Duration;

use crate::admission::{AdmissionPolicy, Posture};
use crate::apiserver::WriteLimits;
use crate::enrollment::gate::EnrollmentLimits;

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
    /// Without a working Node watch, how long this gateway trusts what it knows of a node
    /// without writing to it (default 40 s, the node lifecycle controller's grace period
    /// before it writes Unknown). Past that, the next message costs one Node GET. While the
    /// watch follows, the view is current for the Nodes it selects (those carrying the
    /// managed label) and this applies only to the others.
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
    /// The longest a superseded boot ID's messages are refused (default 30 s); a boot is
    /// remembered for one of its renew intervals when that is shorter (10 s by default).
    /// See [`crate::admission`].
    pub old_boot_memory: Duration,
    /// Apiserver calls in flight at once, Lease calls first (see [`crate::apiserver`]).
    pub write_limits: WriteLimits,
    /// Limits of certificate requests, per source and in all (see
    /// [`crate::enrollment::gate`]), when enrollment is on.
    pub enrollment_limits: EnrollmentLimits,
    /// Letters one node may have waiting in its mailbox behind the one being handled
    /// (default 8): beyond it a node's messages are refused ([`RejectReason::QueueFull`],
    /// unanswered), so one node's flood cannot grow the gateway's memory or starve the
    /// others. See [`Mailbox`].
    pub per_node_queue: usize,
    /// Whether `/metrics` carries the per-node series (`edgebeat_gateway_node_lease_age_seconds`,
    /// `edgebeat_gateway_node_clock_skew_seconds`: two series per node). Off for large
    /// fleets, whose Lease ages then show only as `edgebeat_gateway_lease_age_seconds`'s
    /// buckets (`--per-node-metrics=false`).
    pub per_node_metrics: bool,
    /// Where this replica serves kubelet's resource metrics for its nodes
    /// ([`crate::resource_metrics`]): named in every node status it writes, with the
    /// metrics-server path annotation on every Node it registers. `None`: served nowhere.
    pub resource_metrics: Option<crate::resource_metrics::Endpoint>,
    /// The apiserver's URL, named in the lines that tell an outage
    /// ([`crate::apiserver::outage`]); `None` names none.
    pub apiserver_url: Option<http::Uri>,
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
            enrollment_limits: EnrollmentLimits::default(),
            per_node_queue: DEFAULT_PER_NODE_QUEUE,
            per_node_metrics: true,
            resource_metrics: None,
            apiserver_url: None,
        }
    }
}

/// Default [`GatewayOptions::max_nodes`].
pub const DEFAULT_MAX_NODES: usize = 10_000;

/// Default [`GatewayOptions::per_node_queue`]: a reconnect's Register, status report and
/// renewal with room for their retries.
pub const DEFAULT_PER_NODE_QUEUE: usize = 8;

impl GatewayOptions {
    /// The admission rules of these options ([`crate::admission`]).
    pub(super) fn admission(&self) -> AdmissionPolicy {
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
