//! The command line turned into what the server runs with: each file read once and
//! checked now, so a bad flag or file stops the gateway at start with the flag named and
//! the fix.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use edgebeat_transports::endpoint::MqttCluster;
use edgebeat_transports::grpc::enroll::EnrollmentServerOptions;
use edgebeat_transports::grpc::{GrpcServerOptions, GrpcServerTls, tls};
use edgebeat_transports::mqtt::{MqttIngressOptions, SignaturePolicy};
use edgebeat_transports::signing::{AnswerSigner, CertificateVerifier};

use crate::cli::{Args, CsrApproval};
use crate::enrollment::gate::EnrollmentLimits;
use crate::enrollment::{Approval, Enrollment, EnrollmentOptions};
use crate::message_path::GatewayOptions;
use crate::resource_metrics::ResourceMetricsOptions;

mod error;
mod posture;
pub use error::SettingsError;
pub(crate) use posture::posture;

/// A PEM file of `flag`, at most [`edgebeat_hw::MAX_PEM_FILE_BYTES`].
///
/// Errors: [`SettingsError::ReadFile`], the file cannot be read or is longer, named by
/// `flag` and its path.
fn read_pem(flag: &'static str, path: &Path) -> Result<Vec<u8>, SettingsError> {
    edgebeat_hw::read_bounded(path, edgebeat_hw::MAX_PEM_FILE_BYTES).map_err(|source| {
        SettingsError::ReadFile {
            flag,
            path: path.to_owned(),
            source,
        }
    })
}

/// `--signer-ca`'s PEM, checked against `--signer-name` and `--csr-approval`: kubelet's
/// signer needs it (the gateway verifies what that signer issues), the gateway's own takes
/// none, and kubelet's signer is approved by kube-controller-manager alone
/// (`pkg/controller/certificates/approver/sarapprove.go`), which would approve first
/// enrollments that `--csr-approval=manual` means to hold.
///
/// # Errors
/// A signer name other than those two (no other is proved: another signer's approval
/// needs RBAC `approve` on it, and its intermediates would not reach the agents), one of
/// the combinations above, or a CA file that cannot be read or holds no usable
/// certificate; each names its flag and the fix.
fn signer_ca(args: &Args) -> Result<Option<Vec<u8>>, SettingsError> {
    use crate::enrollment::{DEFAULT_SIGNER_NAME, KUBELET_SIGNER_NAME};
    let name = args.signer_name.as_str();
    let own = name == DEFAULT_SIGNER_NAME;
    if !own && name != KUBELET_SIGNER_NAME {
        return Err(SettingsError::UnsupportedSigner {
            name: name.to_owned(),
        });
    }
    if name == KUBELET_SIGNER_NAME && args.csr_approval == CsrApproval::Manual {
        return Err(SettingsError::ManualApprovalWithKubeletSigner);
    }
    match (&args.signer_ca, own) {
        (None, false) => Err(SettingsError::SignerCaMissing),
        (Some(_), true) => Err(SettingsError::SignerCaWithOwnSigner),
        (None, true) => Ok(None),
        (Some(path), false) => {
            let pem = read_pem("--signer-ca", path)?;
            CertificateVerifier::from_pem(&pem).map_err(|source| {
                SettingsError::SignerCaUnusable {
                    path: path.clone(),
                    source,
                }
            })?;
            Ok(Some(pem))
        }
    }
}

