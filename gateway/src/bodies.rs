//! Building kubelet's apiserver bodies from `edgebeat.v1` messages: the initial Node, the
//! strategic-merge status patch, the Lease and Events.

use std::collections::BTreeMap;

use edgebeat_proto::{self as pb, ConditionStatus, NodeConditionType};
use jiff::Timestamp;
use jiff::fmt::temporal::DateTimePrinter;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Event, EventSource, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo,
    ObjectReference, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};

/// Namespace of node Leases (`kube-node-lease`).
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// Namespace of Events about Nodes: Node is cluster-scoped, so kubelet's events land in
/// `default`.
pub const EVENT_NAMESPACE: &str = "default";

/// The label the gateway puts on the Nodes it registers and the Leases it creates, and the
/// selector of its watches ([`crate::view`]): `edgebeat.io/managed-by=edgebeat-gateway`. Under the
/// `edgebeat.io` domain, which NodeRestriction lets a node set (labels under `kubernetes.io`
/// and `k8s.io` it would refuse, `plugin/pkg/admission/noderestriction/admission.go`).
pub const MANAGED_LABEL: (&str, &str) = ("edgebeat.io/managed-by", "edgebeat-gateway");

/// Annotation recording the certificate a node speaks with (mTLS, or signed MQTT): the
/// SHA-256 of its leaf certificate, 64 lower-case hex digits. Set by the gateway when the node
/// first speaks with it, and again on every newer certificate (a rotation); with
/// [`CERTIFICATE_NOT_BEFORE_ANNOTATION`], what every replica, restarted or not, reads to know
/// that the node speaks with an identity (its unidentified messages are someone else's) and
/// which certificate is its newest (an older one, a broker's rolled-back retained copy say,
/// is never believed).
pub const CERTIFICATE_SHA256_ANNOTATION: &str = "edgebeat.io/node-certificate-sha256";

/// Annotation beside [`CERTIFICATE_SHA256_ANNOTATION`]: the certificate's notBefore, RFC 3339
/// in UTC with whole seconds, e.g. `2026-11-25T13:00:00Z`.
pub const CERTIFICATE_NOT_BEFORE_ANNOTATION: &str = "edgebeat.io/node-certificate-not-before";

/// [`MANAGED_LABEL`] as a one-entry label map.
fn managed_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_LABEL.0.to_owned(), MANAGED_LABEL.1.to_owned())])
}

/// What the gateway remembers of one condition: its status and when it last changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownCondition {
    /// The status held ([`ConditionStatus::from_api`]: other text is `Unknown`).
    pub status: ConditionStatus,
    /// lastTransitionTime as written.
    pub last_transition: Timestamp,
}

/// Condition types an agent may report, the slots of [`KnownConditions`]: kubelet's, then
/// the health conditions.
const CONDITION_SLOTS: usize = NodeConditionType::ALL.len();

/// The [`KnownCondition`] of each condition type an agent may report
/// ([`NodeConditionType::KUBELET`], [`NodeConditionType::HEALTH`]),
/// the only ones the gateway diffs against; other types (a CNI's NetworkUnavailable,
/// node-problem-detector's) are not kept. One fixed slot per type, inline: at most 240
/// bytes per node whatever the Node holds, and no allocation. (Measured against the map of
/// owned strings it replaced, the gateway's RSS at 10,000 MQTT nodes moved by less than a
/// run's noise: `BENCHMARKS.md`, "Memory per node".)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownConditions([Option<KnownCondition>; CONDITION_SLOTS]);

impl KnownConditions {
    /// The slot of `type_`: its place in [`NodeConditionType::ALL`].
    fn slot(type_: NodeConditionType) -> usize {
        type_ as usize
    }

    /// The condition of `type_`, if held.
    pub fn get(&self, type_: NodeConditionType) -> Option<&KnownCondition> {
        self.0.get(Self::slot(type_))?.as_ref()
    }

    /// Whether a condition of `type_` is held.
    pub fn contains_key(&self, type_: NodeConditionType) -> bool {
        self.get(type_).is_some()
    }

    /// Records `condition` for `type_`.
    pub fn insert(&mut self, type_: NodeConditionType, condition: KnownCondition) {
        if let Some(slot) = self.0.get_mut(Self::slot(type_)) {
            *slot = Some(condition);
        }
    }

    /// Every condition held.
    pub fn values(&self) -> impl Iterator<Item = &KnownCondition> {
        self.0.iter().flatten()
    }

    /// Every condition held, with its type (kubelet's four, then the health conditions).
    pub fn iter(&self) -> impl Iterator<Item = (NodeConditionType, &KnownCondition)> {
        NodeConditionType::ALL
            .into_iter()
            .zip(&self.0)
            .filter_map(|(t, c)| Some((t, c.as_ref()?)))
    }
}

