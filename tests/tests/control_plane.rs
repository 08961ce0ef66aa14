//! edgebeat against the real control plane (`tests/src/control_plane.rs`): kube-apiserver,
//! etcd and kube-controller-manager of the pinned release, the real `edgebeat-gateway`
//! binary with the flags and RBAC of `deploy/` applied by the real kubectl, authenticated as
//! its ServiceAccount, and real agents. What the apiserver did is read from its audit log.
//!
//! Needs the built control plane (`scripts/control-plane.sh build`; `scripts/test.sh` builds
//! it and runs these).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use edgebeat_tests::control_plane::{
    AuditEvent, ControlPlane, DeployedGateway, EnrollingGateway, GATEWAY_USER, assert_none_refused,
    gateway_requests,
};
use edgebeat_tests::harness::{fixture, grpc_transport, start_agent, test_agent_config};
use edgebeat_tests::process::GatewayProcess;
use edgebeat_tests::wait::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

/// The Ready condition's status of `node` ("True", "False", "Unknown"), `None` without a
/// Node or condition.
async fn ready(nodes: &Api<Node>, node: &str) -> Option<String> {
    let node = nodes.get_opt(node).await.ok()??;
    node.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status)
}

/// `list` requests of the gateway since `from`, by resource.
fn lists_since(control_plane: &ControlPlane, from: jiff::Timestamp) -> BTreeMap<String, usize> {
    let mut lists = BTreeMap::new();
    for e in gateway_requests(control_plane, from) {
        if e.verb == "list" {
            *lists.entry(e.resource()).or_default() += 1;
        }
    }
    lists
}

/// Whether every Lease of `names` exists and was renewed after `at`.
async fn all_renewed_after(leases: &Api<Lease>, names: &[&str], at: jiff::Timestamp) -> bool {
    for name in names {
        let renewed = leases
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.renew_time)
            .is_some_and(|t| t.0 > at);
        if !renewed {
            return false;
        }
    }
    true
}

/// `(verb, resource)` → count, for the requests about `node`.
fn calls_for(events: &[AuditEvent], node: &str) -> BTreeMap<(String, String), usize> {
    let mut calls = BTreeMap::new();
    for e in events.iter().filter(|e| e.name() == node) {
        *calls.entry((e.verb.clone(), e.resource())).or_default() += 1;
    }
    calls
}

