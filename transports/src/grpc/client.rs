use std::time::Duration;

use edgebeat_proto::heartbeat_client::HeartbeatClient;
use edgebeat_proto::{MAX_AGENT_MESSAGE_BYTES, gateway_message};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;

use crate::uplink::{
    AfterAck, RegisterFn, Session, UplinkDriver, UplinkError, reconnect_backoff,
    refuse_while_waiting,
};

/// Settings of the agent's gRPC uplink.
#[derive(Debug, Clone)]
pub struct GrpcUplinkOptions {
    /// Gateway URL, `http://host:port` (or `https://` once TLS is configured).
    pub endpoint: String,
    /// Interval of HTTP/2 keepalive pings, also sent while idle (default 30 s).
    pub keepalive: Duration,
    /// Time to wait for a ping's answer before the connection counts as dead (default 10 s).
    pub keepalive_timeout: Duration,
    /// Limit for establishing the TCP (and TLS) connection (default 10 s).
    pub connect_timeout: Duration,
    /// First reconnect delay (default 200 ms); doubles with jitter up to `backoff_max`.
    pub backoff_min: Duration,
    /// Largest reconnect delay (default 7 s, kubelet's lease backoff cap).
    pub backoff_max: Duration,
}

impl GrpcUplinkOptions {
    /// Options for `endpoint` with the defaults documented on each field.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            keepalive: super::DEFAULT_KEEPALIVE,
            keepalive_timeout: super::DEFAULT_KEEPALIVE_TIMEOUT,
            connect_timeout: Duration::from_secs(10),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(7),
        }
    }
}

/// Why the gRPC uplink could not start.
#[derive(Debug, thiserror::Error)]
pub enum GrpcUplinkError {
    /// `endpoint` is not a URI tonic accepts.
    #[error("invalid gRPC endpoint {endpoint:?}: {source}")]
    Endpoint {
        /// The rejected value.
        endpoint: String,
        /// tonic's reason.
        source: tonic::transport::Error,
    },
}

enum SessionEnd {
    Cancelled,
    Closed,
    Failed { registered: bool },
}

/// Runs the agent's gRPC connection until `cancel` fires or every [`crate::uplink::Uplink`]
/// handle is dropped.
///
/// On each connection it opens one `Heartbeat.Connect` stream, sends `register()` first,
/// re-sends it with backoff (100 ms doubling to 7 s, kubelet's registration backoff) until
/// the gateway answers `registered`, and then relays requests and their acks. A lost
/// connection fails pending requests with [`UplinkError::Disconnected`]; while reconnecting
/// (jittered exponential backoff from `backoff_min` to `backoff_max`), requests are refused
/// with [`UplinkError::NotConnected`] rather than queued.
///
/// Errors: [`GrpcUplinkError::Endpoint`] when the endpoint URL is invalid (checked before
/// connecting).
pub async fn run_uplink(
    options: GrpcUplinkOptions,
    register: RegisterFn,
    mut driver: UplinkDriver,
    cancel: CancellationToken,
) -> Result<(), GrpcUplinkError> {
    let endpoint = Endpoint::from_shared(options.endpoint.clone())
        .map_err(|source| GrpcUplinkError::Endpoint {
            endpoint: options.endpoint.clone(),
            source,
        })?
        .connect_timeout(options.connect_timeout)
        .http2_keep_alive_interval(options.keepalive)
        .keep_alive_timeout(options.keepalive_timeout)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true)
        .tcp_keepalive(Some(options.keepalive));
    let mut backoff = reconnect_backoff(options.backoff_min, options.backoff_max);
    loop {
        match session(&endpoint, &register, &mut driver, &cancel).await {
            SessionEnd::Cancelled | SessionEnd::Closed => return Ok(()),
            SessionEnd::Failed { registered } => {
                if registered {
                    backoff = reconnect_backoff(options.backoff_min, options.backoff_max);
                }
            }
        }
        let delay = backoff.next().unwrap_or(options.backoff_max);
        tracing::info!(endpoint = %options.endpoint, ?delay, "reconnecting to the gateway");
        if !refuse_while_waiting(&mut driver.requests, delay, &cancel).await {
            return Ok(());
        }
    }
}

async fn session(
    endpoint: &Endpoint,
    register: &RegisterFn,
    driver: &mut UplinkDriver,
    cancel: &CancellationToken,
) -> SessionEnd {
    // Connect, refusing requests meanwhile: a renewal must not wait for a slow handshake.
    let connect = endpoint.connect();
    tokio::pin!(connect);
    let channel = loop {
        tokio::select! {
            () = cancel.cancelled() => return SessionEnd::Cancelled,
            result = &mut connect => match result {
                Ok(channel) => break channel,
                Err(error) => {
                    tracing::warn!(%error, "gRPC connect failed");
                    return SessionEnd::Failed { registered: false };
                }
            },
            request = driver.requests.recv() => match request {
                Some(r) => { let _ = r.reply.send(Err(UplinkError::NotConnected)); }
                None => return SessionEnd::Closed,
            },
        }
    };
    let mut client =
        HeartbeatClient::new(channel).max_decoding_message_size(MAX_AGENT_MESSAGE_BYTES);
    let (out, out_rx) = mpsc::channel(8);
    let register_seq = send_register(&out, register).await;
    let mut inbound = match client.connect(ReceiverStream::new(out_rx)).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            tracing::warn!(%status, "gRPC stream refused");
            return SessionEnd::Failed { registered: false };
        }
    };
    let mut state = Session::new();
    state.register_sent(register_seq);
    let register_retry = tokio::time::sleep(Duration::MAX);
    tokio::pin!(register_retry);
    let mut retry_armed = false;
    let end = loop {
        tokio::select! {
            () = cancel.cancelled() => break SessionEnd::Cancelled,
            () = &mut register_retry, if retry_armed => {
                retry_armed = false;
                state.register_sent(send_register(&out, register).await);
            }
            request = driver.requests.recv() => {
                let Some(request) = request else { break SessionEnd::Closed };
                let seq = request.message.header().map_or(0, |h| h.seq);
                if out.send(request.message).await.is_err() {
                    let _ = request.reply.send(Err(UplinkError::Disconnected));
                    break SessionEnd::Failed { registered: state.registered() };
                }
                state.track(seq, request.reply);
            }
            message = inbound.message() => match message {
                Ok(Some(message)) => {
                    let Some(gateway_message::Kind::Ack(ack)) = message.kind else { continue };
                    match state.on_ack(ack, driver) {
                        AfterAck::Nothing => {}
                        AfterAck::RegisterNow => state.register_sent(send_register(&out, register).await),
                        AfterAck::RegisterAfter(delay) => {
                            register_retry.as_mut().reset(tokio::time::Instant::now() + delay);
                            retry_armed = true;
                        }
                    }
                }
                Ok(None) => break SessionEnd::Failed { registered: state.registered() },
                Err(status) => {
                    tracing::warn!(%status, "gRPC stream broke");
                    break SessionEnd::Failed { registered: state.registered() };
                }
            },
        }
    };
    state.close(driver);
    end
}

async fn send_register(
    out: &mpsc::Sender<edgebeat_proto::AgentMessage>,
    register: &RegisterFn,
) -> Option<u64> {
    let message = register();
    let seq = message.header().map(|h| h.seq);
    // A full channel or closed stream shows up as a broken stream in the caller's loop.
    let _ = out.send(message).await;
    seq
}
