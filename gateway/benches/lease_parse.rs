//! What parsing one node Lease costs the gateway, whole (k8s-openapi's `Lease`) and in part
//! ([`PartialLease`], what the watch and the PUT answers use), for the Lease as the
//! stand-in sends it and as kube-apiserver does, with the `managedFields` entry of the
//! gateway's Update; and, for the decision issue 29 asks for, the same Lease in kubelet's
//! default wire format, protobuf (`application/vnd.kubernetes.protobuf`), decoded and
//! encoded; and a plain Lease's PUT body built and serialized by k8s-openapi against
//! [`bodies::plain_lease_json`]. Prints nanoseconds per call, the best of 25 rounds of
//! 20,000: this VM's timings are noisy, and the best round is the figure that repeats.
//!
//! ```text
//! cargo bench -p edgebeat-gateway --bench lease_parse
//! ```

use std::hint::black_box;
use std::time::Instant;

use edgebeat_gateway::bodies;
use edgebeat_gateway::view::{LeaseRecord, PartialLease};
use k8s_openapi::api::coordination::v1::Lease;

/// A renewed node Lease as the apiserver returns it; `managed_fields` adds the entry
/// kube-apiserver keeps for kubelet's Update (`metadata.managedFields`).
fn lease_json(managed_fields: bool) -> Vec<u8> {
    let mut lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "creationTimestamp": "2026-11-26T20:00:00Z",
            "labels": {"edgebeat.io/managed": "true"},
            "name": "edge-node-00042",
            "namespace": "kube-node-lease",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "edge-node-00042",
                                 "uid": "8f0c1b7e-5a0e-4c1e-9d7a-0b9e6f1c2d3e"}],
            "resourceVersion": "1234567",
            "uid": "1c9d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f"
        },
        "spec": {
            "holderIdentity": "edge-node-00042",
            "leaseDurationSeconds": 40,
            "renewTime": "2026-11-26T21:12:34.567890Z"
        }
    });
    if managed_fields {
        lease["metadata"]["managedFields"] = serde_json::json!([{
            "apiVersion": "coordination.k8s.io/v1",
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:labels": {".": {}, "f:edgebeat.io/managed": {}},
                               "f:ownerReferences": {".": {},
                                   "k:{\"uid\":\"8f0c1b7e-5a0e-4c1e-9d7a-0b9e6f1c2d3e\"}": {}}},
                "f:spec": {"f:holderIdentity": {}, "f:leaseDurationSeconds": {}, "f:renewTime": {}}
            },
            "manager": "edgebeat-gateway",
            "operation": "Update",
            "time": "2026-11-26T21:12:34Z"
        }]);
    }
    serde_json::to_vec(&lease).unwrap_or_default()
}

/// Best nanoseconds per call of `parse` over 25 rounds of `n`.
// Wall time of a CPU-bound loop, outside any tokio runtime: std's clock is the one to read.
#[allow(clippy::disallowed_methods)]
fn per_parse(n: u32, mut parse: impl FnMut() -> bool) -> f64 {
    (0..25)
        .map(|_| {
            let start = Instant::now();
            let mut ok = 0u32;
            for _ in 0..n {
                ok += u32::from(black_box(parse()));
            }
            assert_eq!(ok, n, "every parse succeeds");
            start.elapsed().as_nanos() as f64 / f64::from(n)
        })
        .fold(f64::INFINITY, f64::min)
}

