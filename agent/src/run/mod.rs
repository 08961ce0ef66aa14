//! The agent's loops: status (compute every `nodeStatusUpdateFrequency`, report on change or
//! every `nodeStatusReportFrequency`) and Lease (renew every duration × 0.25), both over one
//! [`Uplink`], each an `async fn` stopped by a [`CancellationToken`]. Beside them, in
//! [`Agent::run`]: the observe server (`healthzBindAddress`: `/healthz`, `/readyz` = registered
//! with the gateway and the Node not deleted, `/metrics` from [`crate::metrics`]) and systemd
//! notifications ([`crate::systemd`]).
//!
//! A deleted Node stays deleted: once the gateway says so (`Ack.node_not_found`), the
//! transport and both loops stop for the rest of the process, as kubelet registers once per
//! process; see [`NodeRegistration`].

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use edgebeat_hw::{CgroupMode, Clock, HostFacts, HostRoot, ReadOptions, read_host_facts};
use edgebeat_proto::{self as pb, agent_message::Kind};
use edgebeat_transports::uplink::{NodeRegistration, RegisterFn, Uplink, UplinkDriver};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{
    AgentConfig, CONTAINER_RUNTIME_LABEL, DEFAULT_LABEL_KEYS, NodeName, TransportConfig,
    parse_node_name,
};
use crate::header::HeaderFactory;
use crate::metrics::AgentMetrics;
use crate::status::{ComputedStatus, Journal, compute};
use crate::systemd::{self, Liveness, Systemd};

mod loops;

/// What the agent says (log, `/readyz`) once its Node was found deleted.
const NODE_NOT_FOUND: &str = "the Node was deleted (kubectl delete node?) after this agent registered it; the agent sends nothing more and registers the Node again only when restarted";

/// Jitter factor of both loops (kubelet `wait.JitterUntil(..., 0.04, sliding)`).
pub const JITTER: f64 = 0.04;

/// Attempts per tick for a status report (kubelet `nodeStatusUpdateRetry`) and a lease
/// renewal (`maxUpdateRetries`).
pub const ATTEMPTS_PER_TICK: u32 = 5;

pub use crate::error::AgentError;

/// Everything the loops share.
pub struct Agent {
    config: AgentConfig,
    root: HostRoot,
    options: ReadOptions,
    clock: Arc<dyn Clock>,
    headers: HeaderFactory,
    labels: BTreeMap<String, String>,
    /// `Register.cgroup_version`: the hierarchy at start, as kubelet checks it once.
    cgroup_version: u32,
    latest: Mutex<ComputedStatus>,
    /// Condition transitions not yet written (carried by Register and full reports).
    journal: Mutex<Journal>,
    metrics: AgentMetrics,
    registry: Arc<Registry>,
    liveness: Liveness,
    observe_addr: std::sync::OnceLock<std::net::SocketAddr>,
}

/// Reads host facts under `config.hostRoot` once (blocking file reads).
///
/// Errors: [`AgentError::Facts`] when a required fact is missing.
pub fn read_facts(config: &AgentConfig) -> Result<HostFacts, AgentError> {
    Ok(read_host_facts(
        &HostRoot::new(&config.host_root),
        &read_options(config),
    )?)
}

/// The cgroup version kubelet's container manager sees (`Register.cgroup_version`): 1 on
/// legacy and hybrid hierarchies (runc `IsCgroup2UnifiedMode` is false there), 2 on the
/// unified one, 0 when unknown.
pub fn cgroup_version(mode: CgroupMode) -> u32 {
    match mode {
        CgroupMode::V1 | CgroupMode::Hybrid => 1,
        CgroupMode::V2 => 2,
        CgroupMode::Unknown => 0,
    }
}

fn read_options(config: &AgentConfig) -> ReadOptions {
    ReadOptions {
        root_dir: config.root_dir.clone(),
        image_fs_dir: config.image_fs_dir.clone(),
    }
}

