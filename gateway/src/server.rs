//! The gateway server as the binary runs it: `main` parses the command line into
//! [`Settings`] and hands them, with a shutdown future, to [`Server`], which binds, reads
//! the site CA, waits for the Node and Lease watches to list, serves every ingress and
//! drains them all at shutdown (the shape of mini-redis's `server::run`). The end-to-end
//! tests start their replicas through the same [`Server`].
//!
//! [`Server::start`] runs in named phases (`server/phases.rs`), each of which can stop
//! the start: observe (`/healthz` at once), clients, enrollment, message path, first
//! list, ingresses. What goes wrong is a [`StartError`], or once serving a [`ServeError`].

use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::admission::Posture;
use crate::apiserver::requests::RequestMetrics;
use crate::enrollment::Enrollment;
use crate::message_path::Gateway;
use crate::settings::{Settings, posture};

mod error;
mod phases;
mod startup;
pub use error::{ServeError, StartError};
use phases::Starting;

/// One gateway replica: its settings checked and its listeners bound ([`Server::bind`]),
/// then run until shutdown ([`Server::run`], or [`Server::start`] and [`Running::wait`]).
#[derive(Debug)]
pub struct Server {
    settings: Settings,
    posture: Posture,
    listeners: Listeners,
}

/// The sockets a [`Server`] serves on, bound before it starts.
#[derive(Debug)]
pub struct Listeners {
    /// `/healthz`, `/readyz` and `/metrics`.
    pub metrics: TcpListener,
    /// The gRPC ingress (with [`Settings::grpc`]).
    pub grpc: Option<TcpListener>,
    /// The gRPC enrollment listener (with [`Settings::grpc_enrollment`]).
    pub grpc_enrollment: Option<TcpListener>,
    /// The resource metrics server (with [`Settings::resource_metrics`]).
    pub resource_metrics: Option<TcpListener>,
}

/// Binds `addr` for `flag`.
///
/// Errors: [`StartError::Bind`], naming the flag and the address.
async fn bind(flag: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { flag, addr, source })
}

impl Server {
    /// Decides the security posture of `settings` and binds every listener they name, so
    /// that a port in use stops the gateway at once and `/healthz` answers from the first
    /// second of [`Server::run`], whatever the apiserver does (a gateway restarted during
    /// an apiserver outage must not be killed by its liveness probe while it waits).
    ///
    /// # Errors
    /// [`StartError::Settings`]: no ingress, or an ingress that lets unidentified agents in
    /// without `--allow-unidentified-agents`; [`StartError::Bind`]: a listener that cannot
    /// be bound. Each names the flag that fixes it.
    pub async fn bind(settings: Settings) -> Result<Self, StartError> {
        let metrics = bind("--metrics-listen", settings.metrics_listen).await?;
        let grpc = match &settings.grpc {
            Some(grpc) => Some(bind("--grpc-listen", grpc.listen).await?),
            None => None,
        };
        let grpc_enrollment = match &settings.grpc_enrollment {
            Some((addr, _)) => Some(bind("--grpc-enrollment-listen", *addr).await?),
            None => None,
        };
        let resource_metrics = match &settings.resource_metrics {
            Some(served) => Some(bind("--resource-metrics-listen", served.listen).await?),
            None => None,
        };
        Self::with_listeners(
            settings,
            Listeners {
                metrics,
                grpc,
                grpc_enrollment,
                resource_metrics,
            },
        )
    }

    /// As [`Server::bind`], on listeners bound already (a test's port 0, or a port kept
    /// across a restart); the addresses in `settings` are not used.
    ///
    /// # Errors
    /// As [`Server::bind`], or a listener missing for an ingress of `settings` (or one
    /// given for an ingress it lacks): [`StartError::GrpcListenerMismatch`],
    /// [`StartError::GrpcEnrollmentListenerMismatch`],
    /// [`StartError::ResourceMetricsListenerMismatch`].
    pub fn with_listeners(settings: Settings, listeners: Listeners) -> Result<Self, StartError> {
        let posture = posture(
            settings.allow_unidentified_agents,
            settings.grpc.as_ref(),
            settings.mqtt.as_ref(),
        )?;
        if settings.grpc.is_some() != listeners.grpc.is_some() {
            return Err(StartError::GrpcListenerMismatch);
        }
        if settings.grpc_enrollment.is_some() != listeners.grpc_enrollment.is_some() {
            return Err(StartError::GrpcEnrollmentListenerMismatch);
        }
        if settings.resource_metrics.is_some() != listeners.resource_metrics.is_some() {
            return Err(StartError::ResourceMetricsListenerMismatch);
        }
        if settings.gateway.impersonate_nodes && posture == Posture::AllowUnidentified {
            // Impersonation says who a request is for; only authentication says who sent it.
            tracing::warn!(
                "--impersonate-nodes with --allow-unidentified-agents: unidentified agents are authorized by the apiserver as whichever node they claim"
            );
        }
        Ok(Self {
            settings,
            posture,
            listeners,
        })
    }

