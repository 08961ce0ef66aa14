//! The Kubernetes manifests under `deploy/`: every document is a known Kubernetes object that
//! k8s-openapi reads without dropping a field, the RBAC is exactly what the gateway's
//! apiserver calls need (checked against the manifests' text and against the requests a
//! running gateway sends to the stand-in), and the Deployment, Service and
//! PodDisruptionBudget fit together.
//!
//! kubectl, when on PATH, is used offline only: `kubectl kustomize` needs no cluster, but
//! `kubectl apply --dry-run=client` still needs discovery (see [`kubectl_reads_every_manifest`]).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgebeat_tests::harness::{Cluster, Transport, fixture_copy};
use edgebeat_tests::standin::RecordedRequest;
use http::Method;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

const NAMESPACE: &str = "edgebeat-system";
const SERVICE_ACCOUNT: &str = "edgebeat-gateway";
const LEASE_NAMESPACE: &str = "kube-node-lease";
const EVENT_NAMESPACE: &str = "default";

// ---------------------------------------------------------------------------------------
// Reading the manifests

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// `deploy/gateway`, applied by `kubectl apply -k deploy/gateway`.
fn gateway_dir() -> PathBuf {
    deploy_dir().join("gateway")
}

/// `deploy/gateway/impersonation`: not applied by default.
fn impersonation_dir() -> PathBuf {
    gateway_dir().join("impersonation")
}

/// `deploy/gateway/enrollment`: not applied by default.
fn enrollment_dir() -> PathBuf {
    gateway_dir().join("enrollment")
}

/// Every `.yaml`/`.yml` file under `dir`, recursively, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn is_kustomization(path: &Path) -> bool {
    matches!(
        path.file_name().and_then(|n| n.to_str()),
        Some("kustomization.yaml" | "kustomization.yml" | "Kustomization")
    )
}

/// The fields of a Kustomization these manifests may use. Anything else, `namespace:` above
/// all (it would move the Roles out of kube-node-lease and default), is refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    patches: Vec<Value>,
}

fn read_kustomization(dir: &Path) -> Kustomization {
    let path = dir.join("kustomization.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let k: Kustomization = serde_saphyr::from_str(&text)
        .unwrap_or_else(|e| panic!("{}: not a Kustomization: {e}", path.display()));
    assert_eq!(
        k.api_version,
        "kustomize.config.k8s.io/v1beta1",
        "{}",
        path.display()
    );
    assert_eq!(k.kind, "Kustomization", "{}", path.display());
    k
}

/// The YAML documents of one file, as JSON values (empty documents skipped).
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    documents_of(&text, &path.display().to_string())
}

fn documents_of(text: &str, what: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .unwrap_or_else(|e| panic!("{what}: YAML does not parse: {e}"));
    assert!(!docs.is_empty(), "{what}: no YAML document");
    docs
}

/// One object of a known kind, typed.
// A few dozen values in a test: their size does not matter, boxing would only add noise.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum Object {
    Namespace(Namespace),
    ServiceAccount(ServiceAccount),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    Role(Role),
    RoleBinding(RoleBinding),
    Deployment(Deployment),
    Service(Service),
    PodDisruptionBudget(PodDisruptionBudget),
    NetworkPolicy(NetworkPolicy),
    FlowSchema(FlowSchema),
}

/// Deserializes `value` as `T` and serializes it back: any field k8s-openapi does not know
/// (a typo, a field at the wrong level) is dropped on the way, so the round trip differs.
/// k8s-openapi also checks `apiVersion` and `kind` against `T`.
fn typed<T>(value: &Value, what: &str) -> T
where
    T: k8s_openapi::Resource + DeserializeOwned + serde::Serialize,
{
    assert_eq!(
        value["apiVersion"],
        T::API_VERSION,
        "{what}: apiVersion of a {}",
        T::KIND
    );
    let object: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{what}: not a valid {}: {e}", T::KIND));
    let back = serde_json::to_value(&object).unwrap();
    let mut differences = Vec::new();
    diff("", value, &back, &mut differences);
    assert!(
        differences.is_empty(),
        "{what}: fields k8s-openapi does not read as written (unknown or misplaced):\n  {}",
        differences.join("\n  ")
    );
    object
}

/// Paths where `written` and `read` differ.
fn diff(path: &str, written: &Value, read: &Value, out: &mut Vec<String>) {
    match (written, read) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => diff(&format!("{path}.{k}"), v, w, out),
                    None => out.push(format!("{path}.{k}: dropped")),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{path}.{k}: added"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}[{i}]"), v, w, out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: written {a}, read back {b}")),
    }
}

fn object(value: &Value, what: &str) -> Object {
    let kind = value["kind"].as_str().unwrap_or_default();
    match kind {
        "Namespace" => Object::Namespace(typed(value, what)),
        "ServiceAccount" => Object::ServiceAccount(typed(value, what)),
        "ClusterRole" => Object::ClusterRole(typed(value, what)),
        "ClusterRoleBinding" => Object::ClusterRoleBinding(typed(value, what)),
        "Role" => Object::Role(typed(value, what)),
        "RoleBinding" => Object::RoleBinding(typed(value, what)),
        "Deployment" => Object::Deployment(typed(value, what)),
        "Service" => Object::Service(typed(value, what)),
        "PodDisruptionBudget" => Object::PodDisruptionBudget(typed(value, what)),
        "NetworkPolicy" => Object::NetworkPolicy(typed(value, what)),
        "FlowSchema" => Object::FlowSchema(typed(value, what)),
        other => panic!("{what}: unexpected kind {other:?} (add it to this test on purpose)"),
    }
}

/// The objects of the files a kustomization lists (plain resource files only).
fn kustomized_objects(dir: &Path) -> Vec<(String, Object)> {
    let mut out = Vec::new();
    for resource in read_kustomization(dir).resources {
        let path = dir.join(&resource);
        assert!(
            path.is_file(),
            "{}: lists {resource}, not a file",
            dir.display()
        );
        for (i, value) in documents(&path).iter().enumerate() {
            let what = format!("{resource}#{i}");
            out.push((what.clone(), object(value, &what)));
        }
    }
    out
}

