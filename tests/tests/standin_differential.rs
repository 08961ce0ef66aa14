//! The stand-in apiserver (`edgebeat_tests::standin`) beside the real kube-apiserver of the
//! pinned release (`edgebeat_tests::control_plane`): the same calls, with the bodies the
//! gateway itself sends (`edgebeat_gateway::bodies`) and kubelet's, made through kube-rs
//! to each, must get the same status codes and reasons and the same values in the fields
//! the gateway reads (conditions, bootID, labels, addresses, Lease spec, CSR conditions;
//! not capacity, whose quantities only the real one writes canonical). The
//! stand-in stays for what the real one cannot do here (injected faults, the 10,000-node
//! fleet); this keeps what it answers true to the real thing, and a difference fails
//! with both transcripts side by side.
//!
//! Needs the built control plane (`scripts/control-plane.sh build`; `scripts/test.sh` runs
//! it beside `control_plane`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use edgebeat_gateway::bodies;
use edgebeat_proto as pb;
use edgebeat_tests::control_plane::ControlPlane;
use edgebeat_tests::fleet::{FleetOptions, FleetTransport, registered_node};
use edgebeat_tests::pki::node_csr_pem;
use edgebeat_tests::standin::StandIn;
use futures_util::StreamExt;
use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde::Serialize;
use serde_json::{Value, json};

/// One step's outcome: `ok <the fields compared>`, or `<code> <reason>` of the
/// apiserver's Status.
type Transcript = Vec<(&'static str, String)>;

/// `fields` of the answer when it is an object, else the Status's code and reason.
fn outcome<T: Serialize>(result: &Result<T, kube::Error>, fields: &[&str]) -> String {
    match result {
        Ok(object) => {
            let value = serde_json::to_value(object).unwrap();
            let picked: Vec<Value> = fields
                .iter()
                .map(|f| value.pointer(f).cloned().unwrap_or(Value::Null))
                .collect();
            format!("ok {}", Value::Array(picked))
        }
        Err(kube::Error::Api(status)) => format!("{} {}", status.code, status.reason),
        Err(error) => format!("error {error}"),
    }
}

/// Sorted conditions (type, status, reason, message, heartbeat, transition), so the
/// comparison says what differs in one line.
fn conditions_of(node: &Result<Node, kube::Error>) -> String {
    match node {
        Ok(node) => {
            let mut conditions: Vec<String> = node
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .map(|c| {
                    format!(
                        "{}={} {:?} {:?} hb={:?} tr={:?}",
                        c.type_,
                        c.status,
                        c.reason,
                        c.message,
                        c.last_heartbeat_time.as_ref().map(|t| t.0.to_string()),
                        c.last_transition_time.as_ref().map(|t| t.0.to_string()),
                    )
                })
                .collect();
            conditions.sort();
            format!("ok {conditions:?}")
        }
        Err(kube::Error::Api(status)) => format!("{} {}", status.code, status.reason),
        Err(error) => format!("error {error}"),
    }
}

/// A self-signed certificate (PEM), a stand-in for a signer's answer in `status.certificate`.
fn certificate_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["signed.example".to_owned()]).unwrap();
    params.self_signed(&key).unwrap().pem()
}

/// `PUT` of Lease `name` with `body` as bytes, as the gateway renews
/// (`edgebeat_gateway::apiserver::Apiserver::replace_lease`).
async fn put_lease(client: &kube::Client, name: &str, body: Vec<u8>) -> Result<Lease, kube::Error> {
    let request = kube::core::Request::new(format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
        bodies::LEASE_NAMESPACE
    ))
    .replace(name, &PostParams::default(), body)
    .map_err(kube::Error::BuildRequest)?;
    client.request::<Lease>(request).await
}

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// The gateway's Lease body with `renewTime` (or another field) replaced by `value`.
fn lease_with(body: &[u8], field: &str, value: Value) -> Vec<u8> {
    let mut lease: Value = serde_json::from_slice(body).unwrap();
    lease["spec"][field] = value;
    serde_json::to_vec(&lease).unwrap()
}