fn count(calls: &BTreeMap<(String, String), usize>, verb: &str, resource: &str) -> usize {
    calls
        .get(&(verb.to_owned(), resource.to_owned()))
        .copied()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn kubelets_calls_at_kubelets_cadence_through_the_deployed_gateway() {
    let control_plane = ControlPlane::shared().unwrap();
    let started = jiff::Timestamp::now();
    let gateway = DeployedGateway::start(control_plane, &[]).await;
    let names = ["cadence-a", "cadence-b"];
    let agents: Vec<_> = names.iter().map(|n| gateway.agent(n)).collect();
    let admin = control_plane.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let leases: Api<Lease> = Api::namespaced(admin, "kube-node-lease");
    eventually(
        "both nodes Ready with a Lease",
        Duration::from_secs(60),
        || async {
            for name in names {
                if ready(&nodes, name).await.as_deref() != Some("True")
                    || leases.get_opt(name).await.ok().flatten().is_none()
                {
                    return false;
                }
            }
            true
        },
    )
    .await;

    // One minute of kubelet's cadence, measured from the audit log (a window of time is
    // what is measured here, not a wait for state).
    let from = jiff::Timestamp::now();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let to = jiff::Timestamp::now();
    let window: Vec<_> = gateway_requests(control_plane, from)
        .into_iter()
        .filter(|e| e.at().is_ok_and(|at| at < to))
        .collect();
    for name in names {
        let calls = calls_for(&window, name);
        eprintln!("{name} in one minute: {calls:?}");
        let updates = count(&calls, "update", "leases");
        assert!(
            (5..=7).contains(&updates),
            "{name}: {updates} Lease updates in a minute, kubelet makes 6: {calls:?}"
        );
        assert_eq!(
            count(&calls, "get", "leases"),
            0,
            "no Lease GET without a 409: {calls:?}"
        );
        assert_eq!(
            count(&calls, "create", "nodes"),
            0,
            "registered once: {calls:?}"
        );
        let other: usize = calls
            .iter()
            .filter(|((verb, resource), _)| {
                !matches!(
                    (verb.as_str(), resource.as_str()),
                    ("update", "leases") | ("patch", "nodes/status")
                )
            })
            .map(|(_, n)| n)
            .sum();
        assert_eq!(other, 0, "only Lease updates and status patches: {calls:?}");
    }

    // The whole run: registration once, status as patches of nodes/status, and nothing the
    // apiserver refused (no 403 from RBAC, no 422 from validation or admission).
    let all = gateway_requests(control_plane, started);
    for name in names {
        let calls = calls_for(&all, name);
        assert_eq!(count(&calls, "create", "nodes"), 1, "{name}: {calls:?}");
        assert_eq!(count(&calls, "create", "leases"), 1, "{name}: {calls:?}");
        assert!(
            count(&calls, "patch", "nodes/status") >= 1,
            "{name}: {calls:?}"
        );
        assert_eq!(count(&calls, "update", "nodes"), 0, "{name}: {calls:?}");
        assert_eq!(count(&calls, "patch", "nodes"), 0, "{name}: {calls:?}");
    }
    assert_none_refused(&all);
    let events = all.iter().filter(|e| e.resource() == "events").count();
    assert!(events >= 1, "the node's Events accepted: {events}");
    assert_eq!(
        edgebeat_tests::harness::http_get(gateway.health, "/readyz")
            .await
            .unwrap(),
        (200, "ok\n".to_owned())
    );

    // The real node lifecycle controller kept both nodes Ready all along.
    for name in names {
        assert_eq!(ready(&nodes, name).await.as_deref(), Some("True"), "{name}");
    }
    let controller_made_unknown = control_plane
        .audit()
        .unwrap()
        .into_iter()
        .filter(|e| {
            e.user.username == "system:serviceaccount:kube-system:node-controller"
                && e.resource() == "nodes/status"
                && names.contains(&e.name())
        })
        .count();
    assert_eq!(
        controller_made_unknown, 0,
        "the controller never wrote these nodes' status"
    );
    for agent in agents {
        agent.stop().await.unwrap();
    }
    drop(gateway);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn a_second_writer_costs_one_get_then_renewals_as_before() {
    let control_plane = ControlPlane::shared().unwrap();
    let gateway = DeployedGateway::start(control_plane, &[]).await;
    let name = "conflict-a";
    let agent = gateway.agent(name);
    let admin = control_plane.admin_client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(admin, "kube-node-lease");
    eventually(
        "the Lease renewed once",
        Duration::from_secs(60),
        || async {
            gateway_requests(control_plane, jiff::Timestamp::UNIX_EPOCH)
                .iter()
                .any(|e| e.verb == "update" && e.name() == name && e.code() == 200)
        },
    )
    .await;

    // A second writer takes the Lease out of the gateway's watch (removes the managed
    // label, as a clean-up script might). The gateway's watch sees it leave, so the next
    // renewal goes by the agent's echo of the last write: its resourceVersion is stale.
    let written = jiff::Timestamp::now();
    control_plane
        .kubectl(&[
            "-n",
            "kube-node-lease",
            "label",
            "lease",
            name,
            "edgebeat.io/managed-by-",
        ])
        .unwrap();
    eventually(
        "two renewals after the other writer",
        Duration::from_secs(60),
        || async {
            gateway_requests(control_plane, written)
                .iter()
                .filter(|e| e.verb == "update" && e.name() == name && e.code() == 200)
                .count()
                >= 2
        },
    )
    .await;
    let after: Vec<_> = gateway_requests(control_plane, written)
        .into_iter()
        .filter(|e| e.name() == name && e.resource() == "leases")
        .map(|e| (e.verb.clone(), e.code()))
        .collect();
    // kubelet PUTs with its last write, meets the 409 and GETs once. The gateway's watch
    // told it the Lease changed, so it may GET at once instead: one GET either way, then
    // renewals as before.
    let start: Vec<_> = after.iter().map(|(v, c)| (v.as_str(), *c)).collect();
    let expected_409: &[(&str, u16)] = &[("update", 409), ("get", 200), ("update", 200)];
    let expected_get: &[(&str, u16)] = &[("get", 200), ("update", 200)];
    let rest = if start.starts_with(expected_409) {
        &start[3..]
    } else if start.starts_with(expected_get) {
        &start[2..]
    } else {
        panic!("one GET after the other writer, then renewals: {start:?}");
    };
    assert!(!rest.is_empty(), "{start:?}");
    assert!(
        rest.iter().all(|c| *c == ("update", 200)),
        "renewals as before, no more GETs: {start:?}"
    );
    let lease = leases.get(name).await.unwrap();
    assert_eq!(
        lease
            .metadata
            .labels
            .unwrap_or_default()
            .get("edgebeat.io/managed-by")
            .map(String::as_str),
        Some("edgebeat-gateway"),
        "the renewal after the GET labels it again"
    );
    agent.stop().await.unwrap();
}

/// The agent binary for `node` with kubelet's status cadence but a short Lease
/// (`nodeLeaseDurationSeconds: 4`, renewed every second), over gRPC with mTLS to `gateway`.
fn agent_process(
    gateway: &DeployedGateway,
    node: &str,
    dir: &std::path::Path,
) -> tokio::process::Child {
    let leaf = gateway.site.node(node);
    let pki = dir.join(node);
    std::fs::create_dir_all(&pki).unwrap();
    std::fs::write(pki.join("ca.crt"), &gateway.site.cert_pem).unwrap();
    std::fs::write(pki.join("node.crt"), &leaf.cert_pem).unwrap();
    std::fs::write(pki.join("node.key"), &leaf.key_pem).unwrap();
    let config = pki.join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: edgebeat.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {node}\nhostRoot: {}\nnodeLeaseDurationSeconds: 4\nclockSyncCondition: false\ntransport: {{kind: grpc, endpoint: \"https://{}\", caFile: {}, certFile: {}, keyFile: {}}}\n",
            fixture("rpi4-cgroup1").display(),
            gateway.grpc,
            pki.join("ca.crt").display(),
            pki.join("node.crt").display(),
            pki.join("node.key").display(),
        ),
    )
    .unwrap();
    let mut command = tokio::process::Command::new(
        edgebeat_tests::process::workspace_binary("edgebeat-agent").unwrap(),
    );
    command.kill_on_drop(true);
    edgebeat_tests::link::spawn_agent(command, &config, &pki.join("agent.log")).unwrap()
}

fn taints(node: &Node) -> Vec<(String, String)> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect()
}

const UNREACHABLE: &str = "node.kubernetes.io/unreachable";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn the_real_node_lifecycle_controller_sees_a_killed_agent_and_its_return() {
    // Test-only: a 10 s grace period checked every second (upstream: 50 s and 5 s), with
    // agents renewing a 4 s Lease every second, so the test takes seconds, not minutes.
    let control_plane = ControlPlane::start(&[
        ("EDGEBEAT_NODE_MONITOR_GRACE_PERIOD", "10s"),
        ("EDGEBEAT_NODE_MONITOR_PERIOD", "1s"),
    ])
    .unwrap();
    let gateway = DeployedGateway::start(&control_plane, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let name = "lifecycle-a";
    let mut agent = agent_process(&gateway, name, dir.path());
    // A second node that stays up: with every node of a zone unreachable the controller
    // takes the zone for a full disruption and adds no NoExecute taints
    // (pkg/controller/nodelifecycle: ComputeZoneState); one site going dark is exactly that.
    let _witness = agent_process(&gateway, "lifecycle-witness", dir.path());
    let admin = control_plane.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin);
    eventually("Ready", Duration::from_secs(60), || async {
        ready(&nodes, name).await.as_deref() == Some("True")
    })
    .await;
    // Kept Ready by the controller across several grace periods (a window measured, not a
    // wait for state).
    let kept_from = jiff::Timestamp::now();
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(ready(&nodes, name).await.as_deref(), Some("True"));

    // SIGKILL: no goodbye, the Lease simply stops.
    agent.start_kill().unwrap();
    agent.wait().await.unwrap();
    let killed = tokio::time::Instant::now();
    eventually(
        "Ready Unknown with the unreachable taints",
        Duration::from_secs(60),
        || async {
            let Ok(node) = nodes.get(name).await else {
                return false;
            };
            let unknown = ready(&nodes, name).await.as_deref() == Some("Unknown");
            let taints = taints(&node);
            unknown
                && taints.contains(&(UNREACHABLE.to_owned(), "NoSchedule".to_owned()))
                && taints.contains(&(UNREACHABLE.to_owned(), "NoExecute".to_owned()))
        },
    )
    .await;
    let after = killed.elapsed();
    eprintln!("Unknown and tainted {after:?} after SIGKILL (grace period 10 s)");
    assert!(
        after >= Duration::from_secs(5),
        "Unknown only after the grace period, not at once ({after:?})"
    );

    // The agent back: Ready again and the taints gone.
    let mut agent = agent_process(&gateway, name, dir.path());
    let back = jiff::Timestamp::now();
    eventually(
        "Ready again, untainted",
        Duration::from_secs(60),
        || async {
            let Ok(node) = nodes.get(name).await else {
                return false;
            };
            ready(&nodes, name).await.as_deref() == Some("True")
                && !taints(&node).iter().any(|(key, _)| key == UNREACHABLE)
        },
    )
    .await;
    let recovered = jiff::Timestamp::now();
    // Steady again: no flapping, and no more status than kubelet writes (a window measured,
    // not a wait for state).
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(ready(&nodes, name).await.as_deref(), Some("True"));
    let events = control_plane.audit().unwrap();
    let status_patches = |from: jiff::Timestamp, user: &str| {
        events
            .iter()
            .filter(|e| {
                e.user.username == user
                    && e.name() == name
                    && e.resource() == "nodes/status"
                    && e.at().is_ok_and(|at| at >= from)
            })
            .count()
    };
    let controller = "system:serviceaccount:kube-system:node-controller";
    assert_eq!(
        status_patches(kept_from, controller),
        1,
        "the controller wrote Unknown once, nothing while the node was renewing"
    );
    assert_eq!(
        status_patches(recovered, controller),
        0,
        "not Unknown again after the agent came back"
    );
    let by_gateway = status_patches(back, GATEWAY_USER);
    assert!(
        (1..=3).contains(&by_gateway),
        "the gateway wrote the recovery's status once or twice (registration, Ready), not a stream: {by_gateway}"
    );
    agent.start_kill().unwrap();
    drop(gateway);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn an_apiserver_outage_of_30_s_then_every_lease_fresh_without_a_backlog() {
    // Test-only: etcd compacted every 10 s (upstream: 5 min), so the watches resume from a
    // compacted history (410 Gone) after the restart.
    let control_plane =
        ControlPlane::start(&[("EDGEBEAT_ETCD_COMPACTION_INTERVAL", "10s")]).unwrap();
    let gateway = DeployedGateway::start(&control_plane, &[]).await;
    let names = ["outage-a", "outage-b", "outage-c"];
    let agents: Vec<_> = names.iter().map(|n| gateway.agent(n)).collect();
    let admin = control_plane.admin_client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let renewed_after = |at: jiff::Timestamp| all_renewed_after(&leases, &names, at);
    let start = jiff::Timestamp::now();
    eventually("every Lease renewed", Duration::from_secs(60), || {
        renewed_after(start)
    })
    .await;
    // kube-controller-manager elects itself leader as in a cluster (a Lease in kube-system).
    let elections: Api<Lease> = Api::namespaced(admin.clone(), "kube-system");
    let leader = |lease: Option<Lease>| {
        lease
            .and_then(|l| l.spec)
            .map(|s| (s.holder_identity, s.renew_time.map(|t| t.0)))
    };
    let leader_before = leader(elections.get_opt("kube-controller-manager").await.unwrap())
        .and_then(|(holder, _)| holder)
        .expect("kube-controller-manager holds its leader Lease");

    control_plane.stop_component("kube-apiserver").unwrap();
    // The outage itself: 30 s without an apiserver.
    tokio::time::sleep(Duration::from_secs(30)).await;
    control_plane.restart_component("kube-apiserver").unwrap();
    let up = jiff::Timestamp::now();
    let up_at = tokio::time::Instant::now();
    eventually(
        "every Lease renewed after the outage",
        Duration::from_secs(60),
        || renewed_after(up),
    )
    .await;
    let fresh_after = up_at.elapsed();
    eprintln!("every Lease fresh {fresh_after:?} after kube-apiserver answered again");
    assert!(
        fresh_after < Duration::from_secs(40),
        "within a Lease duration: {fresh_after:?}"
    );
    // No backlog written late: in the first renew interval after the outage, at most one
    // successful update per node (a renewal held through the outage would be a second).
    let first_interval: Vec<_> = gateway_requests(&control_plane, up)
        .into_iter()
        .filter(|e| {
            e.at()
                .is_ok_and(|at| at < up + jiff::SignedDuration::from_secs(10))
        })
        .collect();
    for name in names {
        let calls = calls_for(&first_interval, name);
        assert!(count(&calls, "update", "leases") <= 2, "{name}: {calls:?}");
    }
    assert_eq!(
        edgebeat_tests::harness::http_get(gateway.health, "/healthz")
            .await
            .unwrap()
            .0,
        200,
        "alive through the outage"
    );
    // The watches came back with a list each, not a relist storm: the lists counted over a
    // 10 s window (what is measured, not a wait for state).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let lists = lists_since(&control_plane, up);
    eprintln!("lists after the restart: {lists:?}");
    // A watch resumed with a resourceVersion older than the restarted watch cache's lists
    // again at once (view.rs, watch_backoff), not after a backoff grown through the outage
    // (30-60 s under kube-runtime's default).
    for resource in ["nodes", "leases"] {
        let first = gateway_requests(&control_plane, up)
            .into_iter()
            .filter(|e| e.verb == "list" && e.resource() == resource)
            .filter_map(|e| e.at().ok())
            .min();
        let relisted = first.map(|t| t.duration_since(up));
        eprintln!("{resource}: listed again {relisted:?} after kube-apiserver answered");
        assert!(
            relisted.is_none_or(|d| d < jiff::SignedDuration::from_secs(8)),
            "{resource}: the re-list waited {relisted:?}"
        );
    }
    for (resource, n) in &lists {
        assert!(*n <= 3, "{resource}: {n} lists after the restart");
    }
    // kube-controller-manager could not renew its leader Lease within its renew deadline
    // (10 s) and exited, as a real one does; started again (the fixture does what kubelet
    // does for its static pod), the new process takes the Lease once it expires.
    assert!(
        control_plane.exits("kube-controller-manager") >= 1,
        "kube-controller-manager lost its lease in a 30 s outage and exited"
    );
    eventually(
        "kube-controller-manager leading again, a new process",
        Duration::from_secs(120),
        || async {
            let lease = elections
                .get_opt("kube-controller-manager")
                .await
                .ok()
                .flatten();
            leader(lease).is_some_and(|(holder, renewed)| {
                holder.is_some_and(|h| h != leader_before) && renewed.is_some_and(|t| t > up)
            })
        },
    )
    .await;
    for agent in agents {
        agent.stop().await.unwrap();
    }
}

/// TCP connections from process `pid` to `port` on loopback (`ss`).
fn connections(pid: u32, port: u16) -> usize {
    let out = edgebeat_tests::process::output(std::process::Command::new("ss").args([
        "-Htnp",
        "state",
        "established",
        "dst",
        &format!("127.0.0.1:{port}"),
    ]))
    .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn alpn_chooses_h2_and_three_connections_carry_a_replica() {
    use edgebeat_gateway::apiserver::client::HttpVersion;
    let control_plane = ControlPlane::shared().unwrap();
    let gateway = DeployedGateway::start(control_plane, &[]).await;
    let names: Vec<String> = (0..8).map(|i| format!("alpn-{i}")).collect();
    let agents: Vec<_> = names.iter().map(|n| gateway.agent(n)).collect();
    let admin = control_plane.admin_client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(admin, "kube-node-lease");
    eventually("every Lease made", Duration::from_secs(60), || async {
        let mut all = true;
        for name in &names {
            all &= leases.get_opt(name).await.ok().flatten().is_some();
        }
        all
    })
    .await;
    let port: u16 = control_plane
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let pid = gateway.process.pid().unwrap();
    // Leases, other writes, watches: one HTTP/2 connection each, whatever the fleet.
    assert_eq!(
        connections(pid, port),
        3,
        "the gateway's connections to kube-apiserver"
    );

    // The same client stack, in this process: a burst of 300 calls (three times
    // kube-apiserver's 100 streams) rides one connection, as ALPN chose h2.
    let kubeconfig = control_plane
        .service_account_kubeconfig("edgebeat-system", "edgebeat-gateway")
        .unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    for (version, expected) in [(HttpVersion::Auto, 1..=1), (HttpVersion::Http1, 20..=300)] {
        let client = edgebeat_gateway::apiserver::kube_client_with(
            config.clone(),
            0,
            &Default::default(),
            version,
        )
        .unwrap();
        let nodes: Api<Node> = Api::all(client);
        // This process's other clients (the admin's) keep their own connections.
        let before = connections(std::process::id(), port);
        let calls = (0..300).map(|i| {
            let nodes = nodes.clone();
            async move { nodes.get_opt(&format!("alpn-{}", i % 8)).await }
        });
        let answers = futures_util::future::join_all(calls).await;
        assert!(answers.iter().all(Result::is_ok), "{version:?}");
        let opened = connections(std::process::id(), port).saturating_sub(before);
        assert!(
            expected.contains(&opened),
            "{version:?}: {opened} connections for 300 concurrent calls"
        );
        drop(nodes);
    }
    for agent in agents {
        agent.stop().await.unwrap();
    }
}

/// The CSRs of `node` (`kubectl get csr -o json`, annotated `edgebeat.io/node`), as JSON
/// values.
fn csrs_of(control_plane: &ControlPlane, node: &str) -> Vec<serde_json::Value> {
    let json = control_plane
        .kubectl(&["get", "csr", "-o", "json"])
        .unwrap();
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|csr| csr["metadata"]["annotations"]["edgebeat.io/node"] == node)
        .cloned()
        .collect()
}

/// A board with nothing but a token and the broker's CA enrolls over MQTT (its request
/// through the broker, a CSR through the real CSR API) and heartbeats signed with the key
/// it got: the real node lifecycle controller sees it Ready, its Lease is renewed, and the
/// gateway (deploy/gateway-enrollment with deploy/gateway-mqtt's flags, as its
/// ServiceAccount) is refused nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn a_board_enrolls_over_signed_mqtt_through_the_real_csr_api() {
    let control_plane = ControlPlane::shared().unwrap();
    let started = jiff::Timestamp::now();
    let broker_ca = edgebeat_tests::pki::Ca::new("broker CA");
    let server = broker_ca.server();
    let broker = edgebeat_tests::broker::Broker::start_tls(edgebeat_tests::broker::BrokerTls {
        require_certificate: false,
        bind_client_ids: false,
        ca_pem: broker_ca.cert_pem.clone(),
        cert_pem: server.cert_pem,
        key_pem: server.key_pem,
    })
    .await
    .unwrap();
    let gateway = EnrollingGateway::start_with_mqtt(control_plane, &broker, &broker_ca).await;
    let token = gateway.token("enroll-mqtt-*", 1);
    let agent = gateway.mqtt_agent("enroll-mqtt-1", &token, &broker, &broker_ca);
    let admin = control_plane.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    eventually(
        "the board enrolled over MQTT Ready",
        Duration::from_secs(90),
        || async { ready(&nodes, "enroll-mqtt-1").await.as_deref() == Some("True") },
    )
    .await;
    let csrs = csrs_of(control_plane, "enroll-mqtt-1");
    assert_eq!(csrs.len(), 1, "{csrs:?}");
    assert_eq!(csrs[0]["spec"]["signerName"], "edgebeat.io/node-client");
    let leases: Api<Lease> = Api::namespaced(admin, "kube-node-lease");
    let renewed = |lease: Lease| lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
    // Ready comes with the first status; the Lease with the first renewal, which may follow.
    let first = eventually("the board's Lease", Duration::from_secs(30), || async {
        leases.get_opt("enroll-mqtt-1").await.ok().flatten()
    })
    .await;
    let first = renewed(first);
    eventually(
        "the Lease renewed again",
        Duration::from_secs(30),
        || async { renewed(leases.get("enroll-mqtt-1").await.unwrap()) != first },
    )
    .await;
    // The board speaks with the certificate it got: the gateway recorded it on the Node.
    let node = nodes.get("enroll-mqtt-1").await.unwrap();
    assert!(
        node.metadata
            .annotations
            .unwrap_or_default()
            .contains_key("edgebeat.io/node-certificate-sha256"),
        "signed with the enrolled key"
    );
    agent.stop().await.unwrap();
    assert_none_refused(&gateway_requests(control_plane, started));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn boards_enroll_through_the_real_csr_api_auto_and_by_kubectl_certificate_approve() {
    let control_plane = ControlPlane::shared().unwrap();
    let started = jiff::Timestamp::now();
    let auto = EnrollingGateway::start(control_plane, "auto").await;
    let token = auto.token("enroll-auto-*", 1);
    let agent = auto.agent("enroll-auto-1", &token);
    let admin = control_plane.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin);
    eventually(
        "the enrolled board Ready",
        Duration::from_secs(60),
        || async { ready(&nodes, "enroll-auto-1").await.as_deref() == Some("True") },
    )
    .await;
    let csrs = csrs_of(control_plane, "enroll-auto-1");
    assert_eq!(csrs.len(), 1, "{csrs:?}");
    let csr = &csrs[0];
    assert_eq!(csr["spec"]["signerName"], "edgebeat.io/node-client");
    assert_eq!(
        csr["spec"]["username"], GATEWAY_USER,
        "requested by the gateway"
    );
    let conditions = csr["status"]["conditions"].as_array().unwrap();
    assert!(
        conditions.iter().any(|c| c["type"] == "Approved"),
        "{conditions:?}"
    );
    assert!(
        csr["status"]["certificate"]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "issued"
    );
    agent.stop().await.unwrap();

    // Manual approval: the CSR waits for a person with the real kubectl.
    let manual = EnrollingGateway::start(control_plane, "manual").await;
    let token = manual.token("enroll-manual-*", 1);
    let agent = manual.agent("enroll-manual-1", &token);
    eventually("a pending CSR", Duration::from_secs(60), || async {
        csrs_of(control_plane, "enroll-manual-1").len() == 1
    })
    .await;
    let csr = &csrs_of(control_plane, "enroll-manual-1")[0];
    assert!(csr["status"]["conditions"].is_null(), "pending: {csr}");
    assert!(
        nodes.get_opt("enroll-manual-1").await.unwrap().is_none(),
        "no Node before approval"
    );
    let name = csr["metadata"]["name"].as_str().unwrap();
    control_plane
        .kubectl(&["certificate", "approve", name])
        .unwrap();
    eventually(
        "the approved board Ready",
        Duration::from_secs(120),
        || async { ready(&nodes, "enroll-manual-1").await.as_deref() == Some("True") },
    )
    .await;
    agent.stop().await.unwrap();

    // Under deploy/'s RBAC: nothing the apiserver refused.
    assert_none_refused(&gateway_requests(control_plane, started));
    let csr_calls: std::collections::BTreeSet<_> = gateway_requests(control_plane, started)
        .into_iter()
        .filter(|e| e.resource().starts_with("certificatesigningrequests"))
        .map(|e| (e.resource(), e.verb))
        .collect();
    for call in [
        ("create", "certificatesigningrequests"),
        ("update", "certificatesigningrequests/approval"),
        ("update", "certificatesigningrequests/status"),
    ] {
        assert!(
            csr_calls.contains(&(call.1.to_owned(), call.0.to_owned())),
            "{call:?} in {csr_calls:?}"
        );
    }
    drop((auto.process, manual.process));
}

/// Under kubelet's own signer (`deploy/gateway-enrollment-kubelet-signer`, its RBAC
/// applied by the real kubectl): a board with a token enrolls, the real
/// kube-controller-manager approves its CSR (csrapproving's nodeclient
/// SubjectAccessReview for the gateway's ServiceAccount) and signs it with the cluster CA,
/// the gateway neither approves nor signs, and the board speaks gRPC with mutual TLS with
/// that certificate until Ready. The issued certificate is checked against the CA of the
/// ConfigMap `kube-root-ca.crt` the overlay mounts, as the node's identity. Then the board
/// rotates, proved by that certificate (verified against `--signer-ca`), and the next CSR
/// is kube-controller-manager's to approve and sign too. (`--certificate-lifetime=400s`,
/// test-only: the API's 600 s minimum goes to the CSR, and kube-controller-manager
/// backdates notBefore 5 min (`pkg/controller/certificates/signer/signer.go`), so a
/// Register 20 s after the certificate is issued hears that it is due, past 80 % of 400 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn boards_enroll_under_kubelets_signer_approved_and_signed_by_kube_controller_manager() {
    let control_plane = ControlPlane::shared().unwrap();
    let started = jiff::Timestamp::now();
    control_plane
        .kubectl(&[
            "apply",
            "--server-side",
            "-f",
            "deploy/gateway/namespace.yaml",
        ])
        .unwrap();
    // kube-controller-manager's root-ca-cert-publisher makes it in every namespace.
    let root_ca = || {
        control_plane
            .kubectl(&[
                "-n",
                "edgebeat-system",
                "get",
                "configmap",
                "kube-root-ca.crt",
                "-o",
                "jsonpath={.data.ca\\.crt}",
            ])
            .unwrap_or_default()
    };
    eventually(
        "the ConfigMap kube-root-ca.crt in edgebeat-system",
        Duration::from_secs(30),
        || async { root_ca().contains("BEGIN CERTIFICATE") },
    )
    .await;
    let root_ca = root_ca();
    let mount = tempfile::tempdir().unwrap();
    std::fs::write(mount.path().join("ca.crt"), &root_ca).unwrap();
    let gateway = EnrollingGateway::start_overlay(
        control_plane,
        "deploy/gateway-enrollment-kubelet-signer",
        &["deploy/gateway/enrollment-kubelet-signer"],
        &[("signer-ca", mount.path())],
        "edgebeat-gateway-kubelet-signer",
        &["--certificate-lifetime=400s"],
    )
    .await;
    let token = gateway.token("enroll-kubelet-*", 1);
    let agent = gateway.agent("enroll-kubelet-1", &token);
    let nodes: Api<Node> = Api::all(control_plane.admin_client().await.unwrap());
    eventually(
        "the board enrolled under kubelet's signer Ready",
        Duration::from_secs(90),
        || async { ready(&nodes, "enroll-kubelet-1").await.as_deref() == Some("True") },
    )
    .await;
    let csrs = csrs_of(control_plane, "enroll-kubelet-1");
    assert_eq!(csrs.len(), 1, "{csrs:?}");
    let csr = &csrs[0];
    assert_eq!(
        csr["spec"]["signerName"],
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    assert_eq!(
        csr["spec"]["username"], GATEWAY_USER,
        "requested by the gateway"
    );
    let leaf = issued_by_kube_controller_manager(control_plane, csr).await;
    let verifier =
        edgebeat_transports::signing::CertificateVerifier::from_pem(root_ca.as_bytes()).unwrap();
    let published = edgebeat_proto::NodeCertificate {
        certificate_chain: vec![leaf.clone()],
    };
    verifier
        .verify(
            "enroll-kubelet-1",
            &prost::Message::encode_to_vec(&published),
            rustls::pki_types::UnixTime::now(),
        )
        .expect("the cluster CA signed the node's certificate, for its name");

    // A rotation, proved by that certificate: the board restarts once its certificate is
    // past 80 % of 400 s, and the gateway's answer to its Register says it is due.
    agent.stop().await.unwrap();
    let (not_before, _) = edgebeat_transports::enroll::certificate_validity(&leaf).unwrap();
    eventually("the certificate due", Duration::from_secs(60), || async {
        jiff::Timestamp::now().as_second() > not_before + 321
    })
    .await;
    let agent = gateway.agent("enroll-kubelet-1", &token);
    let rotation = edgebeat_tests::wait::until(
        "a rotation proved by the kubelet-signed certificate issued (CSRs)",
        Duration::from_secs(90),
        || async {
            let csrs = csrs_of(control_plane, "enroll-kubelet-1");
            csrs.iter()
                .find(|c| {
                    c["metadata"]["annotations"]["edgebeat.io/proof"] == "certificate"
                        && c["status"]["certificate"]
                            .as_str()
                            .is_some_and(|c| !c.is_empty())
                })
                .cloned()
                .ok_or(csrs)
        },
        edgebeat_tests::wait::every(Duration::from_secs(1)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\ngateway log:\n{}", gateway.process.log_text()));
    let rotated = issued_by_kube_controller_manager(control_plane, &rotation).await;
    assert_ne!(rotated, leaf, "a new certificate");
    eventually(
        "the board Ready with its rotated certificate",
        Duration::from_secs(60),
        || async { ready(&nodes, "enroll-kubelet-1").await.as_deref() == Some("True") },
    )
    .await;
    agent.stop().await.unwrap();

    // A Node of the token's pattern that edgebeat does not manage (a worker's) gets no
    // certificate: under this signer it would be that node's apiserver credential.
    let worker: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "enroll-kubelet-worker"},
    }))
    .unwrap();
    nodes
        .create(&kube::api::PostParams::default(), &worker)
        .await
        .unwrap();
    let token = gateway.token("enroll-kubelet-worker", 1);
    let agent = gateway.agent("enroll-kubelet-worker", &token);
    let mut gateway = gateway;
    gateway
        .process
        .wait_for(Duration::from_secs(60), |line| {
            let field = |k: &str| line.get(k).and_then(|v| v.as_str());
            field("message") == Some("certificate request rejected")
                && field("reason") == Some("node_not_managed")
                && field("node") == Some("enroll-kubelet-worker")
        })
        .await
        .expect("the request for an unmanaged Node refused: node_not_managed");
    agent.stop().await.unwrap();
    assert!(
        csrs_of(control_plane, "enroll-kubelet-worker").is_empty(),
        "no CSR for an unmanaged Node"
    );

    // The gateway created the CSRs and nothing else of them (other tests' gateways share
    // its ServiceAccount: only this board's CSRs count); nothing was refused.
    let calls = gateway_requests(control_plane, started);
    assert_none_refused(&calls);
    let names: Vec<String> = csrs_of(control_plane, "enroll-kubelet-1")
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    let csr_calls: std::collections::BTreeSet<_> = calls
        .iter()
        .filter(|e| e.resource().starts_with("certificatesigningrequests"))
        .filter(|e| names.iter().any(|n| n == e.name()))
        .map(|e| (e.verb.clone(), e.resource()))
        .collect();
    assert!(
        csr_calls.contains(&("create".to_owned(), "certificatesigningrequests".to_owned())),
        "{csr_calls:?}"
    );
    assert!(
        csr_calls
            .iter()
            .all(|(_, resource)| resource == "certificatesigningrequests"),
        "the gateway approved or signed: {csr_calls:?}"
    );
    drop(gateway.process);
}

