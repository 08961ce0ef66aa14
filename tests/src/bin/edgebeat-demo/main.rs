//! `edgebeat-demo`: the stand-in apiserver, a gateway and an agent reading this host's real
//! facts, in one process, over real loopback sockets. The agent starts the way a board
//! should: with nothing but a bootstrap token, it enrolls for its node certificate (a CSR,
//! approved and signed by the gateway) and heartbeats with it over mutual TLS (or signed
//! MQTT). Prints the CSR as `kubectl get csr` would, the node as `kubectl get nodes -o wide`
//! would and every lease renewal, and how to point real kubectl at the stand-in. Intervals
//! are kubelet's defaults unless overridden; `--plain` runs without identities instead.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use edgebeat_agent::{Agent, AgentConfig};
use edgebeat_gateway::GatewayOptions;
use edgebeat_hw::SystemClock;
use edgebeat_tests::harness::{Cluster, Transport};
use http::Method;
use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Runs a local edgebeat demo on this host's real facts.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Stop after this many seconds (0: run until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    duration: u64,
    /// Port of the stand-in apiserver on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Host root to read facts from (a fixture tree, or / for this host).
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// Agent configuration file; its transport is replaced by the demo's gateway.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Transport between agent and gateway: grpc, or mqtt (through a local Mosquitto).
    #[arg(long, default_value = "grpc")]
    transport: String,
    /// Log filter for the components.
    #[arg(long, default_value = "warn")]
    log_level: String,
    /// No enrollment and no node identity: plain gRPC or unsigned MQTT, which the gateway
    /// accepts only with --allow-unidentified-agents (as a lab would run it).
    #[arg(long)]
    plain: bool,
}

/// `kubectl get csr`'s columns for the stand-in's CSRs.
async fn print_csrs(standin: &edgebeat_tests::standin::StandInHandle) -> anyhow::Result<()> {
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

fn node_row(node: &Node) -> String {
    let name = node.metadata.name.clone().unwrap_or_default();
    let status = node.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map_or("Unknown", |c| {
            if c.status == "True" {
                "Ready"
            } else if c.status == "False" {
                "NotReady"
            } else {
                "Unknown"
            }
        });
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter: tracing_subscriber::filter::Targets =
        args.log_level.parse().context("--log-level")?;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer())
        .with(filter)
        .init();

    let transport = match args.transport.as_str() {
        "grpc" => Transport::Grpc,
        "mqtt" => Transport::Mqtt,
        other => anyhow::bail!("--transport {other:?}: use grpc or mqtt"),
    };
    let cancel = CancellationToken::new();
    let mut config = match &args.config {
        Some(path) => AgentConfig::load(path)?,
        None => AgentConfig::default(),
    };
    config.host_root = args.host_root.clone();
    let name = edgebeat_agent::run::node_name(&config, &edgebeat_agent::run::read_facts(&config)?)?
        .to_string();
    let cluster = if args.plain {
        Cluster::start_on_port(transport, GatewayOptions::default(), args.port).await?
    } else {
        Cluster::start_enrolling_on_port(
            transport,
            edgebeat_gateway::enrollment::EnrollmentOptions::default(),
            GatewayOptions::default(),
            args.port,
        )
        .await?
    };
    let standin = cluster.standin.clone();
    let url = standin.url();
    let state = tempfile::tempdir()?;
    // Kubelet's intervals (or the file's), the demo's own gateway.
    if args.plain {
        config.transport = cluster.agent_config(&name, &args.host_root).transport;
    } else {
        // As `edgebeat-gateway token create --nodes <name> --uses 1`, put in the board's
        // bootstrapTokenFile; certDir in a temporary directory.
        let token = cluster
            .bootstrap_token(&[name.as_str()], 1, Duration::from_secs(3600))
            .await?;
        let enrolled =
            cluster.enrolled_agent_config(&name, &args.host_root, &token, state.path())?;
        config.transport = enrolled.transport;
        config.certificates = enrolled.certificates;
        println!(
            "bootstrap token {}.… for node {name:?} (edgebeat-gateway token create --nodes {name} --uses 1), certDir {}",
            token.id,
            state.path().join("pki").display()
        );
    }
    let agent = Agent::new(config, Arc::new(SystemClock))?;

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
    let agent_task = tokio::spawn(agent.run(cancel.clone()));
    let started = Instant::now();

    let stop = cancel.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    if args.duration > 0 {
        let stop = cancel.clone();
        let d = Duration::from_secs(args.duration);
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            stop.cancel();
        });
    }

    let mut last_renew = None;
    let mut last_ready = None;
    let mut renewals = 0u32;
    let mut identified = args.plain;
    while !cancel.is_cancelled() {
        let seen = last_renew;
        let ready_seen = last_ready.clone();
        let name2 = name.clone();
        let changed = tokio::select! {
            () = cancel.cancelled() => break,
            r = standin.wait_until(Duration::from_secs(3600), "a change", move |v| {
                let renew = v.lease("kube-node-lease", &name2).and_then(|l| l.spec?.renew_time).map(|t| t.0);
                let ready = v.node(&name2).and_then(|n| n.status?.conditions?.into_iter().find(|c| c.type_ == "Ready").map(|c| c.status));
                renew != seen || ready != ready_seen
            }) => r,
        };
        if changed.is_err() {
            continue;
        }
        if let Some(node) = standin.node(&name) {
            let certificate = node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("edgebeat.io/node-certificate-sha256"))
                .cloned();
            if !identified && let Some(sha256) = certificate {
                identified = true;
                println!(
                    "[{:>6.1}s] kubectl get csr",
                    started.elapsed().as_secs_f64()
                );
                print_csrs(&standin).await?;
                println!(
                    "[{:>6.1}s] node {name} speaks with its enrolled certificate sha256:{}… (annotation edgebeat.io/node-certificate-sha256)",
                    started.elapsed().as_secs_f64(),
                    &sha256[..sha256.len().min(16)]
                );
            }
            let ready = node.status.clone().and_then(|s| {
                s.conditions?
                    .into_iter()
                    .find(|c| c.type_ == "Ready")
                    .map(|c| c.status)
            });
            if ready != last_ready {
                println!(
                    "[{:>6.1}s] kubectl get nodes -o wide",
                    started.elapsed().as_secs_f64()
                );
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
        if let Some(lease) = standin.lease("kube-node-lease", &name) {
            let spec = lease.spec.clone().unwrap_or_default();
            let renew = spec.renew_time.map(|t| t.0);
            if renew != last_renew {
                renewals += 1;
                println!(
                    "[{:>6.1}s] lease kube-node-lease/{name} renewTime={} holder={} duration={}s resourceVersion={}",
                    started.elapsed().as_secs_f64(),
                    renew
                        .map(|t| jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%S%.6fZ", t)
                            .unwrap_or_default())
                        .unwrap_or_default(),
                    spec.holder_identity.unwrap_or_default(),
                    spec.lease_duration_seconds.unwrap_or_default(),
                    lease.metadata.resource_version.unwrap_or_default(),
                );
                last_renew = renew;
            }
        }
    }
    let _ = agent_task.await;
    drop(cluster);

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
    Ok(())
}