/// Logs, once at start, each enabled health condition the host gives no signal for (so it
/// is not reported): PSI without `CONFIG_PSI` or with `psi=0`, no thermal zones, an
/// unreadable mount table. Not `UnderVoltage`, whose signal only Raspberry Pi class boards
/// have (its absence elsewhere is normal), nor the clock (`adjtimex` does not fail).
fn say_missing_signals(config: &AgentConfig, facts: &HostFacts) {
    let h = &config.health;
    let full = |r: Option<&edgebeat_hw::PsiResource>| r.and_then(|r| r.full).is_some();
    let psi = facts.psi.as_ref();
    if h.system_memory_contention_threshold > 0.0 && !full(psi.and_then(|p| p.memory.as_ref())) {
        tracing::info!(
            "no memory PSI (/proc/pressure/memory: kernel without CONFIG_PSI, or booted with psi=0): SystemMemoryContentionPressure is not reported"
        );
    }
    if h.system_disk_contention_threshold > 0.0 && !full(psi.and_then(|p| p.io.as_ref())) {
        tracing::info!(
            "no io PSI (/proc/pressure/io: kernel without CONFIG_PSI, or booted with psi=0): SystemDiskContentionPressure is not reported"
        );
    }
    if h.readonly_filesystem && facts.nodefs_mount.is_none() {
        tracing::info!(
            "the host's mount table (/proc/1/mountinfo, /proc/self/mountinfo) is unreadable: ReadonlyFilesystem is not reported"
        );
    }
    if h.thermal && facts.thermal_zones.is_empty() && facts.cooling_devices.is_empty() {
        tracing::info!("no thermal zones or cooling devices: ThermalPressure is not reported");
    }
}

/// The node name: `nodeName`, else the lower-cased hostname (kubelet `--hostname-override`
/// semantics).
///
/// Errors: [`AgentError::NodeName`] when neither yields a valid name.
pub fn node_name(config: &AgentConfig, facts: &HostFacts) -> Result<NodeName, AgentError> {
    if let Some(name) = &config.node_name {
        return Ok(name.clone());
    }
    let hostname = facts
        .hostname
        .as_deref()
        .ok_or_else(|| AgentError::NodeName("no hostname found".into()))?;
    parse_node_name(&hostname.to_lowercase()).map_err(|e| AgentError::NodeName(e.to_string()))
}

/// kubelet's default node labels (`initialNode`) plus `nodeLabels`, which override, plus
/// [`CONTAINER_RUNTIME_LABEL`], which nothing overrides.
///
/// `kubernetes.io/hostname` is the node name: kubelet labels its hostname, which
/// `--hostname-override` (edgebeat's `nodeName`) replaces, and without it the node name is
/// the lower-cased OS hostname (`cmd/kubelet/app/server.go`, `nodeutil.GetHostname`;
/// `pkg/kubelet/kubelet_node_status.go: initialNode`). So boards left with one default
/// hostname (`raspberrypi`) do not share one label value.
pub fn node_labels(
    config: &AgentConfig,
    facts: &HostFacts,
    node_name: &str,
) -> BTreeMap<String, String> {
    let os = facts.operating_system;
    let arch = facts.architecture;
    // DEFAULT_LABEL_KEYS' order; the last, the container runtime label, goes on last.
    let values = [node_name, os, arch, os, arch];
    let mut labels: BTreeMap<String, String> = DEFAULT_LABEL_KEYS
        .iter()
        .zip(values)
        .map(|(k, v)| ((*k).to_owned(), v.to_owned()))
        .collect();
    labels.extend(config.node_labels.clone());
    labels.insert(
        CONTAINER_RUNTIME_LABEL.0.to_owned(),
        CONTAINER_RUNTIME_LABEL.1.to_owned(),
    );
    labels
}

impl Agent {
    /// Prepares an agent from `config`: reads facts once, settles the node name, computes a
    /// first status.
    ///
    /// Errors: [`AgentError::Facts`], [`AgentError::NodeName`].
    pub fn new(config: AgentConfig, clock: Arc<dyn Clock>) -> Result<Arc<Self>, AgentError> {
        let facts = read_facts(&config)?;
        let name = node_name(&config, &facts)?;
        let labels = node_labels(&config, &facts, &name);
        let first = compute(&facts, &config, None, clock.boottime());
        let transport = config
            .transport
            .as_ref()
            .map_or("none", TransportConfig::kind);
        let (metrics, registry) = AgentMetrics::new(&name, transport);
        metrics.observe_health(&facts, first.condition_states());
        say_missing_signals(&config, &facts);
        let liveness = Liveness::new(watchdog_bound(&config));
        Ok(Arc::new(Self {
            headers: HeaderFactory::new(name, &facts.boot_id, clock.clone()),
            root: HostRoot::new(&config.host_root),
            options: read_options(&config),
            config,
            clock,
            labels,
            cgroup_version: cgroup_version(facts.cgroup),
            latest: Mutex::new(first),
            journal: Mutex::new(Journal::default()),
            metrics,
            registry: Arc::new(registry),
            liveness,
            observe_addr: std::sync::OnceLock::new(),
        }))
    }

