//! The agent's configuration file: YAML with `apiVersion`/`kind` and KubeletConfiguration
//! field names, parsed once at load into typed values.
//!
//! ```yaml
//! apiVersion: edgebeat.io/v1alpha1
//! kind: AgentConfiguration
//! nodeName: edge-01
//! nodeStatusUpdateFrequency: 10s
//! nodeLeaseDurationSeconds: 40
//! evictionHard: {memory.available: 100Mi, nodefs.available: 10%}
//! transport: {kind: grpc, endpoint: "http://gateway.example:7443"}
//! healthzBindAddress: 127.0.0.1:10248
//! ```
//!
//! gRPC over TLS with a kubelet-style node certificate (CN=`system:node:<nodeName>`,
//! O=`system:nodes`), KubeletConfiguration-like file names; the files are read at load:
//!
//! ```yaml
//! transport:
//!   kind: grpc
//!   endpoint: "https://gateway.example:7443"
//!   caFile: /etc/edgebeat/pki/ca.crt        # verifies the gateway (server name = URL host)
//!   certFile: /etc/edgebeat/pki/node.crt    # with keyFile: mTLS client certificate
//!   keyFile: /etc/edgebeat/pki/node.key
//! ```
//!
//! MQTT over TLS takes the same three fields with an `mqtts://` endpoint (default port
//! 8883): `caFile` verifies the broker, `certFile`/`keyFile` are presented to it, and every
//! message is then also signed end to end with `keyFile` (ECDSA P-256 or Ed25519), because
//! the broker is a third party; the gateway verifies the signature against the site CA.
//!
//! A clustered broker takes its nodes as `endpoints` instead of `endpoint`; after a lost
//! connection the agent tries the next one (all `mqtt://` or all `mqtts://`):
//!
//! ```yaml
//! transport:
//!   kind: mqtt
//!   endpoints: ["mqtt://broker-0.plant:1883", "mqtt://broker-1.plant:1883"]
//! ```
//!
//! Unknown fields are rejected. A file with several mistakes gets one error that lists
//! every invalid field (unknown ones and values of the wrong type included), each naming
//! the field and how to fix it. Defaults are kubelet's
//! (`pkg/kubelet/apis/config/v1beta1/defaults.go`), except `maxPods` (0: an edgebeat node
//! runs no pods).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use edgebeat_proto::registration;
use serde::Deserialize;

use crate::health::{self, HealthSettings};
use crate::quantity::{Amount, parse_amount, parse_millicores};

pub use edgebeat_proto::registration::{CONTAINER_RUNTIME_LABEL, DEFAULT_LABEL_KEYS};

/// Default `transport.keepalive` for gRPC (5 min; see [`TransportConfig::Grpc`]).
pub const GRPC_KEEPALIVE: Duration = Duration::from_secs(300);

/// Default `transport.keepalive` for MQTT: 30 min, the one the MQTT uplink defaults to too
/// (see [`MqttTransport::keepalive`] and the constant's own docs for why).
pub use edgebeat_transports::endpoint::MQTT_AGENT_KEEPALIVE as MQTT_KEEPALIVE;

/// `apiVersion` the agent accepts.
pub const API_VERSION: &str = "edgebeat.io/v1alpha1";
/// `kind` the agent accepts.
pub const KIND: &str = "AgentConfiguration";

/// Largest configuration file [`AgentConfig::load`] reads, bytes (1 MiB): a real one is a
/// few hundred bytes; a wrong path such as `/dev/zero` fails at once instead of hanging.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1024 * 1024;
/// Largest `transport.passwordFile`, bytes (4 KiB), shared with the gateway's
/// `--mqtt-password-file`.
pub use edgebeat_hw::MAX_PASSWORD_FILE_BYTES;
/// Largest `transport.caFile`, `certFile` or `keyFile`, bytes (1 MiB), shared with the
/// gateway's TLS files (the whole Mozilla root store is about 220 KiB of PEM).
pub use edgebeat_hw::MAX_PEM_FILE_BYTES;

/// A configuration error: which field, what is wrong, and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read: missing, unreadable, a directory, or larger than
    /// [`MAX_CONFIG_FILE_BYTES`], e.g. `agent configuration: /dev/zero: larger than 1048576
    /// bytes; point it at a regular file of at most 1048576 bytes`.
    #[error("agent configuration: {source}")]
    Read {
        /// The config file path.
        path: PathBuf,
        /// What went wrong, naming the path.
        source: edgebeat_hw::BoundedReadError,
    },
    /// The YAML is malformed or has an unknown field or a value of the wrong type.
    #[error("parsing the agent configuration: {0}")]
    Syntax(String),
    /// Fields have values the agent cannot use: every one of them, in file order, each
    /// naming the field and the fix. Shown as `field: message` for one, and as a count
    /// followed by one `- field: message` line each for several.
    #[error("{}", InvalidFields(.0))]
    Invalid(Vec<FieldError>),
}

/// One invalid field of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path, e.g. `transport.endpoint` or `evictionHard["memory.available"]`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

struct InvalidFields<'a>(&'a [FieldError]);

impl std::fmt::Display for InvalidFields<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            [one] => write!(f, "{one}"),
            all => {
                write!(
                    f,
                    "{} invalid fields in the agent configuration:",
                    all.len()
                )?;
                for e in all {
                    write!(f, "\n- {e}")?;
                }
                Ok(())
            }
        }
    }
}

/// `got "x"` for a value given, `missing` for none.
fn got(value: Option<&str>) -> String {
    value.map_or_else(|| "missing".to_owned(), |v| format!("got {v:?}"))
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(vec![FieldError {
        field: field.into(),
        message: message.into(),
    }])
}

/// serde's message for one field deserialized alone, without the position and snippet
/// (of the one-field document, not of the file): `error: line 1 column 12: invalid i64`
/// and what follows become `invalid i64`.
fn field_message(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message);
    let first = first.strip_prefix("error: ").unwrap_or(first);
    match first.split_once(": ") {
        Some((position, rest)) if position.starts_with("line ") => rest.to_owned(),
        _ => first.to_owned(),
    }
}

/// The invalid fields found so far while validating, so that one error reports them all.
#[derive(Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    /// The value of `result`, or `None` with its problems recorded.
    fn take<T>(&mut self, result: Result<T, ConfigError>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(ConfigError::Invalid(fields)) => {
                self.0.extend(fields);
                None
            }
            // Not raised by validation helpers (they return `Invalid`); kept whole if one is.
            Err(other) => {
                self.push("agent configuration", other.to_string());
                None
            }
        }
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// `value` when nothing was found, otherwise [`ConfigError::Invalid`] with everything.
    fn into_result<T>(self, value: T) -> Result<T, ConfigError> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(ConfigError::Invalid(self.0))
        }
    }
}

/// An eviction signal kubelet knows, a key of `evictionHard`
/// (`pkg/kubelet/eviction/api/types.go`). The status computes pressure from
/// [`AgentConfig::eviction_hard`] by these values, so a misspelt signal is a compile error,
/// not a threshold that silently never applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EvictionSignal {
    /// `memory.available`: bytes of memory available (MemoryPressure).
    MemoryAvailable,
    /// `nodefs.available`: bytes free on the node's root filesystem (DiskPressure).
    NodeFsAvailable,
    /// `nodefs.inodesFree`: inodes free on it (DiskPressure).
    NodeFsInodesFree,
    /// `imagefs.available`: bytes free on the image filesystem, when separate (DiskPressure).
    ImageFsAvailable,
    /// `imagefs.inodesFree`: inodes free on it (DiskPressure).
    ImageFsInodesFree,
    /// `pid.available`: process IDs left below `pid_max` (PIDPressure).
    PidAvailable,
}

impl EvictionSignal {
    /// Every signal, in kubelet's order.
    pub const ALL: [Self; 6] = [
        Self::MemoryAvailable,
        Self::NodeFsAvailable,
        Self::NodeFsInodesFree,
        Self::ImageFsAvailable,
        Self::ImageFsInodesFree,
        Self::PidAvailable,
    ];

    /// kubelet's name, the `evictionHard` key: `memory.available`, `nodefs.available`…
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }
}

impl std::str::FromStr for EvictionSignal {
    type Err = String;

    /// Parses kubelet's name of a signal.
    ///
    /// Errors: a message listing the signals kubelet knows.
    fn from_str(name: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|s| s.as_str()).collect();
                format!("unknown signal; use one of {}", known.join(", "))
            })
    }
}

