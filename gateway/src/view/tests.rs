use super::*;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};

fn node(rv: &str, ready: &str, boot: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            uid: Some("u1".into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                last_transition_time: Some(Time(Timestamp::from_second(100).unwrap())),
                ..Default::default()
            }]),
            node_info: Some(NodeSystemInfo {
                boot_id: boot.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn lease(rv: &str, renew_s: i64) -> Lease {
    let mut lease =
        crate::bodies::new_lease("n1", "u1", 40, Timestamp::from_second(renew_s).unwrap());
    lease.metadata.resource_version = Some(rv.into());
    lease
}

#[test]
fn an_older_version_never_replaces_a_newer_one() {
    let view = ApiserverView::new();
    view.observe_node(&node("7", "True", "b1"));
    // A watch event lagging behind this replica's own write.
    view.observe_node(&node("5", "Unknown", "b0"));
    let held = view.node("n1").unwrap();
    assert_eq!(held.boot_id.as_deref(), Some("b1"));
    assert!(!held.has_unknown_condition());
    view.observe_node(&node("9", "Unknown", "b1"));
    assert!(view.node_has_unknown_condition("n1"));

    view.observe_lease(&PartialLease::from(&lease("12", 200)));
    view.observe_lease(&PartialLease::from(&lease("11", 190)));
    assert_eq!(&*view.lease("n1").unwrap().resource_version, "12");
    view.observe_lease(&PartialLease::from(&lease("13", 210)));
    let held = view.lease("n1").unwrap();
    assert_eq!(&*held.resource_version, "13");
    assert_eq!(held.renew_time, Some(Timestamp::from_second(210).unwrap()));
}

#[test]
fn a_late_delete_does_not_drop_a_newer_node_and_only_labelled_nodes_are_managed() {
    let view = ApiserverView::new();
    // Registered again and written through, then the old incarnation's DELETE arrives.
    view.observe_node(&node("20", "True", "b2"));
    view.deleted(&node("15", "True", "b1"));
    assert_eq!(view.node("n1").unwrap().boot_id.as_deref(), Some("b2"));
    view.deleted(&node("20", "True", "b2"));
    assert!(view.node("n1").is_none());

    assert!(!NodeRecord::of(&node("1", "True", "b")).managed);
    let mut labelled = node("1", "True", "b");
    labelled.metadata.labels = Some(BTreeMap::from([(
        MANAGED_LABEL.0.to_owned(),
        MANAGED_LABEL.1.to_owned(),
    )]));
    assert!(NodeRecord::of(&labelled).managed);
}

/// `lease`'s record, the same whether read whole (a GET) or parsed in part from the JSON
/// the apiserver sends (a PUT's answer, a watch event), with the `managedFields` and
/// other fields a real kube-apiserver adds.
fn record(lease: &Lease) -> Option<LeaseRecord> {
    let whole = LeaseRecord::of(&PartialLease::from(lease));
    let mut json = serde_json::to_value(lease).unwrap();
    json["metadata"]["uid"] = "u-1".into();
    json["metadata"]["creationTimestamp"] = "2026-11-26T21:00:00Z".into();
    json["metadata"]["managedFields"] = serde_json::json!([{
        "apiVersion": "coordination.k8s.io/v1", "fieldsType": "FieldsV1", "manager": "kubelet",
        "operation": "Update", "time": "2026-11-26T21:00:00Z",
        "fieldsV1": {"f:metadata": {"f:ownerReferences": {".": {}}},
                     "f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}}
    }]);
    // From text, as the PUT's answer and the watch are read.
    let parsed: PartialLease = serde_json::from_str(&json.to_string()).unwrap();
    assert_eq!(
        LeaseRecord::of(&parsed),
        whole,
        "parsed in part: {parsed:?}"
    );
    whole
}

#[test]
fn a_lease_with_nulls_and_escapes_parses_as_one_without() {
    let text = r#"{"kind":"Lease","metadata":{"name":"n\u0031","resourceVersion":"7",
        "labels":null,"annotations":null,"finalizers":null,"generation":null,
        "ownerReferences":[{"uid":"u1","kind":"No\u0064e","name":"n1","controller":null,
        "blockOwnerDeletion":null,"apiVersion":"v1"}]},
        "spec":{"renewTime":"2026-11-27T03:27:28.123456Z","holderIdentity":"n1",
        "leaseDurationSeconds":40,"acquireTime":null,"leaseTransitions":null}}"#;
    let parsed: PartialLease = serde_json::from_str(text).unwrap();
    let record = LeaseRecord::of(&parsed).unwrap();
    assert!(record.plain, "{parsed:?}");
    assert_eq!(&*record.resource_version, "7");
    assert_eq!(record.duration_seconds, Some(40));
    // k8s-openapi reads a null kind or name of an ownerReference as "": not plain.
    let nulls = text.replace(
        r#""kind":"No\u0064e","name":"n1""#,
        r#""kind":null,"name":null"#,
    );
    assert_ne!(nulls, text);
    let parsed: PartialLease = serde_json::from_str(&nulls).unwrap();
    assert!(!LeaseRecord::of(&parsed).unwrap().plain);
    // What k8s-openapi's types refuse is refused.
    for wrong in [
        r#"{"metadata":{"labels":[1]}}"#,
        r#"{"metadata":{"labels":{"a":null}}}"#,
        r#"{"metadata":{"annotations":[]}}"#,
        r#"{"metadata":{"annotations":{"a":null}}}"#,
        r#"{"metadata":{"finalizers":{}}}"#,
        r#"{"metadata":{"finalizers":[null]}}"#,
        r#"{"metadata":{"ownerReferences":[{"kind":"Node"},5]}}"#,
        r#"{"metadata":{"ownerReferences":{}}}"#,
        r#"{"spec":{"holderIdentity":1}}"#,
    ] {
        // Valid JSON of the wrong shape: a data error, not a syntax one.
        assert!(
            serde_json::from_str::<PartialLease>(wrong).is_err_and(|e| e.is_data()),
            "{wrong}"
        );
    }
}

/// The watch reads a Lease inside kube's `WatchEvent`, a tagged enum: with `type` first
/// (kube-apiserver's order) the Lease is parsed from the text, with `object` first it is
/// buffered and parsed from serde's buffer; both must give the same record.
#[test]
fn a_lease_in_a_watch_event_parses_in_either_field_order() {
    let l = lease("42", 300);
    let object = serde_json::to_string(&l).unwrap();
    let expected = LeaseRecord::of(&PartialLease::from(&l));
    assert!(expected.as_ref().is_some_and(|r| r.plain));
    for text in [
        format!(r#"{{"type":"MODIFIED","object":{object}}}"#),
        format!(r#"{{"object":{object},"type":"MODIFIED"}}"#),
    ] {
        let event: kube::core::WatchEvent<PartialLease> = serde_json::from_str(&text).unwrap();
        let kube::core::WatchEvent::Modified(parsed) = event else {
            panic!("a Modified event: {text}");
        };
        assert_eq!(LeaseRecord::of(&parsed), expected, "{text}");
    }
}

#[test]
fn a_lease_is_plain_only_with_what_kubelet_sets() {
    let mut l = lease("1", 10);
    assert!(record(&l).unwrap().plain);
    l.metadata.labels = Some(BTreeMap::from([(
        MANAGED_LABEL.0.to_owned(),
        MANAGED_LABEL.1.to_owned(),
    )]));
    assert!(record(&l).unwrap().plain);
    let mut annotated = l.clone();
    annotated.metadata.annotations = Some(BTreeMap::from([("team".to_owned(), "edge".to_owned())]));
    assert!(!record(&annotated).unwrap().plain);
    let mut transitions = l.clone();
    transitions.spec = Some(LeaseSpec {
        lease_transitions: Some(3),
        renew_time: Some(MicroTime(Timestamp::from_second(10).unwrap())),
        ..Default::default()
    });
    assert!(!record(&transitions).unwrap().plain);
    let mut acquired = l.clone();
    if let Some(spec) = acquired.spec.as_mut() {
        spec.acquire_time = spec.renew_time.clone();
    }
    assert!(!record(&acquired).unwrap().plain);
    let mut held_by_another = l.clone();
    held_by_another.spec.as_mut().unwrap().holder_identity = Some("operator".to_owned());
    // Still plain: the rebuilt PUT keeps the holder, as kubelet's newLease does.
    let held = record(&held_by_another).unwrap();
    assert!(held.plain);
    assert_eq!(held.holder_identity.as_deref(), Some("operator"));
    let mut unheld = l.clone();
    unheld.spec.as_mut().unwrap().holder_identity = None;
    assert!(
        !record(&unheld).unwrap().plain,
        "no holder: read whole, as kubelet writes one only at creation"
    );
    let mut labelled = l.clone();
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert("site".to_owned(), "north".to_owned());
    assert!(!record(&labelled).unwrap().plain);
    let mut relabelled = l.clone();
    relabelled.metadata.labels = Some(BTreeMap::from([(
        MANAGED_LABEL.0.to_owned(),
        "someone-else".to_owned(),
    )]));
    assert!(!record(&relabelled).unwrap().plain);
    let mut unlabelled = l.clone();
    unlabelled.metadata.labels = Some(BTreeMap::new());
    unlabelled.metadata.annotations = Some(BTreeMap::new());
    unlabelled.metadata.finalizers = Some(Vec::new());
    assert!(record(&unlabelled).unwrap().plain, "empty is as unset");
    let mut finalized = l.clone();
    finalized.metadata.finalizers = Some(vec!["example.com/keep".to_owned()]);
    assert!(!record(&finalized).unwrap().plain);
    let owner = l.metadata.owner_references.clone().unwrap().remove(0);
    let mut two_owners = l.clone();
    two_owners.metadata.owner_references = Some(vec![owner.clone(), owner.clone()]);
    assert!(!record(&two_owners).unwrap().plain);
    for change in [
        |r: &mut OwnerReference| r.kind = "Pod".into(),
        |r: &mut OwnerReference| r.name = "n2".into(),
        |r: &mut OwnerReference| r.controller = Some(false),
        |r: &mut OwnerReference| r.block_owner_deletion = Some(true),
    ] {
        let mut owned = l.clone();
        let mut other = owner.clone();
        change(&mut other);
        owned.metadata.owner_references = Some(vec![other]);
        assert!(!record(&owned).unwrap().plain, "{owned:?}");
    }
    let mut orphan = l;
    orphan.metadata.owner_references = None;
    assert!(!record(&orphan).unwrap().plain);
    let mut none_left = orphan.clone();
    none_left.metadata.owner_references = Some(Vec::new());
    assert!(!record(&none_left).unwrap().plain);
    // Not a stored object: nothing to PUT against.
    let mut unstored = lease("1", 10);
    unstored.metadata.resource_version = None;
    assert!(record(&unstored).is_none());
}

/// Fed a watcher's events through a channel: following after the list, not after an
/// error, again with the next event; what a re-list leaves out is dropped; a late
/// Delete spares a newer record.
#[tokio::test]
async fn the_watch_state_follows_the_event_stream() {
    let view = Arc::new(ApiserverView::new());
    let mut gone = node("3", "True", "b");
    gone.metadata.name = Some("gone".into());
    view.observe_node(&gone);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<Event<Node>, watcher::Error>>();
    let follower = tokio::spawn({
        let view = view.clone();
        async move {
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            });
            // No waits between tries: the test steps by events, not time.
            let backoff = ExponentialBackoff::from(
                backon::ExponentialBuilder::default()
                    .with_min_delay(Duration::ZERO)
                    .with_max_delay(Duration::ZERO)
                    .without_max_times(),
            );
            view.follow(stream, backoff, "Node").await;
        }
    });
    // Each step waits until the follower has taken every event sent so far.
    let settle = |sent: u64| {
        let view = view.clone();
        async move {
            for _ in 0..1000 {
                let (events, errors) = view.watch_counts();
                if events + errors >= sent {
                    return;
                }
                tokio::task::yield_now().await;
            }
            panic!("the follower did not take {sent} events");
        }
    };
    for event in [Event::Init, Event::InitApply(node("4", "True", "b"))] {
        tx.send(Ok(event)).unwrap();
    }
    settle(2).await;
    assert!(
        !view.nodes_watched(),
        "not following before the list is complete"
    );
    tx.send(Ok(Event::InitDone)).unwrap();
    settle(3).await;
    assert!(view.nodes_watched());
    assert!(
        view.node("gone").is_none(),
        "not in the re-list: deleted meanwhile"
    );
    assert!(view.node("n1").is_some());

    tx.send(Err(watcher::Error::NoResourceVersion)).unwrap();
    settle(4).await;
    assert!(!view.nodes_watched(), "an error stops trusting the view");
    tx.send(Ok(Event::Apply(node("9", "Unknown", "b"))))
        .unwrap();
    settle(5).await;
    assert!(view.nodes_watched(), "resumed from its resourceVersion");
    assert!(view.node_has_unknown_condition("n1"));
    // A Delete of an older version leaves the newer record; the current one drops it.
    tx.send(Ok(Event::Delete(node("8", "True", "b")))).unwrap();
    settle(6).await;
    assert!(view.node("n1").is_some());
    tx.send(Ok(Event::Delete(node("9", "Unknown", "b"))))
        .unwrap();
    settle(7).await;
    assert!(view.node("n1").is_none());

    drop(tx);
    follower.await.unwrap();
    assert!(
        !view.nodes_watched(),
        "the stream ended: no longer following"
    );
}

/// The scrape-time summary counts every Lease by age bucket and managed Nodes by condition
/// status; an unmanaged Node is left out.
#[test]
fn the_fleet_summary_buckets_lease_ages_and_counts_conditions() {
    let view = ApiserverView::new();
    let now = Timestamp::from_second(1_000).unwrap();
    for (i, renewed) in [995, 990, 961, 950, 50].into_iter().enumerate() {
        let mut l = lease("1", renewed);
        l.metadata.name = Some(format!("n{i}"));
        view.observe_lease(&PartialLease::from(&l));
    }
    let managed = |name: &str, ready: &str| {
        let mut n = node("1", ready, "b");
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some([(MANAGED_LABEL.0.into(), MANAGED_LABEL.1.into())].into());
        n
    };
    view.observe_node(&managed("a", "True"));
    view.observe_node(&managed("b", "True"));
    view.observe_node(&managed("c", "Unknown"));
    let mut unmanaged = node("1", "False", "b");
    unmanaged.metadata.name = Some("d".into());
    view.observe_node(&unmanaged);

    let summary = view.fleet_summary(now);
    // ≤5: 995; ≤10: 990; ≤40: 961 (39 s); ≤60: 950 (50 s); >900: 50.
    assert_eq!(summary.lease_ages, [1, 1, 0, 0, 1, 1, 0, 0, 0, 1]);
    assert_eq!(summary.lease_age_sum, 5.0 + 10.0 + 39.0 + 50.0 + 950.0);
    assert_eq!(
        summary.conditions,
        vec![(NodeConditionType::Ready, [2, 0, 1])]
    );
    assert_eq!(summary.oldest_certificate_not_before, None);
}

/// After a `410 Gone` (a resumed watch's resourceVersion too old, as after an apiserver
/// restart) the re-list starts at once, however long the outage before it grew the
/// backoff; other errors wait at most 4 s.
#[tokio::test(start_paused = true)]
async fn a_gone_watch_lists_again_at_once_and_other_errors_wait_at_most_4_s() {
    let view = Arc::new(ApiserverView::new());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<Event<Node>, watcher::Error>>();
    let follower = tokio::spawn({
        let view = view.clone();
        async move {
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            });
            view.follow(stream, watch_backoff(), "Node").await;
        }
    });
    let taken = |view: &ApiserverView| {
        let (events, errors) = view.watch_counts();
        events + errors
    };
    // When the follower takes event number `n`, measured on the paused clock.
    let taken_after = |n: u64| {
        let view = view.clone();
        async move {
            let start = tokio::time::Instant::now();
            while taken(&view) < n {
                tokio::time::sleep(Duration::from_millis(10)).await;
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "event {n} never taken"
                );
            }
            start.elapsed()
        }
    };
    for event in [Event::Init, Event::InitDone] {
        tx.send(Ok(event)).unwrap();
    }
    taken_after(2).await;
    // An outage: twenty failed tries, then the apiserver is back and says 410 Gone.
    let failed = || {
        Err(watcher::Error::WatchFailed(kube::Error::Service(
            "connection refused".into(),
        )))
    };
    for _ in 0..20 {
        tx.send(failed()).unwrap();
    }
    // Twenty errors in a row: each taken after the wait that followed the one before.
    let mut waited = Vec::new();
    for n in 1..=20 {
        waited.push(taken_after(2 + n).await);
    }
    let longest = waited.iter().max().copied().unwrap_or_default();
    assert!(
        longest <= Duration::from_millis(4010),
        "a failing watch waits at most 4 s between tries: {waited:?}"
    );
    assert!(
        waited.iter().skip(5).all(|w| *w >= Duration::from_secs(2)),
        "the wait grew to its cap: {waited:?}"
    );
    let before = taken(&view);
    tx.send(failed()).unwrap();
    tx.send(Err(watcher::Error::WatchError(Box::new(
        kube::core::Status::failure("too old resource version", "Expired").with_code(410),
    ))))
    .unwrap();
    tx.send(Ok(Event::Init)).unwrap();
    let wait_to_gone = taken_after(before + 2).await;
    let wait_to_list = taken_after(before + 3).await;
    assert!(
        wait_to_list <= Duration::from_millis(10),
        "the re-list after 410 Gone starts at once, not after a backoff ({wait_to_gone:?} before the 410)"
    );
    // The list done, another 410 at once (a lagging watch cache): no second re-list at
    // once within RELIST_AT_ONCE_EVERY, so no list storm.
    let listed = taken(&view);
    tx.send(Ok(Event::InitDone)).unwrap();
    taken_after(listed + 1).await;
    let before = listed + 1;
    let gone = || {
        Err(watcher::Error::WatchError(Box::new(
            kube::core::Status::failure("too old resource version", "Expired").with_code(410),
        )))
    };
    tx.send(gone()).unwrap();
    tx.send(Ok(Event::Init)).unwrap();
    taken_after(before + 1).await;
    let waited = taken_after(before + 2).await;
    assert!(
        waited >= Duration::from_millis(250),
        "a second 410 within {RELIST_AT_ONCE_EVERY:?} waits its backoff: {waited:?}"
    );
    drop(tx);
    follower.await.unwrap();
}
