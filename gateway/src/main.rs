//! `edgebeat-gateway`: see the crate docs of `edgebeat_gateway`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use edgebeat_gateway::enrollment::ca::{AnswerCaRotation, SiteCa};
use edgebeat_gateway::enrollment::gate::EnrollmentLimits;
use edgebeat_gateway::enrollment::{Approval, Enrollment, EnrollmentError, EnrollmentOptions};
use edgebeat_gateway::{
    Gateway, GatewayOptions, Posture, kube_client, kube_client_with, watch_client_with,
};
use edgebeat_transports::endpoint::MqttCluster;
use edgebeat_transports::grpc::enroll::{EnrollmentServerOptions, serve_enrollment};
use edgebeat_transports::grpc::{GrpcServerOptions, GrpcServerTls, serve, tls};
use edgebeat_transports::mqtt::{MqttIngressOptions, SignaturePolicy, serve as mqtt_serve};
use edgebeat_transports::signing::{AnswerSigner, CertificateVerifier};

/// Receives edgebeat heartbeats and writes Node status and Leases to Kubernetes.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// What else to do instead of serving (`token create`).
    #[command(subcommand)]
    command: Option<Command>,
    /// Address of the gRPC listener, e.g. `0.0.0.0:7443`; without it the gateway serves no
    /// gRPC (an MQTT-only site has no listener to bypass its signatures through). Needs
    /// --grpc-client-ca (mTLS) unless --allow-unidentified-agents.
    #[arg(long, value_name = "ADDR")]
    grpc_listen: Option<SocketAddr>,
    /// Let in agents without a node identity: gRPC without --grpc-client-ca (or with
    /// --require-node-identity=false) and MQTT without --mqtt-node-ca (or with
    /// --mqtt-require-signatures=false). Anyone who can reach such an ingress can then
    /// write any node that has not spoken with its identity. Off by default: then every
    /// ingress must require node identities, or the gateway does not start. Logged as a
    /// warning at start and exported as edgebeat_gateway_unidentified_agents_allowed.
    #[arg(long)]
    allow_unidentified_agents: bool,
    /// Most nodes one replica keeps state for; messages of further nodes are refused
    /// (reason fleet_full, logged) before anything is allocated for them. Size it to the
    /// fleet a replica serves and the memory limit it runs under.
    #[arg(long, default_value_t = edgebeat_gateway::gateway::DEFAULT_MAX_NODES)]
    max_nodes: usize,
    /// Export the per-node series on /metrics (edgebeat_gateway_node_lease_age_seconds and
    /// edgebeat_gateway_node_clock_skew_seconds, two series per node). For large fleets,
    /// --per-node-metrics=false keeps /metrics to a fixed size; Lease ages then show in
    /// edgebeat_gateway_lease_age_seconds' buckets, without node names.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    per_node_metrics: bool,
    /// PEM certificate chain of the gRPC listener (with --grpc-tls-key): serve gRPC over TLS.
    /// Read again every 10 s with its key and --grpc-client-ca: a renewed certificate or CA
    /// bundle (cert-manager, a mounted Secret) is used for new handshakes, open connections
    /// keep theirs. During a CA change, put the old and the new CA in the bundle.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_key")]
    grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of --grpc-tls-cert.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_cert")]
    grpc_tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) agents' client certificates must chain to (mTLS; needs
    /// --grpc-tls-cert). The node name is taken from the certificate (CN=system:node:<name>,
    /// O=system:nodes) and an agent may only speak for that node.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_cert")]
    grpc_client_ca: Option<PathBuf>,
    /// Refuse gRPC streams without a node identity (UNAUTHENTICATED, counted as rejected).
    /// Default: true with --grpc-client-ca, false without. `--require-node-identity=false`
    /// with a client CA lets agents without a certificate in (unchecked), e.g. while a fleet
    /// moves to mTLS; a certificate that is presented must still be a node's.
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    require_node_identity: Option<bool>,
    /// Address serving /healthz, /readyz (gRPC serving and, with --mqtt-endpoint, the MQTT
    /// shared subscription granted) and Prometheus /metrics.
    #[arg(long, default_value = "0.0.0.0:9102")]
    metrics_listen: SocketAddr,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Enroll and rotate node certificates: boards with only a bootstrap token (`token
    /// create`) get their certificate through this gateway, as kubelet's TLS bootstrap
    /// (each one a CertificateSigningRequest, `kubectl get csr`), and rotate it before it
    /// expires. The site CA lives in the Secret edgebeat-site-ca of --namespace (made if
    /// absent, shared by every replica); it signs the node certificates, verifies them on
    /// every ingress (beside --grpc-client-ca and --mqtt-node-ca), and issues this
    /// gateway's own certificate (gRPC serving without --grpc-tls-cert, signed answers
    /// without --mqtt-answer-cert-file).
    #[arg(long)]
    enrollment: bool,
    /// Address of the gRPC enrollment listener (needs --enrollment), e.g. `0.0.0.0:7444`:
    /// boards without a certificate ask for one there (agents' transport.enrollmentEndpoint).
    /// It takes no client certificate; requests are limited per address and in all. Plain
    /// HTTP/2 (every request is proved and every answer signed), or TLS with
    /// --grpc-tls-cert.
    #[arg(long, value_name = "ADDR", requires = "enrollment")]
    grpc_enrollment_listen: Option<SocketAddr>,
    /// Who approves first enrollments (with --enrollment): `auto` approves every request
    /// proved by a valid bootstrap token for the node; `manual` leaves them to `kubectl
    /// certificate approve`. Rotations proved by the node's certificate are approved
    /// either way.
    #[arg(long, value_enum, default_value_t = CsrApproval::Auto)]
    csr_approval: CsrApproval,
    /// Lifetime of the node certificates this gateway signs (`spec.expirationSeconds`),
    /// e.g. `8760h`; agents rotate at 70-90 % of it.
    #[arg(long, value_parser = parse_duration, default_value = "8760h")]
    certificate_lifetime: Duration,
    /// How long after its expiry a node certificate still proves a rotation, for a Node
    /// that still exists (a board that was offline when it expired); past it the board needs
    /// a new bootstrap token.
    #[arg(long, value_parser = parse_duration, default_value = "720h")]
    certificate_grace: Duration,
    /// Certificate requests per second this replica takes from all sources together (with
    /// --enrollment), in bursts of up to five seconds' worth; more get no answer and the
    /// agents ask again with backoff, so heartbeats keep their share of the gateway and
    /// the apiserver during an enrollment storm.
    #[arg(long, default_value_t = 100.0)]
    enrollment_rate: f64,
    /// Certificate requests per second from one source (a gRPC client's IP address, or
    /// over MQTT one node), in bursts of up to four seconds' worth. Raise it for sites
    /// whose boards share one NAT address.
    #[arg(long, default_value_t = 5.0)]
    enrollment_rate_per_source: f64,
    /// Client-side limit on apiserver requests per second; 0 (the default) for none, as
    /// kubelet's heartbeat client. A fixed rate shared by a whole fleet expires nodes once
    /// the fleet outgrows it: the gateway bounds concurrency (--max-inflight) and backs off
    /// on 429/5xx instead.
    #[arg(long, default_value_t = 0)]
    qps: u64,
    /// HTTP to kube-apiserver, as client-go by default (`auto`): over TLS HTTP/2 when the
    /// apiserver offers it by ALPN (one connection carries every call, PINGs every 30 s find
    /// a dead one), else HTTP/1.1; over plain `http://` (e.g. `kubectl proxy`) HTTP/1.1.
    /// `2` also speaks HTTP/2 over `http://` (prior knowledge, for servers that speak h2c);
    /// `1.1` never HTTP/2 (a connection per call in flight).
    #[arg(long, value_name = "VERSION", default_value = "auto")]
    apiserver_http: edgebeat_gateway::apiserver::client::HttpVersion,
    /// Apiserver requests in flight at once; Node, status and Event calls may hold at most
    /// half, so Lease renewals always get through.
    #[arg(long, default_value_t = 256)]
    max_inflight: usize,
    /// Oldest lease renewal still written, in seconds; older ones are dropped.
    #[arg(long, default_value_t = 5)]
    max_renewal_age_seconds: u64,
    /// MQTT broker to take heartbeats from: `mqtt://host[:1883]`, or `mqtts://host[:8883]`
    /// for TLS (with --mqtt-ca-file); off when not set. Several (repeated, or separated by
    /// commas) name the nodes of one broker cluster: the gateway subscribes on the first
    /// and, after a lost connection, on the next in turn.
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    mqtt_endpoint: Vec<String>,
    /// PEM CA certificate(s) the broker's certificate must chain to (`mqtts://`).
    #[arg(long, value_name = "FILE")]
    mqtt_ca_file: Option<PathBuf>,
    /// PEM client certificate presented to the broker (with --mqtt-key-file; `mqtts://`).
    #[arg(long, value_name = "FILE", requires = "mqtt_key_file")]
    mqtt_cert_file: Option<PathBuf>,
    /// PEM private key of --mqtt-cert-file.
    #[arg(long, value_name = "FILE", requires = "mqtt_cert_file")]
    mqtt_key_file: Option<PathBuf>,
    /// PEM site CA that signs node certificates: verify agents' end-to-end message
    /// signatures against the certificates they publish on `P/certificates/<node>`; a
    /// verified message speaks only for the node its certificate names. Needs
    /// --mqtt-answer-cert-file and --mqtt-answer-key-file: agents that sign take only
    /// signed answers.
    #[arg(long, value_name = "FILE")]
    mqtt_node_ca: Option<PathBuf>,
    /// PEM certificate chain of this gateway's answer key (with --mqtt-answer-key-file): a
    /// server certificate from the --mqtt-node-ca site CA, valid for the DNS name
    /// `edgebeat-gateway`. Every answer to a signed MQTT message is signed with it, so that
    /// agents can tell the gateway's answers from anyone's on the broker.
    #[arg(long, value_name = "FILE", requires = "mqtt_answer_key_file")]
    mqtt_answer_cert_file: Option<PathBuf>,
    /// PEM private key (ECDSA P-256 or Ed25519) of --mqtt-answer-cert-file.
    #[arg(long, value_name = "FILE", requires = "mqtt_answer_cert_file")]
    mqtt_answer_key_file: Option<PathBuf>,
    /// Refuse unsigned MQTT messages (counted as rejected, reason `unsigned`). Default: true
    /// with --mqtt-node-ca. `=false` accepts unsigned ones without an identity, while a fleet
    /// moves to signing; signed ones are still verified.
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    mqtt_require_signatures: Option<bool>,
    /// Largest difference, in seconds, between a signed MQTT message's wall time and this
    /// gateway's clock (with --mqtt-node-ca). Bounds how late a recorded message can be
    /// replayed to a replica that does not remember the node's boot; agents need a clock
    /// within it (NTP), as they need one for TLS.
    #[arg(long, default_value_t = 30)]
    mqtt_max_clock_skew_seconds: u64,
    /// Write as each node: every apiserver request carries `Impersonate-User:
    /// system:node:<name>` and `Impersonate-Group: system:nodes`, so the apiserver's Node
    /// authorizer and NodeRestriction apply too. Needs the RBAC in
    /// deploy/gateway/impersonation.
    #[arg(long)]
    impersonate_nodes: bool,
    /// MQTT client ID of this replica (default `edgebeat-gateway-<pid>`; unique per replica).
    #[arg(long)]
    mqtt_client_id: Option<String>,
    /// MQTT topic prefix (as the agents' `transport.topicPrefix`).
    #[arg(long, default_value = "edgebeat/v1")]
    mqtt_topic_prefix: String,
    /// MQTT 5 shared-subscription group: replicas in one group split the fleet.
    #[arg(long, default_value = "edgebeat-gateway")]
    mqtt_share_group: String,
    /// Follow the site brokers' bridge notifications on `<prefix>/sites/#` (a site's
    /// uplink down marks its nodes SiteUnreachable at once). `false` when the broker's ACL
    /// does not let the gateway read them.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    mqtt_site_uplinks: bool,
    /// MQTT username (with --mqtt-password-file).
    #[arg(long, requires = "mqtt_password_file")]
    mqtt_username: Option<String>,
    /// File holding the MQTT password.
    #[arg(long, requires = "mqtt_username")]
    mqtt_password_file: Option<PathBuf>,
    /// Log filter: a level (info, debug…) or `target=level,…`.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Log line format: `text` (coloured only on a terminal without NO_COLOR) or `json` (one
    /// object per line: timestamp, level, target, message, the event's fields, spans).
    /// kubelet's name for it, `--logging-format`, is accepted too.
    #[arg(
        long,
        alias = "logging-format",
        value_name = "text|json",
        default_value = "text"
    )]
    log_format: edgebeat_transports::observe::LogFormat,
}

