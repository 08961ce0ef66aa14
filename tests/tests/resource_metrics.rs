//! kubelet's resource metrics for edge nodes (gateway/src/resource_metrics.rs) against the
//! real control plane: the real `edgebeat-gateway` binary with `deploy/`'s RBAC serves
//! `/metrics/resource` for the nodes it holds, names itself in their status (an address of
//! type `EdgebeatGateway`, the kubelet endpoint's port, metrics-server's path annotation),
//! and the real kube-apiserver's node proxy reaches it there, authenticating with its
//! kubelet client certificate; callers the apiserver would not let read the node's metrics
//! are refused; and the real metrics-server, registered as the APIService
//! `v1beta1.metrics.k8s.io`, scrapes it there, so that the real kubectl's `kubectl top node`
//! shows the edge node's CPU and memory.
//!
//! Needs the built control plane and metrics-server (`scripts/metrics-server.sh build`) and
//! root: the apiserver's node proxy refuses loopback
//! addresses (`pkg/registry/core/node/strategy.go`, `isProxyableHostname`), so the gateway
//! listens on an address of a veth pair of the test's own (`ip link`). `scripts/test.sh`
//! runs it where both are there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use edgebeat_hw::{HostRoot, read_resource_usage};
use edgebeat_tests::control_plane::{ControlPlane, DeployedGateway, eventually};
use edgebeat_tests::harness::start_agent;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

/// The apiserver's address types with the gateway's first, as README "kubectl top node"
/// tells operators to set it.
const PREFERRED: &str = "--kubelet-preferred-address-types=EdgebeatGateway,Hostname,InternalDNS,InternalIP,ExternalDNS,ExternalIP";

/// A veth pair of this test process whose host end holds `address` (a /30 of
/// 10.213.0.0/16 picked from the PID): an address that is not loopback, reachable only on
/// this host. Removed when dropped.
struct VethAddress {
    name: String,
    address: std::net::Ipv4Addr,
}

impl VethAddress {
    fn create() -> Self {
        let id = std::process::id();
        let name = format!("ebrm{}", id % 100_000);
        let address =
            std::net::Ipv4Addr::new(10, 213, ((id >> 6) % 256) as u8, ((id % 64) * 4 + 1) as u8);
        let ip = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().unwrap();
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let _ = Command::new("ip").args(["link", "del", &name]).output();
        ip(&[
            "link",
            "add",
            &name,
            "type",
            "veth",
            "peer",
            "name",
            &format!("{name}p"),
        ]);
        ip(&["addr", "add", &format!("{address}/30"), "dev", &name]);
        ip(&["link", "set", &name, "up"]);
        Self { name, address }
    }
}

impl Drop for VethAddress {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.name])
            .output();
    }
}

/// A serving certificate for `address` from the cluster CA (kube-apiserver checks kubelet
/// serving certificates against it, `--kubelet-certificate-authority`): `(cert, key)` paths.
fn serving_certificate(
    control_plane: &ControlPlane,
    address: std::net::Ipv4Addr,
    dir: &Path,
) -> (PathBuf, PathBuf) {
    let (cert, key, csr, ext) = (
        dir.join("rm.crt"),
        dir.join("rm.key"),
        dir.join("rm.csr"),
        dir.join("rm.ext"),
    );
    std::fs::write(
        &ext,
        format!(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:{address}\n"
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-subj",
        "/CN=edgebeat-gateway",
        "-keyout",
        &path(&key),
        "-out",
        &path(&csr),
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        &path(&csr),
        "-CA",
        &path(&control_plane.ca),
        "-CAkey",
        &path(&control_plane.ca.with_extension("key")),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &path(&ext),
        "-out",
        &path(&cert),
    ]);
    (cert, key)
}

/// metrics-server of the pinned release (`scripts/metrics-server.sh build`) serving on
/// `address` and registered as the APIService `v1beta1.metrics.k8s.io` of `control_plane`,
/// as its own manifests do (a Service `kube-system/metrics-server` whose EndpointSlice names
/// it: kube-apiserver routes to endpoints with `--enable-aggregator-routing`, and refuses
/// loopback ones). Its flags are `deploy/metrics-server`'s: the address type EdgebeatGateway
/// first, the node's kubelet endpoint port; resolution 15 s (its manifest's). It authenticates as
/// the cluster admin here (a client certificate), kubelets' way of seeing a scraper.
/// Killed when dropped.
struct MetricsServer {
    _child: tokio::process::Child,
}

