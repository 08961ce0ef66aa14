//! The stand-in apiserver seen through the real kube-rs client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use edgebeat_tests::standin::{FaultRule, StandIn, StandInHandle};
use futures_util::{StreamExt, TryStreamExt};
use http::Method;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(10);
const LEASE_NS: &str = "kube-node-lease";

async fn setup() -> (StandInHandle, kube::Client) {
    let standin = StandIn::start().await.unwrap();
    let client = standin.kube_client().unwrap();
    (standin, client)
}

/// A Node create body in kubelet's shape (`pkg/kubelet/kubelet_node_status.go: initialNode`).
fn node_body(name: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64"},
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"taints": [{"key": "example.com/edge", "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "4", "memory": "8011400Ki", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "7909000Ki", "pods": "110"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                 "message": "kubelet has sufficient memory available",
                 "lastHeartbeatTime": "2025-05-14T09:20:00Z", "lastTransitionTime": "2025-05-14T09:20:00Z"},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
                 "message": "kubelet has no disk pressure",
                 "lastHeartbeatTime": "2025-05-14T09:20:00Z", "lastTransitionTime": "2025-05-14T09:20:00Z"},
                {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID",
                 "message": "kubelet has sufficient PID available",
                 "lastHeartbeatTime": "2025-05-14T09:20:00Z", "lastTransitionTime": "2025-05-14T09:20:00Z"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": "2025-05-14T09:20:00Z", "lastTransitionTime": "2025-05-14T09:20:00Z"},
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.21"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.6.31+rpt-rpi-v8",
                         "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.13",
                         "kubeletVersion": "v1.30.2", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "arm64"},
        },
    }))
    .unwrap()
}

fn lease_body(name: &str, node_uid: &str, renew: &str) -> Lease {
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": LEASE_NS,
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": renew},
    }))
    .unwrap()
}

fn api_err(e: kube::Error) -> (u16, String, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason, s.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn cond_types(node: &Node) -> Vec<String> {
    node.status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.type_.clone())
        .collect()
}

/// A raw request through kube's client (for bodies the typed API cannot produce).
async fn raw(
    client: &kube::Client,
    method: Method,
    path: &str,
    content_type: &str,
    body: Value,
) -> Result<Value, kube::Error> {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    client.request::<Value>(req).await
}

