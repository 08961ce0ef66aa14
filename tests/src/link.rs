//! An edge link made of Linux parts: the agent in its own network namespace behind a veth
//! pair, the gateway side in this namespace, and the link's interface byte and packet
//! counters (`/sys/class/net/<if>/statistics`). What the counters see is what a metered link
//! would bill: every Ethernet, IP and TCP header, every TCP ACK, every keepalive.
//!
//! Needs root (`ip netns`, `ip link`). One link at a time per host: the namespace, the
//! interface names and the addresses are fixed ([`GATEWAY_IP`], [`AGENT_IP`]); a link left
//! behind by a killed run is removed when the next one is created.
//!
//! The gateway side reaches its services on loopback through [`forward`], a plain TCP relay
//! listening on [`GATEWAY_IP`]: the link carries the agent's own TCP connection, unchanged.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use tokio::net::{TcpListener, TcpStream};

/// The agent's network namespace.
pub const NAMESPACE: &str = "edgebeat-link";
/// The veth end in this namespace (the gateway side), whose counters are read.
pub const HOST_INTERFACE: &str = "eb-link-gw";
/// The veth end in [`NAMESPACE`] (the agent side).
pub const AGENT_INTERFACE: &str = "eb-link-agent";
/// Address of the gateway side of the link (also in the test PKI's server certificate).
pub const GATEWAY_IP: &str = "10.213.0.1";
/// Address of the agent side of the link.
pub const AGENT_IP: &str = "10.213.0.2";
/// MAC address of the gateway side (locally administered).
const HOST_MAC: &str = "02:eb:00:00:00:01";
/// MAC address of the agent side (locally administered).
const AGENT_MAC: &str = "02:eb:00:00:00:02";

/// Interface counters of the gateway-side veth end: `rx` is what the agent sent, `tx` what
/// it received. Frames are counted whole (14-byte Ethernet header included, no FCS).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Bytes from the agent.
    pub up_bytes: u64,
    /// Frames from the agent.
    pub up_packets: u64,
    /// Bytes to the agent.
    pub down_bytes: u64,
    /// Frames to the agent.
    pub down_packets: u64,
}

impl Counters {
    /// `self − earlier`, counter by counter.
    pub fn since(self, earlier: Counters) -> Counters {
        Counters {
            up_bytes: self.up_bytes.saturating_sub(earlier.up_bytes),
            up_packets: self.up_packets.saturating_sub(earlier.up_packets),
            down_bytes: self.down_bytes.saturating_sub(earlier.down_bytes),
            down_packets: self.down_packets.saturating_sub(earlier.down_packets),
        }
    }

    /// Bytes both ways.
    pub fn bytes(&self) -> u64 {
        self.up_bytes + self.down_bytes
    }

    /// Frames both ways.
    pub fn packets(&self) -> u64 {
        self.up_packets + self.down_packets
    }
}

/// A created link; dropping it deletes the namespace (and with it both veth ends) and
/// lets the next user of the host's one link have it.
#[derive(Debug)]
pub struct Link {
    /// Held exclusively for the link's life ([`LOCK_FILE`]).
    _lock: std::fs::File,
}

/// Locked (`flock`) while a [`Link`] exists, so that a benchmark and a test on one host take
/// turns instead of deleting each other's link.
pub const LOCK_FILE: &str = "/run/edgebeat-link.lock";

fn ip(args: &[&str]) -> anyhow::Result<()> {
    run_tool("ip", args)
}

