use super::*;

/// kubelet's renew interval: 10 s (a 40 s lease).
const R: SignedDuration = SignedDuration::from_secs(10);

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_764_000_000 + s).unwrap()
}

fn member(node: &str, renewed: i64) -> Member {
    Member {
        node: node.into(),
        renewed: t(renewed),
        renew_interval: R,
        unreachable: false,
    }
}

fn site(members: Vec<Member>) -> BTreeMap<Box<str>, Vec<Member>> {
    [("plant-3".into(), members)].into()
}

fn partitioned(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Partitioned { .. }))
        .count()
}

fn unreachable(actions: &[Action]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Unreachable { node, .. } => Some(&**node),
            _ => None,
        })
        .collect()
}

#[test]
fn one_silent_node_is_a_node() {
    let mut tracker = SiteTracker::default();
    let mut nodes: Vec<Member> = (0..5).map(|i| member(&format!("n{i}"), 95)).collect();
    nodes[0].renewed = t(60);
    let actions = tracker.look(&site(nodes), t(100));
    assert!(actions.is_empty(), "{actions:?}");
    let state = &tracker.sites()["plant-3"];
    assert_eq!(
        (state.live, state.silent, state.partition.is_some()),
        (5, 1, false)
    );
}

#[test]
fn most_of_a_site_silent_together_is_a_partition_and_its_end_is_seen() {
    let mut tracker = SiteTracker::default();
    // Four of five last renewed within 4 s of each other, 25–29 s ago; one still renews.
    let mut nodes = vec![
        member("n0", 71),
        member("n1", 72),
        member("n2", 74),
        member("n3", 75),
        member("n4", 98),
    ];
    let actions = tracker.look(&site(nodes.clone()), t(100));
    assert_eq!(partitioned(&actions), 1, "{actions:?}");
    assert_eq!(unreachable(&actions), ["n0", "n1", "n2", "n3"]);
    let Some(Action::Partitioned { partition, .. }) = actions.first() else {
        panic!("{actions:?}")
    };
    assert_eq!(
        partition.since,
        t(71),
        "the last renewal of the first to go silent"
    );
    // The next look changes nothing (the conditions are written).
    for m in nodes.iter_mut().take(4) {
        m.unreachable = true;
    }
    assert!(tracker.look(&site(nodes.clone()), t(102)).is_empty());
    // The link returns: n1 renews at 130; the site is back, n1's condition clears.
    nodes[1].renewed = t(130);
    let actions = tracker.look(&site(nodes.clone()), t(131));
    assert!(
        matches!(&actions[..], [Action::Returned { at, .. }, Action::Reachable { node, .. }] if *at == t(130) && &**node == "n1"),
        "{actions:?}"
    );
    // The others clear as each renews.
    nodes[1].unreachable = false;
    nodes[0].renewed = t(132);
    let actions = tracker.look(&site(nodes), t(133));
    assert_eq!(
        actions,
        [Action::Reachable {
            node: "n0".into(),
            at: t(132)
        }]
    );
}

#[test]
fn nodes_dying_one_by_one_are_no_partition() {
    let mut tracker = SiteTracker::default();
    // Six nodes; one dies every 30 s (three renew intervals apart), the rest keep renewing.
    let died = |i: i64| 30 * i;
    for now in (0..=200).step_by(2) {
        let nodes = (0..6)
            .map(|i| {
                let last = if died(i + 1) < now {
                    died(i + 1)
                } else {
                    now - 1
                };
                member(&format!("n{i}"), last)
            })
            .collect();
        let actions = tracker.look(&site(nodes), t(now));
        assert_eq!(partitioned(&actions), 0, "at {now}: {actions:?}");
    }
}

#[test]
fn a_site_of_two_is_never_called_cut_off() {
    let mut tracker = SiteTracker::default();
    let actions = tracker.look(&site(vec![member("a", 10), member("b", 11)]), t(100));
    assert!(actions.is_empty(), "{actions:?}");
}

#[test]
fn a_straggler_still_silent_after_its_site_returned_is_a_dead_node() {
    let mut tracker = SiteTracker::default();
    let mut nodes = vec![member("n0", 70), member("n1", 71), member("n2", 72)];
    assert_eq!(partitioned(&tracker.look(&site(nodes.clone()), t(100))), 1);
    for m in &mut nodes {
        m.unreachable = true;
    }
    nodes[0].renewed = t(120);
    nodes[1].renewed = t(121);
    let _ = tracker.look(&site(nodes.clone()), t(122));
    nodes[0].unreachable = false;
    nodes[1].unreachable = false;
    // n2 never comes back: settled once 12 renew intervals have passed since the return.
    nodes[0].renewed = t(240);
    nodes[1].renewed = t(240);
    assert!(tracker.look(&site(nodes.clone()), t(200)).is_empty());
    let actions = tracker.look(&site(nodes), t(241));
    assert_eq!(
        actions,
        [Action::Reachable {
            node: "n2".into(),
            at: t(120)
        }]
    );
}