/// The calls, in order, against `client`; names start with `prefix` (one control plane
/// serves other tests' nodes too).
async fn transcript(client: kube::Client, prefix: &str, node: &Node) -> Transcript {
    let mut t: Transcript = Vec::new();
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), bodies::LEASE_NAMESPACE);
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();

    // ---- Nodes: kubelet's registration, then the gateway's status patches ----
    let options = FleetOptions {
        prefix: prefix.to_owned(),
        ..FleetOptions::new(1, FleetTransport::Grpc(String::new()))
    };
    let registered = at("2026-01-01T00:00:00Z");
    let node = node.clone();
    let name = options.node_name(0);
    let created = nodes.create(&pp, &node).await;
    let uid = created
        .as_ref()
        .ok()
        .and_then(|n| n.metadata.uid.clone())
        .unwrap_or_default();
    t.push(("node: create", conditions_of(&created)));
    t.push((
        "node: create's labels, bootID, capacity, addresses",
        outcome(
            &created,
            &[
                "/metadata/labels",
                "/status/nodeInfo/bootID",
                "/status/addresses",
                "/status/daemonEndpoints",
            ],
        ),
    ));
    t.push((
        "node: create again",
        outcome(&nodes.create(&pp, &node).await, &[]),
    ));
    t.push((
        "node: get one that is not there",
        outcome(&nodes.get(&format!("{prefix}absent")).await, &[]),
    ));
    let mut bad = node.clone();
    bad.metadata.name = Some(format!("{prefix}Not_A_DNS_Name"));
    t.push((
        "node: create, invalid name",
        outcome(&nodes.create(&pp, &bad).await, &[]),
    ));

    // A changed status: MemoryPressure True, as the gateway writes a whole status.
    let mut status = node.status.clone().unwrap();
    let changed = at("2026-01-01T00:00:10Z");
    for c in status.conditions.iter_mut().flatten() {
        c.last_heartbeat_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            changed,
        ));
        if c.type_ == "MemoryPressure" {
            c.status = "True".into();
            c.reason = Some("KubeletHasInsufficientMemory".into());
            c.message = Some("kubelet has insufficient memory available".into());
            c.last_transition_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                changed,
            ));
        }
    }
    let patch = Patch::Strategic(bodies::status_patch(&status, None).unwrap());
    let patched = nodes
        .patch_status(&name, &PatchParams::default(), &patch)
        .await;
    t.push((
        "nodes/status: whole status, one condition changed",
        conditions_of(&patched),
    ));

    // An unchanged report: every condition's lastHeartbeatTime only.
    let heartbeat: Vec<Value> = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        .iter()
        .map(|c| json!({"type": c, "lastHeartbeatTime": "2026-01-01T00:05:10Z"}))
        .collect();
    let heartbeat = json!({"status": {"conditions": heartbeat}});
    let patched = nodes
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(heartbeat))
        .await;
    t.push((
        "nodes/status: heartbeat times only",
        conditions_of(&patched),
    ));

    // A health condition added, then deleted with the strategic-merge delete directive.
    let mut with_health = status.clone();
    with_health.conditions.get_or_insert_default().insert(
        0,
        k8s_openapi::api::core::v1::NodeCondition {
            type_: "ThermalPressure".into(),
            status: "False".into(),
            reason: Some("TemperatureNormal".into()),
            message: Some("simulated".into()),
            last_heartbeat_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                changed,
            )),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                changed,
            )),
        },
    );
    let patch = Patch::Strategic(bodies::status_patch(&with_health, None).unwrap());
    let patched = nodes
        .patch_status(&name, &PatchParams::default(), &patch)
        .await;
    t.push((
        "nodes/status: a health condition added",
        conditions_of(&patched),
    ));
    let delete = bodies::delete_conditions(json!({"status": {}}), ["ThermalPressure"]);
    let patched = nodes
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(delete))
        .await;
    t.push((
        "nodes/status: that condition deleted",
        conditions_of(&patched),
    ));
    let annotations = [("example.com/a".to_owned(), "b".to_owned())].into();
    let patch = Patch::Strategic(bodies::status_patch(&status, Some(&annotations)).unwrap());
    t.push((
        "nodes/status: with an annotation",
        outcome(
            &nodes
                .patch_status(&name, &PatchParams::default(), &patch)
                .await,
            &["/metadata/annotations/example.com~1a"],
        ),
    ));
    t.push((
        "nodes/status: of a Node that is not there",
        outcome(
            &nodes
                .patch_status(&format!("{prefix}absent"), &PatchParams::default(), &patch)
                .await,
            &[],
        ),
    ));

    // ---- Leases: the gateway's create, renewals as bytes, a stale one ----
    let lease_fields: &[&str] = &[
        "/metadata/labels",
        "/metadata/ownerReferences/0/apiVersion",
        "/metadata/ownerReferences/0/kind",
        "/metadata/ownerReferences/0/name",
        "/spec/holderIdentity",
        "/spec/leaseDurationSeconds",
        "/spec/renewTime",
    ];
    let created = leases
        .create(
            &pp,
            &bodies::new_lease(&name, &uid, 40, at("2026-01-01T00:00:00.123456Z")),
        )
        .await;
    let first_version = created
        .as_ref()
        .ok()
        .and_then(|l| l.metadata.resource_version.clone())
        .unwrap_or_default();
    t.push(("lease: create", outcome(&created, lease_fields)));
    let renew = |version: &str, when: &str| {
        bodies::plain_lease_json(&name, &name, &uid, 40, version, at(when))
    };
    let mut watch = leases
        .watch(
            &WatchParams::default()
                .labels(&edgebeat_gateway::view::managed_selector())
                .disable_bookmarks(),
            &first_version,
        )
        .await
        .unwrap()
        .boxed();
    let renewed = put_lease(
        &client,
        &name,
        renew(&first_version, "2026-01-01T00:00:10.5Z"),
    )
    .await;
    t.push(("lease: renewal", outcome(&renewed, lease_fields)));
    let event = tokio::time::timeout(Duration::from_secs(10), watch.next()).await;
    t.push((
        "lease: the renewal's watch event",
        match event {
            Ok(Some(Ok(WatchEvent::Modified(lease)))) => {
                outcome(&Ok::<_, kube::Error>(lease), &["/spec/renewTime"])
            }
            Ok(Some(Ok(other))) => format!("another event: {other:?}"),
            Ok(Some(Err(error))) => format!("error {error}"),
            Ok(None) => "the watch ended".into(),
            Err(_) => "no event within 10 s".into(),
        },
    ));
    t.push((
        "lease: renewal with a stale resourceVersion",
        outcome(
            &put_lease(
                &client,
                &name,
                renew(&first_version, "2026-01-01T00:00:20Z"),
            )
            .await,
            &[],
        ),
    ));
    let current = leases.get(&name).await;
    let version = current
        .as_ref()
        .ok()
        .and_then(|l| l.metadata.resource_version.clone())
        .unwrap_or_default();
    t.push((
        "lease: get after the conflict",
        outcome(&current, lease_fields),
    ));
    let body = renew(&version, "2026-01-01T00:00:30Z");
    t.push((
        "lease: renewTime that is no MicroTime",
        outcome(
            &put_lease(
                &client,
                &name,
                lease_with(&body, "renewTime", json!("yesterday")),
            )
            .await,
            &[],
        ),
    ));
    t.push((
        "lease: leaseDurationSeconds 0",
        outcome(
            &put_lease(
                &client,
                &name,
                lease_with(&body, "leaseDurationSeconds", json!(0)),
            )
            .await,
            &[],
        ),
    ));
    t.push((
        "lease: the body names another Lease",
        outcome(
            &put_lease(&client, &format!("{prefix}other"), body.clone()).await,
            &[],
        ),
    ));
    let elsewhere: Api<Lease> = Api::namespaced(client.clone(), "no-such-namespace");
    let mut lease = bodies::new_lease(&name, &uid, 40, registered);
    lease.metadata.namespace = Some("no-such-namespace".into());
    t.push((
        "lease: create in a namespace that does not exist",
        outcome(&elsewhere.create(&pp, &lease).await, &[]),
    ));
    lease.metadata.namespace = Some("default".into());
    t.push((
        "lease: create, the body's namespace not the URL's",
        outcome(&elsewhere.create(&pp, &lease).await, &[]),
    ));

    // ---- Events, as the gateway records kubelet's ----
    let event = bodies::node_event(
        &name,
        pb::EventType::Normal,
        "NodeReady",
        format!("Node {name} status is now: NodeReady"),
        registered,
        1,
    );
    t.push((
        "event: create",
        outcome(
            &events.create(&pp, &event).await,
            &[
                "/reason",
                "/type",
                "/involvedObject/kind",
                "/involvedObject/name",
                "/source",
            ],
        ),
    ));

    // ---- CertificateSigningRequests: create, /approval, /status ----
    let csr_name = format!("{prefix}csr");
    let csr = CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            name: Some(csr_name.clone()),
            ..Default::default()
        },
        spec: k8s_openapi::api::certificates::v1::CertificateSigningRequestSpec {
            request: ByteString(node_csr_pem(&format!("system:node:{name}")).into_bytes()),
            signer_name: "edgebeat.io/node-client".into(),
            expiration_seconds: Some(3600),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..Default::default()
        },
        status: None,
    };
    let csr_fields: &[&str] = &[
        "/spec/signerName",
        "/spec/usages",
        "/spec/expirationSeconds",
        "/status/conditions/0/type",
        "/status/conditions/0/status",
        "/status/conditions/0/reason",
    ];
    let created = csrs.create(&pp, &csr).await;
    t.push(("csr: create", outcome(&created, csr_fields)));
    let mut garbage = csr.clone();
    garbage.metadata.name = Some(format!("{prefix}garbage"));
    garbage.spec.request = ByteString(b"not a PEM request".to_vec());
    t.push((
        "csr: create, a request that is no PKCS#10",
        outcome(&csrs.create(&pp, &garbage).await, &[]),
    ));
    let mut approved = created.unwrap_or(csr);
    approved.status.get_or_insert_default().conditions = Some(vec![
        k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some("EdgebeatAutoApproved".into()),
            message: Some("differential".into()),
            ..Default::default()
        },
    ]);
    let approval = csrs
        .replace_subresource("approval", &csr_name, &pp, &approved)
        .await;
    let mut signed = approval.as_ref().cloned().unwrap_or(approved);
    t.push(("csr: /approval", outcome(&approval, csr_fields)));
    signed.status.get_or_insert_default().certificate =
        Some(ByteString(certificate_pem().into_bytes()));
    let issued = csrs
        .replace_subresource("status", &csr_name, &pp, &signed)
        .await;
    t.push((
        "csr: /status with a certificate",
        match issued {
            Ok(c) => format!(
                "ok certificate present: {}",
                c.status
                    .and_then(|s| s.certificate)
                    .is_some_and(|c| !c.0.is_empty())
            ),
            Err(e) => outcome(&Err::<(), _>(e), &[]),
        },
    ));
    let mut not_pem = signed.clone();
    not_pem.metadata.resource_version = None;
    not_pem.status.get_or_insert_default().certificate = Some(ByteString(b"not PEM".to_vec()));
    t.push((
        "csr: /status with a certificate that is no PEM",
        outcome(
            &csrs
                .replace_subresource("status", &csr_name, &pp, &not_pem)
                .await,
            &[],
        ),
    ));

    // ---- Secrets: immutability (bootstrap tokens' use counts live in Secrets) ----
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{prefix}immutable")},
        "immutable": true,
        "stringData": {"a": "1"},
    }))
    .unwrap();
    let created = secrets.create(&pp, &secret).await;
    t.push((
        "secret: create, immutable",
        outcome(&created, &["/data", "/immutable"]),
    ));
    if let Ok(mut changed) = created {
        changed.data = Some([("a".to_owned(), ByteString(b"2".to_vec()))].into());
        t.push((
            "secret: change an immutable one",
            outcome(
                &secrets
                    .replace(&format!("{prefix}immutable"), &pp, &changed)
                    .await,
                &[],
            ),
        ));
    }
    t
}

