//! End-to-end: agent → transport → gateway → stand-in apiserver, over real sockets.
//!
//! Each scenario is an `async fn` taking the transport; the `scenarios!` macro instantiates
//! it once per transport so both run the same assertions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use edgebeat_agent::run::ATTEMPTS_PER_TICK;
use edgebeat_proto as pb;
use edgebeat_tests::harness::{Cluster, Transport, fixture, fixture_copy, http_get};
use edgebeat_tests::messages;
use edgebeat_tests::requests::{LEASES, is_lease_get, is_lease_put, is_status_patch};
use edgebeat_tests::standin::{FaultRule, RecordedRequest};
use http::Method;
use jiff::Timestamp;

const DEADLINE: Duration = Duration::from_secs(20);
fn renew_time(r: &RecordedRequest) -> Timestamp {
    edgebeat_tests::requests::renew_time(r).unwrap()
}

fn condition<'a>(
    node: &'a k8s_openapi::api::core::v1::Node,
    type_: &str,
) -> &'a k8s_openapi::api::core::v1::NodeCondition {
    node.status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap()
}

async fn registers_with_labels_facts_and_conditions(transport: Transport) {
    let cluster = Cluster::start(transport).await.unwrap();
    let mut config = cluster.agent_config("rpi4-edge-01", &fixture("rpi4-cgroup1"));
    config.node_labels.insert("site".into(), "plant-3".into());
    config
        .register_with_taints
        .push(edgebeat_agent::config::Taint {
            key: "example.com/edge".into(),
            value: "true".into(),
            effect: edgebeat_agent::config::TaintEffect::NoSchedule,
        });
    let agent = cluster.start_agent(config).unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "node registered and leased", |v| {
            v.node("rpi4-edge-01").is_some() && v.lease("kube-node-lease", "rpi4-edge-01").is_some()
        })
        .await
        .unwrap();
    let node = cluster.standin.node("rpi4-edge-01").unwrap();
    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], "rpi4-edge-01");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["kubernetes.io/arch"], edgebeat_hw::host_go_arch());
    assert_eq!(
        labels["beta.kubernetes.io/arch"],
        edgebeat_hw::host_go_arch()
    );
    assert_eq!(labels["site"], "plant-3");
    assert_eq!(
        labels["edgebeat.io/container-runtime"], "none",
        "always set: workloads keep away with node affinity"
    );
    let taints = node.spec.as_ref().unwrap().taints.clone().unwrap();
    assert_eq!(taints.len(), 1);
    assert_eq!(taints[0].key, "example.com/edge");

    let status = node.status.as_ref().unwrap();
    let info = status.node_info.as_ref().unwrap();
    assert_eq!(info.boot_id, "5b3f0e2a-9c41-4d7e-8f26-1a7c3e9d0b54");
    assert_eq!(info.machine_id, "9e4c2b7a51d04f3e8a6b0c1d2e3f4a5b");
    assert_eq!(info.kernel_version, "5.15.84-v8+");
    assert_eq!(info.os_image, "Debian GNU/Linux 11 (bullseye)");
    assert_eq!(info.operating_system, "linux");
    let capacity = status.capacity.as_ref().unwrap();
    assert_eq!(capacity["cpu"].0, "4");
    assert_eq!(capacity["memory"].0, "3885540Ki"); // 3978792960 bytes
    assert_eq!(capacity["pods"].0, "0", "no runtime, no pods (maxPods 0)");
    let allocatable = status.allocatable.as_ref().unwrap();
    assert_eq!(allocatable["pods"].0, "0");
    assert_eq!(
        allocatable["memory"].0, "3783140Ki",
        "capacity − 100Mi hard eviction"
    );
    let types: Vec<_> = status
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.type_.as_str())
        .collect();
    // The health conditions the fixture has signals for (the clock's is off in tests),
    // then kubelet's: Ready last.
    assert_eq!(
        types,
        [
            "SystemMemoryContentionPressure",
            "SystemDiskContentionPressure",
            "ReadonlyFilesystem",
            "ThermalPressure",
            "UnderVoltage",
            "MemoryPressure",
            "DiskPressure",
            "PIDPressure",
            "Ready"
        ],
        "Ready last"
    );
    let ready = condition(&node, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("True", Some("KubeletReady"))
    );
    assert_eq!(
        condition(&node, "MemoryPressure").reason.as_deref(),
        Some("KubeletHasSufficientMemory")
    );
    let addresses: Vec<_> = status
        .addresses
        .as_ref()
        .unwrap()
        .iter()
        .map(|a| (a.type_.as_str(), a.address.as_str()))
        .collect();
    assert_eq!(
        addresses,
        [("InternalIP", "192.168.1.42"), ("Hostname", "rpi4-edge-01")]
    );

    let lease = cluster
        .standin
        .lease("kube-node-lease", "rpi4-edge-01")
        .unwrap();
    let spec = lease.spec.as_ref().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("rpi4-edge-01"));
    assert_eq!(spec.lease_duration_seconds, Some(1));
    let owner = &lease.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", "rpi4-edge-01")
    );
    assert_eq!(Some(&owner.uid), node.metadata.uid.as_ref());

    let posts = cluster
        .standin
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::POST && r.path == "/api/v1/nodes")
        .count();
    assert_eq!(posts, 1, "one registration POST");
    // kubelet's start events: on this cgroup v1 board kubelet v1.36's CgroupV1 Warning,
    // then each pressure condition, new at registration; a new Ready records none.
    cluster
        .standin
        .wait_until(DEADLINE, "the start events", |v| v.events().len() >= 4)
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let reasons = cluster.standin.event_reasons();
    assert_eq!(
        reasons,
        [
            "CgroupV1",
            "NodeHasSufficientMemory",
            "NodeHasNoDiskPressure",
            "NodeHasSufficientPID"
        ]
    );
    let events = cluster.standin.events();
    let cgroup_v1 = &events[0];
    assert_eq!(cgroup_v1.type_.as_deref(), Some("Warning"));
    assert!(
        cgroup_v1
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("cgroup v1 detected. cgroup v1 support is deprecated")),
        "{cgroup_v1:?}"
    );
}

