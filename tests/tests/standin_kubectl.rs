//! The stand-in seen through the real kubectl (skipped when kubectl is not on PATH).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use edgebeat_tests::pki::node_csr_pem;
use edgebeat_tests::standin::{StandIn, StandInHandle, StandInView};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

fn find_kubectl() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
}

struct Kubectl {
    bin: PathBuf,
    server: String,
    cache: tempfile::TempDir,
}

struct Output {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    async fn run(&self, args: &[&str]) -> Output {
        let mut cmd = std::process::Command::new(&self.bin);
        cmd.env("KUBECONFIG", "/dev/null")
            .arg("--server")
            .arg(&self.server)
            .arg("--request-timeout=10s")
            .arg("--cache-dir")
            .arg(self.cache.path())
            .args(args);
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::task::spawn_blocking(move || edgebeat_tests::process::output(&mut cmd)),
        )
        .await
        .expect("kubectl finished in time")
        .unwrap()
        .expect("kubectl runs");
        let out = Output {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        eprintln!("$ kubectl {}\n{}{}", args.join(" "), out.stdout, out.stderr);
        out
    }

    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(out.ok, "kubectl {args:?} failed: {}", out.stderr);
        out.stdout
    }
}

/// Seeds a node, its lease and an event through kube-rs, as a gateway would.
async fn seed(standin: &StandInHandle) {
    let client = standin.kube_client().unwrap();
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "rpi4-edge-01", "labels": {"kubernetes.io/hostname": "rpi4-edge-01", "kubernetes.io/os": "linux",
                     "kubernetes.io/arch": "arm64", "node-role.kubernetes.io/edge": ""}},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                 "lastHeartbeatTime": "2025-05-14T09:20:00Z", "lastTransitionTime": "2025-05-14T09:20:00Z"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": "2025-05-14T09:20:00Z", "lastTransitionTime": "2025-05-14T09:20:00Z"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.21"}, {"type": "Hostname", "address": "rpi4-edge-01"}],
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.6.31+rpt-rpi-v8",
                         "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.13",
                         "kubeletVersion": "v1.30.2", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "arm64"},
        },
    }))
    .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.create(&PostParams::default(), &node).await.unwrap();
    let second: Node = serde_json::from_value(json!({"metadata": {"name": "jetson-edge-02"},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}],
                   "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
                                "containerRuntimeVersion": "", "kubeletVersion": "v1.31.1", "kubeProxyVersion": "",
                                "operatingSystem": "linux", "architecture": "arm64"}}}))
    .unwrap();
    nodes.create(&PostParams::default(), &second).await.unwrap();
    let hb = json!({"status": {"$setElementOrder/conditions": [{"type": "MemoryPressure"}, {"type": "Ready"}],
        "conditions": [{"type": "MemoryPressure", "lastHeartbeatTime": "2025-05-14T09:25:03Z"},
                       {"type": "Ready", "lastHeartbeatTime": "2025-05-14T09:25:03Z"}]}});
    nodes
        .patch_status(
            "rpi4-edge-01",
            &PatchParams::default(),
            &Patch::Strategic(hb),
        )
        .await
        .unwrap();

    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "rpi4-edge-01",
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "rpi4-edge-01", "uid": node.metadata.uid}]},
        "spec": {"holderIdentity": "rpi4-edge-01", "leaseDurationSeconds": 40, "renewTime": "2025-05-14T09:21:07.482913Z"},
    }))
    .unwrap();
    Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();

    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "rpi4-edge-01.17f0a1b2c3d4e5f6"},
        "involvedObject": {"kind": "Node", "name": "rpi4-edge-01", "uid": "rpi4-edge-01"},
        "reason": "Rebooted", "message": "Node rpi4-edge-01 has been rebooted, boot id: b", "type": "Warning",
        "source": {"component": "kubelet", "host": "rpi4-edge-01"},
        "firstTimestamp": "2025-05-14T09:20:00Z", "lastTimestamp": "2025-05-14T09:20:00Z", "count": 1,
    }))
    .unwrap();
    Api::<Event>::namespaced(client, "default")
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
}

