//! kubelet and edgebeat side by side, from the audit log of one run (issue 50, item 3): a
//! real kubelet for this host, and two edgebeat nodes through the deployed gateway, one
//! over gRPC and one over MQTT (`deploy/gateway-enrollment` with `deploy/gateway-mqtt`'s
//! flags, both enrolled with a bootstrap token), against one real control plane. Both sides
//! run kubelet's defaults but `nodeStatusReportFrequency: 1m`, so that the window of steady
//! state holds a periodic status report; `scripts/bench-behaviour.sh` runs it at kubelet's
//! default of 5 minutes (`EDGEBEAT_REPORT_FREQUENCY_SECONDS=300`).
//!
//! What each does, per node and minute of steady state (Lease updates and GETs, Node GETs,
//! status PATCHes, watches); after a 30 s kube-apiserver outage (when each writes again);
//! after a second writer takes its Lease (what each reads and writes); and after SIGKILL
//! (when the node lifecycle controller marks each Ready Unknown, at its default grace).
//! Printed as the table BENCHMARKS.md's "Beside a real kubelet: behaviour" holds; the
//! assertions hold edgebeat to kubelet's figures.
//!
//! Needs root, the control plane, kubelet and containerd, Mosquitto, and the gateway built
//! (`scripts/test.sh` does all).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use edgebeat_tests::broker::{Broker, BrokerTls};
use edgebeat_tests::control_plane::{AuditEvent, ControlPlane, EnrollingGateway, gateway_requests};
use edgebeat_tests::kubelet::Kubelet;
use edgebeat_tests::pki::Ca;
use edgebeat_tests::wait::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