async fn lease_renews_at_cadence_without_gets(transport: Transport) {
    let cluster = Cluster::start(transport).await.unwrap();
    let agent = cluster
        .start_agent(cluster.agent_config("jetson-07", &fixture("jetson-cgroup2")))
        .unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "8 lease renewals", |v| {
            v.requests()
                .iter()
                .filter(|r| is_lease_put(r, "jetson-07") && r.status == 200)
                .count()
                >= 8
        })
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let requests = cluster.standin.requests();
    let puts: Vec<_> = requests
        .iter()
        .filter(|r| is_lease_put(r, "jetson-07"))
        .collect();
    let times: Vec<Timestamp> = puts.iter().map(|r| renew_time(r)).collect();
    assert!(
        times.windows(2).all(|w| w[0] < w[1]),
        "renewTime strictly increases: {times:?}"
    );
    for r in &puts {
        assert!(
            std::str::from_utf8(&r.body)
                .unwrap()
                .contains("\"resourceVersion\""),
            "every PUT carries the cached resourceVersion"
        );
    }
    // Renewals are never closer than the renew interval (1 s × 0.25), minus clock granularity.
    let gaps: Vec<_> = times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .collect();
    assert!(
        gaps.iter()
            .all(|g| *g >= jiff::SignedDuration::from_millis(240)),
        "renew cadence: {gaps:?}"
    );
    let gets = requests
        .iter()
        .filter(|r| is_lease_get(r, "jetson-07"))
        .count();
    assert_eq!(
        gets, 1,
        "one GET when the gateway first sees the lease (it does not exist yet), none on the happy path"
    );
    let creates = requests
        .iter()
        .filter(|r| r.method == Method::POST && r.path == LEASES)
        .count();
    assert_eq!(creates, 1);
}

/// Waits (up to [`DEADLINE`]) until the stand-in has `n` status PATCHes of `node`.
async fn status_patches(cluster: &Cluster, node: &str, n: usize) {
    cluster
        .standin
        .wait_until(DEADLINE, &format!("{n} status patches of {node}"), |v| {
            v.requests()
                .iter()
                .filter(|r| is_status_patch(r, node))
                .count()
                >= n
        })
        .await
        .unwrap();
}

