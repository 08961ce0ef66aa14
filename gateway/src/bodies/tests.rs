use super::*;

fn report() -> pb::NodeStatus {
    pb::NodeStatus {
        capacity: [("cpu".to_owned(), "4".to_owned())].into(),
        allocatable: [("cpu".to_owned(), "4".to_owned())].into(),
        conditions: ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
            .iter()
            .map(|t| pb::NodeCondition {
                r#type: (*t).into(),
                status: if *t == "Ready" { "True" } else { "False" }.into(),
                reason: "R".into(),
                message: "m".into(),
                seconds_since_transition: 30,
            })
            .collect(),
        addresses: vec![pb::NodeAddress {
            r#type: "InternalIP".into(),
            address: "10.0.3.7".into(),
        }],
        node_info: Some(pb::NodeSystemInfo {
            boot_id: "b".into(),
            ..Default::default()
        }),
        kubelet_endpoint_port: 0,
    }
}

#[test]
fn a_plain_lease_is_written_as_k8s_openapi_writes_it() {
    let times = [
        "2026-11-27T03:27:28.123456Z",
        "2026-01-02T00:00:00Z",
        "1999-12-31T23:59:59.999999Z",
        "0001-01-01T00:00:00.000001Z",
        "0000-03-01T00:00:00Z",
    ]
    .map(|t| t.parse::<Timestamp>().unwrap())
    .into_iter()
    .chain([Timestamp::MIN, Timestamp::MAX, Timestamp::UNIX_EPOCH]);
    let names = [
        ("edge-01", "6a1f0c2e-uid", "123456"),
        ("n", "", ""),
        ("quote\"back\\slash\u{1}\u{7f}é\u{2028}", "uid\t", "rv\n"),
    ];
    for t in times {
        for (name, uid, rv) in names {
            for duration in [40, 0, -1, i32::MAX, i32::MIN] {
                let mut lease = new_lease(name, uid, duration, t);
                lease.metadata.resource_version = Some(rv.to_owned());
                let whole = serde_json::to_vec(&lease).unwrap();
                let lean = plain_lease_json(name, name, uid, duration, rv, t);
                assert_eq!(
                    String::from_utf8_lossy(&lean),
                    String::from_utf8_lossy(&whole),
                    "at {t}"
                );
                // A holder a second writer put there, kept.
                lease.spec.as_mut().unwrap().holder_identity = Some("second-writer".into());
                let whole = serde_json::to_vec(&lease).unwrap();
                let lean = plain_lease_json(name, "second-writer", uid, duration, rv, t);
                assert_eq!(
                    String::from_utf8_lossy(&lean),
                    String::from_utf8_lossy(&whole),
                    "at {t}, held by another"
                );
            }
        }
    }
}

#[test]
fn known_conditions_are_inline_slots() {
    // The per-node cost the view's docs state.
    assert!(std::mem::size_of::<KnownConditions>() <= 240);
    let mut known = KnownConditions::default();
    let at: Timestamp = "2026-11-21T10:00:00Z".parse().unwrap();
    for t in NodeConditionType::ALL {
        known.insert(
            t,
            KnownCondition {
                status: ConditionStatus::False,
                last_transition: at,
            },
        );
    }
    assert_eq!(known.values().count(), CONDITION_SLOTS);
    assert!(known.contains_key(NodeConditionType::UnderVoltage));
    assert!(
        known
            .iter()
            .map(|(t, _)| t)
            .eq(NodeConditionType::ALL.into_iter()),
        "one slot per type, in order"
    );
}