#[tokio::test]
async fn node_create_assigns_identity_and_second_create_is_already_exists() {
    let (standin, client) = setup().await;
    let nodes: Api<Node> = Api::all(client);
    let created = nodes
        .create(&PostParams::default(), &node_body("edge-01"))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert_eq!(meta.uid.as_ref().unwrap().len(), 36, "uuid-like uid");
    assert!(
        meta.resource_version
            .as_ref()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert!(meta.creation_timestamp.is_some());
    // status is kept on create (kubelet registers with its status)
    assert_eq!(
        cond_types(&created),
        ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    );

    let (code, reason, message) = api_err(
        nodes
            .create(&PostParams::default(), &node_body("edge-01"))
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(message, r#"nodes "edge-01" already exists"#);

    let listed = nodes.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(
        listed.metadata.resource_version.as_deref(),
        Some(standin.resource_version().to_string().as_str())
    );
    assert_eq!(nodes.get("edge-01").await.unwrap().metadata.uid, meta.uid);
    assert_eq!(standin.nodes().len(), 1);

    let (code, reason, _) = api_err(nodes.get("nope").await.unwrap_err());
    assert_eq!((code, reason.as_str()), (404, "NotFound"));

    // a resourceVersion on create is a server error, as with the etcd3 store
    let mut with_rv = node_body("edge-02");
    with_rv.metadata.resource_version = Some("5".into());
    let (code, _, message) = api_err(
        nodes
            .create(&PostParams::default(), &with_rv)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, message.as_str()),
        (
            500,
            "resourceVersion should not be set on objects to be created"
        )
    );

    let deleted = nodes
        .delete("edge-01", &DeleteParams::default())
        .await
        .unwrap();
    assert!(deleted.is_right(), "nodes answer DELETE with a Status");
    assert!(standin.node("edge-01").is_none());
}

#[tokio::test]
async fn status_patch_merges_conditions_by_type_keeping_order_and_transition_times() {
    let (standin, client) = setup().await;
    let nodes: Api<Node> = Api::all(client);
    let before = nodes
        .create(&PostParams::default(), &node_body("edge-01"))
        .await
        .unwrap();
    let rv_before: u64 = before.metadata.resource_version.unwrap().parse().unwrap();

    // kubelet's periodic "nothing changed" report (spec §1.7)
    let patch = json!({"status": {
        "$setElementOrder/conditions": [{"type": "MemoryPressure"}, {"type": "DiskPressure"}, {"type": "PIDPressure"}, {"type": "Ready"}],
        "conditions": [
            {"type": "MemoryPressure", "lastHeartbeatTime": "2025-05-14T09:25:03Z"},
            {"type": "DiskPressure", "lastHeartbeatTime": "2025-05-14T09:25:03Z"},
            {"type": "PIDPressure", "lastHeartbeatTime": "2025-05-14T09:25:03Z"},
            {"type": "Ready", "lastHeartbeatTime": "2025-05-14T09:25:03Z"}]}});
    let patched = nodes
        .patch_status("edge-01", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap();
    assert!(
        patched
            .metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > rv_before
    );
    assert_eq!(
        cond_types(&patched),
        ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    );
    for c in patched
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
    {
        assert_eq!(
            c.last_heartbeat_time.as_ref().unwrap().0.to_string(),
            "2025-05-14T09:25:03Z"
        );
        assert_eq!(
            c.last_transition_time.as_ref().unwrap().0.to_string(),
            "2025-05-14T09:20:00Z"
        );
        assert!(c.reason.is_some(), "fields not in the patch are kept");
    }
    let ready = standin
        .node("edge-01")
        .unwrap()
        .status
        .unwrap()
        .conditions
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(
        (ready.type_.as_str(), ready.status.as_str()),
        ("Ready", "True")
    );

    // $setElementOrder decides the order
    let reorder = json!({"status": {
        "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "MemoryPressure"}, {"type": "DiskPressure"}, {"type": "PIDPressure"}],
        "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady", "lastTransitionTime": "2025-05-14T09:26:00Z"}]}});
    let patched = nodes
        .patch_status(
            "edge-01",
            &PatchParams::default(),
            &Patch::Strategic(reorder),
        )
        .await
        .unwrap();
    assert_eq!(
        cond_types(&patched),
        ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"]
    );
    let ready = &patched
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("False", Some("KubeletNotReady"))
    );
    assert_eq!(
        ready.message.as_deref(),
        Some("kubelet is posting ready status"),
        "merged, not replaced"
    );

    let reqs = standin.requests();
    let patch_req = reqs.iter().find(|r| r.method == Method::PATCH).unwrap();
    assert_eq!(patch_req.path, "/api/v1/nodes/edge-01/status");
    assert_eq!(
        patch_req.content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    assert_eq!(patch_req.status, 200);
    assert!(patch_req.json().unwrap()["status"]["$setElementOrder/conditions"].is_array());
}

#[tokio::test]
async fn status_patch_addresses_replace_directive_and_merge_by_type() {
    let (_standin, client) = setup().await;
    let nodes: Api<Node> = Api::all(client);
    nodes
        .create(&PostParams::default(), &node_body("edge-01"))
        .await
        .unwrap();
    let addrs = |n: &Node| -> Vec<(String, String)> {
        n.status
            .as_ref()
            .unwrap()
            .addresses
            .as_ref()
            .unwrap()
            .iter()
            .map(|a| (a.type_.clone(), a.address.clone()))
            .collect()
    };

    // Without the directive, addresses merge by type: a second InternalIP overwrites the first.
    let merge = json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.22"}]}});
    let n = nodes
        .patch_status("edge-01", &PatchParams::default(), &Patch::Strategic(merge))
        .await
        .unwrap();
    assert_eq!(
        addrs(&n),
        [
            ("InternalIP".into(), "10.0.0.22".into()),
            ("Hostname".into(), "edge-01".into())
        ]
    );

    // kubelet's fixupPatchForNodeStatusAddresses: full list + {"$patch":"replace"}
    let replace = json!({"status": {"addresses": [
        {"type": "InternalIP", "address": "10.0.0.23"},
        {"type": "InternalIP", "address": "fd00::23"},
        {"type": "Hostname", "address": "edge-01"},
        {"$patch": "replace"}]}});
    let n = nodes
        .patch_status(
            "edge-01",
            &PatchParams::default(),
            &Patch::Strategic(replace),
        )
        .await
        .unwrap();
    assert_eq!(
        addrs(&n),
        [
            ("InternalIP".into(), "10.0.0.23".into()),
            ("InternalIP".into(), "fd00::23".into()),
            ("Hostname".into(), "edge-01".into())
        ]
    );
}

#[tokio::test]
async fn status_patch_drops_spec_keeps_labels_and_main_patch_drops_status() {
    let (standin, client) = setup().await;
    let nodes: Api<Node> = Api::all(client);
    nodes
        .create(&PostParams::default(), &node_body("edge-01"))
        .await
        .unwrap();

    let patch = json!({
        "metadata": {"labels": {"edgebeat.io/site": "plant-7"}, "annotations": {"edgebeat.io/skew-ms": "12"}},
        "spec": {"unschedulable": true, "taints": []},
        "status": {"nodeInfo": {"bootID": "b2"}}});
    let n = nodes
        .patch_status("edge-01", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap();
    assert_eq!(
        n.metadata.labels.as_ref().unwrap()["edgebeat.io/site"],
        "plant-7"
    );
    assert_eq!(
        n.metadata.annotations.as_ref().unwrap()["edgebeat.io/skew-ms"],
        "12"
    );
    let spec = n.spec.as_ref().unwrap();
    assert_eq!(
        spec.unschedulable, None,
        "spec changes sent to /status are dropped"
    );
    assert_eq!(spec.taints.as_ref().unwrap().len(), 1);
    assert_eq!(
        n.status
            .as_ref()
            .unwrap()
            .node_info
            .as_ref()
            .unwrap()
            .boot_id,
        "b2"
    );

    // and the other way round: status sent to the main resource is dropped
    let main = json!({"metadata": {"labels": {"edgebeat.io/rack": "r1"}}, "status": {"nodeInfo": {"bootID": "b3"}}});
    let n = nodes
        .patch("edge-01", &PatchParams::default(), &Patch::Strategic(main))
        .await
        .unwrap();
    assert_eq!(
        n.metadata.labels.as_ref().unwrap()["edgebeat.io/rack"],
        "r1"
    );
    assert_eq!(
        n.status
            .as_ref()
            .unwrap()
            .node_info
            .as_ref()
            .unwrap()
            .boot_id,
        "b2"
    );

    // taints are not a merge list: a strategic merge patch replaces them whole
    let taints = json!({"spec": {"taints": [{"key": "example.com/other", "effect": "NoExecute"}]}});
    let n = nodes
        .patch(
            "edge-01",
            &PatchParams::default(),
            &Patch::Strategic(taints),
        )
        .await
        .unwrap();
    let keys: Vec<_> = n
        .spec
        .unwrap()
        .taints
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert_eq!(keys, ["example.com/other"]);

    // an unchanged patch is not a write
    let rv = standin.resource_version();
    let same = json!({"metadata": {"labels": {"edgebeat.io/rack": "r1"}}});
    nodes
        .patch("edge-01", &PatchParams::default(), &Patch::Strategic(same))
        .await
        .unwrap();
    assert_eq!(standin.resource_version(), rv);

    let (code, reason, _) = api_err(
        nodes
            .patch_status(
                "ghost",
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
}

#[tokio::test]
async fn merge_patch_replaces_conditions_whole_and_other_patch_types() {
    let (_standin, client) = setup().await;
    let nodes: Api<Node> = Api::all(client);
    nodes
        .create(&PostParams::default(), &node_body("edge-01"))
        .await
        .unwrap();
    let merge = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2025-05-14T09:25:03Z"}]}});
    let n = nodes
        .patch_status("edge-01", &PatchParams::default(), &Patch::Merge(merge))
        .await
        .unwrap();
    assert_eq!(
        cond_types(&n),
        ["Ready"],
        "a JSON merge patch replaces the list (RFC 7386: arrays are replaced whole)"
    );
    let ready = &n.status.as_ref().unwrap().conditions.as_ref().unwrap()[0];
    assert!(
        ready.last_transition_time.is_none(),
        "and loses lastTransitionTime"
    );

    let apply =
        Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-01"}}));
    let (code, reason, _) = api_err(
        nodes
            .patch("edge-01", &PatchParams::apply("test"), &apply)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (415, "UnsupportedMediaType"));
}

#[tokio::test]
async fn lease_put_needs_a_fresh_resource_version() {
    let (standin, client) = setup().await;
    let node = Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node_body("edge-01"))
        .await
        .unwrap();
    let uid = node.metadata.uid.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NS);

    let created = leases
        .create(
            &PostParams::default(),
            &lease_body("edge-01", &uid, "2025-05-14T09:21:07.482913Z"),
        )
        .await
        .unwrap();
    let rv1 = created.metadata.resource_version.clone().unwrap();
    let (code, reason, _) = api_err(
        leases
            .create(
                &PostParams::default(),
                &lease_body("edge-01", &uid, "2025-05-14T09:21:07.482913Z"),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));

    // renew with the cached object: OK
    let mut renew = created.clone();
    renew.spec.as_mut().unwrap().renew_time =
        Some(MicroTime("2025-05-14T09:21:17.500001Z".parse().unwrap()));
    let renewed = leases
        .replace("edge-01", &PostParams::default(), &renew)
        .await
        .unwrap();
    let rv2 = renewed.metadata.resource_version.clone().unwrap();
    assert_ne!(rv1, rv2);
    assert_eq!(
        standin
            .lease(LEASE_NS, "edge-01")
            .unwrap()
            .spec
            .unwrap()
            .renew_time
            .unwrap()
            .0
            .to_string(),
        "2025-05-14T09:21:17.500001Z"
    );

    // the stale resourceVersion: 409 Conflict with the real message
    let (code, reason, message) = api_err(
        leases
            .replace("edge-01", &PostParams::default(), &renew)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(
        message,
        "Operation cannot be fulfilled on leases.coordination.k8s.io \"edge-01\": the object has been modified; please apply your changes to the latest version and try again"
    );

    // no resourceVersion: 422, leases do not allow unconditional updates
    let mut unconditional = renewed.clone();
    unconditional.metadata.resource_version = None;
    let (code, reason, message) = api_err(
        leases
            .replace("edge-01", &PostParams::default(), &unconditional)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        message,
        "leases.coordination.k8s.io \"edge-01\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
    );

    // another writer: the next PUT with our last resourceVersion conflicts, a GET recovers
    assert!(standin.bump_lease(LEASE_NS, "edge-01"));
    let mut next = renewed.clone();
    next.spec.as_mut().unwrap().renew_time =
        Some(MicroTime("2025-05-14T09:21:27.000000Z".parse().unwrap()));
    let (code, _, _) = api_err(
        leases
            .replace("edge-01", &PostParams::default(), &next)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 409);
    next.metadata.resource_version = leases
        .get("edge-01")
        .await
        .unwrap()
        .metadata
        .resource_version;
    leases
        .replace("edge-01", &PostParams::default(), &next)
        .await
        .unwrap();

    // PUT to a missing lease creates it (AllowCreateOnUpdate)
    let other = lease_body("edge-02", &uid, "2025-05-14T09:21:07.000000Z");
    leases
        .replace("edge-02", &PostParams::default(), &other)
        .await
        .unwrap();
    assert!(
        standin
            .lease(LEASE_NS, "edge-02")
            .unwrap()
            .metadata
            .uid
            .is_some()
    );
    let put = standin
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.method == Method::PUT)
        .unwrap();
    assert_eq!(put.status, 201);

    // leaseDurationSeconds must be positive
    let mut zero = lease_body("edge-03", &uid, "2025-05-14T09:21:07.000000Z");
    zero.spec.as_mut().unwrap().lease_duration_seconds = Some(0);
    let (code, _, message) = api_err(
        leases
            .create(&PostParams::default(), &zero)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert!(
        message.ends_with("spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"),
        "{message}"
    );

    // the all-namespaces list
    let all: Api<Lease> = Api::all(client);
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
}

#[tokio::test]
async fn lease_micro_time_needs_exactly_six_fractional_digits_in_utc() {
    let (standin, client) = setup().await;
    let path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    let body = |name: &str, renew: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": name}, "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": renew}})
    };
    for (renew, needle) in [
        (
            "2025-05-14T09:21:07.482913123Z",
            r#"cannot parse "123Z" as "Z07:00""#,
        ),
        ("2025-05-14T09:21:07Z", r#"cannot parse "Z" as ".000000""#),
        (
            "2025-05-14T09:21:07.482Z",
            r#"cannot parse ".482Z" as ".000000""#,
        ),
        (
            "2025-05-14T11:21:07.482913+02:00",
            "requires MicroTime in UTC",
        ),
    ] {
        let (code, reason, message) = api_err(
            raw(
                &client,
                Method::POST,
                path,
                "application/json",
                body("edge-01", renew),
            )
            .await
            .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (400, "BadRequest"), "{renew}");
        assert!(
            message
                .starts_with("Lease in version \"v1\" cannot be handled as a Lease: parsing time"),
            "{message}"
        );
        assert!(message.contains(needle), "{renew}: {message}");
    }
    assert!(standin.leases().is_empty());

    let ok = raw(
        &client,
        Method::POST,
        path,
        "application/json",
        body("edge-01", "2025-05-14T09:21:07.482913Z"),
    )
    .await
    .unwrap();
    assert_eq!(ok["spec"]["renewTime"], "2025-05-14T09:21:07.482913Z");

    // the same value through a patch fails in conversion: 422
    let patch = json!({"spec": {"renewTime": "2025-05-14T09:21:08.1Z"}});
    let (code, reason, _) = api_err(
        raw(
            &client,
            Method::PATCH,
            &format!("{path}/edge-01"),
            "application/merge-patch+json",
            patch,
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
}

#[tokio::test]
async fn events_post_list_and_namespace_rules() {
    let (standin, client) = setup().await;
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "edge-01.17f0a1b2c3d4e5f6"},
        "involvedObject": {"kind": "Node", "name": "edge-01", "uid": "edge-01"},
        "reason": "Rebooted", "message": "Node edge-01 has been rebooted, boot id: b2", "type": "Warning",
        "source": {"component": "kubelet", "host": "edge-01"},
        "firstTimestamp": "2025-05-14T09:20:00Z", "lastTimestamp": "2025-05-14T09:20:00Z", "count": 1,
    }))
    .unwrap();
    let default_events: Api<Event> = Api::namespaced(client.clone(), "default");
    let created = default_events
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(
        default_events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let all: Api<Event> = Api::all(client.clone());
    let listed = all
        .list(&ListParams::default().fields("involvedObject.name=edge-01,reason=Rebooted"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(standin.events()[0].reason.as_deref(), Some("Rebooted"));

    // an event about a cluster-scoped Node may only live in "default"
    let system: Api<Event> = Api::namespaced(client.clone(), "kube-system");
    let (code, _, message) = api_err(
        system
            .create(&PostParams::default(), &event)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert!(
        message.contains(
            "involvedObject.namespace: Invalid value: \"\": does not match event.namespace"
        ),
        "{message}"
    );

    // writes into a namespace that does not exist: the NamespaceLifecycle 404
    let nowhere: Api<Event> = Api::namespaced(client, "nowhere");
    let (code, reason, message) = api_err(
        nowhere
            .create(&PostParams::default(), &event)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (404, "NotFound", "namespaces \"nowhere\" not found")
    );
}

#[tokio::test]
async fn faults_answer_then_clear_and_drops_fail_the_client() {
    let (standin, retrying) = setup().await;
    // kube 5 retries 429/503/504 by default (Config::default_retry); see the answers raw.
    let mut config = kube::Config::new(standin.url().parse().unwrap());
    config.default_retry = false;
    let nodes: Api<Node> = Api::all(kube::Client::try_from(config).unwrap());
    nodes
        .create(&PostParams::default(), &node_body("edge-01"))
        .await
        .unwrap();

    standin.inject(FaultRule::status(
        Some(Method::GET),
        "/api/v1/nodes",
        503,
        1,
    ));
    let (code, reason, _) = api_err(nodes.get("edge-01").await.unwrap_err());
    assert_eq!((code, reason.as_str()), (503, "ServiceUnavailable"));
    assert!(standin.faults().is_empty(), "the rule is used up");
    nodes.get("edge-01").await.unwrap();

    standin.inject(FaultRule::status(None, "/status", 429, 2));
    for _ in 0..2 {
        let (code, reason, _) = api_err(
            nodes
                .patch_status(
                    "edge-01",
                    &PatchParams::default(),
                    &Patch::Strategic(json!({"status": {}})),
                )
                .await
                .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (429, "TooManyRequests"));
    }
    nodes
        .patch_status(
            "edge-01",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {}})),
        )
        .await
        .unwrap();

    standin.inject(FaultRule::status(Some(Method::PATCH), "edge-01", 409, 1));
    let (code, reason, message) = api_err(
        nodes
            .patch(
                "edge-01",
                &PatchParams::default(),
                &Patch::Strategic(json!({})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert!(
        message.starts_with("Operation cannot be fulfilled on nodes \"edge-01\""),
        "{message}"
    );

    standin.inject(FaultRule::drop_connection(Some(Method::GET), "edge-01", 1));
    let err = nodes.get("edge-01").await.unwrap_err();
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "a dropped connection is a transport error: {err:?}"
    );
    let dropped = standin
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.method == Method::GET)
        .unwrap();
    assert_eq!(dropped.status, 0);
    nodes.get("edge-01").await.unwrap();

    standin.set_latency(Duration::from_millis(150));
    let t0 = tokio::time::Instant::now();
    nodes.get("edge-01").await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(150));
    standin.inject(FaultRule::status(None, "", 500, 5));
    standin.clear_faults();
    let t0 = tokio::time::Instant::now();
    nodes.get("edge-01").await.unwrap();
    assert!(t0.elapsed() < Duration::from_millis(150));

    // The default client retries a 503 by itself: the caller sees success, the stand-in
    // saw both attempts.
    standin.clear_requests();
    standin.inject(FaultRule::status(
        Some(Method::GET),
        "/api/v1/nodes/edge-01",
        503,
        1,
    ));
    Api::<Node>::all(retrying).get("edge-01").await.unwrap();
    let statuses: Vec<u16> = standin.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503, 200]);
}