#[test]
fn sites_are_zones_with_their_region_and_event_names_are_shared() {
    let labels = |zone: Option<&'static str>, region: Option<&'static str>| {
        site_of(move |k| match k {
            ZONE_LABEL => zone,
            REGION_LABEL => region,
            _ => None,
        })
    };
    assert_eq!(labels(Some("plant-3"), None).as_deref(), Some("plant-3"));
    assert_eq!(
        labels(Some("plant-3"), Some("eu-west")).as_deref(),
        Some("eu-west/plant-3")
    );
    assert_eq!(labels(None, Some("eu-west")), None);
    assert_eq!(labels(Some(""), None), None);
    assert_eq!(
        event_name("eu-west/Plant_3", "silent", t(0)),
        format!(
            "edgebeat-site-eu-west-plant-3.silent.{:x}",
            t(0).as_second()
        )
    );
}

fn mark(nodes: &mut [Member], actions: &[Action]) {
    for a in actions {
        match a {
            Action::Unreachable { node, .. } => {
                if let Some(m) = nodes.iter_mut().find(|m| m.node == *node) {
                    m.unreachable = true;
                }
            }
            Action::Reachable { node, .. } => {
                if let Some(m) = nodes.iter_mut().find(|m| m.node == *node) {
                    m.unreachable = false;
                }
            }
            _ => {}
        }
    }
}

#[test]
fn a_bridge_going_down_cuts_its_site_off_at_once_until_it_is_up_and_heard() {
    let mut tracker = SiteTracker::default();
    // Everyone renewed within the last few seconds: nobody is silent yet.
    let mut nodes: Vec<Member> = (0..4).map(|i| member(&format!("n{i}"), 95 + i)).collect();
    assert!(tracker.look(&site(nodes.clone()), t(100)).is_empty());
    tracker.uplink("plant-3", false);
    let actions = tracker.look(&site(nodes.clone()), t(100));
    let Some(Action::Partitioned { partition, .. }) = actions.first() else {
        panic!("{actions:?}")
    };
    assert_eq!(partition.cause, Cause::UplinkDown);
    assert_eq!(partition.since, t(98), "the site's last renewal");
    assert_eq!(unreachable(&actions), ["n0", "n1", "n2", "n3"]);
    assert!(actions.iter().all(|a| match a {
        Action::Unreachable { cause, since, .. } => *cause == Cause::UplinkDown && *since == t(98),
        _ => true,
    }));
    mark(&mut nodes, &actions);
    // Later looks: nodes now silent, but no second partition and nothing cleared.
    assert!(tracker.look(&site(nodes.clone()), t(130)).is_empty());
    // The bridge is up: the site returns; each node clears with its first renewal.
    tracker.uplink("plant-3", true);
    let actions = tracker.look(&site(nodes.clone()), t(131));
    assert!(
        matches!(actions.as_slice(), [Action::Returned { .. }]),
        "{actions:?}"
    );
    nodes[0].renewed = t(132);
    let actions = tracker.look(&site(nodes.clone()), t(133));
    assert_eq!(
        actions,
        [Action::Reachable {
            node: "n0".into(),
            at: t(132)
        }]
    );
    mark(&mut nodes, &actions);
    // The stragglers not heard yet are no new partition.
    assert!(tracker.look(&site(nodes.clone()), t(135)).is_empty());
}

#[test]
fn a_bridged_site_heard_again_returns_even_if_the_up_notification_is_lost() {
    let mut tracker = SiteTracker::default();
    let mut nodes: Vec<Member> = (0..3).map(|i| member(&format!("n{i}"), 95)).collect();
    tracker.uplink("plant-3", false);
    let actions = tracker.look(&site(nodes.clone()), t(100));
    mark(&mut nodes, &actions);
    assert_eq!(partitioned(&actions), 1);
    // A replica that restarts gets the retained "0" again: same start, same Event name.
    let mut restarted = SiteTracker::default();
    restarted.uplink("plant-3", false);
    let again = restarted.look(&site(nodes.clone()), t(104));
    assert_eq!(
        again.first(),
        actions.first(),
        "the same partition, so the same Event"
    );
    assert!(unreachable(&again).is_empty(), "already marked");
    nodes[1].renewed = t(140);
    let actions = tracker.look(&site(nodes.clone()), t(141));
    assert!(
        matches!(actions.first(), Some(Action::Returned { at, .. }) if *at == t(140)),
        "{actions:?}"
    );
    mark(&mut nodes, &actions);
    assert_eq!(
        partitioned(&tracker.look(&site(nodes), t(142))),
        0,
        "no flapping"
    );
}