/// The certificate (DER) `csr` was issued, once checked approved by
/// kube-controller-manager's approver (`sarapprove.go`: reason `AutoApproved`), not the
/// gateway's `EdgebeatAutoApproved`.
async fn issued_by_kube_controller_manager(
    control_plane: &ControlPlane,
    csr: &serde_json::Value,
) -> Vec<u8> {
    let conditions = csr["status"]["conditions"].as_array().unwrap();
    let approved = conditions
        .iter()
        .find(|c| c["type"] == "Approved")
        .unwrap_or_else(|| panic!("not approved: {conditions:?}"));
    assert_eq!(approved["reason"], "AutoApproved", "{approved}");
    let csrs: Api<k8s_openapi::api::certificates::v1::CertificateSigningRequest> =
        Api::all(control_plane.admin_client().await.unwrap());
    let issued = csrs
        .get(csr["metadata"]["name"].as_str().unwrap())
        .await
        .unwrap()
        .status
        .and_then(|s| s.certificate)
        .expect("issued");
    edgebeat_transports::tls::parse_certificates(&issued.0).unwrap()[0].to_vec()
}

/// `usage-count` of the bootstrap token `token` (`<id>.<secret>`), as its Secret in the
/// gateway's namespace records it.
fn token_uses(control_plane: &ControlPlane, token: &str) -> u32 {
    let id = token.split('.').next().unwrap();
    let json = control_plane
        .kubectl(&[
            "get",
            "secret",
            "-n",
            "edgebeat-system",
            &format!("edgebeat-token-{id}"),
            "-o",
            "json",
        ])
        .unwrap();
    let secret: serde_json::Value = serde_json::from_str(&json).unwrap();
    let encoded = secret["data"]["usage-count"].as_str().unwrap_or("");
    String::from_utf8(piped(&["base64", "-d"], encoded.as_bytes()))
        .unwrap()
        .trim()
        .parse()
        .unwrap_or(0)
}

