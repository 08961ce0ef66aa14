//! Requests made *as a node* through impersonation (`Impersonate-User: system:node:<name>`
//! with `Impersonate-Group: system:nodes`): the Node authorizer and the NodeRestriction
//! admission plugin, for the kinds the stand-in serves.
//!
//! - Identity (`pkg/auth/nodeidentifier/default.go: NodeIdentity`): user
//!   `system:node:<name>` **and** group `system:nodes`. Any other impersonated user is an
//!   ordinary user and is not restricted (the stand-in has no RBAC).
//! - Authorization (`plugin/pkg/auth/authorizer/node/node_authorizer.go`, as in v1.33 where
//!   the `AuthorizeNodeWithSelectors` gate is on by default): `authorizeNode` for
//!   `nodes` and `nodes/status`, `authorizeLease` for leases,
//!   `authorizeReadNamespacedObject` for secrets (a node may only read a Secret a pod bound
//!   to it references, and the stand-in has no pods: every Secret request is denied), and
//!   the static `system:node` rules (`bootstrappolicy/policy.go: NodeRules`) for events
//!   (create, update, patch) and certificatesigningrequests (create, get, list, watch; no
//!   subresource). Namespaces are not in those rules. When the Node authorizer has no
//!   opinion, RBAC is assumed to add nothing
//!   (the `system:node` ClusterRoleBinding has had no subjects since v1.8), so the request
//!   is denied with the authorization filter's 403 (`responsewriters.Forbidden`,
//!   `forbiddenMessage`) and the Node authorizer's reason appended.
//! - Admission (`plugin/pkg/admission/noderestriction/admission.go`): `admitNode`,
//!   `admitLease` and `admitCSR` (on by default since v1.31, when the
//!   `AllowInsecureKubeletCertificateSigningRequests` gate went off: a node's CSR for the
//!   `kubernetes.io/kubelet-serving` or `kubernetes.io/kube-apiserver-client-kubelet`
//!   signer must have CN `system:node:<its name>`), with the kubelet label allow-list of
//!   `k8s.io/kubelet/pkg/apis: IsKubeletLabel`. Events and secrets are not restricted by it.

use std::collections::{BTreeMap, BTreeSet};

use http::Method;
use serde_json::Value;

use super::kinds::{Kind, Sub, at, meta, str_at};
use super::pem;
use super::query::Query;
use super::status::ApiError;
use super::validation::q;

const NODE_USER_PREFIX: &str = "system:node:";
const NODES_GROUP: &str = "system:nodes";
/// `api.NamespaceNodeLease`.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// `v1.LabelNamespaceNodeRestriction`.
const NODE_RESTRICTION_LABEL_NAMESPACE: &str = "node-restriction.kubernetes.io";
/// `kubeletLabels` of `k8s.io/kubelet/pkg/apis/well_known_labels.go`.
const KUBELET_LABELS: [&str; 11] = [
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];
/// `kubeletLabelNamespaces`.
const KUBELET_LABEL_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];

/// The user of a request that the Node authorizer treats as a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodeIdentity {
    user: String,
    /// Empty for `system:node:`: a node the authorizer cannot identify.
    name: String,
}

impl NodeIdentity {
    /// `NodeIdentity()` of the impersonated user: a node only for `system:node:<name>` in
    /// group `system:nodes`. An empty `Impersonate-User` is no impersonation at all.
    pub(crate) fn from_impersonation(user: Option<&str>, groups: &[String]) -> Option<Self> {
        let user = user.filter(|u| !u.is_empty())?;
        let name = user.strip_prefix(NODE_USER_PREFIX)?;
        groups
            .iter()
            .any(|g| g == NODES_GROUP)
            .then(|| NodeIdentity {
                user: user.to_string(),
                name: name.to_string(),
            })
    }
}

/// The `authorizer.Attributes` of a resource request, as `request.RequestInfoFactory`
/// derives them.
#[derive(Clone, Debug)]
pub(crate) struct Attributes {
    verb: String,
    kind: Kind,
    subresource: &'static str,
    namespace: String,
    name: String,
}