/// Everything a [`crate::server::Server`] runs with, checked: built from the command line
/// by [`Settings::from_args`] (every file read once, here), or directly by a test.
#[derive(Debug)]
pub struct Settings {
    /// Where the apiserver is and how to authenticate to it.
    pub kube: kube::Config,
    /// The HTTP version to the apiserver (`--apiserver-http`).
    pub apiserver_http: crate::apiserver::client::HttpVersion,
    /// Most requests per second to the apiserver, 0 for none (`--qps`).
    pub qps: u64,
    /// The per-message options; `posture` is decided by [`crate::server::Server::bind`]
    /// from the ingresses and `allow_unidentified_agents`.
    pub gateway: GatewayOptions,
    /// `--allow-unidentified-agents`.
    pub allow_unidentified_agents: bool,
    /// Enrollment and certificate rotation (`--enrollment`), `None` without.
    pub enrollment: Option<EnrollmentOptions>,
    /// The gRPC listener, `None` without `--grpc-listen`.
    pub grpc: Option<GrpcSettings>,
    /// The gRPC enrollment listener (`--grpc-enrollment-listen`) and its TLS.
    pub grpc_enrollment: Option<(SocketAddr, EnrollmentServerOptions)>,
    /// The MQTT ingress, `None` without `--mqtt-endpoint`.
    pub mqtt: Option<MqttSettings>,
    /// Where `/healthz`, `/readyz` and `/metrics` are served (`--metrics-listen`).
    pub metrics_listen: SocketAddr,
    /// The resource metrics server (`--resource-metrics-listen`), `None` without.
    pub resource_metrics: Option<ResourceMetricsSettings>,
}

/// The resource metrics server's settings ([`crate::resource_metrics`]).
#[derive(Debug, Clone)]
pub struct ResourceMetricsSettings {
    /// Where to listen (`--resource-metrics-listen`).
    pub listen: SocketAddr,
    /// Its TLS material, read and checked.
    pub options: ResourceMetricsOptions,
}

impl ResourceMetricsSettings {
    /// The settings of `args` (`None` without `--resource-metrics-listen`): files read and
    /// checked now, so a bad one stops the gateway at start with its flag named.
    ///
    /// # Errors
    /// A TLS file that cannot be read ([`SettingsError::ReadFile`]) or used
    /// ([`SettingsError::ResourceMetricsTls`]), named by its flag.
    pub fn from_args(args: &Args) -> Result<Option<Self>, SettingsError> {
        let (Some(listen), Some(cert), Some(key)) = (
            args.resource_metrics_listen,
            &args.resource_metrics_tls_cert,
            &args.resource_metrics_tls_key,
        ) else {
            return Ok(None);
        };
        let options = ResourceMetricsOptions {
            tls: GrpcServerTls {
                cert_pem: read_pem("--resource-metrics-tls-cert", cert)?,
                key_pem: read_pem("--resource-metrics-tls-key", key)?,
                client_ca_pem: args
                    .resource_metrics_client_ca
                    .as_ref()
                    .map(|ca| read_pem("--resource-metrics-client-ca", ca))
                    .transpose()?,
            },
        };
        options.check().map_err(SettingsError::ResourceMetricsTls)?;
        Ok(Some(Self { listen, options }))
    }
}

impl Settings {
    /// The settings of `args`: the apiserver configuration found, every file read and
    /// checked.
    ///
    /// # Errors
    /// [`SettingsError`]: a flag without the one it needs, a value out of range, a file
    /// that cannot be read or used, or no apiserver configuration; each names its flag and
    /// the fix.
    pub async fn from_args(args: &Args) -> Result<Self, SettingsError> {
        let grpc = GrpcSettings::from_args(args)?;
        let mqtt = MqttSettings::from_args(args)?;
        let grpc_enrollment = args.grpc_enrollment_listen.map(|addr| {
            let tls = enrollment_tls(grpc.as_ref());
            (addr, EnrollmentServerOptions { tls })
        });
        let signer_ca_pem = signer_ca(args)?;
        let enrollment = args.enrollment.then(|| EnrollmentOptions {
            namespace: args.cluster.namespace(),
            signer_name: args.signer_name.clone(),
            signer_ca_pem,
            approval: match args.csr_approval {
                CsrApproval::Auto => Approval::Auto,
                CsrApproval::Manual => Approval::Manual,
            },
            lifetime: args.certificate_lifetime,
            grace: args.certificate_grace,
            max_clock_skew: Duration::from_secs(args.mqtt_max_clock_skew_seconds),
        });
        Ok(Self {
            kube: args.cluster.kube_config().await?,
            apiserver_http: args.apiserver_http,
            qps: args.qps,
            gateway: gateway_options(args),
            allow_unidentified_agents: args.allow_unidentified_agents,
            enrollment,
            grpc,
            grpc_enrollment,
            mqtt,
            metrics_listen: args.metrics_listen,
            resource_metrics: ResourceMetricsSettings::from_args(args)?,
        })
    }
}

