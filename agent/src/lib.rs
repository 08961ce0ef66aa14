//! edgebeat agent: computes NodeStatus from host facts and renews the node Lease as kubelet
//! does, and ships both to the gateway over a transport (gRPC or MQTT).
//!
//! - [`config`]: the YAML configuration (KubeletConfiguration field names).
//! - [`status`]: the pure status computation `(facts, previous, now) -> NodeStatus`.
//! - [`health`]: the health conditions beyond kubelet's four (PSI, read-only filesystem,
//!   thermal, under-voltage, clock sync).
//! - [`run`]: the status and Lease loops, the observe server and systemd notifications.
//! - [`metrics`]: the Prometheus metrics (`edgebeat_agent_*`) served on `/metrics`.
//! - [`systemd`]: `READY=1`, `WATCHDOG=1` and `STOPPING=1` under systemd.
//! - [`header`]: per-boot sequence numbers.
//! - [`view`]: Kubernetes-shaped JSON for `--once`.
//! - [`quantity`]: resource quantity parsing and canonical formatting.

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
