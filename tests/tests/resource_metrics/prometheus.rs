//! The Prometheus side of edge nodes' resource metrics: the real Prometheus runs the job
//! `deploy/monitoring/scrape-edge-nodes.yaml` ships, against the real kube-apiserver's node
//! proxy, with the permissions that file documents, until the dashboard's edge-node panels
//! have the node's series.

use std::path::Path;
use std::time::Duration;

use edgebeat_tests::control_plane::{ControlPlane, repository};
use edgebeat_tests::prometheus::{get_json, query, start as start_prometheus};
use serde_json::{Value, json};

/// The job of `scrape-edge-nodes.yaml`, which the dashboard's edge-node queries select.
const JOB: &str = "edgebeat-edge-nodes";
/// What the job names inside a pod, replaced here by the test cluster's own.
const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
const IN_CLUSTER_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
const IN_CLUSTER_APISERVER: &str = "kubernetes.default.svc:443";

/// The real Prometheus (Debian's `/usr/bin/prometheus`) scrapes edge node `node` with the
/// job of `deploy/monitoring/scrape-edge-nodes.yaml`, read from that file, through
/// `control_plane`'s kube-apiserver node proxy, until both queries of the dashboard's
/// "Edge nodes: CPU and memory" panels (read from `deploy/monitoring/dashboard.json`) return
/// a series with `node="<node>"`; returns their values, `(cores, working set bytes)`.
///
/// What it proves: the job's relabeling keeps the gateway's Node and reaches
/// `/api/v1/nodes/<node>/proxy/metrics/resource`, and labels its series `node`; the
/// ClusterRole the file's comment documents (read from that comment: `list`/`watch` nodes,
/// `get` nodes/proxy) is enough for a ServiceAccount token to discover and scrape; the
/// exposition the replica serves through the proxy (kubelet's text, with timestamps) is
/// what Prometheus ingests; the two panel queries return the node's figures.
///
/// Replaced, as they must be outside a pod: the apiserver's address (the relabeled
/// `__address__`), the CA file and the token file; the scrape interval (5 s). And the
/// discovery: Debian's Prometheus is built without Kubernetes discovery (`kubernetes_sd_configs`
/// is no field of its config), so a file of target groups stands for `role: node`, written
/// from the Node as Prometheus's ServiceAccount lists it and labelled as Prometheus's node
/// role labels a Node (`discovery/kubernetes/node.go`: name, provider ID, labels,
/// annotations and addresses, `__address__` the first InternalIP, InternalDNS, ExternalIP,
/// ExternalDNS or Hostname with the kubelet endpoint's port, `instance` the node's name);
/// `watch nodes` is checked with `kubectl auth can-i`. Everything else is the file's.
///
/// `dir` holds the credentials, the config and Prometheus's storage. Prometheus is killed
/// when this returns or panics.
///
/// # Panics
/// When Prometheus cannot be started, the RBAC cannot be applied, or the queries have no
/// series for `node` within 90 s (with Prometheus's `/api/v1/targets`).
pub async fn scrapes_edge_node_through_the_node_proxy(
    control_plane: &ControlPlane,
    node: &str,
    dir: &Path,
) -> (f64, f64) {
    let snippet_path = repository().join("deploy/monitoring/scrape-edge-nodes.yaml");
    let snippet_text = std::fs::read_to_string(&snippet_path).unwrap();

    // Prometheus's identity: a ServiceAccount bound to the file's ClusterRole, and a token.
    let role = documented_cluster_role(&snippet_text);
    let role_name = role["metadata"]["name"].as_str().unwrap().to_owned();
    let rbac = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "prometheus", "namespace": "default"}},
            role,
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": role_name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": role_name},
             "subjects": [{"kind": "ServiceAccount", "name": "prometheus",
                           "namespace": "default"}]},
        ],
    });
    let rbac_file = dir.join("prometheus-rbac.json");
    std::fs::write(&rbac_file, rbac.to_string()).unwrap();
    control_plane
        .kubectl(&["apply", "-f", rbac_file.to_str().unwrap()])
        .unwrap();
    let token = control_plane
        .kubectl(&[
            "create",
            "token",
            "prometheus",
            "-n",
            "default",
            "--duration=2h",
        ])
        .unwrap();
    let token_file = dir.join("prometheus.token");
    std::fs::write(&token_file, token.trim()).unwrap();
    let kubeconfig = dir.join("prometheus.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: {}, certificate-authority: {}}}\nusers:\n- name: prometheus\n  user: {{token: {}}}\ncontexts:\n- name: prometheus\n  context: {{cluster: test, user: prometheus}}\ncurrent-context: prometheus\n",
            control_plane.url,
            control_plane.ca.display(),
            token.trim()
        ),
    )
    .unwrap();

    // The node as Prometheus's discovery sees it: listed with its token (RBAC may take a
    // moment to reach the authorizer's cache), and watched.
    let listed = edgebeat_tests::wait::eventually(
        "Prometheus's ServiceAccount listing nodes",
        Duration::from_secs(30),
        || async { control_plane.kubectl_as(&kubeconfig, &["get", "nodes", "-o", "json"]) },
    )
    .await;
    let listed = serde_json::from_str::<Value>(&listed).unwrap();
    let watch = control_plane.kubectl_as(&kubeconfig, &["auth", "can-i", "watch", "nodes"]);
    assert_eq!(
        watch.as_ref().map(|s| s.trim()).ok(),
        Some("yes"),
        "watch nodes: {watch:?}"
    );
    let node_object = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["metadata"]["name"] == node)
        .unwrap_or_else(|| panic!("no Node {node} listed"))
        .clone();
    let targets_file = dir.join("prometheus-nodes.json");
    std::fs::write(
        &targets_file,
        json!([node_target_group(&node_object)]).to_string(),
    )
    .unwrap();

    // The job of the file, with what must differ outside a pod replaced.
    let snippet: Value = serde_saphyr::from_str(&snippet_text)
        .unwrap_or_else(|e| panic!("{}: {e}", snippet_path.display()));
    let jobs = snippet["scrape_configs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "one job in {}", snippet_path.display());
    let mut job = jobs[0].clone();
    assert_eq!(job["job_name"], JOB);
    let apiserver = control_plane
        .url
        .strip_prefix("https://")
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    replace(
        &mut job["tls_config"]["ca_file"],
        IN_CLUSTER_CA,
        control_plane.ca.to_str().unwrap(),
    );
    replace(
        &mut job["authorization"]["credentials_file"],
        IN_CLUSTER_TOKEN,
        token_file.to_str().unwrap(),
    );
    let address = job["relabel_configs"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|r| r["target_label"] == "__address__")
        .expect("a relabeling of __address__");
    replace(
        &mut address["replacement"],
        IN_CLUSTER_APISERVER,
        &apiserver,
    );
    job["scrape_interval"] = json!("5s");
    assert_eq!(
        job["kubernetes_sd_configs"],
        json!([{"role": "node"}]),
        "the node discovery this stands for"
    );
    let fields = job.as_object_mut().unwrap();
    fields.remove("kubernetes_sd_configs");
    fields.insert(
        "file_sd_configs".into(),
        json!([{"files": [targets_file], "refresh_interval": "5s"}]),
    );
    // JSON is YAML: Prometheus reads it as its config.
    let config = json!({"scrape_configs": [job]}).to_string();

    let data = dir.join("prometheus");
    std::fs::create_dir_all(&data).unwrap();
    let (prometheus, _child) = start_prometheus(&data, &config).await;

    let queries = edge_node_queries();
    // The last round's answers, for the failure message.
    let answers = parking_lot::Mutex::new(Vec::new());
    let found = edgebeat_tests::wait::until(
        &format!("series for node {node}"),
        Duration::from_secs(90),
        || async {
            let (mut values, mut answered) = (Vec::new(), Vec::new());
            for expr in &queries {
                let series = query(prometheus, expr).await;
                values.push(
                    series
                        .iter()
                        .find(|s| s["metric"]["node"] == node)
                        .and_then(|s| s["value"][1].as_str()?.parse::<f64>().ok()),
                );
                answered.push(format!("{expr}: {series:?}"));
            }
            *answers.lock() = answered;
            match values[..] {
                [Some(cores), Some(bytes)] => Ok((cores, bytes)),
                _ => Err(values),
            }
        },
        edgebeat_tests::wait::every(Duration::from_millis(500)),
    )
    .await;
    match found {
        Ok(found) => found,
        Err(e) => {
            let targets = get_json(prometheus, "/api/v1/targets").await;
            panic!(
                "{e}:\n{}\nPrometheus's targets: {targets:#}",
                answers.lock().join("\n")
            );
        }
    }
}

