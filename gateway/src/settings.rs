//! The command line turned into what the server runs with: each file read once and
//! checked now, so a bad flag or file stops the gateway at start with the flag named and
//! the fix.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use edgebeat_transports::endpoint::MqttCluster;
use edgebeat_transports::grpc::{GrpcServerOptions, GrpcServerTls, tls};
use edgebeat_transports::mqtt::{MqttIngressOptions, SignaturePolicy};
use edgebeat_transports::signing::{AnswerSigner, CertificateVerifier};

use crate::cli::Args;
use crate::enrollment::Enrollment;
use crate::enrollment::gate::EnrollmentLimits;
use crate::{GatewayOptions, Posture};

/// A PEM file of `flag`, at most [`edgebeat_hw::MAX_PEM_FILE_BYTES`].
///
/// Errors: the file cannot be read or is longer, named by `flag` and its path.
fn read_pem(flag: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    edgebeat_hw::read_bounded(path, edgebeat_hw::MAX_PEM_FILE_BYTES)
        .with_context(|| format!("{flag} {}", path.display()))
}

/// The MQTT password from --mqtt-password-file ([`edgebeat_hw::read_password_file`], as
/// the agent's `transport.passwordFile`), the flag named in the error.
pub(crate) fn read_password_file(file: &std::path::Path) -> anyhow::Result<String> {
    edgebeat_hw::read_password_file(file).context("--mqtt-password-file")
}

/// The MQTT ingress options from the `--mqtt-*` flags (`None` without --mqtt-endpoint):
/// files read and checked now, so a bad file stops the gateway at start with the flag named.
pub(crate) fn mqtt_ingress_options(
    args: &Args,
    enrollment: Option<&Enrollment>,
) -> anyhow::Result<Option<MqttIngressOptions>> {
    let Some(url) = args.mqtt_endpoint.first() else {
        flags_need(
            "--mqtt-endpoint",
            &[
                ("--mqtt-ca-file", args.mqtt_ca_file.is_some()),
                ("--mqtt-cert-file", args.mqtt_cert_file.is_some()),
                ("--mqtt-node-ca", args.mqtt_node_ca.is_some()),
                (
                    "--mqtt-require-signatures",
                    args.mqtt_require_signatures.is_some(),
                ),
            ],
        )?;
        return Ok(None);
    };
    let MqttCluster {
        mut brokers,
        tls: secure,
    } = MqttCluster::parse(&args.mqtt_endpoint).map_err(|problems| {
        let all: Vec<String> = problems.into_iter().map(|(_, m)| m).collect();
        anyhow::anyhow!("--mqtt-endpoint: {}", all.join("; "))
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
            tls.rustls_config()
                .map_err(anyhow::Error::msg)
                .context("--mqtt-ca-file, --mqtt-cert-file, --mqtt-key-file")?;
            Some(tls)
        }
        (true, None) => anyhow::bail!(
            "--mqtt-endpoint {url:?} is mqtts:// and needs --mqtt-ca-file (the CA of the broker's certificate)"
        ),
        (false, _) if args.mqtt_ca_file.is_some() || args.mqtt_cert_file.is_some() => {
            anyhow::bail!(
                "--mqtt-ca-file and --mqtt-cert-file need an mqtts:// --mqtt-endpoint, not {url:?}"
            )
        }
        (false, _) => None,
    };
    let required = args
        .mqtt_require_signatures
        .unwrap_or(args.mqtt_node_ca.is_some() || enrollment.is_some());
    let node_ca = match (&args.mqtt_node_ca, enrollment) {
        (Some(ca), _) => {
            let ca_pem = read_pem("--mqtt-node-ca", ca)?;
            CertificateVerifier::from_pem(&ca_pem)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("--mqtt-node-ca {}", ca.display()))?;
            // Hand-made node certificates and enrolled ones, during a move to enrollment.
            Some(match enrollment {
                Some(enrollment) => enrollment.node_ca_pem(Some(ca_pem)),
                None => ca_pem,
            })
        }
        (None, Some(enrollment)) => Some(enrollment.node_ca_pem(None)),
        (None, None) => None,
    };
    options.signatures = match node_ca {
        Some(ca_pem) => {
            let verifier = CertificateVerifier::from_pem(&ca_pem)
                .map_err(anyhow::Error::msg)
                .context("--mqtt-node-ca")?;
            let mut policy = SignaturePolicy::new(verifier, required);
            policy.max_clock_skew = Duration::from_secs(args.mqtt_max_clock_skew_seconds);
            options.answer_signer = Some(
                match (
                    &args.mqtt_answer_cert_file,
                    &args.mqtt_answer_key_file,
                    enrollment,
                ) {
                    (Some(cert), Some(key), _) => Arc::new(
                        AnswerSigner::from_pem(
                            &read_pem("--mqtt-answer-cert-file", cert)?,
                            &read_pem("--mqtt-answer-key-file", key)?,
                            &ca_pem,
                        )
                        .map_err(anyhow::Error::msg)
                        .context("--mqtt-answer-cert-file, --mqtt-answer-key-file")?,
                    ),
                    // The gateway's own certificate from the site CA.
                    (_, _, Some(enrollment)) => enrollment.answer_signer(),
                    _ => anyhow::bail!(
                        "--mqtt-node-ca needs --mqtt-answer-cert-file and --mqtt-answer-key-file (or --enrollment): agents that sign their messages take only answers the gateway signs; issue a server certificate for the DNS name {} from the site CA (README, \"MQTT over TLS with signed messages\")",
                        edgebeat_transports::signing::ANSWER_SIGNER_NAME
                    ),
                },
            );
            Some(policy)
        }
        None if required => anyhow::bail!(
            "--mqtt-require-signatures needs --mqtt-node-ca (or --enrollment): signatures are verified against node certificates from the site CA"
        ),
        None => None,
    };
    Ok(Some(options))
}

