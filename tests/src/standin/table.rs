//! Server-side printing: `meta.k8s.io/v1` Table objects, with the columns and cell rules
//! of `pkg/printers/internalversion/printers.go` (`printNode`, `printLease`, `printEvent`,
//! `printNamespace`, `printSecret`, `printCertificateSigningRequest`). The server always
//! generates the wide columns (priority 1); kubectl
//! shows them with `-o wide`.

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::kinds::{Kind, at, meta, str_at};

/// `includeObject` of a Table request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub(crate) fn parse(s: Option<&str>) -> Result<Self, String> {
        match s {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(format!(
                "includeObject: Unsupported value: \"{other}\": supported values: \"Metadata\", \"None\", \"Object\""
            )),
        }
    }
}

fn col(name: &str, format: &str, priority: u8, description: &str) -> Value {
    json!({"name": name, "type": "string", "format": format, "description": description, "priority": priority})
}

const NAME_DOC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DOC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

fn columns(kind: Kind) -> Vec<Value> {
    match kind {
        Kind::Node => vec![
            col("Name", "name", 0, NAME_DOC),
            col("Status", "", 0, "The status of the node"),
            col("Roles", "", 0, "The roles of the node"),
            col("Age", "", 0, AGE_DOC),
            col("Version", "", 0, "Kubelet Version reported by the node."),
            col(
                "Internal-IP",
                "",
                1,
                "List of addresses reachable to the node.",
            ),
            col(
                "External-IP",
                "",
                1,
                "List of addresses reachable to the node.",
            ),
            col(
                "OS-Image",
                "",
                1,
                "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
            ),
            col(
                "Kernel-Version",
                "",
                1,
                "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
            ),
            col(
                "Container-Runtime",
                "",
                1,
                "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
            ),
        ],
        Kind::Lease => vec![
            col("Name", "name", 0, NAME_DOC),
            col(
                "Holder",
                "",
                0,
                "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.",
            ),
            col("Age", "", 0, AGE_DOC),
        ],
        Kind::Event => vec![
            col(
                "Last Seen",
                "",
                0,
                "The time at which the most recent occurrence of this event was recorded.",
            ),
            col(
                "Type",
                "",
                0,
                "Type of this event (Normal, Warning), new types could be added in the future",
            ),
            col(
                "Reason",
                "",
                0,
                "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
            ),
            col("Object", "", 0, "The object that this event is about."),
            col(
                "Subobject",
                "",
                1,
                "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement.",
            ),
            col(
                "Source",
                "",
                1,
                "The component reporting this event. Should be a short machine understandable string.",
            ),
            col(
                "Message",
                "",
                0,
                "A human-readable description of the status of this operation.",
            ),
            col(
                "First Seen",
                "",
                1,
                "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
            ),
            col(
                "Count",
                "",
                1,
                "The number of times this event has occurred.",
            ),
            col("Name", "name", 1, NAME_DOC),
        ],
        Kind::Namespace => vec![
            col("Name", "name", 0, NAME_DOC),
            col("Status", "", 0, "The status of the namespace"),
            col("Age", "", 0, AGE_DOC),
        ],
        Kind::Secret => vec![
            col("Name", "name", 0, NAME_DOC),
            col("Type", "", 0, SECRET_TYPE_DOC),
            col("Data", "", 0, SECRET_DATA_DOC),
            col("Age", "", 0, AGE_DOC),
        ],
        Kind::CertificateSigningRequest => vec![
            col("Name", "name", 0, NAME_DOC),
            col("Age", "", 0, AGE_DOC),
            col("SignerName", "", 0, CSR_SIGNER_NAME_DOC),
            col("Requestor", "", 0, CSR_REQUEST_DOC),
            col("RequestedDuration", "", 0, CSR_EXPIRATION_DOC),
            col("Condition", "", 0, CSR_CONDITIONS_DOC),
        ],
    }
}

