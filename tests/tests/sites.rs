//! Sites end to end over gRPC, with two gateway replicas on one stand-in apiserver: a site
//! (a zone) whose nodes all go silent at once gets `SiteUnreachable` on each of its nodes
//! and one Event, however many replicas saw it; another site does not; when the site
//! returns, the conditions clear and one Event says so. Nodes dying one by one, and one
//! dead node, are no partition.
//!
//! Over MQTT, a site whose agents publish to their own broker bridged to the cluster's
//! (real Mosquitto bridges with notifications): the bridge going down marks every node of
//! the site at once, with reason `SiteUplinkDown`, before any Lease is late, once for two
//! replicas; and behind a cut veth (root), within the bridge's keepalive.
//!
//! Agents run with a 4 s lease (renewals every second): a node is silent after 2 s without
//! a renewal, and the replicas look every 2 s.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use edgebeat_gateway::apiserver::{kube_client, watch_client};
use edgebeat_gateway::message_path::Gateway;
use edgebeat_gateway::sites::{
    REASON_REACHABLE, REASON_SILENT, REASON_UPLINK_DOWN, SITE_CONDITION, ZONE_LABEL,
};
use edgebeat_tests::broker::{Bridge, Broker};
use edgebeat_tests::harness::{
    AgentHandle, Cluster, Transport, fixture_copy, gateway_options, wait_for,
};
use edgebeat_tests::standin::StandInView;
use http::Method;
use k8s_openapi::api::core::v1::Event;

const DEADLINE: Duration = Duration::from_secs(60);
const LEASE_SECONDS: u32 = 4;
const LEASE_NAMESPACE: &str = "kube-node-lease";

/// `(status, reason)` of `node`'s `SiteUnreachable` condition, as the stand-in holds it.
fn site_condition(v: &StandInView<'_>, node: &str) -> Option<(String, String)> {
    v.node(node)?
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == SITE_CONDITION)
        .map(|c| (c.status, c.reason.unwrap_or_default()))
}

/// None of `nodes` carries a `SiteUnreachable` condition at all.
fn assert_unmarked(cluster: &Cluster, nodes: &[String]) {
    for node in nodes {
        let condition = cluster.standin.node(node).and_then(|n| {
            n.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == SITE_CONDITION)
        });
        assert!(condition.is_none(), "{node}: {condition:?}");
    }
}

fn is(v: &StandInView<'_>, node: &str, status: &str, reason: &str) -> bool {
    site_condition(v, node).is_some_and(|(s, r)| s == status && r == reason)
}

fn events(cluster: &Cluster, reason: &str) -> Vec<Event> {
    cluster
        .standin
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Waits until every one of `nodes` carries `SiteUnreachable` False (`SiteReachable`) and
/// the site's return is recorded as an Event.
async fn returned(cluster: &Cluster, nodes: &[String]) {
    cluster
        .standin
        .wait_until(DEADLINE, "every node of the site reachable again", |v| {
            nodes.iter().all(|n| is(v, n, "False", REASON_REACHABLE))
        })
        .await
        .unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "the return recorded", |v| {
            v.events()
                .iter()
                .any(|e| e.reason.as_deref() == Some(REASON_REACHABLE))
        })
        .await
        .unwrap();
}

/// Waits until two Event POSTs with `reason` reached the apiserver: both replicas tried to
/// record the partition. (Polled: the request log is read outside the stand-in's change
/// notifications.)
async fn both_replicas_posted(cluster: &Cluster, reason: &str) {
    wait_for("both replicas recorded the partition", DEADLINE, || {
        cluster
            .standin
            .requests()
            .iter()
            .filter(|r| {
                r.method == Method::POST
                    && r.path.ends_with("/events")
                    && String::from_utf8_lossy(&r.body).contains(reason)
            })
            .count()
            >= 2
    })
    .await;
}

/// Agents `names` in zone `zone`, renewing a 4 s Lease.
fn start(
    cluster: &Cluster,
    host: &std::path::Path,
    zone: &str,
    names: &[String],
) -> Vec<AgentHandle> {
    names
        .iter()
        .map(|name| {
            let mut config = cluster.agent_config(name, host);
            config.node_lease_duration_seconds = LEASE_SECONDS;
            config.node_labels.insert(ZONE_LABEL.into(), zone.into());
            cluster.start_agent(config).unwrap()
        })
        .collect()
}

async fn stop(agents: Vec<AgentHandle>) {
    futures_util::future::join_all(agents.into_iter().map(AgentHandle::stop)).await;
}

