//! The phases of [`super::Server::start`], in their order: observe (`/healthz`,
//! `/readyz` and `/metrics` at once), clients (the apiserver's), enrollment (the site
//! CA), message path (the [`Gateway`] and its metrics), first list (the Node and Lease
//! watches) and ingresses. [`Starting`] carries what every phase shares; a phase that
//! waits ends with [`ControlFlow::Break`] when the shutdown comes first, and the start
//! then stops ([`Starting::stopped`]).

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use edgebeat_transports::grpc::GrpcServerOptions;
use edgebeat_transports::grpc::enroll::serve_enrollment;
use edgebeat_transports::grpc::serve;
use edgebeat_transports::mqtt::{MqttIngressOptions, serve as mqtt_serve};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::startup::{Startup, readiness};
use super::{IngressError, Observe, Running, StartError, spawn_ingress};
use crate::admission::Posture;
use crate::apiserver::requests::RequestMetrics;
use crate::apiserver::{kube_client_with, watch_client_with};
use crate::enrollment::{Enrollment, EnrollmentError, EnrollmentOptions};
use crate::message_path::{Gateway, GatewayOptions};
use crate::resource_metrics::{self, ResourceMetricsCounters};
use crate::settings::Settings;

/// Longest wait at start for the Node and Lease watches to list before serving.
const VIEW_SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// First and longest wait before reading the site CA again after an apiserver error.
const SITE_CA_RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));

