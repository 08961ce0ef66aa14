//! `edgebeat-demo`: a gateway and an agent reading this host's real facts, reporting the host
//! as a Node to one of three apiservers:
//!
//! - `--apiserver standin` (the default, up in seconds): the stand-in apiserver (a test
//!   double, not a kube-apiserver), gateway and agent in one process over real loopback
//!   sockets ([`standin`]).
//! - `--apiserver control-plane`: the suite's real kube-apiserver, etcd and
//!   kube-controller-manager (`scripts/control-plane.sh build`, cached), started for the
//!   demo and stopped after it ([`real`]).
//! - `--kubeconfig PATH`: a cluster of your own (kind, k3s), as its admin ([`real`]).
//!
//! Against a real apiserver the demo applies `deploy/`'s RBAC for the gateway with
//! enrollment, runs the real `edgebeat-gateway` binary with `deploy/gateway-enrollment`'s
//! flags as its ServiceAccount, prints real kubectl's views, and removes what it created
//! when it ends. Everywhere the agent starts the way a board should: with nothing but a
//! bootstrap token, it enrolls for its node certificate (a CSR, approved and signed by the
//! gateway) and heartbeats with it over mutual TLS (or signed MQTT, stand-in only). Each
//! form prints the CSR as `kubectl get csr` shows it, the node as `kubectl get nodes -o
//! wide` shows it and every Lease renewal. Intervals are kubelet's defaults unless a
//! `--config` file says otherwise.

mod real;
mod standin;
mod views;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, Parser, ValueEnum};
use edgebeat_agent::AgentConfig;
use edgebeat_tests::harness::Transport;
use tokio_util::sync::CancellationToken;

/// Runs a local edgebeat demo on this host's real facts.
#[derive(Parser, Debug)]
#[command(name = "edgebeat-demo", about)]
pub struct Args {
    /// The apiserver to report to: the stand-in (a test double, up in seconds), or the
    /// suite's real control plane (kube-apiserver, etcd, kube-controller-manager, built
    /// once by scripts/control-plane.sh). For a cluster of your own, give --kubeconfig
    /// instead.
    #[arg(long, value_enum)]
    apiserver: Option<Apiserver>,
    /// A cluster of your own (kind, k3s...) by an admin's kubeconfig (its current
    /// context): deploy/'s RBAC is applied, and everything the demo created is removed
    /// when it ends.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The kubectl for --kubeconfig (default: the control plane's, when built, else
    /// kubectl on PATH).
    #[arg(long, value_name = "PATH")]
    kubectl: Option<PathBuf>,
    /// Stop after this many seconds of heartbeats (0: run until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    duration: u64,
    /// Port of the stand-in apiserver on 127.0.0.1 (default: any free port).
    #[arg(long)]
    port: Option<u16>,
    /// The Node's name (default: the config file's nodeName, else the hostname).
    #[arg(long)]
    node_name: Option<String>,
    /// Host root to read facts from (a fixture tree, or / for this host).
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// Agent configuration file; its transport is replaced by the demo's gateway.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Transport between agent and gateway: grpc, or mqtt (through a local Mosquitto;
    /// stand-in only).
    #[arg(long, default_value = "grpc")]
    transport: String,
    /// Log filter for the components.
    #[arg(long, default_value = "warn")]
    log_level: String,
    /// No enrollment and no node identity: plain gRPC or unsigned MQTT, which the gateway
    /// accepts only with --allow-unidentified-agents (as a lab would run it; stand-in only).
    #[arg(long)]
    plain: bool,
}

/// `--apiserver`'s values.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Apiserver {
    /// The stand-in apiserver, in-process (a test double, not a kube-apiserver).
    Standin,
    /// The suite's real control plane, started for the demo and stopped after it.
    ControlPlane,
}

/// Where the demo reports, as the flags chose it.
#[derive(Debug)]
pub enum Target {
    /// `--apiserver standin`, or no choice.
    Standin(Transport),
    /// `--apiserver control-plane`.
    ControlPlane,
    /// `--kubeconfig PATH`, with the kubectl to drive it.
    Kubeconfig {
        /// The admin's kubeconfig.
        kubeconfig: PathBuf,
        /// `--kubectl`, if given.
        kubectl: Option<PathBuf>,
    },
}

