//! The node's key pair, made on the board and never sent, and the PKCS#10 certificate
//! request it signs.

use std::fmt;

use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair as _};

use super::EnrollError;
use super::der::{der, pem};

/// DER of an OBJECT IDENTIFIER whose encoded value is `value`.
fn oid(value: &[u8]) -> Vec<u8> {
    der(0x06, value)
}

/// id-at-organizationName, 2.5.4.10.
const OID_ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];
/// id-at-commonName, 2.5.4.3.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// id-ecPublicKey, 1.2.840.10045.2.1.
const OID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
/// prime256v1, 1.2.840.10045.3.1.7.
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
/// ecdsa-with-SHA256, 1.2.840.10045.4.3.2.
const OID_ECDSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];

/// One relative distinguished name of one attribute, a UTF8String value.
fn rdn(attribute: &[u8], value: &str) -> Vec<u8> {
    let pair = [oid(attribute), der(0x0c, value.as_bytes())].concat();
    der(0x31, &der(0x30, &pair))
}

/// A node's key pair, ECDSA P-256 (kubelet's key type), made on the board and never sent:
/// it signs the node's certificate request and, once issued, its messages and TLS.
pub struct NodeKeyPair {
    pkcs8: Vec<u8>,
    key: EcdsaKeyPair,
}

impl fmt::Debug for NodeKeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeKeyPair").finish_non_exhaustive()
    }
}

impl NodeKeyPair {
    /// A fresh P-256 key from the system's random source.
    ///
    /// Errors: [`EnrollError::Key`] when the random source fails.
    pub fn generate() -> Result<Self, EnrollError> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(|_| EnrollError::Key("could not generate a P-256 key".into()))?;
        Self::from_pkcs8(pkcs8.as_ref())
    }

    /// The key of a PKCS#8 DER document (P-256).
    ///
    /// Errors: [`EnrollError::Key`] when it is not a P-256 PKCS#8 key.
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<Self, EnrollError> {
        let key =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8, &SystemRandom::new())
                .map_err(|e| EnrollError::Key(format!("not a P-256 PKCS#8 key: {e}")))?;
        Ok(Self {
            pkcs8: pkcs8.to_vec(),
            key,
        })
    }

    /// The key as PEM (`PRIVATE KEY`, PKCS#8), for the node's certificate file.
    pub fn to_pem(&self) -> String {
        pem("PRIVATE KEY", &self.pkcs8)
    }

    /// The uncompressed public point (65 bytes).
    pub fn public_key(&self) -> &[u8] {
        self.key.public_key().as_ref()
    }

    /// The PKCS#10 certificate request (DER, RFC 2986) for node `node`: subject
    /// O=`system:nodes`, CN=`system:node:<node>` (kubelet's,
    /// `pkg/kubelet/certificate/bootstrap/bootstrap.go: requestNodeCertificate`), this key,
    /// no attributes (the usages go on the Kubernetes CertificateSigningRequest), signed
    /// with ECDSA-SHA256.
    ///
    /// Errors: [`EnrollError::Key`] when signing fails.
    pub fn certificate_request(&self, node: &str) -> Result<Vec<u8>, EnrollError> {
        let subject = der(
            0x30,
            &[
                rdn(OID_ORGANIZATION, crate::tls::NODES_GROUP),
                rdn(OID_COMMON_NAME, &crate::tls::node_user(node)),
            ]
            .concat(),
        );
        let mut point = vec![0u8];
        point.extend_from_slice(self.public_key());
        let spki = der(
            0x30,
            &[
                der(0x30, &[oid(OID_EC_PUBLIC_KEY), oid(OID_P256)].concat()),
                der(0x03, &point),
            ]
            .concat(),
        );
        let version = der(0x02, &[0]);
        let attributes = der(0xa0, &[]);
        let info = der(0x30, &[version, subject, spki, attributes].concat());
        let signature = self
            .key
            .sign(&SystemRandom::new(), &info)
            .map_err(|_| EnrollError::Key("signing the request failed".into()))?;
        let mut bits = vec![0u8];
        bits.extend_from_slice(signature.as_ref());
        Ok(der(
            0x30,
            &[info, der(0x30, &oid(OID_ECDSA_SHA256)), der(0x03, &bits)].concat(),
        ))
    }
}
