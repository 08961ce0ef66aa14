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
//! the broker is a third party; the gateway verifies the signature against the site CA, and
//! the agent takes only answers the gateway signed, verified against `caFile` or, when the
//! broker's CA is another, `gatewayCAFile` (the site CA).
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

mod error;
mod eviction;
pub(crate) mod health;
mod transport;
mod values;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use edgebeat_proto::registration;
use serde::Deserialize;

use crate::quantity::{Amount, parse_amount};
use health::HealthSettings;

pub use edgebeat_proto::registration::{CONTAINER_RUNTIME_LABEL, DEFAULT_LABEL_KEYS};

/// Default `transport.keepalive` for gRPC: 5 min, the one the gRPC uplink defaults to too
/// (see the constant's own docs for why).
pub use edgebeat_transports::endpoint::GRPC_AGENT_KEEPALIVE as GRPC_KEEPALIVE;

/// Default `transport.keepalive` for MQTT: 30 min, the one the MQTT uplink defaults to too
/// (see the constant's own docs for why).
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

pub use edgebeat_proto::registration::NodeName;
pub use error::{ConfigError, FieldError};
use error::{Problems, field_message, got};
pub use eviction::{EvictionSignal, UnknownSignal};
#[cfg(feature = "grpc")]
pub use transport::GrpcUplinkOptions;
#[cfg(feature = "mqtt")]
pub use transport::MqttUplinkOptions;
pub use transport::{ClientTls, TlsIdentity, TransportConfig};
use transport::{RawTransport, validate_transport};
use values::{
    AbsolutePath, BindAddress, HoldPeriod, LeaseSeconds, MaxPods, NodeIp, NodeNameField, Period,
    PodsPerCore, parse_reserved,
};
pub use values::{MAX_DURATION, ValueError, parse_bind_address, parse_duration, parse_node_name};

pub use edgebeat_proto::registration::TaintEffect;

/// A registration taint (core/v1 Taint), applied once when the Node is created. Serialized
/// (the agent's `/view`) with the effect in the API's spelling.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Taint {
    /// Taint key, e.g. `example.com/edge`.
    pub key: String,
    /// Taint value (may be empty).
    pub value: String,
    /// What the taint does to pods without a toleration.
    #[serde(serialize_with = "serialize_effect")]
    pub effect: TaintEffect,
}

fn serialize_effect<S: serde::Serializer>(effect: &TaintEffect, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(effect.as_str())
}

/// `registerWithTaints[i]` as written, checked into a [`Taint`] by [`AgentConfig::validate`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTaint {
    key: String,
    #[serde(default)]
    value: String,
    effect: String,
}

