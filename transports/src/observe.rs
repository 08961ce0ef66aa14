//! Health, readiness and Prometheus metrics over HTTP/1.1, one small server for both binaries
//! (feature `observe`), and the process plumbing they share: one [`init_logging`], one
//! [`shutdown_signal`].
//!
//! | request          | answer                                                                     |
//! |------------------|----------------------------------------------------------------------------|
//! | `GET /healthz`   | `200 ok` while the server runs (it runs alongside the process's loops and stops with them) |
//! | `GET /readyz`    | `200 ok` when the readiness closure returns `Ok(())`, else `503` and its one-line reason |
//! | `GET /metrics`   | `200`, the registry in the OpenMetrics text format ([`METRICS_CONTENT_TYPE`], ends with `# EOF`); `503` until the registry is set |
//! | other path       | `404`                                                                      |
//! | other method     | `405` with `Allow: GET, HEAD` (on the three paths above)                   |
//!
//! `HEAD` is answered like `GET` without a body. Text bodies end with a newline. The server
//! is hyper 1's HTTP/1 connection driver on tokio, with no router: three paths do not need
//! one, and the agent's binary stays small. It is for a local scraper and kubelet-style
//! probes, and no client can hold the probes hostage ([`Slots`]): at most
//! [`MAX_CONNECTIONS`] connections at once and [`MAX_CONNECTIONS_PER_ADDRESS`] from one
//! address; a new connection is always taken, the oldest connection of the address that
//! holds the most making room for it (so whoever holds many connections only displaces its
//! own, and a prober's fresh connection is served); [`HEADER_READ_TIMEOUT`] to send a
//! request head, [`IDLE_TIMEOUT`] between requests, and a connection closes after
//! [`MAX_CONNECTION_AGE`] however busy (keep-alive is bounded).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Content type of `/metrics`: prometheus-client writes the OpenMetrics 1.0 text format
/// (which Prometheus asks for first and parses natively).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Content type of the plain-text answers (`ok`, reasons, errors).
const TEXT: &str = "text/plain; charset=utf-8";

/// Most connections served at once (a scraper and a prober need two); a further one makes
/// room for itself ([`Slots`]).
pub const MAX_CONNECTIONS: usize = 32;

/// Most connections from one IP address; a further one closes that address's oldest.
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 4;

/// Time a connection may sit between requests before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);

/// Age after which a connection is closed once its request in progress is answered, however
/// busy it keeps (a client asking every few seconds never goes idle).
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(60);

/// Time a client has to send its request head before the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long shutdown waits for requests in progress to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Pause after an accept error that is not about one connection (e.g. out of file
/// descriptors), so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What `/metrics` encodes: a [`Registry`], or a [`OnceLock`] of one for a process that
/// answers probes before its metrics exist (`/metrics` answers `503` until it is set).
pub trait Exposition: Send + Sync + 'static {
    /// The registry to encode, if there is one yet.
    fn registry(&self) -> Option<&Registry>;
}

impl Exposition for Registry {
    fn registry(&self) -> Option<&Registry> {
        Some(self)
    }
}

impl Exposition for OnceLock<Registry> {
    fn registry(&self) -> Option<&Registry> {
        self.get()
    }
}

/// Serves `/healthz`, `/readyz` and `/metrics` (see the module docs) on `listener` until
/// `shutdown` resolves, then stops accepting, lets requests in progress finish (up to 2 s)
/// and returns `Ok(())`.
///
/// - `registry` is encoded on every `/metrics` request (collectors run then); until it is
///   set ([`Exposition`]), `/metrics` answers `503 metrics not registered yet`: a process
///   that must answer probes before its metrics exist (the gateway, while it reaches the
///   apiserver) serves a [`OnceLock`] and sets it later.
/// - `ready` is called on every `/readyz` request: `Ok(())` answers `200 ok`, `Err(reason)`
///   answers `503` with `reason` (one line; the caller keeps it short). It must not block.
///
/// Takes a bound listener (not an address) so callers report bind errors themselves and tests
/// bind port 0.
///
/// Errors: the listener's error when it is unusable at start (it has no local address).
/// Errors accepting one connection are logged and serving goes on; they never end the
/// server.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<impl Exposition>,
    ready: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let local = listener.local_addr()?;
    tracing::debug!(addr = %local, "observe server listening");
    let ready: Readiness = Arc::new(ready);
    let registry: Arc<dyn Exposition> = registry;
    let closing = CancellationToken::new();
    let mut connections = JoinSet::new();
    let mut slots: Slots = Slots::default();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            Some(done) = connections.join_next_with_id(), if !connections.is_empty() => {
                let id = match done {
                    Ok((id, ())) => id,
                    Err(error) => error.id(),
                };
                slots.remove(id);
                continue;
            }
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) if per_connection(&error) => {
                tracing::debug!(%error, "observe server: accept failed");
                continue;
            }
            Err(error) => {
                tracing::warn!(%error, addr = %local, "observe server: accept failed; pausing");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        for evicted in slots.make_room(peer.ip()) {
            tracing::debug!(%peer, "observe server: closing an older connection to make room");
            evicted.abort();
        }
        let handle = connections.spawn(connection(
            stream,
            registry.clone(),
            ready.clone(),
            closing.clone(),
        ));
        slots.insert(peer.ip(), handle);
    }
    closing.cancel();
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_TIMEOUT, drained).await.is_err() {
        tracing::debug!("observe server: closing connections still busy at shutdown");
    }
    // Dropping the JoinSet aborts whatever is left.
    Ok(())
}

