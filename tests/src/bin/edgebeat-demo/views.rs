//! What the demo prints, the same for every apiserver: the Ready status a row shows, and one
//! line per Lease renewal.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

/// `[  12.3s] ` since `started`, before each view.
pub fn at(started: Instant) -> String {
    format!("[{:>6.1}s]", started.elapsed().as_secs_f64())
}

/// The `Ready` condition's status (`True`, `False`, `Unknown`), if the node reports one.
pub fn ready_status(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

/// The node's certificate fingerprint the gateway records once the node speaks with its
/// enrolled certificate.
pub fn node_certificate(node: &Node) -> Option<String> {
    node.metadata
        .annotations
        .as_ref()?
        .get("edgebeat.io/node-certificate-sha256")
        .cloned()
}

/// The Lease's `renewTime`.
pub fn renew_time(lease: &Lease) -> Option<jiff::Timestamp> {
    lease.spec.as_ref()?.renew_time.as_ref().map(|t| t.0)
}

/// One renewal: `lease kube-node-lease/<name> renewTime=… holder=… duration=…s
/// resourceVersion=…`.
pub fn lease_line(started: Instant, name: &str, lease: &Lease) -> String {
    let spec = lease.spec.clone().unwrap_or_default();
    format!(
        "{} lease kube-node-lease/{name} renewTime={} holder={} duration={}s resourceVersion={}",
        at(started),
        spec.renew_time
            .map(|t| jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%S%.6fZ", t.0).unwrap_or_default())
            .unwrap_or_default(),
        spec.holder_identity.unwrap_or_default(),
        spec.lease_duration_seconds.unwrap_or_default(),
        lease.metadata.resource_version.clone().unwrap_or_default(),
    )
}
