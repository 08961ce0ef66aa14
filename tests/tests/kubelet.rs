//! edgebeat beside a real kubelet (issue 50, item 2): kubelet of the control plane's release
//! with containerd behind it (`tests/src/kubelet.rs`) registers this host as one Node; the
//! edgebeat agent, through the real gateway as `deploy/gateway` runs it, reads this host's
//! real facts (`hostRoot: /`) and registers it as another. The two Nodes, their Leases and
//! the Events at their registration are compared field by field, and every difference must
//! be one of [`EXPECTED_DIFFERENCES`] (the table README.md's "Beside a real kubelet"
//! repeats, with the reasons); a listed difference that has disappeared fails too, so the
//! table stays true.
//!
//! Values that differ by nature are compared by what they mean: the Node's name (and a
//! value equal to it, the hostname label, the Lease's holder) as `<node name>`, its UID as
//! `<node uid>`, heartbeat and renew times as "recent", transition times as "between
//! registration and the last heartbeat", kubelet's port as `<kubelet's port>`.
//!
//! Needs root, the control plane (`scripts/control-plane.sh build`), kubelet and containerd
//! (`scripts/kubelet.sh build`) and the gateway and agent built (`scripts/test.sh` does all).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use edgebeat_agent::config::{AgentConfig, EvictionSignal};
use edgebeat_agent::quantity::Amount;
use edgebeat_tests::control_plane::{ControlPlane, DeployedGateway};
use edgebeat_tests::harness::start_agent;
use edgebeat_tests::kubelet::Kubelet;
use edgebeat_tests::wait::eventually;
use serde_json::Value;

/// When a listed difference is expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    /// On every host.
    Always,
    /// When this host's clock is not synchronized (edgebeat's `ClockUnsynchronized` is
    /// True).
    ClockUnsynchronized,
}

