//! Mutual TLS with kubelet-style node identities on the gRPC transport, over real TLS on
//! loopback: agent (tonic client, rustls on ring) → gateway (tonic server with a client CA)
//! → stand-in apiserver.
//!
//! Every test makes its own PKI with rcgen (nothing is committed): a site CA, the gateway's
//! server certificate for 127.0.0.1/localhost, node client certificates
//! (CN=`system:node:<name>`, O=`system:nodes`) and bad ones (another CA, no node group, a
//! non-node CN, expired). Refusals are shown twice: by a raw gRPC probe that gets the exact
//! error, and by a real agent whose node never appears at the stand-in while a control
//! agent (or the probe's counter) shows the gateway was working meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgebeat_agent::AgentConfig;
use edgebeat_agent::config::{ClientTls, TlsIdentity};
use edgebeat_gateway::message_path::GatewayOptions;
use edgebeat_proto::{self as pb, AckCode};
use edgebeat_tests::harness::{Cluster, fixture, wait_for};
use edgebeat_tests::pki::{Ca, Leaf};
use edgebeat_transports::grpc::GrpcServerOptions;
use edgebeat_transports::ingress::RejectReason;

const DEADLINE: Duration = Duration::from_secs(20);
const FACTS: &str = "rpi4-cgroup1";
const LEASE_NS: &str = "kube-node-lease";

// ---------------------------------------------------------------------------------------
// Cluster, agents, probe

/// A gateway serving TLS with `site`'s server certificate and `site` as client CA.
async fn mtls_cluster(site: &Ca, require_node_identity: bool) -> Cluster {
    let grpc = GrpcServerOptions {
        require_node_identity,
        ..edgebeat_tests::harness::mtls_options(site)
    };
    let cluster = Cluster::start_grpc_with(grpc, GatewayOptions::default())
        .await
        .unwrap();
    assert!(cluster.grpc_url.starts_with("https://127.0.0.1:"));
    cluster
}

/// An agent for `node` that verifies the gateway against `trust` and presents `client`.
fn agent_config(cluster: &Cluster, node: &str, trust: &Ca, client: Option<&Leaf>) -> AgentConfig {
    let mut config = cluster.agent_config(node, &fixture(FACTS));
    config
        .transport
        .as_mut()
        .unwrap()
        .set_tls(ClientTls {
            ca_pem: trust.cert_pem.clone().into_bytes(),
            client_identity: client.map(|leaf| TlsIdentity {
                cert_pem: leaf.cert_pem.clone().into_bytes(),
                key_pem: leaf.key_pem.clone().into_bytes(),
            }),
        })
        .unwrap();
    config
}

fn rejected(cluster: &Cluster) -> u64 {
    cluster.gateway().counters.rejected()
}

/// Stand-in requests that concern `node` (its Node, status, Lease, or a body naming it).
fn writes_for(cluster: &Cluster, node: &str) -> usize {
    cluster
        .standin
        .requests()
        .iter()
        .filter(|r| r.path.contains(node) || String::from_utf8_lossy(&r.body).contains(node))
        .count()
}

fn register(node: &str) -> pb::AgentMessage {
    edgebeat_tests::messages::register(node, 1)
}

