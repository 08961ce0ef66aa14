//! Node certificates without hands, the agent's half: enrollment with a bootstrap token,
//! rotation before expiry, and the live swap of the transport's identity.
//!
//! kubelet's TLS bootstrap and `rotateCertificates` (`pkg/kubelet/certificate/bootstrap/
//! bootstrap.go`, client-go `util/certificate/certificate_manager.go`), over edgebeat's
//! transports (wire shapes: `edgebeat_transports::enroll`):
//!
//! 1. **At start** the certificate in `certDir` ([`CURRENT_FILE`], else [`PREVIOUS_FILE`])
//!    is the node's identity. Without one, the agent makes a P-256 key (kept in
//!    [`PENDING_KEY_FILE`] until its certificate comes, so a restart during a manual
//!    approval asks for the same CSR), reads the token of `bootstrapTokenFile` and sends a
//!    certificate request proved by it: to `transport.enrollmentEndpoint` over gRPC, through
//!    the broker over MQTT. The answer must verify against the site CA the token pins
//!    (kubeadm's `discovery-token-ca-cert-hash`). Pending (manual approval) or unanswered:
//!    it asks again after 2 s doubling to 60 s, with jitter; the token file is read again
//!    each time, so a used-up token can be replaced in place.
//! 2. **Rotation** (`rotateCertificates`, on by default): at a uniformly random 70–90 % of
//!    the certificate's lifetime (`certificate_manager.go: nextRotationDeadline`), or at
//!    once when the gateway says it is due (`Ack.certificate_due`, for boards whose clock
//!    cannot be trusted), the agent makes a new key and sends a request signed by its
//!    current key and certificate; the answer must verify against the site CA. A rotation
//!    the gateway refuses (the certificate expired longer than its grace ago, the Node
//!    deleted) falls back to the bootstrap token, if one is still there.
//! 3. **Writing**: certificate and key as one PEM file, written to a temporary file,
//!    `fsync`ed, renamed over [`CURRENT_FILE`], the directory `fsync`ed; the one it replaces
//!    becomes [`PREVIOUS_FILE`], kept until the new one has carried an accepted `Register`.
//!    A power cut leaves either pair whole, never a certificate without its key.
//! 4. **Swap**: the transport is stopped and started again with the new identity on the
//!    same uplink: the loops' requests wait in it meanwhile, so the Lease goes on (gRPC makes
//!    a new connection with the new certificate; MQTT republishes the retained certificate
//!    and signs with the new key).
//!
//! The server is verified against `transport.caFile` when given, else against the site CA
//! the enrollment brought: the gateway's gRPC listener by the name of the certificate it
//! issues itself ([`edgebeat_transports::signing::ANSWER_SIGNER_NAME`]), a broker by its
//! host name.

mod identity;
mod request;
mod rotation;
mod store;

use std::path::PathBuf;

use edgebeat_hw::Clock;
use edgebeat_transports::enroll;
use edgebeat_transports::tls::{self, ClientTls};

use crate::config::{ManagedCertificates, TransportConfig};
use crate::error::AgentError;
use crate::header::HeaderFactory;
use crate::metrics::AgentMetrics;

pub use identity::NodeIdentity;
pub use request::{REQUEST_RETRY_MAX, REQUEST_RETRY_MIN, REQUEST_TIMEOUT};
pub use rotation::{ROTATION_WINDOW, run};
pub use store::{
    ANSWER_CAS_FILE, CA_FILE, CURRENT_FILE, CertStore, PENDING_KEY_FILE, PREVIOUS_FILE, read_token,
    write_atomically,
};

/// Why a managed certificate could not be read, asked for or taken.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// A certificate or key that does not parse or cannot be used (a file in `certDir`, an
    /// issued chain).
    #[error("unusable certificate: {0}")]
    Unusable(String),
    /// TLS material that does not parse or cannot be used (a file in `certDir`, an issued
    /// chain, the site CA).
    #[error("unusable certificate: {0}")]
    Tls(#[from] tls::TlsError),
    /// `bootstrapTokenFile` cannot be read or holds no token.
    #[error("bootstrapTokenFile {}: {reason}", file.display())]
    Token {
        /// The file.
        file: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The node key cannot be made, stored or used for a request.
    #[error("node key: {0}")]
    Key(String),
    /// No answer came: the gateway or broker unreachable, the request over the gateway's
    /// limits, a timeout.
    #[error("no answer: {0}")]
    Unanswered(String),
    /// An answer came but was not taken (see [`enroll::ReadAnswerError`]).
    #[error(transparent)]
    Answer(#[from] enroll::ReadAnswerError),
}

/// One agent's certificate manager: how it asks and whom it trusts.
pub struct Manager<'a> {
    /// The settings.
    pub managed: &'a ManagedCertificates,
    /// The transport as configured (`caFile`'s CA, no client identity).
    pub transport: &'a TransportConfig,
    /// Headers of the requests (the agent's own: node, boot, sequence).
    pub headers: &'a HeaderFactory,
    /// Wall time for validity and the rotation deadline.
    pub clock: &'a dyn Clock,
    /// Counts requests and holds the certificate's expiry.
    pub metrics: &'a AgentMetrics,
    /// The store in `certDir`.
    pub store: CertStore,
}

impl Manager<'_> {
    fn now(&self) -> i64 {
        self.clock.unix_now().seconds()
    }

    /// The CA of `transport.caFile`, when given.
    fn ca_file(&self) -> Option<&[u8]> {
        self.transport.tls().map(|t| t.ca_pem.as_slice())
    }

    /// The transport with `identity` as its TLS client identity, verifying the server
    /// against `caFile` or else the site CA (see the module docs).
    ///
    /// Errors: [`AgentError::Certificates`] when the transport cannot use it.
    pub fn configure(&self, identity: &NodeIdentity) -> Result<TransportConfig, AgentError> {
        let mut transport = self.transport.clone();
        #[cfg(feature = "grpc")]
        let gateway_ca = match (&self.transport, identity.answer_cas.is_empty()) {
            // The gateway's own gRPC certificate comes from an answer CA, like its answers.
            (TransportConfig::Grpc(_), false) => identity.answer_cas_pem(),
            _ => identity.ca_pem.clone(),
        };
        #[cfg(not(feature = "grpc"))]
        let gateway_ca = identity.ca_pem.clone();
        let server_ca = self
            .ca_file()
            .map_or_else(|| gateway_ca.into_bytes(), <[u8]>::to_vec);
        let tls = ClientTls {
            ca_pem: server_ca,
            client_identity: Some(identity.tls_identity()),
        };
        #[cfg(feature = "grpc")]
        let trusts_site_ca = self.ca_file().is_none();
        transport
            .set_tls(tls)
            .map_err(|e| AgentError::Certificates(e.to_string()))?;
        match &mut transport {
            #[cfg(feature = "grpc")]
            TransportConfig::Grpc(g) => {
                if trusts_site_ca {
                    g.tls_server_name =
                        Some(edgebeat_transports::signing::ANSWER_SIGNER_NAME.to_owned());
                }
            }
            #[cfg(feature = "mqtt")]
            TransportConfig::Mqtt(m) => {
                #[cfg(feature = "mqtt-tls")]
                if identity.answer_cas.is_empty() {
                    m.set_gateway_ca(identity.ca_pem.as_bytes())
                } else {
                    m.set_answer_cas(&identity.answer_cas)
                }
                .map_err(|e| AgentError::Certificates(e.to_string()))?;
                let _ = m;
            }
        }
        Ok(transport)
    }
}

#[cfg(test)]
mod tests;