impl Attributes {
    /// Verb from the method (GET without a name is list, or watch with `watch=true`;
    /// DELETE without a name is deletecollection); for list and watch the name is taken
    /// from a `metadata.name=<x>` field selector; for namespaces the namespace is the name.
    pub(crate) fn new(
        method: &Method,
        kind: Kind,
        namespace: Option<&str>,
        name: Option<&str>,
        sub: Sub,
        q: &Query,
    ) -> Self {
        let verb = match (method.as_str(), name.is_some()) {
            ("GET" | "HEAD", true) => "get".to_string(),
            ("GET" | "HEAD", false) if q.flag("watch") => "watch".to_string(),
            ("GET" | "HEAD", false) => "list".to_string(),
            ("POST", _) => "create".to_string(),
            ("PUT", _) => "update".to_string(),
            ("PATCH", _) => "patch".to_string(),
            ("DELETE", true) => "delete".to_string(),
            ("DELETE", false) => "deletecollection".to_string(),
            (other, _) => other.to_ascii_lowercase(),
        };
        let mut name = name.unwrap_or("").to_string();
        if name.is_empty()
            && (verb == "list" || verb == "watch")
            && let Some(n) = q.get("fieldSelector").and_then(field_selector_name)
        {
            name = n;
        }
        let namespace = match (kind, namespace) {
            (Kind::Namespace, _) => name.clone(),
            (_, ns) => ns.unwrap_or("").to_string(),
        };
        Attributes {
            verb,
            kind,
            subresource: sub.name(),
            namespace,
            name,
        }
    }
}

/// `fields.Selector.RequiresExactMatch("metadata.name")`.
fn field_selector_name(selector: &str) -> Option<String> {
    selector.split(',').find_map(|term| {
        if term.contains("!=") {
            return None;
        }
        let (field, value) = term.split_once("==").or_else(|| term.split_once('='))?;
        (field.trim() == "metadata.name").then(|| value.trim().to_string())
    })
}

/// The authorization step for a request made as `node`: Ok, or the 403 of the
/// authorization filter.
pub(crate) fn authorize(node: &NodeIdentity, a: &Attributes) -> Result<(), ApiError> {
    let verdict = if node.name.is_empty() {
        Err(format!("unknown node for user {}", q(&node.user)))
    } else {
        match a.kind {
            Kind::Node => authorize_node(&node.name, a),
            Kind::Lease => authorize_lease(&node.name, a),
            // NodeRules: events create, update, patch.
            Kind::Event => match a.verb.as_str() {
                "create" | "update" | "patch" => Ok(()),
                _ => Err(String::new()),
            },
            // NodeRules: certificatesigningrequests create, get, list, watch.
            Kind::CertificateSigningRequest => match (a.subresource, a.verb.as_str()) {
                ("", "create" | "get" | "list" | "watch") => Ok(()),
                _ => Err(String::new()),
            },
            Kind::Secret => authorize_read_namespaced_object(&node.name, a),
            Kind::Namespace => Err(String::new()),
        }
    };
    verdict.map_err(|reason| forbidden_by_authorizer(&node.user, a, &reason))
}

/// `authorizeNode`: writes to any Node (NodeRestriction narrows them), reads of its own.
fn authorize_node(node: &str, a: &Attributes) -> Result<(), String> {
    match (a.subresource, a.verb.as_str()) {
        ("", "create" | "update" | "patch") | ("status", "update" | "patch") => Ok(()),
        ("", "get" | "list" | "watch") => {
            if a.name == node {
                Ok(())
            } else if a.name.is_empty() {
                Err(format!(
                    "node '{node}' cannot read all nodes, only its own Node object"
                ))
            } else {
                Err(format!(
                    "node '{node}' cannot read '{}', only its own Node object",
                    a.name
                ))
            }
        }
        _ => Err(String::new()),
    }
}

/// `authorizeLease`: its own Lease in `kube-node-lease` (any name on create, which
/// NodeRestriction then checks).
fn authorize_lease(node: &str, a: &Attributes) -> Result<(), String> {
    if !matches!(
        a.verb.as_str(),
        "get" | "create" | "update" | "patch" | "delete"
    ) {
        return Err("can only get, create, update, patch, or delete a node lease".to_string());
    }
    if a.namespace != NODE_LEASE_NAMESPACE {
        return Err(format!(
            "can only access leases in the {} system namespace",
            q(NODE_LEASE_NAMESPACE)
        ));
    }
    if a.verb != "create" && a.name != node {
        return Err(
            "can only access node lease with the same name as the requesting node".to_string(),
        );
    }
    Ok(())
}

