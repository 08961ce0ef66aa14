#![allow(clippy::unwrap_used)]

use super::*;

const SEC: u64 = 1_000_000;

fn policy(posture: Posture) -> AdmissionPolicy {
    AdmissionPolicy {
        posture,
        max_age: Duration::from_secs(5),
        drift_ppm: 1000,
        rate: 2.0,
        burst: 20.0,
        old_boot_memory: Duration::from_secs(30),
    }
}

fn header(boot: u8, seq: u64, wall_time_ms: i64) -> pb::Header {
    pb::Header {
        node_name: "edge-1".into(),
        boot_id: vec![boot; 16],
        seq,
        wall_time_ms,
        boot_tag: 0,
    }
}

const NOBODY: Provenance<'static> = Provenance {
    identity: None,
    wall_time_verified: false,
};
const MTLS: Provenance<'static> = Provenance {
    identity: Some("edge-1"),
    wall_time_verified: false,
};
const SIGNED: Provenance<'static> = Provenance {
    identity: Some("edge-1"),
    wall_time_verified: true,
};

fn reason(verdict: Verdict) -> RejectReason {
    match verdict {
        Verdict::Reject(r) => r.reason,
        other => panic!("not rejected: {other:?}"),
    }
}

#[test]
fn the_replay_rule_is_the_same_boot_and_a_sequence_not_above() {
    let boot = vec![1; 16];
    let last = LastAccepted::new(boot.clone(), 10 * SEC);
    // A replayed seq, and one overtaken by the last accepted (reordered): replays.
    assert!(last.replayed_by(&boot, 10 * SEC));
    assert!(last.replayed_by(&boot, 3 * SEC));
    assert!(last.replayed_by(&boot, 0));
    // The next message of the same boot is not.
    assert!(!last.replayed_by(&boot, 10 * SEC + 1));
    assert!(!last.replayed_by(&boot, u64::MAX));
    // A new boot starts its own sequence, however low.
    assert!(!last.replayed_by(&[2; 16], 0));
    // An old boot is not a replay by this rule either (the admission's memory of
    // superseded boots refuses it), nor is a boot ID that only shares a prefix.
    assert!(!last.replayed_by(&[0; 16], 5 * SEC));
    assert!(!last.replayed_by(&boot[..8], 5 * SEC));
    // Nothing accepted yet: only an empty boot ID at seq 0 matches it, and admission
    // refuses an empty boot ID before asking (UnknownBoot).
    let none = LastAccepted::default();
    assert!(!none.replayed_by(&boot, 0));
    assert!(none.replayed_by(&[], 0));
}

#[test]
fn identity_checks_come_first_and_follow_the_posture() {
    let id = |posture, node, p| {
        check_identity(posture, node, p)
            .map(|_| ())
            .map_err(|r| r.reason)
    };
    assert_eq!(id(Posture::Identified, "edge-1", MTLS), Ok(()));
    assert_eq!(
        id(Posture::Identified, "edge-1", NOBODY),
        Err(RejectReason::Unauthenticated)
    );
    assert_eq!(id(Posture::AllowUnidentified, "edge-1", NOBODY), Ok(()));
    assert_eq!(
        id(Posture::AllowUnidentified, "edge-2", MTLS),
        Err(RejectReason::Foreign)
    );
    assert_eq!(
        id(Posture::AllowUnidentified, "Edge_1", NOBODY),
        Err(RejectReason::Malformed)
    );
}

/// Hole: one unidentified message with a fresh boot ID locked a genuine node out for
/// good. Now an identified node cannot be touched by unidentified input at all.
#[tokio::test(start_paused = true)]
async fn unidentified_input_never_moves_an_identified_node() {
    let p = policy(Posture::AllowUnidentified);
    let t0 = Instant::now();
    let mut node = NodeAdmission::default();
    assert!(matches!(
        node.admit(&p, &header(1, 10 * SEC, 0), MTLS, true, t0, t0),
        Verdict::Admit(_)
    ));
    let forged = node.admit(&p, &header(9, 1, 0), NOBODY, true, t0, t0);
    assert_eq!(reason(forged), RejectReason::Unauthenticated);
    tokio::time::advance(Duration::from_secs(10)).await;
    let now = Instant::now();
    assert!(matches!(
        node.admit(&p, &header(1, 20 * SEC, 0), MTLS, true, t0, now),
        Verdict::Admit(_)
    ));
}

