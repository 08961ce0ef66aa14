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

use std::fmt;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::{LeaseRecord, MANAGED_LABEL};

/// A Lease (`coordination.k8s.io/v1`) with only what [`LeaseRecord::of`] reads: `metadata`
/// name and resourceVersion, `spec` holderIdentity, leaseDurationSeconds and renewTime, and
/// of everything else only what tells a plain Lease ([`LeaseExtras`]). What the apiserver
/// sends besides is skipped unparsed, and nothing of labels, annotations, finalizers or
/// ownerReferences is kept but those facts. Read-only: it is never written back (a PUT
/// would drop what it skipped).
#[derive(Clone, Debug, Default)]
pub struct PartialLease {
    /// `name` and `resourceVersion`; the rest of `ObjectMeta` stays `None` (kube-runtime's
    /// watcher reads the resourceVersion from here).
    pub metadata: ObjectMeta,
    /// `spec`, in part.
    pub spec: Option<PartialLeaseSpec>,
    /// What the rest of `metadata` says of the Lease.
    pub extras: LeaseExtras,
}

/// What a Lease's labels, annotations, finalizers and ownerReferences say of it, the only
/// facts [`LeaseRecord::of`] reads from them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseExtras {
    /// A label other than [`MANAGED_LABEL`], an annotation or a finalizer is set:
    /// kubelet's `newLease` sets none.
    pub more_than_kubelet_sets: bool,
    /// The name in the Lease's ownerReference when there is exactly one, of kind `Node`,
    /// with neither `controller` nor `blockOwnerDeletion` set (kubelet's
    /// `SetNodeOwnerFunc`); `None` otherwise.
    pub node_owner: Option<String>,
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
    Ok(Option::<IgnoredAny>::deserialize(deserializer)?.is_some())
}

impl<'de> Deserialize<'de> for PartialLease {
    /// The Lease's JSON, fields in any order, unknown ones skipped. Labels are compared
    /// where they lie and ownerReferences read for kind, name, controller and
    /// blockOwnerDeletion only; the only strings kept are the name, resourceVersion,
    /// holderIdentity and the owner's name.
    ///
    /// Errors: serde_json's for malformed JSON or a field of the wrong type.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: Meta,
            #[serde(default)]
            spec: Option<PartialLeaseSpec>,
        }
        #[derive(Default, Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta {
            #[serde(default)]
            name: Option<String>,
            #[serde(default)]
            resource_version: Option<String>,
            #[serde(default)]
            labels: Option<OtherLabels>,
            #[serde(default)]
            annotations: Option<Entries<true>>,
            #[serde(default)]
            finalizers: Option<Entries<false>>,
            #[serde(default)]
            owner_references: Option<NodeOwner>,
        }
        let Wire { metadata: m, spec } = Wire::deserialize(deserializer)?;
        Ok(Self {
            metadata: ObjectMeta {
                name: m.name,
                resource_version: m.resource_version,
                ..ObjectMeta::default()
            },
            spec,
            extras: LeaseExtras {
                more_than_kubelet_sets: m.labels.is_some_and(|l| l.0)
                    || m.annotations.is_some_and(|a| a.0 > 0)
                    || m.finalizers.is_some_and(|f| f.0 > 0),
                node_owner: m.owner_references.and_then(|o| o.0),
            },
        })
    }
}

/// Whether a label map holds a label other than [`MANAGED_LABEL`], compared in place. A
/// key repeated in the JSON is compared each time (a map would keep the last value), which
/// can only make a Lease not plain; kube-apiserver never repeats one.
struct OtherLabels(bool);

impl<'de> Deserialize<'de> for OtherLabels {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Labels;
        impl<'de> Visitor<'de> for Labels {
            type Value = OtherLabels;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of labels")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OtherLabels, A::Error> {
                let mut other = false;
                while let Some(key) = map.next_key_seed(StrIs(MANAGED_LABEL.0))? {
                    let value = map.next_value_seed(StrIs(MANAGED_LABEL.1))?;
                    other |= !(key && value);
                }
                Ok(OtherLabels(other))
            }
        }
        deserializer.deserialize_map(Labels)
    }
}

/// How many strings a JSON object of strings (`MAP`: annotations) or a list of strings
/// (finalizers) holds, the strings kept nowhere; anything else is an error, as it was for
/// k8s-openapi's `BTreeMap<String, String>` and `Vec<String>`.
struct Entries<const MAP: bool>(usize);

