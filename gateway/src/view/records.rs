//! What the view keeps of each followed object: a Node's [`NodeRecord`] and a Lease's
//! [`LeaseRecord`], read from the objects the watches and writes return.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use edgebeat_proto::{ConditionStatus, NodeConditionType};
use edgebeat_transports::ingress::CertificateId;

use crate::bodies::{
    CERTIFICATE_NOT_BEFORE_ANNOTATION, CERTIFICATE_SHA256_ANNOTATION, KnownCondition,
    KnownConditions, MANAGED_LABEL,
};

/// What the gateway knows of one Node, as the apiserver holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeRecord {
    /// `metadata.resourceVersion` as an integer; `None` when it is not one.
    pub(super) resource_version: Option<u64>,
    /// `metadata.uid`, for the Lease's ownerReference.
    pub uid: Option<Box<str>>,
    /// `status.nodeInfo.bootID`, for kubelet's `Rebooted` event.
    pub boot_id: Option<Box<str>>,
    /// Status and lastTransitionTime of each condition, by type.
    pub conditions: KnownConditions,
    /// The Node carries [`MANAGED_LABEL`], so the Node watch follows it; a record of a
    /// Node without it (registered before the label, or the label removed) is only as
    /// fresh as the read or write that made it.
    pub managed: bool,
    /// The certificate the node speaks with, as its annotations record it
    /// ([`CERTIFICATE_SHA256_ANNOTATION`], [`CERTIFICATE_NOT_BEFORE_ANNOTATION`]): the node
    /// is identified, and no older certificate is believed for it.
    pub certificate: Option<CertificateId>,
    /// Its site, from its zone and region labels ([`crate::sites::site_of`]).
    pub site: Option<Box<str>>,
    /// Whether it holds [`crate::sites::SITE_CONDITION`] `True`.
    pub site_unreachable: bool,
    /// Whether it carries metrics-server's path annotation naming its own path
    /// ([`crate::resource_metrics::PATH_ANNOTATION`], [`crate::resource_metrics::node_path`]).
    pub resource_metrics_path: bool,
    /// Its `status.capacity` of CPU and memory, which its usage samples are held to.
    pub capacity: Option<crate::resource_metrics::Capacity>,
}

impl NodeRecord {
    /// The record of `node`.
    pub fn of(node: &Node) -> Self {
        let mut conditions = KnownConditions::default();
        for c in node
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
        {
            if let (Some(t), Some(type_)) = (
                &c.last_transition_time,
                NodeConditionType::from_name(&c.type_),
            ) {
                conditions.insert(
                    type_,
                    KnownCondition {
                        status: ConditionStatus::from_api(&c.status),
                        last_transition: t.0,
                    },
                );
            }
        }
        Self {
            resource_version: integer_version(node.metadata.resource_version.as_deref()),
            uid: node.metadata.uid.as_deref().map(Box::from),
            boot_id: node
                .status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| Box::from(i.boot_id.as_str())),
            conditions,
            managed: node.metadata.labels.as_ref().is_some_and(|labels| {
                labels.get(MANAGED_LABEL.0).map(String::as_str) == Some(MANAGED_LABEL.1)
            }),
            certificate: node
                .metadata
                .annotations
                .as_ref()
                .and_then(recorded_certificate),
            site: node
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| crate::sites::site_of(|k| labels.get(k).map(String::as_str))),
            site_unreachable: node
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| {
                    c.type_ == crate::sites::SITE_CONDITION
                        && ConditionStatus::from_api(&c.status).is_true()
                }),
            resource_metrics_path: node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::resource_metrics::PATH_ANNOTATION))
                .zip(node.metadata.name.as_deref())
                .is_some_and(|(path, name)| *path == crate::resource_metrics::node_path(name)),
            capacity: node
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(crate::resource_metrics::Capacity::of),
        }
    }

    /// Whether the apiserver holds a condition at `Unknown`: the node lifecycle controller
    /// wrote it (`pkg/controller/nodelifecycle/node_lifecycle_controller.go:
    /// tryUpdateNodeHealth`) and only a full status report repairs it.
    pub fn has_unknown_condition(&self) -> bool {
        self.conditions
            .values()
            .any(|c| c.status == ConditionStatus::Unknown)
    }
}

/// What the gateway knows of one node Lease, as the apiserver holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// `metadata.resourceVersion`, sent back with the next PUT.
    pub resource_version: Box<str>,
    /// `spec.renewTime` (microseconds).
    pub renew_time: Option<Timestamp>,
    /// The Lease holds nothing but what kubelet's `newLease` sets (name, namespace,
    /// ownerReference, holderIdentity, leaseDurationSeconds, renewTime) and
    /// [`MANAGED_LABEL`], so a PUT can be rebuilt from this record without dropping a
    /// field. When false the renewal reads the whole Lease first.
    pub plain: bool,
    /// `spec.holderIdentity`: the node name, unless a second writer put another there.
    /// kubelet keeps the holder it finds (its lease controller's `newLease` copies the
    /// Lease it last wrote or read, `k8s.io/component-helpers/apimachinery/lease/
    /// controller.go`), so a rebuilt PUT keeps it too.
    pub holder_identity: Option<Box<str>>,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: Option<i32>,
}

/// The certificate a Node's annotations record: a SHA-256 of 64 hex digits and an RFC 3339
/// notBefore; `None` when either is missing or malformed (then nothing is recorded).
pub(super) fn recorded_certificate(
    annotations: &BTreeMap<String, String>,
) -> Option<CertificateId> {
    let hex = annotations.get(CERTIFICATE_SHA256_ANNOTATION)?;
    let not_before: Timestamp = annotations
        .get(CERTIFICATE_NOT_BEFORE_ANNOTATION)?
        .parse()
        .ok()?;
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut sha256 = [0u8; 32];
    for (byte, pair) in sha256.iter_mut().zip(hex.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(CertificateId {
        sha256,
        not_before: not_before.as_second(),
    })
}

/// `resourceVersion` as the integer etcd3 storage encodes (see the module docs).
pub(super) fn integer_version(rv: Option<&str>) -> Option<u64> {
    rv?.parse().ok()
}
