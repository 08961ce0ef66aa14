//! What the gateway writes to a log file (`kubectl logs` of its container, a redirected
//! stdout): plain lines without colour escapes, or one JSON object per line with
//! `--log-format json`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/log_lines.rs"]
mod log_lines;

use std::process::Command;

use log_lines::{Stream, check_both_formats};

/// A gateway whose apiserver does not answer (a port nobody listens on), serving plain
/// gRPC: it warns that unidentified agents are let in, then says as errors why it cannot
/// reach the apiserver and why its watches fail (`kind=… error=…`).
fn gateway(format: &str) -> Command {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_edgebeat-gateway"));
    command
        .arg(format!("--server=http://{closed}"))
        .args([
            "--grpc-listen",
            "127.0.0.1:0",
            "--allow-unidentified-agents",
        ])
        .args(["--metrics-listen", "127.0.0.1:0", "--log-format", format])
        .args(["--log-level", "info,edgebeat_gateway=debug"])
        .env_remove("NO_COLOR");
    command
}

#[test]
fn log_lines_in_a_file_are_plain_text_or_json() {
    let dir = tempfile::tempdir().unwrap();
    check_both_formats(gateway, Stream::Stdout, dir.path(), 3, "ERROR", "error");
}