impl std::fmt::Display for EvictionSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A registration taint (core/v1 Taint), applied once when the Node is created.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Taint {
    /// Taint key, e.g. `example.com/edge`.
    pub key: String,
    /// Taint value (may be empty).
    #[serde(default)]
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// Which transport carries heartbeats, with its settings.
#[derive(Debug, Clone, PartialEq)]
pub enum TransportConfig {
    /// gRPC to the gateway (`transport.kind: grpc`).
    Grpc {
        /// `transport.endpoint`: gateway URL, `http://host:port`.
        endpoint: String,
        /// `transport.keepalive`: an HTTP/2 ping after this long without receiving anything
        /// (default 5 min). Renewals are answered only when not written, so a short
        /// interval would ping every period on a metered link; while renewals flow, a dead
        /// link is noticed by `TCP_USER_TIMEOUT` (20 s) instead.
        keepalive: Duration,
    },
    /// MQTT 5 through a broker (`transport.kind: mqtt`).
    Mqtt(MqttTransport),
}

/// TLS material of a transport on an `https://` (gRPC) or `mqtts://` (MQTT) endpoint, read and
/// checked at load (`transport.caFile`, `transport.certFile`, `transport.keyFile`): the
/// transports' own [`ClientTls`], which the agent hands them unchanged. Certificates are not
/// reloaded: after rotating the files, restart the agent.
pub use edgebeat_transports::tls::{ClientTls, TlsIdentity};

/// MQTT settings (`transport.kind: mqtt`).
#[derive(Debug, Clone, PartialEq)]
pub struct MqttTransport {
    /// Broker host, from `transport.endpoint` (`mqtt://host:port`, port default 1883), or
    /// the first of `transport.endpoints`.
    pub host: String,
    /// Broker port.
    pub port: u16,
    /// `(host, port)` of the rest of `transport.endpoints`: other nodes of the same broker
    /// cluster, each tried in turn after a lost connection (empty with one endpoint).
    pub failover: Vec<(String, u16)>,
    /// `transport.clientID` (default `edgebeat-agent-<nodeName>`).
    pub client_id: Option<String>,
    /// `transport.username` and the contents of `transport.passwordFile` (trailing newline
    /// removed), read at load.
    pub credentials: Option<(String, String)>,
    /// `transport.topicPrefix` (default `edgebeat/v1`).
    pub topic_prefix: String,
    /// `transport.keepalive`: MQTT Keep Alive, rumqttc's PINGREQ cadence (default
    /// [`MQTT_KEEPALIVE`], 30 min; at least 5 s, at most 65,535 s). A dead path is noticed
    /// sooner, by `TCP_USER_TIMEOUT` on unacknowledged renewals (README, "MQTT in one
    /// paragraph").
    pub keepalive: Duration,
}

/// The validated agent configuration. Durations are parsed, quantities resolved to typed
/// values, defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// Node name; defaults to the host's hostname (lower-cased) when empty.
    pub node_name: Option<String>,
    /// `nodeStatusUpdateFrequency`: how often status is computed (default 10 s).
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency`: longest time between status reports when nothing
    /// changed (default 5 min, or `nodeStatusUpdateFrequency` when only that is set).
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds` (default 40); renewals every duration × 0.25.
    pub node_lease_duration_seconds: u32,
    /// `registerNode` (default true): create the Node if it does not exist.
    pub register_node: bool,
    /// `registerSchedulable` (default true); false adds `spec.unschedulable` at creation.
    pub register_schedulable: bool,
    /// `registerWithTaints`: taints set at creation only.
    pub register_with_taints: Vec<Taint>,
    /// `nodeLabels`: labels added at registration; they override the defaults.
    pub node_labels: BTreeMap<String, String>,
    /// `evictionHard`: signal → threshold (default kubelet's Linux hard thresholds).
    pub eviction_hard: BTreeMap<EvictionSignal, Amount>,
    /// `evictionPressureTransitionPeriod`: how long a pressure condition is held after the
    /// signal last crossed its threshold (default 5 min). The health conditions use it too.
    pub eviction_pressure_transition_period: Duration,
    /// The health conditions beyond kubelet's four: `systemMemoryContentionThreshold`,
    /// `systemDiskContentionThreshold`, `readonlyFilesystemCondition`, `thermalCondition`,
    /// `thermalLimitCelsius`, `underVoltageCondition`, `clockSyncCondition` (see
    /// [`HealthSettings`]).
    pub health: HealthSettings,
    /// `systemReserved`: resource → amount subtracted from allocatable (cpu in millicores,
    /// others in bytes / count).
    pub system_reserved: BTreeMap<String, u64>,
    /// `kubeReserved`: as `systemReserved`.
    pub kube_reserved: BTreeMap<String, u64>,
    /// `maxPods`: `status.capacity.pods` (and allocatable). Default **0**, not kubelet's
    /// 110: there is no container runtime behind an edgebeat node, so it admits no pods and
    /// the scheduler's NodeResourcesFit filter refuses every pod for it ("Too many pods").
    /// Set it only for a node whose pods something else runs.
    pub max_pods: u32,
    /// `podsPerCore` (default 0 = off).
    pub pods_per_core: u32,
    /// `nodeIP` (kubelet `--node-ip`): the InternalIP to report.
    pub node_ip: Option<IpAddr>,
    /// `hostRoot`: where the host's `/` is mounted (default `/`).
    pub host_root: PathBuf,
    /// `rootDir` (kubelet `--root-dir`, default `/var/lib/kubelet`): its filesystem is
    /// nodefs and gives `ephemeral-storage` capacity.
    pub root_dir: PathBuf,
    /// `imageFsDir`: the container image filesystem (imagefs), if separate.
    pub image_fs_dir: Option<PathBuf>,
    /// `transport`: how heartbeats reach the gateway. Required unless running `--once`.
    pub transport: Option<TransportConfig>,
    /// `transport.caFile`/`certFile`/`keyFile`: TLS for a transport on `https://` or
    /// `mqtts://` (required there, refused on plain endpoints); with MQTT the key also signs
    /// every message. Kept beside [`TransportConfig`] rather than in
    /// its `Grpc` variant so code that builds that variant keeps compiling.
    pub transport_tls: Option<ClientTls>,
    /// `healthzBindAddress`: `IP:port` of the observe server (`/healthz`, `/readyz`,
    /// `/metrics`), e.g. `127.0.0.1:10248`; off when not set (the default).
    ///
    /// kubelet splits this into `healthzBindAddress` (an IP) and `healthzPort` (10248); one
    /// `IP:port` field keeps the agent's config small, and the name stays kubelet's because
    /// what kubelet serves on that port is health. `/metrics` shares the port instead of
    /// taking a second one (kubelet serves its metrics on the authenticated 10250).
    pub healthz_bind_address: Option<SocketAddr>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            node_name: None,
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
            node_lease_duration_seconds: 40,
            register_node: true,
            register_schedulable: true,
            register_with_taints: Vec::new(),
            node_labels: BTreeMap::new(),
            eviction_hard: default_eviction_hard(),
            eviction_pressure_transition_period: Duration::from_secs(300),
            health: HealthSettings::default(),
            system_reserved: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            max_pods: 0,
            pods_per_core: 0,
            node_ip: None,
            host_root: PathBuf::from("/"),
            root_dir: PathBuf::from("/var/lib/kubelet"),
            image_fs_dir: None,
            transport: None,
            transport_tls: None,
            healthz_bind_address: None,
        }
    }
}

