//! The site CA the gateway signs node certificates with (under its own signer name), and
//! the answer CAs it issues for the gateway's answer keys ([`super::answer_ca`]), kept in a
//! Secret so that every replica signs with the same ones.

use std::time::Duration;

use edgebeat_transports::enroll;
use edgebeat_transports::signing::AnswerSigner;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use super::EnrollmentError;
use super::answer_ca::{self, AnswerCa};
pub use super::x509::GatewayIdentity;
use super::x509::{IssuingCa, ca_error, validity};
use crate::apiserver::answers;

/// Name of the Secret (type `kubernetes.io/tls`: `tls.crt`, `tls.key`) holding the site CA,
/// in the gateway's namespace, with the answer CAs in [`ANSWER_CAS_KEY`] and
/// [`ANSWER_CA_KEYS_KEY`].
pub const SITE_CA_SECRET: &str = "edgebeat-site-ca";

/// The Secret's key holding the answer CA certificates (PEM bundle, the one replicas sign
/// with first).
pub const ANSWER_CAS_KEY: &str = "answer-ca.crt";

/// The Secret's key holding the answer CAs' private keys (PEM bundle, in the same order).
pub const ANSWER_CA_KEYS_KEY: &str = "answer-ca.key";

/// Validity of a site CA the gateway makes: 10 years.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A site CA with its key: it signs node certificates and the answer CAs.
pub struct SiteCa {
    /// Its certificate and key.
    pub ca: IssuingCa,
    /// The answer CAs, the one replicas sign with first (see [`super::answer_ca`]).
    answer_cas: Vec<AnswerCa>,
}

/// What [`SiteCa::rotate_answer_ca`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerCaRotation {
    /// A new answer CA was added behind the one replicas sign with: agents learn it from now
    /// on; run the rotation again once they have (after a node certificate lifetime).
    Added,
    /// The first answer CA was retired: replicas restarted from now on sign with the next
    /// one and name it alone.
    Retired,
}

impl std::fmt::Debug for SiteCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SiteCa").finish_non_exhaustive()
    }
}

impl SiteCa {
    /// A new self-signed site CA: CN=`edgebeat site CA`, an ECDSA P-256 key, valid 10
    /// years from `now` (Unix seconds), with one answer CA.
    ///
    /// Errors: [`EnrollmentError::Ca`] when rcgen cannot make it.
    pub fn generate(now: i64) -> Result<Self, EnrollmentError> {
        let key = KeyPair::generate().map_err(ca_error)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(ca_error)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "edgebeat site CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let (not_before, not_after) = validity(now - 3600, CA_LIFETIME)?;
        params.not_before = not_before;
        params.not_after = not_after;
        let cert = params.self_signed(&key).map_err(ca_error)?;
        let mut ca = Self::from_pem(&cert.pem(), &key.serialize_pem())?;
        ca.answer_cas.push(AnswerCa::generate(&ca.ca.issuer, now)?);
        Ok(ca)
    }

