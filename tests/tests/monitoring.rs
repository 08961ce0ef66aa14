//! What ships for operators, checked against the real thing: the alert rules by promtool
//! (syntax and unit tests), the PrometheusRule against the plain rules file, the runbook
//! against the alerts, `kubectl kustomize` with the monitoring component, and the Grafana
//! dashboard against a real Prometheus that scraped two real gateways (gRPC and signed
//! MQTT, both enrolling their agents) over loopback: every panel's query must return a
//! series.
//!
//! promtool and prometheus are Debian's `prometheus` package, which `scripts/test.sh`
//! installs: a missing one fails the test, naming it. kubectl is the operator's own (no
//! Debian package): its test is `#[ignore]`d, and scripts/test.sh runs it when kubectl is
//! installed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use edgebeat_gateway::enrollment::EnrollmentOptions;
use edgebeat_tests::harness::{Cluster, Transport, fixture_copy, gateway_options};
use edgebeat_tests::prometheus::{get_json, query};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn monitoring(file: &str) -> PathBuf {
    repo().join("deploy/monitoring").join(file)
}

/// `name` on PATH, or a failure saying where to get it.
fn tool(name: &str, from: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{name} not found on PATH: {from}"))
}

fn promtool() -> PathBuf {
    tool(
        "promtool",
        "install Debian's prometheus package (scripts/test.sh does)",
    )
}

fn run(program: &Path, args: &[&str]) -> String {
    let out = edgebeat_tests::process::output(
        std::process::Command::new(program)
            .args(args)
            .env("KUBECONFIG", "/dev/null"),
    )
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{text}",
        program.display()
    );
    text
}

fn yaml(path: &Path) -> Value {
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every alerting rule of `rules.yaml`.
fn alerts() -> Vec<Value> {
    let rules = yaml(&monitoring("rules.yaml"));
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

/// promtool accepts the rules and every unit test in `rules.test.yaml` passes; each alert
/// is exercised by at least one test case.
#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let promtool = promtool();
    let rules = monitoring("rules.yaml");
    let checked = run(&promtool, &["check", "rules", rules.to_str().unwrap()]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tests = monitoring("rules.test.yaml");
    let tested = run(&promtool, &["test", "rules", tests.to_str().unwrap()]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    let cases = std::fs::read_to_string(&tests).unwrap();
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap();
        assert!(
            cases.contains(&format!("alertname: {name}")),
            "no unit test exercises {name}"
        );
    }
}

/// The PrometheusRule for prometheus-operator carries exactly the plain rules file's groups.
#[test]
fn the_prometheus_rule_carries_exactly_the_plain_rules() {
    let plain = yaml(&monitoring("rules.yaml"));
    let rule = yaml(&monitoring("prometheusrule.yaml"));
    assert_eq!(rule["kind"], "PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["spec"]["groups"], plain["groups"]);
}

/// Every alert has a severity, a summary, a description, and a runbook link to its own
/// section of deploy/README.md.
#[test]
fn every_alert_has_a_summary_and_a_runbook_section() {
    let readme = std::fs::read_to_string(repo().join("deploy/README.md")).unwrap();
    let alerts = alerts();
    assert!(alerts.len() >= 8, "{} alerts", alerts.len());
    for alert in alerts {
        let name = alert["alert"].as_str().unwrap();
        assert!(alert["labels"]["severity"].is_string(), "{name}: severity");
        let notes = &alert["annotations"];
        for key in ["summary", "description"] {
            assert!(
                notes[key].as_str().is_some_and(|s| !s.is_empty()),
                "{name}: {key}"
            );
        }
        let url = notes["runbook_url"].as_str().unwrap();
        let anchor = name.to_lowercase();
        assert!(
            url.ends_with(&format!("deploy/README.md#{anchor}")),
            "{name}: {url}"
        );
        assert!(
            readme.contains(&format!("#### {name}\n")),
            "{name}: no runbook section"
        );
    }
}

/// `kubectl kustomize` renders the gateway with and without the monitoring component; with
/// it, a metrics Service selects the gateway's pods on its metrics port, the ServiceMonitor
/// selects that Service by port name, and the PrometheusRule is the same object as the file.
#[test]
#[ignore = "needs kubectl on PATH: scripts/test.sh runs it when kubectl is installed"]
fn kustomize_adds_the_monitoring_component_to_the_gateway() {
    let kubectl = tool("kubectl", "the operator's kubectl (CI has it)");
    let render = |dir: &str| -> Vec<Value> {
        let out = run(&kubectl, &["kustomize", repo().join(dir).to_str().unwrap()]);
        serde_saphyr::from_multiple(&out).unwrap()
    };
    let plain = render("deploy/gateway");
    let monitored = render("deploy/gateway-monitoring");
    let kinds = |docs: &[Value]| -> Vec<String> {
        let mut k: Vec<String> = docs
            .iter()
            .map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"]))
            .collect();
        k.sort();
        k
    };
    let added: Vec<String> = kinds(&monitored)
        .into_iter()
        .filter(|k| !kinds(&plain).contains(k))
        .collect();
    assert_eq!(added.len(), 3, "{added:?}");
    for doc in &plain {
        assert!(
            monitored.contains(doc),
            "the component changed {}",
            doc["kind"]
        );
    }
    // The component's own objects: those the plain rendering lacks.
    let of = |kind: &str| -> &Value {
        monitored
            .iter()
            .find(|d| d["kind"] == kind && !plain.contains(d))
            .unwrap_or_else(|| panic!("the component adds no {kind}"))
    };
    let monitor = of("ServiceMonitor");
    let service = of("Service");
    let deployment = monitored
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    assert_eq!(
        monitor["metadata"]["namespace"],
        service["metadata"]["namespace"]
    );
    let labels = service["metadata"]["labels"].as_object().unwrap();
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(labels.get(k), Some(v), "ServiceMonitor selector {k}");
    }
    let port = monitor["spec"]["endpoints"][0]["port"].as_str().unwrap();
    let service_port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port)
        .unwrap_or_else(|| panic!("the metrics Service has no port {port}"));
    let pod = &deployment["spec"]["template"];
    for (k, v) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(pod["metadata"]["labels"][k], *v, "Service selector {k}");
    }
    let container_ports = pod["spec"]["containers"][0]["ports"].as_array().unwrap();
    assert!(
        container_ports
            .iter()
            .any(|p| p["name"] == service_port["targetPort"]),
        "targetPort {} is no container port",
        service_port["targetPort"]
    );
    assert_eq!(
        of("PrometheusRule")["spec"],
        yaml(&monitoring("prometheusrule.yaml"))["spec"]
    );
}

