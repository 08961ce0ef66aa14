//! `deploy/systemd/edgebeat-agent.service` is a valid unit (checked by systemd's own
//! `systemd-analyze verify` when present) with the hardening the README promises.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

fn unit() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/edgebeat-agent.service"),
    )
    .unwrap()
}

#[test]
fn unit_carries_the_documented_hardening_and_notify_settings() {
    let unit = unit();
    for line in [
        "Type=notify",
        "WatchdogSec=60s",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "DynamicUser=yes",
        "CapabilityBoundingSet=",
        "ReadOnlyPaths=/proc /sys /etc",
        "Restart=always",
        "KillSignal=SIGTERM",
        "SystemCallFilter=@system-service",
        "ConditionPathExists=/etc/edgebeat/agent.yaml",
        "TimeoutStartSec=30s",
    ] {
        assert!(unit.lines().any(|l| l.trim() == line), "missing `{line}`");
    }
}

#[test]
#[ignore = "needs systemd-analyze: scripts/test.sh runs it when systemd is installed"]
fn systemd_analyze_verifies_the_unit() {
    assert!(
        Command::new("systemd-analyze")
            .arg("--version")
            .output()
            .is_ok(),
        "systemd-analyze not installed"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edgebeat-agent.service");
    let unit = unit().replace(
        "/usr/bin/edgebeat-agent",
        env!("CARGO_BIN_EXE_edgebeat-agent"),
    );
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {stderr}"
    );
}
