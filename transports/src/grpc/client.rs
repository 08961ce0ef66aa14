use std::time::Duration;

use edgebeat_proto::heartbeat_client::HeartbeatClient;
use edgebeat_proto::{MAX_AGENT_MESSAGE_BYTES, gateway_message};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
#[cfg(feature = "grpc-tls")]
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use super::tls::ClientTls;
#[cfg(feature = "grpc-tls")]
use super::tls::{self};

use crate::uplink::{
    AfterAck, HeaderForm, RegisterFn, Session, UplinkDriver, UplinkError, reconnect_backoff,
    refuse_while_waiting,
};

/// Settings of the agent's gRPC uplink.
#[derive(Debug, Clone, PartialEq)]
pub struct GrpcUplinkOptions {
    /// Gateway URL: `http://host:port`, or `https://host:port` with [`Self::tls`] set.
    pub endpoint: String,
    /// TLS for an `https://` endpoint (required there, refused with `http://`; needs
    /// feature `grpc-tls`): the CA to verify the gateway against (server name = the URL's
    /// host) and, for mTLS, the node's client certificate. Read once; rotating certificates
    /// means restarting the uplink.
    pub tls: Option<ClientTls>,
    /// The name the gateway's certificate must be valid for, when not the URL's host
    /// (default `None`: the host). An enrolled agent that trusts the site CA alone sets it
    /// to [`ANSWER_SIGNER_NAME`](crate::signing::ANSWER_SIGNER_NAME), the name of the
    /// certificate the gateway issues itself from that CA.
    pub tls_server_name: Option<String>,
    /// HTTP/2 keepalive: a ping after this long without receiving anything, also while
    /// idle (default [`GRPC_AGENT_KEEPALIVE`](crate::endpoint::GRPC_AGENT_KEEPALIVE), 5 min).
    /// While renewals flow, `TCP_USER_TIMEOUT` notices a dead link without pings (see
    /// `keepalive_timeout`), so a long interval costs no safety.
    pub keepalive: Duration,
    /// Time to wait for a ping's answer before the connection counts as dead (default 10 s);
    /// twice this is the socket's `TCP_USER_TIMEOUT`, the longest a sent renewal may go
    /// unacknowledged by the gateway's TCP before the connection is dropped and made anew.
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
            tls: None,
            tls_server_name: None,
            keepalive: crate::endpoint::GRPC_AGENT_KEEPALIVE,
            keepalive_timeout: super::DEFAULT_KEEPALIVE_TIMEOUT,
            connect_timeout: Duration::from_secs(10),
            backoff_min: crate::backoff::RETRY_MIN,
            backoff_max: crate::backoff::RETRY_MAX,
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
    /// The TLS settings do not fit the endpoint (`https://` without them, `http://` with
    /// them) or the PEM material is unusable.
    #[error("gRPC TLS for {endpoint:?}: {message}")]
    Tls {
        /// The endpoint.
        endpoint: String,
        /// What is wrong.
        message: String,
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
/// with [`UplinkError::NotConnected`] rather than queued. On shutdown it ends the stream
/// cleanly (END_STREAM) and waits up to 500 ms for the gateway to end the call.
///
/// Errors: [`GrpcUplinkError::Endpoint`] when the endpoint URL is invalid,
/// [`GrpcUplinkError::Tls`] when the TLS settings do not fit it (both checked before
/// connecting).
pub async fn run_uplink(
    options: GrpcUplinkOptions,
    register: RegisterFn,
    driver: &mut UplinkDriver,
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
        .keep_alive_while_idle(true);
    let endpoint = with_tls(endpoint, &options)?;
    let mut backoff = reconnect_backoff(options.backoff_min, options.backoff_max);
    loop {
        match session(
            &endpoint,
            options.keepalive_timeout * 2,
            &register,
            driver,
            &cancel,
        )
        .await
        {
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

/// Applies [`GrpcUplinkOptions::tls`] to `endpoint`: the CA, the client identity, and the
/// URL's host as the server name checked against the gateway's certificate.
fn with_tls(endpoint: Endpoint, options: &GrpcUplinkOptions) -> Result<Endpoint, GrpcUplinkError> {
    let error = |message: String| GrpcUplinkError::Tls {
        endpoint: options.endpoint.clone(),
        message,
    };
    let https = endpoint.uri().scheme_str() == Some("https");
    let tls = match (&options.tls, https) {
        (None, false) => return Ok(endpoint),
        (None, true) => {
            return Err(error(
                "an https:// endpoint needs TLS settings (at least the CA that signed the gateway's certificate)".into(),
            ));
        }
        (Some(_), false) => {
            return Err(error(
                "TLS settings are given but the endpoint is not https://".into(),
            ));
        }
        (Some(tls), true) => tls,
    };
    #[cfg(not(feature = "grpc-tls"))]
    {
        let _ = (endpoint, tls);
        Err(error(
            "this build has no TLS support (edgebeat-transports feature grpc-tls; the agent's feature tls)".into(),
        ))
    }
    #[cfg(feature = "grpc-tls")]
    with_tls_config(
        endpoint,
        tls,
        options.tls_server_name.as_deref(),
        options.connect_timeout,
    )
    .map_err(error)
}

/// The TLS part of [`with_tls`]. Errors: what is unusable, for [`GrpcUplinkError::Tls`].
#[cfg(feature = "grpc-tls")]
pub(super) fn with_tls_config(
    endpoint: Endpoint,
    tls: &ClientTls,
    server_name: Option<&str>,
    connect_timeout: Duration,
) -> Result<Endpoint, String> {
    tls::install_ring_provider();
    let host = match server_name {
        Some(name) => name.to_owned(),
        None => endpoint
            .uri()
            .host()
            .ok_or_else(|| "the endpoint has no host".to_owned())?
            // `Uri::host` keeps an IPv6 literal's brackets; the server name is the bare
            // address.
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
    };
    // Checked here so a bad file is named precisely instead of as tonic's parse error.
    tls::parse_certificates(&tls.ca_pem).map_err(|e| format!("CA: {e}"))?;
    let mut config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&tls.ca_pem))
        .domain_name(host)
        .timeout(connect_timeout.min(super::TLS_HANDSHAKE_TIMEOUT));
    if let Some(identity) = &tls.client_identity {
        tls::parse_certificates(&identity.cert_pem)
            .map_err(|e| format!("client certificate: {e}"))?;
        tls::parse_private_key(&identity.key_pem).map_err(|e| format!("client key: {e}"))?;
        config = config.identity(Identity::from_pem(&identity.cert_pem, &identity.key_pem));
    }
    endpoint.tls_config(config).map_err(|e| error_chain(&e))
}

/// `error: cause: cause…`, since tonic's transport error alone says only "transport error".
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Opens the agent's TCP connections (tonic adds TLS on top): `TCP_NODELAY`, TCP keepalive
/// probes after `user_timeout` of silence, and `TCP_USER_TIMEOUT` = `user_timeout`
/// (`tcp(7)`): a renewal the gateway's kernel has not acknowledged by then ends the
/// connection, so a dead link is noticed within one `user_timeout` of the next renewal,
/// without HTTP/2 pings while renewals flow.
#[derive(Clone, Copy)]
pub(super) struct Connector {
    pub(super) user_timeout: Duration,
}

impl tonic::codegen::Service<tonic::transport::Uri> for Connector {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: tonic::transport::Uri) -> Self::Future {
        let user_timeout = self.user_timeout;
        Box::pin(async move {
            let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
            let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
                Some("https") => 443,
                _ => 80,
            });
            let stream = tokio::net::TcpStream::connect((host, port)).await?;
            stream.set_nodelay(true)?;
            let socket = socket2::SockRef::from(&stream);
            socket.set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(user_timeout))?;
            socket.set_tcp_user_timeout(Some(user_timeout))?;
            Ok(hyper_util::rt::TokioIo::new(stream))
        })
    }
}