async fn next_event<S>(s: &mut S) -> WatchEvent<Node>
where
    S: futures_util::Stream<Item = Result<WatchEvent<Node>, kube::Error>> + Unpin,
{
    tokio::time::timeout(DEADLINE, s.try_next())
        .await
        .expect("watch event in time")
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn watch_delivers_added_then_modified_after_a_patch() {
    let (standin, client) = setup().await;
    let nodes: Api<Node> = Api::all(client);
    nodes
        .create(&PostParams::default(), &node_body("edge-01"))
        .await
        .unwrap();
    let stream = nodes.watch(&WatchParams::default(), "0").await.unwrap();
    let mut stream = Box::pin(stream);
    match next_event(&mut stream).await {
        WatchEvent::Added(n) => assert_eq!(n.metadata.name.as_deref(), Some("edge-01")),
        other => panic!("expected ADDED, got {other:?}"),
    }
    let patch = json!({"status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": "2025-05-14T09:25:03Z"}]}});
    let patched = nodes
        .patch_status("edge-01", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap();
    match next_event(&mut stream).await {
        WatchEvent::Modified(n) => assert_eq!(
            n.metadata.resource_version,
            patched.metadata.resource_version
        ),
        other => panic!("expected MODIFIED, got {other:?}"),
    }

    // resuming from a resourceVersion replays what came after it
    let from = patched.metadata.resource_version.unwrap();
    nodes
        .delete("edge-01", &DeleteParams::default())
        .await
        .unwrap();
    let resumed = nodes.watch(&WatchParams::default(), &from).await.unwrap();
    let mut resumed = Box::pin(resumed);
    assert!(matches!(
        next_event(&mut resumed).await,
        WatchEvent::Deleted(_)
    ));
    assert!(matches!(
        next_event(&mut stream).await,
        WatchEvent::Deleted(_)
    ));

    // shutdown ends open watches
    standin.shutdown();
    let end = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("watch ends on shutdown");
    assert!(end.is_none() || end.unwrap().is_err());
}

