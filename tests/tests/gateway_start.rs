//! The real `edgebeat-gateway` binary, with its defaults, against the apiservers a new user
//! meets first: one that cannot be reached, and one that speaks only HTTP/1.1 over plain
//! `http://` (`kubectl proxy`, as client-go talks to it).
//!
//! - `/healthz` answers from the first second whatever the apiserver does; only `/readyz`
//!   waits for the watches.
//! - An unreachable apiserver is an ERROR line naming its URL and the cause within seconds.
//! - Over `http://` the gateway speaks HTTP/1.1 by default; `--apiserver-http=2` (HTTP/2 with
//!   prior knowledge) against the same proxy is reported as unreachable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use edgebeat_tests::harness::{fixture, grpc_transport, http_get, start_agent, test_agent_config};
use edgebeat_tests::process::{GatewayProcess, LogLine};
use edgebeat_tests::standin::StandIn;
use tokio::io::AsyncBufReadExt as _;

/// How long an unreachable apiserver may go unsaid.
const REPORTED_WITHIN: Duration = Duration::from_secs(10);

fn message(line: &LogLine) -> &str {
    line.get("message").and_then(|m| m.as_str()).unwrap_or("")
}

fn field<'a>(line: &'a LogLine, name: &str) -> &'a str {
    line.get(name).and_then(|m| m.as_str()).unwrap_or("")
}