async fn steady_node_patches_status_once_then_per_report_period(transport: Transport) {
    let cluster = Cluster::start(transport).await.unwrap();
    let config = cluster.agent_config("nuc-lab-03", &fixture("nuc-hybrid"));
    let report_period = config.node_status_report_frequency;
    let agent = cluster.start_agent(config).unwrap();
    status_patches(&cluster, "nuc-lab-03", 2).await;
    agent.stop().await.unwrap();
    let requests = cluster.standin.requests();
    let patches: Vec<_> = requests
        .iter()
        .filter(|r| is_status_patch(r, "nuc-lab-03"))
        .collect();
    assert_eq!(
        patches[0].content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    // Status is computed every 100 ms; with nothing changing, the second PATCH waits for the
    // report period. Heartbeat times are gateway-stamped, whole seconds.
    let heartbeat = |r: &RecordedRequest| -> Timestamp {
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        v["status"]["conditions"][3]["lastHeartbeatTime"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    // After the first report (a change), kubelet v1.34+ waits the report period ± half of
    // it, once, at random (`calculateDelay`).
    let gap = heartbeat(patches[1]).duration_since(heartbeat(patches[0]));
    assert!(
        gap >= jiff::SignedDuration::try_from(report_period / 2).unwrap()
            - jiff::SignedDuration::from_secs(1),
        "second PATCH only after half the report period at least, got {gap:?}"
    );
    let v: serde_json::Value = serde_json::from_slice(&patches[0].body).unwrap();
    let order = v["status"]["$setElementOrder/conditions"]
        .as_array()
        .unwrap();
    assert_eq!(order.last().unwrap()["type"], "Ready", "Ready last");
    // The periodic report of an unchanged node is "unchanged": its PATCH refreshes only
    // the heartbeat times (what kubelet's two-way merge patch of an unchanged node holds).
    let periodic: serde_json::Value = serde_json::from_slice(&patches[1].body).unwrap();
    assert!(periodic["status"].get("capacity").is_none(), "{periodic}");
    for c in periodic["status"]["conditions"].as_array().unwrap() {
        let keys: Vec<_> = c.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["lastHeartbeatTime", "type"], "{periodic}");
    }
    let node = cluster.standin.node("nuc-lab-03").unwrap();
    assert_eq!(
        condition(&node, "Ready").status,
        "True",
        "merged, not replaced"
    );
    assert_eq!(
        condition(&node, "Ready").reason.as_deref(),
        Some("KubeletReady")
    );
}

/// `nodeStatusReportFrequency` equal to `nodeStatusUpdateFrequency` (a KubeletConfiguration
/// that sets only the update frequency gets that: kubelet's backward-compatible default):
/// kubelet then reports at every computation, because its report clock starts when a report
/// is sent (`lastStatusReportTime`, `pkg/kubelet/kubelet_node_status.go`) and its sync loop
/// ticks a jittered period later. An unchanged report that waits its answer's silence still
/// counts from when it was sent, so the agent reports every period too, not every second one
/// (seen from outside: 20.4 s between PATCHes with both at 10 s).
async fn a_report_frequency_equal_to_the_update_frequency_reports_every_period(
    transport: Transport,
) {
    let cluster = Cluster::start(transport).await.unwrap();
    let mut config = cluster.agent_config("nuc-lab-04", &fixture("nuc-hybrid"));
    let period = Duration::from_secs(2);
    config.node_status_update_frequency = period;
    config.node_status_report_frequency = period;
    let agent = cluster.start_agent(config).unwrap();
    status_patches(&cluster, "nuc-lab-04", 5).await;
    agent.stop().await.unwrap();
    // Heartbeat times are gateway-stamped whole seconds: a period of 2 s shows as 2 or 3 s
    // between reports (the jitter, the rounding), a report every second period as 4 or 5.
    // The first gap follows the registration's report, a change: the period ± half of it
    // (1 to 3 s, so 1 to 4 shown), kubelet's one-time delay.
    let heartbeats: Vec<Timestamp> = cluster
        .standin
        .requests()
        .iter()
        .filter(|r| is_status_patch(r, "nuc-lab-04"))
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            v["status"]["conditions"][0]["lastHeartbeatTime"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    let gaps: Vec<i64> = heartbeats
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs())
        .collect();
    assert!(
        (1..=4).contains(&gaps[0]) && gaps[1..].iter().all(|g| (1..=3).contains(g)),
        "seconds between status reports, one every {period:?} expected: {gaps:?}"
    );
}

/// kubelet v1.36 warns at every start on a cgroup v1 host only (`cgroupVersionCheck`): a
/// board on the unified hierarchy records the pressure conditions' start events alone.
async fn a_cgroup_v2_board_starts_without_the_cgroup_v1_warning(transport: Transport) {
    let cluster = Cluster::start(transport).await.unwrap();
    let agent = cluster
        .start_agent(cluster.agent_config("jetson-07", &fixture("jetson-cgroup2")))
        .unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "the start events", |v| v.events().len() >= 3)
        .await
        .unwrap();
    agent.stop().await.unwrap();
    assert_eq!(
        cluster.standin.event_reasons(),
        [
            "NodeHasSufficientMemory",
            "NodeHasNoDiskPressure",
            "NodeHasSufficientPID"
        ]
    );
}

async fn conflict_leads_to_one_get_and_recovery(transport: Transport) {
    let cluster = Cluster::start(transport).await.unwrap();
    let agent = cluster
        .start_agent(cluster.agent_config("rpi4-edge-01", &fixture("rpi4-cgroup1")))
        .unwrap();
    cluster
        .wait_for_renewals("rpi4-edge-01", 2, DEADLINE)
        .await
        .unwrap();
    let before = cluster.standin.requests().len();
    // Another writer moves the Lease on: the gateway's Lease watch usually carries its
    // resourceVersion before the next renewal; if the renewal wins the race, one 409 and
    // one GET, never more.
    assert!(
        cluster
            .standin
            .bump_lease("kube-node-lease", "rpi4-edge-01"),
        "another writer touched the lease"
    );
    cluster
        .wait_for_renewals("rpi4-edge-01", 3, DEADLINE)
        .await
        .unwrap();
    // A conflict the watch cannot prevent (the apiserver refuses the resourceVersion):
    // kubelet's answer, exactly one GET, then a PUT that succeeds.
    let injected = cluster.standin.requests().len();
    cluster.standin.inject(FaultRule::status(
        Some(Method::PUT),
        "/leases/rpi4-edge-01",
        409,
        1,
    ));
    cluster
        .wait_for_renewals("rpi4-edge-01", 2, DEADLINE)
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let requests = cluster.standin.requests();
    let count = |from: usize, to: usize| {
        let window = &requests[from..to];
        (
            window
                .iter()
                .filter(|r| is_lease_put(r, "rpi4-edge-01") && r.status == 409)
                .count(),
            window
                .iter()
                .filter(|r| is_lease_get(r, "rpi4-edge-01"))
                .count(),
        )
    };
    let (conflicts, gets) = count(before, injected);
    assert!(
        conflicts <= 1 && gets == conflicts,
        "another writer costs at most one 409 and one GET: {conflicts} 409s, {gets} GETs"
    );
    let (conflicts, gets) = count(injected, requests.len());
    assert_eq!(conflicts, 1, "the injected 409");
    assert_eq!(gets, 1, "exactly one GET after the 409");
}

async fn reboot_yields_rebooted_event_and_new_boot_id(transport: Transport) {
    let cluster = Cluster::start(transport).await.unwrap();
    let host = fixture_copy("rpi4-cgroup1").unwrap();
    let config = cluster.agent_config("rpi4-edge-01", host.path());
    let agent = cluster.start_agent(config.clone()).unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "registered", |v| {
            v.lease("kube-node-lease", "rpi4-edge-01").is_some()
        })
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let new_boot = "0c5e7d1a-2b3c-4d5e-8f90-a1b2c3d4e5f6";
    std::fs::write(
        host.path().join("proc/sys/kernel/random/boot_id"),
        format!("{new_boot}\n"),
    )
    .unwrap();
    let agent = cluster.start_agent(config).unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "new boot ID reported, Rebooted recorded", |v| {
            v.node("rpi4-edge-01")
                .and_then(|n| {
                    n.status
                        .as_ref()?
                        .node_info
                        .as_ref()
                        .map(|i| i.boot_id == new_boot)
                })
                .unwrap_or(false)
                && v.events()
                    .iter()
                    .any(|e| e.reason.as_deref() == Some("Rebooted"))
        })
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let rebooted: Vec<_> = cluster
        .standin
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Rebooted"))
        .collect();
    assert_eq!(rebooted.len(), 1);
    assert_eq!(rebooted[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        rebooted[0].message.as_deref(),
        Some(format!("Node rpi4-edge-01 has been rebooted, boot id: {new_boot}").as_str())
    );
    assert_eq!(rebooted[0].involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(rebooted[0].metadata.namespace.as_deref(), Some("default"));
}

async fn transitions_keep_last_transition_time_when_unchanged(transport: Transport) {
    let cluster = Cluster::start(transport).await.unwrap();
    let host = fixture_copy("rpi4-cgroup1").unwrap();
    let agent = cluster
        .start_agent(cluster.agent_config("rpi4-edge-01", host.path()))
        .unwrap();
    let patches = |v: &edgebeat_tests::standin::StandInView<'_>| {
        v.requests()
            .iter()
            .filter(|r| is_status_patch(r, "rpi4-edge-01"))
            .count()
    };
    cluster
        .standin
        .wait_until(DEADLINE, "first status patch", |v| patches(v) >= 1)
        .await
        .unwrap();
    let first = cluster.standin.node("rpi4-edge-01").unwrap();
    let ready_since = condition(&first, "Ready").last_transition_time.clone();
    assert_eq!(condition(&first, "MemoryPressure").status, "False");
    // Memory pressure: the root cgroup's usage now leaves less than 100Mi available.
    let usage = 3_978_792_960u64 - 50 * 1024 * 1024 + 991_285_248; // + total_inactive_file
    let cgroup = host.path().join("sys/fs/cgroup/memory");
    let stat = std::fs::read_to_string(cgroup.join("memory.stat")).unwrap();
    assert!(
        stat.contains("total_inactive_file 991285248"),
        "fixture changed: {stat}"
    );
    std::fs::write(cgroup.join("memory.usage_in_bytes"), format!("{usage}\n")).unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "MemoryPressure=True", |v| {
            v.node("rpi4-edge-01")
                .is_some_and(|n| condition(&n, "MemoryPressure").status == "True")
        })
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let node = cluster.standin.node("rpi4-edge-01").unwrap();
    let pressure = condition(&node, "MemoryPressure");
    assert_eq!(
        pressure.reason.as_deref(),
        Some("KubeletHasInsufficientMemory")
    );
    assert_eq!(
        condition(&node, "Ready").last_transition_time,
        ready_since,
        "Ready unchanged keeps lastTransitionTime"
    );
    assert!(pressure.last_transition_time.as_ref().unwrap().0 >= ready_since.unwrap().0);
    cluster
        .standin
        .wait_until(DEADLINE, "the transition's event", |v| {
            v.events()
                .iter()
                .any(|e| e.reason.as_deref() == Some("NodeHasInsufficientMemory"))
        })
        .await
        .unwrap();
    let reasons = cluster.standin.event_reasons();
    assert_eq!(
        reasons,
        [
            "CgroupV1",
            "NodeHasSufficientMemory",
            "NodeHasNoDiskPressure",
            "NodeHasSufficientPID",
            "NodeHasInsufficientMemory"
        ],
        "kubelet's start events, then the transition's; none for unchanged conditions"
    );
}