const SECRET_TYPE_DOC: &str = "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types";
const SECRET_DATA_DOC: &str = "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4";
const CSR_SIGNER_NAME_DOC: &str = "signerName indicates the requested signer, and is a qualified name.\n\nList/watch requests for CertificateSigningRequests can filter on this field using a \"spec.signerName=NAME\" fieldSelector.\n\nWell-known Kubernetes signers are:\n 1. \"kubernetes.io/kube-apiserver-client\": issues client certificates that can be used to authenticate to kube-apiserver.\n  Requests for this signer are never auto-approved by kube-controller-manager, can be issued by the \"csrsigning\" controller in kube-controller-manager.\n 2. \"kubernetes.io/kube-apiserver-client-kubelet\": issues client certificates that kubelets use to authenticate to kube-apiserver.\n  Requests for this signer can be auto-approved by the \"csrapproving\" controller in kube-controller-manager, and can be issued by the \"csrsigning\" controller in kube-controller-manager.\n 3. \"kubernetes.io/kubelet-serving\" issues serving certificates that kubelets use to serve TLS endpoints, which kube-apiserver can connect to securely.\n  Requests for this signer are never auto-approved by kube-controller-manager, and can be issued by the \"csrsigning\" controller in kube-controller-manager.\n\nMore details are available at https://k8s.io/docs/reference/access-authn-authz/certificate-signing-requests/#kubernetes-signers\n\nCustom signerNames can also be specified. The signer defines:\n 1. Trust distribution: how trust (CA bundles) are distributed.\n 2. Permitted subjects: and behavior when a disallowed subject is requested.\n 3. Required, permitted, or forbidden x509 extensions in the request (including whether subjectAltNames are allowed, which types, restrictions on allowed values) and behavior when a disallowed extension is requested.\n 4. Required, permitted, or forbidden key usages / extended key usages.\n 5. Expiration/certificate lifetime: whether it is fixed by the signer, configurable by the admin.\n 6. Whether or not requests for CA certificates are allowed.";
const CSR_REQUEST_DOC: &str = "request contains an x509 certificate signing request encoded in a \"CERTIFICATE REQUEST\" PEM block. When serialized as JSON or YAML, the data is additionally base64-encoded.";
const CSR_EXPIRATION_DOC: &str = "expirationSeconds is the requested duration of validity of the issued certificate. The certificate signer may issue a certificate with a different validity duration so a client must check the delta between the notBefore and and notAfter fields in the issued certificate to determine the actual duration.\n\nThe v1.22+ in-tree implementations of the well-known Kubernetes signers will honor this field as long as the requested duration is not greater than the maximum duration they will honor per the --cluster-signing-duration CLI flag to the Kubernetes controller manager.\n\nCertificate signers may not honor this field for various reasons:\n\n  1. Old signer that is unaware of the field (such as the in-tree\n     implementations prior to v1.22)\n  2. Signer whose configured maximum is shorter than the requested duration\n  3. Signer whose configured minimum is longer than the requested duration\n\nThe minimum valid value for expirationSeconds is 600, i.e. 10 minutes.";
const CSR_CONDITIONS_DOC: &str = "conditions applied to the request. Known conditions are \"Approved\", \"Denied\", and \"Failed\".";

/// `extractCSRStatus`: Denied over Approved over Pending, then `,Failed` and `,Issued`.
fn csr_condition(obj: &Value) -> String {
    let has = |ty: &str| {
        at(obj, &["status", "conditions"])
            .and_then(Value::as_array)
            .is_some_and(|cs| cs.iter().any(|c| str_at(c, &["type"]) == ty))
    };
    let mut status = if has("Denied") {
        "Denied"
    } else if has("Approved") {
        "Approved"
    } else {
        "Pending"
    }
    .to_string();
    if has("Failed") {
        status.push_str(",Failed");
    }
    if !str_at(obj, &["status", "certificate"]).is_empty() {
        status.push_str(",Issued");
    }
    status
}

/// `duration.HumanDuration`.
pub(crate) fn human_duration(secs_total: i64) -> String {
    if secs_total < -1 {
        return "<invalid>".into();
    }
    if secs_total < 0 {
        return "0s".into();
    }
    if secs_total < 60 * 2 {
        return format!("{secs_total}s");
    }
    let minutes = secs_total / 60;
    if minutes < 10 {
        let s = secs_total % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = secs_total / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// `translateTimestampSince`: "<unknown>" for a missing time.
fn since(ts: Option<&Value>, now: Timestamp) -> String {
    match ts
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<Timestamp>().ok())
    {
        Some(t) => human_duration(now.duration_since(t).as_secs()),
        None => "<unknown>".into(),
    }
}

fn node_roles(obj: &Value) -> String {
    let mut roles: Vec<String> = Vec::new();
    if let Some(labels) = meta::labels(obj) {
        for (k, v) in labels {
            let v = v.as_str().unwrap_or("");
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.push(role.to_string());
                }
            } else if k == "kubernetes.io/role" && !v.is_empty() {
                roles.push(v.to_string());
            }
        }
    }
    roles.sort();
    roles.dedup();
    if roles.is_empty() {
        "<none>".into()
    } else {
        roles.join(",")
    }
}

fn node_address(obj: &Value, ty: &str) -> String {
    at(obj, &["status", "addresses"])
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|x| str_at(x, &["type"]) == ty))
        .map(|x| str_at(x, &["address"]).to_string())
        .unwrap_or_else(|| "<none>".into())
}

fn or_unknown(s: &str) -> String {
    if s.is_empty() {
        "<unknown>".into()
    } else {
        s.into()
    }
}