/// The gRPC server's options from the TLS flags: files read and checked now, so a bad file
/// stops the gateway at start with the flag named.
pub(crate) fn grpc_server_options(
    args: &Args,
    enrollment: Option<&Enrollment>,
) -> anyhow::Result<GrpcServerOptions> {
    let require_node_identity = args
        .require_node_identity
        .unwrap_or(args.grpc_client_ca.is_some() || enrollment.is_some());
    if require_node_identity && args.grpc_client_ca.is_none() && enrollment.is_none() {
        anyhow::bail!(
            "--require-node-identity needs --grpc-client-ca (or --enrollment): node identities come from client certificates"
        );
    }
    let client_ca_pem = args
        .grpc_client_ca
        .as_ref()
        .map(|ca| read_pem("--grpc-client-ca", ca))
        .transpose()?;
    let tls = match (&args.grpc_tls_cert, &args.grpc_tls_key, enrollment) {
        (None, None, Some(enrollment)) => {
            tracing::info!(
                "gRPC over TLS with the gateway's certificate from the site CA (no --grpc-tls-cert)"
            );
            Some(enrollment.grpc_server_tls(client_ca_pem))
        }
        (Some(cert), Some(key), _) => {
            let tls = GrpcServerTls {
                cert_pem: read_pem("--grpc-tls-cert", cert)?,
                key_pem: read_pem("--grpc-tls-key", key)?,
                // Client certificates from --grpc-client-ca and the site CA.
                client_ca_pem: match enrollment {
                    Some(enrollment) => Some(enrollment.node_ca_pem(client_ca_pem)),
                    None => client_ca_pem,
                },
            };
            tls::parse_certificates(&tls.cert_pem)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("--grpc-tls-cert {}", cert.display()))?;
            tls::parse_private_key(&tls.key_pem)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("--grpc-tls-key {}", key.display()))?;
            tls.check()
                .map_err(anyhow::Error::msg)
                .context("--grpc-tls-cert, --grpc-tls-key, --grpc-client-ca")?;
            tracing::info!(
                mtls = tls.client_ca_pem.is_some(),
                require_node_identity,
                "gRPC over TLS"
            );
            Some(tls)
        }
        _ => None,
    };
    Ok(GrpcServerOptions {
        tls,
        require_node_identity,
        ..GrpcServerOptions::default()
    })
}

