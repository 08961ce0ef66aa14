//! The HTTPS server of kubelet's `/metrics/resource` for the nodes a replica holds.
//!
//! | request                                          | node                        |
//! |--------------------------------------------------|-----------------------------|
//! | `GET /nodes/<node>/metrics/resource`             | from the path ([`super::node_path`]; metrics-server with [`super::PATH_ANNOTATION`]) |
//! | `GET /metrics/resource` with `X-Forwarded-Uri: /api/v1/nodes/<node>/proxy/metrics/resource` | from the header, which the apiserver's node proxy sets (`k8s.io/apimachinery` `pkg/util/proxy/transport.go`; `<node>` may carry the proxy's `[scheme:]name[:port]` form) |
//!
//! `HEAD` is answered as `GET`, without a body. Every request is decided in this order,
//! each step answering with a one-line text when it refuses:
//!
//! 1. route: another path `404`; another method `405` (with `Allow: GET, HEAD`);
//!    `/metrics/resource` without `X-Forwarded-Uri` naming a node `404` ("which node?");
//!    a name that is not a valid Node name `400`;
//! 2. authentication ([`super::auth`]): none `401 Unauthorized`;
//! 3. authorization of `get nodes/metrics` on that node: refused `403 Forbidden (user=<u>,
//!    verb=get, resource=nodes, subresource=metrics)` (kubelet's text,
//!    `pkg/kubelet/server/server.go: InstallAuthFilter`); an apiserver error in 2 or 3 `500`;
//!    a review in 2 or 3 that the review budgets do not allow ([`super::budget`]) `429 Too
//!    Many Requests` with `Retry-After` (whole seconds), the apiserver not asked;
//! 4. a node this replica holds no sample of, or none of the last [`super::MAX_SAMPLE_AGE`]:
//!    `404 node <n> has no sample of the last 60s at this replica`;
//! 5. `200`, the node's [`exposition`](super::exposition()).
//!
//! Connections are TLS (rustls on ring, ALPN `h2` then `http/1.1`), then hyper's HTTP/2 or
//! HTTP/1.1: Go clients (metrics-server, kube-apiserver) speak HTTP/2, so one connection
//! carries the scrapes of every node of a cycle, [`MAX_STREAMS`] at once. Bounded like the
//! observe server (`edgebeat_transports::observe`): at most [`MAX_CONNECTIONS`] at once and
//! [`MAX_CONNECTIONS_PER_ADDRESS`] from one address (a further one closes the oldest of its
//! own address, or of the address holding the most; of those, a connection that was served
//! a `200` goes last, so connections churned from many addresses do not close
//! metrics-server's), [`TLS_HANDSHAKE_TIMEOUT`] for the handshake,
//! [`HEADER_READ_TIMEOUT`] for an HTTP/1.1 request head, [`IDLE_TIMEOUT`] between requests,
//! and a connection closes after [`MAX_CONNECTION_AGE`] however busy.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use edgebeat_transports::observe::{Slots, Succeeded, accept_connections, drive_connection};
use edgebeat_transports::tls::{GrpcServerTls, TlsError, is_node_name};
use http::header::{ALLOW, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::Samples;
use super::auth::{Auth, RESOURCE, Reviews, SUBRESOURCE, User, VERB, bearer_token};
use super::budget::{OverBudget, Source};
use super::cache::ReviewError;
use super::counters::ResourceMetricsCounters;
use super::exposition::{EXPOSITION_CONTENT_TYPE, exposition};

/// Most connections served at once: enough for HTTP/1.1 clients that scrape a replica's
/// nodes in parallel without HTTP/2. A further one closes the oldest of the address that
/// holds the most, a connection that was served a `200` last ([`Slots`]).
pub const MAX_CONNECTIONS: usize = 256;

/// Most connections from one address: a new one beyond it closes that address's oldest (a
/// connection that was served a `200` last).
/// metrics-server and kube-apiserver each multiplex a cycle's scrapes on one HTTP/2
/// connection (a few across restarts); one address holding more is a client gone wrong, or
/// a flood, which must not keep them out.
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 64;

/// Most requests in flight on one HTTP/2 connection (Go's client queues the others).
pub const MAX_STREAMS: u32 = 256;

/// Time a client has to complete its TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a client has to send a request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a connection may sit between requests before it is closed: longer than
/// metrics-server's default resolution (15 s), so its connections carry every scrape.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Age after which a connection is closed once its request in progress is answered, however
/// busy it keeps (keep-alive is bounded; a client certificate's user is read once per
/// connection).
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);