/// `authorizeReadNamespacedObject` then `authorize`: reads of one named object in a
/// namespace, allowed only along a path in the node's graph, which holds no Secrets here.
fn authorize_read_namespaced_object(node: &str, a: &Attributes) -> Result<(), String> {
    if !matches!(a.verb.as_str(), "get" | "list" | "watch") {
        return Err("can only read resources of this type".to_string());
    }
    if !a.subresource.is_empty() {
        return Err("cannot read subresource".to_string());
    }
    if a.namespace.is_empty() {
        return Err("can only read namespaced object of this type".to_string());
    }
    if a.name.is_empty() {
        return Err("No Object name found".to_string());
    }
    Err(format!(
        "no relationship found between node '{node}' and this object"
    ))
}

/// `responsewriters.Forbidden`: `errors.NewForbidden` over `forbiddenMessage` (HTML
/// metacharacters escaped) and the authorizer's reason.
fn forbidden_by_authorizer(user: &str, a: &Attributes, reason: &str) -> ApiError {
    let resource = if a.subresource.is_empty() {
        a.kind.plural().to_string()
    } else {
        format!("{}/{}", a.kind.plural(), a.subresource)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace {}", q(&a.namespace))
    };
    let message = format!(
        "User {} cannot {} resource {} in API group {} {scope}",
        q(user),
        a.verb,
        q(&resource),
        q(a.kind.group())
    )
    .replace('&', "&amp;")
    .replace('<', "&lt;")
    .replace('>', "&gt;");
    let cause = if reason.is_empty() {
        message
    } else {
        format!("{message}: {reason}")
    };
    ApiError::forbidden(a.kind, &a.name, &cause)
}

/// The admission operation of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Operation {
    /// POST, or a PUT that creates (create on update).
    Create,
    /// PUT or PATCH of an existing object.
    Update,
}

/// NodeRestriction's `Admit` for a write made as `node`. `name` is the admission name:
/// the URL's, or the object's on a POST. `obj` is the object as it would be stored
/// (after the patch, before the registry strategy), `old` the stored one on update.
pub(crate) fn admit(
    node: &NodeIdentity,
    op: Operation,
    kind: Kind,
    namespace: &str,
    name: &str,
    obj: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if node.name.is_empty() {
        return Err(ApiError::forbidden(
            kind,
            name,
            &format!("could not determine node from user {}", q(&node.user)),
        ));
    }
    match kind {
        Kind::Node => admit_node(&node.name, op, name, obj, old),
        Kind::Lease => admit_lease(&node.name, op, namespace, name, obj),
        Kind::CertificateSigningRequest => admit_csr(&node.name, op, name, obj),
        Kind::Event | Kind::Namespace | Kind::Secret => Ok(()),
    }
}

/// `admitCSR`: on create, a request for the kubelet serving or kubelet client signer must
/// be for this node's CN. When the stand-in cannot read the subject (a bad signature, or
/// one rcgen cannot represent), validation decides instead.
fn admit_csr(node: &str, op: Operation, name: &str, obj: &Value) -> Result<(), ApiError> {
    const NODE_SIGNERS: [&str; 2] = [
        "kubernetes.io/kubelet-serving",
        "kubernetes.io/kube-apiserver-client-kubelet",
    ];
    if op != Operation::Create || !NODE_SIGNERS.contains(&str_at(obj, &["spec", "signerName"])) {
        return Ok(());
    }
    let forbid = |cause: String| {
        Err(ApiError::forbidden(
            Kind::CertificateSigningRequest,
            name,
            &cause,
        ))
    };
    let request: Vec<u8> = at(obj, &["spec", "request"])
        .cloned()
        .and_then(|v| serde_json::from_value::<k8s_openapi::ByteString>(v).ok())
        .map(|b| b.0)
        .unwrap_or_default();
    let expected = format!("{NODE_USER_PREFIX}{node}");
    match pem::csr_common_name(&request) {
        Err(e) => forbid(format!("unable to parse csr: {e}")),
        Ok(Some(cn)) if cn != expected => {
            forbid(format!("can only create a node CSR with CN={expected}"))
        }
        Ok(_) => Ok(()),
    }
}