/// What `kubectl apply -k deploy/gateway` creates.
fn gateway_objects() -> Vec<Object> {
    kustomized_objects(&gateway_dir())
        .into_iter()
        .map(|(_, o)| o)
        .collect()
}

fn the<T>(objects: &[Object], pick: impl Fn(&Object) -> Option<&T>) -> T
where
    T: Clone,
{
    let found: Vec<&T> = objects.iter().filter_map(pick).collect();
    assert_eq!(found.len(), 1, "expected exactly one of that kind");
    found[0].clone()
}

fn deployment(objects: &[Object]) -> Deployment {
    the(objects, |o| match o {
        Object::Deployment(d) => Some(d),
        _ => None,
    })
}

fn pod_spec(d: &Deployment) -> PodSpec {
    d.spec.as_ref().unwrap().template.spec.clone().unwrap()
}

fn gateway_container(d: &Deployment) -> Container {
    let spec = pod_spec(d);
    assert_eq!(spec.containers.len(), 1, "one container, the gateway");
    spec.containers[0].clone()
}

fn pod_labels(d: &Deployment) -> BTreeMap<String, String> {
    d.spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap()
}

/// `selector` (matchLabels only: matchExpressions would need more than this test does)
/// selects pods labelled `labels`.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn match_labels(
    s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> BTreeMap<String, String> {
    assert!(
        s.match_expressions.is_none(),
        "matchLabels only, so the test can evaluate it"
    );
    s.match_labels.clone().unwrap()
}

// ---------------------------------------------------------------------------------------
// RBAC as data

/// Where a permission applies: cluster-wide (ClusterRole via ClusterRoleBinding) or in one
/// namespace (Role via RoleBinding).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Cluster,
    Namespace(String),
}

/// One (apiGroup, resource[/subresource], scope, verb) permission.
type Permission = (String, String, Scope, String);

fn perm(group: &str, resource: &str, scope: Scope, verb: &str) -> Permission {
    (group.into(), resource.into(), scope, verb.into())
}

fn ns(name: &str) -> Scope {
    Scope::Namespace(name.into())
}

/// What the gateway's calls in gateway/src/message_path.rs need, and nothing else.
fn expected_permissions() -> BTreeSet<Permission> {
    BTreeSet::from([
        // Api<Node>::create
        perm("", "nodes", Scope::Cluster, "create"),
        // Api<Node>::get, get_opt
        perm("", "nodes", Scope::Cluster, "get"),
        // kube-runtime watcher over Api<Node>::all (list, then watch)
        perm("", "nodes", Scope::Cluster, "list"),
        perm("", "nodes", Scope::Cluster, "watch"),
        // Api<Node>::patch_status (strategic merge patch)
        perm("", "nodes/status", Scope::Cluster, "patch"),
        // kube-runtime watcher over Api<Lease>::namespaced(kube-node-lease)
        perm("coordination.k8s.io", "leases", ns(LEASE_NAMESPACE), "list"),
        perm(
            "coordination.k8s.io",
            "leases",
            ns(LEASE_NAMESPACE),
            "watch",
        ),
        // Api<Lease>::get_opt (after a 409 or without a cached Lease)
        perm("coordination.k8s.io", "leases", ns(LEASE_NAMESPACE), "get"),
        // Api<Lease>::create
        perm(
            "coordination.k8s.io",
            "leases",
            ns(LEASE_NAMESPACE),
            "create",
        ),
        // Api<Lease>::replace (PUT)
        perm(
            "coordination.k8s.io",
            "leases",
            ns(LEASE_NAMESPACE),
            "update",
        ),
        // Api<Event>::create
        perm("", "events", ns(EVENT_NAMESPACE), "create"),
    ])
}

fn assert_no_wildcards(rule: &PolicyRule, what: &str) {
    let all = rule
        .api_groups
        .iter()
        .flatten()
        .chain(rule.resources.iter().flatten())
        .chain(rule.verbs.iter())
        .chain(rule.resource_names.iter().flatten())
        .chain(rule.non_resource_urls.iter().flatten());
    for word in all {
        assert!(!word.contains('*'), "{what}: wildcard {word:?} in {rule:?}");
    }
}

/// The permissions `rules` grant in `scope`, each rule checked for wildcards, resource
/// names and non-resource URLs (none belongs in the gateway's roles).
fn flatten(rules: &[PolicyRule], scope: &Scope, what: &str) -> Vec<Permission> {
    let mut out = Vec::new();
    for rule in rules {
        assert_no_wildcards(rule, what);
        assert!(
            rule.resource_names.is_none(),
            "{what}: resourceNames cannot name nodes that do not exist yet: {rule:?}"
        );
        assert!(rule.non_resource_urls.is_none(), "{what}: {rule:?}");
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    out.push(perm(group, resource, scope.clone(), verb));
                }
            }
        }
    }
    out
}

