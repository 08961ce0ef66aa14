//! The configuration file as written (`RawConfig`, read by serde) and its validation,
//! section by section, into an [`AgentConfig`]: every invalid field goes to one list.

use std::collections::BTreeMap;
use std::path::PathBuf;

use edgebeat_proto::registration;
use serde::Deserialize;

use super::error::{Problems, got};
use super::health::{self, HealthSettings};
use super::managed::{RawManaged, transport_section};
use super::transport::RawTransport;
use super::values::{
    AbsolutePath, BindAddress, HoldPeriod, LeaseSeconds, MaxPods, NodeIp, NodeNameField, Period,
    PodsPerCore, parse_reserved,
};
use super::{
    API_VERSION, AgentConfig, CONTAINER_RUNTIME_LABEL, ConfigError, DEFAULT_LABEL_KEYS,
    EvictionSignal, KIND, Taint, TaintEffect,
};
use crate::quantity::{Amount, parse_amount};

/// `registerWithTaints[i]` as written, checked into a [`Taint`] by [`AgentConfig::validate`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTaint {
    key: String,
    #[serde(default)]
    value: String,
    effect: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawConfig {
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
    /// Checks a whole document, section by section, into a config; every invalid field
    /// goes into one [`ConfigError::Invalid`]. Scalars were checked by their types
    /// (values.rs) as serde read them.
    pub(super) fn validate(raw: RawConfig) -> Result<Self, ConfigError> {
        let mut p = Problems::default();
        let mut c = AgentConfig::default();
        check_type_meta(&mut p, raw.api_version.as_deref(), raw.kind.as_deref());
        // Before any field is moved out of `raw`: `health` reads its own (Copy) fields.
        c.health = health(&mut p, &raw);
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

/// The health conditions' settings ([`HealthSettings`]) over their defaults, from their
/// fields of `raw` (`systemMemoryContentionThreshold`, `systemDiskContentionThreshold`,
/// `thermalLimitCelsius` and the `*Condition` switches); the floats are checked here (see
/// `RawConfig`).
fn health(p: &mut Problems, raw: &RawConfig) -> HealthSettings {
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
