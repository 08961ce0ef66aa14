//! TLS on a bootstrap token's pin alone: the server verifier of a board that does not hold
//! the site CA yet.

use rustls::pki_types::CertificateDer;

use super::ca_pin;

/// A TLS server verifier for a board that knows only its bootstrap token's pin: the server
/// must present, in its chain, a CA certificate whose SubjectPublicKeyInfo has the pin
/// ([`ca_pin`]), and its certificate must chain to that CA and be valid for the name
/// dialled, as webpki checks against a CA file. For an MQTT broker whose certificate the
/// site CA issued (its certificate file holding the CA too), before the agent holds the CA.
#[derive(Debug)]
pub struct PinnedCaVerifier {
    pin: [u8; 32],
    provider: std::sync::Arc<rustls::crypto::CryptoProvider>,
}

impl PinnedCaVerifier {
    /// A verifier for the CA with `pin`, on ring.
    pub fn new(pin: [u8; 32]) -> Self {
        Self {
            pin,
            provider: std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        }
    }

    /// A rustls client configuration verifying servers with this pin (TLS 1.2 and 1.3),
    /// presenting no client certificate.
    ///
    /// Errors: [`TlsError::Rustls`](crate::tls::TlsError::Rustls) when the protocol
    /// versions cannot be set.
    pub fn client_config(pin: [u8; 32]) -> Result<rustls::ClientConfig, crate::tls::TlsError> {
        let verifier = std::sync::Arc::new(Self::new(pin));
        Ok(
            rustls::ClientConfig::builder_with_provider(verifier.provider.clone())
                .with_safe_default_protocol_versions()?
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth(),
        )
    }
}

impl rustls::client::danger::ServerCertVerifier for PinnedCaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| ca_pin(c).is_ok_and(|pin| pin == self.pin))
            .ok_or(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ))?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            self.provider.clone(),
        )
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?
        .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