/// Runs `program` (`ip`, `tc`) with `args` to completion.
///
/// Errors: it cannot start, or exits unsuccessfully (its stderr in the message).
pub(crate) fn run_tool(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = crate::process::output(Command::new(program).args(args).stdin(Stdio::null()))
        .with_context(|| format!("running {program} (iproute2)"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Sets the kernel setting `key` (sysctl's dotted name, e.g. `net.ipv4.tcp_timestamps`) to
/// `value`, in `namespace` when given (through `ip netns exec`), by writing
/// `/proc/sys/<key with / for .>` (sysctl(8) does the same; procps need not be installed).
///
/// Errors: a key or value with characters outside letters, digits, `.`, `_`, `-` (and
/// spaces in the value), or the write failing.
fn write_sysctl(namespace: Option<&str>, key: &str, value: &str) -> anyhow::Result<()> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    anyhow::ensure!(
        !key.is_empty() && key.chars().all(plain) && value.chars().all(|c| plain(c) || c == ' '),
        "{key}={value}: a sysctl name and value of letters, digits, '.', '_' and '-'"
    );
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    match namespace {
        None => std::fs::write(&path, value).with_context(|| format!("writing {path}")),
        Some(ns) => run_tool(
            "ip",
            &[
                "netns",
                "exec",
                ns,
                "sh",
                "-c",
                &format!("echo {value} > {path}"),
            ],
        ),
    }
}

impl Link {
    /// Waits for [`LOCK_FILE`], then creates the namespace and the veth pair, addresses
    /// both ends (`/30`), turns IPv6 off on both and gives each a permanent neighbour entry
    /// for the other (nothing but the agent's traffic is counted: a metered cellular or
    /// satellite uplink carries IP only, on a raw-IP or point-to-point interface without
    /// ARP, while a veth pair would otherwise refresh its neighbour entries with an ARP
    /// exchange about every 50 s, about 0.15 MB a day) and brings them up, after removing a
    /// link left by an earlier run.
    ///
    /// Errors: not root, no `ip` command, or the kernel refuses (no veth, no namespaces).
    pub fn create() -> anyhow::Result<Link> {
        let lock =
            std::fs::File::create(LOCK_FILE).with_context(|| format!("creating {LOCK_FILE}"))?;
        lock.lock()
            .with_context(|| format!("locking {LOCK_FILE}"))?;
        let _ = ip(&["netns", "del", NAMESPACE]);
        let _ = ip(&["link", "del", HOST_INTERFACE]);
        ip(&["netns", "add", NAMESPACE])?;
        let link = Link { _lock: lock };
        ip(&[
            "link",
            "add",
            HOST_INTERFACE,
            "address",
            HOST_MAC,
            "type",
            "veth",
            "peer",
            "name",
            AGENT_INTERFACE,
            "address",
            AGENT_MAC,
            "netns",
            NAMESPACE,
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("{GATEWAY_IP}/30"),
            "dev",
            HOST_INTERFACE,
        ])?;
        // No IPv6 on the link: its router solicitations and MLD reports would be counted.
        write_sysctl(
            None,
            &format!("net.ipv6.conf.{HOST_INTERFACE}.disable_ipv6"),
            "1",
        )?;
        write_sysctl(
            Some(NAMESPACE),
            &format!("net.ipv6.conf.{AGENT_INTERFACE}.disable_ipv6"),
            "1",
        )?;
        ip(&["link", "set", HOST_INTERFACE, "up"])?;
        ip(&[
            "neigh",
            "replace",
            AGENT_IP,
            "lladdr",
            AGENT_MAC,
            "dev",
            HOST_INTERFACE,
            "nud",
            "permanent",
        ])?;
        ip(&[
            "-n",
            NAMESPACE,
            "addr",
            "add",
            &format!("{AGENT_IP}/30"),
            "dev",
            AGENT_INTERFACE,
        ])?;
        ip(&["-n", NAMESPACE, "link", "set", AGENT_INTERFACE, "up"])?;
        ip(&[
            "-n",
            NAMESPACE,
            "neigh",
            "replace",
            GATEWAY_IP,
            "lladdr",
            HOST_MAC,
            "dev",
            AGENT_INTERFACE,
            "nud",
            "permanent",
        ])?;
        ip(&["-n", NAMESPACE, "link", "set", "lo", "up"])?;
        Ok(link)
    }

    /// Whether this process can create links (root, with `ip` and network namespaces).
    pub fn available() -> bool {
        let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1))
                == Some("0")
        });
        root && crate::process::status(
            Command::new("ip")
                .args(["netns", "list"])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .is_ok_and(|s| s.success())
    }

    /// Errors unless [`Link::available`]: for benchmarks, which cannot measure without it.
    pub fn require() -> anyhow::Result<()> {
        anyhow::ensure!(
            Self::available(),
            "needs root with `ip netns` (network namespaces and veth pairs)"
        );
        Ok(())
    }

    /// The gateway-side counters now.
    ///
    /// Errors: the interface is gone or its statistics unreadable.
    pub fn counters(&self) -> anyhow::Result<Counters> {
        let read = |name: &str| -> anyhow::Result<u64> {
            let path = Path::new("/sys/class/net")
                .join(HOST_INTERFACE)
                .join("statistics")
                .join(name);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            text.trim()
                .parse()
                .with_context(|| format!("{}: {text:?}", path.display()))
        };
        Ok(Counters {
            up_bytes: read("rx_bytes")?,
            up_packets: read("rx_packets")?,
            down_bytes: read("tx_bytes")?,
            down_packets: read("tx_packets")?,
        })
    }

    /// Takes the link down (`ip link set … down` on the gateway side: the agent side loses
    /// its carrier, nothing crosses) or brings it back up: a cut uplink and its return.
    ///
    /// Errors: `ip` fails.
    pub fn set_up(&self, up: bool) -> anyhow::Result<()> {
        ip(&[
            "link",
            "set",
            HOST_INTERFACE,
            if up { "up" } else { "down" },
        ])
    }

    /// A command that runs `program` inside the agent's namespace (`ip netns exec`).
    pub fn command(&self, program: &Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("ip");
        command
            .args(["netns", "exec", NAMESPACE])
            .arg(program)
            .kill_on_drop(true);
        command
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", NAMESPACE]);
        let _ = ip(&["link", "del", HOST_INTERFACE]);
    }
}

