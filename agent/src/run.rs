//! The agent's loops: status (compute every `nodeStatusUpdateFrequency`, report on change or
//! every `nodeStatusReportFrequency`) and Lease (renew every duration × 0.25), both over one
//! [`Uplink`], each an `async fn` stopped by a [`CancellationToken`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgebeat_hw::{Clock, HostFacts, HostRoot, ReadOptions, read_host_facts};
use edgebeat_proto::{self as pb, AckCode, agent_message::Kind};
use edgebeat_transports::uplink::{Uplink, UplinkError, reconnect_backoff};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{AgentConfig, TransportConfig, validate_node_name};
use crate::header::HeaderFactory;
use crate::status::{ComputedStatus, compute, has_changed};

/// Jitter factor of both loops (kubelet `wait.JitterUntil(..., 0.04, sliding)`).
pub const JITTER: f64 = 0.04;

/// Attempts per tick for a status report (kubelet `nodeStatusUpdateRetry`) and a lease
/// renewal (`maxUpdateRetries`).
pub const ATTEMPTS_PER_TICK: u32 = 5;

type TransportTask =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), AgentError>> + Send>>;

/// Why the agent could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Required host facts are unreadable (boot ID, MemTotal, CPU count).
    #[error("reading host facts: {0}")]
    Facts(#[from] edgebeat_hw::HwError),
    /// No node name configured and the hostname is unusable.
    #[error("node name: {0}; set nodeName in the configuration")]
    NodeName(String),
    /// `transport` is missing (required unless `--once`).
    #[error(
        "transport: required to run; add e.g. `transport: {{kind: grpc, endpoint: \"http://gateway:7443\"}}`"
    )]
    NoTransport,
    /// The transport could not start (bad endpoint).
    #[error("transport: {0}")]
    Transport(String),
}

