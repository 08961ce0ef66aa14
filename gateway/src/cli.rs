//! The `edgebeat-gateway` command line: clap types only, parsed by `main` and handed to
//! [`crate::server::Server`] (or to a subcommand in [`crate::commands`]).

// The doc comments below are clap's --help text, read as plain text: `<name>` is a
// placeholder there, not HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

/// Receives edgebeat heartbeats and writes Node status and Leases to Kubernetes.
#[derive(clap::Parser, Debug, Clone)]
#[command(version, about)]
// The gRPC and MQTT security flags mean nothing without their ingress: each group needs it.
#[command(group(clap::ArgGroup::new("grpc_security")
    .args(["grpc_tls_cert", "grpc_client_ca", "require_node_identity"])
    .multiple(true)
    .requires("grpc_listen")))]
#[command(group(clap::ArgGroup::new("resource_metrics")
    .args(["resource_metrics_address", "resource_metrics_tls_cert", "resource_metrics_client_ca"])
    .multiple(true)
    .requires("resource_metrics_listen")))]
#[command(group(clap::ArgGroup::new("mqtt_security")
    .args(["mqtt_ca_file", "mqtt_cert_file", "mqtt_node_ca", "mqtt_require_signatures"])
    .multiple(true)
    .requires("mqtt_endpoint")))]