/// Every permission granted to the gateway's ServiceAccount by `objects`, with each
/// (Cluster)Role and binding checked: roles bound, bindings resolved, subject the gateway.
fn granted_permissions(objects: &[Object]) -> Vec<Permission> {
    let mut cluster_roles = BTreeMap::new();
    let mut roles = BTreeMap::new();
    let mut cluster_bindings = Vec::new();
    let mut bindings = Vec::new();
    for o in objects {
        match o {
            Object::ClusterRole(r) => {
                assert!(r.aggregation_rule.is_none(), "no aggregated roles");
                let name = r.metadata.name.clone().unwrap();
                assert!(r.metadata.namespace.is_none(), "{name}: cluster-scoped");
                cluster_roles.insert(name, r.rules.clone().unwrap_or_default());
            }
            Object::Role(r) => {
                let name = r.metadata.name.clone().unwrap();
                let namespace = r.metadata.namespace.clone().expect("Role namespace");
                roles.insert((namespace, name), r.rules.clone().unwrap_or_default());
            }
            Object::ClusterRoleBinding(b) => cluster_bindings.push(b.clone()),
            Object::RoleBinding(b) => bindings.push(b.clone()),
            _ => {}
        }
    }
    let assert_subjects = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>,
                           what: &str| {
        let subjects = subjects.clone().unwrap_or_default();
        assert_eq!(subjects.len(), 1, "{what}: one subject, the gateway");
        let s = &subjects[0];
        assert_eq!(s.kind, "ServiceAccount", "{what}");
        assert_eq!(s.name, SERVICE_ACCOUNT, "{what}");
        assert_eq!(s.namespace.as_deref(), Some(NAMESPACE), "{what}");
        assert!(s.api_group.as_deref().unwrap_or("").is_empty(), "{what}");
    };

    let mut granted = Vec::new();
    let mut bound_cluster_roles = BTreeSet::new();
    let mut bound_roles = BTreeSet::new();
    for b in &cluster_bindings {
        let what = format!("ClusterRoleBinding {}", b.metadata.name.clone().unwrap());
        assert_subjects(&b.subjects, &what);
        assert_eq!(
            b.role_ref.api_group.as_deref(),
            Some("rbac.authorization.k8s.io"),
            "{what}"
        );
        assert_eq!(b.role_ref.kind, "ClusterRole", "{what}");
        let rules = cluster_roles.get(&b.role_ref.name).unwrap_or_else(|| {
            panic!(
                "{what}: ClusterRole {} not in the manifests",
                b.role_ref.name
            )
        });
        bound_cluster_roles.insert(b.role_ref.name.clone());
        granted.extend(flatten(rules, &Scope::Cluster, &what));
    }
    for b in &bindings {
        let namespace = b.metadata.namespace.clone().expect("RoleBinding namespace");
        let what = format!(
            "RoleBinding {namespace}/{}",
            b.metadata.name.clone().unwrap()
        );
        assert_subjects(&b.subjects, &what);
        assert_eq!(
            b.role_ref.api_group.as_deref(),
            Some("rbac.authorization.k8s.io"),
            "{what}"
        );
        // A RoleBinding to a ClusterRole would grant it in that namespace; these manifests
        // keep namespaced permissions in Roles so each file reads on its own.
        assert_eq!(b.role_ref.kind, "Role", "{what}");
        let key = (namespace.clone(), b.role_ref.name.clone());
        let rules = roles
            .get(&key)
            .unwrap_or_else(|| panic!("{what}: Role {key:?} not in the manifests"));
        bound_roles.insert(key);
        granted.extend(flatten(rules, &Scope::Namespace(namespace), &what));
    }
    assert_eq!(
        bound_cluster_roles,
        cluster_roles.keys().cloned().collect(),
        "every ClusterRole is bound"
    );
    assert_eq!(
        bound_roles,
        roles.keys().cloned().collect(),
        "every Role is bound"
    );
    granted
}

// ---------------------------------------------------------------------------------------
// Parsing and layout

#[test]
fn every_manifest_parses_into_its_kubernetes_type_without_dropping_fields() {
    let mut kinds = BTreeMap::<String, usize>::new();
    for dir in [
        gateway_dir(),
        deploy_dir().join("gateway-mqtt"),
        deploy_dir().join("gateway-resource-metrics"),
    ] {
        for path in yaml_files(&dir) {
            if is_kustomization(&path) {
                read_kustomization(path.parent().unwrap());
                continue;
            }
            for (i, value) in documents(&path).iter().enumerate() {
                let what = format!("{}#{i}", path.display());
                object(value, &what);
                *kinds
                    .entry(value["kind"].as_str().unwrap().to_owned())
                    .or_default() += 1;
            }
        }
    }
    let expected: BTreeMap<String, usize> = [
        ("Namespace", 1),
        ("ServiceAccount", 1),
        // The gateway's, (deploy/gateway/impersonation) the impersonation one and
        // (deploy/gateway/enrollment) the enrollment ones; (deploy/gateway/resource-metrics)
        // a binding of the built-in system:auth-delegator;
        // (deploy/gateway/enrollment-kubelet-signer) a binding of the built-in nodeclient one.
        ("ClusterRole", 3),
        ("ClusterRoleBinding", 5),
        ("Role", 3),
        ("RoleBinding", 3),
        ("Deployment", 1),
        // The gRPC one; (deploy/gateway-resource-metrics) the resource metrics one.
        ("Service", 2),
        ("PodDisruptionBudget", 1),
        ("NetworkPolicy", 1),
        ("FlowSchema", 1),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_owned(), n))
    .collect();
    assert_eq!(kinds, expected);
}

#[test]
fn the_round_trip_check_catches_a_misplaced_field() {
    // The guard the test above relies on: k8s-openapi ignores unknown fields when reading,
    // so only the comparison notices them.
    let yaml = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: x\n  nmespace: y\n";
    let value = &documents_of(yaml, "inline")[0];
    let result = std::panic::catch_unwind(|| typed::<ServiceAccount>(value, "inline"));
    let panic = result.expect_err("a typo'd field must fail the check");
    let message = panic.downcast_ref::<String>().expect("a formatted panic");
    assert!(
        message.contains("fields k8s-openapi does not read as written")
            && message.contains(".metadata.nmespace: dropped"),
        "{message}"
    );
}

#[test]
fn kustomizations_list_every_manifest_in_their_directory() {
    for dir in [gateway_dir(), impersonation_dir(), enrollment_dir()] {
        let listed: BTreeSet<String> = read_kustomization(&dir).resources.into_iter().collect();
        let present: BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file() && !is_kustomization(p))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
            .collect();
        assert_eq!(listed, present, "{}: kustomization vs files", dir.display());
    }
    // The default set does not pull in the impersonation RBAC or the MQTT overlay.
    let default = read_kustomization(&gateway_dir());
    assert!(
        default.resources.iter().all(|r| !r.contains('/')),
        "{:?}",
        default.resources
    );
    assert!(default.patches.is_empty());
}

// ---------------------------------------------------------------------------------------
// RBAC

#[test]
fn rbac_grants_exactly_the_gateways_calls() {
    let granted = granted_permissions(&gateway_objects());
    let unique: BTreeSet<Permission> = granted.iter().cloned().collect();
    assert_eq!(unique.len(), granted.len(), "no permission granted twice");
    assert_eq!(unique, expected_permissions());
}

