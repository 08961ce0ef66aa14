//! The Helm chart `deploy/helm/edgebeat-gateway`, rendered and installed by real Helm
//! (`scripts/helm.sh build`, from its Go module) into the real control plane
//! (`scripts/control-plane.sh build`):
//! - one source of truth: for each choice the kustomize bases make, the chart renders the
//!   same objects (`kubectl kustomize` against `helm template`), Helm's own labels aside;
//! - `helm lint --strict` with every example values file, and the schema refuses a wrong
//!   value by its name;
//! - every example renders objects the real kube-apiserver accepts (`--dry-run=server`);
//! - `helm install` with enrollment, then the real gateway binary with the installed
//!   Deployment's flags, as the chart's ServiceAccount, enrolls a board that goes Ready: the
//!   chart's RBAC is enough, and every permission it grants is used; `helm upgrade` to gRPC
//!   and MQTT; `helm uninstall` leaves none of the chart's objects behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use edgebeat_tests::control_plane::{
    ControlPlane, EnrollingGateway, assert_none_refused, gateway_requests, installed_gateway_args,
};
use edgebeat_tests::wait::eventually;
use serde_json::Value;

const CHART: &str = "deploy/helm/edgebeat-gateway";
const NAMESPACE: &str = "edgebeat-system";
const RELEASE: &str = "edgebeat";

/// Labels Helm's chart adds that kustomize's bases do not have.
const HELM_LABELS: [&str; 3] = [
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
];

fn repository() -> PathBuf {
    edgebeat_tests::control_plane::repository()
}