async fn renewing(cluster: &Cluster, names: &[String]) {
    for name in names {
        cluster.wait_for_renewals(name, 2, DEADLINE).await.unwrap();
    }
}

/// Seconds since `node`'s Lease was last renewed, by the test's clock.
fn lease_age(cluster: &Cluster, node: &str) -> f64 {
    let renewed = cluster
        .standin
        .lease(LEASE_NAMESPACE, node)
        .and_then(|l| l.spec?.renew_time)
        .map_or(0, |t| t.0.as_millisecond());
    (jiff::Timestamp::now().as_millisecond() - renewed) as f64 / 1e3
}

/// A second gateway replica on the cluster's stand-in: its own clients, view and site
/// tracker, following the same Nodes and Leases (no ingress: sites are read from Leases).
fn second_replica(cluster: &Cluster) -> tokio::task::JoinHandle<()> {
    let config = kube::Config::new(cluster.standin.url().parse().unwrap());
    let client = kube_client(config.clone(), 1000, &Default::default()).unwrap();
    let gateway = Arc::new(Gateway::new(
        client,
        Arc::new(edgebeat_hw::SystemClock),
        gateway_options(),
    ));
    let watch = gateway.watch(watch_client(config, &Default::default()).unwrap());
    tokio::spawn(async move {
        let _gateway = gateway;
        watch.await;
    })
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:02}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_cut_off_is_marked_on_its_nodes_once_and_cleared_when_it_returns() {
    let cluster = Cluster::start(Transport::Grpc).await.unwrap();
    let replica = second_replica(&cluster);
    let host = fixture_copy("rpi4-cgroup1").unwrap();
    let cut = names("plant-a", 4);
    let other = names("plant-b", 2);
    let a = start(&cluster, host.path(), "plant-a", &cut);
    let b = start(&cluster, host.path(), "plant-b", &other);
    renewing(&cluster, &cut).await;
    renewing(&cluster, &other).await;

    // The site's uplink is cut: every agent of plant-a falls silent at once.
    let cut_at = tokio::time::Instant::now();
    stop(a).await;
    cluster
        .standin
        .wait_until(DEADLINE, "every node of plant-a marked unreachable", |v| {
            cut.iter().all(|n| is(v, n, "True", REASON_SILENT))
        })
        .await
        .unwrap();
    println!("cut to condition: {:.1} s", cut_at.elapsed().as_secs_f64());
    // Both replicas tried to record the partition; the apiserver kept one Event.
    both_replicas_posted(&cluster, REASON_SILENT).await;
    let silent = events(&cluster, REASON_SILENT);
    assert_eq!(silent.len(), 1, "{silent:?}");
    let message = silent[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("plant-a") && message.contains("4 nodes"),
        "{message}"
    );
    assert_eq!(silent[0].type_.as_deref(), Some("Warning"));
    assert_unmarked(&cluster, &other);

    // The link returns: the agents come back, each node's condition clears.
    let a = start(&cluster, host.path(), "plant-a", &cut);
    returned(&cluster, &cut).await;
    let back = events(&cluster, REASON_REACHABLE);
    assert_eq!(back.len(), 1, "{back:#?}");
    let silent: Vec<_> = events(&cluster, REASON_SILENT)
        .into_iter()
        .map(|e| (e.metadata.name, e.message))
        .collect();
    assert_eq!(silent.len(), 1, "{silent:#?}");
    stop(a).await;
    stop(b).await;
    replica.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_dying_one_by_one_are_no_partition() {
    let cluster = Cluster::start(Transport::Grpc).await.unwrap();
    let host = fixture_copy("rpi4-cgroup1").unwrap();
    let site = names("plant-c", 4);
    let agents = start(&cluster, host.path(), "plant-c", &site);
    renewing(&cluster, &site).await;
    // One at a time, each after the previous one has been silent for three renew intervals
    // (longer than the 2 s window in which silences count as together).
    for (agent, name) in agents.into_iter().zip(&site) {
        agent.stop().await.unwrap();
        // Silence grows with time alone: polled (nothing changes in the stand-in).
        wait_for(&format!("{name} silent 3 s"), DEADLINE, || {
            lease_age(&cluster, name) > 3.0
        })
        .await;
    }
    // Long enough for several looks after the last one fell silent.
    let last = site.last().unwrap();
    wait_for("the last node silent 8 s", DEADLINE, || {
        lease_age(&cluster, last) > 8.0
    })
    .await;
    assert!(events(&cluster, REASON_SILENT).is_empty());
    assert_unmarked(&cluster, &site);
}

/// Agents `names` in zone `zone`, publishing to `broker` (a site broker) over MQTT.
fn start_on(
    cluster: &Cluster,
    host: &std::path::Path,
    zone: &str,
    names: &[String],
    broker: &Broker,
) -> Vec<AgentHandle> {
    names
        .iter()
        .map(|name| {
            let mut config = cluster.agent_config(name, host);
            config.node_lease_duration_seconds = LEASE_SECONDS;
            config.node_labels.insert(ZONE_LABEL.into(), zone.into());
            if let Some(edgebeat_agent::config::TransportConfig::Mqtt(mqtt)) = &mut config.transport
            {
                mqtt.port = broker.port();
            }
            cluster.start_agent(config).unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridged_site_whose_uplink_drops_is_marked_at_once_and_cleared_when_it_returns() {
    let mut cluster = Cluster::start(Transport::Mqtt).await.unwrap();
    // Two replicas, each following the bridge's notifications: one partition, one Event.
    cluster.start_replica(gateway_options()).await.unwrap();
    let cluster_broker = cluster.broker.as_ref().unwrap();
    let mut site = Broker::start_site(Bridge {
        remote_host: cluster_broker.host().into(),
        remote_port: cluster_broker.port(),
        site: "plant-m".into(),
        topic_prefix: edgebeat_transports::mqtt::DEFAULT_TOPIC_PREFIX.into(),
        keepalive_secs: 5,
    })
    .await
    .unwrap();
    let host = fixture_copy("rpi4-cgroup1").unwrap();
    let bridged = names("plant-m", 3);
    let direct = names("plant-n", 2);
    let m = start_on(&cluster, host.path(), "plant-m", &bridged, &site);
    let n = start(&cluster, host.path(), "plant-n", &direct);
    renewing(&cluster, &bridged).await;
    renewing(&cluster, &direct).await;

    // The site broker dies: the cluster's broker publishes the bridge's Last Will `0`.
    let cut_at = tokio::time::Instant::now();
    site.stop().await;
    cluster
        .standin
        .wait_until(DEADLINE, "every node of plant-m marked uplink down", |v| {
            bridged.iter().all(|n| is(v, n, "True", REASON_UPLINK_DOWN))
        })
        .await
        .unwrap();
    let marked_after = cut_at.elapsed();
    println!(
        "bridge down to condition: {:.2} s",
        marked_after.as_secs_f64()
    );
    // Before the Leases could tell: a 4 s lease is silent only after 2 s without renewal
    // and the rule would need a look after that. Both replicas posted the Event; the
    // apiserver kept one.
    both_replicas_posted(&cluster, REASON_UPLINK_DOWN).await;
    let down = events(&cluster, REASON_UPLINK_DOWN);
    assert_eq!(down.len(), 1, "{down:#?}");
    let message = down[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("plant-m") && message.contains("3 nodes"),
        "{message}"
    );
    assert!(
        events(&cluster, REASON_SILENT).is_empty(),
        "one partition, one reason"
    );
    assert_unmarked(&cluster, &direct);

    // The uplink returns: the bridge says `1`, the agents renew through it again.
    site.restart().await.unwrap();
    returned(&cluster, &bridged).await;
    assert_eq!(events(&cluster, REASON_UPLINK_DOWN).len(), 1);
    assert!(events(&cluster, REASON_SILENT).is_empty());
    assert_unmarked(&cluster, &direct);
    stop(m).await;
    stop(n).await;
}

/// Cuts of the veth test (`EDGEBEAT_SITE_CUTS`, default 1, to keep the suite short):
/// BENCHMARKS.md's figure is of 5.
fn cuts() -> usize {
    std::env::var("EDGEBEAT_SITE_CUTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root with ip netns (a network namespace and a veth pair)"]
async fn a_site_behind_a_cut_veth_is_marked_within_the_bridge_keepalive() {
    use edgebeat_tests::link::{AGENT_IP, GATEWAY_IP, Link, NAMESPACE, agent_binary, forward};
    Link::require().expect("scripts/test.sh runs this as root");
    let link = Link::create().unwrap();
    let cluster = Cluster::start(Transport::Mqtt).await.unwrap();
    let cluster_broker = cluster.broker.as_ref().unwrap();
    // The site reaches the cluster's broker across the link.
    let relay = forward(std::net::SocketAddr::new(
        cluster_broker.host().parse().unwrap(),
        cluster_broker.port(),
    ))
    .await
    .unwrap();
    let keepalive = 5;
    let site = Broker::start_site_in(
        Bridge {
            remote_host: GATEWAY_IP.into(),
            remote_port: relay,
            site: "plant-v".into(),
            topic_prefix: edgebeat_transports::mqtt::DEFAULT_TOPIC_PREFIX.into(),
            keepalive_secs: keepalive,
        },
        NAMESPACE,
        AGENT_IP,
    )
    .await
    .unwrap();
    // Three boards in the site, the real agent binary in the namespace, at kubelet's
    // cadence (40 s Leases renewed every 10 s: silent only 20 s after the cut, so it is the
    // bridge that tells).
    let dir = tempfile::tempdir().unwrap();
    let hosts: Vec<_> = (0..3)
        .map(|_| fixture_copy("rpi4-cgroup1").unwrap())
        .collect();
    let behind = names("plant-v", 3);
    let mut agents = Vec::new();
    for (name, host) in behind.iter().zip(&hosts) {
        let config = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &config,
            format!(
                "apiVersion: edgebeat.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {name}\nhostRoot: {}\nnodeLabels: {{{ZONE_LABEL}: plant-v}}\ntransport: {{kind: mqtt, endpoint: \"mqtt://{AGENT_IP}:{}\"}}\n",
                host.path().display(),
                site.port(),
            ),
        )
        .unwrap();
        agents.push(
            edgebeat_tests::link::spawn_agent(
                link.command(&agent_binary().unwrap()),
                &config,
                &dir.path().join(format!("{name}.log")),
            )
            .unwrap(),
        );
    }
    // Another site, straight on the cluster's broker.
    let host = fixture_copy("rpi4-cgroup1").unwrap();
    let direct = names("plant-w", 2);
    let w = start(&cluster, host.path(), "plant-w", &direct);
    // Registered and renewing (one renewal each: 40 s Leases renew every 10 s).
    for name in &behind {
        cluster.wait_for_renewals(name, 1, DEADLINE).await.unwrap();
    }
    renewing(&cluster, &direct).await;

    for name in &behind {
        let labels = cluster.standin.node(name).and_then(|n| n.metadata.labels);
        assert_eq!(
            labels
                .as_ref()
                .and_then(|l| l.get(ZONE_LABEL))
                .map(String::as_str),
            Some("plant-v"),
            "{name}: {labels:?}"
        );
    }
    let mut times = Vec::new();
    for cut in 1..=cuts() {
        link.set_up(false).unwrap();
        let cut_at = tokio::time::Instant::now();
        let marked = cluster
            .standin
            .wait_until(DEADLINE, "every node of plant-v marked uplink down", |v| {
                behind.iter().all(|n| is(v, n, "True", REASON_UPLINK_DOWN))
            })
            .await;
        if let Err(e) = marked {
            let conditions: Vec<_> = behind
                .iter()
                .map(|n| {
                    cluster
                        .standin
                        .node(n)
                        .and_then(|n| n.status?.conditions)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|c| c.type_ == SITE_CONDITION)
                        .collect::<Vec<_>>()
                })
                .collect();
            let reqs: Vec<_> = cluster
                .standin
                .requests()
                .iter()
                .filter(|r| r.path.contains("plant-v") && r.method != Method::PUT)
                .map(|r| {
                    format!(
                        "{} {} {} {}",
                        r.method,
                        r.path,
                        r.status,
                        String::from_utf8_lossy(&r.body)
                            .chars()
                            .take(200)
                            .collect::<String>()
                    )
                })
                .collect();
            panic!("{e}\nconditions {conditions:#?}\nrequests {reqs:#?}");
        }
        times.push(cut_at.elapsed().as_secs_f64());
        assert_unmarked(&cluster, &direct);
        link.set_up(true).unwrap();
        cluster
            .standin
            .wait_until(DEADLINE, "every node of plant-v reachable again", |v| {
                behind.iter().all(|n| is(v, n, "False", REASON_REACHABLE))
            })
            .await
            .unwrap();
        assert_eq!(
            events(&cluster, REASON_UPLINK_DOWN).len(),
            cut,
            "one Event per cut"
        );
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let max = times[times.len() - 1];
    println!(
        "veth cut to SiteUplinkDown on every node, {} cuts, bridge keepalive {keepalive} s: median {median:.1} s, max {max:.1} s ({times:.1?})",
        times.len()
    );
    // Within the broker's keepalive check (1.5 × keepalive) and a look, far inside the
    // 40 s a Lease lasts at kubelet's defaults.
    assert!(max < 40.0, "{times:?}");
    assert!(events(&cluster, REASON_SILENT).is_empty());
    for mut agent in agents {
        let _ = agent.kill().await;
    }
    stop(w).await;
}