/// `error: cause: cause…`.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A raw gRPC client: connects over TLS trusting `trust`, presenting `client`, opens one
/// `Connect` stream, sends a register for `node` and returns the gateway's ack, or the
/// error (`connect: …` for the connection, `<Code>: …` for the stream) with its causes.
async fn probe(
    cluster: &Cluster,
    trust: &Ca,
    client: Option<&Leaf>,
    node: &str,
) -> Result<pb::Ack, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&trust.cert_pem))
        .domain_name("127.0.0.1");
    if let Some(leaf) = client {
        tls = tls.identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem));
    }
    let endpoint = Endpoint::from_shared(cluster.grpc_url.clone())
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .tls_config(tls)
        .unwrap();
    let channel = tokio::time::timeout(DEADLINE, endpoint.connect())
        .await
        .expect("probe connect within the deadline")
        .map_err(|e| format!("connect: {}", chain(&e)))?;
    let mut client = pb::heartbeat_client::HeartbeatClient::new(channel);
    let status = |s: tonic::Status| format!("{:?}: {}", s.code(), chain(&s));
    let call = client.connect(futures_util::stream::iter(vec![register(node)]));
    let mut inbound = tokio::time::timeout(DEADLINE, call)
        .await
        .expect("probe answered within the deadline")
        .map_err(status)?
        .into_inner();
    match tokio::time::timeout(DEADLINE, inbound.message())
        .await
        .expect("probe ack within the deadline")
    {
        Ok(Some(pb::GatewayMessage {
            kind: Some(pb::gateway_message::Kind::Ack(ack)),
        })) => Ok(ack),
        Ok(other) => Err(format!("no ack: {other:?}")),
        Err(s) => Err(status(s)),
    }
}

/// rustls client configuration trusting `trust` and presenting `client`.
fn rustls_client(trust: &Ca, client: Option<&Leaf>) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = |pem: &str| {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    };
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(certs(&trust.cert_pem));
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    Arc::new(match client {
        Some(leaf) => builder
            .with_client_auth_cert(
                certs(&leaf.cert_pem),
                PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    })
}

/// Why the gateway ends a TLS connection from a client presenting `client`, as the client
/// sees it. In TLS 1.3 the client's side of the handshake completes before the server has
/// judged its certificate, so the refusal is an alert read after it: reading (never
/// writing, which could race the close) makes it deterministic. `None` when the connection
/// stays up for `patience`.
async fn tls_refusal(
    cluster: &Cluster,
    trust: &Ca,
    client: Option<&Leaf>,
    patience: Duration,
) -> Option<String> {
    let config = rustls_client(trust, client);
    let addr = cluster.grpc_url.trim_start_matches("https://").to_owned();
    tokio::task::spawn_blocking(move || {
        let mut socket = std::net::TcpStream::connect(addr).unwrap();
        socket.set_read_timeout(Some(patience)).unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = rustls::ClientConnection::new(config, name).unwrap();
        while tls.is_handshaking() {
            if let Err(e) = tls.complete_io(&mut socket) {
                return Some(format!("during the handshake: {e}"));
            }
        }
        let mut buf = [0u8; 256];
        loop {
            match tls.complete_io(&mut socket) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                Err(e) => return Some(format!("after the handshake: {e}")),
                Ok((0, 0)) => return Some("closed without an alert".into()),
                Ok(_) => {
                    // Session tickets and the like; nothing for the application.
                    let _ = tls.reader().read(&mut buf);
                }
            }
        }
    })
    .await
    .unwrap()
}

/// Starts a control agent with a valid node certificate and waits for 3 renewals: proof
/// that the gateway served TLS clients during the time a refused agent was trying.
async fn control_agent_renews(cluster: &Cluster, site: &Ca, node: &str) {
    let control = cluster
        .start_agent(agent_config(cluster, node, site, Some(&site.node(node))))
        .unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "control node leased", |v| {
            v.lease(LEASE_NS, node).is_some()
        })
        .await
        .unwrap();
    cluster.wait_for_renewals(node, 3, DEADLINE).await.unwrap();
    control.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// (a) the good path

/// (a) A node with a valid node certificate registers over mTLS and keeps renewing its
/// Lease; nothing is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_with_a_valid_certificate_registers_and_renews() {
    let site = Ca::new("site-ca");
    let cluster = mtls_cluster(&site, true).await;
    let agent = cluster
        .start_agent(agent_config(
            &cluster,
            "edge-a",
            &site,
            Some(&site.node("edge-a")),
        ))
        .unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "edge-a registered and leased", |v| {
            v.node("edge-a").is_some() && v.lease(LEASE_NS, "edge-a").is_some()
        })
        .await
        .unwrap();
    cluster
        .wait_for_renewals("edge-a", 3, DEADLINE)
        .await
        .unwrap();
    let refusal = tls_refusal(
        &cluster,
        &site,
        Some(&site.node("edge-a2")),
        Duration::from_secs(1),
    )
    .await;
    assert_eq!(refusal, None, "a node certificate keeps its TLS session");
    let lease = cluster.standin.lease(LEASE_NS, "edge-a").unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("edge-a")
    );
    assert_eq!(rejected(&cluster), 0);
    agent.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// (b) identity binds the node name

