//! The CertificateSigningRequest's life in Kubernetes: create (or find), approve, sign
//! (or wait).

use std::time::Duration;

use edgebeat_proto::ConditionStatus;
use edgebeat_transports::enroll;
use edgebeat_transports::ingress::TransportKind;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use super::csr::csr_name;
use super::proof::Proof;
use super::rejection::{CsrRejectReason, Unissued, reject};
use super::{
    Approval, DEFAULT_SIGNER_NAME, Enrollment, KUBELET_SIGNER_NAME, MIN_EXPIRATION_SECONDS,
    NODE_ANNOTATION, PROOF_ANNOTATION, TOKEN_LABEL, TRANSPORT_ANNOTATION,
};
use crate::apiserver::answers;

impl Enrollment {
    /// Whether CSR `name` exists (a token's use already counted, when a request is asked
    /// again). An apiserver error counts as "no": the request is then rejected as over its
    /// limit, and asked again later.
    pub(super) async fn csr_exists(&self, name: &str) -> bool {
        let csrs: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        matches!(csrs.get_metadata_opt(name).await, Ok(Some(_)))
    }

    /// The CertificateSigningRequest's life: create (or find), approve, sign (or wait).
    /// `Ok(Some(chain))` once issued, `Ok(None)` while waiting for approval or the signer;
    /// [`Unissued::Rejected`] when denied, failed or not signable, [`Unissued::Pending`] to ask again
    /// (the apiserver).
    pub(super) async fn through_kubernetes(
        &self,
        transport: TransportKind,
        node: &str,
        csr_der: &[u8],
        public_key: rcgen::PublicKey,
        proof: &Proof,
    ) -> Result<Option<Vec<Vec<u8>>>, Unissued> {
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        let name = csr_name(csr_der, node);
        let apiserver =
            |what: &str, e: kube::Error| Unissued::Pending(format!("{what} {name}: {e}"));
        // Created first (a new request is the common case: one call), read when it exists
        // (a retry while pending, or after a lost answer).
        let wanted = self.new_csr(&name, transport, node, csr_der, proof);
        let mut csr = match api.create(&PostParams::default(), &wanted).await {
            Ok(created) => {
                if let Proof::Token(id) = proof {
                    self.token_used(id).await;
                }
                created
            }
            Err(e) if answers::is_already_exists(&e) => {
                api.get(&name).await.map_err(|e| apiserver("reading", e))?
            }
            Err(e) => return Err(apiserver("creating", e)),
        };
        let conditions = |csr: &CertificateSigningRequest, type_: &str| {
            csr.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == type_ && ConditionStatus::from_api(&c.status).is_true())
                })
        };
        if conditions(&csr, "Denied") || conditions(&csr, "Failed") {
            return Err(reject(
                CsrRejectReason::Denied,
                format!("the CertificateSigningRequest {name} was denied or failed"),
            )
            .into());
        }
        if !conditions(&csr, "Approved") {
            // kubelet's signer: kube-controller-manager approves (nodeclient), never the
            // gateway; the agent asks again, and finds the CSR approved and signed.
            let approve = (self.options.approval == Approval::Auto || *proof == Proof::Certificate)
                && self.options.signer_name != KUBELET_SIGNER_NAME;
            if !approve {
                self.pending(&name, true);
                return Ok(None);
            }
            csr = self
                .approve(&api, csr, proof)
                .await
                .map_err(|e| apiserver("approving", e))?;
        }
        let issued = csr
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .filter(|c| !c.0.is_empty())
            .cloned();
        let pem = match (issued, &self.ca) {
            (Some(pem), _) => pem.0,
            (None, Some(ca)) if self.options.signer_name == DEFAULT_SIGNER_NAME => {
                let now = self.clock.unix_now().seconds();
                // The signer's own lifetime, shorter when the CSR asks for less (which the
                // API lets a CSR ask down to its 600 s minimum).
                let lifetime = csr
                    .spec
                    .expiration_seconds
                    .and_then(|s| u64::try_from(s).ok())
                    .map_or(self.options.lifetime, Duration::from_secs)
                    .min(self.options.lifetime);
                let pem = ca
                    .sign_node(node, public_key, now, lifetime)
                    .map_err(|e| Unissued::from(reject(CsrRejectReason::Signing, e.to_string())))?;
                csr.status.get_or_insert_default().certificate =
                    Some(ByteString(pem.clone().into_bytes()));
                api.replace_status(&name, &PostParams::default(), &csr)
                    .await
                    .map_err(|e| apiserver("signing", e))?;
                pem.into_bytes()
            }
            (None, _) => {
                self.pending(&name, true);
                return Ok(None);
            }
        };
        self.pending(&name, false);
        let mut chain: Vec<Vec<u8>> = edgebeat_transports::tls::parse_certificates(&pem)
            .map_err(|e| {
                Unissued::from(reject(
                    CsrRejectReason::Signing,
                    format!("status.certificate: {e}"),
                ))
            })?
            .into_iter()
            .map(|c| c.to_vec())
            .collect();
        if chain.last() != Some(&self.ca_der) {
            chain.push(self.ca_der.clone());
        }
        Ok(Some(chain))
    }

    fn new_csr(
        &self,
        name: &str,
        transport: TransportKind,
        node: &str,
        csr_der: &[u8],
        proof: &Proof,
    ) -> CertificateSigningRequest {
        let mut labels = std::collections::BTreeMap::new();
        if let Proof::Token(id) = proof {
            labels.insert(TOKEN_LABEL.to_owned(), id.clone());
        }
        let annotations = [
            (NODE_ANNOTATION, node),
            (TRANSPORT_ANNOTATION, transport.as_str()),
            (PROOF_ANNOTATION, proof.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        CertificateSigningRequest {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(enroll::pem("CERTIFICATE REQUEST", csr_der).into_bytes()),
                signer_name: self.options.signer_name.clone(),
                // The API refuses less than 600 s (`certificates.k8s.io/v1` validation); a
                // shorter --certificate-lifetime (tests, demos) is the signer's to apply.
                expiration_seconds: i32::try_from(
                    self.options.lifetime.as_secs().max(MIN_EXPIRATION_SECONDS),
                )
                .ok(),
                usages: Some(vec!["digital signature".into(), "client auth".into()]),
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        }
    }

    async fn approve(
        &self,
        api: &Api<CertificateSigningRequest>,
        mut csr: CertificateSigningRequest,
        proof: &Proof,
    ) -> Result<CertificateSigningRequest, kube::Error> {
        let message = match proof {
            Proof::Token(id) => format!("Approved by edgebeat-gateway: bootstrap token {id}"),
            Proof::Certificate => {
                "Approved by edgebeat-gateway: a rotation proved by the node's certificate".into()
            }
        };
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(self.now());
        let status = csr
            .status
            .get_or_insert_with(CertificateSigningRequestStatus::default);
        status
            .conditions
            .get_or_insert_default()
            .push(CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: ConditionStatus::True.as_str().into(),
                reason: Some("EdgebeatAutoApproved".into()),
                message: Some(message),
                last_update_time: Some(now.clone()),
                last_transition_time: Some(now),
            });
        let name = csr.metadata.name.clone().unwrap_or_default();
        api.replace_subresource("approval", &name, &PostParams::default(), &csr)
            .await
    }
}
