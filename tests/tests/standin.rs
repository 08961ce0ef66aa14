//! The stand-in apiserver seen through the real kube-rs client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use edgebeat_tests::pki::node_csr_pem;
use edgebeat_tests::standin::{FaultRule, StandIn, StandInHandle};
use futures_util::{StreamExt, TryStreamExt};
use http::Method;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Secret};
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
    assert!(
        matches!(end, None | Some(Err(kube::Error::ReadEvents(_)))),
        "{end:?}"
    );
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

// ---- CertificateSigningRequests ----

/// A CSR create body as a careless (or malicious) client would send it: requester fields
/// and a status that the server must ignore.
fn csr_body(name: &str, signer: &str, request_pem: &str) -> CertificateSigningRequest {
    serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "labels": {"edgebeat.io/node": "edge-01"}},
        "spec": {
            "request": ByteString(request_pem.as_bytes().to_vec()),
            "signerName": signer,
            "expirationSeconds": 86400,
            "usages": ["digital signature", "client auth"],
            "username": "mallory", "uid": "forged-uid", "groups": ["system:masters"],
            "extra": {"scopes": ["everything"]},
        },
        "status": {
            "conditions": [{"type": "Approved", "status": "True", "reason": "SelfApproved"}],
            "certificate": ByteString(b"-----BEGIN CERTIFICATE-----\n".to_vec()),
        },
    }))
    .unwrap()
}

/// The gateway's signer name (`gateway/src/enrollment.rs`).
const SIGNER: &str = "edgebeat.io/node-client";

/// `(type, status, reason)` of each condition of `csr`.
fn conditions(csr: &CertificateSigningRequest) -> Vec<(String, String, Option<String>)> {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// `status.certificate` of `csr`.
fn certificate(csr: &CertificateSigningRequest) -> Option<Vec<u8>> {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .map(|c| c.0.clone())
}

/// `csr` with a `ty`=True condition added (no timestamps), as an approver or signer sends
/// it.
fn with_condition(
    mut csr: CertificateSigningRequest,
    ty: &str,
    reason: &str,
) -> CertificateSigningRequest {
    csr.status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new)
        .push(
            serde_json::from_value(json!({"type": ty, "status": "True", "reason": reason}))
                .unwrap(),
        );
    csr
}