impl<'de, const MAP: bool> Deserialize<'de> for Entries<MAP> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Count<const MAP: bool>;
        impl<'de, const MAP: bool> Visitor<'de> for Count<MAP> {
            type Value = Entries<MAP>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of strings or a list of strings")
            }
            // `StrIs("")` only to require a string: the comparison is not read.
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries<MAP>, A::Error> {
                let mut n = 0;
                while map.next_key_seed(StrIs(""))?.is_some() {
                    map.next_value_seed(StrIs(""))?;
                    n += 1;
                }
                Ok(Entries(n))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Entries<MAP>, A::Error> {
                let mut n = 0;
                while seq.next_element_seed(StrIs(""))?.is_some() {
                    n += 1;
                }
                Ok(Entries(n))
            }
        }
        match MAP {
            true => deserializer.deserialize_map(Count),
            false => deserializer.deserialize_seq(Count),
        }
    }
}

/// The owner's name when `ownerReferences` holds exactly one, of kind `Node`, with neither
/// `controller` nor `blockOwnerDeletion` set (see [`LeaseExtras::node_owner`]).
struct NodeOwner(Option<String>);

impl<'de> Deserialize<'de> for NodeOwner {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Null or absent `kind` and `name` read as "" (k8s-openapi's defaults).
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Reference {
            #[serde(default)]
            kind: Option<IsNode>,
            #[serde(default)]
            name: Option<String>,
            #[serde(default, deserialize_with = "set")]
            controller: bool,
            #[serde(default, deserialize_with = "set")]
            block_owner_deletion: bool,
        }
        struct IsNode(bool);
        impl<'de> Deserialize<'de> for IsNode {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                StrIs("Node").deserialize(deserializer).map(IsNode)
            }
        }
        struct References;
        impl<'de> Visitor<'de> for References {
            type Value = NodeOwner;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of ownerReferences")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NodeOwner, A::Error> {
                let first = seq.next_element::<Reference>()?;
                let mut more = false;
                while seq.next_element::<Reference>()?.is_some() {
                    more = true;
                }
                Ok(NodeOwner(
                    first
                        .filter(|r| {
                            !more
                                && r.kind.as_ref().is_some_and(|k| k.0)
                                && !r.controller
                                && !r.block_owner_deletion
                        })
                        .map(|r| r.name.unwrap_or_default()),
                ))
            }
        }
        deserializer.deserialize_seq(References)
    }
}

/// Whether a JSON string equals the one given, compared without keeping it.
#[derive(Clone, Copy)]
struct StrIs(&'static str);

impl<'de> DeserializeSeed<'de> for StrIs {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for StrIs {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}

impl From<&Lease> for PartialLease {
    /// The same facts of a whole `Lease` (read by a GET).
    fn from(lease: &Lease) -> Self {
        let m = &lease.metadata;
        let node_owner = match m.owner_references.as_deref() {
            Some([r])
                if r.kind == "Node"
                    && r.controller.is_none()
                    && r.block_owner_deletion.is_none() =>
            {
                Some(r.name.clone())
            }
            _ => None,
        };
        Self {
            metadata: ObjectMeta {
                name: m.name.clone(),
                resource_version: m.resource_version.clone(),
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
            extras: LeaseExtras {
                more_than_kubelet_sets: m.labels.as_ref().is_some_and(|labels| {
                    labels
                        .iter()
                        .any(|(k, v)| (k.as_str(), v.as_str()) != MANAGED_LABEL)
                }) || m.annotations.as_ref().is_some_and(|a| !a.is_empty())
                    || m.finalizers.as_ref().is_some_and(|f| !f.is_empty()),
                node_owner,
            },
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
        let spec = lease.spec.as_ref();
        let plain = !lease.extras.more_than_kubelet_sets
            && lease.extras.node_owner.as_deref() == Some(name)
            && spec.is_some_and(|s| s.holder_identity.is_some() && !s.more_than_kubelet_sets());
        Some(Self {
            resource_version: Box::from(meta.resource_version.as_deref()?),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            plain,
            holder_identity: spec
                .and_then(|s| s.holder_identity.as_deref())
                .map(Box::from),
            duration_seconds: spec.and_then(|s| s.lease_duration_seconds),
        })
    }
}
