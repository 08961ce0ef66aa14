//! `edgebeat-cluster-load`: what N nodes cost the real kube-apiserver and etcd
//! (`edgebeat_tests::control_plane`), written directly as kubelets write them and through one
//! `edgebeat-gateway` replica, side by side in one run. `scripts/cluster-load.sh` builds and
//! runs it; BENCHMARKS.md quotes it.
//!
//! Each side gets a fresh control plane with upstream settings:
//! - **kubelets**: N nodes, each with a client and a connection of its own (as N kubelets),
//!   POST its Node (the very Node the gateway registers for the same simulated host:
//!   `edgebeat_tests::fleet::registered_node`), patch its whole status once, create its
//!   Lease, then PUT the Lease every 10 s with the object of its last write (kubelet's
//!   `nodeLeaseRenewIntervalFraction` × 40 s) and patch every condition's
//!   `lastHeartbeatTime` every 5 min (`nodeStatusReportFrequency`, nothing changed); nodes
//!   start spread over the ramp. Each writes as its node (`system:node:<name>` in
//!   `system:nodes`, impersonated by the admin), so the Node authorizer and NodeRestriction
//!   judge its requests as they judge a kubelet's.
//! - **gateway**: `deploy/gateway`'s RBAC and arguments (`DeployedGateway`), N simulated
//!   agents over gRPC with mTLS (`edgebeat_tests::fleet`, kubelet's cadence: Lease 40 s
//!   renewed every 10 s, status every 10 s reported every 5 min).
//!
//! After the ramp, one Lease duration, and until kube-controller-manager has done with the
//! new Nodes (its TTL and node lifecycle controllers patch each one, at its client's 20
//! requests/s, again whenever the cluster's size crosses a TTL step: minutes for thousands
//! of nodes, work both sides owe to registration, not to heartbeats), over
//! `--window-seconds` (300, one status report per node, by default): kube-apiserver's and etcd's CPU
//! (utime + stime of `/proc/<pid>/stat`) per node-minute, etcd's writes (`etcd_mvcc_put_total`
//! from its `/metrics`) per node-minute, kube-apiserver's requests by verb and resource
//! from the audit log, and every 5 s each Lease's age (now − renewTime): `expired` counts the
//! samples older than the Lease's 40 s. Printed as `side.key=value` lines.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use edgebeat_gateway::bodies;
use edgebeat_tests::control_plane::{ControlPlane, DeployedGateway};
use edgebeat_tests::fleet::{FleetOptions, FleetStats, FleetTransport, registered_node, run_fleet};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
struct Args {
    /// Nodes on each side.
    #[arg(long, default_value_t = 500)]
    nodes: usize,
    /// Node starts spread over this many seconds.
    #[arg(long, default_value_t = 30)]
    ramp_seconds: u64,
    /// Seconds measured after the ramp, one Lease duration and kube-controller-manager's
    /// registration work (module docs); 300 holds one status report of every node.
    #[arg(long, default_value_t = 300)]
    window_seconds: u64,
    /// Which sides to run: kubelets, gateway, or both.
    #[arg(long, default_value = "both")]
    side: String,
}

const LEASE_SECONDS: i32 = 40;
const RENEW: Duration = Duration::from_secs(10);
/// kubelet's `nodeStatusReportFrequency`.
const REPORT: Duration = Duration::from_secs(300);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    edgebeat_transports::tls::install_ring_provider();
    println!("nodes={}", args.nodes);
    println!("window_s={}", args.window_seconds);
    if args.side == "both" || args.side == "kubelets" {
        let control_plane = ControlPlane::start(&[])?;
        let stop = CancellationToken::new();
        let writers = kubelets(&control_plane, &args, stop.clone()).await?;
        measure("kubelets", &control_plane, &args).await?;
        stop.cancel();
        for writer in writers {
            let _ = writer.await;
        }
    }
    if args.side == "both" || args.side == "gateway" {
        let control_plane = ControlPlane::start(&[])?;
        let gateway = DeployedGateway::start(&control_plane, &[]).await;
        let stats = Arc::new(FleetStats::default());
        let stop = CancellationToken::new();
        let transport = FleetTransport::Grpc(format!("https://{}", gateway.grpc));
        let options = FleetOptions {
            prefix: "gw-".to_owned(),
            ramp: Duration::from_secs(args.ramp_seconds),
            site_ca: Some(gateway.site.clone()),
            // Nothing changes on either side: status is reported every 5 min unchanged.
            flip_probability: 0.0,
            ..FleetOptions::new(args.nodes, transport)
        };
        let fleet = tokio::spawn(run_fleet(options, stats, stop.clone()));
        measure("gateway", &control_plane, &args).await?;
        stop.cancel();
        let _ = fleet.await;
        drop(gateway);
    }
    Ok(())
}

