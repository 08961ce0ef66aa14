//! The HTTP/1.1 server of `/healthz`, `/readyz` and `/metrics` ([`serve`]; the table is in
//! the [`observe`](super) module docs), and its accept loop and connection driver, which
//! the gateway's resource metrics server shares ([`accept_connections`],
//! [`drive_connection`]).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::Arc;
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

use super::metrics::{Exposition, METRICS_CONTENT_TYPE};
use super::slots::{Slots, Succeeded};

/// Content type of the plain-text answers (`ok`, reasons, errors).
const TEXT: &str = "text/plain; charset=utf-8";

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