async fn gateway_restart_costs_no_lease_get(transport: Transport) {
    let mut cluster = Cluster::start(transport).await.unwrap();
    let agent = cluster
        .start_agent(cluster.agent_config("jetson-07", &fixture("jetson-cgroup2")))
        .unwrap();
    cluster
        .wait_for_renewals("jetson-07", 2, DEADLINE)
        .await
        .unwrap();
    cluster
        .restart_gateway(edgebeat_tests::harness::gateway_options())
        .await
        .unwrap();
    let before = cluster.standin.requests().len();
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
        .collect();
    // The echoed lease state replaces the GET. The one exception is a race: the old gateway
    // wrote a renewal but its ack was lost when it stopped, so the agent echoes the
    // resourceVersion before that write; that costs one 409 and one GET, never more.
    let gets = after
        .iter()
        .filter(|r| is_lease_get(r, "jetson-07"))
        .count();
    let conflicts = after
        .iter()
        .filter(|r| is_lease_put(r, "jetson-07") && r.status == 409)
        .count();
    let trace: Vec<_> = after
        .iter()
        .map(|r| (r.method.as_str(), r.path.as_str(), r.status))
        .collect();
    assert!(
        gets <= 1 && gets == conflicts,
        "lease GETs only after a lost ack's 409: {trace:?}"
    );
    let node_gets = after
        .iter()
        .filter(|r| r.method == Method::GET && r.path == "/api/v1/nodes/jetson-07")
        .count();
    // The new replica's Node watch lists the node: nothing to read per node. A gRPC agent
    // registers again on its new connection (kubelet's POST, 409, GET); an MQTT agent's
    // session outlives the gateway and it does not.
    let expected = match transport {
        Transport::Grpc => 1,
        Transport::Mqtt => 0,
    };
    assert_eq!(
        node_gets, expected,
        "Node GETs after a gateway restart: only registration's"
    );
    assert_eq!(
        cluster
            .standin
            .events()
            .iter()
            .filter(|e| e.reason.as_deref() == Some("Rebooted"))
            .count(),
        0,
        "same boot: no Rebooted"
    );
}

