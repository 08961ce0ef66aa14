//! What becomes of a certificate request that is not issued: a [`CsrRejection`] (answered
//! `Answer::Rejected`, or not answered at all), or pending (answered `Answer::Retry`, the
//! agent asks again), each counted under one `outcome` label of
//! `edgebeat_gateway_certificate_requests_total`.

/// Why a certificate request was rejected: the `outcome` label of
/// `edgebeat_gateway_certificate_requests_total` besides `issued` and `pending`, rendered by
/// [`CsrRejectReason::as_str`] alone. A fixed set, so the series are bounded; the detail of each
/// case goes to the log and the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CsrRejectReason {
    /// Neither a bootstrap token nor a node certificate proves the request, or a signed
    /// one came without its certificate.
    Unproved,
    /// The bootstrap token's Secret does not exist or cannot be read as one.
    TokenUnknown,
    /// The token proof does not verify: another secret, or an altered request.
    BadProof,
    /// The bootstrap token has expired.
    TokenExpired,
    /// The bootstrap token does not cover the node.
    TokenNode,
    /// The bootstrap token has enrolled as many nodes as it may.
    TokenUsedUp,
    /// The node certificate that signed a rotation does not parse or is not the site CA's
    /// for the node.
    Certificate,
    /// The node certificate expired beyond the grace period, or its Node is gone.
    CertificateExpired,
    /// The rotation's signature does not verify with the node certificate.
    BadSignature,
    /// The apiserver could not say whether the node of an expired certificate exists.
    Apiserver,
    /// The PKCS#10 request does not parse or its signature does not verify.
    Csr,
    /// The request's subject is not exactly `O=system:nodes, CN=system:node:<node>`.
    CsrSubject,
    /// The request asks for subject alternative names.
    CsrNames,
    /// The request asks for usages beyond digital signature and client auth.
    CsrUsages,
    /// The request's key is neither ECDSA P-256 nor Ed25519.
    CsrKey,
    /// The CertificateSigningRequest was denied or failed.
    Denied,
    /// Under kubelet's signer: the node's Node exists and is not one the gateway manages
    /// (no [`crate::bodies::MANAGED_LABEL`]), so its certificate would be the apiserver
    /// credential of a node edgebeat does not run (a worker's, a control plane's).
    NodeNotManaged,
    /// The certificate could not be signed, or its signer's certificate does not parse.
    Signing,
    /// Not answered: the payload is not a certificate request (no header or CSR).
    Malformed,
    /// Not answered: its node name is not a valid one, or not its MQTT topic's.
    Foreign,
    /// Not answered: its wall time is outside the clock window.
    ClockSkew,
    /// Not answered: a request already seen (a replay, or a redelivery).
    Replayed,
    /// Not answered: over the enrollment rate limits (the agent asks again with backoff).
    RateLimited,
}

impl CsrRejectReason {
    /// The metric label, e.g. `token_used_up`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unproved => "unproved",
            Self::TokenUnknown => "token_unknown",
            Self::BadProof => "bad_proof",
            Self::TokenExpired => "token_expired",
            Self::TokenNode => "token_node",
            Self::TokenUsedUp => "token_used_up",
            Self::Certificate => "certificate",
            Self::CertificateExpired => "certificate_expired",
            Self::BadSignature => "bad_signature",
            Self::Apiserver => "apiserver",
            Self::Csr => "csr",
            Self::CsrSubject => "csr_subject",
            Self::CsrNames => "csr_names",
            Self::CsrUsages => "csr_usages",
            Self::CsrKey => "csr_key",
            Self::Denied => "denied",
            Self::NodeNotManaged => "node_not_managed",
            Self::Signing => "signing",
            Self::Malformed => "malformed",
            Self::Foreign => "foreign",
            Self::ClockSkew => "clock_skew",
            Self::Replayed => "replayed",
            Self::RateLimited => "rate_limited",
        }
    }
}

/// A request rejected: its reason and what exactly was wrong, for the log and the answer.
#[derive(Debug)]
pub(super) struct CsrRejection {
    pub(super) reason: CsrRejectReason,
    pub(super) detail: String,
}

/// A [`CsrRejection`] for `reason` with `detail`.
pub(super) fn reject(reason: CsrRejectReason, detail: impl Into<String>) -> CsrRejection {
    CsrRejection {
        reason,
        detail: detail.into(),
    }
}

/// Why a step of a request did not go on to a certificate.
#[derive(Debug)]
pub(super) enum Unissued {
    /// Rejected for good, as it stands.
    Rejected(CsrRejection),
    /// Pending: waiting for the apiserver (unreachable, or the CSR not approved or signed
    /// yet); the agent asks again. The text says why.
    Pending(String),
}

impl From<CsrRejection> for Unissued {
    fn from(rejection: CsrRejection) -> Self {
        Self::Rejected(rejection)
    }
}
