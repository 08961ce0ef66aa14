//! kubelet's resource metrics for the nodes a replica holds: the latest [`Sample`] of each
//! node (from its agent's Lease renewals, `LeaseRenewal.usage`), served as kubelet's
//! `/metrics/resource` (`pkg/kubelet/metrics/collectors/resource_metrics.go`) so that
//! metrics-server, `kubectl top node` and the apiserver's node proxy see edge nodes.
//!
//! How the cluster finds a node's replica: the replica that writes a node's status adds an
//! address of type [`ADDRESS_TYPE`] (`--resource-metrics-address`: its own IP, or a
//! Service's) beside the board's own addresses, sets `daemonEndpoints.kubeletEndpoint.Port`
//! to its `--resource-metrics-listen` port (or the Service's), and the Node carries the
//! annotation [`PATH_ANNOTATION`] naming the node's path on the replica ([`node_path`]):
//! metrics-server (`--kubelet-preferred-address-types=EdgebeatGateway,…`,
//! `--kubelet-use-node-status-port`) scrapes that path at that address. The apiserver's node
//! proxy (`/api/v1/nodes/<node>/proxy/metrics/resource`, with the same address type first in
//! its `--kubelet-preferred-address-types`) sends `/metrics/resource` with the original path
//! in `X-Forwarded-Uri`, which names the node.
//!
//! Over gRPC a node's samples reach the replica holding its stream, which names itself
//! (its pod IP); a node that reconnects elsewhere is named again at once (the new replica
//! asks for its status). Over MQTT a shared subscription splits a node's renewals between
//! replicas, so replicas share what they admit ([`Samples::record_shared`], the MQTT
//! ingress's `usage_sharing`): each holds every node's latest sample, and the address can
//! be the gateway Service's, which a replica's death does not change.
//!
//! The replica serves them over HTTPS ([`serve`], with [`ResourceMetricsOptions`]),
//! authenticated and authorized as kubelet does it (`cmd/kubelet/app/auth.go`): a client
//! certificate of the client CA or a bearer token (a TokenReview), then a
//! SubjectAccessReview for `get` on the node's `metrics` subresource, both asked of the
//! apiserver through [`Reviews`] and cached for kubelet's default times, each review within
//! budgets per source address and per replica (a request over budget is answered `429`
//! without a review: [`GLOBAL_REVIEWS_PER_SECOND`], [`ADDRESS_REVIEWS_PER_SECOND`]). The text
//! is kubelet's ([`exposition()`]).

use std::collections::HashMap;

use edgebeat_hw::UnixTime;
use parking_lot::RwLock;

/// The Node address type naming the replica that serves a node's resource metrics.
/// Kubernetes accepts any address type on Node status (`k8s.io/api` `NodeAddressType`: "a
/// cloud provider may set a type not listed here"), and metrics-server and kube-apiserver
/// take any in `--kubelet-preferred-address-types`.
pub const ADDRESS_TYPE: &str = "EdgebeatGateway";

/// metrics-server's per-node override of the scraped path
/// (`sigs.k8s.io/metrics-server` `pkg/scraper/client/resource/client.go`,
/// `AnnotationResourceMetricsPath`), set on every Node the gateway registers.
pub const PATH_ANNOTATION: &str = "metrics.k8s.io/resource-metrics-path";

/// The path of `node`'s resource metrics on a replica: `/nodes/<node>/metrics/resource`.
pub fn node_path(node: &str) -> String {
    format!("/nodes/{node}/metrics/resource")
}

/// Oldest sample served, 60 s: three of the agent's sampling periods (every second
/// renewal of kubelet's 10 s). A node that stopped sending (dead, or cut off) drops out of
/// `kubectl top node` as a dead kubelet's does (metrics-server's scrape fails), instead of
/// showing its last figures as if it were alive.
pub const MAX_SAMPLE_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// One node's resource usage as its agent sampled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// `node_cpu_usage_seconds_total` × 1000: cumulative CPU time, milliseconds.
    pub cpu_usage_ms: u64,
    /// `node_memory_working_set_bytes`.
    pub memory_working_set_bytes: u64,
    /// When it was sampled, milliseconds since the Unix epoch on this replica's clock (the
    /// renewal's receipt minus its age on the agent's boot clock).
    pub timestamp_ms: i64,
}

impl Sample {
    /// The sample a `SharedUsage` holds; `None` without usage, with a 0 (not readable on
    /// the host: metrics-server drops a node whose CPU or memory is 0) or without a time.
    fn of(shared: &edgebeat_proto::SharedUsage) -> Option<Self> {
        let usage = shared.usage?;
        (usage.cpu_usage_ms != 0 && usage.memory_working_set_kib != 0 && shared.sampled_ms > 0)
            .then(|| Self {
                cpu_usage_ms: usage.cpu_usage_ms,
                memory_working_set_bytes: usage.memory_working_set_kib.saturating_mul(1024),
                timestamp_ms: shared.sampled_ms,
            })
    }
}

