//! `edgebeat-fleet`: runs a simulated fleet ([`edgebeat_tests::fleet`]) against the real
//! gateway binary and prints what it carried.
//!
//! It starts the stand-in apiserver in-process (request recording off, optional latency and
//! overload), Mosquitto for `--transport mqtt` (or uses the nodes of a broker cluster
//! already running, `--mqtt-broker`), and the gateway as a child process
//! (`--gateway-bin`, plaintext with `--allow-unidentified-agents`, or as told by
//! `--gateway-arg`), then N simulated agents on the real transports. Every `--report-every`
//! seconds it prints one line of figures; at the end a summary as `key=value` lines:
//!
//! - `renewals_ok`, `renewals_failed`, `status_ok`, `registrations`, `messages_per_s`;
//! - `ack_p50_ms`, `ack_p99_ms`, `ack_max_ms`: renewal send → ack, which includes the
//!   gateway's Lease PUT (the ack is sent after the write);
//! - `lease_age_max_s`, `lease_age_p99_s`: now − renewTime of the Leases the stand-in holds,
//!   sampled every second after the warm-up (the ramp plus one lease duration);
//!   `expired_samples`, `expired_nodes`: Leases older than `nodeLeaseDurationSeconds` at a
//!   sample (a node the node lifecycle controller would have marked NotReady);
//! - `gateway_rss_mib` (VmRSS at the end), `gateway_rss_per_node_kib`, `gateway_cpu_s_per_s`;
//! - `sim_rss_mib`, `sim_rss_per_node_kib` (this process, the stand-in included);
//! - `apiserver_connections_max` (most TCP connections open to the stand-in apiserver at a
//!   progress line, every replica's clients together) and `apiserver_connections_accepted`
//!   (over the run);
//! - for a soak, from the progress lines after the warm-up: `gateway_rss_slope_kib_per_min`
//!   (least-squares slope of the gateway's VmRSS), `gateway_fds_first`/`_last` (entries of
//!   /proc/<pid>/fd, summed over replicas), and `broker_rss_slope_kib_per_min`,
//!   `broker_fds_first`/`_last` for Mosquitto;
//! - `lease_writes` (every Lease write the stand-in took), `lease_writes_beyond_renewals_sent`
//!   (summed over nodes, writes above the renewals the transport took for the node: a
//!   renewal written twice; a renewal taken but not written could hide one, so it is
//!   read beside `renewals_failed`),
//!   `lease_writes_unanswered` (writes minus renewals answered OK, those in flight at the
//!   end included);
//! - with `--kill-replica-after`: `replica_killed_at_s` and
//!   `renewal_failures_until_s_after_kill` (the last failed renewal, after the kill); with
//!   `--kill-broker-after`: `broker_killed_at_s` and the same failure figure;
//! - `broker_cpu_s_per_s`, `broker_cpu_us_per_message` (broker CPU over the measured
//!   window per heartbeat message the fleet sent; each crosses the broker twice, up and as
//!   its ack down), `broker_rss_mib` at the end: of Mosquitto, or summed over `--broker-pid`;
//! - `apiserver_<METHOD>_<resource>_per_node_hour`: requests the stand-in answered 2xx.
//! - with `--sites`: `site_cuts` (whole-site cuts made, `--site-cut-every`),
//!   `site_cuts_caught`, `site_false_partitions` (partition Events matching no cut, e.g. from
//!   `--churn-per-minute` single-node silences), `site_partition_events`, and
//!   `site_cut_to_condition_s_median` / `_max` (cut to the gateway's Event, whole seconds);
//! - with `--apiserver-outage-after`: `outage_s` (how long it lasted), `outage_log_lines`
//!   and `outage_log_bytes` (the first replica's log from the outage's start to the end of
//!   the run, which comes at least 20 s after the outage's end), `outage_error_lines`,
//!   `outage_first_error_s` (from the outage's start to the first ERROR line; polled every
//!   50 ms), `outage_recovered_line` (1 when a line says the apiserver takes writes again);
//! - `metrics_series`, `metrics_scrape_bytes`, `metrics_scrape_ms_median`: a scrape of the
//!   first replica's `/metrics` at the end (not with `--ack-only`);
//! - `renewal_usage_every`: 2 when every second renewal carries the node's resource usage
//!   (the default, as real agents: those renewals are about 12 bytes larger than before
//!   the gateway served resource metrics, so message sizes and the broker's and gateway's
//!   work per renewal are slightly up on figures measured before), 0 with `--no-usage`;
//! - with `--scrape-every`: `scrape_cycles`, `scrape_ok` (answered 200), `scrape_not_ok`
//!   (any other status, and errors), `scrape_errors` (no answer: connection, TLS, HTTP/2,
//!   timeout), `scrape_status_<code>` for each other status seen, `scrape_cycle_ms_median`
//!   and `scrape_cycle_ms_max` (a cycle: every node scraped once), `scrape_body_bytes_mean`
//!   (of a 200), `scrape_connections` (TLS connections opened: 1 unless the gateway closed
//!   one, e.g. at its maximum connection age of 5 minutes), and the apiserver's
//!   `apiserver_post_subjectaccessreviews_201_per_node_hour`. The gateway CPU and RSS
//!   figures then include the scrapes' cost.
//!
//! With `--scrape-every SECONDS` it also plays metrics-server: the gateway (each replica)
//! serves kubelet's resource metrics (`--resource-metrics-listen` on a port of its
//! choosing, found in its log, with a serving certificate and a client CA made for the run)
//! and, from 25 s after the ramp (when every node has sent a first sample), every SECONDS
//! every node's `/nodes/<node>/metrics/resource` is fetched over one TLS connection with a
//! client certificate (CN=`system:serviceaccount:kube-system:metrics-server`) and ALPN
//! `h2`, at most 256 requests in flight on it (the gateway's HTTP/2 stream limit). All
//! nodes are scraped at the first replica: over gRPC (one replica) it holds every node, and
//! over MQTT replicas share their samples, so the first holds every node's; the other
//! replicas serve too but are not scraped. The stand-in apiserver allows every
//! SubjectAccessReview (it is not an authorizer), so the gateway asks one per
//! 5 minutes for the scraper's user, as it would of a cluster that allows it.
//!
//! With `--ack-only` the gateway is replaced by a subscriber that only acknowledges: this
//! binary again, as a child process serving the real gRPC or MQTT ingress code with a
//! handler that answers every message OK at once, writing nothing. Its figures are the
//! transport's and the broker's ceiling on this machine, beside which a gateway run's
//! throughput reads (no Lease is written, so the Lease-age figures stay empty).
//!
//! Every figure it prints comes from this run; `scripts/fleet.sh` builds and runs it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use edgebeat_tests::broker::Broker;
use edgebeat_tests::fleet::{
    FleetEnrollment, FleetOptions, FleetStats, FleetTransport, Silences, quantile, run_fleet,
};
use edgebeat_tests::process::spawn_async;
use edgebeat_tests::procfs::{open_files, vm_rss_kib};
use edgebeat_tests::standin::StandIn;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Transport {
    Grpc,
    Mqtt,
}