    /// The address `/healthz`, `/readyz` and `/metrics` are served on.
    ///
    /// # Errors
    /// The socket's address cannot be read (as [`TcpListener::local_addr`]).
    pub fn metrics_addr(&self) -> std::io::Result<SocketAddr> {
        self.listeners.metrics.local_addr()
    }

    /// Serves until `shutdown` resolves or an ingress fails: [`Server::start`], then
    /// [`Running::wait`].
    ///
    /// # Errors
    /// As [`Server::start`] ([`ServeError::Start`]) and [`Running::wait`].
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        match self.start(shutdown).await? {
            Some(running) => running.wait().await,
            None => Ok(()),
        }
    }

    /// Starts serving, in phases: `/healthz`, `/readyz` (which says what the start waits
    /// for) and `/metrics` at once (observe); then the apiserver clients (clients), the
    /// site CA under enrollment, read again after apiserver errors (enrollment), the
    /// per-message path and its metrics (message path), the Node and Lease watches, which
    /// serving waits for up to 30 s (first list), and every ingress (ingresses). Returns
    /// once the ingresses are spawned, or `None` when `shutdown` came first (everything
    /// stopped).
    ///
    /// # Errors
    /// [`StartError`]: apiserver clients that cannot be built, a site CA that cannot be
    /// used, settings an ingress cannot use, or a listener whose address cannot be read.
    pub async fn start(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<Option<Running>, StartError> {
        let Self {
            settings,
            posture,
            listeners,
        } = self;
        let Listeners {
            metrics,
            grpc,
            grpc_enrollment,
            resource_metrics,
        } = listeners;
        let mut starting = Starting::observe(metrics, shutdown)?;
        let (clients, watches) = starting.clients(&settings)?;
        let clock: Arc<dyn edgebeat_hw::Clock> = Arc::new(edgebeat_hw::SystemClock);
        let enrolling = settings.enrollment.clone();
        let ControlFlow::Continue(enrollment) = starting
            .enrollment(enrolling, &clients.client, clock.clone())
            .await?
        else {
            return starting.stopped().await;
        };
        let path = starting.message_path(
            &settings,
            posture,
            &clients,
            clock,
            enrollment,
            resource_metrics.as_ref(),
        )?;
        let ControlFlow::Continue(listed) = starting.first_list(&path.gateway, watches).await
        else {
            return starting.stopped().await;
        };
        let listeners = phases::IngressListeners {
            grpc,
            grpc_enrollment,
            resource_metrics,
        };
        starting
            .ingresses(settings, listeners, path, clients, listed)
            .map(Some)
    }
}

/// A started [`Server`]: its parts, for a test to look at, and [`Running::wait`].
pub struct Running {
    /// The per-message path; its tasks are in `ingresses` and `background`.
    gateway: Arc<Gateway>,
    /// The enrollment side, under enrollment.
    enrollment: Option<Arc<Enrollment>>,
    /// Both apiserver clients' requests, for `/metrics`.
    requests: RequestMetrics,
    /// Whether the broker granted the shared subscription (with MQTT).
    mqtt_subscribed: Option<tokio::sync::watch::Receiver<bool>>,
    /// Every ingress: awaited to its end at shutdown, so that each drains.
    ingresses: JoinSet<(&'static str, Result<(), IngressError>)>,
    /// The shutdown watcher, the watches and the apiserver reachability reports: aborted
    /// once the ingresses have drained (nothing there needs a clean end).
    background: JoinSet<()>,
    /// Cancelled by the shutdown future or the first ingress to end: tells every task to
    /// stop.
    stop: CancellationToken,
    /// The health and metrics server: stopped last, so `/readyz` says "shutting down"
    /// while the ingresses drain.
    observe: Observe,
}

impl Running {
    /// The per-message path, its counters and view.
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// The enrollment side, under enrollment.
    pub fn enrollment(&self) -> Option<&Arc<Enrollment>> {
        self.enrollment.as_ref()
    }