/// The validated agent configuration. Durations are parsed, quantities resolved to typed
/// values, defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// `nodeName`; the host's hostname (lower-cased) when unset or empty.
    pub node_name: Option<NodeName>,
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
    /// `transport`: how heartbeats reach the gateway, with its TLS. Required unless running
    /// `--once`.
    pub transport: Option<TransportConfig>,
    /// Node certificates the agent enrolls for and rotates itself (`bootstrapTokenFile`
    /// set; see [`ManagedCertificates`]); `None` when the transport's `certFile`/`keyFile`
    /// are made by hand.
    pub certificates: Option<ManagedCertificates>,
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
            certificates: None,
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
    node_name: Option<NodeNameField>,
    node_status_update_frequency: Option<Period>,
    node_status_report_frequency: Option<Period>,
    node_lease_duration_seconds: Option<LeaseSeconds>,
    register_node: Option<bool>,
    register_schedulable: Option<bool>,
    register_with_taints: Option<Vec<RawTaint>>,
    node_labels: Option<BTreeMap<String, String>>,
    eviction_hard: Option<BTreeMap<String, String>>,
    eviction_pressure_transition_period: Option<HoldPeriod>,
    // Floats are read as f64 and checked in `validate`: a non-finite one (`.nan`, `.inf`)
    // refused by a type would stop the field-by-field pass, which reads the document
    // untyped and refuses non-finite floats, from naming the field.
    system_memory_contention_threshold: Option<f64>,
    system_disk_contention_threshold: Option<f64>,
    readonly_filesystem_condition: Option<bool>,
    thermal_condition: Option<bool>,
    thermal_limit_celsius: Option<f64>,
    under_voltage_condition: Option<bool>,
    clock_sync_condition: Option<bool>,
    system_reserved: Option<BTreeMap<String, String>>,
    kube_reserved: Option<BTreeMap<String, String>>,
    max_pods: Option<MaxPods>,
    pods_per_core: Option<PodsPerCore>,
    #[serde(rename = "nodeIP")]
    node_ip: Option<NodeIp>,
    host_root: Option<PathBuf>,
    root_dir: Option<AbsolutePath>,
    image_fs_dir: Option<AbsolutePath>,
    transport: Option<RawTransport>,
    bootstrap_token_file: Option<AbsolutePath>,
    cert_dir: Option<AbsolutePath>,
    rotate_certificates: Option<bool>,
    healthz_bind_address: Option<BindAddress>,
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
        let check = |key: &str, value: serde_json::Value| {
            alone(serde_json::Map::from_iter([(key.to_owned(), value)]))
                .map(drop)
                .map_err(|e| field_message(&e.to_string()))
        };
        let mut p = Problems::default();
        let mut good = serde_json::Map::new();
        for (key, value) in fields {
            if check(&key, value.clone()).is_ok() {
                good.insert(key, value);
                continue;
            }
            if key == "transport" {
                // Tagged on `kind`: its fields are checked with their kind.
                let kept = transport::name_bad_fields(&mut p, value, |v| check(&key, v));
                good.extend(kept.map(|kept| (key, kept)));
                continue;
            }
            // A mapping (a map of quantities, labels): name its bad entries one by one too.
            // The good ones are still validated, the bad ones reported.
            let mut named = false;
            if let serde_json::Value::Object(inner) = &value {
                let mut kept = serde_json::Map::new();
                for (sub, v) in inner {
                    let nested = serde_json::Map::from_iter([(sub.clone(), v.clone())]);
                    match check(&key, serde_json::Value::Object(nested)) {
                        Ok(()) => {
                            kept.insert(sub.clone(), v.clone());
                        }
                        Err(m) => {
                            p.push(format!("{key}.{sub}"), m);
                            named = true;
                        }
                    }
                }
                if named {
                    good.insert(key.clone(), serde_json::Value::Object(kept));
                }
            }
            if !named && let Err(m) = check(&key, value) {
                p.push(key, m);
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

    /// Checks a whole document, section by section, into a config; every invalid field
    /// goes into one [`ConfigError::Invalid`]. Scalars were checked by their types
    /// (values.rs) as serde read them.
    fn validate(raw: RawConfig) -> Result<Self, ConfigError> {
        let mut p = Problems::default();
        let mut c = AgentConfig::default();
        check_type_meta(&mut p, raw.api_version.as_deref(), raw.kind.as_deref());
        c.node_name = raw.node_name.and_then(|n| n.0);
        if let Some(Period(d)) = raw.node_status_update_frequency {
            c.node_status_update_frequency = d;
            // kubelet: the report period follows an explicitly set update period.
            c.node_status_report_frequency = d;
        }
        if let Some(Period(d)) = raw.node_status_report_frequency {
            c.node_status_report_frequency = d;
        }
        if let Some(LeaseSeconds(v)) = raw.node_lease_duration_seconds {
            c.node_lease_duration_seconds = v;
        }
        c.register_node = raw.register_node.unwrap_or(true);
        c.register_schedulable = raw.register_schedulable.unwrap_or(true);
        if let Some(taints) = raw.register_with_taints {
            c.register_with_taints = registration_taints(&mut p, taints);
        }
        if let Some(labels) = raw.node_labels {
            check_node_labels(&mut p, &labels);
            c.node_labels = labels;
        }
        if let Some(hard) = raw.eviction_hard {
            c.eviction_hard = eviction_hard(&mut p, hard);
        }
        if let Some(HoldPeriod(d)) = raw.eviction_pressure_transition_period {
            c.eviction_pressure_transition_period = d;
        }
        c.health = health(
            &mut p,
            RawHealth {
                system_memory_contention_threshold: raw.system_memory_contention_threshold,
                system_disk_contention_threshold: raw.system_disk_contention_threshold,
                readonly_filesystem_condition: raw.readonly_filesystem_condition,
                thermal_condition: raw.thermal_condition,
                thermal_limit_celsius: raw.thermal_limit_celsius,
                under_voltage_condition: raw.under_voltage_condition,
                clock_sync_condition: raw.clock_sync_condition,
            },
        );
        c.system_reserved = parse_reserved(&mut p, "systemReserved", raw.system_reserved);
        c.kube_reserved = parse_reserved(&mut p, "kubeReserved", raw.kube_reserved);
        if let Some(MaxPods(v)) = raw.max_pods {
            c.max_pods = v;
        }
        if let Some(PodsPerCore(v)) = raw.pods_per_core {
            c.pods_per_core = v;
        }
        c.node_ip = raw.node_ip.map(|NodeIp(ip)| ip);
        if let Some(path) = raw.host_root {
            c.host_root = path;
        }
        if let Some(AbsolutePath(path)) = raw.root_dir {
            c.root_dir = path;
        }
        c.image_fs_dir = raw.image_fs_dir.map(|AbsolutePath(path)| path);
        let managed = RawManaged {
            bootstrap_token_file: raw.bootstrap_token_file,
            cert_dir: raw.cert_dir,
            rotate_certificates: raw.rotate_certificates,
        };
        (c.transport, c.certificates) =
            transport_section(&mut p, raw.transport, managed, c.lease_renew_interval());
        c.healthz_bind_address = raw.healthz_bind_address.map(|BindAddress(a)| a);
        p.into_result(c)
    }

    /// Lease renew interval: `nodeLeaseDurationSeconds` × 0.25 (kubelet
    /// `nodeLeaseRenewIntervalFraction`), 10 s by default.
    pub fn lease_renew_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.node_lease_duration_seconds) * 250)
    }
}

