//! Why the agent could not start or run: a leaf, so that every module can return it
//! without depending on the loops of [`crate::run`].

/// Why the agent could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Required host facts are unreadable (boot ID, MemTotal, CPU count).
    #[error("reading host facts: {0}")]
    Facts(#[from] edgebeat_hw::HwError),
    /// No node name configured and the hostname is unusable.
    #[error("node name: {0}; set nodeName in the configuration")]
    NodeName(String),
    /// `transport` is missing (required unless `--once`).
    #[error(
        "transport: required to run; add e.g. `transport: {{kind: grpc, endpoint: \"http://gateway:7443\"}}`"
    )]
    NoTransport,
    /// The gRPC uplink could not start (endpoint, TLS settings).
    #[cfg(feature = "grpc")]
    #[error("transport: {0}")]
    Grpc(#[source] edgebeat_transports::grpc::GrpcUplinkError),
    /// The MQTT uplink could not start (an option, TLS settings).
    #[cfg(feature = "mqtt")]
    #[error("transport: {0}")]
    Mqtt(#[source] edgebeat_transports::mqtt::MqttUplinkError),
    /// Managed node certificates cannot work: `certDir` unusable, or an issued certificate
    /// the transport cannot use.
    #[error("node certificates: {0}")]
    Certificates(String),
    /// The observe server could not bind `healthzBindAddress` (address in use, not local).
    #[error("healthzBindAddress: binding {addr}: {source}")]
    Healthz {
        /// The address configured.
        addr: std::net::SocketAddr,
        /// What binding it returned.
        #[source]
        source: std::io::Error,
    },
}
