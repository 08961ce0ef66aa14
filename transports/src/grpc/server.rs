use std::sync::Arc;
use std::time::Duration;

use edgebeat_hw::{Clock as _, SystemClock};
use edgebeat_proto::heartbeat_server::{Heartbeat, HeartbeatServer};
use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{
    AgentMessage, GatewayMessage, Header, MAX_AGENT_MESSAGE_BYTES, agent_message,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::tls::{self, GrpcServerTls};
use crate::ingress::{Asked, Handler, Letter, Peer, RejectReason, TransportKind};

/// Settings of the gateway's gRPC server.
#[derive(Debug, Clone)]
pub struct GrpcServerOptions {
    /// Interval of HTTP/2 keepalive pings to agents (default 30 s).
    pub keepalive: Duration,
    /// Time to wait for a ping's answer before dropping the connection (default 10 s).
    pub keepalive_timeout: Duration,
    /// Largest accepted encoded message in bytes (default
    /// [`MAX_AGENT_MESSAGE_BYTES`], 64 KiB); larger ones end that agent's stream with
    /// `RESOURCE_EXHAUSTED` and are counted through [`Handler::rejected`].
    pub max_message_bytes: usize,
    /// TLS (default off: plain HTTP/2). With a client CA the transport sets
    /// [`Peer::identity`] from the client certificate's node identity; a certificate
    /// without one (CN=`system:node:<name>`, O=`system:nodes`) has its stream refused with
    /// `UNAUTHENTICATED`, counted through [`Handler::rejected`].
    pub tls: Option<GrpcServerTls>,
    /// Refuse every stream that has no node identity, with `UNAUTHENTICATED` counted through
    /// [`Handler::rejected`] (default false). With a client CA this also makes the client
    /// certificate mandatory in the handshake; with it off, clients without a certificate
    /// are let in with `identity: None` (e.g. while a fleet moves to mTLS), but one that
    /// presents a certificate must still present a node identity. Without a client CA, no
    /// stream can have an identity, so turning it on refuses everything.
    pub require_node_identity: bool,
    /// TLS handshakes in progress at once, from everyone (default 1,024). A new connection
    /// beyond it is still let in: an incomplete handshake gives way (one still waiting for
    /// its ClientHello first, the oldest of the address holding the most), is closed and
    /// counted, so peers that open
    /// sockets and stall can neither use up file descriptors nor keep genuine agents out.
    pub max_handshakes: usize,
    /// TLS handshakes in progress at once from one IP address (default 32); beyond it the
    /// address's own oldest incomplete handshake gives way. Agents behind one NAT share an
    /// address: handshakes take milliseconds and an evicted one reconnects with backoff,
    /// so a site of hundreds reconnecting at once still gets in within seconds.
    pub max_handshakes_per_address: usize,
    /// New TLS material for the listener while it serves (default none): each value that
    /// arrives (a serving certificate renewed by cert-manager, a client CA bundle with the
    /// old and the new CA during a CA change) is used for every handshake from then on;
    /// connections already open keep theirs. A value that does not build is logged and the
    /// previous one kept. Only with [`GrpcServerOptions::tls`].
    pub tls_updates: Option<tokio::sync::watch::Receiver<GrpcServerTls>>,
}

impl Default for GrpcServerOptions {
    fn default() -> Self {
        Self {
            keepalive: super::DEFAULT_KEEPALIVE,
            keepalive_timeout: super::DEFAULT_KEEPALIVE_TIMEOUT,
            max_message_bytes: MAX_AGENT_MESSAGE_BYTES,
            tls: None,
            require_node_identity: false,
            max_handshakes: 1024,
            max_handshakes_per_address: 32,
            tls_updates: None,
        }
    }
}

struct Service<H> {
    handler: Arc<H>,
    /// Client certificates are verified against a CA, so the leaf names a node.
    client_ca: bool,
    require_node_identity: bool,
    /// Fires at shutdown so open streams end and tonic's graceful shutdown can finish.
    closing: tokio_util::sync::CancellationToken,
}

#[tonic::async_trait]
impl<H: Handler> Heartbeat for Service<H> {
    type ConnectStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<GatewayMessage, Status>> + Send + 'static>,
    >;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let connection = request.extensions().get::<ConnectionInfo>();
        let remote = connection
            .map(ConnectionInfo::remote)
            .or_else(|| request.remote_addr());
        let mut peer = Peer::unidentified(TransportKind::Grpc, remote);
        match self.authenticate(connection) {
            Ok(identity) => {
                if let Some((name, certificate)) = identity {
                    peer.identity = Some(name);
                    peer.certificate = Some(certificate);
                }
            }
            Err(refused) => {
                // Rejected before any message is read: nothing from this stream reaches the
                // handler, and the agent sees UNAUTHENTICATED (its own fault, not the link).
                let reason = refused.to_string();
                // Counted and logged (within bounds) by the handler.
                self.handler
                    .rejected(&peer, RejectReason::Unauthenticated, &reason);
                return Err(Status::unauthenticated(reason));
            }
        }
        tracing::debug!(remote = ?peer.remote, identity = ?peer.identity, "gRPC stream opened");
        // A stream speaks with its certificate for as long as that is valid: at its notAfter
        // the stream ends (the agent reconnects, and an expired certificate fails the
        // handshake), instead of renewing on an open stream long after.
        let expires = connection
            .and_then(ConnectionInfo::not_after)
            .filter(|_| peer.identity.is_some())
            .map(expiry_instant);
        if expires.is_some_and(|at| at <= tokio::time::Instant::now()) {
            // A new stream on a connection whose certificate expired since its handshake.
            let reason = "the client certificate expired: rotate it and connect again";
            self.handler
                .rejected(&peer, RejectReason::Certificate, reason);
            return Err(Status::unauthenticated(reason));
        }
        // The acks are a stream driven by tonic as it sends them: no task and no channel per
        // agent; the handler runs in a task that exists only while a message is handled, so
        // an idle stream holds a few hundred bytes, not the largest state of the handler.
        let state = StreamState {
            inbound: request.into_inner(),
            handler: self.handler.clone(),
            peer,
            closing: self.closing.clone(),
            register: None,
            expires,
        };
        let acks = futures_util::stream::unfold(Some(state), |state| async move {
            let mut state = state?;
            loop {
                let expired = async {
                    match state.expires {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                let next = tokio::select! {
                    biased;
                    () = state.closing.cancelled() => return None,
                    () = expired => {
                        state.handler.rejected(
                            &state.peer,
                            RejectReason::Certificate,
                            "the client certificate expired: its stream is closed (the agent must rotate it)",
                        );
                        return None;
                    }
                    next = state.inbound.message() => next,
                };
                return match next {
                    Ok(Some(mut message)) => {
                        let asked = Asked::of(&message);
                        if matches!(message.kind, Some(agent_message::Kind::Register(_))) {
                            state.register = message.header().cloned();
                        } else if let Some(header) = &state.register {
                            message.complete_header(header);
                        }
                        // Delivered, and handled apart from this stream (for the gateway, in
                        // the node's mailbox): an agent that goes away mid-message must not
                        // cancel the gateway's writes half-way (a Node patched but its Event
                        // not recorded). A reply dropped unsent is no answer.
                        let (reply, answer) = tokio::sync::oneshot::channel();
                        let letter = Letter::new(state.peer.clone(), message, reply);
                        state.handler.clone().deliver(letter);
                        let ack = answer.await.unwrap_or(None);
                        let Some(reply) = asked.answer(ack) else {
                            continue;
                        };
                        Some((Ok(reply), Some(state)))
                    }
                    Ok(None) => None,
                    Err(status) => {
                        // Malformed or oversized frames end this stream only; the agent
                        // reconnects and every other stream is untouched.
                        let reason = match status.code() {
                            tonic::Code::Cancelled | tonic::Code::Unknown => None,
                            // tonic's decoder: a message over max_message_bytes.
                            tonic::Code::OutOfRange => Some(RejectReason::TooLarge),
                            _ => Some(RejectReason::Malformed),
                        };
                        if let Some(reason) = reason {
                            state
                                .handler
                                .rejected(&state.peer, reason, status.message());
                        }
                        tracing::debug!(peer = ?state.peer.remote, %status, "gRPC stream ended");
                        None
                    }
                };
            }
        });
        Ok(Response::new(Box::pin(acks)))
    }
}

/// One agent stream's state, owned by its ack stream.
struct StreamState<H> {
    inbound: Streaming<AgentMessage>,
    handler: Arc<H>,
    peer: Peer,
    closing: tokio_util::sync::CancellationToken,
    /// The header of the stream's last `Register`: node name and boot ID of compact
    /// headers ([`edgebeat_proto::HeaderForm::Compact`]).
    register: Option<Header>,
    /// When the client certificate of an identified stream expires: the stream ends then.
    expires: Option<tokio::time::Instant>,
}

/// The tokio instant of `not_after` (Unix seconds) on the system clock: now, when it has
/// passed; far ahead (a century) for a date beyond what an instant holds.
fn expiry_instant(not_after: i64) -> tokio::time::Instant {
    let now = SystemClock.unix_now().duration();
    let left = u64::try_from(not_after)
        .ok()
        .map(std::time::Duration::from_secs)
        .and_then(|at| at.checked_sub(now))
        .unwrap_or_default();
    let century = std::time::Duration::from_secs(100 * 365 * 24 * 3600);
    tokio::time::Instant::now() + left.min(century)
}

impl<H> Service<H> {
    /// The node identity of the stream's client certificate (parsed once for its
    /// connection, see [`ConnectionInfo`]), with the certificate's
    /// [`CertificateId`](crate::tls::CertificateId): `Ok(Some(..))`, or `Ok(None)` when there
    /// is no certificate and none is required.
    ///
    /// Errors: [`Unauthenticated`], why the stream is refused.
    fn authenticate(
        &self,
        connection: Option<&ConnectionInfo>,
    ) -> Result<Option<(NodeName, crate::tls::CertificateId)>, Unauthenticated> {
        let presented = connection
            .filter(|_| self.client_ca)
            .and_then(ConnectionInfo::identity);
        match presented {
            // A presented certificate chains to the client CA (rustls checked it); it must
            // also say which node it is, whether or not identity is required.
            Some(identity) => identity
                .clone()
                .map(Some)
                .map_err(Unauthenticated::Certificate),
            None if self.require_node_identity => Err(Unauthenticated::Required),
            None => Ok(None),
        }
    }
}

/// Why a gRPC stream is refused before any of its messages is read (`UNAUTHENTICATED`).
#[derive(Debug, thiserror::Error)]
enum Unauthenticated {
    /// The client certificate names no node, or does not parse.
    #[error(transparent)]
    Certificate(tls::IdentityError),
    /// No client certificate, and node identities are required.
    #[error(
        "a client certificate with a node identity is required (CN={prefix}<nodeName>, O={group})",
        prefix = tls::NODE_USER_PREFIX,
        group = tls::NODES_GROUP
    )]
    Required,
}