pub struct Args {
    /// What else to do instead of serving (`token create`).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Address of the gRPC listener, e.g. `0.0.0.0:7443`; without it the gateway serves no
    /// gRPC (an MQTT-only site has no listener to bypass its signatures through). Needs
    /// --grpc-client-ca (mTLS) unless --allow-unidentified-agents.
    #[arg(long, value_name = "ADDR")]
    pub grpc_listen: Option<SocketAddr>,
    /// Let in agents without a node identity: gRPC without --grpc-client-ca (or with
    /// --require-node-identity=false) and MQTT without --mqtt-node-ca (or with
    /// --mqtt-require-signatures=false). Anyone who can reach such an ingress can then
    /// write any node that has not spoken with its identity. Off by default: then every
    /// ingress must require node identities, or the gateway does not start. Logged as a
    /// warning at start and exported as edgebeat_gateway_unidentified_agents_allowed.
    #[arg(long)]
    pub allow_unidentified_agents: bool,
    /// Most nodes one replica keeps state for; messages of further nodes are refused
    /// (reason fleet_full, logged) before anything is allocated for them. Size it to the
    /// fleet a replica serves and the memory limit it runs under.
    #[arg(long, default_value_t = DEFAULT_MAX_NODES)]
    pub max_nodes: NonZeroUsize,
    /// Export the per-node series on /metrics (edgebeat_gateway_node_lease_age_seconds and
    /// edgebeat_gateway_node_clock_skew_seconds, two series per node). For large fleets,
    /// --per-node-metrics=false keeps /metrics to a fixed size; Lease ages then show in
    /// edgebeat_gateway_lease_age_seconds' buckets, without node names.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub per_node_metrics: bool,
    /// PEM certificate chain of the gRPC listener (with --grpc-tls-key): serve gRPC over TLS.
    /// Read again every 10 s with its key and --grpc-client-ca: a renewed certificate or CA
    /// bundle (cert-manager, a mounted Secret) is used for new handshakes, open connections
    /// keep theirs. During a CA change, put the old and the new CA in the bundle.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_key")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of --grpc-tls-cert.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_cert")]
    pub grpc_tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) agents' client certificates must chain to (mTLS; needs
    /// --grpc-tls-cert). The node name is taken from the certificate (CN=system:node:<name>,
    /// O=system:nodes) and an agent may only speak for that node.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_cert")]
    pub grpc_client_ca: Option<PathBuf>,
    /// Refuse gRPC streams without a node identity (UNAUTHENTICATED, counted as rejected).
    /// Default: true with --grpc-client-ca, false without. `--require-node-identity=false`
    /// with a client CA lets agents without a certificate in (unchecked), e.g. while a fleet
    /// moves to mTLS; a certificate that is presented must still be a node's.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub require_node_identity: Option<bool>,
    /// Address serving /healthz, /readyz (gRPC serving and, with --mqtt-endpoint, the MQTT
    /// shared subscription granted) and Prometheus /metrics.
    #[arg(long, default_value = "0.0.0.0:9102")]
    pub metrics_listen: SocketAddr,
    /// Address serving kubelet's resource metrics (`/metrics/resource`) for the nodes this
    /// replica holds, over HTTPS, e.g. `0.0.0.0:10250`: what metrics-server and `kubectl top
    /// node` read. Callers are authenticated as kubelet does (a client certificate from
    /// --resource-metrics-client-ca, or a bearer token by TokenReview) and authorized by a
    /// SubjectAccessReview for `get nodes/metrics`. Needs --resource-metrics-address,
    /// --resource-metrics-tls-cert and --resource-metrics-tls-key; README "kubectl top node".
    #[arg(
        long,
        value_name = "ADDR",
        requires_all = ["resource_metrics_address", "resource_metrics_tls_cert"]
    )]
    pub resource_metrics_listen: Option<SocketAddr>,
    /// Where the cluster reaches this replica's resource metrics, `IP` or `IP:PORT`,
    /// written as the address of type EdgebeatGateway (and the kubelet endpoint's port) of
    /// every node it writes, beside the board's own addresses. Over gRPC, the pod IP
    /// (`$(POD_IP)` from the downward API; the port is then the one bound): a node's stream
    /// is on one replica. Over MQTT with several replicas, which share every sample, the
    /// gateway Service's `CLUSTER-IP:PORT`, so that a replica's death changes nothing.
    #[arg(long, value_name = "IP[:PORT]", value_parser = parse_resource_metrics_address)]
    pub resource_metrics_address: Option<(std::net::IpAddr, Option<u16>)>,
    /// PEM serving certificate of --resource-metrics-listen (with
    /// --resource-metrics-tls-key), valid for --resource-metrics-address: metrics-server
    /// checks it against the cluster CA unless told otherwise
    /// (`--kubelet-certificate-authority`, `--kubelet-insecure-tls`).
    #[arg(long, value_name = "FILE", requires = "resource_metrics_tls_key")]
    pub resource_metrics_tls_cert: Option<PathBuf>,
    /// PEM private key of --resource-metrics-tls-cert.
    #[arg(long, value_name = "FILE", requires = "resource_metrics_tls_cert")]
    pub resource_metrics_tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) of client certificates taken as identities on
    /// --resource-metrics-listen (kubelet's --client-ca-file: the CA of kube-apiserver's
    /// --kubelet-client-certificate). Without it only bearer tokens authenticate.
    #[arg(long, value_name = "FILE")]
    pub resource_metrics_client_ca: Option<PathBuf>,
    /// Where the cluster is: `--kubeconfig`, `--server`, `--namespace`.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Enroll and rotate node certificates: boards with only a bootstrap token (`token
    /// create`) get their certificate through this gateway, as kubelet's TLS bootstrap
    /// (each one a CertificateSigningRequest, `kubectl get csr`), and rotate it before it
    /// expires. The site CA lives in the Secret edgebeat-site-ca of --namespace (made if
    /// absent, shared by every replica); it signs the node certificates, verifies them on
    /// every ingress (beside --grpc-client-ca and --mqtt-node-ca), and issues this
    /// gateway's own certificate (gRPC serving without --grpc-tls-cert, signed answers
    /// without --mqtt-answer-cert-file).
    #[arg(long)]
    pub enrollment: bool,
    /// Address of the gRPC enrollment listener (needs --enrollment), e.g. `0.0.0.0:7444`:
    /// boards without a certificate ask for one there (agents' transport.enrollmentEndpoint).
    /// It takes no client certificate; requests are limited per address and in all. Plain
    /// HTTP/2 (every request is proved and every answer signed), or TLS with
    /// --grpc-tls-cert.
    #[arg(long, value_name = "ADDR", requires = "enrollment")]
    pub grpc_enrollment_listen: Option<SocketAddr>,
    /// Who approves first enrollments (with --enrollment): `auto` approves every request
    /// proved by a valid bootstrap token for the node; `manual` leaves them to `kubectl
    /// certificate approve`. Rotations proved by the node's certificate are approved
    /// either way.
    #[arg(long, value_enum, default_value_t = CsrApproval::Auto)]
    pub csr_approval: CsrApproval,
    /// `spec.signerName` of the CertificateSigningRequests (with --enrollment). The default,
    /// `edgebeat.io/node-client`, is the gateway's own: it approves and signs with the site
    /// CA. `kubernetes.io/kube-apiserver-client-kubelet` is kubelet's: kube-controller-manager
    /// approves (its csrapproving controller, when the gateway's ServiceAccount may create
    /// `certificatesigningrequests/nodeclient`: `deploy/gateway/enrollment-kubelet-signer`)
    /// and signs, the certificates it issues also authenticate to kube-apiserver as the node,
    /// it needs --signer-ca, and a Node that exists without edgebeat's label gets none. No
    /// other signer name is taken.
    #[arg(long, value_name = "NAME", requires = "enrollment", default_value = crate::enrollment::DEFAULT_SIGNER_NAME)]
    pub signer_name: String,
    /// PEM file of the CA that signs for --signer-name (the cluster CA of
    /// kube-controller-manager's `--cluster-signing-cert-file`; in most clusters the
    /// ConfigMap `kube-root-ca.crt`): node certificates it issued are verified against it on
    /// every ingress and when they prove a rotation, beside the site CA. Read at start: a
    /// new cluster CA takes a restart of the gateway.
    #[arg(long, value_name = "FILE", requires = "enrollment")]
    pub signer_ca: Option<PathBuf>,
    /// Lifetime of the node certificates this gateway signs (`spec.expirationSeconds`),
    /// e.g. `8760h`; agents rotate at 70-90 % of it.
    #[arg(long, value_parser = parse_duration, default_value = "8760h")]
    pub certificate_lifetime: Duration,
    /// How long after its expiry a node certificate still proves a rotation, for a Node
    /// that still exists (a board that was offline when it expired); past it the board needs
    /// a new bootstrap token.
    #[arg(long, value_parser = parse_duration, default_value = "720h")]
    pub certificate_grace: Duration,
    /// Certificate requests per second this replica takes from all sources together (with
    /// --enrollment), in bursts of up to five seconds' worth; more get no answer and the
    /// agents ask again with backoff, so heartbeats keep their share of the gateway and
    /// the apiserver during an enrollment storm.
    #[arg(long, default_value_t = 100.0)]
    pub enrollment_rate: f64,
    /// Certificate requests per second from one source (a gRPC client's IP address, or
    /// over MQTT one node), in bursts of up to four seconds' worth. Raise it for sites
    /// whose boards share one NAT address.
    #[arg(long, default_value_t = 5.0)]
    pub enrollment_rate_per_source: f64,
    /// Client-side limit on apiserver requests per second; 0 (the default) for none, as
    /// kubelet's heartbeat client. A fixed rate shared by a whole fleet expires nodes once
    /// the fleet outgrows it: the gateway bounds concurrency (--max-inflight) and backs off
    /// on 429/5xx instead.
    #[arg(long, default_value_t = 0)]
    pub qps: u64,
    /// HTTP to kube-apiserver, as client-go by default (`auto`): over TLS HTTP/2 when the
    /// apiserver offers it by ALPN (one connection carries every call, PINGs every 30 s find
    /// a dead one), else HTTP/1.1; over plain `http://` (e.g. `kubectl proxy`) HTTP/1.1.
    /// `2` also speaks HTTP/2 over `http://` (prior knowledge, for servers that speak h2c);
    /// `1.1` never HTTP/2 (a connection per call in flight).
    #[arg(long, value_name = "VERSION", default_value = "auto")]
    pub apiserver_http: crate::apiserver::client::HttpVersion,
    /// Apiserver requests in flight at once; Node, status and Event calls may hold at most
    /// half, so Lease renewals always get through.
    #[arg(long, default_value_t = 256)]
    pub max_inflight: usize,
    /// Oldest lease renewal still written, in seconds; older ones are dropped.
    #[arg(long, default_value_t = 5)]
    pub max_renewal_age_seconds: u64,
    /// MQTT broker to take heartbeats from: `mqtt://host[:1883]`, or `mqtts://host[:8883]`
    /// for TLS (with --mqtt-ca-file); off when not set. Several (repeated, or separated by
    /// commas) name the nodes of one broker cluster: the gateway subscribes on the first
    /// and, after a lost connection, on the next in turn.
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    pub mqtt_endpoint: Vec<String>,
    /// PEM CA certificate(s) the broker's certificate must chain to (`mqtts://`).
    #[arg(long, value_name = "FILE")]
    pub mqtt_ca_file: Option<PathBuf>,
    /// PEM client certificate presented to the broker (with --mqtt-key-file; `mqtts://`).
    #[arg(long, value_name = "FILE", requires = "mqtt_key_file")]
    pub mqtt_cert_file: Option<PathBuf>,
    /// PEM private key of --mqtt-cert-file.
    #[arg(long, value_name = "FILE", requires = "mqtt_cert_file")]
    pub mqtt_key_file: Option<PathBuf>,
    /// PEM site CA that signs node certificates: verify agents' end-to-end message
    /// signatures against the certificates they publish on `P/certificates/<node>`; a
    /// verified message speaks only for the node its certificate names. Needs
    /// --mqtt-answer-cert-file and --mqtt-answer-key-file: agents that sign take only
    /// signed answers.
    #[arg(long, value_name = "FILE")]
    pub mqtt_node_ca: Option<PathBuf>,
    /// PEM certificate chain of this gateway's answer key (with --mqtt-answer-key-file): a
    /// server certificate from the --mqtt-node-ca site CA, valid for the DNS name
    /// `edgebeat-gateway`. Every answer to a signed MQTT message is signed with it, so that
    /// agents can tell the gateway's answers from anyone's on the broker.
    #[arg(long, value_name = "FILE", requires = "mqtt_answer_key_file")]
    pub mqtt_answer_cert_file: Option<PathBuf>,
    /// PEM private key (ECDSA P-256 or Ed25519) of --mqtt-answer-cert-file.
    #[arg(long, value_name = "FILE", requires = "mqtt_answer_cert_file")]
    pub mqtt_answer_key_file: Option<PathBuf>,
    /// Refuse unsigned MQTT messages (counted as rejected, reason `unsigned`). Default: true
    /// with --mqtt-node-ca. `=false` accepts unsigned ones without an identity, while a fleet
    /// moves to signing; signed ones are still verified.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub mqtt_require_signatures: Option<bool>,
    /// Largest difference, in seconds, between a signed MQTT message's wall time and this
    /// gateway's clock (with --mqtt-node-ca). Bounds how late a recorded message can be
    /// replayed to a replica that does not remember the node's boot; agents need a clock
    /// within it (NTP), as they need one for TLS.
    #[arg(long, default_value_t = 30)]
    pub mqtt_max_clock_skew_seconds: u64,
    /// Write as each node: every apiserver request carries `Impersonate-User:
    /// system:node:<name>` and `Impersonate-Group: system:nodes`, so the apiserver's Node
    /// authorizer and NodeRestriction apply too. Needs the RBAC in
    /// deploy/gateway/impersonation.
    #[arg(long)]
    pub impersonate_nodes: bool,
    /// MQTT client ID of this replica (default `edgebeat-gateway-<pid>`; unique per replica).
    #[arg(long)]
    pub mqtt_client_id: Option<String>,
    /// MQTT topic prefix (as the agents' `transport.topicPrefix`).
    #[arg(long, default_value = "edgebeat/v1")]
    pub mqtt_topic_prefix: String,
    /// MQTT 5 shared-subscription group: replicas in one group split the fleet.
    #[arg(long, default_value = "edgebeat-gateway")]
    pub mqtt_share_group: String,
    /// Follow the site brokers' bridge notifications on `<prefix>/sites/#` (a site's
    /// uplink down marks its nodes SiteUnreachable at once). `false` when the broker's ACL
    /// does not let the gateway read them.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub mqtt_site_uplinks: bool,
    /// MQTT username (with --mqtt-password-file).
    #[arg(long, requires = "mqtt_password_file")]
    pub mqtt_username: Option<String>,
    /// File holding the MQTT password.
    #[arg(long, requires = "mqtt_username")]
    pub mqtt_password_file: Option<PathBuf>,
    /// Log filter: a level (info, debug…) or `target=level,…`.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Log line format: `text` (coloured only on a terminal without NO_COLOR) or `json` (one
    /// object per line: timestamp, level, target, message, the event's fields, spans).
    /// kubelet's name for it, `--logging-format`, is accepted too.
    #[arg(
        long,
        alias = "logging-format",
        value_name = "text|json",
        default_value = "text"
    )]
    pub log_format: edgebeat_transports::observe::LogFormat,
}

