//! `--apiserver standin` (the default): the stand-in apiserver (a test double, not a
//! kube-apiserver), the gateway in-process, the agent enrolling with a bootstrap token (or
//! `--plain`, without identities) over gRPC or MQTT. The views are the stand-in's own
//! renderings of `kubectl get csr` and `kubectl get nodes -o wide`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use edgebeat_agent::{Agent, AgentConfig};
use edgebeat_gateway::message_path::GatewayOptions;
use edgebeat_hw::SystemClock;
use edgebeat_tests::harness::{Cluster, Transport};
use edgebeat_tests::standin::StandInHandle;
use http::Method;
use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::views::{at, lease_line, node_certificate, ready_status, renew_time};
use crate::{Args, stop_after, stop_on_signals};

/// Runs the demo against the stand-in until `--duration` passes or Ctrl-C.
pub async fn run(args: &Args, transport: Transport, config: AgentConfig) -> anyhow::Result<()> {
    let name = crate::node_name(&config)?;
    let cluster = start_cluster(args, transport).await?;
    let state = tempfile::tempdir()?;
    let config = agent_config(args, &cluster, config, &name, state.path()).await?;
    let agent = Agent::new(config, Arc::new(SystemClock))?;
    print_banner(args, &cluster, &name);

    let cancel = CancellationToken::new();
    let agent_task = tokio::spawn(agent.run(cancel.clone()));
    let started = Instant::now();
    stop_on_signals(&cancel);
    stop_after(&cancel, args.duration);
    let standin = cluster.standin.clone();
    let renewals = watch(&standin, &name, &cancel, started, args.plain).await?;
    let _ = agent_task.await;
    drop(cluster);
    print_requests(&standin, &name, started, renewals);
    Ok(())
}

async fn start_cluster(args: &Args, transport: Transport) -> anyhow::Result<Cluster> {
    let port = args.port.unwrap_or(0);
    if args.plain {
        Cluster::start_on_port(transport, GatewayOptions::default(), port).await
    } else {
        Cluster::start_enrolling_on_port(
            transport,
            edgebeat_gateway::enrollment::EnrollmentOptions::default(),
            GatewayOptions::default(),
            port,
        )
        .await
    }
}

/// `config` (kubelet's intervals, or the file's) reaching the demo's own gateway: plain, or
/// with nothing but a bootstrap token and a certDir in `state`.
async fn agent_config(
    args: &Args,
    cluster: &Cluster,
    mut config: AgentConfig,
    name: &str,
    state: &Path,
) -> anyhow::Result<AgentConfig> {
    if args.plain {
        config.transport = cluster.agent_config(name, &args.host_root).transport;
        return Ok(config);
    }
    // As `edgebeat-gateway token create --nodes <name> --uses 1`, put in the board's
    // bootstrapTokenFile; certDir in a temporary directory.
    let token = cluster
        .bootstrap_token(&[name], 1, Duration::from_secs(3600))
        .await?;
    let enrolled = cluster.enrolled_agent_config(name, &args.host_root, &token, state)?;
    config.transport = enrolled.transport;
    config.certificates = enrolled.certificates;
    println!(
        "bootstrap token {}.… for node {name:?} (edgebeat-gateway token create --nodes {name} --uses 1), certDir {}",
        token.id,
        state.join("pki").display()
    );
    Ok(config)
}

fn print_banner(args: &Args, cluster: &Cluster, name: &str) {
    let url = cluster.standin.url();
    println!("edgebeat demo — stand-in apiserver (a test double, not a kube-apiserver) at {url}");
    match &cluster.broker {
        Some(b) => println!(
            "agent → MQTT (Mosquitto at {}:{}) → gateway; node {name:?} reads host facts under {}",
            b.host(),
            b.port(),
            args.host_root.display()
        ),
        None => println!(
            "agent → gRPC ({}) → gateway; node {name:?} reads host facts under {}",
            cluster.grpc_url,
            args.host_root.display()
        ),
    }
    println!("point real kubectl at it:");
    println!("  kubectl --server {url} get nodes -o wide");
    println!("  kubectl --server {url} get lease -n kube-node-lease");
    if !args.plain {
        println!("  kubectl --server {url} get csr");
    }
    println!();
}