/// Where no identity exists, a forged boot can displace the genuine one, but only for one
/// renew interval of the genuine boot (10 s while none of its renewals said otherwise): the
/// genuine node is back well before its Lease expires.
#[tokio::test(start_paused = true)]
async fn an_unidentified_boot_change_decays() {
    let p = policy(Posture::AllowUnidentified);
    let t0 = Instant::now();
    let mut node = NodeAdmission::default();
    node.admit(&p, &header(1, 10 * SEC, 0), NOBODY, true, t0, t0);
    let forged = node.admit(&p, &header(9, 1, 0), NOBODY, false, t0, t0);
    assert!(matches!(
        forged,
        Verdict::Admit(Admitted { new_boot: true, .. })
    ));
    tokio::time::advance(Duration::from_secs(5)).await;
    let genuine = node.admit(
        &p,
        &header(1, 15 * SEC, 0),
        NOBODY,
        true,
        t0,
        Instant::now(),
    );
    assert_eq!(reason(genuine), RejectReason::Replayed);
    tokio::time::advance(Duration::from_secs(5)).await;
    let genuine = node.admit(
        &p,
        &header(1, 20 * SEC, 0),
        NOBODY,
        true,
        t0,
        Instant::now(),
    );
    assert!(
        matches!(genuine, Verdict::Admit(Admitted { new_boot: true, .. })),
        "{genuine:?}"
    );
}

/// A displaced boot is remembered for its own renew interval (its renewals'
/// `leaseDurationSeconds` × 0.25), never longer than `old_boot_memory`: with a 10 s lease a
/// forged boot keeps the genuine one out for 2.5 s, whatever the forger claims.
#[tokio::test(start_paused = true)]
async fn a_displaced_boot_is_remembered_for_its_own_renew_interval() {
    let p = policy(Posture::AllowUnidentified);
    let t0 = Instant::now();
    let mut node = NodeAdmission::default();
    node.admit(&p, &header(1, 10 * SEC, 0), NOBODY, true, t0, t0);
    node.lease_duration_seconds(10);
    node.admit(&p, &header(9, 1, 0), NOBODY, true, t0, t0);
    // The forger's own claim makes only its own boot's memory long (capped at 30 s).
    node.lease_duration_seconds(3600);
    tokio::time::advance(Duration::from_millis(2400)).await;
    let now = Instant::now();
    let early = node.admit(&p, &header(1, 12 * SEC, 0), NOBODY, true, t0, now);
    assert_eq!(reason(early), RejectReason::Replayed);
    tokio::time::advance(Duration::from_millis(100)).await;
    let now = Instant::now();
    let back = node.admit(&p, &header(1, 13 * SEC, 0), NOBODY, true, t0, now);
    assert!(
        matches!(back, Verdict::Admit(Admitted { new_boot: true, .. })),
        "{back:?}"
    );
    // The forged boot, displaced in turn, is refused for the cap: 30 s, not 900 s.
    tokio::time::advance(Duration::from_secs(29)).await;
    let now = Instant::now();
    let forged = node.admit(&p, &header(9, 2, 0), NOBODY, true, t0, now);
    assert_eq!(reason(forged), RejectReason::Replayed);
    tokio::time::advance(Duration::from_secs(1)).await;
    let now = Instant::now();
    let forged = node.admit(&p, &header(9, 3, 0), NOBODY, true, t0, now);
    assert!(matches!(forged, Verdict::Admit(_)), "{forged:?}");
}

