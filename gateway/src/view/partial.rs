//! A node Lease parsed in part: what the view keeps of a Lease ([`LeaseRecord`]) and what
//! tells whether it is plain, and nothing else.
//!
//! Every renewal brings the gateway a Lease twice, as the answer to its PUT and as the
//! watch event of that PUT, and every replica parses the watch events of every other
//! replica's renewals too. Most of a Lease is fields nobody here reads: `uid`,
//! `creationTimestamp`, `apiVersion`/`kind`, and from a real kube-apiserver `managedFields`,
//! which k8s-openapi's whole `Lease` builds into a tree of `serde_json::Value`s. serde
//! skips the fields a type does not name (it still scans them, but builds nothing), so this
//! type names only what is read: with kube-apiserver's `managedFields` a Lease parses in
//! about half the time (`cargo bench -p edgebeat-gateway --bench lease_parse`; BENCHMARKS.md,
//! "What was cut"). A Lease read to be written back whole (a GET before a PUT of a Lease
//! that is not plain) is still parsed in full as k8s-openapi's `Lease`.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use serde::{Deserialize, Deserializer};

use super::LeaseRecord;

/// A Lease (`coordination.k8s.io/v1`) with only the fields [`LeaseRecord::of`] reads:
/// `metadata` name, resourceVersion, labels, annotations, finalizers and
/// ownerReferences; `spec` holderIdentity, leaseDurationSeconds and renewTime, and whether
/// each other spec field is set. What the apiserver sends besides is skipped unparsed.
/// Read-only: it is never written back (a PUT would drop what it skipped).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PartialLease {
    /// The fields named above; the rest of `ObjectMeta` stays `None`.
    #[serde(default, deserialize_with = "partial_meta")]
    pub metadata: ObjectMeta,
    /// `spec`, in part.
    #[serde(default)]
    pub spec: Option<PartialLeaseSpec>,
}

/// `LeaseSpec` in part (see [`PartialLease`]).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PartialLeaseSpec {
    /// `holderIdentity`: kubelet sets its node name.
    #[serde(default)]
    pub holder_identity: Option<String>,
    /// `leaseDurationSeconds`.
    #[serde(default)]
    pub lease_duration_seconds: Option<i32>,
    /// `renewTime` (microseconds).
    #[serde(default)]
    pub renew_time: Option<MicroTime>,
    /// Whether `acquireTime` is set (not null). kubelet's `newLease` sets none of
    /// `acquireTime`, `leaseTransitions`, `preferredHolder` and `strategy`, so a Lease with
    /// any is not plain; they are read for presence only, their values skipped.
    #[serde(default, deserialize_with = "set")]
    pub acquire_time: bool,
    /// Whether `leaseTransitions` is set (see [`PartialLeaseSpec::acquire_time`]).
    #[serde(default, deserialize_with = "set")]
    pub lease_transitions: bool,
    /// Whether `preferredHolder` is set (see [`PartialLeaseSpec::acquire_time`]).
    #[serde(default, deserialize_with = "set")]
    pub preferred_holder: bool,
    /// Whether `strategy` is set (see [`PartialLeaseSpec::acquire_time`]).
    #[serde(default, deserialize_with = "set")]
    pub strategy: bool,
}

impl PartialLeaseSpec {
    /// Whether a field kubelet's `newLease` never sets is set.
    pub fn more_than_kubelet_sets(&self) -> bool {
        self.acquire_time || self.lease_transitions || self.preferred_holder || self.strategy
    }
}

/// Whether a field is set (not null), its value skipped unparsed.
fn set<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::<serde::de::IgnoredAny>::deserialize(deserializer)?.is_some())
}

/// `ObjectMeta` with only the fields [`PartialLease`] names parsed.
fn partial_meta<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        resource_version: Option<String>,
        #[serde(default)]
        labels: Option<BTreeMap<String, String>>,
        #[serde(default)]
        annotations: Option<BTreeMap<String, String>>,
        #[serde(default)]
        finalizers: Option<Vec<String>>,
        #[serde(default)]
        owner_references: Option<Vec<OwnerReference>>,
    }
    let m = Meta::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: m.name,
        resource_version: m.resource_version,
        labels: m.labels,
        annotations: m.annotations,
        finalizers: m.finalizers,
        owner_references: m.owner_references,
        ..ObjectMeta::default()
    })
}

impl From<&Lease> for PartialLease {
    /// The same fields of a whole `Lease` (read by a GET).
    fn from(lease: &Lease) -> Self {
        let m = &lease.metadata;
        Self {
            metadata: ObjectMeta {
                name: m.name.clone(),
                resource_version: m.resource_version.clone(),
                labels: m.labels.clone(),
                annotations: m.annotations.clone(),
                finalizers: m.finalizers.clone(),
                owner_references: m.owner_references.clone(),
                ..ObjectMeta::default()
            },
            spec: lease.spec.as_ref().map(|s| PartialLeaseSpec {
                holder_identity: s.holder_identity.clone(),
                lease_duration_seconds: s.lease_duration_seconds,
                renew_time: s.renew_time.clone(),
                acquire_time: s.acquire_time.is_some(),
                lease_transitions: s.lease_transitions.is_some(),
                preferred_holder: s.preferred_holder.is_some(),
                strategy: s.strategy.is_some(),
            }),
        }
    }
}

impl k8s_openapi::Resource for PartialLease {
    const API_VERSION: &'static str = <Lease as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Lease as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Lease as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Lease as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Lease as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Lease as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for PartialLease {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl LeaseRecord {
    /// The record of `lease`, the one rule for a Lease from any source (a whole Lease
    /// converts with `PartialLease::from`); `None` without a resourceVersion (not a stored
    /// object).
    pub fn of(lease: &PartialLease) -> Option<Self> {
        let meta = &lease.metadata;
        let name = meta.name.as_deref().unwrap_or_default();
        let only_managed_label = meta.labels.as_ref().is_none_or(|labels| {
            labels
                .iter()
                .all(|(k, v)| (k.as_str(), v.as_str()) == super::MANAGED_LABEL)
        });
        let spec = lease.spec.as_ref();
        let plain = only_managed_label
            && meta.annotations.as_ref().is_none_or(BTreeMap::is_empty)
            && meta.finalizers.as_ref().is_none_or(Vec::is_empty)
            && meta.owner_references.as_ref().is_some_and(|refs| {
                matches!(refs.as_slice(), [r] if r.kind == "Node" && r.name == name
                    && r.controller.is_none() && r.block_owner_deletion.is_none())
            })
            && spec.is_some_and(|s| {
                s.holder_identity.as_deref() == Some(name) && !s.more_than_kubelet_sets()
            });
        Some(Self {
            resource_version: Box::from(meta.resource_version.as_deref()?),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            plain,
            duration_seconds: spec.and_then(|s| s.lease_duration_seconds),
        })
    }
}