/// The job of `scrape-edge-nodes.yaml`: edge nodes' kubelet resource metrics through
/// kube-apiserver's node proxy.
const EDGE_NODES_JOB: &str = "edgebeat-edge-nodes";

/// Every `expr` of every panel (rows' panels too) of the dashboard.
fn dashboard_queries() -> Vec<(String, String)> {
    fn walk(panel: &Value, out: &mut Vec<(String, String)>) {
        let title = panel["title"].as_str().unwrap_or("").to_owned();
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push((title.clone(), expr.to_owned()));
            }
        }
        for inner in panel["panels"].as_array().into_iter().flatten() {
            walk(inner, out);
        }
    }
    let text = std::fs::read_to_string(monitoring("dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    walk(&dashboard, &mut out);
    out
}

/// Serves `cluster`'s first replica's metrics, as the gateway binary registers them, on a
/// port of its own; returns its address.
async fn serve_metrics(cluster: &Cluster) -> SocketAddr {
    let replica = cluster.replicas[0].as_ref().unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    replica.gateway.register_metrics(&mut registry);
    replica.requests.register(&mut registry);
    registry.register_collector(Box::new(edgebeat_transports::observe::ProcessCollector));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(edgebeat_transports::observe::serve(
        listener,
        Arc::new(registry),
        || Ok(()),
        std::future::pending(),
    ));
    addr
}

/// A real Prometheus (Debian's, 2.42) scraping `targets` every second; returns its address
/// and the process.
async fn prometheus(dir: &Path, targets: &[SocketAddr]) -> (SocketAddr, tokio::process::Child) {
    let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    edgebeat_tests::prometheus::start(
        dir,
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: edgebeat-gateway\n    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        ),
    )
    .await
}