/// An unidentified message that came first (a public boot ID, a seq far ahead) binds
/// nothing: the node's first identified message starts its state afresh.
#[tokio::test(start_paused = true)]
async fn unidentified_history_does_not_bind_an_identified_node() {
    let p = policy(Posture::AllowUnidentified);
    let t0 = Instant::now();
    let mut node = NodeAdmission::default();
    node.admit(&p, &header(1, u64::MAX, 0), NOBODY, false, t0, t0);
    assert!(matches!(
        node.admit(&p, &header(1, 10 * SEC, 0), MTLS, true, t0, t0),
        Verdict::Admit(_)
    ));
    assert!(node.identified());
}

/// A seq from further ahead than the age limit is refused and not recorded, so the
/// genuine messages that follow are neither replays nor stale.
#[tokio::test(start_paused = true)]
async fn a_seq_from_the_future_is_refused() {
    let p = AdmissionPolicy {
        drift_ppm: 0,
        ..policy(Posture::AllowUnidentified)
    };
    let t0 = Instant::now();
    let mut node = NodeAdmission::default();
    node.admit(&p, &header(1, 100 * SEC, 0), NOBODY, true, t0, t0);
    let forged = node.admit(&p, &header(1, 110 * SEC, 0), NOBODY, true, t0, t0);
    assert_eq!(reason(forged), RejectReason::Invalid);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        node.admit(
            &p,
            &header(1, 101 * SEC, 0),
            NOBODY,
            true,
            t0,
            Instant::now()
        ),
        Verdict::Admit(Admitted {
            age: Duration::ZERO,
            new_boot: false
        })
    );
}

/// Hole: replaying one accepted message drained the node's rate limit, and a
/// rate-limited message could be replayed later.
#[tokio::test(start_paused = true)]
async fn replays_cost_no_tokens_and_rate_limited_seqs_are_recorded() {
    let p = AdmissionPolicy {
        burst: 2.0,
        rate: 0.1,
        ..policy(Posture::Identified)
    };
    let t0 = Instant::now();
    let mut node = NodeAdmission::default();
    assert!(matches!(
        node.admit(&p, &header(1, SEC, 0), MTLS, false, t0, t0),
        Verdict::Admit(_)
    ));
    for _ in 0..50 {
        let replay = node.admit(&p, &header(1, SEC, 0), MTLS, false, t0, t0);
        assert_eq!(reason(replay), RejectReason::Replayed);
    }
    assert!(
        matches!(
            node.admit(&p, &header(1, 2 * SEC, 0), MTLS, false, t0, t0),
            Verdict::Admit(_)
        ),
        "the replays took no token"
    );
    let limited = node.admit(&p, &header(1, 3 * SEC, 0), MTLS, false, t0, t0);
    assert_eq!(reason(limited), RejectReason::RateLimited);
    tokio::time::advance(Duration::from_secs(60)).await;
    let replay = node.admit(&p, &header(1, 3 * SEC, 0), MTLS, false, t0, Instant::now());
    assert_eq!(reason(replay), RejectReason::Replayed);
}

/// A signed message of an earlier boot (its wall time is authenticated) cannot push the
/// current boot out, even after the old boot is forgotten.
#[tokio::test(start_paused = true)]
async fn verified_wall_time_orders_boots() {
    let p = policy(Posture::Identified);
    let t0 = Instant::now();
    let mut node = NodeAdmission::default();
    node.admit(&p, &header(1, 10, 1_000), SIGNED, false, t0, t0);
    assert!(matches!(
        node.admit(&p, &header(2, 5, 2_000), SIGNED, false, t0, t0),
        Verdict::Admit(Admitted { new_boot: true, .. })
    ));
    tokio::time::advance(Duration::from_secs(60)).await;
    let replay = node.admit(&p, &header(1, 11, 1_500), SIGNED, false, t0, Instant::now());
    assert_eq!(reason(replay), RejectReason::Replayed);
    assert!(matches!(
        node.admit(&p, &header(2, 6, 2_100), SIGNED, false, t0, Instant::now()),
        Verdict::Admit(Admitted {
            new_boot: false,
            ..
        })
    ));
}

