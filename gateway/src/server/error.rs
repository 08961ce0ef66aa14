//! [`StartError`] (binding and starting a replica) and [`ServeError`] (what ends it once
//! started): one variant per problem, as kube-runtime's `watcher::Error`; each message
//! names the flag or part, and the cause follows as the error's source.

use std::net::SocketAddr;

use crate::enrollment::EnrollmentError;
use crate::settings::SettingsError;

use super::IngressError;

/// Why a replica did not start ([`super::Server::bind`], [`super::Server::with_listeners`],
/// [`super::Server::start`]).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The settings cannot be served: no ingress, an ingress that lets unidentified agents
    /// in without `--allow-unidentified-agents`, or MQTT settings that cannot be used once
    /// the site CA is read.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The listener of `flag` cannot be bound at `addr` (in use, or not an address of this
    /// host).
    #[error("binding {flag} {addr}")]
    Bind {
        /// The flag that names the address, e.g. `--grpc-listen`.
        flag: &'static str,
        /// The address given.
        addr: SocketAddr,
        /// Why it cannot be bound.
        #[source]
        source: std::io::Error,
    },
    /// A gRPC listener without [`crate::settings::Settings::grpc`], or those settings
    /// without a listener ([`super::Server::with_listeners`]).
    #[error("a gRPC listener without gRPC settings, or the other way round")]
    GrpcListenerMismatch,
    /// A gRPC enrollment listener without
    /// [`crate::settings::Settings::grpc_enrollment`], or the other way round.
    #[error("a gRPC enrollment listener without its settings, or the other way round")]
    GrpcEnrollmentListenerMismatch,
    /// A resource metrics listener without
    /// [`crate::settings::Settings::resource_metrics`], or the other way round.
    #[error("a resource metrics listener without its settings, or the other way round")]
    ResourceMetricsListenerMismatch,
    /// A bound listener's address cannot be read (as [`tokio::net::TcpListener::local_addr`]).
    #[error("reading the address of the {listener} listener")]
    ListenerAddress {
        /// Which listener: `metrics`, `gRPC`, `gRPC enrollment` or `resource metrics`.
        listener: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The apiserver clients cannot be built from the configuration (`--kubeconfig`,
    /// `--server`).
    #[error("building the apiserver client (--kubeconfig, --server)")]
    ApiserverClient(#[source] kube::Error),
    /// Under `--enrollment`, the site CA of the Secret edgebeat-site-ca cannot be used
    /// (its content: no retry mends it; apiserver errors are retried instead).
    #[error("--enrollment: the site CA (Secret edgebeat-site-ca)")]
    SiteCa(#[source] EnrollmentError),
    /// The health and metrics server's task panicked while the start stopped.
    #[error("observe task")]
    ObservePanicked(#[source] tokio::task::JoinError),
}

/// Why a replica stopped with an error ([`super::Server::run`],
/// [`super::Running::wait`]).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// It did not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The first ingress to fail, named (`gRPC`, `MQTT`, `gRPC enrollment`, `resource
    /// metrics`).
    #[error("{ingress} ingress")]
    Ingress {
        /// Which ingress.
        ingress: &'static str,
        /// What ended it.
        #[source]
        source: IngressError,
    },
    /// An ingress task panicked.
    #[error("an ingress task")]
    IngressPanicked(#[source] tokio::task::JoinError),
    /// The health and metrics server's task panicked.
    #[error("observe task")]
    ObservePanicked(#[source] tokio::task::JoinError),
}