/// The gRPC listener's settings; the site CA's part is added at start
/// ([`GrpcSettings::server_options`]).
#[derive(Debug, Clone)]
pub struct GrpcSettings {
    /// Where to listen (`--grpc-listen`).
    pub listen: SocketAddr,
    /// The server's options: TLS from `--grpc-tls-cert`, `--grpc-tls-key` and
    /// `--grpc-client-ca` when given, whether a node identity is required.
    pub options: GrpcServerOptions,
    /// `--grpc-client-ca`, also trusted beside the site CA under `--enrollment`.
    pub client_ca_pem: Option<Vec<u8>>,
    /// The files read again every [`crate::reload::RELOAD_PERIOD`]: certificate, key and
    /// client CA (empty: none).
    pub reload: Vec<std::path::PathBuf>,
}

/// The MQTT ingress's settings; the site CA's part is added at start
/// ([`MqttSettings::ingress_options`]).
#[derive(Debug, Clone)]
pub struct MqttSettings {
    /// The ingress's options: brokers, TLS, credentials, topics; the answer key of
    /// `--mqtt-answer-cert-file` when given. Signatures are set at start.
    pub options: MqttIngressOptions,
    /// `--mqtt-node-ca`: the CA of node certificates that sign messages.
    pub node_ca_pem: Option<Vec<u8>>,
    /// Unsigned messages are refused (`--mqtt-require-signatures`).
    pub require_signatures: bool,
    /// Most a signed message's time may differ from the gateway's clock.
    pub max_clock_skew: Duration,
}

/// The MQTT password from --mqtt-password-file ([`edgebeat_hw::read_password_file`], as
/// the agent's `transport.passwordFile`), the flag named in the error.
///
/// Errors: [`SettingsError::PasswordFile`].
fn read_password_file(file: &std::path::Path) -> Result<String, SettingsError> {
    edgebeat_hw::read_password_file(file).map_err(SettingsError::PasswordFile)
}