    /// The apiserver requests of both clients, as `/metrics` exports them.
    pub fn requests(&self) -> &RequestMetrics {
        &self.requests
    }

    /// Whether the broker has granted the shared subscription (with MQTT): `true` once it
    /// has, `false` again while reconnecting.
    pub fn mqtt_subscribed(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.mqtt_subscribed.clone()
    }

    /// Serves until shutdown or the first ingress to end, then stops the others and awaits
    /// every one (each drains), and the health server last. Dropping a `Running` instead
    /// aborts every task of the replica where it stands, as `kill -9` would.
    ///
    /// # Errors
    /// The first ingress error ([`ServeError::Ingress`]) or panic
    /// ([`ServeError::IngressPanicked`]), named by its ingress; the others are logged.
    /// [`ServeError::ObservePanicked`] when the health server's task panicked.
    pub async fn wait(self) -> Result<(), ServeError> {
        let Self {
            ingresses,
            background,
            stop,
            observe,
            ..
        } = self;
        let drained = drain(ingresses, &stop).await;
        observe
            .stopped()
            .await
            .map_err(ServeError::ObservePanicked)?;
        drop(background);
        drained
    }
}

/// The health and metrics server's task and how to stop it.
#[derive(Debug)]
struct Observe {
    stop: CancellationToken,
    /// Aborted when dropped, as every other task of the replica: a dropped [`Running`]
    /// (a killed replica) stops answering `/healthz` too.
    task: tokio_util::task::AbortOnDropHandle<std::io::Result<()>>,
}

impl Observe {
    /// Stops the health and metrics server last (after the ingresses, so `/readyz`
    /// answered "shutting down" while they drained) and waits for it.
    ///
    /// Errors: the server task panicked.
    async fn stopped(self) -> Result<(), tokio::task::JoinError> {
        self.stop.cancel();
        if let Err(error) = self.task.await? {
            tracing::warn!(%error, "observe server failed");
        }
        Ok(())
    }
}

/// Waits for the first ingress of `ingresses` to end, cancels `stop` so that the others
/// end too, and awaits every one of them (with none, waits for `stop`).
///
/// Errors: the first ingress error ([`ServeError::Ingress`]) or panic
/// ([`ServeError::IngressPanicked`]), named by its ingress; the others are logged.
async fn drain(
    mut ingresses: tokio::task::JoinSet<(&'static str, Result<(), IngressError>)>,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<(), ServeError> {
    if ingresses.is_empty() {
        stop.cancelled().await;
    }
    let mut first: Option<ServeError> = None;
    while let Some(ended) = ingresses.join_next().await {
        stop.cancel();
        let error = match ended {
            Ok((_, Ok(()))) => continue,
            Ok((ingress, Err(source))) => ServeError::Ingress { ingress, source },
            Err(panicked) => ServeError::IngressPanicked(panicked),
        };
        if first.is_some() {
            tracing::error!(
                error = edgebeat_transports::observe::error_report(&error),
                "ingress failed while stopping"
            );
        } else {
            first = Some(error);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Spawns the ingress `name` into `ingresses`: it ends, named, with what `served` returns.
fn spawn_ingress<E: Into<IngressError>>(
    ingresses: &mut JoinSet<(&'static str, Result<(), IngressError>)>,
    name: &'static str,
    served: impl Future<Output = Result<(), E>> + Send + 'static,
) {
    ingresses.spawn(async move { (name, served.await.map_err(Into::into)) });
}

/// What ends an ingress with an error: each ingress's own error type
/// ([`edgebeat_transports::grpc::GrpcServeError`],
/// [`edgebeat_transports::mqtt::MqttIngressError`], an I/O error), boxed.
pub type IngressError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(test)]
#[path = "server/tests.rs"]
mod tests;
