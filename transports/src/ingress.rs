//! The gateway's side of every transport: where a message came from, and the handler that
//! answers it.

use std::future::Future;
use std::net::SocketAddr;

use edgebeat_proto::{Ack, AgentMessage};

/// Which transport carried a message (a metric label and log field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// The gRPC `Heartbeat.Connect` stream.
    Grpc,
    /// MQTT through a broker.
    Mqtt,
}

impl TransportKind {
    /// Lower-case name: `grpc` or `mqtt`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::Mqtt => "mqtt",
        }
    }
}

/// Where a message came from, as far as the transport knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Transport that carried it.
    pub transport: TransportKind,
    /// Remote socket address (gRPC) or `None` (MQTT: the broker is the socket peer).
    pub remote: Option<SocketAddr>,
    /// Node name the transport authenticated (mTLS `system:node:<name>`), when it did.
    /// `None` means "unauthenticated"; the gateway decides whether that is allowed.
    pub identity: Option<String>,
}

/// Answers agent messages. Implemented by the gateway; transports call it.
pub trait Handler: Send + Sync + 'static {
    /// Handles one decoded message from `peer` and returns the [`Ack`] to send back.
    /// Messages of one connection are handled in order, one at a time.
    fn handle(&self, peer: &Peer, message: AgentMessage) -> impl Future<Output = Ack> + Send;

    /// Called when bytes from `peer` could not be decoded (malformed, oversized); the
    /// transport drops them and keeps serving. `reason` is short, for logs and metrics.
    fn rejected(&self, peer: &Peer, reason: &str);
}