/// The latest [`Sample`] of each node this replica holds, or that another replica shared
/// (MQTT, [`Samples::record_shared`]).
#[derive(Debug)]
pub struct Samples {
    latest: RwLock<HashMap<String, Sample>>,
    /// Most nodes a shared sample may add (the replica's `--max-nodes`): what other
    /// replicas say cannot grow the map past the fleet.
    shared_limit: usize,
}

impl Default for Samples {
    /// No limit on shared samples' nodes.
    fn default() -> Self {
        Self::new(usize::MAX)
    }
}

impl Samples {
    /// Empty, taking shared samples of at most `shared_limit` nodes in all.
    pub fn new(shared_limit: usize) -> Self {
        Self {
            latest: RwLock::default(),
            shared_limit,
        }
    }

    /// Records `sample` as `node`'s latest, unless an already recorded one is newer (a late
    /// retry, or a replica's shared sample that came first). Returns whether it was
    /// recorded.
    pub fn record(&self, node: &str, sample: Sample) -> bool {
        self.insert(node, sample, false, None).unwrap_or(false)
    }

    /// [`Samples::record`], for a `shared` sample not past the limit of nodes, and within
    /// the node's `capacity` when it is known ([`check_capacity`], against the sample held).
    fn insert(
        &self,
        node: &str,
        sample: Sample,
        shared: bool,
        capacity: Option<Capacity>,
    ) -> Result<bool, SampleRefused> {
        let mut latest = self.latest.write();
        let full = shared && latest.len() >= self.shared_limit;
        let held = latest.get(node).copied();
        if held.is_some_and(|held| held.timestamp_ms >= sample.timestamp_ms) {
            return Ok(false);
        }
        if let Some(capacity) = capacity {
            check_capacity(&sample, held.as_ref(), capacity)?;
        }
        match latest.get_mut(node) {
            Some(held) => {
                *held = sample;
                Ok(true)
            }
            None if full => Ok(false),
            None => {
                latest.insert(node.to_owned(), sample);
                Ok(true)
            }
        }
    }

    /// Records a node's usage as its agent sent it (`LeaseRenewal.usage`), sampled at
    /// `sampled` on this replica's clock, within the node's `capacity` when it is known; a
    /// usage the host could not read (a 0) is not a sample (metrics-server drops a node
    /// whose CPU or memory is 0). Returns the sample as the other replicas take it
    /// ([`Samples::record_shared`]) when it was recorded.
    ///
    /// # Errors
    ///
    /// [`SampleRefused`] for a sample beyond the node's capacity ([`check_capacity`]):
    /// nothing is recorded.
    pub fn record_usage(
        &self,
        node: &str,
        usage: &edgebeat_proto::ResourceUsage,
        sampled: std::time::SystemTime,
        capacity: Option<Capacity>,
    ) -> Result<Option<edgebeat_proto::SharedUsage>, SampleRefused> {
        let shared = edgebeat_proto::SharedUsage {
            usage: Some(*usage),
            sampled_ms: UnixTime::from(sampled).millis(),
            node_name: node.to_owned(),
        };
        let Some(sample) = Sample::of(&shared) else {
            return Ok(None);
        };
        Ok(self
            .insert(node, sample, false, capacity)?
            .then_some(shared))
    }

    /// Records a sample another replica admitted and shared (MQTT `P/usage`) for its node
    /// (`shared.node_name`), unless it is not one (no usage, a 0, no time), a newer one is
    /// held, or it would add a node past the limit ([`Samples::new`]). Returns whether it
    /// was recorded.
    ///
    /// # Errors
    ///
    /// [`SampleRefused`] for a sample dated beyond [`MAX_SAMPLE_AHEAD`] after `now`
    /// ([`check_sample_time`]: it would stay the node's latest until then) or beyond the
    /// node's `capacity` when it is known ([`check_capacity`]): nothing is recorded.
    pub fn record_shared(
        &self,
        shared: &edgebeat_proto::SharedUsage,
        capacity: Option<Capacity>,
        now: std::time::SystemTime,
    ) -> Result<bool, SampleRefused> {
        check_sample_time(shared.sampled_ms, now)?;
        match Sample::of(shared) {
            Some(sample) => self.insert(&shared.node_name, sample, true, capacity),
            None => Ok(false),
        }
    }

    /// Forgets `node` (its slot was swept, or it moved to another replica).
    pub fn remove(&self, node: &str) {
        self.latest.write().remove(node);
    }

    /// Forgets every sample taken before `cutoff`: nodes no replica has heard from since,
    /// including those only other replicas held.
    pub fn forget_before(&self, cutoff: std::time::SystemTime) {
        let cutoff_ms = UnixTime::from(cutoff).millis();
        self.latest
            .write()
            .retain(|_, s| s.timestamp_ms >= cutoff_ms);
    }