#[test]
fn gateway_rbac_objects_sit_where_their_rules_apply() {
    let objects = gateway_objects();
    let mut roles = BTreeSet::new();
    for o in &objects {
        match o {
            Object::Role(r) => {
                roles.insert((
                    r.metadata.namespace.clone().unwrap(),
                    r.metadata.name.clone().unwrap(),
                ));
            }
            Object::ServiceAccount(sa) => {
                assert_eq!(sa.metadata.name.as_deref(), Some(SERVICE_ACCOUNT));
                assert_eq!(sa.metadata.namespace.as_deref(), Some(NAMESPACE));
            }
            Object::Namespace(n) => assert_eq!(n.metadata.name.as_deref(), Some(NAMESPACE)),
            Object::Deployment(d) => assert_eq!(d.metadata.namespace.as_deref(), Some(NAMESPACE)),
            Object::Service(s) => assert_eq!(s.metadata.namespace.as_deref(), Some(NAMESPACE)),
            Object::PodDisruptionBudget(p) => {
                assert_eq!(p.metadata.namespace.as_deref(), Some(NAMESPACE));
            }
            _ => {}
        }
    }
    assert_eq!(
        roles,
        BTreeSet::from([
            (LEASE_NAMESPACE.into(), "edgebeat-gateway-leases".into()),
            (EVENT_NAMESPACE.into(), "edgebeat-gateway-events".into()),
        ])
    );
}

#[test]
fn impersonation_rbac_is_separate_and_limited_to_node_identities() {
    let objects: Vec<Object> = kustomized_objects(&impersonation_dir())
        .into_iter()
        .map(|(_, o)| o)
        .collect();
    let role = the(&objects, |o| match o {
        Object::ClusterRole(r) => Some(r),
        _ => None,
    });
    let binding = the(&objects, |o| match o {
        Object::ClusterRoleBinding(b) => Some(b),
        _ => None,
    });
    assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
    let subjects = binding.subjects.clone().unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(subjects[0].name, SERVICE_ACCOUNT);
    assert_eq!(subjects[0].namespace.as_deref(), Some(NAMESPACE));

    let mut resources = BTreeSet::new();
    for rule in role.rules.clone().unwrap() {
        assert_no_wildcards(&rule, "impersonation ClusterRole");
        assert_eq!(rule.verbs, ["impersonate"]);
        assert_eq!(rule.api_groups.clone().unwrap(), [""]);
        let names = rule.resource_names.clone().unwrap_or_default();
        // Without resourceNames, impersonate would let the gateway become anyone.
        assert!(!names.is_empty(), "{rule:?}");
        for resource in rule.resources.clone().unwrap() {
            match resource.as_str() {
                "users" => assert!(
                    names
                        .iter()
                        .all(|n| n.starts_with("system:node:") && n.len() > "system:node:".len()),
                    "users: node identities only: {names:?}"
                ),
                "groups" => assert_eq!(names, ["system:nodes"]),
                other => panic!("impersonation of {other} is not needed"),
            }
            resources.insert(resource);
        }
    }
    assert_eq!(resources, BTreeSet::from(["groups".into(), "users".into()]));

    // Not part of the default deployment.
    let default_names: Vec<String> = gateway_objects()
        .iter()
        .filter_map(|o| match o {
            Object::ClusterRole(r) => r.metadata.name.clone(),
            _ => None,
        })
        .collect();
    assert!(!default_names.contains(&role.metadata.name.clone().unwrap()));
}

/// The RBAC attributes the apiserver would check for one request the stand-in recorded.
/// Non-resource paths (`/version`, `/api`…) come back with an empty resource.
fn attributes(r: &RecordedRequest) -> (String, String, Option<String>, String) {
    let segments: Vec<&str> = r.path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return (String::new(), String::new(), None, r.path.clone()),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (resource, named) = match rest {
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => (String::new(), false),
    };
    let watch = r
        .query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let verb = match (&r.method, named) {
        (m, _) if *m == Method::GET && watch => "watch",
        (m, true) if *m == Method::GET => "get",
        (m, false) if *m == Method::GET => "list",
        (m, _) if *m == Method::POST => "create",
        (m, _) if *m == Method::PUT => "update",
        (m, _) if *m == Method::PATCH => "patch",
        (m, true) if *m == Method::DELETE => "delete",
        (m, false) if *m == Method::DELETE => "deletecollection",
        (m, _) => panic!("unexpected method {m} {}", r.path),
    };
    (group.to_owned(), resource, namespace, verb.to_owned())
}

