use std::sync::Arc;
use std::time::Duration;

use edgebeat_proto::heartbeat_server::{Heartbeat, HeartbeatServer};
use edgebeat_proto::{AgentMessage, GatewayMessage, MAX_AGENT_MESSAGE_BYTES, gateway_message};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use crate::ingress::{Handler, Peer, TransportKind};

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
}

impl Default for GrpcServerOptions {
    fn default() -> Self {
        Self {
            keepalive: super::DEFAULT_KEEPALIVE,
            keepalive_timeout: super::DEFAULT_KEEPALIVE_TIMEOUT,
            max_message_bytes: MAX_AGENT_MESSAGE_BYTES,
        }
    }
}

struct Service<H> {
    handler: Arc<H>,
    /// Fires at shutdown so open streams end and tonic's graceful shutdown can finish.
    closing: tokio_util::sync::CancellationToken,
}

#[tonic::async_trait]
impl<H: Handler> Heartbeat for Service<H> {
    type ConnectStream = ReceiverStream<Result<GatewayMessage, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let peer = Peer {
            transport: TransportKind::Grpc,
            remote: request.remote_addr(),
            identity: None,
        };
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        let handler = self.handler.clone();
        let closing = self.closing.clone();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    () = closing.cancelled() => break,
                    next = inbound.message() => next,
                };
                match next {
                    Ok(Some(message)) => {
                        let ack = handler.handle(&peer, message).await;
                        let reply = GatewayMessage {
                            kind: Some(gateway_message::Kind::Ack(ack)),
                        };
                        if tx.send(Ok(reply)).await.is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        // Malformed or oversized frames end this stream only; the agent
                        // reconnects and every other stream is untouched.
                        if !matches!(status.code(), tonic::Code::Cancelled | tonic::Code::Unknown) {
                            handler.rejected(&peer, status.message());
                        }
                        tracing::debug!(peer = ?peer.remote, %status, "gRPC stream ended");
                        break;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Serves the `edgebeat.v1.Heartbeat` gRPC service on `listener` until `shutdown`
/// resolves, handing every decoded message to `handler`. At shutdown every open stream is
/// ended (agents reconnect elsewhere) and the call returns once connections have closed.
///
/// Takes the listener (not an address) so callers bind port 0 in tests. Errors: the
/// transport error tonic reports when serving fails (listener broken).
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    options: GrpcServerOptions,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let closing = tokio_util::sync::CancellationToken::new();
    let service = HeartbeatServer::new(Service {
        handler,
        closing: closing.clone(),
    })
    .max_decoding_message_size(options.max_message_bytes);
    let shutdown = async move {
        shutdown.await;
        closing.cancel();
    };
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(options.keepalive))
        .http2_keepalive_timeout(Some(options.keepalive_timeout))
        .tcp_nodelay(true)
        .add_service(service)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}