/// Where the gateway's cluster is (both for serving and for `token create`).
#[derive(clap::Args, Debug)]
struct ClusterArgs {
    /// kubeconfig file; without it: $KUBECONFIG, ~/.kube/config, then in-cluster config.
    #[arg(long, value_name = "FILE", global = true)]
    kubeconfig: Option<PathBuf>,
    /// apiserver URL to use instead of a kubeconfig (plain http, no auth: for the stand-in).
    #[arg(long, value_name = "URL", global = true)]
    server: Option<String>,
    /// Namespace of the site CA and bootstrap token Secrets (default: $POD_NAMESPACE, else
    /// edgebeat-system).
    #[arg(long, global = true)]
    namespace: Option<String>,
}

impl ClusterArgs {
    fn namespace(&self) -> String {
        self.namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|n| !n.is_empty())
            })
            .unwrap_or_else(|| "edgebeat-system".to_owned())
    }
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Bootstrap tokens for enrolling boards (the gateway must run with --enrollment).
    #[command(subcommand)]
    Token(TokenCommand),
    /// The answer CAs, which issue the keys the gateway signs its answers with (README
    /// "Rotating the answer CA").
    #[command(subcommand)]
    AnswerCa(AnswerCaCommand),
}

#[derive(clap::Subcommand, Debug)]
enum AnswerCaCommand {
    /// One step of a rotation of the answer CA in the Secret edgebeat-site-ca of
    /// --namespace: the first run adds a new answer CA that agents learn at their next
    /// certificate; the second, once they have (a node certificate lifetime later),
    /// retires the old one. Restart the gateway after each (`kubectl rollout restart`).
    Rotate,
}