impl MqttSettings {
    /// The MQTT ingress from the `--mqtt-*` flags (`None` without --mqtt-endpoint): files
    /// read and checked now, so a bad file stops the gateway at start with the flag named.
    ///
    /// # Errors
    /// [`SettingsError`]: a flag without the one it needs, an endpoint that is not
    /// `mqtt://` or `mqtts://`, a file that cannot be read or used; each names its flag and
    /// the fix.
    pub fn from_args(args: &Args) -> Result<Option<Self>, SettingsError> {
        let Some(url) = args.mqtt_endpoint.first() else {
            // The flags that need --mqtt-endpoint say so to clap (`requires`).
            return Ok(None);
        };
        let MqttCluster {
            mut brokers,
            tls: secure,
        } = MqttCluster::parse(&args.mqtt_endpoint).map_err(|problems| {
            SettingsError::MqttEndpoint {
                problems: problems.into_iter().map(|(_, m)| m).collect(),
            }
        })?;
        let (host, port) = brokers.remove(0);
        let client_id = args
            .mqtt_client_id
            .clone()
            .unwrap_or_else(|| format!("edgebeat-gateway-{}", std::process::id()));
        let mut options = MqttIngressOptions::new(host, port, client_id);
        options.failover = brokers;
        options.topic_prefix = args.mqtt_topic_prefix.clone();
        options.share_group = args.mqtt_share_group.clone();
        options.site_uplinks = args.mqtt_site_uplinks;
        if let (Some(user), Some(file)) = (&args.mqtt_username, &args.mqtt_password_file) {
            let password = read_password_file(file)?;
            options.credentials = Some((user.clone(), password));
        }
        options.tls = match (secure, &args.mqtt_ca_file) {
            (true, Some(ca)) => {
                let tls = tls::ClientTls {
                    ca_pem: read_pem("--mqtt-ca-file", ca)?,
                    client_identity: match (&args.mqtt_cert_file, &args.mqtt_key_file) {
                        (Some(cert), Some(key)) => Some(tls::TlsIdentity {
                            cert_pem: read_pem("--mqtt-cert-file", cert)?,
                            key_pem: read_pem("--mqtt-key-file", key)?,
                        }),
                        _ => None,
                    },
                };
                tls.rustls_config().map_err(SettingsError::MqttTls)?;
                Some(tls)
            }
            (true, None) => {
                return Err(SettingsError::MqttsWithoutCaFile { url: url.clone() });
            }
            (false, _) if args.mqtt_ca_file.is_some() || args.mqtt_cert_file.is_some() => {
                return Err(SettingsError::MqttTlsFilesWithoutMqtts { url: url.clone() });
            }
            (false, _) => None,
        };
        let require_signatures = args
            .mqtt_require_signatures
            .unwrap_or(args.mqtt_node_ca.is_some() || args.enrollment);
        let node_ca_pem = match &args.mqtt_node_ca {
            Some(ca) => {
                let ca_pem = read_pem("--mqtt-node-ca", ca)?;
                CertificateVerifier::from_pem(&ca_pem).map_err(|source| {
                    SettingsError::NodeCaUnusable {
                        path: ca.clone(),
                        source,
                    }
                })?;
                Some(ca_pem)
            }
            None => None,
        };
        if let (Some(cert), Some(key), Some(ca_pem)) = (
            &args.mqtt_answer_cert_file,
            &args.mqtt_answer_key_file,
            &node_ca_pem,
        ) {
            options.answer_signer = Some(Arc::new(
                AnswerSigner::from_pem(
                    &read_pem("--mqtt-answer-cert-file", cert)?,
                    &read_pem("--mqtt-answer-key-file", key)?,
                    ca_pem,
                )
                .map_err(SettingsError::AnswerKey)?,
            ));
        }
        let settings = Self {
            options,
            node_ca_pem,
            require_signatures,
            max_clock_skew: Duration::from_secs(args.mqtt_max_clock_skew_seconds),
        };
        // The same checks as at serving, with the site CA standing in under --enrollment.
        settings.check(args.enrollment)?;
        Ok(Some(settings))
    }

    /// Checks what [`MqttSettings::ingress_options`] needs, `enrolling` standing for the
    /// site CA it will have.
    ///
    /// Errors: [`SettingsError::NodeCaWithoutAnswerKey`],
    /// [`SettingsError::SignaturesWithoutNodeCa`].
    fn check(&self, enrolling: bool) -> Result<(), SettingsError> {
        match (&self.node_ca_pem, enrolling) {
            (Some(_), false) if self.options.answer_signer.is_none() => {
                Err(SettingsError::NodeCaWithoutAnswerKey)
            }
            (None, false) if self.require_signatures => Err(SettingsError::SignaturesWithoutNodeCa),
            _ => Ok(()),
        }
    }

    /// The ingress's options once the site CA is read (`enrollment`, under --enrollment):
    /// signatures verified against `node_ca_pem` and the site CA together (hand-made node
    /// certificates and enrolled ones, during a move to enrollment), answers (and shared
    /// usage batches) signed with the answer key of the files, else the gateway's own from
    /// the site CA, and the other replicas' usage batches verified against the same CAs.
    ///
    /// # Errors
    /// Node CAs that cannot be used ([`SettingsError::NodeCas`]), or signed messages with
    /// no way to sign answers (as [`MqttSettings::from_args`] checks).
    pub fn ingress_options(
        &self,
        enrollment: Option<&Enrollment>,
    ) -> Result<MqttIngressOptions, SettingsError> {
        self.check(enrollment.is_some())?;
        let mut options = self.options.clone();
        let node_ca = match enrollment {
            Some(enrollment) => Some(enrollment.node_ca_pem(self.node_ca_pem.clone())),
            None => self.node_ca_pem.clone(),
        };
        if let Some(ca_pem) = node_ca {
            let verifier =
                CertificateVerifier::from_pem(&ca_pem).map_err(SettingsError::NodeCas)?;
            let mut policy = SignaturePolicy::new(verifier, self.require_signatures);
            policy.max_clock_skew = self.max_clock_skew;
            options.signatures = Some(policy);
            // The other replicas' usage batches are taken signed by a gateway's answer key
            // of the same site CA only.
            options.usage_verifier = Some(
                edgebeat_transports::signing::AnswerVerifier::from_pem(&ca_pem)
                    .map_err(SettingsError::NodeCas)?,
            );
            if options.answer_signer.is_none() {
                options.answer_signer = enrollment.map(Enrollment::answer_signer);
            }
        }
        Ok(options)
    }
}