    /// The node name this agent speaks for.
    pub fn node_name(&self) -> &str {
        self.headers.node_name()
    }

    /// The address the observe server (`/healthz`, `/readyz`, `/metrics`) listens on, once
    /// [`Agent::run`] has bound `healthzBindAddress` (with port 0, the port the kernel
    /// chose); `None` before that or without `healthzBindAddress`.
    pub fn observe_addr(&self) -> Option<std::net::SocketAddr> {
        self.observe_addr.get().copied()
    }

    /// The registry `/metrics` serves (see [`crate::metrics`]).
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    fn latest(&self) -> ComputedStatus {
        loops::latest(&self.latest)
    }

    /// What sending over `uplink` uses (see [`loops::Sender`]).
    fn sender<'a>(&'a self, uplink: &'a Uplink) -> loops::Sender<'a> {
        loops::Sender {
            uplink,
            headers: &self.headers,
            metrics: &self.metrics,
        }
    }

    /// The status loop's inputs, sending over `uplink`.
    fn status_inputs<'a>(&'a self, uplink: &'a Uplink) -> loops::StatusLoop<'a> {
        loops::StatusLoop {
            config: &self.config,
            root: &self.root,
            options: &self.options,
            clock: self.clock.as_ref(),
            latest: &self.latest,
            journal: &self.journal,
            send: self.sender(uplink),
        }
    }

    /// The Lease loop's inputs, sending over `uplink`.
    fn lease_inputs<'a>(&'a self, uplink: &'a Uplink) -> loops::LeaseLoop<'a> {
        loops::LeaseLoop {
            lease_duration_seconds: self.config.node_lease_duration_seconds,
            root: &self.root,
            renew_interval: self.config.lease_renew_interval(),
            clock: self.clock.as_ref(),
            liveness: &self.liveness,
            send: self.sender(uplink),
        }
    }

    /// The `Register` message for a new connection: labels, registration taints, and the
    /// latest computed status (kubelet `initialNode`). `registration_completed`: this
    /// process registered before (see [`NodeRegistration`]), so the gateway must not create
    /// the Node again.
    pub fn register_message(&self, registration_completed: bool) -> pb::AgentMessage {
        let header = self.headers.next();
        let now = self.clock.boottime();
        let status = self.latest().to_proto(now);
        let journal = self.journal.lock().to_proto(now);
        pb::AgentMessage {
            kind: Some(Kind::Register(pb::Register {
                header: Some(header),
                labels: self.labels.clone().into_iter().collect(),
                taints: self
                    .config
                    .register_with_taints
                    .iter()
                    .map(|t| pb::Taint {
                        key: t.key.clone(),
                        value: t.value.clone(),
                        effect: t.effect.as_str().to_owned(),
                    })
                    .collect(),
                unschedulable: !self.config.register_schedulable,
                skip_create: !self.config.register_node,
                registration_completed,
                status: Some(status),
                uptime_ms: u64::try_from(now.as_millis()).unwrap_or(u64::MAX),
                journal,
                cgroup_version: self.cgroup_version,
            })),
        }
    }

