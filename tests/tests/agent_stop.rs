//! SIGTERM stops a connected `edgebeat-agent` (the real binary, its `main` and signal
//! handling) within a second, with a clean goodbye on either transport: over gRPC it ends its
//! request stream and the gateway (the real `edgebeat-gateway` binary) ends the call cleanly;
//! over MQTT it sends DISCONNECT, so Mosquitto publishes no Last Will. The shipped unit's
//! `TimeoutStopSec` (deploy/systemd/edgebeat-agent.service) is sized from this bound.
//!
//! The agent runs with kubelet's default Lease (40 s, renewed every 10 s, each quiet renewal
//! waiting up to the renew interval for an answer): a renewal is in flight whenever the agent
//! is stopped, which is what used to hold a connected agent's exit for 10.0–10.4 s.
//!
//! Needs both binaries built beside the test (`cargo build -p edgebeat-agent -p
//! edgebeat-gateway`, as `cargo test --workspace` does) and Mosquitto for the MQTT case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use edgebeat_tests::harness::{fixture, wait_for};
use edgebeat_tests::process::{GatewayProcess, LogLine, signal, spawn_async, workspace_binary};
use edgebeat_tests::requests::{count, is_lease_renewed};
use edgebeat_tests::standin::{StandIn, StandInHandle};
use edgebeat_transports::mqtt;
use tokio::time::Instant;

/// How long a connected agent may take from SIGTERM to its exit: the bound, and
/// what the unit's `TimeoutStopSec` is sized from.
const EXIT_WITHIN: Duration = Duration::from_secs(1);

/// How long the agent may take to register and get a first renewal written.
const CONNECTED_WITHIN: Duration = Duration::from_secs(30);

fn message(line: &LogLine) -> &str {
    line.get("message").and_then(|m| m.as_str()).unwrap_or("")
}

