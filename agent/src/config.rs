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
//! Unknown fields are rejected; every error names the field and how to fix it. Defaults
//! are kubelet's (`pkg/kubelet/apis/config/v1beta1/defaults.go`).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::quantity::{Amount, parse_amount, parse_millicores};

/// `apiVersion` the agent accepts.
pub const API_VERSION: &str = "edgebeat.io/v1alpha1";
/// `kind` the agent accepts.
pub const KIND: &str = "AgentConfiguration";

/// Largest configuration file [`AgentConfig::load`] reads, bytes (1 MiB): a real one is a
/// few hundred bytes; a wrong path such as `/dev/zero` fails at once instead of hanging.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1024 * 1024;
/// Largest `transport.passwordFile`, bytes (4 KiB): a password or token, not a document.
pub const MAX_PASSWORD_FILE_BYTES: u64 = 4 * 1024;
/// Largest `transport.caFile`, `certFile` or `keyFile`, bytes (1 MiB): room for a large CA
/// bundle (the whole Mozilla root store is about 220 KiB of PEM).
pub const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

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
    /// A field has a value the agent cannot use.
    #[error("{field}: {message}")]
    Invalid {
        /// The field's path, e.g. `transport.endpoint` or `evictionHard["memory.available"]`.
        field: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// The eviction signals kubelet knows (`pkg/kubelet/eviction/api/types.go`).
pub const EVICTION_SIGNALS: [&str; 6] = [
    "memory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "pid.available",
];

/// A registration taint (core/v1 Taint), applied once when the Node is created.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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
        /// `transport.keepalive`: HTTP/2 keepalive ping interval (default 30 s).
        keepalive: Duration,
    },
    /// MQTT 5 through a broker (`transport.kind: mqtt`).
    Mqtt(MqttTransport),
}

/// TLS material of a transport on an `https://` (gRPC) or `mqtts://` (MQTT) endpoint, read and parsed at load
/// (`transport.caFile`, `transport.certFile`, `transport.keyFile`). Certificates are not
/// reloaded: after rotating the files, restart the agent.
#[derive(Clone, PartialEq, Eq)]
pub struct TransportTls {
    /// PEM CA certificate(s) from `transport.caFile`: the server's (gateway's, broker's)
    /// certificate must chain to one of them and name the endpoint's host.
    pub ca_pem: Vec<u8>,
    /// PEM certificate chain (`transport.certFile`) and private key (`transport.keyFile`)
    /// presented to the gateway, when both are set.
    pub client: Option<ClientCertificate>,
}

/// A client certificate and its key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    /// PEM certificate chain, leaf first (`transport.certFile`).
    pub cert_pem: Vec<u8>,
    /// PEM private key (`transport.keyFile`).
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TransportTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportTls")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("client", &self.client)
            .finish()
    }
}

impl std::fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &format_args!("<redacted>"))
            .finish()
    }
}