/// Simulated fleet against the real gateway binary.
#[derive(Parser, Debug)]
struct Args {
    /// Simulated nodes.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Transport of every node.
    #[arg(long, value_enum, default_value = "grpc")]
    transport: Transport,
    /// Seconds to run after the ramp.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Seconds over which nodes join.
    #[arg(long, default_value_t = 10)]
    ramp: u64,
    /// The gateway binary (build it with `cargo build --release -p edgebeat-gateway`).
    #[arg(long, default_value = "target/release/edgebeat-gateway")]
    gateway_bin: PathBuf,
    /// Extra gateway flag (repeatable), e.g. `--gateway-arg=--qps=50`.
    #[arg(long = "gateway-arg", allow_hyphen_values = true)]
    gateway_args: Vec<String>,
    /// Stand-in apiserver latency per request, milliseconds (a real apiserver answers a
    /// Lease PUT in 5–20 ms).
    #[arg(long, default_value_t = 10)]
    apiserver_latency_ms: u64,
    /// Stand-in overload mode: more requests in flight than this are answered 429.
    #[arg(long)]
    apiserver_max_inflight: Option<usize>,
    /// Lease renew interval, seconds (kubelet: 10).
    #[arg(long, default_value_t = 10.0)]
    renew_interval: f64,
    /// Reboots per minute across the fleet.
    #[arg(long, default_value_t = 0.0)]
    reboots_per_minute: f64,
    /// Chance per status computation that a node's MemoryPressure flips.
    #[arg(long, default_value_t = 0.001)]
    flip_probability: f64,
    /// Each node also reports the agent's six health conditions (all False).
    #[arg(long)]
    health_conditions: bool,
    /// Spread the nodes over this many sites (`topology.kubernetes.io/zone` site-NN, node i
    /// in site i mod N); 0: no sites.
    #[arg(long, default_value_t = 0)]
    sites: usize,
    /// Single nodes falling silent per minute across the fleet (churn: a board off), each
    /// for --churn-down seconds. Needs --sites.
    #[arg(long, default_value_t = 0.0)]
    churn_per_minute: f64,
    /// How long a churned node stays silent, seconds.
    #[arg(long, default_value_t = 120)]
    churn_down: u64,
    /// Cut a random site's uplink (every node of it silent at once) every this many seconds
    /// after the ramp, for --site-cut-for seconds; 0: never. Needs --sites.
    #[arg(long, default_value_t = 0)]
    site_cut_every: u64,
    /// How long a site cut lasts, seconds.
    #[arg(long, default_value_t = 60)]
    site_cut_for: u64,
    /// Where the first replica's log goes (its stdout and stderr: warnings and errors, and
    /// with --scrape-every its server start lines); discarded without it.
    #[arg(long, value_name = "FILE")]
    gateway_log: Option<PathBuf>,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 10)]
    report_every: u64,
    /// gRPC over mutual TLS, as deploy/gateway runs it: a site CA made for the run signs
    /// the gateway's certificate and each node's (CN=system:node:<name>, O=system:nodes),
    /// and the gateway runs in its default identified posture.
    #[arg(long)]
    mtls: bool,
    /// Gateway replicas on one shared MQTT subscription (`--transport mqtt` only); their
    /// RSS and CPU are summed in the figures.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Seconds after the ramp at which the last replica is killed with SIGKILL, mid-write
    /// (needs `--replicas` 2 or more): the others must carry its share of the fleet.
    #[arg(long, value_name = "SECONDS")]
    kill_replica_after: Option<u64>,
    /// Seconds after the kill at which a new replica takes the killed one's place, as a
    /// rescheduled pod would.
    #[arg(long, value_name = "SECONDS", requires = "kill_replica_after")]
    restart_replica_after: Option<u64>,
    /// Nodes start with nothing but a bootstrap token (`--transport grpc`): the gateway runs
    /// with `--enrollment` and a gRPC enrollment listener (its site CA in the stand-in, its
    /// gRPC listener on mutual TLS with its own certificate), the token comes from
    /// `edgebeat-gateway token create`, and each node enrolls as the agent does before it
    /// heartbeats with its certificate. Prints when the last node got its certificate and
    /// when the last one had a renewal written with it. Node starts still follow --ramp
    /// (`--ramp 0`: all at once).
    #[arg(long, conflicts_with_all = ["mtls", "ack_only"])]
    enroll: bool,
    /// Replace the gateway by a subscriber that only acknowledges (see the module docs).
    #[arg(long, conflicts_with_all = ["mtls", "gateway_args"])]
    ack_only: bool,
    /// Measure the stand-in apiserver alone instead: `--nodes` Leases renewed by 256
    /// concurrent kube-rs clients' PUTs (each with the resourceVersion of its last write)
    /// for `--duration` seconds at `--apiserver-latency-ms`; prints the PUTs per second it
    /// answered, the ceiling a fleet run's apiserver writes are read beside.
    #[arg(long, conflicts_with_all = ["ack_only", "mtls"])]
    standin_ceiling: bool,
    /// A node of an MQTT broker cluster already running, `host:port` (repeatable), used
    /// instead of starting Mosquitto: node `i` of the fleet dials broker `i mod n` first,
    /// replica `r` subscribes on broker `r mod n` first, and each fails over to the others
    /// in turn (`--mqtt-endpoint` given as the whole list).
    #[arg(
        long = "mqtt-broker",
        value_name = "HOST:PORT",
        conflicts_with = "ack_only"
    )]
    mqtt_brokers: Vec<String>,
    /// Process ID of each `--mqtt-broker`, in the same order (repeatable): their RSS and CPU
    /// are the broker figures, and `--kill-broker-after` kills the first.
    #[arg(long = "broker-pid", value_name = "PID", requires = "mqtt_brokers")]
    broker_pids: Vec<u32>,
    /// Seconds after the ramp at which the first `--mqtt-broker` is killed with SIGKILL
    /// (needs its `--broker-pid`): the agents and the replica on it must fail over to the
    /// other nodes of the cluster.
    #[arg(
        long,
        value_name = "SECONDS",
        requires = "broker_pids",
        conflicts_with = "kill_replica_after"
    )]
    kill_broker_after: Option<u64>,
    /// Play metrics-server every this many seconds (metrics-server's default resolution is
    /// 15): scrape every node's resource metrics at the first gateway replica (see the
    /// module docs). Off without it.
    #[arg(
        long,
        value_name = "SECONDS",
        conflicts_with_all = ["ack_only", "standin_ceiling", "no_usage"]
    )]
    scrape_every: Option<u64>,
    /// Seconds after the ramp at which the stand-in apiserver stops taking requests: every
    /// new request is answered 503 while watches already open stay open (as in a
    /// kube-apiserver's drain, or etcd trouble), for `--apiserver-outage-for` seconds. The
    /// gateway then logs at its default level (info) and the summary tells what its log
    /// said of the outage (see the module docs).
    #[arg(long, value_name = "SECONDS", requires = "gateway_log")]
    apiserver_outage_after: Option<u64>,
    /// How long the `--apiserver-outage-after` outage lasts, seconds.
    #[arg(long, default_value_t = 60)]
    apiserver_outage_for: u64,
    /// Simulated nodes send no resource usage on their renewals (by default every second
    /// renewal carries it, as real agents' do): renewals as before the gateway served
    /// resource metrics, for comparisons with figures measured then.
    #[arg(long)]
    no_usage: bool,
    /// Internal: be that subscriber, on `grpc:<port>` or `mqtt:<host>:<port>`.
    #[arg(long, hide = true)]
    serve_ack_only: Option<String>,
}

/// The handler of `--ack-only`: every message answered OK at once (a Register as
/// registered), nothing written.
struct AckOnly;

impl edgebeat_transports::ingress::Handler for AckOnly {
    async fn handle(
        &self,
        _peer: &edgebeat_transports::ingress::Peer,
        message: edgebeat_proto::AgentMessage,
    ) -> Option<edgebeat_proto::Answer> {
        Some(match message.kind {
            Some(edgebeat_proto::agent_message::Kind::Register(_)) => {
                edgebeat_proto::Answer::Registered {
                    headers: edgebeat_proto::HeaderForm::Full,
                    resend_status: false,
                    certificate_due: false,
                }
            }
            _ => edgebeat_proto::Answer::WRITTEN,
        })
    }

    fn rejected(
        &self,
        _peer: &edgebeat_transports::ingress::Peer,
        reason: edgebeat_transports::ingress::RejectReason,
        detail: &str,
    ) {
        eprintln!("refused: {} {detail}", reason.as_str());
    }
}

/// Runs the `--ack-only` subscriber until killed; prints `ready` once it serves.
async fn serve_ack_only(spec: &str) -> anyhow::Result<()> {
    let handler = Arc::new(AckOnly);
    if let Some(port) = spec.strip_prefix("grpc:") {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port.parse()?)).await?;
        println!("ready");
        edgebeat_transports::grpc::serve(
            listener,
            handler,
            edgebeat_transports::grpc::GrpcServerOptions::default(),
            std::future::pending(),
        )
        .await?;
    } else if let Some(addr) = spec.strip_prefix("mqtt:") {
        let (host, port) = addr.rsplit_once(':').context("mqtt:<host>:<port>")?;
        let mut options = edgebeat_transports::mqtt::MqttIngressOptions::new(
            host,
            port.parse()?,
            "edgebeat-fleet-ack-only",
        );
        let (subscribed, mut watch) = tokio::sync::watch::channel(false);
        options.subscribed = Some(Arc::new(subscribed));
        tokio::spawn(async move {
            if watch.wait_for(|s| *s).await.is_ok() {
                println!("ready");
            }
        });
        edgebeat_transports::mqtt::serve(options, handler, std::future::pending()).await?;
    } else {
        anyhow::bail!("--serve-ack-only {spec:?}: expected grpc:<port> or mqtt:<host>:<port>");
    }
    Ok(())
}

/// `--apiserver-http=2` unless `--gateway-arg` chose: the stand-in serves HTTP/2 without TLS
/// (h2c), and the gateway's default over plain `http://` is HTTP/1.1, as client-go's; the
/// benchmarks measure the gateway as it talks to a real apiserver over TLS, which is HTTP/2.
fn apiserver_http(gateway_args: &[String]) -> Option<&'static str> {
    (!gateway_args
        .iter()
        .any(|a| a.starts_with("--apiserver-http")))
    .then_some("--apiserver-http=2")
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// `--standin-ceiling` (see [`Args::standin_ceiling`]).
async fn standin_ceiling(
    standin: &edgebeat_tests::standin::StandInHandle,
    args: &Args,
) -> anyhow::Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    const WORKERS: usize = 256;
    let client = edgebeat_gateway::apiserver::kube_client(
        kube::Config::new(standin.url().parse()?),
        0,
        &Default::default(),
    )?;
    let api: kube::Api<Lease> =
        kube::Api::namespaced(client, edgebeat_gateway::bodies::LEASE_NAMESPACE);
    let mut leases = Vec::with_capacity(args.nodes);
    for i in 0..args.nodes {
        let lease = edgebeat_gateway::bodies::new_lease(
            &format!("ceiling-{i:05}"),
            "00000000-0000-0000-0000-000000000000",
            40,
            jiff::Timestamp::now(),
        );
        leases.push(api.create(&Default::default(), &lease).await?);
    }
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let end = tokio::time::Instant::now() + Duration::from_secs(args.duration);
    let started = tokio::time::Instant::now();
    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let mut mine: Vec<Lease> = leases
            .iter()
            .skip(worker)
            .step_by(WORKERS)
            .cloned()
            .collect();
        let (api, written, failed) = (api.clone(), written.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            let mut i = 0;
            while !mine.is_empty() && tokio::time::Instant::now() < end {
                let slot = i % mine.len();
                let mut lease = mine[slot].clone();
                if let Some(spec) = lease.spec.as_mut() {
                    spec.renew_time =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                            jiff::Timestamp::now(),
                        ));
                }
                let name = lease.metadata.name.clone().unwrap_or_default();
                match api.replace(&name, &Default::default(), &lease).await {
                    Ok(stored) => {
                        mine[slot] = stored;
                        written.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                i += 1;
            }
        }));
    }
    for worker in workers {
        worker.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (rss, _) = process_figures(std::process::id()).unwrap_or_default();
    println!("standin_leases={}", args.nodes);
    println!("standin_concurrent_clients={WORKERS}");
    println!(
        "standin_lease_puts_per_s={:.0}",
        written.load(Ordering::Relaxed) as f64 / elapsed
    );
    println!("standin_failed_puts={}", failed.load(Ordering::Relaxed));
    println!("process_rss_mib={:.1}", rss as f64 / 1024.0);
    Ok(())
}

/// [`process_figures`] summed over `pids`.
fn figures_of(pids: &[u32]) -> (u64, f64) {
    pids.iter()
        .filter_map(|pid| process_figures(*pid))
        .fold((0, 0.0), |(rss, cpu), (r, c)| (rss + r, cpu + c))
}

/// The soak figures of one progress line after the warm-up.
struct SoakSample {
    /// Since the run started.
    minutes: f64,
    /// VmRSS of the gateway replicas, summed.
    gateway_rss_kib: f64,
    /// Open files of the gateway replicas, summed.
    gateway_fds: usize,
    /// VmRSS of Mosquitto (0 without a broker).
    broker_rss_kib: f64,
    /// Open files of Mosquitto (0 without a broker).
    broker_fds: usize,
}

/// Least-squares slope of `points` (x, y); 0 with fewer than two distinct x.
fn least_squares_slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(num, den), (x, y)| {
        (num + (x - mx) * (y - my), den + (x - mx) * (x - mx))
    });
    if den > 0.0 { num / den } else { 0.0 }
}

/// `(VmRSS KiB, utime+stime seconds)` of `pid` from /proc.
fn process_figures(pid: u32) -> Option<(u64, f64)> {
    Some((vm_rss_kib(pid)?, edgebeat_tests::procfs::cpu_seconds(pid)?))
}

/// `--mqtt-endpoint` naming every broker, `brokers[first mod n]` first.
fn endpoint_list(brokers: &[(String, u16)], first: usize) -> String {
    let mut ring: Vec<String> = brokers
        .iter()
        .map(|(host, port)| format!("mqtt://{host}:{port}"))
        .collect();
    ring.rotate_left(first % brokers.len().max(1));
    format!("--mqtt-endpoint={}", ring.join(","))
}

