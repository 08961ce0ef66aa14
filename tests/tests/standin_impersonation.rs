//! The stand-in apiserver's Node authorizer and NodeRestriction for impersonated node
//! identities, seen through the real kube-rs client (`auth_info.impersonate` and
//! `auth_info.impersonate_groups`, sent as `Impersonate-User` / `Impersonate-Group`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use edgebeat_tests::standin::{StandIn, StandInHandle};
use futures_util::TryStreamExt;
use http::Method;
use http_body_util::BodyExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

const LEASE_NS: &str = "kube-node-lease";

/// A client with no impersonation: the cluster admin of these tests.
fn admin(standin: &StandInHandle) -> kube::Client {
    standin.kube_client().unwrap()
}

/// A client that impersonates `user` with `groups`, as the gateway's impersonation mode
/// will.
fn impersonating(standin: &StandInHandle, user: &str, groups: &[&str]) -> kube::Client {
    let mut config = kube::Config::new(standin.url().parse().unwrap());
    config.auth_info.impersonate = Some(user.to_string());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    kube::Client::try_from(config).unwrap()
}

/// The client of node `name`: `system:node:<name>` in group `system:nodes`.
fn as_node(standin: &StandInHandle, name: &str) -> kube::Client {
    impersonating(standin, &format!("system:node:{name}"), &["system:nodes"])
}

fn node_body(name: &str, labels: Value) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": [{"key": "example.com/edge", "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": "2025-05-14T09:20:00Z",
                            "lastTransitionTime": "2025-05-14T09:20:00Z"}],
            "addresses": [{"type": "Hostname", "address": name}],
        },
    }))
    .unwrap()
}

fn kubelet_labels(name: &str) -> Value {
    json!({"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64"})
}

fn lease_body(name: &str, renew: &str) -> Lease {
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": LEASE_NS},
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

/// The answer to a raw request, status code and body, without kube's error mapping.
async fn send(
    client: &kube::Client,
    method: Method,
    path: &str,
    content_type: &str,
    body: Value,
) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap())
}

/// The stand-in with Node `name` and its Lease, created by the admin.
async fn seed(standin: &StandInHandle, name: &str) -> (Node, Lease) {
    let client = admin(standin);
    let node = Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &node_body(name, kubelet_labels(name)),
        )
        .await
        .unwrap();
    let lease = Api::<Lease>::namespaced(client, LEASE_NS)
        .create(
            &PostParams::default(),
            &lease_body(name, "2025-05-14T09:21:07.482913Z"),
        )
        .await
        .unwrap();
    (node, lease)
}

#[tokio::test]
async fn a_node_registers_heartbeats_and_renews_its_own_lease() {
    let standin = StandIn::start().await.unwrap();
    let client = as_node(&standin, "a");
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NS);

    // kubelet's registration: labels from its allowed set, plus taints on create
    let mut labels = kubelet_labels("a");
    labels["node.kubernetes.io/instance-type"] = json!("rpi5");
    labels["example.com/rack"] = json!("r1");
    let created = nodes
        .create(&PostParams::default(), &node_body("a", labels))
        .await
        .unwrap();
    assert_eq!(created.spec.unwrap().taints.unwrap().len(), 1);
    assert_eq!(
        nodes.get("a").await.unwrap().metadata.name.as_deref(),
        Some("a")
    );

    // status heartbeat (strategic merge patch of /status) and a metadata patch
    let patched = nodes
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "2025-05-14T09:25:00Z"}
            ]}})),
        )
        .await
        .unwrap();
    let ready = &patched.status.unwrap().conditions.unwrap()[0];
    assert_eq!(
        serde_json::to_value(&ready.last_heartbeat_time).unwrap(),
        json!("2025-05-14T09:25:00Z")
    );
    nodes
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "z1"},
                                              "annotations": {"example.com/note": "x"}}}),
            ),
        )
        .await
        .unwrap();
    let stored = standin.node("a").unwrap();
    assert_eq!(
        stored.metadata.labels.unwrap()["topology.kubernetes.io/zone"],
        "z1"
    );

    // its own Lease: create, then renew with the cached resourceVersion
    let lease = leases
        .create(
            &PostParams::default(),
            &lease_body("a", "2025-05-14T09:21:07.482913Z"),
        )
        .await
        .unwrap();
    let mut renew = lease.clone();
    renew.spec.as_mut().unwrap().renew_time =
        Some(MicroTime("2025-05-14T09:21:17.500001Z".parse().unwrap()));
    let renewed = leases
        .replace("a", &PostParams::default(), &renew)
        .await
        .unwrap();
    assert_ne!(
        renewed.metadata.resource_version,
        lease.metadata.resource_version
    );
    assert_eq!(
        standin
            .lease(LEASE_NS, "a")
            .unwrap()
            .spec
            .unwrap()
            .renew_time,
        renew.spec.unwrap().renew_time
    );
    // a stale renewal passes admission and then conflicts, as on a real server
    let (code, reason, _) = api_err(
        leases
            .replace("a", &PostParams::default(), &lease)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(
        leases.get("a").await.unwrap().metadata.name.as_deref(),
        Some("a")
    );

    // events about itself, in `default`
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "a.rebooted", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": "a", "uid": "a"},
        "reason": "Rebooted", "type": "Warning", "message": "Node a has been rebooted",
        "source": {"component": "kubelet", "host": "a"},
    }))
    .unwrap();
    events.create(&PostParams::default(), &event).await.unwrap();
    assert_eq!(standin.events().len(), 1);

    // every request carried the node identity, and every one was answered 2xx or the 409
    let requests = standin.requests();
    assert_eq!(requests.len(), 9);
    for r in &requests {
        assert_eq!(
            r.impersonate_user.as_deref(),
            Some("system:node:a"),
            "{r:?}"
        );
        assert_eq!(r.impersonate_groups, ["system:nodes"], "{r:?}");
        assert!(r.status < 300 || r.status == 409, "{r:?}");
    }
}