/// MQTT settings (`transport.kind: mqtt`).
#[derive(Debug, Clone, PartialEq)]
pub struct MqttTransport {
    /// Broker host, from `transport.endpoint` (`mqtt://host:port`, port default 1883).
    pub host: String,
    /// Broker port.
    pub port: u16,
    /// `transport.clientID` (default `edgebeat-agent-<nodeName>`).
    pub client_id: Option<String>,
    /// `transport.username` and the contents of `transport.passwordFile` (trailing newline
    /// removed), read at load.
    pub credentials: Option<(String, String)>,
    /// `transport.topicPrefix` (default `edgebeat/v1`).
    pub topic_prefix: String,
    /// `transport.keepalive`: MQTT keep alive (default 30 s, at least 5 s).
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
    pub eviction_hard: BTreeMap<String, Amount>,
    /// `evictionPressureTransitionPeriod`: how long a pressure condition is held after the
    /// signal last crossed its threshold (default 5 min).
    pub eviction_pressure_transition_period: Duration,
    /// `systemReserved`: resource → amount subtracted from allocatable (cpu in millicores,
    /// others in bytes / count).
    pub system_reserved: BTreeMap<String, u64>,
    /// `kubeReserved`: as `systemReserved`.
    pub kube_reserved: BTreeMap<String, u64>,
    /// `maxPods` (default 110).
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
    pub transport_tls: Option<TransportTls>,
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
            system_reserved: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            max_pods: 110,
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
pub fn default_eviction_hard() -> BTreeMap<String, Amount> {
    BTreeMap::from([
        (
            "memory.available".to_owned(),
            Amount::Absolute(100 * 1024 * 1024),
        ),
        ("nodefs.available".to_owned(), Amount::Percentage(0.1)),
        ("nodefs.inodesFree".to_owned(), Amount::Percentage(0.05)),
        ("imagefs.available".to_owned(), Amount::Percentage(0.15)),
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
        let raw: RawConfig =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        Self::validate(raw)
    }

    fn validate(raw: RawConfig) -> Result<Self, ConfigError> {
        let mut c = AgentConfig::default();
        match raw.api_version.as_deref() {
            Some(API_VERSION) => {}
            other => {
                return Err(invalid(
                    "apiVersion",
                    format!("got {other:?}; set apiVersion: {API_VERSION}"),
                ));
            }
        }
        match raw.kind.as_deref() {
            Some(KIND) => {}
            other => return Err(invalid("kind", format!("got {other:?}; set kind: {KIND}"))),
        }
        if let Some(name) = raw.node_name.filter(|n| !n.is_empty()) {
            validate_node_name(&name).map_err(|m| invalid("nodeName", m))?;
            c.node_name = Some(name);
        }
        if let Some(v) = raw.node_status_update_frequency {
            let d = parse_positive_duration("nodeStatusUpdateFrequency", &v)?;
            c.node_status_update_frequency = d;
            // kubelet: the report period follows an explicitly set update period.
            c.node_status_report_frequency = d;
        }
        if let Some(v) = raw.node_status_report_frequency {
            c.node_status_report_frequency =
                parse_positive_duration("nodeStatusReportFrequency", &v)?;
        }
        if let Some(v) = raw.node_lease_duration_seconds {
            c.node_lease_duration_seconds =
                u32::try_from(v).ok().filter(|v| *v > 0).ok_or_else(|| {
                    invalid(
                        "nodeLeaseDurationSeconds",
                        format!("got {v}; must be a positive number of seconds, e.g. 40"),
                    )
                })?;
        }
        c.register_node = raw.register_node.unwrap_or(true);
        c.register_schedulable = raw.register_schedulable.unwrap_or(true);
        if let Some(taints) = raw.register_with_taints {
            for (i, t) in taints.iter().enumerate() {
                if !matches!(
                    t.effect.as_str(),
                    "NoSchedule" | "PreferNoSchedule" | "NoExecute"
                ) {
                    return Err(invalid(
                        format!("registerWithTaints[{i}].effect"),
                        format!(
                            "got {:?}; use NoSchedule, PreferNoSchedule or NoExecute",
                            t.effect
                        ),
                    ));
                }
                if t.key.is_empty() {
                    return Err(invalid(
                        format!("registerWithTaints[{i}].key"),
                        "must not be empty",
                    ));
                }
            }
            c.register_with_taints = taints;
        }
        if let Some(labels) = raw.node_labels {
            c.node_labels = labels;
        }
        if let Some(hard) = raw.eviction_hard {
            // kubelet: setting any evictionHard key drops the other defaults.
            c.eviction_hard = BTreeMap::new();
            for (signal, value) in hard {
                let field = format!("evictionHard[{signal:?}]");
                if !EVICTION_SIGNALS.contains(&signal.as_str()) {
                    return Err(invalid(
                        field,
                        format!("unknown signal; use one of {}", EVICTION_SIGNALS.join(", ")),
                    ));
                }
                let amount =
                    parse_amount(&value, true).map_err(|e| invalid(&field, e.to_string()))?;
                c.eviction_hard.insert(signal, amount);
            }
        }
        if let Some(v) = raw.eviction_pressure_transition_period {
            c.eviction_pressure_transition_period =
                parse_duration(&v).map_err(|m| invalid("evictionPressureTransitionPeriod", m))?;
            if c.eviction_pressure_transition_period > MAX_DURATION {
                return Err(invalid(
                    "evictionPressureTransitionPeriod",
                    format!("{v:?} must be at most 24h"),
                ));
            }
        }
        c.system_reserved = parse_reserved("systemReserved", raw.system_reserved)?;
        c.kube_reserved = parse_reserved("kubeReserved", raw.kube_reserved)?;
        if let Some(v) = raw.max_pods {
            c.max_pods = u32::try_from(v).ok().filter(|v| *v > 0).ok_or_else(|| {
                invalid("maxPods", format!("got {v}; must be positive, e.g. 110"))
            })?;
        }
        if let Some(v) = raw.pods_per_core {
            c.pods_per_core = u32::try_from(v).map_err(|_| {
                invalid(
                    "podsPerCore",
                    format!("got {v}; must be 0 (off) or positive"),
                )
            })?;
        }
        if let Some(ip) = raw.node_ip {
            let parsed: IpAddr = ip
                .parse()
                .map_err(|_| invalid("nodeIP", format!("{ip:?} is not an IP address")))?;
            if parsed.is_loopback()
                || parsed.is_multicast()
                || parsed.is_unspecified()
                || is_link_local(&parsed)
            {
                return Err(invalid(
                    "nodeIP",
                    format!(
                        "{ip} is loopback, link-local, multicast or unspecified; use the node's own address (kubelet validateNodeIP)"
                    ),
                ));
            }
            c.node_ip = Some(parsed);
        }
        if let Some(p) = raw.host_root {
            c.host_root = p;
        }
        if let Some(p) = raw.root_dir {
            if !p.is_absolute() {
                return Err(invalid(
                    "rootDir",
                    "must be an absolute path on the host, e.g. /var/lib/kubelet",
                ));
            }
            c.root_dir = p;
        }
        if let Some(p) = raw.image_fs_dir {
            if !p.is_absolute() {
                return Err(invalid(
                    "imageFsDir",
                    "must be an absolute path on the host",
                ));
            }
            c.image_fs_dir = Some(p);
        }
        if let Some(t) = raw.transport {
            let (transport, tls) = validate_transport(t)?;
            c.transport = Some(transport);
            c.transport_tls = tls;
        }
        if let Some(a) = raw.healthz_bind_address {
            c.healthz_bind_address =
                Some(parse_bind_address(&a).map_err(|m| invalid("healthzBindAddress", m))?);
        }
        Ok(c)
    }

    /// Lease renew interval: `nodeLeaseDurationSeconds` × 0.25 (kubelet
    /// `nodeLeaseRenewIntervalFraction`), 10 s by default.
    pub fn lease_renew_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.node_lease_duration_seconds) * 250)
    }
}

