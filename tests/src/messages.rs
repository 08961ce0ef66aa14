//! Hand-built `edgebeat.v1` messages for tests that talk to the gateway directly (raw
//! uplinks, TLS probes, hostile input): a minimal valid Register and a Lease renewal.

use edgebeat_proto::{self as pb, agent_message::Kind};

/// Boot ID used by hand-built messages.
pub const BOOT: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";

/// A header for `node` with per-boot sequence number `seq` (µs of boot clock) on [`BOOT`].
pub fn header(node: &str, seq: u64) -> pb::Header {
    pb::Header {
        node_name: node.into(),
        boot_id: pb::boot_id_to_bytes(BOOT),
        seq,
        wall_time_ms: 0,
        boot_tag: 0,
    }
}

/// A minimal valid Register: one CPU, Ready=True with kubelet's reason, nodeInfo.bootID.
pub fn register(node: &str, seq: u64) -> pb::AgentMessage {
    let status = pb::NodeStatus {
        capacity: [("cpu".to_owned(), "1".to_owned())].into(),
        conditions: vec![pb::NodeCondition {
            r#type: "Ready".into(),
            status: "True".into(),
            reason: "KubeletReady".into(),
            message: "kubelet is posting ready status".into(),
            seconds_since_transition: 0,
        }],
        node_info: Some(pb::NodeSystemInfo {
            boot_id: BOOT.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    pb::AgentMessage {
        kind: Some(Kind::Register(pb::Register {
            header: Some(header(node, seq)),
            status: Some(status),
            ..Default::default()
        })),
    }
}

/// A Lease renewal for `node` (duration 40 s, no echoed lease state).
pub fn renewal(node: &str, seq: u64) -> pb::AgentMessage {
    pb::AgentMessage {
        kind: Some(Kind::Lease(pb::LeaseRenewal {
            header: Some(header(node, seq)),
            lease_duration_seconds: 40,
            lease_state: Vec::new(),
            quiet: false,
            usage: None,
        })),
    }
}