/// Truncates to whole seconds: `metav1.Time` keeps second precision only.
pub fn whole_seconds(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// The agent's conditions as written at `now` (gateway clock), as kubelet's setters write
/// them (`pkg/kubelet/nodestatus/setters.go`: `ReadyCondition`,
/// `MemoryPressureCondition`, …): a condition whose status equals what `known` says the
/// apiserver holds keeps its `lastTransitionTime`; any other — new, or changed, including
/// from the node lifecycle controller's `Unknown` — gets `now`. Heartbeat time is `now`;
/// the agent's `seconds_since_transition` is not used (kubelet stamps a transition when it
/// writes it). Order is the agent's (Ready last).
pub fn conditions(
    status: &pb::NodeStatus,
    now: Timestamp,
    known: &KnownConditions,
) -> Vec<NodeCondition> {
    let now = whole_seconds(now);
    status
        .conditions
        .iter()
        .map(|c| {
            let held = NodeConditionType::from_name(&c.r#type).and_then(|t| known.get(t));
            let transition = match held {
                Some(k) if k.status.as_str() == c.status => k.last_transition,
                _ => now,
            };
            NodeCondition {
                type_: c.r#type.clone(),
                status: c.status.clone(),
                reason: Some(c.reason.clone()),
                message: Some(c.message.clone()),
                last_heartbeat_time: Some(Time(now)),
                last_transition_time: Some(Time(transition)),
            }
        })
        .collect()
}

fn quantities(map: &std::collections::HashMap<String, String>) -> BTreeMap<String, Quantity> {
    map.iter()
        .map(|(k, v)| (k.clone(), Quantity(v.clone())))
        .collect()
}

/// The `core/v1` NodeStatus for a reported status, with conditions from [`conditions`].
pub fn node_status(status: &pb::NodeStatus, conditions: Vec<NodeCondition>) -> NodeStatus {
    let info = status.node_info.clone().unwrap_or_default();
    NodeStatus {
        capacity: Some(quantities(&status.capacity)),
        allocatable: Some(quantities(&status.allocatable)),
        conditions: Some(conditions),
        addresses: Some(
            status
                .addresses
                .iter()
                .map(|a| NodeAddress {
                    type_: a.r#type.clone(),
                    address: a.address.clone(),
                })
                .collect(),
        ),
        node_info: Some(NodeSystemInfo {
            machine_id: info.machine_id,
            system_uuid: info.system_uuid,
            boot_id: info.boot_id,
            kernel_version: info.kernel_version,
            os_image: info.os_image,
            container_runtime_version: info.container_runtime_version,
            kubelet_version: info.kubelet_version,
            kube_proxy_version: String::new(),
            operating_system: info.operating_system,
            architecture: info.architecture,
            ..Default::default()
        }),
        daemon_endpoints: (status.kubelet_endpoint_port > 0).then_some(
            k8s_openapi::api::core::v1::NodeDaemonEndpoints {
                kubelet_endpoint: Some(k8s_openapi::api::core::v1::DaemonEndpoint {
                    port: status.kubelet_endpoint_port,
                }),
            },
        ),
        ..Default::default()
    }
}

/// The Node kubelet POSTs at registration (`initialNode`): name, labels, taints
/// (`registerWithTaints`, plus `node.kubernetes.io/unschedulable:NoSchedule` when not
/// schedulable), unschedulable, and the full status. The attach/detach annotation is left
/// out: edgebeat nodes run no volume plugins.
pub fn initial_node(name: &str, register: &pb::Register, status: NodeStatus) -> Node {
    let mut labels: BTreeMap<String, String> = register.labels.clone().into_iter().collect();
    labels.extend(managed_labels());
    let mut taints: Vec<Taint> = register
        .taints
        .iter()
        .map(|t| Taint {
            key: t.key.clone(),
            value: Some(t.value.clone()).filter(|v| !v.is_empty()),
            effect: t.effect.clone(),
            time_added: None,
        })
        .collect();
    if register.unschedulable {
        taints.push(Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            value: None,
            effect: "NoSchedule".into(),
            time_added: None,
        });
    }
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            unschedulable: register.unschedulable.then_some(true),
            ..Default::default()
        }),
        status: Some(status),
    }
}