/// Every field where edgebeat's Node, Lease or Events differ from kubelet's on this host:
/// (field, when, reason). README.md's "Beside a real kubelet" holds the same table with the
/// values seen.
const EXPECTED_DIFFERENCES: &[(&str, When, &str)] = &[
    (
        "events[NTPNotSynchronized]",
        When::ClockUnsynchronized,
        "edgebeat's own ClockUnsynchronized condition (not kubelet's) announces its transition as kubelet's setters announce theirs; this host's clock is not synchronized",
    ),
    (
        "events[NodeAllocatableEnforced]",
        When::Always,
        "kubelet's container manager enforces allocatable on its kubepods cgroup; there are no pods and no pod cgroups behind an edgebeat node",
    ),
    (
        "events[NodeReady]",
        When::Always,
        "kubelet's first status is NotReady (its container runtime's status check has not completed) and its setter announces the transition to Ready; edgebeat is Ready from its first status (no runtime to wait for), and the setter announces transitions only",
    ),
    (
        "events[Starting]",
        When::Always,
        "kubelet announces its own start (\"Starting kubelet.\"); the agent announces none",
    ),
    (
        "lease.metadata.labels.edgebeat.io/managed-by",
        When::Always,
        "the gateway labels the Leases it writes (edgebeat's own label)",
    ),
    (
        "metadata.annotations.edgebeat.io/node-certificate-not-before",
        When::Always,
        "the gateway records which node certificate speaks for the Node (edgebeat's own annotation)",
    ),
    (
        "metadata.annotations.edgebeat.io/node-certificate-sha256",
        When::Always,
        "as edgebeat.io/node-certificate-not-before",
    ),
    (
        "metadata.annotations.volumes.kubernetes.io/controller-managed-attach-detach",
        When::Always,
        "kubelet's enableControllerAttachDetach (default true) at registration; no volumes are attached to an edgebeat node",
    ),
    (
        "metadata.labels.edgebeat.io/container-runtime",
        When::Always,
        "edgebeat's own label: no container runtime behind the node",
    ),
    (
        "metadata.labels.edgebeat.io/managed-by",
        When::Always,
        "edgebeat's own label: the Node is written by the gateway",
    ),
    (
        "status.allocatable.pods",
        When::Always,
        "maxPods defaults to 0 on purpose: no container runtime behind the node (kubelet: 110)",
    ),
    (
        "status.capacity.pods",
        When::Always,
        "as status.allocatable.pods",
    ),
    (
        "status.conditions (order)",
        When::Always,
        "edgebeat's health conditions come first, then kubelet's four with Ready last",
    ),
    (
        "status.conditions[ClockUnsynchronized]",
        When::Always,
        "a health condition of edgebeat's beyond kubelet's four (clockSyncCondition, on by default)",
    ),
    (
        "status.conditions[ReadonlyFilesystem]",
        When::Always,
        "a health condition of edgebeat's beyond kubelet's four (readonlyFilesystemCondition)",
    ),
    (
        "status.conditions[SystemDiskContentionPressure]",
        When::Always,
        "a health condition of edgebeat's beyond kubelet's four (systemDiskContentionThreshold, io PSI)",
    ),
    (
        "status.conditions[SystemMemoryContentionPressure]",
        When::Always,
        "a health condition of edgebeat's beyond kubelet's four (systemMemoryContentionThreshold, memory PSI)",
    ),
    (
        "status.daemonEndpoints.kubeletEndpoint.Port",
        When::Always,
        "kubelet serves its API on its port (10250 by default, a free one here); the agent serves none, so 0 (the gateway sets a port only when it serves the node's resource metrics)",
    ),
    (
        "status.declaredFeatures",
        When::Always,
        "kubelet v1.36 declares the features it supports (NodeDeclaredFeatures, beta and on by default), each something a pod may need of its node; no pod runs on an edgebeat node (maxPods 0), so it declares none",
    ),
    (
        "status.features.supplementalGroupsPolicy",
        When::Always,
        "kubelet reports it from its container runtime's CRI status; no runtime behind edgebeat",
    ),
    (
        "status.nodeInfo.containerRuntimeVersion",
        When::Always,
        "no container runtime behind edgebeat (kubelet: containerd://<version>)",
    ),
    (
        "status.nodeInfo.kubeletVersion",
        When::Always,
        "edgebeat names the release it follows and its own version (v1.36.0-edgebeat.<version>) on purpose, so kubectl get nodes -o wide tells its nodes and releases apart",
    ),
    (
        "status.runtimeHandlers",
        When::Always,
        "kubelet reports its container runtime's handlers (CRI status); no runtime behind edgebeat",
    ),
];

/// How old a condition's heartbeat may be: kubelet (and edgebeat) report an unchanged
/// status every `nodeStatusReportFrequency` (5 min by default), plus slack.
const HEARTBEAT_WITHIN: i64 = 310;

/// How old the Lease's renewal may be: renewed every 10 s, `leaseDurationSeconds` 40.
const RENEWED_WITHIN: i64 = 40;

/// A Node, its Lease and its Events, as `field → value`, values that differ by nature
/// replaced by what they mean (see the module docs).
struct Facts {
    fields: BTreeMap<String, String>,
}

/// The fields the issue names, present in every comparison: `(absent)` when the object has
/// none, so that "both absent" is a comparison made, not a field skipped.
const ALWAYS: &[&str] = &[
    "status.declaredFeatures",
    "status.daemonEndpoints.kubeletEndpoint.Port",
    "status.nodeInfo.machineID",
    "status.nodeInfo.systemUUID",
    "status.nodeInfo.bootID",
    "status.nodeInfo.kernelVersion",
    "status.nodeInfo.osImage",
    "status.nodeInfo.architecture",
    "status.nodeInfo.operatingSystem",
    "status.nodeInfo.containerRuntimeVersion",
    "status.nodeInfo.kubeletVersion",
    "status.nodeInfo.kubeProxyVersion",
    "spec.taints",
    "lease.spec.holderIdentity",
    "lease.spec.leaseDurationSeconds",
    "lease.spec.renewTime",
    "lease.metadata.ownerReferences",
];