    /// Runs the configured transport and both loops until `cancel` fires, with the observe
    /// server when `healthzBindAddress` is set and systemd notifications under systemd.
    ///
    /// Errors: [`AgentError::NoTransport`] or the uplink's error (`AgentError::Grpc`,
    /// `AgentError::Mqtt`) at start, and
    /// [`AgentError::Healthz`] when `healthzBindAddress` cannot be bound (fail fast: a
    /// misconfigured probe port is found at deploy time, not by a prober later).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) -> Result<(), AgentError> {
        let observe_listener = match self.config.healthz_bind_address {
            Some(addr) => Some(self.bind_observe(addr).await?),
            None => None,
        };
        let transport = self
            .config
            .transport
            .clone()
            .ok_or(AgentError::NoTransport)?;
        let (uplink, mut driver) = edgebeat_transports::uplink::channel(8);
        // The transport and the two loops: stopped at shutdown, or for good when the Node
        // is found deleted (the observe server and systemd notifications go on).
        let sending = cancel.child_token();
        let me = self.clone();
        let registration = uplink.registration();
        let register: RegisterFn = Arc::new(move || {
            let completed = *registration.borrow() != NodeRegistration::Pending;
            let message = me.register_message(completed);
            me.metrics.message_sent(&message);
            message
        });
        tracing::info!(node = self.node_name(), "edgebeat agent starting");
        let managed = self.config.certificates.as_ref();
        if managed.is_none() && transport.tls().is_none_or(|t| t.client_identity.is_none()) {
            // The gateway's default posture refuses messages without a node identity.
            tracing::warn!(
                node = self.node_name(),
                "no node certificate (transport.certFile, transport.keyFile): this agent's messages carry no identity, and only a gateway run with --allow-unidentified-agents accepts them"
            );
        }
        let notify = async {
            let Some(systemd) = Systemd::from_env() else {
                return;
            };
            let registered = uplink.registered();
            let period = systemd.watchdog_period;
            systemd::notify(Systemd::send, period, registered, &self.liveness, &cancel).await;
        };
        let loops = async {
            tokio::join!(
                loops::count_registrations(&self.metrics, uplink.registered(), &cancel),
                self.serve_observe(observe_listener, &uplink, &cancel),
                notify,
                loops::status_loop(self.status_inputs(&uplink), sending.clone()),
                loops::lease_loop(self.lease_inputs(&uplink), sending.clone()),
                self.stop_when_node_not_found(uplink.registration(), &sending, &cancel),
            )
        };
        let transport = async {
            let result = self
                .run_transport(&transport, register, &uplink, &mut driver, &sending)
                .await;
            // No transport runs again in this process: what the loops still send (the retry
            // of a message the last connection failed) is answered at once, not left queued
            // until its timeout (a Lease renewal's is the renew interval, 10 s by default).
            driver.close();
            // The transport returns at shutdown, when the Node was found deleted (then the
            // agent stays up, unready, until shutdown), or on a fatal error: stop the rest.
            if result.is_err() || !sending.is_cancelled() {
                cancel.cancel();
            }
            result
        };
        let (result, _) = tokio::join!(transport, loops);
        result
    }

    /// Runs `transport` until `sending` is cancelled: through the certificate manager when
    /// the agent enrolls for and rotates its certificate (`bootstrapTokenFile`), else as
    /// configured.
    ///
    /// Errors: [`AgentError::Certificates`] when `certDir` cannot be opened, and the
    /// transport's or the certificate manager's own.
    #[cfg_attr(
        not(any(feature = "grpc-tls", feature = "mqtt-tls")),
        allow(unused_variables)
    )]
    async fn run_transport(
        &self,
        transport: &TransportConfig,
        register: RegisterFn,
        uplink: &Uplink,
        driver: &mut UplinkDriver,
        sending: &CancellationToken,
    ) -> Result<(), AgentError> {
        #[cfg(feature = "mqtt-tls")]
        let transport = &{
            let mut transport = transport.clone();
            #[allow(irrefutable_let_patterns)] // an MQTT-only build has no other transport
            if let TransportConfig::Mqtt(options) = &mut transport {
                options.count_answer_refusals(self.metrics.answers_refused());
            }
            transport
        };
        match self.config.certificates.as_ref() {
            #[cfg(any(feature = "grpc-tls", feature = "mqtt-tls"))]
            Some(managed) => {
                let store =
                    crate::certificates::CertStore::open(&managed.cert_dir).map_err(|e| {
                        AgentError::Certificates(format!(
                            "certDir {}: {e}",
                            managed.cert_dir.display()
                        ))
                    })?;
                let manager = crate::certificates::Manager {
                    managed,
                    transport,
                    headers: &self.headers,
                    clock: self.clock.as_ref(),
                    metrics: &self.metrics,
                    store,
                };
                let node = self.node_name();
                crate::certificates::run(manager, node, register, uplink, driver, sending.clone())
                    .await
            }
            _ => {
                transport
                    .clone()
                    .run(self.node_name(), register, driver, sending.clone())
                    .await
            }
        }
    }

    /// Binds `healthzBindAddress` (`addr`) and records the address bound
    /// ([`Agent::observe_addr`]).
    ///
    /// Errors: [`AgentError::Healthz`] when it cannot be bound.
    async fn bind_observe(
        &self,
        addr: std::net::SocketAddr,
    ) -> Result<tokio::net::TcpListener, AgentError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| AgentError::Healthz { addr, source })?;
        if let Ok(bound) = listener.local_addr() {
            let _ = self.observe_addr.set(bound);
        }
        Ok(listener)
    }

    /// Serves `/healthz`, `/readyz` (registered with the gateway, and the Node not found
    /// deleted) and `/metrics` on `listener`, when there is one, until `cancel` fires.
    async fn serve_observe(
        &self,
        listener: Option<tokio::net::TcpListener>,
        uplink: &Uplink,
        cancel: &CancellationToken,
    ) {
        let Some(listener) = listener else {
            return;
        };
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
        }
        let registered = uplink.registered();
        let registration = uplink.registration();
        let ready = move || {
            if *registration.borrow() == NodeRegistration::NodeNotFound {
                Err(NODE_NOT_FOUND.to_owned())
            } else if *registered.borrow() {
                Ok(())
            } else {
                Err("not registered with the gateway (connecting or registering)".to_owned())
            }
        };
        let shutdown = cancel.clone().cancelled_owned();
        if let Err(error) =
            edgebeat_transports::observe::serve(listener, self.registry(), ready, shutdown).await
        {
            tracing::warn!(%error, "observe server stopped");
        }
    }

    /// Waits until the gateway says this agent's Node was deleted
    /// ([`NodeRegistration::NodeNotFound`]); then stops `sending` (the transport and both
    /// loops: kubelet registers once per process, `registrationCompleted` in
    /// `pkg/kubelet/kubelet_node_status.go`, so a deleted Node stays deleted), sets
    /// `edgebeat_agent_node_not_found` and logs at error level every
    /// `nodeStatusUpdateFrequency` (kubelet's cadence for its failing status updates) until
    /// `cancel` fires. `/readyz` turns false meanwhile; the systemd watchdog keeps being
    /// fed (the agent is not stuck, and a restart would register the Node again).
    async fn stop_when_node_not_found(
        &self,
        mut registration: watch::Receiver<NodeRegistration>,
        sending: &CancellationToken,
        cancel: &CancellationToken,
    ) {
        while *registration.borrow_and_update() != NodeRegistration::NodeNotFound {
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = registration.changed() => if changed.is_err() { return },
            }
        }
        sending.cancel();
        self.liveness.waiting(true);
        self.metrics.node_not_found();
        loop {
            tracing::error!(node = self.node_name(), "{NODE_NOT_FOUND}");
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.config.node_status_update_frequency) => {}
            }
        }
    }
}