async fn setup() -> (StandInHandle, Kubectl) {
    let bin = find_kubectl().expect("kubectl on PATH");
    let standin = StandIn::start().await.unwrap();
    seed(&standin).await;
    let kubectl = Kubectl {
        bin,
        server: standin.url(),
        cache: tempfile::tempdir().unwrap(),
    };
    (standin, kubectl)
}

fn line_with<'a>(out: &'a str, needle: &str) -> &'a str {
    out.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{out}"))
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[tokio::test]
#[ignore = "needs kubectl on PATH: scripts/test.sh runs it when kubectl is installed"]
async fn kubectl_get_prints_nodes_leases_and_events_like_a_cluster() {
    let (standin, k) = setup().await;

    let out = k.ok(&["get", "nodes"]).await;
    assert_eq!(
        words(out.lines().next().unwrap()),
        ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    );
    let row = words(line_with(&out, "rpi4-edge-01"));
    assert_eq!(
        (row[1], row[2], row[4]),
        ("Ready", "edge", "v1.30.2"),
        "{out}"
    );
    let row = words(line_with(&out, "jetson-edge-02"));
    assert_eq!(
        (row[1], row[2], row[4]),
        ("NotReady", "<none>", "v1.31.1"),
        "Ready=Unknown prints NotReady"
    );

    let out = k.ok(&["get", "nodes", "-o", "wide"]).await;
    assert_eq!(
        words(out.lines().next().unwrap()),
        [
            "NAME",
            "STATUS",
            "ROLES",
            "AGE",
            "VERSION",
            "INTERNAL-IP",
            "EXTERNAL-IP",
            "OS-IMAGE",
            "KERNEL-VERSION",
            "CONTAINER-RUNTIME"
        ]
    );
    let row = line_with(&out, "rpi4-edge-01");
    for cell in [
        "10.0.0.21",
        "<none>",
        "Debian GNU/Linux 12 (bookworm)",
        "6.6.31+rpt-rpi-v8",
        "containerd://1.7.13",
    ] {
        assert!(row.contains(cell), "{cell:?} missing from {row:?}");
    }

    let out = k.ok(&["get", "node", "rpi4-edge-01", "-o", "yaml"]).await;
    for needle in [
        "kind: Node",
        "name: rpi4-edge-01",
        "kubeletVersion: v1.30.2",
        "address: 10.0.0.21",
        "type: Ready",
        r#"lastHeartbeatTime: "2025-05-14T09:25:03Z""#,
        r#"lastTransitionTime: "2025-05-14T09:20:00Z""#,
    ] {
        assert!(out.contains(needle), "{needle:?} missing from:\n{out}");
    }

    let out = k.ok(&["get", "lease", "-n", "kube-node-lease"]).await;
    assert_eq!(
        words(out.lines().next().unwrap()),
        ["NAME", "HOLDER", "AGE"]
    );
    assert_eq!(
        words(line_with(&out, "rpi4-edge-01"))[..2],
        ["rpi4-edge-01", "rpi4-edge-01"]
    );

    let out = k
        .ok(&[
            "get",
            "lease",
            "-n",
            "kube-node-lease",
            "rpi4-edge-01",
            "-o",
            "yaml",
        ])
        .await;
    for needle in [
        "holderIdentity: rpi4-edge-01",
        "leaseDurationSeconds: 40",
        r#"renewTime: "2025-05-14T09:21:07.482913Z""#,
        "kind: Node",
    ] {
        assert!(out.contains(needle), "{needle:?} missing from:\n{out}");
    }

    let out = k.ok(&["get", "events", "-A"]).await;
    assert_eq!(
        words(out.lines().next().unwrap()),
        [
            "NAMESPACE",
            "LAST",
            "SEEN",
            "TYPE",
            "REASON",
            "OBJECT",
            "MESSAGE"
        ]
    );
    let row = words(line_with(&out, "Rebooted"));
    assert_eq!(
        (row[0], row[2], row[4]),
        ("default", "Warning", "node/rpi4-edge-01")
    );

    let out = k.run(&["get", "node", "nope"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains(r#"Error from server (NotFound): nodes "nope" not found"#),
        "{}",
        out.stderr
    );

    // kubectl never needed OpenAPI, and every request was answered without a server error
    let requests = standin.requests();
    assert!(requests.iter().all(|r| !r.path.starts_with("/openapi")));
    assert!(requests.iter().all(|r| r.status < 500), "{requests:?}");
}

#[tokio::test]
#[ignore = "needs kubectl on PATH: scripts/test.sh runs it when kubectl is installed"]
async fn kubectl_get_watch_prints_status_transitions() {
    let (standin, k) = setup().await;
    let mut cmd = std::process::Command::new(&k.bin);
    cmd.env("KUBECONFIG", "/dev/null")
        .args(["--server", &k.server, "--cache-dir"])
        .arg(k.cache.path())
        .args(["get", "nodes", "-w"]);
    let kubectl = tokio::task::spawn_blocking(move || edgebeat_tests::process::output(&mut cmd));
    let watching = |v: &StandInView<'_>| {
        v.requests().iter().any(|r| {
            r.query.as_deref().is_some_and(|q| q.contains("watch=true")) && r.status == 200
        })
    };
    standin
        .wait_until(Duration::from_secs(20), "kubectl watching nodes", watching)
        .await
        .unwrap();

    let client = standin.kube_client().unwrap();
    let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}});
    Api::<Node>::all(client)
        .patch_status(
            "rpi4-edge-01",
            &PatchParams::default(),
            &Patch::Strategic(not_ready),
        )
        .await
        .unwrap();
    // shutting down ends the watch, and kubectl with it
    standin.shutdown();
    let out = tokio::time::timeout(Duration::from_secs(30), kubectl)
        .await
        .expect("kubectl exits")
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "$ kubectl get nodes -w\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| l.starts_with("rpi4-edge-01"))
        .map(words)
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert_eq!((rows[0][1], rows[1][1]), ("Ready", "NotReady"));
}

