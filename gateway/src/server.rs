//! The gateway server as the binary runs it: `main` parses the command line into
//! [`Settings`] and hands them, with a shutdown future, to [`Server`], which binds, reads
//! the site CA, waits for the Node and Lease watches to list, serves every ingress and
//! drains them all at shutdown (the shape of mini-redis's `server::run`). The end-to-end
//! tests start their replicas through the same [`Server`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use edgebeat_transports::grpc::enroll::serve_enrollment;
use edgebeat_transports::grpc::serve;
use edgebeat_transports::mqtt::serve as mqtt_serve;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::apiserver::requests::RequestMetrics;
use crate::enrollment::{Enrollment, EnrollmentError, EnrollmentOptions};
use crate::resource_metrics::{self, ResourceMetricsCounters};
use crate::settings::{Settings, posture};
use crate::{Gateway, Posture, kube_client_with, watch_client_with};

mod startup;
use startup::{Startup, readiness};

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

impl Server {
    /// Decides the security posture of `settings` and binds every listener they name, so
    /// that a port in use stops the gateway at once and `/healthz` answers from the first
    /// second of [`Server::run`], whatever the apiserver does (a gateway restarted during
    /// an apiserver outage must not be killed by its liveness probe while it waits).
    ///
    /// # Errors
    /// No ingress, an ingress that lets unidentified agents in without
    /// `--allow-unidentified-agents`, or a listener that cannot be bound; each names the
    /// flag that fixes it.
    pub async fn bind(settings: Settings) -> anyhow::Result<Self> {
        let metrics = TcpListener::bind(settings.metrics_listen)
            .await
            .with_context(|| format!("binding --metrics-listen {}", settings.metrics_listen))?;
        let grpc = match &settings.grpc {
            Some(grpc) => Some(
                TcpListener::bind(grpc.listen)
                    .await
                    .with_context(|| format!("binding --grpc-listen {}", grpc.listen))?,
            ),
            None => None,
        };
        let grpc_enrollment = match &settings.grpc_enrollment {
            Some((addr, _)) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding --grpc-enrollment-listen {addr}"))?,
            ),
            None => None,
        };
        let resource_metrics = match &settings.resource_metrics {
            Some(served) => {
                Some(TcpListener::bind(served.listen).await.with_context(|| {
                    format!("binding --resource-metrics-listen {}", served.listen)
                })?)
            }
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
    /// As [`Server::bind`], or a listener missing for an ingress of `settings`.
    pub fn with_listeners(settings: Settings, listeners: Listeners) -> anyhow::Result<Self> {
        let posture = posture(
            settings.allow_unidentified_agents,
            settings.grpc.as_ref(),
            settings.mqtt.as_ref(),
        )?;
        anyhow::ensure!(
            settings.grpc.is_some() == listeners.grpc.is_some(),
            "a gRPC listener without gRPC settings, or the other way round"
        );
        anyhow::ensure!(
            settings.grpc_enrollment.is_some() == listeners.grpc_enrollment.is_some(),
            "a gRPC enrollment listener without its settings, or the other way round"
        );
        anyhow::ensure!(
            settings.resource_metrics.is_some() == listeners.resource_metrics.is_some(),
            "a resource metrics listener without its settings, or the other way round"
        );
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
    /// As [`Server::start`] and [`Running::wait`].
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        match self.start(shutdown).await? {
            Some(running) => running.wait().await,
            None => Ok(()),
        }
    }

    /// Starts serving: `/healthz`, `/readyz` (which says what the start waits for) and
    /// `/metrics` at once; then the apiserver clients, the site CA under enrollment (read
    /// again after apiserver errors), the Node and Lease watches (serving starts once they
    /// listed, or after 30 s), and every ingress. Returns once the ingresses are spawned,
    /// or `None` when `shutdown` came first (everything stopped).
    ///
    /// # Errors
    /// Apiserver clients that cannot be built, a site CA that cannot be used, or settings
    /// an ingress cannot use.
    pub async fn start(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<Option<Running>> {
        let Self {
            settings,
            posture,
            listeners,
        } = self;
        tracing::info!(addr = %listeners.metrics.local_addr()?, "serving /healthz, /readyz and /metrics");
        let stop = CancellationToken::new();
        // Every task of the replica: aborted with it when it is dropped.
        let mut background = JoinSet::new();
        background.spawn({
            let signal = stop.clone();
            async move {
                shutdown.await;
                signal.cancel();
            }
        });
        let metrics = Arc::new(std::sync::OnceLock::new());
        let startup = Arc::new(Startup::new("reading the apiserver configuration"));
        // Stops after the ingresses, so /readyz answers "shutting down" while they drain.
        let observe_stop = CancellationToken::new();
        let observe = tokio::spawn(edgebeat_transports::observe::serve(
            listeners.metrics,
            metrics.clone(),
            {
                let startup = startup.clone();
                move || startup.ready()
            },
            observe_stop.clone().cancelled_owned(),
        ));
        let observe = Observe {
            stop: observe_stop,
            task: tokio_util::task::AbortOnDropHandle::new(observe),
        };
        let apiserver_url = settings.kube.cluster_url.clone();
        // Both clients' requests, in edgebeat_gateway_apiserver_request_duration_seconds.
        let requests = RequestMetrics::default();
        let watches = watch_client_with(settings.kube.clone(), &requests, settings.apiserver_http)?;
        let client = kube_client_with(
            settings.kube,
            settings.qps,
            &requests,
            settings.apiserver_http,
        )?;
        let reachability = crate::apiserver::reach::report_reachability(
            client.clone(),
            apiserver_url.clone(),
            stop.clone(),
        );
        background.spawn(async move {
            reachability.await;
        });
        let clock: Arc<dyn edgebeat_hw::Clock> = Arc::new(edgebeat_hw::SystemClock);
        let enrollment = match settings.enrollment {
            Some(options) => {
                let (namespace, approval, lifetime) = (
                    options.namespace.clone(),
                    options.approval,
                    options.lifetime,
                );
                startup.phase("reading the site CA (Secret edgebeat-site-ca)");
                let Some(enrollment) =
                    site_ca_enrollment(client.clone(), options, clock.clone(), &stop).await?
                else {
                    observe.stopped().await?;
                    return Ok(None);
                };
                tracing::info!(
                    %namespace,
                    ?approval,
                    ?lifetime,
                    "enrolling and rotating node certificates"
                );
                Some(Arc::new(enrollment))
            }
            None => None,
        };
        let grpc_options = settings
            .grpc
            .as_ref()
            .map(|grpc| grpc.server_options(enrollment.as_ref()));
        let mqtt_options = match &settings.mqtt {
            Some(mqtt) => Some(mqtt.ingress_options(enrollment.as_deref())?),
            None => None,
        };
        let mut options = crate::GatewayOptions {
            posture,
            apiserver_url: Some(apiserver_url.clone()),
            ..settings.gateway
        };
        // Unless --resource-metrics-address names a port (a Service's), the port nodes name
        // is the one bound (a test's port 0 included).
        if let (Some(endpoint), Some(listener)) =
            (&mut options.resource_metrics, &listeners.resource_metrics)
            && endpoint.port == 0
        {
            endpoint.port = listener.local_addr()?.port();
        }
        let gateway = Arc::new(Gateway::new(client.clone(), clock, options));
        if let Some(enrollment) = &enrollment {
            gateway.enable_enrollment(enrollment.clone());
        }
        let mut registry = prometheus_client::registry::Registry::default();
        gateway.register_metrics(&mut registry);
        requests.register(&mut registry);
        let resource_metrics_counters = Arc::new(ResourceMetricsCounters::default());
        if settings.resource_metrics.is_some() {
            resource_metrics_counters.register(&mut registry);
        }
        registry.register_collector(Box::new(edgebeat_transports::observe::ProcessCollector));
        // Set once: the cell was empty until now.
        let _ = metrics.set(registry);
        startup.phase(
            "listing the managed Nodes and Leases (is the apiserver reachable? see the log)",
        );
        // What the apiserver holds for the managed Nodes and Leases (see crate::view).
        background.spawn(gateway.watch(watches));
        let listed = Arc::new(AtomicBool::new(false));
        background.spawn({
            let (view, listed) = (gateway.view().clone(), listed.clone());
            async move {
                view.synced().await;
                listed.store(true, Ordering::Relaxed);
            }
        });
        // Serving starts once the watches have listed, so that the first messages (and the
        // broker's retained certificates) meet the cluster's record of every node: which
        // certificate each speaks with. A watch that cannot list (RBAC) delays the start by
        // at most VIEW_SYNC_TIMEOUT; /readyz waits for the list either way.
        let synced = tokio::time::timeout(VIEW_SYNC_TIMEOUT, gateway.view().synced());
        match stop.run_until_cancelled(synced).await {
            None => {
                observe.stopped().await?;
                return Ok(None);
            }
            Some(Ok(())) => {}
            Some(Err(_)) => tracing::warn!(
                timeout = ?VIEW_SYNC_TIMEOUT,
                "the Node and Lease watches have not listed; serving without the cluster's record of node certificates until they do"
            ),
        }
        let grpc_serving = Arc::new(AtomicBool::new(false));
        let serves_grpc = grpc_options.is_some();
        let mut mqtt_subscribed = None;
        // Every ingress is a task of one set: the first to end (an error, or the shutdown
        // signal) stops the others, and every one is awaited to its end, so that each drains
        // (the MQTT ingress sends its DISCONNECT) before the process exits.
        let mut ingresses: JoinSet<(&'static str, anyhow::Result<()>)> = JoinSet::new();
        if let Some(mut options) = mqtt_options {
            let (subscribed, watch) = tokio::sync::watch::channel(false);
            options.subscribed = Some(Arc::new(subscribed));
            options.sessions_taken_over = Some(gateway.mqtt_sessions_taken_over());
            mqtt_subscribed = Some(watch);
            // Replicas tell each other the samples they admit, so that each serves every
            // node's resource metrics (a shared subscription splits a node's renewals).
            if settings.resource_metrics.is_some() {
                options.usage_sharing = Some(gateway.share_usage());
            }
            tracing::info!(
                broker = %options.host,
                tls = options.tls.is_some(),
                signatures = ?options.signatures.as_ref().map(|s| if s.required { "required" } else { "verified when present" }),
                usage_sharing = options.usage_sharing.is_some(),
                "taking heartbeats from MQTT"
            );
            let served = mqtt_serve(options, gateway.clone(), stop.clone().cancelled_owned());
            spawn_ingress(&mut ingresses, "MQTT", served);
        }
        if let (Some(listener), Some((_, options))) =
            (listeners.grpc_enrollment, settings.grpc_enrollment)
        {
            tracing::info!(addr = %listener.local_addr()?, "gRPC enrollment listening");
            let until = stop.clone().cancelled_owned();
            let served = serve_enrollment(listener, gateway.clone(), options, until);
            spawn_ingress(&mut ingresses, "gRPC enrollment", served);
        }
        if let (Some(listener), Some(options)) = (listeners.grpc, grpc_options) {
            tracing::info!(addr = %listener.local_addr()?, "gRPC listening");
            let serving = grpc_serving.clone();
            let served = serve(
                listener,
                gateway.clone(),
                options,
                stop.clone().cancelled_owned(),
            );
            // The listener is bound and tonic accepts from the moment it is polled.
            spawn_ingress(&mut ingresses, "gRPC", async move {
                serving.store(true, Ordering::Relaxed);
                let result = served.await;
                serving.store(false, Ordering::Relaxed);
                result
            });
        }
        if let (Some(listener), Some(served)) =
            (listeners.resource_metrics, settings.resource_metrics)
        {
            tracing::info!(addr = %listener.local_addr()?, "serving resource metrics");
            let served = resource_metrics::serve(
                listener,
                served.options,
                gateway.resource_samples(),
                client.clone(),
                resource_metrics_counters,
                stop.clone().cancelled_owned(),
            );
            spawn_ingress(&mut ingresses, "resource metrics", served);
        }
        startup.started(readiness(
            stop.clone(),
            serves_grpc.then(|| grpc_serving.clone()),
            mqtt_subscribed.clone(),
            listed,
        ));
        Ok(Some(Running {
            gateway,
            enrollment,
            requests,
            mqtt_subscribed,
            ingresses,
            background,
            stop,
            observe,
        }))
    }
}

/// A started [`Server`]: its parts, for a test to look at, and [`Running::wait`].
pub struct Running {
    gateway: Arc<Gateway>,
    enrollment: Option<Arc<Enrollment>>,
    requests: RequestMetrics,
    mqtt_subscribed: Option<tokio::sync::watch::Receiver<bool>>,
    ingresses: JoinSet<(&'static str, anyhow::Result<()>)>,
    background: JoinSet<()>,
    stop: CancellationToken,
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
    /// The first ingress error (or panic), named by its ingress; the others are logged.
    pub async fn wait(self) -> anyhow::Result<()> {
        let Self {
            ingresses,
            background,
            stop,
            observe,
            ..
        } = self;
        let drained = drain(ingresses, &stop).await;
        observe.stopped().await?;
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
    async fn stopped(self) -> anyhow::Result<()> {
        self.stop.cancel();
        if let Err(error) = self.task.await.context("observe task")? {
            tracing::warn!(%error, "observe server failed");
        }
        Ok(())
    }
}

/// Waits for the first ingress of `ingresses` to end, cancels `stop` so that the others
/// end too, and awaits every one of them (with none, waits for `stop`).
///
/// Errors: the first ingress error (or panic), named by its ingress; the others are logged.
async fn drain(
    mut ingresses: tokio::task::JoinSet<(&'static str, anyhow::Result<()>)>,
    stop: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    if ingresses.is_empty() {
        stop.cancelled().await;
    }
    let mut first: Option<anyhow::Error> = None;
    while let Some(ended) = ingresses.join_next().await {
        stop.cancel();
        let error = match ended {
            Ok((_, Ok(()))) => continue,
            Ok((ingress, Err(error))) => error.context(format!("{ingress} ingress")),
            Err(panicked) => anyhow::Error::from(panicked).context("an ingress task"),
        };
        if first.is_some() {
            tracing::error!(
                error = format!("{error:#}"),
                "ingress failed while stopping"
            );
        } else {
            first = Some(error);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Longest wait at start for the Node and Lease watches to list before serving.
const VIEW_SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// First and longest wait before reading the site CA again after an apiserver error.
const SITE_CA_RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));

/// The enrollment side with the site CA of the Secret edgebeat-site-ca
/// ([`Enrollment::with_site_ca`]), read again after every apiserver error (logged as an
/// error, 1 s doubling to 30 s apart) until it is read or `stop` is cancelled (`None`).
///
/// Errors: a site CA that cannot be used (the Secret's content), which no retry mends.
async fn site_ca_enrollment(
    client: kube::Client,
    options: EnrollmentOptions,
    clock: Arc<dyn edgebeat_hw::Clock>,
    stop: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<Option<Enrollment>> {
    let mut wait = SITE_CA_RETRY.0;
    loop {
        let reading = Enrollment::with_site_ca(client.clone(), options.clone(), clock.clone());
        match stop.run_until_cancelled(reading).await {
            None => return Ok(None),
            Some(Ok(enrollment)) => return Ok(Some(enrollment)),
            Some(Err(EnrollmentError::Apiserver(error))) => tracing::error!(
                error = %edgebeat_transports::observe::error_report(&error),
                retry_in = ?wait,
                "--enrollment: cannot read the site CA (Secret edgebeat-site-ca) from the apiserver"
            ),
            Some(Err(error)) => {
                return Err(error).context("--enrollment: the site CA (Secret edgebeat-site-ca)");
            }
        }
        if stop
            .run_until_cancelled(tokio::time::sleep(wait))
            .await
            .is_none()
        {
            return Ok(None);
        }
        wait = (wait * 2).min(SITE_CA_RETRY.1);
    }
}

/// Spawns the ingress `name` into `ingresses`: it ends, named, with what `served` returns.
fn spawn_ingress<E: Into<anyhow::Error>>(
    ingresses: &mut JoinSet<(&'static str, anyhow::Result<()>)>,
    name: &'static str,
    served: impl Future<Output = Result<(), E>> + Send + 'static,
) {
    ingresses.spawn(async move { (name, served.await.map_err(Into::into)) });
}

#[cfg(test)]
#[path = "server/tests.rs"]
mod tests;