async fn session(
    endpoint: &Endpoint,
    user_timeout: Duration,
    register: &RegisterFn,
    driver: &mut UplinkDriver,
    cancel: &CancellationToken,
) -> SessionEnd {
    // Connect, refusing requests meanwhile: a renewal must not wait for a slow handshake.
    let connect = endpoint.connect_with_connector(Connector { user_timeout });
    tokio::pin!(connect);
    let channel = loop {
        tokio::select! {
            () = cancel.cancelled() => return SessionEnd::Cancelled,
            result = &mut connect => match result {
                Ok(channel) => break channel,
                Err(error) => {
                    // The chain carries the TLS reason (unknown CA, expired, name mismatch).
                    tracing::warn!(error = %error_chain(&error), "gRPC connect failed");
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
    // Opening the stream waits for the gateway's response headers, which a dead link never
    // brings: shutdown must not wait for TCP_USER_TIMEOUT.
    let opened = tokio::select! {
        () = cancel.cancelled() => return SessionEnd::Cancelled,
        opened = client.connect(ReceiverStream::new(out_rx)) => opened,
    };
    let mut inbound = match opened {
        Ok(response) => response.into_inner(),
        Err(status) => {
            tracing::warn!(%status, "gRPC stream refused");
            return SessionEnd::Failed { registered: false };
        }
    };
    // Over TLS the answers come from the gateway the CA vouches for.
    let tls = endpoint.uri().scheme_str() == Some("https");
    let mut state = Session::new().with_authenticated_answers(tls);
    state.register_sent(register_seq);
    driver.connected();
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
                let quiet = request.message.is_quiet();
                let mut message = request.message;
                if state.header_form() != HeaderForm::Full {
                    // The stream's Register told the gateway who and which boot.
                    message.compact_header();
                }
                if out.send(message).await.is_err() {
                    let _ = request.reply.send(Err(UplinkError::Disconnected));
                    break SessionEnd::Failed { registered: state.registered() };
                }
                state.track(seq, request.reply, quiet);
            }
            message = inbound.message() => match message {
                Ok(Some(message)) => {
                    let Some(gateway_message::Kind::Ack(ack)) = message.kind else { continue };
                    match state.on_ack(ack, driver) {
                        // Certificates are for signed MQTT; gRPC's is in the handshake.
                        AfterAck::Nothing | AfterAck::PublishCertificate => {}
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
    if matches!(end, SessionEnd::Cancelled | SessionEnd::Closed) {
        close_stream(out, inbound).await;
    }
    end
}

/// Longest a stopping agent waits for the gateway to end the call after ending its own
/// request stream ([`close_stream`]), 500 ms: a gateway on a working link answers within a
/// round trip (plus the message it may be handling), and the agent must exit well within a
/// second of SIGTERM, connected or not, so that `TimeoutStopSec` never has to kill it
/// (deploy/systemd/edgebeat-agent.service).
const CLOSE_TIMEOUT: Duration = Duration::from_millis(500);

/// Ends the session's `Heartbeat.Connect` call cleanly at shutdown, as a gRPC client does:
/// ends the request stream (HTTP/2 END_STREAM), which the gateway reads as the agent's
/// goodbye rather than a reset or a broken connection, then waits up to [`CLOSE_TIMEOUT`]
/// for the gateway to end the call in turn (its trailers). Waiting keeps the process, and
/// with it the connection task that writes the end, alive until the end is on the wire;
/// dropping the stream at once would reset it instead.
async fn close_stream(
    out: mpsc::Sender<edgebeat_proto::AgentMessage>,
    mut inbound: tonic::Streaming<edgebeat_proto::GatewayMessage>,
) {
    drop(out);
    let ended = async {
        loop {
            match inbound.message().await {
                // Answers to requests the session has already failed: nobody awaits them.
                Ok(Some(_)) => {}
                Ok(None) => return Ok(()),
                Err(status) => return Err(status),
            }
        }
    };
    match tokio::time::timeout(CLOSE_TIMEOUT, ended).await {
        Ok(Ok(())) => tracing::info!("gRPC stream closed"),
        Ok(Err(status)) => tracing::debug!(%status, "the gRPC stream broke while closing"),
        Err(_) => tracing::warn!(
            timeout = ?CLOSE_TIMEOUT,
            "the gateway did not end the gRPC stream in time; closing the connection"
        ),
    }
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

#[cfg(all(test, feature = "grpc-tls"))]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::grpc::TlsIdentity;

    fn ca_pem() -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem().into_bytes()
    }

    fn options(endpoint: &str, tls: Option<ClientTls>) -> GrpcUplinkOptions {
        let mut options = GrpcUplinkOptions::new(endpoint);
        options.tls = tls;
        options
    }

    fn check(options: &GrpcUplinkOptions) -> Result<Endpoint, GrpcUplinkError> {
        with_tls(
            Endpoint::from_shared(options.endpoint.clone()).unwrap(),
            options,
        )
    }

    #[test]
    fn tls_settings_must_fit_the_scheme() {
        let tls = ClientTls {
            ca_pem: ca_pem(),
            client_identity: None,
        };
        check(&options("http://gw:7443", None)).unwrap();
        check(&options("https://gw:7443", Some(tls.clone()))).unwrap();
        check(&options("https://[::1]:7443", Some(tls.clone()))).unwrap();
        let err = check(&options("https://gw:7443", None)).unwrap_err();
        assert!(err.to_string().contains("needs TLS settings"), "{err}");
        let err = check(&options("http://gw:7443", Some(tls))).unwrap_err();
        assert!(err.to_string().contains("not https://"), "{err}");
    }

    #[test]
    fn unusable_pem_is_named() {
        let bad_ca = ClientTls {
            ca_pem: b"not pem".to_vec(),
            client_identity: None,
        };
        let err = check(&options("https://gw:7443", Some(bad_ca))).unwrap_err();
        assert!(err.to_string().contains("CA: "), "{err}");
        let bad_key = ClientTls {
            ca_pem: ca_pem(),
            client_identity: Some(TlsIdentity {
                cert_pem: ca_pem(),
                key_pem: b"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n".to_vec(),
            }),
        };
        let err = check(&options("https://gw:7443", Some(bad_key))).unwrap_err();
        assert!(err.to_string().contains("client key: "), "{err}");
    }
}

#[cfg(test)]
mod connector_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tonic::codegen::Service as _;

    /// The agent's socket notices a dead link from unacknowledged data: TCP_USER_TIMEOUT is
    /// set (and Nagle is off), read back from the kernel.
    #[tokio::test]
    async fn the_agents_socket_carries_its_user_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut connector = Connector {
            user_timeout: Duration::from_secs(20),
        };
        let uri: tonic::transport::Uri = format!("http://127.0.0.1:{port}").parse().unwrap();
        let io = connector.call(uri).await.unwrap();
        let socket = socket2::SockRef::from(io.inner());
        assert_eq!(
            socket.tcp_user_timeout().unwrap(),
            Some(Duration::from_secs(20))
        );
        assert!(socket.tcp_nodelay().unwrap());
        assert!(socket.keepalive().unwrap());
    }
}