/// Largest request head read (hyper's read buffer): a service account token is a few KiB.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The header in which the apiserver's node proxy names the path it was asked for.
const X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");

/// The path kubelet serves its resource metrics on.
const RESOURCE_PATH: &str = "/metrics/resource";

/// Content type of the one-line text answers.
const TEXT: &str = "text/plain; charset=utf-8";

/// The TLS material of the resource metrics server: as kubelet's `--tls-cert-file`,
/// `--tls-private-key-file` and `--client-ca-file`, in the shape the gRPC listener's takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceMetricsOptions {
    /// The server certificate chain (leaf first), its key, and the client CA.
    /// metrics-server and the apiserver check the certificate against the cluster's kubelet
    /// serving CA unless told not to (`--kubelet-insecure-tls`,
    /// `--kubelet-certificate-authority`), for the address they connect to (the replica's
    /// [`super::ADDRESS_TYPE`] address): it should name that IP. With a client CA (usually
    /// the cluster CA: the apiserver's kubelet client certificate chains to it), a client
    /// may present a certificate and is then authenticated by it (bearer tokens work
    /// alongside); without one, no client certificate is asked for and only bearer tokens
    /// authenticate.
    pub tls: GrpcServerTls,
}

impl ResourceMetricsOptions {
    /// Checks the material before serving, so a bad file fails at start-up with a precise
    /// message: every PEM parses, the key belongs to the certificate, and the client CA
    /// (when set) holds at least one usable certificate.
    ///
    /// # Errors
    ///
    /// [`TlsError::In`] naming the part (`certificate`, `key`, `certificate and key`,
    /// `client CA`).
    pub fn check(&self) -> Result<(), TlsError> {
        self.rustls_config().map(|_| ())
    }

    /// The rustls server configuration on the ring provider, offering ALPN `h2` and `http/1.1`; with
    /// a client CA, client certificates that chain to it are verified and optional.
    ///
    /// # Errors
    ///
    /// As [`ResourceMetricsOptions::check`].
    pub fn rustls_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        // The gRPC listener's rules for the same material (ring, TLS 1.2 and 1.3, the
        // client CA's verifier), with client certificates optional, and this server's ALPN.
        let mut config = self.tls.rustls_config(false)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// Serves kubelet's `/metrics/resource` for the nodes in `samples` (see the module docs) on
/// `listener` over TLS with `options`, authenticating and authorizing every request through
/// `reviews` (kubelet's rules: see [`Reviews`](super::Reviews)) and counting it in `counters`, until
/// `shutdown` resolves; then stops accepting, lets requests in progress finish (up to 2 s)
/// and returns `Ok(())`.
///
/// Takes a bound listener (not an address) so callers report bind errors themselves and
/// tests bind port 0.
///
/// # Errors
///
/// [`io::ErrorKind::InvalidInput`] with the [`TlsError`] when `options` is unusable (check
/// it first with [`ResourceMetricsOptions::check`]); the listener's error when it has no
/// local address. Errors of one connection (accept, handshake, HTTP) are logged at debug
/// level and never end the server.
pub async fn serve<R: Reviews + 'static>(
    listener: TcpListener,
    options: ResourceMetricsOptions,
    samples: Arc<Samples>,
    reviews: R,
    counters: Arc<ResourceMetricsCounters>,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let config = options
        .rustls_config()
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let auth = Auth::new(reviews, counters.clone());
    let handler = Arc::new(Handler::new(samples, auth, counters));
    let slots = Slots::new(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_ADDRESS);
    accept_connections(
        listener,
        slots,
        "resource metrics server",
        shutdown,
        |stream, remote, succeeded, closing| {
            connection(
                stream,
                remote,
                succeeded,
                acceptor.clone(),
                handler.clone(),
                closing,
            )
        },
    )
    .await
}