impl GrpcSettings {
    /// The gRPC listener from `--grpc-listen` and the TLS flags (`None` without
    /// `--grpc-listen`): files read and checked now, so a bad file stops the gateway at
    /// start with the flag named.
    ///
    /// # Errors
    /// [`SettingsError`]: `--require-node-identity` with no client CA, a TLS file that
    /// cannot be read or used, or a certificate and key that do not match; each names its
    /// flag.
    pub fn from_args(args: &Args) -> Result<Option<Self>, SettingsError> {
        // The flags that need --grpc-listen say so to clap (`requires`).
        let Some(listen) = args.grpc_listen else {
            return Ok(None);
        };
        let require_node_identity = args
            .require_node_identity
            .unwrap_or(args.grpc_client_ca.is_some() || args.enrollment);
        if require_node_identity && args.grpc_client_ca.is_none() && !args.enrollment {
            return Err(SettingsError::NodeIdentityWithoutClientCa);
        }
        let client_ca_pem = args
            .grpc_client_ca
            .as_ref()
            .map(|ca| read_pem("--grpc-client-ca", ca))
            .transpose()?;
        let mut reload = Vec::new();
        let tls = match (&args.grpc_tls_cert, &args.grpc_tls_key) {
            (Some(cert), Some(key)) => {
                let tls = GrpcServerTls {
                    cert_pem: read_pem("--grpc-tls-cert", cert)?,
                    key_pem: read_pem("--grpc-tls-key", key)?,
                    client_ca_pem: client_ca_pem.clone(),
                };
                tls::parse_certificates(&tls.cert_pem).map_err(|source| {
                    SettingsError::GrpcTlsCert {
                        path: cert.clone(),
                        source,
                    }
                })?;
                tls::parse_private_key(&tls.key_pem).map_err(|source| {
                    SettingsError::GrpcTlsKey {
                        path: key.clone(),
                        source,
                    }
                })?;
                tls.check().map_err(SettingsError::GrpcTls)?;
                reload = vec![cert.clone(), key.clone()];
                reload.extend(args.grpc_client_ca.clone());
                Some(tls)
            }
            _ => None,
        };
        Ok(Some(Self {
            listen,
            options: GrpcServerOptions {
                tls,
                require_node_identity,
                ..GrpcServerOptions::default()
            },
            client_ca_pem,
            reload,
        }))
    }

    /// The server's options once the site CA is read (`enrollment`, under --enrollment):
    /// client certificates from `client_ca_pem` and the site CA; without a certificate of
    /// the files, the gateway's own from the site CA; and TLS material read again when the
    /// files change ([`GrpcSettings::reload`]; without such files, the options' own
    /// `tls_updates` stay).
    pub fn server_options(&self, enrollment: Option<&Arc<Enrollment>>) -> GrpcServerOptions {
        let mut options = self.options.clone();
        options.tls = match (options.tls.take(), enrollment) {
            (None, Some(enrollment)) => {
                tracing::info!(
                    "gRPC over TLS with the gateway's certificate from the site CA (no --grpc-tls-cert)"
                );
                Some(enrollment.grpc_server_tls(self.client_ca_pem.clone()))
            }
            (Some(tls), Some(enrollment)) => Some(GrpcServerTls {
                client_ca_pem: Some(enrollment.node_ca_pem(tls.client_ca_pem.clone())),
                ..tls
            }),
            (tls, None) => tls,
        };
        if let Some(tls) = &options.tls {
            tracing::info!(
                mtls = tls.client_ca_pem.is_some(),
                require_node_identity = options.require_node_identity,
                "gRPC over TLS"
            );
        }
        if let Some(updates) = self.tls_updates(options.tls.clone(), enrollment.cloned()) {
            options.tls_updates = Some(updates);
        }
        options
    }