#[tokio::test]
async fn a_node_cannot_write_another_nodes_lease_or_status() {
    let standin = StandIn::start().await.unwrap();
    let (node_b, lease_b) = seed(&standin, "b").await;
    let client = as_node(&standin, "a");
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NS);
    let rv = standin.resource_version();

    // the Node authorizer refuses updates of a Lease with another name
    let mut renew = lease_b.clone();
    renew.spec.as_mut().unwrap().renew_time =
        Some(MicroTime("2025-05-14T09:21:17.500001Z".parse().unwrap()));
    let (code, reason, message) = api_err(
        leases
            .replace("b", &PostParams::default(), &renew)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        r#"leases.coordination.k8s.io "b" is forbidden: User "system:node:a" cannot update resource "leases" in API group "coordination.k8s.io" in the namespace "kube-node-lease": can only access node lease with the same name as the requesting node"#
    );
    // the whole Status object, as the apiserver writes it
    let (code, status) = send(
        &client,
        Method::PATCH,
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/b",
        "application/merge-patch+json",
        json!({"spec": {"renewTime": "2025-05-14T09:21:27.000000Z"}}),
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(
        status,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "leases.coordination.k8s.io \"b\" is forbidden: User \"system:node:a\" cannot patch resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"kube-node-lease\": can only access node lease with the same name as the requesting node",
            "reason": "Forbidden",
            "details": {"name": "b", "group": "coordination.k8s.io", "kind": "leases"},
            "code": 403,
        })
    );

    // creating a Lease is authorized for any name; NodeRestriction checks the object
    let (code, reason, message) = api_err(
        leases
            .create(
                &PostParams::default(),
                &lease_body("c", "2025-05-14T09:21:07.482913Z"),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        r#"leases.coordination.k8s.io "c" is forbidden: can only access node lease with the same name as the requesting node"#
    );
    // and only in kube-node-lease
    let mut elsewhere = lease_body("a", "2025-05-14T09:21:07.482913Z");
    elsewhere.metadata.namespace = Some("default".into());
    let (code, _, message) = api_err(
        Api::<Lease>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &elsewhere)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"leases.coordination.k8s.io is forbidden: User "system:node:a" cannot create resource "leases" in API group "coordination.k8s.io" in the namespace "default": can only access leases in the "kube-node-lease" system namespace"#
    );

    // status writes to any Node are authorized; NodeRestriction refuses other names
    let (code, reason, message) = api_err(
        nodes
            .patch_status(
                "b",
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {"conditions": [
                    {"type": "Ready", "status": "False", "reason": "KubeletNotReady"}
                ]}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        r#"nodes "b" is forbidden: node "a" is not allowed to modify node "b""#
    );
    let (code, status) = send(
        &client,
        Method::PUT,
        "/api/v1/nodes/b",
        "application/json",
        serde_json::to_value(&node_b).unwrap(),
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(
        status["details"],
        json!({"name": "b", "kind": "nodes"}),
        "core group: no details.group"
    );
    let (code, _, message) = api_err(
        nodes
            .create(&PostParams::default(), &node_body("c", kubelet_labels("c")))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"nodes "c" is forbidden: node "a" is not allowed to modify node "c""#
    );

    // nothing was written
    assert_eq!(standin.resource_version(), rv);
    assert_eq!(standin.lease(LEASE_NS, "b"), Some(lease_b));
    assert_eq!(standin.node("b"), Some(node_b));
    assert!(standin.node("c").is_none() && standin.lease(LEASE_NS, "c").is_none());
    let refused: Vec<_> = standin
        .requests()
        .into_iter()
        .filter(|r| r.status == 403)
        .collect();
    assert_eq!(refused.len(), 7);
    for r in &refused {
        assert_eq!(r.impersonate_user.as_deref(), Some("system:node:a"));
        assert_eq!(r.impersonate_groups, ["system:nodes"]);
    }
}

#[tokio::test]
async fn a_node_reads_only_its_own_node_and_lease() {
    let standin = StandIn::start().await.unwrap();
    seed(&standin, "a").await;
    seed(&standin, "b").await;
    let client = as_node(&standin, "a");
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NS);

    assert!(nodes.get("a").await.is_ok());
    let (code, _, message) = api_err(nodes.get("b").await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"nodes "b" is forbidden: User "system:node:a" cannot get resource "nodes" in API group "" at the cluster scope: node 'a' cannot read 'b', only its own Node object"#
    );
    let (code, _, message) = api_err(nodes.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"nodes is forbidden: User "system:node:a" cannot list resource "nodes" in API group "" at the cluster scope: node 'a' cannot read all nodes, only its own Node object"#
    );
    // kubelet's informer: list and watch scoped to its own name
    let own = nodes
        .list(&ListParams::default().fields("metadata.name=a"))
        .await
        .unwrap();
    assert_eq!(own.items.len(), 1);
    let mut stream = Box::pin(
        nodes
            .watch(&WatchParams::default().fields("metadata.name=a"), "0")
            .await
            .unwrap(),
    );
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Added(n)) => assert_eq!(n.metadata.name.as_deref(), Some("a")),
        other => panic!("expected ADDED a, got {other:?}"),
    }
    let (code, _, message) = api_err(
        nodes
            .watch(&WatchParams::default().fields("metadata.name=b"), "0")
            .await
            .err()
            .unwrap(),
    );
    assert_eq!(code, 403);
    assert!(message.ends_with("node 'a' cannot read 'b', only its own Node object"));
    // no reads of /status, no deletes
    let (code, status) = send(
        &client,
        Method::GET,
        "/api/v1/nodes/a/status",
        "",
        json!({}),
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(
        status["message"],
        r#"nodes "a" is forbidden: User "system:node:a" cannot get resource "nodes/status" in API group "" at the cluster scope"#
    );
    let (code, _) = send(&client, Method::DELETE, "/api/v1/nodes/a", "", json!({})).await;
    assert_eq!(code, 403);
    assert!(standin.node("a").is_some());

    assert!(leases.get("a").await.is_ok());
    let (code, _, message) = api_err(leases.get("b").await.unwrap_err());
    assert_eq!(code, 403);
    assert!(
        message.ends_with("can only access node lease with the same name as the requesting node")
    );
    let (code, _, message) = api_err(leases.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"leases.coordination.k8s.io is forbidden: User "system:node:a" cannot list resource "leases" in API group "coordination.k8s.io" in the namespace "kube-node-lease": can only get, create, update, patch, or delete a node lease"#
    );
    // events can be written, not read; namespaces are not the node's business
    let (code, _, message) = api_err(
        Api::<Event>::namespaced(client.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"events is forbidden: User "system:node:a" cannot list resource "events" in API group "" in the namespace "default""#
    );
    let (code, status) = send(
        &client,
        Method::GET,
        "/api/v1/namespaces/default",
        "",
        json!({}),
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(
        status["message"],
        r#"namespaces "default" is forbidden: User "system:node:a" cannot get resource "namespaces" in API group "" in the namespace "default""#
    );
    // discovery is not a resource request
    assert!(client.apiserver_version().await.is_ok());
}

#[tokio::test]
async fn node_restriction_guards_labels_taints_and_config_source() {
    let standin = StandIn::start().await.unwrap();
    let client = as_node(&standin, "a");
    let nodes: Api<Node> = Api::all(client.clone());

    // forbidden labels on create, listed sorted; allowed ones are not listed
    let mut labels = kubelet_labels("a");
    labels["node-restriction.kubernetes.io/x"] = json!("y");
    let (code, reason, message) = api_err(
        nodes
            .create(&PostParams::default(), &node_body("a", labels.clone()))
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        r#"nodes "a" is forbidden: node "a" is not allowed to set the following labels: node-restriction.kubernetes.io/x"#
    );
    labels["node-role.kubernetes.io/edge"] = json!("");
    labels["kubelet.kubernetes.io/fine"] = json!("1");
    labels["example.com/fine"] = json!("1");
    let (code, _, message) = api_err(
        nodes
            .create(&PostParams::default(), &node_body("a", labels))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        message.ends_with("labels: node-restriction.kubernetes.io/x, node-role.kubernetes.io/edge"),
        "{message}"
    );
    // admission runs before validation: a forbidden label with an invalid value is a 403
    let (code, _, message) = api_err(
        nodes
            .create(
                &PostParams::default(),
                &node_body(
                    "a",
                    json!({"node-restriction.kubernetes.io/x": "not valid!"}),
                ),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403, "{message}");
    // no configSource (dynamic kubelet config would widen what the node may read)
    let mut with_config = node_body("a", kubelet_labels("a"));
    with_config.spec.as_mut().unwrap().config_source = Some(
        serde_json::from_value(json!({"configMap": {
            "name": "kubelet", "namespace": "kube-system", "kubeletConfigKey": "kubelet"}}))
        .unwrap(),
    );
    let (code, _, message) = api_err(
        nodes
            .create(&PostParams::default(), &with_config)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"nodes "a" is forbidden: node "a" is not allowed to create pods with a non-nil configSource"#
    );
    assert!(standin.node("a").is_none());

    let created = nodes
        .create(&PostParams::default(), &node_body("a", kubelet_labels("a")))
        .await
        .unwrap();
    let taints = created.spec.unwrap().taints;

    // taints are fixed after creation: through /status (whose strategy would drop spec
    // anyway) and through the main resource
    let add_taint = json!({"spec": {"taints": [
        {"key": "example.com/edge", "value": "true", "effect": "NoSchedule"},
        {"key": "example.com/other", "effect": "NoExecute"}]}});
    let (code, _, message) = api_err(
        nodes
            .patch_status(
                "a",
                &PatchParams::default(),
                &Patch::Merge(add_taint.clone()),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"nodes "a" is forbidden: node "a" is not allowed to modify taints"#
    );
    let (code, _, _) = api_err(
        nodes
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": null}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(standin.node("a").unwrap().spec.unwrap().taints, taints);

    // labels: kubelet's may change, others under kubernetes.io may not
    nodes
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kubernetes.io/arch": "amd64"}}})),
        )
        .await
        .unwrap();
    let (code, _, message) = api_err(
        nodes
            .patch_status(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"foo.kubernetes.io/x": "1"}}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"nodes "a" is forbidden: is not allowed to modify labels: foo.kubernetes.io/x"#
    );

    // a restricted label an admin set is no obstacle until the node touches it
    assert!(standin.update_node("a", |n| {
        n.metadata
            .labels
            .get_or_insert_default()
            .insert("node-restriction.kubernetes.io/pool".into(), "edge".into());
    }));
    nodes
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "2025-05-14T09:25:00Z"}
            ]}})),
        )
        .await
        .unwrap();
    let (code, _, message) = api_err(
        nodes
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"node-restriction.kubernetes.io/pool": null}}}),
                ),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(message.ends_with("labels: node-restriction.kubernetes.io/pool"));
    assert_eq!(
        standin.node("a").unwrap().metadata.labels.unwrap()["node-restriction.kubernetes.io/pool"],
        "edge"
    );
}

