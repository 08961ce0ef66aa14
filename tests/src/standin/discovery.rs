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
        "minor": "33",
        "emulationMajor": "1",
        "emulationMinor": "33",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "32",
        "gitVersion": "v1.33.0-edgebeat-standin",
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
        ],
    })
}

fn coordination_group() -> Value {
    json!({
        "name": "coordination.k8s.io",
        "versions": [{"groupVersion": "coordination.k8s.io/v1", "version": "v1"}],
        "preferredVersion": {"groupVersion": "coordination.k8s.io/v1", "version": "v1"},
    })
}

/// `/apis`: APIGroupList.
pub(crate) fn api_groups() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [coordination_group()]})
}

/// `/apis/coordination.k8s.io`: APIGroup.
pub(crate) fn coordination() -> Value {
    let mut g = coordination_group();
    if let Some(m) = g.as_object_mut() {
        m.insert("kind".into(), "APIGroup".into());
        m.insert("apiVersion".into(), "v1".into());
    }
    g
}

/// `/apis/coordination.k8s.io/v1`: APIResourceList.
pub(crate) fn coordination_resources() -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "coordination.k8s.io/v1",
        "resources": [
            {"name": "leases", "singularName": "lease", "namespaced": true, "kind": "Lease",
             "verbs": ALL},
        ],
    })
}