/// The Lease in protobuf, as kube-apiserver sends it: the envelope of
/// `staging/src/k8s.io/apimachinery/pkg/runtime/serializer/protobuf/protobuf.go` (the bytes
/// `k8s\0`, then a `runtime.Unknown` whose `raw` is the object), field numbers of
/// `k8s.io/api/coordination/v1/generated.proto` and
/// `k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`. Only the fields the JSON above
/// carries are declared; `managedFields[].fieldsV1` is raw bytes in protobuf (its JSON text),
/// not a tree.
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeMeta {
        #[prost(string, tag = "1")]
        pub api_version: String,
        #[prost(string, tag = "2")]
        pub kind: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Unknown {
        #[prost(message, optional, tag = "1")]
        pub type_meta: Option<TypeMeta>,
        #[prost(bytes = "vec", tag = "2")]
        pub raw: Vec<u8>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Time {
        #[prost(int64, tag = "1")]
        pub seconds: i64,
        #[prost(int32, tag = "2")]
        pub nanos: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct OwnerReference {
        #[prost(string, tag = "1")]
        pub kind: String,
        #[prost(string, tag = "3")]
        pub name: String,
        #[prost(string, tag = "4")]
        pub uid: String,
        #[prost(string, tag = "5")]
        pub api_version: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FieldsV1 {
        #[prost(bytes = "vec", tag = "1")]
        pub raw: Vec<u8>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ManagedFieldsEntry {
        #[prost(string, tag = "1")]
        pub manager: String,
        #[prost(string, tag = "2")]
        pub operation: String,
        #[prost(string, tag = "3")]
        pub api_version: String,
        #[prost(message, optional, tag = "4")]
        pub time: Option<Time>,
        #[prost(string, tag = "6")]
        pub fields_type: String,
        #[prost(message, optional, tag = "7")]
        pub fields_v1: Option<FieldsV1>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ObjectMeta {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "3")]
        pub namespace: String,
        #[prost(string, tag = "5")]
        pub uid: String,
        #[prost(string, tag = "6")]
        pub resource_version: String,
        #[prost(message, optional, tag = "8")]
        pub creation_timestamp: Option<Time>,
        #[prost(btree_map = "string, string", tag = "11")]
        pub labels: std::collections::BTreeMap<String, String>,
        #[prost(message, repeated, tag = "13")]
        pub owner_references: Vec<OwnerReference>,
        #[prost(message, repeated, tag = "17")]
        pub managed_fields: Vec<ManagedFieldsEntry>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseSpec {
        #[prost(string, optional, tag = "1")]
        pub holder_identity: Option<String>,
        #[prost(int32, optional, tag = "2")]
        pub lease_duration_seconds: Option<i32>,
        #[prost(message, optional, tag = "4")]
        pub renew_time: Option<Time>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Lease {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, optional, tag = "2")]
        pub spec: Option<LeaseSpec>,
    }

    /// The protobuf form of the JSON Lease `json` (`managed_fields`: with the entry).
    pub fn lease(managed_fields: bool) -> Lease {
        let time = |seconds, nanos| Some(Time { seconds, nanos });
        Lease {
            metadata: Some(ObjectMeta {
                name: "edge-node-00042".into(),
                namespace: "kube-node-lease".into(),
                uid: "1c9d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f".into(),
                resource_version: "1234567".into(),
                creation_timestamp: time(1_795_723_200, 0),
                labels: [("edgebeat.io/managed".to_owned(), "true".to_owned())].into(),
                owner_references: vec![OwnerReference {
                    kind: "Node".into(),
                    name: "edge-node-00042".into(),
                    uid: "8f0c1b7e-5a0e-4c1e-9d7a-0b9e6f1c2d3e".into(),
                    api_version: "v1".into(),
                }],
                managed_fields: if managed_fields {
                    vec![ManagedFieldsEntry {
                        manager: "edgebeat-gateway".into(),
                        operation: "Update".into(),
                        api_version: "coordination.k8s.io/v1".into(),
                        time: time(1_795_727_554, 0),
                        fields_type: "FieldsV1".into(),
                        fields_v1: Some(FieldsV1 {
                            raw: br#"{"f:metadata":{"f:labels":{".":{},"f:edgebeat.io/managed":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"8f0c1b7e-5a0e-4c1e-9d7a-0b9e6f1c2d3e\"}":{}}},"f:spec":{"f:holderIdentity":{},"f:leaseDurationSeconds":{},"f:renewTime":{}}}"#.to_vec(),
                        }),
                    }]
                } else {
                    Vec::new()
                },
            }),
            spec: Some(LeaseSpec {
                holder_identity: Some("edge-node-00042".into()),
                lease_duration_seconds: Some(40),
                renew_time: time(1_795_727_554, 567_890_000),
            }),
        }
    }

    /// `lease` in the envelope, as on the wire.
    pub fn wire(lease: &Lease) -> Vec<u8> {
        use prost::Message as _;
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: "coordination.k8s.io/v1".into(),
                kind: "Lease".into(),
            }),
            raw: lease.encode_to_vec(),
        };
        let mut wire = b"k8s\0".to_vec();
        unknown.encode(&mut wire).unwrap_or_default();
        wire
    }

    /// Decodes the envelope and the Lease in it.
    pub fn decode(wire: &[u8]) -> Option<Lease> {
        use prost::Message as _;
        let unknown = Unknown::decode(wire.strip_prefix(b"k8s\0")?).ok()?;
        Lease::decode(unknown.raw.as_slice()).ok()
    }
}