/// The gateway's flags: the stand-in as apiserver, a gRPC listener on a port the kernel
/// picks, agents without node certificates let in; the gRPC server's stream events at debug
/// level (`gRPC stream opened`, and `gRPC stream ended` for a stream that broke or was
/// reset), the rest at info.
fn gateway_args(standin: &StandInHandle) -> Vec<String> {
    [
        "--server",
        &standin.url(),
        "--grpc-listen",
        "127.0.0.1:0",
        "--allow-unidentified-agents",
        "--metrics-listen",
        "127.0.0.1:0",
        "--log-level",
        "info,edgebeat_transports::grpc::server=debug",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The stand-in apiserver and the real gateway binary serving gRPC on it ([`gateway_args`],
/// its log in `dir`), and the gateway's gRPC address.
async fn grpc_gateway(dir: &Path) -> (StandInHandle, GatewayProcess, std::net::SocketAddr) {
    let standin = StandIn::serve(
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        std::future::pending(),
    )
    .await
    .unwrap();
    let mut gateway =
        GatewayProcess::start(gateway_args(&standin), &dir.join("gateway.log")).unwrap();
    let grpc = gateway.address("gRPC listening").await.unwrap();
    (standin, gateway, grpc)
}

/// The real agent binary for `node` with `transport` (a YAML flow mapping), kubelet's
/// default intervals, logging JSON to `log`. Killed if the test fails before it exits.
fn spawn_agent(dir: &Path, node: &str, transport: &str, log: &Path) -> tokio::process::Child {
    spawn_agent_with(dir, node, transport, log, &[])
}

/// As [`spawn_agent`], with `env` added to its environment (e.g. `NOTIFY_SOCKET`).
fn spawn_agent_with(
    dir: &Path,
    node: &str,
    transport: &str,
    log: &Path,
    env: &[(&str, &Path)],
) -> tokio::process::Child {
    let config = dir.join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: edgebeat.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {node}\nhostRoot: {}\nclockSyncCondition: false\ntransport: {transport}\n",
            fixture("rpi4-cgroup1").display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(log).unwrap();
    spawn_async(
        tokio::process::Command::new(workspace_binary("edgebeat-agent").unwrap())
            .arg("--config")
            .arg(&config)
            .args(["--log-format", "json"])
            .envs(env.iter().copied())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true),
    )
    .unwrap()
}

/// Waits until the gateway wrote a renewal of `node`'s Lease: the agent is registered, and
/// its next quiet renewal is in flight.
async fn wait_until_renewing(standin: &StandInHandle, node: &str) {
    standin
        .wait_until(CONNECTED_WITHIN, &format!("a renewal of {node}"), |v| {
            count(v.requests(), |r| is_lease_renewed(r, node)) >= 1
        })
        .await
        .unwrap();
}

/// Sends SIGTERM to `agent` and waits for it to exit (killing it after 15 s, so a slow exit
/// is measured rather than hanging the test): its exit status and how long it took.
async fn terminate(agent: &mut tokio::process::Child) -> (std::process::ExitStatus, Duration) {
    let pid = agent.id().expect("the agent is running");
    let started = Instant::now();
    signal(pid, "TERM").unwrap();
    match tokio::time::timeout(Duration::from_secs(15), agent.wait()).await {
        Ok(status) => (status.unwrap(), started.elapsed()),
        Err(_) => {
            agent.kill().await.unwrap();
            panic!("the agent did not exit within 15 s of SIGTERM");
        }
    }
}

/// The agent's JSON log lines.
fn agent_lines(log: &Path) -> Vec<LogLine> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter_map(|l| match serde_json::from_str(l) {
            Ok(serde_json::Value::Object(line)) => Some(line),
            _ => None,
        })
        .collect()
}

/// gRPC: SIGTERM ends the agent's `Heartbeat.Connect` stream cleanly and the process exits
/// 0 within [`EXIT_WITHIN`]. The clean end is seen by the agent: it ends its request stream
/// and logs `gRPC stream closed` only when the gateway answers by ending the call with OK,
/// which its server does once it has read that end (not a reset, not a broken connection).
/// The gateway has no line or metric for a clean end; it logs `gRPC stream ended` (debug)
/// for a stream that was reset or whose connection broke, and must not have here. (That
/// second check is the weaker: an end followed by a reset reads as clean to the gateway.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_a_connected_grpc_agents_stream_and_exits_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let (standin, gateway, grpc) = grpc_gateway(dir.path()).await;
    let node = "stop-grpc-01";
    let log = dir.path().join("agent.log");
    let mut agent = spawn_agent(
        dir.path(),
        node,
        &format!("{{kind: grpc, endpoint: \"http://{grpc}\"}}"),
        &log,
    );
    wait_until_renewing(&standin, node).await;

    let (status, took) = terminate(&mut agent).await;
    println!("gRPC agent: SIGTERM to exit in {took:?} ({status})");
    let agent_log = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status}; agent log:\n{agent_log}");
    assert!(
        took <= EXIT_WITHIN,
        "SIGTERM to exit took {took:?}, over {EXIT_WITHIN:?}; agent log:\n{agent_log}"
    );
    assert!(
        agent_lines(&log)
            .iter()
            .any(|l| message(l) == "gRPC stream closed"),
        "the gateway did not end the call after the agent's half-close; agent log:\n{agent_log}",
    );

    // Whatever the gateway logged about the agent's stream was written before the agent
    // exited; a stream opened now is logged after it, so once that line is read, so is every
    // line about the agent's stream.
    let opened = |gateway: &GatewayProcess| {
        gateway
            .lines()
            .iter()
            .filter(|l| message(l) == "gRPC stream opened")
            .count()
    };
    let before = opened(&gateway);
    assert!(
        before >= 1,
        "the gateway's debug log is not read: {}",
        gateway.log_text()
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut probe = edgebeat_proto::heartbeat_client::HeartbeatClient::new(channel);
    let _call = probe
        .connect(futures_util::stream::pending::<edgebeat_proto::AgentMessage>())
        .await
        .unwrap();
    wait_for(
        "the probe's stream in the gateway's log",
        CONNECTED_WITHIN,
        || opened(&gateway) > before,
    )
    .await;
    let ended: Vec<_> = gateway
        .lines()
        .into_iter()
        .filter(|l| message(l) == "gRPC stream ended")
        .collect();
    assert!(
        ended.is_empty(),
        "the gateway saw the agent's stream break, not end: {ended:?}"
    );
}

