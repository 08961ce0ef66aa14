use super::*;
use crate::config::GrpcUplinkOptions;
use edgebeat_hw::SystemClock;
use edgebeat_transports::uplink::UplinkError;
use prost::Message as _;

fn fixture_agent() -> Arc<Agent> {
    let config = AgentConfig {
        node_name: Some("edge-metrics".parse().unwrap()),
        host_root: std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/rpi4-cgroup1"),
        transport: Some(TransportConfig::Grpc(GrpcUplinkOptions {
            keepalive: Duration::from_secs(30),
            ..GrpcUplinkOptions::new("http://gateway.invalid:7443")
        })),
        ..AgentConfig::default()
    };
    Agent::new(config, Arc::new(SystemClock)).unwrap()
}

/// A board left with its default hostname, named by `nodeName`: the hostname label is
/// the node name, as with kubelet's `--hostname-override`; without `nodeName` it is
/// the lower-cased OS hostname, which is then the node name too.
#[test]
fn the_hostname_label_is_the_node_name() {
    let mut config = AgentConfig {
        node_name: Some("judge-node-0".parse().unwrap()),
        host_root: std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/rpi4-cgroup1"),
        ..AgentConfig::default()
    };
    let facts = read_facts(&config).unwrap();
    assert_eq!(facts.hostname.as_deref(), Some("rpi4-edge-01"));
    let name = node_name(&config, &facts).unwrap();
    let labels = node_labels(&config, &facts, &name);
    assert_eq!(labels["kubernetes.io/hostname"], "judge-node-0");
    config.node_name = None;
    let name = node_name(&config, &facts).unwrap();
    let labels = node_labels(&config, &facts, &name);
    assert_eq!(labels["kubernetes.io/hostname"], "rpi4-edge-01");
}

fn metrics_text(agent: &Agent) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &agent.registry()).unwrap();
    out
}

/// The value of the sample line starting with `series ` (name and labels).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .parse()
        .unwrap()
}