/// A cluster over `transport` whose gateway enrolls, with one enrolled agent `node`
/// heartbeating; returns it, the agent and what must outlive them.
async fn enrolled(
    transport: Transport,
    node: &str,
) -> (
    Cluster,
    edgebeat_tests::harness::AgentHandle,
    [tempfile::TempDir; 2],
) {
    let cluster =
        Cluster::start_enrolling(transport, EnrollmentOptions::default(), gateway_options())
            .await
            .unwrap();
    let token = cluster
        .bootstrap_token(&[node], 1, Duration::from_secs(3600))
        .await
        .unwrap();
    let host = fixture_copy("rpi4-cgroup1").unwrap();
    let certs = tempfile::tempdir().unwrap();
    let mut config = cluster
        .enrolled_agent_config(node, host.path(), &token, certs.path())
        .unwrap();
    // A site, so the per-site panels have series.
    config.node_labels.insert(
        edgebeat_gateway::sites::ZONE_LABEL.into(),
        format!("{node}-site"),
    );
    let agent = cluster.start_agent(config).unwrap();
    cluster
        .wait_for_renewals(node, 2, Duration::from_secs(60))
        .await
        .unwrap();
    (cluster, agent, [host, certs])
}

/// A real Prometheus scrapes two gateways (gRPC and signed MQTT, each with an enrolled
/// agent); every query of the dashboard, with `$__rate_interval` as 10s, then returns at
/// least one series: a panel whose query returns nothing is a broken panel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_series_from_a_real_prometheus() {
    let all = dashboard_queries();
    for (title, expr) in &all {
        let vars: Vec<&str> = expr
            .match_indices('$')
            .map(|(i, _)| &expr[i..])
            .filter(|rest| !rest.starts_with("$__rate_interval"))
            .collect();
        assert!(
            vars.is_empty(),
            "{title}: a variable the test cannot fill: {expr}"
        );
    }
    // The one exception: the edge nodes' CPU and memory (job edgebeat-edge-nodes,
    // scrape-edge-nodes.yaml), which kubelet's /metrics/resource through kube-apiserver's
    // node proxy gives, not a gateway's /metrics. tests/tests/resource_metrics.rs proves those
    // two against the real apiserver (resource_metrics/prometheus.rs). Counted, so that no
    // other query passes unproved by naming that job.
    let (edge, queries): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|(_, expr)| expr.contains(&format!("job=\"{EDGE_NODES_JOB}\"")));
    assert_eq!(edge.len(), 2, "edge-node queries: {edge:?}");
    assert!(queries.len() >= 12, "{} queries", queries.len());
    let (grpc, grpc_agent, _keep_grpc) = enrolled(Transport::Grpc, "watch-grpc-01").await;
    let (mqtt, mqtt_agent, _keep_mqtt) = enrolled(Transport::Mqtt, "watch-mqtt-01").await;
    let targets = [serve_metrics(&grpc).await, serve_metrics(&mqtt).await];
    let dir = tempfile::tempdir().unwrap();
    let (prometheus, mut child) = prometheus(dir.path(), &targets).await;

    // Waits on what Prometheus holds: every query answered with a series, within a
    // deadline long enough for a few scrapes and two renewals per agent.
    edgebeat_tests::wait::until(
        "every panel's query answered with a series",
        Duration::from_secs(90),
        || async {
            let mut empty = Vec::new();
            for (title, expr) in &queries {
                let expr = expr.replace("$__rate_interval", "10s");
                if query(prometheus, &expr).await.is_empty() {
                    empty.push(format!("{title}: {expr}"));
                }
            }
            if empty.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "panels whose query returned nothing:\n{}",
                    empty.join("\n")
                ))
            }
        },
        // Paced as before: each check queries Prometheus.
        edgebeat_tests::wait::every(Duration::from_millis(500)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    // Both gateways were scraped, and they are the only targets.
    let up = query(prometheus, "up == 1").await;
    assert_eq!(up.len(), 2, "{up:?}");
    let _ = child.kill().await;
    grpc_agent.stop().await.unwrap();
    mqtt_agent.stop().await.unwrap();
}

