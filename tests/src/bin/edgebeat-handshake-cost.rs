//! `edgebeat-handshake-cost`: the gateway memory one TLS handshake in progress holds, what
//! `GrpcServerOptions::max_handshakes` is sized from. Serves the real gRPC ingress with mTLS
//! on loopback in this process, then holds N connections at each stage a staller can keep
//! one in: idle (no byte sent), or stalled after a whole ClientHello (the server has
//! answered and waits for the client's Finished), one stage per run so that the first
//! stage's deadline (3 s) frees nothing during the second. Prints the process's RSS growth
//! per connection (`VmRSS`, /proc/self/status), which also counts this process's client side
//! of each socket: an upper bound.
//!
//! Run: `cargo run --release -p edgebeat-tests --bin edgebeat-handshake-cost -- idle|hello [N]`
//! (N = 1000 by default; the process needs 2 N + 100 file descriptors).

use std::sync::Arc;
use std::time::Duration;

use edgebeat_tests::pki::Ca;
use edgebeat_transports::grpc::{GrpcServerOptions, GrpcServerTls, serve};
use edgebeat_transports::ingress::{Handler, Peer, RejectReason};

/// Answers nothing: only handshakes are measured.
struct Nothing;

impl Handler for Nothing {
    async fn handle(
        &self,
        _peer: &Peer,
        _message: edgebeat_proto::AgentMessage,
    ) -> Option<edgebeat_proto::Answer> {
        None
    }

    fn rejected(&self, _peer: &Peer, _reason: RejectReason, _detail: &str) {}
}

/// This process's resident set, in KiB.
fn rss_kib() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS in /proc/self/status"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let stage = std::env::args().nth(1).unwrap_or_else(|| "hello".into());
    anyhow::ensure!(
        stage == "idle" || stage == "hello",
        "stage {stage:?}: use idle or hello"
    );
    let n: usize = std::env::args()
        .nth(2)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1000);
    edgebeat_transports::tls::install_ring_provider();
    let site = Ca::new("edgebeat site CA");
    let server = site.server();
    let options = GrpcServerOptions {
        tls: Some(GrpcServerTls {
            cert_pem: server.cert_pem.into_bytes(),
            key_pem: server.key_pem.into_bytes(),
            client_ca_pem: Some(site.cert_pem.clone().into_bytes()),
        }),
        require_node_identity: true,
        // Room for every connection measured: nothing gives way here.
        max_handshakes: 2 * n + 16,
        max_handshakes_per_address: 2 * n + 16,
        ..GrpcServerOptions::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(
        listener,
        Arc::new(Nothing),
        options,
        std::future::pending(),
    ));
    // The client's first flight: a real ClientHello of a node with its certificate.
    let node = site.node("edge-0001");
    let client = edgebeat_transports::tls::ClientTls {
        ca_pem: site.cert_pem.clone().into_bytes(),
        client_identity: Some(edgebeat_transports::tls::TlsIdentity {
            cert_pem: node.cert_pem.into_bytes(),
            key_pem: node.key_pem.into_bytes(),
        }),
    }
    .rustls_config()
    .map_err(anyhow::Error::msg)?;
    let mut hello = Vec::new();
    rustls::ClientConnection::new(
        Arc::new(client),
        rustls::pki_types::ServerName::try_from("127.0.0.1")?,
    )?
    .write_tls(&mut hello)?;
    // A warm-up handshake of each kind, so the growth measured is per connection, not the
    // first use of the code paths.
    let settle = || tokio::time::sleep(Duration::from_millis(300));
    let mut warm = tokio::net::TcpStream::connect(addr).await?;
    tokio::io::AsyncWriteExt::write_all(&mut warm, &hello).await?;
    settle().await;
    let base = rss_kib()?;
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        if stage == "hello" {
            tokio::io::AsyncWriteExt::write_all(&mut stream, &hello).await?;
        }
        held.push(stream);
    }
    settle().await;
    let grown = rss_kib()?.saturating_sub(base);
    // KiB counts far below 2^52: exact as f64.
    let per = grown as f64 / n as f64;
    let what = match stage.as_str() {
        "idle" => "idle (no ClientHello yet)",
        _ => "stalled after a whole ClientHello",
    };
    println!(
        "| {what} | {n} | {grown} KiB | {per:.1} KiB | (ClientHello {} B)",
        hello.len()
    );
    drop((held, warm));
    Ok(())
}
