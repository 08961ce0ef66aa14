//! `--apiserver control-plane` and `--kubeconfig PATH`: a real kube-apiserver.
//!
//! 1. The cluster: the suite's control plane started as the tests start it
//!    ([`ControlPlane::start`], a child of this process that dies with it), or the
//!    kubeconfig's ([`KubeconfigCluster`]).
//! 2. Before anything is made, the demo refuses a cluster where a Node of its name or any
//!    of the objects below exists already: it removes what it made when it ends, and would
//!    remove those too.
//! 3. `deploy/gateway-enrollment`'s RBAC as `kubectl kustomize` renders it (the namespace
//!    `edgebeat-system`, the gateway's ServiceAccount, its ClusterRoles, Roles and their
//!    bindings), applied with kubectl; not its Deployment, Service, PodDisruptionBudget or
//!    NetworkPolicy, whose pod would need the gateway's image in the cluster.
//! 4. The real `edgebeat-gateway` with the Deployment's flags ([`rendered_gateway_args`]) as
//!    its ServiceAccount ([`EnrollingGateway`]): it keeps its site CA in the Secret
//!    `edgebeat-site-ca`, and a bootstrap token for the node (`edgebeat-gateway token
//!    create`) is a Secret beside it. The agent enrolls with that token (a
//!    `certificates.k8s.io/v1` CSR the gateway approves and signs) and heartbeats over
//!    mutual TLS.
//! 5. Real kubectl's views (`get csr`, `get nodes -o wide`) as they change, and every Lease
//!    renewal (read with kube-rs every 500 ms).
//! 6. At the end (`--duration`, Ctrl-C or SIGTERM): the agent and the gateway stop, then
//!    kubectl deletes the Node, its Lease, its CSRs and Events, and the RBAC objects with
//!    the namespace (and its Secrets), and checks that none is left.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use edgebeat_agent::{Agent, AgentConfig};
use edgebeat_hw::SystemClock;
use edgebeat_tests::control_plane::{
    ClusterAdmin, ControlPlane, EnrollingGateway, KubeconfigCluster, kube_client,
    rendered_gateway_args,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::views::{at, lease_line, node_certificate, ready_status, renew_time};
use crate::{Args, Target, node_name, stop_after, stop_on_signals};

/// The kustomization whose RBAC the demo applies and whose gateway it runs.
const KUSTOMIZATION: &str = "deploy/gateway-enrollment";
/// The kinds of its objects the demo applies: RBAC and what it binds.
const RBAC_KINDS: [&str; 6] = [
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];
/// `$(POD_NAME)` of the demo's gateway.
const POD_NAME: &str = "edgebeat-gateway-demo";

/// The cluster the demo reports to.
enum Cluster {
    ControlPlane(ControlPlane),
    Kubeconfig(KubeconfigCluster),
}

impl Cluster {
    fn admin(&self) -> &dyn ClusterAdmin {
        match self {
            Self::ControlPlane(c) => c,
            Self::Kubeconfig(c) => c,
        }
    }
}

/// `deploy/`'s RBAC for the gateway, rendered into a file for `kubectl apply/delete -f`.
struct Rbac {
    file: PathBuf,
}

/// Runs the demo against a real apiserver until `--duration` passes, Ctrl-C or SIGTERM,
/// then removes what it created.
pub async fn run(args: &Args, target: Target, config: AgentConfig) -> anyhow::Result<()> {
    let begun = Instant::now();
    let name = node_name(&config)?;
    let cancel = CancellationToken::new();
    stop_on_signals(&cancel);
    let cluster = connect(target).await?;
    let state = tempfile::tempdir()?;
    let rbac = render_rbac(cluster.admin(), state.path())?;
    preflight(cluster.admin(), &name, &rbac)?;
    let outcome = match apply_rbac(cluster.admin(), &rbac) {
        Ok(()) if !cancel.is_cancelled() => {
            demo(args, &cluster, config, &name, &cancel, state.path(), begun).await
        }
        other => other,
    };
    let cleaned = clean_up(cluster.admin(), &name, &rbac);
    if let Cluster::ControlPlane(control_plane) = cluster {
        let dir = control_plane.dir.clone();
        tokio::task::spawn_blocking(move || drop(control_plane)).await?;
        println!(
            "stopped the control plane (its logs and audit log stay in {})",
            dir.display()
        );
    }
    outcome.and(cleaned)
}

/// Starts the control plane, or checks that the kubeconfig's cluster answers.
async fn connect(target: Target) -> anyhow::Result<Cluster> {
    let begun = Instant::now();
    let cluster = match target {
        Target::ControlPlane => {
            println!(
                "starting the real control plane (etcd, kube-apiserver, kube-controller-manager)…"
            );
            let control_plane = tokio::task::spawn_blocking(|| ControlPlane::start(&[]))
                .await?
                .context("starting the control plane (scripts/demo.sh builds it: scripts/control-plane.sh build)")?;
            Cluster::ControlPlane(control_plane)
        }
        Target::Kubeconfig {
            kubeconfig,
            kubectl,
        } => {
            let kubectl = kubectl.unwrap_or_else(default_kubectl);
            Cluster::Kubeconfig(KubeconfigCluster::new(&kubectl, &kubeconfig)?)
        }
        Target::Standin(_) => bail!("the stand-in is not a real apiserver"),
    };
    let admin = cluster.admin();
    let version: serde_json::Value =
        serde_json::from_str(&kubectl(admin, &["version", "-o", "json"])?)
            .context("kubectl version -o json")?;
    let server = kubectl(
        admin,
        &[
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ],
    )?;
    let kind = match &cluster {
        Cluster::ControlPlane(_) => "the real control plane",
        Cluster::Kubeconfig(_) => "the cluster of your kubeconfig",
    };
    println!(
        "edgebeat demo — {kind}: kube-apiserver {} at {server} (reached in {:.1} s)",
        version["serverVersion"]["gitVersion"]
            .as_str()
            .unwrap_or("?"),
        begun.elapsed().as_secs_f64()
    );
    Ok(cluster)
}

/// kubectl on PATH (yours, for your cluster), else the control plane's when built.
fn default_kubectl() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("kubectl"))
            .find(|k| k.is_file())
    });
    on_path
        .or_else(|| edgebeat_tests::control_plane::built().map(|bin| bin.join("kubectl")))
        .unwrap_or_else(|| PathBuf::from("kubectl"))
}

