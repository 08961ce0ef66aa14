//! The kinds the stand-in serves, and what the real registry strategies say about each.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::smp::ListStrategy;

/// A served kind. The strategy answers mirror `pkg/registry/.../strategy.go` of each type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    Namespace,
    Node,
    Event,
    Lease,
    /// Core v1 `secrets` (`pkg/registry/core/secret/strategy.go`).
    Secret,
    /// `certificatesigningrequests.certificates.k8s.io`
    /// (`pkg/registry/certificates/certificates/strategy.go`).
    CertificateSigningRequest,
}

/// The write target of an update: the object, or one of its subresources (`/status` of
/// nodes and CSRs, `/approval` of CSRs), each with its own registry strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sub {
    Main,
    Status,
    Approval,
}

impl Sub {
    /// The subresource's name in a path and in authorization attributes ("" for the object).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Sub::Main => "",
            Sub::Status => "status",
            Sub::Approval => "approval",
        }
    }
}

impl Kind {
    pub(crate) const ALL: [Kind; 6] = [
        Kind::Namespace,
        Kind::Node,
        Kind::Event,
        Kind::Lease,
        Kind::Secret,
        Kind::CertificateSigningRequest,
    ];

    pub(crate) fn from_group_resource(group: &str, resource: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.group() == group && k.plural() == resource)
    }

    pub(crate) fn group(self) -> &'static str {
        match self {
            Kind::Lease => "coordination.k8s.io",
            Kind::CertificateSigningRequest => "certificates.k8s.io",
            _ => "",
        }
    }

    pub(crate) fn api_version(self) -> &'static str {
        match self {
            Kind::Lease => "coordination.k8s.io/v1",
            Kind::CertificateSigningRequest => "certificates.k8s.io/v1",
            _ => "v1",
        }
    }

    pub(crate) fn kind(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::Node => "Node",
            Kind::Event => "Event",
            Kind::Lease => "Lease",
            Kind::Secret => "Secret",
            Kind::CertificateSigningRequest => "CertificateSigningRequest",
        }
    }

    pub(crate) fn plural(self) -> &'static str {
        match self {
            Kind::Namespace => "namespaces",
            Kind::Node => "nodes",
            Kind::Event => "events",
            Kind::Lease => "leases",
            Kind::Secret => "secrets",
            Kind::CertificateSigningRequest => "certificatesigningrequests",
        }
    }

    pub(crate) fn namespaced(self) -> bool {
        matches!(self, Kind::Event | Kind::Lease | Kind::Secret)
    }

    /// The subresources served for this kind besides the object itself.
    pub(crate) fn subresources(self) -> &'static [Sub] {
        match self {
            Kind::Node => &[Sub::Status],
            Kind::CertificateSigningRequest => &[Sub::Status, Sub::Approval],
            _ => &[],
        }
    }

    /// `nodes`, `leases.coordination.k8s.io`: the GroupResource string of error messages.
    pub(crate) fn qualified_resource(self) -> String {
        if self.group().is_empty() {
            self.plural().to_string()
        } else {
            format!("{}.{}", self.plural(), self.group())
        }
    }

    /// `Node`, `Lease.coordination.k8s.io`: the GroupKind string of Invalid messages.
    pub(crate) fn group_kind(self) -> String {
        if self.group().is_empty() {
            self.kind().to_string()
        } else {
            format!("{}.{}", self.kind(), self.group())
        }
    }

    /// `AllowCreateOnUpdate`: true for leases and events, false for nodes, secrets and CSRs.
    pub(crate) fn allow_create_on_update(self) -> bool {
        matches!(self, Kind::Lease | Kind::Event)
    }

    /// `AllowUnconditionalUpdate`: false only for leases
    /// (`pkg/registry/coordination/lease/strategy.go`).
    pub(crate) fn allow_unconditional_update(self) -> bool {
        !matches!(self, Kind::Lease)
    }

    /// Whether the stand-in accepts writes for this kind (namespaces are fixed).
    pub(crate) fn writable(self) -> bool {
        !matches!(self, Kind::Namespace)
    }

    /// Lists of this kind that do not use the default (replace) strategy in a strategic
    /// merge patch, from the `patchStrategy`/`patchMergeKey` tags of `k8s.io/api`.
    pub(crate) fn merge_lists(self) -> &'static [(&'static [&'static str], ListStrategy)] {
        const META: [(&[&str], ListStrategy); 2] = [
            (
                &["metadata", "ownerReferences"],
                ListStrategy::MergeKey("uid"),
            ),
            (&["metadata", "finalizers"], ListStrategy::MergeScalars),
        ];
        const NODE: [(&[&str], ListStrategy); 5] = [
            META[0],
            META[1],
            (&["spec", "podCIDRs"], ListStrategy::MergeScalars),
            (&["status", "conditions"], ListStrategy::MergeKey("type")),
            (&["status", "addresses"], ListStrategy::MergeKey("type")),
        ];
        match self {
            Kind::Node => &NODE,
            _ => &META,
        }
    }

    /// Decodes `value` into the k8s-openapi type and encodes it again: the stored form.
    /// Returns the normalized object and the fields the type does not know (which the
    /// real server drops, warning or failing per `fieldValidation`).
    pub(crate) fn normalize(self, value: &Value) -> Result<(Value, Vec<String>), String> {
        match self {
            Kind::Namespace => roundtrip::<k8s_openapi::api::core::v1::Namespace>(value),
            Kind::Node => roundtrip::<k8s_openapi::api::core::v1::Node>(value),
            Kind::Event => roundtrip::<k8s_openapi::api::core::v1::Event>(value),
            Kind::Lease => roundtrip::<k8s_openapi::api::coordination::v1::Lease>(value),
            Kind::Secret => {
                let (out, unknown) = roundtrip::<k8s_openapi::api::core::v1::Secret>(value)?;
                Ok((secret_defaults(out)?, unknown))
            }
            Kind::CertificateSigningRequest => {
                roundtrip::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>(value)
            }
        }
    }

    /// The MicroTime fields of this kind, checked with Go's `RFC3339Micro` parser rules.
    pub(crate) fn micro_time_fields(self) -> &'static [&'static [&'static str]] {
        match self {
            Kind::Lease => &[&["spec", "renewTime"], &["spec", "acquireTime"]],
            Kind::Event => &[&["eventTime"], &["series", "lastObservedTime"]],
            _ => &[],
        }
    }
}

