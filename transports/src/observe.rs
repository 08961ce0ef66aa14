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
use prometheus_client::registry::{Metric, Registry, Unit};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

mod process;

pub use process::{ProcessCollector, ProcessStats};

/// Registers `metric` in `registry` as the family `name` with `help`, in `unit` when one is
/// given (prometheus-client then appends `_<unit>` to the name, and `_total` to a counter's).
/// One call for [`Registry::register`] and [`Registry::register_with_unit`], so that a
/// binary's families read as a table, one a line.
pub fn register_family(
    registry: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    metric: impl Metric,
) {
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, metric),
        None => registry.register(name, help, metric),
    }
}

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
    let ready: Readiness = Arc::new(ready);
    let registry: Arc<dyn Exposition> = registry;
    accept_connections(
        listener,
        Slots::default(),
        "observe server",
        shutdown,
        // The observe server marks no connection: the oldest make room.
        |stream, _, _, closing| connection(stream, registry.clone(), ready.clone(), closing),
    )
    .await
}

/// The accept loop of a server on `listener` (named `what` in logs) until `shutdown`
/// resolves: each connection is taken ([`accepted_or_pause`]), room made for it by closing
/// what `slots` names ([`Slots::make_room`]), and served by `connection(stream, peer,
/// succeeded, closing)` in a task of its own (`succeeded`: the connection's mark in
/// `slots`, for the connection to set when it serves a success); then the closing signal
/// goes out and the connections drain ([`drain`]).
///
/// # Errors
/// The listener's error when it has no local address.
pub async fn accept_connections<F, C>(
    listener: TcpListener,
    mut slots: Slots,
    what: &str,
    shutdown: impl Future<Output = ()> + Send,
    mut connection: F,
) -> io::Result<()>
where
    F: FnMut(TcpStream, std::net::SocketAddr, Succeeded, CancellationToken) -> C,
    C: Future<Output = ()> + Send + 'static,
{
    let local = listener.local_addr()?;
    tracing::debug!(addr = %local, "{what} listening");
    let closing = CancellationToken::new();
    let mut connections = JoinSet::new();
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
        let Some((stream, peer)) = accepted_or_pause(accepted, local, what).await else {
            continue;
        };
        for evicted in slots.make_room(peer.ip()) {
            tracing::debug!(%peer, "{what}: closing an older connection to make room");
            evicted.abort();
        }
        let succeeded = Succeeded::default();
        let handle =
            connections.spawn(connection(stream, peer, succeeded.clone(), closing.clone()));
        slots.insert(peer.ip(), handle, succeeded);
    }
    closing.cancel();
    drain(connections, what).await;
    Ok(())
}

/// Waits up to 2 s for the connections of a server that stopped accepting to finish their
/// requests in progress (after its closing signal), then aborts what is left (named `what`
/// in the debug log).
async fn drain<T: 'static>(mut connections: JoinSet<T>, what: &str) {
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_TIMEOUT, drained).await.is_err() {
        tracing::debug!("{what}: closing connections still busy at shutdown");
    }
    // Dropping the JoinSet aborts whatever is left.
}

/// The connection of an accept `result` of the listener on `local`; `None` after an error,
/// logged as `what`'s: at once when it concerns that connection only ([`per_connection`]),
/// after a pause when it concerns the listener (out of file descriptors), so that the
/// accept loop does not spin.
async fn accepted_or_pause(
    result: io::Result<(TcpStream, std::net::SocketAddr)>,
    local: std::net::SocketAddr,
    what: &str,
) -> Option<(TcpStream, std::net::SocketAddr)> {
    match result {
        Ok(accepted) => Some(accepted),
        Err(error) if per_connection(&error) => {
            tracing::debug!(%error, "{what}: accept failed");
            None
        }
        Err(error) => {
            tracing::warn!(%error, addr = %local, "{what}: accept failed; pausing");
            tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            None
        }
    }
}

/// Whether an accept error concerns only the connection being accepted (the server goes on
/// at once), rather than the listener (out of file descriptors: the server pauses).
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
    let result = drive_connection(
        conn,
        |conn| conn.graceful_shutdown(),
        &activity,
        &closing,
        IDLE_TIMEOUT,
        MAX_CONNECTION_AGE,
    )
    .await;
    if let Err(error) = result {
        tracing::debug!(%error, "observe server: connection ended with an error");
    }
}

/// Drives one HTTP connection `conn` (a hyper connection future) to its end, with its
/// lifetime bounded: when `closing` fires, after `idle` without a request (`activity` is
/// notified at each), or at `max_age` however busy, `graceful_shutdown` asks it to answer
/// the request in progress, if any, and close (an idle keep-alive connection closes at
/// once).
///
/// # Errors
/// The connection's own, as it ends.
pub async fn drive_connection<C, E>(
    conn: C,
    graceful_shutdown: impl FnOnce(std::pin::Pin<&mut C>),
    activity: &tokio::sync::Notify,
    closing: &CancellationToken,
    idle: Duration,
    max_age: Duration,
) -> Result<(), E>
where
    C: Future<Output = Result<(), E>>,
{
    tokio::pin!(conn);
    let too_old = tokio::time::sleep(max_age);
    tokio::pin!(too_old);
    loop {
        let idle = tokio::time::sleep(idle);
        tokio::select! {
            result = conn.as_mut() => return result,
            () = activity.notified() => continue,
            () = closing.cancelled() => {}
            () = &mut too_old => {}
            () = idle => {}
        }
        graceful_shutdown(conn.as_mut());
        return conn.await;
    }
}