#[tokio::test]
async fn requests_are_recorded_with_impersonation_and_warnings() {
    let standin = StandIn::start().await.unwrap();
    let mut config = kube::Config::new(standin.url().parse().unwrap());
    config.auth_info.impersonate = Some("system:node:edge-01".into());
    config.auth_info.impersonate_groups =
        Some(vec!["system:nodes".into(), "system:authenticated".into()]);
    let client = kube::Client::try_from(config).unwrap();

    let mut body = serde_json::to_value(node_body("edge-01")).unwrap();
    body["spec"]["notAField"] = json!(true);
    raw(
        &client,
        Method::POST,
        "/api/v1/nodes",
        "application/json",
        body.clone(),
    )
    .await
    .unwrap();
    let post = standin.requests().pop().unwrap();
    assert_eq!(
        (post.method.as_str(), post.path.as_str(), post.status),
        ("POST", "/api/v1/nodes", 201)
    );
    assert_eq!(
        post.impersonate_user.as_deref(),
        Some("system:node:edge-01")
    );
    assert_eq!(
        post.impersonate_groups,
        ["system:nodes", "system:authenticated"]
    );
    assert_eq!(
        post.warnings,
        [r#"299 - "unknown field \"spec.notAField\"""#]
    );

    body["metadata"]["name"] = json!("edge-02");
    let (code, reason, message) = api_err(
        raw(
            &client,
            Method::POST,
            "/api/v1/nodes?fieldValidation=Strict",
            "application/json",
            body,
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (400, "BadRequest"));
    assert_eq!(
        message,
        r#"strict decoding error: unknown field "spec.notAField""#
    );

    standin.clear_requests();
    assert!(standin.requests().is_empty());
}

#[tokio::test]
async fn wait_until_wakes_on_changes_and_reports_on_timeout() {
    let (standin, client) = setup().await;
    let waiter = standin.clone();
    let wait = tokio::spawn(async move {
        waiter
            .wait_until(DEADLINE, "node edge-01", |v| v.node("edge-01").is_some())
            .await
    });
    Api::<Node>::all(client)
        .create(&PostParams::default(), &node_body("edge-01"))
        .await
        .unwrap();
    wait.await.unwrap().unwrap();

    let err = standin
        .wait_until(Duration::from_millis(50), "a lease that never comes", |v| {
            v.lease(LEASE_NS, "edge-01").is_some()
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a lease that never comes") && err.contains("nodes [edge-01@"),
        "{err}"
    );
}

#[tokio::test]
async fn table_output_for_nodes_and_leases() {
    let (_standin, client) = setup().await;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node_body("edge-01"))
        .await
        .unwrap();
    let req = http::Request::builder()
        .uri("/api/v1/nodes")
        .header(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())
        .unwrap();
    let table: Value = client.request(req).await.unwrap();
    assert_eq!(table["kind"], "Table");
    let cols: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        cols,
        [
            "Name",
            "Status",
            "Roles",
            "Age",
            "Version",
            "Internal-IP",
            "External-IP",
            "OS-Image",
            "Kernel-Version",
            "Container-Runtime"
        ]
    );
    let cells = &table["rows"][0]["cells"];
    assert_eq!(cells[0], "edge-01");
    assert_eq!(cells[1], "Ready");
    assert_eq!(cells[2], "<none>");
    assert_eq!(cells[4], "v1.30.2");
    assert_eq!(cells[5], "10.0.0.21");
    assert_eq!(cells[6], "<none>");
    assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
}