/// Why [`serve`] stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum GrpcServeError {
    /// The TLS material cannot work (see [`GrpcServerTls::check`]).
    #[error("gRPC TLS: {0}")]
    Tls(#[source] crate::tls::TlsError),
    /// tonic stopped serving (the listener broke).
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Connections waiting between a finished TLS handshake and tonic picking them up.
const ACCEPTED_QUEUE: usize = 64;

/// Longest wait for a connection's whole ClientHello, 3 s: a genuine agent sends it right
/// after the TCP handshake (a few hundred bytes), so a socket that stays idle or trickles
/// bytes gives its handshake slot back long before [`super::TLS_HANDSHAKE_TIMEOUT`].
const CLIENT_HELLO_TIMEOUT: Duration = Duration::from_secs(3);

mod connection;
use connection::{Connection, ConnectionInfo};
mod handshakes;
use handshakes::{Handshakes, Ticket};

/// Accepts TCP connections on `listener` and runs each TLS handshake in its own task
/// (the whole ClientHello within [`CLIENT_HELLO_TIMEOUT`], the whole handshake within
/// [`super::TLS_HANDSHAKE_TIMEOUT`]), handing finished ones to tonic. At most
/// `max_handshakes` are in progress at once, `max_handshakes_per_address` from one IP
/// address; a new connection is never refused for room: an incomplete handshake gives way
/// instead, one still without a whole ClientHello first, the oldest of the address holding
/// the most (see [`handshakes`]), so
/// sockets that open and stall cannot keep genuine agents out. A failed, timed-out or
/// evicted handshake is counted through [`Handler::rejected`]
/// ([`RejectReason::TlsHandshake`]) and its cause logged at debug level; tonic's own TLS
/// acceptor would swallow both. Ends, with every handshake task, when `closing` fires or
/// tonic stops taking connections.
fn tls_incoming<H: Handler>(
    listener: TcpListener,
    config: rustls::ServerConfig,
    options: &GrpcServerOptions,
    handler: Arc<H>,
    closing: tokio_util::sync::CancellationToken,
) -> ReceiverStream<Result<Connection, std::io::Error>> {
    let mut config = Arc::new(config);
    let mut updates = options.tls_updates.clone();
    let require_client_cert = options.require_node_identity;
    let (tx, rx) = mpsc::channel(ACCEPTED_QUEUE);
    let handshakes = Handshakes::new(options.max_handshakes, options.max_handshakes_per_address);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = closing.cancelled() => return,
                () = tx.closed() => return,
                changed = async {
                    match updates.as_mut() {
                        Some(updates) => updates.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    match changed {
                        Ok(()) => {
                            let tls = updates.as_mut().map(|u| u.borrow_and_update().clone());
                            match tls.map(|t| t.rustls_config(require_client_cert)) {
                                Some(Ok(new)) => {
                                    tracing::info!("gRPC TLS material reloaded: new handshakes use it");
                                    config = Arc::new(new);
                                }
                                Some(Err(error)) => tracing::warn!(%error, "new gRPC TLS material refused; the previous stays in use"),
                                None => {}
                            }
                        }
                        // The sender is gone: no more updates.
                        Err(_) => updates = None,
                    }
                    continue;
                }
                accepted = listener.accept() => accepted,
            };
            let (stream, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: the listener itself is fine.
                    tracing::warn!(%error, "gRPC accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (ticket, evicted) = handshakes.admit(remote.ip());
            if evicted > 0 {
                tracing::debug!(%remote, evicted, "TLS handshakes full; an incomplete one gave way");
            }
            // Small acks (and the handshake's last flight) must not wait for a delayed ACK.
            let _ = stream.set_nodelay(true);
            let (config, handler, tx, closing) =
                (config.clone(), handler.clone(), tx.clone(), closing.clone());
            tokio::spawn(async move {
                let peer = Peer::unidentified(TransportKind::Grpc, Some(remote));
                let result = tokio::select! {
                    () = closing.cancelled() => return,
                    () = ticket.evicted.cancelled() => Err(std::io::Error::other(
                        "evicted: an incomplete handshake, to make room for a new connection",
                    )),
                    result = handshake(stream, config, &ticket) => result,
                };
                drop(ticket);
                let error = match result {
                    Ok(tls) => {
                        let connection = Connection::new(tls, remote);
                        tokio::select! {
                            () = closing.cancelled() => {}
                            _ = tx.send(Ok(connection)) => {}
                        }
                        return;
                    }
                    Err(error) => error,
                };
                // Counted for every failure; logged at debug only, since any client can
                // cause one (the counter is the signal, the log the detail).
                tracing::debug!(%remote, %error, "gRPC TLS handshake failed");
                handler.rejected(&peer, RejectReason::TlsHandshake, &error.to_string());
            });
        }
    });
    ReceiverStream::new(rx)
}