/// A report and a renewal through an in-process uplink whose "gateway" acknowledges
/// everything (no network), then the families `/metrics` serves.
#[tokio::test]
async fn a_report_and_a_renewal_show_in_the_metrics() {
    let agent = fixture_agent();
    let (uplink, mut driver) = edgebeat_transports::uplink::channel(4);
    let gateway = tokio::spawn(async move {
        let mut sizes = Vec::new();
        while let Some(request) = driver.requests.recv().await {
            sizes.push((request.message.kind_name(), request.message.encoded_len()));
            let _ = request.reply.send(Ok(pb::Answer::WRITTEN));
        }
        sizes
    });
    let before = metrics_text(&agent);
    assert_eq!(
        sample(
            &before,
            "edgebeat_agent_status_reports_total{result=\"ok\"}"
        ),
        0.0
    );

    assert!(
        loops::report(
            &agent.status_inputs(&uplink),
            &agent.latest(),
            false,
            &Journal::default()
        )
        .await
    );
    assert_eq!(
        loops::renew(&agent.lease_inputs(&uplink), &mut Vec::new(), false).await,
        Some(false),
        "answered at once (an older gateway): written, the loop still waits its period"
    );
    drop(uplink);
    let sizes = gateway.await.unwrap();

    let text = metrics_text(&agent);
    let expect = [
        ("edgebeat_agent_status_reports_total{result=\"ok\"}", 1.0),
        (
            "edgebeat_agent_status_reports_total{result=\"failed\"}",
            0.0,
        ),
        ("edgebeat_agent_lease_renewals_total{result=\"ok\"}", 1.0),
        (
            "edgebeat_agent_lease_renewals_total{result=\"failed\"}",
            0.0,
        ),
        ("edgebeat_agent_registrations_total", 0.0),
        ("edgebeat_agent_transport_reconnects_total", 0.0),
        (
            "edgebeat_agent_messages_sent_bytes_total{kind=\"register\"}",
            0.0,
        ),
    ];
    for (series, value) in expect {
        assert_eq!(sample(&text, series), value, "{series}");
    }
    // Exactly the encoded sizes of what reached the transport.
    for (kind, size) in sizes {
        let series = format!("edgebeat_agent_messages_sent_bytes_total{{kind=\"{kind}\"}}");
        assert_eq!(sample(&text, &series), size as f64, "{series}");
    }
    let renewed = sample(&text, "edgebeat_agent_last_lease_renewal_timestamp_seconds");
    assert!(renewed > 1.7e9, "{renewed}");
    assert!(
        text.contains(&format!(
            "edgebeat_agent_info{{node=\"edge-metrics\",transport=\"grpc\",version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    for family in [
        "# TYPE edgebeat_agent_lease_renewals counter",
        "# TYPE edgebeat_agent_status_reports counter",
        "# TYPE edgebeat_agent_registrations counter",
        "# TYPE edgebeat_agent_transport_reconnects counter",
        "# TYPE edgebeat_agent_messages_sent_bytes counter",
        "# TYPE edgebeat_agent_last_lease_renewal_timestamp_seconds gauge",
        "# TYPE edgebeat_agent info",
    ] {
        assert!(text.contains(family), "missing {family:?}");
    }
}

/// Quiet renewals and unchanged reports: silence until the next one is due means
/// written; a RETRY answer is retried with a fresh message; a `resend_status` answer to
/// an unchanged report ends it so the whole status goes next.
#[tokio::test(start_paused = true)]
async fn silence_means_written_and_news_is_acted_on() {
    let agent = fixture_agent();
    let (uplink, mut driver) = edgebeat_transports::uplink::channel(4);
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let gateway = tokio::spawn(async move {
        let mut held = Vec::new();
        let mut first = true;
        while let Some(request) = driver.requests.recv().await {
            let _ = seen_tx.send(request.message.clone());
            match &request.message.kind {
                // The first renewal is not written; every other quiet one is.
                Some(Kind::Lease(_)) if first => {
                    first = false;
                    let _ = request.reply.send(Ok(pb::Answer::Retry {
                        reason: "apiserver busy".into(),
                    }));
                }
                Some(Kind::Status(s)) if s.unchanged && held.len() == 2 => {
                    let _ = request.reply.send(Ok(pb::Answer::ResendStatus {
                        reason: "the apiserver's status differs".into(),
                    }));
                }
                // Silence: keep the request open, answer nothing.
                _ => held.push(request),
            }
        }
    });
    let started = tokio::time::Instant::now();
    assert_eq!(
        loops::renew(&agent.lease_inputs(&uplink), &mut Vec::new(), false).await,
        Some(true)
    );
    let waited = started.elapsed();
    let interval = agent.config.lease_renew_interval();
    assert!(
        waited >= interval && waited <= interval.mul_f64(1.0 + JITTER),
        "one silent renew interval after the refused attempt: {waited:?}"
    );
    let renewals: Vec<_> = std::iter::from_fn(|| seen.try_recv().ok()).collect();
    assert_eq!(renewals.len(), 2, "the refused renewal was retried");
    assert!(renewals.iter().all(pb::AgentMessage::is_quiet));

    assert!(
        loops::report(
            &agent.status_inputs(&uplink),
            &agent.latest(),
            true,
            &Journal::default()
        )
        .await,
        "silence"
    );
    let report = seen.try_recv().unwrap();
    assert!(report.is_quiet());
    let Some(Kind::Status(s)) = &report.kind else {
        panic!("{report:?}")
    };
    assert!(s.status.is_none(), "an unchanged report carries no status");
    assert!(
        !loops::report(
            &agent.status_inputs(&uplink),
            &agent.latest(),
            true,
            &Journal::default()
        )
        .await,
        "the gateway wants the whole status"
    );
    drop(uplink);
    gateway.abort();
}

/// After failed ticks the lease loop backs off (200 ms doubling to 7 s, as kubelet), but a
/// connection coming up ends the wait: the first renewal after an outage goes out with
/// the connection, not up to 7 s later.
#[tokio::test(start_paused = true)]
async fn a_connection_coming_up_ends_the_renewal_backoff() {
    let agent = fixture_agent();
    let (uplink, mut driver) = edgebeat_transports::uplink::channel(4);
    driver.registered.send_replace(true);
    let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (sent_tx, mut sent) = tokio::sync::mpsc::unbounded_channel();
    let link_up = up.clone();
    let connections = driver.connections.clone();
    let gateway = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(request) = driver.requests.recv().await {
            let _ = sent_tx.send(tokio::time::Instant::now());
            if link_up.load(std::sync::atomic::Ordering::SeqCst) {
                held.push(request); // silence: written
            } else {
                let _ = request.reply.send(Err(UplinkError::NotConnected));
            }
        }
    });
    let cancel = CancellationToken::new();
    let lease = loops::lease_loop(agent.lease_inputs(&uplink), cancel.clone());
    let outage = async {
        // A minute of outage: the backoff has grown to its 7 s cap.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let back = tokio::time::Instant::now();
        up.store(true, std::sync::atomic::Ordering::SeqCst);
        connections.send_modify(|n| *n += 1);
        let first = loop {
            let at = sent.recv().await.unwrap();
            if at >= back {
                break at;
            }
        };
        assert_eq!(first, back, "the renewal goes with the connection");
        cancel.cancel();
    };
    tokio::join!(lease, outage);
    gateway.abort();
}