fn cells(kind: Kind, obj: &Value, now: Timestamp) -> Vec<Value> {
    let age = || since(meta::get(obj, "creationTimestamp"), now);
    match kind {
        Kind::Node => {
            let ready = at(obj, &["status", "conditions"])
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| str_at(c, &["type"]) == "Ready"));
            let mut status = vec![match ready {
                Some(c) if str_at(c, &["status"]) == "True" => "Ready",
                Some(_) => "NotReady",
                None => "Unknown",
            }];
            if at(obj, &["spec", "unschedulable"]).and_then(Value::as_bool) == Some(true) {
                status.push("SchedulingDisabled");
            }
            let info = |k: &str| or_unknown(str_at(obj, &["status", "nodeInfo", k]));
            vec![
                meta::name(obj).into(),
                status.join(",").into(),
                node_roles(obj).into(),
                age().into(),
                str_at(obj, &["status", "nodeInfo", "kubeletVersion"]).into(),
                node_address(obj, "InternalIP").into(),
                node_address(obj, "ExternalIP").into(),
                info("osImage").into(),
                info("kernelVersion").into(),
                info("containerRuntimeVersion").into(),
            ]
        }
        Kind::Lease => vec![
            meta::name(obj).into(),
            str_at(obj, &["spec", "holderIdentity"]).into(),
            age().into(),
        ],
        Kind::Namespace => vec![
            meta::name(obj).into(),
            str_at(obj, &["status", "phase"]).into(),
            age().into(),
        ],
        Kind::Secret => vec![
            meta::name(obj).into(),
            str_at(obj, &["type"]).into(),
            at(obj, &["data"])
                .and_then(Value::as_object)
                .map_or(0, serde_json::Map::len)
                .into(),
            age().into(),
        ],
        Kind::CertificateSigningRequest => {
            let signer = str_at(obj, &["spec", "signerName"]);
            let duration = at(obj, &["spec", "expirationSeconds"])
                .and_then(Value::as_i64)
                .map_or_else(|| "<none>".to_string(), human_duration);
            vec![
                meta::name(obj).into(),
                age().into(),
                (if signer.is_empty() { "<none>" } else { signer }).into(),
                str_at(obj, &["spec", "username"]).into(),
                duration.into(),
                csr_condition(obj).into(),
            ]
        }
        Kind::Event => {
            let mut first = since(at(obj, &["firstTimestamp"]), now);
            if at(obj, &["firstTimestamp"]).is_none_or(Value::is_null) {
                first = since(at(obj, &["eventTime"]), now);
            }
            let mut last = since(at(obj, &["lastTimestamp"]), now);
            if at(obj, &["lastTimestamp"]).is_none_or(Value::is_null) {
                last = first.clone();
            }
            let mut count = at(obj, &["count"]).and_then(Value::as_i64).unwrap_or(0);
            if let Some(series) = at(obj, &["series"]).filter(|s| !s.is_null()) {
                last = since(at(series, &["lastObservedTime"]), now);
                count = at(series, &["count"]).and_then(Value::as_i64).unwrap_or(0);
            } else if count == 0 {
                count = 1;
            }
            let involved_kind = str_at(obj, &["involvedObject", "kind"]).to_lowercase();
            let involved_name = str_at(obj, &["involvedObject", "name"]);
            let target = if involved_name.is_empty() {
                involved_kind
            } else {
                format!("{involved_kind}/{involved_name}")
            };
            let first_non_empty = |a: &str, b: &str| {
                if a.is_empty() {
                    b.to_string()
                } else {
                    a.to_string()
                }
            };
            let component = first_non_empty(
                str_at(obj, &["source", "component"]),
                str_at(obj, &["reportingComponent"]),
            );
            let instance = first_non_empty(
                str_at(obj, &["source", "host"]),
                str_at(obj, &["reportingInstance"]),
            );
            let source = if instance.is_empty() {
                component
            } else {
                format!("{component}, {instance}")
            };
            vec![
                last.into(),
                str_at(obj, &["type"]).into(),
                str_at(obj, &["reason"]).into(),
                target.into(),
                str_at(obj, &["involvedObject", "fieldPath"]).into(),
                source.into(),
                str_at(obj, &["message"]).trim().into(),
                first.into(),
                count.into(),
                meta::name(obj).into(),
            ]
        }
    }
}

/// A `PartialObjectMetadata` of `obj` (`meta.k8s.io/v1`).
pub(crate) fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// Builds a Table of `objects` (a list, or one object for a GET or a watch event).
pub(crate) fn table(
    kind: Kind,
    objects: &[Value],
    resource_version: &str,
    include: IncludeObject,
    api_version: &str,
) -> Value {
    let now = Timestamp::now();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut row = Map::new();
            row.insert("cells".into(), Value::Array(cells(kind, o, now)));
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => {
                    row.insert("object".into(), partial_metadata(o));
                }
                IncludeObject::Object => {
                    let mut full = o.clone();
                    if let Some(m) = full.as_object_mut() {
                        m.insert("kind".into(), kind.kind().into());
                        m.insert("apiVersion".into(), kind.api_version().into());
                    }
                    row.insert("object".into(), full);
                }
            }
            Value::Object(row)
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns(kind),
        "rows": rows,
    })
}