/// `--max-nodes`' default, [`crate::message_path::DEFAULT_MAX_NODES`].
const DEFAULT_MAX_NODES: NonZeroUsize =
    match NonZeroUsize::new(crate::message_path::DEFAULT_MAX_NODES) {
        Some(n) => n,
        None => panic!("DEFAULT_MAX_NODES is 0"),
    };

/// Where the gateway's cluster is (both for serving and for `token create`).
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// kubeconfig file; without it: $KUBECONFIG, ~/.kube/config, then in-cluster config.
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// apiserver URL to use instead of a kubeconfig (plain http, no auth: for the stand-in).
    #[arg(long, value_name = "URL", global = true)]
    pub server: Option<String>,
    /// Namespace of the site CA and bootstrap token Secrets (default: $POD_NAMESPACE, else
    /// edgebeat-system).
    #[arg(long, global = true)]
    pub namespace: Option<String>,
}

impl ClusterArgs {
    /// `--namespace`, else `$POD_NAMESPACE` when set and not empty, else `edgebeat-system`.
    pub fn namespace(&self) -> String {
        self.namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|n| !n.is_empty())
            })
            .unwrap_or_else(|| "edgebeat-system".to_owned())
    }

    /// The apiserver client config from `--server`, `--kubeconfig` or the environment
    /// (`$KUBECONFIG`, `~/.kube/config`, then the in-cluster service account), as kubectl
    /// and client-go find it.
    ///
    /// # Errors
    /// [`KubeConfigError`]: a `--server` that is not a URL, a `--kubeconfig` that cannot be
    /// read or used, or no configuration found at all; each names the flag that fixes it.
    pub async fn kube_config(&self) -> Result<kube::Config, KubeConfigError> {
        let mut config = self.located_config().await?;
        config
            .headers
            .push((http::header::USER_AGENT, user_agent()));
        Ok(config)
    }

    /// The configuration `--server`, `--kubeconfig` or the environment names.
    async fn located_config(&self) -> Result<kube::Config, KubeConfigError> {
        Ok(match (&self.server, &self.kubeconfig) {
            (Some(url), _) => {
                kube::Config::new(url.parse().map_err(|source| KubeConfigError::Server {
                    url: url.clone(),
                    source,
                })?)
            }
            (None, Some(path)) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                    KubeConfigError::ReadKubeconfig {
                        path: path.clone(),
                        source,
                    }
                })?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .map_err(|source| KubeConfigError::UseKubeconfig {
                        path: path.clone(),
                        source,
                    })?
            }
            (None, None) => kube::Config::infer().await?,
        })
    }
}

