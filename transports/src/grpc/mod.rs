//! gRPC transport: one long-lived bidirectional `Heartbeat.Connect` stream per agent, with
//! HTTP/2 keepalive pings so a dead link is noticed within `keepalive + timeout`.

use std::time::Duration;

#[cfg(feature = "grpc-uplink")]
mod client;
#[cfg(feature = "grpc-ingress")]
mod server;

#[cfg(feature = "grpc-uplink")]
pub use client::{GrpcUplinkError, GrpcUplinkOptions, run_uplink};
#[cfg(feature = "grpc-ingress")]
pub use server::{GrpcServerOptions, serve};

/// Default interval of HTTP/2 keepalive pings on both sides, 30 s: short enough to notice a
/// dead cellular link well within the 40 s lease duration, long enough to cost little.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(30);

/// Default time to wait for a keepalive ping's answer before closing the connection, 10 s.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