/// MQTT: SIGTERM sends DISCONNECT to the broker (so it discards the Last Will) and the
/// process exits 0 within [`EXIT_WITHIN`]. Seen in Mosquitto's own log: `Received DISCONNECT`
/// from the agent's client, and no PUBLISH of its will topic to anyone (the gateway
/// subscribes to every will).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_disconnects_a_connected_mqtt_agent_without_a_will_and_exits_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let standin = StandIn::serve(
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        std::future::pending(),
    )
    .await
    .unwrap();
    let broker = edgebeat_tests::broker::Broker::start().await.unwrap();
    let mut args = gateway_args(&standin);
    args.extend([
        format!("--mqtt-endpoint=mqtt://{}:{}", broker.host(), broker.port()),
        "--mqtt-client-id=gateway-agent-stop".to_owned(),
    ]);
    let _gateway = GatewayProcess::start(&args, &dir.path().join("gateway.log")).unwrap();
    let node = "stop-mqtt-01";
    let client = mqtt::default_client_id(node);
    let log = dir.path().join("agent.log");
    let mut agent = spawn_agent(
        dir.path(),
        node,
        &format!(
            "{{kind: mqtt, endpoint: \"mqtt://{}:{}\"}}",
            broker.host(),
            broker.port()
        ),
        &log,
    );
    wait_until_renewing(&standin, node).await;

    let (status, took) = terminate(&mut agent).await;
    println!("MQTT agent: SIGTERM to exit in {took:?} ({status})");
    let agent_log = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status}; agent log:\n{agent_log}");
    assert!(
        took <= EXIT_WITHIN,
        "SIGTERM to exit took {took:?}, over {EXIT_WITHIN:?}; agent log:\n{agent_log}"
    );

    // Mosquitto logs how the agent's connection ended: DISCONNECT, or a closed or broken
    // socket (then it publishes the will).
    let ended = |log: &str| {
        log.contains(&format!("Received DISCONNECT from {client}"))
            || log.contains(&format!("Client {client} closed its connection"))
            || log.contains(&format!("Socket error on client {client}"))
    };
    wait_for(
        "the broker to log the agent's end",
        CONNECTED_WITHIN,
        || ended(&broker.log()),
    )
    .await;
    let log = broker.log();
    assert!(
        log.contains(&format!("Received DISCONNECT from {client}")),
        "the agent's MQTT session ended without DISCONNECT:\n{log}"
    );
    let will = format!(
        "'{}'",
        mqtt::node_topic(mqtt::DEFAULT_TOPIC_PREFIX, node, mqtt::WILL_KIND)
    );
    let wills: Vec<_> = log
        .lines()
        .filter(|l| l.contains("Sending PUBLISH") && l.contains(&will))
        .collect();
    assert!(
        wills.is_empty(),
        "the broker published the agent's Last Will: {wills:?}"
    );
}

/// Receives notifications on `socket` (each datagram one or more `KEY=value` lines) into
/// `received` until one starts with `last`.
///
/// # Panics
/// When none does within `within`.
async fn notifications_until(
    socket: &tokio::net::UnixDatagram,
    received: &mut Vec<String>,
    last: &str,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    let mut buf = vec![0u8; 4096];
    while !received.iter().any(|n| n.starts_with(last)) {
        let n = tokio::time::timeout_at(deadline, socket.recv(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {last} within {within:?}: {received:?}"))
            .unwrap();
        received.extend(
            String::from_utf8_lossy(&buf[..n])
                .lines()
                .map(str::to_owned),
        );
    }
}

/// Boot while the site is offline, over a real `$NOTIFY_SOCKET` (the datagram socket systemd
/// gives a `Type=notify` unit): the agent says `READY=1` as soon as it runs, with `STATUS=`
/// saying it is still registering, although its gateway does not answer (the gateway
/// process stopped with SIGSTOP: its port takes connections that nothing serves, as a dead
/// uplink's would hang). Once the gateway runs again the agent registers and says so in
/// `STATUS=`. So a board booting offline finishes booting (`multi-user.target` waits for
/// the units it wants), which `TimeoutStartSec=infinity` and a READY held until the
/// gateway answered did not allow. (No systemd runs as PID 1 on this machine: this is the
/// notify protocol as systemd reads it, from the real binary.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_without_the_gateway_and_the_registration_in_status() {
    let dir = tempfile::tempdir().unwrap();
    let (standin, gateway, grpc) = grpc_gateway(dir.path()).await;
    let gateway_pid = gateway.pid().unwrap();
    signal(gateway_pid, "STOP").unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = tokio::net::UnixDatagram::bind(&socket_path).unwrap();
    let started = Instant::now();
    let mut agent = spawn_agent_with(
        dir.path(),
        "offline-boot",
        &format!("{{kind: grpc, endpoint: \"http://{grpc}\"}}"),
        &dir.path().join("agent.log"),
        &[("NOTIFY_SOCKET", &socket_path)],
    );
    let mut received: Vec<String> = Vec::new();
    notifications_until(&socket, &mut received, "READY=1", Duration::from_secs(10)).await;
    let ready_after = started.elapsed();
    eprintln!("READY=1 {ready_after:?} after start, the gateway not answering");
    assert_eq!(
        received,
        [
            format!("STATUS={}", edgebeat_agent::systemd::STATUS_REGISTERING),
            "READY=1".to_owned()
        ],
        "ready while registering"
    );
    assert_eq!(
        count(&standin.requests(), |r| is_lease_renewed(r, "offline-boot")),
        0,
        "the gateway never answered meanwhile"
    );
    // The gateway appears: the agent registers and says so.
    signal(gateway_pid, "CONT").unwrap();
    notifications_until(
        &socket,
        &mut received,
        "STATUS=registered",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        received.last().map(String::as_str),
        Some(format!("STATUS={}", edgebeat_agent::systemd::STATUS_REGISTERED).as_str())
    );
    wait_until_renewing(&standin, "offline-boot").await;
    let (status, _) = terminate(&mut agent).await;
    assert!(status.success(), "{status}");
    notifications_until(&socket, &mut received, "STOPPING=1", Duration::from_secs(5)).await;
}