#[derive(clap::Subcommand, Debug)]
enum TokenCommand {
    /// Makes a bootstrap token and prints it (`<id>.<secret>.sha256:<site CA hash>`): put it
    /// in the agents' bootstrapTokenFile. Stored as the Secret edgebeat-token-<id> of
    /// --namespace; delete that Secret to revoke it. Makes the site CA if there is none yet.
    Create {
        /// Node names it may enroll: names, or prefixes ending in `*`
        /// (`'plant-3-*'`), comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<String>,
        /// How long it enrolls, e.g. `24h`.
        #[arg(long, value_parser = parse_duration, default_value = "24h")]
        ttl: Duration,
        /// How many nodes it may enroll.
        #[arg(long, default_value_t = 1)]
        uses: u32,
    },
}

/// `--csr-approval`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum CsrApproval {
    /// Approve every proved request.
    Auto,
    /// First enrollments wait for `kubectl certificate approve`.
    Manual,
}

/// A duration flag that is not a whole number with `s`, `m`, `h` or `d`, or is 0.
#[derive(Debug, thiserror::Error)]
#[error("{0:?}: give a whole number above 0 with s, m, h or d, e.g. 24h")]
struct BadDuration(String);

/// A duration flag: a whole number with a unit (`s`, `m`, `h`, `d`), e.g. `24h`.
///
/// Errors: [`BadDuration`], naming the text.
fn parse_duration(text: &str) -> Result<Duration, BadDuration> {
    let bad = || BadDuration(text.to_owned());
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    match number.checked_mul(unit) {
        Some(seconds) if seconds > 0 => Ok(Duration::from_secs(seconds)),
        _ => Err(bad()),
    }
}