/// Prints the views as the node and its Lease change, until `cancel`: the renewals seen.
async fn watch(
    standin: &StandInHandle,
    name: &str,
    cancel: &CancellationToken,
    started: Instant,
    plain: bool,
) -> anyhow::Result<u32> {
    let mut last_renew = None;
    let mut last_ready = None;
    let mut renewals = 0u32;
    let mut identified = plain;
    while !cancel.is_cancelled() {
        let (seen, ready_seen, watched) = (last_renew, last_ready.clone(), name.to_owned());
        let changed = tokio::select! {
            () = cancel.cancelled() => break,
            r = standin.wait_until(Duration::from_secs(3600), "a change", move |v| {
                let renew = v.lease("kube-node-lease", &watched).as_ref().and_then(renew_time);
                let ready = v.node(&watched).as_ref().and_then(ready_status);
                renew != seen || ready != ready_seen
            }) => r,
        };
        if changed.is_err() {
            continue;
        }
        if let Some(node) = standin.node(name) {
            if !identified && let Some(sha256) = node_certificate(&node) {
                identified = true;
                println!("{} kubectl get csr", at(started));
                print_csrs(standin).await?;
                println!(
                    "{} node {name} speaks with its enrolled certificate sha256:{}… (annotation edgebeat.io/node-certificate-sha256)",
                    at(started),
                    &sha256[..sha256.len().min(16)]
                );
            }
            let ready = ready_status(&node);
            if ready != last_ready {
                println!("{} kubectl get nodes -o wide", at(started));
                println!(
                    "{:<16} {:<8} {:<8} {:<5} {:<26} {:<15} {:<12} {:<32} {:<20} CONTAINER-RUNTIME",
                    "NAME",
                    "STATUS",
                    "ROLES",
                    "AGE",
                    "VERSION",
                    "INTERNAL-IP",
                    "EXTERNAL-IP",
                    "OS-IMAGE",
                    "KERNEL-VERSION"
                );
                println!("{}", node_row(&node));
                last_ready = ready;
            }
        }
        if let Some(lease) = standin.lease("kube-node-lease", name) {
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

/// The apiserver requests per minute for the node, as the stand-in recorded them.
fn print_requests(standin: &StandInHandle, name: &str, started: Instant, renewals: u32) {
    let requests = standin.requests();
    let lease_path =
        format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}");
    let count = |m: Method, p: &str| {
        requests
            .iter()
            .filter(|r| r.method == m && r.path == p)
            .count()
    };
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    let status_path = format!("/api/v1/nodes/{name}/status");
    let smp = requests
        .iter()
        .filter(|r| {
            r.path == status_path
                && r.content_type.as_deref() == Some("application/strategic-merge-patch+json")
        })
        .count();
    println!();
    println!(
        "apiserver requests in {:.1} min for node {name}: lease PUT {} ({:.1}/min), lease GET {}, lease POST {}, status PATCH {} ({} strategic-merge), node POST {}; {renewals} renewals seen",
        minutes,
        count(Method::PUT, &lease_path),
        count(Method::PUT, &lease_path) as f64 / minutes.max(1e-9),
        count(Method::GET, &lease_path),
        count(
            Method::POST,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        ),
        count(Method::PATCH, &status_path),
        smp,
        count(Method::POST, "/api/v1/nodes")
    );
}

/// `kubectl get csr`'s columns for the stand-in's CSRs.
async fn print_csrs(standin: &StandInHandle) -> anyhow::Result<()> {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    let api: kube::Api<CertificateSigningRequest> = kube::Api::all(standin.kube_client()?);
    println!(
        "{:<42} {:<5} {:<24} {:<18} {:<18} CONDITION",
        "NAME", "AGE", "SIGNERNAME", "REQUESTOR", "REQUESTEDDURATION"
    );
    for csr in api.list(&Default::default()).await?.items {
        let age = csr
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| format!("{}s", jiff::Timestamp::now().duration_since(t.0).as_secs()))
            .unwrap_or_default();
        let status = csr.status.clone().unwrap_or_default();
        let mut condition: Vec<String> = status
            .conditions
            .iter()
            .flatten()
            .filter(|c| c.status == "True")
            .map(|c| c.type_.clone())
            .collect();
        if condition.is_empty() {
            condition.push("Pending".into());
        }
        if status.certificate.is_some_and(|c| !c.0.is_empty()) {
            condition.push("Issued".into());
        }
        let duration = csr
            .spec
            .expiration_seconds
            .map_or("<none>".into(), |s| format!("{}d", s / 86_400));
        println!(
            "{:<42} {:<5} {:<24} {:<18} {:<18} {}",
            csr.metadata.name.unwrap_or_default(),
            age,
            csr.spec.signer_name,
            csr.spec.username.unwrap_or_default(),
            duration,
            condition.join(",")
        );
    }
    Ok(())
}

/// `kubectl get nodes -o wide`'s row for `node`, as the stand-in renders it.
fn node_row(node: &Node) -> String {
    let name = node.metadata.name.clone().unwrap_or_default();
    let status = node.status.clone().unwrap_or_default();
    let ready = match ready_status(node).as_deref() {
        Some("True") => "Ready",
        Some("False") => "NotReady",
        _ => "Unknown",
    };
    let age = node
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| format!("{}s", jiff::Timestamp::now().duration_since(t.0).as_secs()))
        .unwrap_or_default();
    let info = status.node_info.clone().unwrap_or_default();
    let address = |t: &str| {
        status
            .addresses
            .iter()
            .flatten()
            .find(|a| a.type_ == t)
            .map_or("<none>".to_owned(), |a| a.address.clone())
    };
    let runtime = if info.container_runtime_version.is_empty() {
        "<none>".to_owned()
    } else {
        info.container_runtime_version.clone()
    };
    format!(
        "{:<16} {:<8} {:<8} {:<5} {:<26} {:<15} {:<12} {:<32} {:<20} {}",
        name,
        ready,
        "<none>",
        age,
        info.kubelet_version,
        address("InternalIP"),
        address("ExternalIP"),
        info.os_image,
        info.kernel_version,
        runtime
    )
}
