//! edgebeat agent: computes NodeStatus from host facts and renews the node Lease as kubelet
//! does, and ships both to the gateway over a transport (gRPC or MQTT).
//!
//! - [`config`]: the YAML configuration (KubeletConfiguration field names).
//! - [`status`]: the pure status computation `(facts, previous, now) -> NodeStatus`.
//! - [`run`]: the status and Lease loops.
//! - [`header`]: per-boot sequence numbers.
//! - [`view`]: Kubernetes-shaped JSON for `--once`.
//! - [`quantity`]: resource quantity parsing and canonical formatting.

pub mod config;
pub mod header;
pub mod quantity;
pub mod run;
pub mod status;
pub mod view;

pub use config::AgentConfig;
pub use run::{Agent, AgentError};