/// N kubelet-like writers (see the module docs), running until `stop`.
async fn kubelets(
    control_plane: &ControlPlane,
    args: &Args,
    stop: CancellationToken,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut writers = Vec::new();
    let hosts = FleetOptions {
        prefix: "kubelet-".to_owned(),
        ..FleetOptions::new(args.nodes, FleetTransport::Grpc(String::new()))
    };
    for i in 0..args.nodes {
        // A client, and so a connection, of its own, as the node.
        let name = hosts.node_name(i);
        let client = kubelet_client(control_plane, &name).await?;
        let start = Duration::from_secs(args.ramp_seconds).mul_f64(i as f64 / args.nodes as f64);
        let stop = stop.clone();
        let hosts = hosts.clone();
        writers.push(tokio::spawn(async move {
            tokio::time::sleep(start).await;
            let node = registered_node(&hosts, i, jiff::Timestamp::now());
            if let Err(error) = kubelet(client, node, &name, stop).await {
                eprintln!("{name}: {error:#}");
            }
        }));
    }
    Ok(writers)
}

/// A client of node `name`: the admin's credentials impersonating `system:node:<name>` in
/// `system:nodes`, so each request is authorized as a kubelet's is, by the Node authorizer
/// and NodeRestriction (a real kubelet presents its own client certificate instead).
async fn kubelet_client(control_plane: &ControlPlane, name: &str) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&control_plane.admin_kubeconfig)?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    config.auth_info.impersonate = Some(format!("system:node:{name}"));
    config.auth_info.impersonate_groups = Some(vec!["system:nodes".to_owned()]);
    Ok(kube::Client::try_from(config)?)
}

async fn kubelet(
    client: kube::Client,
    node: Node,
    name: &str,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let status = bodies::status_patch(node.status.as_ref().context("a status")?, None)?;
    nodes.create(&PostParams::default(), &node).await?;
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(status))
        .await?;
    let mut lease = leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some("kube-node-lease".to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(name.to_owned()),
                    lease_duration_seconds: Some(LEASE_SECONDS),
                    renew_time: Some(MicroTime(jiff::Timestamp::now())),
                    ..LeaseSpec::default()
                }),
            },
        )
        .await?;
    let mut tick = tokio::time::interval(RENEW);
    tick.tick().await;
    let mut report = tokio::time::interval(REPORT);
    report.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            _ = report.tick() => {
                // What kubelet's two-way merge patch of an unchanged status carries.
                let now = Time(bodies::whole_seconds(jiff::Timestamp::now()));
                let conditions: Vec<serde_json::Value> =
                    ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
                        .iter()
                        .map(|t| serde_json::json!({"type": t, "lastHeartbeatTime": now}))
                        .collect();
                let body = serde_json::json!({"status": {"conditions": conditions}});
                let patch = Patch::Strategic(body);
                if let Err(error) = nodes.patch_status(name, &PatchParams::default(), &patch).await {
                    eprintln!("{name}: reporting status: {error}");
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        }
        match leases.replace(name, &PostParams::default(), &lease).await {
            Ok(written) => lease = written,
            Err(error) => eprintln!("{name}: renewing: {error}"),
        }
    }
}

fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command's closing parenthesis: utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').context("stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

fn pid_of(control_plane: &ControlPlane, component: &str) -> anyhow::Result<u32> {
    Ok(
        std::fs::read_to_string(control_plane.dir.join(format!("{component}.pid")))?
            .trim()
            .parse()?,
    )
}

async fn etcd_puts(control_plane: &ControlPlane) -> anyhow::Result<f64> {
    let env = std::fs::read_to_string(control_plane.dir.join("env"))?;
    let url = env
        .lines()
        .find_map(|l| l.strip_prefix("export EDGEBEAT_ETCD_URL="))
        .context("etcd URL")?;
    let addr = url.trim_start_matches("http://");
    let (_, body) = edgebeat_tests::harness::http_get(addr.parse()?, "/metrics").await?;
    Ok(body
        .lines()
        .find_map(|l| l.strip_prefix("etcd_mvcc_put_total "))
        .context("etcd_mvcc_put_total")?
        .trim()
        .parse()?)
}

/// `PATCH`es of Nodes (not of their status) kube-apiserver has answered: the
/// controllers' (`apiserver_request_total` of its `/metrics`).
async fn node_patches(admin: &kube::Client) -> anyhow::Result<f64> {
    let text = admin
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains(r#"resource="nodes""#)
                && l.contains(r#"subresource="""#)
                && l.contains(r#"verb="PATCH""#)
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum())
}

/// Waits for the ramp, one Lease duration and kube-controller-manager's last patch of a
/// Node (none for 15 s; at most 15 min), then measures the window (module docs).
async fn measure(side: &str, control_plane: &ControlPlane, args: &Args) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(
        args.ramp_seconds + LEASE_SECONDS as u64,
    ))
    .await;
    let admin = control_plane.admin_client().await?;
    let (mut last, mut quiet) = (node_patches(&admin).await?, 0);
    while quiet < 3 {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(900),
            "kube-controller-manager still patching Nodes after 15 min"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = node_patches(&admin).await?;
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
    }
    println!("{side}.settled_after_s={}", started.elapsed().as_secs());
    let apiserver = pid_of(control_plane, "kube-apiserver")?;
    let etcd = pid_of(control_plane, "etcd")?;
    let ticks_per_s = 100.0; // sysconf(_SC_CLK_TCK) on Linux
    let from = jiff::Timestamp::now();
    let (a0, e0, p0) = (
        cpu_ticks(apiserver)?,
        cpu_ticks(etcd)?,
        etcd_puts(control_plane).await?,
    );
    let leases: Api<Lease> = Api::namespaced(admin, "kube-node-lease");
    let end = tokio::time::Instant::now() + Duration::from_secs(args.window_seconds);
    let (mut samples, mut expired, mut max_age) = (0usize, 0usize, 0f64);
    while tokio::time::Instant::now() < end {
        let now = jiff::Timestamp::now();
        for lease in leases.list(&ListParams::default()).await? {
            let Some(renewed) = lease.spec.and_then(|s| s.renew_time) else {
                continue;
            };
            let age = (now - renewed.0).total(jiff::Unit::Second).unwrap_or(0.0);
            samples += 1;
            max_age = max_age.max(age);
            if age > f64::from(LEASE_SECONDS) {
                expired += 1;
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let (a1, e1, p1) = (
        cpu_ticks(apiserver)?,
        cpu_ticks(etcd)?,
        etcd_puts(control_plane).await?,
    );
    let node_minutes = args.nodes as f64 * args.window_seconds as f64 / 60.0;
    let cpu_ms = |t0: u64, t1: u64| (t1 - t0) as f64 / ticks_per_s * 1000.0;
    println!(
        "{side}.apiserver_cpu_ms_per_node_minute={:.2}",
        cpu_ms(a0, a1) / node_minutes
    );
    println!(
        "{side}.etcd_cpu_ms_per_node_minute={:.2}",
        cpu_ms(e0, e1) / node_minutes
    );
    println!(
        "{side}.etcd_puts_per_node_minute={:.2}",
        (p1 - p0) / node_minutes
    );
    println!("{side}.lease_samples={samples}");
    println!("{side}.lease_expired_samples={expired}");
    println!("{side}.lease_age_max_s={max_age:.1}");
    let to = jiff::Timestamp::now();
    let mut requests: BTreeMap<String, usize> = BTreeMap::new();
    for event in control_plane.audit()? {
        let user = &event.user.username;
        let ours = user == "kubernetes-admin" && event.name().starts_with("kubelet-")
            || user == "system:serviceaccount:edgebeat-system:edgebeat-gateway";
        if ours && event.at().is_ok_and(|at| at >= from && at < to) {
            *requests
                .entry(format!(
                    "{}_{}",
                    event.verb,
                    event.resource().replace('/', "_")
                ))
                .or_default() += 1;
        }
    }
    for (call, n) in requests {
        println!(
            "{side}.requests_per_node_minute.{call}={:.2}",
            n as f64 / node_minutes
        );
    }
    Ok(())
}