/// Relays every connection accepted on `GATEWAY_IP:0` to `upstream` (a service on
/// loopback), until the runtime stops. Returns the port it listens on.
///
/// Errors: binding (the link must exist).
pub async fn forward(upstream: SocketAddr) -> anyhow::Result<u16> {
    let listener = TcpListener::bind((GATEWAY_IP, 0))
        .await
        .with_context(|| format!("binding {GATEWAY_IP}:0"))?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut agent, _)) = listener.accept().await {
            let _ = agent.set_nodelay(true);
            tokio::spawn(async move {
                let Ok(mut service) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = service.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut agent, &mut service).await;
            });
        }
    });
    Ok(port)
}

/// What one link measurement runs: a transport, with or without TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// gRPC, plaintext HTTP/2 (`http://`).
    Grpc,
    /// gRPC over mutual TLS with a node certificate, as `deploy/gateway` runs it.
    GrpcMtls,
    /// MQTT 5 through Mosquitto, plaintext (`mqtt://`).
    Mqtt,
    /// MQTT 5 over TLS with a node certificate, every message signed.
    MqttTlsSigned,
}

impl Case {
    /// Every case, in the order the benchmark prints them.
    pub const ALL: [Case; 4] = [Case::Grpc, Case::GrpcMtls, Case::Mqtt, Case::MqttTlsSigned];

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Case::Grpc => "gRPC",
            Case::GrpcMtls => "gRPC, mTLS",
            Case::Mqtt => "MQTT",
            Case::MqttTlsSigned => "MQTT, TLS + signed",
        }
    }

    /// Parses `grpc`, `grpc-mtls`, `mqtt` or `mqtt-tls`.
    pub fn parse(text: &str) -> Option<Case> {
        Some(match text {
            "grpc" => Case::Grpc,
            "grpc-mtls" => Case::GrpcMtls,
            "mqtt" => Case::Mqtt,
            "mqtt-tls" => Case::MqttTlsSigned,
            _ => return None,
        })
    }
}

/// One steady window on the link.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Its length.
    pub length: std::time::Duration,
    /// What crossed the link in it.
    pub counters: Counters,
    /// Lease renewals the stand-in recorded as written in it.
    pub renewals: usize,
    /// Status PATCHes the stand-in recorded in it.
    pub reports: usize,
}

/// The measurement of one [`Case`]: a window with Lease renewals only (status reported at
/// start, then not for an hour), one with a periodic status report every `report_every`
/// (an unchanged node's), and one in which a condition flips (MemoryPressure becomes True:
/// one status report with the change).
#[derive(Debug, Clone, Copy)]
pub struct Measurement {
    /// Which case.
    pub case: Case,
    /// Renewals (and keepalives) only.
    pub renewals: Window,
    /// Renewals plus periodic status reports of an unchanged status.
    pub with_reports: Window,
    /// Renewals plus the report of one condition flip.
    pub with_flip: Window,
}

