//! What a node's registration may carry, as the apiserver and its NodeRestriction admission
//! plugin take it: one set of rules for the agent, which checks its `nodeName`,
//! `nodeLabels` and `registerWithTaints` when its config loads (as kubelet checks
//! `--node-labels` and `registerWithTaints` at start), and for the gateway, which checks
//! every [`Register`] before it writes anything (in service-account mode the apiserver's
//! NodeRestriction does not apply to the gateway).
//!
//! Sources:
//! - names and labels: `k8s.io/apimachinery/pkg/util/validation/validation.go`
//!   (`IsDNS1123Subdomain`, `IsQualifiedName`, `IsValidLabelValue`);
//! - labels a node may set: `plugin/pkg/admission/noderestriction/admission.go`
//!   (`getForbiddenLabels`) and `k8s.io/kubelet/pkg/apis/well_known_labels.go`
//!   (`IsKubeletLabel`); kubelet refuses other `kubernetes.io` labels at start
//!   (`cmd/kubelet/app/options/options.go: ValidateKubeletFlags`);
//! - taint effects: core/v1 `TaintEffect`.

use crate::Register;

/// Labels kubelet sets and may always set (`IsKubeletLabel`'s fixed list).
const KUBELET_LABELS: [&str; 11] = [
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];

/// Label namespaces a node may use freely (`kubeletLabelNamespaces`).
const KUBELET_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];

/// The label every edgebeat Node carries, `edgebeat.io/container-runtime: none`: no
/// container runtime runs its pods, so workloads and DaemonSets keep away with a node
/// affinity on it (the README has the snippet). `nodeLabels` cannot override it.
pub const CONTAINER_RUNTIME_LABEL: (&str, &str) = ("edgebeat.io/container-runtime", "none");

/// The labels the agent sets on every Node, in this order: kubelet's defaults
/// (`pkg/kubelet/kubelet_node_status.go: initialNode`: hostname, OS and architecture, and
/// their beta forms), then [`CONTAINER_RUNTIME_LABEL`]. `nodeLabels` may override all but
/// the last; the gateway reconciles them on an existing Node.
pub const DEFAULT_LABEL_KEYS: [&str; 6] = [
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    CONTAINER_RUNTIME_LABEL.0,
];

/// A taint's effect: core/v1 `TaintEffect` (`staging/src/k8s.io/api/core/v1/types.go`), the
/// three values the apiserver accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaintEffect {
    /// `NoSchedule`: no new pod without a toleration is scheduled here.
    NoSchedule,
    /// `PreferNoSchedule`: the scheduler avoids the node for pods without a toleration.
    PreferNoSchedule,
    /// `NoExecute`: pods without a toleration are also evicted.
    NoExecute,
}

impl TaintEffect {
    /// Every effect, in the API's order.
    pub const ALL: [Self; 3] = [Self::NoSchedule, Self::PreferNoSchedule, Self::NoExecute];

    /// The API's spelling, e.g. `NoSchedule`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

impl std::str::FromStr for TaintEffect {
    type Err = RegistrationError;

    /// Parses the API's spelling (case-sensitive, as the apiserver).
    ///
    /// Errors: [`RegistrationError::TaintEffect`]: `unknown effect "X"; use NoSchedule,
    /// PreferNoSchedule, NoExecute`.
    fn from_str(s: &str) -> Result<Self, RegistrationError> {
        Self::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| RegistrationError::TaintEffect {
                effect: s.to_owned(),
            })
    }
}