/// The `User-Agent` of every apiserver request, in client-go's form (`<program>/<version>
/// (<os>/<arch>)`, `k8s.io/client-go/rest/config.go: DefaultKubernetesUserAgent`), so the
/// audit log (`userAgent`) and proxies name the gateway, as they name kubelet
/// (`kubelet/v1.36.3 (linux/arm64) kubernetes/<commit>`).
pub fn user_agent() -> http::HeaderValue {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        other => other,
    };
    http::HeaderValue::from_str(&format!(
        "edgebeat-gateway/v{} ({}/{arch})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS
    ))
    .unwrap_or(http::HeaderValue::from_static("edgebeat-gateway"))
}

/// Why [`ClusterArgs::kube_config`] found no usable apiserver configuration; each names
/// the flag that fixes it (the cause follows as the error's source).
#[derive(Debug, thiserror::Error)]
pub enum KubeConfigError {
    /// `--server` is not a URL.
    #[error("--server {url:?}")]
    Server {
        /// The text given.
        url: String,
        /// Why it is not a URL.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// The `--kubeconfig` file cannot be read or parsed.
    #[error("--kubeconfig {}", path.display())]
    ReadKubeconfig {
        /// The file given.
        path: PathBuf,
        /// Why it cannot be read.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The `--kubeconfig` file was read but names no usable context, cluster or user.
    #[error("--kubeconfig {}", path.display())]
    UseKubeconfig {
        /// The file given.
        path: PathBuf,
        /// What it lacks.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither flag, and neither `$KUBECONFIG`, `~/.kube/config` nor an in-cluster service
    /// account.
    #[error("no kubeconfig or in-cluster config found; pass --kubeconfig")]
    NotFound(#[from] kube::config::InferConfigError),
}

/// The subcommands: what the binary does instead of serving.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Command {
    /// Bootstrap tokens for enrolling boards (the gateway must run with --enrollment).
    #[command(subcommand)]
    Token(TokenCommand),
    /// The answer CAs, which issue the keys the gateway signs its answers with (README
    /// "Rotating the answer CA").
    #[command(subcommand)]
    AnswerCa(AnswerCaCommand),
}

/// `answer-ca`'s subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum AnswerCaCommand {
    /// One step of a rotation of the answer CA in the Secret edgebeat-site-ca of
    /// --namespace: the first run adds a new answer CA that agents learn at their next
    /// certificate; the second, once they have (a node certificate lifetime later),
    /// retires the old one. Restart the gateway after each (`kubectl rollout restart`).
    Rotate,
}

/// `token`'s subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum TokenCommand {
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
pub enum CsrApproval {
    /// Approve every proved request.
    Auto,
    /// First enrollments wait for `kubectl certificate approve`.
    Manual,
}

/// A duration flag that is not a Go duration above 0.
#[derive(Debug, thiserror::Error)]
#[error(
    "{0:?}: give a duration above 0 in Go's grammar (as kubectl and KubeletConfiguration), e.g. 24h, 8760h or 1h30m"
)]
pub struct BadDuration(pub String);

/// A duration flag in Go's grammar ([`edgebeat_hw::parse_duration`], as the agent's
/// configuration file), e.g. `24h` or `1h30m`, above 0.
///
/// # Errors
/// [`BadDuration`], naming the text, for anything else (`0`, or `7d`: Go has no day unit).
pub fn parse_duration(text: &str) -> Result<Duration, BadDuration> {
    match edgebeat_hw::parse_duration(text) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        _ => Err(BadDuration(text.to_owned())),
    }
}

/// `--resource-metrics-address`: `IP`, or `IP:PORT` (`[IPv6]:PORT`).
///
/// # Errors
/// [`AddressError`] when the text is neither form.
fn parse_resource_metrics_address(
    text: &str,
) -> Result<(std::net::IpAddr, Option<u16>), AddressError> {
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok((address.ip(), Some(address.port())));
    }
    text.parse::<std::net::IpAddr>()
        .map(|ip| (ip, None))
        .map_err(|_| AddressError(text.to_owned()))
}

/// A `--resource-metrics-address` that is neither an IP nor `IP:PORT` (the text given).
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is neither an IP nor IP:PORT (e.g. 10.0.0.7 or 10.96.0.20:10250)")]
struct AddressError(String);