/// The helm binary `scripts/helm.sh` built.
fn helm_binary() -> PathBuf {
    let out = edgebeat_tests::process::output(
        Command::new(repository().join("scripts/helm.sh")).arg("bin"),
    )
    .unwrap();
    assert!(
        out.status.success(),
        "helm is not built: scripts/helm.sh build"
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Runs helm with `args` in the repository; its output, whether it succeeded or not.
fn helm(args: &[&str]) -> std::process::Output {
    edgebeat_tests::process::output(
        Command::new(helm_binary())
            .args(args)
            .current_dir(repository())
            // Nothing of the user's Helm state (repositories, plugins, cache) is read or written.
            .env(
                "HELM_CACHE_HOME",
                std::env::temp_dir().join("edgebeat-helm/cache"),
            )
            .env(
                "HELM_CONFIG_HOME",
                std::env::temp_dir().join("edgebeat-helm/config"),
            )
            .env(
                "HELM_DATA_HOME",
                std::env::temp_dir().join("edgebeat-helm/data"),
            ),
    )
    .unwrap()
}

/// helm with `args` that must succeed: its standard output.
fn helm_ok(args: &[&str]) -> String {
    let out = helm(args);
    assert!(
        out.status.success(),
        "helm {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The YAML documents of `text` as JSON values (empty ones skipped).
fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// `kind/namespace/name` of an object.
fn key(v: &Value) -> String {
    format!(
        "{}/{}/{}",
        v["kind"].as_str().unwrap_or("?"),
        v["metadata"]["namespace"].as_str().unwrap_or("-"),
        v["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Objects by [`key`], without Helm's own labels.
fn by_key(docs: Vec<Value>) -> BTreeMap<String, Value> {
    docs.into_iter()
        .map(|mut v| {
            if let Some(labels) = v["metadata"]["labels"].as_object_mut() {
                for label in HELM_LABELS {
                    labels.remove(label);
                }
            }
            (key(&v), v)
        })
        .collect()
}

/// `helm template` of the chart with the example values files `values` (under the chart's
/// `examples/`) and `--set`s, in [`NAMESPACE`].
fn rendered(values: &[&str], sets: &[&str]) -> BTreeMap<String, Value> {
    let mut args = vec!["template", RELEASE, CHART, "--namespace", NAMESPACE];
    let files: Vec<String> = values
        .iter()
        .map(|v| format!("{CHART}/examples/{v}"))
        .collect();
    for file in &files {
        args.extend(["--values", file]);
    }
    for set in sets {
        args.extend(["--set", set]);
    }
    by_key(documents(&helm_ok(&args)))
}

/// `kubectl kustomize` (the release's own kubectl, offline) of each of `dirs`, together,
/// without the Namespace (Helm's `--create-namespace` makes it; deploy/'s carries the Pod
/// Security labels the chart's README asks for).
fn kustomized(dirs: &[&str]) -> BTreeMap<String, Value> {
    let kubectl = edgebeat_tests::control_plane::built()
        .expect("the control plane's kubectl: scripts/control-plane.sh build")
        .join("kubectl");
    let mut docs = Vec::new();
    for dir in dirs {
        let out = edgebeat_tests::process::output(
            Command::new(&kubectl)
                .args(["kustomize", dir])
                .current_dir(repository()),
        )
        .unwrap();
        assert!(
            out.status.success(),
            "kubectl kustomize {dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        docs.extend(documents(&String::from_utf8(out.stdout).unwrap()));
    }
    by_key(docs)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("Namespace/"))
        .collect()
}

/// Asserts that `chart` holds exactly the objects of `kustomize`, field for field, and
/// besides them only `chart_only`.
fn assert_same(
    what: &str,
    chart: &BTreeMap<String, Value>,
    kustomize: &BTreeMap<String, Value>,
    chart_only: &[&str],
) {
    let mut differences = Vec::new();
    for (key, object) in kustomize {
        match chart.get(key) {
            None => differences.push(format!("{key}: not rendered by the chart")),
            Some(rendered) if rendered != object => differences.push(format!(
                "{key}:\n  kustomize {}\n  chart     {}",
                serde_json::to_string(object).unwrap(),
                serde_json::to_string(rendered).unwrap()
            )),
            Some(_) => {}
        }
    }
    for key in chart.keys() {
        if !kustomize.contains_key(key) && !chart_only.contains(&key.as_str()) {
            differences.push(format!("{key}: rendered by the chart only"));
        }
    }
    assert!(
        differences.is_empty(),
        "{what}: the chart and kustomize differ:\n{}",
        differences.join("\n")
    );
}

/// One source of truth: for each choice deploy/'s kustomizations make, the chart renders
/// the same objects. The chart's only additions: the dashboard ConfigMap (kustomize users
/// load `deploy/monitoring/dashboard.json` into Grafana themselves), and
/// `--impersonate-nodes`, which deploy/README.md has operators add to the Deployment with
/// `deploy/gateway/impersonation`. The chart's copies of the alert rules and the dashboard
/// are byte for byte deploy/monitoring's.
#[test]
#[ignore = "needs helm (scripts/helm.sh build) and the control plane's kubectl: scripts/test.sh runs it"]
fn the_chart_renders_what_the_kustomize_bases_do() {
    let dashboard = "ConfigMap/edgebeat-system/edgebeat-gateway-dashboard";
    for (values, kustomizations, chart_only) in [
        (None, "deploy/gateway", None),
        (Some("grpc.yaml"), "deploy/gateway", None),
        (Some("grpc-mqtt.yaml"), "deploy/gateway-mqtt", None),
        (Some("enrollment.yaml"), "deploy/gateway-enrollment", None),
        (
            Some("monitoring.yaml"),
            "deploy/gateway-monitoring",
            Some(dashboard),
        ),
    ] {
        assert_same(
            values.unwrap_or("defaults"),
            &rendered(values.as_slice(), &[]),
            &kustomized(&[kustomizations]),
            chart_only.as_slice(),
        );
    }
    let mut impersonating = kustomized(&["deploy/gateway", "deploy/gateway/impersonation"]);
    let args = impersonating
        .get_mut("Deployment/edgebeat-system/edgebeat-gateway")
        .unwrap()["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array_mut()
        .unwrap();
    args.push("--impersonate-nodes".into());
    assert_same(
        "examples/impersonation.yaml",
        &rendered(&["impersonation.yaml"], &[]),
        &impersonating,
        &[],
    );
    for file in ["rules.yaml", "dashboard.json"] {
        assert_eq!(
            std::fs::read(repository().join(CHART).join("files").join(file)).unwrap(),
            std::fs::read(repository().join("deploy/monitoring").join(file)).unwrap(),
            "{CHART}/files/{file} is a copy of deploy/monitoring/{file}: copy it again"
        );
    }
    // The dashboard ConfigMap carries the sidecar's label and the dashboard itself.
    let dashboard = &rendered(&["monitoring.yaml"], &[])["ConfigMap/edgebeat-system/edgebeat-gateway-dashboard"];
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value =
        serde_json::from_str(dashboard["data"]["edgebeat-gateway.json"].as_str().unwrap()).unwrap();
    assert!(json["panels"].as_array().is_some_and(|p| !p.is_empty()));
}

/// Sizing follows the transport (BENCHMARKS.md): MQTT only needs a tenth of gRPC's memory
/// and carries more nodes; RBAC is rendered only for what is enabled.
#[test]
#[ignore = "needs helm (scripts/helm.sh build): scripts/test.sh runs it"]
fn resources_and_rbac_follow_the_choices() {
    let mqtt_only = rendered(&[], &["grpc.enabled=false", "mqtt.enabled=true"]);
    let deployment = &mqtt_only["Deployment/edgebeat-system/edgebeat-gateway"];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["resources"]["limits"]["memory"], "128Mi");
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--max-nodes=10000"), "{args:?}");
    assert!(!args.iter().any(|a| a.starts_with("--grpc-")), "{args:?}");
    assert!(!mqtt_only.contains_key("Service/edgebeat-system/edgebeat-gateway"));
    let kinds = |objects: &BTreeMap<String, Value>| -> Vec<String> {
        objects
            .keys()
            .filter(|k| k.contains("Role"))
            .cloned()
            .collect()
    };
    let plain = kinds(&rendered(&[], &[]));
    assert!(
        !plain
            .iter()
            .any(|k| k.contains("enrollment") || k.contains("impersonate")),
        "{plain:?}"
    );
}

/// `helm lint --strict` passes with every example values file, and the schema refuses a
/// wrong value naming it: `helm install` fails before anything is sent.
#[test]
#[ignore = "needs helm (scripts/helm.sh build): scripts/test.sh runs it"]
fn lint_passes_and_the_schema_names_a_wrong_value() {
    let examples: Vec<String> = std::fs::read_dir(repository().join(CHART).join("examples"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(examples.len() >= 5, "{examples:?}");
    helm_ok(&["lint", "--strict", CHART]);
    for example in &examples {
        helm_ok(&[
            "lint",
            "--strict",
            CHART,
            "--values",
            &format!("{CHART}/examples/{example}"),
        ]);
    }
    for (set, named) in [
        ("replicas=two", "replicas"),
        ("enrollment.approval=sometimes", "approval"),
        ("mqtt.endpoint=http://broker:1883", "endpoint"),
        ("grpc.enabled=false", "enabled"),
        ("unknownOption=1", "unknownOption"),
    ] {
        let out = helm(&["template", RELEASE, CHART, "--set", set]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--set {set} was accepted");
        assert!(
            stderr.contains("values don't meet the specifications of the schema")
                && stderr.contains(named),
            "--set {set}: {stderr}"
        );
    }
}

/// The CRDs of the Prometheus Operator the monitoring example needs, from its module.
fn install_monitoring_crds(control_plane: &ControlPlane) {
    let out = edgebeat_tests::process::output(
        Command::new(repository().join("scripts/helm.sh")).arg("crds"),
    )
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    for crd in ["servicemonitors", "prometheusrules"] {
        let file = dir.join(format!("monitoring.coreos.com_{crd}.yaml"));
        control_plane
            .kubectl(&["apply", "--server-side", "-f", file.to_str().unwrap()])
            .unwrap();
        control_plane
            .kubectl(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                &format!("crd/{crd}.monitoring.coreos.com"),
            ])
            .unwrap();
    }
}

/// `(verb, resource)` pairs the rendered ClusterRoles and Roles grant (`resource` as
/// [`edgebeat_tests::control_plane::AuditEvent::resource`] names it:
/// `resource[/subresource]`; no two of the chart's resources share a name across groups).
fn granted(objects: &BTreeMap<String, Value>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (key, object) in objects {
        if !(key.starts_with("ClusterRole/") || key.starts_with("Role/")) {
            continue;
        }
        for rule in object["rules"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    out.push((
                        verb.as_str().unwrap().to_owned(),
                        resource.as_str().unwrap().to_owned(),
                    ));
                }
            }
        }
    }
    out
}

/// Every example renders objects the real kube-apiserver accepts; then the chart installed
/// with enrollment carries an enrolled board through the real gateway binary run with the
/// installed Deployment's flags as the chart's ServiceAccount, and, upgraded to manual
/// approval, a second one approved with kubectl: nothing refused, every permission granted
/// used (the signer's `approve` and `sign` are checked by the apiserver
/// as the gateway approves and signs, not requested). Upgraded to gRPC and MQTT, the
/// Deployment gains the MQTT flags; uninstalled, none of the chart's objects is left, and
/// the site CA's Secret (the gateway's, not the chart's) stays for the boards that trust it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs helm (scripts/helm.sh build) and the control plane (scripts/control-plane.sh build): scripts/test.sh runs it"]
async fn helm_installs_a_least_privilege_gateway_that_enrolls_a_board() {
    // Its own control plane: the shared one holds deploy/'s objects under the same names,
    // which Helm rightly refuses to adopt.
    let control_plane = ControlPlane::start(&[]).unwrap();
    let kubeconfig = control_plane.admin_kubeconfig.to_str().unwrap().to_owned();
    install_monitoring_crds(&control_plane);
    control_plane
        .kubectl(&["create", "namespace", NAMESPACE])
        .unwrap();
    let examples = std::fs::read_dir(repository().join(CHART).join("examples")).unwrap();
    for example in examples {
        let file = example.unwrap().path();
        let manifest = helm_ok(&[
            "template",
            RELEASE,
            CHART,
            "--namespace",
            NAMESPACE,
            "--values",
            file.to_str().unwrap(),
        ]);
        let rendered_file = control_plane.dir.join("rendered.yaml");
        std::fs::write(&rendered_file, manifest).unwrap();
        control_plane
            .kubectl(&[
                "apply",
                "--dry-run=server",
                "-f",
                rendered_file.to_str().unwrap(),
            ])
            .unwrap_or_else(|e| panic!("{}: {e:#}", file.display()));
    }

    // A values file with a wrong type: `helm install` refuses it, naming the value, and
    // installs nothing.
    let wrong = control_plane.dir.join("wrong-values.yaml");
    std::fs::write(&wrong, "grpc:\n  port: \"7443\"\n").unwrap();
    let out = helm(&[
        "install",
        RELEASE,
        CHART,
        "--kubeconfig",
        &kubeconfig,
        "--namespace",
        NAMESPACE,
        "--values",
        wrong.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("values don't meet the specifications of the schema")
            && stderr.contains("/grpc/port"),
        "{stderr}"
    );
    let releases = helm_ok(&[
        "list",
        "--kubeconfig",
        &kubeconfig,
        "--all-namespaces",
        "--short",
    ]);
    assert!(releases.trim().is_empty(), "{releases}");

    let started = jiff::Timestamp::now();
    let enrollment = format!("{CHART}/examples/enrollment.yaml");
    // `helm <verb> <args>` on the release, in its namespace, as the cluster admin.
    let release = |verb: &str, args: &[&str]| {
        let mut all = vec![verb];
        if verb != "get" {
            all.push(RELEASE);
        }
        all.extend(args);
        all.extend(["--kubeconfig", &kubeconfig, "--namespace", NAMESPACE]);
        helm_ok(&all)
    };
    release(
        "install",
        &[CHART, "--create-namespace", "--values", &enrollment],
    );
    let notes = release("status", &[]);
    assert!(
        notes.contains("token create") && notes.contains("kubectl get csr"),
        "{notes}"
    );
    let args = installed_gateway_args(&control_plane, &[], "edgebeat-gateway-helm").unwrap();
    assert!(args.contains(&"--enrollment".to_owned()), "{args:?}");
    let gateway = EnrollingGateway::with_args(args).await;
    let token = gateway.token("helm-board-*", 1);
    let board = gateway.agent("helm-board-1", &token);
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
        kube::Api::all(control_plane.admin_client().await.unwrap());
    eventually("the board Ready", Duration::from_secs(90), || async {
        nodes
            .get_opt("helm-board-1")
            .await
            .ok()
            .flatten()
            .and_then(|n| n.status?.conditions)
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    })
    .await;
    eventually("a Lease renewed twice", Duration::from_secs(60), || async {
        gateway_requests(&control_plane, started)
            .iter()
            .filter(|e| e.verb == "update" && e.resource() == "leases")
            .count()
            >= 2
    })
    .await;
    board.stop().await.unwrap();
    drop(gateway);

    // Manual approval, by upgrading the release: the board's request waits, asked again
    // (the CSR read back) until a person approves it with kubectl.
    release(
        "upgrade",
        &[
            CHART,
            "--values",
            &enrollment,
            "--set",
            "enrollment.approval=manual",
        ],
    );
    let args = installed_gateway_args(&control_plane, &[], "edgebeat-gateway-helm").unwrap();
    assert!(
        args.contains(&"--csr-approval=manual".to_owned()),
        "{args:?}"
    );
    let gateway = EnrollingGateway::with_args(args).await;
    let token = gateway.token("helm-board-*", 1);
    let board = gateway.agent("helm-board-2", &token);
    let pending = || {
        let list: Value = serde_json::from_str(
            &control_plane
                .kubectl(&["get", "csr", "-o", "json"])
                .unwrap(),
        )
        .unwrap();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|csr| {
                csr["metadata"]["annotations"]["edgebeat.io/node"] == "helm-board-2"
                    && csr["status"]["conditions"].is_null()
            })
            .map(|csr| csr["metadata"]["name"].as_str().unwrap().to_owned())
    };
    eventually(
        "a pending CSR read back",
        Duration::from_secs(60),
        || async {
            pending().is_some()
                && control_plane.audit().unwrap().iter().any(|e| {
                    e.user.username == "system:serviceaccount:edgebeat-system:edgebeat-gateway"
                        && e.verb == "get"
                        && e.resource() == "certificatesigningrequests"
                })
        },
    )
    .await;
    control_plane
        .kubectl(&["certificate", "approve", &pending().unwrap()])
        .unwrap();
    eventually(
        "the approved board registered",
        Duration::from_secs(90),
        || async { nodes.get_opt("helm-board-2").await.ok().flatten().is_some() },
    )
    .await;
    board.stop().await.unwrap();

    let from_gateway = gateway_requests(&control_plane, started);
    assert_none_refused(&from_gateway);
    let used: std::collections::BTreeSet<(String, String)> = from_gateway
        .iter()
        .map(|e| (e.verb.clone(), e.resource()))
        .collect();
    let installed = by_key(documents(&release("get", &["manifest", RELEASE])));
    let unused: Vec<_> = granted(&installed)
        .into_iter()
        .filter(|(verb, resource)| {
            !used.contains(&(verb.clone(), resource.clone()))
                // Authorization checks the apiserver makes as the gateway approves and
                // signs CSRs of its signer (certificates.k8s.io's signer admission), never
                // requests of their own.
                && resource != "signers"
        })
        .collect();
    assert!(
        unused.is_empty(),
        "granted by the chart and never used: {unused:?} (used: {used:?})"
    );

    // Upgrade: gRPC only, to gRPC and MQTT.
    release(
        "upgrade",
        &[CHART, "--values", &enrollment, "--set", "mqtt.enabled=true"],
    );
    let broker_tls = tempfile::tempdir().unwrap();
    let upgraded = installed_gateway_args(
        &control_plane,
        &[("mqtt-tls", broker_tls.path())],
        "edgebeat-gateway-helm",
    )
    .unwrap();
    assert!(
        upgraded
            .iter()
            .any(|a| a.starts_with("--mqtt-endpoint=mqtts://"))
            && upgraded.iter().any(|a| a.starts_with("--grpc-listen=")),
        "{upgraded:?}"
    );

    // Uninstall: nothing of the chart's is left; the gateway's site CA Secret stays.
    release("uninstall", &[]);
    let left = control_plane
        .kubectl(&[
            "get",
            "deployments,services,serviceaccounts,configmaps,secrets,networkpolicies,poddisruptionbudgets,roles,rolebindings,clusterroles,clusterrolebindings,servicemonitors,prometheusrules",
            "--all-namespaces",
            "--selector",
            &format!("app.kubernetes.io/instance={RELEASE}"),
            "--output",
            "name",
        ])
        .unwrap();
    assert!(left.trim().is_empty(), "left behind: {left}");
    control_plane
        .kubectl(&[
            "--namespace",
            NAMESPACE,
            "get",
            "secret",
            "edgebeat-site-ca",
        ])
        .unwrap();
    drop(gateway);
}