/// Why a Node name, label, taint or registration is refused, with the rule it breaks
/// (apimachinery's validation, `k8s.io/apimachinery/pkg/util/validation`, and
/// NodeRestriction's label rules). `Display` is the message for the operator's config error
/// or the agent's log, e.g. `label "Site": key "Site": the name must be …`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationError {
    /// Not a DNS-1123 subdomain ([`is_node_name`]).
    #[error(
        "{name:?} is not a valid node name: use lower-case letters, digits, '-' and '.', starting and ending with a letter or digit, at most {MAX_SUBDOMAIN_BYTES} characters"
    )]
    NodeName {
        /// The name refused.
        name: String,
    },
    /// A key's prefix before `/` is not a DNS-1123 subdomain.
    #[error(
        "key {key:?}: the prefix before '/' must be a DNS subdomain (lower-case letters, digits, '-' and '.', at most {MAX_SUBDOMAIN_BYTES} characters)"
    )]
    KeyPrefix {
        /// The key refused.
        key: String,
    },
    /// A key's name part is not 1 to 63 letters, digits, `-`, `_` and `.`.
    #[error(
        "key {key:?}: the name must be 1 to {MAX_LABEL_VALUE_BYTES} characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    )]
    KeyName {
        /// The key refused.
        key: String,
    },
    /// A value is neither empty nor at most 63 letters, digits, `-`, `_` and `.`.
    #[error(
        "value {value:?} must be empty or at most {MAX_LABEL_VALUE_BYTES} characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    )]
    Value {
        /// The value refused.
        value: String,
    },
    /// A taint effect other than [`TaintEffect::ALL`].
    #[error(
        "unknown effect {effect:?}; use {}",
        TaintEffect::ALL.map(TaintEffect::as_str).join(", ")
    )]
    TaintEffect {
        /// The effect refused.
        effect: String,
    },
    /// The label `key` is malformed (`source` says how).
    #[error("label {key:?}: {source}")]
    Label {
        /// The label's key.
        key: String,
        /// What is wrong with it.
        #[source]
        source: Box<RegistrationError>,
    },
    /// The taint `key` is malformed (`source` says how).
    #[error("taint {key:?}: {source}")]
    Taint {
        /// The taint's key.
        key: String,
        /// What is wrong with it.
        #[source]
        source: Box<RegistrationError>,
    },
    /// More than [`MAX_LABELS`] labels.
    #[error("too many labels: {count} > {MAX_LABELS}")]
    TooManyLabels {
        /// How many there were.
        count: usize,
    },
    /// More than [`MAX_TAINTS`] taints.
    #[error("too many taints: {count} > {MAX_TAINTS}")]
    TooManyTaints {
        /// How many there were.
        count: usize,
    },
    /// Labels a node may not set ([`forbidden_labels`]).
    #[error("forbidden labels (NodeRestriction): {}", keys.join(", "))]
    ForbiddenLabels {
        /// The forbidden keys, sorted.
        keys: Vec<String>,
    },
}

impl std::fmt::Display for TaintEffect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Most labels a registration may carry (kubelet sets six; sites add a few). Bounds the
/// work and the Node object a hostile agent can cause.
pub const MAX_LABELS: usize = 64;
/// Most taints a registration may carry.
pub const MAX_TAINTS: usize = 16;
/// Longest label value, and longest name part of a label key, in bytes (Kubernetes' limit).
pub const MAX_LABEL_VALUE_BYTES: usize = 63;
/// Longest DNS-1123 subdomain, in bytes: a Node name, or a label key's prefix.
pub const MAX_SUBDOMAIN_BYTES: usize = 253;

/// A Node name the apiserver accepts ([`is_node_name`]: a DNS-1123 subdomain), checked once
/// where it is read (a config file, a flag, a hostname, a message's header at the gateway's
/// door) and carried as this type after that. Shared, not copied: a clone is a reference
/// count (`Arc<str>`), so the gateway carries one name from its ingress to the apiserver
/// call without allocating per step.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeName(std::sync::Arc<str>);