/// Starts gateway replica `index` on the shared MQTT subscription, client ID
/// `edgebeat-fleet-gateway-<suffix>`, subscribed on broker `index mod n` first, and waits
/// until it is ready.
async fn spawn_replica(
    args: &Args,
    standin: &edgebeat_tests::standin::StandInHandle,
    brokers: &[(String, u16)],
    index: usize,
    suffix: &str,
    resource_metrics: &[String],
) -> anyhow::Result<tokio::process::Child> {
    anyhow::ensure!(
        !brokers.is_empty(),
        "replicas share an MQTT subscription: --transport mqtt"
    );
    let port = free_port()?;
    let child = spawn_async(
        tokio::process::Command::new(&args.gateway_bin)
            .arg("--server")
            .arg(standin.url())
            .arg(format!("--metrics-listen=127.0.0.1:{port}"))
            .arg("--log-level=warn")
            .arg(endpoint_list(brokers, index))
            .arg(format!("--mqtt-client-id=edgebeat-fleet-gateway-{suffix}"))
            .arg("--allow-unidentified-agents")
            .args(apiserver_http(&args.gateway_args))
            .args(resource_metrics)
            .args(&args.gateway_args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true),
    )
    .with_context(|| format!("starting {}", args.gateway_bin.display()))?;
    wait_ready(port).await?;
    Ok(child)
}

/// A bootstrap token for every node of the fleet (`<prefix>*`, `--nodes` uses, 1 h), made
/// by the gateway binary's `token create` against the stand-in, as an operator makes one.
async fn fleet_token(
    args: &Args,
    standin: &edgebeat_tests::standin::StandInHandle,
    prefix: &str,
) -> anyhow::Result<edgebeat_transports::enroll::BootstrapToken> {
    let output = edgebeat_tests::process::output_async(
        tokio::process::Command::new(&args.gateway_bin)
            .arg("--server")
            .arg(standin.url())
            .args(["token", "create", "--ttl", "1h"])
            .arg(format!("--nodes={prefix}*"))
            .arg(format!("--uses={}", args.nodes)),
    )
    .await
    .context("edgebeat-gateway token create")?;
    anyhow::ensure!(
        output.status.success(),
        "edgebeat-gateway token create: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|e| anyhow::anyhow!("the token printed by token create: {e}"))
}

/// GETs `/readyz` on `port` until it answers 200, for at most 30 s.
async fn wait_ready(port: u16) -> anyhow::Result<()> {
    edgebeat_tests::wait::until(
        "the gateway ready",
        Duration::from_secs(30),
        || async {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            stream
                .write_all(b"GET /readyz HTTP/1.0\r\nHost: x\r\n\r\n")
                .await?;
            let mut head = [0u8; 12];
            stream.read_exact(&mut head).await?;
            if head.ends_with(b"200") {
                Ok(())
            } else {
                Err(std::io::Error::other(
                    String::from_utf8_lossy(&head).into_owned(),
                ))
            }
        },
        edgebeat_tests::wait::every(Duration::from_millis(100)),
    )
    .await?;
    Ok(())
}

/// What the gateway recorded of the sites (its `SiteSilent` Events, each naming its site
/// and stamped when it was recorded) against the `cuts` made: `site_cuts`,
/// `site_cuts_caught` (an Event for the cut site between its start and a minute after its
/// end), `site_false_partitions` (Events matching no cut), and the seconds from cut to
/// Event (whole seconds, the Event's resolution): `site_cut_to_condition_s_median`, `…_max`.
fn site_figures(
    events: &[k8s_openapi::api::core::v1::Event],
    cuts: &[(usize, jiff::Timestamp, jiff::Timestamp)],
    put: &mut impl FnMut(&str, String),
) {
    use edgebeat_tests::fleet::Silences;
    let recorded: Vec<(String, jiff::Timestamp)> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("SiteSilent"))
        .filter_map(|e| {
            let message = e.message.as_deref()?;
            let site = message.strip_prefix("Site ")?.split(' ').next()?.to_owned();
            Some((site, e.first_timestamp.as_ref()?.0))
        })
        .collect();
    let matches = |(site, at): &(String, jiff::Timestamp),
                   (s, start, end): &(usize, jiff::Timestamp, jiff::Timestamp)| {
        *site == Silences::site_name(*s)
            && *at >= *start - jiff::SignedDuration::from_secs(2)
            && *at <= *end + jiff::SignedDuration::from_secs(60)
    };
    let mut latencies: Vec<f64> = cuts
        .iter()
        .filter_map(|cut| {
            recorded
                .iter()
                .filter(|r| matches(r, cut))
                .map(|(_, at)| at.duration_since(cut.1).as_secs_f64())
                .reduce(f64::min)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    let false_partitions = recorded
        .iter()
        .filter(|r| !cuts.iter().any(|cut| matches(r, cut)))
        .count();
    put("site_cuts", cuts.len().to_string());
    put("site_cuts_caught", latencies.len().to_string());
    put("site_false_partitions", false_partitions.to_string());
    put("site_partition_events", recorded.len().to_string());
    if let (Some(median), Some(max)) = (latencies.get(latencies.len() / 2), latencies.last()) {
        put("site_cut_to_condition_s_median", format!("{median:.0}"));
        put("site_cut_to_condition_s_max", format!("{max:.0}"));
    }
}

/// The body of `GET /metrics` on 127.0.0.1:`port` (HTTP/1.0: read to the end).
async fn scrape_metrics(port: u16) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let (_, body) = answer
        .split_once("\r\n\r\n")
        .context("no HTTP answer from /metrics")?;
    Ok(body.to_owned())
}

/// Seconds after the ramp before the first `--scrape-every` cycle.
const SCRAPE_AFTER_RAMP_S: u64 = 25;

/// Most resource metrics requests in flight at once: the gateway's HTTP/2 stream limit
/// (`edgebeat_gateway::resource_metrics` `MAX_STREAMS`).
const SCRAPE_IN_FLIGHT: usize = 256;

/// How long one resource metrics request (or a connection's TCP, TLS and HTTP/2 set-up) may
/// take (metrics-server's `--kubelet-request-timeout` default, 10 s).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// The user the scraper's client certificate names (metrics-server's service account).
const SCRAPER_USER: &str = "system:serviceaccount:kube-system:metrics-server";

/// `--scrape-every`'s PKI, made for the run: a CA that signs the gateway's serving
/// certificate (valid for 127.0.0.1) and the scraper's client certificate, and is the
/// gateway's `--resource-metrics-client-ca`; files in the run's temporary directory.
struct ScrapePki {
    ca_pem: String,
    client: edgebeat_tests::pki::Leaf,
    cert: PathBuf,
    key: PathBuf,
    client_ca: PathBuf,
}

impl ScrapePki {
    /// Makes the PKI and writes the gateway's files into `dir`.
    fn write(dir: &std::path::Path) -> anyhow::Result<Self> {
        let ca = edgebeat_tests::pki::Ca::new("edgebeat-fleet-resource-metrics-ca");
        let server = ca.server();
        let pki = Self {
            ca_pem: ca.cert_pem.clone(),
            client: ca.client(SCRAPER_USER, None),
            cert: dir.join("resource-metrics.crt"),
            key: dir.join("resource-metrics.key"),
            client_ca: dir.join("resource-metrics-client-ca.crt"),
        };
        std::fs::write(&pki.cert, &server.cert_pem)?;
        std::fs::write(&pki.key, &server.key_pem)?;
        std::fs::write(&pki.client_ca, &ca.cert_pem)?;
        Ok(pki)
    }

    /// The flags of a replica serving resource metrics on a port of its choosing.
    fn gateway_args(&self) -> Vec<String> {
        vec![
            "--resource-metrics-listen=127.0.0.1:0".to_owned(),
            "--resource-metrics-address=127.0.0.1".to_owned(),
            format!("--resource-metrics-tls-cert={}", self.cert.display()),
            format!("--resource-metrics-tls-key={}", self.key.display()),
            format!("--resource-metrics-client-ca={}", self.client_ca.display()),
        ]
    }
}

/// Reads the gateway's log (its stdout) line by line until it ends, copying each line to
/// `log` when given (`--gateway-log`); the receiver gets the address of its "serving
/// resource metrics" line (`addr=…` in the text format).
fn follow_gateway_log(
    stdout: tokio::process::ChildStdout,
    mut log: Option<std::fs::File>,
) -> tokio::sync::oneshot::Receiver<std::net::SocketAddr> {
    let (found, addr) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut found = Some(found);
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(file) = log.as_mut() {
                use std::io::Write as _;
                let _ = writeln!(file, "{line}");
            }
            if line.contains("serving resource metrics")
                && let Some(addr) = line
                    .split_whitespace()
                    .find_map(|word| word.strip_prefix("addr="))
                    .and_then(|a| a.trim_matches('"').parse().ok())
                && let Some(found) = found.take()
            {
                let _ = found.send(addr);
            }
        }
    });
    addr
}

/// An `--apiserver-outage-after` outage, and what the first replica's log said of it.
struct Outage {
    started: tokio::time::Instant,
    ended: Option<tokio::time::Instant>,
    log: PathBuf,
    /// The log's length when the outage began.
    offset: u64,
    /// Time from the start to the first ERROR line, once seen.
    first_error: tokio::task::JoinHandle<Option<Duration>>,
}

impl Outage {
    /// Answers every new request of `standin` with 503 from now, and starts looking for
    /// the first ERROR line in `log` after its current end.
    fn start(
        standin: &edgebeat_tests::standin::StandInHandle,
        log: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let offset = std::fs::metadata(log)?.len();
        let started = tokio::time::Instant::now();
        standin.inject(edgebeat_tests::standin::FaultRule::status(
            None,
            "",
            503,
            u32::MAX,
        ));
        let path = log.to_owned();
        let first_error = tokio::spawn(async move {
            let mut poll = tokio::time::interval(Duration::from_millis(50));
            while started.elapsed() < Duration::from_secs(120) {
                poll.tick().await;
                if Self::since(&path, offset)
                    .is_ok_and(|text| text.lines().any(|l| l.contains(" ERROR ")))
                {
                    return Some(started.elapsed());
                }
            }
            None
        });
        Ok(Self {
            started,
            ended: None,
            log: log.to_owned(),
            offset,
            first_error,
        })
    }

    /// `log` from byte `offset` on.
    fn since(log: &std::path::Path, offset: u64) -> std::io::Result<String> {
        use std::io::{Read as _, Seek as _};
        let mut file = std::fs::File::open(log)?;
        file.seek(std::io::SeekFrom::Start(offset))?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        Ok(text)
    }

