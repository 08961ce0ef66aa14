//! Certificate requests: asking until a certificate is issued, proved by the current
//! certificate or else the bootstrap token, over the configured transport's enrollment
//! path, with the answer verified as the proof says.

use std::time::Duration;

use edgebeat_proto::Header;
use edgebeat_transports::enroll::{self, AnswerTrust, Answered, NodeKeyPair};
#[cfg(feature = "mqtt-tls")]
use edgebeat_transports::tls::ClientTls;
use rustls_pki_types::UnixTime;
use tokio_util::sync::CancellationToken;

use crate::config::TransportConfig;
use crate::metrics::CertificateRequestKind;

use super::identity::NodeIdentity;
use super::store::read_token;
use super::{CertificateError, Manager};

/// First delay before asking again after a pending or unanswered request: 2 s, doubling
/// with jitter up to [`REQUEST_RETRY_MAX`].
pub const REQUEST_RETRY_MIN: Duration = Duration::from_secs(2);
/// Longest delay between two certificate requests: 60 s (a fleet waiting for a manual
/// approval asks about once a minute per board).
pub const REQUEST_RETRY_MAX: Duration = Duration::from_secs(60);
/// Time allowed for one request's answer (the gateway creates, approves and signs a CSR
/// meanwhile): 30 s.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What one request came to.
enum Attempt {
    Issued(NodeIdentity),
    Pending(String),
    Refused(String),
}