/// One connection's TLS handshake: its whole ClientHello within [`CLIENT_HELLO_TIMEOUT`]
/// (then `ticket` moves it behind every handshake still waiting for one), the rest within
/// what is left of [`super::TLS_HANDSHAKE_TIMEOUT`].
///
/// Errors: the handshake's, or a timeout naming which deadline passed.
async fn handshake(
    stream: tokio::net::TcpStream,
    config: Arc<rustls::ServerConfig>,
    ticket: &Ticket,
) -> std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let started = tokio::time::Instant::now();
    let hello = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
    let start = tokio::time::timeout(CLIENT_HELLO_TIMEOUT, hello)
        .await
        .map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "no whole ClientHello in time")
        })??;
    ticket.hello_received();
    let rest = super::TLS_HANDSHAKE_TIMEOUT.saturating_sub(started.elapsed());
    tokio::time::timeout(rest, start.into_stream(config))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "handshake timed out"))?
}

/// Serves the `edgebeat.v1.Heartbeat` gRPC service on `listener` until `shutdown`
/// resolves, handing every decoded message to `handler`. At shutdown every open stream is
/// ended (agents reconnect elsewhere) and the call returns once connections have closed.
///
/// With [`GrpcServerOptions::tls`], connections are TLS (rustls on ring, ALPN `h2`), each
/// handshake in its own task with a 10 s limit. A failed handshake (no certificate, unknown
/// CA, expired, not TLS) closes that connection before any request: it never reaches
/// `handler.handle`, and is counted through [`Handler::rejected`] as
/// [`RejectReason::TlsHandshake`].
///
/// Takes the listener (not an address) so callers bind port 0 in tests. Errors:
/// [`GrpcServeError::Tls`] when the TLS material is unusable (check it first with
/// [`GrpcServerTls::check`]), [`GrpcServeError::Transport`] when serving fails.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    options: GrpcServerOptions,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), GrpcServeError> {
    let closing = tokio_util::sync::CancellationToken::new();
    let client_ca = options
        .tls
        .as_ref()
        .is_some_and(|t| t.client_ca_pem.is_some());
    let service = HeartbeatServer::new(Service {
        handler: handler.clone(),
        client_ca,
        require_node_identity: options.require_node_identity,
        closing: closing.clone(),
    })
    .max_decoding_message_size(options.max_message_bytes);
    let shutdown = {
        let closing = closing.clone();
        async move {
            shutdown.await;
            closing.cancel();
        }
    };
    let mut server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(options.keepalive))
        .http2_keepalive_timeout(Some(options.keepalive_timeout));
    let router = server.add_service(service);
    match &options.tls {
        Some(tls) => {
            let config = tls
                .rustls_config(options.require_node_identity)
                .map_err(GrpcServeError::Tls)?;
            let incoming = tls_incoming(listener, config, &options, handler, closing);
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
                .map_err(GrpcServeError::Transport)
        }
        None => router
            // TCP_NODELAY on the incoming stream itself: `Server::tcp_nodelay` is ignored
            // by `serve_with_incoming*`, and with Nagle on, small acks can wait for a
            // delayed ACK, ~40 ms on Linux.
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                shutdown,
            )
            .await
            .map_err(GrpcServeError::Transport),
    }
}