/// Kubelet's default hard eviction thresholds on Linux
/// (`pkg/kubelet/eviction/defaults_linux.go`).
pub fn default_eviction_hard() -> BTreeMap<EvictionSignal, Amount> {
    BTreeMap::from([
        (
            EvictionSignal::MemoryAvailable,
            Amount::Absolute(100 * 1024 * 1024),
        ),
        (EvictionSignal::NodeFsAvailable, Amount::Percentage(0.1)),
        (EvictionSignal::NodeFsInodesFree, Amount::Percentage(0.05)),
        (EvictionSignal::ImageFsAvailable, Amount::Percentage(0.15)),
    ])
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    api_version: Option<String>,
    kind: Option<String>,
    node_name: Option<String>,
    node_status_update_frequency: Option<String>,
    node_status_report_frequency: Option<String>,
    node_lease_duration_seconds: Option<i64>,
    register_node: Option<bool>,
    register_schedulable: Option<bool>,
    register_with_taints: Option<Vec<Taint>>,
    node_labels: Option<BTreeMap<String, String>>,
    eviction_hard: Option<BTreeMap<String, String>>,
    eviction_pressure_transition_period: Option<String>,
    system_memory_contention_threshold: Option<f64>,
    system_disk_contention_threshold: Option<f64>,
    readonly_filesystem_condition: Option<bool>,
    thermal_condition: Option<bool>,
    thermal_limit_celsius: Option<f64>,
    under_voltage_condition: Option<bool>,
    clock_sync_condition: Option<bool>,
    system_reserved: Option<BTreeMap<String, String>>,
    kube_reserved: Option<BTreeMap<String, String>>,
    max_pods: Option<i64>,
    pods_per_core: Option<i64>,
    #[serde(rename = "nodeIP")]
    node_ip: Option<String>,
    host_root: Option<PathBuf>,
    root_dir: Option<PathBuf>,
    image_fs_dir: Option<PathBuf>,
    transport: Option<RawTransport>,
    healthz_bind_address: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawTransport {
    kind: Option<String>,
    endpoint: Option<String>,
    endpoints: Option<Vec<String>>,
    keepalive: Option<String>,
    #[serde(rename = "clientID")]
    client_id: Option<String>,
    username: Option<String>,
    password_file: Option<PathBuf>,
    topic_prefix: Option<String>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

impl AgentConfig {
    /// Reads and validates the YAML file at `path`.
    ///
    /// The file may hold at most [`MAX_CONFIG_FILE_BYTES`] and must be UTF-8.
    ///
    /// Errors: [`ConfigError::Read`], [`ConfigError::Syntax`] (with serde's line and
    /// column, or for text that is not UTF-8), [`ConfigError::Invalid`] naming the field.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let bytes = edgebeat_hw::read_bounded(path, MAX_CONFIG_FILE_BYTES).map_err(|source| {
            ConfigError::Read {
                path: path.to_owned(),
                source,
            }
        })?;
        let text = String::from_utf8(bytes).map_err(|e| {
            ConfigError::Syntax(format!(
                "{}: not UTF-8 text ({e}); save the file as UTF-8 YAML",
                path.display()
            ))
        })?;
        Self::from_yaml(&text)
    }

    /// Parses and validates a YAML document (see the module docs for the shape).
    ///
    /// Errors: as [`AgentConfig::load`], without `Read`.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        match serde_saphyr::from_str::<RawConfig>(text) {
            Ok(raw) => Self::validate(raw),
            Err(first) => Self::validate_field_by_field(text, first),
        }
    }

    /// The document did not deserialize as a whole (an unknown field, a value of the wrong
    /// type): deserializes each top-level field on its own to name every bad one, then
    /// validates the others, so one error lists them all. A document that is not a YAML
    /// mapping at all is [`ConfigError::Syntax`] with `first`.
    fn validate_field_by_field(
        text: &str,
        first: serde_saphyr::Error,
    ) -> Result<Self, ConfigError> {
        let syntax = || ConfigError::Syntax(first.to_string());
        let Ok(serde_json::Value::Object(fields)) =
            serde_saphyr::from_str::<serde_json::Value>(text)
        else {
            return Err(syntax());
        };
        // Each field alone, as YAML (JSON is YAML): the same typing as in the whole file.
        let alone = |fields: serde_json::Map<String, serde_json::Value>| {
            serde_saphyr::from_str::<RawConfig>(&serde_json::Value::Object(fields).to_string())
        };
        let mut p = Problems::default();
        let mut good = serde_json::Map::new();
        for (key, value) in fields {
            let one = serde_json::Map::from_iter([(key.clone(), value.clone())]);
            if alone(one).is_ok() {
                good.insert(key, value);
                continue;
            }
            // A mapping (transport): name its bad fields one by one too.
            // The good ones are still validated, the bad ones reported.
            let mut named = false;
            if let serde_json::Value::Object(inner) = &value {
                let mut kept = serde_json::Map::new();
                for (sub, v) in inner {
                    let nested = serde_json::Map::from_iter([(sub.clone(), v.clone())]);
                    let one = serde_json::Map::from_iter([(
                        key.clone(),
                        serde_json::Value::Object(nested),
                    )]);
                    match alone(one) {
                        Ok(_) => {
                            kept.insert(sub.clone(), v.clone());
                        }
                        Err(e) => {
                            p.push(format!("{key}.{sub}"), field_message(&e.to_string()));
                            named = true;
                        }
                    }
                }
                if named {
                    good.insert(key.clone(), serde_json::Value::Object(kept));
                }
            }
            if !named && let Err(e) = alone(serde_json::Map::from_iter([(key.clone(), value)])) {
                p.push(key, field_message(&e.to_string()));
            }
        }
        match alone(good).map(Self::validate) {
            Ok(Ok(_)) | Err(_) if p.len() == 0 => Err(syntax()),
            Ok(Ok(_)) | Err(_) => p.into_result(AgentConfig::default()),
            Ok(Err(ConfigError::Invalid(more))) => {
                p.0.extend(more);
                p.into_result(AgentConfig::default())
            }
            Ok(Err(other)) => Err(other),
        }
    }

    fn validate(raw: RawConfig) -> Result<Self, ConfigError> {
        let mut p = Problems::default();
        let mut c = AgentConfig::default();
        match raw.api_version.as_deref() {
            Some(API_VERSION) => {}
            other => p.push(
                "apiVersion",
                format!("{}; set apiVersion: {API_VERSION}", got(other)),
            ),
        }
        match raw.kind.as_deref() {
            Some(KIND) => {}
            other => p.push("kind", format!("{}; set kind: {KIND}", got(other))),
        }
        if let Some(name) = raw.node_name.filter(|n| !n.is_empty()) {
            match validate_node_name(&name) {
                Ok(()) => c.node_name = Some(name),
                Err(m) => p.push("nodeName", m),
            }
        }
        if let Some(v) = raw.node_status_update_frequency
            && let Some(d) = p.take(parse_positive_duration("nodeStatusUpdateFrequency", &v))
        {
            c.node_status_update_frequency = d;
            // kubelet: the report period follows an explicitly set update period.
            c.node_status_report_frequency = d;
        }
        if let Some(v) = raw.node_status_report_frequency
            && let Some(d) = p.take(parse_positive_duration("nodeStatusReportFrequency", &v))
        {
            c.node_status_report_frequency = d;
        }
        if let Some(v) = raw.node_lease_duration_seconds {
            match u32::try_from(v).ok().filter(|v| *v > 0) {
                Some(v) => c.node_lease_duration_seconds = v,
                None => p.push(
                    "nodeLeaseDurationSeconds",
                    format!("got {v}; must be a positive number of seconds, e.g. 40"),
                ),
            }
        }
        c.register_node = raw.register_node.unwrap_or(true);
        c.register_schedulable = raw.register_schedulable.unwrap_or(true);
        if let Some(taints) = raw.register_with_taints {
            if taints.len() > registration::MAX_TAINTS {
                p.push(
                    "registerWithTaints",
                    format!(
                        "{} taints; at most {} are accepted",
                        taints.len(),
                        registration::MAX_TAINTS
                    ),
                );
            }
            for (i, t) in taints.iter().enumerate() {
                if !registration::TAINT_EFFECTS.contains(&t.effect.as_str()) {
                    p.push(
                        format!("registerWithTaints[{i}].effect"),
                        format!(
                            "got {:?}; use {}",
                            t.effect,
                            registration::TAINT_EFFECTS.join(", ")
                        ),
                    );
                }
                if let Err(e) = registration::check_key(&t.key) {
                    p.push(format!("registerWithTaints[{i}].key"), e);
                }
                if let Err(e) = registration::check_value(&t.value) {
                    p.push(format!("registerWithTaints[{i}].value"), e);
                }
            }
            c.register_with_taints = taints;
        }
        if let Some(labels) = raw.node_labels {
            if let Some(value) = labels.get(CONTAINER_RUNTIME_LABEL.0) {
                p.push(
                    format!("nodeLabels[{:?}]", CONTAINER_RUNTIME_LABEL.0),
                    format!(
                        "got {value:?}; the agent always sets it to {:?} (an edgebeat node runs no containers); remove it",
                        CONTAINER_RUNTIME_LABEL.1
                    ),
                );
            }
            for (key, value) in &labels {
                if let Err(e) = registration::check_label(key, value) {
                    p.push(format!("nodeLabels[{key:?}]"), e);
                }
            }
            for key in registration::forbidden_labels(labels.keys().map(String::as_str)) {
                p.push(
                    format!("nodeLabels[{key:?}]"),
                    "a node may not set kubernetes.io or k8s.io labels other than kubelet's (NodeRestriction); use your own prefix, e.g. example.com/role, or node.kubernetes.io/…",
                );
            }
            let total = DEFAULT_LABEL_KEYS.len()
                + labels
                    .keys()
                    .filter(|k| !DEFAULT_LABEL_KEYS.contains(&k.as_str()))
                    .count();
            if total > registration::MAX_LABELS {
                p.push(
                    "nodeLabels",
                    format!(
                        "{total} labels with the agent's own {}; at most {} are accepted",
                        DEFAULT_LABEL_KEYS.len(),
                        registration::MAX_LABELS
                    ),
                );
            }
            c.node_labels = labels;
        }
        if let Some(hard) = raw.eviction_hard {
            // kubelet: setting any evictionHard key drops the other defaults.
            c.eviction_hard = BTreeMap::new();
            for (name, value) in hard {
                let field = format!("evictionHard[{name:?}]");
                let signal = match name.parse::<EvictionSignal>() {
                    Ok(signal) => signal,
                    Err(e) => {
                        p.push(field, e);
                        continue;
                    }
                };
                match parse_amount(&value, true) {
                    Ok(amount) => {
                        c.eviction_hard.insert(signal, amount);
                    }
                    Err(e) => p.push(field, e.to_string()),
                }
            }
        }
        if let Some(v) = raw.eviction_pressure_transition_period {
            match parse_duration(&v) {
                Ok(d) if d <= MAX_DURATION => c.eviction_pressure_transition_period = d,
                Ok(_) => p.push(
                    "evictionPressureTransitionPeriod",
                    format!("{v:?} must be at most 24h"),
                ),
                Err(m) => p.push("evictionPressureTransitionPeriod", m),
            }
        }
        let thresholds = [
            (
                "systemMemoryContentionThreshold",
                raw.system_memory_contention_threshold,
                &mut c.health.system_memory_contention_threshold,
            ),
            (
                "systemDiskContentionThreshold",
                raw.system_disk_contention_threshold,
                &mut c.health.system_disk_contention_threshold,
            ),
        ];
        for (field, value, slot) in thresholds {
            if let Some(v) = value {
                match health::check_threshold(v) {
                    Ok(v) => *slot = v,
                    Err(m) => p.push(field, m),
                }
            }
        }
        if let Some(v) = raw.thermal_limit_celsius {
            match health::check_thermal_limit(v) {
                Ok(v) => c.health.thermal_limit_celsius = Some(v),
                Err(m) => p.push("thermalLimitCelsius", m),
            }
        }
        let switches = [
            (
                raw.readonly_filesystem_condition,
                &mut c.health.readonly_filesystem,
            ),
            (raw.thermal_condition, &mut c.health.thermal),
            (raw.under_voltage_condition, &mut c.health.under_voltage),
            (raw.clock_sync_condition, &mut c.health.clock_sync),
        ];
        for (value, slot) in switches {
            if let Some(v) = value {
                *slot = v;
            }
        }
        c.system_reserved = parse_reserved(&mut p, "systemReserved", raw.system_reserved);
        c.kube_reserved = parse_reserved(&mut p, "kubeReserved", raw.kube_reserved);
        if let Some(v) = raw.max_pods {
            match u32::try_from(v) {
                Ok(v) => c.max_pods = v,
                Err(_) => p.push(
                    "maxPods",
                    format!("got {v}; must be 0 (no pods: the default) or positive"),
                ),
            }
        }
        if let Some(v) = raw.pods_per_core {
            match u32::try_from(v) {
                Ok(v) => c.pods_per_core = v,
                Err(_) => p.push(
                    "podsPerCore",
                    format!("got {v}; must be 0 (off) or positive"),
                ),
            }
        }
        if let Some(ip) = raw.node_ip {
            match ip.parse::<IpAddr>() {
                Err(_) => p.push("nodeIP", format!("{ip:?} is not an IP address")),
                Ok(parsed)
                    if parsed.is_loopback()
                        || parsed.is_multicast()
                        || parsed.is_unspecified()
                        || is_link_local(&parsed) =>
                {
                    p.push(
                        "nodeIP",
                        format!(
                            "{ip} is loopback, link-local, multicast or unspecified; use the node's own address (kubelet validateNodeIP)"
                        ),
                    );
                }
                Ok(parsed) => c.node_ip = Some(parsed),
            }
        }
        if let Some(path) = raw.host_root {
            c.host_root = path;
        }
        if let Some(path) = raw.root_dir {
            if path.is_absolute() {
                c.root_dir = path;
            } else {
                p.push(
                    "rootDir",
                    "must be an absolute path on the host, e.g. /var/lib/kubelet",
                );
            }
        }
        if let Some(path) = raw.image_fs_dir {
            if path.is_absolute() {
                c.image_fs_dir = Some(path);
            } else {
                p.push("imageFsDir", "must be an absolute path on the host");
            }
        }
        if let Some(t) = raw.transport
            && let Some((transport, tls)) = validate_transport(&mut p, t)
        {
            c.transport = Some(transport);
            c.transport_tls = tls;
        }
        if let Some(a) = raw.healthz_bind_address {
            match parse_bind_address(&a) {
                Ok(addr) => c.healthz_bind_address = Some(addr),
                Err(m) => p.push("healthzBindAddress", m),
            }
        }
        p.into_result(c)
    }

    /// Lease renew interval: `nodeLeaseDurationSeconds` × 0.25 (kubelet
    /// `nodeLeaseRenewIntervalFraction`), 10 s by default.
    pub fn lease_renew_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.node_lease_duration_seconds) * 250)
    }
}

