//! The soak's two-minute version (`scripts/soak.sh` runs the hour at 10,000 nodes): a
//! simulated fleet with reboots through one in-process gateway and a real Mosquitto, at
//! kubelet's renew ratio on a short lease. Checks what an hour would show sooner or later:
//! no Lease ever older than its duration, and no growth of open files in this process
//! (gateway, simulated agents, stand-in) or in the broker while nodes reconnect. RSS before
//! and after is printed, not asserted: memory goals live in benchmarks (`scripts/soak.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use edgebeat_tests::fleet::{FleetOptions, FleetStats, FleetTransport, run_fleet};
use edgebeat_tests::harness::{Cluster, Transport, wait_for};
use edgebeat_tests::procfs::{open_files, vm_rss_kib};
use tokio_util::sync::CancellationToken;

const NODES: usize = 500;
const LEASE_SECONDS: i32 = 8;
const RUN: Duration = Duration::from_secs(120);
/// Open files may move by a few (a connection being made, a log file) but not per reboot.
const FD_SLACK: usize = 16;

fn rss_kib(pid: u32) -> u64 {
    vm_rss_kib(pid).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_minutes_of_a_rebooting_fleet_expire_nothing_and_leak_no_files() {
    let cluster = Cluster::start(Transport::Mqtt).await.unwrap();
    cluster.standin.set_recording(false);
    let broker = cluster.broker.as_ref().unwrap();
    let broker_pid = broker.pid().unwrap();
    let mut options = FleetOptions::new(NODES, FleetTransport::mqtt(broker.host(), broker.port()));
    options.lease_duration_seconds = LEASE_SECONDS;
    options.renew_interval = Duration::from_secs(2);
    options.status_interval = Duration::from_secs(2);
    options.ramp = Duration::from_secs(5);
    options.reboots_per_minute = 60.0;
    let stats = Arc::new(FleetStats::default());
    let cancel = CancellationToken::new();
    let fleet = tokio::spawn(run_fleet(options, stats.clone(), cancel.clone()));
    wait_for("every node's Lease", Duration::from_secs(60), || {
        cluster.standin.lease_renew_times().len() >= NODES
    })
    .await;

    let me = std::process::id();
    let first = (open_files(me), open_files(broker_pid));
    let rss_first = (rss_kib(me), rss_kib(broker_pid));
    let mut oldest = 0.0_f64;
    let mut sample = tokio::time::interval(Duration::from_millis(500));
    let end = tokio::time::Instant::now() + RUN;
    while tokio::time::Instant::now() < end {
        sample.tick().await;
        let now = jiff::Timestamp::now();
        for (name, renew) in cluster.standin.lease_renew_times() {
            let age = now.duration_since(renew).as_secs_f64();
            oldest = oldest.max(age);
            assert!(
                age <= f64::from(LEASE_SECONDS),
                "{name}'s Lease is {age:.1} s old"
            );
        }
    }
    let last = (open_files(me), open_files(broker_pid));
    let rss_last = (rss_kib(me), rss_kib(broker_pid));
    cancel.cancel();
    fleet.await.unwrap();
    let reboots = stats.reboots.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "{NODES} nodes, {reboots} reboots, oldest Lease {oldest:.1} s; open files: this process {} → {}, broker {} → {}; RSS KiB: this process (the stand-in's watch history of 10,000 records filling included) {} → {}, broker {} → {}",
        first.0, last.0, first.1, last.1, rss_first.0, rss_last.0, rss_first.1, rss_last.1
    );
    assert!(reboots >= 60, "the fleet rebooted nodes: {reboots}");
    assert!(
        last.0 <= first.0 + FD_SLACK,
        "this process's open files grew: {} → {}",
        first.0,
        last.0
    );
    assert!(
        last.1 <= first.1 + FD_SLACK,
        "the broker's open files grew: {} → {}",
        first.1,
        last.1
    );
}