#[tokio::test]
#[ignore = "needs the control plane: scripts/control-plane.sh build (scripts/test.sh runs it)"]
async fn the_standin_answers_the_gateways_calls_as_the_real_apiserver_does() {
    edgebeat_transports::tls::install_ring_provider();
    let standin = StandIn::start().await.unwrap();
    let control_plane = ControlPlane::shared().unwrap();
    // One Node for both (its bootID is random).
    let options = FleetOptions {
        prefix: "differential-".to_owned(),
        ..FleetOptions::new(1, FleetTransport::Grpc(String::new()))
    };
    let node = registered_node(&options, 0, at("2026-01-01T00:00:00Z"));
    let real = transcript(
        control_plane.admin_client().await.unwrap(),
        "differential-",
        &node,
    )
    .await;
    let stand_in = transcript(standin.kube_client().unwrap(), "differential-", &node).await;
    assert_eq!(
        real.len(),
        stand_in.len(),
        "transcripts of different lengths:\nreal: {real:#?}\nstand-in: {stand_in:#?}"
    );
    let differences: Vec<String> = real
        .iter()
        .zip(&stand_in)
        .filter(|(r, s)| r != s)
        .map(|((step, r), (_, s))| format!("{step}:\n  real:     {r}\n  stand-in: {s}"))
        .collect();
    for (step, outcome) in &real {
        println!("{step}: {outcome}");
    }
    assert!(
        differences.is_empty(),
        "the stand-in answers {} of {} calls unlike the real apiserver:\n{}",
        differences.len(),
        real.len(),
        differences.join("\n")
    );
    // The transcript is no empty agreement: the calls that must fail did, on both.
    let codes: Vec<&str> = real
        .iter()
        .map(|(_, o)| o.split(' ').next().unwrap())
        .collect();
    for expected in ["409", "404", "422", "400"] {
        assert!(codes.contains(&expected), "no {expected} in {real:?}");
    }
}