/// Code, message and the `details.causes[].field`s of an API error.
fn invalid_causes(e: kube::Error) -> (u16, String, Vec<String>) {
    match e {
        kube::Error::Api(s) => {
            let fields = s
                .details
                .as_ref()
                .map(|d| d.causes.iter().map(|c| c.field.clone()).collect())
                .unwrap_or_default();
            (s.code, s.message, fields)
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn csr_create_records_the_anonymous_requester_and_drops_a_supplied_status() {
    let (standin, client) = setup().await;
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let request = node_csr_pem("system:node:edge-01");
    let created = csrs
        .create(
            &PostParams::default(),
            &csr_body("edge-01-a", SIGNER, &request),
        )
        .await
        .unwrap();
    let spec = &created.spec;
    assert_eq!(spec.username.as_deref(), Some("system:anonymous"));
    assert_eq!(
        spec.groups.as_deref(),
        Some(&["system:unauthenticated".to_string()][..])
    );
    assert_eq!((spec.uid.as_deref(), spec.extra.as_ref()), (None, None));
    assert_eq!(
        spec.request.0,
        request.as_bytes(),
        "the request is kept byte for byte"
    );
    assert_eq!(spec.signer_name, SIGNER);
    assert_eq!(spec.expiration_seconds, Some(86400));
    assert!(
        conditions(&created).is_empty(),
        "no pre-approved requests: {created:?}"
    );
    assert_eq!(certificate(&created), None);
    assert_eq!(created.metadata.uid.as_ref().map(String::len), Some(36));

    // the stored object is what was answered
    let stored = standin.certificate_signing_request("edge-01-a").unwrap();
    assert_eq!(stored, csrs.get("edge-01-a").await.unwrap());
    assert_eq!(stored.spec.username.as_deref(), Some("system:anonymous"));
    let listed = csrs
        .list(&ListParams::default().fields(&format!("spec.signerName={SIGNER}")))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    let other_signer = csrs
        .list(&ListParams::default().fields("spec.signerName=kubernetes.io/kubelet-serving"))
        .await
        .unwrap();
    assert!(other_signer.items.is_empty());

    let (code, reason, message) = api_err(
        csrs.create(
            &PostParams::default(),
            &csr_body("edge-01-a", SIGNER, &request),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(
        message,
        r#"certificatesigningrequests.certificates.k8s.io "edge-01-a" already exists"#
    );
    // CSR names are not DNS names, but they are path segments
    let odd = csrs
        .create(
            &PostParams::default(),
            &csr_body("Edge_01:A", SIGNER, &request),
        )
        .await
        .unwrap();
    assert_eq!(odd.metadata.name.as_deref(), Some("Edge_01:A"));
    let (code, _, message) = api_err(
        csrs.create(&PostParams::default(), &csr_body("a%b", SIGNER, &request))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, message.as_str()),
        (400, r#"Name parameter invalid: "a%b": may not contain '%'"#)
    );
}

#[tokio::test]
async fn csr_create_records_the_impersonated_requester() {
    let standin = StandIn::start().await.unwrap();
    let admin = standin.kube_client().unwrap();
    let body = serde_json::to_vec(&csr_body("alice-a", SIGNER, &node_csr_pem("alice"))).unwrap();
    let req = http::Request::builder()
        .method(Method::POST)
        .uri("/apis/certificates.k8s.io/v1/certificatesigningrequests")
        .header("content-type", "application/json")
        .header("impersonate-user", "alice")
        .header("impersonate-uid", "1f0c1a5e-1111-4222-8333-444455556666")
        .header("impersonate-group", "edge-admins")
        .header("impersonate-group", "ops")
        .header("impersonate-extra-scopes", "view")
        .header("impersonate-extra-scopes", "edit")
        .header("impersonate-extra-example.com%2fteam", "edge")
        .body(body)
        .unwrap();
    let created: CertificateSigningRequest = admin.request(req).await.unwrap();
    let spec = &created.spec;
    assert_eq!(spec.username.as_deref(), Some("alice"));
    assert_eq!(
        spec.uid.as_deref(),
        Some("1f0c1a5e-1111-4222-8333-444455556666")
    );
    assert_eq!(
        spec.groups.as_deref().unwrap(),
        ["edge-admins", "ops", "system:authenticated"]
    );
    let extra = spec.extra.as_ref().unwrap();
    assert_eq!(extra["scopes"], ["view", "edit"]);
    assert_eq!(extra["example.com/team"], ["edge"]);
    assert_eq!(extra.len(), 2);
}

#[tokio::test]
async fn csr_update_of_the_object_changes_only_metadata() {
    let (standin, client) = setup().await;
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let created = csrs
        .create(
            &PostParams::default(),
            &csr_body("edge-01-a", SIGNER, &node_csr_pem("system:node:edge-01")),
        )
        .await
        .unwrap();
    let mut changed = with_condition(created.clone(), "Approved", "SneakedIn");
    changed.spec.signer_name = "example.com/other".into();
    changed.spec.usages = Some(vec!["server auth".into()]);
    changed.spec.username = Some("system:admin".into());
    changed.status.as_mut().unwrap().certificate = Some(ByteString(
        edgebeat_tests::pki::Ca::new("sneaky").cert_pem.into_bytes(),
    ));
    changed
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("reviewed".into(), "yes".into());
    let updated = csrs
        .replace("edge-01-a", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_eq!(
        updated.spec, created.spec,
        "spec is immutable through the object"
    );
    assert_eq!(updated.status, created.status, "so is status");
    assert_eq!(
        updated.metadata.labels.as_ref().unwrap()["reviewed"],
        "yes",
        "metadata changes stick"
    );
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(
        standin.certificate_signing_request("edge-01-a").unwrap(),
        updated
    );

    // a merge patch of the object is held to the same strategy
    let patched = csrs
        .patch(
            "edge-01-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"signerName": "example.com/other"},
                                "status": {"conditions": [{"type": "Denied", "status": "True"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        (patched.spec, patched.status),
        (created.spec, created.status)
    );
}

#[tokio::test]
async fn csr_approval_changes_only_conditions() {
    let (standin, client) = setup().await;
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let created = csrs
        .create(
            &PostParams::default(),
            &csr_body("edge-01-a", SIGNER, &node_csr_pem("system:node:edge-01")),
        )
        .await
        .unwrap();
    let mut approve = with_condition(created.clone(), "Approved", "EdgebeatAutoApproved");
    approve.spec.signer_name = "example.com/other".into();
    approve.status.as_mut().unwrap().certificate = Some(ByteString(
        edgebeat_tests::pki::Ca::new("sneaky").cert_pem.into_bytes(),
    ));
    let approved = csrs
        .replace_subresource("approval", "edge-01-a", &PostParams::default(), &approve)
        .await
        .unwrap();
    assert_eq!(
        conditions(&approved),
        [(
            "Approved".into(),
            "True".into(),
            Some("EdgebeatAutoApproved".into())
        )]
    );
    let cond = &approved
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()[0];
    assert!(cond.last_update_time.is_some() && cond.last_transition_time.is_some());
    assert_eq!(
        approved.spec, created.spec,
        "spec is immutable through /approval"
    );
    assert_eq!(certificate(&approved), None, "/approval cannot issue");
    assert_eq!(
        standin.certificate_signing_request("edge-01-a").unwrap(),
        approved
    );
    // GET of the subresource answers the object
    assert_eq!(
        csrs.get_subresource("approval", "edge-01-a").await.unwrap(),
        approved
    );

    // Approved and Denied exclude each other, and neither can be taken back
    let both = with_condition(approved.clone(), "Denied", "ChangedMyMind");
    let (code, message, fields) = invalid_causes(
        csrs.replace_subresource("approval", "edge-01-a", &PostParams::default(), &both)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert_eq!(
        message,
        r#"CertificateSigningRequest.certificates.k8s.io "edge-01-a" is invalid: status.conditions[1].type: Invalid value: "Denied": Approved and Denied conditions are mutually exclusive"#
    );
    assert_eq!(fields, ["status.conditions[1].type"]);
    let mut withdrawn = approved.clone();
    withdrawn.status.as_mut().unwrap().conditions = Some(Vec::new());
    let (code, message, _) = invalid_causes(
        csrs.replace_subresource("approval", "edge-01-a", &PostParams::default(), &withdrawn)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert_eq!(
        message,
        r#"CertificateSigningRequest.certificates.k8s.io "edge-01-a" is invalid: status.conditions: Forbidden: updates may not remove a condition of type "Approved""#
    );
    // a patch of /approval goes through the same strategy: nothing here may change
    let patched = csrs
        .patch_subresource(
            "approval",
            "edge-01-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"signerName": "example.com/other"},
                                "status": {"certificate": ByteString(b"x".to_vec())}})),
        )
        .await
        .unwrap();
    assert_eq!(
        patched, approved,
        "an update that changes nothing is not written"
    );
    // a stale resourceVersion is a conflict, as for every update
    let (code, reason, _) = api_err(
        csrs.replace_subresource("approval", "edge-01-a", &PostParams::default(), &approve)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(
        standin.certificate_signing_request("edge-01-a").unwrap(),
        approved
    );
}

#[tokio::test]
async fn csr_status_sets_the_certificate_once_and_cannot_approve() {
    let (standin, client) = setup().await;
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let created = csrs
        .create(
            &PostParams::default(),
            &csr_body("edge-01-a", SIGNER, &node_csr_pem("system:node:edge-01")),
        )
        .await
        .unwrap();
    let ca = edgebeat_tests::pki::Ca::new("site");
    let issued = ca.node("edge-01").cert_pem;

    // /status cannot approve
    let (code, message, fields) = invalid_causes(
        csrs.replace_status(
            "edge-01-a",
            &PostParams::default(),
            &with_condition(created.clone(), "Approved", "SelfApproved"),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert_eq!(
        message,
        r#"CertificateSigningRequest.certificates.k8s.io "edge-01-a" is invalid: status.conditions: Forbidden: updates may not add a condition of type "Approved""#
    );
    assert_eq!(fields, ["status.conditions"]);
    // a certificate must be PEM CERTIFICATE blocks of X.509 certificates
    for (garbage, detail) in [
        (
            "not a certificate".to_string(),
            "must contain at least one CERTIFICATE PEM block",
        ),
        (
            node_csr_pem("system:node:edge-01"),
            r#"only CERTIFICATE PEM blocks are allowed, found "CERTIFICATE REQUEST""#,
        ),
    ] {
        let mut bad = created.clone();
        bad.status.as_mut().unwrap().certificate = Some(ByteString(garbage.into_bytes()));
        let (code, message, fields) = invalid_causes(
            csrs.replace_status("edge-01-a", &PostParams::default(), &bad)
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 422);
        assert_eq!(
            message,
            format!(
                r#"CertificateSigningRequest.certificates.k8s.io "edge-01-a" is invalid: status.certificate: Invalid value: "<certificate data>": {detail}"#
            )
        );
        assert_eq!(fields, ["status.certificate"]);
    }

    let approved = csrs
        .replace_subresource(
            "approval",
            "edge-01-a",
            &PostParams::default(),
            &with_condition(created.clone(), "Approved", "EdgebeatAutoApproved"),
        )
        .await
        .unwrap();
    // the signer writes the certificate; its spec edits and its edit of the Approved
    // condition are dropped
    let mut sign = approved.clone();
    sign.spec.usages = Some(vec!["server auth".into()]);
    let status = sign.status.as_mut().unwrap();
    status.certificate = Some(ByteString(issued.clone().into_bytes()));
    status.conditions.as_mut().unwrap()[0].reason = Some("Rewritten".into());
    let signed = csrs
        .replace_status("edge-01-a", &PostParams::default(), &sign)
        .await
        .unwrap();
    assert_eq!(certificate(&signed), Some(issued.clone().into_bytes()));
    assert_eq!(signed.spec, created.spec);
    assert_eq!(conditions(&signed), conditions(&approved));
    assert_eq!(
        standin.certificate_signing_request("edge-01-a").unwrap(),
        signed
    );

    // once set, the certificate cannot change
    let mut reissue = signed.clone();
    reissue.status.as_mut().unwrap().certificate =
        Some(ByteString(ca.node("edge-01").cert_pem.into_bytes()));
    let (code, message, fields) = invalid_causes(
        csrs.replace_status("edge-01-a", &PostParams::default(), &reissue)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert_eq!(
        message,
        r#"CertificateSigningRequest.certificates.k8s.io "edge-01-a" is invalid: status.certificate: Forbidden: updates may not modify existing certificate content"#
    );
    assert_eq!(fields, ["status.certificate"]);
    // a signer may add Failed through /status (and it then sticks)
    let failed = csrs
        .replace_status(
            "edge-01-a",
            &PostParams::default(),
            &with_condition(signed.clone(), "Failed", "SignerGaveUp"),
        )
        .await
        .unwrap();
    assert_eq!(conditions(&failed).len(), 2);
    assert_eq!(certificate(&failed), Some(issued.into_bytes()));

    // As kube-apiserver does, /status takes a certificate for a request nobody approved
    // (validation.go has no such rule; signers are trusted to wait for Approved).
    let pending = csrs
        .create(
            &PostParams::default(),
            &csr_body("edge-01-b", SIGNER, &node_csr_pem("system:node:edge-01")),
        )
        .await
        .unwrap();
    let mut early = pending.clone();
    early
        .status
        .get_or_insert_with(Default::default)
        .certificate = Some(ByteString(ca.node("edge-01").cert_pem.into_bytes()));
    let early = csrs
        .replace_status("edge-01-b", &PostParams::default(), &early)
        .await
        .unwrap();
    assert!(certificate(&early).is_some() && conditions(&early).is_empty());
}

#[tokio::test]
async fn csr_validation_of_request_signer_usages_and_duration() {
    let (standin, client) = setup().await;
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let good = node_csr_pem("system:node:edge-01");
    let invalid = |name: &str, e: kube::Error| {
        let (code, message, fields) = invalid_causes(e);
        assert_eq!(code, 422, "{message}");
        let prefix =
            format!(r#"CertificateSigningRequest.certificates.k8s.io "{name}" is invalid: "#);
        (
            message
                .strip_prefix(&prefix)
                .unwrap_or(&message)
                .to_string(),
            fields,
        )
    };

    // not a CERTIFICATE REQUEST block: the value is Go's %#v of the bytes
    let e = csrs
        .create(&PostParams::default(), &csr_body("a", SIGNER, "hi"))
        .await
        .unwrap_err();
    assert_eq!(
        invalid("a", e),
        (
            "spec.request: Invalid value: []byte{0x68, 0x69}: PEM block type must be CERTIFICATE REQUEST"
                .to_string(),
            vec!["spec.request".to_string()]
        )
    );
    // a request whose signature does not verify
    let (label_end, body_end) = (
        good.find('\n').unwrap() + 1,
        good.rfind("-----END").unwrap(),
    );
    let mut der = base64_decode(&good[label_end..body_end]);
    let last = der.len() - 3;
    der[last] ^= 0x01;
    let tampered = format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        base64_encode(&der)
    );
    let e = csrs
        .create(&PostParams::default(), &csr_body("b", SIGNER, &tampered))
        .await
        .unwrap_err();
    let (message, fields) = invalid("b", e);
    assert!(
        message
            .starts_with("spec.request: Invalid value: []byte{0x2d, 0x2d, 0x2d, 0x2d, 0x2d, 0x42")
            && message.ends_with("}: x509: ECDSA verification failure"),
        "{message}"
    );
    assert_eq!(fields, ["spec.request"]);

    // signer name, usages and duration
    let mut body = csr_body("c", "example/signer", &good);
    body.spec.usages = Some(vec![
        "client auth".into(),
        "client auth".into(),
        "teleport".into(),
    ]);
    body.spec.expiration_seconds = Some(300);
    let e = csrs
        .create(&PostParams::default(), &body)
        .await
        .unwrap_err();
    let (message, fields) = invalid("c", e);
    assert_eq!(
        fields,
        [
            "spec.usages[2]",
            "spec.usages[1]",
            "spec.signerName",
            "spec.expirationSeconds"
        ]
    );
    for part in [
        r#"spec.usages[2]: Unsupported value: "teleport": supported values: "any", "cert sign", "client auth""#,
        r#"spec.usages[1]: Duplicate value: "client auth""#,
        r#"spec.signerName: Invalid value: "example": should be a domain with at least two segments separated by dots"#,
        "spec.expirationSeconds: Invalid value: 300: may not specify a duration less than 600 seconds (10 minutes)",
    ] {
        assert!(message.contains(part), "{part:?} missing from {message}");
    }
    let mut body = csr_body("d", "", &good);
    body.spec.usages = None;
    let e = csrs
        .create(&PostParams::default(), &body)
        .await
        .unwrap_err();
    assert_eq!(
        invalid("d", e),
        (
            "[spec.usages: Required value, spec.signerName: Required value]".to_string(),
            vec!["spec.usages".to_string(), "spec.signerName".to_string()]
        )
    );
    assert!(standin.certificate_signing_requests().is_empty());
}

/// Standard base64 of `der`, for hand-made PEM bodies.
fn base64_encode(der: &[u8]) -> String {
    let v = serde_json::to_value(ByteString(der.to_vec())).unwrap();
    v.as_str().unwrap().to_string()
}

/// The DER of a PEM body (base64 lines).
fn base64_decode(body: &str) -> Vec<u8> {
    let clean: String = body.split_whitespace().collect();
    serde_json::from_value::<ByteString>(Value::String(clean))
        .unwrap()
        .0
}

/// The next event of a CSR watch, within [`DEADLINE`].
async fn next_csr_event<S>(s: &mut S) -> WatchEvent<CertificateSigningRequest>
where
    S: futures_util::Stream<Item = Result<WatchEvent<CertificateSigningRequest>, kube::Error>>
        + Unpin,
{
    tokio::time::timeout(DEADLINE, s.try_next())
        .await
        .expect("watch event in time")
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn csr_watch_delivers_added_then_modified_on_approval_and_signing() {
    let (_standin, client) = setup().await;
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let stream = csrs.watch(&WatchParams::default(), "0").await.unwrap();
    let mut stream = Box::pin(stream);
    let created = csrs
        .create(
            &PostParams::default(),
            &csr_body("edge-01-a", SIGNER, &node_csr_pem("system:node:edge-01")),
        )
        .await
        .unwrap();
    match next_csr_event(&mut stream).await {
        WatchEvent::Added(c) => assert_eq!(c, created),
        other => panic!("expected ADDED, got {other:?}"),
    }
    let approved = csrs
        .replace_subresource(
            "approval",
            "edge-01-a",
            &PostParams::default(),
            &with_condition(created, "Approved", "EdgebeatAutoApproved"),
        )
        .await
        .unwrap();
    match next_csr_event(&mut stream).await {
        WatchEvent::Modified(c) => {
            assert_eq!(c, approved);
            assert_eq!(conditions(&c)[0].0, "Approved");
        }
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    let mut sign = approved;
    sign.status.as_mut().unwrap().certificate = Some(ByteString(
        edgebeat_tests::pki::Ca::new("site")
            .node("edge-01")
            .cert_pem
            .into_bytes(),
    ));
    let signed = csrs
        .replace_status("edge-01-a", &PostParams::default(), &sign)
        .await
        .unwrap();
    match next_csr_event(&mut stream).await {
        WatchEvent::Modified(c) => assert_eq!(c, signed),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    // a watch with a signer field selector sees nothing of other signers
    let filtered = csrs
        .watch(
            &WatchParams::default().fields("spec.signerName=kubernetes.io/kubelet-serving"),
            "0",
        )
        .await
        .unwrap();
    let mut filtered = Box::pin(filtered);
    let mut other = csr_body(
        "serving",
        "kubernetes.io/kubelet-serving",
        &node_csr_pem("system:node:edge-01"),
    );
    other.spec.usages = Some(vec!["digital signature".into(), "server auth".into()]);
    csrs.create(&PostParams::default(), &other).await.unwrap();
    match next_csr_event(&mut filtered).await {
        WatchEvent::Added(c) => assert_eq!(c.metadata.name.as_deref(), Some("serving")),
        other => panic!("expected ADDED of the serving CSR, got {other:?}"),
    }
}

// ---- Secrets ----

#[tokio::test]
async fn secret_create_get_list_update_and_type_is_immutable() {
    let (standin, client) = setup().await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let body: Secret = serde_json::from_value(json!({
        "metadata": {"name": "edgebeat-token-abcdef", "labels": {"app": "edgebeat"}},
        "data": {"token-id": ByteString(b"abcdef".to_vec())},
        "stringData": {"token-secret": "0123456789abcdef", "token-id": "overwritten"},
    }))
    .unwrap();
    let created = secrets.create(&PostParams::default(), &body).await.unwrap();
    assert_eq!(created.type_.as_deref(), Some("Opaque"), "defaulted");
    assert_eq!(created.string_data, None, "stringData is never stored");
    let data = created.data.as_ref().unwrap();
    assert_eq!(data["token-secret"].0, b"0123456789abcdef");
    assert_eq!(
        data["token-id"].0, b"overwritten",
        "stringData wins over data"
    );
    assert_eq!(data.len(), 2);
    assert_eq!(secrets.get("edgebeat-token-abcdef").await.unwrap(), created);
    assert_eq!(
        standin.secret("kube-system", "edgebeat-token-abcdef"),
        Some(created.clone())
    );

    let tls: Secret = serde_json::from_value(json!({
        "metadata": {"name": "edgebeat-site-ca"}, "type": "kubernetes.io/tls",
        "data": {"tls.crt": ByteString(b"crt".to_vec()), "tls.key": ByteString(b"key".to_vec())},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &tls).await.unwrap();
    let listed = secrets.list(&ListParams::default()).await.unwrap();
    let names: Vec<_> = listed
        .items
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["edgebeat-site-ca", "edgebeat-token-abcdef"]);
    let by_type = secrets
        .list(&ListParams::default().fields("type=kubernetes.io/tls"))
        .await
        .unwrap();
    assert_eq!(by_type.items.len(), 1);
    let elsewhere = Api::<Secret>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(elsewhere.items.is_empty());
    assert_eq!(
        Api::<Secret>::all(client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );

    // update: data may change, type may not
    let mut update = created.clone();
    update.data.as_mut().unwrap().insert(
        "usage-bootstrap-authentication".into(),
        ByteString(b"true".to_vec()),
    );
    let updated = secrets
        .replace("edgebeat-token-abcdef", &PostParams::default(), &update)
        .await
        .unwrap();
    assert_eq!(updated.data.as_ref().unwrap().len(), 3);
    let mut retype = updated.clone();
    retype.type_ = Some("bootstrap.kubernetes.io/token".into());
    let (code, message, fields) = invalid_causes(
        secrets
            .replace("edgebeat-token-abcdef", &PostParams::default(), &retype)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert_eq!(
        message,
        r#"Secret "edgebeat-token-abcdef" is invalid: type: Invalid value: "bootstrap.kubernetes.io/token": field is immutable"#
    );
    assert_eq!(fields, ["type"]);
    // leaving type out of a PUT defaults it to Opaque, which is a change too
    let mut untyped = serde_json::to_value(&updated).unwrap();
    untyped.as_object_mut().unwrap().remove("type");
    let tls_untyped = {
        let mut v = serde_json::to_value(secrets.get("edgebeat-site-ca").await.unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("type");
        v
    };
    let (code, _, message) = api_err(
        raw(
            &client,
            Method::PUT,
            "/api/v1/namespaces/kube-system/secrets/edgebeat-site-ca",
            "application/json",
            tls_untyped,
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert_eq!(
        message,
        r#"Secret "edgebeat-site-ca" is invalid: type: Invalid value: "Opaque": field is immutable"#
    );
    raw(
        &client,
        Method::PUT,
        "/api/v1/namespaces/kube-system/secrets/edgebeat-token-abcdef",
        "application/json",
        untyped,
    )
    .await
    .unwrap();
    // a patch that changes type is refused the same way
    let (code, _, _) = api_err(
        secrets
            .patch(
                "edgebeat-token-abcdef",
                &PatchParams::default(),
                &Patch::Merge(json!({"type": "kubernetes.io/tls"})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert_eq!(
        standin
            .secret("kube-system", "edgebeat-token-abcdef")
            .unwrap()
            .type_
            .as_deref(),
        Some("Opaque")
    );

    // the keys a well-known type needs, and data key names
    let bad: Secret = serde_json::from_value(json!({
        "metadata": {"name": "half-tls"}, "type": "kubernetes.io/tls",
        "data": {"tls.crt": ByteString(b"crt".to_vec()), "bad/key": ByteString(b"x".to_vec())},
    }))
    .unwrap();
    let (code, message, fields) = invalid_causes(
        secrets
            .create(&PostParams::default(), &bad)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert_eq!(fields, ["data[bad/key]", "data[tls.key]"], "{message}");
    assert!(
        message.contains("data[tls.key]: Required value"),
        "{message}"
    );

    secrets
        .delete("edgebeat-site-ca", &DeleteParams::default())
        .await
        .unwrap();
    assert!(standin.secret("kube-system", "edgebeat-site-ca").is_none());
}
