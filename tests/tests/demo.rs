//! `edgebeat-demo` (`scripts/demo.sh`) against a real kube-apiserver: the binary as a user
//! runs it, its output read.
//!
//! - `--apiserver control-plane`: the demo starts the suite's control plane itself, shows
//!   the node Ready and its Lease renewed, and when `--duration` ends removes what it made
//!   (its own check says none is left) and stops the control plane.
//! - `--kubeconfig PATH` (the form for kind or k3s), pointed at this test's control plane's
//!   admin kubeconfig: the node is Ready in the apiserver, the demo ends on Ctrl-C (SIGINT),
//!   and the apiserver has none of what it made.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use edgebeat_tests::control_plane::ControlPlane;
use edgebeat_tests::wait::eventually;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::io::AsyncBufReadExt as _;

/// The demo binary of this package (`cargo test` builds it).
const DEMO: &str = env!("CARGO_BIN_EXE_edgebeat-demo");

/// Whether `output` has `kubectl get nodes -o wide`'s row of `node` with STATUS Ready.
fn shows_ready(output: &str, node: &str) -> bool {
    output.lines().any(|l| {
        let mut columns = l.split_whitespace();
        columns.next() == Some(node) && columns.next().is_some_and(|s| s.starts_with("Ready"))
    })
}

/// The `renewTime`s of `output`'s Lease lines for `node`, in order.
fn renew_times(output: &str, node: &str) -> Vec<String> {
    let prefix = format!("lease kube-node-lease/{node} renewTime=");
    output
        .lines()
        .filter_map(|l| l.split_once(prefix.as_str()))
        .filter_map(|(_, rest)| rest.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The Lease made, then renewed at least twice, each renewal later than the one before.
fn renewed_twice(output: &str, node: &str) -> bool {
    let times = renew_times(output, node);
    times.len() >= 3 && times.windows(2).all(|w| w[0] < w[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real control plane (scripts/test.sh)"]
async fn demo_against_the_real_control_plane_shows_a_ready_node_and_renewals() {
    let node = "demo-control-plane";
    let mut command = tokio::process::Command::new(DEMO);
    command
        .args(["--apiserver", "control-plane", "--duration", "30"])
        .args(["--node-name", node])
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let run = edgebeat_tests::process::output_async(&mut command);
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the demo ends within 300 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("kube-apiserver v1."), "{stdout}");
    assert!(shows_ready(&stdout, node), "no Ready row:\n{stdout}");
    assert!(
        renewed_twice(&stdout, node),
        "the Lease made and renewed twice:\n{stdout}"
    );
    assert!(
        stdout.contains("Approved,Issued"),
        "the CSR as kubectl get csr shows it:\n{stdout}"
    );
    for removed in [
        format!("node \"{node}\" deleted"),
        "namespace \"edgebeat-system\" deleted".to_owned(),
        "clusterrole.rbac.authorization.k8s.io \"edgebeat-gateway\" deleted".to_owned(),
        "nothing of the demo's is left in the cluster".to_owned(),
        "stopped the control plane".to_owned(),
    ] {
        assert!(stdout.contains(&removed), "{removed:?} in:\n{stdout}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real control plane (scripts/test.sh)"]
async fn demo_with_a_kubeconfig_ends_on_ctrl_c_and_leaves_nothing_in_the_cluster() {
    let control_plane = ControlPlane::shared().unwrap();
    let node = "demo-kubeconfig";
    let mut demo = edgebeat_tests::process::spawn_async(
        tokio::process::Command::new(DEMO)
            .arg("--kubeconfig")
            .arg(&control_plane.admin_kubeconfig)
            .arg("--kubectl")
            .arg(control_plane.bin.join("kubectl"))
            .args(["--node-name", node])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true),
    )
    .unwrap();
    let mut lines = tokio::io::BufReader::new(demo.stdout.take().unwrap()).lines();
    let mut stdout = String::new();
    let seen = tokio::time::timeout(Duration::from_secs(180), async {
        while !(shows_ready(&stdout, node) && renewed_twice(&stdout, node)) {
            let Some(line) = lines.next_line().await.unwrap() else {
                return false;
            };
            stdout.push_str(&line);
            stdout.push('\n');
        }
        true
    })
    .await;
    assert!(
        seen == Ok(true),
        "a Ready row and two renewals within 180 s:\n{stdout}"
    );

    // What the demo printed is the apiserver's.
    let nodes: Api<Node> = Api::all(control_plane.admin_client().await.unwrap());
    eventually(
        "the node Ready in the apiserver",
        Duration::from_secs(30),
        || async {
            nodes.get_opt(node).await.ok().flatten().is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        },
    )
    .await;

    edgebeat_tests::process::signal(demo.id().unwrap(), "INT").unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(180), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            stdout.push_str(&line);
            stdout.push('\n');
        }
        demo.wait().await.unwrap()
    })
    .await
    .expect("the demo ends within 180 s of Ctrl-C");
    assert!(ended.success(), "{ended}:\n{stdout}");
    assert!(
        stdout.contains("nothing of the demo's is left in the cluster"),
        "{stdout}"
    );

    // The apiserver's own answer: none of what the demo made is there.
    let selector = format!("involvedObject.kind=Node,involvedObject.name={node}");
    for get in [
        vec!["get", "node", node],
        vec!["-n", "kube-node-lease", "get", "lease", node],
        vec!["get", "namespace", "edgebeat-system"],
        vec![
            "get",
            "clusterrole",
            "edgebeat-gateway",
            "edgebeat-gateway-enrollment",
        ],
        vec![
            "get",
            "clusterrolebinding",
            "edgebeat-gateway",
            "edgebeat-gateway-enrollment",
        ],
        vec![
            "-n",
            "kube-node-lease",
            "get",
            "role/edgebeat-gateway-leases",
            "rolebinding/edgebeat-gateway-leases",
        ],
        vec![
            "-n",
            "default",
            "get",
            "role/edgebeat-gateway-events",
            "rolebinding/edgebeat-gateway-events",
        ],
        vec![
            "-n",
            "default",
            "get",
            "events",
            "--field-selector",
            &selector,
        ],
    ] {
        let found = control_plane
            .kubectl(&[&get[..], &["--ignore-not-found", "-o", "name"]].concat())
            .unwrap();
        assert_eq!(found.trim(), "", "left by the demo: {get:?}\n{stdout}");
    }
    let csrs: serde_json::Value = serde_json::from_str(
        &control_plane
            .kubectl(&["get", "csr", "-o", "json"])
            .unwrap(),
    )
    .unwrap();
    let left: Vec<_> = csrs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["metadata"]["annotations"]["edgebeat.io/node"] == node)
        .collect();
    assert!(left.is_empty(), "CSRs left by the demo: {left:?}");
}