/// The ingresses of one replica, as a set: each ends, named, with its result.
type Ingresses = JoinSet<(&'static str, Result<(), IngressError>)>;

/// A replica between its phases: what each part does at shutdown.
pub(super) struct Starting {
    /// Cancelled by the shutdown future: every phase that waits stops at it, and once
    /// serving every ingress and background task does.
    stop: CancellationToken,
    /// The shutdown watcher, the apiserver reachability reports and the watches: aborted
    /// when dropped (a start that stops, or a [`Running`] once its ingresses drained).
    background: JoinSet<()>,
    /// What `/readyz` says: the phase waited for, then [`readiness`].
    startup: Arc<Startup>,
    /// The registry `/metrics` serves, set once by [`Starting::message_path`].
    metrics: Arc<OnceLock<Registry>>,
    /// The health and metrics server: stopped last, after everything else.
    observe: Observe,
}

/// The apiserver clients ([`Starting::clients`]).
pub(super) struct Clients {
    /// The apiserver's URL, as nodes are told and reachability is reported.
    apiserver_url: http::Uri,
    /// Both clients' requests, in `edgebeat_gateway_apiserver_request_duration_seconds`.
    pub(super) requests: RequestMetrics,
    /// The writes' client (rate limited by `--qps`).
    pub(super) client: kube::Client,
}

/// The per-message path and what its ingresses take ([`Starting::message_path`]).
pub(super) struct MessagePath {
    /// Admission and the writer, shared by every ingress.
    pub(super) gateway: Arc<Gateway>,
    /// The enrollment side, under `--enrollment`.
    enrollment: Option<Arc<Enrollment>>,
    /// The gRPC server's options, with the site CA's part (with gRPC).
    grpc: Option<GrpcServerOptions>,
    /// The MQTT ingress's options, with the site CA's part (with MQTT).
    mqtt: Option<MqttIngressOptions>,
    /// The resource metrics server's counters (registered with it only).
    resource_metrics_counters: Arc<ResourceMetricsCounters>,
}

/// The listeners the ingresses serve on (the metrics one is observe's).
pub(super) struct IngressListeners {
    /// With [`Settings::grpc`].
    pub(super) grpc: Option<TcpListener>,
    /// With [`Settings::grpc_enrollment`].
    pub(super) grpc_enrollment: Option<TcpListener>,
    /// With [`Settings::resource_metrics`].
    pub(super) resource_metrics: Option<TcpListener>,
}

/// [`StartError::ListenerAddress`] of `listener`.
fn listener_address(listener: &'static str) -> impl FnOnce(std::io::Error) -> StartError {
    move |source| StartError::ListenerAddress { listener, source }
}

impl Starting {
    /// Phase observe: serves `/healthz`, `/readyz` ("starting: " and the phase) and
    /// `/metrics` (empty until the message path) on `listener` at once, and spawns the
    /// task that turns `shutdown` into the stop of every phase.
    ///
    /// Errors: [`StartError::ListenerAddress`].
    pub(super) fn observe(
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Self, StartError> {
        let addr = listener.local_addr().map_err(listener_address("metrics"))?;
        tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
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
        let metrics = Arc::new(OnceLock::new());
        let startup = Arc::new(Startup::new("reading the apiserver configuration"));
        // Stops after the ingresses, so /readyz answers "shutting down" while they drain.
        let observe_stop = CancellationToken::new();
        let task = tokio::spawn(edgebeat_transports::observe::serve(
            listener,
            metrics.clone(),
            {
                let startup = startup.clone();
                move || startup.ready()
            },
            observe_stop.clone().cancelled_owned(),
        ));
        let observe = Observe {
            stop: observe_stop,
            task: tokio_util::task::AbortOnDropHandle::new(task),
        };
        Ok(Self {
            stop,
            background,
            startup,
            metrics,
            observe,
        })
    }

    /// Phase clients: the watches' client and the writes' client of `settings`, both
    /// counted in one [`RequestMetrics`], and the apiserver's reachability reported from
    /// now on (an ERROR line naming the URL and the cause while it cannot be reached).
    ///
    /// Errors: [`StartError::ApiserverClient`].
    pub(super) fn clients(
        &mut self,
        settings: &Settings,
    ) -> Result<(Clients, kube::Client), StartError> {
        let apiserver_url = settings.kube.cluster_url.clone();
        // Both clients' requests, in edgebeat_gateway_apiserver_request_duration_seconds.
        let requests = RequestMetrics::default();
        let watches = watch_client_with(settings.kube.clone(), &requests, settings.apiserver_http)
            .map_err(StartError::ApiserverClient)?;
        let client = kube_client_with(
            settings.kube.clone(),
            settings.qps,
            &requests,
            settings.apiserver_http,
        )
        .map_err(StartError::ApiserverClient)?;
        let reachability = crate::apiserver::reach::report_reachability(
            client.clone(),
            apiserver_url.clone(),
            self.stop.clone(),
        );
        self.background.spawn(async move {
            reachability.await;
        });
        let clients = Clients {
            apiserver_url,
            requests,
            client,
        };
        Ok((clients, watches))
    }

    /// Phase enrollment (under `--enrollment`, else `None` at once): the site CA read,
    /// again after each apiserver error ([`site_ca_enrollment`]), and logged.
    ///
    /// Errors: [`StartError::SiteCa`], a site CA that cannot be used.
    pub(super) async fn enrollment(
        &self,
        options: Option<EnrollmentOptions>,
        client: &kube::Client,
        clock: Arc<dyn edgebeat_hw::Clock>,
    ) -> Result<ControlFlow<(), Option<Arc<Enrollment>>>, StartError> {
        let Some(options) = options else {
            return Ok(ControlFlow::Continue(None));
        };
        let (namespace, approval, lifetime) = (
            options.namespace.clone(),
            options.approval,
            options.lifetime,
        );
        self.startup
            .phase("reading the site CA (Secret edgebeat-site-ca)");
        let Some(enrollment) =
            site_ca_enrollment(client.clone(), options, clock, &self.stop).await?
        else {
            return Ok(ControlFlow::Break(()));
        };
        tracing::info!(
            %namespace,
            ?approval,
            ?lifetime,
            "enrolling and rotating node certificates"
        );
        Ok(ControlFlow::Continue(Some(Arc::new(enrollment))))
    }

    /// Phase message path: each ingress's options with the site CA's part, the
    /// [`Gateway`] with the options of `settings` and `posture` (the resource metrics
    /// port, unless given, the one `resource_metrics` is bound to), and every metric
    /// registered for `/metrics`.
    ///
    /// Errors: [`StartError::Settings`] (MQTT node CAs that cannot be used),
    /// [`StartError::ListenerAddress`].
    pub(super) fn message_path(
        &self,
        settings: &Settings,
        posture: Posture,
        clients: &Clients,
        clock: Arc<dyn edgebeat_hw::Clock>,
        enrollment: Option<Arc<Enrollment>>,
        resource_metrics: Option<&TcpListener>,
    ) -> Result<MessagePath, StartError> {
        let grpc = settings
            .grpc
            .as_ref()
            .map(|grpc| grpc.server_options(enrollment.as_ref()));
        let mqtt = match &settings.mqtt {
            Some(mqtt) => Some(mqtt.ingress_options(enrollment.as_deref())?),
            None => None,
        };
        let mut options = GatewayOptions {
            posture,
            apiserver_url: Some(clients.apiserver_url.clone()),
            ..settings.gateway.clone()
        };
        // Unless --resource-metrics-address names a port (a Service's), the port nodes name
        // is the one bound (a test's port 0 included).
        if let (Some(endpoint), Some(listener)) = (&mut options.resource_metrics, resource_metrics)
            && endpoint.port == 0
        {
            endpoint.port = listener
                .local_addr()
                .map_err(listener_address("resource metrics"))?
                .port();
        }
        let gateway = Arc::new(Gateway::new(clients.client.clone(), clock, options));
        if let Some(enrollment) = &enrollment {
            gateway.enable_enrollment(enrollment.clone());
        }
        let resource_metrics_counters = Arc::new(ResourceMetricsCounters::default());
        let served_counters = settings
            .resource_metrics
            .is_some()
            .then_some(&resource_metrics_counters);
        self.register_metrics(&gateway, &clients.requests, served_counters);
        Ok(MessagePath {
            gateway,
            enrollment,
            grpc,
            mqtt,
            resource_metrics_counters,
        })
    }

    /// `/metrics` from now on: the gateway's, the apiserver requests', the resource
    /// metrics server's `counters` (when it serves) and the process's.
    fn register_metrics(
        &self,
        gateway: &Arc<Gateway>,
        requests: &RequestMetrics,
        counters: Option<&Arc<ResourceMetricsCounters>>,
    ) {
        let mut registry = Registry::default();
        gateway.register_metrics(&mut registry);
        requests.register(&mut registry);
        if let Some(counters) = counters {
            counters.register(&mut registry);
        }
        registry.register_collector(Box::new(edgebeat_transports::observe::ProcessCollector));
        // Set once: the cell was empty until now.
        let _ = self.metrics.set(registry);
    }

    /// Phase first list: the Node and Lease watches started on `watches`, and serving
    /// held until they have listed, so that the first messages (and the broker's retained
    /// certificates) meet the cluster's record of every node: which certificate each
    /// speaks with. A watch that cannot list (RBAC) delays the start by at most
    /// [`VIEW_SYNC_TIMEOUT`], logged as a warning; `/readyz` waits for the list either
    /// way, through the flag returned.
    pub(super) async fn first_list(
        &mut self,
        gateway: &Arc<Gateway>,
        watches: kube::Client,
    ) -> ControlFlow<(), Arc<AtomicBool>> {
        self.startup.phase(
            "listing the managed Nodes and Leases (is the apiserver reachable? see the log)",
        );
        // What the apiserver holds for the managed Nodes and Leases (see crate::view).
        self.background.spawn(gateway.watch(watches));
        let listed = Arc::new(AtomicBool::new(false));
        self.background.spawn({
            let (view, listed) = (gateway.view().clone(), listed.clone());
            async move {
                view.synced().await;
                listed.store(true, Ordering::Relaxed);
            }
        });
        let synced = tokio::time::timeout(VIEW_SYNC_TIMEOUT, gateway.view().synced());
        match self.stop.run_until_cancelled(synced).await {
            None => return ControlFlow::Break(()),
            Some(Ok(())) => {}
            Some(Err(_)) => tracing::warn!(
                timeout = ?VIEW_SYNC_TIMEOUT,
                "the Node and Lease watches have not listed; serving without the cluster's record of node certificates until they do"
            ),
        }
        ControlFlow::Continue(listed)
    }

    /// Phase ingresses: MQTT, gRPC enrollment, gRPC and resource metrics, each spawned
    /// into one set ([`Running::wait`] drains them), then `/readyz` turned to whether
    /// every one serves ([`readiness`]).
    ///
    /// Errors: [`StartError::ListenerAddress`].
    pub(super) fn ingresses(
        self,
        settings: Settings,
        listeners: IngressListeners,
        path: MessagePath,
        clients: Clients,
        listed: Arc<AtomicBool>,
    ) -> Result<Running, StartError> {
        let Self {
            stop,
            background,
            startup,
            observe,
            ..
        } = self;
        let gateway = path.gateway;
        let shares_usage = settings.resource_metrics.is_some();
        // Every ingress is a task of one set: the first to end (an error, or the shutdown
        // signal) stops the others, and every one is awaited to its end, so that each
        // drains (the MQTT ingress sends its DISCONNECT) before the process exits.
        let mut ingresses = Ingresses::new();
        let mqtt_subscribed = path
            .mqtt
            .map(|options| spawn_mqtt(&mut ingresses, options, &gateway, shares_usage, &stop));
        if let (Some(listener), Some((_, options))) =
            (listeners.grpc_enrollment, settings.grpc_enrollment)
        {
            let addr = listener
                .local_addr()
                .map_err(listener_address("gRPC enrollment"))?;
            tracing::info!(%addr, "gRPC enrollment listening");
            let until = stop.clone().cancelled_owned();
            let served = serve_enrollment(listener, gateway.clone(), options, until);
            spawn_ingress(&mut ingresses, "gRPC enrollment", served);
        }
        let serves_grpc = path.grpc.is_some();
        let grpc_serving = Arc::new(AtomicBool::new(false));
        if let (Some(listener), Some(options)) = (listeners.grpc, path.grpc) {
            let serving = grpc_serving.clone();
            spawn_grpc(&mut ingresses, listener, options, &gateway, serving, &stop)?;
        }
        if let (Some(listener), Some(served)) =
            (listeners.resource_metrics, settings.resource_metrics)
        {
            spawn_resource_metrics(
                &mut ingresses,
                listener,
                served.options,
                clients.client.clone(),
                path.resource_metrics_counters,
                &gateway,
                &stop,
            )?;
        }
        startup.started(readiness(
            stop.clone(),
            serves_grpc.then_some(grpc_serving),
            mqtt_subscribed.clone(),
            listed,
        ));
        Ok(Running {
            gateway,
            enrollment: path.enrollment,
            requests: clients.requests,
            mqtt_subscribed,
            ingresses,
            background,
            stop,
            observe,
        })
    }

    /// The start stopped by the shutdown between phases: the health server stopped (the
    /// other tasks are aborted as `self` is dropped).
    ///
    /// Errors: [`StartError::ObservePanicked`].
    pub(super) async fn stopped(self) -> Result<Option<Running>, StartError> {
        self.observe
            .stopped()
            .await
            .map_err(StartError::ObservePanicked)?;
        Ok(None)
    }
}

/// Spawns the MQTT ingress with `options` into `ingresses`, telling the broker's grant of
/// the shared subscription through the receiver returned. With `shares_usage` (a
/// resource metrics server), replicas tell each other the samples they admit, so that
/// each serves every node's resource metrics (a shared subscription splits a node's
/// renewals).
fn spawn_mqtt(
    ingresses: &mut Ingresses,
    mut options: MqttIngressOptions,
    gateway: &Arc<Gateway>,
    shares_usage: bool,
    stop: &CancellationToken,
) -> tokio::sync::watch::Receiver<bool> {
    let (subscribed, watch) = tokio::sync::watch::channel(false);
    options.subscribed = Some(Arc::new(subscribed));
    options.sessions_taken_over = Some(gateway.mqtt_sessions_taken_over());
    if shares_usage {
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
    spawn_ingress(ingresses, "MQTT", served);
    watch
}

/// Spawns the gRPC ingress on `listener` into `ingresses`; `serving` is true while it
/// runs (tonic accepts from the moment it is polled, on a listener bound already).
///
/// Errors: [`StartError::ListenerAddress`].
fn spawn_grpc(
    ingresses: &mut Ingresses,
    listener: TcpListener,
    options: GrpcServerOptions,
    gateway: &Arc<Gateway>,
    serving: Arc<AtomicBool>,
    stop: &CancellationToken,
) -> Result<(), StartError> {
    let addr = listener.local_addr().map_err(listener_address("gRPC"))?;
    tracing::info!(%addr, "gRPC listening");
    let served = serve(
        listener,
        gateway.clone(),
        options,
        stop.clone().cancelled_owned(),
    );
    // The listener is bound and tonic accepts from the moment it is polled.
    spawn_ingress(ingresses, "gRPC", async move {
        serving.store(true, Ordering::Relaxed);
        let result = served.await;
        serving.store(false, Ordering::Relaxed);
        result
    });
    Ok(())
}

/// Spawns the resource metrics server on `listener` into `ingresses`, with its TLS
/// `options`, the client its TokenReviews and SubjectAccessReviews go through
/// (`reviews`), and its `counters`.
///
/// Errors: [`StartError::ListenerAddress`].
fn spawn_resource_metrics(
    ingresses: &mut Ingresses,
    listener: TcpListener,
    options: resource_metrics::ResourceMetricsOptions,
    reviews: kube::Client,
    counters: Arc<ResourceMetricsCounters>,
    gateway: &Arc<Gateway>,
    stop: &CancellationToken,
) -> Result<(), StartError> {
    let addr = listener
        .local_addr()
        .map_err(listener_address("resource metrics"))?;
    tracing::info!(%addr, "serving resource metrics");
    let served = resource_metrics::serve(
        listener,
        options,
        gateway.resource_samples(),
        reviews,
        counters,
        stop.clone().cancelled_owned(),
    );
    spawn_ingress(ingresses, "resource metrics", served);
    Ok(())
}

/// The enrollment side with the site CA of the Secret edgebeat-site-ca
/// ([`Enrollment::with_site_ca`]), read again after every apiserver error (logged as an
/// error, 1 s doubling to 30 s apart) until it is read or `stop` is cancelled (`None`).
///
/// Errors: [`StartError::SiteCa`], a site CA that cannot be used (the Secret's content),
/// which no retry mends.
async fn site_ca_enrollment(
    client: kube::Client,
    options: EnrollmentOptions,
    clock: Arc<dyn edgebeat_hw::Clock>,
    stop: &CancellationToken,
) -> Result<Option<Enrollment>, StartError> {
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
            Some(Err(error)) => return Err(StartError::SiteCa(error)),
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