/// (b) Node A's certificate used to send messages in the name of node B: every message is
/// rejected and counted, B's Lease is not touched, and A (same certificate, its own name)
/// keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_certificate_cannot_speak_for_another_node() {
    let site = Ca::new("site-ca");
    let cluster = mtls_cluster(&site, true).await;
    let (cert_a, cert_b) = (site.node("edge-a"), site.node("edge-b"));

    // B registers legitimately, then goes away: its Lease stays as B left it.
    let b = cluster
        .start_agent(agent_config(&cluster, "edge-b", &site, Some(&cert_b)))
        .unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "edge-b leased", |v| {
            v.lease(LEASE_NS, "edge-b").is_some()
        })
        .await
        .unwrap();
    cluster
        .wait_for_renewals("edge-b", 2, DEADLINE)
        .await
        .unwrap();
    b.stop().await.unwrap();
    let lease_b = cluster.standin.lease(LEASE_NS, "edge-b").unwrap();
    let writes_b = writes_for(&cluster, "edge-b");
    let rejected_before = rejected(&cluster);

    // An impostor holding A's certificate claims to be B; A runs too.
    let impostor = cluster
        .start_agent(agent_config(&cluster, "edge-b", &site, Some(&cert_a)))
        .unwrap();
    let a = cluster
        .start_agent(agent_config(&cluster, "edge-a", &site, Some(&cert_a)))
        .unwrap();
    wait_for(
        "the impostor's registers rejected 3 times",
        DEADLINE,
        || rejected(&cluster) >= rejected_before + 3,
    )
    .await;
    cluster
        .standin
        .wait_until(DEADLINE, "edge-a leased", |v| {
            v.lease(LEASE_NS, "edge-a").is_some()
        })
        .await
        .unwrap();
    cluster
        .wait_for_renewals("edge-a", 3, DEADLINE)
        .await
        .unwrap();

    // A raw probe shows the reason the gateway gives.
    let ack = probe(&cluster, &site, Some(&cert_a), "edge-b")
        .await
        .unwrap();
    assert_eq!(AckCode::try_from(ack.code).unwrap(), AckCode::Rejected);
    assert!(
        ack.reason
            .contains("\"edge-a\" may not speak for node \"edge-b\""),
        "{}",
        ack.reason
    );

    assert_eq!(
        writes_for(&cluster, "edge-b"),
        writes_b,
        "nothing written for edge-b while the impostor ran"
    );
    assert_eq!(
        cluster.standin.lease(LEASE_NS, "edge-b").unwrap(),
        lease_b,
        "B's Lease untouched"
    );
    impostor.stop().await.unwrap();
    a.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// (c) (e) (f): refused in the TLS handshake

/// A probe error from the connection itself (the TLS session closed under the stream), not
/// an answer of the gateway's gRPC service.
fn is_transport_failure(err: &str) -> bool {
    err.starts_with("connect: ") || err.contains("transport error")
}

/// Asserts that an agent presenting `client` (trusting `trust` for the gateway) gets
/// nothing written for `node` while a control agent with a good certificate renews, and
/// that the gateway counts the refused handshakes as `tls_handshake` and nothing else (no
/// message from the refused agent reaches the handler).
async fn refused_agent_writes_nothing(
    cluster: &Cluster,
    site: &Ca,
    trust: &Ca,
    client: Option<&Leaf>,
    node: &str,
) {
    let refused = cluster
        .start_agent(agent_config(cluster, node, trust, client))
        .unwrap();
    control_agent_renews(cluster, site, "control-01").await;
    assert_eq!(writes_for(cluster, node), 0, "nothing written for {node}");
    assert!(cluster.standin.node(node).is_none());
    let handshakes = || {
        cluster
            .gateway()
            .counters
            .rejections(RejectReason::TlsHandshake)
    };
    wait_for("the refused handshakes counted", DEADLINE, || {
        handshakes() >= 1
    })
    .await;
    assert_eq!(
        rejected(cluster),
        handshakes(),
        "only handshake failures counted"
    );
    refused.stop().await.unwrap();
}

