//! What parsing one node Lease costs the gateway, whole (k8s-openapi's `Lease`) and in part
//! ([`PartialLease`], what the watch and the PUT answers use), for the Lease as the
//! stand-in sends it and as kube-apiserver does, with the `managedFields` entry of the
//! gateway's Update. Prints nanoseconds per parse, the best of 25 rounds of 20,000: this
//! VM's timings are noisy, and the best round is the figure that repeats.
//!
//! ```text
//! cargo bench -p edgebeat-gateway --bench lease_parse
//! ```

use std::hint::black_box;
use std::time::Instant;

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
}