impl MetricsServer {
    fn start(control_plane: &ControlPlane, address: std::net::Ipv4Addr, dir: &Path) -> Self {
        let out = Command::new("scripts/metrics-server.sh")
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .arg("bin")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "metrics-server not built: scripts/metrics-server.sh build"
        );
        let binary = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        let port = std::net::TcpListener::bind((address, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let admin = control_plane.admin_kubeconfig.display().to_string();
        let log = std::fs::File::create(dir.join("metrics-server.log")).unwrap();
        let child = tokio::process::Command::new(binary)
            .args([
                format!("--kubeconfig={admin}"),
                format!("--authentication-kubeconfig={admin}"),
                format!("--authorization-kubeconfig={admin}"),
                format!("--bind-address={address}"),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", dir.join("metrics-server").display()),
                "--kubelet-preferred-address-types=EdgebeatGateway,InternalIP,ExternalIP,Hostname"
                    .to_owned(),
                "--kubelet-use-node-status-port".to_owned(),
                "--metric-resolution=15s".to_owned(),
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let objects = format!(
            "apiVersion: v1
kind: Service
metadata: {{name: metrics-server, namespace: kube-system}}
spec:
  ports: [{{name: https, port: 443, targetPort: {port}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: metrics-server-1
  namespace: kube-system
  labels: {{kubernetes.io/service-name: metrics-server}}
addressType: IPv4
endpoints: [{{addresses: [\"{address}\"], conditions: {{ready: true}}}}]
ports: [{{name: https, port: {port}, protocol: TCP}}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: v1beta1.metrics.k8s.io}}
spec:
  service: {{name: metrics-server, namespace: kube-system}}
  group: metrics.k8s.io
  version: v1beta1
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
"
        );
        let file = dir.join("metrics-server.yaml");
        std::fs::write(&file, objects).unwrap();
        control_plane
            .kubectl(&["apply", "-f", file.to_str().unwrap()])
            .unwrap();
        Self { _child: child }
    }
}

/// `(node_cpu_usage_seconds_total, node_memory_working_set_bytes)` of a `/metrics/resource`
/// body, with their timestamps (ms).
fn node_series(body: &str) -> Option<((f64, i64), (f64, i64))> {
    let series = |name: &str| {
        let line = body.lines().find(|l| l.starts_with(&format!("{name} ")))?;
        let mut fields = line.split_whitespace().skip(1);
        Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
    };
    Some((
        series("node_cpu_usage_seconds_total")?,
        series("node_memory_working_set_bytes")?,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the built control plane and root for a veth address (scripts/test.sh)"]
async fn the_apiserver_node_proxy_reads_an_edge_nodes_resource_metrics_from_its_replica() {
    let veth = VethAddress::create();
    let control_plane = ControlPlane::start(&[("EDGEBEAT_APISERVER_FLAGS", PREFERRED)]).unwrap();
    // kubeadm's binding for kube-apiserver's kubelet client certificate (its group), which
    // kubelets authorize like any caller.
    control_plane
        .kubectl(&[
            "create",
            "clusterrolebinding",
            "kubeadm:cluster-admins",
            "--clusterrole=cluster-admin",
            "--group=kubeadm:cluster-admins",
        ])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = serving_certificate(&control_plane, veth.address, dir.path());
    let flags = [
        format!("--resource-metrics-listen={}:0", veth.address),
        format!("--resource-metrics-address={}", veth.address),
        format!("--resource-metrics-tls-cert={}", cert.display()),
        format!("--resource-metrics-tls-key={}", key.display()),
        format!(
            "--resource-metrics-client-ca={}",
            control_plane.ca.display()
        ),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut gateway = DeployedGateway::start(&control_plane, &flags).await;
    control_plane
        .kubectl(&[
            "apply",
            "--server-side",
            "-k",
            "deploy/gateway/resource-metrics",
        ])
        .unwrap();
    let served = gateway
        .process
        .address("serving resource metrics")
        .await
        .unwrap();
    assert_eq!(served.ip(), std::net::IpAddr::V4(veth.address));

    // An agent on this host's real facts, so its figures are the host's.
    let node = "resource-metrics-1";
    let mut config = gateway.agent_config(node);
    config.host_root = PathBuf::from("/");
    let agent = start_agent(config, Arc::new(edgebeat_hw::SystemClock)).unwrap();

    let nodes: Api<Node> = Api::all(control_plane.admin_client().await.unwrap());
    eventually(
        "the node naming its replica: address, port and path annotation",
        Duration::from_secs(60),
        || async {
            let Ok(Some(n)) = nodes.get_opt(node).await else {
                return false;
            };
            let status = n.status.unwrap_or_default();
            let named = status
                .addresses
                .unwrap_or_default()
                .iter()
                .any(|a| a.type_ == "EdgebeatGateway" && a.address == veth.address.to_string());
            let port = status
                .daemon_endpoints
                .and_then(|d| d.kubelet_endpoint)
                .map(|e| e.port);
            let path = n
                .metadata
                .annotations
                .unwrap_or_default()
                .get("metrics.k8s.io/resource-metrics-path")
                .cloned();
            named
                && port == Some(i32::from(served.port()))
                && path.as_deref() == Some("/nodes/resource-metrics-1/metrics/resource")
        },
    )
    .await;

    // Through the real apiserver's node proxy, as `kubectl get --raw` reads it.
    let raw = format!("/api/v1/nodes/{node}/proxy/metrics/resource");
    let last = std::sync::Mutex::new(String::new());
    eventually(
        "the node's resource metrics through the node proxy",
        Duration::from_secs(60),
        || {
            let out = control_plane.kubectl(&["get", "--raw", &raw]);
            let ok = match out {
                Ok(text) => {
                    let ok = node_series(&text).is_some();
                    *last.lock().unwrap() = text;
                    ok
                }
                Err(e) => {
                    *last.lock().unwrap() = e.to_string();
                    false
                }
            };
            async move { ok }
        },
    )
    .await;
    let body = last.into_inner().unwrap();
    let ((cpu_seconds, cpu_at), (memory_bytes, memory_at)) = node_series(&body).unwrap();
    assert_eq!(cpu_at, memory_at, "one sample: {body}");
    let now = read_resource_usage(&HostRoot::new("/"));
    let host_cpu_seconds = now.cpu_usage_ms.unwrap() as f64 / 1000.0;
    let cpus = std::thread::available_parallelism().unwrap().get() as f64;
    assert!(
        cpu_seconds > 0.0
            && cpu_seconds <= host_cpu_seconds
            && host_cpu_seconds - cpu_seconds < 120.0 * cpus,
        "the host's CPU time, sampled within the last two minutes: {cpu_seconds} s served, {host_cpu_seconds} s now"
    );
    assert!(
        memory_bytes > 0.0,
        "the host's working set: {memory_bytes} B served"
    );
    assert!(body.contains("resource_scrape_error 0\n"), "{body}");

    // Straight to the replica, as metrics-server scrapes it: a token the apiserver does not
    // know is 401, one without `get nodes/metrics` is 403, both counted.
    control_plane
        .kubectl(&["create", "serviceaccount", "nobody", "-n", "default"])
        .unwrap();
    let token = control_plane
        .kubectl(&["create", "token", "nobody", "-n", "default"])
        .unwrap();
    let direct = |user: &str| {
        let kubeconfig = dir.path().join("direct.kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: replica\n  cluster:\n    server: https://{served}\n    certificate-authority: {}\nusers:\n- name: caller\n  user: {user}\ncontexts:\n- name: caller\n  context: {{cluster: replica, user: caller}}\ncurrent-context: caller\n",
                control_plane.ca.display()
            ),
        )
        .unwrap();
        control_plane.kubectl_as(
            &kubeconfig,
            &["get", "--raw", "/nodes/resource-metrics-1/metrics/resource"],
        )
    };
    // (kubectl asks for a password on a terminal when it has no credentials at all; the
    // unit tests take the no-credentials case.)
    let unknown = direct("{token: not-a-token-the-apiserver-issued}")
        .unwrap_err()
        .to_string();
    // kubectl's words for a 401.
    assert!(unknown.contains("provide credentials"), "{unknown}");
    let forbidden = direct(&format!("{{token: {}}}", token.trim()))
        .unwrap_err()
        .to_string();
    assert!(forbidden.contains("Forbidden"), "{forbidden}");
    let metrics = edgebeat_tests::harness::http_get(gateway.health, "/metrics")
        .await
        .unwrap()
        .1;
    for code in ["200", "401", "403"] {
        let line = format!("edgebeat_gateway_resource_metrics_requests_total{{code=\"{code}\"}}");
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with(&line) && !l.ends_with(" 0")),
            "{line} counted: {metrics}"
        );
    }

    // `kubectl top node` through the real metrics-server: the node's CPU and memory, within
    // two of its resolutions once it scrapes.
    let _metrics_server = MetricsServer::start(&control_plane, veth.address, dir.path());
    let registered = tokio::time::Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let top = loop {
        let out = control_plane.kubectl(&["top", "node", node, "--no-headers"]);
        match out {
            Ok(text) if text.starts_with(node) => break text,
            other => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "kubectl top node never showed the edge node: {other:?}\nmetrics-server's log:\n{}",
                    std::fs::read_to_string(dir.path().join("metrics-server.log"))
                        .unwrap_or_default()
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    eprintln!("kubectl top node after {:?}: {top}", registered.elapsed());
    // NAME CPU(cores) CPU(%) MEMORY(bytes) MEMORY(%)
    let fields: Vec<&str> = top.split_whitespace().collect();
    assert_eq!(fields.len(), 5, "{top}");
    assert!(
        fields[1].ends_with('m') && fields[3].ends_with("Mi"),
        "{top}"
    );

    agent.stop().await.unwrap();
    drop(gateway);
    drop(veth);
}
