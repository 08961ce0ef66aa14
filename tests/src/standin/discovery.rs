//! Legacy (unaggregated) discovery documents. kubectl asks for aggregated discovery
//! first; a plain `application/json` answer makes client-go fall back to these.

use std::net::SocketAddr;

use serde_json::{Value, json};

/// `version.Info` of `/version`.
pub(crate) fn version() -> Value {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        other => other,
    };
    json!({
        "major": "1",
        "minor": "36",
        "emulationMajor": "1",
        "emulationMinor": "36",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "35",
        "gitVersion": "v1.36.0-edgebeat-standin",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": format!("{}/{arch}", std::env::consts::OS),
    })
}

/// `/api`: APIVersions.
pub(crate) fn api_versions(addr: SocketAddr) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr.to_string()}],
    })
}

const ALL: [&str; 7] = [
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// `/api/v1`: APIResourceList of the core resources the stand-in serves.
pub(crate) fn core_resources() -> Value {
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {"name": "events", "singularName": "event", "namespaced": true, "kind": "Event",
             "verbs": ALL, "shortNames": ["ev"]},
            {"name": "namespaces", "singularName": "namespace", "namespaced": false, "kind": "Namespace",
             "verbs": ["get", "list", "watch"], "shortNames": ["ns"]},
            {"name": "nodes", "singularName": "node", "namespaced": false, "kind": "Node",
             "verbs": ALL, "shortNames": ["no"]},
            {"name": "nodes/status", "singularName": "", "namespaced": false, "kind": "Node",
             "verbs": ["get", "patch", "update"]},
            {"name": "secrets", "singularName": "secret", "namespaced": true, "kind": "Secret",
             "verbs": ALL},
        ],
    })
}

/// The API groups served besides the core group, in the order `/apis` lists them (the
/// kube-aggregator's group priorities put certificates before coordination).
pub(crate) const GROUPS: [&str; 2] = ["certificates.k8s.io", "coordination.k8s.io"];

/// The `APIGroup` entry of `group` (only `v1` is served).
fn api_group(group: &str) -> Value {
    let gv = format!("{group}/v1");
    json!({
        "name": group,
        "versions": [{"groupVersion": gv, "version": "v1"}],
        "preferredVersion": {"groupVersion": gv, "version": "v1"},
    })
}

/// `/apis`: APIGroupList.
pub(crate) fn api_groups() -> Value {
    let groups: Vec<Value> = GROUPS.into_iter().map(api_group).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`: APIGroup.
pub(crate) fn group(group: &str) -> Value {
    let mut g = api_group(group);
    if let Some(m) = g.as_object_mut() {
        m.insert("kind".into(), "APIGroup".into());
        m.insert("apiVersion".into(), "v1".into());
    }
    g
}

/// `/apis/<group>/v1`: APIResourceList of the group's resources the stand-in serves.
pub(crate) fn group_resources(group: &str) -> Value {
    let resources = match group {
        "coordination.k8s.io" => json!([
            {"name": "leases", "singularName": "lease", "namespaced": true, "kind": "Lease",
             "verbs": ALL},
        ]),
        "certificates.k8s.io" => json!([
            {"name": "certificatesigningrequests", "singularName": "certificatesigningrequest",
             "namespaced": false, "kind": "CertificateSigningRequest", "verbs": ALL,
             "shortNames": ["csr"]},
            {"name": "certificatesigningrequests/approval", "singularName": "",
             "namespaced": false, "kind": "CertificateSigningRequest",
             "verbs": ["get", "patch", "update"]},
            {"name": "certificatesigningrequests/status", "singularName": "",
             "namespaced": false, "kind": "CertificateSigningRequest",
             "verbs": ["get", "patch", "update"]},
        ]),
        _ => json!([]),
    };
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{group}/v1"),
        "resources": resources,
    })
}