/// `transport`: every invalid field goes to `p`; `None` when any did.
fn validate_transport(
    p: &mut Problems,
    t: RawTransport,
) -> Option<(TransportConfig, Option<ClientTls>)> {
    let before = p.len();
    let keepalive = match (&t.keepalive, t.kind.as_deref()) {
        (Some(v), _) => p.take(parse_positive_duration("transport.keepalive", v)),
        (None, Some("grpc")) => Some(GRPC_KEEPALIVE),
        (None, _) => Some(MQTT_KEEPALIVE),
    };
    let kind = t.kind.as_deref().unwrap_or("");
    let example = match kind {
        "mqtt" => "mqtt://broker.example:1883",
        _ => "http://gateway.example:7443",
    };
    // `endpoint`, or the several broker URLs of `endpoints` (MQTT only).
    let endpoints: Vec<String> = match (t.endpoint.clone(), t.endpoints.clone()) {
        (Some(one), None) => vec![one],
        (None, Some(list)) if list.is_empty() => {
            p.push(
                "transport.endpoints",
                format!("must list at least one URL, e.g. [{example}]"),
            );
            return None;
        }
        (None, Some(list)) => list,
        (None, None) => Vec::new(),
        (Some(_), Some(list)) => {
            p.push(
                "transport.endpoints",
                "set transport.endpoint or transport.endpoints, not both",
            );
            list
        }
    };
    let endpoint = endpoints.first().cloned();
    if endpoint.is_none() && matches!(kind, "grpc" | "mqtt") {
        p.push(
            "transport.endpoint",
            format!("required for kind: {kind}, e.g. {example}"),
        );
    }
    let tls = |p: &mut Problems, endpoint: &str, scheme: &str| {
        validate_tls(
            p,
            endpoint,
            scheme,
            t.ca_file.clone(),
            t.cert_file.clone(),
            t.key_file.clone(),
        )
    };
    let transport = match t.kind.as_deref() {
        Some("grpc") => {
            for (field, set) in [
                ("transport.clientID", t.client_id.is_some()),
                ("transport.username", t.username.is_some()),
                ("transport.passwordFile", t.password_file.is_some()),
                ("transport.topicPrefix", t.topic_prefix.is_some()),
                ("transport.endpoints", t.endpoints.is_some()),
            ] {
                if set {
                    p.push(
                        field,
                        "only valid with kind: mqtt; remove it or set kind: mqtt",
                    );
                }
            }
            if !cfg!(feature = "grpc") {
                p.push(
                    "transport.kind",
                    "this agent was built without gRPC (cargo feature grpc); use kind: mqtt or an agent built with it",
                );
            }
            let endpoint = endpoint?;
            if let Err(m) = edgebeat_transports::endpoint::check_grpc_endpoint(&endpoint) {
                p.push("transport.endpoint", m);
                return None;
            }
            if endpoint.starts_with("https://") && !cfg!(feature = "grpc-tls") {
                p.push(
                    "transport.endpoint",
                    "this build has no gRPC TLS support (feature grpc-tls); use http:// or an agent built with TLS",
                );
            }
            let tls = tls(p, &endpoint, "https://");
            (
                TransportConfig::Grpc {
                    endpoint,
                    keepalive: keepalive?,
                },
                tls,
            )
        }
        Some("mqtt") => {
            if !cfg!(feature = "mqtt") {
                p.push(
                    "transport.kind",
                    "this agent was built without MQTT (cargo feature mqtt); use kind: grpc or an agent built with it",
                );
            }
            if let Some(Err(why)) =
                keepalive.map(edgebeat_transports::endpoint::check_mqtt_keepalive)
            {
                p.push("transport.keepalive", format!("{why} for MQTT"));
            }
            let credentials = mqtt_credentials(p, t.username, t.password_file);
            let topic_prefix = t.topic_prefix.unwrap_or_else(|| "edgebeat/v1".to_owned());
            if let Err(why) = edgebeat_transports::endpoint::check_topic_prefix(&topic_prefix) {
                p.push(
                    "transport.topicPrefix",
                    format!("{topic_prefix:?} {why}; a plain topic path, e.g. edgebeat/v1"),
                );
            }
            if let Some(id) = &t.client_id
                && (id.is_empty() || id.len() > 256)
            {
                p.push("transport.clientID", "must be 1 to 256 characters");
            }
            let url = endpoint?;
            let field = |i: usize| match t.endpoints {
                Some(_) => format!("transport.endpoints[{i}]"),
                None => "transport.endpoint".to_owned(),
            };
            let mut brokers = Vec::with_capacity(endpoints.len());
            for (i, text) in endpoints.iter().enumerate() {
                match text.parse::<edgebeat_transports::endpoint::MqttEndpoint>() {
                    Ok(e) if i > 0 && e.tls != url.starts_with("mqtts://") => p.push(
                        field(i),
                        format!(
                            "{text:?} and {url:?} differ in TLS: every broker of the list shares transport.caFile/certFile/keyFile, so all are mqtts:// or all mqtt://"
                        ),
                    ),
                    Ok(e) => brokers.push((e.host, e.port)),
                    Err(m) => p.push(field(i), m),
                }
            }
            if brokers.len() != endpoints.len() {
                return None;
            }
            let (host, port) = brokers.remove(0);
            let tls = tls(p, &url, "mqtts://");
            #[cfg(feature = "mqtt-tls")]
            if let Some(client) = tls.as_ref().and_then(|t| t.client_identity.as_ref())
                && let Err(e) = edgebeat_transports::signing::MessageSigner::from_pem(
                    &client.cert_pem,
                    &client.key_pem,
                )
            {
                p.push(
                    "transport.keyFile",
                    format!("cannot sign MQTT messages with it: {e}"),
                );
            }
            #[cfg(not(feature = "mqtt-tls"))]
            if url.starts_with("mqtts://") {
                p.push(
                    "transport.endpoint",
                    "this build has no MQTT TLS support (feature mqtt-tls); use mqtt:// or an agent built with TLS",
                );
            }
            (
                TransportConfig::Mqtt(MqttTransport {
                    host,
                    port,
                    failover: brokers,
                    client_id: t.client_id,
                    credentials: credentials?,
                    topic_prefix,
                    keepalive: keepalive?,
                }),
                tls,
            )
        }
        Some(other) => {
            p.push(
                "transport.kind",
                format!("{other:?} is not a transport; use grpc or mqtt"),
            );
            return None;
        }
        None => {
            p.push("transport.kind", "required; use grpc or mqtt");
            return None;
        }
    };
    (p.len() == before).then_some(transport)
}