/// The apiserver client config from `--server`, `--kubeconfig` or the environment.
async fn kube_config(cluster: &ClusterArgs) -> anyhow::Result<kube::Config> {
    Ok(match (&cluster.server, &cluster.kubeconfig) {
        (Some(url), _) => {
            kube::Config::new(url.parse().with_context(|| format!("--server {url:?}"))?)
        }
        (None, Some(path)) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        (None, None) => kube::Config::infer()
            .await
            .context("no kubeconfig or in-cluster config found; pass --kubeconfig")?,
    })
}

/// `token create`: makes the token and prints it on stdout (and what it allows on stderr).
async fn token_create(
    cluster: &ClusterArgs,
    nodes: Vec<String>,
    ttl: Duration,
    uses: u32,
) -> anyhow::Result<()> {
    let client = kube_client(
        kube_config(cluster).await?,
        0,
        &edgebeat_gateway::apiserver::requests::RequestMetrics::default(),
    )?;
    let namespace = cluster.namespace();
    let now = jiff::Timestamp::now();
    let ca = SiteCa::load_or_create(client.clone(), &namespace, now.as_second()).await?;
    let token = edgebeat_gateway::enrollment::tokens::create_token(
        client,
        &namespace,
        nodes.clone(),
        ttl,
        uses,
        ca.pin()?,
        now,
    )
    .await?;
    eprintln!(
        "bootstrap token {} for {} node(s) matching {}, valid {}s (Secret {}/{}):",
        token.id,
        uses,
        nodes.join(","),
        ttl.as_secs(),
        namespace,
        edgebeat_gateway::enrollment::tokens::token_secret_name(&token.id)
    );
    println!("{token}");
    Ok(())
}