/// The ClusterRole in `scrape-edge-nodes.yaml`'s comment: the lines from `#   apiVersion:
/// rbac.authorization.k8s.io/v1` to the first that is not indented comment, uncommented.
fn documented_cluster_role(snippet: &str) -> Value {
    let start = "#   apiVersion: rbac.authorization.k8s.io/v1";
    let lines: Vec<&str> = snippet
        .lines()
        .skip_while(|l| *l != start)
        .take_while(|l| l.starts_with("#   "))
        .map(|l| &l["#   ".len()..])
        .collect();
    assert!(
        !lines.is_empty(),
        "scrape-edge-nodes.yaml documents no ClusterRole ({start})"
    );
    let role: Value = serde_saphyr::from_str(&lines.join("\n"))
        .unwrap_or_else(|e| panic!("the ClusterRole of scrape-edge-nodes.yaml: {e}"));
    assert_eq!(role["kind"], "ClusterRole", "{role}");
    role
}

/// Sets `value`, which must be `in_cluster`, to `here`.
fn replace(value: &mut Value, in_cluster: &str, here: &str) {
    assert_eq!(*value, in_cluster, "the job's in-cluster setting");
    *value = json!(here);
}

/// `name` as a Prometheus label name (`strutil.SanitizeLabelName`).
fn sanitized(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The target group Prometheus's Kubernetes discovery (`role: node`) makes of `node`, for
/// `file_sd_configs`.
///
/// # Panics
/// When it would make none: no address of the types it takes.
fn node_target_group(node: &Value) -> Value {
    const META: &str = "__meta_kubernetes_node_";
    let name = node["metadata"]["name"].as_str().unwrap();
    let mut labels = serde_json::Map::new();
    labels.insert(format!("{META}name"), json!(name));
    labels.insert(
        format!("{META}provider_id"),
        json!(node["spec"]["providerID"].as_str().unwrap_or("")),
    );
    for (kind, key) in [("label", "labels"), ("annotation", "annotations")] {
        for (k, v) in node["metadata"][key].as_object().into_iter().flatten() {
            labels.insert(sanitized(&format!("{META}{kind}_{k}")), v.clone());
            labels.insert(
                sanitized(&format!("{META}{kind}present_{k}")),
                json!("true"),
            );
        }
    }
    let addresses: Vec<(&str, &str)> = node["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| Some((a["type"].as_str()?, a["address"].as_str()?)))
        .collect();
    for (ty, address) in addresses.iter().rev() {
        // The first of each type (reversed, so the first is written last).
        labels.insert(sanitized(&format!("{META}address_{ty}")), json!(address));
    }
    let host = [
        "InternalIP",
        "InternalDNS",
        "ExternalIP",
        "ExternalDNS",
        "LegacyHostIP",
        "Hostname",
    ]
    .iter()
    .find_map(|ty| addresses.iter().find(|(t, _)| t == ty).map(|(_, a)| *a))
    .unwrap_or_else(|| panic!("Node {name} has no address Prometheus scrapes: {addresses:?}"));
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .unwrap_or(0);
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    labels.insert("instance".into(), json!(name));
    json!({"targets": [target], "labels": labels})
}

/// The queries of `deploy/monitoring/dashboard.json` that select [`JOB`]: the "Edge nodes:
/// CPU and memory" panels', CPU first.
fn edge_node_queries() -> Vec<String> {
    fn walk(panel: &Value, out: &mut Vec<String>) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str()
                && expr.contains(&format!("job=\"{JOB}\""))
            {
                out.push(expr.to_owned());
            }
        }
        for inner in panel["panels"].as_array().into_iter().flatten() {
            walk(inner, out);
        }
    }
    let path = repository().join("deploy/monitoring/dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    walk(&dashboard, &mut out);
    assert_eq!(out.len(), 2, "the dashboard's edge-node queries: {out:?}");
    assert!(
        out[0].contains("node_cpu_usage_seconds_total")
            && out[1].contains("node_memory_working_set_bytes"),
        "CPU, then memory: {out:?}"
    );
    out
}