/// Accept errors that concern only the connection being accepted.
fn per_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
    )
}

async fn connection(
    stream: TcpStream,
    registry: Arc<dyn Exposition>,
    ready: Readiness,
    closing: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(tokio::sync::Notify::new());
    let active = activity.clone();
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        active.notify_one();
        let response = answer(
            request.method(),
            request.uri().path(),
            registry.registry(),
            &*ready,
        );
        std::future::ready(Ok::<_, Infallible>(response))
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let too_old = tokio::time::sleep(MAX_CONNECTION_AGE);
    tokio::pin!(too_old);
    let result = loop {
        let idle = tokio::time::sleep(IDLE_TIMEOUT);
        tokio::select! {
            result = conn.as_mut() => break result,
            () = activity.notified() => continue,
            // Finish the request in progress, if any, then close (idle keep-alive
            // connections close at once).
            () = closing.cancelled() => {}
            () = &mut too_old => {}
            () = idle => {}
        }
        conn.as_mut().graceful_shutdown();
        break conn.await;
    };
    if let Err(error) = result {
        tracing::debug!(%error, "observe server: connection ended with an error");
    }
}

/// The observe server's connections by peer address, and which to close for a new one: the
/// oldest of the new one's own address when it holds [`MAX_CONNECTIONS_PER_ADDRESS`], else,
/// when [`MAX_CONNECTIONS`] are open, the oldest of the address that holds the most. I/O
/// free: `H` is what closes a connection (a task's `AbortHandle` in the server).
#[derive(Debug)]
pub struct Slots<H = tokio::task::AbortHandle> {
    open: Vec<(std::net::IpAddr, H)>,
}

impl<H> Default for Slots<H> {
    fn default() -> Self {
        Self { open: Vec::new() }
    }
}

/// A handle that names its connection ([`Slots::remove`]).
pub trait SlotId {
    /// What names a connection.
    type Id: PartialEq;
    /// The connection's identity.
    fn slot_id(&self) -> Self::Id;
}

impl SlotId for tokio::task::AbortHandle {
    type Id = tokio::task::Id;
    fn slot_id(&self) -> tokio::task::Id {
        self.id()
    }
}

impl<H: SlotId> Slots<H> {
    /// Removes and returns the connections to close before one from `ip` is taken (none,
    /// or one).
    pub fn make_room(&mut self, ip: std::net::IpAddr) -> Vec<H> {
        let own = self.open.iter().filter(|(a, _)| *a == ip).count();
        let victim = if own >= MAX_CONNECTIONS_PER_ADDRESS {
            Some(ip)
        } else if self.open.len() >= MAX_CONNECTIONS {
            self.busiest()
        } else {
            None
        };
        // `open` is in the order connections came: the first of an address is its oldest.
        victim
            .and_then(|victim| self.open.iter().position(|(a, _)| *a == victim))
            .map(|i| vec![self.open.remove(i).1])
            .unwrap_or_default()
    }

    /// The address holding the most connections (of those, the one whose oldest came first).
    fn busiest(&self) -> Option<std::net::IpAddr> {
        let mut best: Option<(usize, std::net::IpAddr)> = None;
        for (ip, _) in &self.open {
            let n = self.open.iter().filter(|(a, _)| a == ip).count();
            if best.is_none_or(|(most, _)| n > most) {
                best = Some((n, *ip));
            }
        }
        best.map(|(_, ip)| ip)
    }

    /// Records a connection from `ip`.
    pub fn insert(&mut self, ip: std::net::IpAddr, handle: H) {
        self.open.push((ip, handle));
    }

    /// Forgets the connection `id` (it ended).
    pub fn remove(&mut self, id: H::Id) {
        self.open.retain(|(_, h)| h.slot_id() != id);
    }