impl Facts {
    fn of(node: &Value, lease: &Value, events: &[Value], kubelet_port: u16) -> Self {
        let name = node["metadata"]["name"].as_str().unwrap().to_owned();
        let uid = node["metadata"]["uid"].as_str().unwrap().to_owned();
        let created = time(&node["metadata"]["creationTimestamp"]).unwrap();
        let now = jiff::Timestamp::now();
        let mut fields = BTreeMap::new();
        let norm = |s: &str| -> String {
            if s == name {
                "<node name>".to_owned()
            } else if s == uid {
                "<node uid>".to_owned()
            } else {
                s.to_owned()
            }
        };

        // metadata: what a Node carries beyond its identity (name, uid, resourceVersion,
        // creationTimestamp and managedFields differ by nature).
        for part in ["labels", "annotations"] {
            flatten(
                &format!("metadata.{part}"),
                &node["metadata"][part],
                &mut fields,
                &norm,
            );
        }
        let mut spec = node["spec"].clone();
        if let Some(taints) = spec.get_mut("taints").map(Value::take) {
            let list: Vec<String> = taints
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    format!(
                        "{}={}:{}",
                        t["key"].as_str().unwrap_or(""),
                        t["value"].as_str().unwrap_or(""),
                        t["effect"].as_str().unwrap_or("")
                    )
                })
                .collect();
            fields.insert("spec.taints".to_owned(), list.join(", "));
        }
        flatten("spec", &spec, &mut fields, &norm);

        let mut status = node["status"].clone();
        if let Some(conditions) = status.get_mut("conditions").map(Value::take) {
            let conditions = conditions.as_array().cloned().unwrap_or_default();
            let order: Vec<&str> = conditions
                .iter()
                .map(|c| c["type"].as_str().unwrap_or("?"))
                .collect();
            fields.insert("status.conditions (order)".to_owned(), order.join(", "));
            for c in &conditions {
                let prefix = format!("status.conditions[{}]", c["type"].as_str().unwrap_or("?"));
                // The condition itself: one row when one side has none (its fields are
                // compared only when both have it).
                fields.insert(
                    prefix.clone(),
                    format!(
                        "{} {}",
                        c["status"].as_str().unwrap_or("?"),
                        c["reason"].as_str().unwrap_or("?")
                    ),
                );
                for key in ["status", "reason", "message"] {
                    fields.insert(
                        format!("{prefix}.{key}"),
                        c[key].as_str().unwrap_or("(absent)").to_owned(),
                    );
                }
                let heartbeat = time(&c["lastHeartbeatTime"]);
                fields.insert(
                    format!("{prefix}.lastHeartbeatTime"),
                    match heartbeat {
                        Some(t) if (now - t).get_seconds() <= HEARTBEAT_WITHIN => {
                            "within nodeStatusReportFrequency".to_owned()
                        }
                        Some(t) => format!("{} s ago", (now - t).get_seconds()),
                        None => "(absent)".to_owned(),
                    },
                );
                let transition = time(&c["lastTransitionTime"]);
                fields.insert(
                    format!("{prefix}.lastTransitionTime"),
                    match (transition, heartbeat) {
                        (Some(t), Some(h)) if (t - created).get_seconds() >= -1 && t <= h => {
                            "between registration and the last heartbeat".to_owned()
                        }
                        (Some(t), _) => format!(
                            "{} s after registration, heartbeat {}",
                            (t - created).get_seconds(),
                            c["lastHeartbeatTime"]
                        ),
                        (None, _) => "(absent)".to_owned(),
                    },
                );
            }
        }
        if let Some(addresses) = status.get_mut("addresses").map(Value::take) {
            let list: Vec<String> = addresses
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| {
                    format!(
                        "{} {}",
                        a["type"].as_str().unwrap_or("?"),
                        norm(a["address"].as_str().unwrap_or("?"))
                    )
                })
                .collect();
            fields.insert("status.addresses".to_owned(), list.join(", "));
        }
        if let Some(handlers) = status.get_mut("runtimeHandlers").map(Value::take) {
            let list: Vec<String> = handlers
                .as_array()
                .into_iter()
                .flatten()
                .map(|h| {
                    format!(
                        "{:?} {}",
                        h["name"].as_str().unwrap_or(""),
                        serde_json::to_string(&h["features"]).unwrap_or_default()
                    )
                })
                .collect();
            fields.insert("status.runtimeHandlers".to_owned(), list.join(", "));
        }
        if let Some(port) = status
            .pointer_mut("/daemonEndpoints/kubeletEndpoint/Port")
            .map(Value::take)
        {
            fields.insert(
                "status.daemonEndpoints.kubeletEndpoint.Port".to_owned(),
                if port.as_u64() == Some(u64::from(kubelet_port)) {
                    "<kubelet's port>".to_owned()
                } else {
                    port.to_string()
                },
            );
        }
        flatten("status", &status, &mut fields, &norm);

        // The Lease: identity aside, its spec and its owner.
        let spec = &lease["spec"];
        fields.insert(
            "lease.spec.holderIdentity".to_owned(),
            norm(spec["holderIdentity"].as_str().unwrap_or("(absent)")),
        );
        fields.insert(
            "lease.spec.leaseDurationSeconds".to_owned(),
            spec["leaseDurationSeconds"].to_string(),
        );
        fields.insert(
            "lease.spec.renewTime".to_owned(),
            match time(&spec["renewTime"]) {
                Some(t) if (now - t).get_seconds() <= RENEWED_WITHIN => {
                    "within leaseDurationSeconds".to_owned()
                }
                Some(t) => format!("{} s ago", (now - t).get_seconds()),
                None => "(absent)".to_owned(),
            },
        );
        for key in [
            "acquireTime",
            "leaseTransitions",
            "preferredHolder",
            "strategy",
        ] {
            if !spec[key].is_null() {
                fields.insert(format!("lease.spec.{key}"), spec[key].to_string());
            }
        }
        let owners: Vec<String> = lease["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| {
                format!(
                    "{}/{} {} uid={} controller={} blockOwnerDeletion={}",
                    o["apiVersion"].as_str().unwrap_or("?"),
                    o["kind"].as_str().unwrap_or("?"),
                    norm(o["name"].as_str().unwrap_or("?")),
                    norm(o["uid"].as_str().unwrap_or("?")),
                    o["controller"],
                    o["blockOwnerDeletion"]
                )
            })
            .collect();
        fields.insert(
            "lease.metadata.ownerReferences".to_owned(),
            owners.join("; "),
        );
        for part in ["labels", "annotations"] {
            flatten(
                &format!("lease.metadata.{part}"),
                &lease["metadata"][part],
                &mut fields,
                &norm,
            );
        }

        // The Events about the Node, by reason: type, who reported it, what it says.
        let mut by_reason: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for e in events {
            let source = e["source"]["component"]
                .as_str()
                .filter(|s| !s.is_empty())
                .or_else(|| e["reportingComponent"].as_str())
                .unwrap_or("?");
            by_reason
                .entry(format!("events[{}]", e["reason"].as_str().unwrap_or("?")))
                .or_default()
                .insert(format!(
                    "{} from {source}: {}",
                    e["type"].as_str().unwrap_or("?"),
                    words_normalized(e["message"].as_str().unwrap_or(""), &name)
                ));
        }
        for (reason, values) in by_reason {
            fields.insert(reason, values.into_iter().collect::<Vec<_>>().join(" | "));
        }
        for key in ALWAYS {
            fields
                .entry((*key).to_owned())
                .or_insert_with(|| "(absent)".to_owned());
        }
        Self { fields }
    }
}

