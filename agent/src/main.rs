//! `edgebeat-agent`: see the crate docs of `edgebeat_agent`.

// Production functions of at most 100 lines (clippy.toml's too-many-lines-threshold,
// issue 51): a longer one is split into named steps. Tests are exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use edgebeat_agent::{Agent, AgentConfig, run, status, view::NodeView};
use edgebeat_hw::{Clock, SystemClock};
use tokio_util::sync::CancellationToken;

/// Reports this host to Kubernetes as a Node, as kubelet would: NodeStatus and the node
/// Lease, through an edgebeat gateway.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Agent configuration file (YAML, kind AgentConfiguration).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Read host facts under this directory instead of `/` (overrides `hostRoot`), like
    /// node_exporter's --path.rootfs.
    #[arg(long, value_name = "DIR")]
    host_root: Option<PathBuf>,
    /// Node name (overrides `nodeName`; kubelet --hostname-override).
    #[arg(long)]
    node_name: Option<String>,
    /// Serve /healthz, /readyz and /metrics on this IP:port, e.g. 127.0.0.1:10248 (overrides
    /// `healthzBindAddress`; off unless one of them is set).
    #[arg(long, value_name = "IP:PORT", value_parser = edgebeat_agent::config::parse_bind_address)]
    healthz_bind_address: Option<std::net::SocketAddr>,
    /// Print the NodeStatus the agent would send, as JSON, and exit.
    #[arg(long)]
    once: bool,
    /// Log filter: a level (info, debug…) or `target=level,…`.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Log line format: `text` (coloured only on a terminal without NO_COLOR) or `json` (one
    /// object per line: timestamp, level, target, message, the event's fields, spans).
    /// kubelet's name for it, `--logging-format`, is accepted too.
    #[arg(
        long,
        alias = "logging-format",
        value_name = "text|json",
        default_value = "text"
    )]
    log_format: edgebeat_transports::observe::LogFormat,
}

fn main() -> std::process::ExitCode {
    edgebeat_transports::observe::exit_code(run())
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    edgebeat_transports::observe::init_logging(
        &args.log_level,
        edgebeat_transports::observe::LogTo::Stderr,
        args.log_format,
    )
    .with_context(|| format!("--log-level {:?}", args.log_level))?;

    let mut config = match &args.config {
        Some(path) => AgentConfig::load(path)?,
        None => AgentConfig::default(),
    };
    if let Some(root) = args.host_root {
        config.host_root = root;
    }
    if let Some(name) = args.node_name {
        let name = edgebeat_agent::config::parse_node_name(&name)
            .map_err(|m| anyhow::anyhow!("--node-name: {m}"))?;
        config.node_name = Some(name);
    }
    if let Some(addr) = args.healthz_bind_address {
        config.healthz_bind_address = Some(addr);
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);

    if args.once {
        let facts = run::read_facts(&config)?;
        let name = run::node_name(&config, &facts)?;
        let labels = run::node_labels(&config, &facts, &name);
        let computed = status::compute(&facts, &config, None, clock.boottime());
        let json =
            serde_json::to_string_pretty(&NodeView::new(&name, &labels, &config, &computed))?;
        // A closed pipe (`| head`) is the reader's choice, not an error.
        use std::io::Write;
        return match writeln!(std::io::stdout().lock(), "{json}") {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
            _ => Ok(()),
        };
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        let agent = Agent::new(config, clock)?;
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            edgebeat_transports::observe::shutdown_signal().await;
            tracing::info!("shutting down");
            stop.cancel();
        });
        agent.run(cancel).await?;
        Ok(())
    })
}