/// What decoding a v1 Secret does besides the type: `SetDefaults_Secret` (an empty `type` is
/// `Opaque`, `pkg/apis/core/v1/defaults.go`) and `Convert_v1_Secret_To_core_Secret`
/// (`stringData` is merged into `data`, overwriting, and never stored;
/// `pkg/apis/core/v1/conversion.go`).
fn secret_defaults(value: Value) -> Result<Value, String> {
    let mut secret: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(value).map_err(|e| e.to_string())?;
    if secret.type_.as_deref().is_none_or(str::is_empty) {
        secret.type_ = Some("Opaque".to_string());
    }
    if let Some(string_data) = secret.string_data.take().filter(|m| !m.is_empty()) {
        let data = secret.data.get_or_insert_with(Default::default);
        for (k, v) in string_data {
            data.insert(k, k8s_openapi::ByteString(v.into_bytes()));
        }
    }
    serde_json::to_value(&secret).map_err(|e| e.to_string())
}

fn roundtrip<T: DeserializeOwned + Serialize>(
    value: &Value,
) -> Result<(Value, Vec<String>), String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    let out = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut unknown = Vec::new();
    unknown_fields(value, &out, "", &mut unknown);
    Ok((out, unknown))
}

/// Keys present (non-null) in `input` but absent from the typed round trip `output`.
fn unknown_fields(input: &Value, output: &Value, prefix: &str, out: &mut Vec<String>) {
    match (input, output) {
        (Value::Object(i), Value::Object(o)) => {
            for (k, v) in i {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match o.get(k) {
                    Some(ov) => unknown_fields(v, ov, &path, out),
                    None if v.is_null() => {}
                    None => out.push(path),
                }
            }
        }
        (Value::Array(i), Value::Array(o)) => {
            for (idx, (iv, ov)) in i.iter().zip(o).enumerate() {
                unknown_fields(iv, ov, &format!("{prefix}[{idx}]"), out);
            }
        }
        _ => {}
    }
}

/// Accessors on a JSON object's `metadata`.
pub(crate) mod meta {
    use super::*;

    pub(crate) fn get<'a>(obj: &'a Value, key: &str) -> Option<&'a Value> {
        obj.get("metadata").and_then(|m| m.get(key))
    }

    pub(crate) fn str_field<'a>(obj: &'a Value, key: &str) -> &'a str {
        get(obj, key).and_then(Value::as_str).unwrap_or("")
    }

    pub(crate) fn name(obj: &Value) -> &str {
        str_field(obj, "name")
    }

    pub(crate) fn namespace(obj: &Value) -> &str {
        str_field(obj, "namespace")
    }

    pub(crate) fn resource_version(obj: &Value) -> &str {
        str_field(obj, "resourceVersion")
    }

    pub(crate) fn uid(obj: &Value) -> &str {
        str_field(obj, "uid")
    }

    pub(crate) fn labels(obj: &Value) -> Option<&Map<String, Value>> {
        get(obj, "labels").and_then(Value::as_object)
    }

    /// The metadata map, created if missing (objects are always JSON objects here).
    pub(crate) fn map_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
        let root = obj.as_object_mut()?;
        let m = root
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if !m.is_object() {
            *m = Value::Object(Map::new());
        }
        m.as_object_mut()
    }

    pub(crate) fn set(obj: &mut Value, key: &str, value: Value) {
        if let Some(m) = map_mut(obj) {
            if value.is_null() {
                m.remove(key);
            } else {
                m.insert(key.to_string(), value);
            }
        }
    }
}

/// Follows `path` through nested objects.
pub(crate) fn at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(obj, |v, k| v.get(*k))
}

/// The string at `path`, or "".
pub(crate) fn str_at<'a>(obj: &'a Value, path: &[&str]) -> &'a str {
    at(obj, path).and_then(Value::as_str).unwrap_or("")
}