fn validate_transport(
    t: RawTransport,
) -> Result<(TransportConfig, Option<TransportTls>), ConfigError> {
    let keepalive = match &t.keepalive {
        Some(v) => parse_positive_duration("transport.keepalive", v)?,
        None => Duration::from_secs(30),
    };
    let endpoint = |example: &str| {
        t.endpoint.clone().ok_or_else(|| {
            invalid(
                "transport.endpoint",
                format!(
                    "required for kind: {}, e.g. {example}",
                    t.kind.as_deref().unwrap_or("")
                ),
            )
        })
    };
    match t.kind.as_deref() {
        Some("grpc") => {
            for (field, set) in [
                ("transport.clientID", t.client_id.is_some()),
                ("transport.username", t.username.is_some()),
                ("transport.passwordFile", t.password_file.is_some()),
                ("transport.topicPrefix", t.topic_prefix.is_some()),
            ] {
                if set {
                    return Err(invalid(
                        field,
                        "only valid with kind: mqtt; remove it or set kind: mqtt",
                    ));
                }
            }
            let endpoint = endpoint("http://gateway.example:7443")?;
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err(invalid(
                    "transport.endpoint",
                    format!("{endpoint:?} must start with http:// or https:// for kind: grpc"),
                ));
            }
            let tls = validate_tls(&endpoint, "https://", t.ca_file, t.cert_file, t.key_file)?;
            Ok((
                TransportConfig::Grpc {
                    endpoint,
                    keepalive,
                },
                tls,
            ))
        }
        Some("mqtt") => {
            let url = endpoint("mqtt://broker.example:1883")?;
            let edgebeat_transports::endpoint::MqttEndpoint { host, port, .. } =
                url.parse().map_err(|m| invalid("transport.endpoint", m))?;
            let tls = validate_tls(&url, "mqtts://", t.ca_file, t.cert_file, t.key_file)?;
            #[cfg(feature = "mqtt-tls")]
            if let Some(client) = tls.as_ref().and_then(|t| t.client.as_ref()) {
                edgebeat_transports::signing::MessageSigner::from_pem(
                    &client.cert_pem,
                    &client.key_pem,
                )
                .map_err(|e| {
                    invalid(
                        "transport.keyFile",
                        format!("cannot sign MQTT messages with it: {e}"),
                    )
                })?;
            }
            #[cfg(not(feature = "mqtt-tls"))]
            if tls.is_some() {
                return Err(invalid(
                    "transport.endpoint",
                    "this build has no MQTT TLS support (feature mqtt-tls); use mqtt:// or an agent built with TLS",
                ));
            }
            if keepalive < Duration::from_secs(5) {
                return Err(invalid(
                    "transport.keepalive",
                    "must be at least 5s for MQTT",
                ));
            }
            let credentials = match (t.username, t.password_file) {
                (None, None) => None,
                (Some(user), Some(file)) => {
                    let password = edgebeat_hw::read_bounded(&file, MAX_PASSWORD_FILE_BYTES)
                        .map_err(|e| invalid("transport.passwordFile", e.to_string()))?;
                    let password = String::from_utf8(password).map_err(|e| {
                        invalid(
                            "transport.passwordFile",
                            format!(
                                "{}: not UTF-8 text ({e}); the password must be UTF-8",
                                file.display()
                            ),
                        )
                    })?;
                    Some((user, password.trim_end_matches(['\r', '\n']).to_owned()))
                }
                (Some(_), None) => {
                    return Err(invalid(
                        "transport.passwordFile",
                        "required when transport.username is set",
                    ));
                }
                (None, Some(_)) => {
                    return Err(invalid(
                        "transport.username",
                        "required when transport.passwordFile is set",
                    ));
                }
            };
            let topic_prefix = t.topic_prefix.unwrap_or_else(|| "edgebeat/v1".to_owned());
            if topic_prefix.is_empty()
                || topic_prefix.contains(['+', '#'])
                || topic_prefix.starts_with('$')
                || topic_prefix.ends_with('/')
            {
                return Err(invalid(
                    "transport.topicPrefix",
                    format!(
                        "{topic_prefix:?} must be a plain topic path without wildcards, leading $ or trailing /, e.g. edgebeat/v1"
                    ),
                ));
            }
            if let Some(id) = &t.client_id
                && (id.is_empty() || id.len() > 256)
            {
                return Err(invalid("transport.clientID", "must be 1 to 256 characters"));
            }
            Ok((
                TransportConfig::Mqtt(MqttTransport {
                    host,
                    port,
                    client_id: t.client_id,
                    credentials,
                    topic_prefix,
                    keepalive,
                }),
                tls,
            ))
        }
        Some(other) => Err(invalid(
            "transport.kind",
            format!("{other:?} is not a transport; use grpc or mqtt"),
        )),
        None => Err(invalid("transport.kind", "required; use grpc or mqtt")),
    }
}