/// Adds to a [`status_patch`] body a strategic-merge `{"type": t, "$patch": "delete"}`
/// for each condition type of `types`, which removes it from the Node
/// (`apimachinery/pkg/util/strategicpatch`: `deleteDirective` in a merging list).
pub fn delete_conditions<'a>(
    mut body: serde_json::Value,
    types: impl IntoIterator<Item = &'a str>,
) -> serde_json::Value {
    if let Some(serde_json::Value::Array(conditions)) =
        body.get_mut("status").and_then(|s| s.get_mut("conditions"))
    {
        conditions.extend(
            types
                .into_iter()
                .map(|t| serde_json::json!({ "type": t, "$patch": "delete" })),
        );
    }
    body
}

/// The body of `PATCH nodes/{name}/status` (`application/strategic-merge-patch+json`), in
/// kubelet's shape: conditions merge by `type` with a `$setElementOrder/conditions`
/// directive keeping Ready last; addresses are replaced whole with `{"$patch":"replace"}`
/// (kubelet `fixupPatchForNodeStatusAddresses`); capacity and allocatable merge per key.
/// `annotations`, when given, merge into `metadata.annotations` in the same PATCH (the
/// status subresource keeps metadata changes: `pkg/registry/core/node/strategy.go`
/// `nodeStatusStrategy.PrepareForUpdate` resets only the spec).
///
/// Errors: serialization failure (not expected for these types).
pub fn status_patch(
    status: &NodeStatus,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<serde_json::Value, serde_json::Error> {
    let mut body = serde_json::to_value(status)?;
    if let serde_json::Value::Object(map) = &mut body {
        let order: Vec<serde_json::Value> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| {
                serde_json::Value::Object(serde_json::Map::from_iter([(
                    "type".to_owned(),
                    c.type_.clone().into(),
                )]))
            })
            .collect();
        map.insert(
            "$setElementOrder/conditions".to_owned(),
            serde_json::Value::Array(order),
        );
        if let Some(serde_json::Value::Array(addresses)) = map.get_mut("addresses") {
            addresses.push(serde_json::Value::Object(serde_json::Map::from_iter([(
                "$patch".to_owned(),
                "replace".into(),
            )])));
        }
    }
    let mut root = serde_json::Map::new();
    root.insert("status".to_owned(), body);
    if let Some(annotations) = annotations {
        let meta = serde_json::json!({ "annotations": annotations });
        root.insert("metadata".to_owned(), meta);
    }
    Ok(serde_json::Value::Object(root))
}

/// A node Lease as kubelet's lease controller builds it (`newLease`): name and holder are
/// the node name, no acquireTime or leaseTransitions, ownerReference to the Node with no
/// `controller`/`blockOwnerDeletion` (kubelet `SetNodeOwnerFunc`).
pub fn new_lease(name: &str, node_uid: &str, duration_seconds: i32, renew: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(LEASE_NAMESPACE.to_owned()),
            labels: Some(managed_labels()),
            owner_references: Some(vec![owner_reference(name, node_uid)]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_owned()),
            lease_duration_seconds: Some(duration_seconds),
            renew_time: Some(MicroTime(renew)),
            ..Default::default()
        }),
    }
}

