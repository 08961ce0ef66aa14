//! `transport.caFile`, `certFile` and `keyFile` (and `gatewayCAFile`'s PEM): read, parsed
//! and checked at load into the transports' [`ClientTls`], for either kind.

use std::path::PathBuf;

use crate::config::error::{Problems, invalid};
use crate::config::{ConfigError, MAX_PEM_FILE_BYTES};

use super::{ClientTls, TlsIdentity};

/// `transport.caFile`/`certFile`/`keyFile` (`files`, in that order): with an endpoint on
/// `secure_scheme` (`https://` for gRPC, `mqtts://` for MQTT) the CA is required and cert and
/// key go together; on a plain endpoint none is allowed. Each file is read and parsed now, so
/// a bad file is reported at load with its field. Every problem goes to `p`.
pub(super) fn validate_tls(
    p: &mut Problems,
    endpoint: &str,
    secure_scheme: &str,
    files: [Option<PathBuf>; 3],
    enrolled: bool,
) -> Option<ClientTls> {
    const FIELDS: [&str; 3] = [
        "transport.caFile",
        "transport.certFile",
        "transport.keyFile",
    ];
    if !endpoint.starts_with(secure_scheme) {
        for (field, file) in FIELDS.iter().zip(&files) {
            if file.is_some() {
                p.push(
                    *field,
                    format!(
                        "only valid with a {secure_scheme} endpoint, but transport.endpoint is {endpoint:?}; use {secure_scheme} or remove it"
                    ),
                );
            }
        }
        return None;
    }
    let [ca_file, cert_file, key_file] = files;
    if enrolled {
        return enrolled_tls(p, ca_file, cert_file.is_some() || key_file.is_some());
    }
    let ca_pem = match ca_file {
        Some(file) => p.take(read_certificates("transport.caFile", &file)),
        None => {
            p.push(
                "transport.caFile",
                format!("required for a {secure_scheme} endpoint: the PEM CA certificate that signed the server's certificate"),
            );
            None
        }
    };
    let client = client_identity(p, cert_file, key_file);
    let tls = ClientTls {
        ca_pem: ca_pem?,
        client_identity: client?,
    };
    // The transport builds this same rustls configuration when it connects: a CA that is
    // PEM but no usable trust anchor, or a key rustls cannot use with its certificate, is
    // refused now rather than at the first connection.
    #[cfg(any(feature = "grpc-tls", feature = "mqtt-tls"))]
    if let Err(why) = tls.rustls_config() {
        use edgebeat_transports::tls::TlsError;
        let field = match &why {
            TlsError::In { part: "CA", .. } => "transport.caFile",
            TlsError::In {
                part: "client certificate",
                ..
            } => "transport.certFile",
            _ => "transport.keyFile",
        };
        p.push(field, format!("unusable for TLS: {why}"));
        return None;
    }
    Some(tls)
}

/// The TLS of an enrolled node at load: the CA of `caFile` when given (else the site CA its
/// enrollment brings verifies the server), never a client certificate of a file.
fn enrolled_tls(
    p: &mut Problems,
    ca_file: Option<PathBuf>,
    has_client_files: bool,
) -> Option<ClientTls> {
    if has_client_files {
        p.push(
            "transport.certFile",
            "with bootstrapTokenFile the node's certificate comes from enrollment (certDir); remove certFile and keyFile, or bootstrapTokenFile",
        );
    }
    let ca_pem = p.take(read_certificates("transport.caFile", &ca_file?))?;
    Some(ClientTls {
        ca_pem,
        client_identity: None,
    })
}

/// `transport.certFile` and `transport.keyFile`, read and parsed now: both or neither.
/// `Some(None)`: neither; `None`: a problem went to `p`.
fn client_identity(
    p: &mut Problems,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
) -> Option<Option<TlsIdentity>> {
    use rustls_pki_types::PrivateKeyDer;
    use rustls_pki_types::pem::PemObject as _;

    match (cert_file, key_file) {
        (None, None) => Some(None),
        (Some(cert), Some(key)) => {
            let cert_pem = p.take(read_certificates("transport.certFile", &cert));
            let key_pem = p.take(read_pem("transport.keyFile", &key).and_then(|pem| {
                PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                    invalid(
                        "transport.keyFile",
                        format!(
                            "{}: no usable PEM private key (PKCS#8, RSA or EC): {e}",
                            key.display()
                        ),
                    )
                })?;
                Ok(pem)
            }));
            cert_pem
                .zip(key_pem)
                .map(|(cert_pem, key_pem)| Some(TlsIdentity { cert_pem, key_pem }))
        }
        (Some(_), None) => {
            p.push(
                "transport.keyFile",
                "required when transport.certFile is set (the client certificate's private key)",
            );
            None
        }
        (None, Some(_)) => {
            p.push(
                "transport.certFile",
                "required when transport.keyFile is set (the client certificate)",
            );
            None
        }
    }
}

/// A file of at most [`MAX_PEM_FILE_BYTES`] named by `field`.
fn read_pem(field: &str, path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    edgebeat_hw::read_bounded(path, MAX_PEM_FILE_BYTES).map_err(|e| invalid(field, e.to_string()))
}

/// A PEM file of at least one certificate named by `field`.
pub(super) fn read_certificates(
    field: &str,
    path: &std::path::Path,
) -> Result<Vec<u8>, ConfigError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;

    let pem = read_pem(field, path)?;
    let count = CertificateDer::pem_slice_iter(&pem)
        .try_fold(0usize, |n, c| c.map(|_| n + 1))
        .map_err(|e| invalid(field, format!("{}: not valid PEM: {e}", path.display())))?;
    if count == 0 {
        return Err(invalid(
            field,
            format!(
                "{}: no PEM CERTIFICATE block found; give a PEM certificate file",
                path.display()
            ),
        ));
    }
    Ok(pem)
}