/// `transport.caFile`/`certFile`/`keyFile`: with an endpoint on `secure_scheme`
/// (`https://` for gRPC, `mqtts://` for MQTT) the CA is required and cert and key go
/// together; on a plain endpoint none is allowed. Each file is read and parsed now, so a bad
/// file is reported at load with its field.
fn validate_tls(
    endpoint: &str,
    secure_scheme: &str,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
) -> Result<Option<TransportTls>, ConfigError> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    if !endpoint.starts_with(secure_scheme) {
        for (field, set) in [
            ("transport.caFile", ca_file.is_some()),
            ("transport.certFile", cert_file.is_some()),
            ("transport.keyFile", key_file.is_some()),
        ] {
            if set {
                return Err(invalid(
                    field,
                    format!(
                        "only valid with a {secure_scheme} endpoint, but transport.endpoint is {endpoint:?}; use {secure_scheme} or remove it"
                    ),
                ));
            }
        }
        return Ok(None);
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
    let ca_file = ca_file.ok_or_else(|| {
        invalid(
            "transport.caFile",
            format!("required for a {secure_scheme} endpoint: the PEM CA certificate that signed the server's certificate"),
        )
    })?;
    let ca_pem = certificates("transport.caFile", &ca_file)?;
    let client = match (cert_file, key_file) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            let cert_pem = certificates("transport.certFile", &cert)?;
            let key_pem = read("transport.keyFile", &key)?;
            PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                invalid(
                    "transport.keyFile",
                    format!(
                        "{}: no usable PEM private key (PKCS#8, RSA or EC): {e}",
                        key.display()
                    ),
                )
            })?;
            Some(ClientCertificate { cert_pem, key_pem })
        }
        (Some(_), None) => {
            return Err(invalid(
                "transport.keyFile",
                "required when transport.certFile is set (the client certificate's private key)",
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                "transport.certFile",
                "required when transport.keyFile is set (the client certificate)",
            ));
        }
    };
    Ok(Some(TransportTls { ca_pem, client }))
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