    /// New TLS material for the listener when the files of [`GrpcSettings::reload`] change
    /// on disk ([`crate::reload`]), checked as at start and with the site CA added under
    /// --enrollment; `None` without those files.
    fn tls_updates(
        &self,
        initial: Option<GrpcServerTls>,
        enrollment: Option<Arc<Enrollment>>,
    ) -> Option<tokio::sync::watch::Receiver<GrpcServerTls>> {
        if self.reload.len() < 2 {
            return None;
        }
        Some(crate::reload::watch_files(
            self.reload.clone(),
            crate::reload::RELOAD_PERIOD,
            initial?,
            move |mut files| {
                let client_ca = (files.len() > 2).then(|| files.remove(2));
                let key_pem = files.remove(1);
                let cert_pem = files.remove(0);
                let tls = GrpcServerTls {
                    cert_pem,
                    key_pem,
                    client_ca_pem: match &enrollment {
                        Some(enrollment) => Some(enrollment.node_ca_pem(client_ca)),
                        None => client_ca,
                    },
                };
                tls.check()?;
                Ok::<_, edgebeat_transports::tls::TlsError>(tls)
            },
        ))
    }
}

/// The gRPC enrollment listener's TLS: the gRPC listener's certificate and key (read and
/// checked once, by [`GrpcSettings::from_args`], so a file that cannot be read stops the
/// gateway there: the listener never falls back to plain HTTP/2 when TLS was asked for),
/// without a client CA (boards enroll before they have a certificate). `None` without
/// `--grpc-tls-cert`: plain HTTP/2, the request being proved by the token or the node's
/// key, and the answer signed.
fn enrollment_tls(grpc: Option<&GrpcSettings>) -> Option<GrpcServerTls> {
    let tls = grpc?.options.tls.as_ref()?;
    Some(GrpcServerTls {
        client_ca_pem: None,
        ..tls.clone()
    })
}

/// The per-message options of [`crate::message_path::Gateway`] from the flags (the posture is decided
/// at [`crate::server::Server::bind`]). The enrollment bursts are 5 s of `--enrollment-rate` and 4 s of
/// `--enrollment-rate-per-source`, at least one request each; `--max-inflight` is taken as
/// given ([`crate::apiserver::Apiserver::with_limits`] raises it to 2).
fn gateway_options(args: &Args) -> GatewayOptions {
    GatewayOptions {
        resource_metrics: match (args.resource_metrics_address, args.resource_metrics_listen) {
            // Without a port, the one bound ([`crate::server::Server::bind`] sets it).
            (Some((address, port)), Some(_)) => Some(crate::resource_metrics::Endpoint {
                address,
                port: port.unwrap_or(0),
            }),
            _ => None,
        },
        max_renewal_age: Duration::from_secs(args.max_renewal_age_seconds),
        impersonate_nodes: args.impersonate_nodes,
        max_nodes: args.max_nodes.get(),
        per_node_metrics: args.per_node_metrics,
        write_limits: crate::apiserver::WriteLimits {
            max_inflight: args.max_inflight,
        },
        enrollment_limits: EnrollmentLimits {
            rate: args.enrollment_rate,
            burst: (args.enrollment_rate * 5.0).max(1.0),
            per_source_rate: args.enrollment_rate_per_source,
            per_source_burst: (args.enrollment_rate_per_source * 4.0).max(1.0),
            ..EnrollmentLimits::default()
        },
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "settings/tests.rs"]
mod tests;