/// New TLS material for the gRPC listener when --grpc-tls-cert, --grpc-tls-key or
/// --grpc-client-ca change on disk ([`crate::reload`]), checked as at start and
/// with the site CA added under --enrollment; `None` without those files.
pub(crate) fn grpc_tls_updates(
    args: &Args,
    initial: Option<GrpcServerTls>,
    enrollment: Option<Arc<Enrollment>>,
) -> Option<tokio::sync::watch::Receiver<GrpcServerTls>> {
    let (cert, key, initial) = (
        args.grpc_tls_cert.clone()?,
        args.grpc_tls_key.clone()?,
        initial?,
    );
    let mut paths = vec![cert, key];
    paths.extend(args.grpc_client_ca.clone());
    Some(crate::reload::watch_files(
        paths,
        crate::reload::RELOAD_PERIOD,
        initial,
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

/// The gRPC enrollment listener's TLS: --grpc-tls-cert and --grpc-tls-key when given, else
/// none (plain HTTP/2: the request is proved by the token or the node's key, and the
/// answer is signed).
///
/// Errors: either file cannot be read (named by its flag). The listener never falls back
/// to plain HTTP/2 when TLS was asked for.
pub(crate) fn enrollment_tls(args: &Args) -> anyhow::Result<Option<GrpcServerTls>> {
    let (Some(cert), Some(key)) = (&args.grpc_tls_cert, &args.grpc_tls_key) else {
        return Ok(None);
    };
    Ok(Some(GrpcServerTls {
        cert_pem: read_pem("--grpc-tls-cert", cert)?,
        key_pem: read_pem("--grpc-tls-key", key)?,
        client_ca_pem: None,
    }))
}

/// The per-message options of [`crate::Gateway`] from the flags, with `posture` (from
/// [`posture`]). The enrollment bursts are 5 s of `--enrollment-rate` and 4 s of
/// `--enrollment-rate-per-source`, at least one request each; `--max-inflight` is taken as
/// given ([`crate::apiserver::Apiserver::with_limits`] raises it to 2).
pub(crate) fn gateway_options(args: &Args, posture: Posture) -> GatewayOptions {
    GatewayOptions {
        max_renewal_age: Duration::from_secs(args.max_renewal_age_seconds),
        impersonate_nodes: args.impersonate_nodes,
        posture,
        max_nodes: args.max_nodes,
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

/// The gRPC flags that mean nothing without --grpc-listen are an error, not silently ignored.
pub(crate) fn check_no_grpc_flags(args: &Args) -> anyhow::Result<()> {
    flags_need(
        "--grpc-listen",
        &[
            ("--grpc-tls-cert", args.grpc_tls_cert.is_some()),
            ("--grpc-client-ca", args.grpc_client_ca.is_some()),
            (
                "--require-node-identity",
                args.require_node_identity.is_some(),
            ),
        ],
    )
}

/// Errors with "`flag` needs `parent`" for the first of `flags` that is set (`parent` is
/// not).
pub(crate) fn flags_need(parent: &str, flags: &[(&str, bool)]) -> anyhow::Result<()> {
    match flags.iter().find(|(_, set)| *set) {
        Some((flag, _)) => anyhow::bail!("{flag} needs {parent}"),
        None => Ok(()),
    }
}

/// The gateway's one security posture, from the configured ingresses: at least one
/// ingress; every ingress requires node identities ([`Posture::Identified`]) unless
/// --allow-unidentified-agents, and then each unidentified ingress is logged as a warning.
///
/// Errors: no ingress, or an ingress that lets unidentified agents in without the opt-in;
/// the message names the flags that fix it.
pub(crate) fn posture(
    args: &Args,
    grpc: Option<&GrpcServerOptions>,
    mqtt: Option<&MqttIngressOptions>,
) -> anyhow::Result<Posture> {
    if grpc.is_none() && mqtt.is_none() {
        anyhow::bail!(
            "no ingress: pass --grpc-listen (with --grpc-client-ca for mTLS), --mqtt-endpoint (with --mqtt-node-ca for signed messages), or both"
        );
    }
    let mut unidentified = Vec::new();
    if grpc.is_some_and(|g| !g.require_node_identity) {
        unidentified.push(
            "gRPC lets in agents without a node certificate (add --grpc-tls-cert, --grpc-tls-key and --grpc-client-ca, without --require-node-identity=false)",
        );
    }
    if mqtt.is_some_and(|m| !m.signatures.as_ref().is_some_and(|s| s.required)) {
        unidentified.push(
            "MQTT lets in unsigned messages (add --mqtt-node-ca, without --mqtt-require-signatures=false)",
        );
    }
    match (unidentified.is_empty(), args.allow_unidentified_agents) {
        (true, false) => Ok(Posture::Identified),
        (true, true) => {
            tracing::info!(
                "--allow-unidentified-agents has no effect: every ingress requires node identities"
            );
            Ok(Posture::Identified)
        }
        (false, true) => {
            for ingress in &unidentified {
                tracing::warn!(
                    "--allow-unidentified-agents: {ingress}; anyone who reaches it can write any node that has not spoken with its identity"
                );
            }
            Ok(Posture::AllowUnidentified)
        }
        (false, false) => anyhow::bail!(
            "{}; require node identities there, or pass --allow-unidentified-agents to accept that anyone who reaches it can write nodes",
            unidentified.join("; ")
        ),
    }
}

#[cfg(test)]
#[path = "settings/tests.rs"]
mod tests;