impl Args {
    /// The target the flags name.
    ///
    /// # Errors
    /// A clap error (kind `InvalidValue` for an unknown `--transport`, `ArgumentConflict`
    /// for flags that do not go together) naming the flags and the fix; `exit()` prints it
    /// as clap prints its own.
    fn target(&self) -> Result<Target, clap::Error> {
        let conflict = |message: String| {
            Args::command().error(clap::error::ErrorKind::ArgumentConflict, message)
        };
        let transport = match self.transport.as_str() {
            "grpc" => Transport::Grpc,
            "mqtt" => Transport::Mqtt,
            other => {
                return Err(Args::command().error(
                    clap::error::ErrorKind::InvalidValue,
                    format!("--transport {other:?}: use grpc or mqtt"),
                ));
            }
        };
        let target = match (self.apiserver, &self.kubeconfig) {
            (None | Some(Apiserver::Standin), None) => {
                if self.kubectl.is_some() {
                    return Err(conflict("--kubectl drives a cluster of your own: give --kubeconfig PATH with it, or drop --kubectl".into()));
                }
                return Ok(Target::Standin(transport));
            }
            (Some(Apiserver::ControlPlane), None) => {
                if self.kubectl.is_some() {
                    return Err(conflict("--apiserver control-plane uses the control plane's own kubectl: drop --kubectl (it is for --kubeconfig)".into()));
                }
                Target::ControlPlane
            }
            (None, Some(kubeconfig)) => Target::Kubeconfig {
                kubeconfig: kubeconfig.clone(),
                kubectl: self.kubectl.clone(),
            },
            (Some(apiserver), Some(_)) => {
                let name = apiserver
                    .to_possible_value()
                    .map(|v| v.get_name().to_owned());
                let name = name.unwrap_or_default();
                return Err(conflict(format!(
                    "--apiserver {name} and --kubeconfig name two apiservers: drop --apiserver {name} to report to the cluster of your kubeconfig, or drop --kubeconfig"
                )));
            }
        };
        let form = if matches!(target, Target::ControlPlane) {
            "--apiserver control-plane"
        } else {
            "--kubeconfig"
        };
        if self.port.is_some() {
            return Err(conflict(format!(
                "--port sets the stand-in's port; with {form} the apiserver has its own: drop --port"
            )));
        }
        if transport == Transport::Mqtt {
            return Err(conflict(format!(
                "--transport mqtt runs with the stand-in only; with {form} the gateway runs as deploy/gateway-enrollment deploys it, over gRPC: drop --transport mqtt, or {form}"
            )));
        }
        if self.plain {
            return Err(conflict(format!(
                "--plain runs with the stand-in only; with {form} the agent enrolls, as deploy/gateway-enrollment's gateway wants: drop --plain, or {form}"
            )));
        }
        Ok(target)
    }
}

/// The node's name: the config's (`--node-name` is put there), else the hostname.
pub fn node_name(config: &AgentConfig) -> anyhow::Result<String> {
    let facts = edgebeat_agent::run::read_facts(config)?;
    Ok(edgebeat_agent::run::node_name(config, &facts)?.into_string())
}

/// Cancels `cancel` on Ctrl-C (SIGINT) or SIGTERM.
pub fn stop_on_signals(cancel: &CancellationToken) {
    let stop = cancel.clone();
    tokio::spawn(async move {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut term) => {
                    term.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = terminate => {}
        }
        stop.cancel();
    });
}

/// Cancels `cancel` after `duration` seconds, unless 0 (then only a signal ends the demo).
pub fn stop_after(cancel: &CancellationToken, duration: u64) {
    if duration > 0 {
        let stop = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(duration)).await;
            stop.cancel();
        });
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let target = args.target().unwrap_or_else(|e| e.exit());
    let filter: tracing_subscriber::filter::Targets =
        args.log_level.parse().context("--log-level")?;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer())
        .with(filter)
        .init();

    let mut config = match &args.config {
        Some(path) => AgentConfig::load(path)?,
        None => AgentConfig::default(),
    };
    config.host_root = args.host_root.clone();
    if let Some(name) = &args.node_name {
        config.node_name =
            Some(edgebeat_agent::config::NodeName::new(name.as_str()).context("--node-name")?);
    }
    match target {
        Target::Standin(transport) => standin::run(&args, transport, config).await,
        target => real::run(&args, target, config).await,
    }
}
