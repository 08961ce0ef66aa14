//! The gateway's pure handling of a decoded `AgentMessage`, in `handle_message`'s order and
//! without an apiserver: the header checks, then per kind the status checks and the
//! apiserver bodies built from the message, or the echoed Lease state.
//!
//! Checks (none may panic):
//! - `NodeName::new` on the header's node name;
//! - `edgebeat_proto::boot_id_to_string` on the header's boot ID (a 16-byte ID must come
//!   back from `boot_id_to_bytes` unchanged), `boot_id_to_bytes` on `nodeInfo.bootID`;
//! - `metrics::clock_skew_seconds` on the agent's wall time, `freshness::Freshness` on `seq`;
//! - `gateway::validate_status` on every NodeStatus inside (Register, StatusReport); for a
//!   status and name the gateway accepts, `patch::conditions`, `patch::node_status`,
//!   `patch::initial_node` and `patch::status_patch` (what it would send the apiserver);
//! - `gateway::LeaseState::decode` on `lease_state` (a decoded state must survive
//!   `encode` → `decode`), then `patch::new_lease` / `renewed_lease` / `node_event`.
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use edgebeat_gateway::freshness::Freshness;
use edgebeat_gateway::message_path::{LeaseState, validate_status};
use edgebeat_gateway::metrics::clock_skew_seconds;
use edgebeat_gateway::patch::{self, HeldStatus, KnownCondition, KnownConditions};
use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{self as pb, AgentMessage, agent_message::Kind};
use jiff::Timestamp;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tokio::time::Instant;

/// The gateway's clock, fixed so runs repeat: 2026-05-28T20:26:40Z.
const NOW_S: i64 = 1_780_000_000;

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = AgentMessage::decode(data) else {
        return;
    };
    check(&msg);
});

fn check(msg: &AgentMessage) {
    let now = Timestamp::from_second(NOW_S).unwrap_or(Timestamp::UNIX_EPOCH);
    let Some(header) = msg.header() else {
        return;
    };
    let name = header.node_name.as_str();
    let name_ok = NodeName::new(name).is_ok();

    let boot = edgebeat_proto::boot_id_to_string(&header.boot_id);
    if header.boot_id.len() == edgebeat_proto::BOOT_ID_BYTES {
        assert_eq!(
            edgebeat_proto::boot_id_to_bytes(&boot),
            header.boot_id,
            "16-byte boot ID {boot:?} does not round-trip"
        );
    }

    let gateway_wall = SystemTime::UNIX_EPOCH + Duration::from_secs(NOW_S as u64);
    let _ = clock_skew_seconds(gateway_wall, header.wall_time_ms);
    let start = origin();
    let mut freshness = Freshness::new(start, header.seq, start);
    let _ = freshness.observe(header.seq, start + Duration::from_secs(1), 1000);
    let _ = freshness.observe(header.seq / 2, start + Duration::from_secs(2), u64::MAX);

    // What the apiserver might say it holds: the agent's own conditions, transitioned at the
    // agent's wall time (any instant jiff accepts).
    let known_at = Timestamp::from_millisecond(header.wall_time_ms).unwrap_or(now);

    match &msg.kind {
        Some(Kind::Register(register)) => {
            if let Some(status) = &register.status {
                status_bodies(name, name_ok, status, Some(register), now, known_at);
            }
        }
        Some(Kind::Status(report)) => {
            if let Some(status) = &report.status {
                status_bodies(name, name_ok, status, None, now, known_at);
            }
        }
        Some(Kind::Lease(renewal)) => {
            if let Some(state) = LeaseState::decode(&renewal.lease_state) {
                let wire = state.encode();
                assert_eq!(
                    wire, renewal.lease_state,
                    "LeaseState re-encodes differently"
                );
                assert_eq!(LeaseState::decode(&wire).as_ref(), Some(&state));
                if name_ok && renewal.lease_duration_seconds > 0 {
                    let mut lease = patch::new_lease(
                        name,
                        "uid",
                        renewal.lease_duration_seconds,
                        state.renew_time,
                    );
                    lease.metadata.resource_version = Some(state.resource_version.clone());
                    let _ = patch::renewed_lease(
                        lease,
                        name,
                        Some("uid"),
                        renewal.lease_duration_seconds,
                        now,
                    );
                }
            }
            if name_ok {
                let _ = patch::node_event(
                    name,
                    "Normal",
                    "NodeReady",
                    format!("Node {name} status is now: NodeReady ({boot})"),
                    now,
                    header.seq,
                );
            }
        }
        None => {}
    }
}

/// `validate_status`, then — for a status and name the gateway accepts — the bodies
/// `report` (or, with `register`, `register`) would send.
fn status_bodies(
    name: &str,
    name_ok: bool,
    status: &pb::NodeStatus,
    register: Option<&pb::Register>,
    now: Timestamp,
    known_at: Timestamp,
) {
    if let Some(info) = &status.node_info {
        let _ = edgebeat_proto::boot_id_to_bytes(&info.boot_id);
    }
    if validate_status(status).is_err() || !name_ok {
        return;
    }
    let conditions = patch::conditions(status, now, &KnownConditions::default());
    // Known with the same status (kept transition) and the opposite one (a new transition,
    // clamped against the known one).
    for flip in [false, true] {
        let mut known = KnownConditions::default();
        for c in &status.conditions {
            let held = match (flip, HeldStatus::parse(&c.status)) {
                (false, held) => held,
                (true, HeldStatus::True) => HeldStatus::False,
                (true, _) => HeldStatus::Unknown,
            };
            known.insert(
                &c.r#type,
                KnownCondition {
                    status: held,
                    last_transition: known_at,
                },
            );
        }
        let _ = patch::conditions(status, now, &known);
    }
    let ns = patch::node_status(status, conditions);
    let _ = patch::status_patch(&ns, None);
    if let Some(register) = register {
        let labels: BTreeMap<String, String> = register.labels.clone().into_iter().collect();
        let _ = patch::status_patch(&ns, Some(&labels));
        let _ = patch::initial_node(name, register, ns);
    }
}