/// (c) A node certificate from another CA: the handshake fails (the gateway does not know
/// the issuer), so nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_fails_the_handshake() {
    let site = Ca::new("site-ca");
    let rogue = Ca::new("rogue-ca");
    let cluster = mtls_cluster(&site, true).await;
    let foreign = rogue.node("edge-c");
    let refusal = tls_refusal(&cluster, &site, Some(&foreign), DEADLINE).await;
    assert!(
        refusal.as_deref().unwrap_or("").contains("UnknownCA"),
        "{refusal:?}"
    );
    let err = probe(&cluster, &site, Some(&foreign), "edge-c")
        .await
        .unwrap_err();
    assert!(is_transport_failure(&err), "{err}");
    refused_agent_writes_nothing(&cluster, &site, &site, Some(&foreign), "edge-c").await;
}

/// (e) An expired node certificate from the right CA is refused in the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_client_certificate_is_refused() {
    let site = Ca::new("site-ca");
    let cluster = mtls_cluster(&site, true).await;
    let expired = site.client_with("system:node:edge-e", Some("system:nodes"), true);
    let refusal = tls_refusal(&cluster, &site, Some(&expired), DEADLINE).await;
    assert!(
        refusal
            .as_deref()
            .unwrap_or("")
            .contains("CertificateExpired"),
        "{refusal:?}"
    );
    let err = probe(&cluster, &site, Some(&expired), "edge-e")
        .await
        .unwrap_err();
    assert!(is_transport_failure(&err), "{err}");
    refused_agent_writes_nothing(&cluster, &site, &site, Some(&expired), "edge-e").await;
}

/// (f) No client certificate while the gateway has a client CA: refused in the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_certificate_is_refused_when_a_client_ca_is_configured() {
    let site = Ca::new("site-ca");
    let cluster = mtls_cluster(&site, true).await;
    let refusal = tls_refusal(&cluster, &site, None, DEADLINE).await;
    assert!(
        refusal
            .as_deref()
            .unwrap_or("")
            .contains("CertificateRequired"),
        "{refusal:?}"
    );
    let err = probe(&cluster, &site, None, "edge-f").await.unwrap_err();
    assert!(is_transport_failure(&err), "{err}");
    refused_agent_writes_nothing(&cluster, &site, &site, None, "edge-f").await;
}

/// The agent verifies the gateway too: a gateway certificate its CA did not sign is
/// refused by the agent, whatever the agent's own certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_refuses_a_gateway_its_ca_did_not_sign() {
    let site = Ca::new("site-ca");
    let other = Ca::new("other-ca");
    let cluster = mtls_cluster(&site, true).await;
    let cert = site.node("edge-h");
    let refusal = tls_refusal(&cluster, &other, Some(&cert), DEADLINE).await;
    assert!(
        refusal.as_deref().unwrap_or("").contains("UnknownIssuer"),
        "{refusal:?}"
    );
    let err = probe(&cluster, &other, Some(&cert), "edge-h")
        .await
        .unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
    refused_agent_writes_nothing(&cluster, &site, &other, Some(&cert), "edge-h").await;
}

// ---------------------------------------------------------------------------------------
// (d) a verified certificate that is not a node's