    /// `node`'s latest sample.
    pub fn get(&self, node: &str) -> Option<Sample> {
        self.latest.read().get(node).copied()
    }

    /// `node`'s latest sample if it was taken at most [`MAX_SAMPLE_AGE`] before `now`.
    pub fn fresh(&self, node: &str, now: std::time::SystemTime) -> Option<Sample> {
        let oldest = UnixTime::from(now).saturating_sub(MAX_SAMPLE_AGE).millis();
        self.get(node).filter(|s| s.timestamp_ms >= oldest)
    }
}

/// Furthest ahead of this replica's clock a sample may be dated: the clock window of signed
/// messages ([`edgebeat_transports::mqtt::DEFAULT_MAX_CLOCK_SKEW`], 30 s), which the
/// replicas' clocks keep to.
pub const MAX_SAMPLE_AHEAD: std::time::Duration = edgebeat_transports::mqtt::DEFAULT_MAX_CLOCK_SKEW;

/// A sample dated `sampled_ms` (milliseconds since the Unix epoch) more than
/// [`MAX_SAMPLE_AHEAD`] after `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("dated {ahead_ms} ms ahead of this replica's clock, beyond {} s", MAX_SAMPLE_AHEAD.as_secs())]
pub struct SampleFromTheFuture {
    /// How far ahead.
    pub ahead_ms: i128,
}

/// Whether a sample dated `sampled_ms` may be taken at `now`: not from the future beyond
/// [`MAX_SAMPLE_AHEAD`] (a sample dated years ahead would be the node's "latest" for
/// years). Older ones are for [`Samples::fresh`] to judge.
///
/// # Errors
///
/// [`SampleFromTheFuture`] with how far ahead.
pub fn check_sample_time(
    sampled_ms: i64,
    now: std::time::SystemTime,
) -> Result<(), SampleFromTheFuture> {
    let ahead_ms = i128::from(sampled_ms) - i128::from(UnixTime::from(now).millis());
    if ahead_ms > i128::try_from(MAX_SAMPLE_AHEAD.as_millis()).unwrap_or(i128::MAX) {
        return Err(SampleFromTheFuture { ahead_ms });
    }
    Ok(())
}

/// A Node's `status.capacity` of CPU and memory as the apiserver holds it (what its agent
/// reported): what no sample of its usage can exceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// `cpu`, millicores.
    pub cpu_millis: u64,
    /// `memory`, bytes.
    pub memory_bytes: u64,
}

impl Capacity {
    /// The capacity of `capacity` (a NodeStatus's `capacity` map); `None` unless both
    /// `cpu` and `memory` are there and parse as Kubernetes quantities (`4`, `3900m`,
    /// `8029908Ki`; parsed with kube_quantity).
    pub fn of(
        capacity: &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    ) -> Option<Self> {
        let parse = |name: &str| {
            kube_quantity::ParsedQuantity::try_from(capacity.get(name)?)
                .ok()?
                .to_bytes_f64()
        };
        let cpu = parse("cpu")?;
        let memory = parse("memory")?;
        // Float to integer casts saturate (a negative quantity is 0).
        Some(Self {
            cpu_millis: (cpu * 1000.0).round() as u64,
            memory_bytes: memory.round() as u64,
        })
    }
}

/// How far a node's CPU rate between two samples may exceed its capacity before the later
/// sample is refused, in per cent of the capacity: 25 %, for the time between samples as
/// this replica dates them (the renewal's receipt minus its age) against the agent's own.
pub const CPU_RATE_SLACK_PERCENT: u64 = 25;

/// Shortest time between two samples over which their CPU rate is judged, 10 s: over a
/// shorter one the dating's error outweighs the rate.
pub const CPU_RATE_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// A sample refused ([`Samples::record_usage`], [`Samples::record_shared`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SampleRefused {
    /// Dated beyond [`MAX_SAMPLE_AHEAD`] after this replica's clock.
    #[error(transparent)]
    FromTheFuture(#[from] SampleFromTheFuture),
    /// A memory working set above the node's memory capacity.
    #[error(
        "memory working set {working_set_bytes} B above the node's capacity of {capacity_bytes} B"
    )]
    MemoryAboveCapacity {
        /// The sample's `node_memory_working_set_bytes`.
        working_set_bytes: u64,
        /// The Node's `status.capacity.memory`, bytes.
        capacity_bytes: u64,
    },
    /// CPU time used faster than the node's CPUs can, since the sample held.
    #[error(
        "{rate_millis}m of CPU since the sample held, above the node's capacity of {capacity_millis}m"
    )]
    CpuAboveCapacity {
        /// The rate between the two samples, millicores.
        rate_millis: u64,
        /// The Node's `status.capacity.cpu`, millicores.
        capacity_millis: u64,
    },
}