/// kubectl as the admin, off the runtime's worker (it waits for the process).
fn kubectl(admin: &dyn ClusterAdmin, args: &[&str]) -> anyhow::Result<String> {
    tokio::task::block_in_place(|| admin.kubectl(args))
}

/// The RBAC objects of [`KUSTOMIZATION`] as a `List`, written into `dir`.
fn render_rbac(admin: &dyn ClusterAdmin, dir: &Path) -> anyhow::Result<Rbac> {
    let rendered = kubectl(admin, &["kustomize", KUSTOMIZATION])?;
    let items: Vec<serde_json::Value> =
        serde_saphyr::from_multiple::<serde_json::Value>(&rendered)?
            .into_iter()
            .filter(|o| RBAC_KINDS.iter().any(|k| o["kind"] == *k))
            .collect();
    if items.is_empty() {
        bail!("kubectl kustomize {KUSTOMIZATION} rendered no RBAC");
    }
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    let file = dir.join("rbac.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&list)?)?;
    Ok(Rbac { file })
}

impl Rbac {
    fn path(&self) -> &str {
        self.file.to_str().unwrap_or_default()
    }

    /// Which of its objects exist (`kind/name`, as `kubectl get -o name` says).
    fn existing(&self, admin: &dyn ClusterAdmin) -> anyhow::Result<Vec<String>> {
        let out = kubectl(
            admin,
            &["get", "-f", self.path(), "--ignore-not-found", "-o", "name"],
        )?;
        Ok(out.lines().map(str::to_owned).collect())
    }
}

/// Refuses a cluster where the demo would remove what is not its own.
fn preflight(admin: &dyn ClusterAdmin, name: &str, rbac: &Rbac) -> anyhow::Result<()> {
    let node = kubectl(
        admin,
        &["get", "node", name, "--ignore-not-found", "-o", "name"],
    )?;
    if !node.trim().is_empty() {
        bail!(
            "a Node named {name} is in this cluster already, and the demo deletes its Node when it ends: give the demo's node another name with --node-name NAME"
        );
    }
    let existing = rbac.existing(admin)?;
    if !existing.is_empty() {
        bail!(
            "edgebeat's gateway RBAC is in this cluster already ({}), and the demo removes what it applies when it ends: run the demo against a cluster without it, or remove it first (kubectl delete -k {KUSTOMIZATION})",
            existing.join(", ")
        );
    }
    Ok(())
}

fn apply_rbac(admin: &dyn ClusterAdmin, rbac: &Rbac) -> anyhow::Result<()> {
    println!(
        "applying {KUSTOMIZATION}'s RBAC (kubectl apply --server-side; not its Deployment, Service, PodDisruptionBudget or NetworkPolicy):"
    );
    let out = kubectl(
        admin,
        &[
            "apply",
            "--server-side",
            "--field-manager=edgebeat-demo",
            "-f",
            rbac.path(),
        ],
    )?;
    print_indented(&out);
    Ok(())
}

fn print_indented(out: &str) {
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        println!("  {line}");
    }
}