impl TransportConfig {
    /// Runs this transport's uplink for node `node` until `cancel` fires (see
    /// `edgebeat_transports::grpc::run_uplink` and `edgebeat_transports::mqtt::run_uplink`),
    /// sending `register()` first on every connection and the requests `driver` receives.
    ///
    /// Errors: the uplink's, at start (`AgentError::Grpc`, `AgentError::Mqtt`).
    #[cfg_attr(not(feature = "mqtt"), allow(unused_variables))]
    pub(crate) async fn run(
        self,
        node: &str,
        register: RegisterFn,
        driver: &mut UplinkDriver,
        cancel: CancellationToken,
    ) -> Result<(), AgentError> {
        match self {
            #[cfg(feature = "grpc")]
            Self::Grpc(options) => {
                edgebeat_transports::grpc::run_uplink(options, register, driver, cancel)
                    .await
                    .map_err(AgentError::Grpc)
            }
            #[cfg(feature = "mqtt")]
            Self::Mqtt(options) => edgebeat_transports::mqtt::run_uplink(
                options,
                node.to_owned(),
                register,
                driver,
                cancel,
            )
            .await
            .map_err(AgentError::Mqtt),
        }
    }
}

/// Time allowed for one answer: min(`nodeStatusUpdateFrequency`, lease duration), as
/// kubelet's heartbeat client timeout (10 s by default).
fn ack_timeout(config: &AgentConfig) -> Duration {
    config
        .node_status_update_frequency
        .min(Duration::from_secs(u64::from(
            config.node_lease_duration_seconds,
        )))
}

/// Longest time a Lease loop that is not stuck goes without finishing a tick: the longest
/// pause between ticks (the jittered renew interval, or 14 s of failure backoff: 7 s plus
/// its jitter) plus a tick whose every attempt waits its longest (the answer timeout, or a
/// quiet renewal's silence of one jittered renew interval). 66 s with the defaults.
pub fn watchdog_bound(config: &AgentConfig) -> Duration {
    let interval = config.lease_renew_interval().mul_f64(1.0 + JITTER);
    let pause = interval.max(Duration::from_secs(14));
    pause + ack_timeout(config).max(interval) * ATTEMPTS_PER_TICK
}

/// `period` plus up to `JITTER` × period of random extra (kubelet `wait.Jitter`).
pub fn jittered(period: Duration) -> Duration {
    period.saturating_add(period.mul_f64(JITTER * fastrand::f64()))
}

#[cfg(test)]
#[cfg(feature = "grpc")]
mod tests;