fn main() {
    const N: u32 = 20_000;
    println!("lease_json                    bytes  whole Lease  PartialLease  (ns per parse)");
    for (label, managed) in [
        ("as the stand-in sends it", false),
        ("with managedFields", true),
    ] {
        let json = lease_json(managed);
        let whole = per_parse(N, || {
            serde_json::from_slice::<Lease>(black_box(&json)).is_ok()
        });
        let partial = per_parse(N, || {
            serde_json::from_slice::<PartialLease>(black_box(&json))
                .ok()
                .and_then(|l| LeaseRecord::of(&l))
                .is_some()
        });
        println!(
            "{label:<28} {:>6} {whole:>12.0} {partial:>13.0}",
            json.len()
        );
    }
    println!();
    println!(
        "encode and decode, both ways    JSON bytes  JSON ser  protobuf bytes  protobuf enc  protobuf dec (ns per call)"
    );
    for (label, managed) in [
        ("as the stand-in sends it", false),
        ("with managedFields", true),
    ] {
        let json = lease_json(managed);
        let Ok(lease) = serde_json::from_slice::<Lease>(&json) else {
            panic!("the JSON Lease parses");
        };
        let proto = pb::lease(managed);
        let wire = pb::wire(&proto);
        assert_eq!(
            pb::decode(&wire).as_ref(),
            Some(&proto),
            "the protobuf Lease round-trips"
        );
        let ser = per_parse(N, || {
            serde_json::to_vec(black_box(&lease)).is_ok_and(|v| !v.is_empty())
        });
        let enc = per_parse(N, || !pb::wire(black_box(&proto)).is_empty());
        let dec = per_parse(N, || pb::decode(black_box(&wire)).is_some());
        println!(
            "{label:<30} {:>11} {ser:>9.0} {:>15} {enc:>13.0} {dec:>13.0}",
            json.len(),
            wire.len()
        );
    }
    println!();
    println!(
        "a plain Lease's PUT body          bytes  new_lease + to_vec  plain_lease_json (ns per body)"
    );
    let (name, uid, rv) = (
        "edge-node-00042",
        "8f0c1b7e-5a0e-4c1e-9d7a-0b9e6f1c2d3e",
        "1234567",
    );
    let Ok(renew) = "2026-11-26T21:12:34.567890Z".parse::<jiff::Timestamp>() else {
        panic!("the renewTime parses");
    };
    let body = bodies::plain_lease_json(name, name, uid, 40, rv, renew);
    let whole = per_parse(N, || {
        let mut lease = bodies::new_lease(black_box(name), uid, 40, renew);
        lease.metadata.resource_version = Some(rv.to_owned());
        serde_json::to_vec(&lease).is_ok_and(|v| v.len() == body.len())
    });
    let lean = per_parse(N, || {
        bodies::plain_lease_json(black_box(name), name, uid, 40, rv, renew).len() == body.len()
    });
    println!(
        "{:<32} {:>6} {whole:>19.0} {lean:>17.0}",
        "edge-node-00042",
        body.len()
    );
}