/// The edgebeat nodes: over gRPC, over MQTT.
const GRPC: &str = "side-grpc";
const MQTT: &str = "side-mqtt";
/// `nodeStatusReportFrequency` on both sides: a minute, or
/// `EDGEBEAT_REPORT_FREQUENCY_SECONDS`. The steady-state window is twice that and 15 s:
/// on both sides the first periodic report after a change (the registration) comes the
/// frequency × [0.5, 1.5) later (kubelet's `calculateDelay`, since v1.34), so only two
/// periods make sure one falls in the window.
fn report_frequency() -> Duration {
    let seconds = std::env::var("EDGEBEAT_REPORT_FREQUENCY_SECONDS")
        .ok()
        .map(|s| {
            s.parse::<u64>()
                .expect("EDGEBEAT_REPORT_FREQUENCY_SECONDS: whole seconds, e.g. 300")
        })
        .unwrap_or(60);
    Duration::from_secs(seconds)
}
/// How long kube-apiserver is down.
const OUTAGE: Duration = Duration::from_secs(30);
/// How long after the outage, and after the second writer, calls are read.
const AFTER: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs root, kubelet and containerd, Mosquitto (scripts/test.sh)"]
async fn kubelet_and_edgebeat_side_by_side_in_one_audit_log() {
    let report = report_frequency();
    let control_plane = ControlPlane::start(&[]).unwrap();
    let mut kubelet = tokio::task::block_in_place(|| {
        Kubelet::start(
            &control_plane,
            &format!(
                "evictionHard:\n  memory.available: 100Mi\nimageGCHighThresholdPercent: 100\nnodeStatusReportFrequency: {}s\n",
                report.as_secs()
            ),
        )
    })
    .unwrap();
    let host = kubelet.node_name.clone();
    let broker_ca = Ca::new("broker CA");
    let server = broker_ca.server();
    let broker = Broker::start_tls(BrokerTls {
        require_certificate: false,
        bind_client_ids: false,
        ca_pem: broker_ca.cert_pem.clone(),
        cert_pem: server.cert_pem,
        key_pem: server.key_pem,
    })
    .await
    .unwrap();
    let gateway = EnrollingGateway::start_with_mqtt(&control_plane, &broker, &broker_ca).await;
    let token = gateway.token("side-*", 2);
    let mut grpc = gateway.agent_config(GRPC, &token);
    let mut mqtt = gateway.mqtt_agent_config(MQTT, &token, &broker, &broker_ca);
    // kubelet's defaults (the tests' configuration is faster), the report as kubelet's here.
    for config in [&mut grpc, &mut mqtt] {
        config.node_status_update_frequency = Duration::from_secs(10);
        config.node_status_report_frequency = report;
        config.node_lease_duration_seconds = 40;
    }
    let clock = || std::sync::Arc::new(edgebeat_hw::SystemClock);
    let agents = [
        edgebeat_tests::harness::start_agent(grpc, clock()).unwrap(),
        edgebeat_tests::harness::start_agent(mqtt, clock()).unwrap(),
    ];
    let names = [host.as_str(), GRPC, MQTT];
    let admin = control_plane.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let leases: Api<Lease> = Api::namespaced(admin, "kube-node-lease");
    eventually(
        "all three Ready, Leases renewed",
        Duration::from_secs(120),
        || {
            let (nodes, leases) = (nodes.clone(), leases.clone());
            async move {
                for name in names {
                    if ready(&nodes, name).await.as_deref() != Some("True")
                        || leases.get_opt(name).await.ok().flatten().is_none()
                    {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;

    // Steady state. A measurement window: what happens in it is the figure.
    let steady_from = jiff::Timestamp::now();
    tokio::time::sleep(2 * report + Duration::from_secs(15)).await;
    let steady_to = jiff::Timestamp::now();

    // A 30 s outage of kube-apiserver (a measured window), then 30 s of what each does.
    tokio::task::block_in_place(|| control_plane.stop_component("kube-apiserver")).unwrap();
    tokio::time::sleep(OUTAGE).await;
    tokio::task::block_in_place(|| control_plane.restart_component("kube-apiserver")).unwrap();
    let back = jiff::Timestamp::now();
    tokio::time::sleep(AFTER).await;

    // A second writer takes every Lease (as another holder would), then 30 s of calls.
    let taken = jiff::Timestamp::now();
    for name in names {
        control_plane
            .kubectl(&[
                "-n",
                "kube-node-lease",
                "patch",
                "lease",
                name,
                "--type=merge",
                "-p",
                r#"{"spec":{"holderIdentity":"second-writer"}}"#,
            ])
            .unwrap();
    }
    tokio::time::sleep(AFTER).await;
    let mut holders = BTreeMap::new();
    for name in names {
        let lease = leases.get(name).await.unwrap();
        holders.insert(name, lease.spec.and_then(|s| s.holder_identity));
    }

    // SIGKILL: kubelet's process, the agents' tasks. The node lifecycle controller marks
    // each Ready Unknown once its Lease is older than its grace period (50 s by default).
    let killed = jiff::Timestamp::now();
    tokio::task::block_in_place(|| kubelet.kill_kubelet()).unwrap();
    for agent in agents {
        agent.kill().await;
    }
    eventually("all three Ready Unknown", Duration::from_secs(120), || {
        let nodes = nodes.clone();
        async move {
            for name in names {
                if ready(&nodes, name).await.as_deref() != Some("Unknown") {
                    return false;
                }
            }
            true
        }
    })
    .await;
    let mut unknown_after = BTreeMap::new();
    for name in names {
        let node = nodes.get(name).await.unwrap();
        let since = ready_condition(&node)
            .and_then(|c| c.last_transition_time)
            .map(|t| t.0)
            .unwrap();
        unknown_after.insert(name, since.duration_since(killed).as_secs_f64());
    }

    let audit = control_plane.audit().unwrap();
    drop(gateway);
    let before = kubelet.before().clone();
    let after = tokio::task::block_in_place(|| kubelet.stop()).unwrap();
    let gateway_calls = gateway_requests(&control_plane, steady_from);
    drop(control_plane);

    let node_user = format!("system:node:{host}");
    let calls_of = |name: &str| -> Vec<&AuditEvent> {
        if name == host {
            audit
                .iter()
                .filter(|e| e.user.username == node_user)
                .collect()
        } else {
            gateway_calls.iter().filter(|e| e.name() == name).collect()
        }
    };
    let minutes = steady_to.duration_since(steady_from).as_secs_f64() / 60.0;
    let rows: [(&str, Counts); 7] = [
        ("Lease updates", |e, n| is(e, "update", "leases", n)),
        ("Lease GETs", |e, n| is(e, "get", "leases", n)),
        ("Node GETs", |e, n| is(e, "get", "nodes", n)),
        ("status PATCHes", |e, n| is(e, "patch", "nodes/status", n)),
        ("Node watches opened", |e, _| {
            e.verb == "watch" && e.resource() == "nodes" && e.stage == "ResponseStarted"
        }),
        ("Events", |e, _| e.resource() == "events"),
        ("all calls", |e, _| e.stage == "ResponseComplete"),
    ];
    let mut steady: BTreeMap<(&str, &str), f64> = BTreeMap::new();
    println!(
        "| per node and minute, steady state ({:.2} min) | kubelet | edgebeat, gRPC | edgebeat, MQTT |",
        minutes
    );
    println!("|---|---|---|---|");
    for (row, test) in rows {
        let mut cells = Vec::new();
        for name in names {
            let n = calls_of(name)
                .iter()
                .filter(|e| within(e, steady_from, steady_to) && test(e, name))
                .count() as f64
                / minutes;
            steady.insert((row, name), n);
            cells.push(format!("{n:.1}"));
        }
        println!("| {row} | {} |", cells.join(" | "));
    }
    let gateway_watches = gateway_calls
        .iter()
        .filter(|e| e.verb == "watch" && e.stage == "ResponseStarted")
        .filter(|e| within(e, steady_from, steady_to))
        .count();
    println!(
        "(the gateway's own watches, Nodes and Leases of all its nodes at once: {gateway_watches} opened in the window)"
    );

    let first_write_after = |name: &str, from: jiff::Timestamp| -> Option<f64> {
        calls_of(name)
            .iter()
            .filter(|e| is(e, "update", "leases", name) && e.code() == 200)
            .filter_map(|e| e.at().ok())
            .filter(|at| *at >= from)
            .min()
            .map(|at| at.duration_since(from).as_secs_f64())
    };
    let sequence = |name: &str, from: jiff::Timestamp, to: jiff::Timestamp| -> String {
        calls_of(name)
            .iter()
            .filter(|e| within(e, from, to) && e.resource() == "leases" && e.name() == name)
            .filter(|e| e.stage == "ResponseComplete")
            .map(|e| format!("{} {}", e.verb, e.code()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let cell = |v: Option<f64>| v.map_or_else(|| "never".to_owned(), |s| format!("{s:.1} s"));
    let row = |label: &str, f: &dyn Fn(&str) -> String| {
        let cells: Vec<String> = names.iter().map(|n| f(n)).collect();
        println!("| {label} | {} |", cells.join(" | "));
    };
    println!("| event | kubelet | edgebeat, gRPC | edgebeat, MQTT |");
    println!("|---|---|---|---|");
    let back_to = back + jiff::SignedDuration::try_from(AFTER).unwrap();
    let taken_to = taken + jiff::SignedDuration::try_from(AFTER).unwrap();
    row("apiserver back after 30 s: first Lease update", &|n| {
        cell(first_write_after(n, back))
    });
    row("apiserver back: status PATCHes in the next 30 s", &|n| {
        calls_of(n)
            .iter()
            .filter(|e| within(e, back, back_to) && is(e, "patch", "nodes/status", n))
            .count()
            .to_string()
    });
    row("second writer: Lease calls in the next 30 s", &|n| {
        sequence(n, taken, taken_to)
    });
    row("second writer: holder 30 s later", &|n| {
        holders[n].clone().unwrap_or_default()
    });
    row("SIGKILL: Ready Unknown after", &|n| {
        format!("{:.1} s", unknown_after[n])
    });

    assert_eq!(
        before, after,
        "kubelet and containerd left the machine changed"
    );
    let kubelets = |row: &str| steady[&(row, host.as_str())];
    for edge in [GRPC, MQTT] {
        let ours = |row: &str| steady[&(row, edge)];
        // The same Lease cadence (every 10 s: 6 a minute), within one renewal.
        assert!(
            (ours("Lease updates") - kubelets("Lease updates")).abs() <= 1.0,
            "{edge}: {} Lease updates a minute, kubelet {}",
            ours("Lease updates"),
            kubelets("Lease updates")
        );
        // The periodic report made, and no more status writes than kubelet (one more
        // at most: the phases of the two sides' reports differ).
        let (reports, theirs) = (
            ours("status PATCHes") * minutes,
            kubelets("status PATCHes") * minutes,
        );
        assert!(
            reports >= 0.5 && reports <= theirs + 1.5,
            "{edge}: {reports:.0} status PATCHes in the window, kubelet {theirs:.0}"
        );
        // No more calls per node than kubelet in all, but for one renewal: a window of
        // whole renewal intervals holds one more of a side whose phase falls right.
        assert!(
            ours("all calls") * minutes <= kubelets("all calls") * minutes + 1.5,
            "{edge}: {} calls a minute, kubelet {}",
            ours("all calls"),
            kubelets("all calls")
        );
        // Back within a renewal interval and a backoff after the outage.
        let written = first_write_after(edge, back);
        assert!(
            written.is_some_and(|s| s <= 17.0),
            "{edge}: first Lease update {written:?} s after the apiserver came back"
        );
        // The controller's grace is the same for both: Unknown at about the same time
        // (renewal phases differ by up to 10 s, the controller looks every 5 s).
        let (ours, theirs) = (unknown_after[edge], unknown_after[host.as_str()]);
        assert!(
            (ours - theirs).abs() <= 15.0 && ours >= 30.0,
            "{edge}: Ready Unknown {ours:.1} s after SIGKILL, kubelet's {theirs:.1} s"
        );
        // The second writer's holder stays, as kubelet keeps it (its newLease copies the
        // Lease it found), and it costs one GET at most, as kubelet's 409 costs it one.
        assert_eq!(
            holders[edge].as_deref(),
            Some("second-writer"),
            "{edge}: the Lease's holder 30 s after a second writer took it"
        );
        let gets = sequence(edge, taken, taken_to).matches("get").count();
        assert!(
            gets <= 1,
            "{edge}: Lease calls after the second writer: {}",
            sequence(edge, taken, taken_to)
        );
    }
}

/// Whether an audit event counts in a row of the table, for the node named.
type Counts = fn(&AuditEvent, &str) -> bool;

/// Whether `event` is `verb` on `resource` named `name`, answered.
fn is(event: &AuditEvent, verb: &str, resource: &str, name: &str) -> bool {
    event.stage == "ResponseComplete"
        && event.verb == verb
        && event.resource() == resource
        && event.name() == name
}

/// Whether `event` was answered in `[from, to)`.
fn within(event: &AuditEvent, from: jiff::Timestamp, to: jiff::Timestamp) -> bool {
    event.at().is_ok_and(|at| at >= from && at < to)
}

fn ready_condition(node: &Node) -> Option<k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .cloned()
}

/// The Ready condition's status, if the Node exists and has one.
async fn ready(nodes: &Api<Node>, name: &str) -> Option<String> {
    let node = nodes.get_opt(name).await.ok()??;
    ready_condition(&node).map(|c| c.status)
}