/// Runs a real gateway against the stand-in through registration, renewals, a lost Lease
/// race (409 then GET) and a reboot (Rebooted event), then checks that the manifests allow
/// every request it sent, and that it used every permission they grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_covers_every_request_the_gateway_sends() {
    const DEADLINE: Duration = Duration::from_secs(20);
    const NODE: &str = "rpi4-edge-01";
    let cluster = Cluster::start(Transport::Grpc).await.unwrap();
    let host = fixture_copy("rpi4-cgroup1").unwrap();
    let config = cluster.agent_config(NODE, host.path());

    let agent = cluster.start_agent(config.clone()).unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "registered and leased", |v| {
            v.node(NODE).is_some() && v.lease(LEASE_NAMESPACE, NODE).is_some()
        })
        .await
        .unwrap();
    cluster.wait_for_renewals(NODE, 2, DEADLINE).await.unwrap();
    // Another writer moves the Lease on: the next PUT gets a 409 and the gateway GETs.
    assert!(cluster.standin.bump_lease(LEASE_NAMESPACE, NODE));
    cluster.wait_for_renewals(NODE, 2, DEADLINE).await.unwrap();
    agent.stop().await.unwrap();

    // A new boot ID: the gateway records a Rebooted event.
    std::fs::write(
        host.path().join("proc/sys/kernel/random/boot_id"),
        "0c5e7d1a-2b3c-4d5e-8f90-a1b2c3d4e5f6\n",
    )
    .unwrap();
    let agent = cluster.start_agent(config).unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "Rebooted event", |v| {
            v.events()
                .iter()
                .any(|e| e.reason.as_deref() == Some("Rebooted"))
        })
        .await
        .unwrap();
    agent.stop().await.unwrap();

    let granted: BTreeSet<Permission> = granted_permissions(&gateway_objects())
        .into_iter()
        .collect();
    let allows = |group: &str, resource: &str, namespace: &Option<String>, verb: &str| {
        granted.contains(&perm(group, resource, Scope::Cluster, verb))
            || namespace
                .as_deref()
                .is_some_and(|n| granted.contains(&perm(group, resource, ns(n), verb)))
    };
    let mut used = BTreeSet::new();
    for r in cluster.standin.requests() {
        // The reachability check at start: every cluster lets anyone read /version
        // (ClusterRole system:public-info-viewer, bound to system:authenticated and
        // system:unauthenticated by default).
        if r.method == Method::GET && r.path == "/version" {
            continue;
        }
        let (group, resource, namespace, verb) = attributes(&r);
        assert!(
            !resource.is_empty(),
            "{} {}: a non-resource request; the manifests grant none (system:discovery \
             would cover discovery, but the gateway is not expected to need it)",
            r.method,
            r.path
        );
        assert!(
            allows(&group, &resource, &namespace, &verb),
            "{} {} needs {verb} on {group:?} {resource} in {namespace:?}, which the manifests \
             do not grant",
            r.method,
            r.path
        );
        let scope = match &namespace {
            Some(n) if granted.contains(&perm(&group, &resource, ns(n), &verb)) => ns(n),
            _ => Scope::Cluster,
        };
        used.insert(perm(&group, &resource, scope, &verb));
    }
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(
        unused.is_empty(),
        "granted but never used in this run: {unused:?}"
    );
}

/// The enrollment RBAC (deploy/gateway/enrollment): a gateway run with --enrollment (first
/// enrollments approved by hand, short certificates so that one rotation happens) sends no
/// request that the base and enrollment manifests do not allow, and uses every verb the
/// enrollment manifests grant; approving and signing are granted for the gateway's own
/// signer name only, and nothing grants the kubelet CSR subresources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrollment_rbac_covers_every_request_of_enrolling_and_rotating() {
    use edgebeat_gateway::enrollment::{Approval, DEFAULT_SIGNER_NAME, EnrollmentOptions};
    const DEADLINE: Duration = Duration::from_secs(30);
    let objects: Vec<Object> = kustomized_objects(&enrollment_dir())
        .into_iter()
        .map(|(_, o)| o)
        .collect();
    // The signer rule is the one with resourceNames; the rest flattens as the base does.
    let mut signer_rules = Vec::new();
    let plain: Vec<Object> = objects
        .iter()
        .cloned()
        .map(|o| match o {
            Object::ClusterRole(mut r) => {
                let rules = r.rules.take().unwrap_or_default();
                let (signers, rest): (Vec<_>, Vec<_>) = rules
                    .into_iter()
                    .partition(|rule| rule.resource_names.is_some());
                signer_rules.extend(signers);
                r.rules = Some(rest);
                Object::ClusterRole(r)
            }
            other => other,
        })
        .collect();
    assert_eq!(signer_rules.len(), 1, "{signer_rules:?}");
    let signers = &signer_rules[0];
    assert_eq!(signers.api_groups.clone().unwrap(), ["certificates.k8s.io"]);
    assert_eq!(signers.resources.clone().unwrap(), ["signers"]);
    assert_eq!(
        signers.resource_names.clone().unwrap(),
        [DEFAULT_SIGNER_NAME]
    );
    assert_eq!(signers.verbs, ["approve", "sign"]);
    let enrollment: BTreeSet<Permission> = granted_permissions(&plain).into_iter().collect();
    assert!(
        enrollment
            .iter()
            .all(|(_, resource, _, _)| !resource.contains("nodeclient")),
        "{enrollment:?}"
    );
    let mut all = gateway_objects();
    all.extend(plain);
    let granted: BTreeSet<Permission> = granted_permissions(&all).into_iter().collect();

    let options = EnrollmentOptions {
        approval: Approval::Manual,
        lifetime: Duration::from_secs(10),
        ..EnrollmentOptions::default()
    };
    let cluster = Cluster::start_enrolling(
        Transport::Grpc,
        options,
        edgebeat_tests::harness::gateway_options(),
    )
    .await
    .unwrap();
    let token = cluster
        .bootstrap_token(&["edge-01"], 1, Duration::from_secs(3600))
        .await
        .unwrap();
    let host = fixture_copy("rpi4-cgroup1").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = cluster
        .enrolled_agent_config("edge-01", host.path(), &token, dir.path())
        .unwrap();
    let agent = cluster.start_agent(config).unwrap();
    let replica = cluster.replicas[0].as_ref().unwrap();
    let counters = &replica.enrollment.as_ref().unwrap().counters;
    edgebeat_tests::harness::wait_for("asked twice, pending", DEADLINE, || {
        counters.get("token", "pending") >= 2
    })
    .await;
    // kubectl certificate approve, as the operator.
    let client = edgebeat_tests::harness::operator_client(&cluster.standin).unwrap();
    let api: kube::Api<k8s_openapi::api::certificates::v1::CertificateSigningRequest> =
        kube::Api::all(client);
    let csr = api.list(&Default::default()).await.unwrap().items.remove(0);
    edgebeat_tests::harness::approve_csr(&cluster.standin, csr.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    edgebeat_tests::harness::wait_for("enrolled, then rotated", Duration::from_secs(90), || {
        counters.get("certificate", "issued") >= 1
    })
    .await;
    agent.stop().await.unwrap();

    let mut used = BTreeSet::new();
    // The gateway's requests; the operator's (token, approval) carry its impersonated name.
    for r in cluster.standin.requests() {
        if r.impersonate_user.as_deref() == Some(edgebeat_tests::harness::OPERATOR) {
            continue;
        }
        let (group, resource, namespace, verb) = attributes(&r);
        if !matches!(
            resource.as_str(),
            "secrets"
                | "certificatesigningrequests"
                | "certificatesigningrequests/approval"
                | "certificatesigningrequests/status"
        ) {
            continue;
        }
        let scope = match &namespace {
            Some(n) => ns(n),
            None => Scope::Cluster,
        };
        let permission = perm(&group, &resource, scope, &verb);
        assert!(
            granted.contains(&permission),
            "{} {} needs {permission:?}, which the manifests do not grant",
            r.method,
            r.path
        );
        used.insert(permission);
    }
    let unused: Vec<_> = enrollment.difference(&used).collect();
    assert!(unused.is_empty(), "granted but never used: {unused:?}");
}