/// The plain gateway flags of these tests: one gRPC ingress without identities, every port
/// chosen by the kernel.
fn gateway_args(server: &str) -> Vec<String> {
    [
        "--server",
        server,
        "--grpc-listen",
        "127.0.0.1:0",
        "--allow-unidentified-agents",
        "--metrics-listen",
        "127.0.0.1:0",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// `http://` and a port nothing listens on: bound by the kernel, then closed.
fn closed_url() -> String {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    format!("http://{closed}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_apiserver_is_an_error_within_seconds_and_healthz_answers_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let url = closed_url();
    let mut gateway =
        GatewayProcess::start(gateway_args(&url), &dir.path().join("gateway.log")).unwrap();
    let health = gateway
        .address("serving /healthz, /readyz and /metrics")
        .await
        .unwrap();
    assert_eq!(
        http_get(health, "/healthz").await.unwrap(),
        (200, "ok\n".to_owned())
    );
    let (code, body) = http_get(health, "/readyz").await.unwrap();
    assert_eq!(code, 503, "not ready without the apiserver: {body}");

    let error = gateway
        .wait_for(REPORTED_WITHIN, |l| {
            message(l) == "cannot reach the apiserver"
        })
        .await
        .unwrap();
    assert_eq!(field(&error, "level"), "ERROR", "{error:?}");
    assert!(field(&error, "apiserver").starts_with(&url), "{error:?}");
    assert!(
        field(&error, "error").contains("Connection refused"),
        "the cause is named: {error:?}"
    );
    // The watches say so too, as errors.
    gateway
        .wait_for(REPORTED_WITHIN, |l| {
            field(l, "level") == "ERROR" && message(l).starts_with("watch failed")
        })
        .await
        .unwrap();

    // Still alive and answering, still not ready, and why.
    assert_eq!(http_get(health, "/healthz").await.unwrap().0, 200);
    let (code, body) = http_get(health, "/readyz").await.unwrap();
    assert_eq!(code, 503);
    assert!(body.contains("Nodes and Leases"), "{body}");
    let status = gateway.terminate().await.unwrap();
    assert!(
        status.success(),
        "SIGTERM during the wait ends cleanly: {status}"
    );
}

fn find_kubectl() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
}

/// `kubectl proxy` in front of `upstream` on a port of its choosing: an apiserver endpoint
/// that speaks HTTP/1.1 only, over plain `http://`. Killed when the child is dropped.
async fn kubectl_proxy(upstream: &str) -> (tokio::process::Child, SocketAddr) {
    let kubectl = find_kubectl().expect("kubectl on PATH");
    let mut child = edgebeat_tests::process::spawn_async(
        tokio::process::Command::new(kubectl)
            .env("KUBECONFIG", "/dev/null")
            .args([
                "--server",
                upstream,
                "proxy",
                "--port=0",
                "--address=127.0.0.1",
            ])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true),
    )
    .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // "Starting to serve on 127.0.0.1:40123"
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("kubectl proxy serves within 20 s")
        .unwrap()
        .expect("kubectl proxy printed where it serves");
    let addr = line.rsplit(' ').next().unwrap().parse().unwrap();
    (child, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl on PATH (scripts/test.sh runs it)"]
async fn the_defaults_work_against_an_http1_apiserver_over_http() {
    let standin = StandIn::start().await.unwrap();
    let (_proxy, proxy) = kubectl_proxy(&standin.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut gateway = GatewayProcess::start(
        gateway_args(&format!("http://{proxy}")),
        &dir.path().join("gateway.log"),
    )
    .unwrap();
    let health = gateway
        .address("serving /healthz, /readyz and /metrics")
        .await
        .unwrap();
    let grpc = gateway.address("gRPC listening").await.unwrap();
    let reached = gateway
        .wait_for(REPORTED_WITHIN, |l| message(l) == "reached the apiserver")
        .await
        .unwrap();
    assert_eq!(
        reached.get("failed_attempts"),
        Some(&0.into()),
        "{reached:?}"
    );

    let config = test_agent_config(
        "http1-proxy-node",
        &fixture("rpi4-cgroup1"),
        grpc_transport(&format!("http://{grpc}")),
    );
    let agent = start_agent(config, Arc::new(edgebeat_hw::SystemClock)).unwrap();
    standin
        .wait_until(
            Duration::from_secs(30),
            "the node registered and its Lease renewed through kubectl proxy",
            |v| {
                v.node("http1-proxy-node").is_some()
                    && v.lease("kube-node-lease", "http1-proxy-node")
                        .and_then(|l| l.spec?.renew_time)
                        .is_some()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        http_get(health, "/readyz").await.unwrap(),
        (200, "ok\n".to_owned())
    );
    let errors: Vec<_> = gateway
        .lines()
        .into_iter()
        .filter(|l| field(l, "level") == "ERROR")
        .collect();
    assert!(errors.is_empty(), "no errors: {errors:?}");
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl on PATH (scripts/test.sh runs it)"]
async fn http2_with_prior_knowledge_against_an_http1_apiserver_is_reported() {
    let standin = StandIn::start().await.unwrap();
    let (_proxy, proxy) = kubectl_proxy(&standin.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://{proxy}");
    let mut args = gateway_args(&url);
    args.push("--apiserver-http=2".to_owned());
    let mut gateway = GatewayProcess::start(args, &dir.path().join("gateway.log")).unwrap();
    let error = gateway
        .wait_for(REPORTED_WITHIN, |l| {
            message(l) == "cannot reach the apiserver"
        })
        .await
        .unwrap();
    assert_eq!(field(&error, "level"), "ERROR");
    assert!(field(&error, "apiserver").starts_with(&url), "{error:?}");
    assert!(!field(&error, "error").is_empty(), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_enrollment_an_unreachable_apiserver_is_retried_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let url = closed_url();
    let mut args = gateway_args(&url);
    args.extend(["--enrollment", "--grpc-enrollment-listen=127.0.0.1:0"].map(str::to_owned));
    let mut gateway = GatewayProcess::start(args, &dir.path().join("gateway.log")).unwrap();
    let health = gateway
        .address("serving /healthz, /readyz and /metrics")
        .await
        .unwrap();
    // The site CA cannot be read: said as an error and asked again (1 s later), alive
    // all along.
    let is_retry = |l: &LogLine| {
        message(l).starts_with("--enrollment: cannot read the site CA")
            && field(l, "level") == "ERROR"
    };
    gateway.wait_for(REPORTED_WITHIN, is_retry).await.unwrap();
    let asked = edgebeat_tests::wait::until(
        "asked twice",
        REPORTED_WITHIN,
        || async {
            let asked = gateway.lines().iter().filter(|l| is_retry(l)).count();
            if asked >= 2 { Ok(()) } else { Err(asked) }
        },
        edgebeat_tests::wait::every(Duration::from_millis(100)),
    )
    .await;
    if let Err(e) = asked {
        panic!("{e}: {}", gateway.log_text());
    }
    assert_eq!(http_get(health, "/healthz").await.unwrap().0, 200);
    let (code, body) = http_get(health, "/readyz").await.unwrap();
    assert_eq!(code, 503);
    assert!(body.contains("site CA"), "{body}");
    let status = gateway.terminate().await.unwrap();
    assert!(
        status.success(),
        "SIGTERM while retrying ends cleanly: {status}"
    );
}

/// SIGTERM drains every ingress before the process exits, whichever stops first: with gRPC
/// and MQTT, the gRPC server ends at once, and the MQTT ingress still ends its broker
/// session with a DISCONNECT (so the broker publishes no Last Will and drops the session
/// cleanly) and the process exits 0. Main used to return when the first ingress ended and
/// drop the others mid-drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_every_ingress_and_mqtt_ends_with_disconnect() {
    let dir = tempfile::tempdir().unwrap();
    let standin = StandIn::serve(
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        std::future::pending(),
    )
    .await
    .unwrap();
    let broker = edgebeat_tests::broker::Broker::start().await.unwrap();
    let mut args = gateway_args(&standin.url());
    args.extend([
        "--apiserver-http=2".to_owned(),
        format!("--mqtt-endpoint=mqtt://{}:{}", broker.host(), broker.port()),
        "--mqtt-client-id=gateway-draining".to_owned(),
    ]);
    let mut gateway = GatewayProcess::start(&args, &dir.path().join("gateway.log")).unwrap();
    let health = gateway
        .address("serving /healthz, /readyz and /metrics")
        .await
        .unwrap();
    let ready = edgebeat_tests::wait::until(
        "/readyz 200",
        Duration::from_secs(30),
        || async {
            match http_get(health, "/readyz").await {
                Ok((200, _)) => Ok(()),
                other => Err(other),
            }
        },
        edgebeat_tests::wait::every(Duration::from_millis(100)),
    )
    .await;
    if let Err(e) = ready {
        panic!("{e}: {}", gateway.log_text());
    }
    let status = gateway.terminate().await.unwrap();
    assert!(status.success(), "{status}: {}", gateway.log_text());
    let log = broker.log();
    assert!(
        log.contains("Received DISCONNECT from gateway-draining"),
        "the MQTT session was cut off without DISCONNECT:\n{log}"
    );
}