/// `answer-ca rotate`: one rotation step, said on stderr.
async fn answer_ca_rotate(cluster: &ClusterArgs) -> anyhow::Result<()> {
    let client = kube_client(
        kube_config(cluster).await?,
        0,
        &edgebeat_gateway::apiserver::requests::RequestMetrics::default(),
    )?;
    let namespace = cluster.namespace();
    let now = jiff::Timestamp::now().as_second();
    let step = SiteCa::rotate_in_secret(client, &namespace, now)
        .await
        .context("rotating the answer CA")?;
    eprintln!(
        "{}",
        match step {
            AnswerCaRotation::Added =>
                "added a new answer CA behind the current one: restart the gateway; agents learn it at their next certificate. Run this again, to retire the old one, once every agent has rotated (a node certificate lifetime).",
            AnswerCaRotation::Retired =>
                "retired the old answer CA: restart the gateway; it signs with the new one, and agents drop the old one at their next certificate.",
        }
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run()));
    edgebeat_transports::observe::exit_code(result)
}

async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    edgebeat_transports::observe::init_logging(
        &args.log_level,
        edgebeat_transports::observe::LogTo::Stdout,
        args.log_format,
    )
    .map_err(|e| anyhow::anyhow!("--log-level {:?}: {e}", args.log_level))?;
    // rustls on ring for every TLS user in the process (gRPC server, kube client).
    tls::install_ring_provider();
    if let Some(Command::AnswerCa(AnswerCaCommand::Rotate)) = args.command {
        return answer_ca_rotate(&args.cluster).await;
    }
    if let Some(Command::Token(TokenCommand::Create { nodes, ttl, uses })) = args.command {
        return token_create(&args.cluster, nodes, ttl, uses).await;
    }
    if args.grpc_listen.is_none() {
        check_no_grpc_flags(&args)?;
    }
    if args.max_nodes == 0 {
        anyhow::bail!("--max-nodes must be at least 1");
    }
    // Probes are answered from the first second, whatever the apiserver does: /healthz
    // says the process runs, /readyz says why it is not ready yet. A gateway restarted
    // during an apiserver outage must not be killed by its liveness probe while it waits.
    let observe_listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding --metrics-listen {}", args.metrics_listen))?;
    tracing::info!(addr = %observe_listener.local_addr()?, "serving /healthz, /readyz and /metrics");
    let stop = tokio_util::sync::CancellationToken::new();
    let signal = stop.clone();
    tokio::spawn(async move {
        edgebeat_transports::observe::shutdown_signal().await;
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
    let config = kube_config(&args.cluster).await?;
    let apiserver_url = config.cluster_url.clone();
    // Both clients' requests, in edgebeat_gateway_apiserver_request_duration_seconds.
    let requests = edgebeat_gateway::apiserver::requests::RequestMetrics::default();
    let watches = watch_client_with(config.clone(), &requests, args.apiserver_http)?;
    let client = kube_client_with(config, args.qps, &requests, args.apiserver_http)?;
    tokio::spawn(edgebeat_gateway::apiserver::reach::report_reachability(
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
    let options = GatewayOptions {
        max_renewal_age: Duration::from_secs(args.max_renewal_age_seconds),
        impersonate_nodes: args.impersonate_nodes,
        posture,
        max_nodes: args.max_nodes,
        per_node_metrics: args.per_node_metrics,
        write_limits: edgebeat_gateway::apiserver::WriteLimits {
            max_inflight: args.max_inflight.max(2),
        },
        enrollment_limits: EnrollmentLimits {
            rate: args.enrollment_rate,
            burst: (args.enrollment_rate * 5.0).max(1.0),
            per_source_rate: args.enrollment_rate_per_source,
            per_source_burst: (args.enrollment_rate_per_source * 4.0).max(1.0),
            ..EnrollmentLimits::default()
        },
        ..Default::default()
    };
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
    startup.phase("listing the managed Nodes and Leases (is the apiserver reachable? see the log)");
    // What the apiserver holds for the managed Nodes and Leases (see edgebeat_gateway::view).
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
        ingresses
            .spawn(async move { ("gRPC enrollment", served.await.map_err(anyhow::Error::from)) });
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

/// The MQTT password from --mqtt-password-file ([`edgebeat_hw::read_password_file`], as
/// the agent's `transport.passwordFile`), the flag named in the error.
fn read_password_file(file: &std::path::Path) -> anyhow::Result<String> {
    edgebeat_hw::read_password_file(file).context("--mqtt-password-file")
}

/// The MQTT ingress options from the `--mqtt-*` flags (`None` without --mqtt-endpoint):
/// files read and checked now, so a bad file stops the gateway at start with the flag named.
fn mqtt_ingress_options(
    args: &Args,
    enrollment: Option<&Enrollment>,
) -> anyhow::Result<Option<MqttIngressOptions>> {
    let read = |flag: &str, path: &PathBuf| {
        edgebeat_hw::read_bounded(path, edgebeat_hw::MAX_PEM_FILE_BYTES)
            .with_context(|| format!("{flag} {}", path.display()))
    };
    let Some(url) = args.mqtt_endpoint.first() else {
        flags_need(
            "--mqtt-endpoint",
            &[
                ("--mqtt-ca-file", args.mqtt_ca_file.is_some()),
                ("--mqtt-cert-file", args.mqtt_cert_file.is_some()),
                ("--mqtt-node-ca", args.mqtt_node_ca.is_some()),
                (
                    "--mqtt-require-signatures",
                    args.mqtt_require_signatures.is_some(),
                ),
            ],
        )?;
        return Ok(None);
    };
    let MqttCluster {
        mut brokers,
        tls: secure,
    } = MqttCluster::parse(&args.mqtt_endpoint).map_err(|problems| {
        let all: Vec<String> = problems.into_iter().map(|(_, m)| m).collect();
        anyhow::anyhow!("--mqtt-endpoint: {}", all.join("; "))
    })?;
    let (host, port) = brokers.remove(0);
    let client_id = args
        .mqtt_client_id
        .clone()
        .unwrap_or_else(|| format!("edgebeat-gateway-{}", std::process::id()));
    let mut options = MqttIngressOptions::new(host, port, client_id);
    options.failover = brokers;
    options.topic_prefix = args.mqtt_topic_prefix.clone();
    options.share_group = args.mqtt_share_group.clone();
    options.site_uplinks = args.mqtt_site_uplinks;
    if let (Some(user), Some(file)) = (&args.mqtt_username, &args.mqtt_password_file) {
        let password = read_password_file(file)?;
        options.credentials = Some((user.clone(), password));
    }
    options.tls = match (secure, &args.mqtt_ca_file) {
        (true, Some(ca)) => {
            let tls = tls::ClientTls {
                ca_pem: read("--mqtt-ca-file", ca)?,
                client_identity: match (&args.mqtt_cert_file, &args.mqtt_key_file) {
                    (Some(cert), Some(key)) => Some(tls::TlsIdentity {
                        cert_pem: read("--mqtt-cert-file", cert)?,
                        key_pem: read("--mqtt-key-file", key)?,
                    }),
                    _ => None,
                },
            };
            tls.rustls_config()
                .map_err(anyhow::Error::msg)
                .context("--mqtt-ca-file, --mqtt-cert-file, --mqtt-key-file")?;
            Some(tls)
        }
        (true, None) => anyhow::bail!(
            "--mqtt-endpoint {url:?} is mqtts:// and needs --mqtt-ca-file (the CA of the broker's certificate)"
        ),
        (false, _) if args.mqtt_ca_file.is_some() || args.mqtt_cert_file.is_some() => {
            anyhow::bail!(
                "--mqtt-ca-file and --mqtt-cert-file need an mqtts:// --mqtt-endpoint, not {url:?}"
            )
        }
        (false, _) => None,
    };
    let required = args
        .mqtt_require_signatures
        .unwrap_or(args.mqtt_node_ca.is_some() || enrollment.is_some());
    let node_ca = match (&args.mqtt_node_ca, enrollment) {
        (Some(ca), _) => {
            let ca_pem = read("--mqtt-node-ca", ca)?;
            CertificateVerifier::from_pem(&ca_pem)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("--mqtt-node-ca {}", ca.display()))?;
            // Hand-made node certificates and enrolled ones, during a move to enrollment.
            Some(match enrollment {
                Some(enrollment) => enrollment.node_ca_pem(Some(ca_pem)),
                None => ca_pem,
            })
        }
        (None, Some(enrollment)) => Some(enrollment.node_ca_pem(None)),
        (None, None) => None,
    };
    options.signatures = match node_ca {
        Some(ca_pem) => {
            let verifier = CertificateVerifier::from_pem(&ca_pem)
                .map_err(anyhow::Error::msg)
                .context("--mqtt-node-ca")?;
            let mut policy = SignaturePolicy::new(verifier, required);
            policy.max_clock_skew = Duration::from_secs(args.mqtt_max_clock_skew_seconds);
            options.answer_signer = Some(
                match (
                    &args.mqtt_answer_cert_file,
                    &args.mqtt_answer_key_file,
                    enrollment,
                ) {
                    (Some(cert), Some(key), _) => Arc::new(
                        AnswerSigner::from_pem(
                            &read("--mqtt-answer-cert-file", cert)?,
                            &read("--mqtt-answer-key-file", key)?,
                            &ca_pem,
                        )
                        .map_err(anyhow::Error::msg)
                        .context("--mqtt-answer-cert-file, --mqtt-answer-key-file")?,
                    ),
                    // The gateway's own certificate from the site CA.
                    (_, _, Some(enrollment)) => enrollment.answer_signer(),
                    _ => anyhow::bail!(
                        "--mqtt-node-ca needs --mqtt-answer-cert-file and --mqtt-answer-key-file (or --enrollment): agents that sign their messages take only answers the gateway signs; issue a server certificate for the DNS name {} from the site CA (README, \"MQTT over TLS with signed messages\")",
                        edgebeat_transports::signing::ANSWER_SIGNER_NAME
                    ),
                },
            );
            Some(policy)
        }
        None if required => anyhow::bail!(
            "--mqtt-require-signatures needs --mqtt-node-ca (or --enrollment): signatures are verified against node certificates from the site CA"
        ),
        None => None,
    };
    Ok(Some(options))
}

/// The gRPC server's options from the TLS flags: files read and checked now, so a bad file
/// stops the gateway at start with the flag named.
fn grpc_server_options(
    args: &Args,
    enrollment: Option<&Enrollment>,
) -> anyhow::Result<GrpcServerOptions> {
    let read = |flag: &str, path: &PathBuf| {
        edgebeat_hw::read_bounded(path, edgebeat_hw::MAX_PEM_FILE_BYTES)
            .with_context(|| format!("{flag} {}", path.display()))
    };
    let require_node_identity = args
        .require_node_identity
        .unwrap_or(args.grpc_client_ca.is_some() || enrollment.is_some());
    if require_node_identity && args.grpc_client_ca.is_none() && enrollment.is_none() {
        anyhow::bail!(
            "--require-node-identity needs --grpc-client-ca (or --enrollment): node identities come from client certificates"
        );
    }
    let client_ca_pem = args
        .grpc_client_ca
        .as_ref()
        .map(|ca| read("--grpc-client-ca", ca))
        .transpose()?;
    let tls = match (&args.grpc_tls_cert, &args.grpc_tls_key, enrollment) {
        (None, None, Some(enrollment)) => {
            tracing::info!(
                "gRPC over TLS with the gateway's certificate from the site CA (no --grpc-tls-cert)"
            );
            Some(enrollment.grpc_server_tls(client_ca_pem))
        }
        (Some(cert), Some(key), _) => {
            let tls = GrpcServerTls {
                cert_pem: read("--grpc-tls-cert", cert)?,
                key_pem: read("--grpc-tls-key", key)?,
                // Client certificates from --grpc-client-ca and the site CA.
                client_ca_pem: match enrollment {
                    Some(enrollment) => Some(enrollment.node_ca_pem(client_ca_pem)),
                    None => client_ca_pem,
                },
            };
            tls::parse_certificates(&tls.cert_pem)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("--grpc-tls-cert {}", cert.display()))?;
            tls::parse_private_key(&tls.key_pem)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("--grpc-tls-key {}", key.display()))?;
            tls.check()
                .map_err(anyhow::Error::msg)
                .context("--grpc-tls-cert, --grpc-tls-key, --grpc-client-ca")?;
            tracing::info!(
                mtls = tls.client_ca_pem.is_some(),
                require_node_identity,
                "gRPC over TLS"
            );
            Some(tls)
        }
        _ => None,
    };
    Ok(GrpcServerOptions {
        tls,
        require_node_identity,
        ..GrpcServerOptions::default()
    })
}

/// New TLS material for the gRPC listener when --grpc-tls-cert, --grpc-tls-key or
/// --grpc-client-ca change on disk ([`edgebeat_gateway::reload`]), checked as at start and
/// with the site CA added under --enrollment; `None` without those files.
fn grpc_tls_updates(
    args: &Args,
    initial: Option<GrpcServerTls>,
    enrollment: Option<Arc<Enrollment>>,
) -> Option<tokio::sync::watch::Receiver<GrpcServerTls>> {
    let (cert, key, initial) = (
        args.grpc_tls_cert.clone()?,
        args.grpc_tls_key.clone()?,
        initial?,
    );
    let mut paths = vec![cert, key];
    paths.extend(args.grpc_client_ca.clone());
    Some(edgebeat_gateway::reload::watch_files(
        paths,
        edgebeat_gateway::reload::RELOAD_PERIOD,
        initial,
        move |mut files| {
            let client_ca = (files.len() > 2).then(|| files.remove(2));
            let key_pem = files.remove(1);
            let cert_pem = files.remove(0);
            let tls = GrpcServerTls {
                cert_pem,
                key_pem,
                client_ca_pem: match &enrollment {
                    Some(enrollment) => Some(enrollment.node_ca_pem(client_ca)),
                    None => client_ca,
                },
            };
            tls.check()?;
            Ok::<_, edgebeat_transports::tls::TlsError>(tls)
        },
    ))
}

/// The gRPC enrollment listener's TLS: --grpc-tls-cert and --grpc-tls-key when given, else
/// none (plain HTTP/2: the request is proved by the token or the node's key, and the
/// answer is signed).
///
/// Errors: either file cannot be read (named by its flag). The listener never falls back
/// to plain HTTP/2 when TLS was asked for.
fn enrollment_tls(args: &Args) -> anyhow::Result<Option<GrpcServerTls>> {
    let (Some(cert), Some(key)) = (&args.grpc_tls_cert, &args.grpc_tls_key) else {
        return Ok(None);
    };
    let read = |flag: &str, path: &PathBuf| {
        edgebeat_hw::read_bounded(path, edgebeat_hw::MAX_PEM_FILE_BYTES)
            .with_context(|| format!("{flag} {}", path.display()))
    };
    Ok(Some(GrpcServerTls {
        cert_pem: read("--grpc-tls-cert", cert)?,
        key_pem: read("--grpc-tls-key", key)?,
        client_ca_pem: None,
    }))
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

/// The gRPC flags that mean nothing without --grpc-listen are an error, not silently ignored.
fn check_no_grpc_flags(args: &Args) -> anyhow::Result<()> {
    flags_need(
        "--grpc-listen",
        &[
            ("--grpc-tls-cert", args.grpc_tls_cert.is_some()),
            ("--grpc-client-ca", args.grpc_client_ca.is_some()),
            (
                "--require-node-identity",
                args.require_node_identity.is_some(),
            ),
        ],
    )
}

/// Errors with "`flag` needs `parent`" for the first of `flags` that is set (`parent` is
/// not).
fn flags_need(parent: &str, flags: &[(&str, bool)]) -> anyhow::Result<()> {
    match flags.iter().find(|(_, set)| *set) {
        Some((flag, _)) => anyhow::bail!("{flag} needs {parent}"),
        None => Ok(()),
    }
}

/// The gateway's one security posture, from the configured ingresses: at least one
/// ingress; every ingress requires node identities ([`Posture::Identified`]) unless
/// --allow-unidentified-agents, and then each unidentified ingress is logged as a warning.
///
/// Errors: no ingress, or an ingress that lets unidentified agents in without the opt-in;
/// the message names the flags that fix it.
fn posture(
    args: &Args,
    grpc: Option<&GrpcServerOptions>,
    mqtt: Option<&MqttIngressOptions>,
) -> anyhow::Result<Posture> {
    if grpc.is_none() && mqtt.is_none() {
        anyhow::bail!(
            "no ingress: pass --grpc-listen (with --grpc-client-ca for mTLS), --mqtt-endpoint (with --mqtt-node-ca for signed messages), or both"
        );
    }
    let mut unidentified = Vec::new();
    if grpc.is_some_and(|g| !g.require_node_identity) {
        unidentified.push(
            "gRPC lets in agents without a node certificate (add --grpc-tls-cert, --grpc-tls-key and --grpc-client-ca, without --require-node-identity=false)",
        );
    }
    if mqtt.is_some_and(|m| !m.signatures.as_ref().is_some_and(|s| s.required)) {
        unidentified.push(
            "MQTT lets in unsigned messages (add --mqtt-node-ca, without --mqtt-require-signatures=false)",
        );
    }
    match (unidentified.is_empty(), args.allow_unidentified_agents) {
        (true, false) => Ok(Posture::Identified),
        (true, true) => {
            tracing::info!(
                "--allow-unidentified-agents has no effect: every ingress requires node identities"
            );
            Ok(Posture::Identified)
        }
        (false, true) => {
            for ingress in &unidentified {
                tracing::warn!(
                    "--allow-unidentified-agents: {ingress}; anyone who reaches it can write any node that has not spoken with its identity"
                );
            }
            Ok(Posture::AllowUnidentified)
        }
        (false, false) => anyhow::bail!(
            "{}; require node identities there, or pass --allow-unidentified-agents to accept that anyone who reaches it can write nodes",
            unidentified.join("; ")
        ),
    }
}

#[cfg(test)]
#[path = "main/tests.rs"]
mod tests;