/// Default `certDir` (kubelet's `--cert-dir` is `/var/lib/kubelet/pki`): edgebeat's own
/// state directory, `StateDirectory=edgebeat` in the systemd unit.
pub const DEFAULT_CERT_DIR: &str = "/var/lib/edgebeat/pki";

/// Node certificates the agent enrolls for with a bootstrap token and rotates before they
/// expire, as kubelet's TLS bootstrap and `rotateCertificates`
/// (`pkg/kubelet/certificate/bootstrap/bootstrap.go`, client-go
/// `util/certificate/certificate_manager.go`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedCertificates {
    /// `bootstrapTokenFile`: the file holding the bootstrap token
    /// (`<id>.<secret>.sha256:<CA hash>`, as `edgebeat-gateway token create` prints it).
    /// Read only while the node holds no usable certificate; it may be deleted after.
    pub bootstrap_token_file: PathBuf,
    /// `certDir` (kubelet's `--cert-dir`; default [`DEFAULT_CERT_DIR`]): where the
    /// certificate with its key and the site CA are kept.
    pub cert_dir: PathBuf,
    /// `rotateCertificates` (default true): ask for a new certificate, with a new key, at
    /// 70–90 % of the current one's lifetime or when the gateway says it is due.
    pub rotate_certificates: bool,
    /// `transport.enrollmentEndpoint` (gRPC only): the gateway's enrollment listener. MQTT
    /// requests go through the broker.
    pub enrollment_endpoint: Option<String>,
}

/// The raw fields of certificates the agent enrolls for and rotates.
struct RawManaged {
    bootstrap_token_file: Option<AbsolutePath>,
    cert_dir: Option<AbsolutePath>,
    rotate_certificates: Option<bool>,
}

/// `transport` (checked by [`validate_transport`] for a Lease renew interval of `renew`)
/// and the certificates the agent manages (`bootstrapTokenFile`, `certDir`,
/// `rotateCertificates`), which need each other: problems go to `p`.
fn transport_section(
    p: &mut Problems,
    transport: Option<RawTransport>,
    managed: RawManaged,
    renew: Duration,
) -> (Option<TransportConfig>, Option<ManagedCertificates>) {
    let enrolled = managed.bootstrap_token_file.is_some();
    if !enrolled && (managed.cert_dir.is_some() || managed.rotate_certificates.is_some()) {
        p.push(
            if managed.cert_dir.is_some() { "certDir" } else { "rotateCertificates" },
            "only valid with bootstrapTokenFile (certificates the agent enrolls for and rotates); add it, or remove this field",
        );
    }
    let Some(transport) = transport else {
        if enrolled {
            p.push(
                "bootstrapTokenFile",
                "needs transport: the enrollment goes to the gateway over it",
            );
        }
        return (None, None);
    };
    let Some((transport, endpoint)) = validate_transport(p, transport, renew, enrolled) else {
        return (None, None);
    };
    let certificates = managed_certificates(
        managed.bootstrap_token_file,
        managed.cert_dir,
        managed.rotate_certificates,
        endpoint,
    );
    (Some(transport), certificates)
}

/// `bootstrapTokenFile`, `certDir` and `rotateCertificates` with the enrollment endpoint
/// `transport` gave; `None` without a token file.
fn managed_certificates(
    token_file: Option<AbsolutePath>,
    cert_dir: Option<AbsolutePath>,
    rotate: Option<bool>,
    enrollment_endpoint: Option<String>,
) -> Option<ManagedCertificates> {
    let AbsolutePath(bootstrap_token_file) = token_file?;
    Some(ManagedCertificates {
        bootstrap_token_file,
        cert_dir: cert_dir.map_or_else(|| PathBuf::from(DEFAULT_CERT_DIR), |AbsolutePath(d)| d),
        rotate_certificates: rotate.unwrap_or(true),
        enrollment_endpoint,
    })
}

/// `apiVersion` and `kind` must be this file type's.
fn check_type_meta(p: &mut Problems, api_version: Option<&str>, kind: Option<&str>) {
    if api_version != Some(API_VERSION) {
        p.push(
            "apiVersion",
            format!("{}; set apiVersion: {API_VERSION}", got(api_version)),
        );
    }
    if kind != Some(KIND) {
        p.push("kind", format!("{}; set kind: {KIND}", got(kind)));
    }
}