#[test]
fn transitions_are_kept_when_unchanged_and_now_otherwise() {
    let now: Timestamp = "2026-11-21T10:00:00.750Z".parse().unwrap();
    let second: Timestamp = "2026-11-21T10:00:00Z".parse().unwrap();
    let earlier: Timestamp = "2026-11-20T08:00:00Z".parse().unwrap();
    let unknown_at: Timestamp = "2026-11-21T09:59:50Z".parse().unwrap();
    let held = |status: &str, at| KnownCondition {
        status: ConditionStatus::from_api(status),
        last_transition: at,
    };
    let mut known = KnownConditions::default();
    known.insert(NodeConditionType::Ready, held("True", earlier));
    known.insert(NodeConditionType::MemoryPressure, held("True", earlier));
    // The node lifecycle controller's Unknown, during an outage.
    known.insert(NodeConditionType::DiskPressure, held("Unknown", unknown_at));
    assert_eq!(known.values().count(), 3);
    let c = conditions(&report(), now, &known);
    assert_eq!(c.len(), 4);
    assert_eq!(c[3].type_, "Ready", "Ready last");
    let transition = |i: usize| c[i].last_transition_time.as_ref().unwrap().0;
    assert_eq!(transition(3), earlier, "unchanged status keeps the time");
    assert_eq!(transition(0), second, "changed status: now");
    assert_eq!(
        transition(1),
        second,
        "after the controller's Unknown: now, as kubelet (not the Unknown's time)"
    );
    assert_eq!(transition(2), second, "new condition: now");
    assert_eq!(c[1].last_heartbeat_time.as_ref().unwrap().0, second);
}

#[test]
fn unschedulable_registration_adds_kubelets_taint() {
    let register = pb::Register {
        unschedulable: true,
        ..Default::default()
    };
    let node = initial_node("edge-01", &register, NodeStatus::default());
    let taints = node.spec.unwrap().taints.unwrap();
    assert_eq!(taints[0].key, "node.kubernetes.io/unschedulable");
    assert_eq!(taints[0].effect, "NoSchedule");
}

#[test]
fn status_patch_has_kubelets_directives() {
    let now: Timestamp = "2026-11-21T10:00:00Z".parse().unwrap();
    let s = node_status(
        &report(),
        conditions(&report(), now, &KnownConditions::default()),
    );
    let patch = status_patch(&s, None).unwrap();
    let status = &patch["status"];
    assert_eq!(
        status["$setElementOrder/conditions"],
        serde_json::json!([{"type":"MemoryPressure"},{"type":"DiskPressure"},{"type":"PIDPressure"},{"type":"Ready"}])
    );
    assert_eq!(
        status["addresses"][1],
        serde_json::json!({"$patch": "replace"})
    );
    assert_eq!(
        status["conditions"][3]["lastHeartbeatTime"],
        "2026-11-21T10:00:00Z"
    );
    assert!(patch.get("metadata").is_none());
    assert!(status.get("daemonEndpoints").is_none());
}

#[test]
fn a_renewal_keeps_the_holder_identity_it_finds() {
    let t: Timestamp = "2026-11-21T10:00:00Z".parse().unwrap();
    let mut base = new_lease("edge-01", "uid-1", 40, t);
    base.spec.as_mut().unwrap().holder_identity = Some("someone-else".to_owned());
    let renewed = renewed_lease(base, "edge-01", Some("uid-1"), 40, t);
    assert_eq!(
        renewed.spec.unwrap().holder_identity.as_deref(),
        Some("someone-else")
    );
}

#[test]
fn lease_has_kubelets_shape_and_micro_time() {
    let t: Timestamp = "2026-11-21T10:00:00.123456789Z".parse().unwrap();
    let lease = new_lease("edge-01", "uid-1", 40, t);
    let v = serde_json::to_value(&lease).unwrap();
    assert_eq!(v["spec"]["renewTime"], "2026-11-21T10:00:00.123456Z");
    assert_eq!(v["spec"]["holderIdentity"], "edge-01");
    assert!(v["spec"].get("acquireTime").is_none());
    assert_eq!(
        v["metadata"]["ownerReferences"],
        serde_json::json!([{"apiVersion":"v1","kind":"Node","name":"edge-01","uid":"uid-1"}])
    );
}
