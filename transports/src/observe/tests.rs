use super::process::{boot_time, stat_fields, vm_rss_bytes};
use std::io;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::*;
use prometheus_client::metrics::counter::Counter;

#[test]
fn process_figures_parse_from_procfs_text() {
    // A command name with a space and a parenthesis, as `comm` may hold.
    let stat = "4242 (edge (gw) x) S 1 4242 4242 0 -1 4194560 1500 0 0 0 \
                250 75 0 0 20 0 9 0 123456 27000000 3000 18446744073709551615";
    assert_eq!(stat_fields(stat), Some((250, 75, 123456)));
    assert_eq!(stat_fields("garbage"), None);
    let status = "Name:\tedgebeat\nVmPeak:\t  9000 kB\nVmRSS:\t    5120 kB\n";
    assert_eq!(vm_rss_bytes(status), Some(5 * 1024 * 1024));
    assert_eq!(vm_rss_bytes("Name: x\n"), None);
    assert_eq!(
        boot_time("cpu 1 2 3\nbtime 1764000000\nprocesses 9\n"),
        Some(1764000000)
    );
    // This process, read for real.
    let me = ProcessStats::read();
    assert!(me.resident_bytes.is_some_and(|b| b > 1024 * 1024), "{me:?}");
    assert!(me.open_fds.is_some_and(|n| n >= 3), "{me:?}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = me.start_time_seconds.unwrap();
    assert!(
        started <= now + 1.0 && started > now - 3600.0,
        "{started} vs {now}"
    );
}

#[test]
fn colour_only_on_a_terminal_without_no_color() {
    use std::ffi::OsStr;
    assert!(colour(true, None));
    assert!(
        colour(true, Some(OsStr::new(""))),
        "an empty NO_COLOR is unset"
    );
    assert!(!colour(true, Some(OsStr::new("1"))));
    assert!(!colour(false, None), "a file or a pipe");
}

#[test]
fn log_formats_parse_and_others_are_named() {
    assert_eq!("text".parse::<LogFormat>().unwrap(), LogFormat::Text);
    assert_eq!("json".parse::<LogFormat>().unwrap(), LogFormat::Json);
    let bad = "JSON5".parse::<LogFormat>().unwrap_err().to_string();
    assert!(
        bad.contains("JSON5") && bad.contains("text or json"),
        "{bad}"
    );
}
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 request on a fresh connection; returns (status, headers, body).
async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

/// A chain whose every level says its cause (as edgebeat's errors do) reads once; a
/// level that does not say it gets it appended.
#[test]
fn error_report_says_each_cause_once() {
    #[derive(Debug, thiserror::Error)]
    #[error("reading /proc/meminfo: {0}")]
    struct Says(#[source] std::io::Error);
    #[derive(Debug, thiserror::Error)]
    #[error("starting")]
    struct Silent(#[source] Says);
    let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
    assert_eq!(error_report(&Says(io())), "reading /proc/meminfo: gone");
    assert_eq!(
        error_report(&Silent(Says(io()))),
        "starting: reading /proc/meminfo: gone"
    );
}

#[tokio::test]
async fn serves_health_readiness_metrics_and_404() {
    let mut registry = Registry::default();
    let counter: Counter = Counter::default();
    registry.register("edgebeat_test_things", "Things counted", counter.clone());
    counter.inc_by(3);
    let ready = Arc::new(AtomicBool::new(false));
    let flag = ready.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let server = tokio::spawn(serve(
        listener,
        Arc::new(registry),
        move || {
            if flag.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err("not registered yet\nsecond line dropped".into())
            }
        },
        stop.clone().cancelled_owned(),
    ));

    assert_eq!(request(addr, "GET", "/healthz").await.0, 200);
    assert_eq!(request(addr, "GET", "/healthz").await.2, "ok\n");

    let (status, _, body) = request(addr, "GET", "/readyz").await;
    assert_eq!((status, body.as_str()), (503, "not registered yet\n"));
    ready.store(true, Ordering::SeqCst);
    let (status, _, body) = request(addr, "GET", "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));

    let (status, head, body) = request(addr, "GET", "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("content-type: {METRICS_CONTENT_TYPE}")),
        "{head}"
    );
    assert!(
        body.contains("# TYPE edgebeat_test_things counter"),
        "{body}"
    );
    assert!(body.contains("edgebeat_test_things_total 3\n"), "{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");

    assert_eq!(request(addr, "GET", "/").await.0, 404);
    assert_eq!(request(addr, "GET", "/metricsx").await.0, 404);
    let (status, head, _) = request(addr, "POST", "/metrics").await;
    assert_eq!(status, 405);
    assert!(
        head.to_ascii_lowercase().contains("allow: get, head"),
        "{head}"
    );
    let (status, _, body) = request(addr, "HEAD", "/healthz").await;
    assert_eq!((status, body.as_str()), (200, ""));

    stop.cancel();
    server.await.unwrap().unwrap();
    assert!(
        TcpStream::connect(addr)
            .await
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
        "the listener is closed after shutdown"
    );
}

impl SlotId for u32 {
    type Id = u32;
    fn slot_id(&self) -> u32 {
        *self
    }
}

fn ip(last: u8) -> std::net::IpAddr {
    std::net::IpAddr::from([127, 0, 0, last])
}

#[test]
fn a_new_connection_displaces_only_the_busiest_address() {
    let mut slots: Slots<u32> = Slots::default();
    let mut next = 0;
    let mut open = |slots: &mut Slots<u32>, from: u8| {
        let evicted = slots.make_room(ip(from));
        slots.insert(ip(from), next, Succeeded::default());
        next += 1;
        evicted
    };
    // One address: its fifth connection closes its first.
    for _ in 0..MAX_CONNECTIONS_PER_ADDRESS {
        assert!(open(&mut slots, 1).is_empty());
    }
    assert_eq!(open(&mut slots, 1), vec![0]);
    // Fill the server from seven more addresses, four each.
    for from in 2..=8 {
        for _ in 0..MAX_CONNECTIONS_PER_ADDRESS {
            assert!(open(&mut slots, from).is_empty());
        }
    }
    assert_eq!(slots.len(), MAX_CONNECTIONS);
    // A prober's connection: the oldest of the first busiest address makes room.
    assert_eq!(open(&mut slots, 9), vec![1]);
    // Its next one too, from the next busiest (address 1 now holds three).
    assert_eq!(open(&mut slots, 9), vec![5]);
    assert_eq!(slots.len(), MAX_CONNECTIONS);
    // A connection that ended frees its slot.
    slots.remove(2);
    assert_eq!(slots.len(), MAX_CONNECTIONS - 1);
    assert!(open(&mut slots, 10).is_empty());
}

/// Another server's limits (the gateway's resource metrics server): one address beyond
/// its share closes its own oldest; a full server closes the busiest address's oldest.
#[test]
fn slots_keep_the_limits_they_are_given() {
    let mut slots: Slots<u32> = Slots::new(3, 2);
    for (id, from) in [(0, 1), (1, 1)] {
        assert!(slots.make_room(ip(from)).is_empty());
        slots.insert(ip(from), id, Succeeded::default());
    }
    assert_eq!(slots.make_room(ip(1)), vec![0], "address 1 holds its 2");
    slots.insert(ip(1), 2, Succeeded::default());
    assert!(slots.make_room(ip(2)).is_empty());
    slots.insert(ip(2), 3, Succeeded::default());
    assert_eq!(
        slots.make_room(ip(3)),
        vec![1],
        "full: address 1 holds the most"
    );
}

/// Connections churned by many addresses (one each, as from 300 source addresses) fill a
/// full server: each new one closes the oldest connection not yet served a success, never
/// a scraper's long-lived connection that was; only when all were, the oldest goes.
#[test]
fn a_connection_that_succeeded_is_closed_last() {
    let mut slots: Slots<u32> = Slots::new(3, 2);
    let scraper = Succeeded::default();
    assert!(slots.make_room(ip(1)).is_empty());
    slots.insert(ip(1), 0, scraper.clone());
    scraper.mark();
    for (id, from) in [(1, 2), (2, 3)] {
        assert!(slots.make_room(ip(from)).is_empty());
        slots.insert(ip(from), id, Succeeded::default());
    }
    // Full, one connection per address: the oldest not yet succeeded goes, not the
    // scraper's (the oldest of all).
    for (id, from) in (3..20).zip(4u8..) {
        let evicted = slots.make_room(ip(from));
        assert_eq!(evicted, vec![id - 2], "connection {id} from address {from}");
        slots.insert(ip(from), id, Succeeded::default());
    }
    assert_eq!(slots.len(), 3);
    // Every connection succeeded: the oldest goes, the scraper's.
    let all: Vec<Succeeded> = (0..2).map(|_| Succeeded::default()).collect();
    let mut full: Slots<u32> = Slots::new(3, 2);
    full.insert(ip(1), 0, scraper.clone());
    full.insert(ip(2), 1, all[0].clone());
    full.insert(ip(3), 2, all[1].clone());
    all.iter().for_each(Succeeded::mark);
    assert_eq!(full.make_room(ip(4)), vec![0]);
}

/// The address over its share closes its own oldest connection not yet succeeded; its
/// connection that succeeded goes only when all its connections did.
#[test]
fn an_address_over_its_share_keeps_its_connection_that_succeeded() {
    let mut slots: Slots<u32> = Slots::new(10, 2);
    let served = Succeeded::default();
    slots.insert(ip(1), 0, served.clone());
    served.mark();
    slots.insert(ip(1), 1, Succeeded::default());
    assert_eq!(slots.make_room(ip(1)), vec![1]);
    let also = Succeeded::default();
    slots.insert(ip(1), 2, also.clone());
    also.mark();
    assert_eq!(
        slots.make_room(ip(1)),
        vec![0],
        "both succeeded: the oldest"
    );
}

/// Among connections not yet succeeded, the address holding the most of them gives one up
/// first (a flood from one address displaces its own).
#[test]
fn a_full_server_closes_from_the_address_with_most_connections_not_yet_succeeded() {
    let mut slots: Slots<u32> = Slots::new(4, 4);
    let scraper = Succeeded::default();
    slots.insert(ip(1), 0, scraper.clone());
    scraper.mark();
    slots.insert(ip(2), 1, Succeeded::default());
    slots.insert(ip(3), 2, Succeeded::default());
    slots.insert(ip(3), 3, Succeeded::default());
    assert_eq!(
        slots.make_room(ip(4)),
        vec![2],
        "address 3 holds two not yet succeeded"
    );
}

/// Opens connections from `from` to `addr` and asks `GET /metrics` on each every
/// 500 ms, opening another when one is closed, until `until`.
async fn hold(from: std::net::IpAddr, addr: SocketAddr, until: tokio::time::Instant) {
    while tokio::time::Instant::now() < until {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(from, 0)).unwrap();
        let Ok(mut stream) = socket.connect(addr).await else {
            continue;
        };
        let mut buf = vec![0; 64 * 1024];
        while tokio::time::Instant::now() < until {
            let asked = stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
                .await;
            if asked.is_err() || matches!(stream.read(&mut buf).await, Ok(0) | Err(_)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET path` from `from` on a fresh connection, within 1 s: the status code.
async fn probe(from: std::net::IpAddr, addr: SocketAddr, path: &str) -> Option<u16> {
    let asked = async {
        let socket = tokio::net::TcpSocket::new_v4().ok()?;
        socket.bind(SocketAddr::new(from, 0)).ok()?;
        let mut stream = socket.connect(addr).await.ok()?;
        let head = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        std::str::from_utf8(&raw)
            .ok()?
            .split(' ')
            .nth(1)?
            .parse()
            .ok()
    };
    tokio::time::timeout(Duration::from_secs(1), asked)
        .await
        .ok()?
}

/// A server of an empty registry, always ready, on a port of its own.
async fn ready_server() -> (
    SocketAddr,
    CancellationToken,
    tokio::task::JoinHandle<io::Result<()>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let server = tokio::spawn(serve(
        listener,
        Arc::new(Registry::default()),
        || Ok(()),
        stop.clone().cancelled_owned(),
    ));
    (addr, stop, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_while_many_clients_hold_connections() {
    let (addr, stop, server) = ready_server().await;
    // 64 connections from 127.0.0.1 and 16 from each of 127.0.0.2 to .9, for 4 s.
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    let mut holders = JoinSet::new();
    for _ in 0..64 {
        holders.spawn(hold(ip(1), addr, until));
    }
    for from in 2..=9 {
        for _ in 0..16 {
            holders.spawn(hold(ip(from), addr, until));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // kubelet's probes from the node's address, and the monitoring scrape from another.
    let mut answered = Vec::new();
    while tokio::time::Instant::now() + Duration::from_millis(200) < until {
        answered.push(probe(ip(10), addr, "/healthz").await);
        answered.push(probe(ip(10), addr, "/readyz").await);
        answered.push(probe(ip(11), addr, "/metrics").await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered.len() >= 30, "{} probes", answered.len());
    assert!(
        answered.iter().all(|a| *a == Some(200)),
        "every probe answered 200 within 1 s: {answered:?}"
    );
    while holders.join_next().await.is_some() {}
    stop.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn idle_and_old_connections_are_closed() {
    let (addr, stop, server) = ready_server().await;
    let mut buf = vec![0; 4096];
    // Idle: closed after IDLE_TIMEOUT without a request.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    assert!(idle.read(&mut buf).await.unwrap() > 0);
    tokio::time::sleep(IDLE_TIMEOUT + Duration::from_secs(1)).await;
    assert_eq!(idle.read(&mut buf).await.unwrap(), 0, "closed when idle");
    // Busy: a request every 5 s still ends at MAX_CONNECTION_AGE.
    let mut busy = TcpStream::connect(addr).await.unwrap();
    let opened = tokio::time::Instant::now();
    let closed_after = loop {
        let asked = busy
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
            .await;
        if asked.is_err() || matches!(busy.read(&mut buf).await, Ok(0) | Err(_)) {
            break opened.elapsed();
        }
        assert!(opened.elapsed() < MAX_CONNECTION_AGE * 2, "never closed");
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    assert!(
        closed_after >= MAX_CONNECTION_AGE && closed_after < MAX_CONNECTION_AGE + IDLE_TIMEOUT,
        "{closed_after:?}"
    );
    stop.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn metrics_wait_for_a_late_registry_while_health_answers() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let late = Arc::new(OnceLock::new());
    let stop = CancellationToken::new();
    let server = tokio::spawn(serve(
        listener,
        late.clone(),
        || Err("starting".into()),
        stop.clone().cancelled_owned(),
    ));
    assert_eq!(request(addr, "GET", "/healthz").await.0, 200);
    let (status, _, body) = request(addr, "GET", "/metrics").await;
    assert_eq!(
        (status, body.as_str()),
        (503, "metrics not registered yet\n")
    );

    let mut registry = Registry::default();
    let counter: Counter = Counter::default();
    registry.register("edgebeat_test_late", "Registered late", counter);
    late.set(registry)
        .unwrap_or_else(|_| panic!("the registry was set once before"));
    let (status, _, body) = request(addr, "GET", "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("edgebeat_test_late_total 0"), "{body}");
    stop.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_closes_idle_keep_alive_connections() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let server = tokio::spawn(serve(
        listener,
        Arc::new(Registry::default()),
        || Ok(()),
        stop.clone().cancelled_owned(),
    ));
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0; 1024];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    // The connection stays open (keep-alive) until shutdown closes it.
    stop.cancel();
    server.await.unwrap().unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
}
