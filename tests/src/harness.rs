//! End-to-end harness: a stand-in apiserver, a gateway serving gRPC on a loopback port 0,
//! and agents started in-process with short heartbeat intervals.
//!
//! Everything talks over real sockets: the agent's tonic client to the gateway's tonic
//! server, the gateway's kube-rs client to the stand-in over HTTP.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use edgebeat_agent::config::TransportConfig;
use edgebeat_agent::{Agent, AgentConfig};
use edgebeat_gateway::{Gateway, GatewayOptions, kube_client};
use edgebeat_hw::{Clock, SystemClock};
use edgebeat_transports::grpc::{GrpcServerOptions, serve};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::standin::{StandIn, StandInHandle};

/// Which transport the agents of a [`Cluster`] use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// gRPC to the gateway's listener.
    Grpc,
}

/// A stand-in apiserver plus a running gateway.
pub struct Cluster {
    /// The stand-in apiserver (a test double).
    pub standin: StandInHandle,
    /// The gateway core, for its counters.
    pub gateway: Arc<Gateway>,
    /// `http://127.0.0.1:PORT` of the gateway's gRPC listener.
    pub grpc_url: String,
    /// Transport the agents use.
    pub transport: Transport,
    cancel: CancellationToken,
    server: Option<JoinHandle<()>>,
}

/// A running in-process agent.
pub struct AgentHandle {
    /// The node name it speaks for.
    pub node_name: String,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), edgebeat_agent::AgentError>>,
}

impl AgentHandle {
    /// Stops the agent (as SIGTERM would) and waits for it to finish.
    ///
    /// Errors: the agent's own error, or a join error if it panicked.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.cancel.cancel();
        self.task.await.context("agent task")?.context("agent")?;
        Ok(())
    }
}

/// Path of a committed fixture host tree (`tests/fixtures/<name>`).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// Copies a fixture tree into a fresh temporary directory so a test can change host facts
/// (boot ID, meminfo) while an agent runs.
///
/// Errors: I/O errors while copying.
pub fn fixture_copy(name: &str) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    copy_tree(&fixture(name), dir.path())?;
    Ok(dir)
}

fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

impl Cluster {
    /// Starts a stand-in apiserver and a gateway with default options.
    ///
    /// Errors: binding or client construction failures.
    pub async fn start(transport: Transport) -> anyhow::Result<Self> {
        Self::start_with(transport, GatewayOptions::default()).await
    }

    /// As [`Cluster::start`], with gateway options.
    ///
    /// Errors: binding or client construction failures.
    pub async fn start_with(transport: Transport, options: GatewayOptions) -> anyhow::Result<Self> {
        let standin = StandIn::start().await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let grpc_url = format!("http://{}", listener.local_addr()?);
        let (gateway, cancel, server) = spawn_gateway(&standin, options, listener)?;
        Ok(Self {
            standin,
            gateway,
            grpc_url,
            transport,
            cancel,
            server: Some(server),
        })
    }

    /// Replaces the gateway with a fresh one (no memory of any node) on the same address,
    /// as a gateway restart would.
    ///
    /// Errors: the address cannot be bound again.
    pub async fn restart_gateway(&mut self, options: GatewayOptions) -> anyhow::Result<()> {
        self.stop_gateway().await;
        let addr = self.grpc_url.trim_start_matches("http://").to_owned();
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("rebinding {addr}"))?;
        let (gateway, cancel, server) = spawn_gateway(&self.standin, options, listener)?;
        self.gateway = gateway;
        self.cancel = cancel;
        self.server = Some(server);
        Ok(())
    }

    /// An agent configuration for `node_name` reading host facts from `host_root`, with
    /// short intervals: status computed every 100 ms and reported every 2 s when unchanged,
    /// lease duration 1 s (renewal every 250 ms).
    pub fn agent_config(&self, node_name: &str, host_root: &Path) -> AgentConfig {
        AgentConfig {
            node_name: Some(node_name.to_owned()),
            node_status_update_frequency: Duration::from_millis(100),
            node_status_report_frequency: Duration::from_secs(2),
            node_lease_duration_seconds: 1,
            host_root: host_root.to_owned(),
            transport: Some(match self.transport {
                Transport::Grpc => TransportConfig::Grpc {
                    endpoint: self.grpc_url.clone(),
                    keepalive: Duration::from_secs(30),
                },
            }),
            ..AgentConfig::default()
        }
    }

    /// Starts an in-process agent with `config`.
    ///
    /// Errors: the agent's start-up errors (unreadable host facts, bad node name).
    pub fn start_agent(&self, config: AgentConfig) -> anyhow::Result<AgentHandle> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let agent = Agent::new(config, clock)?;
        let node_name = agent.node_name().to_owned();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(agent.run(cancel.clone()));
        Ok(AgentHandle {
            node_name,
            cancel,
            task,
        })
    }

    /// Stops the gateway's gRPC server and waits for it.
    pub async fn stop_gateway(&mut self) {
        self.cancel.cancel();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }
}

fn spawn_gateway(
    standin: &StandInHandle,
    options: GatewayOptions,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<(Arc<Gateway>, CancellationToken, JoinHandle<()>)> {
    let client = kube_client(kube::Config::new(standin.url().parse()?), 1000)?;
    let gateway = Arc::new(Gateway::new(client, Arc::new(SystemClock), options));
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let handler = gateway.clone();
    let server = tokio::spawn(async move {
        if let Err(error) = serve(
            listener,
            handler,
            GrpcServerOptions::default(),
            stop.cancelled_owned(),
        )
        .await
        {
            tracing::error!(%error, "gRPC server failed");
        }
    });
    Ok((gateway, cancel, server))
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.standin.shutdown();
    }
}
