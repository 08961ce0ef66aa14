#![allow(clippy::unwrap_used)]

use super::gate::{GATE_BACKOFF_MAX, GATE_BACKOFF_MIN, trouble};
use super::*;

fn api() -> Apiserver {
    // Never contacted: the gate is driven by hand.
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    Apiserver::new(client, false)
}

fn answered(code: u16, retry_after_seconds: u32) -> Result<(), kube::Error> {
    let mut status = kube::core::Status::failure("test", "test").with_code(code);
    status.details = Some(kube::core::response::StatusDetails {
        name: String::new(),
        group: String::new(),
        kind: String::new(),
        uid: String::new(),
        causes: Vec::new(),
        retry_after_seconds,
    });
    Err(kube::Error::Api(Box::new(status)))
}

fn observe(api: &Apiserver, priority: Priority, result: Result<(), kube::Error>, probe: bool) {
    let _ = api.gate(priority).lock().observe(trouble(&result), probe);
}

/// 5xx closes the gate; one probe at a time after the backoff; only the probe's
/// failure doubles the wait; success reopens it.
#[tokio::test(start_paused = true)]
async fn the_gate_backs_off_with_one_probe_and_reopens_on_success() {
    let api = api();
    let lease = Priority::Lease;
    assert!(matches!(api.admit(lease), Ok(Ticket::Open)));
    observe(&api, lease, answered(503, 0), false);
    assert!(api.backing_off());
    assert!(
        matches!(api.admit(lease), Err(BackingOff(_))),
        "closed until the backoff passes"
    );
    // Failures of calls already in flight say nothing new.
    observe(&api, lease, answered(503, 0), false);
    tokio::time::advance(GATE_BACKOFF_MIN).await;
    let probe = api.admit(lease);
    assert!(matches!(probe, Ok(Ticket::Probe(_))));
    assert!(
        matches!(api.admit(lease), Err(BackingOff(_))),
        "one probe at a time"
    );
    drop(probe);
    let probe = api.admit(lease).map_err(|_| ()).unwrap();
    // The probe fails too: the next wait doubles.
    observe(&api, lease, answered(500, 0), true);
    drop(probe);
    tokio::time::advance(GATE_BACKOFF_MIN).await;
    assert!(matches!(api.admit(lease), Err(BackingOff(_))));
    tokio::time::advance(GATE_BACKOFF_MIN).await;
    let probe = api.admit(lease).map_err(|_| ()).unwrap();
    observe(&api, lease, Ok(()), true);
    drop(probe);
    assert!(!api.backing_off());
    assert!(matches!(api.admit(lease), Ok(Ticket::Open)));
    // A 404 or 409 is an apiserver that works.
    observe(&api, lease, answered(409, 0), false);
    assert!(!api.backing_off());
}

/// A failing Node or status call (a webhook answering 500) does not hold up Leases.
#[tokio::test(start_paused = true)]
async fn each_priority_has_its_own_gate() {
    let api = api();
    observe(&api, Priority::Other, answered(500, 0), false);
    assert!(matches!(api.admit(Priority::Other), Err(BackingOff(_))));
    assert!(matches!(api.admit(Priority::Lease), Ok(Ticket::Open)));
}

/// A 429's Retry-After is honoured up to GATE_BACKOFF_MAX, never longer: a Lease not
/// renewed for 40 s is a NotReady node.
#[tokio::test(start_paused = true)]
async fn a_429_waits_for_its_retry_after_up_to_the_cap() {
    let api = api();
    observe(&api, Priority::Lease, answered(429, 3), false);
    tokio::time::advance(Duration::from_millis(2_900)).await;
    assert!(matches!(api.admit(Priority::Lease), Err(BackingOff(_))));
    tokio::time::advance(Duration::from_millis(100)).await;
    assert!(matches!(api.admit(Priority::Lease), Ok(Ticket::Probe(_))));
    let api = self::api();
    observe(&api, Priority::Lease, answered(429, 60), false);
    tokio::time::advance(GATE_BACKOFF_MAX).await;
    assert!(matches!(api.admit(Priority::Lease), Ok(Ticket::Probe(_))));
}

/// A call dropped before its answer (its caller's deadline) counts as no answer.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_unanswered_closes_the_gate() {
    let api = api();
    drop(Recording {
        api: &api,
        priority: Priority::Lease,
        probe: false,
        recorded: false,
    });
    assert!(api.backing_off());
    assert!(api.in_outage(), "the first trouble begins an outage");
}

/// Write health and the outage follow the Lease gate: the other gate's trouble (a failing
/// webhook on status patches) is no outage and holds no site; a Lease gate that no call has
/// tried for [`TROUBLE_RECENT`] says nothing either way.
#[tokio::test(start_paused = true)]
async fn write_health_and_the_outage_follow_the_lease_gate() {
    let api = api();
    let fail = |priority| {
        let mut call = Recording {
            api: &api,
            priority,
            probe: false,
            recorded: false,
        };
        call.record(&answered(503, 0));
    };
    assert_eq!(
        api.write_health(),
        WriteHealth {
            failing: false,
            since_recovery: None
        }
    );
    fail(Priority::Other);
    assert!(api.backing_off());
    assert!(!api.in_outage(), "status calls failing are no outage");
    assert!(!api.write_health().failing);

    fail(Priority::Lease);
    assert!(api.write_health().failing);
    assert!(api.in_outage());
    // Nobody tries the gate for 30 s (the replica's nodes went elsewhere): unknown.
    tokio::time::advance(TROUBLE_RECENT).await;
    assert!(!api.write_health().failing);
    assert!(
        api.in_outage(),
        "the outage is over only when a write says so"
    );
    let mut probe = Recording {
        api: &api,
        priority: Priority::Lease,
        probe: true,
        recorded: false,
    };
    probe.record(&Ok(()));
    assert!(!api.in_outage());
    assert_eq!(
        api.write_health(),
        WriteHealth {
            failing: false,
            since_recovery: Some(Duration::ZERO)
        }
    );
    tokio::time::advance(Duration::from_secs(7)).await;
    assert_eq!(
        api.write_health().since_recovery,
        Some(Duration::from_secs(7))
    );
    assert!(api.backing_off(), "the other gate is still closed");
}

/// Node, status and Event calls hold at most half the slots.
#[tokio::test]
async fn lease_calls_keep_half_the_slots() {
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let api = Apiserver::with_limits(client, false, WriteLimits { max_inflight: 4 });
    let others: Vec<_> = (0..2)
        .map(|_| api.others.clone().try_acquire_owned().unwrap())
        .collect();
    assert!(matches!(
        api.others.clone().try_acquire_owned(),
        Err(tokio::sync::TryAcquireError::NoPermits)
    ));
    assert_eq!(
        api.all.available_permits(),
        4,
        "leases still have every slot"
    );
    drop(others);
}