/// Creates CSR `name` through kube-rs, as `user` when given (impersonated).
async fn create_csr(
    standin: &StandInHandle,
    name: &str,
    user: Option<&str>,
    expiration: Option<i32>,
) {
    let mut config = kube::Config::new(standin.url().parse().unwrap());
    if let Some(user) = user {
        config.auth_info.impersonate = Some(user.to_string());
        config.auth_info.impersonate_groups = Some(vec!["system:nodes".into()]);
    }
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"request": ByteString(node_csr_pem("system:node:rpi4-edge-01").into_bytes()),
                 "signerName": "edgebeat.io/node-client", "expirationSeconds": expiration,
                 "usages": ["digital signature", "client auth"]},
    }))
    .unwrap();
    Api::<CertificateSigningRequest>::all(kube::Client::try_from(config).unwrap())
        .create(&PostParams::default(), &csr)
        .await
        .unwrap();
}

/// Adds condition `type_` (status True, `reason`) to the stored CSR `name`, as an approver
/// outside the test would.
fn add_condition(standin: &StandInHandle, name: &str, type_: &str, reason: &str) {
    assert!(standin.update_certificate_signing_request(name, |csr| {
        csr.status
            .get_or_insert_with(Default::default)
            .conditions
            .get_or_insert_with(Vec::new)
            .push(CertificateSigningRequestCondition {
                type_: type_.into(),
                status: "True".into(),
                reason: Some(reason.into()),
                ..Default::default()
            });
    }));
}

