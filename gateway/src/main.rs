//! `edgebeat-gateway`: see the crate docs of `edgebeat_gateway`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use edgebeat_gateway::{Gateway, GatewayOptions, kube_client};
use edgebeat_transports::grpc::{GrpcServerOptions, serve};

/// Receives edgebeat heartbeats and writes Node status and Leases to Kubernetes.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address of the gRPC listener.
    #[arg(long, default_value = "0.0.0.0:7443")]
    grpc_listen: SocketAddr,
    /// kubeconfig file; without it: $KUBECONFIG, ~/.kube/config, then in-cluster config.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// apiserver URL to use instead of a kubeconfig (plain http, no auth: for the stand-in).
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// Client-side limit on apiserver requests per second.
    #[arg(long, default_value_t = 50)]
    qps: u64,
    /// Oldest lease renewal still written, in seconds; older ones are dropped.
    #[arg(long, default_value_t = 5)]
    max_renewal_age_seconds: u64,
    /// Log filter: a level (info, debug…) or `target=level,…`.
    #[arg(long, default_value = "info")]
    log_level: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter: tracing_subscriber::filter::Targets = args
        .log_level
        .parse()
        .with_context(|| format!("--log-level {:?}", args.log_level))?;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer())
        .with(filter)
        .init();

    let config = match (&args.server, &args.kubeconfig) {
        (Some(url), _) => {
            kube::Config::new(url.parse().with_context(|| format!("--server {url:?}"))?)
        }
        (None, Some(path)) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        (None, None) => kube::Config::infer()
            .await
            .context("no kubeconfig or in-cluster config found; pass --kubeconfig")?,
    };
    let client = kube_client(config, args.qps)?;
    let options = GatewayOptions {
        max_renewal_age: Duration::from_secs(args.max_renewal_age_seconds),
        ..Default::default()
    };
    let gateway = Arc::new(Gateway::new(
        client,
        Arc::new(edgebeat_hw::SystemClock),
        options,
    ));
    let listener = tokio::net::TcpListener::bind(args.grpc_listen)
        .await
        .with_context(|| format!("binding {}", args.grpc_listen))?;
    tracing::info!(addr = %listener.local_addr()?, "gRPC listening");
    serve(
        listener,
        gateway,
        GrpcServerOptions::default(),
        shutdown_signal(),
    )
    .await?;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    if let Ok(mut term) = signal(SignalKind::terminate()) {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    } else {
        let _ = tokio::signal::ctrl_c().await;
    }
}
