//! edgebeat agent: computes NodeStatus from host facts and renews the node Lease as kubelet
//! does, and ships both to the gateway over a transport (gRPC or MQTT).
//!
//! - [`config`]: the YAML configuration (KubeletConfiguration field names).
//! - [`status`]: the pure status computation `(facts, previous, now) -> NodeStatus`.
//! - [`condition`]: one NodeCondition and how it follows the previous one.
//! - [`health`]: the health conditions beyond kubelet's four (PSI, read-only filesystem, thermal, under-voltage, clock sync).
//! - [`run`]: the agent ([`Agent`]): the status and Lease loops, the observe server.
//! - [`header`]: message headers: node name, boot ID, per-boot sequence numbers.
//! - [`certificates`]: node certificates: enrollment with a bootstrap token, rotation.
//! - [`metrics`]: the Prometheus metrics (`edgebeat_agent_*`) served on `/metrics`.
//! - [`systemd`]: `READY=1`, `WATCHDOG=1` and `STOPPING=1` under systemd.
//! - [`view`]: Kubernetes-shaped JSON for `--once`.
//! - [`quantity`]: resource quantity parsing and canonical formatting.
//! - `error`: why the agent could not start or run ([`AgentError`]).

// Production functions of at most 100 lines (clippy.toml's too-many-lines-threshold,
// issue 51): a longer one is split into named steps. Tests are exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

#[cfg(not(any(feature = "grpc", feature = "mqtt")))]
compile_error!(
    "edgebeat-agent needs a transport: build with feature `grpc`, `mqtt` or both (the default)"
);

#[cfg(any(feature = "grpc-tls", feature = "mqtt-tls"))]
pub mod certificates;
pub mod condition;
pub mod config;
mod error;
pub mod header;
pub mod health;
pub mod metrics;
pub mod quantity;
pub mod run;
pub mod status;
pub mod systemd;
pub mod view;

pub use config::AgentConfig;
pub use run::{Agent, AgentError};