/// `scrape-edge-nodes.yaml`'s job as the real Prometheus relabels it: of three Nodes as its
/// node discovery labels them, it keeps only the one the gateway registered and serves
/// resource metrics for (not a kubelet's Node, nor the gateway's Node without
/// `--resource-metrics-listen`), scrapes it at kube-apiserver's node proxy
/// (`https://kubernetes.default.svc:443/api/v1/nodes/<node>/proxy/metrics/resource`), and
/// labels it `node` and `instance` with the node's name. Offline: Debian's Prometheus has
/// no Kubernetes discovery, so a file of target groups labelled as `role: node` labels
/// Nodes stands for it, and nothing answers the scrape. tests/tests/resource_metrics.rs
/// scrapes through the real apiserver (resource_metrics/prometheus.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_node_job_keeps_gateway_nodes_and_scrapes_them_through_the_node_proxy() {
    let snippet = yaml(&monitoring("scrape-edge-nodes.yaml"));
    let jobs = snippet["scrape_configs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "one job: {jobs:?}");
    let mut job = jobs[0].clone();
    assert_eq!(job["job_name"], EDGE_NODES_JOB);
    assert_eq!(
        job["kubernetes_sd_configs"],
        serde_json::json!([{"role": "node"}])
    );
    let dir = tempfile::tempdir().unwrap();
    // Prometheus reads the CA file when it loads the job: a CA of the test's.
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, &edgebeat_tests::pki::Ca::new("edgebeat-test").cert_pem).unwrap();
    job["tls_config"]["ca_file"] = ca.to_str().unwrap().into();
    let nodes = dir.path().join("nodes.json");
    let fields = job.as_object_mut().unwrap();
    fields.remove("kubernetes_sd_configs");
    fields.insert(
        "file_sd_configs".into(),
        serde_json::json!([{"files": [nodes]}]),
    );
    // How Prometheus's node discovery labels a Node (discovery/kubernetes/node.go).
    let node = |name: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]| {
        let meta = |kind: &str, key: &str| -> String {
            format!("__meta_kubernetes_node_{kind}_{key}")
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect()
        };
        let mut set = serde_json::Map::new();
        set.insert("__meta_kubernetes_node_name".into(), name.into());
        set.insert("instance".into(), name.into());
        for (kind, pairs) in [("label", labels), ("annotation", annotations)] {
            for (k, v) in pairs {
                set.insert(meta(kind, k), (*v).into());
                set.insert(meta(&format!("{kind}present"), k), "true".into());
            }
        }
        serde_json::json!({"targets": ["192.0.2.7:10250"], "labels": set})
    };
    let managed = ("edgebeat.io/managed-by", "edgebeat-gateway");
    let path = (
        "metrics.k8s.io/resource-metrics-path",
        "/nodes/edge-1/metrics/resource",
    );
    let groups = serde_json::json!([
        node(
            "edge-1",
            &[managed, ("kubernetes.io/hostname", "edge-1")],
            &[path]
        ),
        node("edge-2", &[managed], &[]),
        node("kubelet-1", &[("kubernetes.io/hostname", "kubelet-1")], &[]),
    ]);
    std::fs::write(&nodes, groups.to_string()).unwrap();
    // JSON is YAML: Prometheus reads it as its config.
    let config = serde_json::json!({"scrape_configs": [job]}).to_string();
    let (prometheus, mut child) = edgebeat_tests::prometheus::start(dir.path(), &config).await;

    let targets = edgebeat_tests::wait::until(
        "Prometheus discovering the three Nodes",
        Duration::from_secs(30),
        || async {
            let targets = get_json(prometheus, "/api/v1/targets").await;
            let seen = |kind: &str| targets["data"][kind].as_array().map_or(0, Vec::len);
            if seen("activeTargets") + seen("droppedTargets") == 3 {
                Ok(targets)
            } else {
                Err(targets.to_string())
            }
        },
        // Paced as before: each check queries Prometheus.
        edgebeat_tests::wait::every(Duration::from_millis(200)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let active = targets["data"]["activeTargets"].as_array().unwrap();
    assert_eq!(active.len(), 1, "{targets:#}");
    assert_eq!(
        active[0]["labels"],
        serde_json::json!({"instance": "edge-1", "job": EDGE_NODES_JOB, "node": "edge-1"})
    );
    assert_eq!(
        active[0]["scrapeUrl"],
        "https://kubernetes.default.svc:443/api/v1/nodes/edge-1/proxy/metrics/resource"
    );
    let mut dropped: Vec<&str> = targets["data"]["droppedTargets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t["discoveredLabels"]["__meta_kubernetes_node_name"]
                .as_str()
                .unwrap()
        })
        .collect();
    dropped.sort_unstable();
    assert_eq!(dropped, ["edge-2", "kubelet-1"]);
    let _ = child.kill().await;
}
