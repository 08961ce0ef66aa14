//! What a node may write, whatever the transport: the rules of the NodeRestriction
//! admission plugin (`plugin/pkg/admission/noderestriction/admission.go`) and kubelet's own
//! label rules (`k8s.io/kubelet/pkg/apis: IsKubeletLabel`), plus input limits and a
//! per-node rate limit. The gateway enforces them itself because in service-account mode
//! the apiserver's NodeRestriction does not apply to it.

use std::time::Duration;

use edgebeat_proto as pb;
use tokio::time::Instant;

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

/// Most labels and taints a registration may carry (kubelet sets five labels; sites add a
/// few). Bounds the work and the Node object a hostile agent can cause.
pub const MAX_LABELS: usize = 64;
/// Most taints a registration may carry.
pub const MAX_TAINTS: usize = 16;
/// Longest label or taint key accepted, in bytes (a DNS-1123 prefix of 253 + `/` + a
/// 63-byte name).
pub const MAX_KEY_BYTES: usize = 317;
/// Longest label or taint value, in bytes (Kubernetes' limit).
pub const MAX_VALUE_BYTES: usize = 63;
/// Longest free-text field in a status (condition message, nodeInfo fields), in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;
/// Most addresses or resource entries in a status.
pub const MAX_ENTRIES: usize = 32;

/// Checks a registration against NodeRestriction and the input limits: no forbidden
/// labels, at most [`MAX_LABELS`] labels and [`MAX_TAINTS`] taints, keys and values within
/// Kubernetes' lengths, taint effects Kubernetes knows.
///
/// Errors: a message naming the offending label or taint, for the Ack and the log.
pub fn validate_register(register: &pb::Register) -> Result<(), String> {
    if register.labels.len() > MAX_LABELS {
        return Err(format!(
            "too many labels: {} > {MAX_LABELS}",
            register.labels.len()
        ));
    }
    if register.taints.len() > MAX_TAINTS {
        return Err(format!(
            "too many taints: {} > {MAX_TAINTS}",
            register.taints.len()
        ));
    }
    for (key, value) in &register.labels {
        if key.is_empty() || key.len() > MAX_KEY_BYTES || value.len() > MAX_VALUE_BYTES {
            return Err(format!(
                "label {key:?} exceeds Kubernetes' key or value length"
            ));
        }
    }
    let forbidden = forbidden_labels(register.labels.keys().map(String::as_str));
    if !forbidden.is_empty() {
        return Err(format!(
            "forbidden labels (NodeRestriction): {}",
            forbidden.join(", ")
        ));
    }
    for t in &register.taints {
        if t.key.is_empty() || t.key.len() > MAX_KEY_BYTES || t.value.len() > MAX_VALUE_BYTES {
            return Err(format!(
                "taint {:?} exceeds Kubernetes' key or value length",
                t.key
            ));
        }
        if !matches!(
            t.effect.as_str(),
            "NoSchedule" | "PreferNoSchedule" | "NoExecute"
        ) {
            return Err(format!(
                "taint {:?} has unknown effect {:?}",
                t.key, t.effect
            ));
        }
    }
    Ok(())
}

/// Checks the sizes in a reported status: at most [`MAX_ENTRIES`] addresses and resource
/// entries each, text fields at most [`MAX_TEXT_BYTES`].
///
/// Errors: a message naming the oversized field.
pub fn validate_status_limits(status: &pb::NodeStatus) -> Result<(), String> {
    for (field, n) in [
        ("addresses", status.addresses.len()),
        ("capacity", status.capacity.len()),
        ("allocatable", status.allocatable.len()),
    ] {
        if n > MAX_ENTRIES {
            return Err(format!("status.{field} has {n} entries > {MAX_ENTRIES}"));
        }
    }
    let info = status.node_info.as_ref();
    let texts = status
        .conditions
        .iter()
        .flat_map(|c| [&c.message, &c.reason])
        .chain(status.addresses.iter().map(|a| &a.address))
        .chain(
            status
                .capacity
                .iter()
                .chain(&status.allocatable)
                .flat_map(|(k, v)| [k, v]),
        )
        .chain(info.into_iter().flat_map(|i| {
            [
                &i.machine_id,
                &i.system_uuid,
                &i.boot_id,
                &i.kernel_version,
                &i.os_image,
                &i.container_runtime_version,
                &i.kubelet_version,
                &i.operating_system,
                &i.architecture,
            ]
        }));
    for text in texts {
        if text.len() > MAX_TEXT_BYTES {
            return Err(format!(
                "a status field is {} bytes > {MAX_TEXT_BYTES}",
                text.len()
            ));
        }
    }
    Ok(())
}