/// (d) Certificates from the right CA that are not node identities (no O=system:nodes,
/// another group, a non-node CN) pass the handshake but the stream is refused with
/// UNAUTHENTICATED and counted; an agent holding one writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_without_the_node_identity_is_refused_unauthenticated() {
    let site = Ca::new("site-ca");
    let cluster = mtls_cluster(&site, true).await;
    let cases = [
        (
            site.client("system:node:edge-d", None),
            "lacks O=system:nodes",
        ),
        (
            site.client("system:node:edge-d", Some("system:masters")),
            "lacks O=system:nodes",
        ),
        (
            site.client("edge-d", Some("system:nodes")),
            "not a node identity",
        ),
        (
            site.client("system:kube-proxy", Some("system:nodes")),
            "not a node identity",
        ),
    ];
    for (leaf, reason) in &cases {
        let before = rejected(&cluster);
        let err = probe(&cluster, &site, Some(leaf), "edge-d")
            .await
            .unwrap_err();
        assert!(
            err.starts_with("Unauthenticated: ") && err.contains(reason),
            "{err}"
        );
        assert_eq!(rejected(&cluster), before + 1, "counted once: {err}");
    }
    let before = rejected(&cluster);
    let agent = cluster
        .start_agent(agent_config(&cluster, "edge-d", &site, Some(&cases[0].0)))
        .unwrap();
    wait_for("the agent's streams refused twice", DEADLINE, || {
        rejected(&cluster) >= before + 2
    })
    .await;
    assert_eq!(writes_for(&cluster, "edge-d"), 0);
    agent.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// --require-node-identity=false

/// With a client CA but node identity not required (a fleet moving to mTLS): an agent
/// without a certificate is let in; a presented certificate must still be a node's, and a
/// node certificate still binds its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_identity_admits_certless_agents_but_still_checks_certificates() {
    let site = Ca::new("site-ca");
    let cluster = mtls_cluster(&site, false).await;
    let certless = cluster
        .start_agent(agent_config(&cluster, "edge-g", &site, None))
        .unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "certless edge-g leased", |v| {
            v.lease(LEASE_NS, "edge-g").is_some()
        })
        .await
        .unwrap();
    cluster
        .wait_for_renewals("edge-g", 2, DEADLINE)
        .await
        .unwrap();

    let err = probe(
        &cluster,
        &site,
        Some(&site.client("edge-x", Some("system:nodes"))),
        "edge-x",
    )
    .await
    .unwrap_err();
    assert!(err.starts_with("Unauthenticated: "), "{err}");
    let ack = probe(&cluster, &site, Some(&site.node("edge-y")), "edge-z")
        .await
        .unwrap();
    assert_eq!(AckCode::try_from(ack.code).unwrap(), AckCode::Rejected);
    assert_eq!(
        writes_for(&cluster, "edge-x") + writes_for(&cluster, "edge-z"),
        0
    );
    certless.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// (5) what a handshake costs

/// Byte counts of a socket.
struct Counting<S> {
    inner: S,
    read: usize,
    written: usize,
}

impl<S: Read> Read for Counting<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n;
        Ok(n)
    }
}