/// `transport.username` and `transport.passwordFile` (read now): both or neither.
/// `Some(None)`: neither; `None`: an error went to `p`.
fn mqtt_credentials(
    p: &mut Problems,
    username: Option<String>,
    password_file: Option<PathBuf>,
) -> Option<Option<(String, String)>> {
    match (username, password_file) {
        (None, None) => Some(None),
        (Some(user), Some(file)) => match edgebeat_hw::read_password_file(&file) {
            Ok(password) => Some(Some((user, password))),
            Err(e) => {
                p.push("transport.passwordFile", e.to_string());
                None
            }
        },
        (Some(_), None) => {
            p.push(
                "transport.passwordFile",
                "required when transport.username is set",
            );
            None
        }
        (None, Some(_)) => {
            p.push(
                "transport.username",
                "required when transport.passwordFile is set",
            );
            None
        }
    }
}

/// `transport.caFile`/`certFile`/`keyFile`: with an endpoint on `secure_scheme`
/// (`https://` for gRPC, `mqtts://` for MQTT) the CA is required and cert and key go
/// together; on a plain endpoint none is allowed. Each file is read and parsed now, so a bad
/// file is reported at load with its field. Every problem goes to `p`.
fn validate_tls(
    p: &mut Problems,
    endpoint: &str,
    secure_scheme: &str,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
) -> Option<ClientTls> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    if !endpoint.starts_with(secure_scheme) {
        for (field, set) in [
            ("transport.caFile", ca_file.is_some()),
            ("transport.certFile", cert_file.is_some()),
            ("transport.keyFile", key_file.is_some()),
        ] {
            if set {
                p.push(
                    field,
                    format!(
                        "only valid with a {secure_scheme} endpoint, but transport.endpoint is {endpoint:?}; use {secure_scheme} or remove it"
                    ),
                );
            }
        }
        return None;
    }
    let read = |field: &str, path: &PathBuf| {
        edgebeat_hw::read_bounded(path, MAX_PEM_FILE_BYTES)
            .map_err(|e| invalid(field, e.to_string()))
    };
    let certificates = |field: &str, path: &PathBuf| {
        let pem = read(field, path)?;
        let count = CertificateDer::pem_slice_iter(&pem)
            .try_fold(0usize, |n, c| c.map(|_| n + 1))
            .map_err(|e| invalid(field, format!("{}: not valid PEM: {e}", path.display())))?;
        if count == 0 {
            return Err(invalid(
                field,
                format!(
                    "{}: no PEM CERTIFICATE block found; give a PEM certificate file",
                    path.display()
                ),
            ));
        }
        Ok(pem)
    };
    let ca_pem = match ca_file {
        Some(file) => p.take(certificates("transport.caFile", &file)),
        None => {
            p.push(
                "transport.caFile",
                format!("required for a {secure_scheme} endpoint: the PEM CA certificate that signed the server's certificate"),
            );
            None
        }
    };
    let client = match (cert_file, key_file) {
        (None, None) => Some(None),
        (Some(cert), Some(key)) => {
            let cert_pem = p.take(certificates("transport.certFile", &cert));
            let key_pem = p.take(read("transport.keyFile", &key).and_then(|pem| {
                PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                    invalid(
                        "transport.keyFile",
                        format!(
                            "{}: no usable PEM private key (PKCS#8, RSA or EC): {e}",
                            key.display()
                        ),
                    )
                })?;
                Ok(pem)
            }));
            cert_pem
                .zip(key_pem)
                .map(|(cert_pem, key_pem)| Some(TlsIdentity { cert_pem, key_pem }))
        }
        (Some(_), None) => {
            p.push(
                "transport.keyFile",
                "required when transport.certFile is set (the client certificate's private key)",
            );
            None
        }
        (None, Some(_)) => {
            p.push(
                "transport.certFile",
                "required when transport.keyFile is set (the client certificate)",
            );
            None
        }
    };
    let tls = ClientTls {
        ca_pem: ca_pem?,
        client_identity: client?,
    };
    // The transport builds this same rustls configuration when it connects: a CA that is
    // PEM but no usable trust anchor, or a key rustls cannot use with its certificate, is
    // refused now rather than at the first connection.
    #[cfg(any(feature = "grpc-tls", feature = "mqtt-tls"))]
    if let Err(why) = tls.rustls_config() {
        let field = if why.starts_with("CA") {
            "transport.caFile"
        } else if why.starts_with("client certificate:") {
            "transport.certFile"
        } else {
            "transport.keyFile"
        };
        p.push(field, format!("unusable for TLS: {why}"));
        return None;
    }
    Some(tls)
}

/// Parses the observe server's address (`healthzBindAddress`, `--healthz-bind-address`): an
/// `IP:port` (`[v6]:port` for IPv6) with a port other than 0. A host name is not accepted:
/// the agent binds before any resolver is needed, as kubelet does.
///
/// Errors: a message with the rejected text and an example.
pub fn parse_bind_address(text: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = text.trim().parse().map_err(|_| {
        format!(
            "{text:?} is not an IP:port address, e.g. 127.0.0.1:10248 or [::1]:10248 (remove the field to turn the server off)"
        )
    })?;
    if addr.port() == 0 {
        return Err(format!(
            "{text:?} has port 0; use a fixed port such as 10248 so probes and scrapers can find it"
        ));
    }
    Ok(addr)
}