    /// The site CA of a certificate and key, both PEM, with no answer CA yet.
    ///
    /// Errors: [`EnrollmentError::Ca`] when either does not parse or the certificate is not
    /// a CA's.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, EnrollmentError> {
        Ok(Self {
            ca: IssuingCa::from_pem(cert_pem, key_pem)?,
            answer_cas: Vec::new(),
        })
    }

    /// The site CA of `namespace`'s Secret [`SITE_CA_SECRET`], made and stored first if
    /// there is none. Replicas starting together never make two: the Secret is created only
    /// if absent, and the one that loses the race reads the winner's. A Secret without
    /// answer CAs (made by an older gateway, or by hand) gets one, written with the
    /// Secret's resourceVersion, so that two replicas never add two.
    ///
    /// Errors: [`EnrollmentError::Apiserver`] for the Secret's reads and writes,
    /// [`EnrollmentError::Ca`] when the Secret holds no usable CA.
    pub async fn load_or_create(
        client: kube::Client,
        namespace: &str,
        now: i64,
    ) -> Result<Self, EnrollmentError> {
        let secrets: Api<Secret> = Api::namespaced(client, namespace);
        if let Some(secret) = secrets.get_opt(SITE_CA_SECRET).await? {
            let mut ca = Self::from_secret(&secret)?;
            if !ca.answer_cas.is_empty() {
                return Ok(ca);
            }
            ca.answer_cas.push(AnswerCa::generate(&ca.ca.issuer, now)?);
            let mut updated = ca.to_secret();
            updated.metadata = secret.metadata;
            return match secrets
                .replace(SITE_CA_SECRET, &PostParams::default(), &updated)
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = SITE_CA_SECRET, namespace, "made the answer CA");
                    Ok(ca)
                }
                Err(e) if answers::is_conflict(&e) => {
                    Self::from_secret(&secrets.get(SITE_CA_SECRET).await?)
                }
                Err(e) => Err(e.into()),
            };
        }
        let made = Self::generate(now)?;
        match secrets
            .create(&PostParams::default(), &made.to_secret())
            .await
        {
            Ok(_) => {
                tracing::info!(secret = SITE_CA_SECRET, namespace, "made the site CA");
                Ok(made)
            }
            Err(e) if answers::is_already_exists(&e) => {
                tracing::info!(
                    secret = SITE_CA_SECRET,
                    "another replica made the site CA first; using it"
                );
                Self::from_secret(&secrets.get(SITE_CA_SECRET).await?)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The site CA (and answer CAs, if any) of its Secret.
    ///
    /// Errors: [`EnrollmentError::Ca`] when a field is missing or unusable.
    pub fn from_secret(secret: &Secret) -> Result<Self, EnrollmentError> {
        let field = |key: &str| {
            super::secret_text(secret, key)
                .ok_or_else(|| EnrollmentError::Ca(format!("Secret {SITE_CA_SECRET} has no {key}")))
        };
        let mut ca = Self::from_pem(&field("tls.crt")?, &field("tls.key")?)?;
        if let (Ok(certs), Ok(keys)) = (field(ANSWER_CAS_KEY), field(ANSWER_CA_KEYS_KEY)) {
            ca.answer_cas = answer_ca::from_bundles(&certs, &keys)?;
        }
        Ok(ca)
    }

    /// The Secret holding this site CA and its answer CAs (data only, no resourceVersion).
    pub fn to_secret(&self) -> Secret {
        let mut secret = self.tls_secret();
        if !self.answer_cas.is_empty()
            && let Some(data) = secret.data.as_mut()
        {
            let bundle = |pem: fn(&AnswerCa) -> &str| {
                ByteString(
                    self.answer_cas
                        .iter()
                        .map(pem)
                        .collect::<String>()
                        .into_bytes(),
                )
            };
            data.insert(ANSWER_CAS_KEY.to_owned(), bundle(|a| &a.ca.cert_pem));
            data.insert(ANSWER_CA_KEYS_KEY.to_owned(), bundle(|a| &a.ca.key_pem));
        }
        secret
    }

    /// One step of an answer CA rotation ([`SiteCa::rotate_answer_ca`]) on `namespace`'s
    /// Secret [`SITE_CA_SECRET`] (made first if there is none), written with the
    /// resourceVersion it was read at. Running replicas go on as they started: a restart
    /// (`kubectl rollout restart`) makes them name or sign with what the Secret holds.
    ///
    /// Errors: [`EnrollmentError::Apiserver`] for the Secret's reads and writes (409 when
    /// it changed meanwhile: run it again), [`EnrollmentError::Ca`] as
    /// [`SiteCa::rotate_answer_ca`].
    pub async fn rotate_in_secret(
        client: kube::Client,
        namespace: &str,
        now: i64,
    ) -> Result<AnswerCaRotation, EnrollmentError> {
        Self::load_or_create(client.clone(), namespace, now).await?;
        let secrets: Api<Secret> = Api::namespaced(client, namespace);
        let secret = secrets.get(SITE_CA_SECRET).await?;
        let mut ca = Self::from_secret(&secret)?;
        let rotation = ca.rotate_answer_ca(now)?;
        let mut updated = ca.to_secret();
        updated.metadata = secret.metadata;
        secrets
            .replace(SITE_CA_SECRET, &PostParams::default(), &updated)
            .await?;
        Ok(rotation)
    }

    /// The answer CAs' certificates (DER), the one replicas sign with first: what
    /// certificate answers name (`IssuedCertificate.answer_cas`).
    pub fn answer_cas(&self) -> Vec<Vec<u8>> {
        self.answer_cas
            .iter()
            .map(|a| a.ca.cert_der.clone())
            .collect()
    }

    /// One step of an answer CA rotation at `now` (see [`super::answer_ca`]): with one
    /// answer CA, a new one is added behind it; with more, the first is retired.
    ///
    /// Errors: [`EnrollmentError::Ca`] when a new one cannot be made, or there is none.
    pub fn rotate_answer_ca(&mut self, now: i64) -> Result<AnswerCaRotation, EnrollmentError> {
        match self.answer_cas.len() {
            0 => Err(EnrollmentError::Ca("no answer CA to rotate".into())),
            1 => {
                self.answer_cas
                    .push(AnswerCa::generate(&self.ca.issuer, now)?);
                Ok(AnswerCaRotation::Added)
            }
            _ => {
                self.answer_cas.remove(0);
                Ok(AnswerCaRotation::Retired)
            }
        }
    }

    fn tls_secret(&self) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(SITE_CA_SECRET.to_owned()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(
                [
                    (
                        "tls.crt".to_owned(),
                        ByteString(self.ca.cert_pem.clone().into_bytes()),
                    ),
                    (
                        "tls.key".to_owned(),
                        ByteString(self.ca.key_pem.clone().into_bytes()),
                    ),
                ]
                .into(),
            ),
            ..Secret::default()
        }
    }

    /// The CA key (PEM), for tests that read a CA back.
    #[cfg(test)]
    pub(crate) fn key_pem_for_tests(&self) -> String {
        self.ca.key_pem.clone()
    }

    /// The pin bootstrap tokens carry ([`enroll::ca_pin`]).
    ///
    /// Errors: [`EnrollmentError::Ca`] (cannot happen for a CA that loaded).
    pub fn pin(&self) -> Result<[u8; 32], EnrollmentError> {
        enroll::ca_pin(&self.ca.cert_der).map_err(|e| EnrollmentError::Ca(e.to_string()))
    }

    /// The gateway's answer key, issued now by the first answer CA (see
    /// [`SiteCa::gateway_identity`]).
    ///
    /// Errors: [`EnrollmentError::Ca`] when it cannot be made.
    pub fn answer_signer(&self, now: i64) -> Result<AnswerSigner, EnrollmentError> {
        let identity = self.gateway_identity(now)?;
        AnswerSigner::from_pem(
            identity.cert_pem.as_bytes(),
            identity.key_pem.as_bytes(),
            self.ca.cert_pem.as_bytes(),
        )
        .map_err(EnrollmentError::AnswerSigner)
    }

    /// A certificate for the gateway itself, issued now by the first answer CA
    /// ([`AnswerCa::issue_answer_key`]). It signs the gateway's answers and, without
    /// `--grpc-tls-cert`, serves its gRPC listeners; enrolled agents verify both against the
    /// answer CAs they learnt (agents that learnt none, against the site CA).
    ///
    /// Errors: [`EnrollmentError::Ca`] when it cannot be made, or there is no answer CA.
    pub fn gateway_identity(&self, now: i64) -> Result<GatewayIdentity, EnrollmentError> {
        self.answer_cas
            .first()
            .ok_or_else(|| EnrollmentError::Ca("no answer CA".into()))?
            .issue_answer_key(now)
    }

    /// A node client certificate (PEM) for `public_key` (from a verified request), subject
    /// CN=`system:node:<node>`, O=`system:nodes`, digitalSignature and clientAuth only,
    /// valid until `now` + `lifetime`, from 5 minutes before `now` (kube-controller-manager's
    /// signer backdates the same, for clocks a little behind) or, for a lifetime under 50
    /// minutes, a tenth of it before (so that a short certificate's rotation deadline,
    /// 70–90 % of its validity, stays in its future).
    ///
    /// Errors: [`EnrollmentError::Ca`] when rcgen cannot sign.
    pub fn sign_node(
        &self,
        node: &str,
        public_key: rcgen::PublicKey,
        now: i64,
        lifetime: Duration,
    ) -> Result<String, EnrollmentError> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(ca_error)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(
            DnType::OrganizationName,
            edgebeat_transports::tls::NODES_GROUP,
        );
        params.distinguished_name.push(
            DnType::CommonName,
            edgebeat_transports::tls::node_user(node),
        );
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let backdate = Duration::from_secs(300).min(lifetime / 10);
        let from = now - i64::try_from(backdate.as_secs()).unwrap_or(0);
        let (not_before, not_after) = validity(from, lifetime + backdate)?;
        params.not_before = not_before;
        params.not_after = not_after;
        let request = rcgen::CertificateSigningRequestParams { params, public_key };
        Ok(request.signed_by(&self.ca.issuer).map_err(ca_error)?.pem())
    }
}