impl<S: Write> Write for Counting<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Measures a full mTLS handshake (TLS 1.3, ECDSA P-256 certificates, one-certificate
/// chains, rustls on ring, no resumption) over loopback TCP with the same kind of material
/// the gateway and agents use: bytes each way and wall time per handshake (both sockets
/// TCP_NODELAY, as the gateway's and agent's are). Prints the numbers (`--nocapture`);
/// asserts only that the byte counts are sane.
#[test]
fn tls_handshake_cost_over_loopback() {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    let site = Ca::new("site-ca");
    let server = site.server();
    let node = site.node("edge-m");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = |pem: &str| {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    };
    let key = |pem: &str| PrivateKeyDer::from_pem_slice(pem.as_bytes()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(certs(&site.cert_pem));
    let roots = Arc::new(roots);
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()
    .unwrap();
    let server_config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs(&server.cert_pem), key(&server.key_pem))
            .unwrap(),
    );
    let client_config = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(certs(&node.cert_pem), key(&node.key_pem))
            .unwrap(),
    );

    const ROUNDS: u32 = 20;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = std::thread::spawn(move || {
        let mut bytes = (0, 0);
        for _ in 0..ROUNDS {
            let (socket, _) = listener.accept().unwrap();
            socket.set_nodelay(true).unwrap();
            let mut socket = Counting {
                inner: socket,
                read: 0,
                written: 0,
            };
            let mut tls = rustls::ServerConnection::new(server_config.clone()).unwrap();
            while tls.is_handshaking() {
                tls.complete_io(&mut socket).unwrap();
            }
            // Session tickets (TLS 1.3 sends them right after the handshake).
            while tls.wants_write() {
                tls.write_tls(&mut socket).unwrap();
            }
            assert_eq!(tls.peer_certificates().map(<[_]>::len), Some(1));
            bytes = (socket.read, socket.written);
        }
        bytes
    });
    #[allow(
        clippy::disallowed_methods,
        reason = "real handshakes on the wall clock, outside any tokio runtime"
    )]
    let started = Instant::now();
    for _ in 0..ROUNDS {
        let mut socket = std::net::TcpStream::connect(addr).unwrap();
        socket.set_nodelay(true).unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = rustls::ClientConnection::new(client_config.clone(), name).unwrap();
        while tls.is_handshaking() {
            tls.complete_io(&mut socket).unwrap();
        }
        assert_eq!(
            tls.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_3)
        );
    }
    let per_handshake = started.elapsed() / ROUNDS;
    let (client_to_server, server_to_client) = acceptor.join().unwrap();
    // The time depends on how ring and rustls were optimized: with this workspace's dev
    // profile they are not; `--config 'profile.dev.package."*".opt-level=3'` or --release
    // gives figures comparable to a release gateway.
    println!(
        "mTLS handshake over loopback (TLS 1.3, ECDSA P-256, rustls/ring): \
         {client_to_server} B client→server, {server_to_client} B server→client \
         (incl. session tickets), {per_handshake:?} per handshake (client side, mean of {ROUNDS})"
    );
    assert!(
        (500..8192).contains(&client_to_server),
        "{client_to_server}"
    );
    assert!(
        (500..8192).contains(&server_to_client),
        "{server_to_client}"
    );
}