/// kubelet's mean time between two Lease renewals at its defaults: the 10 s renew interval
/// stretched by `wait.JitterUntil`'s jitter factor 0.04, on average by 2 % (10.2 s).
pub const MEAN_RENEW_PERIOD: std::time::Duration = std::time::Duration::from_millis(10_200);

/// Status reports in a day at kubelet's `nodeStatusReportFrequency` (5 min).
pub const REPORTS_PER_DAY: f64 = 288.0;
/// Condition flips assumed per day (each one status report, sent at once).
pub const FLIPS_PER_DAY: f64 = 4.0;

impl Measurement {
    /// Link bytes per second of the renewals-only window (renewals, their answers, TCP
    /// ACKs, keepalives).
    pub fn renewal_rate(&self) -> f64 {
        self.renewals.counters.bytes() as f64 / self.renewals.length.as_secs_f64()
    }

    /// What `window` carried beyond the renewals-only rate, per status report in it
    /// (`count` picks bytes or packets); `None` without a report.
    fn per_report(&self, window: &Window, count: impl Fn(&Counters) -> u64) -> Option<f64> {
        let a = &self.renewals;
        let rate = count(&a.counters) as f64 / a.length.as_secs_f64();
        (window.reports > 0).then(|| {
            let beyond = count(&window.counters) as f64 - rate * window.length.as_secs_f64();
            (beyond / window.reports as f64).max(0.0)
        })
    }

    /// Link bytes a periodic status report of an unchanged node adds.
    pub fn report_bytes(&self) -> Option<f64> {
        self.per_report(&self.with_reports, Counters::bytes)
    }

    /// Link bytes the status report of a condition flip adds.
    pub fn flip_bytes(&self) -> Option<f64> {
        self.per_report(&self.with_flip, Counters::bytes)
    }

    /// Bytes per node-day: the renewal rate for 86,400 s, [`REPORTS_PER_DAY`] periodic
    /// reports and [`FLIPS_PER_DAY`] flips.
    pub fn bytes_per_day(&self) -> f64 {
        self.renewal_rate() * 86_400.0
            + REPORTS_PER_DAY * self.report_bytes().unwrap_or(0.0)
            + FLIPS_PER_DAY * self.flip_bytes().unwrap_or(0.0)
    }

    /// Packets per node-day, estimated as bytes are.
    pub fn packets_per_day(&self) -> f64 {
        let a = &self.renewals;
        let rate = a.counters.packets() as f64 / a.length.as_secs_f64();
        rate * 86_400.0
            + REPORTS_PER_DAY
                * self
                    .per_report(&self.with_reports, Counters::packets)
                    .unwrap_or(0.0)
            + FLIPS_PER_DAY
                * self
                    .per_report(&self.with_flip, Counters::packets)
                    .unwrap_or(0.0)
    }
}

/// The agent binary built beside the running executable (`target/<profile>/edgebeat-agent`,
/// also for test executables in `target/<profile>/deps`): [`crate::process::workspace_binary`].
///
/// Errors: not built (`cargo build -p edgebeat-agent` first).
pub fn agent_binary() -> anyhow::Result<std::path::PathBuf> {
    crate::process::workspace_binary("edgebeat-agent")
}

/// Starts the agent `command` (from [`Link::command`] or a plain `edgebeat-agent` command)
/// with `--config config`, logging warnings and errors to the file `log`.
///
/// Errors: the log file cannot be created or the agent cannot start.
pub fn spawn_agent(
    mut command: tokio::process::Command,
    config: &Path,
    log: &Path,
) -> anyhow::Result<tokio::process::Child> {
    let log = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    crate::process::spawn_async(
        command
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "warn")
            .stdout(log.try_clone()?)
            .stderr(log),
    )
    .with_context(|| format!("starting edgebeat-agent with {}", config.display()))
}

