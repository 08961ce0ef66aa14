//! The gateway server as the binary runs it: `main` parses the command line
//! ([`crate::cli::Args`]) and hands it, with a shutdown future, to [`Server`], which binds,
//! reads the site CA, waits for the Node and Lease watches to list, serves every ingress
//! and drains them all at shutdown (the shape of mini-redis's `server::run`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use edgebeat_transports::grpc::enroll::{EnrollmentServerOptions, serve_enrollment};
use edgebeat_transports::grpc::serve;
use edgebeat_transports::mqtt::serve as mqtt_serve;

use crate::cli::{Args, CsrApproval};
use crate::enrollment::{Approval, Enrollment, EnrollmentError, EnrollmentOptions};
use crate::settings::{
    check_no_grpc_flags, enrollment_tls, gateway_options, grpc_server_options, grpc_tls_updates,
    mqtt_ingress_options, posture,
};
use crate::{Gateway, Posture, kube_client_with, watch_client_with};

/// One gateway replica: its command line checked and its health and metrics port bound
/// ([`Server::bind`]), then run until shutdown ([`Server::run`]).
#[derive(Debug)]
pub struct Server {
    args: Args,
    observe_listener: tokio::net::TcpListener,
}

impl Server {
    /// Checks the flags that need no file or apiserver and binds `--metrics-listen`, so
    /// that `/healthz` answers from the first second of [`Server::run`], whatever the
    /// apiserver does (a gateway restarted during an apiserver outage must not be killed
    /// by its liveness probe while it waits).
    ///
    /// # Errors
    /// A flag that needs another (`--grpc-tls-cert` without `--grpc-listen`),
    /// `--max-nodes 0`, or `--metrics-listen` cannot be bound; each names the flag.
    pub async fn bind(args: Args) -> anyhow::Result<Self> {
        if args.grpc_listen.is_none() {
            check_no_grpc_flags(&args)?;
        }
        if args.max_nodes == 0 {
            anyhow::bail!("--max-nodes must be at least 1");
        }
        let observe_listener = tokio::net::TcpListener::bind(args.metrics_listen)
            .await
            .with_context(|| format!("binding --metrics-listen {}", args.metrics_listen))?;
        Ok(Self {
            args,
            observe_listener,
        })
    }

    /// The address `/healthz`, `/readyz` and `/metrics` are served on (`--metrics-listen`,
    /// its port chosen by the kernel when it was 0).
    ///
    /// # Errors
    /// The socket's address cannot be read (as [`tokio::net::TcpListener::local_addr`]).
    pub fn metrics_addr(&self) -> std::io::Result<SocketAddr> {
        self.observe_listener.local_addr()
    }