/// The gateway's serving certificate replaced on disk (cert-manager renewing it into a
/// mounted Secret, here from another CA): new handshakes use the new one, the stream an
/// agent opened before goes on with no reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serving_certificate_replaced_on_disk_serves_new_handshakes_and_open_streams_go_on() {
    let site = Ca::new("site");
    let next = Ca::new("next serving CA");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let first = site.server();
    std::fs::write(&cert, &first.cert_pem).unwrap();
    std::fs::write(&key, &first.key_pem).unwrap();
    let mut grpc = edgebeat_tests::harness::mtls_options(&site);
    let initial = grpc.tls.clone().unwrap();
    let client_ca = site.cert_pem.clone().into_bytes();
    grpc.tls_updates = Some(edgebeat_gateway::reload::watch_files(
        vec![cert.clone(), key.clone()],
        Duration::from_millis(100),
        initial,
        move |files| {
            let tls = edgebeat_transports::grpc::GrpcServerTls {
                cert_pem: files[0].clone(),
                key_pem: files[1].clone(),
                client_ca_pem: Some(client_ca.clone()),
            };
            tls.check()?;
            Ok::<_, edgebeat_transports::tls::TlsError>(tls)
        },
    ));
    let cluster = Cluster::start_grpc_with(grpc, GatewayOptions::default())
        .await
        .unwrap();
    let mut before = agent_config(
        &cluster,
        "edge-before",
        &site,
        Some(&site.node("edge-before")),
    );
    before.healthz_bind_address = Some("127.0.0.1:0".parse().unwrap());
    let before = cluster.start_agent(before).unwrap();
    cluster
        .standin
        .wait_until(DEADLINE, "edge-before leased", |v| {
            v.lease(LEASE_NS, "edge-before").is_some()
        })
        .await
        .unwrap();

    // Renewed: a certificate from another CA, written as a Secret update would (the key
    // first: for a moment the pair does not match, and is refused until it does).
    let renewed = next.server();
    std::fs::write(&key, &renewed.key_pem).unwrap();
    std::fs::write(&cert, &renewed.cert_pem).unwrap();
    let after = agent_config(
        &cluster,
        "edge-after",
        &next,
        Some(&site.node("edge-after")),
    );
    let after = cluster.start_agent(after).unwrap();
    cluster
        .standin
        .wait_until(
            DEADLINE,
            "edge-after leased through the new certificate",
            |v| v.lease(LEASE_NS, "edge-after").is_some(),
        )
        .await
        .unwrap();
    // The old stream goes on: more renewals, and its agent never lost its registration.
    cluster
        .wait_for_renewals("edge-before", 3, DEADLINE)
        .await
        .unwrap();
    let addr = before.agent.observe_addr().unwrap();
    let (_, metrics) = edgebeat_tests::harness::http_get(addr, "/metrics")
        .await
        .unwrap();
    assert!(
        metrics.contains("edgebeat_agent_transport_reconnects_total 0"),
        "{metrics}"
    );
    // And a new connection that trusts only the old CA is refused now.
    let handshakes = cluster.rejections(RejectReason::TlsHandshake);
    let stale = agent_config(
        &cluster,
        "edge-stale",
        &site,
        Some(&site.node("edge-stale")),
    );
    let stale = cluster.start_agent(stale).unwrap();
    wait_for("the old CA's client refused", DEADLINE, || {
        cluster.rejections(RejectReason::TlsHandshake) > handshakes
    })
    .await;
    assert!(cluster.standin.lease(LEASE_NS, "edge-stale").is_none());
    for agent in [before, after, stale] {
        agent.stop().await.unwrap();
    }
}

/// A stream speaks with its client certificate only while it is valid: at its notAfter the
/// gateway ends the stream (counted as `certificate`); the agent's reconnection then fails
/// the handshake (the certificate expired), so nothing more is written for it while a
/// control agent renews. A stream whose certificate had expired went on renewing for
/// minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_when_its_client_certificate_expires() {
    let site = Ca::new("site-ca");
    let cluster = mtls_cluster(&site, true).await;
    let not_after = std::time::SystemTime::now() + Duration::from_secs(5);
    let leaf = site.node_until("edge-x", not_after);
    let agent = cluster
        .start_agent(agent_config(&cluster, "edge-x", &site, Some(&leaf)))
        .unwrap();
    cluster
        .wait_for_renewals("edge-x", 2, DEADLINE)
        .await
        .unwrap();
    let certificate = || {
        cluster
            .gateway()
            .counters
            .rejections(RejectReason::Certificate)
    };
    assert_eq!(certificate(), 0, "valid until its notAfter");
    wait_for("the expired stream ended", DEADLINE, || certificate() >= 1).await;
    let ended = std::time::SystemTime::now();
    let late = ended
        .duration_since(not_after)
        .unwrap_or_default()
        .as_secs_f64();
    eprintln!("stream ended {late:.2} s after the certificate's notAfter");
    assert!(late < 2.0, "ended {late:.2} s after notAfter");
    let written = writes_for(&cluster, "edge-x");
    // The gateway keeps working meanwhile, and the expired agent writes nothing more.
    control_agent_renews(&cluster, &site, "control-01").await;
    assert_eq!(
        writes_for(&cluster, "edge-x"),
        written,
        "nothing after expiry"
    );
    // Its next stream (on the same connection, or a new one whose handshake fails) is
    // refused too.
    wait_for("its next stream refused", DEADLINE, || {
        certificate() >= 2
            || cluster
                .gateway()
                .counters
                .rejections(RejectReason::TlsHandshake)
                >= 1
    })
    .await;
    assert_eq!(
        writes_for(&cluster, "edge-x"),
        written,
        "nothing after expiry"
    );
    agent.stop().await.unwrap();
}
