//! `edgebeat-agent --once` on the committed fixture trees prints what the tree implies.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn once(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_edgebeat-agent"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn once_prints_the_jetson_fixture_status() {
    let root = fixture("jetson-cgroup2");
    let (ok, stdout, stderr) = once(&["--once", "--host-root", root.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let node: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(node["kind"], "Node");
    // No nodeName: the lower-cased hostname, also the hostname label (kubelet's default).
    assert_eq!(node["metadata"]["name"], "jetson-orin-nx-07");
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], "jetson-orin-nx-07");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["edgebeat.io/container-runtime"], "none");
    let v = &node["status"];
    assert_eq!(v["capacity"]["cpu"], "8");
    assert_eq!(v["capacity"]["memory"], "15656828Ki"); // 16032591872 bytes
    assert_eq!(v["capacity"]["hugepages-2Mi"], "256Mi"); // 128 pages
    assert_eq!(v["capacity"]["hugepages-1Gi"], "0");
    // No container runtime behind an edgebeat node: no pods unless maxPods says so.
    assert_eq!(v["capacity"]["pods"], "0");
    assert_eq!(v["allocatable"]["pods"], "0");
    // 16032591872 − 100Mi − 256Mi of hugepages
    assert_eq!(v["allocatable"]["memory"], "15292284Ki");
    assert_eq!(
        v["nodeInfo"]["bootID"],
        "c2a8e4f1-3b6d-4a9e-b07c-5d2f8e1a6c39"
    );
    assert_eq!(
        v["nodeInfo"]["machineID"],
        "4f8a1c3e9b2d47e6a05c7d9e1b3f5a72"
    );
    assert_eq!(v["nodeInfo"]["kernelVersion"], "5.15.136-tegra");
    assert_eq!(v["nodeInfo"]["osImage"], "Ubuntu 22.04.4 LTS");
    // No DMI, no device-tree ID: the machine ID, as cadvisor falls back to it.
    assert_eq!(
        v["nodeInfo"]["systemUUID"],
        "4f8a1c3e9b2d47e6a05c7d9e1b3f5a72"
    );
    assert_eq!(
        v["addresses"],
        serde_json::json!([
            {"type": "InternalIP", "address": "192.168.50.23"},
            {"type": "Hostname", "address": "jetson-orin-nx-07"}
        ])
    );
    let conditions: Vec<_> = v["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
        // The running kernel's clock, not the tree's: either status.
        .filter(|(t, _)| *t != "ClockUnsynchronized")
        .collect();
    // DiskPressure reads the filesystem the checkout is on (statvfs of the tree's rootDir),
    // not the tree: True on a host with less than imagefs.available's 15 % free. Either
    // status, but it is there.
    let disk = conditions.iter().position(|(t, _)| *t == "DiskPressure");
    assert!(
        disk.is_some_and(|i| matches!(conditions[i].1, "True" | "False")),
        "{conditions:?}"
    );
    let conditions: Vec<_> = conditions
        .into_iter()
        .filter(|(t, _)| *t != "DiskPressure")
        .collect();
    // The health conditions this tree has signals for (PSI, the mount table, thermal
    // zones; no power: not a Raspberry Pi), then kubelet's four, Ready last.
    assert_eq!(
        conditions,
        [
            ("SystemMemoryContentionPressure", "False"),
            ("SystemDiskContentionPressure", "False"),
            ("ReadonlyFilesystem", "False"),
            ("ThermalPressure", "False"),
            ("MemoryPressure", "False"),
            ("PIDPressure", "False"),
            ("Ready", "True"),
        ]
    );
}

#[test]
fn bad_config_names_the_field_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.yaml");
    std::fs::write(&path, "apiVersion: edgebeat.io/v1alpha1\nkind: AgentConfiguration\nnodeLeaseDurationSeconds: -5\n").unwrap();
    let (ok, _, stderr) = once(&["--once", "--config", path.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("nodeLeaseDurationSeconds"), "{stderr}");
}

#[test]
fn missing_host_root_is_a_clear_error() {
    let (ok, _, stderr) = once(&["--once", "--host-root", "/nonexistent/edgebeat"]);
    assert!(!ok);
    assert!(stderr.contains("boot_id"), "{stderr}");
    // One line, each cause said once (observe::error_report).
    assert!(stderr.contains("Error: reading host facts: "), "{stderr}");
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
}

/// The health conditions of `--once` on `tree`: type → (status, reason).
fn health(tree: &str) -> std::collections::BTreeMap<String, (String, String)> {
    let root = fixture(tree);
    let (ok, stdout, stderr) = once(&["--once", "--host-root", root.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let node: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            edgebeat_proto::NodeConditionType::from_name(c["type"].as_str().unwrap())
                .is_some_and(|t| !t.is_kubelets())
        })
        .map(|c| {
            (
                c["type"].as_str().unwrap().to_owned(),
                (
                    c["status"].as_str().unwrap().to_owned(),
                    c["reason"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect()
}

/// Each per-signal tree turns exactly its condition True with the documented reason; the
/// healthy tree has them all False. `ClockUnsynchronized` reads the running kernel, not the
/// tree, so it is only required to be there.
#[test]
fn once_shows_each_health_signal_on_its_fixture_tree() {
    let cases = [
        ("rpi4-cgroup1", None),
        (
            "rpi4-undervoltage",
            Some(("UnderVoltage", "UnderVoltageDetected")),
        ),
        (
            "rpi4-thermal-passive",
            Some(("ThermalPressure", "TemperatureAboveTripPoint")),
        ),
        (
            "rpi4-readonly-root",
            Some(("ReadonlyFilesystem", "FilesystemIsReadOnly")),
        ),
        (
            "rpi4-memory-contention",
            Some((
                "SystemMemoryContentionPressure",
                "KubeletHasSystemMemoryContentionPressure",
            )),
        ),
    ];
    for (tree, failing) in cases {
        let mut got = health(tree);
        assert!(got.remove("ClockUnsynchronized").is_some(), "{tree}");
        assert_eq!(got.len(), 5, "{tree}: {got:?}");
        for (type_, (status, reason)) in &got {
            match failing {
                Some((t, r)) if t == type_ => {
                    assert_eq!((status.as_str(), reason.as_str()), ("True", r), "{tree}")
                }
                _ => assert_eq!(status, "False", "{tree}: {type_} {reason}"),
            }
        }
    }
}
