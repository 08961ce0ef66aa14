//! Node certificates the agent enrolls for and rotates itself (`bootstrapTokenFile`,
//! `certDir`, `rotateCertificates`): their settings, and their check with `transport`,
//! which they need.

use std::path::PathBuf;
use std::time::Duration;

use super::TransportConfig;
use super::error::Problems;
use super::transport::{RawTransport, validate_transport};
use super::values::AbsolutePath;

/// Default `certDir` (kubelet's `--cert-dir` is `/var/lib/kubelet/pki`): edgebeat's own
/// state directory, `StateDirectory=edgebeat` in the systemd unit.
pub const DEFAULT_CERT_DIR: &str = "/var/lib/edgebeat/pki";

/// Node certificates the agent enrolls for with a bootstrap token and rotates before they
/// expire, as kubelet's TLS bootstrap and `rotateCertificates`
/// (`pkg/kubelet/certificate/bootstrap/bootstrap.go`, client-go
/// `util/certificate/certificate_manager.go`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedCertificates {
    /// `bootstrapTokenFile`: the file holding the bootstrap token
    /// (`<id>.<secret>.sha256:<CA hash>`, as `edgebeat-gateway token create` prints it).
    /// Read only while the node holds no usable certificate; it may be deleted after.
    pub bootstrap_token_file: PathBuf,
    /// `certDir` (kubelet's `--cert-dir`; default [`DEFAULT_CERT_DIR`]): where the
    /// certificate with its key and the site CA are kept.
    pub cert_dir: PathBuf,
    /// `rotateCertificates` (default true): ask for a new certificate, with a new key, at
    /// 70–90 % of the current one's lifetime or when the gateway says it is due.
    pub rotate_certificates: bool,
    /// `transport.enrollmentEndpoint` (gRPC only): the gateway's enrollment listener. MQTT
    /// requests go through the broker.
    pub enrollment_endpoint: Option<String>,
}

/// The raw fields of certificates the agent enrolls for and rotates.
pub(super) struct RawManaged {
    pub(super) bootstrap_token_file: Option<AbsolutePath>,
    pub(super) cert_dir: Option<AbsolutePath>,
    pub(super) rotate_certificates: Option<bool>,
}

/// `transport` (checked by [`validate_transport`] for a Lease renew interval of `renew`)
/// and the certificates the agent manages (`bootstrapTokenFile`, `certDir`,
/// `rotateCertificates`), which need each other: problems go to `p`.
pub(super) fn transport_section(
    p: &mut Problems,
    transport: Option<RawTransport>,
    managed: RawManaged,
    renew: Duration,
) -> (Option<TransportConfig>, Option<ManagedCertificates>) {
    let enrolled = managed.bootstrap_token_file.is_some();
    if !enrolled && (managed.cert_dir.is_some() || managed.rotate_certificates.is_some()) {
        p.push(
            if managed.cert_dir.is_some() { "certDir" } else { "rotateCertificates" },
            "only valid with bootstrapTokenFile (certificates the agent enrolls for and rotates); add it, or remove this field",
        );
    }
    let Some(transport) = transport else {
        if enrolled {
            p.push(
                "bootstrapTokenFile",
                "needs transport: the enrollment goes to the gateway over it",
            );
        }
        return (None, None);
    };
    let Some((transport, endpoint)) = validate_transport(p, transport, renew, enrolled) else {
        return (None, None);
    };
    let certificates = managed_certificates(
        managed.bootstrap_token_file,
        managed.cert_dir,
        managed.rotate_certificates,
        endpoint,
    );
    (Some(transport), certificates)
}

/// `bootstrapTokenFile`, `certDir` and `rotateCertificates` with the enrollment endpoint
/// `transport` gave; `None` without a token file.
fn managed_certificates(
    token_file: Option<AbsolutePath>,
    cert_dir: Option<AbsolutePath>,
    rotate: Option<bool>,
    enrollment_endpoint: Option<String>,
) -> Option<ManagedCertificates> {
    let AbsolutePath(bootstrap_token_file) = token_file?;
    Some(ManagedCertificates {
        bootstrap_token_file,
        cert_dir: cert_dir.map_or_else(|| PathBuf::from(DEFAULT_CERT_DIR), |AbsolutePath(d)| d),
        rotate_certificates: rotate.unwrap_or(true),
        enrollment_endpoint,
    })
}
