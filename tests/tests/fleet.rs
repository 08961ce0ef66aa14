//! A small fleet through one gateway, on each transport: the fleet simulator's nodes (real
//! gRPC streams, real MQTT sessions through Mosquitto) renew through an in-process gateway
//! into the stand-in apiserver. Correctness, not speed: no Lease is ever older than its
//! duration, no renewal fails, nothing is dropped as stale, and no renewTime goes backwards.
//! The timed figures live in `edgebeat-fleet` (BENCHMARKS.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use edgebeat_tests::fleet::{FleetOptions, FleetStats, FleetTransport, run_fleet};
use edgebeat_tests::harness::{Cluster, Transport, wait_for};
use tokio_util::sync::CancellationToken;

const NODES: usize = 500;
/// A short lease (kubelet's ratio: renew every quarter of it) so a short run sees many.
const LEASE_SECONDS: i32 = 8;
const RUN: Duration = Duration::from_secs(25);

async fn fleet_through_one_gateway(transport: Transport) {
    let cluster = Cluster::start(transport).await.unwrap();
    cluster.standin.set_recording(false);
    let fleet_transport = match transport {
        Transport::Grpc => FleetTransport::Grpc(cluster.grpc_url.clone()),
        Transport::Mqtt => {
            let broker = cluster.broker.as_ref().unwrap();
            FleetTransport::mqtt(broker.host(), broker.port())
        }
    };
    let mut options = FleetOptions::new(NODES, fleet_transport);
    options.lease_duration_seconds = LEASE_SECONDS;
    options.renew_interval = Duration::from_secs(2);
    options.status_interval = Duration::from_secs(2);
    options.ramp = Duration::from_secs(3);
    options.flip_probability = 0.02;
    let stats = Arc::new(FleetStats::default());
    let cancel = CancellationToken::new();
    let fleet = tokio::spawn(run_fleet(options, stats.clone(), cancel.clone()));

    // Every Lease exists once the fleet has joined.
    wait_for("every node's Lease", Duration::from_secs(30), || {
        cluster.standin.lease_renew_times().len() >= NODES
    })
    .await;
    let mut last: HashMap<String, jiff::Timestamp> = HashMap::new();
    let mut samples = 0;
    let mut sample = tokio::time::interval(Duration::from_millis(250));
    let end = tokio::time::Instant::now() + RUN;
    while tokio::time::Instant::now() < end {
        sample.tick().await;
        let now = jiff::Timestamp::now();
        let leases = cluster.standin.lease_renew_times();
        assert_eq!(leases.len(), NODES);
        for (name, renew) in leases {
            let age = now.duration_since(renew).as_secs_f64();
            assert!(
                age <= f64::from(LEASE_SECONDS),
                "{name}'s Lease is {age:.1} s old"
            );
            if let Some(previous) = last.insert(name.clone(), renew) {
                assert!(renew >= previous, "{name}'s renewTime went backwards");
            }
        }
        samples += 1;
    }
    cancel.cancel();
    fleet.await.unwrap();
    let gateway = cluster.gateway();
    let renewals = stats.renewals_ok.load(Ordering::Relaxed);
    println!(
        "{transport:?}: {NODES} nodes, {samples} samples, {renewals} renewals, {} status reports, {} reboots",
        stats.status_ok.load(Ordering::Relaxed),
        stats.reboots.load(Ordering::Relaxed)
    );
    assert!(
        renewals >= (NODES as u64) * 8,
        "about one renewal per node every 2 s: {renewals}"
    );
    assert_eq!(
        stats.renewals_failed.load(Ordering::Relaxed),
        0,
        "{:?}",
        stats.failures()
    );
    assert_eq!(gateway.counters.stale_renewals.get(), 0);
    assert_eq!(gateway.counters.rejected(), 0);
    assert!(
        stats.status_ok.load(Ordering::Relaxed) > 0,
        "flips were reported"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_over_grpc_never_expires() {
    fleet_through_one_gateway(Transport::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_over_mqtt_never_expires() {
    fleet_through_one_gateway(Transport::Mqtt).await;
}

/// The enrollment storm, short: 200 nodes with one bootstrap token start at once, each
/// enrolls as the agent does (gateway limits as deployed, but per source raised: every
/// simulated board dials from 127.0.0.1) and then renews with its certificate. Every node
/// ends identified; the timed 10,000-node figure is `edgebeat-fleet --enroll`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_enrolling_at_once_ends_identified() {
    const FLEET: usize = 200;
    let mut gateway = edgebeat_tests::harness::gateway_options();
    gateway.enrollment_limits.per_source_rate = 1000.0;
    gateway.enrollment_limits.per_source_burst = 1000.0;
    let cluster = Cluster::start_enrolling(
        Transport::Grpc,
        edgebeat_gateway::enrollment::EnrollmentOptions::default(),
        gateway,
    )
    .await
    .unwrap();
    cluster.standin.set_recording(false);
    let token = cluster
        .bootstrap_token(&["sim-*"], FLEET as u32, Duration::from_secs(3600))
        .await
        .unwrap();
    let mut options = FleetOptions::new(FLEET, FleetTransport::Grpc(cluster.grpc_url.clone()));
    options.ramp = Duration::ZERO;
    options.lease_duration_seconds = LEASE_SECONDS;
    options.renew_interval = Duration::from_secs(2);
    options.enroll = Some(edgebeat_tests::fleet::FleetEnrollment {
        url: cluster.enrolling.as_ref().unwrap().enrollment_urls[0].clone(),
        token,
    });
    let stats = Arc::new(FleetStats::default());
    let cancel = CancellationToken::new();
    let fleet = tokio::spawn(run_fleet(options, stats.clone(), cancel.clone()));
    wait_for("every node identified", Duration::from_secs(60), || {
        stats.identified.load(Ordering::Relaxed) >= FLEET as u64
    })
    .await;
    cancel.cancel();
    fleet.await.unwrap();
    let enrollment = cluster.replicas[0]
        .as_ref()
        .unwrap()
        .enrollment
        .clone()
        .unwrap();
    assert_eq!(enrollment.counters.get("token", "issued"), FLEET as u64);
    assert_eq!(stats.enrolled.load(Ordering::Relaxed), FLEET as u64);
    println!(
        "{FLEET} nodes enrolled with {} requests ({} retried)",
        stats.enrollment_requests.load(Ordering::Relaxed),
        stats.enrollment_retries.load(Ordering::Relaxed)
    );
}