/// Measures `case`: starts the stand-in, a gateway (and Mosquitto for MQTT) on this side,
/// the real `edgebeat-agent` binary in the link's namespace at kubelet's default cadence
/// (Lease renewed every 10 s), and counts three steady windows of `window` each (see
/// [`Measurement`]); the second reports status every `report_every`. `keepalive` sets
/// `transport.keepalive` (`None`: the agent's default). `agent_sysctls` (`key=value`, e.g.
/// `net.ipv4.tcp_timestamps=0`) are set in the agent's namespace: host tuning an operator
/// could apply on the board.
///
/// Errors: the link, the cluster or the agent could not start, or the agent did not
/// register within a minute.
pub async fn measure(
    case: Case,
    window: std::time::Duration,
    report_every: std::time::Duration,
    keepalive: Option<std::time::Duration>,
    agent_sysctls: &[String],
) -> anyhow::Result<Measurement> {
    let link = Link::create()?;
    for setting in agent_sysctls {
        let (key, value) = setting.split_once('=').with_context(|| {
            format!("{setting:?}: expected key=value, e.g. net.ipv4.tcp_timestamps=0")
        })?;
        write_sysctl(Some(NAMESPACE), key, value)?;
    }
    let (site, cluster, port) = gateway_side(case).await?;
    let side = Side {
        link: &link,
        cluster: &cluster,
        site: &site,
        dir: tempfile::tempdir()?,
        case,
        port,
        keepalive,
    };
    let hour = std::time::Duration::from_secs(3600);
    Ok(Measurement {
        case,
        renewals: side.window("link-0", hour, window, false).await?,
        with_reports: side.window("link-1", report_every, window, false).await?,
        with_flip: side.window("link-2", hour, window, true).await?,
    })
}

/// The gateway side of `case` on this side of the link: a site CA, the cluster (stand-in,
/// gateway, Mosquitto for MQTT) in the posture of `case`, and the port of a relay on
/// [`GATEWAY_IP`] to its gRPC listener or broker.
///
/// Errors: the cluster did not start, or the relay could not bind (the link must exist).
async fn gateway_side(
    case: Case,
) -> anyhow::Result<(crate::pki::Ca, crate::harness::Cluster, u16)> {
    use crate::harness::{Cluster, Transport, gateway_options, mtls_options};
    let site = crate::pki::Ca::new("edgebeat site CA");
    let cluster = match case {
        Case::Grpc => Cluster::start(Transport::Grpc).await?,
        Case::GrpcMtls => Cluster::start_grpc_with(mtls_options(&site), gateway_options()).await?,
        Case::Mqtt => Cluster::start(Transport::Mqtt).await?,
        Case::MqttTlsSigned => Cluster::start_mqtt_secure(&site, true, gateway_options()).await?,
    };
    let upstream: SocketAddr = match &cluster.broker {
        Some(b) => SocketAddr::new(b.host().parse()?, b.port()),
        None => cluster
            .grpc_url
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .parse()?,
    };
    let port = forward(upstream).await?;
    Ok((site, cluster, port))
}

/// What a partition of the link costs when it heals ([`measure_partition`]).
#[derive(Debug, Clone, Copy)]
pub struct Heal {
    /// Which case.
    pub case: Case,
    /// How long the link was down.
    pub partition: std::time::Duration,
    /// Length of each counted window.
    pub window: std::time::Duration,
    /// A steady window before the partition.
    pub steady: Counters,
    /// The window that starts when the link comes back.
    pub healed: Counters,
    /// From the link's return to the node caught up: its Lease renewed and the status with
    /// the transition made while cut off written.
    pub caught_up: std::time::Duration,
    /// How far the transition's Event time is from when the memory pressure began
    /// (seconds; `None`: no Event found).
    pub event_off_by: Option<f64>,
}

impl Heal {
    /// Bytes the healed window carried beyond the steady one.
    pub fn heal_bytes(&self) -> i64 {
        i64::try_from(self.healed.bytes()).unwrap_or(i64::MAX)
            - i64::try_from(self.steady.bytes()).unwrap_or(i64::MAX)
    }
}