#[tokio::test]
async fn other_impersonated_users_are_not_node_restricted() {
    let standin = StandIn::start().await.unwrap();
    let (_, lease_b) = seed(&standin, "b").await;
    let status_patch = Patch::Strategic(json!({"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "KubeletNotReady"}
    ]}}));

    // a node user name without the system:nodes group is an ordinary user
    let not_a_node = impersonating(&standin, "system:node:a", &["system:authenticated"]);
    Api::<Node>::all(not_a_node.clone())
        .patch_status("b", &PatchParams::default(), &status_patch)
        .await
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(not_a_node, LEASE_NS);
    leases
        .replace("b", &PostParams::default(), &lease_b)
        .await
        .unwrap();

    // and so is any other user, whatever its groups; several groups are all recorded
    let alice = impersonating(&standin, "alice", &["system:authenticated", "system:nodes"]);
    let nodes: Api<Node> = Api::all(alice);
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let r = standin.requests().pop().unwrap();
    assert_eq!(
        (r.impersonate_user.as_deref(), r.status),
        (Some("alice"), 200)
    );
    assert_eq!(
        r.impersonate_groups,
        ["system:authenticated", "system:nodes"]
    );

    // the node group with a node user: restricted, and the group may come second
    let node_a = impersonating(
        &standin,
        "system:node:a",
        &["system:authenticated", "system:nodes"],
    );
    let (code, _, _) = api_err(
        Api::<Node>::all(node_a)
            .patch_status("b", &PatchParams::default(), &status_patch)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);

    // `system:node:` names no node: every resource request is refused
    let nameless = as_node(&standin, "");
    let (code, _, message) = api_err(Api::<Node>::all(nameless).get("b").await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"nodes "b" is forbidden: User "system:node:" cannot get resource "nodes" in API group "" at the cluster scope: unknown node for user "system:node:""#
    );
}