// ---------------------------------------------------------------------------------------
// Workload

#[test]
fn deployment_is_replicated_probed_and_locked_down() {
    let d = deployment(&gateway_objects());
    let spec = d.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert!(
        selects(&match_labels(&spec.selector), &pod_labels(&d)),
        "the Deployment selects its own pods"
    );

    let pod = pod_spec(&d);
    assert_eq!(pod.service_account_name.as_deref(), Some(SERVICE_ACCOUNT));
    // In-cluster config needs the token, which the ServiceAccount does not mount by default.
    assert_eq!(pod.automount_service_account_token, Some(true));
    let pod_security = pod.security_context.clone().unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(pod_security.run_as_user, Some(65532));
    assert_eq!(
        pod_security.seccomp_profile.unwrap().type_,
        "RuntimeDefault"
    );

    // Replicas spread over nodes.
    let spread = pod.topology_spread_constraints.clone().unwrap_or_default();
    assert!(
        spread
            .iter()
            .any(|c| c.topology_key == "kubernetes.io/hostname"
                && c.label_selector
                    .as_ref()
                    .is_some_and(|s| selects(&match_labels(s), &pod_labels(&d)))),
        "topology spread over kubernetes.io/hostname: {spread:?}"
    );
    let anti = pod
        .affinity
        .clone()
        .and_then(|a| a.pod_anti_affinity)
        .and_then(|a| a.preferred_during_scheduling_ignored_during_execution)
        .unwrap_or_default();
    assert!(
        anti.iter()
            .any(|t| t.pod_affinity_term.topology_key == "kubernetes.io/hostname")
    );

    let c = gateway_container(&d);
    assert_eq!(c.image.as_deref(), Some("edgebeat/gateway:0.1.0"));
    let args = c.args.clone().unwrap();
    for arg in [
        "--grpc-listen=0.0.0.0:7443",
        "--metrics-listen=0.0.0.0:9102",
        "--mqtt-client-id=$(POD_NAME)",
        // The identified posture: gRPC only over mTLS with node certificates.
        "--grpc-tls-cert=/etc/edgebeat/tls/tls.crt",
        "--grpc-tls-key=/etc/edgebeat/tls/tls.key",
        "--grpc-client-ca=/etc/edgebeat/site-ca/ca.crt",
    ] {
        assert!(args.iter().any(|a| a == arg), "{arg} in {args:?}");
    }
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--allow-unidentified-agents")
                || a.starts_with("--require-node-identity")),
        "the manifests never let unidentified agents in: {args:?}"
    );
    let mounts: Vec<String> = c
        .volume_mounts
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mount_path)
        .collect();
    for path in ["/etc/edgebeat/tls", "/etc/edgebeat/site-ca"] {
        assert!(mounts.iter().any(|m| m == path), "{path} in {mounts:?}");
    }
    // MQTT is opt-in (deploy/gateway-mqtt); no kubeconfig: in-cluster config.
    assert!(
        !args.iter().any(|a| a.starts_with("--mqtt-endpoint")
            || a.starts_with("--kubeconfig")
            || a.starts_with("--server")),
        "{args:?}"
    );
    let pod_name = c
        .env
        .clone()
        .unwrap()
        .into_iter()
        .find(|e| e.name == "POD_NAME")
        .expect("POD_NAME for $(POD_NAME)");
    assert_eq!(
        pod_name.value_from.unwrap().field_ref.unwrap().field_path,
        "metadata.name"
    );

    let ports: BTreeMap<String, i32> = c
        .ports
        .clone()
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        BTreeMap::from([("grpc".into(), 7443), ("http-metrics".into(), 9102)])
    );

    for (probe, path) in [
        (c.liveness_probe.clone(), "/healthz"),
        (c.readiness_probe.clone(), "/readyz"),
    ] {
        let get = probe
            .unwrap_or_else(|| panic!("probe for {path}"))
            .http_get
            .unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, IntOrString::String("http-metrics".into()));
    }

    let resources = c.resources.clone().unwrap();
    let requests = resources.requests.unwrap();
    assert_eq!(requests["cpu"].0, "350m");
    assert_eq!(requests["memory"].0, "256Mi");
    let limits = resources.limits.unwrap();
    assert_eq!(limits["memory"].0, "512Mi");
    // --max-nodes fits the limit at the measured cost (BENCHMARKS.md, "Gateway with a
    // fleet": 9 MiB + 49 KiB per gRPC node with mTLS), with a fifth of it to spare.
    let max_nodes: f64 = c
        .args
        .iter()
        .flatten()
        .find_map(|a| a.strip_prefix("--max-nodes="))
        .expect("--max-nodes")
        .parse()
        .unwrap();
    let needed_mib = 9.0 + max_nodes * 49.0 / 1024.0;
    assert!(
        needed_mib <= 0.8 * 512.0,
        "--max-nodes={max_nodes} needs {needed_mib:.0} MiB of the 512Mi limit"
    );
    assert!(
        !limits.contains_key("cpu"),
        "no CPU limit: throttling delays renewals"
    );

    let security = c.security_context.clone().unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.privileged, None);
    assert_eq!(
        security.capabilities.unwrap().drop.unwrap(),
        ["ALL"],
        "every capability dropped"
    );
}