fn parse_reserved(
    field: &str,
    map: Option<BTreeMap<String, String>>,
) -> Result<BTreeMap<String, u64>, ConfigError> {
    let mut out = BTreeMap::new();
    for (resource, value) in map.unwrap_or_default() {
        let f = format!("{field}[{resource:?}]");
        let v = match resource.as_str() {
            "cpu" => parse_millicores(&value).map_err(|e| invalid(&f, e.to_string()))?,
            "memory" | "ephemeral-storage" | "pid" => {
                match parse_amount(&value, false).map_err(|e| invalid(&f, e.to_string()))? {
                    Amount::Absolute(v) => v,
                    Amount::Percentage(_) => {
                        return Err(invalid(&f, "percentages are not allowed here"));
                    }
                }
            }
            _ => {
                return Err(invalid(
                    &f,
                    "unknown resource; use cpu, memory, ephemeral-storage or pid",
                ));
            }
        };
        out.insert(resource, v);
    }
    Ok(out)
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// Checks a Node name: a DNS-1123 subdomain (lower-case alphanumerics, `-` and `.`, at most
/// 253 characters, starting and ending alphanumeric), as the apiserver validates it.
///
/// Errors: a message saying what is wrong.
pub fn validate_node_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.is_empty()
        || name.len() > 253
        || !name.chars().all(ok_char)
        || !edge_ok(name.chars().next())
        || !edge_ok(name.chars().last())
    {
        return Err(format!(
            "{name:?} is not a valid node name: use lower-case letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters"
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
        assert_eq!(c.eviction_hard["pid.available"], Amount::Percentage(0.1));
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
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let node_key = rcgen::KeyPair::generate().unwrap();
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
                    .is_some_and(|t| t.client.is_some()),
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
        let client = tls.client.unwrap();
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
        assert_eq!(c.transport_tls.unwrap().client, None);
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
        assert!(c.transport_tls.unwrap().client.is_some());
        // A key that cannot sign compactly is refused at load, naming the field.
        let p384 = dir.path().join("p384.key");
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        std::fs::write(&p384, key.serialize_pem()).unwrap();
        let err = AgentConfig::from_yaml(&yaml(&p384))
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
        ];
        for (transport, field, words) in cases {
            let err = AgentConfig::from_yaml(&format!("{MINIMAL}transport: {transport}\n"))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(&format!("{field}: ")) && err.contains(words),
                "{transport}: {err}"
            );
        }
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