async fn apiserver_errors_are_retried_with_fresh_renewals(transport: Transport) {
    let cluster = Cluster::start(transport).await.unwrap();
    let agent = cluster
        .start_agent(cluster.agent_config("rpi4-edge-01", &fixture("rpi4-cgroup1")))
        .unwrap();
    cluster
        .wait_for_renewals("rpi4-edge-01", 1, DEADLINE)
        .await
        .unwrap();
    cluster.standin.inject(FaultRule::status(
        Some(Method::PUT),
        "/leases/rpi4-edge-01",
        503,
        3,
    ));
    cluster
        .wait_for_renewals("rpi4-edge-01", 2, DEADLINE)
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let requests = cluster.standin.requests();
    let failed: Vec<_> = requests
        .iter()
        .filter(|r| is_lease_put(r, "rpi4-edge-01") && r.status == 503)
        .collect();
    assert_eq!(failed.len(), 3, "each injected 503 hit one PUT");
    let times: Vec<Timestamp> = requests
        .iter()
        .filter(|r| is_lease_put(r, "rpi4-edge-01"))
        .map(renew_time)
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] < w[1]),
        "every attempt, failed or not, carries a newer renewTime"
    );
    // Each 503 is one failed renewal, and so is every retry the gateway answered at once
    // while it backed off from the apiserver (without sending it: the 503s above are all
    // that reached the apiserver).
    assert!(cluster.gateway().counters.lease_failures.get() >= 3);
}

async fn node_set_unknown_during_an_outage_is_ready_again_within_seconds(transport: Transport) {
    // Default options: the Node watch, not a re-read after `knowledge_ttl` (40 s, longer
    // than DEADLINE), brings the controller's Unknown to the gateway.
    let cluster = Cluster::start(transport).await.unwrap();
    let mut config = cluster.agent_config("rpi4-edge-01", &fixture("rpi4-cgroup1"));
    config.node_status_report_frequency = Duration::from_secs(3600);
    let agent = cluster.start_agent(config).unwrap();
    // Both heartbeats once (the Lease's creation reads the Node for its ownerReference: a
    // GET that must come before the outage is marked).
    cluster
        .standin
        .wait_until(DEADLINE, "first status and Lease", |v| {
            v.requests()
                .iter()
                .any(|r| is_status_patch(r, "rpi4-edge-01"))
                && v.lease("kube-node-lease", "rpi4-edge-01").is_some()
        })
        .await
        .unwrap();
    // An apiserver outage: lease writes fail (the gateway backs off between them, so 5
    // take seconds)...
    cluster.standin.inject(FaultRule::status(
        Some(Method::PUT),
        "/leases/rpi4-edge-01",
        503,
        5,
    ));
    // ...and, as the node lifecycle controller does after its grace period, every condition
    // becomes Unknown with reason NodeStatusUnknown, lastHeartbeatTime untouched.
    let unknown_at = jiff::Timestamp::now();
    let unknown_at = jiff::Timestamp::from_second(unknown_at.as_second()).unwrap();
    let outage = cluster.standin.requests().len();
    assert!(cluster.standin.update_node("rpi4-edge-01", |node| {
        for c in node.status.as_mut().unwrap().conditions.as_mut().unwrap() {
            c.status = "Unknown".into();
            c.reason = Some("NodeStatusUnknown".into());
            c.message = Some("Kubelet stopped posting node status.".into());
            c.last_transition_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                unknown_at,
            ));
        }
    }));
    cluster
        .standin
        .wait_until(DEADLINE, "Ready=True again", |v| {
            v.node("rpi4-edge-01")
                .is_some_and(|n| condition(&n, "Ready").status == "True")
        })
        .await
        .unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "NodeReady event", |v| {
            v.events()
                .iter()
                .any(|e| e.reason.as_deref() == Some("NodeReady"))
        })
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let node = cluster.standin.node("rpi4-edge-01").unwrap();
    for type_ in ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"] {
        let c = condition(&node, type_);
        assert_ne!(c.status, "Unknown", "{type_}");
        assert!(
            c.last_transition_time.as_ref().unwrap().0 >= unknown_at,
            "{type_}: the transition follows the controller's Unknown"
        );
    }
    let ready_events = cluster
        .standin
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("NodeReady"))
        .count();
    assert_eq!(ready_events, 1, "NodeReady recorded for Unknown → True");
    let patches = cluster
        .standin
        .requests()
        .iter()
        .filter(|r| is_status_patch(r, "rpi4-edge-01"))
        .count();
    assert_eq!(
        patches, 2,
        "the start-up report and the one the gateway asked for, not one per period"
    );
    let node_gets = cluster.standin.requests()[outage..]
        .iter()
        .filter(|r| r.method == Method::GET && r.path == "/api/v1/nodes/rpi4-edge-01")
        .count();
    assert_eq!(
        node_gets,
        0,
        "the watch, not a read, brought the Unknown: {:?}",
        cluster.standin.requests()[outage..]
            .iter()
            .map(|r| format!("{} {} {}", r.method, r.path, r.status))
            .collect::<Vec<_>>()
    );
}