/// One connection: its TLS handshake, the user of its client certificate, then HTTP/1.1
/// or HTTP/2 until it idles, ages or the server closes; `succeeded` is marked at its first
/// `200`.
async fn connection<R: Reviews + 'static>(
    stream: TcpStream,
    remote: SocketAddr,
    succeeded: Succeeded,
    acceptor: tokio_rustls::TlsAcceptor,
    handler: Arc<Handler<R>>,
    closing: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream));
    let tls = tokio::select! {
        () = closing.cancelled() => return,
        handshake = handshake => match handshake {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                tracing::debug!(%remote, %error, "resource metrics server: TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%remote, "resource metrics server: TLS handshake timed out");
                return;
            }
        },
    };
    let certificate_user = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|leaf| match super::auth::certificate_user(leaf) {
            Ok(user) => user,
            Err(error) => {
                tracing::debug!(%remote, %error, "resource metrics server: client certificate names no user");
                None
            }
        });
    let peer = Arc::new(Peer {
        remote,
        certificate_user,
        succeeded,
    });
    let activity = Arc::new(tokio::sync::Notify::new());
    let active = activity.clone();
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        active.notify_one();
        let (handler, peer) = (handler.clone(), peer.clone());
        async move {
            let (parts, _) = request.into_parts();
            Ok::<_, Infallible>(handler.handle(&parts, &peer).await)
        }
    });
    // HTTP/2 when the client offers it (metrics-server and kube-apiserver do, through Go's
    // transport): every node's scrape of a cycle then shares one connection instead of
    // opening one (and a TLS handshake) each.
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(u32::try_from(MAX_HEAD_BYTES).unwrap_or(u32::MAX));
    let result = drive_connection(
        builder.serve_connection(TokioIo::new(tls), service),
        |conn| conn.graceful_shutdown(),
        &activity,
        &closing,
        IDLE_TIMEOUT,
        MAX_CONNECTION_AGE,
    )
    .await;
    if let Err(error) = result {
        tracing::debug!(%remote, %error, "resource metrics server: connection ended with an error");
    }
}

/// What a connection's TLS handshake established: the client's address and the user its
/// verified client certificate authenticates, if any; and whether the connection was served
/// a `200` (which [`Slots`] and the review budgets read).
#[derive(Debug, Clone)]
pub(super) struct Peer {
    pub(super) remote: SocketAddr,
    pub(super) certificate_user: Option<User>,
    pub(super) succeeded: Succeeded,
}

impl Peer {
    /// Where its reviews take from the budgets.
    fn source(&self) -> Source {
        Source {
            address: self.remote.ip(),
            served: self.succeeded.is_marked(),
        }
    }
}

/// The answer to every request (see the module docs), with no I/O of its own but the
/// reviews: what the server's connections call, and the tests without sockets.
pub(super) struct Handler<R> {
    samples: Arc<Samples>,
    auth: Auth<R>,
    counters: Arc<ResourceMetricsCounters>,
}

impl<R: Reviews> Handler<R> {
    pub(super) fn new(
        samples: Arc<Samples>,
        auth: Auth<R>,
        counters: Arc<ResourceMetricsCounters>,
    ) -> Self {
        Self {
            samples,
            auth,
            counters,
        }
    }

    /// The answer to `request` from `peer`, counted; a `200` marks the connection
    /// [`Succeeded`].
    pub(super) async fn handle(&self, request: &Parts, peer: &Peer) -> Response<Full<Bytes>> {
        let response = self.answer(request, peer).await;
        self.counters.count(response.status());
        if response.status() == StatusCode::OK {
            peer.succeeded.mark();
        }
        response
    }

    async fn answer(&self, request: &Parts, peer: &Peer) -> Response<Full<Bytes>> {
        let node = match route(&request.method, request.uri.path(), &request.headers) {
            Ok(node) => node,
            Err(refusal) => return refusal.response(),
        };
        let user = match &peer.certificate_user {
            Some(user) => user.clone(),
            None => {
                let token = bearer_token(&request.headers);
                let user = match token {
                    Some(token) => match self.auth.authenticate_token(token, peer.source()).await {
                        Ok(user) => user,
                        Err(ReviewError::OverBudget(over)) => return too_many_requests(over),
                        Err(_) => {
                            return text(
                                StatusCode::INTERNAL_SERVER_ERROR,
                                "Authentication error: the apiserver's TokenReview failed",
                            );
                        }
                    },
                    None => None,
                };
                let Some(user) = user else {
                    tracing::debug!(
                        remote = %peer.remote,
                        bearer_token = token.is_some(),
                        node,
                        "resource metrics: unauthenticated request"
                    );
                    return text(StatusCode::UNAUTHORIZED, "Unauthorized");
                };
                user
            }
        };
        let attributes = format!(
            "(user={}, verb={VERB}, resource={RESOURCE}, subresource={SUBRESOURCE})",
            user.name
        );
        match self.auth.authorize(&user, node, peer.source()).await {
            Ok(true) => {}
            Err(ReviewError::OverBudget(over)) => return too_many_requests(over),
            Ok(false) => {
                tracing::debug!(
                    remote = %peer.remote,
                    user = %user.name,
                    node,
                    "resource metrics: forbidden"
                );
                return text(StatusCode::FORBIDDEN, &format!("Forbidden {attributes}"));
            }
            Err(_) => {
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("Authorization error {attributes}"),
                );
            }
        }
        match self.samples.fresh(node, std::time::SystemTime::now()) {
            Some(sample) => respond(
                StatusCode::OK,
                EXPOSITION_CONTENT_TYPE,
                exposition(Some(&sample)),
            ),
            None => text(
                StatusCode::NOT_FOUND,
                &format!(
                    "node {node} has no sample of the last {}s at this replica",
                    super::MAX_SAMPLE_AGE.as_secs()
                ),
            ),
        }
    }
}

