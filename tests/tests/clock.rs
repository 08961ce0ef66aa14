//! Clock faults on the agent: boards without an RTC whose wall clock jumps by an hour and
//! back (a wrong manual date, NTP's first sync). kubelet's heartbeats carry no agent time,
//! and neither do edgebeat's writes: renewTime, lastHeartbeatTime and transition times are
//! the gateway's clock, elapsed time is the agent's CLOCK_BOOTTIME. So over plain gRPC and
//! MQTT the apiserver sees nothing change. Signed MQTT is the one place the agent's wall
//! time counts (the signed clock window bounds replays): there a jump past the window is
//! refused, counted, answered with the size of the skew, and renewals resume once the clock
//! is right again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use edgebeat_tests::harness::{Cluster, ShiftedClock, Transport, fixture, gateway_options};
use edgebeat_tests::pki::Ca;
use edgebeat_tests::requests::{count, is_lease_renewed, renew_time};
use edgebeat_transports::ingress::RejectReason;
use jiff::{SignedDuration, Timestamp};

const DEADLINE: Duration = Duration::from_secs(20);
const HOUR_MS: i64 = 3_600_000;

/// The Node's conditions as (type, status, reason, lastTransitionTime): what a jump would
/// move if agent time leaked into a status write.
fn conditions(cluster: &Cluster, node: &str) -> Vec<(String, String, Option<String>, String)> {
    let node = cluster.standin.node(node).unwrap();
    let mut out: Vec<_> = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            (
                c.type_,
                c.status,
                c.reason,
                c.last_transition_time
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

async fn a_wall_clock_jump_changes_nothing_the_apiserver_sees(transport: Transport) {
    const NODE: &str = "rtc-less-01";
    let cluster = Cluster::start(transport).await.unwrap();
    let clock = Arc::new(ShiftedClock::default());
    let agent = cluster
        .start_agent_with_clock(
            cluster.agent_config(NODE, &fixture("rpi4-cgroup1")),
            clock.clone(),
        )
        .unwrap();
    cluster.wait_for_renewals(NODE, 3, DEADLINE).await.unwrap();
    let before = conditions(&cluster, NODE);
    let events = cluster.standin.events().len();
    let start = cluster.standin.requests().len();
    // An hour ahead, an hour behind, then right again: several renewals each.
    for offset in [HOUR_MS, -HOUR_MS, 0] {
        clock.shift(offset);
        cluster.wait_for_renewals(NODE, 4, DEADLINE).await.unwrap();
    }
    agent.stop().await.unwrap();

    let requests = cluster.standin.requests();
    let times: Vec<Timestamp> = requests[start..]
        .iter()
        .filter(|r| is_lease_renewed(r, NODE))
        .filter_map(renew_time)
        .collect();
    assert!(times.len() >= 12, "{times:?}");
    // renewTime is the gateway's clock: a steady cadence (renewals every 250 ms here), no
    // step of an hour either way, and now, not an hour off.
    for w in times.windows(2) {
        let gap = w[1].duration_since(w[0]);
        assert!(
            gap > SignedDuration::ZERO && gap < SignedDuration::from_secs(1),
            "renewTime stepped by {gap:?}: {times:?}"
        );
    }
    let last = times.last().unwrap();
    assert!(
        Timestamp::now().duration_since(*last).abs() < SignedDuration::from_secs(5),
        "renewTime {last} is not the gateway's now"
    );
    assert_eq!(conditions(&cluster, NODE), before, "conditions unchanged");
    assert_eq!(cluster.standin.events().len(), events, "no events");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_changes_nothing_over_grpc() {
    a_wall_clock_jump_changes_nothing_the_apiserver_sees(Transport::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_changes_nothing_over_mqtt() {
    a_wall_clock_jump_changes_nothing_the_apiserver_sees(Transport::Mqtt).await;
}

/// Signed MQTT: a wall clock an hour off is outside the clock window (30 s), so its signed
/// renewals are refused as `clock_skew` and nothing is written for them; once the clock is
/// right again, renewals resume within the agent's backoff (at most 7 s). Both directions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_mqtt_refuses_a_clock_off_by_an_hour_and_resumes_when_it_is_right() {
    const NODE: &str = "rtc-less-02";
    let site = Ca::new("edgebeat site CA");
    let cluster = Cluster::start_mqtt_secure(&site, true, gateway_options())
        .await
        .unwrap();
    let clock = Arc::new(ShiftedClock::default());
    let cert = site.node(NODE);
    let agent = cluster
        .start_agent_with_clock(
            cluster.secure_agent_config(NODE, &fixture("rpi4-cgroup1"), &cert),
            clock.clone(),
        )
        .unwrap();
    cluster.wait_for_renewals(NODE, 3, DEADLINE).await.unwrap();
    let renewals = || count(&cluster.standin.requests(), |r| is_lease_renewed(r, NODE));
    for (round, offset) in [HOUR_MS, -HOUR_MS].into_iter().enumerate() {
        let refused_before = cluster.rejections(RejectReason::ClockSkew);
        clock.shift(offset);
        // Two refused: whatever was sent before the jump has been written by now.
        cluster
            .wait_for_rejections(RejectReason::ClockSkew, refused_before + 2, DEADLINE)
            .await;
        let written = renewals();
        cluster
            .wait_for_rejections(RejectReason::ClockSkew, refused_before + 5, DEADLINE)
            .await;
        assert_eq!(
            renewals(),
            written,
            "round {round}: nothing written while the clock is off"
        );
        clock.shift(0);
        cluster.wait_for_renewals(NODE, 3, DEADLINE).await.unwrap();
    }
    agent.stop().await.unwrap();
}