    /// Connections open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// The answer to `method path` (pure apart from running `ready` and the registry's
/// collectors).
fn answer(
    method: &Method,
    path: &str,
    registry: Option<&Registry>,
    ready: &(dyn Fn() -> Result<(), String> + Send + Sync),
) -> Response<Full<Bytes>> {
    let known = matches!(path, "/healthz" | "/readyz" | "/metrics");
    if !known {
        return text(
            StatusCode::NOT_FOUND,
            "not found: try /healthz, /readyz or /metrics",
        );
    }
    if method != Method::GET && method != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/healthz" => text(StatusCode::OK, "ok"),
        "/readyz" => match ready() {
            Ok(()) => text(StatusCode::OK, "ok"),
            Err(reason) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                reason.lines().next().unwrap_or("not ready"),
            ),
        },
        _ => {
            let Some(registry) = registry else {
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "metrics not registered yet",
                );
            };
            let mut body = String::with_capacity(4096);
            match prometheus_client::encoding::text::encode(&mut body, registry) {
                Ok(()) => respond(StatusCode::OK, METRICS_CONTENT_TYPE, body),
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "could not encode the metrics",
                ),
            }
        }
    }
}

fn text(status: StatusCode, line: &str) -> Response<Full<Bytes>> {
    let mut body = String::with_capacity(line.len() + 1);
    body.push_str(line);
    body.push('\n');
    respond(status, TEXT, body)
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The process's own metrics, as every Prometheus client library exports them
/// (client_golang's `process` collector): `process_cpu_seconds_total` (user + system CPU,
/// seconds), `process_resident_memory_bytes` (RSS, bytes), `process_start_time_seconds`
/// (Unix seconds) and `process_open_fds`. Read from procfs at scrape time (proc(5):
/// `/proc/self/stat` fields 14, 15 and 22 in clock ticks, `/proc/self/status` `VmRSS` in
/// KiB, `/proc/stat` `btime`, the entries of `/proc/self/fd`). Register it with
/// `registry.register_collector(Box::new(ProcessCollector))`.
///
/// Clock ticks are taken as 100 per second (`USER_HZ`, which the kernel fixes at 100 for
/// user space on every architecture edgebeat builds for), as prometheus/procfs does
/// (`proc_stat.go: userHZ`) rather than calling `sysconf` through unsafe code. A series
/// whose file cannot be read (no procfs) is left out of the scrape; the others stay.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessCollector;

/// Clock ticks per second in `/proc/self/stat` (`USER_HZ`).
const USER_HZ: f64 = 100.0;

/// What [`ProcessCollector`] reads, `None` for what could not be read.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    /// User + system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size, bytes.
    pub resident_bytes: Option<u64>,
    /// Start time, Unix seconds.
    pub start_time_seconds: Option<f64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
}

impl ProcessStats {
    /// Reads this process's figures from `/proc` (see [`ProcessCollector`]).
    pub fn read() -> Self {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let fields = stat.as_deref().and_then(stat_fields);
        let btime = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        Self {
            cpu_seconds: fields.map(|(utime, stime, _)| (utime + stime) as f64 / USER_HZ),
            resident_bytes: std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| vm_rss_bytes(&s)),
            start_time_seconds: fields
                .zip(btime)
                .map(|((_, _, start), btime)| btime as f64 + start as f64 / USER_HZ),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|dir| dir.count() as u64),
        }
    }
}

/// `utime`, `stime` and `starttime` (fields 14, 15 and 22 of proc(5)'s `/proc/pid/stat`,
/// clock ticks). Fields are counted after the command name's closing parenthesis, since the
/// name itself may hold spaces and parentheses.
fn stat_fields(stat: &str) -> Option<(u64, u64, u64)> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // After the name come field 3 (state) onwards.
    let mut fields = after_comm.split_ascii_whitespace();
    let field = |fields: &mut std::str::SplitAsciiWhitespace<'_>, skip: usize| {
        fields.nth(skip).and_then(|f| f.parse::<u64>().ok())
    };
    let utime = field(&mut fields, 14 - 3)?;
    let stime = field(&mut fields, 0)?;
    let start = field(&mut fields, 22 - 15 - 1)?;
    Some((utime, stime, start))
}