    /// The summary's `outage_*` figures (see the module docs).
    async fn figures(self) -> anyhow::Result<Vec<(&'static str, String)>> {
        let text = Self::since(&self.log, self.offset)?;
        let first_error = if self.first_error.is_finished() {
            self.first_error.await?
        } else {
            self.first_error.abort();
            None
        };
        let lasted = self
            .ended
            .map_or(0.0, |e| e.duration_since(self.started).as_secs_f64());
        Ok(vec![
            ("outage_s", format!("{lasted:.0}")),
            ("outage_log_lines", text.lines().count().to_string()),
            ("outage_log_bytes", text.len().to_string()),
            (
                "outage_error_lines",
                text.lines()
                    .filter(|l| l.contains(" ERROR "))
                    .count()
                    .to_string(),
            ),
            (
                "outage_first_error_s",
                first_error.map_or("none".into(), |d| format!("{:.2}", d.as_secs_f64())),
            ),
            (
                "outage_recovered_line",
                u8::from(text.contains("the apiserver takes writes again")).to_string(),
            ),
        ])
    }
}

/// One `--scrape-every` cycle: every node's resource metrics asked once.
#[derive(Debug, Default, Clone)]
struct ScrapeCycle {
    /// Answered 200.
    ok: u64,
    /// Answered otherwise, by status code.
    by_code: BTreeMap<u16, u64>,
    /// Not answered (connection, TLS, HTTP/2, timeout).
    errors: u64,
    /// Body bytes of the 200 answers.
    ok_bytes: u64,
    duration: Duration,
}

/// The HTTP/2 connection of the scraper.
type Http2Sender = hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>;

/// metrics-server's side of `--scrape-every` (see the module docs): one TLS connection with
/// ALPN `h2` and a client certificate, every node's `/nodes/<node>/metrics/resource` on it
/// each cycle, at most [`SCRAPE_IN_FLIGHT`] at once; a closed connection is opened anew
/// (and a request it did not send, sent again once), as Go's HTTP/2 transport does.
struct ResourceScraper {
    addr: std::net::SocketAddr,
    tls: tokio_rustls::TlsConnector,
    paths: Vec<String>,
    connection: tokio::sync::Mutex<Option<Http2Sender>>,
    connections: std::sync::atomic::AtomicU64,
    cycles: parking_lot::Mutex<Vec<ScrapeCycle>>,
    error_kinds: parking_lot::Mutex<BTreeMap<String, u64>>,
}

impl ResourceScraper {
    /// A scraper of `nodes` at `addr` with `pki`'s CA and client certificate.
    fn new(addr: std::net::SocketAddr, pki: &ScrapePki, nodes: &[String]) -> anyhow::Result<Self> {
        let mut config = edgebeat_transports::tls::ClientTls {
            ca_pem: pki.ca_pem.clone().into_bytes(),
            client_identity: Some(edgebeat_transports::tls::TlsIdentity {
                cert_pem: pki.client.cert_pem.clone().into_bytes(),
                key_pem: pki.client.key_pem.clone().into_bytes(),
            }),
        }
        .rustls_config()
        .context("the scraper's TLS")?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self {
            addr,
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            paths: nodes
                .iter()
                .map(|node| format!("https://{addr}/nodes/{node}/metrics/resource"))
                .collect(),
            connection: tokio::sync::Mutex::new(None),
            connections: std::sync::atomic::AtomicU64::new(0),
            cycles: parking_lot::Mutex::new(Vec::new()),
            error_kinds: parking_lot::Mutex::new(BTreeMap::new()),
        })
    }

    /// A new connection: TCP, TLS (the server must pick `h2`), the HTTP/2 handshake.
    async fn connect(&self) -> anyhow::Result<Http2Sender> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let tls = self
            .tls
            .connect(rustls::pki_types::ServerName::from(self.addr.ip()), tcp)
            .await
            .context("TLS")?;
        anyhow::ensure!(
            tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice()),
            "the server did not pick ALPN h2"
        );
        let (sender, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        .context("HTTP/2 handshake")?;
        tokio::spawn(connection);
        self.connections.fetch_add(1, Ordering::Relaxed);
        Ok(sender)
    }

    /// The open connection, or a new one when there is none or it closed.
    async fn sender(&self) -> anyhow::Result<Http2Sender> {
        let mut held = self.connection.lock().await;
        if let Some(sender) = held.as_ref()
            && !sender.is_closed()
        {
            return Ok(sender.clone());
        }
        *held = None;
        let sender = tokio::time::timeout(SCRAPE_TIMEOUT, self.connect())
            .await
            .context("connecting: timed out")??;
        *held = Some(sender.clone());
        Ok(sender)
    }

    /// GETs `uri`: its status and body size.
    async fn get(&self, uri: &str) -> anyhow::Result<(u16, usize)> {
        use http_body_util::BodyExt as _;
        let mut retried = false;
        loop {
            let mut sender = self.sender().await?;
            let request = http::Request::get(uri).body(http_body_util::Empty::new())?;
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let body = response.into_body().collect().await?.to_bytes();
                    return Ok((status, body.len()));
                }
                // Not sent, or its connection closed under it (the server's GOAWAY at its
                // maximum connection age): once more, on a new connection.
                Err(error) if !retried && (error.message().is_some() || sender.is_closed()) => {
                    retried = true;
                }
                Err(error) => return Err(error.into_error().into()),
            }
        }
    }

    /// One cycle: every node once, at most [`SCRAPE_IN_FLIGHT`] at once.
    async fn cycle(self: &Arc<Self>) -> ScrapeCycle {
        use futures_util::StreamExt as _;
        let started = tokio::time::Instant::now();
        let answers: Vec<anyhow::Result<(u16, usize)>> =
            futures_util::stream::iter(0..self.paths.len())
                .map(|i| {
                    let this = self.clone();
                    async move {
                        tokio::time::timeout(SCRAPE_TIMEOUT, this.get(&this.paths[i]))
                            .await
                            .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")))
                    }
                })
                .buffer_unordered(SCRAPE_IN_FLIGHT)
                .collect()
                .await;
        let mut cycle = ScrapeCycle {
            duration: started.elapsed(),
            ..ScrapeCycle::default()
        };
        let mut kinds = self.error_kinds.lock();
        for answer in answers {
            match answer {
                Ok((200, bytes)) => {
                    cycle.ok += 1;
                    cycle.ok_bytes += bytes as u64;
                }
                Ok((code, _)) => *cycle.by_code.entry(code).or_default() += 1,
                Err(error) => {
                    cycle.errors += 1;
                    *kinds.entry(format!("{error:#}")).or_default() += 1;
                }
            }
        }
        cycle
    }

    /// Runs a cycle at `first`, then every `every` (right after the last one when it took
    /// longer), until `stop`; a cycle cut off by `stop` is not recorded.
    async fn run(
        self: Arc<Self>,
        first: tokio::time::Instant,
        every: Duration,
        stop: CancellationToken,
    ) {
        let mut ticks = tokio::time::interval_at(first, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let cycle = tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => tokio::select! {
                    () = stop.cancelled() => return,
                    cycle = self.cycle() => cycle,
                },
            };
            self.cycles.lock().push(cycle);
        }
    }

    /// The cycles recorded so far.
    fn cycles(&self) -> Vec<ScrapeCycle> {
        self.cycles.lock().clone()
    }

    /// Requests not answered, by why.
    fn error_kinds(&self) -> BTreeMap<String, u64> {
        self.error_kinds.lock().clone()
    }

    /// The progress line's figure: cycles, and the last one's 200s of its requests and
    /// duration.
    fn progress(&self) -> String {
        let cycles = self.cycles();
        match cycles.last() {
            None => " scrape_cycles=0".to_owned(),
            Some(last) => {
                let asked = last.ok + last.by_code.values().sum::<u64>() + last.errors;
                format!(
                    " scrape_cycles={} last_scrape={}/{} in {:.0}ms",
                    cycles.len(),
                    last.ok,
                    asked,
                    last.duration.as_secs_f64() * 1e3
                )
            }
        }
    }

    /// The summary's `scrape_*` figures.
    fn figures(&self, put: &mut impl FnMut(&str, String)) {
        let cycles = self.cycles();
        let ok: u64 = cycles.iter().map(|c| c.ok).sum();
        let errors: u64 = cycles.iter().map(|c| c.errors).sum();
        let mut by_code: BTreeMap<u16, u64> = BTreeMap::new();
        for cycle in &cycles {
            for (code, n) in &cycle.by_code {
                *by_code.entry(*code).or_default() += n;
            }
        }
        let mut durations: Vec<f64> = cycles
            .iter()
            .map(|c| c.duration.as_secs_f64() * 1e3)
            .collect();
        durations.sort_by(f64::total_cmp);
        put("scrape_cycles", cycles.len().to_string());
        put("scrape_ok", ok.to_string());
        put(
            "scrape_not_ok",
            (by_code.values().sum::<u64>() + errors).to_string(),
        );
        put("scrape_errors", errors.to_string());
        for (code, n) in by_code {
            put(&format!("scrape_status_{code}"), n.to_string());
        }
        if let (Some(median), Some(max)) = (durations.get(durations.len() / 2), durations.last()) {
            put("scrape_cycle_ms_median", format!("{median:.0}"));
            put("scrape_cycle_ms_max", format!("{max:.0}"));
        }
        let bytes: u64 = cycles.iter().map(|c| c.ok_bytes).sum();
        put(
            "scrape_body_bytes_mean",
            format!("{:.0}", bytes as f64 / ok.max(1) as f64),
        );
        put(
            "scrape_connections",
            self.connections.load(Ordering::Relaxed).to_string(),
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(spec) = &args.serve_ack_only {
        return serve_ack_only(spec).await;
    }
    anyhow::ensure!(args.nodes > 0, "--nodes must be at least 1");
    let standin = start_standin(&args).await?;
    if args.standin_ceiling {
        return standin_ceiling(&standin, &args).await;
    }
    check_args(&args)?;
    let (broker, brokers) = start_brokers(&args).await?;
    let pki_dir = tempfile::tempdir()?;
    let mut gateways = start_gateways(&args, &standin, &brokers, pki_dir.path()).await?;
    let (_, cpu_start) = figures_of(&gateways.pids);
    let options = fleet_options(&args, &standin, &mut gateways).await?;
    let mut run = Run::new(&args, &options, &broker, cpu_start)?;
    let node_names: Vec<String> = (0..args.nodes).map(|i| options.node_name(i)).collect();
    let silences = options.silences.clone();
    let stats = Arc::new(FleetStats::default());
    let cancel = CancellationToken::new();
    let fleet = tokio::spawn(run_fleet(options, stats.clone(), cancel.clone()));
    let scraping = start_scraping(&args, &gateways, &node_names, run.started, &cancel)?;
    print_header(&args, brokers.len());
    let mut sample = tokio::time::interval(Duration::from_secs(1));
    while tokio::time::Instant::now() < run.end {
        sample.tick().await;
        if let Some(silences) = &silences {
            run.churn_and_cut(&args, silences)?;
        }
        run.outage_step(&args, &standin)?;
        run.kill_step(&args, &mut gateways).await?;
        run.restart_step(&args, &standin, &brokers, &mut gateways)
            .await?;
        let messages = Run::messages(&stats);
        run.sample(&standin, messages);
        run.progress(&args, &standin, &stats, &gateways, &scraping, messages);
    }
    // A cycle in progress at the end is dropped, uncounted.
    let scraped = match scraping {
        Some((scraper, stop, task)) => {
            stop.cancel();
            let _ = task.await;
            Some(scraper)
        }
        None => None,
    };
    let summary = summary(&args, &standin, &stats, &gateways, run, scraped.as_deref()).await?;
    cancel.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), fleet).await;
    for (key, value) in &summary {
        println!("{key}={value}");
    }
    for (why, count) in stats.failures() {
        println!("renewal_failure {count} × {why}");
    }
    if let Some(scraper) = &scraped {
        for (why, count) in scraper.error_kinds() {
            println!("scrape_error {count} × {why}");
        }
    }
    stop_all(gateways, broker, &standin).await;
    Ok(())
}