/// The JSON body of a plain node Lease, [`new_lease`]`(name, node_uid, duration_seconds,
/// renew)` with `metadata.resourceVersion` = `resource_version` and `spec.holderIdentity` =
/// `holder` (the node name, or what a second writer put there, kept as kubelet keeps it):
/// the PUT of every renewal of a Lease the view knows to be plain
/// ([`crate::view::LeaseRecord::plain`]).
///
/// Written straight into bytes: the same bytes, field for field and escape for escape, as
/// `serde_json::to_vec` of that `Lease` (k8s-openapi's serializer, fields in its order;
/// the test `a_plain_lease_is_written_as_k8s_openapi_writes_it` compares them), at a
/// fraction of the instructions: building the `Lease`, serializing it through k8s-openapi
/// (renewTime through jiff's `strtime`) and dropping it took about a tenth of a renewal's
/// (BENCHMARKS.md, "A plain Lease written as bytes, Leases read as facts"). Strings go through serde_json's
/// escaping, so any name, UID or resourceVersion (the latter may come from the agent's
/// echo) is written as valid JSON. renewTime is `MicroTime`'s format,
/// `%Y-%m-%dT%H:%M:%S%.6fZ` in UTC (`apimachinery/pkg/apis/meta/v1/micro_time.go`).
pub fn plain_lease_json(
    name: &str,
    holder: &str,
    node_uid: &str,
    duration_seconds: i32,
    resource_version: &str,
    renew: Timestamp,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        400 + 2 * name.len() + holder.len() + node_uid.len() + resource_version.len(),
    );
    out.extend_from_slice(
        br#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"labels":{"#,
    );
    json_str(&mut out, MANAGED_LABEL.0);
    out.push(b':');
    json_str(&mut out, MANAGED_LABEL.1);
    out.extend_from_slice(br#"},"name":"#);
    json_str(&mut out, name);
    out.extend_from_slice(br#","namespace":"#);
    json_str(&mut out, LEASE_NAMESPACE);
    out.extend_from_slice(br#","ownerReferences":[{"apiVersion":"v1","kind":"Node","name":"#);
    json_str(&mut out, name);
    out.extend_from_slice(br#","uid":"#);
    json_str(&mut out, node_uid);
    out.extend_from_slice(br#"}],"resourceVersion":"#);
    json_str(&mut out, resource_version);
    out.extend_from_slice(br#"},"spec":{"holderIdentity":"#);
    json_str(&mut out, holder);
    out.extend_from_slice(br#","leaseDurationSeconds":"#);
    let _ = serde_json::to_writer(&mut out, &duration_seconds);
    out.extend_from_slice(br#","renewTime":"#);
    micro_time(&mut out, renew);
    out.extend_from_slice(b"}}");
    out
}

/// `s` as a JSON string, quoted and escaped by serde_json.
fn json_str(out: &mut Vec<u8>, s: &str) {
    // Writing a str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// `t` as k8s-openapi's `MicroTime` writes it: `"2026-11-27T03:27:28.123456Z"`, the
/// microseconds truncated as `%.6f` does, by jiff's RFC 3339 printer (far cheaper than the
/// `strtime` format k8s-openapi goes through). Years outside 0–9999 (never a renewTime),
/// which that printer writes in the extended form, go through k8s-openapi itself.
fn micro_time(out: &mut Vec<u8>, t: Timestamp) {
    static PRINTER: DateTimePrinter = DateTimePrinter::new().precision(Some(6));
    if !(0..=9999).contains(&jiff::tz::Offset::UTC.to_datetime(t).year()) {
        let _ = serde_json::to_writer(&mut *out, &MicroTime(t));
        return;
    }
    out.push(b'"');
    // Printing into a Vec cannot fail.
    let _ = PRINTER.print_timestamp(&t, &mut *out);
    out.push(b'"');
}

/// The Lease's ownerReference to its Node.
pub fn owner_reference(name: &str, node_uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: name.to_owned(),
        uid: node_uid.to_owned(),
        ..Default::default()
    }
}

/// `base` renewed: fresh `renewTime`, duration re-applied, ownerReference added when
/// missing and the Node's UID is known (kubelet `retryUpdateLease` + `SetNodeOwnerFunc`),
/// `holderIdentity` left as it is (kubelet's `newLease` sets it only when it creates the
/// Lease, `k8s.io/component-helpers/apimachinery/lease/controller.go`),
/// [`MANAGED_LABEL`] added when missing (a Lease created before the gateway labelled them).
/// Keeps `metadata.resourceVersion`, so the PUT is conditional.
pub fn renewed_lease(
    base: Lease,
    name: &str,
    node_uid: Option<&str>,
    duration_seconds: i32,
    renew: Timestamp,
) -> Lease {
    let mut lease = base;
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.renew_time = Some(MicroTime(renew));
    spec.lease_duration_seconds = Some(duration_seconds);
    lease
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .entry(MANAGED_LABEL.0.to_owned())
        .or_insert_with(|| MANAGED_LABEL.1.to_owned());
    if lease
        .metadata
        .owner_references
        .as_ref()
        .is_none_or(Vec::is_empty)
        && let Some(uid) = node_uid
    {
        lease.metadata.owner_references = Some(vec![owner_reference(name, uid)]);
    }
    lease
}

/// A `core/v1` Event about Node `name`, as kubelet records it: involvedObject Kind Node with
/// UID = node name (kubelet's `nodeRef`), source component `kubelet` on host `name`, in
/// namespace `default`, of type `type_`.
///
/// The object name is client-go's `<node>.<hex nanoseconds>`, with `unique` added to the
/// nanoseconds so events recorded at one instant get distinct names.
pub fn node_event(
    name: &str,
    type_: pb::EventType,
    reason: &str,
    message: String,
    now: Timestamp,
    unique: u64,
) -> Event {
    let nanos = now.as_nanosecond().wrapping_add(i128::from(unique));
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{nanos:x}")),
            namespace: Some(EVENT_NAMESPACE.to_owned()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            kind: Some("Node".into()),
            name: Some(name.to_owned()),
            uid: Some(name.to_owned()),
            ..Default::default()
        },
        reason: Some(reason.to_owned()),
        message: Some(message),
        type_: Some(type_.as_str().to_owned()),
        count: Some(1),
        first_timestamp: Some(Time(whole_seconds(now))),
        last_timestamp: Some(Time(whole_seconds(now))),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(name.to_owned()),
        }),
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(name.to_owned()),
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "bodies/tests.rs"]
mod tests;