/// Everything the loops share.
pub struct Agent {
    config: AgentConfig,
    root: HostRoot,
    options: ReadOptions,
    clock: Arc<dyn Clock>,
    headers: HeaderFactory,
    labels: BTreeMap<String, String>,
    latest: Mutex<ComputedStatus>,
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

fn read_options(config: &AgentConfig) -> ReadOptions {
    ReadOptions {
        root_dir: config.root_dir.clone(),
        image_fs_dir: config.image_fs_dir.clone(),
    }
}

/// The node name: `nodeName`, else the lower-cased hostname (kubelet `--hostname-override`
/// semantics).
///
/// Errors: [`AgentError::NodeName`] when neither yields a valid name.
pub fn node_name(config: &AgentConfig, facts: &HostFacts) -> Result<String, AgentError> {
    let name = config
        .node_name
        .clone()
        .or_else(|| facts.hostname.as_deref().map(str::to_lowercase))
        .ok_or_else(|| AgentError::NodeName("no hostname found".into()))?;
    validate_node_name(&name).map_err(AgentError::NodeName)?;
    Ok(name)
}

/// kubelet's default node labels (`initialNode`) plus `nodeLabels`, which override.
pub fn node_labels(
    config: &AgentConfig,
    facts: &HostFacts,
    node_name: &str,
) -> BTreeMap<String, String> {
    let hostname = facts
        .hostname
        .as_deref()
        .map_or_else(|| node_name.to_owned(), str::to_lowercase);
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), hostname),
        (
            "kubernetes.io/os".to_owned(),
            facts.operating_system.to_owned(),
        ),
        (
            "kubernetes.io/arch".to_owned(),
            facts.architecture.to_owned(),
        ),
        (
            "beta.kubernetes.io/os".to_owned(),
            facts.operating_system.to_owned(),
        ),
        (
            "beta.kubernetes.io/arch".to_owned(),
            facts.architecture.to_owned(),
        ),
    ]);
    labels.extend(config.node_labels.clone());
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
        Ok(Arc::new(Self {
            headers: HeaderFactory::new(name, &facts.boot_id, clock.clone()),
            root: HostRoot::new(&config.host_root),
            options: read_options(&config),
            config,
            clock,
            labels,
            latest: Mutex::new(first),
        }))
    }

    /// The node name this agent speaks for.
    pub fn node_name(&self) -> &str {
        self.headers.node_name()
    }

    fn latest(&self) -> ComputedStatus {
        match self.latest.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The `Register` message for a new connection: labels, registration taints, and the
    /// latest computed status (kubelet `initialNode`).
    pub fn register_message(&self) -> pb::AgentMessage {
        let header = self.headers.next();
        let status = self.latest().to_proto(self.clock.boottime());
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
                        effect: t.effect.clone(),
                    })
                    .collect(),
                unschedulable: !self.config.register_schedulable,
                skip_create: !self.config.register_node,
                status: Some(status),
            })),
        }
    }

    /// Time allowed for one answer: min(`nodeStatusUpdateFrequency`, lease duration), as
    /// kubelet's heartbeat client timeout (10 s by default).
    fn ack_timeout(&self) -> Duration {
        self.config
            .node_status_update_frequency
            .min(Duration::from_secs(u64::from(
                self.config.node_lease_duration_seconds,
            )))
    }

    /// Runs the configured transport and both loops until `cancel` fires.
    ///
    /// Errors: [`AgentError::NoTransport`] or [`AgentError::Transport`] at start.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) -> Result<(), AgentError> {
        let (uplink, driver) = edgebeat_transports::uplink::channel(8);
        let me = self.clone();
        let register: edgebeat_transports::uplink::RegisterFn =
            Arc::new(move || me.register_message());
        let transport = match self.config.transport.clone() {
            None => return Err(AgentError::NoTransport),
            #[cfg(feature = "grpc")]
            Some(TransportConfig::Grpc {
                endpoint,
                keepalive,
            }) => {
                let mut options = edgebeat_transports::grpc::GrpcUplinkOptions::new(endpoint);
                options.keepalive = keepalive;
                let cancel = cancel.clone();
                Box::pin(async move {
                    edgebeat_transports::grpc::run_uplink(options, register, driver, cancel)
                        .await
                        .map_err(|e| AgentError::Transport(e.to_string()))
                }) as TransportTask
            }
            #[cfg(not(feature = "grpc"))]
            Some(TransportConfig::Grpc { .. }) => {
                drop((register, driver));
                return Err(AgentError::Transport(
                    "this build has no gRPC support (feature grpc)".into(),
                ));
            }
            #[cfg(feature = "mqtt")]
            Some(TransportConfig::Mqtt(m)) => {
                use edgebeat_transports::mqtt::{MqttUplinkOptions, run_uplink};
                let name = self.node_name().to_owned();
                let mut options = MqttUplinkOptions::new(m.host, m.port, &name);
                if let Some(id) = m.client_id {
                    options.client_id = id;
                }
                options.credentials = m.credentials;
                options.topic_prefix = m.topic_prefix;
                options.keepalive = m.keepalive;
                // Message Expiry Interval: no longer than the renew interval (whole seconds,
                // at least 1), so a broker never hands a gateway a backlog of stale renewals.
                options.lease_expiry =
                    Duration::from_secs(self.config.lease_renew_interval().as_secs().max(1));
                let cancel = cancel.clone();
                Box::pin(async move {
                    run_uplink(options, name, register, driver, cancel)
                        .await
                        .map_err(|e| AgentError::Transport(e.to_string()))
                }) as TransportTask
            }
            #[cfg(not(feature = "mqtt"))]
            Some(TransportConfig::Mqtt(_)) => {
                drop((register, driver));
                return Err(AgentError::Transport(
                    "this build has no MQTT support (feature mqtt)".into(),
                ));
            }
        };
        tracing::info!(node = self.node_name(), "edgebeat agent starting");
        let loops = async {
            tokio::join!(
                self.clone().status_loop(uplink.clone(), cancel.clone()),
                self.clone().lease_loop(uplink, cancel.clone()),
            )
        };
        tokio::select! {
            // The transport only returns at shutdown or on a fatal error: stop the loops too.
            result = transport => {
                cancel.cancel();
                result
            }
            _ = loops => Ok(()),
        }
    }

    /// Status loop (kubelet `syncNodeStatus` every `nodeStatusUpdateFrequency`): compute,
    /// then report when registered and (never reported | changed | report period elapsed |
    /// the gateway asked). Up to [`ATTEMPTS_PER_TICK`] attempts per report.
    pub async fn status_loop(self: Arc<Self>, uplink: Uplink, cancel: CancellationToken) {
        let mut registered = uplink.registered();
        let mut last_reported: Option<ComputedStatus> = None;
        let mut last_report_at: Option<Instant> = None;
        let mut requests = uplink.status_requests();
        let mut served_request = *requests.borrow_and_update();
        let mut watch_registration = true;
        let mut watch_requests = true;
        loop {
            let root = self.root.clone();
            let options = self.options.clone();
            match tokio::task::spawn_blocking(move || read_host_facts(&root, &options)).await {
                Ok(Ok(facts)) => {
                    let previous = self.latest();
                    let next =
                        compute(&facts, &self.config, Some(&previous), self.clock.boottime());
                    match self.latest.lock() {
                        Ok(mut g) => *g = next,
                        Err(poisoned) => *poisoned.into_inner() = next,
                    }
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "reading host facts failed; keeping the last status")
                }
                Err(error) => tracing::warn!(%error, "host facts task failed"),
            }
            if *registered.borrow() {
                let latest = self.latest();
                let request = *requests.borrow_and_update();
                let due = request != served_request
                    || last_reported
                        .as_ref()
                        .is_none_or(|l| has_changed(l, &latest))
                    || last_report_at
                        .is_none_or(|t| t.elapsed() >= self.config.node_status_report_frequency);
                if due && self.report(&uplink, &latest).await {
                    last_reported = Some(latest);
                    last_report_at = Some(Instant::now());
                    served_request = request;
                }
            }
            let delay = jittered(self.config.node_status_update_frequency);
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
                changed = requests.changed(), if watch_requests => {
                    if changed.is_err() { watch_requests = false; }
                }
                changed = registered.changed(), if watch_registration => {
                    if changed.is_err() { watch_registration = false; }
                }
            }
        }
    }

    async fn report(&self, uplink: &Uplink, status: &ComputedStatus) -> bool {
        for attempt in 0..ATTEMPTS_PER_TICK {
            let message = pb::AgentMessage {
                kind: Some(Kind::Status(pb::StatusReport {
                    header: Some(self.headers.next()),
                    status: Some(status.to_proto(self.clock.boottime())),
                })),
            };
            match outcome(uplink.send(message, self.ack_timeout()).await) {
                Outcome::Ok => return true,
                Outcome::Retry(why) => {
                    tracing::debug!(attempt, %why, "status report not written; retrying")
                }
                Outcome::GiveUp(why) => {
                    tracing::warn!(%why, "status report failed");
                    return false;
                }
            }
        }
        tracing::warn!("update node status exceeds retry count");
        false
    }

    /// Lease loop (kubelet's lease controller): once registered, renew every
    /// `nodeLeaseDurationSeconds` × 0.25 with jitter 0.04; up to [`ATTEMPTS_PER_TICK`]
    /// attempts per tick; after a failed tick retry with backoff from 200 ms doubling to 7 s.
    pub async fn lease_loop(self: Arc<Self>, uplink: Uplink, cancel: CancellationToken) {
        let mut registered = uplink.registered();
        let mut backoff = None;
        let mut lease_state = Vec::new();
        loop {
            // Lease only after the Node exists (its ownerReference needs the Node).
            while !*registered.borrow_and_update() {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    changed = registered.changed() => if changed.is_err() { return },
                }
            }
            let delay = if self.renew(&uplink, &mut lease_state).await {
                backoff = None;
                jittered(self.config.lease_renew_interval())
            } else {
                backoff
                    .get_or_insert_with(|| {
                        reconnect_backoff(Duration::from_millis(200), Duration::from_secs(7))
                    })
                    .next()
                    .unwrap_or(Duration::from_secs(7))
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// One renewal tick. `lease_state` is the gateway's opaque Lease state from the last
    /// successful renewal, echoed so any gateway replica can PUT without a GET.
    async fn renew(&self, uplink: &Uplink, lease_state: &mut Vec<u8>) -> bool {
        for attempt in 0..ATTEMPTS_PER_TICK {
            let message = pb::AgentMessage {
                kind: Some(Kind::Lease(pb::LeaseRenewal {
                    header: Some(self.headers.next()),
                    lease_duration_seconds: i32::try_from(self.config.node_lease_duration_seconds)
                        .unwrap_or(i32::MAX),
                    lease_state: lease_state.clone(),
                })),
            };
            let answer = uplink.send(message, self.ack_timeout()).await;
            if let Ok(ack) = &answer {
                if !ack.lease_state.is_empty() {
                    lease_state.clone_from(&ack.lease_state);
                } else if ack.register_again {
                    lease_state.clear();
                }
            }
            match outcome(answer) {
                Outcome::Ok => return true,
                Outcome::Retry(why) => {
                    tracing::debug!(attempt, %why, "lease renewal not written; retrying")
                }
                Outcome::GiveUp(why) => {
                    tracing::warn!(%why, "lease renewal failed");
                    return false;
                }
            }
        }
        tracing::warn!("failed {ATTEMPTS_PER_TICK} attempts to update lease");
        false
    }
}

enum Outcome {
    Ok,
    Retry(String),
    GiveUp(String),
}

fn outcome(result: Result<pb::Ack, UplinkError>) -> Outcome {
    match result {
        // The transport registers again first; retrying now would only ask again.
        Ok(ack) if ack.register_again => {
            Outcome::GiveUp("the gateway asked to register again".into())
        }
        Ok(ack) => match AckCode::try_from(ack.code) {
            Ok(AckCode::Ok) => Outcome::Ok,
            Ok(AckCode::Retry) => Outcome::Retry(ack.reason),
            _ => Outcome::GiveUp(format!("rejected by the gateway: {}", ack.reason)),
        },
        // Timeouts and lost connections are retried within the tick (kubelet retries
        // immediately); with no connection at all there is nothing to retry on.
        Err(e @ (UplinkError::Timeout(_) | UplinkError::Disconnected)) => {
            Outcome::Retry(e.to_string())
        }
        Err(e) => Outcome::GiveUp(e.to_string()),
    }
}

/// `period` plus up to `JITTER` × period of random extra (kubelet `wait.Jitter`).
pub fn jittered(period: Duration) -> Duration {
    period.saturating_add(period.mul_f64(JITTER * fastrand::f64()))
}