/// Measures what a partition of `partition` costs `case` when it heals: the real agent in
/// the link's namespace at kubelet's cadence, registered and renewing; a steady `window`
/// counted; the link taken down (`ip link set … down` on the gateway side) for `partition`,
/// MemoryPressure turning True 5 s into it (a transition the agent's journal holds); the
/// link back up and the `window` after it counted, with the time until the node caught
/// up and the Event's time checked against the pressure's.
///
/// Errors: as [`measure`], or the node not caught up within `window` + 2 minutes.
pub async fn measure_partition(
    case: Case,
    partition: std::time::Duration,
    window: std::time::Duration,
    keepalive: Option<std::time::Duration>,
) -> anyhow::Result<Heal> {
    let link = Link::create()?;
    let (site, cluster, port) = gateway_side(case).await?;
    let side = Side {
        link: &link,
        cluster: &cluster,
        site: &site,
        dir: tempfile::tempdir()?,
        case,
        port,
        keepalive,
    };
    let node = "link-cut";
    let hour = std::time::Duration::from_secs(3600);
    let (mut agent, host) = side.start(node, hour).await?;
    // Time passing is what is measured here: plain sleeps.
    let before = link.counters()?;
    tokio::time::sleep(window).await;
    let steady = link.counters()?.since(before);
    link.set_up(false)?;
    let cut_at = tokio::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let usage = 3_978_792_960u64 - 50 * 1024 * 1024 + 991_285_248;
    std::fs::write(
        host.path()
            .join("sys/fs/cgroup/memory/memory.usage_in_bytes"),
        format!("{usage}\n"),
    )?;
    let pressure_at = jiff::Timestamp::now();
    tokio::time::sleep(partition.saturating_sub(cut_at.elapsed())).await;
    let (renewed, reported) = written(&cluster.standin.requests(), node);
    let before = link.counters()?;
    link.set_up(true)?;
    let healed_at = tokio::time::Instant::now();
    cluster
        .standin
        .wait_until(
            window + std::time::Duration::from_secs(120),
            "caught up after the partition",
            |v| {
                let (r, p) = written(v.requests(), node);
                r > renewed && p > reported
            },
        )
        .await?;
    let caught_up = healed_at.elapsed();
    tokio::time::sleep(window.saturating_sub(healed_at.elapsed())).await;
    let healed = link.counters()?.since(before);
    let _ = agent.kill().await;
    let event_off_by = cluster
        .standin
        .events()
        .iter()
        .filter(|e| e.reason.as_deref() == Some("NodeHasInsufficientMemory"))
        .filter_map(|e| e.first_timestamp.as_ref())
        .map(|t| {
            let truth = pressure_at.as_second();
            (t.0.as_second() - truth).abs() as f64
        })
        .reduce(f64::min);
    Ok(Heal {
        case,
        partition,
        window,
        steady,
        healed,
        caught_up,
        event_off_by,
    })
}

/// `(Lease renewals written, status PATCHes)` of `node` in `requests`.
fn written(requests: &[crate::standin::RecordedRequest], node: &str) -> (usize, usize) {
    (
        crate::requests::count(requests, |r| crate::requests::is_lease_renewed(r, node)),
        crate::requests::count(requests, |r| crate::requests::is_status_patch(r, node)),
    )
}

/// The gateway side of one measurement, for [`Side::window`].
struct Side<'a> {
    link: &'a Link,
    cluster: &'a crate::harness::Cluster,
    site: &'a crate::pki::Ca,
    dir: tempfile::TempDir,
    case: Case,
    port: u16,
    keepalive: Option<std::time::Duration>,
}

