//! MQTT-only scenarios: broker restart, failover to the next broker of a list, gateway
//! replicas on a shared subscription, and a gateway that was down longer than the renew
//! interval. All against real Mosquitto brokers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use edgebeat_tests::harness::{Cluster, Transport, fixture};
use edgebeat_tests::requests::{is_lease_renewed, renew_time};
use edgebeat_tests::standin::{RecordedRequest, StandInView};
use edgebeat_tests::wait::eventually;
use http::Method;
use jiff::{SignedDuration, Timestamp};

const DEADLINE: Duration = Duration::from_secs(30);

/// renewTimes written per node (successful writes only), in order.
fn renewals(requests: &[RecordedRequest], nodes: &[&str]) -> BTreeMap<String, Vec<Timestamp>> {
    nodes
        .iter()
        .map(|n| {
            (
                (*n).to_owned(),
                requests
                    .iter()
                    .filter(|r| is_lease_renewed(r, n))
                    .filter_map(renew_time)
                    .collect(),
            )
        })
        .collect()
}

fn max_gap(times: &[Timestamp]) -> SignedDuration {
    times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .max()
        .unwrap_or_default()
}

/// Lease duration 4 s (renew every 1 s): the lease must never go 4 s without a renewal.
fn config(cluster: &Cluster, node: &str, tree: &str) -> edgebeat_agent::AgentConfig {
    let mut c = cluster.agent_config(node, &fixture(tree));
    c.node_lease_duration_seconds = 4;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restart_does_not_let_the_lease_expire() {
    let mut cluster = Cluster::start(Transport::Mqtt).await.unwrap();
    let agent = cluster
        .start_agent(config(&cluster, "rpi4-edge-01", "rpi4-cgroup1"))
        .unwrap();
    cluster
        .wait_for_renewals("rpi4-edge-01", 2, DEADLINE)
        .await
        .unwrap();
    cluster.broker.as_mut().unwrap().restart().await.unwrap();
    cluster
        .wait_for_renewals("rpi4-edge-01", 3, DEADLINE)
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let times = &renewals(&cluster.standin.requests(), &["rpi4-edge-01"])["rpi4-edge-01"];
    let gap = max_gap(times);
    assert!(
        gap < SignedDuration::from_secs(4),
        "lease would have expired: longest gap {gap:?} in {times:?}"
    );
    let node = cluster.standin.node("rpi4-edge-01").unwrap();
    let ready = node
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");
}

/// Two brokers as two nodes of a broker cluster, and both sides listing both: the agent's
/// `transport.endpoints` and a replica's `--mqtt-endpoint` list. The first broker dies for
/// good; the agent and that replica both carry on through the second, and the Lease never
/// expires. (The cluster's first replica, subscribed on the first broker alone, is lost with
/// it: every renewal after the stop crossed the second broker.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_and_a_replica_fail_over_to_the_next_broker_of_their_lists() {
    let mut cluster = Cluster::start(Transport::Mqtt).await.unwrap();
    let second = edgebeat_tests::broker::Broker::start().await.unwrap();
    let first = {
        let b = cluster.broker.as_ref().unwrap();
        (b.host().to_owned(), b.port())
    };
    let moving = cluster
        .start_replica_at(
            edgebeat_tests::harness::gateway_options(),
            &[(&first.0, first.1), (second.host(), second.port())],
        )
        .await
        .unwrap();
    let mut c = config(&cluster, "rpi4-edge-01", "rpi4-cgroup1");
    let Some(edgebeat_agent::config::TransportConfig::Mqtt(m)) = c.transport.as_mut() else {
        panic!("an MQTT agent");
    };
    m.failover = vec![(second.host().to_owned(), second.port())];
    let agent = cluster.start_agent(c).unwrap();
    cluster
        .wait_for_renewals("rpi4-edge-01", 2, DEADLINE)
        .await
        .unwrap();
    let gateway = cluster.replicas[moving].as_ref().unwrap().gateway.clone();
    cluster.broker.as_mut().unwrap().stop().await;
    // Counted by the replica itself, which counts a write when its answer arrives: at
    // most one of these was taken through the first broker before it stopped.
    let before = gateway.counters.lease_renewals.get();
    edgebeat_tests::harness::wait_for(
        "the replica to carry 3 more renewals through the second broker",
        DEADLINE,
        || gateway.counters.lease_renewals.get() >= before + 3,
    )
    .await;
    agent.stop().await.unwrap();
    let times = &renewals(&cluster.standin.requests(), &["rpi4-edge-01"])["rpi4-edge-01"];
    let gap = max_gap(times);
    assert!(
        gap < SignedDuration::from_secs(4),
        "lease would have expired: longest gap {gap:?} in {times:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_split_the_fleet_write_each_renewal_once_and_survive_a_loss() {
    let mut cluster = Cluster::start(Transport::Mqtt).await.unwrap();
    cluster
        .start_replica(edgebeat_tests::harness::gateway_options())
        .await
        .unwrap();
    let nodes = ["rpi4-edge-01", "jetson-07", "nuc-lab-03"];
    let trees = ["rpi4-cgroup1", "jetson-cgroup2", "nuc-hybrid"];
    let agents: Vec<_> = nodes
        .iter()
        .zip(trees)
        .map(|(n, t)| cluster.start_agent(config(&cluster, n, t)).unwrap())
        .collect();
    let each = |v: &StandInView<'_>, k: usize| {
        nodes.iter().all(|n| {
            v.requests()
                .iter()
                .filter(|r| is_lease_renewed(r, n))
                .count()
                >= k
        })
    };
    cluster
        .standin
        .wait_until(DEADLINE, "all nodes renewing", |v| each(v, 4))
        .await
        .unwrap();
    let (a, b) = (
        cluster.replicas[0].as_ref().unwrap().gateway.clone(),
        cluster.replicas[1].as_ref().unwrap().gateway.clone(),
    );
    let (wrote_a, wrote_b) = (
        a.counters.lease_renewals.get(),
        b.counters.lease_renewals.get(),
    );
    assert!(
        wrote_a > 0 && wrote_b > 0,
        "both replicas carry renewals: {wrote_a} / {wrote_b}"
    );

    // Replica 0 is killed, with no shutdown (no MQTT DISCONNECT, its watch and connection
    // cut where they stand); replica 1 carries every node.
    let health = cluster.replicas[0].as_ref().unwrap().metrics_addr;
    cluster.kill_replica(0).await;
    // Killed means all of it: its /healthz port closes too (the task is aborted, so the
    // listener goes within moments).
    eventually(
        &format!("the killed replica's {health} refusing connections"),
        DEADLINE,
        || async {
            match tokio::net::TcpStream::connect(health).await {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
                other => Err(other.map(|_| "connected")),
            }
        },
    )
    .await;
    let marks: Vec<usize> = nodes
        .iter()
        .map(|n| {
            cluster
                .standin
                .requests()
                .iter()
                .filter(|r| is_lease_renewed(r, n))
                .count()
        })
        .collect();
    cluster
        .standin
        .wait_until(DEADLINE, "every node renewing through the survivor", |v| {
            nodes.iter().zip(&marks).all(|(n, m)| {
                v.requests()
                    .iter()
                    .filter(|r| is_lease_renewed(r, n))
                    .count()
                    >= m + 3
            })
        })
        .await
        .unwrap();
    for agent in agents {
        agent.stop().await.unwrap();
    }
    let requests = cluster.standin.requests();
    for (node, times) in renewals(&requests, &nodes) {
        assert!(
            times.windows(2).all(|w| w[0] < w[1]),
            "{node}: renewTime strictly increases across replicas: {times:?}"
        );
        let gap = max_gap(&times);
        assert!(
            gap < SignedDuration::from_secs(4),
            "{node}: lease would have expired: longest gap {gap:?}"
        );
    }
    // Exactly once: every renewal the gateways counted as written is one successful PUT
    // or the initial create, and no write was repeated. The one exception is the write the
    // killed replica had in flight when it stopped: the apiserver took it, the replica never
    // counted it. A replica counts a write when its answer arrives, after the stand-in has
    // recorded it, so the count is read once the survivor has caught up.
    let puts_and_creates = requests
        .iter()
        .filter(|r| {
            r.path.contains("/leases")
                && matches!(r.method, Method::PUT | Method::POST)
                && (r.status == 200 || r.status == 201)
        })
        .count() as u64;
    let counted = || a.counters.lease_renewals.get() + b.counters.lease_renewals.get();
    edgebeat_tests::harness::wait_for("the survivor to count its last write", DEADLINE, || {
        counted() + 1 >= puts_and_creates
    })
    .await;
    let written = counted();
    assert!(
        puts_and_creates >= written && puts_and_creates <= written + 1,
        "each renewal written exactly once: {written} counted, {puts_and_creates} written"
    );
    let lease_gets = requests
        .iter()
        .filter(|r| r.method == Method::GET && r.path.contains("/leases/"))
        .count();
    assert!(
        lease_gets <= nodes.len() * 2,
        "lease GETs stay rare with replicas alternating: {lease_gets}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_back_from_an_outage_writes_no_stale_renewal() {
    let mut cluster = Cluster::start(Transport::Mqtt).await.unwrap();
    let agent = cluster
        .start_agent(config(&cluster, "jetson-07", "jetson-cgroup2"))
        .unwrap();
    cluster
        .wait_for_renewals("jetson-07", 2, DEADLINE)
        .await
        .unwrap();
    cluster.stop_replica(0).await;
    // Down for longer than the renew interval (1 s) and the message expiry (1 s): the
    // agent keeps publishing renewals that nobody takes.
    let down_since = Timestamp::now();
    let sent = |c: &Cluster| c.standin.requests().len();
    let before = sent(&cluster);
    tokio::time::sleep(Duration::from_secs(3)).await; // the outage itself, not a wait for state
    assert_eq!(
        sent(&cluster),
        before,
        "nothing reaches the apiserver while the gateway is down"
    );
    let back_at = Timestamp::now();
    let index = cluster
        .start_replica(edgebeat_tests::harness::gateway_options())
        .await
        .unwrap();
    cluster
        .wait_for_renewals("jetson-07", 3, DEADLINE)
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let after: Vec<_> = cluster
        .standin
        .requests()
        .into_iter()
        .skip(before)
        .filter(|r| is_lease_renewed(r, "jetson-07"))
        .collect();
    let times: Vec<Timestamp> = after.iter().filter_map(renew_time).collect();
    // A backlog would show as a burst: several writes within moments of the restart.
    let burst = times
        .iter()
        .filter(|t| t.duration_since(back_at) < SignedDuration::from_millis(500))
        .count();
    assert!(burst <= 1, "no backlog written on return: {times:?}");
    assert!(
        times
            .windows(2)
            .all(|w| w[1].duration_since(w[0]) >= SignedDuration::from_millis(900)),
        "renewals keep their cadence: {times:?}"
    );
    assert!(
        times.iter().all(|t| *t > down_since),
        "renewTime is the gateway's clock at write time"
    );
    let stale = cluster.replicas[index]
        .as_ref()
        .unwrap()
        .gateway
        .counters
        .stale_renewals
        .get();
    assert_eq!(stale, 0, "expired messages never even reached the gateway");
}

/// Two replicas on one shared subscription see one node's messages in turn. Each diffs
/// against what the apiserver holds (their Node watches), so a reboot is one `Rebooted`
/// event, not one per replica, and the controller's Unknown is repaired once, with
/// transition times after it and one `NodeReady` event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_a_fleet_record_each_change_once() {
    const NODE: &str = "rpi4-edge-01";
    let mut cluster = Cluster::start(Transport::Mqtt).await.unwrap();
    cluster
        .start_replica(edgebeat_tests::harness::gateway_options())
        .await
        .unwrap();
    let host = edgebeat_tests::harness::fixture_copy("rpi4-cgroup1").unwrap();
    let mut agent_config = cluster.agent_config(NODE, host.path());
    agent_config.node_lease_duration_seconds = 4;
    // Only the start-up report and the ones the gateway asks for.
    agent_config.node_status_report_frequency = Duration::from_secs(3600);
    let agent = cluster.start_agent(agent_config.clone()).unwrap();
    cluster.wait_for_renewals(NODE, 6, DEADLINE).await.unwrap();
    agent.stop().await.unwrap();

    // A reboot: a new boot ID, the agent starts again and registers.
    let new_boot = "0c5e7d1a-2b3c-4d5e-8f90-a1b2c3d4e5f6";
    std::fs::write(
        host.path().join("proc/sys/kernel/random/boot_id"),
        format!("{new_boot}\n"),
    )
    .unwrap();
    let agent = cluster.start_agent(agent_config).unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "new boot ID and its Rebooted event", |v| {
            v.node(NODE).is_some_and(|n| {
                n.status
                    .and_then(|s| s.node_info)
                    .is_some_and(|i| i.boot_id == new_boot)
            }) && v
                .events()
                .iter()
                .any(|e| e.reason.as_deref() == Some("Rebooted"))
        })
        .await
        .unwrap();
    cluster.wait_for_renewals(NODE, 6, DEADLINE).await.unwrap();

    // The node lifecycle controller marks the node Unknown.
    let unknown_at = Timestamp::from_second(Timestamp::now().as_second()).unwrap();
    assert!(cluster.standin.update_node(NODE, |node| {
        for c in node.status.as_mut().unwrap().conditions.as_mut().unwrap() {
            c.status = "Unknown".into();
            c.reason = Some("NodeStatusUnknown".into());
            c.last_transition_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                unknown_at,
            ));
        }
    }));
    cluster
        .standin
        .wait_until(DEADLINE, "Ready again, with its NodeReady event", |v| {
            v.node(NODE).is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .is_some_and(|cs| cs.iter().all(|c| c.status != "Unknown"))
            }) && v
                .events()
                .iter()
                .any(|e| e.reason.as_deref() == Some("NodeReady"))
        })
        .await
        .unwrap();
    // Both replicas keep serving the node for a few more renewals: a duplicate would come
    // from the replica that did not write.
    cluster.wait_for_renewals(NODE, 8, DEADLINE).await.unwrap();
    agent.stop().await.unwrap();

    for (i, replica) in cluster.replicas.iter().enumerate() {
        let written = replica
            .as_ref()
            .unwrap()
            .gateway
            .counters
            .lease_renewals
            .get();
        assert!(written > 0, "replica {i} carried renewals too");
    }
    let reasons = cluster.standin.event_reasons();
    let count = |r: &str| reasons.iter().filter(|x| *x == r).count();
    assert_eq!(
        count("Rebooted"),
        1,
        "one Rebooted for one reboot: {reasons:?}"
    );
    assert_eq!(
        count("NodeReady"),
        1,
        "one NodeReady for Unknown → True: {reasons:?}"
    );
    let node = cluster.standin.node(NODE).unwrap();
    for c in node.status.unwrap().conditions.unwrap() {
        assert!(
            c.last_transition_time.unwrap().0 >= unknown_at,
            "{}: the transition follows the controller's Unknown",
            c.type_
        );
    }
}
