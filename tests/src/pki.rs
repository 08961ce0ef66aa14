//! A test PKI made per test with rcgen (never committed keys): a CA, server and client
//! certificates, and kubelet-style node certificates (CN=`system:node:<name>`,
//! O=`system:nodes`). Keys are ECDSA P-256, what kubelet's certificate manager uses.
#![allow(clippy::unwrap_used)]

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority made for one test.
pub struct Ca {
    /// The CA certificate, PEM.
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A leaf certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct Leaf {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key (ECDSA P-256, PKCS#8), PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// A self-signed CA with subject CN=`name` and a fresh ECDSA P-256 key.
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert_pem = params.self_signed(&key).unwrap().pem();
        Self {
            cert_pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// Issues a leaf for `params` (digital signature key usage) with a fresh key.
    pub fn issue(&self, mut params: CertificateParams) -> Leaf {
        let key = KeyPair::generate().unwrap();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        Leaf {
            cert_pem: params.signed_by(&key, &self.issuer).unwrap().pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Issues a certificate (PEM) for `params` with a given key (e.g. Ed25519), digital
    /// signature key usage.
    pub fn issue_with_key(&self, mut params: CertificateParams, key: &KeyPair) -> String {
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        params.signed_by(key, &self.issuer).unwrap().pem()
    }

    /// The gateway's serving certificate, valid for 127.0.0.1 and localhost.
    pub fn server(&self) -> Leaf {
        let mut params = CertificateParams::new(vec![
            "127.0.0.1".to_owned(),
            "localhost".to_owned(),
            // The gateway side of crate::link, for agents measured behind a veth pair.
            crate::link::GATEWAY_IP.to_owned(),
        ])
        .unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "edgebeat-gateway");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// The gateway's answer key: a server certificate valid for
    /// [`ANSWER_SIGNER_NAME`](edgebeat_transports::signing::ANSWER_SIGNER_NAME), what agents
    /// that sign require of the gateway's signed answers.
    pub fn answers(&self) -> Leaf {
        let name = edgebeat_transports::signing::ANSWER_SIGNER_NAME;
        let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// A client certificate with subject CN=`cn` and, when given, O=`org`; `expired` makes
    /// it valid only during 2020.
    pub fn client_with(&self, cn: &str, org: Option<&str>, expired: bool) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(org) = org {
            params
                .distinguished_name
                .push(DnType::OrganizationName, org);
        }
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        self.issue(params)
    }

    /// [`Ca::client_with`], not expired.
    pub fn client(&self, cn: &str, org: Option<&str>) -> Leaf {
        self.client_with(cn, org, false)
    }

    /// A kubelet-style node certificate: CN=system:node:<name>, O=system:nodes.
    pub fn node(&self, name: &str) -> Leaf {
        self.client(&format!("system:node:{name}"), Some("system:nodes"))
    }

    /// [`Ca::node`] valid from 1 January of `year` (to 4096): an earlier `year` is an
    /// older certificate of the node, as before a rotation.
    pub fn node_from(&self, name: &str, year: i32) -> Leaf {
        let mut params = node_params(name);
        params.not_before = rcgen::date_time_ymd(year, 1, 1);
        self.issue(params)
    }
}

impl Ca {
    /// [`Ca::node`] valid until `not_after` (whole seconds, as X.509 keeps it), from a
    /// minute before now.
    pub fn node_until(&self, name: &str, not_after: std::time::SystemTime) -> Leaf {
        let mut params = node_params(name);
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        let since = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap();
        params.not_before =
            epoch + since(std::time::SystemTime::now()) - std::time::Duration::from_secs(60);
        params.not_after = epoch + since(not_after);
        self.issue(params)
    }
}

/// The parameters of a kubelet-style client certificate of node `name`: CN=`system:node:<name>`,
/// O=`system:nodes`, client authentication.
fn node_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{name}"));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params
}

/// A PKCS#10 certificate request (PEM) for CN=`cn`, O=`system:nodes`, with a fresh P-256
/// key: the subject of a kubelet client certificate when `cn` is `system:node:<name>`.
pub fn node_csr_pem(cn: &str) -> String {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params.serialize_request(&key).unwrap().pem().unwrap()
}