/// `VmRSS` of `/proc/pid/status` in bytes (the file says kB: KiB).
fn vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line["VmRSS:".len()..]
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// `btime` of `/proc/stat`: the boot time, Unix seconds.
fn boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric as _;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        use prometheus_client::registry::Unit;
        let stats = ProcessStats::read();
        if let Some(cpu) = stats.cpu_seconds {
            let counter = ConstCounter::new(cpu);
            let metric = encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds.",
                Some(&Unit::Seconds),
                counter.metric_type(),
            )?;
            counter.encode(metric)?;
        }
        let gauges = [
            (
                "process_resident_memory",
                "Resident memory size in bytes.",
                Some(Unit::Bytes),
                stats.resident_bytes.map(|b| b as f64),
            ),
            (
                "process_start_time",
                "Start time of the process since unix epoch in seconds.",
                Some(Unit::Seconds),
                stats.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                stats.open_fds.map(|n| n as f64),
            ),
        ];
        for (name, help, unit, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(value);
            let metric =
                encoder.encode_descriptor(name, help, unit.as_ref(), gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

/// Where a binary's log lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTo {
    /// Standard output (the gateway: a container's log).
    Stdout,
    /// Standard error (the agent, whose `--once` prints JSON on standard output).
    Stderr,
}

/// How log lines are written (`--log-format` of both binaries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// tracing-subscriber's `fmt` lines: `2026-11-25T10:00:00.123456Z  INFO target: message
    /// key=value…`, coloured only on a terminal (see [`init_logging`]).
    #[default]
    Text,
    /// One JSON object per line (tracing-subscriber's `json` format, event flattened):
    /// `timestamp`, `level`, `target`, `message` and every field of the event as keys, the
    /// innermost span under `span` and all open spans under `spans`. For log shippers
    /// (Loki, Elasticsearch, journald's `MESSAGE`).
    Json,
}

/// A `--log-format` value that is neither `text` nor `json`.
#[derive(Debug, thiserror::Error)]
#[error("unknown log format {0:?}: use text or json")]
pub struct UnknownLogFormat(String);

impl std::str::FromStr for LogFormat {
    type Err = UnknownLogFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(UnknownLogFormat(other.to_owned())),
        }
    }
}

/// Whether log lines to a stream that `is_terminal` may carry ANSI colour escapes: only on
/// a terminal, and only while `NO_COLOR` (`no_color`, its value) is unset or empty, as
/// <https://no-color.org> asks. Files, pipes, `kubectl logs` and journald get plain text.
pub fn colour(is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs the process's log subscriber, the same for both binaries: lines in `format`,
/// filtered by `filter` (a level such as `info`, or `target=level,…`: tracing-subscriber's
/// `Targets` syntax), written to `to`. Text lines are coloured only when `to` is a terminal
/// and `NO_COLOR` is unset ([`colour`]); JSON lines never are.
///
/// Errors: why `filter` does not parse. Nothing is installed then.
pub fn init_logging(
    filter: &str,
    to: LogTo,
    format: LogFormat,
) -> Result<(), tracing_subscriber::filter::ParseError> {
    use std::io::IsTerminal as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let targets: tracing_subscriber::filter::Targets = filter.parse()?;
    let terminal = match to {
        LogTo::Stdout => std::io::stdout().is_terminal(),
        LogTo::Stderr => std::io::stderr().is_terminal(),
    };
    let ansi = colour(terminal, std::env::var_os("NO_COLOR").as_deref());
    let writer = || match to {
        LogTo::Stdout => BoxMakeWriter::new(std::io::stdout),
        LogTo::Stderr => BoxMakeWriter::new(std::io::stderr),
    };
    let layer = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(writer())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_ansi(false)
            .with_writer(writer())
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(layer.with_filter(targets))
        .init();
    Ok(())
}

/// The one line either binary prints for the error it stops with: `error`'s text, then
/// each cause's (`source()`) that the text before it does not already hold, joined by
/// `: `. edgebeat's errors put their cause in their own text for logs (`%error`) and
/// also return it as `source()`; printing the whole chain, as `anyhow`'s `{:?}` does,
/// would say every cause twice.
pub fn error_report(error: &(dyn std::error::Error + 'static)) -> String {
    let mut report = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !report.contains(&text) {
            report.push_str(": ");
            report.push_str(&text);
        }
        cause = c.source();
    }
    report
}

/// How either binary ends: status 0, or its error's [`error_report`] on standard error,
/// after `Error: `, and status 1.
pub fn exit_code<E: AsRef<dyn std::error::Error + 'static>>(
    result: Result<(), E>,
) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {}", error_report(error.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT): what stops either binary, whether systemd or the
/// kubelet sends SIGTERM or someone presses Ctrl-C. When SIGTERM cannot be listened for, logs
/// a warning and waits for Ctrl-C alone.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the process");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
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
    async fn request(
        addr: std::net::SocketAddr,
        method: &str,
        path: &str,
    ) -> (u16, String, String) {
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
            TcpStream::connect(addr).await.is_err(),
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
            slots.insert(ip(from), next);
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
        assert!(late.set(registry).is_ok());
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
}
