//! The fleet simulator: many simulated edge agents in one process, each a real client of the
//! real transports code (its own gRPC stream or MQTT session through the broker), with its
//! own node name, boot ID and host figures, kubelet's cadences with jitter, condition flips
//! and churn. edgebeat's counterpart of kwok (`sigs.k8s.io/kwok`), shared by the benchmarks
//! (`edgebeat-fleet`) and the fleet tests.
//!
//! A simulated node does what `edgebeat-agent` does on the wire, without reading a host:
//! it registers on every connect (the transport's [`RegisterFn`]), renews its Lease every
//! `renew_interval` × (1 + 0.04 × jitter) echoing the gateway's Lease state, computes its
//! status every `status_interval` and reports it when a condition flipped or every
//! `status_report_interval`, and answers the gateway's `resend_status`. Each message's
//! `Header.seq` is the node's simulated boot clock in µs, as the agent's CLOCK_BOOTTIME.
//! As the agent, every second renewal attempt (the first included) carries the node's
//! resource usage ([`FleetOptions::usage`], on by default), with simulated figures.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use edgebeat_proto::{self as pb, agent_message::Kind};
use edgebeat_transports::uplink::{RegisterFn, Uplink, UplinkError, channel};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// kubelet's jitter factor on both heartbeat loops (`wait.JitterUntil(…, 0.04, …)`).
const JITTER: f64 = 0.04;

/// Where the simulated agents send their heartbeats.
#[derive(Debug, Clone)]
pub enum FleetTransport {
    /// gRPC to the gateway at this `http://host:port` URL (one stream per node).
    Grpc(String),
    /// MQTT 5 through the brokers `(host, port)` of one cluster (one session per node):
    /// node `i` dials broker `i mod n` first and the others in turn after a lost
    /// connection ([`edgebeat_transports::mqtt::MqttUplinkOptions::failover`]), so the fleet
    /// is spread over the cluster's nodes as a load balancer would spread it.
    Mqtt {
        /// The cluster's nodes; at least one.
        brokers: Vec<(String, u16)>,
    },
}

impl FleetTransport {
    /// MQTT through the one broker at `host:port`.
    pub fn mqtt(host: impl Into<String>, port: u16) -> Self {
        Self::Mqtt {
            brokers: vec![(host.into(), port)],
        }
    }
}

/// What the simulated fleet does.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Number of nodes.
    pub nodes: usize,
    /// Node names are `{prefix}{index:05}`.
    pub prefix: String,
    /// Transport of every node.
    pub transport: FleetTransport,
    /// Lease renew interval (kubelet: `nodeLeaseDurationSeconds` × 0.25 = 10 s).
    pub renew_interval: Duration,
    /// `nodeLeaseDurationSeconds` (40).
    pub lease_duration_seconds: i32,
    /// `nodeStatusUpdateFrequency` (10 s): how often status is computed.
    pub status_interval: Duration,
    /// `nodeStatusReportFrequency` (5 min): unchanged status is reported this often.
    pub status_report_interval: Duration,
    /// Chance per status computation that a node's MemoryPressure flips (0.001: about once
    /// per 3 h per node).
    pub flip_probability: f64,
    /// Node starts are spread evenly over this time, so a fleet joins as a fleet does.
    pub ramp: Duration,
    /// Reboots per minute across the fleet (a new boot ID, a new connection, a
    /// re-registration).
    pub reboots_per_minute: f64,
    /// How long one answer may take (kubelet's heartbeat client timeout, 10 s).
    pub ack_timeout: Duration,
    /// gRPC over mutual TLS (an `https://` endpoint): the site CA that signs each node's
    /// kubelet-style certificate (issued when the node starts) and the gateway's. `None`:
    /// plaintext.
    pub site_ca: Option<Arc<crate::pki::Ca>>,
    /// Each node also reports the agent's six health conditions (all False), as an agent
    /// with every health signal does.
    pub health_conditions: bool,
    /// Each node first enrolls for its certificate with a bootstrap token, as an agent with
    /// `bootstrapTokenFile` does, then heartbeats over gRPC with mutual TLS with it
    /// (`transport` must be an `https://` gRPC URL of a gateway run with `--enrollment`).
    pub enroll: Option<FleetEnrollment>,
    /// Sites and silences: node `i` registers with `topology.kubernetes.io/zone` =
    /// [`Silences::site_name`]`(i % sites)`, and sends nothing while [`Silences`] says it is
    /// silent (its site cut off, or the node itself down). `None`: no sites.
    pub silences: Option<Arc<Silences>>,
    /// Every second renewal attempt of each node (the first included) carries its resource
    /// usage (`LeaseRenewal.usage`), as the agent's do (`USAGE_EVERY_NTH_RENEWAL`): a
    /// cumulative CPU time that grows with the node's simulated uptime at 1–2 % of one CPU
    /// (about 200–400 ms per 20 s), and a working set of 120–360 MiB by node plus a little
    /// noise per sample. Those renewals are about 12 bytes larger. On by default; `false`
    /// sends none, as before the gateway served resource metrics.
    pub usage: bool,
}