#[test]
fn deployment_flags_exist_in_the_gateway_binary() {
    // A flag the binary does not know, or a value it cannot parse, makes every pod
    // crash-loop, which no YAML parser notices: the Deployment's arguments (and the flag the
    // MQTT overlay adds) are parsed by the binary's own command line.
    use clap::Parser;
    let d = deployment(&gateway_objects());
    let mut args = gateway_container(&d).args.unwrap();
    args.push("--mqtt-endpoint=mqtt://x:1883".into());
    for arg in &args {
        assert!(
            arg.starts_with("--") && arg.contains('='),
            "{arg}: use --flag=value"
        );
    }
    let parsed = edgebeat_gateway::cli::Args::try_parse_from(
        std::iter::once("edgebeat-gateway".to_owned()).chain(args),
    );
    if let Err(error) = parsed {
        panic!("deploy/gateway's arguments: {error}");
    }
}

#[test]
fn service_targets_the_grpc_port() {
    let objects = gateway_objects();
    let d = deployment(&objects);
    let service = the(&objects, |o| match o {
        Object::Service(s) => Some(s),
        _ => None,
    });
    assert_eq!(service.metadata.name.as_deref(), Some("edgebeat-gateway"));
    let spec = service.spec.unwrap();
    assert!(selects(&spec.selector.unwrap(), &pod_labels(&d)));
    let ports = spec.ports.unwrap();
    assert_eq!(ports.len(), 1, "gRPC only; metrics stay off the Service");
    let port = &ports[0];
    assert_eq!(port.name.as_deref(), Some("grpc"));
    assert_eq!(port.port, 7443);
    assert_eq!(port.app_protocol.as_deref(), Some("grpc"));
    let target = match port.target_port.clone().unwrap() {
        IntOrString::String(name) => name,
        IntOrString::Int(n) => panic!("target the port by name, not {n}"),
    };
    let container_port = gateway_container(&d)
        .ports
        .unwrap()
        .into_iter()
        .find(|p| p.name.as_deref() == Some(target.as_str()))
        .unwrap_or_else(|| panic!("no container port named {target}"));
    assert_eq!(container_port.container_port, 7443);
}

#[test]
fn network_policy_admits_grpc_from_anywhere_and_metrics_from_monitoring_only() {
    let objects = gateway_objects();
    let d = deployment(&objects);
    let policy = the(&objects, |o| match o {
        Object::NetworkPolicy(p) => Some(p),
        _ => None,
    });
    let spec = policy.spec.unwrap();
    assert!(selects(
        &match_labels(spec.pod_selector.as_ref().unwrap()),
        &pod_labels(&d)
    ));
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
    let rules = spec.ingress.unwrap();
    let port_of = |rule: &k8s_openapi::api::networking::v1::NetworkPolicyIngressRule| {
        let ports = rule.ports.clone().unwrap();
        assert_eq!(ports.len(), 1);
        match ports[0].port.clone().unwrap() {
            IntOrString::String(name) => name,
            IntOrString::Int(n) => panic!("name the port, not {n}"),
        }
    };
    let grpc = rules.iter().find(|r| port_of(r) == "grpc").unwrap();
    assert!(grpc.from.is_none(), "agents come from anywhere");
    let metrics = rules.iter().find(|r| port_of(r) == "http-metrics").unwrap();
    let from = metrics.from.clone().unwrap();
    assert_eq!(from.len(), 1);
    let namespaces = from[0].namespace_selector.clone().unwrap();
    assert_eq!(
        match_labels(&namespaces)
            .get("kubernetes.io/metadata.name")
            .map(String::as_str),
        Some("monitoring")
    );
    assert!(from[0].pod_selector.is_none() && from[0].ip_block.is_none());
    // The named ports exist on the gateway container.
    let names: Vec<String> = gateway_container(&d)
        .ports
        .unwrap()
        .into_iter()
        .filter_map(|p| p.name)
        .collect();
    for rule in &rules {
        assert!(names.contains(&port_of(rule)), "{names:?}");
    }
}

#[test]
fn pod_disruption_budget_keeps_one_gateway_pod() {
    let objects = gateway_objects();
    let d = deployment(&objects);
    let pdb = the(&objects, |o| match o {
        Object::PodDisruptionBudget(p) => Some(p),
        _ => None,
    });
    let spec = pdb.spec.unwrap();
    assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
    assert!(spec.max_unavailable.is_none());
    let selector = match_labels(&spec.selector.unwrap());
    assert!(selects(&selector, &pod_labels(&d)));
    assert_eq!(
        selector,
        match_labels(&d.spec.unwrap().selector),
        "the budget counts exactly the Deployment's pods"
    );
}

// ---------------------------------------------------------------------------------------
// kubectl, offline

fn find_kubectl() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
}

fn kubectl(bin: &Path, cache: &Path, args: &[&str]) -> std::process::Output {
    edgebeat_tests::process::output(
        std::process::Command::new(bin)
            .env("KUBECONFIG", "/dev/null")
            .arg("--cache-dir")
            .arg(cache)
            .args(args),
    )
    .unwrap()
}

