//! The HTTP stack under the gateway's kube-rs clients: HTTP/2 to kube-apiserver over TLS,
//! as every kubelet speaks it, and HTTP/1.1 over plain `http://`, as client-go does.
//!
//! client-go (and so kubelet) talks to kube-apiserver over one TLS connection with HTTP/2,
//! multiplexing every request on it. kube-rs' own client speaks HTTP/1.1 only (kube-rs
//! issue #1923: its upgrade calls — exec, attach, port-forward — need HTTP/1.1), so
//! concurrent requests each take a connection: a gateway writing for thousands of nodes
//! held hundreds. The gateway makes no upgrade calls, so it builds the client from the same
//! parts kube-rs does ([`kube::client::ConfigExt`]: the base URI, authentication and extra
//! header layers, the rustls connector from the kubeconfig) on a hyper client with HTTP/2
//! enabled:
//!
//! - over TLS, ALPN offers `h2` then `http/1.1`, and the server's choice is used (a server
//!   that offers only HTTP/1.1 gets HTTP/1.1);
//! - over plain `http://` (`kubectl proxy`, a local proxy in front of the apiserver;
//!   kube-apiserver itself has served no insecure port since 1.20) HTTP/1.1, as client-go:
//!   Go's `net/http` client never speaks HTTP/2 without TLS, and servers such as
//!   `kubectl proxy` speak only HTTP/1.1 there. [`HttpVersion::Http2`] asks for HTTP/2 with
//!   prior knowledge instead (h2c, RFC 9113 §3.3), for a server known to speak it (the
//!   stand-in apiserver of the tests);
//! - HTTP/2 keepalive PINGs every [`PING_INTERVAL`] (30 s) even when idle, a connection
//!   whose PING is not answered within [`PING_TIMEOUT`] (15 s) is closed: client-go's
//!   `ReadIdleTimeout` and `PingTimeout` (`staging/src/k8s.io/client-go/transport/
//!   transport.go` via `golang.org/x/net/http2`), so a dead connection behind a load
//!   balancer is noticed;
//! - the server's `SETTINGS_MAX_CONCURRENT_STREAMS` (kube-apiserver: 100 by default,
//!   `--http2-max-streams-per-connection`) is respected by h2: a request beyond it waits
//!   for a stream to free up on the connection, it is never refused for it;
//! - Lease calls have a connection of their own, as kubelet's `heartbeatClient` has its own
//!   transport (`cmd/kubelet/app/server.go`): the writes of Nodes, status and Events, up
//!   to half of `--max-inflight`, can fill a connection's 100 streams, but never hold up a
//!   renewal (see [`http_client`]);
//! - a connection is established (TCP and TLS) within `connect_timeout` (default
//!   [`CONNECT_TIMEOUT`]);
//! - with [`HttpVersion::Http1`] (or a server without HTTP/2) at most [`MAX_IDLE_HTTP1`]
//!   idle connections are kept.
//!
//! One HTTP/2 connection stays on the apiserver instance it reached: behind a load
//! balancer, kube-apiserver's `--goaway-chance` is what spreads long-lived clients, as it
//! does kubelets.
//!
//! What kube-rs' default stack adds and this one leaves out: its tracing span per request
//! (the gateway times requests itself, [`super::requests`]), gzip (not enabled), HTTP
//! proxies (`proxy_url` is refused, see [`http_client`]) and `valid_until` of exec
//! credential plugins (the gateway runs with a service account token, which the auth layer
//! re-reads).

use std::time::Duration;

use http::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt as _};
use tower::{BoxError, Service, ServiceBuilder};

/// HTTP/2 PING interval on an idle connection (client-go's `ReadIdleTimeout`).
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a PING may go unanswered before the connection is closed (client-go's
/// `PingTimeout`).
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);
/// Idle HTTP/1.1 connections kept per apiserver (HTTP/2 needs one): the gateway's default
/// `--max-inflight`, so a steady load does not dial afresh.
pub const MAX_IDLE_HTTP1: usize = 256;
/// Time to establish a connection, TCP and TLS, when the kubeconfig sets none.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Which HTTP the gateway's clients speak to kube-apiserver (`--apiserver-http`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HttpVersion {
    /// As client-go: over TLS, HTTP/2 when the server chooses it by ALPN, else HTTP/1.1;
    /// over plain `http://`, HTTP/1.1 (see the module docs).
    #[default]
    Auto,
    /// As [`Self::Auto`] over TLS; over plain `http://`, HTTP/2 with prior knowledge (a
    /// server that does not speak h2c fails every call).
    Http2,
    /// HTTP/1.1 only: a connection per request in flight, [`MAX_IDLE_HTTP1`] kept idle.
    Http1,
}

