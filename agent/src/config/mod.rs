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
mod load;
mod managed;
mod transport;
mod validate;
mod values;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::quantity::Amount;
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
pub use eviction::{EvictionSignal, UnknownSignal};
pub use managed::{DEFAULT_CERT_DIR, ManagedCertificates};
#[cfg(feature = "grpc")]
pub use transport::GrpcUplinkOptions;
#[cfg(feature = "mqtt")]
pub use transport::MqttUplinkOptions;
pub use transport::{ClientTls, TlsIdentity, TransportConfig};
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

impl AgentConfig {
    /// Lease renew interval: `nodeLeaseDurationSeconds` × 0.25 (kubelet
    /// `nodeLeaseRenewIntervalFraction`), 10 s by default.
    pub fn lease_renew_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.node_lease_duration_seconds) * 250)
    }
}

// The tests read configs of both transports, with TLS: the default build.
#[cfg(test)]
#[cfg(all(feature = "grpc-tls", feature = "mqtt-tls"))]
mod tests;
