use super::*;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

struct Fixed(Mutex<SystemTime>);
impl Clock for Fixed {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }
    fn boottime(&self) -> Duration {
        Duration::ZERO
    }
}

#[test]
fn skew_is_gateway_minus_agent_and_signed() {
    let gw = UNIX_EPOCH + Duration::from_millis(1_700_000_010_250);
    assert_eq!(clock_skew_seconds(gw, 1_700_000_000_000), Some(10.25));
    assert_eq!(clock_skew_seconds(gw, 1_700_000_012_750), Some(-2.5));
    assert_eq!(clock_skew_seconds(gw, 1_700_000_010_250), Some(0.0));
    assert_eq!(clock_skew_seconds(gw, 0), None, "no wall time sent");
    // An agent without RTC that booted in 1970.
    assert!(clock_skew_seconds(gw, 5_000).unwrap() > 1.69e9);
}

#[test]
fn lease_age_is_now_minus_the_written_renew_time() {
    let renew: Timestamp = "2026-11-21T10:00:00.250Z".parse().unwrap();
    let now = SystemTime::from(renew) + Duration::from_millis(12_500);
    assert_eq!(lease_age_seconds(now, renew.as_microsecond()), 12.5);
    assert_eq!(
        lease_age_seconds(SystemTime::from(renew), renew.as_microsecond()),
        0.0
    );
}

#[test]
fn families_compute_age_at_scrape_time_and_drop_removed_nodes() {
    let renew: Timestamp = "2026-11-21T10:00:00Z".parse().unwrap();
    let clock = Arc::new(Fixed(Mutex::new(SystemTime::from(renew))));
    let metrics = NodeMetrics::new(clock.clone());
    let mut registry = Registry::default();
    registry.register_with_unit(
        "edgebeat_gateway_node_lease_age",
        "age",
        Unit::Seconds,
        metrics.lease_age.clone(),
    );
    registry.register_with_unit(
        "edgebeat_gateway_node_clock_skew",
        "skew",
        Unit::Seconds,
        metrics.clock_skew.clone(),
    );
    let text = |r: &Registry| {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, r).unwrap();
        out
    };
    for node in ["edge-01", "edge-02"] {
        metrics.lease_age(node).renewed(renew);
        metrics.clock_skew(node).set(-1.5);
    }
    *clock.0.lock().unwrap() += Duration::from_secs(7);
    let out = text(&registry);
    assert!(
        out.contains("edgebeat_gateway_node_lease_age_seconds{node=\"edge-01\"} 7.0\n"),
        "{out}"
    );
    assert!(out.contains("edgebeat_gateway_node_clock_skew_seconds{node=\"edge-02\"} -1.5\n"));
    // Later scrapes see the age grow with no write.
    *clock.0.lock().unwrap() += Duration::from_secs(33);
    assert!(text(&registry).contains("{node=\"edge-01\"} 40.0\n"));

    metrics.remove("edge-01");
    let out = text(&registry);
    assert!(!out.contains("edge-01"), "{out}");
    assert!(out.contains("edgebeat_gateway_node_lease_age_seconds{node=\"edge-02\"} 40.0\n"));
}

/// The scrape shows the Lease ages as cumulative buckets with `+Inf`, conditions by
/// status, and the per-node families only when they are on.
#[test]
fn the_replica_collector_encodes_the_fleet_and_honours_per_node_off() {
    let summary = FleetSummary {
        lease_ages: [3, 1, 0, 0, 0, 2, 0, 0, 0, 1],
        lease_age_sum: 150.5,
        conditions: vec![(edgebeat_proto::NodeConditionType::Ready, [4, 0, 3])],
        oldest_certificate_not_before: Some(1_700_000_000),
    };
    let gauges = ReplicaGauges {
        tracked_nodes: 4,
        max_nodes: 10,
        backing_off: false,
        unidentified_allowed: false,
        per_node_metrics: false,
        certificate_lifetime: Some(Duration::from_secs(86_400)),
        fleet: summary,
        sites: vec![("plant-3".into(), false, 5, 4)],
        sites_held: true,
        mqtt_sessions_taken_over: 2,
    };
    let clock = Arc::new(Fixed(Mutex::new(UNIX_EPOCH)));
    let nodes = NodeMetrics::new(clock);
    nodes.clock_skew("edge-01").set(1.0);
    let mut registry = Registry::default();
    register(&mut registry, &Counters::default(), None, move || {
        Some(gauges.clone())
    });
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    for line in [
        "# TYPE edgebeat_gateway_lease_age_seconds histogram",
        "edgebeat_gateway_lease_age_seconds_bucket{le=\"5.0\"} 3\n",
        "edgebeat_gateway_lease_age_seconds_bucket{le=\"10.0\"} 4\n",
        "edgebeat_gateway_lease_age_seconds_bucket{le=\"40.0\"} 4\n",
        "edgebeat_gateway_lease_age_seconds_bucket{le=\"60.0\"} 6\n",
        "edgebeat_gateway_lease_age_seconds_bucket{le=\"+Inf\"} 7\n",
        "edgebeat_gateway_lease_age_seconds_count 7\n",
        "edgebeat_gateway_lease_age_seconds_sum 150.5\n",
        "edgebeat_gateway_node_conditions{condition=\"Ready\",status=\"True\"} 4\n",
        "edgebeat_gateway_node_conditions{condition=\"Ready\",status=\"Unknown\"} 3\n",
        "edgebeat_gateway_per_node_metrics 0\n",
        "edgebeat_gateway_certificate_lifetime_seconds 86400",
        "edgebeat_gateway_node_certificate_oldest_not_before_timestamp_seconds 1700000000\n",
        "edgebeat_gateway_site_reachable{site=\"plant-3\"} 0\n",
        "edgebeat_gateway_site_nodes{site=\"plant-3\",state=\"renewing\"} 1\n",
        "edgebeat_gateway_site_nodes{site=\"plant-3\",state=\"silent\"} 4\n",
        "edgebeat_gateway_sites_held 1\n",
        "# TYPE edgebeat_gateway_mqtt_sessions_taken_over counter\n",
        "edgebeat_gateway_mqtt_sessions_taken_over_total 2\n",
    ] {
        assert!(out.contains(line), "{line} missing from\n{out}");
    }
    assert!(
        !out.contains("# TYPE edgebeat_gateway_node_clock_skew"),
        "{out}"
    );
}
