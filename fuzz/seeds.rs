//! Writes the committed protobuf seeds, `seeds/agent_message/*.hex` (one encoded
//! `AgentMessage` per file, as hex), from messages shaped like the agent's. Not a fuzz
//! target: run it after a change to `heartbeat.proto` with
//!
//! ```sh
//! cargo run --manifest-path fuzz/Cargo.toml --features seeds --bin seeds
//! ```
//!
//! `scripts/fuzz.sh` turns the hex files into the binary corpus of `agent_message_decode`
//! and `gateway_validate`.

use std::collections::HashMap;
use std::path::Path;

use edgebeat_gateway::message_path::LeaseState;
use edgebeat_proto::{self as pb, AgentMessage, agent_message::Kind};
use jiff::Timestamp;
use prost::Message;

const BOOT: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";

fn header(seq: u64) -> Option<pb::Header> {
    Some(pb::Header {
        node_name: "edge-0001".into(),
        boot_id: pb::boot_id_to_bytes(BOOT),
        seq,
        wall_time_ms: 1_780_000_000_123,
        ..Default::default()
    })
}

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn status(ready: &str) -> pb::NodeStatus {
    let conditions = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        .iter()
        .map(|t| {
            let is_ready = *t == "Ready";
            pb::NodeCondition {
                r#type: (*t).into(),
                status: if is_ready { ready } else { "False" }.into(),
                reason: if is_ready {
                    "KubeletReady"
                } else {
                    "NoPressure"
                }
                .into(),
                message: String::new(),
                seconds_since_transition: 30,
            }
        })
        .collect();
    pb::NodeStatus {
        capacity: map(&[("cpu", "4"), ("memory", "8025424Ki")]),
        allocatable: map(&[("cpu", "4"), ("pods", "110")]),
        conditions,
        addresses: vec![
            pb::NodeAddress {
                r#type: "InternalIP".into(),
                address: "192.0.2.10".into(),
            },
            pb::NodeAddress {
                r#type: "Hostname".into(),
                address: "edge-0001".into(),
            },
        ],
        node_info: Some(pb::NodeSystemInfo {
            machine_id: "5c2d6e0f".into(),
            system_uuid: String::new(),
            boot_id: BOOT.into(),
            kernel_version: "6.1.0".into(),
            os_image: "Debian 12".into(),
            container_runtime_version: String::new(),
            kubelet_version: "v1.36.0".into(),
            operating_system: "linux".into(),
            architecture: "arm64".into(),
        }),
        kubelet_endpoint_port: 10250,
    }
}

fn message(kind: Kind) -> Vec<u8> {
    AgentMessage { kind: Some(kind) }.encode_to_vec()
}

fn main() -> std::io::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/agent_message");
    std::fs::create_dir_all(&dir)?;
    let lease_state = LeaseState {
        resource_version: "184467".into(),
        renew_time: Timestamp::from_microsecond(1_780_000_000_123_456)
            .unwrap_or(Timestamp::UNIX_EPOCH),
    }
    .encode();
    let mut unknown_status = status("Unknown");
    unknown_status.conditions[0].reason.clear();

    let seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "register",
            message(Kind::Register(pb::Register {
                header: header(12_000_000),
                labels: map(&[
                    ("kubernetes.io/hostname", "edge-0001"),
                    ("kubernetes.io/arch", "arm64"),
                ]),
                taints: vec![pb::Taint {
                    key: "edge".into(),
                    value: "true".into(),
                    effect: "NoSchedule".into(),
                }],
                unschedulable: false,
                status: Some(status("True")),
                skip_create: false,
                cgroup_version: 2,
                ..Default::default()
            })),
        ),
        (
            "status",
            message(Kind::Status(pb::StatusReport {
                header: header(22_000_000),
                status: Some(status("False")),
                unchanged: false,
                journal: Vec::new(),
            })),
        ),
        (
            "status_rejected",
            message(Kind::Status(pb::StatusReport {
                header: header(23_000_000),
                status: Some(unknown_status),
                unchanged: false,
                journal: Vec::new(),
            })),
        ),
        (
            "lease",
            message(Kind::Lease(pb::LeaseRenewal {
                header: header(32_000_000),
                lease_duration_seconds: 40,
                lease_state,
                quiet: true,
                usage: None,
            })),
        ),
        (
            "lease_first",
            message(Kind::Lease(pb::LeaseRenewal {
                header: Some(pb::Header {
                    node_name: "Edge_01".into(),
                    boot_id: b"not-a-uuid".to_vec(),
                    seq: 1,
                    wall_time_ms: 0,
                    ..Default::default()
                }),
                lease_duration_seconds: 40,
                lease_state: Vec::new(),
                quiet: false,
                usage: None,
            })),
        ),
        // Field 99 (varint): a newer agent's message kind.
        ("unknown_kind", vec![0xf8, 0x06, 0x01]),
    ];
    for (name, bytes) in seeds {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert!(hex.len() <= 1024, "seed {name} is {} hex chars", hex.len());
        std::fs::write(dir.join(format!("{name}.hex")), hex + "\n")?;
        println!("seeds/agent_message/{name}.hex: {} bytes", bytes.len());
    }
    Ok(())
}