/// `kubectl delete node` decommissions the machine: the gateway tells the agent, which
/// stops sending, says so (`/readyz` 503, `edgebeat_agent_node_not_found 1`) and does not
/// create the Node again; a restarted agent (a new process) registers it again, as kubelet
/// (`registrationCompleted` is per process).
async fn a_deleted_node_is_registered_again_only_by_a_restart(transport: Transport) {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, DeleteParams};

    let cluster = Cluster::start(transport).await.unwrap();
    let mut config = cluster.agent_config("rpi4-edge-01", &fixture("rpi4-cgroup1"));
    config.healthz_bind_address = Some("127.0.0.1:0".parse().unwrap());
    let agent = cluster.start_agent(config.clone()).unwrap();
    cluster
        .wait_for_renewals("rpi4-edge-01", 2, DEADLINE)
        .await
        .unwrap();
    let observe = agent.agent.observe_addr().unwrap();
    assert_eq!(http_get(observe, "/readyz").await.unwrap().0, 200);
    // What `kubectl delete node` does, and the garbage collector after it (the Lease is
    // owned by the Node; the stand-in has no garbage collector).
    let client = cluster.standin.kube_client().unwrap();
    let deleted_at = cluster.standin.requests().len();
    Api::<Node>::all(client.clone())
        .delete("rpi4-edge-01", &DeleteParams::default())
        .await
        .unwrap();
    Api::<Lease>::namespaced(client, "kube-node-lease")
        .delete("rpi4-edge-01", &DeleteParams::default())
        .await
        .unwrap();
    let unready = edgebeat_tests::wait::eventually("the agent unready", DEADLINE, || async {
        match http_get(observe, "/readyz").await.unwrap() {
            (503, body) => Ok((503, body)),
            still => Err(still),
        }
    })
    .await;
    assert!(unready.1.contains("the Node was deleted"), "{}", unready.1);
    let metrics = http_get(observe, "/metrics").await.unwrap().1;
    assert!(
        metrics.contains("\nedgebeat_agent_node_not_found 1\n"),
        "{metrics}"
    );
    // Plain gRPC and MQTT do not authenticate the gateway's answers: the agent took the
    // Node as deleted at the third answer in a row that said so, never at one.
    assert_eq!(
        cluster.gateway().counters.nodes_not_found.get(),
        u64::from(edgebeat_transports::uplink::NODE_NOT_FOUND_CONFIRMATIONS)
    );
    // Nothing created the Node or its Lease again.
    let after: Vec<_> = cluster.standin.requests()[deleted_at..].to_vec();
    assert!(
        !after.iter().any(|r| r.method == Method::POST),
        "nothing created after the delete: {:?}",
        after
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect::<Vec<_>>()
    );
    assert!(
        cluster
            .standin
            .lease("kube-node-lease", "rpi4-edge-01")
            .is_none()
    );
    assert!(cluster.standin.node("rpi4-edge-01").is_none());
    agent.stop().await.unwrap();

    // A restart registers the Node again (and its Lease).
    config.healthz_bind_address = None;
    let agent = cluster.start_agent(config).unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "the Node registered again", |v| {
            v.node("rpi4-edge-01").is_some()
        })
        .await
        .unwrap();
    cluster
        .wait_for_renewals("rpi4-edge-01", 1, DEADLINE)
        .await
        .unwrap();
    agent.stop().await.unwrap();
}

/// A gRPC agent registers on every new stream; once its process has registered, that
/// Register says so (`registration_completed`) and never creates a deleted Node again: the
/// gateway answers `node_not_found` and the uplink's registration ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_reconnect_never_creates_a_deleted_node() {
    use edgebeat_transports::grpc::{GrpcUplinkOptions, run_uplink};
    use edgebeat_transports::uplink::{NodeRegistration, RegisterFn, channel};
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, DeleteParams};

    let mut cluster = Cluster::start(Transport::Grpc).await.unwrap();
    let (uplink, driver) = channel(4);
    let registration = uplink.registration();
    let seq = std::sync::atomic::AtomicU64::new(1);
    let register: RegisterFn = std::sync::Arc::new(move || {
        let mut message = messages::register(
            "edge-del",
            seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        );
        if let Some(pb::agent_message::Kind::Register(r)) = message.kind.as_mut() {
            r.registration_completed = *registration.borrow() != NodeRegistration::Pending;
        }
        message
    });
    let cancel = tokio_util::sync::CancellationToken::new();
    let cluster_url = cluster.grpc_url.clone();
    let stop = cancel.clone();
    tokio::spawn(async move {
        let mut driver = driver;
        run_uplink(
            GrpcUplinkOptions::new(cluster_url),
            register,
            &mut driver,
            stop,
        )
        .await
    });
    let mut state = uplink.registration();
    tokio::time::timeout(
        DEADLINE,
        state.wait_for(|r| *r == NodeRegistration::Completed),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(cluster.standin.node("edge-del").is_some());
    let client = cluster.standin.kube_client().unwrap();
    Api::<Node>::all(client)
        .delete("edge-del", &DeleteParams::default())
        .await
        .unwrap();
    let deleted_at = cluster.standin.requests().len();
    // A gateway restart breaks the stream; the uplink connects and registers anew.
    cluster
        .restart_gateway(edgebeat_tests::harness::gateway_options())
        .await
        .unwrap();
    tokio::time::timeout(
        DEADLINE,
        state.wait_for(|r| *r == NodeRegistration::NodeNotFound),
    )
    .await
    .unwrap()
    .unwrap();
    cancel.cancel();
    let after = &cluster.standin.requests()[deleted_at..];
    assert!(
        after
            .iter()
            .any(|r| r.method == Method::GET && r.path == "/api/v1/nodes/edge-del"),
        "the new replica read the Node"
    );
    assert!(
        !after.iter().any(|r| r.method == Method::POST),
        "not created"
    );
    assert!(cluster.standin.node("edge-del").is_none());
}

