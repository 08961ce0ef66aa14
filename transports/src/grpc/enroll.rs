//! The gRPC enrollment endpoint: the `Enrollment` service on a listener of its own, which
//! needs no client certificate (a board enrolling has none yet), and its client. The bytes
//! are the enrollment endpoint's ([`edgebeat_proto::EnrollmentPayload`]): every request
//! is proved in itself and every answer signed, so the channel need not authenticate
//! either side (TLS, when used, keeps the request from view).

#[cfg(feature = "grpc-ingress")]
pub use server::{EnrollmentServerOptions, serve_enrollment};

#[cfg(feature = "grpc-uplink")]
pub use client::{EnrollmentClientError, request_certificate};

#[cfg(feature = "grpc-ingress")]
mod server {
    use std::sync::Arc;

    use edgebeat_proto::EnrollmentPayload;
    use edgebeat_proto::enrollment_server::{Enrollment, EnrollmentServer};
    use tokio::net::TcpListener;
    use tonic::{Request, Response, Status};

    use crate::grpc::{GrpcServeError, GrpcServerTls};
    use crate::ingress::{Handler, Peer, TransportKind};

    /// Settings of the gateway's gRPC enrollment listener.
    #[derive(Debug, Clone, Default)]
    pub struct EnrollmentServerOptions {
        /// TLS with the gateway's serving certificate (no client CA: a board enrolling has
        /// no certificate); `None` serves plain HTTP/2, as the requests and answers need
        /// no channel security (see the module docs).
        pub tls: Option<GrpcServerTls>,
    }

    struct Service<H> {
        handler: Arc<H>,
    }

    #[tonic::async_trait]
    impl<H: Handler> Enrollment for Service<H> {
        async fn request_certificate(
            &self,
            request: Request<EnrollmentPayload>,
        ) -> Result<Response<EnrollmentPayload>, Status> {
            let peer = Peer::unidentified(TransportKind::Grpc, request.remote_addr());
            let payload = request.into_inner().payload;
            match self.handler.request_certificate(&peer, None, payload).await {
                Some(answer) => Ok(Response::new(EnrollmentPayload { payload: answer })),
                // Rejected without an answer (a replay, the rate limit): the caller asks
                // again later, with backoff.
                None => Err(Status::unavailable("not answered; ask again later")),
            }
        }
    }

    /// Serves the `edgebeat.v1.Enrollment` service on `listener` until `shutdown`
    /// resolves, handing each request to [`Handler::request_certificate`] with the peer's
    /// address (the handler rate-limits per address and in all). Requests are limited to
    /// [`edgebeat_proto::MAX_AGENT_MESSAGE_BYTES`].
    ///
    /// Errors: [`GrpcServeError::Tls`] when the TLS material is unusable,
    /// [`GrpcServeError::Transport`] when serving fails.
    pub async fn serve_enrollment<H: Handler>(
        listener: TcpListener,
        handler: Arc<H>,
        options: EnrollmentServerOptions,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), GrpcServeError> {
        let service = EnrollmentServer::new(Service { handler })
            .max_decoding_message_size(edgebeat_proto::MAX_AGENT_MESSAGE_BYTES);
        let mut server = tonic::transport::Server::builder();
        if let Some(tls) = &options.tls {
            let identity = tonic::transport::Identity::from_pem(&tls.cert_pem, &tls.key_pem);
            server = server
                .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                .map_err(GrpcServeError::Transport)?;
        }
        server
            .add_service(service)
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                shutdown,
            )
            .await
            .map_err(GrpcServeError::Transport)
    }
}

#[cfg(feature = "grpc-uplink")]
mod client {
    use std::time::Duration;

    use edgebeat_proto::EnrollmentPayload;
    use edgebeat_proto::enrollment_client::EnrollmentClient;

    use crate::tls::ClientTls;

    /// Why a certificate request got no answer over gRPC.
    #[derive(Debug, thiserror::Error)]
    pub enum EnrollmentClientError {
        /// The endpoint URL, or its TLS settings, cannot work.
        #[error("enrollment endpoint {endpoint:?}: {message}")]
        Endpoint {
            /// The endpoint.
            endpoint: String,
            /// What is wrong.
            message: String,
        },
        /// The gateway could not be reached, or did not answer (refused without an answer,
        /// rate limited, down): ask again later.
        #[error("no answer from the enrollment endpoint: {0}")]
        Unanswered(String),
    }

    /// Sends one certificate request `payload` to the gateway's enrollment endpoint
    /// `endpoint` (`http://host:port`, or `https://` with `tls`, whose CA verifies the
    /// gateway) and returns its answer (an encoded SignedAnswer, for
    /// [`crate::enroll::read_answer`]), within `timeout`.
    ///
    /// Errors: [`EnrollmentClientError::Endpoint`] for an endpoint or TLS settings that
    /// cannot work, [`EnrollmentClientError::Unanswered`] otherwise.
    pub async fn request_certificate(
        endpoint: &str,
        tls: Option<&ClientTls>,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, EnrollmentClientError> {
        let bad = |message: String| EnrollmentClientError::Endpoint {
            endpoint: endpoint.to_owned(),
            message,
        };
        #[cfg_attr(not(feature = "grpc-tls"), allow(unused_mut))]
        let mut channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
            .map_err(|e| bad(e.to_string()))?
            .connect_timeout(timeout)
            .timeout(timeout);
        match (tls, endpoint.starts_with("https://")) {
            (None, false) => {}
            #[cfg(feature = "grpc-tls")]
            (Some(tls), true) => {
                channel = crate::grpc::client::with_tls_config(channel, tls, None, timeout)
                    .map_err(bad)?;
            }
            _ => {
                return Err(bad(
                    "https:// needs TLS settings (a CA) in a build with TLS, http:// none".into(),
                ));
            }
        }
        // The uplink's own connector: one TCP and HTTP/2 stack in the agent, not two.
        let channel = channel
            .connect_with_connector(crate::grpc::client::Connector {
                user_timeout: timeout,
            })
            .await
            .map_err(|e| EnrollmentClientError::Unanswered(e.to_string()))?;
        let mut client = EnrollmentClient::new(channel)
            .max_decoding_message_size(edgebeat_proto::MAX_AGENT_MESSAGE_BYTES);
        let answer = client
            .request_certificate(EnrollmentPayload { payload })
            .await
            .map_err(|status| EnrollmentClientError::Unanswered(status.to_string()))?;
        Ok(answer.into_inner().payload)
    }
}