#[test]
fn watchdog_bound_covers_a_pause_and_a_tick_of_timeouts() {
    assert_eq!(
        watchdog_bound(&AgentConfig::default()),
        // 14 s of backoff + 5 quiet attempts of 10 s × 1.04 each
        Duration::from_secs(66)
    );
    let slow = AgentConfig {
        node_lease_duration_seconds: 120,
        ..AgentConfig::default()
    };
    // 30 s × 1.04 + 5 × 30 s × 1.04
    assert_eq!(watchdog_bound(&slow), Duration::from_millis(187_200));
}

#[tokio::test]
async fn refused_messages_count_no_bytes_and_fail_the_tick() {
    let agent = fixture_agent();
    let (uplink, mut driver) = edgebeat_transports::uplink::channel(4);
    let gateway = tokio::spawn(async move {
        while let Some(request) = driver.requests.recv().await {
            let _ = request.reply.send(Err(UplinkError::NotConnected));
        }
    });
    assert_eq!(
        loops::renew(&agent.lease_inputs(&uplink), &mut Vec::new(), false).await,
        None
    );
    drop(uplink);
    gateway.await.unwrap();
    let text = metrics_text(&agent);
    assert_eq!(
        sample(
            &text,
            "edgebeat_agent_lease_renewals_total{result=\"failed\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            "edgebeat_agent_messages_sent_bytes_total{kind=\"lease\"}"
        ),
        0.0
    );
    assert_eq!(
        sample(&text, "edgebeat_agent_last_lease_renewal_timestamp_seconds"),
        0.0
    );
}

/// A renewal with the node's resource usage carries the host's CPU time (the root
/// `cpuacct.usage`, ns → ms) and working set (bytes → KiB), read as it is sent; one without
/// carries none.
#[tokio::test(start_paused = true)]
async fn a_renewal_with_usage_carries_the_hosts_cpu_time_and_working_set() {
    let agent = fixture_agent();
    let (uplink, mut driver) = edgebeat_transports::uplink::channel(4);
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let gateway = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(request) = driver.requests.recv().await {
            let _ = seen_tx.send(request.message.clone());
            held.push(request);
        }
    });
    let facts = read_facts(&agent.config).unwrap();
    let working_set = facts.memory.working_set_bytes.unwrap();
    for with_usage in [true, false] {
        assert_eq!(
            loops::renew(&agent.lease_inputs(&uplink), &mut Vec::new(), with_usage).await,
            Some(true)
        );
        let Some(Kind::Lease(renewal)) = seen.try_recv().unwrap().kind else {
            panic!("not a renewal")
        };
        let expected = with_usage.then_some(pb::ResourceUsage {
            cpu_usage_ms: 123_456_789,
            memory_working_set_kib: working_set / 1024,
        });
        assert_eq!(renewal.usage, expected, "with_usage {with_usage}");
    }
    drop(uplink);
    gateway.abort();
}

/// kubelet's one-time delay after a changed report (`calculateDelay`): the next periodic
/// report within [frequency/2, 3·frequency/2), spread over that range; after a periodic
/// report, the frequency exactly.
#[test]
fn the_report_after_a_change_is_spread_over_half_a_period_either_side() {
    let frequency = Duration::from_secs(300);
    let draws: Vec<Duration> = (0..2000)
        .map(|_| loops::next_report_period(frequency, true))
        .collect();
    let (low, high) = (frequency / 2, frequency * 3 / 2);
    assert!(
        draws.iter().all(|d| (low..high).contains(d)),
        "outside [{low:?}, {high:?}): {:?}",
        draws
            .iter()
            .filter(|d| !(low..high).contains(*d))
            .collect::<Vec<_>>()
    );
    let (min, max) = (draws.iter().min().unwrap(), draws.iter().max().unwrap());
    assert!(
        *min < frequency * 6 / 10 && *max > frequency * 14 / 10,
        "not spread: {min:?}..{max:?}"
    );
    assert_eq!(loops::next_report_period(frequency, false), frequency);
}
