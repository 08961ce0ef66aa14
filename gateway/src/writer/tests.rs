use super::*;

#[test]
fn lease_state_round_trips_and_rejects_garbage() {
    let state = LeaseState {
        resource_version: "884213".into(),
        renew_time: "2026-11-21T10:00:00.123456Z".parse().unwrap(),
    };
    let bytes = state.encode();
    assert_eq!(bytes.len(), 14, "8 bytes of time + the resourceVersion");
    assert_eq!(LeaseState::decode(&bytes), Some(state));
    assert_eq!(LeaseState::decode(&[]), None);
    assert_eq!(LeaseState::decode(&[0; 8]), None, "no resourceVersion");
    assert_eq!(LeaseState::decode(&[0; 80]), None, "too long");
    let mut bad = vec![0; 8];
    bad.extend_from_slice(&[0xff, 0xfe]);
    assert_eq!(LeaseState::decode(&bad), None, "not UTF-8");
}

#[test]
fn events_follow_kubelets_setters() {
    use ConditionStatus::{False, True, Unknown};
    use NodeConditionType as T;
    let r = condition_event_reason;
    let health =
        |status, reason, before| condition_event(T::ThermalPressure, status, reason, before);
    assert_eq!(
        health(True, "TemperatureAboveTripPoint", None),
        Some((EventType::Warning, "TemperatureAboveTripPoint".to_owned()))
    );
    assert_eq!(
        health(False, "TemperatureNormal", None),
        None,
        "new and fine"
    );
    assert_eq!(
        health(False, "TemperatureNormal", Some(True)),
        Some((EventType::Normal, "TemperatureNormal".to_owned()))
    );
    assert_eq!(health(True, "CPUThermallyThrottled", Some(True)), None);
    assert_eq!(
        r(T::MemoryPressure, False, None),
        Some("NodeHasSufficientMemory")
    );
    assert_eq!(r(T::Ready, True, None), None, "a new Ready records nothing");
    assert_eq!(r(T::Ready, True, Some(Unknown)), Some("NodeReady"));
    assert_eq!(
        r(T::DiskPressure, True, Some(False)),
        Some("NodeHasDiskPressure")
    );
    assert_eq!(r(T::PidPressure, False, Some(False)), None, "unchanged");
}

#[test]
fn only_kubelets_and_the_health_conditions_are_accepted() {
    let cond = |t: &str, s: &str, r: &str| pb::NodeCondition {
        r#type: t.into(),
        status: s.into(),
        reason: r.into(),
        ..Default::default()
    };
    let status = |c: Vec<pb::NodeCondition>| pb::NodeStatus {
        conditions: c,
        ..Default::default()
    };
    validate_status(&status(vec![cond("Ready", "True", "KubeletReady")])).unwrap();
    assert!(
        validate_status(&status(vec![cond(
            "ReadonlyFilesystem",
            "True",
            "FilesystemIsReadOnly"
        )]))
        .is_ok()
    );
    use NodeConditionType::Ready;
    for (bad, err) in [
        (
            vec![cond("NetworkUnavailable", "False", "RouteCreated")],
            StatusError::UnknownConditionType {
                type_: "NetworkUnavailable".into(),
            },
        ),
        (
            vec![cond("Ready", "Unknown", "KubeletReady")],
            StatusError::ConditionStatus {
                type_: Ready,
                status: "Unknown".into(),
            },
        ),
        (
            vec![cond("Ready", "True", "")],
            StatusError::NoReason { type_: Ready },
        ),
        (
            vec![cond("Ready", "True", "A"), cond("Ready", "False", "B")],
            StatusError::DuplicateCondition { type_: Ready },
        ),
    ] {
        assert_eq!(validate_status(&status(bad.clone())), Err(err), "{bad:?}");
    }
}
