//! kubelet's resource metrics for the nodes a replica holds: the latest [`Sample`] of each
//! node (from its agent's Lease renewals, `LeaseRenewal.usage`), served as kubelet's
//! `/metrics/resource` (`pkg/kubelet/metrics/collectors/resource_metrics.go`) so that
//! metrics-server, `kubectl top node` and the apiserver's node proxy see edge nodes.
//!
//! How the cluster finds a node's replica: the replica that writes a node's status adds an
//! address of type [`ADDRESS_TYPE`] (its own IP, `--resource-metrics-address`) beside the
//! board's own addresses, sets `daemonEndpoints.kubeletEndpoint.Port` to its
//! `--resource-metrics-listen` port, and the Node carries the annotation
//! [`PATH_ANNOTATION`] naming the node's path on the replica ([`node_path`]): metrics-server
//! (`--kubelet-preferred-address-types=EdgebeatGateway,…`, `--kubelet-use-node-status-port`)
//! scrapes that path at that address. The apiserver's node proxy
//! (`/api/v1/nodes/<node>/proxy/metrics/resource`, with the same address type first in its
//! `--kubelet-preferred-address-types`) sends `/metrics/resource` with the original path in
//! `X-Forwarded-Uri`, which names the node.
//!
//! The replica serves them over HTTPS ([`serve`], with [`ResourceMetricsOptions`]),
//! authenticated and authorized as kubelet does it (`cmd/kubelet/app/auth.go`): a client
//! certificate of the client CA or a bearer token (a TokenReview), then a
//! SubjectAccessReview for `get` on the node's `metrics` subresource, both asked of the
//! apiserver through [`Reviews`] and cached for kubelet's default times. The text is
//! kubelet's ([`exposition()`]).

use std::collections::HashMap;

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

/// The latest [`Sample`] of each node this replica holds.
#[derive(Debug, Default)]
pub struct Samples {
    latest: RwLock<HashMap<String, Sample>>,
}

impl Samples {
    /// Records `sample` as `node`'s latest, unless an already recorded one is newer (a late
    /// retry).
    pub fn record(&self, node: &str, sample: Sample) {
        let mut latest = self.latest.write();
        match latest.get_mut(node) {
            Some(held) if held.timestamp_ms >= sample.timestamp_ms => {}
            Some(held) => *held = sample,
            None => {
                latest.insert(node.to_owned(), sample);
            }
        }
    }

    /// Records a node's usage as its agent sent it (`LeaseRenewal.usage`), sampled at
    /// `sampled` on this replica's clock; a usage the host could not read (a 0) is not a
    /// sample (metrics-server drops a node whose CPU or memory is 0).
    pub fn record_usage(
        &self,
        node: &str,
        usage: &edgebeat_proto::ResourceUsage,
        sampled: std::time::SystemTime,
    ) {
        if usage.cpu_usage_ms == 0 || usage.memory_working_set_kib == 0 {
            return;
        }
        let timestamp_ms = sampled
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.record(
            node,
            Sample {
                cpu_usage_ms: usage.cpu_usage_ms,
                memory_working_set_bytes: usage.memory_working_set_kib.saturating_mul(1024),
                timestamp_ms,
            },
        );
    }

    /// Forgets `node` (its slot was swept, or it moved to another replica).
    pub fn remove(&self, node: &str) {
        self.latest.write().remove(node);
    }

    /// `node`'s latest sample.
    pub fn get(&self, node: &str) -> Option<Sample> {
        self.latest.read().get(node).copied()
    }
}

/// Where this replica serves resource metrics, as written into the status of the nodes it
/// writes (`--resource-metrics-address`, the port of `--resource-metrics-listen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// This replica's IP as the cluster reaches it (a pod IP): the node address of type
    /// [`ADDRESS_TYPE`].
    pub address: std::net::IpAddr,
    /// The port: `daemonEndpoints.kubeletEndpoint.Port`.
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
mod cache;
mod exposition;
mod server;

pub use auth::{
    ALLOWED_TTL, CACHE_ENTRIES, DENIED_TTL, REVIEW_TIMEOUT, Reviews, TOKEN_FAILURE_TTL, TOKEN_TTL,
};
pub use cache::ReviewError;
pub use exposition::{EXPOSITION_CONTENT_TYPE, exposition};
pub use server::{
    HEADER_READ_TIMEOUT, IDLE_TIMEOUT, MAX_CONNECTION_AGE, MAX_CONNECTIONS,
    ResourceMetricsCounters, ResourceMetricsOptions, TLS_HANDSHAKE_TIMEOUT, serve,
};

#[cfg(test)]
mod tests;