/// The gateway and the agent, running until `cancel`.
async fn demo(
    args: &Args,
    cluster: &Cluster,
    config: AgentConfig,
    name: &str,
    cancel: &CancellationToken,
    state: &Path,
    begun: Instant,
) -> anyhow::Result<()> {
    let admin = cluster.admin();
    let gateway_args =
        tokio::task::block_in_place(|| rendered_gateway_args(admin, KUSTOMIZATION, &[], POD_NAME))?;
    let mut gateway = EnrollingGateway::try_with_args(gateway_args).await?;
    let token = tokio::task::block_in_place(|| gateway.try_token(name, 1))?;
    let config = gateway.enrolled_agent_config(config, &token, &state.join("agent"))?;
    let grpc = match &config.transport {
        Some(edgebeat_agent::config::TransportConfig::Grpc(grpc)) => grpc.endpoint.clone(),
        _ => String::new(),
    };
    let agent = Agent::new(config, Arc::new(SystemClock))?;
    print_banner(args, admin, name, &grpc, &token, gateway.process.pid());
    println!(
        "up in {:.1} s; heartbeats start now{}",
        begun.elapsed().as_secs_f64(),
        if args.duration > 0 {
            format!(" for {} s", args.duration)
        } else {
            " until Ctrl-C".to_owned()
        }
    );
    println!();
    let agent_cancel = cancel.child_token();
    let agent_task = tokio::spawn(agent.run(agent_cancel.clone()));
    let started = Instant::now();
    stop_after(cancel, args.duration);
    let client = kube_client(admin.admin_kubeconfig()).await?;
    let watched = watch(admin, client, name, cancel, started).await;
    agent_cancel.cancel();
    let _ = agent_task.await;
    let _ = gateway.process.terminate().await;
    println!();
    println!(
        "stopped the agent and the gateway after {:.1} s; {} Lease renewals seen",
        started.elapsed().as_secs_f64(),
        watched.as_ref().copied().unwrap_or_default()
    );
    watched.map(|_| ())
}