/// The stand-in apiserver as the run wants it: request recording off (a long run would
/// hold every request), `--apiserver-latency-ms` and `--apiserver-max-inflight`, and with
/// `--enroll` the gateway's namespace.
async fn start_standin(args: &Args) -> anyhow::Result<edgebeat_tests::standin::StandInHandle> {
    let standin = StandIn::start().await?;
    standin.set_recording(false);
    standin.set_latency(Duration::from_millis(args.apiserver_latency_ms));
    standin.set_max_inflight(args.apiserver_max_inflight);
    if args.enroll {
        // deploy/gateway's namespace, where the gateway keeps its site CA and tokens.
        standin.create_namespace("edgebeat-system");
    }
    Ok(standin)
}

/// The flags that only go together: checked before anything but the stand-in starts.
///
/// Errors: the first combination that does not hold, saying why.
fn check_args(args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.mqtt_brokers.is_empty() || args.transport == Transport::Mqtt,
        "--mqtt-broker is for --transport mqtt"
    );
    anyhow::ensure!(
        args.broker_pids.is_empty() || args.broker_pids.len() == args.mqtt_brokers.len(),
        "--broker-pid: one per --mqtt-broker, in the same order"
    );
    anyhow::ensure!(
        !args.mtls || args.transport == Transport::Grpc,
        "--mtls is for --transport grpc"
    );
    anyhow::ensure!(
        args.scrape_every != Some(0),
        "--scrape-every must be at least 1 second"
    );
    anyhow::ensure!(
        !args.enroll || args.transport == Transport::Grpc,
        "--enroll is for --transport grpc"
    );
    anyhow::ensure!(
        args.replicas >= 1
            && (args.replicas == 1 || (args.transport == Transport::Mqtt && !args.ack_only)),
        "--replicas above 1 needs --transport mqtt and a gateway"
    );
    anyhow::ensure!(
        args.kill_replica_after.is_none() || args.replicas >= 2,
        "--kill-replica-after needs --replicas 2 or more"
    );
    Ok(())
}