/// kubelet `reconcileHugePageResource`: a hugepage size the host no longer has is removed
/// from the Node's capacity and allocatable when the agent starts again; status reports
/// alone never remove a key.
async fn a_vanished_hugepage_size_is_removed_when_the_agent_starts(transport: Transport) {
    let cluster = Cluster::start(transport).await.unwrap();
    let host = fixture_copy("jetson-cgroup2").unwrap();
    let config = cluster.agent_config("jetson-01", host.path());
    let agent = cluster.start_agent(config.clone()).unwrap();
    cluster
        .wait_for_renewals("jetson-01", 1, DEADLINE)
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let capacity = |node: &k8s_openapi::api::core::v1::Node| {
        let status = node.status.clone().unwrap();
        (status.capacity.unwrap(), status.allocatable.unwrap())
    };
    let (before, _) = capacity(&cluster.standin.node("jetson-01").unwrap());
    assert!(before.contains_key("hugepages-1Gi"), "{before:?}");
    // The board comes back without 1 GiB pages (a kernel without them).
    std::fs::remove_dir_all(
        host.path()
            .join("sys/kernel/mm/hugepages/hugepages-1048576kB"),
    )
    .unwrap();
    let agent = cluster.start_agent(config).unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "hugepages-1Gi removed", |v| {
            v.node("jetson-01").is_some_and(|n| {
                let (c, a) = capacity(&n);
                !c.contains_key("hugepages-1Gi") && !a.contains_key("hugepages-1Gi")
            })
        })
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let (after, _) = capacity(&cluster.standin.node("jetson-01").unwrap());
    assert!(
        after.contains_key("hugepages-2Mi"),
        "other sizes stay: {after:?}"
    );
}

/// A health condition flips on the apiserver with one status report: the Raspberry Pi's
/// `rpi_volt` alarm goes up, `UnderVoltage` turns True with its reason and a Warning event,
/// and the agent's later computations (every 100 ms here) send no further whole status —
/// only the periodic heartbeat refreshes, which keep the condition's lastHeartbeatTime
/// current.
async fn a_health_condition_flips_with_one_status_report(transport: Transport) {
    let cluster = Cluster::start(transport).await.unwrap();
    let host = fixture_copy("rpi4-cgroup1").unwrap();
    let agent = cluster
        .start_agent(cluster.agent_config("rpi4-edge-01", host.path()))
        .unwrap();
    // A whole status carries `status` fields; a periodic refresh only lastHeartbeatTime.
    let whole = |r: &RecordedRequest| {
        is_status_patch(r, "rpi4-edge-01")
            && std::str::from_utf8(&r.body)
                .is_ok_and(|b| b.contains("\"UnderVoltage\"") && b.contains("\"reason\""))
    };
    cluster
        .standin
        .wait_until(DEADLINE, "first status patch", |v| {
            v.requests().iter().any(whole)
        })
        .await
        .unwrap();
    let first = cluster.standin.node("rpi4-edge-01").unwrap();
    let before = condition(&first, "UnderVoltage");
    assert_eq!(
        (before.status.as_str(), before.reason.as_deref()),
        ("False", Some("SufficientVoltage"))
    );
    for type_ in pb::NodeConditionType::HEALTH {
        if type_ != pb::NodeConditionType::ClockUnsynchronized {
            assert_eq!(condition(&first, type_.as_str()).status, "False", "{type_}");
        }
    }
    let flipped_at = cluster.standin.requests().len();
    std::fs::write(
        host.path().join("sys/class/hwmon/hwmon0/in0_lcrit_alarm"),
        "1\n",
    )
    .unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "UnderVoltage=True", |v| {
            v.node("rpi4-edge-01")
                .is_some_and(|n| condition(&n, "UnderVoltage").status == "True")
        })
        .await
        .unwrap();
    // Two periodic reports (2 s each) later, still one whole status since the flip.
    cluster
        .standin
        .wait_until(DEADLINE, "two heartbeat refreshes after the flip", |v| {
            v.requests()[flipped_at..]
                .iter()
                .filter(|r| is_status_patch(r, "rpi4-edge-01") && !whole(r))
                .count()
                >= 2
        })
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let after = &cluster.standin.requests()[flipped_at..];
    // One status report for the flip, and none from the computations after it. The agent
    // waits nodeStatusUpdateFrequency (100 ms here) for an answer and then sends the report
    // again within its tick (kubelet's nodeStatusUpdateRetry), so on a loaded machine the
    // one report can be written more than once; every copy comes before the first
    // heartbeat refresh after it, which only a later tick sends.
    let flip = after.iter().position(&whole).unwrap();
    let refreshed = flip
        + after[flip..]
            .iter()
            .position(|r| is_status_patch(r, "rpi4-edge-01") && !whole(r))
            .unwrap();
    let copies = after[flip..refreshed].iter().filter(|r| whole(r)).count();
    assert!(
        (1..=ATTEMPTS_PER_TICK as usize).contains(&copies),
        "one status report for the flip, {copies} writes of it"
    );
    assert_eq!(
        after[refreshed..].iter().filter(|r| whole(r)).count(),
        0,
        "no whole status report after the flip's"
    );
    let node = cluster.standin.node("rpi4-edge-01").unwrap();
    let c = condition(&node, "UnderVoltage");
    assert_eq!(c.reason.as_deref(), Some("UnderVoltageDetected"));
    assert_eq!(
        c.message.as_deref(),
        Some(
            "the power supply is under-voltage (rpi_volt in0_lcrit_alarm=1, firmware throttled=0x0: now none; since boot none)"
        )
    );
    assert!(
        c.last_heartbeat_time.as_ref().unwrap().0 > c.last_transition_time.as_ref().unwrap().0,
        "the refreshes reached the health condition"
    );
    cluster
        .standin
        .wait_until(DEADLINE, "the Warning event", |v| {
            v.events().iter().any(|e| {
                e.reason.as_deref() == Some("UnderVoltageDetected")
                    && e.type_.as_deref() == Some("Warning")
            })
        })
        .await
        .unwrap();
}

