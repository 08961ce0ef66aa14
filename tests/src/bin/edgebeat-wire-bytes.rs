//! `edgebeat-wire-bytes`: measures bytes on the wire per Lease renewal and per NodeStatus
//! report, over gRPC and over MQTT, on loopback. A counting TCP proxy sits between the
//! agent and the gateway (gRPC) or the broker (MQTT) and counts TCP payload bytes in each
//! direction — all framing included (HTTP/2 frames and gRPC length prefixes; MQTT fixed
//! header, topic, properties and PUBACKs), TCP/IP headers excluded.
//!
//! The third run is MQTT over TLS with every message signed (Mosquitto with a TLS-only
//! listener): TLS records and signatures included.
//!
//! Run: `cargo run --release -p edgebeat-tests --bin edgebeat-wire-bytes`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use edgebeat_agent::config::TransportConfig;
use edgebeat_tests::harness::{Cluster, Transport, fixture, gateway_options};
use edgebeat_tests::pki::Ca;
use edgebeat_tests::standin::StandInView;
use http::Method;
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Counts {
    up: AtomicU64,
    down: AtomicU64,
}

impl Counts {
    fn take(&self) -> (u64, u64) {
        (
            self.up.swap(0, Ordering::Relaxed),
            self.down.swap(0, Ordering::Relaxed),
        )
    }
}

/// A TCP proxy on a free loopback port to `upstream`, counting payload bytes.
async fn proxy(upstream: String, counts: Arc<Counts>) -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&upstream).await else {
                continue;
            };
            let counts = counts.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let up = pump(&mut cr, &mut sw, &counts.up);
                let down = pump(&mut sr, &mut cw, &counts.down);
                let _ = tokio::join!(up, down);
            });
        }
    });
    Ok(port)
}

async fn pump(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    n: &AtomicU64,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(k) => {
                n.fetch_add(k as u64, Ordering::Relaxed);
                if to.write_all(&buf[..k]).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn count(v: &StandInView<'_>, method: Method, suffix: &str) -> usize {
    v.requests()
        .iter()
        .filter(|r| r.method == method && r.path.ends_with(suffix) && r.status < 300)
        .count()
}

/// Measures one transport; with `site`, MQTT over TLS with signed messages (the broker
/// requires `site` certificates, each agent signs with its node key).
async fn measure(transport: Transport, site: Option<&Ca>) -> anyhow::Result<()> {
    const K: usize = 10;
    let cluster = match site {
        Some(site) => Cluster::start_mqtt_secure(site, true, gateway_options()).await?,
        None => Cluster::start(transport).await?,
    };
    let config = |name: &str, facts: &str| match site {
        Some(site) => cluster.secure_agent_config(name, &fixture(facts), &site.node(name)),
        None => cluster.agent_config(name, &fixture(facts)),
    };
    let counts = Arc::new(Counts::default());
    let upstream = match &cluster.broker {
        Some(b) => format!("{}:{}", b.host(), b.port()),
        None => cluster.grpc_url.trim_start_matches("http://").to_owned(),
    };
    let port = proxy(upstream, counts.clone()).await?;
    let via_proxy = |mut c: edgebeat_agent::AgentConfig| {
        c.transport = match c.transport.take() {
            Some(TransportConfig::Grpc(mut g)) => {
                g.endpoint = format!("http://127.0.0.1:{port}");
                Some(TransportConfig::Grpc(g))
            }
            Some(TransportConfig::Mqtt(mut m)) => {
                m.port = port;
                Some(TransportConfig::Mqtt(m))
            }
            None => None,
        };
        c
    };
    let deadline = Duration::from_secs(120);

    // Lease renewals: renew every second, status only at start.
    let mut c = via_proxy(config("edge-lease", "rpi4-cgroup1"));
    c.node_lease_duration_seconds = 4;
    c.node_status_report_frequency = Duration::from_secs(3600);
    let agent = cluster.start_agent(c)?;
    cluster
        .standin
        .wait_until(deadline, "lease created and status sent", |v| {
            count(v, Method::PATCH, "/nodes/edge-lease/status") >= 1
                && count(v, Method::PUT, "/leases/edge-lease") >= 1
        })
        .await?;
    let start = cluster
        .standin
        .requests()
        .iter()
        .filter(|r| r.method == Method::PUT && r.path.ends_with("/leases/edge-lease"))
        .count();
    counts.take();
    cluster
        .standin
        .wait_until(deadline, "K renewals", |v| {
            count(v, Method::PUT, "/leases/edge-lease") >= start + K
        })
        .await?;
    let (up, down) = counts.take();
    agent.stop().await?;
    let name = match (transport, site) {
        (Transport::Grpc, _) => "gRPC",
        (Transport::Mqtt, None) => "MQTT",
        (Transport::Mqtt, Some(_)) => "MQTT over TLS, signed",
    };
    println!(
        "{name}: per lease renewal: {:.1} B agent→ + {:.1} B ←agent = {:.1} B (mean of {K}, TCP payload, framing and acks included)",
        up as f64 / K as f64,
        down as f64 / K as f64,
        (up + down) as f64 / K as f64
    );

    // Status reports: report every second, lease every ~15 min.
    let mut c = via_proxy(config("edge-status", "jetson-cgroup2"));
    c.node_lease_duration_seconds = 3600;
    c.node_status_report_frequency = Duration::from_secs(1);
    let agent = cluster.start_agent(c)?;
    cluster
        .standin
        .wait_until(deadline, "first status", |v| {
            count(v, Method::PATCH, "/nodes/edge-status/status") >= 1
                && count(v, Method::POST, "/leases") >= 2
        })
        .await?;
    let start = cluster
        .standin
        .requests()
        .iter()
        .filter(|r| r.method == Method::PATCH && r.path.ends_with("/nodes/edge-status/status"))
        .count();
    counts.take();
    cluster
        .standin
        .wait_until(deadline, "K status reports", |v| {
            count(v, Method::PATCH, "/nodes/edge-status/status") >= start + K
        })
        .await?;
    let (up, down) = counts.take();
    agent.stop().await?;
    println!(
        "{name}: per status report:  {:.1} B agent→ + {:.1} B ←agent = {:.1} B (mean of {K}; unchanged full NodeStatus of the jetson-cgroup2 fixture)",
        up as f64 / K as f64,
        down as f64 / K as f64,
        (up + down) as f64 / K as f64
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    measure(Transport::Grpc, None).await.context("gRPC")?;
    measure(Transport::Mqtt, None).await.context("MQTT")?;
    let site = Ca::new("edgebeat site CA");
    measure(Transport::Mqtt, Some(&site))
        .await
        .context("MQTT over TLS, signed")?;
    Ok(())
}
