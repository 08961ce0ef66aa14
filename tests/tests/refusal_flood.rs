//! A flood of refused messages is counted in full and written to the log in a few lines:
//! the real `edgebeat-gateway` binary in the signed MQTT posture (`--mqtt-node-ca`), a real
//! Mosquitto, and 20,000 unsigned renewals of as many made-up nodes published within 20 s.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use edgebeat_tests::broker::Broker;
use edgebeat_tests::harness::http_get;
use edgebeat_tests::messages::renewal;
use edgebeat_tests::pki::Ca;
use edgebeat_tests::process::GatewayProcess;
use edgebeat_tests::standin::StandIn;
use prost::Message as _;

const FLOOD: u64 = 20_000;

/// `edgebeat_gateway_rejected_messages_total{reason="unsigned"}` from `/metrics`.
async fn unsigned_rejections(metrics: std::net::SocketAddr) -> u64 {
    let (_, body) = http_get(metrics, "/metrics").await.unwrap();
    body.lines()
        .find_map(|l| {
            l.strip_prefix("edgebeat_gateway_rejected_messages_total{reason=\"unsigned\"} ")
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_refused_messages_write_a_few_kilobytes_of_log() {
    let standin = StandIn::start().await.unwrap();
    let broker = Broker::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let site = Ca::new("edgebeat-test-site");
    let site_ca = dir.path().join("site-ca.crt");
    std::fs::write(&site_ca, &site.cert_pem).unwrap();
    let answers = site.answers();
    let (answer_cert, answer_key) = (
        dir.path().join("answers.crt"),
        dir.path().join("answers.key"),
    );
    std::fs::write(&answer_cert, &answers.cert_pem).unwrap();
    std::fs::write(&answer_key, &answers.key_pem).unwrap();
    let log = dir.path().join("gateway.log");
    let mut gateway = GatewayProcess::start(
        [
            "--server".to_owned(),
            standin.url(),
            format!("--mqtt-endpoint=mqtt://{}:{}", broker.host(), broker.port()),
            format!("--mqtt-node-ca={}", site_ca.display()),
            format!("--mqtt-answer-cert-file={}", answer_cert.display()),
            format!("--mqtt-answer-key-file={}", answer_key.display()),
            "--metrics-listen=127.0.0.1:0".to_owned(),
        ],
        &log,
    )
    .unwrap();
    let metrics = gateway
        .address("serving /healthz, /readyz and /metrics")
        .await
        .unwrap();
    // Ready: the watches listed and the broker granted the shared subscription.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while http_get(metrics, "/readyz").await.map(|a| a.0).ok() != Some(200) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready: {}",
            gateway.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = std::fs::metadata(&log).unwrap().len();

    let mut options = rumqttc::v5::MqttOptions::new("flooder", broker.host(), broker.port());
    options.set_outgoing_inflight_upper_limit(256);
    let (client, mut eventloop) = rumqttc::v5::AsyncClient::new(options, 1024);
    let driver = tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
    for i in 0..FLOOD {
        let node = format!("made-up-{i}");
        client
            .publish(
                format!("edgebeat/v1/nodes/{node}/lease"),
                rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
                false,
                renewal(&node, 1).encode_to_vec(),
            )
            .await
            .unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while unsigned_rejections(metrics).await < FLOOD {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {FLOOD} refusals counted",
            unsigned_rejections(metrics).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        unsigned_rejections(metrics).await,
        FLOOD,
        "every refusal counted, once"
    );
    let written = std::fs::metadata(&log).unwrap().len() - before;
    eprintln!("{FLOOD} refused messages wrote {written} bytes of log");
    assert!(
        written < 8 * 1024,
        "{written} bytes of log for {FLOOD} refusals"
    );
    let lines: Vec<_> = gateway
        .lines()
        .into_iter()
        .filter(|l| l.get("why").and_then(|w| w.as_str()) == Some("unsigned"))
        .collect();
    assert!(!lines.is_empty(), "the refusals are still said");
    // The next interval's line says how many were not written (anonymous publishers share
    // one source: the broker tells the gateway nothing of who they are).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let node = "made-up-late";
    client
        .publish(
            format!("edgebeat/v1/nodes/{node}/lease"),
            rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
            false,
            renewal(node, 1).encode_to_vec(),
        )
        .await
        .unwrap();
    let said = gateway
        .wait_for(Duration::from_secs(20), |l| {
            l.get("why").and_then(|w| w.as_str()) == Some("unsigned")
                && l.get("suppressed")
                    .and_then(|s| s.as_u64())
                    .is_some_and(|s| s > 0)
        })
        .await
        .unwrap();
    assert_eq!(
        said.get("suppressed").and_then(|s| s.as_u64()),
        Some(FLOOD - lines.len() as u64),
        "{said:?}"
    );
    driver.abort();
}
