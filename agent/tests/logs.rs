//! What the agent writes to a log file (a systemd journal, a redirected stderr): plain
//! lines without colour escapes, or one JSON object per line with `--log-format json`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/log_lines.rs"]
mod log_lines;

use std::process::Command;

use log_lines::{Stream, check_both_formats};

/// The agent of the `rpi4-cgroup1` fixture, speaking gRPC to a port nobody listens on: it
/// logs why each connection fails.
fn agent(dir: &std::path::Path, format: &str) -> Command {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/rpi4-cgroup1");
    let config = dir.join(format!("{format}.yaml"));
    std::fs::write(
        &config,
        format!(
            "apiVersion: edgebeat.io/v1alpha1\nkind: AgentConfiguration\nnodeName: logs-01\nhostRoot: {}\nclockSyncCondition: false\ntransport: {{kind: grpc, endpoint: \"http://{closed}\"}}\n",
            root.display()
        ),
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_edgebeat-agent"));
    command
        .arg("--config")
        .arg(&config)
        .args(["--log-format", format])
        .env_remove("NO_COLOR");
    command
}

#[test]
fn log_lines_in_a_file_are_plain_text_or_json() {
    let dir = tempfile::tempdir().unwrap();
    let lines = check_both_formats(
        |format| agent(dir.path(), format),
        Stream::Stderr,
        dir.path(),
        2,
        "WARN",
        "error",
    );
    assert!(
        lines.iter().all(|l| l["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("edgebeat"))),
        "{lines:?}"
    );
}