impl Manager<'_> {
    /// Asks until a certificate is issued, proved by `current` while the gateway takes it
    /// and else by the bootstrap token (see the module docs); `None` when `cancel` fires.
    pub async fn obtain(
        &self,
        current: Option<&NodeIdentity>,
        cancel: &CancellationToken,
    ) -> Option<NodeIdentity> {
        let kind = if current.is_some() {
            CertificateRequestKind::Rotation
        } else {
            CertificateRequestKind::Enrollment
        };
        let mut by_certificate = current;
        let mut delays =
            edgebeat_transports::backoff::reconnect_backoff(REQUEST_RETRY_MIN, REQUEST_RETRY_MAX);
        loop {
            let attempt = match self.store.pending_key() {
                Ok(key) => match by_certificate {
                    Some(identity) => self.by_certificate(identity, &key).await,
                    None => self.by_token(&key).await,
                },
                Err(e) => Err(e),
            };
            match attempt {
                Ok(Attempt::Issued(identity)) => match self.store.save(&identity) {
                    Ok(()) => {
                        self.metrics.certificate_request(kind, "issued");
                        self.metrics.certificate_expires(identity.not_after);
                        tracing::info!(
                            node = self.headers.node_name(),
                            not_after = identity.not_after,
                            dir = %self.store.dir.display(),
                            "node certificate issued and stored"
                        );
                        return Some(identity);
                    }
                    Err(error) => {
                        self.metrics.certificate_request(kind, "failed");
                        tracing::error!(%error, dir = %self.store.dir.display(), "the issued certificate could not be stored; asking again");
                    }
                },
                Ok(Attempt::Pending(why)) => {
                    self.metrics.certificate_request(kind, "pending");
                    tracing::info!(node = self.headers.node_name(), %why, "certificate request pending; asking again later");
                }
                Ok(Attempt::Refused(why)) => {
                    self.metrics.certificate_request(kind, "refused");
                    if by_certificate.take().is_some() {
                        tracing::warn!(node = self.headers.node_name(), %why, "rotation refused; asking with the bootstrap token");
                        continue;
                    }
                    tracing::error!(node = self.headers.node_name(), %why, file = %self.managed.bootstrap_token_file.display(), "enrollment refused: the bootstrap token does not cover this node, is used up or expired; put a new one in the file");
                }
                Err(error) => {
                    self.metrics.certificate_request(kind, "failed");
                    tracing::warn!(node = self.headers.node_name(), %error, "certificate request failed; asking again later");
                }
            }
            let delay = delays.next().unwrap_or(REQUEST_RETRY_MAX);
            tokio::select! {
                () = cancel.cancelled() => return None,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// One request proved by the bootstrap token, its answer verified against the pin.
    async fn by_token(&self, key: &NodeKeyPair) -> Result<Attempt, CertificateError> {
        let token = read_token(&self.managed.bootstrap_token_file)?;
        let header = self.headers.next();
        let csr = key
            .certificate_request(self.headers.node_name())
            .map_err(|e| CertificateError::Key(e.to_string()))?;
        let payload = enroll::token_request(&token, header.clone(), csr);
        let trust = AnswerTrust::Pin(token.ca_pin);
        let answer = self.send(payload, &header, trust, None).await?;
        self.attempt(answer, key)
    }

    /// One request proved by `identity`, its answer verified against its site CA.
    async fn by_certificate(
        &self,
        identity: &NodeIdentity,
        key: &NodeKeyPair,
    ) -> Result<Attempt, CertificateError> {
        let header = self.headers.next();
        let csr = key
            .certificate_request(self.headers.node_name())
            .map_err(|e| CertificateError::Key(e.to_string()))?;
        let payload = enroll::certificate_request(&identity.signer()?, header.clone(), csr)
            .map_err(|e| CertificateError::Key(e.to_string()))?;
        let trust = if identity.answer_cas.is_empty() {
            AnswerTrust::Ca(identity.ca_pem.as_bytes())
        } else {
            AnswerTrust::AnswerCas(&identity.answer_cas)
        };
        let answer = self.send(payload, &header, trust, Some(identity)).await?;
        self.attempt(answer, key)
    }

    fn attempt(&self, answer: Answered, key: &NodeKeyPair) -> Result<Attempt, CertificateError> {
        Ok(match answer {
            Answered::Issued {
                chain,
                ca,
                answer_cas,
            } => Attempt::Issued(NodeIdentity::issued(&chain, &ca, answer_cas, key)?),
            Answered::Pending(why) => Attempt::Pending(why),
            Answered::Rejected(why) => Attempt::Refused(why),
        })
    }

    /// Sends `payload` over the configured transport's enrollment path and reads the
    /// answer to `header` as `trust` says. `identity`: the site CA is known (rotation).
    async fn send(
        &self,
        payload: Vec<u8>,
        header: &Header,
        trust: AnswerTrust<'_>,
        identity: Option<&NodeIdentity>,
    ) -> Result<Answered, CertificateError> {
        #[cfg(not(feature = "mqtt"))]
        let _ = identity;
        let node = self.headers.node_name();
        let boot_tag = header.named_boot_tag();
        let seq = header.seq;
        let now = || UnixTime::since_unix_epoch(self.clock.unix_now().duration());
        let read = |answer: &[u8]| {
            enroll::read_answer(answer, trust, node, boot_tag, seq, now()).inspect_err(|error| {
                if let enroll::ReadAnswerError::Unverified(refused) = error {
                    self.metrics.answers_refused().count(refused);
                }
            })
        };
        match self.transport {
            #[cfg(feature = "grpc")]
            TransportConfig::Grpc(_) => {
                let endpoint = self.managed.enrollment_endpoint.as_deref().ok_or_else(|| {
                    CertificateError::Unanswered("no transport.enrollmentEndpoint".into())
                })?;
                let tls = self.transport.tls();
                let answer = edgebeat_transports::grpc::enroll::request_certificate(
                    endpoint,
                    tls,
                    payload,
                    REQUEST_TIMEOUT,
                )
                .await
                .map_err(|e| CertificateError::Unanswered(e.to_string()))?;
                Ok(read(&answer)?)
            }
            #[cfg(feature = "mqtt")]
            TransportConfig::Mqtt(options) => {
                #[cfg(feature = "mqtt-tls")]
                {
                    let tls = match (self.ca_file(), identity) {
                        (Some(_), _) => None,
                        (None, Some(identity)) => Some(
                            ClientTls {
                                ca_pem: identity.ca_pem.clone().into_bytes(),
                                client_identity: None,
                            }
                            .rustls_config()
                            .map_err(CertificateError::Tls)?,
                        ),
                        (None, None) => match trust {
                            AnswerTrust::Pin(pin) => Some(
                                enroll::PinnedCaVerifier::client_config(pin)
                                    .map_err(CertificateError::Tls)?,
                            ),
                            AnswerTrust::Ca(_) | AnswerTrust::AnswerCas(_) => None,
                        },
                    };
                    let answer = edgebeat_transports::mqtt::enroll::request_certificate(
                        options,
                        node,
                        tls,
                        payload,
                        |answer| read(answer).is_ok(),
                        REQUEST_TIMEOUT,
                    )
                    .await
                    .map_err(|e| CertificateError::Unanswered(e.to_string()))?;
                    Ok(read(&answer)?)
                }
                #[cfg(not(feature = "mqtt-tls"))]
                {
                    let _ = (options, payload, identity, read);
                    Err(CertificateError::Unanswered(
                        "this build has no MQTT TLS".into(),
                    ))
                }
            }
        }
    }
}