/// A server's connections by peer address, and which to close for a new one: one of the new
/// one's own address when it holds `per_address` ([`MAX_CONNECTIONS_PER_ADDRESS`] for the
/// observe server), else, when `max` ([`MAX_CONNECTIONS`]) are open, one of the address
/// that holds the most. So one address flooding a server closes its own connections, never
/// everyone else's (a limit that refused new connections would let it keep the others out).
///
/// A connection whose server marked its [`Succeeded`] (the resource metrics server does at
/// a `200`) is closed last: the one closed is the oldest connection not yet marked (of the
/// new one's address, or of the address holding the most connections not yet marked);
/// only when every candidate is marked, the oldest of them. So connections churned by many
/// addresses displace each other, not a scraper's long-lived connection that is being
/// served. A server that marks none (the observe server) closes the oldest, as before.
///
/// I/O free: `H` is what closes a connection (a task's `AbortHandle` in a server).
#[derive(Debug)]
pub struct Slots<H = tokio::task::AbortHandle> {
    /// In the order connections came: the first of an address is its oldest.
    open: Vec<Slot<H>>,
    max: usize,
    per_address: usize,
}

/// One open connection of [`Slots`].
#[derive(Debug)]
struct Slot<H> {
    ip: std::net::IpAddr,
    handle: H,
    succeeded: Succeeded,
}

/// Whether a connection has been served a success (for the resource metrics server: a
/// `200` to an authenticated and authorized request), which [`Slots`] reads when it must
/// close one. Shared between the server's accept loop and the connection's task: clones
/// mark the same connection. Unmarked at first; a mark is never taken back.
#[derive(Debug, Clone, Default)]
pub struct Succeeded(Arc<std::sync::atomic::AtomicBool>);

impl Succeeded {
    /// Marks the connection as served a success.
    pub fn mark(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether [`Succeeded::mark`] was called on this connection.
    pub fn is_marked(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl<H> Default for Slots<H> {
    /// The observe server's limits.
    fn default() -> Self {
        Self::new(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_ADDRESS)
    }
}

impl<H> Slots<H> {
    /// None open, at most `max` at once and `per_address` from one address (each at least
    /// 1).
    pub fn new(max: usize, per_address: usize) -> Self {
        Self {
            open: Vec::new(),
            max: max.max(1),
            per_address: per_address.max(1),
        }
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
    /// or one; see [`Slots`] for which).
    pub fn make_room(&mut self, ip: std::net::IpAddr) -> Vec<H> {
        let own = self.open.iter().filter(|slot| slot.ip == ip).count();
        let victim = if own >= self.per_address {
            self.oldest_of(ip, false)
                .or_else(|| self.oldest_of(ip, true))
        } else if self.open.len() >= self.max {
            let unmarked = self
                .busiest(false)
                .and_then(|busiest| self.oldest_of(busiest, false));
            unmarked.or_else(|| {
                self.busiest(true)
                    .and_then(|busiest| self.oldest_of(busiest, true))
            })
        } else {
            None
        };
        victim
            .map(|i| vec![self.open.remove(i).handle])
            .unwrap_or_default()
    }

    /// Where the oldest connection from `ip` is: of those not marked [`Succeeded`], or of
    /// all when `marked_too`.
    fn oldest_of(&self, ip: std::net::IpAddr, marked_too: bool) -> Option<usize> {
        self.open
            .iter()
            .position(|slot| slot.ip == ip && (marked_too || !slot.succeeded.is_marked()))
    }

    /// The address holding the most connections not marked [`Succeeded`] (of all, when
    /// `marked_too`); of those, the one whose oldest came first. `None` when it holds none.
    fn busiest(&self, marked_too: bool) -> Option<std::net::IpAddr> {
        let candidates = || {
            self.open
                .iter()
                .filter(move |slot| marked_too || !slot.succeeded.is_marked())
        };
        let mut best: Option<(usize, std::net::IpAddr)> = None;
        for slot in candidates() {
            let n = candidates().filter(|other| other.ip == slot.ip).count();
            if best.is_none_or(|(most, _)| n > most) {
                best = Some((n, slot.ip));
            }
        }
        best.map(|(_, ip)| ip)
    }

    /// Records a connection from `ip`, closed by `handle`, whose server marks `succeeded`
    /// when it serves it a success (a clone of the one given to the connection).
    pub fn insert(&mut self, ip: std::net::IpAddr, handle: H, succeeded: Succeeded) {
        self.open.push(Slot {
            ip,
            handle,
            succeeded,
        });
    }

    /// Forgets the connection `id` (it ended).
    pub fn remove(&mut self, id: H::Id) {
        self.open.retain(|slot| slot.handle.slot_id() != id);
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
#[path = "observe/tests.rs"]
mod tests;