/// As the name's `str` (`"edge-01"`), so logs and messages read the same as before it was
/// a type.
impl std::fmt::Debug for NodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl NodeName {
    /// `name` if it is a valid Node name ([`is_node_name`]).
    ///
    /// Errors: [`RegistrationError::NodeName`]: `"Edge_1" is not a valid node name: use
    /// lower-case letters, digits, '-' and '.', starting and ending with a letter or digit,
    /// at most 253 characters`.
    pub fn new(name: impl Into<String>) -> Result<Self, RegistrationError> {
        let name = name.into();
        if is_node_name(&name) {
            Ok(Self(name.into()))
        } else {
            Err(RegistrationError::NodeName { name })
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name, owned (a copy: the name itself may be shared).
    pub fn into_string(self) -> String {
        self.0.to_string()
    }
}

impl std::ops::Deref for NodeName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

/// A `HashMap<NodeName, _>` is looked up by `&str`: equality and hashing are the name's.
impl std::borrow::Borrow<str> for NodeName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for NodeName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for NodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for NodeName {
    type Err = RegistrationError;

    /// As [`NodeName::new`].
    fn from_str(s: &str) -> Result<Self, RegistrationError> {
        Self::new(s)
    }
}

impl TryFrom<String> for NodeName {
    type Error = RegistrationError;

    /// As [`NodeName::new`].
    fn try_from(s: String) -> Result<Self, RegistrationError> {
        Self::new(s)
    }
}

impl PartialEq<str> for NodeName {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for NodeName {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

/// A DNS-1123 subdomain (`IsDNS1123Subdomain`): at most 253 bytes of lower-case letters,
/// digits, `-` and `.`, starting and ending with a letter or digit. This is the rule for a
/// Node name, which the agent's config, the gateway and the certificate check share.
pub fn is_node_name(name: &str) -> bool {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.';
    let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    !name.is_empty()
        && name.len() <= MAX_SUBDOMAIN_BYTES
        && name.bytes().all(ok)
        && edge(name.as_bytes().first())
        && edge(name.as_bytes().last())
}

/// Letters, digits, `-`, `_` and `.`, starting and ending with a letter or digit: a label
/// value when not empty, and the name part of a qualified name.
fn is_label_token(s: &str) -> bool {
    let edge = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && edge(s.as_bytes().first())
        && edge(s.as_bytes().last())
}

/// Checks a label or taint key (`IsQualifiedName`): an optional DNS-1123 subdomain prefix
/// and `/`, then a name of 1 to 63 bytes of letters, digits, `-`, `_` and `.`, starting and
/// ending with a letter or digit.
///
/// Errors: [`RegistrationError::KeyPrefix`] or [`RegistrationError::KeyName`].
pub fn check_key(key: &str) -> Result<(), RegistrationError> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_node_name(prefix)
    {
        return Err(RegistrationError::KeyPrefix {
            key: key.to_owned(),
        });
    }
    if name.len() > MAX_LABEL_VALUE_BYTES || !is_label_token(name) {
        return Err(RegistrationError::KeyName {
            key: key.to_owned(),
        });
    }
    Ok(())
}

/// Checks a label or taint value (`IsValidLabelValue`): empty, or at most 63 bytes of
/// letters, digits, `-`, `_` and `.`, starting and ending with a letter or digit.
///
/// Errors: [`RegistrationError::Value`].
pub fn check_value(value: &str) -> Result<(), RegistrationError> {
    if value.is_empty() || (value.len() <= MAX_LABEL_VALUE_BYTES && is_label_token(value)) {
        Ok(())
    } else {
        Err(RegistrationError::Value {
            value: value.to_owned(),
        })
    }
}

fn namespace(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

fn in_namespace(ns: &str, domain: &str) -> bool {
    ns == domain
        || ns
            .strip_suffix(domain)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// kubelet's `IsKubeletLabel`: one of the labels kubelet computes, or any label in the
/// `kubelet.kubernetes.io` / `node.kubernetes.io` namespaces.
pub fn is_kubelet_label(key: &str) -> bool {
    KUBELET_LABELS.contains(&key)
        || KUBELET_NAMESPACES
            .iter()
            .any(|d| in_namespace(namespace(key), d))
}

/// NodeRestriction's `getForbiddenLabels`: labels under `node-restriction.kubernetes.io`,
/// and `kubernetes.io` / `k8s.io` labels that are not kubelet labels. Returns the forbidden
/// keys among `keys`, sorted.
pub fn forbidden_labels<'a>(keys: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = keys
        .into_iter()
        .filter(|key| {
            let ns = namespace(key);
            in_namespace(ns, "node-restriction.kubernetes.io")
                || ((in_namespace(ns, "kubernetes.io") || in_namespace(ns, "k8s.io"))
                    && !is_kubelet_label(key))
        })
        .collect();
    out.sort_unstable();
    out
}

/// Checks one label: its key ([`check_key`]) and value ([`check_value`]).
///
/// Errors: [`RegistrationError::Label`], naming the label and what is wrong.
pub fn check_label(key: &str, value: &str) -> Result<(), RegistrationError> {
    check_key(key)
        .and_then(|()| check_value(value))
        .map_err(|e| RegistrationError::Label {
            key: key.to_owned(),
            source: Box::new(e),
        })
}

/// Checks one taint: key ([`check_key`]), value ([`check_value`]) and effect
/// ([`TaintEffect`]).
///
/// Errors: [`RegistrationError::Taint`], naming the taint and what is wrong.
pub fn check_taint(key: &str, value: &str, effect: &str) -> Result<(), RegistrationError> {
    check_key(key)
        .and_then(|()| check_value(value))
        .and_then(|()| effect.parse::<TaintEffect>().map(|_| ()))
        .map_err(|e| RegistrationError::Taint {
            key: key.to_owned(),
            source: Box::new(e),
        })
}

/// Checks a registration: at most [`MAX_LABELS`] labels and [`MAX_TAINTS`] taints, each
/// label and taint well formed ([`check_label`], [`check_taint`]), no label a node may not
/// set ([`forbidden_labels`]).
///
/// Errors: the [`RegistrationError`] naming the offending label or taint, for the Ack and
/// the log.
pub fn validate_register(register: &Register) -> Result<(), RegistrationError> {
    if register.labels.len() > MAX_LABELS {
        return Err(RegistrationError::TooManyLabels {
            count: register.labels.len(),
        });
    }
    if register.taints.len() > MAX_TAINTS {
        return Err(RegistrationError::TooManyTaints {
            count: register.taints.len(),
        });
    }
    for (key, value) in &register.labels {
        check_label(key, value)?;
    }
    let forbidden = forbidden_labels(register.labels.keys().map(String::as_str));
    if !forbidden.is_empty() {
        return Err(RegistrationError::ForbiddenLabels {
            keys: forbidden.into_iter().map(str::to_owned).collect(),
        });
    }
    for t in &register.taints {
        check_taint(&t.key, &t.value, &t.effect)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "registration/tests.rs"]
mod tests;