fn print_banner(
    args: &Args,
    admin: &dyn ClusterAdmin,
    name: &str,
    grpc: &str,
    token: &str,
    gateway_pid: Option<u32>,
) {
    let id = token.split('.').next().unwrap_or_default();
    println!(
        "gateway: edgebeat-gateway (pid {}) with {KUSTOMIZATION}'s flags, as the ServiceAccount edgebeat-system/edgebeat-gateway",
        gateway_pid.unwrap_or_default()
    );
    println!(
        "bootstrap token {id}.… for node {name:?} (edgebeat-gateway token create --nodes {name} --uses 1)"
    );
    println!(
        "agent → gRPC ({grpc}, mutual TLS once enrolled) → gateway; node {name:?} reads host facts under {}",
        args.host_root.display()
    );
    let kubeconfig = admin.admin_kubeconfig().display();
    println!("point kubectl at it:");
    println!("  kubectl --kubeconfig {kubeconfig} get nodes -o wide");
    println!("  kubectl --kubeconfig {kubeconfig} get lease -n kube-node-lease {name}");
    println!("  kubectl --kubeconfig {kubeconfig} get csr");
}

/// Prints real kubectl's views as the node changes and each renewal, until `cancel`: the
/// renewals seen.
async fn watch(
    admin: &dyn ClusterAdmin,
    client: kube::Client,
    name: &str,
    cancel: &CancellationToken,
    started: Instant,
) -> anyhow::Result<u32> {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let (mut last_renew, mut last_ready) = (None, None);
    let (mut identified, mut renewals, mut failing) = (false, 0u32, false);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        let (node, lease) = match tokio::try_join!(nodes.get_opt(name), leases.get_opt(name)) {
            Ok(found) => {
                failing = false;
                found
            }
            Err(e) => {
                if !failing {
                    eprintln!(
                        "{} reading the Node and its Lease: {e} (trying again)",
                        at(started)
                    );
                }
                failing = true;
                continue;
            }
        };
        if let Some(node) = node {
            if !identified && let Some(sha256) = node_certificate(&node) {
                identified = true;
                print_view(admin, started, &["get", "csr"]);
                println!(
                    "{} node {name} speaks with its enrolled certificate sha256:{}… (annotation edgebeat.io/node-certificate-sha256)",
                    at(started),
                    &sha256[..sha256.len().min(16)]
                );
            }
            let ready = ready_status(&node);
            if ready != last_ready {
                print_view(admin, started, &["get", "nodes", "-o", "wide"]);
                last_ready = ready;
            }
        }
        if let Some(lease) = lease {
            let renew = renew_time(&lease);
            if renew != last_renew {
                renewals += 1;
                println!("{}", lease_line(started, name, &lease));
                last_renew = renew;
            }
        }
    }
    Ok(renewals)
}

/// `kubectl <args>` and what it prints.
fn print_view(admin: &dyn ClusterAdmin, started: Instant, args: &[&str]) {
    println!("{} kubectl {}", at(started), args.join(" "));
    match kubectl(admin, args) {
        Ok(out) => print!("{out}"),
        Err(e) => println!("  {e:#}"),
    }
}

/// The names of the CSRs the gateway made for `name` (annotation `edgebeat.io/node`).
fn csrs_of(admin: &dyn ClusterAdmin, name: &str) -> anyhow::Result<Vec<String>> {
    let list: serde_json::Value =
        serde_json::from_str(&kubectl(admin, &["get", "csr", "-o", "json"])?)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|csr| csr["metadata"]["annotations"]["edgebeat.io/node"] == name)
        .filter_map(|csr| csr["metadata"]["name"].as_str().map(str::to_owned))
        .collect())
}

/// `--field-selector` of the Events about the Node `name` (the gateway's, the node
/// lifecycle controller's), all in `default`.
fn events_of(name: &str) -> String {
    format!("involvedObject.kind=Node,involvedObject.name={name}")
}