/// While the apiserver does not take the replica's writes, and for two renew intervals and a
/// tick after it takes them again, the sites are held (Lease ages say nothing of them).
#[test]
fn sites_are_held_while_writes_fail_and_two_renew_intervals_after() {
    let members = site(vec![member("a", 0), member("b", 0), member("c", 0)]);
    assert!(held(true, None, &members));
    assert!(held(true, Some(Duration::from_secs(600)), &members));
    assert!(!held(false, None, &members), "no outage ever");
    let hold = Duration::from_secs(20) + TICK;
    assert!(held(false, Some(hold - Duration::from_millis(1)), &members));
    assert!(!held(false, Some(hold), &members));
    // The longest renew interval of the fleet sets the hold; kubelet's when none is known.
    let slow = site(vec![Member {
        renew_interval: SignedDuration::from_secs(60),
        ..member("a", 0)
    }]);
    assert!(held(false, Some(Duration::from_secs(100)), &slow));
    assert!(!held(false, Some(Duration::from_secs(122)), &slow));
    assert!(held(false, Some(Duration::from_secs(21)), &BTreeMap::new()));
    assert!(!held(false, Some(hold), &BTreeMap::new()));
}

/// A partition whose Event the apiserver did not take is taken back: the site is reachable
/// in the metrics, and the next look (after the hold) finds it again if it still is cut off.
#[test]
fn a_retracted_partition_leaves_the_site_reachable_and_is_found_again() {
    let mut tracker = SiteTracker::default();
    let members = site(vec![member("a", 0), member("b", 1), member("c", 2)]);
    let actions = tracker.look(&members, t(30));
    assert_eq!(partitioned(&actions), 1);
    tracker.retract("plant-3");
    tracker.hold(true);
    assert!(tracker.is_held());
    assert!(tracker.sites()["plant-3"].partition.is_none());
    let figures = figures(&Mutex::new(tracker));
    assert_eq!(figures, vec![("plant-3".into(), true, 3, 3)]);
    let mut tracker = SiteTracker::default();
    tracker.look(&members, t(30));
    tracker.retract("plant-3");
    tracker.hold(false);
    assert_eq!(partitioned(&tracker.look(&members, t(32))), 1);
}

/// Notifications for made-up sites, from anyone on the broker, keep at most
/// MAX_UNSEEN_UPLINKS between two looks and nothing after one; a retained `0` for a real
/// site, delivered before the first look, still cuts it off.
#[test]
fn uplink_notifications_are_bounded_by_the_sites_that_exist() {
    let mut tracker = SiteTracker::default();
    tracker.uplink("plant-3", false);
    for i in 0..200_000 {
        tracker.uplink(&format!("made-up-{i}"), false);
    }
    assert_eq!(
        tracker.unseen_down.len(),
        MAX_UNSEEN_UPLINKS,
        "bounded between looks"
    );
    let members = site(vec![member("a", 0), member("b", 1), member("c", 2)]);
    let actions = tracker.look(&members, t(3));
    assert_eq!(
        partitioned(&actions),
        1,
        "the real site's retained 0 was kept"
    );
    assert!(tracker.unseen_down.is_empty());
    assert_eq!(tracker.uplinks_down.len(), 1);
    assert_eq!(tracker.sites().len(), 1);
    // After a look, a made-up site is refused at once; a seen one is taken.
    let mut tracker = SiteTracker::default();
    tracker.look(&members, t(3));
    for i in 0..MAX_UNSEEN_UPLINKS * 2 {
        tracker.uplink(&format!("made-up-{i}"), false);
    }
    tracker.uplink("plant-3", false);
    assert!(tracker.uplinks_down.contains("plant-3"));
    assert_eq!(tracker.unseen_down.len(), MAX_UNSEEN_UPLINKS);
}

/// One node with a long Lease does not hold every site for long: the hold is capped.
#[test]
fn a_long_lease_holds_the_sites_no_longer_than_the_cap() {
    let long = site(vec![Member {
        renew_interval: SignedDuration::from_secs(900),
        ..member("a", 0)
    }]);
    assert_eq!(hold_after(&long), MAX_HOLD_INTERVAL * 2 + TICK);
    assert!(!held(false, Some(MAX_HOLD_INTERVAL * 2 + TICK), &long));
}

/// A partition taken back leaves the site as it was before the look that found it: the
/// last partition's stragglers are still known as such.
#[test]
fn a_retracted_partition_restores_what_came_before() {
    let mut tracker = SiteTracker::default();
    let cut = site(vec![member("a", 0), member("b", 1), member("c", 2)]);
    assert_eq!(partitioned(&tracker.look(&cut, t(30))), 1);
    // a and b are heard again; c stays silent: the site returned, c a straggler.
    let back = site(vec![member("a", 40), member("b", 41), member("c", 2)]);
    tracker.look(&back, t(42));
    let before = tracker.sites()["plant-3"].clone();
    assert!(before.partition.is_none() && before.last.is_some() && before.returned.is_some());
    // All silent again: a new partition, taken back.
    let again = site(vec![member("a", 40), member("b", 41), member("c", 42)]);
    assert_eq!(partitioned(&tracker.look(&again, t(70))), 1);
    tracker.retract("plant-3");
    let after = &tracker.sites()["plant-3"];
    assert_eq!(after.partition, None);
    assert_eq!(after.last, before.last);
    assert_eq!(after.returned, before.returned);
}