fn admit_node(
    node: &str,
    op: Operation,
    name: &str,
    obj: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let forbid = |cause: String| Err(ApiError::forbidden(Kind::Node, name, &cause));
    if name != node {
        return forbid(format!(
            "node {} is not allowed to modify node {}",
            q(node),
            q(name)
        ));
    }
    match op {
        Operation::Create => {
            if config_source(obj).is_some() {
                return forbid(format!(
                    "node {} is not allowed to create pods with a non-nil configSource",
                    q(node)
                ));
            }
            let bad = forbidden_labels(&labels(obj), &BTreeMap::new());
            if !bad.is_empty() {
                return forbid(format!(
                    "node {} is not allowed to set the following labels: {}",
                    q(node),
                    bad.join(", ")
                ));
            }
        }
        Operation::Update => {
            let old = old.unwrap_or(&Value::Null);
            if let Some(cs) = config_source(obj)
                && config_source(old) != Some(cs)
            {
                return forbid(format!(
                    "node {} is not allowed to update configSource to a new non-nil configSource",
                    q(node)
                ));
            }
            if taints(obj) != taints(old) {
                return forbid(format!("node {} is not allowed to modify taints", q(node)));
            }
            let bad = forbidden_labels(&labels(obj), &labels(old));
            if !bad.is_empty() {
                // Sic: upstream's message has no subject here.
                return forbid(format!(
                    "is not allowed to modify labels: {}",
                    bad.join(", ")
                ));
            }
        }
    }
    Ok(())
}

fn admit_lease(
    node: &str,
    op: Operation,
    namespace: &str,
    name: &str,
    obj: &Value,
) -> Result<(), ApiError> {
    // On create the name is the proposed object's (the URL's if the body has none).
    let lease_name = match (op, meta::name(obj)) {
        (Operation::Create, n) if !n.is_empty() => n,
        _ => name,
    };
    let forbid = |cause: String| Err(ApiError::forbidden(Kind::Lease, lease_name, &cause));
    if namespace != NODE_LEASE_NAMESPACE {
        return forbid(format!(
            "can only access leases in the {} system namespace",
            q(NODE_LEASE_NAMESPACE)
        ));
    }
    if lease_name != node {
        return forbid(
            "can only access node lease with the same name as the requesting node".to_string(),
        );
    }
    Ok(())
}

fn config_source(obj: &Value) -> Option<&Value> {
    at(obj, &["spec", "configSource"]).filter(|v| !v.is_null())
}

/// `spec.taints` for `apiequality.Semantic.DeepEqual`: nil and empty are equal, and an
/// absent value is the empty string.
fn taints(obj: &Value) -> Vec<[String; 4]> {
    at(obj, &["spec", "taints"])
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    ["key", "value", "effect", "timeAdded"].map(|k| str_at(t, &[k]).to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

fn labels(obj: &Value) -> BTreeMap<String, String> {
    meta::labels(obj)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// `getForbiddenLabels(getModifiedLabels(new, old))`, sorted as `sets.String.List()`.
fn forbidden_labels(new: &BTreeMap<String, String>, old: &BTreeMap<String, String>) -> Vec<String> {
    let modified: BTreeSet<&String> = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(*v))
        .chain(old.iter().filter(|(k, v)| new.get(*k) != Some(*v)))
        .map(|(k, _)| k)
        .collect();
    modified
        .into_iter()
        .filter(|k| {
            let ns = label_namespace(k);
            let node_restriction = ns == NODE_RESTRICTION_LABEL_NAMESPACE
                || ns.ends_with(&format!(".{NODE_RESTRICTION_LABEL_NAMESPACE}"));
            node_restriction || (is_kubernetes_label(k) && !is_kubelet_label(k))
        })
        .cloned()
        .collect()
}

fn label_namespace(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

fn in_namespace(ns: &str, domain: &str) -> bool {
    ns == domain || ns.ends_with(&format!(".{domain}"))
}

fn is_kubernetes_label(key: &str) -> bool {
    let ns = label_namespace(key);
    in_namespace(ns, "kubernetes.io") || in_namespace(ns, "k8s.io")
}

/// `IsKubeletLabel`.
fn is_kubelet_label(key: &str) -> bool {
    KUBELET_LABELS.contains(&key)
        || KUBELET_LABEL_NAMESPACES
            .iter()
            .any(|allowed| in_namespace(label_namespace(key), allowed))
}