impl HttpVersion {
    /// Whether a client for `scheme` (`http` or `https`) offers HTTP/2: over TLS unless
    /// [`Self::Http1`], without TLS only with [`Self::Http2`].
    pub fn http2_for(self, scheme: Option<&http::uri::Scheme>) -> bool {
        match self {
            Self::Auto => scheme != Some(&http::uri::Scheme::HTTP),
            Self::Http2 => true,
            Self::Http1 => false,
        }
    }
}

/// A `--apiserver-http` value that is none of `auto`, `2` and `1.1`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: use auto, 2 or 1.1")]
pub struct UnknownHttpVersion(pub String);

impl std::str::FromStr for HttpVersion {
    type Err = UnknownHttpVersion;

    /// `auto`, `2` (or `http2`) and `1.1` (or `http1`).
    ///
    /// Errors: [`UnknownHttpVersion`] for anything else.
    fn from_str(s: &str) -> Result<Self, UnknownHttpVersion> {
        match s {
            "auto" => Ok(Self::Auto),
            "2" | "http2" => Ok(Self::Http2),
            "1.1" | "http1" => Ok(Self::Http1),
            other => Err(UnknownHttpVersion(other.to_owned())),
        }
    }
}

/// The service a kube-rs [`kube::client::ClientBuilder`] is built on: requests with
/// `config`'s base URI, authentication and extra headers, over a hyper client speaking
/// `version` (see the module docs), connecting within `config.connect_timeout`. With
/// `lease_connection`, calls on `leases` go over a pool (a connection, with HTTP/2) of
/// their own.
///
/// Errors: kube's error for TLS material it cannot use ([`kube::Error::RustlsTls`]) or an
/// authentication it cannot set up; [`kube::Error::ProxyProtocolDisabled`] for a
/// `proxy_url` (this stack has no proxy support); [`kube::Error::Service`] for a
/// `tls_server_name` that is no DNS name.
pub fn http_client(
    config: kube::Config,
    version: HttpVersion,
    lease_connection: bool,
) -> Result<
    impl Service<
        Request<Body>,
        Response = Response<hyper::body::Incoming>,
        Error = BoxError,
        Future = impl Send,
    > + Clone
    + Send
    + 'static,
    kube::Error,
> {
    if let Some(proxy_url) = &config.proxy_url {
        return Err(kube::Error::ProxyProtocolDisabled {
            proxy_url: Box::new(proxy_url.clone()),
            protocol_feature: "the gateway's own HTTP/2 client (no proxy support)",
        });
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let tls = match &config.tls_server_name {
        Some(name) => tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
            name.clone()
                .try_into()
                .map_err(|e| kube::Error::Service(Box::new(e)))?,
        )),
        None => tls,
    };
    let plain = config.cluster_url.scheme() == Some(&http::uri::Scheme::HTTP);
    let http2 = version.http2_for(config.cluster_url.scheme());
    let connector = match http2 {
        true => tls.enable_http1().enable_http2().wrap_connector(http),
        false => tls.enable_http1().wrap_connector(http),
    };
    // TCP and TLS together.
    let connect_timeout = config.connect_timeout.unwrap_or(CONNECT_TIMEOUT);
    let connector = tower::service_fn(move |uri: http::Uri| {
        let connecting = tower::ServiceExt::oneshot(connector.clone(), uri);
        Box::pin(async move {
            match tokio::time::timeout(connect_timeout, connecting).await {
                Ok(connected) => connected,
                Err(_) => {
                    Err(format!("connecting to the apiserver took over {connect_timeout:?}").into())
                }
            }
        })
    });
    let mut builder = Client::builder(TokioExecutor::new());
    // HTTP/2 PINGs and idle-connection expiry run on tokio's timer.
    builder
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_max_idle_per_host(MAX_IDLE_HTTP1);
    if http2 {
        builder
            .http2_keep_alive_interval(PING_INTERVAL)
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .http2_keep_alive_while_idle(true);
        // Without TLS there is no ALPN to agree on HTTP/2: prior knowledge.
        if plain {
            builder.http2_only(true);
        }
    }
    let rest: Client<_, Body> = builder.build(connector.clone());
    let leases = match lease_connection {
        // Another client, so another pool.
        true => builder.build(connector),
        false => rest.clone(),
    };
    Ok(ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(ByResource { leases, rest }))
}

/// Calls on `leases` (the path names them: `/apis/coordination.k8s.io/v1/…/leases…`) to
/// `leases`, the others to `rest`. Both are ready at all times (hyper clients queue in
/// their pools).
#[derive(Clone)]
struct ByResource<S> {
    leases: S,
    rest: S,
}

impl<S> Service<Request<Body>> for ByResource<S>
where
    S: Service<Request<Body>> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = tower::util::Oneshot<S, Request<Body>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let service = if request.uri().path().contains("/leases") {
            self.leases.clone()
        } else {
            self.rest.clone()
        };
        tower::ServiceExt::oneshot(service, request)
    }
}