/// `kubectl kustomize` builds each kustomization offline: the default one yields exactly the
/// documents of its files (no namespace or name rewritten), and the MQTT overlay adds
/// `--mqtt-endpoint` to an otherwise identical Deployment.
#[test]
#[ignore = "needs kubectl on PATH: scripts/test.sh runs it when kubectl is installed"]
fn kubectl_kustomize_builds_the_documented_objects() {
    let bin = find_kubectl().expect("kubectl on PATH");
    let cache = tempfile::tempdir().unwrap();
    let build = |dir: &Path| -> Vec<Value> {
        let out = kubectl(&bin, cache.path(), &["kustomize", dir.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        documents_of(&String::from_utf8(out.stdout).unwrap(), "kustomize output")
    };
    let key = |v: &Value| {
        format!(
            "{}/{}/{}",
            v["kind"],
            v["metadata"]["namespace"].as_str().unwrap_or("-"),
            v["metadata"]["name"]
        )
    };
    let by_key = |docs: Vec<Value>| -> BTreeMap<String, Value> {
        docs.into_iter().map(|v| (key(&v), v)).collect()
    };
    let from_files = |dir: &Path| -> BTreeMap<String, Value> {
        by_key(
            read_kustomization(dir)
                .resources
                .iter()
                .flat_map(|r| documents(&dir.join(r)))
                .collect(),
        )
    };

    for dir in [gateway_dir(), impersonation_dir(), enrollment_dir()] {
        let built = build(&dir);
        let count = built.len();
        // Keyed by kind/namespace/name: kustomize reorders documents (and keys).
        let built = by_key(built);
        assert_eq!(built.len(), count, "{}: duplicate objects", dir.display());
        assert_eq!(built, from_files(&dir), "{}", dir.display());
    }

    let mut expected = from_files(&gateway_dir());
    let overlay = by_key(build(&deploy_dir().join("gateway-mqtt")));
    let deployment_key = "\"Deployment\"/edgebeat-system/\"edgebeat-gateway\"";
    let pod = &mut expected.get_mut(deployment_key).unwrap()["spec"]["template"]["spec"];
    let args = pod["containers"][0]["args"].as_array_mut().unwrap();
    // MQTT over TLS with signed messages verified against the site CA: the identified
    // posture the base's gRPC has too.
    for arg in [
        "--mqtt-endpoint=mqtts://mosquitto.mqtt.svc.cluster.local:8883",
        "--mqtt-ca-file=/etc/edgebeat/mqtt/ca.crt",
        "--mqtt-cert-file=/etc/edgebeat/mqtt/tls.crt",
        "--mqtt-key-file=/etc/edgebeat/mqtt/tls.key",
        "--mqtt-node-ca=/etc/edgebeat/site-ca/ca.crt",
        "--mqtt-answer-cert-file=/etc/edgebeat/answers/tls.crt",
        "--mqtt-answer-key-file=/etc/edgebeat/answers/tls.key",
    ] {
        args.push(Value::from(arg));
    }
    for (name, secret, path) in [
        (
            "mqtt-tls",
            "edgebeat-gateway-mqtt-tls",
            "/etc/edgebeat/mqtt",
        ),
        (
            "answers",
            "edgebeat-gateway-answers",
            "/etc/edgebeat/answers",
        ),
    ] {
        pod["volumes"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"name": name, "secret": {"secretName": secret}}));
        pod["containers"][0]["volumeMounts"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"name": name, "mountPath": path, "readOnly": true}));
    }
    assert_eq!(
        overlay, expected,
        "the overlay only adds signed MQTT over TLS, its answer key and their Secrets"
    );
}

/// `kubectl apply --dry-run=client` cannot work offline: even a client-side dry run maps
/// kinds to resources through the apiserver's discovery (and validation downloads the
/// OpenAPI schema). What is reliable without a cluster is the order of kubectl's work: it
/// reads and decodes the file first, and only then contacts the server. So each file must
/// either succeed (a reachable apiserver) or fail on the connection to the closed port
/// given as --server, never on the file itself (YAML syntax, missing kind, bad field).
#[test]
#[ignore = "needs kubectl on PATH: scripts/test.sh runs it when kubectl is installed"]
fn kubectl_reads_every_manifest() {
    let bin = find_kubectl().expect("kubectl on PATH");
    let cache = tempfile::tempdir().unwrap();
    // Port 1 (tcpmux) is closed on any ordinary machine: "connection refused" at once.
    let server = "http://127.0.0.1:1";
    for path in yaml_files(&gateway_dir()) {
        if is_kustomization(&path) {
            continue;
        }
        let out = kubectl(
            &bin,
            cache.path(),
            &[
                "apply",
                "--dry-run=client",
                "--server",
                server,
                "--request-timeout=5s",
                "-o",
                "name",
                "-f",
                path.to_str().unwrap(),
            ],
        );
        if out.status.success() {
            continue;
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        for file_error in [
            "error parsing",
            "error converting YAML",
            "unable to decode",
            "unknown field",
            "strict decoding error",
        ] {
            assert!(
                !stderr.contains(file_error),
                "{}: kubectl rejects the file: {stderr}",
                path.display()
            );
        }
        assert!(
            stderr.contains("127.0.0.1:1"),
            "{}: kubectl failed before reaching the server: {stderr}",
            path.display()
        );
    }
}

/// deploy/gateway's FlowSchema gives the gateway's heartbeats kubelets' priority level: the
/// gateway's ServiceAccount, Leases in kube-node-lease and Nodes with their status, at
/// `node-high` (kubelets' `system-node-high` schema's level), before `service-accounts`
/// (precedence 9000, `workload-low`) and after `system-node-high` (400).
#[test]
fn the_flow_schema_puts_the_gateways_heartbeats_at_node_high() {
    let objects = gateway_objects();
    let schema = the(&objects, |o| match o {
        Object::FlowSchema(f) => Some(f),
        _ => None,
    });
    let spec = schema.spec.unwrap();
    assert_eq!(spec.priority_level_configuration.name, "node-high");
    let precedence = spec.matching_precedence.unwrap();
    assert!((401..9000).contains(&precedence), "{precedence}");
    // By namespace: the renewals (kube-node-lease) one flow, the Node writes (cluster-scoped)
    // another; a schema cannot tell nodes apart (only users or namespaces).
    assert_eq!(spec.distinguisher_method.unwrap().type_, "ByNamespace");
    let rules = spec.rules.unwrap();
    assert_eq!(rules.len(), 1);
    let subjects = &rules[0].subjects;
    assert_eq!(subjects.len(), 1);
    let account = subjects[0].service_account.as_ref().unwrap();
    assert_eq!(
        (account.name.as_str(), account.namespace.as_str()),
        (SERVICE_ACCOUNT, NAMESPACE)
    );
    let resources: Vec<_> = rules[0]
        .resource_rules
        .iter()
        .flatten()
        .map(|r| {
            (
                r.api_groups.join(","),
                r.resources.join(","),
                r.namespaces.clone().unwrap_or_default().join(","),
                r.cluster_scope.unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(
        resources,
        [
            (
                "coordination.k8s.io".to_owned(),
                "leases".to_owned(),
                LEASE_NAMESPACE.to_owned(),
                false
            ),
            (
                String::new(),
                "nodes,nodes/status".to_owned(),
                String::new(),
                true
            ),
        ]
    );
}