/// Why [`route`] names no node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Another path: `404`.
    NotFound,
    /// Another method than `GET` or `HEAD`: `405`.
    MethodNotAllowed,
    /// `/metrics/resource` without an `X-Forwarded-Uri` that names a node: `404`.
    WhichNode,
    /// Not a valid Node name: `400`.
    InvalidNode(String),
}

impl Refusal {
    /// The answer: its status and one line of text.
    pub(super) fn response(&self) -> Response<Full<Bytes>> {
        match self {
            Self::NotFound => text(
                StatusCode::NOT_FOUND,
                "not found: try /nodes/<node>/metrics/resource",
            ),
            Self::MethodNotAllowed => {
                let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
                response
                    .headers_mut()
                    .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
                response
            }
            Self::WhichNode => text(
                StatusCode::NOT_FOUND,
                "which node? /metrics/resource answers only through the apiserver's node proxy \
                 (X-Forwarded-Uri: /api/v1/nodes/<node>/proxy/metrics/resource); \
                 ask for /nodes/<node>/metrics/resource",
            ),
            Self::InvalidNode(node) => text(
                StatusCode::BAD_REQUEST,
                &format!("invalid node name {node:?}"),
            ),
        }
    }
}

/// The node a request asks for (see the module docs), or why it names none: another path
/// first, then another method, then a `/metrics/resource` that names no node, then an
/// invalid name.
///
/// # Errors
///
/// The [`Refusal`].
pub(super) fn route<'a>(
    method: &Method,
    path: &'a str,
    headers: &'a http::HeaderMap,
) -> Result<&'a str, Refusal> {
    let direct = path
        .strip_prefix("/nodes/")
        .and_then(|rest| rest.strip_suffix(RESOURCE_PATH))
        .filter(|node| !node.contains('/'));
    if direct.is_none() && path != RESOURCE_PATH {
        return Err(Refusal::NotFound);
    }
    if method != Method::GET && method != Method::HEAD {
        return Err(Refusal::MethodNotAllowed);
    }
    let node = match direct {
        Some(node) => node,
        None => forwarded_node(headers).ok_or(Refusal::WhichNode)?,
    };
    if !is_node_name(node) {
        return Err(Refusal::InvalidNode(node.to_owned()));
    }
    Ok(node)
}

/// The node named by the apiserver's node proxy in `X-Forwarded-Uri`:
/// `/api/v1/nodes/<id>/proxy/metrics/resource`, with `<id>` in the proxy's
/// `[scheme:]name[:port]` form (`k8s.io/apimachinery` `pkg/util/net/http.go:
/// SplitSchemeNamePort`).
fn forwarded_node(headers: &http::HeaderMap) -> Option<&str> {
    let uri = headers.get(X_FORWARDED_URI)?.to_str().ok()?;
    let id = uri
        .strip_prefix("/api/v1/nodes/")?
        .strip_suffix("/proxy/metrics/resource")?;
    if id.contains('/') {
        return None;
    }
    let parts: Vec<&str> = id.split(':').collect();
    match parts.as_slice() {
        [name] | [name, _] => Some(name),
        [scheme, name, _] if matches!(*scheme, "" | "http" | "https") => Some(name),
        _ => None,
    }
}

/// `429 Too Many Requests` for a review `over` its budget, with `Retry-After` in whole
/// seconds (rounded up, at least 1: RFC 9110 §10.2.3 counts in seconds).
fn too_many_requests(over: OverBudget) -> Response<Full<Bytes>> {
    let mut response = text(
        StatusCode::TOO_MANY_REQUESTS,
        &format!(
            "too many requests: over the {} review budget; retry later",
            over.budget.as_str()
        ),
    );
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after_seconds(over)));
    response
}

/// The `Retry-After` of `over`: its wait in whole seconds, rounded up, at least 1.
pub(super) fn retry_after_seconds(over: OverBudget) -> u64 {
    let wait = over.retry_after;
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// A one-line text answer (a newline is added).
fn text(status: StatusCode, line: &str) -> Response<Full<Bytes>> {
    respond(status, TEXT, format!("{line}\n"))
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