/// Deletes what the demo made, saying what, then checks that none of it is left.
fn clean_up(admin: &dyn ClusterAdmin, name: &str, rbac: &Rbac) -> anyhow::Result<()> {
    println!();
    println!("removing what the demo created:");
    let mut failed = Vec::new();
    // What could not be deleted, if anything.
    let delete = |what: &str, args: &[&str]| match kubectl(admin, args) {
        Ok(out) => {
            print_indented(&out);
            None
        }
        Err(e) => Some(format!("{what}: {e:#}")),
    };
    failed.extend(delete(
        "the Node",
        &["delete", "node", name, "--ignore-not-found"],
    ));
    match kubectl(
        admin,
        &[
            "-n",
            "kube-node-lease",
            "delete",
            "lease",
            name,
            "--ignore-not-found",
        ],
    ) {
        Ok(out) if out.trim().is_empty() => println!(
            "  lease \"{name}\" in kube-node-lease went with its Node (its ownerReference)"
        ),
        Ok(out) => print_indented(&out),
        Err(e) => failed.push(format!("its Lease: {e:#}")),
    }
    match csrs_of(admin, name) {
        Ok(csrs) if !csrs.is_empty() => {
            let mut args = vec!["delete", "csr", "--ignore-not-found"];
            args.extend(csrs.iter().map(String::as_str));
            failed.extend(delete("its CSRs", &args));
        }
        Ok(_) => {}
        Err(e) => failed.push(format!("listing its CSRs: {e:#}")),
    }
    if let Ok(secrets) = kubectl(
        admin,
        &["-n", "edgebeat-system", "get", "secrets", "-o", "name"],
    ) && !secrets.trim().is_empty()
    {
        let secrets: Vec<&str> = secrets.lines().collect();
        println!(
            "  {} go with namespace edgebeat-system:",
            secrets.join(", ")
        );
    }
    failed.extend(delete(
        "deploy/'s RBAC",
        &[
            "delete",
            "-f",
            rbac.path(),
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ],
    ));
    // The node lifecycle controller records RemovingNode once it sees the Node gone (within
    // its --node-monitor-period, 5 s): the last Event about it, deleted with the others.
    let selector = events_of(name);
    wait_for_event(admin, &format!("{selector},reason=RemovingNode"));
    let events = ["-n", "default", "--field-selector", selector.as_str()];
    failed.extend(delete(
        "its Events",
        &[&events[..], &["delete", "events"]].concat(),
    ));
    if !failed.is_empty() {
        bail!("could not remove everything:\n{}", failed.join("\n"));
    }
    check_nothing_left(admin, name, rbac)
}

/// Waits up to 15 s for an Event in `default` that `selector` matches; a cluster without a
/// node lifecycle controller never records one.
fn wait_for_event(admin: &dyn ClusterAdmin, selector: &str) {
    for _ in 0..15 {
        let found = kubectl(
            admin,
            &[
                "-n",
                "default",
                "get",
                "events",
                "--field-selector",
                selector,
                "-o",
                "name",
            ],
        );
        if found.is_ok_and(|out| !out.trim().is_empty()) {
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Asks the apiserver for each kind of object the demo made.
fn check_nothing_left(admin: &dyn ClusterAdmin, name: &str, rbac: &Rbac) -> anyhow::Result<()> {
    let mut left = rbac.existing(admin)?;
    for args in [
        vec!["get", "node", name, "--ignore-not-found", "-o", "name"],
        vec![
            "-n",
            "kube-node-lease",
            "get",
            "lease",
            name,
            "--ignore-not-found",
            "-o",
            "name",
        ],
    ] {
        left.extend(kubectl(admin, &args)?.lines().map(str::to_owned));
    }
    left.extend(
        csrs_of(admin, name)?
            .into_iter()
            .map(|c| format!("csr/{c}")),
    );
    let selector = events_of(name);
    let events = kubectl(
        admin,
        &[
            "-n",
            "default",
            "get",
            "events",
            "--field-selector",
            &selector,
            "-o",
            "name",
        ],
    )?;
    left.extend(events.lines().map(str::to_owned));
    if !left.is_empty() {
        bail!("left in the cluster: {}", left.join(", "));
    }
    println!(
        "nothing of the demo's is left in the cluster (asked kubectl for the Node, its Lease, CSRs and Events, and every RBAC object with namespace edgebeat-system)"
    );
    Ok(())
}