    /// Serves until `shutdown` resolves or an ingress fails: `/healthz`, `/readyz` (which
    /// says what the start waits for) and `/metrics` at once; then the apiserver clients,
    /// the site CA under `--enrollment` (read again after apiserver errors), the Node and
    /// Lease watches (serving starts once they listed, or after 30 s), and every ingress of
    /// the command line. At shutdown every ingress drains (the MQTT ingress sends its
    /// DISCONNECT) before the health server stops, so `/readyz` says "shutting down" while
    /// they do.
    ///
    /// # Errors
    /// A flag or file that cannot be used (named), a site CA that cannot be used, a
    /// listener that cannot be bound, or the first ingress to fail (named by its ingress).
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Self {
            args,
            observe_listener,
        } = self;
        tracing::info!(addr = %observe_listener.local_addr()?, "serving /healthz, /readyz and /metrics");
        let stop = tokio_util::sync::CancellationToken::new();
        let signal = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            signal.cancel();
        });
        let metrics = Arc::new(std::sync::OnceLock::new());
        let startup = Arc::new(Startup::new("reading the apiserver configuration"));
        // Stops after the ingresses, so /readyz answers "shutting down" while they drain.
        let observe_stop = tokio_util::sync::CancellationToken::new();
        let observe = tokio::spawn(edgebeat_transports::observe::serve(
            observe_listener,
            metrics.clone(),
            {
                let startup = startup.clone();
                move || startup.ready()
            },
            observe_stop.clone().cancelled_owned(),
        ));
        let config = args.cluster.kube_config().await?;
        let apiserver_url = config.cluster_url.clone();
        // Both clients' requests, in edgebeat_gateway_apiserver_request_duration_seconds.
        let requests = crate::apiserver::requests::RequestMetrics::default();
        let watches = watch_client_with(config.clone(), &requests, args.apiserver_http)?;
        let client = kube_client_with(config, args.qps, &requests, args.apiserver_http)?;
        tokio::spawn(crate::apiserver::reach::report_reachability(
            client.clone(),
            apiserver_url,
            stop.clone(),
        ));
        let clock: Arc<dyn edgebeat_hw::Clock> = Arc::new(edgebeat_hw::SystemClock);
        let enrollment = match args.enrollment {
            true => {
                let options = EnrollmentOptions {
                    namespace: args.cluster.namespace(),
                    approval: match args.csr_approval {
                        CsrApproval::Auto => Approval::Auto,
                        CsrApproval::Manual => Approval::Manual,
                    },
                    lifetime: args.certificate_lifetime,
                    grace: args.certificate_grace,
                    max_clock_skew: Duration::from_secs(args.mqtt_max_clock_skew_seconds),
                    ..EnrollmentOptions::default()
                };
                startup.phase("reading the site CA (Secret edgebeat-site-ca)");
                let Some(enrollment) =
                    site_ca_enrollment(client.clone(), options, clock.clone(), &stop).await?
                else {
                    return stopped(observe_stop, observe).await;
                };
                tracing::info!(
                    namespace = %args.cluster.namespace(),
                    approval = ?args.csr_approval,
                    lifetime = ?args.certificate_lifetime,
                    "enrolling and rotating node certificates"
                );
                Some(Arc::new(enrollment))
            }
            false => None,
        };
        let mut grpc_options = match args.grpc_listen {
            Some(_) => Some(grpc_server_options(&args, enrollment.as_deref())?),
            None => None,
        };
        let mqtt_options = mqtt_ingress_options(&args, enrollment.as_deref())?;
        let posture = posture(&args, grpc_options.as_ref(), mqtt_options.as_ref())?;
        if let Some(options) = grpc_options.as_mut() {
            options.tls_updates = grpc_tls_updates(&args, options.tls.clone(), enrollment.clone());
        }
        let options = gateway_options(&args, posture);
        if args.impersonate_nodes && posture == Posture::AllowUnidentified {
            // Impersonation says who a request is for; only authentication says who sent it.
            tracing::warn!(
                "--impersonate-nodes with --allow-unidentified-agents: unidentified agents are authorized by the apiserver as whichever node they claim"
            );
        }
        let gateway = Arc::new(Gateway::new(client, clock, options));
        if let Some(enrollment) = &enrollment {
            gateway.enable_enrollment(enrollment.clone());
        }
        let mut registry = prometheus_client::registry::Registry::default();
        gateway.register_metrics(&mut registry);
        requests.register(&mut registry);
        registry.register_collector(Box::new(edgebeat_transports::observe::ProcessCollector));
        // Set once: the cell was empty until now.
        let _ = metrics.set(registry);
        startup.phase(
            "listing the managed Nodes and Leases (is the apiserver reachable? see the log)",
        );
        // What the apiserver holds for the managed Nodes and Leases (see crate::view).
        tokio::spawn(gateway.watch(watches));
        let listed = Arc::new(AtomicBool::new(false));
        tokio::spawn({
            let (view, listed) = (gateway.view().clone(), listed.clone());
            async move {
                view.synced().await;
                listed.store(true, Ordering::Relaxed);
            }
        });
        // Serving starts once the watches have listed, so that the first messages (and the
        // broker's retained certificates) meet the cluster's record of every node: which
        // certificate each speaks with. A watch that cannot list (RBAC) delays the start by at
        // most VIEW_SYNC_TIMEOUT; /readyz waits for the list either way.
        let synced = tokio::time::timeout(VIEW_SYNC_TIMEOUT, gateway.view().synced());
        match stop.run_until_cancelled(synced).await {
            None => return stopped(observe_stop, observe).await,
            Some(Ok(())) => {}
            Some(Err(_)) => tracing::warn!(
                timeout = ?VIEW_SYNC_TIMEOUT,
                "the Node and Lease watches have not listed; serving without the cluster's record of node certificates until they do"
            ),
        }
        let grpc = match (args.grpc_listen, grpc_options) {
            (Some(addr), Some(options)) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding --grpc-listen {addr}"))?;
                tracing::info!(addr = %listener.local_addr()?, "gRPC listening");
                Some((listener, options))
            }
            _ => None,
        };
        let enrollment_listener = match args.grpc_enrollment_listen {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding --grpc-enrollment-listen {addr}"))?;
                tracing::info!(addr = %listener.local_addr()?, "gRPC enrollment listening");
                Some(listener)
            }
            None => None,
        };
        let grpc_serving = Arc::new(AtomicBool::new(false));
        let mut mqtt_subscribed = None;
        let mqtt = match mqtt_options {
            Some(mut options) => {
                let (subscribed, watch) = tokio::sync::watch::channel(false);
                options.subscribed = Some(Arc::new(subscribed));
                mqtt_subscribed = Some(watch);
                tracing::info!(
                    broker = %options.host,
                    tls = options.tls.is_some(),
                    signatures = ?options.signatures.as_ref().map(|s| if s.required { "required" } else { "verified when present" }),
                    "taking heartbeats from MQTT"
                );
                Some(mqtt_serve(
                    options,
                    gateway.clone(),
                    stop.clone().cancelled_owned(),
                ))
            }
            None => None,
        };
        startup.started(readiness(
            stop.clone(),
            grpc.is_some().then(|| grpc_serving.clone()),
            mqtt_subscribed,
            listed,
        ));
        // Every ingress is a task of one set: the first to end (an error, or the shutdown
        // signal) stops the others, and every one is awaited to its end, so that each drains
        // (the MQTT ingress sends its DISCONNECT) before the process exits.
        let mut ingresses: tokio::task::JoinSet<(&'static str, anyhow::Result<()>)> =
            tokio::task::JoinSet::new();
        if let Some(mqtt) = mqtt {
            ingresses.spawn(async move { ("MQTT", mqtt.await.map_err(anyhow::Error::from)) });
        }
        if let Some(listener) = enrollment_listener {
            let options = EnrollmentServerOptions {
                tls: enrollment_tls(&args)?,
            };
            let served = serve_enrollment(
                listener,
                gateway.clone(),
                options,
                stop.clone().cancelled_owned(),
            );
            ingresses.spawn(async move {
                ("gRPC enrollment", served.await.map_err(anyhow::Error::from))
            });
        }
        if let Some((listener, options)) = grpc {
            let serving = grpc_serving.clone();
            let served = serve(listener, gateway, options, stop.clone().cancelled_owned());
            // The listener is bound and tonic accepts from the moment it is polled.
            ingresses.spawn(async move {
                serving.store(true, Ordering::Relaxed);
                let result = served.await;
                serving.store(false, Ordering::Relaxed);
                ("gRPC", result.map_err(anyhow::Error::from))
            });
        }
        let drained = drain(ingresses, &stop).await;
        stopped(observe_stop, observe).await?;
        drained
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

/// Stops the health and metrics server last (after the ingresses, so `/readyz` answered
/// "shutting down" while they drained) and waits for it.
///
/// Errors: the server task panicked.
async fn stopped(
    observe_stop: tokio_util::sync::CancellationToken,
    observe: tokio::task::JoinHandle<std::io::Result<()>>,
) -> anyhow::Result<()> {
    observe_stop.cancel();
    if let Err(error) = observe.await.context("observe task")? {
        tracing::warn!(%error, "observe server failed");
    }
    Ok(())
}

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

type Readiness = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// `/readyz` from the first second: while the gateway starts, "starting: " and what it
/// waits for; then [`readiness`].
struct Startup {
    phase: tokio::sync::watch::Sender<&'static str>,
    started: std::sync::OnceLock<Readiness>,
}

impl Startup {
    fn new(phase: &'static str) -> Self {
        Self {
            phase: tokio::sync::watch::Sender::new(phase),
            started: std::sync::OnceLock::new(),
        }
    }

    /// What the start waits for now.
    fn phase(&self, phase: &'static str) {
        self.phase.send_replace(phase);
    }

    /// Started: from now on `/readyz` is `ready`.
    fn started(&self, ready: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        // Set once: run() starts once.
        let _ = self.started.set(Box::new(ready));
    }

    fn ready(&self) -> Result<(), String> {
        match self.started.get() {
            Some(ready) => ready(),
            None => Err(format!("starting: {}", *self.phase.borrow())),
        }
    }
}

/// `/readyz`: not shutting down, the Node and Lease watches listed once (`listed`: the
/// apiserver answered the gateway's credentials), (with gRPC) the gRPC server running, and
/// (with MQTT) the shared subscription granted by the broker.
fn readiness(
    stop: tokio_util::sync::CancellationToken,
    grpc_serving: Option<Arc<AtomicBool>>,
    mqtt_subscribed: Option<tokio::sync::watch::Receiver<bool>>,
    listed: Arc<AtomicBool>,
) -> impl Fn() -> Result<(), String> + Send + Sync + 'static {
    move || {
        if stop.is_cancelled() {
            return Err("shutting down".into());
        }
        if !listed.load(Ordering::Relaxed) {
            return Err(
                "the managed Nodes and Leases are not listed yet (is the apiserver reachable? see the log)"
                    .into(),
            );
        }
        if grpc_serving
            .as_ref()
            .is_some_and(|serving| !serving.load(Ordering::Relaxed))
        {
            return Err("gRPC server not serving".into());
        }
        if let Some(subscribed) = &mqtt_subscribed
            && !*subscribed.borrow()
        {
            return Err(
                "MQTT shared subscription not granted yet (connecting to the broker or subscribing)"
                    .into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "server/tests.rs"]
mod tests;