/// `systemReserved` / `kubeReserved`: resource → amount (cpu in millicores, the others in
/// bytes or a count); every invalid entry goes to `p` and is left out.
fn parse_reserved(
    p: &mut Problems,
    field: &str,
    map: Option<BTreeMap<String, String>>,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (resource, value) in map.unwrap_or_default() {
        let f = format!("{field}[{resource:?}]");
        let v = match resource.as_str() {
            "cpu" => parse_millicores(&value).map_err(|e| e.to_string()),
            "memory" | "ephemeral-storage" | "pid" => match parse_amount(&value, false) {
                Ok(Amount::Absolute(v)) => Ok(v),
                Ok(Amount::Percentage(_)) => Err("percentages are not allowed here".to_owned()),
                Err(e) => Err(e.to_string()),
            },
            _ => Err("unknown resource; use cpu, memory, ephemeral-storage or pid".to_owned()),
        };
        match v {
            Ok(v) => {
                out.insert(resource, v);
            }
            Err(m) => p.push(f, m),
        }
    }
    out
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// Checks a Node name for this agent: a DNS-1123 subdomain (lower-case alphanumerics, `-`
/// and `.`, starting and ending alphanumeric), as the apiserver validates it
/// ([`registration::is_node_name`]), and at most 63 characters, because it is also the
/// value of the Node's `kubernetes.io/hostname` label ([`registration::check_value`]); a
/// longer name would load and then never register.
///
/// Errors: a message saying what is wrong.
pub fn validate_node_name(name: &str) -> Result<(), String> {
    if !registration::is_node_name(name) {
        return Err(format!(
            "{name:?} is not a valid node name: use lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
        ));
    }
    if registration::check_value(name).is_err() {
        return Err(format!(
            "{name:?} is {} characters; a node name is also its kubernetes.io/hostname label, which allows at most {}",
            name.len(),
            registration::MAX_LABEL_VALUE_BYTES
        ));
    }
    Ok(())
}

/// Longest period any duration field accepts (one day); longer values are mistakes and
/// would overflow timer arithmetic.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

fn parse_positive_duration(field: &str, text: &str) -> Result<Duration, ConfigError> {
    let d = parse_duration(text).map_err(|m| invalid(field, m))?;
    if d.is_zero() || d > MAX_DURATION {
        return Err(invalid(
            field,
            format!("{text:?} must be greater than zero and at most 24h"),
        ));
    }
    Ok(d)
}

/// Parses a Go duration (`metav1.Duration` as in KubeletConfiguration): a sequence of
/// decimal numbers with units `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`, e.g. `"10s"`, `"1m30s"`,
/// `"1.5h"`, `"300ms"`; `"0"` alone is zero.
///
/// Errors: a message with the rejected text and an example of the expected form.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let err = || {
        format!("invalid duration {text:?}; use a Go duration such as \"10s\", \"5m\" or \"1m30s\"")
    };
    let t = text.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() {
        return Err(err());
    }
    let mut rest = t;
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if num_end == 0 {
            return Err(err());
        }
        let value: f64 = rest[..num_end].parse().map_err(|_| err())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += value * seconds;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| err())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "apiVersion: edgebeat.io/v1alpha1\nkind: AgentConfiguration\n";

    #[test]
    fn defaults_are_kubelets() {
        let c = AgentConfig::from_yaml(MINIMAL).unwrap();
        assert_eq!(c, AgentConfig::default());
        assert_eq!(c.node_status_update_frequency, Duration::from_secs(10));
        assert_eq!(c.node_status_report_frequency, Duration::from_secs(300));
        assert_eq!(c.lease_renew_interval(), Duration::from_secs(10));
        assert_eq!(c.eviction_hard.len(), 4);
    }

    #[test]
    fn explicit_update_frequency_carries_the_report_frequency() {
        let c =
            AgentConfig::from_yaml(&format!("{MINIMAL}nodeStatusUpdateFrequency: 20s\n")).unwrap();
        assert_eq!(c.node_status_report_frequency, Duration::from_secs(20));
        let c = AgentConfig::from_yaml(&format!(
            "{MINIMAL}nodeStatusUpdateFrequency: 20s\nnodeStatusReportFrequency: 1m\n"
        ))
        .unwrap();
        assert_eq!(c.node_status_report_frequency, Duration::from_secs(60));
    }

    #[test]
    fn full_config_parses() {
        let yaml = format!(
            "{MINIMAL}nodeName: edge-01\nnodeLeaseDurationSeconds: 20\nregisterWithTaints:\n- {{key: example.com/edge, value: \"true\", effect: NoSchedule}}\nnodeLabels: {{site: plant-3}}\nevictionHard: {{memory.available: 200Mi, pid.available: 10%}}\nevictionPressureTransitionPeriod: 1m30s\nsystemReserved: {{cpu: 250m, memory: 128Mi}}\nmaxPods: 20\nnodeIP: 10.0.3.7\nhostRoot: /host\nrootDir: /var/lib/edgebeat\ntransport: {{kind: grpc, endpoint: \"http://gw:7443\", keepalive: 20s}}\n"
        );
        let c = AgentConfig::from_yaml(&yaml).unwrap();
        assert_eq!(c.node_name.as_deref(), Some("edge-01"));
        assert_eq!(c.lease_renew_interval(), Duration::from_secs(5));
        assert_eq!(c.register_with_taints[0].effect, "NoSchedule");
        assert_eq!(
            c.eviction_hard.len(),
            2,
            "setting evictionHard drops the other defaults"
        );
        assert_eq!(
            c.eviction_hard[&EvictionSignal::PidAvailable],
            Amount::Percentage(0.1)
        );
        assert_eq!(
            c.eviction_pressure_transition_period,
            Duration::from_secs(90)
        );
        assert_eq!(c.system_reserved["cpu"], 250);
        assert_eq!(c.system_reserved["memory"], 128 << 20);
        assert_eq!(c.node_ip, Some("10.0.3.7".parse().unwrap()));
        assert_eq!(
            c.transport,
            Some(TransportConfig::Grpc {
                endpoint: "http://gw:7443".into(),
                keepalive: Duration::from_secs(20)
            })
        );
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                "nodeStatusUpdateFrequency: 10x\n",
                "nodeStatusUpdateFrequency",
            ),
            (
                "nodeStatusUpdateFrequency: 0s\n",
                "nodeStatusUpdateFrequency",
            ),
            ("nodeLeaseDurationSeconds: 0\n", "nodeLeaseDurationSeconds"),
            (
                "evictionHard: {memory.free: 1Gi}\n",
                "evictionHard[\"memory.free\"]",
            ),
            (
                "evictionHard: {memory.available: lots}\n",
                "evictionHard[\"memory.available\"]",
            ),
            (
                "registerWithTaints: [{key: a, effect: Sometimes}]\n",
                "registerWithTaints[0].effect",
            ),
            ("nodeName: Edge_01\n", "nodeName"),
            ("maxPods: -1\n", "maxPods"),
            (
                "nodeLabels: {edgebeat.io/container-runtime: containerd}\n",
                "nodeLabels[\"edgebeat.io/container-runtime\"]",
            ),
            ("nodeIP: 127.0.0.1\n", "nodeIP"),
            ("transport: {kind: grpc}\n", "transport.endpoint"),
            ("transport: {kind: carrier-pigeon}\n", "transport.kind"),
            ("transport: {kind: mqtt}\n", "transport.endpoint"),
            (
                "transport: {kind: mqtt, endpoint: \"http://b:1883\"}\n",
                "transport.endpoint",
            ),
            (
                "transport: {kind: mqtt, endpoint: \"mqtt://b:99999\"}\n",
                "transport.endpoint",
            ),
            (
                "transport: {kind: mqtt, endpoint: \"mqtt://b\", topicPrefix: \"a/#\"}\n",
                "transport.topicPrefix",
            ),
            // Rules that once drifted from the MQTT transport's (a config that loaded but
            // failed to run): a leading `/`, a NUL, a keepalive over MQTT's 16 bits.
            (
                "transport: {kind: mqtt, endpoint: \"mqtt://b\", topicPrefix: /edgebeat}\n",
                "transport.topicPrefix",
            ),
            (
                "transport: {kind: mqtt, endpoint: \"mqtt://b\", topicPrefix: \"a\\0b\"}\n",
                "transport.topicPrefix",
            ),
            (
                "transport: {kind: mqtt, endpoint: \"mqtt://b\", keepalive: 20h}\n",
                "transport.keepalive",
            ),
            (
                "transport: {kind: mqtt, endpoint: \"mqtt://b\", username: u}\n",
                "transport.passwordFile",
            ),
            (
                "transport: {kind: mqtt, endpoint: \"mqtt://b\", keepalive: 1s}\n",
                "transport.keepalive",
            ),
            (
                "transport: {kind: grpc, endpoint: \"http://g:1\", topicPrefix: x}\n",
                "transport.topicPrefix",
            ),
            (
                "transport: {kind: grpc, endpoint: gw:7443}\n",
                "transport.endpoint",
            ),
            ("systemReserved: {gpu: 1}\n", "systemReserved[\"gpu\"]"),
            (
                "healthzBindAddress: localhost:10248\n",
                "healthzBindAddress",
            ),
            ("healthzBindAddress: \"10248\"\n", "healthzBindAddress"),
            ("healthzBindAddress: 127.0.0.1\n", "healthzBindAddress"),
            ("healthzBindAddress: 127.0.0.1:0\n", "healthzBindAddress"),
            ("healthzBindAddress: \"::1:10248\"\n", "healthzBindAddress"),
            // Rules that once drifted from the gateway's and the apiserver's (a config
            // that loaded but whose node never registered): the hostname label's length,
            // label and taint syntax, NodeRestriction's labels.
            (
                "nodeName: edge-01234567890123456789012345678901234567890123456789012345678\n",
                "nodeName",
            ),
            (
                "nodeLabels: {node-role.kubernetes.io/edge: \"\"}\n",
                "nodeLabels[\"node-role.kubernetes.io/edge\"]",
            ),
            ("nodeLabels: {site: plant 3}\n", "nodeLabels[\"site\"]"),
            (
                "nodeLabels: {Example.com/site: a}\n",
                "nodeLabels[\"Example.com/site\"]",
            ),
            (
                "registerWithTaints: [{key: a b, effect: NoSchedule}]\n",
                "registerWithTaints[0].key",
            ),
            (
                "registerWithTaints: [{key: a, value: -x, effect: NoSchedule}]\n",
                "registerWithTaints[0].value",
            ),
            // ... and from the gRPC uplink's endpoint parser.
            (
                "transport: {kind: grpc, endpoint: \"http://\"}\n",
                "transport.endpoint",
            ),
            (
                "transport: {kind: grpc, endpoint: \"http://gw:x\"}\n",
                "transport.endpoint",
            ),
        ];
        for (body, field) in cases {
            let err = AgentConfig::from_yaml(&format!("{MINIMAL}{body}"))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(&format!("{field}: ")),
                "{body:?} gave {err:?}"
            );
        }
    }

    /// The registration's label limit counts the agent's own labels: 59 more than its
    /// six are one too many for the gateway, so the config says so.
    #[test]
    fn node_labels_are_counted_with_the_agents_own() {
        let labels = |n: usize| {
            let list: Vec<String> = (0..n).map(|i| format!("example.com/l{i}: v")).collect();
            format!("{MINIMAL}nodeLabels: {{{}}}\n", list.join(", "))
        };
        assert!(AgentConfig::from_yaml(&labels(58)).is_ok());
        let err = AgentConfig::from_yaml(&labels(59)).unwrap_err().to_string();
        assert!(err.starts_with("nodeLabels: 65 labels"), "{err}");
        // Overriding a default label adds none.
        let yaml = format!("{MINIMAL}nodeLabels: {{kubernetes.io/hostname: edge-01}}\n");
        assert!(AgentConfig::from_yaml(&yaml).is_ok());
    }

    #[test]
    fn max_pods_defaults_to_zero_and_accepts_zero() {
        assert_eq!(AgentConfig::from_yaml(MINIMAL).unwrap().max_pods, 0);
        let c = AgentConfig::from_yaml(&format!("{MINIMAL}maxPods: 0\n")).unwrap();
        assert_eq!(c.max_pods, 0);
        let c = AgentConfig::from_yaml(&format!("{MINIMAL}maxPods: 110\n")).unwrap();
        assert_eq!(c.max_pods, 110);
    }

    #[test]
    fn unknown_fields_and_wrong_kind_are_rejected() {
        let err = AgentConfig::from_yaml(&format!("{MINIMAL}nodeStatusUpdateFrequncy: 10s\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("nodeStatusUpdateFrequncy"), "{err}");
        let err = AgentConfig::from_yaml("apiVersion: v1\nkind: AgentConfiguration\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("apiVersion: "), "{err}");
        let err = AgentConfig::from_yaml("apiVersion: edgebeat.io/v1alpha1\nkind: Pod\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("kind: "), "{err}");
        assert!(AgentConfig::from_yaml("{ not yaml").is_err());
        let err = AgentConfig::from_yaml(&format!("{MINIMAL}maxPods: many\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("maxPods") || err.contains("line"), "{err}");
    }

    #[test]
    fn several_broker_endpoints_are_one_list_tried_in_turn() {
        let c = AgentConfig::from_yaml(&format!(
            "{MINIMAL}transport: {{kind: mqtt, endpoints: [\"mqtt://b0:1883\", \"mqtt://b1\", \"mqtt://[fd00::2]:2883\"]}}\n"
        ))
        .unwrap();
        let Some(TransportConfig::Mqtt(m)) = c.transport else {
            panic!("mqtt expected")
        };
        assert_eq!((m.host.as_str(), m.port), ("b0", 1883));
        assert_eq!(
            m.failover,
            [("b1".to_owned(), 1883), ("fd00::2".to_owned(), 2883)]
        );
        let one = AgentConfig::from_yaml(&format!(
            "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtt://b0\"}}\n"
        ))
        .unwrap();
        assert!(matches!(one.transport, Some(TransportConfig::Mqtt(m)) if m.failover.is_empty()));
        let cases = [
            (
                "{kind: mqtt, endpoint: \"mqtt://b0\", endpoints: [\"mqtt://b1\"]}",
                "transport.endpoints",
                "not both",
            ),
            (
                "{kind: mqtt, endpoints: []}",
                "transport.endpoints",
                "at least one",
            ),
            (
                "{kind: mqtt, endpoints: [\"mqtt://b0\", \"http://b1\"]}",
                "transport.endpoints[1]",
                "http://b1",
            ),
            (
                "{kind: mqtt, endpoints: [\"mqtt://b0\", \"mqtts://b1\"]}",
                "transport.endpoints[1]",
                "differ in TLS",
            ),
            (
                "{kind: grpc, endpoints: [\"http://gw:7443\"]}",
                "transport.endpoints",
                "only valid with kind: mqtt",
            ),
        ];
        for (transport, field, words) in cases {
            let err = AgentConfig::from_yaml(&format!("{MINIMAL}transport: {transport}\n"))
                .unwrap_err()
                .to_string();
            assert!(
                (err.starts_with(&format!("{field}: ")) || err.contains(&format!("\n- {field}: ")))
                    && err.contains(words),
                "{transport}: {err}"
            );
        }
    }

    #[test]
    fn mqtt_transport_parses() {
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "s3cret\n").unwrap();
        let yaml = format!(
            "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtt://broker.plant:8883\", clientID: edge-01, username: edge, passwordFile: {}, topicPrefix: plant3/edgebeat, keepalive: 1m}}\n",
            password.display()
        );
        let c = AgentConfig::from_yaml(&yaml).unwrap();
        let Some(TransportConfig::Mqtt(m)) = c.transport else {
            panic!("mqtt expected")
        };
        assert_eq!((m.host.as_str(), m.port), ("broker.plant", 8883));
        assert_eq!(m.credentials, Some(("edge".into(), "s3cret".into())));
        assert_eq!(m.topic_prefix, "plant3/edgebeat");
        assert_eq!(m.keepalive, Duration::from_secs(60));
        let c = AgentConfig::from_yaml(&format!(
            "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtt://10.0.0.1\"}}\n"
        ))
        .unwrap();
        let Some(TransportConfig::Mqtt(m)) = c.transport else {
            panic!("mqtt expected")
        };
        assert_eq!(
            (m.host.as_str(), m.port, m.topic_prefix.as_str()),
            ("10.0.0.1", 1883, "edgebeat/v1")
        );
    }

    /// The regression: `passwordFile: /dev/zero` used to read forever at load.
    #[test]
    fn endless_password_file_is_refused_naming_the_field() {
        let err = AgentConfig::from_yaml(&format!(
            "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtt://b\", username: edge, passwordFile: /dev/zero}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "transport.passwordFile: /dev/zero: larger than 4096 bytes; point it at a regular file of at most 4096 bytes"
        );
        let dir = tempfile::tempdir().unwrap();
        let err = AgentConfig::from_yaml(&format!(
            "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtt://b\", username: edge, passwordFile: {}}}\n",
            dir.path().display()
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("transport.passwordFile: ") && err.contains("is a directory"),
            "{err}"
        );
    }

    #[test]
    fn endless_pem_file_is_refused_naming_the_field() {
        let err = AgentConfig::from_yaml(&format!(
            "{MINIMAL}transport: {{kind: grpc, endpoint: \"https://gw:7443\", caFile: /dev/zero}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("transport.caFile: /dev/zero: larger than 1048576 bytes"),
            "{err}"
        );
    }

    #[test]
    fn load_refuses_an_endless_config_file() {
        let err = AgentConfig::load(std::path::Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "agent configuration: /dev/zero: larger than 1048576 bytes; point it at a regular file of at most 1048576 bytes"
        );
        let dir = tempfile::tempdir().unwrap();
        let err = AgentConfig::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is a directory"), "{err}");
        let path = dir.path().join("agent.yaml");
        std::fs::write(&path, MINIMAL).unwrap();
        assert_eq!(AgentConfig::load(&path).unwrap(), AgentConfig::default());
        std::fs::write(&path, b"kind: \xff\n").unwrap();
        let err = AgentConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("not UTF-8"), "{err}");
    }

    /// Writes a CA certificate, a node certificate and its key as PEM files.
    fn pki(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
        pki_with(dir, &rcgen::PKCS_ECDSA_P256_SHA256)
    }

    /// [`pki`] with a node key of `algorithm`.
    fn pki_with(
        dir: &std::path::Path,
        algorithm: &'static rcgen::SignatureAlgorithm,
    ) -> (PathBuf, PathBuf, PathBuf) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let node_key = rcgen::KeyPair::generate_for(algorithm).unwrap();
        let mut node = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        node.distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:edge-01");
        node.distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let node_cert = node.signed_by(&node_key, &issuer).unwrap();
        let paths = (
            dir.join("ca.crt"),
            dir.join("node.crt"),
            dir.join("node.key"),
        );
        std::fs::write(&paths.0, ca_cert.pem()).unwrap();
        std::fs::write(&paths.1, node_cert.pem()).unwrap();
        std::fs::write(&paths.2, node_key.serialize_pem()).unwrap();
        paths
    }

    /// The example site configs (`deploy/agent`) run the identified posture: each names a
    /// CA, a node certificate and its key under /etc/edgebeat/pki, which load here from
    /// [`pki`] (the paths rewritten to it).
    #[test]
    fn example_site_configs_load() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _, _) = pki(dir.path());
        let pki_dir = format!("{}/", ca.parent().unwrap().display());
        for name in ["site-grpc.yaml", "site-mqtt.yaml"] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../deploy/agent")
                .join(name);
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(
                text.matches("/etc/edgebeat/pki/").count(),
                3,
                "{name}: caFile, certFile and keyFile are set"
            );
            let config = AgentConfig::from_yaml(&text.replace("/etc/edgebeat/pki/", &pki_dir))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(config.transport.is_some(), "{name}");
            assert!(
                config
                    .transport_tls
                    .as_ref()
                    .is_some_and(|t| t.client_identity.is_some()),
                "{name}: a node identity"
            );
            assert_eq!(config.register_with_taints.len(), 1, "{name}");
        }
    }

    #[test]
    fn grpc_tls_files_are_read_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki(dir.path());
        let c = AgentConfig::from_yaml(&format!(
            "{MINIMAL}transport: {{kind: grpc, endpoint: \"https://gw.plant:7443\", caFile: {}, certFile: {}, keyFile: {}}}\n",
            ca.display(),
            cert.display(),
            key.display()
        ))
        .unwrap();
        let tls = c.transport_tls.unwrap();
        assert_eq!(tls.ca_pem, std::fs::read(&ca).unwrap());
        let client = tls.client_identity.unwrap();
        assert_eq!(client.key_pem, std::fs::read(&key).unwrap());
        assert!(
            !format!("{client:?}").contains("PRIVATE"),
            "key not in Debug"
        );
        // Server-authenticated TLS only: a CA without a client certificate.
        let c = AgentConfig::from_yaml(&format!(
            "{MINIMAL}transport: {{kind: grpc, endpoint: \"https://gw:7443\", caFile: {}}}\n",
            ca.display()
        ))
        .unwrap();
        assert_eq!(c.transport_tls.unwrap().client_identity, None);
        // Plain gRPC has no TLS material.
        let c = AgentConfig::from_yaml(&format!(
            "{MINIMAL}transport: {{kind: grpc, endpoint: \"http://gw:7443\"}}\n"
        ))
        .unwrap();
        assert_eq!(c.transport_tls, None);
    }

    #[test]
    fn mqtt_tls_files_are_read_at_load_and_the_key_must_sign() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki(dir.path());
        let yaml = |key: &std::path::Path| {
            format!(
                "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtts://broker.plant\", caFile: {}, certFile: {}, keyFile: {}}}\n",
                ca.display(),
                cert.display(),
                key.display()
            )
        };
        let c = AgentConfig::from_yaml(&yaml(&key)).unwrap();
        let Some(TransportConfig::Mqtt(m)) = &c.transport else {
            panic!("mqtt expected");
        };
        assert_eq!((m.host.as_str(), m.port), ("broker.plant", 8883));
        assert!(c.transport_tls.unwrap().client_identity.is_some());
        // A key that is not the certificate's is refused at load by rustls, building the
        // TLS configuration the transport will use, naming the field.
        let other = dir.path().join("other.key");
        let key = rcgen::KeyPair::generate().unwrap();
        std::fs::write(&other, key.serialize_pem()).unwrap();
        let err = AgentConfig::from_yaml(&yaml(&other))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("transport.keyFile: unusable for TLS: client certificate and key:"),
            "{err}"
        );
        // A certificate and key that TLS accepts but that cannot sign compactly (P-384) are
        // refused at load, naming the field.
        let p384 = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki_with(p384.path(), &rcgen::PKCS_ECDSA_P384_SHA384);
        let err = AgentConfig::from_yaml(&format!(
            "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtts://broker.plant\", caFile: {}, certFile: {}, keyFile: {}}}\n",
            ca.display(),
            cert.display(),
            key.display()
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("transport.keyFile: cannot sign MQTT messages"),
            "{err}"
        );
    }

    #[test]
    fn grpc_tls_errors_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki(dir.path());
        let missing = dir.path().join("missing.crt");
        // PEM, but its DER is no certificate: only rustls, building the TLS configuration
        // the transport will use, can tell.
        let not_der = dir.path().join("not-der.crt");
        std::fs::write(
            &not_der,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let not_der = not_der.display().to_string();
        let (ca, cert, key, missing) = (
            ca.display().to_string(),
            cert.display().to_string(),
            key.display().to_string(),
            missing.display().to_string(),
        );
        let https = "kind: grpc, endpoint: \"https://gw:7443\"";
        let cases = [
            (format!("{{{https}}}"), "transport.caFile", "required"),
            (
                format!("{{{https}, caFile: {ca}, certFile: {cert}}}"),
                "transport.keyFile",
                "required",
            ),
            (
                format!("{{{https}, caFile: {ca}, keyFile: {key}}}"),
                "transport.certFile",
                "required",
            ),
            (
                format!("{{kind: grpc, endpoint: \"http://gw:7443\", caFile: {ca}}}"),
                "transport.caFile",
                "https://",
            ),
            (
                format!(
                    "{{kind: grpc, endpoint: \"http://gw:7443\", certFile: {cert}, keyFile: {key}}}"
                ),
                "transport.certFile",
                "https://",
            ),
            (
                format!("{{kind: mqtt, endpoint: \"mqtt://b\", caFile: {ca}}}"),
                "transport.caFile",
                "mqtts://",
            ),
            (
                "{kind: mqtt, endpoint: \"mqtts://b\"}".to_owned(),
                "transport.caFile",
                "required for a mqtts:// endpoint",
            ),
            (
                format!("{{{https}, caFile: {missing}}}"),
                "transport.caFile",
                "reading",
            ),
            (
                format!("{{{https}, caFile: {key}}}"),
                "transport.caFile",
                "no PEM CERTIFICATE",
            ),
            (
                format!("{{{https}, caFile: {ca}, certFile: {key}, keyFile: {key}}}"),
                "transport.certFile",
                "no PEM CERTIFICATE",
            ),
            (
                format!("{{{https}, caFile: {ca}, certFile: {cert}, keyFile: {cert}}}"),
                "transport.keyFile",
                "private key",
            ),
            (
                format!("{{{https}, caFile: {not_der}}}"),
                "transport.caFile",
                "unusable for TLS: CA: not a usable CA certificate",
            ),
        ];
        for (transport, field, words) in cases {
            let err = AgentConfig::from_yaml(&format!("{MINIMAL}transport: {transport}\n"))
                .unwrap_err()
                .to_string();
            assert!(
                (err.starts_with(&format!("{field}: ")) || err.contains(&format!("\n- {field}: ")))
                    && err.contains(words),
                "{transport}: {err}"
            );
        }
    }

    /// The fields `yaml` is refused for, sorted, and the error.
    fn refused_fields(yaml: &str) -> (Vec<String>, ConfigError) {
        let err = AgentConfig::from_yaml(yaml).unwrap_err();
        let ConfigError::Invalid(fields) = &err else {
            panic!("{err}");
        };
        let mut names: Vec<String> = fields.iter().map(|f| f.field.clone()).collect();
        names.sort_unstable();
        (names, err)
    }

    #[test]
    fn health_condition_fields() {
        let c = AgentConfig::from_yaml(&format!(
            "{MINIMAL}systemMemoryContentionThreshold: 0.25\nsystemDiskContentionThreshold: 0\nthermalLimitCelsius: 75\nclockSyncCondition: false\nunderVoltageCondition: false\n"
        ))
        .unwrap();
        assert_eq!(
            c.health,
            HealthSettings {
                system_memory_contention_threshold: 0.25,
                system_disk_contention_threshold: 0.0,
                thermal_limit_celsius: Some(75.0),
                clock_sync: false,
                under_voltage: false,
                ..HealthSettings::default()
            }
        );
        let (names, err) = refused_fields(&format!(
            "{MINIMAL}systemMemoryContentionThreshold: 10\nthermalLimitCelsius: -3\nthermalCondition: maybe\n"
        ));
        assert_eq!(
            names,
            [
                "systemMemoryContentionThreshold",
                "thermalCondition",
                "thermalLimitCelsius"
            ],
            "{err}"
        );
        assert!(err.to_string().contains("between 0 (off) and 1"), "{err}");
    }

    /// A file with several mistakes names every one in a single error: type errors and
    /// unknown fields (top level and inside transport) as well as invalid values.
    #[test]
    fn every_invalid_field_is_reported_at_once() {
        let (names, err) = refused_fields(
            "apiVersion: v1\nkind: AgentConfiguration\nmaxPods: many\nnodeStatusUpdateFrequncy: 10s\nnodeLeaseDurationSeconds: -5\nnodeIP: 127.0.0.1\ntransport: {kind: mqtt, endpoint: \"mqtt://b:1883\", keepalive: 1s, usernam: u, topicPrefix: \"a/#\"}\n",
        );
        assert_eq!(
            names,
            [
                "apiVersion",
                "maxPods",
                "nodeIP",
                "nodeLeaseDurationSeconds",
                "nodeStatusUpdateFrequncy",
                "transport.keepalive",
                "transport.topicPrefix",
                "transport.usernam",
            ]
        );
        let text = err.to_string();
        assert!(
            text.starts_with("8 invalid fields in the agent configuration:\n- "),
            "{text}"
        );
        assert!(
            !text.contains("line 1 column"),
            "no positions of the one-field documents: {text}"
        );
        // One mistake reads as before: `field: message`.
        let one = AgentConfig::from_yaml(&format!("{MINIMAL}maxPods: many\n"))
            .unwrap_err()
            .to_string();
        assert!(one.starts_with("maxPods: "), "{one}");
    }

    #[test]
    fn healthz_bind_address_is_off_by_default_and_parses_ip_port() {
        assert_eq!(AgentConfig::default().healthz_bind_address, None);
        let c = AgentConfig::from_yaml(&format!("{MINIMAL}healthzBindAddress: 127.0.0.1:10248\n"))
            .unwrap();
        assert_eq!(
            c.healthz_bind_address,
            Some("127.0.0.1:10248".parse().unwrap())
        );
        let c = AgentConfig::from_yaml(&format!("{MINIMAL}healthzBindAddress: \"[::]:9100\"\n"))
            .unwrap();
        assert_eq!(c.healthz_bind_address, Some("[::]:9100".parse().unwrap()));
        let err = parse_bind_address("0.0.0.0:0").unwrap_err();
        assert!(err.contains("port 0"), "{err}");
    }

    #[test]
    fn go_durations() {
        let cases = [
            ("10s", 10.0),
            ("5m", 300.0),
            ("1m30s", 90.0),
            ("1.5h", 5400.0),
            ("300ms", 0.3),
            ("0", 0.0),
            ("2h45m", 9900.0),
        ];
        for (text, secs) in cases {
            assert_eq!(
                parse_duration(text).unwrap(),
                Duration::from_secs_f64(secs),
                "{text}"
            );
        }
        for bad in ["", "10", "s", "10x", "-1s", "1m-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