/// `text` with each word that is `name` (trailing punctuation aside) as `<node name>`.
fn words_normalized(text: &str, name: &str) -> String {
    text.split(' ')
        .map(|w| {
            if w.trim_end_matches([',', '.', ':', ';']) == name {
                w.replacen(name, "<node name>", 1)
            } else {
                w.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn time(v: &Value) -> Option<jiff::Timestamp> {
    v.as_str()?.parse().ok()
}

/// `value` as `prefix.key... → text`: arrays of scalars joined by ", ", arrays of objects
/// by index, scalars through `norm`.
fn flatten(
    prefix: &str,
    value: &Value,
    out: &mut BTreeMap<String, String>,
    norm: &dyn Fn(&str) -> String,
) {
    match value {
        Value::Null => {}
        Value::Object(map) => {
            for (k, v) in map {
                flatten(&format!("{prefix}.{k}"), v, out, norm);
            }
        }
        Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
            let joined: Vec<String> = items.iter().map(|i| scalar(i, norm)).collect();
            out.insert(prefix.to_owned(), format!("[{}]", joined.join(", ")));
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), v, out, norm);
            }
        }
        scalar_value => {
            out.insert(prefix.to_owned(), scalar(scalar_value, norm));
        }
    }
}

fn scalar(v: &Value, norm: &dyn Fn(&str) -> String) -> String {
    match v {
        Value::String(s) => norm(s),
        other => other.to_string(),
    }
}