/// The node's resource usage rides its Lease renewals over either transport into the
/// replica's samples (what `/metrics/resource` serves): the fixture's root `cpuacct.usage`
/// (ns → ms) and working set (bytes, through KiB), stamped within the run.
async fn the_nodes_resource_usage_reaches_its_replica(transport: Transport) {
    let cluster = Cluster::start(transport).await.unwrap();
    let root = fixture("rpi4-cgroup1");
    let expected = edgebeat_hw::read_resource_usage(&edgebeat_hw::HostRoot::new(&root));
    let agent = cluster
        .start_agent(cluster.agent_config("rpi4-edge-01", &root))
        .unwrap();
    let started = jiff::Timestamp::now().as_millisecond();
    let samples = cluster.gateway().resource_samples();
    let sample = edgebeat_tests::wait::eventually("a sample of rpi4-edge-01", DEADLINE, || async {
        samples.get("rpi4-edge-01")
    })
    .await;
    agent.stop().await.unwrap();
    assert_eq!(
        (sample.cpu_usage_ms, sample.memory_working_set_bytes),
        (
            expected.cpu_usage_ms.unwrap(),
            expected.memory_working_set_bytes.unwrap() / 1024 * 1024
        )
    );
    assert!(
        sample.timestamp_ms >= started - 1_000
            && sample.timestamp_ms <= jiff::Timestamp::now().as_millisecond(),
        "sampled during the run: {sample:?} (started {started})"
    );
}

/// A node registered before its replica served resource metrics gets metrics-server's path
/// annotation and the replica's address with the whole status the replica asks for at its
/// first renewal: over MQTT too, whose agent never registers again while it runs.
async fn a_node_registered_before_resource_metrics_gets_its_path(transport: Transport) {
    let mut cluster = Cluster::start(transport).await.unwrap();
    let root = fixture("rpi4-cgroup1");
    let agent = cluster
        .start_agent(cluster.agent_config("rpi4-edge-01", &root))
        .unwrap();
    cluster
        .wait_for_renewals("rpi4-edge-01", 1, DEADLINE)
        .await
        .unwrap();
    let annotation = |node: &k8s_openapi::api::core::v1::Node| {
        node.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("metrics.k8s.io/resource-metrics-path").cloned())
    };
    assert_eq!(
        annotation(&cluster.standin.node("rpi4-edge-01").unwrap()),
        None
    );
    let mut options = edgebeat_tests::harness::gateway_options();
    options.resource_metrics = Some(edgebeat_gateway::resource_metrics::Endpoint {
        address: std::net::Ipv4Addr::LOCALHOST.into(),
        port: 10250,
    });
    cluster.restart_gateway(options).await.unwrap();
    let named = |node: &k8s_openapi::api::core::v1::Node| {
        annotation(node).as_deref() == Some("/nodes/rpi4-edge-01/metrics/resource")
            && node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .is_some_and(|a| {
                    a.iter()
                        .any(|a| a.type_ == "EdgebeatGateway" && a.address == "127.0.0.1")
                })
    };
    cluster
        .standin
        .wait_until(
            DEADLINE,
            "the path annotation and the replica's address",
            |v| v.node("rpi4-edge-01").is_some_and(|n| named(&n)),
        )
        .await
        .unwrap();
    agent.stop().await.unwrap();
}

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        mod grpc {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Transport::Grpc).await;
                }
            )*
        }
        mod mqtt {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Transport::Mqtt).await;
                }
            )*
        }
    };
}

scenarios!(
    registers_with_labels_facts_and_conditions,
    lease_renews_at_cadence_without_gets,
    steady_node_patches_status_once_then_per_report_period,
    a_report_frequency_equal_to_the_update_frequency_reports_every_period,
    a_cgroup_v2_board_starts_without_the_cgroup_v1_warning,
    conflict_leads_to_one_get_and_recovery,
    reboot_yields_rebooted_event_and_new_boot_id,
    transitions_keep_last_transition_time_when_unchanged,
    gateway_restart_costs_no_lease_get,
    apiserver_errors_are_retried_with_fresh_renewals,
    node_set_unknown_during_an_outage_is_ready_again_within_seconds,
    a_deleted_node_is_registered_again_only_by_a_restart,
    a_vanished_hugepage_size_is_removed_when_the_agent_starts,
    a_health_condition_flips_with_one_status_report,
    the_nodes_resource_usage_reaches_its_replica,
    a_node_registered_before_resource_metrics_gets_its_path,
);
