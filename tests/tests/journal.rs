//! What happened while a node's link was down arrives with its true times: a board that
//! reboots and then comes under memory pressure while its gateway cannot be reached gets,
//! once the link returns, its `Rebooted` Event at the time it booted (from its uptime) and
//! its `NodeHasInsufficientMemory` Event and MemoryPressure `lastTransitionTime` at the time
//! the agent saw the pressure (from its journal), not at the reconnection. Against the
//! stand-in apiserver's recorded Events, over gRPC (the journal is in the one contract
//! every transport carries).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use edgebeat_hw::{Clock, SystemClock};
use edgebeat_proto::agent_message::Kind;
use edgebeat_tests::harness::{Cluster, Transport, fixture_copy, gateway_options, wait_for};
use jiff::Timestamp;

const DEADLINE: Duration = Duration::from_secs(60);
const NODE: &str = "rpi4-edge-01";

/// The real wall clock, and a boot clock that started at `booted`: a board that has just
/// rebooted.
struct RebootedClock {
    booted: Instant,
}

impl Clock for RebootedClock {
    fn now(&self) -> std::time::SystemTime {
        SystemClock.now()
    }

    fn boottime(&self) -> Duration {
        self.booted.elapsed()
    }
}

fn events(cluster: &Cluster, reason: &str) -> Vec<k8s_openapi::api::core::v1::Event> {
    cluster
        .standin
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Seconds between `recorded` (whole seconds, as `metav1.Time` keeps) and the true time
/// `truth` taken down to its second.
fn off_by(recorded: Timestamp, truth: Timestamp) -> f64 {
    let truth = Timestamp::from_second(truth.as_second()).unwrap();
    (recorded.as_millisecond() - truth.as_millisecond()).abs() as f64 / 1e3
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_and_a_transition_made_while_cut_off_arrive_with_their_true_times() {
    let mut cluster = Cluster::start(Transport::Grpc).await.unwrap();
    let host = fixture_copy("rpi4-cgroup1").unwrap();
    let config = cluster.agent_config(NODE, host.path());
    let agent = cluster.start_agent(config.clone()).unwrap();
    cluster.wait_for_renewals(NODE, 2, DEADLINE).await.unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "status written", |v| {
            v.node(NODE)
                .and_then(|n| n.status?.node_info)
                .is_some_and(|i| !i.boot_id.is_empty())
        })
        .await
        .unwrap();

    // The link goes down: no gateway answers.
    cluster.stop_replica(0).await;

    // The board reboots while cut off.
    agent.stop().await.unwrap();
    let new_boot = "0c5e7d1a-2b3c-4d5e-8f90-a1b2c3d4e5f6";
    std::fs::write(
        host.path().join("proc/sys/kernel/random/boot_id"),
        format!("{new_boot}\n"),
    )
    .unwrap();
    let booted_at = Timestamp::now();
    let clock = Arc::new(RebootedClock {
        booted: Instant::now(),
    });
    let agent = cluster
        .start_agent_with_clock(config, clock.clone())
        .unwrap();
    // Up a while before the pressure comes, so boot and pressure are seconds apart.
    wait_for("the new boot up 2 s", DEADLINE, || {
        clock.boottime() > Duration::from_secs(2)
    })
    .await;

    // Memory pressure while still cut off: the root cgroup leaves less than 100Mi.
    let usage = 3_978_792_960u64 - 50 * 1024 * 1024 + 991_285_248;
    let cgroup = host.path().join("sys/fs/cgroup/memory");
    std::fs::write(cgroup.join("memory.usage_in_bytes"), format!("{usage}\n")).unwrap();
    let pressure_at = Timestamp::now();
    // The agent computes every 100 ms; its journal holds the transition from then on (and
    // its next Register would carry it).
    wait_for("the pressure in the agent's journal", DEADLINE, || {
        let register = agent.agent.register_message(true);
        let Some(Kind::Register(register)) = register.kind else {
            return false;
        };
        register
            .journal
            .iter()
            .any(|t| t.r#type == "MemoryPressure" && t.status == "True")
    })
    .await;
    // The outage lasts past what a report's normal delay is (the gateway's `LATE`, 10 s).
    wait_for("the outage 11 s past the pressure", DEADLINE, || {
        Timestamp::now().duration_since(pressure_at).as_secs_f64() > 11.0
    })
    .await;

    // The link returns.
    let healed_at = Timestamp::now();
    cluster.start_replica(gateway_options()).await.unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "both events recorded", |v| {
            let events = v.events();
            ["Rebooted", "NodeHasInsufficientMemory"]
                .iter()
                .all(|r| events.iter().any(|e| e.reason.as_deref() == Some(*r)))
        })
        .await
        .unwrap();
    // The report after the Register carries the journal again: nothing twice.
    cluster.wait_for_renewals(NODE, 2, DEADLINE).await.unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "MemoryPressure written True", |v| {
            v.node(NODE)
                .and_then(|n| n.status?.conditions)
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "MemoryPressure" && c.status == "True")
                })
        })
        .await
        .unwrap();
    agent.stop().await.unwrap();

    let rebooted = events(&cluster, "Rebooted");
    assert_eq!(rebooted.len(), 1, "{rebooted:#?}");
    let at = rebooted[0].first_timestamp.as_ref().unwrap().0;
    println!(
        "Rebooted recorded {:.1} s from the boot, healed {:.1} s after it",
        off_by(at, booted_at),
        healed_at.duration_since(booted_at).as_secs_f64()
    );
    assert!(
        off_by(at, booted_at) <= 1.0,
        "Rebooted at {at}, booted {booted_at}"
    );

    let pressure = events(&cluster, "NodeHasInsufficientMemory");
    let all: Vec<_> = cluster
        .standin
        .events()
        .into_iter()
        .map(|e| (e.reason, e.first_timestamp.map(|t| t.0), e.message))
        .collect();
    println!("pressure {pressure_at} healed {healed_at} booted {booted_at}: {all:#?}");
    assert_eq!(
        events(&cluster, "NodeHasSufficientMemory").len(),
        2,
        "one per start, each of the status at its start: {all:#?}"
    );
    assert_eq!(pressure.len(), 1, "{pressure:#?}");
    let at = pressure[0].first_timestamp.as_ref().unwrap().0;
    assert!(
        off_by(at, pressure_at) <= 1.0,
        "pressure event at {at}, pressure at {pressure_at}"
    );
    let message = pressure[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("after the node's link was down"),
        "{message}"
    );
    let node = cluster.standin.node(NODE).unwrap();
    let condition = node
        .status
        .and_then(|s| s.conditions)
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "MemoryPressure")
        .unwrap();
    let transition = condition.last_transition_time.unwrap().0;
    assert!(
        off_by(transition, pressure_at) <= 1.0,
        "lastTransitionTime {transition}, pressure at {pressure_at}, healed {healed_at}"
    );
}