/// The MQTT brokers of the run: Mosquitto started here for `--transport mqtt` (returned,
/// to be stopped at the end), or the `--mqtt-broker` nodes already running; none for gRPC.
///
/// Errors: Mosquitto did not start, or a `--mqtt-broker` is not `host:port`.
async fn start_brokers(args: &Args) -> anyhow::Result<(Option<Broker>, Vec<(String, u16)>)> {
    let broker = match args.transport {
        Transport::Mqtt if args.mqtt_brokers.is_empty() => Some(Broker::start_quiet().await?),
        _ => None,
    };
    let brokers: Vec<(String, u16)> = match &broker {
        Some(b) => vec![(b.host().to_owned(), b.port())],
        None => args
            .mqtt_brokers
            .iter()
            .map(|text| {
                let (host, port) = text
                    .rsplit_once(':')
                    .with_context(|| format!("--mqtt-broker {text:?}: expected host:port"))?;
                let port = port
                    .parse()
                    .with_context(|| format!("--mqtt-broker {text:?}: a bad port"))?;
                anyhow::Ok((host.to_owned(), port))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    Ok((broker, brokers))
}

/// The gateway replicas (or the ack-only subscriber) of a run, and what the fleet needs to
/// reach them.
struct Gateways {
    /// The first replica, or the `--ack-only` subscriber.
    first: tokio::process::Child,
    /// The other replicas still running.
    replicas: Vec<tokio::process::Child>,
    /// The process IDs of every replica running.
    pids: Vec<u32>,
    /// The first replica's `/metrics` port.
    metrics_port: u16,
    /// The first replica's resource metrics server (`--scrape-every`).
    scrape_addr: Option<std::net::SocketAddr>,
    /// The flags serving resource metrics, which every replica gets.
    resource_metrics_args: Vec<String>,
    /// `--scrape-every`'s TLS material.
    scrape_pki: Option<ScrapePki>,
    /// The transport the fleet takes to the first replica.
    transport: Option<FleetTransport>,
    /// The enrollment endpoint (`--enroll`).
    enroll_url: Option<String>,
    /// The site CA that signs node certificates (`--mtls`).
    site_ca: Option<Arc<edgebeat_tests::pki::Ca>>,
}

/// Starts the first gateway replica (or the ack-only subscriber), waits until it is ready,
/// then the other `--replicas`.
///
/// Errors: a file of the PKI could not be written, or a replica did not start or become
/// ready.
async fn start_gateways(
    args: &Args,
    standin: &edgebeat_tests::standin::StandInHandle,
    brokers: &[(String, u16)],
    pki_dir: &std::path::Path,
) -> anyhow::Result<Gateways> {
    let site_ca = args
        .mtls
        .then(|| Arc::new(edgebeat_tests::pki::Ca::new("edgebeat-fleet-site-ca")));
    // --scrape-every: the TLS material of every replica's resource metrics server and of
    // the scraper, and the flags that serve it.
    let scrape_pki = args
        .scrape_every
        .map(|_| ScrapePki::write(pki_dir))
        .transpose()?;
    let resource_metrics_args = scrape_pki
        .as_ref()
        .map(ScrapePki::gateway_args)
        .unwrap_or_default();
    let metrics_port = free_port()?;
    // The gateway logs to stdout; with --gateway-log both streams go to the file.
    let gateway_log = args
        .gateway_log
        .as_ref()
        .map(|path| {
            std::fs::File::create(path).with_context(|| format!("--gateway-log {}", path.display()))
        })
        .transpose()?;
    let mut command = gateway_command(
        args,
        standin,
        metrics_port,
        scrape_pki.is_some(),
        gateway_log.as_ref(),
    )?;
    let (transport, enroll_url) =
        transport_args(args, &mut command, brokers, site_ca.as_deref(), pki_dir)?;
    if site_ca.is_none() && !args.enroll {
        command.arg("--allow-unidentified-agents");
    }
    command.args(&resource_metrics_args);
    command.args(&args.gateway_args);
    let (first, scrape_addr) = if args.ack_only {
        (start_ack_only(&transport).await?, None)
    } else {
        start_first_replica(args, &mut command, gateway_log, metrics_port).await?
    };
    let mut gateways = Gateways {
        pids: vec![first.id().context("gateway pid")?],
        first,
        replicas: Vec::new(),
        metrics_port,
        scrape_addr,
        resource_metrics_args,
        scrape_pki,
        transport: Some(transport),
        enroll_url,
        site_ca,
    };
    for index in 1..args.replicas {
        let child = spawn_replica(
            args,
            standin,
            brokers,
            index,
            &index.to_string(),
            &gateways.resource_metrics_args,
        )
        .await?;
        gateways.pids.push(child.id().context("gateway pid")?);
        gateways.replicas.push(child);
    }
    Ok(gateways)
}

/// The first replica's command line but for its transport: the stand-in, its metrics
/// port, its log level, and where its output goes.
///
/// Errors: the log file could not be shared with the child.
fn gateway_command(
    args: &Args,
    standin: &edgebeat_tests::standin::StandInHandle,
    metrics_port: u16,
    scraping: bool,
    gateway_log: Option<&std::fs::File>,
) -> anyhow::Result<tokio::process::Command> {
    let stdio_log = |log: Option<&std::fs::File>| -> anyhow::Result<std::process::Stdio> {
        Ok(match log {
            Some(file) => std::process::Stdio::from(file.try_clone()?),
            None => std::process::Stdio::null(),
        })
    };
    let mut command = tokio::process::Command::new(&args.gateway_bin);
    command
        .arg("--server")
        .arg(standin.url())
        .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
        // With --scrape-every, the line naming the resource metrics server's address too.
        .arg(if args.apiserver_outage_after.is_some() {
            // What an outage's lines are at the level the gateway runs with by default.
            "--log-level=info"
        } else if scraping {
            "--log-level=warn,edgebeat_gateway::server=info"
        } else {
            "--log-level=warn"
        })
        .args(apiserver_http(&args.gateway_args))
        .env("NO_COLOR", "1")
        .stdout(if scraping {
            std::process::Stdio::piped()
        } else {
            stdio_log(gateway_log)?
        })
        .stderr(stdio_log(gateway_log)?)
        .kill_on_drop(true);
    Ok(command)
}

/// Adds the first replica's transport flags to `command`: MQTT brokers, or a gRPC port
/// (with `--enroll` an enrollment port, with `--mtls` the server's certificate, written
/// into `pki_dir`); gives the fleet's transport and the enrollment URL.
///
/// Errors: no free port, or a PKI file could not be written.
fn transport_args(
    args: &Args,
    command: &mut tokio::process::Command,
    brokers: &[(String, u16)],
    site_ca: Option<&edgebeat_tests::pki::Ca>,
    pki_dir: &std::path::Path,
) -> anyhow::Result<(FleetTransport, Option<String>)> {
    Ok(match args.transport {
        Transport::Mqtt => {
            command
                .arg(endpoint_list(brokers, 0))
                .arg("--mqtt-client-id=edgebeat-fleet-gateway");
            (
                FleetTransport::Mqtt {
                    brokers: brokers.to_vec(),
                },
                None,
            )
        }
        Transport::Grpc if args.enroll => {
            let (port, enroll_port) = (free_port()?, free_port()?);
            command
                .arg(format!("--grpc-listen=127.0.0.1:{port}"))
                .arg("--enrollment")
                .arg(format!("--grpc-enrollment-listen=127.0.0.1:{enroll_port}"));
            (
                FleetTransport::Grpc(format!("https://127.0.0.1:{port}")),
                Some(format!("http://127.0.0.1:{enroll_port}")),
            )
        }
        Transport::Grpc => {
            let port = free_port()?;
            command.arg(format!("--grpc-listen=127.0.0.1:{port}"));
            let url = match site_ca {
                Some(ca) => {
                    let server = ca.server();
                    let (cert, key, client_ca) = (
                        pki_dir.join("tls.crt"),
                        pki_dir.join("tls.key"),
                        pki_dir.join("ca.crt"),
                    );
                    std::fs::write(&cert, &server.cert_pem)?;
                    std::fs::write(&key, &server.key_pem)?;
                    std::fs::write(&client_ca, &ca.cert_pem)?;
                    command
                        .arg(format!("--grpc-tls-cert={}", cert.display()))
                        .arg(format!("--grpc-tls-key={}", key.display()))
                        .arg(format!("--grpc-client-ca={}", client_ca.display()));
                    format!("https://127.0.0.1:{port}")
                }
                None => format!("http://127.0.0.1:{port}"),
            };
            (FleetTransport::Grpc(url), None)
        }
    })
}

/// `--ack-only`: this binary again as a subscriber that answers every renewal at once,
/// on `transport`'s port or broker, once it says "ready".
///
/// Errors: it did not start, or said nothing within 30 s.
async fn start_ack_only(transport: &FleetTransport) -> anyhow::Result<tokio::process::Child> {
    let spec = match transport {
        FleetTransport::Grpc(url) => {
            format!("grpc:{}", url.rsplit(':').next().unwrap_or_default())
        }
        FleetTransport::Mqtt { brokers } => {
            let (host, port) = brokers.first().context("a broker")?;
            format!("mqtt:{host}:{port}")
        }
    };
    let mut child = spawn_async(
        tokio::process::Command::new(std::env::current_exe()?)
            .arg(format!("--serve-ack-only={spec}"))
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true),
    )
    .context("starting the ack-only subscriber")?;
    let stdout = child.stdout.take().context("its stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    anyhow::ensure!(
        matches!(ready, Ok(Ok(Some(ref l))) if l == "ready"),
        "the ack-only subscriber did not become ready within 30 s"
    );
    Ok(child)
}

/// Starts the first replica with `command` and waits until it is ready; with
/// `--scrape-every` also for the address its log gives the resource metrics server.
///
/// Errors: it did not start, become ready, or log that address within 30 s.
async fn start_first_replica(
    args: &Args,
    command: &mut tokio::process::Command,
    gateway_log: Option<std::fs::File>,
    metrics_port: u16,
) -> anyhow::Result<(tokio::process::Child, Option<std::net::SocketAddr>)> {
    let mut child =
        spawn_async(command).with_context(|| format!("starting {}", args.gateway_bin.display()))?;
    let resource_metrics_addr = child
        .stdout
        .take()
        .map(|stdout| follow_gateway_log(stdout, gateway_log));
    wait_ready(metrics_port).await?;
    let mut scrape_addr = None;
    if let Some(addr) = resource_metrics_addr {
        scrape_addr = Some(
            tokio::time::timeout(Duration::from_secs(30), addr)
                .await
                .ok()
                .and_then(Result::ok)
                .context("the gateway logged no \"serving resource metrics\" address")?,
        );
    }
    Ok((child, scrape_addr))
}

/// The simulated fleet's options from the flags, on the first replica's transport; with
/// `--enroll` a bootstrap token made for it.
///
/// Errors: the token could not be made.
async fn fleet_options(
    args: &Args,
    standin: &edgebeat_tests::standin::StandInHandle,
    gateways: &mut Gateways,
) -> anyhow::Result<FleetOptions> {
    let transport = gateways.transport.take().context("the fleet's transport")?;
    let mut options = FleetOptions::new(args.nodes, transport);
    options.ramp = Duration::from_secs(args.ramp);
    options.renew_interval = Duration::from_secs_f64(args.renew_interval);
    options.reboots_per_minute = args.reboots_per_minute;
    options.flip_probability = args.flip_probability;
    options.health_conditions = args.health_conditions;
    options.usage = !args.no_usage;
    options.silences = (args.sites > 0).then(|| Arc::new(Silences::new(args.nodes, args.sites)));
    options.site_ca = gateways.site_ca.take();
    if let Some(url) = gateways.enroll_url.take() {
        options.enroll = Some(FleetEnrollment {
            url,
            token: fleet_token(args, standin, &options.prefix).await?,
        });
    }
    Ok(options)
}

/// The scraper's state, what stops it, and its task.
type Scraping = (
    Arc<ResourceScraper>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
);

/// `--scrape-every`: metrics-server's cycles, from 25 s after the ramp (every node has
/// sent its first sample by then: the first renewal after registering carries one).
///
/// Errors: the scraper's TLS configuration could not be made.
fn start_scraping(
    args: &Args,
    gateways: &Gateways,
    node_names: &[String],
    started: tokio::time::Instant,
    cancel: &CancellationToken,
) -> anyhow::Result<Option<Scraping>> {
    Ok(
        match (
            &gateways.scrape_pki,
            gateways.scrape_addr,
            args.scrape_every,
        ) {
            (Some(pki), Some(addr), Some(every)) => {
                let scraper = Arc::new(ResourceScraper::new(addr, pki, node_names)?);
                let first = started + Duration::from_secs(args.ramp + SCRAPE_AFTER_RAMP_S);
                let stop = cancel.child_token();
                let task = tokio::spawn(scraper.clone().run(
                    first,
                    Duration::from_secs(every),
                    stop.clone(),
                ));
                Some((scraper, stop, task))
            }
            _ => None,
        },
    )
}

/// The first line: the run's settings.
fn print_header(args: &Args, brokers: usize) {
    println!(
        "nodes={} transport={:?} brokers={} replicas={} renew_interval_s={} ack_only={} mtls={} apiserver_latency_ms={} gateway_args={:?}",
        args.nodes,
        args.transport,
        brokers,
        args.replicas,
        args.renew_interval,
        args.ack_only,
        args.mtls,
        args.apiserver_latency_ms,
        args.gateway_args
    );
}

/// A run's schedule (when it started, when its measured window starts, what happens
/// when) and what it measured so far, second by second.
struct Run {
    started: tokio::time::Instant,
    /// The ramp plus one lease duration: Lease ages are sampled after it.
    warm_up: Duration,
    end: tokio::time::Instant,
    /// The end of the ramp: the figures per second count from here.
    measured_from: tokio::time::Instant,
    lease_duration: f64,
    /// The next site cut (`--site-cut-every`).
    next_cut: Option<tokio::time::Instant>,
    /// Site cuts made: (site, start, end), by the wall clock the gateway also stamps with.
    cuts: Vec<(usize, jiff::Timestamp, jiff::Timestamp)>,
    outage_at: Option<tokio::time::Instant>,
    outage: Option<Outage>,
    kill_at: Option<tokio::time::Instant>,
    restart_at: Option<tokio::time::Instant>,
    broker_kill_at: Option<tokio::time::Instant>,
    killed_at: Option<tokio::time::Instant>,
    /// CPU seconds of replicas no longer running, so the CPU figure keeps their share.
    cpu_of_gone: f64,
    broker_cpu_of_gone: f64,
    broker_pids: Vec<u32>,
    broker_cpu_at_measure: Option<f64>,
    /// Lease ages sampled after the warm-up (ms).
    ages: Vec<u32>,
    /// Renewal answer times of the progress lines so far (µs).
    all_latencies: Vec<u32>,
    expired_samples: u64,
    expired_nodes: std::collections::BTreeSet<String>,
    last_report: tokio::time::Instant,
    last_messages: u64,
    messages_at_measure: Option<u64>,
    soak: Vec<SoakSample>,
    /// Most connections open to the apiserver at a progress line.
    apiserver_conns_max: usize,
    /// The replicas' CPU seconds when the run started.
    cpu_start: f64,
}

impl Run {
    /// A run starting now, its events scheduled from the flags.
    ///
    /// Errors: an `--apiserver-outage-after` the run would end less than 20 s after.
    fn new(
        args: &Args,
        options: &FleetOptions,
        broker: &Option<Broker>,
        cpu_start: f64,
    ) -> anyhow::Result<Self> {
        // Scheduled before the start, as the fleet's first cut always was (a cut due at the
        // last moment still fits the run).
        let next_cut = (args.site_cut_every > 0).then(|| {
            tokio::time::Instant::now() + Duration::from_secs(args.ramp + args.site_cut_every)
        });
        let started = tokio::time::Instant::now();
        let lease_duration = f64::from(options.lease_duration_seconds);
        let end = started + Duration::from_secs(args.ramp + args.duration);
        let measured_from = started + Duration::from_secs(args.ramp);
        let kill_at = args
            .kill_replica_after
            .map(|after| measured_from + Duration::from_secs(after));
        let outage_at = args
            .apiserver_outage_after
            .map(|after| measured_from + Duration::from_secs(after));
        if let Some(at) = outage_at {
            anyhow::ensure!(
                at + Duration::from_secs(args.apiserver_outage_for + 20) <= end,
                "--duration must reach 20 s past the outage's end"
            );
        }
        Ok(Self {
            started,
            warm_up: Duration::from_secs(args.ramp) + Duration::from_secs_f64(lease_duration),
            end,
            measured_from,
            lease_duration,
            next_cut,
            cuts: Vec::new(),
            outage_at,
            outage: None,
            kill_at,
            restart_at: kill_at
                .zip(args.restart_replica_after)
                .map(|(k, r)| k + Duration::from_secs(r)),
            broker_kill_at: args
                .kill_broker_after
                .map(|after| measured_from + Duration::from_secs(after)),
            killed_at: None,
            cpu_of_gone: 0.0,
            broker_cpu_of_gone: 0.0,
            broker_pids: match broker {
                Some(b) => b.pid().into_iter().collect(),
                None => args.broker_pids.clone(),
            },
            broker_cpu_at_measure: None,
            ages: Vec::new(),
            all_latencies: Vec::new(),
            expired_samples: 0,
            expired_nodes: std::collections::BTreeSet::new(),
            last_report: started,
            last_messages: 0,
            messages_at_measure: None,
            soak: Vec::new(),
            apiserver_conns_max: 0,
            cpu_start,
        })
    }

    /// Seconds since the start, for the progress lines.
    fn t(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// `--churn-per-minute`: single nodes off, a Poisson process sampled once a second;
    /// `--site-cut-every`: a whole site cut when due.
    ///
    /// Errors: a cut too long for a timestamp.
    fn churn_and_cut(&mut self, args: &Args, silences: &Silences) -> anyhow::Result<()> {
        let mut expected = args.churn_per_minute / 60.0;
        while expected > 0.0 {
            if fastrand::f64() < expected.min(1.0) {
                silences.down(
                    fastrand::usize(0..args.nodes),
                    Duration::from_secs(args.churn_down),
                );
            }
            expected -= 1.0;
        }
        // No cut that the run would end before the gateway could see.
        if let Some(at) = self.next_cut
            && tokio::time::Instant::now() >= at
            && at + Duration::from_secs(args.site_cut_for) <= self.end
        {
            let cuts = &self.cuts;
            let busy = |s: usize| {
                cuts.iter()
                    .any(|(c, _, e)| *c == s && *e > jiff::Timestamp::now())
            };
            let free: Vec<usize> = (0..silences.sites()).filter(|s| !busy(*s)).collect();
            if let Some(&site) = free.get(fastrand::usize(0..free.len().max(1))) {
                let d = Duration::from_secs(args.site_cut_for);
                silences.cut(site, d);
                let start = jiff::Timestamp::now();
                self.cuts
                    .push((site, start, start + jiff::SignedDuration::try_from(d)?));
            }
            self.next_cut = Some(at + Duration::from_secs(args.site_cut_every));
        }
        Ok(())
    }

    /// `--apiserver-outage-after`: the outage starts when due, and ends after
    /// `--apiserver-outage-for`.
    ///
    /// Errors: the gateway's log could not be read.
    fn outage_step(
        &mut self,
        args: &Args,
        standin: &edgebeat_tests::standin::StandInHandle,
    ) -> anyhow::Result<()> {
        if self.outage.is_none()
            && self
                .outage_at
                .is_some_and(|t| tokio::time::Instant::now() >= t)
            && let Some(log) = &args.gateway_log
        {
            self.outage = Some(Outage::start(standin, log)?);
            println!(
                "t={:>4.0}s apiserver outage: every new request answered 503",
                self.t()
            );
        }
        if let Some(o) = self.outage.as_mut()
            && o.ended.is_none()
            && o.started.elapsed() >= Duration::from_secs(args.apiserver_outage_for)
        {
            standin.clear_faults();
            standin.set_latency(Duration::from_millis(args.apiserver_latency_ms));
            o.ended = Some(tokio::time::Instant::now());
            println!("t={:>4.0}s apiserver outage over", self.t());
        }
        Ok(())
    }

    /// `--kill-replica-after` and `--kill-broker-after`: SIGKILL when due (one kill a run).
    ///
    /// Errors: the process could not be killed.
    async fn kill_step(&mut self, args: &Args, gateways: &mut Gateways) -> anyhow::Result<()> {
        if self.killed_at.is_none()
            && self
                .kill_at
                .is_some_and(|t| tokio::time::Instant::now() >= t)
            && let Some(mut victim) = gateways.replicas.pop()
        {
            let pid = victim.id().context("replica pid")?;
            self.cpu_of_gone += process_figures(pid).map_or(0.0, |(_, cpu)| cpu);
            // SIGKILL: no shutdown, writes in flight are cut off where they are.
            victim.start_kill()?;
            victim.wait().await?;
            gateways.pids.retain(|p| *p != pid);
            self.killed_at = Some(tokio::time::Instant::now());
            println!("t={:>4.0}s replica pid {pid} killed (SIGKILL)", self.t());
        }
        if self.killed_at.is_none()
            && self
                .broker_kill_at
                .is_some_and(|t| tokio::time::Instant::now() >= t)
            && let Some(&pid) = self.broker_pids.first()
        {
            // A kill at the start of the measured window comes before the baseline below.
            if self.broker_cpu_at_measure.is_none() {
                self.broker_cpu_at_measure = Some(figures_of(&self.broker_pids).1);
            }
            self.broker_cpu_of_gone += process_figures(pid).map_or(0.0, |(_, cpu)| cpu);
            edgebeat_tests::process::signal(pid, "KILL").context("kill")?;
            self.broker_pids.remove(0);
            self.killed_at = Some(tokio::time::Instant::now());
            println!(
                "t={:>4.0}s broker pid {pid} ({}) killed (SIGKILL)",
                self.t(),
                args.mqtt_brokers.first().map_or("", String::as_str),
            );
        }
        Ok(())
    }

    /// `--restart-replica-after`: a new replica in the killed one's place when due.
    ///
    /// Errors: it did not start or become ready.
    async fn restart_step(
        &mut self,
        args: &Args,
        standin: &edgebeat_tests::standin::StandInHandle,
        brokers: &[(String, u16)],
        gateways: &mut Gateways,
    ) -> anyhow::Result<()> {
        if self.killed_at.is_some()
            && args.kill_replica_after.is_some()
            && gateways.replicas.len() + 1 < args.replicas
            && self
                .restart_at
                .is_some_and(|t| tokio::time::Instant::now() >= t)
        {
            let index = args.replicas - 1;
            let child = spawn_replica(
                args,
                standin,
                brokers,
                index,
                "restarted",
                &gateways.resource_metrics_args,
            )
            .await?;
            gateways.pids.push(child.id().context("gateway pid")?);
            gateways.replicas.push(child);
            println!(
                "t={:>4.0}s a new replica took the killed one's place",
                self.t()
            );
        }
        Ok(())
    }

    /// The fleet's messages so far.
    fn messages(stats: &FleetStats) -> u64 {
        stats.renewals_sent.load(Ordering::Relaxed)
            + stats.status_sent.load(Ordering::Relaxed)
            + stats.registrations.load(Ordering::Relaxed)
    }

    /// The second's sample: the baselines at the start of the measured window, and after
    /// the warm-up every Lease's age.
    fn sample(&mut self, standin: &edgebeat_tests::standin::StandInHandle, messages: u64) {
        let now = jiff::Timestamp::now();
        if self.messages_at_measure.is_none() && tokio::time::Instant::now() >= self.measured_from {
            self.messages_at_measure = Some(messages);
            if self.broker_cpu_at_measure.is_none() {
                self.broker_cpu_at_measure = Some(figures_of(&self.broker_pids).1);
            }
        }
        if self.started.elapsed() >= self.warm_up {
            for (name, renew) in standin.lease_renew_times() {
                let age = now.duration_since(renew).as_secs_f64().max(0.0);
                self.ages.push((age * 1000.0) as u32);
                if age > self.lease_duration {
                    self.expired_samples += 1;
                    self.expired_nodes.insert(name);
                }
            }
        }
    }

    /// Every `--report-every` seconds: a progress line, and after the warm-up a soak
    /// sample.
    fn progress(
        &mut self,
        args: &Args,
        standin: &edgebeat_tests::standin::StandInHandle,
        stats: &FleetStats,
        gateways: &Gateways,
        scraping: &Option<Scraping>,
        messages: u64,
    ) {
        if self.last_report.elapsed() < Duration::from_secs(args.report_every) {
            return;
        }
        let window = stats.take_latencies();
        let dt = self.last_report.elapsed().as_secs_f64();
        let pids = &gateways.pids;
        let (rss, cpu) = figures_of(pids);
        if args.enroll {
            println!(
                "t={:>4.0}s enrollment_requests={} enrolled={} identified={}",
                self.t(),
                stats.enrollment_requests.load(Ordering::Relaxed),
                stats.enrolled.load(Ordering::Relaxed),
                stats.identified.load(Ordering::Relaxed),
            );
        }
        let scrape_note = scraping
            .as_ref()
            .map(|(scraper, _, _)| scraper.progress())
            .unwrap_or_default();
        println!(
            "t={:>4.0}s msgs/s={:>7.1} renewals_ok={} failed={} ack_p50={:.1}ms p99={:.1}ms max={:.1}ms leases={} expired_samples={} gateway_rss={:.1}MiB cpu={:.1}s gateway_fds={} apiserver_conns={}{scrape_note}",
            self.t(),
            (messages - self.last_messages) as f64 / dt,
            stats.renewals_ok.load(Ordering::Relaxed),
            stats.renewals_failed.load(Ordering::Relaxed),
            f64::from(quantile(&window, 0.5)) / 1000.0,
            f64::from(quantile(&window, 0.99)) / 1000.0,
            f64::from(quantile(&window, 1.0)) / 1000.0,
            standin.lease_renew_times().len(),
            self.expired_samples,
            rss as f64 / 1024.0,
            cpu + self.cpu_of_gone - self.cpu_start,
            pids.iter().map(|p| open_files(*p)).sum::<usize>(),
            standin.open_connections(),
        );
        self.apiserver_conns_max = self.apiserver_conns_max.max(standin.open_connections());
        // A kill or a restart is a step in the summed figures, not a slope.
        if self.started.elapsed() >= self.warm_up
            && args.kill_replica_after.is_none()
            && args.kill_broker_after.is_none()
        {
            self.soak.push(SoakSample {
                minutes: self.started.elapsed().as_secs_f64() / 60.0,
                gateway_rss_kib: rss as f64,
                gateway_fds: pids.iter().map(|p| open_files(*p)).sum(),
                broker_rss_kib: self
                    .broker_pids
                    .iter()
                    .filter_map(|p| vm_rss_kib(*p))
                    .sum::<u64>() as f64,
                broker_fds: self.broker_pids.iter().map(|p| open_files(*p)).sum(),
            });
        }
        self.all_latencies.extend(window);
        self.last_messages = messages;
        self.last_report = tokio::time::Instant::now();
    }
}

/// The summary's figures, by key (printed as `key=value` lines, sorted).
type Summary = BTreeMap<String, String>;

/// What the figures divide by, taken once when the run's loop ended.
struct Totals {
    /// Seconds of the measured window (at least 1).
    measured: f64,
    /// Seconds since the start.
    elapsed: f64,
    /// The fleet's messages.
    messages: u64,
}

/// Every figure of the summary (the module docs list them), the fleet still running.
///
/// Errors: the outage's log could not be read, or a `/metrics` scrape failed.
async fn summary(
    args: &Args,
    standin: &edgebeat_tests::standin::StandInHandle,
    stats: &FleetStats,
    gateways: &Gateways,
    mut run: Run,
    scraped: Option<&ResourceScraper>,
) -> anyhow::Result<Summary> {
    run.all_latencies.extend(stats.take_latencies());
    run.all_latencies.sort_unstable();
    run.ages.sort_unstable();
    let totals = Totals {
        measured: tokio::time::Instant::now()
            .duration_since(run.measured_from)
            .as_secs_f64()
            .max(1.0),
        messages: Run::messages(stats),
        elapsed: run.started.elapsed().as_secs_f64(),
    };
    let (gateway_rss, gateway_cpu) = figures_of(&gateways.pids);
    let mut summary = Summary::new();
    let mut put = |k: &str, v: String| {
        summary.insert(k.to_owned(), v);
    };
    put("nodes", args.nodes.to_string());
    put(
        "renewal_usage_every",
        if args.no_usage { "0" } else { "2" }.to_owned(),
    );
    if let (Some(scraper), Some(every)) = (scraped, args.scrape_every) {
        put("scrape_every_s", every.to_string());
        scraper.figures(&mut put);
    }
    put(
        "apiserver_connections_max",
        run.apiserver_conns_max.to_string(),
    );
    put(
        "apiserver_connections_accepted",
        standin.connections().to_string(),
    );
    message_figures(stats, &run, &totals, &mut put);
    put(
        "gateway_rss_mib",
        format!("{:.1}", gateway_rss as f64 / 1024.0),
    );
    put(
        "gateway_rss_per_node_kib",
        format!("{:.1}", gateway_rss as f64 / args.nodes as f64),
    );
    put(
        "gateway_cpu_s_per_s",
        format!(
            "{:.3}",
            (gateway_cpu + run.cpu_of_gone - run.cpu_start) / totals.elapsed
        ),
    );
    let (sim_rss, _) = process_figures(std::process::id()).unwrap_or_default();
    put("sim_rss_mib", format!("{:.1}", sim_rss as f64 / 1024.0));
    put(
        "sim_rss_per_node_kib",
        format!("{:.1}", sim_rss as f64 / args.nodes as f64),
    );
    soak_figures(&run, &mut put);
    lease_write_figures(standin, stats, &mut put);
    broker_figures(&run, &totals, &mut put);
    if let Some(o) = run.outage.take() {
        for (key, value) in o.figures().await? {
            put(key, value);
        }
    }
    kill_figures(args, stats, &run, &mut put);
    if args.enroll {
        enrollment_figures(standin, stats, gateways, &run, &mut put);
    }
    let node_hours = args.nodes as f64 * totals.elapsed / 3600.0;
    for (key, count) in standin.request_counts() {
        let mut parts = key.split(' ');
        let (Some(method), Some(resource), Some(status)) =
            (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let name = format!(
            "apiserver_{}_{}_{}_per_node_hour",
            method.to_lowercase(),
            resource.replace('/', "_"),
            status
        );
        put(&name, format!("{:.1}", count as f64 / node_hours));
    }
    if args.sites > 0 {
        site_figures(&standin.events(), &run.cuts, &mut put);
    }
    if !args.ack_only {
        metrics_scrape_figures(gateways.metrics_port, &mut put).await?;
    }
    Ok(summary)
}

/// The fleet's counts, the message rate, ack times and Lease ages.
fn message_figures(
    stats: &FleetStats,
    run: &Run,
    totals: &Totals,
    put: &mut impl FnMut(&str, String),
) {
    for (key, counter) in [
        ("renewals_ok", &stats.renewals_ok),
        ("renewals_failed", &stats.renewals_failed),
        ("status_ok", &stats.status_ok),
        ("registrations", &stats.registrations),
    ] {
        put(key, counter.load(Ordering::Relaxed).to_string());
    }
    put(
        "messages_per_s",
        format!(
            "{:.1}",
            (totals.messages - run.messages_at_measure.unwrap_or(0)) as f64 / totals.measured
        ),
    );
    for (key, q) in [
        ("ack_p50_ms", 0.5),
        ("ack_p99_ms", 0.99),
        ("ack_max_ms", 1.0),
    ] {
        put(
            key,
            format!("{:.1}", f64::from(quantile(&run.all_latencies, q)) / 1000.0),
        );
    }
    put(
        "lease_age_p99_s",
        format!("{:.1}", f64::from(quantile(&run.ages, 0.99)) / 1000.0),
    );
    put(
        "lease_age_max_s",
        format!("{:.1}", f64::from(quantile(&run.ages, 1.0)) / 1000.0),
    );
    put("expired_samples", run.expired_samples.to_string());
    put("expired_nodes", run.expired_nodes.len().to_string());
}

/// A soak's slopes and first and last descriptor counts, from the progress lines after the
/// warm-up.
fn soak_figures(run: &Run, put: &mut impl FnMut(&str, String)) {
    let soak = &run.soak;
    if let [first, .., last] = soak.as_slice() {
        let slope = |y: fn(&SoakSample) -> f64| {
            let points: Vec<(f64, f64)> = soak.iter().map(|s| (s.minutes, y(s))).collect();
            format!("{:.1}", least_squares_slope(&points))
        };
        put(
            "gateway_rss_slope_kib_per_min",
            slope(|s| s.gateway_rss_kib),
        );
        put("gateway_fds_first", first.gateway_fds.to_string());
        put("gateway_fds_last", last.gateway_fds.to_string());
        if !run.broker_pids.is_empty() {
            put("broker_rss_slope_kib_per_min", slope(|s| s.broker_rss_kib));
            put("broker_fds_first", first.broker_fds.to_string());
            put("broker_fds_last", last.broker_fds.to_string());
        }
    }
}

/// The Lease writes the stand-in took, against the renewals sent and answered.
fn lease_write_figures(
    standin: &edgebeat_tests::standin::StandInHandle,
    stats: &FleetStats,
    put: &mut impl FnMut(&str, String),
) {
    // Every Lease write of the gateway is one renewal's: more writes than renewals the
    // transport took for a node is a renewal written twice (by two replicas). A renewal
    // taken but not written (answered RETRY, lost) could hide one such duplicate; the
    // failed renewals printed below bound that blind spot.
    // Answers first, then writes: a write precedes its answer, so writes in flight at the
    // end count as unanswered (a few), never the other way round.
    let answered = stats.renewals_ok.load(Ordering::Relaxed);
    let writes = standin.lease_write_counts();
    let sent = stats.renewals_taken_by_node();
    let duplicates: u64 = writes
        .iter()
        .map(|(node, n)| n.saturating_sub(sent.get(node).copied().unwrap_or(0)))
        .sum();
    let total_writes: u64 = writes.values().sum();
    put("lease_writes", total_writes.to_string());
    put("lease_writes_beyond_renewals_sent", duplicates.to_string());
    // Writes whose answer never reached the node: those in flight when a replica died,
    // answered after the node's ack timeout, or in flight at the end of the run.
    put(
        "lease_writes_unanswered",
        total_writes.saturating_sub(answered).to_string(),
    );
}

/// The broker's memory and CPU over the measured window (with broker processes).
fn broker_figures(run: &Run, totals: &Totals, put: &mut impl FnMut(&str, String)) {
    if run.broker_pids.is_empty() {
        return;
    }
    let (rss, cpu) = figures_of(&run.broker_pids);
    let used = cpu + run.broker_cpu_of_gone - run.broker_cpu_at_measure.unwrap_or(0.0);
    let sent = totals.messages - run.messages_at_measure.unwrap_or(0);
    put("broker_rss_mib", format!("{:.1}", rss as f64 / 1024.0));
    put(
        "broker_cpu_s_per_s",
        format!("{:.3}", used / totals.measured),
    );
    put(
        "broker_cpu_us_per_message",
        format!("{:.1}", used * 1e6 / sent.max(1) as f64),
    );
}

/// With a kill: when it came, and until when nodes saw failures after it.
fn kill_figures(args: &Args, stats: &FleetStats, run: &Run, put: &mut impl FnMut(&str, String)) {
    let Some(killed) = run.killed_at else {
        return;
    };
    put(
        if args.kill_broker_after.is_some() {
            "broker_killed_at_s"
        } else {
            "replica_killed_at_s"
        },
        format!("{:.0}", killed.duration_since(run.started).as_secs_f64()),
    );
    // How long nodes saw failures after the kill (0 when none failed after it).
    let last = stats.last_failure().filter(|t| *t >= killed);
    put(
        "renewal_failures_until_s_after_kill",
        format!(
            "{:.1}",
            last.map_or(0.0, |t| t.duration_since(killed).as_secs_f64())
        ),
    );
}

/// `--enroll`: how many enrolled and were identified, when the last did, the requests it
/// took, and the gateway's peak memory.
fn enrollment_figures(
    standin: &edgebeat_tests::standin::StandInHandle,
    stats: &FleetStats,
    gateways: &Gateways,
    run: &Run,
    put: &mut impl FnMut(&str, String),
) {
    let (enrolled_at, identified_at) = stats.enrollment_times();
    let since = |t: Option<tokio::time::Instant>| {
        t.map_or_else(
            || "never".into(),
            |t| format!("{:.1}", t.duration_since(run.started).as_secs_f64()),
        )
    };
    let enrolled = stats.enrolled.load(Ordering::Relaxed);
    put("enrolled", enrolled.to_string());
    put(
        "identified",
        stats.identified.load(Ordering::Relaxed).to_string(),
    );
    put("last_enrolled_at_s", since(enrolled_at));
    put("last_identified_at_s", since(identified_at));
    put(
        "enrollment_requests",
        stats
            .enrollment_requests
            .load(Ordering::Relaxed)
            .to_string(),
    );
    put(
        "enrollment_retries",
        stats.enrollment_retries.load(Ordering::Relaxed).to_string(),
    );
    // The apiserver calls of enrollment: Secrets (site CA, tokens) and CSRs.
    let enrollment_calls: u64 = standin
        .request_counts()
        .iter()
        .filter(|(key, _)| key.contains("secrets") || key.contains("certificatesigningrequests"))
        .map(|(_, n)| n)
        .sum();
    put(
        "apiserver_requests_per_enrollment",
        format!("{:.2}", enrollment_calls as f64 / enrolled.max(1) as f64),
    );
    let peak: u64 = gateways
        .pids
        .iter()
        .filter_map(|p| edgebeat_tests::procfs::vm_hwm_kib(*p))
        .sum();
    put(
        "gateway_peak_rss_mib",
        format!("{:.1}", peak as f64 / 1024.0),
    );
}

/// What a Prometheus scrape of the first replica costs with this fleet: its series, its
/// size, and the median of five scrapes' times (fleet still running).
///
/// Errors: a scrape failed.
async fn metrics_scrape_figures(
    metrics_port: u16,
    put: &mut impl FnMut(&str, String),
) -> anyhow::Result<()> {
    let mut times = Vec::new();
    let mut body = String::new();
    for _ in 0..5 {
        let asked = tokio::time::Instant::now();
        body = scrape_metrics(metrics_port).await?;
        times.push(asked.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let series = body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    put("metrics_series", series.to_string());
    put("metrics_scrape_bytes", body.len().to_string());
    put(
        "metrics_scrape_ms_median",
        format!("{:.1}", times.get(2).copied().unwrap_or_default()),
    );
    Ok(())
}

/// Stops every replica (SIGKILL: the figures are taken), the broker started here, and the
/// stand-in.
async fn stop_all(
    mut gateways: Gateways,
    broker: Option<Broker>,
    standin: &edgebeat_tests::standin::StandInHandle,
) {
    for child in std::iter::once(&mut gateways.first).chain(gateways.replicas.iter_mut()) {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    if let Some(mut broker) = broker {
        broker.stop().await;
    }
    standin.shutdown();
}