/// A boot tag stands for the boot it matches and nothing else: it never starts a boot,
/// never moves one, and a refused one leaves no trace.
#[tokio::test(start_paused = true)]
async fn a_boot_tag_names_only_the_boot_held() {
    let p = policy(Posture::Identified);
    let t0 = Instant::now();
    let tagged = |boot: u8, seq| pb::Header {
        boot_id: Vec::new(),
        boot_tag: pb::boot_tag(&[boot; 16]),
        ..header(boot, seq, 0)
    };
    let mut node = NodeAdmission::default();
    let first = node.admit(&p, &tagged(1, 10 * SEC), MTLS, true, t0, t0);
    assert_eq!(reason(first), RejectReason::UnknownBoot, "no boot held yet");
    assert!(matches!(
        node.admit(&p, &header(1, 11 * SEC, 0), MTLS, true, t0, t0),
        Verdict::Admit(Admitted { new_boot: true, .. })
    ));
    assert!(matches!(
        node.admit(&p, &tagged(1, 12 * SEC), MTLS, true, t0, t0),
        Verdict::Admit(Admitted {
            new_boot: false,
            ..
        })
    ));
    // Replay rules hold as for a boot ID.
    let replay = node.admit(&p, &tagged(1, 12 * SEC), MTLS, true, t0, t0);
    assert_eq!(reason(replay), RejectReason::Replayed);
    // Another boot's tag is refused and changes nothing: the held boot goes on.
    let other = node.admit(&p, &tagged(2, SEC), MTLS, true, t0, t0);
    assert_eq!(reason(other), RejectReason::UnknownBoot);
    assert!(matches!(
        node.admit(&p, &header(1, 13 * SEC, 0), MTLS, true, t0, t0),
        Verdict::Admit(Admitted {
            new_boot: false,
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn late_heartbeats_are_stale_but_registrations_are_not() {
    let p = AdmissionPolicy {
        drift_ppm: 0,
        ..policy(Posture::Identified)
    };
    let t0 = Instant::now();
    let mut node = NodeAdmission::default();
    node.admit(&p, &header(1, 100 * SEC, 0), MTLS, true, t0, t0);
    tokio::time::advance(Duration::from_secs(20)).await;
    let now = Instant::now();
    // Sent 10 s after the first, received 20 s after it: 10 s old.
    assert_eq!(
        node.admit(&p, &header(1, 110 * SEC, 0), MTLS, true, t0, now),
        Verdict::Stale(Duration::from_secs(10))
    );
    assert!(matches!(
        node.admit(&p, &header(1, 111 * SEC, 0), MTLS, false, t0, now),
        Verdict::Admit(_)
    ));
}

/// `is_replay` names exactly the messages `admit` would refuse as replayed within the
/// current boot, whichever way the header names the boot; another boot's are not its call.
#[tokio::test(start_paused = true)]
async fn is_replay_matches_the_current_boot_by_id_or_tag() {
    let p = policy(Posture::Identified);
    let t0 = Instant::now();
    let mut node = NodeAdmission::default();
    assert!(
        !node.is_replay(&header(1, 10 * SEC, 0)),
        "nothing admitted yet"
    );
    node.admit(&p, &header(1, 10 * SEC, 0), MTLS, true, t0, t0);
    let by_tag = |seq| pb::Header {
        boot_id: Vec::new(),
        boot_tag: pb::boot_tag(&[1; 16]),
        ..header(1, seq, 0)
    };
    for replay in [header(1, 10 * SEC, 0), header(1, SEC, 0), by_tag(10 * SEC)] {
        assert!(node.is_replay(&replay), "{replay:?}");
        assert_eq!(
            reason(node.admit(&p, &replay, MTLS, true, t0, t0)),
            RejectReason::Replayed
        );
    }
    assert!(!node.is_replay(&header(1, 10 * SEC + 1, 0)));
    assert!(!node.is_replay(&by_tag(10 * SEC + 1)));
    assert!(!node.is_replay(&header(2, SEC, 0)), "another boot");
}
