//! `edgebeat-gateway`: see the crate docs of `edgebeat_gateway`. Parses the command line
//! into [`Settings`] and hands them to [`Server`] (or to a subcommand); every piece of wiring lives in the
//! library, so the tests run the same server.

// Production functions of at most 100 lines (clippy.toml's too-many-lines-threshold,
// issue 51): a longer one is split into named steps. Tests are exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use anyhow::Context as _;
use clap::Parser;
use edgebeat_gateway::cli::{AnswerCaCommand, Args, Command, TokenCommand};
use edgebeat_gateway::commands::{answer_ca_rotate, token_create};
use edgebeat_gateway::server::Server;
use edgebeat_gateway::settings::Settings;

fn main() -> std::process::ExitCode {
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run()));
    edgebeat_transports::observe::exit_code(result)
}

async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    edgebeat_transports::observe::init_logging(
        &args.log_level,
        edgebeat_transports::observe::LogTo::Stdout,
        args.log_format,
    )
    .with_context(|| format!("--log-level {:?}", args.log_level))?;
    // rustls on ring for every TLS user in the process (gRPC server, kube client).
    edgebeat_transports::grpc::tls::install_ring_provider();
    match args.command {
        Some(Command::AnswerCa(AnswerCaCommand::Rotate)) => answer_ca_rotate(&args.cluster).await?,
        Some(Command::Token(TokenCommand::Create { nodes, ttl, uses })) => {
            token_create(&args.cluster, nodes, ttl, uses).await?;
        }
        None => {
            Server::bind(Settings::from_args(&args).await?)
                .await?
                .run(edgebeat_transports::observe::shutdown_signal())
                .await?;
        }
    }
    Ok(())
}
