//! gRPC transport: one long-lived bidirectional `Heartbeat.Connect` stream per agent, with
//! HTTP/2 keepalive pings so a dead link is noticed within `keepalive + timeout`.
//!
//! Plain HTTP/2 on `http://`, or TLS on `https://` (rustls on ring, module [`tls`]): the
//! agent verifies the gateway against a CA and may present a client certificate; a gateway
//! with a client CA requires one (mTLS) and reads the kubelet-style node identity
//! (CN=`system:node:<name>`, O=`system:nodes`) from it into
//! [`Peer::identity`](crate::ingress::Peer::identity).

use std::time::Duration;

#[cfg(feature = "grpc-uplink")]
mod client;
#[cfg(feature = "grpc-ingress")]
mod server;
/// TLS material and node identity (the crate's [`crate::tls`], kept here for gRPC users).
pub use crate::tls;

pub use crate::tls::{ClientTls, GrpcServerTls, TlsIdentity};
#[cfg(feature = "grpc-uplink")]
pub use client::{GrpcUplinkError, GrpcUplinkOptions, run_uplink};

pub mod enroll;
#[cfg(feature = "grpc-ingress")]
pub use server::{GrpcServeError, GrpcServerOptions, serve};

/// Default interval of HTTP/2 keepalive pings on both sides, 30 s: short enough to notice a
/// dead cellular link well within the 40 s lease duration, long enough to cost little.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(30);

/// Default time to wait for a keepalive ping's answer before closing the connection, 10 s.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest TLS handshake either side waits for, 10 s: a peer that stalls mid-handshake is
/// dropped instead of holding a socket.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