/// `registerWithTaints`: at most [`registration::MAX_TAINTS`], each with a valid key, value
/// and effect; the ones with a valid effect are kept (so one bad key does not hide the
/// others' problems).
fn registration_taints(p: &mut Problems, taints: Vec<RawTaint>) -> Vec<Taint> {
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
    let mut checked = Vec::with_capacity(taints.len());
    for (i, t) in taints.into_iter().enumerate() {
        let effect = match t.effect.parse::<TaintEffect>() {
            Ok(effect) => Some(effect),
            Err(e) => {
                p.push(format!("registerWithTaints[{i}].effect"), e.to_string());
                None
            }
        };
        if let Err(e) = registration::check_key(&t.key) {
            p.push(format!("registerWithTaints[{i}].key"), e.to_string());
        }
        if let Err(e) = registration::check_value(&t.value) {
            p.push(format!("registerWithTaints[{i}].value"), e.to_string());
        }
        if let Some(effect) = effect {
            checked.push(Taint {
                key: t.key,
                value: t.value,
                effect,
            });
        }
    }
    checked
}

/// `nodeLabels`: valid keys and values, none the agent sets itself, none NodeRestriction
/// forbids a node, and at most [`registration::MAX_LABELS`] with the agent's own.
fn check_node_labels(p: &mut Problems, labels: &BTreeMap<String, String>) {
    if let Some(value) = labels.get(CONTAINER_RUNTIME_LABEL.0) {
        p.push(
            format!("nodeLabels[{:?}]", CONTAINER_RUNTIME_LABEL.0),
            format!(
                "got {value:?}; the agent always sets it to {:?} (an edgebeat node runs no containers); remove it",
                CONTAINER_RUNTIME_LABEL.1
            ),
        );
    }
    for (key, value) in labels {
        if let Err(e) = registration::check_label(key, value) {
            p.push(format!("nodeLabels[{key:?}]"), e.to_string());
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
}

/// `evictionHard`: signal → threshold. As kubelet, setting any key drops the other
/// defaults.
fn eviction_hard(
    p: &mut Problems,
    hard: BTreeMap<String, String>,
) -> BTreeMap<EvictionSignal, Amount> {
    let mut out = BTreeMap::new();
    for (name, value) in hard {
        let field = format!("evictionHard[{name:?}]");
        let signal = match name.parse::<EvictionSignal>() {
            Ok(signal) => signal,
            Err(e) => {
                p.push(field, e.to_string());
                continue;
            }
        };
        match parse_amount(&value, true) {
            Ok(amount) => {
                out.insert(signal, amount);
            }
            Err(e) => p.push(field, e.to_string()),
        }
    }
    out
}

/// The health conditions' fields as written ([`HealthSettings`]).
struct RawHealth {
    system_memory_contention_threshold: Option<f64>,
    system_disk_contention_threshold: Option<f64>,
    readonly_filesystem_condition: Option<bool>,
    thermal_condition: Option<bool>,
    thermal_limit_celsius: Option<f64>,
    under_voltage_condition: Option<bool>,
    clock_sync_condition: Option<bool>,
}

/// The health conditions' settings over their defaults; the floats are checked here (see
/// `RawConfig`).
fn health(p: &mut Problems, raw: RawHealth) -> HealthSettings {
    let mut health = HealthSettings::default();
    let thresholds = [
        (
            "systemMemoryContentionThreshold",
            raw.system_memory_contention_threshold,
            &mut health.system_memory_contention_threshold,
        ),
        (
            "systemDiskContentionThreshold",
            raw.system_disk_contention_threshold,
            &mut health.system_disk_contention_threshold,
        ),
    ];
    for (field, value, slot) in thresholds {
        if let Some(v) = value {
            match health::check_threshold(v) {
                Ok(v) => *slot = v,
                Err(m) => p.push(field, m.to_string()),
            }
        }
    }
    if let Some(v) = raw.thermal_limit_celsius {
        match health::check_thermal_limit(v) {
            Ok(v) => health.thermal_limit_celsius = Some(v),
            Err(m) => p.push("thermalLimitCelsius", m.to_string()),
        }
    }
    let switches = [
        (
            raw.readonly_filesystem_condition,
            &mut health.readonly_filesystem,
        ),
        (raw.thermal_condition, &mut health.thermal),
        (raw.under_voltage_condition, &mut health.under_voltage),
        (raw.clock_sync_condition, &mut health.clock_sync),
    ];
    for (value, slot) in switches {
        if let Some(v) = value {
            *slot = v;
        }
    }
    health
}

// The tests read configs of both transports, with TLS: the default build.
#[cfg(test)]
#[cfg(all(feature = "grpc-tls", feature = "mqtt-tls"))]
mod tests;
