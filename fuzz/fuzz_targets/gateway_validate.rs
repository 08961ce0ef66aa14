//! The gateway's pure handling of a decoded `AgentMessage`, in the message path's order and
//! without an apiserver: the header checks, then per kind the status checks and the
//! apiserver bodies built from the message, or the echoed Lease state.
//!
//! Checks (none may panic):
//! - `NodeName::new` on the header's node name;
//! - `edgebeat_proto::boot_id_to_string` on the header's boot ID (a 16-byte ID must come
//!   back from `boot_id_to_bytes` unchanged), `boot_id_to_bytes` on `nodeInfo.bootID`;
//! - `metrics::clock_skew_seconds` on the agent's wall time, `freshness::Freshness` on `seq`;
//! - `message_path::validate_status` on every NodeStatus inside (Register, StatusReport); for a
//!   status and name the gateway accepts, `bodies::conditions`, `bodies::node_status`,
//!   `bodies::initial_node` and `bodies::status_patch` (what it would send the apiserver);
//! - `message_path::LeaseState::decode` on `lease_state` (a decoded state must survive
//!   `encode` → `decode`), then `bodies::new_lease` / `renewed_lease` / `node_event`, and
//!   `bodies::plain_lease_json` (the renewal PUT written as bytes) must equal
//!   `serde_json::to_vec` of `new_lease` with the echoed resourceVersion, for the node as
//!   holder and for a holder some other writer set.
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use edgebeat_gateway::bodies::{self, KnownCondition, KnownConditions};
use edgebeat_gateway::freshness::Freshness;
use edgebeat_gateway::message_path::{LeaseState, validate_status};
use edgebeat_gateway::metrics::clock_skew_seconds;
use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{
    self as pb, AgentMessage, ConditionStatus, EventType, NodeConditionType, agent_message::Kind,
};
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
                    let mut lease = bodies::new_lease(
                        name,
                        "uid",
                        renewal.lease_duration_seconds,
                        state.renew_time,
                    );
                    lease.metadata.resource_version = Some(state.resource_version.clone());
                    let json = serde_json::to_vec(&lease).expect("a Lease serializes");
                    plain_lease_agrees(name, name, &json, renewal, &state);
                    // A holder another writer set (any text: the boot ID as the agent sent it).
                    let mut other = lease.clone();
                    if let Some(spec) = other.spec.as_mut() {
                        spec.holder_identity = Some(boot.clone());
                    }
                    let json = serde_json::to_vec(&other).expect("a Lease serializes");
                    plain_lease_agrees(name, &boot, &json, renewal, &state);
                    let _ = bodies::renewed_lease(
                        lease,
                        name,
                        Some("uid"),
                        renewal.lease_duration_seconds,
                        now,
                    );
                }
            }
            if name_ok {
                let _ = bodies::node_event(
                    name,
                    EventType::Normal,
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

/// `bodies::plain_lease_json` against `lease_json`, `serde_json::to_vec` of the Lease it
/// stands in for.
fn plain_lease_agrees(
    name: &str,
    holder: &str,
    lease_json: &[u8],
    renewal: &pb::LeaseRenewal,
    state: &LeaseState,
) {
    let plain = bodies::plain_lease_json(
        name,
        holder,
        "uid",
        renewal.lease_duration_seconds,
        &state.resource_version,
        state.renew_time,
    );
    assert_eq!(
        String::from_utf8_lossy(&plain),
        String::from_utf8_lossy(lease_json),
        "plain_lease_json differs from the serialized Lease"
    );
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
    let conditions = bodies::conditions(status, now, &KnownConditions::default());
    // Known with the same status (kept transition) and the opposite one (a new transition,
    // clamped against the known one).
    for flip in [false, true] {
        let mut known = KnownConditions::default();
        for c in &status.conditions {
            let Some(type_) = NodeConditionType::from_name(&c.r#type) else {
                continue;
            };
            let held = match (flip, ConditionStatus::from_api(&c.status)) {
                (false, held) => held,
                (true, ConditionStatus::True) => ConditionStatus::False,
                (true, _) => ConditionStatus::Unknown,
            };
            known.insert(
                type_,
                KnownCondition {
                    status: held,
                    last_transition: known_at,
                },
            );
        }
        let _ = bodies::conditions(status, now, &known);
    }
    let ns = bodies::node_status(status, conditions);
    let _ = bodies::status_patch(&ns, None);
    if let Some(register) = register {
        let labels: BTreeMap<String, String> = register.labels.clone().into_iter().collect();
        let _ = bodies::status_patch(&ns, Some(&labels));
        let _ = bodies::initial_node(name, register, ns);
    }
}