/// The notAfter of the certificate a CSR's `status.certificate` holds (base64 of PEM), by
/// OpenSSL.
fn not_after(certificate: &str) -> jiff::Timestamp {
    let pem = piped(&["base64", "-d"], certificate.as_bytes());
    let text = piped(
        &[
            "openssl", "x509", "-noout", "-enddate", "-dateopt", "iso_8601",
        ],
        &pem,
    );
    // "notAfter=2026-11-29 14:32:07Z"
    String::from_utf8(text)
        .unwrap()
        .trim()
        .strip_prefix("notAfter=")
        .unwrap()
        .replace(' ', "T")
        .parse()
        .unwrap()
}

/// The output of `args` (a program and its arguments) given `input`.
///
/// # Panics
/// When it cannot run or fails.
fn piped(args: &[&str], input: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut child = edgebeat_tests::process::spawn(
        std::process::Command::new(args[0])
            .args(&args[1..])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped()),
    )
    .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{args:?}");
    out.stdout
}

/// What kube-controller-manager's CSR cleaner does to a board's CSRs
/// (`pkg/controller/certificates/cleaner`: an issued CSR whose certificate has expired, or
/// approved over an hour ago, is deleted) changes no bootstrap token's use count: the first
/// CSR is deleted once its certificate expired, and the token's count stays the 1 its
/// enrollment recorded, while the board, which rotates with its certificate (not the
/// token), stays Ready and rotates on.
///
/// The deletion is the cleaner's own call (`DELETE` as its identity,
/// `system:serviceaccount:kube-system:certificate-controller`, so its RBAC is the real one)
/// made by the test, a stand-in for the cleaner's timing only: the real cleaner passes once
/// an hour (`pollingInterval`), and its pass at kube-controller-manager's start comes before
/// its informer has listed anything (`cleaner.go` `Run`: no cache sync), so no restart
/// makes it act within a test. Certificates of 40 s (`--certificate-lifetime`, test-only:
/// the gateway's signer applies it below the API's 600 s minimum).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn csrs_deleted_as_the_cleaner_deletes_them_change_no_tokens_use_count() {
    let control_plane = ControlPlane::shared().unwrap();
    let gateway =
        EnrollingGateway::start_with(control_plane, "auto", &["--certificate-lifetime=40s"]).await;
    let token = gateway.token("enroll-clean-*", 1);
    let agent = gateway.agent("enroll-clean-1", &token);
    let nodes: Api<Node> = Api::all(control_plane.admin_client().await.unwrap());
    eventually(
        "the enrolled board Ready",
        Duration::from_secs(60),
        || async { ready(&nodes, "enroll-clean-1").await.as_deref() == Some("True") },
    )
    .await;
    let first = csrs_of(control_plane, "enroll-clean-1");
    assert_eq!(first.len(), 1, "{first:?}");
    let not_after = not_after(first[0]["status"]["certificate"].as_str().unwrap());
    let first = first[0]["metadata"]["name"].as_str().unwrap().to_owned();
    assert_eq!(token_uses(control_plane, &token), 1);
    // The first certificate expires; meanwhile the board rotates (at 70-90 % of 40 s).
    eventually(
        "a rotation's CSR beside the first",
        Duration::from_secs(60),
        || async { csrs_of(control_plane, "enroll-clean-1").len() >= 2 },
    )
    .await;
    eventually(
        "the first certificate expired",
        Duration::from_secs(60),
        || async { jiff::Timestamp::now() > not_after },
    )
    .await;
    control_plane
        .kubectl(&[
            "delete",
            "csr",
            &first,
            "--as=system:serviceaccount:kube-system:certificate-controller",
        ])
        .unwrap();
    assert!(
        !csrs_of(control_plane, "enroll-clean-1")
            .iter()
            .any(|c| c["metadata"]["name"] == first.as_str())
    );
    assert_eq!(
        token_uses(control_plane, &token),
        1,
        "the deletion changed no use count"
    );
    assert_eq!(
        ready(&nodes, "enroll-clean-1").await.as_deref(),
        Some("True")
    );
    // The board rotates on after the cleaner: a newer CSR, still under the one use.
    let before: Vec<String> = csrs_of(control_plane, "enroll-clean-1")
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    eventually(
        "a rotation after the cleaner",
        Duration::from_secs(60),
        || async {
            csrs_of(control_plane, "enroll-clean-1")
                .iter()
                .any(|c| !before.iter().any(|b| c["metadata"]["name"] == b.as_str()))
        },
    )
    .await;
    assert_eq!(token_uses(control_plane, &token), 1);
    agent.stop().await.unwrap();
    drop(gateway);
}

