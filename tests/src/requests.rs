//! Reading the stand-in's request log: which recorded request is which kubelet call.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;

use crate::standin::RecordedRequest;

/// Collection path of node Leases.
pub const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";

/// `PUT` of `node`'s Lease (a renewal), whatever the answer.
pub fn is_lease_put(r: &RecordedRequest, node: &str) -> bool {
    r.method == http::Method::PUT
        && r.path
            .strip_prefix(LEASES)
            .and_then(|p| p.strip_prefix('/'))
            == Some(node)
}

/// `PUT` of `node`'s Lease answered 200: a renewal written.
pub fn is_lease_renewed(r: &RecordedRequest, node: &str) -> bool {
    is_lease_put(r, node) && r.status == 200
}

/// `GET` of `node`'s Lease.
pub fn is_lease_get(r: &RecordedRequest, node: &str) -> bool {
    r.method == http::Method::GET
        && r.path
            .strip_prefix(LEASES)
            .and_then(|p| p.strip_prefix('/'))
            == Some(node)
}

/// `PATCH nodes/{node}/status`: a status report.
pub fn is_status_patch(r: &RecordedRequest, node: &str) -> bool {
    r.method == http::Method::PATCH && r.path == format!("/api/v1/nodes/{node}/status")
}

/// How many recorded requests match `pred`.
pub fn count(requests: &[RecordedRequest], pred: impl Fn(&RecordedRequest) -> bool) -> usize {
    requests.iter().filter(|r| pred(r)).count()
}

/// `spec.renewTime` in a Lease request body; `None` when the body is not a Lease with one.
pub fn renew_time(r: &RecordedRequest) -> Option<Timestamp> {
    let lease: Lease = serde_json::from_slice(&r.body).ok()?;
    Some(lease.spec?.renew_time?.0)
}

/// The longest time between two consecutive renewals of `node`'s Lease among `requests`
/// (by the `renewTime`s written, in order), or `None` with fewer than two: how long the node
/// looked silent to the node lifecycle controller.
pub fn longest_renewal_gap(requests: &[RecordedRequest], node: &str) -> Option<Duration> {
    let times: Vec<Timestamp> = requests
        .iter()
        .filter(|r| is_lease_renewed(r, node))
        .filter_map(renew_time)
        .collect();
    times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).unsigned_abs())
        .max()
}

/// A list or watch of a collection (the gateway's informer, [`edgebeat_gateway::view`]),
/// not a call made for one node.
pub fn is_collection_read(r: &RecordedRequest) -> bool {
    r.method == http::Method::GET && (r.path == "/api/v1/nodes" || r.path == LEASES)
}

/// A read the gateway makes for itself, not for one node: a list or watch of a collection
/// ([`is_collection_read`]) or the `/version` it asks at start to report the apiserver
/// reachable (`edgebeat_gateway::apiserver::reach`).
pub fn is_gateway_own_read(r: &RecordedRequest) -> bool {
    is_collection_read(r) || (r.method == http::Method::GET && r.path == "/version")
}