/// One object as kubectl prints it in JSON.
fn get_json(control_plane: &ControlPlane, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&control_plane.kubectl(&all).unwrap()).unwrap()
}

/// The Node `node`, its Lease and Events as [`Facts`], also written as JSON into `dir`
/// (`<node>.json`, for a failing run to be read).
fn snapshot(control_plane: &ControlPlane, node: &str, kubelet_port: u16, dir: &Path) -> Facts {
    let node_json = get_json(control_plane, &["get", "node", node]);
    let lease = get_json(
        control_plane,
        &["-n", "kube-node-lease", "get", "lease", node],
    );
    let selector = format!("involvedObject.kind=Node,involvedObject.name={node}");
    let events = get_json(
        control_plane,
        &["get", "events", "-A", "--field-selector", &selector],
    );
    let events = events["items"].as_array().cloned().unwrap_or_default();
    let all = serde_json::json!({"node": node_json, "lease": lease, "events": events});
    std::fs::write(
        dir.join(format!("{node}.json")),
        serde_json::to_vec_pretty(&all).unwrap(),
    )
    .unwrap();
    Facts::of(&node_json, &lease, &events, kubelet_port)
}

/// Whether `node` is Ready and its Lease exists.
fn ready_with_lease(control_plane: &ControlPlane, node: &str) -> bool {
    let Ok(json) = control_plane.kubectl(&["get", "node", node, "-o", "json"]) else {
        return false;
    };
    let node_json: Value = serde_json::from_str(&json).unwrap_or_default();
    let ready = node_json["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    ready
        && control_plane
            .kubectl(&["-n", "kube-node-lease", "get", "lease", node])
            .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs root, kubelet and containerd (scripts/test.sh)"]
async fn edgebeat_reports_this_host_as_kubelet_does_but_for_the_listed_differences() {
    let control_plane = ControlPlane::start(&[]).unwrap();
    // Hard eviction on memory only, on both sides: whether this host's disk is more than
    // 90 % full (a shared CI machine's can be) is not what is compared, and under the disk
    // thresholds both would report DiskPressure and kubelet EvictionThresholdMet. kubelet's
    // image garbage collection off (imageGCHighThresholdPercent 100): there are no images,
    // and its first run's Event depends on timing and on this disk's usage
    // (InvalidDiskCapacity before cAdvisor's first stats, FreeDiskSpaceFailed above 85 %).
    let mut kubelet = tokio::task::block_in_place(|| {
        Kubelet::start(
            &control_plane,
            "evictionHard:\n  memory.available: 100Mi\nimageGCHighThresholdPercent: 100\n",
        )
    })
    .unwrap();
    let gateway = DeployedGateway::start(&control_plane, &[]).await;
    let node = format!("{}-edgebeat", kubelet.node_name);
    // As a deployed agent runs on this host: its real facts, kubelet's defaults (eviction
    // thresholds, health conditions, intervals), nodefs on kubelet's root directory's
    // filesystem as kubelet's.
    let config = AgentConfig {
        host_root: "/".into(),
        root_dir: kubelet.root_dir.clone(),
        health: Default::default(),
        eviction_hard: BTreeMap::from([(
            EvictionSignal::MemoryAvailable,
            Amount::Absolute(100 * 1024 * 1024),
        )]),
        ..gateway.agent_config(&node)
    };
    let agent = start_agent(config, Arc::new(edgebeat_hw::SystemClock)).unwrap();
    for name in [kubelet.node_name.clone(), node.clone()] {
        eventually(
            &format!("{name} Ready with its Lease"),
            Duration::from_secs(120),
            || {
                let ready = ready_with_lease(&control_plane, &name);
                async move { ready }
            },
        )
        .await;
    }
    // Both past registration: a status update or two (every 10 s), a Lease renewal, the
    // node lifecycle controller's RegisteredNode. A window both run through before the
    // snapshots are compared, not a wait for one state.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let theirs = snapshot(
        &control_plane,
        &kubelet.node_name,
        kubelet.port,
        &kubelet.dir,
    );
    let ours = snapshot(&control_plane, &node, kubelet.port, &kubelet.dir);

    agent.stop().await.unwrap();
    drop(gateway);
    let before = kubelet.before().clone();
    let after = tokio::task::block_in_place(|| kubelet.stop()).unwrap();
    drop(control_plane);

    // Every field of either side, with both values.
    let keys: BTreeSet<&String> = theirs.fields.keys().chain(ours.fields.keys()).collect();
    let absent = "(absent)".to_owned();
    let mut differences = Vec::new();
    for key in keys {
        // A condition one side has not: its own row only.
        if let Some((condition, _)) = key.split_once("].")
            && condition.starts_with("status.conditions[")
        {
            let condition = format!("{condition}]");
            if !theirs.fields.contains_key(&condition) || !ours.fields.contains_key(&condition) {
                continue;
            }
        }
        let k = theirs.fields.get(key).unwrap_or(&absent);
        let e = ours.fields.get(key).unwrap_or(&absent);
        if k != e {
            differences.push((key.clone(), k.clone(), e.clone()));
        }
    }
    let clock_unsynchronized = ours
        .fields
        .get("status.conditions[ClockUnsynchronized]")
        .is_some_and(|c| c.starts_with("True"));
    let listed: BTreeMap<&str, &str> = EXPECTED_DIFFERENCES
        .iter()
        .filter(|(_, when, _)| match when {
            When::Always => true,
            When::ClockUnsynchronized => clock_unsynchronized,
        })
        .map(|(field, _, reason)| (*field, *reason))
        .collect();
    println!(
        "{} fields compared, {} differ:",
        theirs.fields.len().max(ours.fields.len()),
        differences.len()
    );
    println!("| field | kubelet | edgebeat | reason |\n|---|---|---|---|");
    for (key, k, e) in &differences {
        println!(
            "| `{key}` | {k} | {e} | {} |",
            listed
                .get(key.as_str())
                .copied()
                .unwrap_or("**NOT LISTED**")
        );
    }
    let differing: BTreeSet<&str> = differences.iter().map(|(k, _, _)| k.as_str()).collect();
    let unlisted: Vec<&str> = differing
        .iter()
        .copied()
        .filter(|k| !listed.contains_key(k))
        .collect();
    let disappeared: Vec<&str> = listed
        .keys()
        .copied()
        .filter(|k| !differing.contains(k))
        .collect();

    assert_eq!(
        before, after,
        "kubelet and containerd left the machine changed"
    );
    assert!(
        unlisted.is_empty() && disappeared.is_empty(),
        "differences not in EXPECTED_DIFFERENCES: {unlisted:?}; listed ones that no longer differ (remove them from the table and README.md): {disappeared:?}"
    );
}