/// What the real apiserver's API Priority and Fairness dispatched for `flow_schema` at
/// `priority_level` so far (`apiserver_flowcontrol_dispatched_requests_total`, summed over
/// its other labels).
fn dispatched(control_plane: &ControlPlane, flow_schema: &str, priority_level: &str) -> f64 {
    let text = control_plane
        .kubectl(&["get", "--raw", "/metrics"])
        .unwrap();
    let (schema, level) = (
        format!("flow_schema=\"{flow_schema}\""),
        format!("priority_level=\"{priority_level}\""),
    );
    text.lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_dispatched_requests_total{"))
        .filter(|l| l.contains(&schema) && l.contains(&level))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// deploy/gateway's FlowSchema at work in the real apiserver: the deployed gateway's Node
/// and Lease requests are dispatched at `node-high`, kubelets' priority level, not at
/// `workload-low` with every other ServiceAccount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn the_gateways_heartbeats_ride_kubelets_priority_level() {
    let control_plane = ControlPlane::shared().unwrap();
    let started = jiff::Timestamp::now();
    let gateway = DeployedGateway::start(control_plane, &[]).await;
    let before = dispatched(control_plane, "edgebeat-gateway", "node-high");
    let agent = gateway.agent("apf-a");
    // The registration's POST and PATCH, the Lease's creation and a renewal, at least.
    eventually(
        "the gateway's heartbeats dispatched at node-high",
        Duration::from_secs(60),
        || async { dispatched(control_plane, "edgebeat-gateway", "node-high") >= before + 4.0 },
    )
    .await;
    agent.stop().await.unwrap();
    drop(gateway);
    // Every request names the gateway, as client-go's name kubelet (the audit log's
    // `userAgent`; kube-rs sends none unless told).
    let requests = gateway_requests(control_plane, started);
    assert!(!requests.is_empty());
    let agents: std::collections::BTreeSet<&str> =
        requests.iter().map(|e| e.user_agent.as_str()).collect();
    assert!(
        agents
            .iter()
            .all(|a| a.starts_with("edgebeat-gateway/v") && a.contains(" (linux/")),
        "{agents:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn impersonated_writes_pass_the_real_node_authorizer_and_node_restriction() {
    let control_plane = ControlPlane::shared().unwrap();
    // deploy/gateway/impersonation names these two nodes (its example per-site list).
    let names = ["rpi4-edge-01", "jetson-07"];
    control_plane
        .kubectl(&["apply", "-k", "deploy/gateway/impersonation"])
        .unwrap();
    let started = jiff::Timestamp::now();
    let gateway = DeployedGateway::start(control_plane, &["--impersonate-nodes"]).await;
    let node_high_before = dispatched(control_plane, "system-node-high", "node-high");
    let agents: Vec<_> = names.iter().map(|n| gateway.agent(n)).collect();
    let admin = control_plane.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin);
    eventually("both nodes Ready", Duration::from_secs(60), || async {
        let mut all = true;
        for name in names {
            all &= ready(&nodes, name).await.as_deref() == Some("True");
        }
        all
    })
    .await;
    eventually("a Lease renewal each", Duration::from_secs(60), || async {
        let all = gateway_requests(control_plane, started);
        names.iter().all(|n| {
            all.iter()
                .any(|e| e.verb == "update" && e.name() == *n && e.code() == 200)
        })
    })
    .await;
    // API Priority and Fairness classifies a request after impersonation: as the node, in
    // kubelets' own schema and level, each node its own flow (no other node user talks to
    // this control plane).
    let node_high = dispatched(control_plane, "system-node-high", "node-high") - node_high_before;
    assert!(
        node_high >= 2.0 * names.len() as f64,
        "{node_high} requests dispatched at system-node-high"
    );
    let all = gateway_requests(control_plane, started);
    // Nothing the gateway sent was refused: its calls as each node fit what the Node
    // authorizer and NodeRestriction allow a kubelet, and its watches of the managed Nodes
    // and Leases run as itself (as a node they would be 403: a node may list and watch
    // only its own Node, and no Leases).
    assert_none_refused(&all);
    for name in names {
        let node_user = format!("system:node:{name}");
        let writes: Vec<_> = all
            .iter()
            .filter(|e| e.name() == name && !matches!(e.verb.as_str(), "get" | "list" | "watch"))
            .collect();
        assert!(!writes.is_empty());
        for write in &writes {
            assert_eq!(
                write
                    .impersonated_user
                    .as_ref()
                    .map(|u| u.username.as_str()),
                Some(node_user.as_str()),
                "{} {} made as the node",
                write.verb,
                write.request_uri
            );
            assert!(
                (200..300).contains(&write.code()),
                "{} {} → {}",
                write.verb,
                write.request_uri,
                write.code()
            );
        }
        let resources: std::collections::BTreeSet<_> = writes
            .iter()
            .map(|e| (e.verb.clone(), e.resource()))
            .collect();
        for call in [
            ("create", "nodes"),
            ("patch", "nodes/status"),
            ("create", "leases"),
            ("update", "leases"),
        ] {
            assert!(
                resources.contains(&(call.0.to_owned(), call.1.to_owned())),
                "{name}: {call:?} in {resources:?}"
            );
        }
    }

    // The same identity cannot write another node's objects: the real Node authorizer and
    // NodeRestriction refuse what the gateway's own checks would refuse first.
    let kubeconfig = control_plane
        .service_account_kubeconfig("edgebeat-system", "edgebeat-gateway")
        .unwrap();
    let as_node = ["--as=system:node:rpi4-edge-01", "--as-group=system:nodes"];
    for args in [
        vec![
            "-n",
            "kube-node-lease",
            "annotate",
            "lease",
            "jetson-07",
            "edgebeat.io/test=x",
        ],
        vec!["annotate", "node", "jetson-07", "edgebeat.io/test=x"],
    ] {
        let all: Vec<&str> = as_node
            .iter()
            .copied()
            .chain(args.iter().copied())
            .collect();
        let error = control_plane
            .kubectl_as(&kubeconfig, &all)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("Forbidden") || error.contains("forbidden"),
            "{all:?}: {error}"
        );
    }
    // And a node the impersonation RBAC does not name cannot be impersonated at all.
    let error = control_plane
        .kubectl_as(
            &kubeconfig,
            &[
                "--as=system:node:not-listed",
                "--as-group=system:nodes",
                "get",
                "node",
                "jetson-07",
            ],
        )
        .unwrap_err()
        .to_string();
    assert!(error.contains("cannot impersonate"), "{error}");
    for agent in agents {
        agent.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn the_defaults_work_through_kubectl_proxy_in_front_of_the_real_apiserver() {
    let control_plane = ControlPlane::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The gateway's identity behind the proxy: the ServiceAccount of deploy/gateway.
    control_plane
        .kubectl(&["apply", "-k", "deploy/gateway"])
        .unwrap();
    let kubeconfig = control_plane
        .service_account_kubeconfig("edgebeat-system", "edgebeat-gateway")
        .unwrap();
    let mut proxy = edgebeat_tests::process::spawn_async(
        tokio::process::Command::new(control_plane.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["proxy", "--port=0", "--address=127.0.0.1"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true),
    )
    .unwrap();
    let line = {
        use tokio::io::AsyncBufReadExt as _;
        let mut lines = tokio::io::BufReader::new(proxy.stdout.take().unwrap()).lines();
        tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };
    // "Starting to serve on 127.0.0.1:40123": HTTP/1.1 only, plain http://.
    let proxy_addr = line.rsplit(' ').next().unwrap().to_owned();
    let mut gateway = GatewayProcess::start(
        [
            "--server",
            &format!("http://{proxy_addr}"),
            "--grpc-listen=127.0.0.1:0",
            "--allow-unidentified-agents",
            "--metrics-listen=127.0.0.1:0",
        ],
        &dir.path().join("gateway.log"),
    )
    .unwrap();
    let grpc = gateway.address("gRPC listening").await.unwrap();
    let name = "through-proxy";
    let agent = start_agent(
        test_agent_config(
            name,
            &fixture("rpi4-cgroup1"),
            grpc_transport(&format!("http://{grpc}")),
        ),
        Arc::new(edgebeat_hw::SystemClock),
    )
    .unwrap();
    let admin = control_plane.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin);
    eventually(
        "Ready through kubectl proxy",
        Duration::from_secs(60),
        || async { ready(&nodes, name).await.as_deref() == Some("True") },
    )
    .await;
    let errors: Vec<_> = gateway
        .lines()
        .into_iter()
        .filter(|l| l.get("level").and_then(|v| v.as_str()) == Some("ERROR"))
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    agent.stop().await.unwrap();
}

fn signal(pid: u32, signal: &str) {
    edgebeat_tests::process::signal(pid, signal).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn watches_recover_from_410_gone_with_one_list_each() {
    // Test-only: etcd compacted every 5 s (upstream: 5 min).
    let control_plane =
        ControlPlane::start(&[("EDGEBEAT_ETCD_COMPACTION_INTERVAL", "5s")]).unwrap();
    let gateway = DeployedGateway::start(&control_plane, &[]).await;
    let name = "gone-a";
    let agent = gateway.agent(name);
    let admin = control_plane.admin_client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(admin, "kube-node-lease");
    eventually("the Lease made", Duration::from_secs(60), || async {
        leases.get_opt(name).await.ok().flatten().is_some()
    })
    .await;
    agent.stop().await.unwrap();

    // The gateway frozen while the managed objects change, etcd compacts past what it
    // saw, and kube-apiserver restarts (its watch cache starts anew): its watches resume
    // from a compacted resourceVersion.
    let pid = gateway.process.pid().unwrap();
    signal(pid, "STOP");
    for i in 0..20 {
        let patch = serde_json::json!({"spec": {"leaseDurationSeconds": 41 + i % 2}});
        leases
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(patch),
            )
            .await
            .unwrap();
    }
    // Two compaction intervals: time itself is the condition (etcd compacts on its clock).
    tokio::time::sleep(Duration::from_secs(11)).await;
    control_plane.restart_component("kube-apiserver").unwrap();
    let resumed = jiff::Timestamp::now();
    signal(pid, "CONT");

    let mut process = gateway.process;
    let relisted = process
        .wait_for(Duration::from_secs(60), |l| {
            l.get("message").and_then(|m| m.as_str()) == Some("watch listed and following")
                && l.get("kind").and_then(|k| k.as_str()) == Some("Lease")
                && l.get("timestamp")
                    .and_then(|t| t.as_str())
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                    .is_some_and(|t| t >= resumed)
        })
        .await;
    relisted.unwrap();
    // One list per watch to recover, not a storm: the lists counted over a 5 s window
    // (what is measured, not a wait for state).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let lists = lists_since(&control_plane, resumed);
    eprintln!("lists after 410: {lists:?}");
    // kube-runtime's watcher lists again only after 410 Gone (other errors resume the watch
    // from its resourceVersion): a list of each kind is the 410 met and recovered from.
    for kind in ["leases", "nodes"] {
        assert!(
            lists.get(kind).is_some_and(|n| (1..=2).contains(n)),
            "{kind}: one list after 410 Gone, not a storm: {lists:?}"
        );
    }
}

/// `name = value` of the line of `metric` in a `/metrics` text, if it is there.
fn metric_value(text: &str, metric: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(metric)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Log lines of `process` with `level` whose message is `message`.
fn logged(
    process: &GatewayProcess,
    level: &str,
    message: &str,
) -> Vec<edgebeat_tests::process::LogLine> {
    process
        .lines()
        .into_iter()
        .filter(|l| {
            l.get("level").and_then(|v| v.as_str()) == Some(level)
                && l.get("message").and_then(|m| m.as_str()) == Some(message)
        })
        .collect()
}

/// etcd frozen (SIGSTOP) for longer than `EdgebeatSiteUnreachable`'s window (1 min) with a
/// site of three nodes connected throughout: kube-apiserver's watches stay up (its etcd
/// connections stay open, nothing answers) while writes fail, as in its drain or with etcd
/// in trouble, and every Lease ages. The gateway tells it as an apiserver
/// outage, not a site cut: `edgebeat_gateway_site_reachable` stays 1 and
/// `edgebeat_gateway_sites_held` says why, a real Prometheus evaluating the shipped rules
/// fires no `EdgebeatSiteUnreachable`, no site Event is written, and the log holds one
/// ERROR at its start and one INFO at its end, not a line per node per retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane (scripts/test.sh builds it)"]
async fn an_etcd_outage_is_told_as_an_apiserver_outage_not_a_site_cut() {
    let control_plane = ControlPlane::start(&[]).unwrap();
    let gateway = DeployedGateway::start(&control_plane, &[]).await;
    let names = ["held-a", "held-b", "held-c"];
    let _agents: Vec<_> = names
        .iter()
        .map(|n| {
            let mut config = gateway.agent_config(n);
            config
                .node_labels
                .insert(edgebeat_gateway::sites::ZONE_LABEL.into(), "plant-o".into());
            start_agent(config, Arc::new(edgebeat_hw::SystemClock)).unwrap()
        })
        .collect();
    let admin = control_plane.admin_client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let renewed_after = |at: jiff::Timestamp| all_renewed_after(&leases, &names, at);
    let scrape = || async {
        edgebeat_tests::harness::http_get(gateway.health, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    };
    const REACHABLE: &str = "edgebeat_gateway_site_reachable{site=\"plant-o\"}";
    let start = jiff::Timestamp::now();
    eventually(
        "every Lease renewed, the site seen",
        Duration::from_secs(60),
        || async {
            renewed_after(start).await && metric_value(&scrape().await, REACHABLE) == Some(1.0)
        },
    )
    .await;
    // A real Prometheus evaluating the shipped rules on the gateway every second.
    let dir = tempfile::tempdir().unwrap();
    let rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/monitoring/rules.yaml")
        .canonicalize()
        .unwrap();
    let (prometheus, _prometheus) = edgebeat_tests::prometheus::start(
        dir.path(),
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{}']\nscrape_configs:\n  - job_name: edgebeat-gateway-metrics\n    static_configs:\n      - targets: ['{}']\n",
            rules.display(),
            gateway.health
        ),
    )
    .await;
    eventually(
        "Prometheus scrapes the gateway",
        Duration::from_secs(30),
        || async {
            !edgebeat_tests::prometheus::query(prometheus, REACHABLE)
                .await
                .is_empty()
        },
    )
    .await;

    let stopped = jiff::Timestamp::now();
    control_plane.signal_component("etcd", "STOP").unwrap();
    // Longer than the alert's `for: 1m`, scraped every second meanwhile.
    let outage = Duration::from_secs(75);
    let until = tokio::time::Instant::now() + outage;
    let mut held_seen = false;
    while tokio::time::Instant::now() < until {
        let metrics = scrape().await;
        assert_ne!(
            metric_value(&metrics, REACHABLE),
            Some(0.0),
            "a site connected throughout is not cut off by an outage"
        );
        held_seen |= metric_value(&metrics, "edgebeat_gateway_sites_held") == Some(1.0);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(held_seen, "edgebeat_gateway_sites_held said why");
    control_plane.signal_component("etcd", "CONT").unwrap();
    let up = jiff::Timestamp::now();
    eventually(
        "every Lease renewed after the outage",
        Duration::from_secs(90),
        || renewed_after(up),
    )
    .await;
    eventually(
        "the sites judged again",
        Duration::from_secs(60),
        || async {
            let metrics = scrape().await;
            assert_ne!(
                metric_value(&metrics, REACHABLE),
                Some(0.0),
                "no cut after the return"
            );
            metric_value(&metrics, "edgebeat_gateway_sites_held") == Some(0.0)
        },
    )
    .await;

    let process = &gateway.process;
    let began = logged(
        process,
        "ERROR",
        "the apiserver does not take writes (429, 5xx or no answer); backing off, one probe request at a time; renewals are not written until it does",
    );
    assert_eq!(began.len(), 1, "one ERROR for the outage: {began:?}");
    let at = |l: &edgebeat_tests::process::LogLine| {
        l.get("timestamp")
            .and_then(|t| t.as_str())
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .unwrap()
    };
    let first_error = at(&began[0]).duration_since(stopped);
    let ended = logged(process, "INFO", "the apiserver takes writes again");
    assert_eq!(ended.len(), 1, "one INFO at its end: {ended:?}");
    let during: Vec<_> = process
        .lines()
        .into_iter()
        .filter(|l| at(l) >= stopped)
        .collect();
    eprintln!(
        "etcd outage of {outage:?}: first ERROR {first_error:?} after the stop (a write fails once its 10 s deadline passes); {} log lines from the stop to the sites judged again",
        during.len()
    );
    for line in &during {
        eprintln!(
            "  {} {} {}",
            line.get("level").and_then(|v| v.as_str()).unwrap_or(""),
            line.get("message").and_then(|v| v.as_str()).unwrap_or(""),
            line.get("kind").and_then(|v| v.as_str()).unwrap_or("")
        );
    }
    assert!(
        first_error < jiff::SignedDuration::from_secs(25),
        "the outage is an ERROR within a renew interval and a request's deadline: {first_error:?}"
    );
    assert!(
        logged(process, "WARN", "lease renewal failed").is_empty(),
        "each node's failure is no WARN of its own during an outage"
    );
    assert!(logged(process, "WARN", "site cut off").is_empty());
    assert!(
        during.len() <= 40,
        "an outage is a few lines, not one per node per retry: {during:#?}"
    );
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin, "default");
    let site_events: Vec<_> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref().is_some_and(|r| r.starts_with("Site")))
        .collect();
    assert!(site_events.is_empty(), "no site Event: {site_events:?}");
    let fired = edgebeat_tests::prometheus::query(
        prometheus,
        "ALERTS{alertname=\"EdgebeatSiteUnreachable\"}",
    )
    .await;
    assert!(fired.is_empty(), "EdgebeatSiteUnreachable fired: {fired:?}");
    let held = edgebeat_tests::prometheus::query(
        prometheus,
        "max_over_time(edgebeat_gateway_sites_held[10m])",
    )
    .await;
    assert_eq!(
        held[0]["value"][1], "1",
        "Prometheus saw the hold: {held:?}"
    );
}