/// A token bucket: `rate` messages per second on average, bursts of `burst`. One per node,
/// so a flooding node is refused before it costs an apiserver call and cannot use up the
/// gateway's shared apiserver budget (`--qps`) that every other node needs.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    at: Option<Instant>,
}

impl Default for TokenBucket {
    fn default() -> Self {
        Self {
            tokens: f64::INFINITY,
            at: None,
        }
    }
}

impl TokenBucket {
    /// Takes one token at `now` if there is one (refilling at `rate` per second up to
    /// `burst`); false means "over the limit".
    pub fn take(&mut self, now: Instant, rate: f64, burst: f64) -> bool {
        let elapsed = self
            .at
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
        self.tokens = (self.tokens.min(burst) + elapsed.as_secs_f64() * rate).min(burst);
        self.at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noderestriction_label_rules() {
        let keys = [
            "kubernetes.io/hostname",
            "kubernetes.io/arch",
            "node.kubernetes.io/instance-type",
            "node.kubernetes.io/edge",
            "foo.node.kubernetes.io/bar",
            "kubelet.kubernetes.io/x",
            "topology.kubernetes.io/zone",
            "example.com/site",
            "site",
            // forbidden:
            "node-role.kubernetes.io/control-plane",
            "node-restriction.kubernetes.io/trusted",
            "x.node-restriction.kubernetes.io/a",
            "kubernetes.io/role",
            "k8s.io/anything",
            "sub.k8s.io/x",
        ];
        assert_eq!(
            forbidden_labels(keys),
            [
                "k8s.io/anything",
                "kubernetes.io/role",
                "node-restriction.kubernetes.io/trusted",
                "node-role.kubernetes.io/control-plane",
                "sub.k8s.io/x",
                "x.node-restriction.kubernetes.io/a",
            ]
        );
        assert!(
            !is_kubelet_label("evilnode.kubernetes.io/x"),
            "a suffix match needs a dot"
        );
    }

    #[test]
    fn registrations_are_bounded_and_restricted() {
        let mut r = pb::Register::default();
        r.labels
            .insert("kubernetes.io/hostname".into(), "edge-01".into());
        assert!(validate_register(&r).is_ok());
        r.labels.insert(
            "node-role.kubernetes.io/control-plane".into(),
            String::new(),
        );
        let err = validate_register(&r).unwrap_err();
        assert!(
            err.contains("node-role.kubernetes.io/control-plane"),
            "{err}"
        );
        let mut r = pb::Register::default();
        for i in 0..=MAX_LABELS {
            r.labels.insert(format!("example.com/l{i}"), "v".into());
        }
        assert!(
            validate_register(&r)
                .unwrap_err()
                .starts_with("too many labels")
        );
        let mut r = pb::Register::default();
        r.labels.insert("example.com/l".into(), "v".repeat(64));
        assert!(validate_register(&r).is_err());
        let r = pb::Register {
            taints: vec![pb::Taint {
                key: "k".into(),
                value: String::new(),
                effect: "Sometimes".into(),
            }],
            ..Default::default()
        };
        assert!(validate_register(&r).is_err());
    }

    #[test]
    fn status_sizes_are_bounded() {
        let mut s = pb::NodeStatus::default();
        assert!(validate_status_limits(&s).is_ok());
        s.conditions.push(pb::NodeCondition {
            message: "m".repeat(MAX_TEXT_BYTES + 1),
            ..Default::default()
        });
        assert!(validate_status_limits(&s).is_err());
        let s = pb::NodeStatus {
            addresses: vec![pb::NodeAddress::default(); MAX_ENTRIES + 1],
            ..Default::default()
        };
        assert!(validate_status_limits(&s).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn token_bucket_allows_bursts_then_the_rate() {
        let mut b = TokenBucket::default();
        let t0 = Instant::now();
        let granted = (0..30).filter(|_| b.take(t0, 2.0, 10.0)).count();
        assert_eq!(granted, 10, "the burst");
        tokio::time::advance(Duration::from_secs(2)).await;
        let granted = (0..30)
            .filter(|_| b.take(Instant::now(), 2.0, 10.0))
            .count();
        assert_eq!(granted, 4, "2 per second for 2 s");
    }
}