impl Side<'_> {
    /// Starts an agent for `node` reporting status every `report_every`, waits until it is
    /// registered and renewing, counts about `length` of the link, from one Lease write to
    /// the one that ends `length` / [`MEAN_RENEW_PERIOD`] renew periods later (with `flip`,
    /// MemoryPressure turns True at its start), and kills it.
    async fn window(
        &self,
        node: &str,
        report_every: std::time::Duration,
        length: std::time::Duration,
        flip: bool,
    ) -> anyhow::Result<Window> {
        let (mut agent, host) = self.start(node, report_every).await?;
        let written = |requests: &[crate::standin::RecordedRequest]| written(requests, node);
        // The window runs from one Lease write to a later one, so that it holds whole renew
        // periods: a window of fixed length catches 11 or 12 renewals in 120 s (the period
        // is 10 to 10.4 s with kubelet's jitter), which moves the day's figure by 8 %.
        let (renewed_steady, _) = written(&self.cluster.standin.requests());
        let renewal_after = |after: usize, what: &'static str| {
            self.cluster.standin.wait_until(
                length * 2 + std::time::Duration::from_secs(60),
                what,
                move |v| written(v.requests()).0 > after,
            )
        };
        renewal_after(renewed_steady, "a renewal to start the window").await?;
        let (renewed, reported) = written(&self.cluster.standin.requests());
        let before = self.link.counters()?;
        let started = tokio::time::Instant::now();
        if flip {
            // The root cgroup's usage leaves under 100Mi available (rpi4-cgroup1: MemTotal
            // 3,978,792,960 B, total_inactive_file 991,285,248 B).
            let usage = 3_978_792_960u64 - 50 * 1024 * 1024 + 991_285_248;
            std::fs::write(
                host.path()
                    .join("sys/fs/cgroup/memory/memory.usage_in_bytes"),
                format!("{usage}\n"),
            )?;
        }
        // Renewals in `length` at kubelet's mean period (the renew interval × 1.02).
        let periods = (length.as_secs_f64() / MEAN_RENEW_PERIOD.as_secs_f64())
            .round()
            .max(1.0) as usize;
        let mut last = renewed + periods - 1;
        if flip {
            // The flip's report belongs in the window: end at the first write after it.
            self.cluster
                .standin
                .wait_until(
                    length * 2 + std::time::Duration::from_secs(60),
                    "the flip's report",
                    |v| written(v.requests()).1 > reported,
                )
                .await?;
            last = last.max(written(&self.cluster.standin.requests()).0);
        }
        renewal_after(last, "the window's renewals").await?;
        let counters = self.link.counters()?.since(before);
        let length = started.elapsed();
        let (renewed_after, reported_after) = written(&self.cluster.standin.requests());
        let _ = agent.kill().await;
        Ok(Window {
            length,
            counters,
            renewals: renewed_after - renewed,
            reports: reported_after - reported,
        })
    }

    /// Starts the agent for `node` (status reported every `report_every`) on a copy of
    /// the `rpi4-cgroup1` fixture and waits until it is registered, its status written and
    /// its Lease renewed. Returns it and its host tree.
    async fn start(
        &self,
        node: &str,
        report_every: std::time::Duration,
    ) -> anyhow::Result<(tokio::process::Child, tempfile::TempDir)> {
        let host = crate::harness::fixture_copy("rpi4-cgroup1")?;
        let case = self.case;
        let file = |name: &str| self.dir.path().join(format!("{node}-{name}"));
        let tls = match case {
            Case::Grpc | Case::Mqtt => String::new(),
            Case::GrpcMtls | Case::MqttTlsSigned => {
                let leaf = self.site.node(node);
                std::fs::write(file("ca.crt"), &self.site.cert_pem)?;
                std::fs::write(file("node.crt"), &leaf.cert_pem)?;
                std::fs::write(file("node.key"), &leaf.key_pem)?;
                format!(
                    ", caFile: {}, certFile: {}, keyFile: {}",
                    file("ca.crt").display(),
                    file("node.crt").display(),
                    file("node.key").display()
                )
            }
        };
        let keepalive = self
            .keepalive
            .map_or(String::new(), |k| format!(", keepalive: {}s", k.as_secs()));
        let (kind, scheme) = match case {
            Case::Grpc => ("grpc", "http"),
            Case::GrpcMtls => ("grpc", "https"),
            Case::Mqtt => ("mqtt", "mqtt"),
            Case::MqttTlsSigned => ("mqtt", "mqtts"),
        };
        std::fs::write(
            file("agent.yaml"),
            format!(
                "apiVersion: edgebeat.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {node}\nhostRoot: {}\nnodeStatusReportFrequency: {}s\ntransport: {{kind: {kind}, endpoint: \"{scheme}://{GATEWAY_IP}:{}\"{tls}{keepalive}}}\n",
                host.path().display(),
                report_every.as_secs(),
                self.port,
            ),
        )?;
        let agent = spawn_agent(
            self.link.command(&agent_binary()?),
            &file("agent.yaml"),
            &file("agent.log"),
        )?;
        let written = |requests: &[crate::standin::RecordedRequest]| written(requests, node);
        // Steady: registered, first status written, renewing.
        let started = self
            .cluster
            .standin
            .wait_until(
                std::time::Duration::from_secs(60),
                "registered and renewing",
                |v| {
                    let (renewed, reported) = written(v.requests());
                    renewed >= 1 && reported >= 1
                },
            )
            .await;
        if let Err(e) = started {
            let log = std::fs::read_to_string(file("agent.log")).unwrap_or_default();
            bail!(
                "{}: the agent did not start: {e}\nagent log:\n{log}",
                case.name()
            );
        }
        Ok((agent, host))
    }
}