/// Whether `sample` fits the node's `capacity`: a memory working set at most its memory,
/// and, against the sample `held` before it (at least [`CPU_RATE_WINDOW`] older, its
/// cumulative CPU time not above this one's: a lower one is a counter reset, a reboot), a
/// CPU rate at most its CPUs and [`CPU_RATE_SLACK_PERCENT`]. The working set is the root
/// cgroup's (cadvisor's, `pkg/kubelet/metrics/collectors/resource_metrics.go`), which the
/// kernel never lets past the machine's memory.
///
/// # Errors
///
/// [`SampleRefused::MemoryAboveCapacity`], [`SampleRefused::CpuAboveCapacity`].
pub fn check_capacity(
    sample: &Sample,
    held: Option<&Sample>,
    capacity: Capacity,
) -> Result<(), SampleRefused> {
    if sample.memory_working_set_bytes > capacity.memory_bytes {
        return Err(SampleRefused::MemoryAboveCapacity {
            working_set_bytes: sample.memory_working_set_bytes,
            capacity_bytes: capacity.memory_bytes,
        });
    }
    let Some(held) = held else { return Ok(()) };
    let window_ms = i128::from(sample.timestamp_ms) - i128::from(held.timestamp_ms);
    let used_ms = i128::from(sample.cpu_usage_ms) - i128::from(held.cpu_usage_ms);
    if window_ms < i128::try_from(CPU_RATE_WINDOW.as_millis()).unwrap_or(i128::MAX) || used_ms < 0 {
        return Ok(());
    }
    // CPU milliseconds per wall millisecond, in millicores.
    let rate_millis = used_ms * 1000 / window_ms;
    let limit = i128::from(capacity.cpu_millis) * i128::from(100 + CPU_RATE_SLACK_PERCENT) / 100;
    if rate_millis > limit {
        return Err(SampleRefused::CpuAboveCapacity {
            rate_millis: u64::try_from(rate_millis).unwrap_or(u64::MAX),
            capacity_millis: capacity.cpu_millis,
        });
    }
    Ok(())
}

/// Where the cluster reaches this replica's resource metrics, as written into the status of
/// the nodes it writes (`--resource-metrics-address`: the pod IP and the port of
/// `--resource-metrics-listen`, or a Service's IP and port in front of replicas that share
/// their samples).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// The IP the cluster reaches this replica at (its pod IP, or a Service's in front of
    /// replicas sharing samples): the node address of type [`ADDRESS_TYPE`].
    pub address: std::net::IpAddr,
    /// The port: `daemonEndpoints.kubeletEndpoint.Port` (0 until the gateway binds: the
    /// port bound).
    pub port: u16,
}

impl Endpoint {
    /// Names this replica in `status`: an address of type [`ADDRESS_TYPE`] after the
    /// board's own (any earlier one of that type replaced), and the kubelet endpoint's port.
    pub fn apply(&self, status: &mut k8s_openapi::api::core::v1::NodeStatus) {
        let addresses = status.addresses.get_or_insert_with(Vec::new);
        addresses.retain(|a| a.type_ != ADDRESS_TYPE);
        addresses.push(k8s_openapi::api::core::v1::NodeAddress {
            type_: ADDRESS_TYPE.to_owned(),
            address: self.address.to_string(),
        });
        status.daemon_endpoints = Some(k8s_openapi::api::core::v1::NodeDaemonEndpoints {
            kubelet_endpoint: Some(k8s_openapi::api::core::v1::DaemonEndpoint {
                port: i32::from(self.port),
            }),
        });
    }
}

mod auth;
mod budget;
mod cache;
mod counters;
mod exposition;
mod server;

pub use auth::{
    ALLOWED_TTL, CACHE_ENTRIES, DENIED_TTL, REVIEW_TIMEOUT, Reviews, TOKEN_FAILURE_TTL, TOKEN_TTL,
};
pub use budget::{
    ADDRESS_REVIEW_BURST, ADDRESS_REVIEWS_PER_SECOND, Budget, GLOBAL_REVIEW_BURST,
    GLOBAL_REVIEWS_PER_SECOND, OverBudget, SERVED_REVIEW_BURST, SERVED_REVIEWS_PER_SECOND,
};
pub use cache::ReviewError;
pub use counters::ResourceMetricsCounters;
pub use exposition::{EXPOSITION_CONTENT_TYPE, exposition};
pub use server::{
    HEADER_READ_TIMEOUT, IDLE_TIMEOUT, MAX_CONNECTION_AGE, MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_ADDRESS, ResourceMetricsOptions, TLS_HANDSHAKE_TIMEOUT, serve,
};

#[cfg(test)]
mod tests;