/// `kubectl get csr`, which the demo tells users to run against the stand-in: the columns,
/// the requester, the requested duration and the condition, and `-o yaml`. (`kubectl
/// certificate approve|deny` writes protobuf, which the stand-in does not read; it is proved
/// against the real control plane: `tests/tests/control_plane.rs::
/// boards_enroll_through_the_real_csr_api_auto_and_by_kubectl_certificate_approve`.)
#[tokio::test]
#[ignore = "needs kubectl on PATH: scripts/test.sh runs it when kubectl is installed"]
async fn kubectl_get_csr_prints_requestor_duration_and_condition() {
    let (standin, k) = setup().await;
    create_csr(&standin, "edgebeat-0a1b", None, Some(86400)).await;
    create_csr(
        &standin,
        "edgebeat-2c3d",
        Some("system:node:rpi4-edge-01"),
        None,
    )
    .await;

    let out = k.ok(&["get", "csr"]).await;
    assert_eq!(
        words(out.lines().next().unwrap()),
        [
            "NAME",
            "AGE",
            "SIGNERNAME",
            "REQUESTOR",
            "REQUESTEDDURATION",
            "CONDITION"
        ]
    );
    let row = words(line_with(&out, "edgebeat-0a1b"));
    assert_eq!(
        (row[2], row[3], row[4], row[5]),
        (
            "edgebeat.io/node-client",
            "system:anonymous",
            "24h",
            "Pending"
        ),
        "{out}"
    );
    let row = words(line_with(&out, "edgebeat-2c3d"));
    assert_eq!(
        (row[3], row[4], row[5]),
        ("system:node:rpi4-edge-01", "<none>", "Pending"),
        "{out}"
    );

    add_condition(
        &standin,
        "edgebeat-0a1b",
        "Approved",
        "EdgebeatAutoApproved",
    );
    add_condition(&standin, "edgebeat-2c3d", "Denied", "EdgebeatDenied");
    let out = k.ok(&["get", "csr"]).await;
    assert_eq!(
        words(line_with(&out, "edgebeat-0a1b"))[5],
        "Approved",
        "{out}"
    );
    assert_eq!(
        words(line_with(&out, "edgebeat-2c3d"))[5],
        "Denied",
        "{out}"
    );

    let out = k.ok(&["get", "csr", "edgebeat-0a1b", "-o", "yaml"]).await;
    for needle in [
        "kind: CertificateSigningRequest",
        "username: system:anonymous",
        "- system:unauthenticated",
        "signerName: edgebeat.io/node-client",
        "reason: EdgebeatAutoApproved",
        "type: Approved",
    ] {
        assert!(out.contains(needle), "{needle:?} missing from:\n{out}");
    }

    let requests = standin.requests();
    assert!(requests.iter().all(|r| !r.path.starts_with("/openapi")));
    assert!(requests.iter().all(|r| r.status < 500), "{requests:?}");
}

#[tokio::test]
#[ignore = "needs kubectl on PATH: scripts/test.sh runs it when kubectl is installed"]
async fn kubectl_get_secrets_prints_type_and_data_count() {
    let (standin, k) = setup().await;
    let client = standin.kube_client().unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "edgebeat-site-ca"}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": "crt", "tls.key": "key"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let token: Secret = serde_json::from_value(json!({
        "metadata": {"name": "edgebeat-token-abcdef"},
        "stringData": {"token-id": "abcdef", "token-secret": "0123456789abcdef", "expiration": "2030-01-01T00:00:00Z"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client, "kube-system")
        .create(&PostParams::default(), &token)
        .await
        .unwrap();

    let out = k.ok(&["get", "secrets", "-n", "kube-system"]).await;
    assert_eq!(
        words(out.lines().next().unwrap()),
        ["NAME", "TYPE", "DATA", "AGE"]
    );
    assert_eq!(
        words(line_with(&out, "edgebeat-site-ca"))[..3],
        ["edgebeat-site-ca", "kubernetes.io/tls", "2"]
    );
    assert_eq!(
        words(line_with(&out, "edgebeat-token-abcdef"))[..3],
        ["edgebeat-token-abcdef", "Opaque", "3"]
    );
    let out = k.run(&["get", "secrets"]).await;
    assert!(out.ok);
    assert!(
        out.stderr
            .contains("No resources found in default namespace."),
        "{}",
        out.stderr
    );
    let out = k
        .ok(&[
            "get",
            "secret",
            "-n",
            "kube-system",
            "edgebeat-site-ca",
            "-o",
            "jsonpath={.data.tls\\.crt}",
        ])
        .await;
    assert_eq!(out, "Y3J0", "base64 of \"crt\"");
}