/// Which simulated nodes are silent now: a site's uplink cut, or one node down (churn).
/// A silent node sends nothing (no renewal, no status report) but keeps its connection, as
/// a board behind a dead uplink whose gateway has not yet noticed; the gateway only reads
/// its Lease going stale.
#[derive(Debug)]
pub struct Silences {
    sites: usize,
    origin: Instant,
    /// Per node: milliseconds after `origin` until which it is down.
    node_until: Vec<AtomicU64>,
    /// Per site: milliseconds after `origin` until which it is cut off.
    site_until: Vec<AtomicU64>,
}

impl Silences {
    /// `nodes` nodes over `sites` sites (at least 1), none silent.
    pub fn new(nodes: usize, sites: usize) -> Self {
        let sites = sites.max(1);
        Self {
            sites,
            origin: Instant::now(),
            node_until: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            site_until: (0..sites).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Number of sites.
    pub fn sites(&self) -> usize {
        self.sites
    }

    /// The zone label of site `site`: `site-NN`.
    pub fn site_name(site: usize) -> String {
        format!("site-{site:02}")
    }

    /// The site of node `index`.
    pub fn site_of(&self, index: usize) -> usize {
        index % self.sites
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Node `index` goes silent for `d`.
    pub fn down(&self, index: usize, d: Duration) {
        if let Some(until) = self.node_until.get(index) {
            until.store(self.now_ms() + d.as_millis() as u64, Ordering::Relaxed);
        }
    }

    /// Site `site`'s uplink is cut for `d`.
    pub fn cut(&self, site: usize, d: Duration) {
        if let Some(until) = self.site_until.get(site) {
            until.store(self.now_ms() + d.as_millis() as u64, Ordering::Relaxed);
        }
    }

    /// Whether node `index` is silent now.
    pub fn silent(&self, index: usize) -> bool {
        let now = self.now_ms();
        let over =
            |until: Option<&AtomicU64>| until.is_some_and(|u| u.load(Ordering::Relaxed) > now);
        over(self.node_until.get(index)) || over(self.site_until.get(self.site_of(index)))
    }
}

/// Where and with what the simulated nodes enroll (see [`FleetOptions::enroll`]).
#[derive(Debug, Clone)]
pub struct FleetEnrollment {
    /// The gateway's enrollment listener, `http://host:port`.
    pub url: String,
    /// The bootstrap token every node uses (its node names must cover the fleet's).
    pub token: edgebeat_transports::enroll::BootstrapToken,
}

/// A simulated node's enrolled identity: its certificate, key and the site CA, PEM.
#[derive(Debug, Clone)]
struct Enrolled {
    cert_pem: String,
    key_pem: String,
    ca_pem: String,
}

impl FleetOptions {
    /// `nodes` nodes over `transport` with kubelet's default cadences, a 10 s ramp, rare
    /// flips and no reboots.
    pub fn new(nodes: usize, transport: FleetTransport) -> Self {
        Self {
            nodes,
            prefix: "sim-".into(),
            transport,
            renew_interval: Duration::from_secs(10),
            lease_duration_seconds: 40,
            status_interval: Duration::from_secs(10),
            status_report_interval: Duration::from_secs(300),
            flip_probability: 0.001,
            ramp: Duration::from_secs(10),
            reboots_per_minute: 0.0,
            ack_timeout: Duration::from_secs(10),
            site_ca: None,
            health_conditions: false,
            enroll: None,
            silences: None,
            usage: true,
        }
    }

    /// Whether node `index` is silent now (see [`Silences`]).
    fn silent(&self, index: usize) -> bool {
        self.silences.as_ref().is_some_and(|s| s.silent(index))
    }

    /// Name of node `index`.
    pub fn node_name(&self, index: usize) -> String {
        format!("{}{index:05}", self.prefix)
    }
}

/// The Node the gateway registers for simulated node `index` of `options`, its conditions
/// first written at `now` (`edgebeat_gateway::bodies::initial_node` of the node's
/// registration): what a kubelet with the same host facts POSTs, for a benchmark that
/// writes nodes directly, as kubelets do, beside the fleet (`edgebeat-cluster-load`).
pub fn registered_node(
    options: &FleetOptions,
    index: usize,
    now: jiff::Timestamp,
) -> k8s_openapi::api::core::v1::Node {
    use edgebeat_gateway::bodies;
    let host = Host::new(index, options);
    let register = host.register(None);
    let status = register.status.clone().unwrap_or_default();
    let conditions = bodies::conditions(&status, now, &bodies::KnownConditions::default());
    bodies::initial_node(
        &host.name,
        &register,
        bodies::node_status(&status, conditions),
    )
}

/// What the fleet did, counted as it runs (every field an event count).
#[derive(Debug, Default)]
pub struct FleetStats {
    /// Lease renewals sent.
    pub renewals_sent: AtomicU64,
    /// Lease renewals the gateway answered OK (written).
    pub renewals_ok: AtomicU64,
    /// Lease renewals answered otherwise, or not answered in time.
    pub renewals_failed: AtomicU64,
    /// Status reports sent.
    pub status_sent: AtomicU64,
    /// Status reports answered OK.
    pub status_ok: AtomicU64,
    /// Register messages built by the transports: one per connect and when asked (MQTT
    /// also builds one per connect for its Last Will header, which is not sent as a Register).
    pub registrations: AtomicU64,
    /// Reboots simulated.
    pub reboots: AtomicU64,
    /// Certificate requests sent ([`FleetOptions::enroll`]).
    pub enrollment_requests: AtomicU64,
    /// Certificate requests answered pending, refused, or not answered (rate limited, a
    /// timeout).
    pub enrollment_retries: AtomicU64,
    /// Nodes that got their certificate.
    pub enrolled: AtomicU64,
    /// Enrolled nodes whose first Lease renewal with their certificate was written.
    pub identified: AtomicU64,
    /// When the last node got its certificate, and when the last one was identified.
    enrollment_times: Mutex<(Option<Instant>, Option<Instant>)>,
    /// Lease renewals the transport took (sent, not refused unsent), by node name.
    renewals_taken_by_node: Mutex<std::collections::BTreeMap<String, u64>>,
    /// When a renewal last failed.
    last_failure: Mutex<Option<Instant>>,
    /// Renewal answer times since the last [`FleetStats::take_latencies`], µs.
    latencies: Mutex<Vec<u32>>,
    /// Failed renewals by why (the ack's reason, or the transport's error).
    failures: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl FleetStats {
    /// The renewal answer times recorded since the last call (µs), sorted.
    pub fn take_latencies(&self) -> Vec<u32> {
        let mut taken = std::mem::take(&mut *self.latencies.lock());
        taken.sort_unstable();
        taken
    }

    /// Failed renewals by why, so far.
    pub fn failures(&self) -> std::collections::BTreeMap<String, u64> {
        self.failures.lock().clone()
    }

    /// Lease renewals the transport took so far (each may have been written once), by
    /// node name.
    pub fn renewals_taken_by_node(&self) -> std::collections::BTreeMap<String, u64> {
        self.renewals_taken_by_node.lock().clone()
    }

    /// When a renewal last failed (answered otherwise than OK, or not answered in time).
    pub fn last_failure(&self) -> Option<Instant> {
        *self.last_failure.lock()
    }

    /// When the last node got its certificate and when the last enrolled node had its
    /// first renewal written ([`FleetOptions::enroll`]).
    pub fn enrollment_times(&self) -> (Option<Instant>, Option<Instant>) {
        *self.enrollment_times.lock()
    }

    fn enrollment_event(&self, identified: bool) {
        let mut times = self.enrollment_times.lock();
        if identified {
            self.identified.fetch_add(1, Ordering::Relaxed);
            times.1 = Some(Instant::now());
        } else {
            self.enrolled.fetch_add(1, Ordering::Relaxed);
            times.0 = Some(Instant::now());
        }
    }

    /// Adds `delta` (±1) to the renewals the transport took for `node`.
    fn taken(&self, node: &str, delta: i64) {
        let mut taken = self.renewals_taken_by_node.lock();
        let n = taken.entry(node.to_owned()).or_default();
        *n = n.saturating_add_signed(delta);
    }

    fn failed(&self, why: String) {
        self.renewals_failed.fetch_add(1, Ordering::Relaxed);
        *self.last_failure.lock() = Some(Instant::now());
        *self.failures.lock().entry(why).or_default() += 1;
    }

    fn latency(&self, d: Duration) {
        let us = u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
        self.latencies.lock().push(us);
    }
}

/// The `q` quantile (0..=1) of sorted `values`, or 0 when empty.
pub fn quantile(values: &[u32], q: f64) -> u32 {
    if values.is_empty() {
        return 0;
    }
    let rank = ((values.len() - 1) as f64 * q).round() as usize;
    values[rank.min(values.len() - 1)]
}

/// Runs the fleet until `cancel` fires: starts node `i` at `i / nodes × ramp` and returns
/// once every node has stopped (its connection closed).
pub async fn run_fleet(options: FleetOptions, stats: Arc<FleetStats>, cancel: CancellationToken) {
    let options = Arc::new(options);
    let origin = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..options.nodes {
        let start = origin
            + options
                .ramp
                .mul_f64(index as f64 / options.nodes.max(1) as f64);
        let (options, stats, cancel) = (options.clone(), stats.clone(), cancel.clone());
        tasks.spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(start) => {}
            }
            simulate_node(index, options, stats, cancel).await;
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// The host figures of one simulated node: fixed per node, varied across the fleet.
#[derive(Debug, Clone)]
struct Host {
    index: usize,
    name: String,
    boot_id: [u8; 16],
    memory_kib: u64,
    disk_bytes: u64,
    cpus: u32,
    address: String,
    memory_pressure: bool,
    health_conditions: bool,
    /// Its certificate from enrollment, once it has one.
    enrolled: Option<Enrolled>,
    /// Whether its first renewal with that certificate was counted as identified.
    identified: bool,
}

impl Host {
    fn new(index: usize, options: &FleetOptions) -> Self {
        Self {
            index,
            name: options.node_name(index),
            boot_id: fastrand_bytes(),
            memory_kib: [1_000_000, 2_000_000, 4_000_000, 8_000_000][index % 4]
                + (index as u64 % 997) * 64,
            disk_bytes: (16 + (index as u64 % 240)) * 1_000_000_000,
            cpus: [1, 2, 4, 8][index % 4],
            address: format!(
                "10.{}.{}.{}",
                index >> 16 & 255,
                index >> 8 & 255,
                index & 255
            ),
            memory_pressure: false,
            health_conditions: options.health_conditions,
            enrolled: None,
            identified: false,
        }
    }

    /// Its registration (labels, taints and whole status) without a header: node `name`'s
    /// as the agent sends it, in `site` (its `topology.kubernetes.io/zone`) if any.
    fn register(&self, site: Option<String>) -> pb::Register {
        pb::Register {
            labels: [
                ("kubernetes.io/hostname".to_owned(), self.name.clone()),
                ("kubernetes.io/os".to_owned(), "linux".to_owned()),
                ("kubernetes.io/arch".to_owned(), "arm64".to_owned()),
                ("beta.kubernetes.io/os".to_owned(), "linux".to_owned()),
                ("beta.kubernetes.io/arch".to_owned(), "arm64".to_owned()),
            ]
            .into_iter()
            .chain(site.map(|s| ("topology.kubernetes.io/zone".to_owned(), s)))
            .collect(),
            taints: vec![pb::Taint {
                key: "edgebeat.io/edge".into(),
                value: "true".into(),
                effect: "NoSchedule".into(),
            }],
            status: Some(self.status()),
            ..Default::default()
        }
    }

    fn status(&self) -> pb::NodeStatus {
        let memory = format!("{}Ki", self.memory_kib);
        let allocatable_memory = format!("{}Ki", self.memory_kib.saturating_sub(102_400));
        let disk = self.disk_bytes.to_string();
        let allocatable_disk = (self.disk_bytes / 10 * 9).to_string();
        let resources = |memory: &str, disk: &str| {
            [
                ("cpu".to_owned(), self.cpus.to_string()),
                ("memory".to_owned(), memory.to_owned()),
                ("ephemeral-storage".to_owned(), disk.to_owned()),
                ("pods".to_owned(), "0".to_owned()),
                ("hugepages-2Mi".to_owned(), "0".to_owned()),
            ]
            .into()
        };
        let condition = |t: &str, s: &str, reason: &str, message: &str| pb::NodeCondition {
            r#type: t.into(),
            status: s.into(),
            reason: reason.into(),
            message: message.into(),
            seconds_since_transition: 0,
        };
        let memory_condition = if self.memory_pressure {
            condition(
                "MemoryPressure",
                "True",
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            )
        } else {
            condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            )
        };
        let health: &[(&str, &str)] = if self.health_conditions {
            &[
                (
                    "SystemMemoryContentionPressure",
                    "KubeletHasNoSystemMemoryContentionPressure",
                ),
                (
                    "SystemDiskContentionPressure",
                    "KubeletHasNoSystemDiskContentionPressure",
                ),
                ("ReadonlyFilesystem", "FilesystemIsNotReadOnly"),
                ("ThermalPressure", "TemperatureNormal"),
                ("UnderVoltage", "SufficientVoltage"),
                ("ClockUnsynchronized", "NTPSynchronized"),
            ]
        } else {
            &[]
        };
        let mut conditions: Vec<pb::NodeCondition> = health
            .iter()
            .map(|(t, reason)| condition(t, "False", reason, "simulated"))
            .collect();
        conditions.extend([
            memory_condition,
            condition(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
            ),
            condition(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            condition(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
            ),
        ]);
        pb::NodeStatus {
            capacity: resources(&memory, &disk),
            allocatable: resources(&allocatable_memory, &allocatable_disk),
            conditions,
            addresses: vec![
                pb::NodeAddress {
                    r#type: "InternalIP".into(),
                    address: self.address.clone(),
                },
                pb::NodeAddress {
                    r#type: "Hostname".into(),
                    address: self.name.clone(),
                },
            ],
            kubelet_endpoint_port: 10250,
            node_info: Some(pb::NodeSystemInfo {
                machine_id: format!("{:032x}", fxhash(&self.name)),
                system_uuid: String::new(),
                boot_id: pb::boot_id_to_string(&self.boot_id),
                kernel_version: "6.1.0-rpi7-rpi-v8".into(),
                os_image: "Debian GNU/Linux 12 (bookworm)".into(),
                container_runtime_version: String::new(),
                kubelet_version: "v1.36.0".into(),
                operating_system: "linux".into(),
                architecture: "arm64".into(),
            }),
        }
    }
}

impl Host {
    /// The node's resource usage at `uptime` of its simulated boot: cumulative CPU time at
    /// 1–2 % of one CPU (by node; it restarts from 0 at a reboot, as a host's), and a working
    /// set of 120–360 MiB by node (at most half its memory) plus up to 16 MiB of noise per
    /// sample. Never 0 (the gateway ignores a sample with a 0): uptime starts at 30 s.
    fn usage(&self, uptime: Duration) -> pb::ResourceUsage {
        let per_mille = 10 + (self.index as u64 % 11);
        let uptime_ms = u64::try_from(uptime.as_millis()).unwrap_or(u64::MAX);
        let base_kib = (120 * 1024 + (self.index as u64 % 13) * 20 * 1024).min(self.memory_kib / 2);
        pb::ResourceUsage {
            cpu_usage_ms: (uptime_ms / 1000 * per_mille).max(1),
            memory_working_set_kib: (base_kib + fastrand::u64(0..16 * 1024)).max(1),
        }
    }
}

fn fastrand_bytes() -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&fastrand::u64(..).to_le_bytes());
    out[8..].copy_from_slice(&fastrand::u64(..).to_le_bytes());
    out
}

fn fxhash(s: &str) -> u128 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u128, |h, b| {
        (h ^ u128::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Headers of one boot: the node's name and boot ID, `seq` from its simulated boot clock.
#[derive(Clone)]
struct Headers {
    name: Arc<str>,
    boot_id: [u8; 16],
    /// The simulated boot happened this long before `booted`.
    uptime_at_start: Duration,
    booted: Instant,
    last: Arc<AtomicU64>,
}

impl Headers {
    /// The node's simulated uptime now.
    fn uptime(&self) -> Duration {
        self.uptime_at_start + self.booted.elapsed()
    }

    fn next(&self) -> pb::Header {
        let now = self.uptime();
        let mut seq = u64::try_from(now.as_micros()).unwrap_or(u64::MAX);
        // Strictly increasing, as the agent's: two messages in one microsecond differ.
        let last = self.last.fetch_max(seq, Ordering::Relaxed);
        if seq <= last {
            seq = last + 1;
            self.last.fetch_max(seq, Ordering::Relaxed);
        }
        let wall_time_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        pb::Header {
            node_name: self.name.to_string(),
            boot_id: self.boot_id.to_vec(),
            seq,
            wall_time_ms,
            boot_tag: 0,
        }
    }
}

/// One node, boot after boot, until `cancel`.
async fn simulate_node(
    index: usize,
    options: Arc<FleetOptions>,
    stats: Arc<FleetStats>,
    cancel: CancellationToken,
) {
    let mut host = Host::new(index, &options);
    if let Some(enrollment) = &options.enroll {
        match enroll(&host, enrollment, &stats, &cancel).await {
            Some(enrolled) => host.enrolled = Some(enrolled),
            None => return,
        }
    }
    loop {
        let boot = cancel.child_token();
        let rebooted = run_boot(&mut host, &options, &stats, &boot).await;
        boot.cancel();
        if !rebooted {
            return;
        }
        stats.reboots.fetch_add(1, Ordering::Relaxed);
        host.boot_id = fastrand_bytes();
    }
}

/// Enrolls `host` as the agent does (`edgebeat_agent::certificates`): a P-256 key made
/// here, a request proved by the token, its answer verified against the token's pin, and
/// again after 2 s doubling to 60 s (with jitter) while pending or unanswered. `None` when
/// refused or cancelled.
async fn enroll(
    host: &Host,
    enrollment: &FleetEnrollment,
    stats: &FleetStats,
    cancel: &CancellationToken,
) -> Option<Enrolled> {
    use edgebeat_transports::enroll::{self, AnswerTrust, Answered, NodeKeyPair};
    let key = NodeKeyPair::generate().ok()?;
    let csr = key.certificate_request(&host.name).ok()?;
    let headers = Headers {
        name: host.name.as_str().into(),
        boot_id: host.boot_id,
        uptime_at_start: Duration::from_secs(30),
        booted: Instant::now(),
        last: Arc::new(AtomicU64::new(0)),
    };
    let mut delays = edgebeat_transports::backoff::reconnect_backoff(
        Duration::from_secs(2),
        Duration::from_secs(60),
    );
    loop {
        let header = headers.next();
        let payload = enroll::token_request(&enrollment.token, header.clone(), csr.clone());
        stats.enrollment_requests.fetch_add(1, Ordering::Relaxed);
        let answer = edgebeat_transports::grpc::enroll::request_certificate(
            &enrollment.url,
            None,
            payload,
            Duration::from_secs(30),
        )
        .await
        .ok()
        .and_then(|answer| {
            enroll::read_answer(
                &answer,
                AnswerTrust::Pin(enrollment.token.ca_pin),
                &host.name,
                header.named_boot_tag(),
                header.seq,
                rustls::pki_types::UnixTime::now(),
            )
            .ok()
        });
        match answer {
            Some(Answered::Issued { chain, ca, .. }) => {
                stats.enrollment_event(false);
                return Some(Enrolled {
                    cert_pem: enroll::pem("CERTIFICATE", chain.first()?),
                    key_pem: key.to_pem(),
                    ca_pem: enroll::pem("CERTIFICATE", &ca),
                });
            }
            Some(Answered::Rejected(why)) => {
                tracing::error!(node = %host.name, %why, "enrollment refused");
                return None;
            }
            Some(Answered::Pending(_)) | None => {
                stats.enrollment_retries.fetch_add(1, Ordering::Relaxed);
            }
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(60));
        tokio::select! {
            () = cancel.cancelled() => return None,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// One boot of a node: its transport, registration, Lease and status loops. Returns true
/// when it ended in a (simulated) reboot, false when cancelled.
async fn run_boot(
    host: &mut Host,
    options: &FleetOptions,
    stats: &Arc<FleetStats>,
    cancel: &CancellationToken,
) -> bool {
    let headers = Headers {
        name: host.name.as_str().into(),
        boot_id: host.boot_id,
        uptime_at_start: Duration::from_secs(30 + fastrand::u64(0..3600)),
        booted: Instant::now(),
        last: Arc::new(AtomicU64::new(0)),
    };
    let site = options
        .silences
        .as_ref()
        .map(|s| Silences::site_name(s.site_of(host.index)));
    let register: RegisterFn = {
        let headers = headers.clone();
        let stats = stats.clone();
        let host = host.clone();
        Arc::new(move || {
            stats.registrations.fetch_add(1, Ordering::Relaxed);
            pb::AgentMessage {
                kind: Some(Kind::Register(pb::Register {
                    header: Some(headers.next()),
                    ..host.register(site.clone())
                })),
            }
        })
    };
    let (uplink, mut driver) = channel(4);
    let transport = cancel.child_token();
    let site_ca = options.site_ca.clone();
    let driver_task = match &options.transport {
        FleetTransport::Grpc(url) => {
            let mut options = edgebeat_transports::grpc::GrpcUplinkOptions::new(url.clone());
            // Pings every 30 s, not the agent's 5 min: the load every fleet figure in
            // BENCHMARKS.md was measured with, and the heavier one for the gateway.
            options.keepalive = edgebeat_transports::grpc::DEFAULT_KEEPALIVE;
            if let Some(enrolled) = &host.enrolled {
                options.tls = Some(edgebeat_transports::tls::ClientTls {
                    ca_pem: enrolled.ca_pem.clone().into_bytes(),
                    client_identity: Some(edgebeat_transports::tls::TlsIdentity {
                        cert_pem: enrolled.cert_pem.clone().into_bytes(),
                        key_pem: enrolled.key_pem.clone().into_bytes(),
                    }),
                });
                options.tls_server_name =
                    Some(edgebeat_transports::signing::ANSWER_SIGNER_NAME.to_owned());
            } else if let Some(ca) = &site_ca {
                let leaf = ca.node(&host.name);
                options.tls = Some(edgebeat_transports::tls::ClientTls {
                    ca_pem: ca.cert_pem.clone().into_bytes(),
                    client_identity: Some(edgebeat_transports::tls::TlsIdentity {
                        cert_pem: leaf.cert_pem.into_bytes(),
                        key_pem: leaf.key_pem.into_bytes(),
                    }),
                });
            }
            tokio::spawn({
                let transport = transport.clone();
                async move {
                    let _ = edgebeat_transports::grpc::run_uplink(
                        options,
                        register,
                        &mut driver,
                        transport,
                    )
                    .await;
                }
            })
        }
        FleetTransport::Mqtt { brokers } => {
            let mut ring = brokers.clone();
            ring.rotate_left(host.index % brokers.len().max(1));
            let Some((broker, port)) = ring.first().cloned() else {
                return false;
            };
            let mut mqtt = edgebeat_transports::mqtt::MqttUplinkOptions::new(broker, port);
            mqtt.failover = ring.split_off(1);
            mqtt.lease_expiry = options.renew_interval;
            let name = host.name.clone();
            tokio::spawn({
                let transport = transport.clone();
                async move {
                    let _ = edgebeat_transports::mqtt::run_uplink(
                        mqtt,
                        name,
                        register,
                        &mut driver,
                        transport,
                    )
                    .await;
                }
            })
        }
    };
    let rebooted = heartbeat_loops(host, options, stats, &uplink, &headers, cancel).await;
    transport.cancel();
    let _ = driver_task.await;
    rebooted
}

/// The Lease and status loops of one boot (kubelet's, in one task to keep a node small).
async fn heartbeat_loops(
    host: &mut Host,
    options: &FleetOptions,
    stats: &FleetStats,
    uplink: &Uplink,
    headers: &Headers,
    cancel: &CancellationToken,
) -> bool {
    let mut registered = uplink.registered();
    let mut resend = uplink.status_requests();
    tokio::select! {
        () = cancel.cancelled() => return false,
        _ = registered.wait_for(|r| *r) => {}
    }
    let jittered = |d: Duration| d.mul_f64(1.0 + JITTER * fastrand::f64());
    // A reboot, when one comes, at an exponentially distributed time for this node.
    let reboot_rate_per_node = options.reboots_per_minute / 60.0 / options.nodes.max(1) as f64;
    let reboot_at = (reboot_rate_per_node > 0.0).then(|| {
        let wait = -fastrand::f64().max(f64::MIN_POSITIVE).ln() / reboot_rate_per_node;
        Instant::now() + Duration::from_secs_f64(wait.min(1e9))
    });
    let mut lease_state = Vec::new();
    // Renewal attempts of this boot: those with an even count carry the usage.
    let mut ticks: u64 = 0;
    let mut next_renew = Instant::now();
    let mut next_status = Instant::now() + jittered(options.status_interval);
    let mut last_report = Instant::now();
    loop {
        tokio::select! {
            () = cancel.cancelled() => return false,
            () = async {
                match reboot_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => return true,
            () = tokio::time::sleep_until(next_renew) => {
                if options.silent(host.index) {
                    // Cut off: the renewal never leaves; the next is due as usual.
                    next_renew = Instant::now() + jittered(options.renew_interval);
                    continue;
                }
                let usage = (options.usage && ticks.is_multiple_of(2))
                    .then(|| host.usage(headers.uptime()));
                ticks = ticks.wrapping_add(1);
                let ok = renew(
                    options,
                    stats,
                    uplink,
                    headers,
                    &host.name,
                    &mut lease_state,
                    usage,
                    cancel,
                )
                .await;
                if ok && host.enrolled.is_some() && !host.identified {
                    host.identified = true;
                    stats.enrollment_event(true);
                }
                next_renew = Instant::now() + if ok {
                    jittered(options.renew_interval)
                } else {
                    Duration::from_millis(200 + fastrand::u64(0..800))
                };
            }
            () = tokio::time::sleep_until(next_status) => {
                let flipped = fastrand::f64() < options.flip_probability;
                if flipped {
                    host.memory_pressure = !host.memory_pressure;
                }
                if (flipped || last_report.elapsed() >= options.status_report_interval)
                    && !options.silent(host.index)
                {
                    report(options, stats, uplink, headers, host).await;
                    last_report = Instant::now();
                }
                next_status = Instant::now() + jittered(options.status_interval);
            }
            changed = resend.changed() => {
                if changed.is_err() {
                    return false;
                }
                report(options, stats, uplink, headers, host).await;
                last_report = Instant::now();
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn renew(
    options: &FleetOptions,
    stats: &FleetStats,
    uplink: &Uplink,
    headers: &Headers,
    node: &str,
    lease_state: &mut Vec<u8>,
    usage: Option<pb::ResourceUsage>,
    cancel: &CancellationToken,
) -> bool {
    let message = pb::AgentMessage {
        kind: Some(Kind::Lease(pb::LeaseRenewal {
            header: Some(headers.next()),
            lease_duration_seconds: options.lease_duration_seconds,
            lease_state: lease_state.clone(),
            // Answered every time: the simulator measures ack latency.
            quiet: false,
            usage,
        })),
    };
    stats.renewals_sent.fetch_add(1, Ordering::Relaxed);
    let sent = Instant::now();
    // Counted as taken before it can be written, so a renewal in flight when the figures
    // are read is never a write beyond the renewals taken; one the transport refuses
    // unsent is taken back.
    stats.taken(node, 1);
    let answer = uplink.send(message, options.ack_timeout).await;
    if matches!(answer, Err(UplinkError::NotConnected | UplinkError::Closed)) {
        stats.taken(node, -1);
    }
    match answer {
        Ok(ack) if ack.is_written() => {
            stats.latency(sent.elapsed());
            stats.renewals_ok.fetch_add(1, Ordering::Relaxed);
            if let pb::Answer::Renewed { lease_state: l, .. } = ack {
                *lease_state = l;
            }
            true
        }
        Ok(ack) => {
            // Numbers in reasons (ages, seqs) would make every failure its own kind.
            let why: String = ack
                .reason()
                .chars()
                .filter(|c| !c.is_ascii_digit())
                .collect();
            stats.failed(why);
            false
        }
        // Not sent, or lost because the simulation is stopping: not a failure of the gateway.
        Err(UplinkError::NotConnected | UplinkError::Closed) => false,
        Err(_) if cancel.is_cancelled() => false,
        Err(error) => {
            stats.failed(error.to_string());
            false
        }
    }
}

async fn report(
    options: &FleetOptions,
    stats: &FleetStats,
    uplink: &Uplink,
    headers: &Headers,
    host: &Host,
) {
    let message = pb::AgentMessage {
        kind: Some(Kind::Status(pb::StatusReport {
            header: Some(headers.next()),
            status: Some(host.status()),
            unchanged: false,
            journal: Vec::new(),
        })),
    };
    stats.status_sent.fetch_add(1, Ordering::Relaxed);
    if let Ok(ack) = uplink.send(message, options.ack_timeout).await
        && ack.is_written()
    {
        stats.status_ok.fetch_add(1, Ordering::Relaxed);
    }
}
