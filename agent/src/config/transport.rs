//! `transport`: which transport carries heartbeats, its endpoint(s), credentials and TLS,
//! each checked where it is parsed.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::{Problems, invalid};
use super::values::Period;
use super::{GRPC_KEEPALIVE, MAX_PEM_FILE_BYTES, MQTT_KEEPALIVE};

/// Which transport carries heartbeats, with its settings: each variant owns its endpoint
/// shape and its TLS.
#[derive(Debug, Clone, PartialEq)]
pub enum TransportConfig {
    /// gRPC to the gateway (`transport.kind: grpc`).
    Grpc(GrpcTransport),
    /// MQTT 5 through a broker (`transport.kind: mqtt`).
    Mqtt(MqttTransport),
}

impl TransportConfig {
    /// `transport.kind`: `grpc` or `mqtt` (also the agent's `transport` metric label).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Grpc(_) => "grpc",
            Self::Mqtt(_) => "mqtt",
        }
    }

    /// The transport's TLS ([`GrpcTransport::tls`], [`MqttTransport::tls`]).
    pub fn tls(&self) -> Option<&ClientTls> {
        match self {
            Self::Grpc(g) => g.tls.as_ref(),
            Self::Mqtt(m) => m.tls.as_ref(),
        }
    }

    /// The transport's TLS, to set (tests and tools that build a config in code).
    pub fn tls_mut(&mut self) -> &mut Option<ClientTls> {
        match self {
            Self::Grpc(g) => &mut g.tls,
            Self::Mqtt(m) => &mut m.tls,
        }
    }
}

/// gRPC settings (`transport.kind: grpc`).
#[derive(Debug, Clone, PartialEq)]
pub struct GrpcTransport {
    /// `transport.endpoint`: the gateway's URL, `http://host:port` or `https://host:port`
    /// (checked at load by `edgebeat_transports::endpoint::check_grpc_endpoint`).
    pub endpoint: String,
    /// `transport.keepalive`: an HTTP/2 ping after this long without receiving anything
    /// (default [`GRPC_KEEPALIVE`], 5 min). Renewals are answered only when not written, so
    /// a short interval would ping every period on a metered link; while renewals flow, a
    /// dead link is noticed by `TCP_USER_TIMEOUT` (20 s) instead.
    pub keepalive: Duration,
    /// `transport.caFile`/`certFile`/`keyFile` on an `https://` endpoint (required there,
    /// refused on `http://`): the CA that verifies the gateway and the node's client
    /// certificate (mTLS).
    pub tls: Option<ClientTls>,
}

impl GrpcTransport {
    /// Plain gRPC to `endpoint` with the default keepalive and no TLS.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            keepalive: GRPC_KEEPALIVE,
            tls: None,
        }
    }
}

/// TLS material of a transport on an `https://` (gRPC) or `mqtts://` (MQTT) endpoint, read and
/// checked at load (`transport.caFile`, `transport.certFile`, `transport.keyFile`): the
/// transports' own [`ClientTls`], which the agent hands them unchanged. Certificates are not
/// reloaded: after rotating the files, restart the agent.
pub use edgebeat_transports::tls::{ClientTls, TlsIdentity};

/// MQTT settings (`transport.kind: mqtt`).
#[derive(Debug, Clone, PartialEq)]
pub struct MqttTransport {
    /// Broker host, from `transport.endpoint` (`mqtt://host:port`, port default 1883), or
    /// the first of `transport.endpoints`.
    pub host: String,
    /// Broker port.
    pub port: u16,
    /// `(host, port)` of the rest of `transport.endpoints`: other nodes of the same broker
    /// cluster, each tried in turn after a lost connection (empty with one endpoint).
    pub failover: Vec<(String, u16)>,
    /// `transport.clientID` (default `edgebeat-agent-<nodeName>`).
    pub client_id: Option<String>,
    /// `transport.username` and the contents of `transport.passwordFile` (trailing newline
    /// removed), read at load.
    pub credentials: Option<(String, String)>,
    /// `transport.topicPrefix` (default `edgebeat/v1`).
    pub topic_prefix: String,
    /// `transport.keepalive`: MQTT Keep Alive, rumqttc's PINGREQ cadence (default
    /// [`MQTT_KEEPALIVE`], 30 min; at least 5 s, at most 65,535 s). A dead path is noticed
    /// sooner, by `TCP_USER_TIMEOUT` on unacknowledged renewals (README, "MQTT in one
    /// paragraph").
    pub keepalive: Duration,
    /// `transport.caFile`/`certFile`/`keyFile` on an `mqtts://` endpoint (required there,
    /// refused on `mqtt://`): the CA that verifies the broker and the node's client
    /// certificate, whose key also signs every message end to end.
    pub tls: Option<ClientTls>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawTransport {
    kind: Option<String>,
    endpoint: Option<String>,
    endpoints: Option<Vec<String>>,
    keepalive: Option<Period>,
    #[serde(rename = "clientID")]
    client_id: Option<String>,
    username: Option<String>,
    password_file: Option<PathBuf>,
    topic_prefix: Option<String>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

/// `transport`: every invalid field goes to `p`; `None` when any did.
pub(super) fn validate_transport(p: &mut Problems, t: RawTransport) -> Option<TransportConfig> {
    let before = p.len();
    let keepalive = match (t.keepalive, t.kind.as_deref()) {
        (Some(Period(d)), _) => d,
        (None, Some("grpc")) => GRPC_KEEPALIVE,
        (None, _) => MQTT_KEEPALIVE,
    };
    let kind = t.kind.as_deref().unwrap_or("");
    let example = match kind {
        "mqtt" => "mqtt://broker.example:1883",
        _ => "http://gateway.example:7443",
    };
    // `endpoint`, or the several broker URLs of `endpoints` (MQTT only).
    let endpoints: Vec<String> = match (t.endpoint.clone(), t.endpoints.clone()) {
        (Some(one), None) => vec![one],
        // An empty list is reported below, with the other fields' problems.
        (None, Some(list)) => list,
        (None, None) => Vec::new(),
        (Some(_), Some(list)) => {
            p.push(
                "transport.endpoints",
                "set transport.endpoint or transport.endpoints, not both",
            );
            list
        }
    };
    let endpoint = endpoints.first().cloned();
    if endpoint.is_none() && t.endpoints.is_some() {
        p.push(
            "transport.endpoints",
            format!("must list at least one URL, e.g. [{example}]"),
        );
    } else if endpoint.is_none() && matches!(kind, "grpc" | "mqtt") {
        p.push(
            "transport.endpoint",
            format!("required for kind: {kind}, e.g. {example}"),
        );
    }
    let tls = |p: &mut Problems, endpoint: &str, scheme: &str| {
        validate_tls(
            p,
            endpoint,
            scheme,
            t.ca_file.clone(),
            t.cert_file.clone(),
            t.key_file.clone(),
        )
    };
    let transport = match t.kind.as_deref() {
        Some("grpc") => {
            for (field, set) in [
                ("transport.clientID", t.client_id.is_some()),
                ("transport.username", t.username.is_some()),
                ("transport.passwordFile", t.password_file.is_some()),
                ("transport.topicPrefix", t.topic_prefix.is_some()),
                ("transport.endpoints", t.endpoints.is_some()),
            ] {
                if set {
                    p.push(
                        field,
                        "only valid with kind: mqtt; remove it or set kind: mqtt",
                    );
                }
            }
            if !cfg!(feature = "grpc") {
                p.push(
                    "transport.kind",
                    "this agent was built without gRPC (cargo feature grpc); use kind: mqtt or an agent built with it",
                );
            }
            let endpoint = endpoint?;
            if let Err(m) = edgebeat_transports::endpoint::check_grpc_endpoint(&endpoint) {
                p.push("transport.endpoint", m);
                return None;
            }
            if endpoint.starts_with("https://") && !cfg!(feature = "grpc-tls") {
                p.push(
                    "transport.endpoint",
                    "this build has no gRPC TLS support (feature grpc-tls); use http:// or an agent built with TLS",
                );
            }
            let tls = tls(p, &endpoint, "https://");
            TransportConfig::Grpc(GrpcTransport {
                endpoint,
                keepalive,
                tls,
            })
        }
        Some("mqtt") => {
            if !cfg!(feature = "mqtt") {
                p.push(
                    "transport.kind",
                    "this agent was built without MQTT (cargo feature mqtt); use kind: grpc or an agent built with it",
                );
            }
            if let Err(why) = edgebeat_transports::endpoint::check_mqtt_keepalive(keepalive) {
                p.push("transport.keepalive", format!("{why} for MQTT"));
            }
            let credentials = mqtt_credentials(p, t.username, t.password_file);
            let topic_prefix = t.topic_prefix.unwrap_or_else(|| "edgebeat/v1".to_owned());
            if let Err(why) = edgebeat_transports::endpoint::check_topic_prefix(&topic_prefix) {
                p.push(
                    "transport.topicPrefix",
                    format!("{topic_prefix:?} {why}; a plain topic path, e.g. edgebeat/v1"),
                );
            }
            if let Some(id) = &t.client_id
                && (id.is_empty() || id.len() > 256)
            {
                p.push("transport.clientID", "must be 1 to 256 characters");
            }
            let url = endpoint?;
            let field = |i: usize| match t.endpoints {
                Some(_) => format!("transport.endpoints[{i}]"),
                None => "transport.endpoint".to_owned(),
            };
            let mut brokers = match edgebeat_transports::endpoint::MqttCluster::parse(&endpoints) {
                Ok(cluster) => cluster.brokers,
                Err(problems) => {
                    for (i, m) in problems {
                        p.push(field(i), m);
                    }
                    return None;
                }
            };
            let (host, port) = brokers.remove(0);
            let tls = tls(p, &url, "mqtts://");
            #[cfg(feature = "mqtt-tls")]
            if let Some(client) = tls.as_ref().and_then(|t| t.client_identity.as_ref())
                && let Err(e) = edgebeat_transports::signing::MessageSigner::from_pem(
                    &client.cert_pem,
                    &client.key_pem,
                )
            {
                p.push(
                    "transport.keyFile",
                    format!("cannot sign MQTT messages with it: {e}"),
                );
            }
            #[cfg(not(feature = "mqtt-tls"))]
            if url.starts_with("mqtts://") {
                p.push(
                    "transport.endpoint",
                    "this build has no MQTT TLS support (feature mqtt-tls); use mqtt:// or an agent built with TLS",
                );
            }
            TransportConfig::Mqtt(MqttTransport {
                host,
                port,
                failover: brokers,
                client_id: t.client_id,
                credentials: credentials?,
                topic_prefix,
                keepalive,
                tls,
            })
        }
        Some(other) => {
            p.push(
                "transport.kind",
                format!("{other:?} is not a transport; use grpc or mqtt"),
            );
            return None;
        }
        None => {
            p.push("transport.kind", "required; use grpc or mqtt");
            return None;
        }
    };
    (p.len() == before).then_some(transport)
}

/// `transport.username` and `transport.passwordFile` (read now): both or neither.
/// `Some(None)`: neither; `None`: an error went to `p`.
pub(super) fn mqtt_credentials(
    p: &mut Problems,
    username: Option<String>,
    password_file: Option<PathBuf>,
) -> Option<Option<(String, String)>> {
    match (username, password_file) {
        (None, None) => Some(None),
        (Some(user), Some(file)) => match edgebeat_hw::read_password_file(&file) {
            Ok(password) => Some(Some((user, password))),
            Err(e) => {
                p.push("transport.passwordFile", e.to_string());
                None
            }
        },
        (Some(_), None) => {
            p.push(
                "transport.passwordFile",
                "required when transport.username is set",
            );
            None
        }
        (None, Some(_)) => {
            p.push(
                "transport.username",
                "required when transport.passwordFile is set",
            );
            None
        }
    }
}

/// `transport.caFile`/`certFile`/`keyFile`: with an endpoint on `secure_scheme`
/// (`https://` for gRPC, `mqtts://` for MQTT) the CA is required and cert and key go
/// together; on a plain endpoint none is allowed. Each file is read and parsed now, so a bad
/// file is reported at load with its field. Every problem goes to `p`.
pub(super) fn validate_tls(
    p: &mut Problems,
    endpoint: &str,
    secure_scheme: &str,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
) -> Option<ClientTls> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    if !endpoint.starts_with(secure_scheme) {
        for (field, set) in [
            ("transport.caFile", ca_file.is_some()),
            ("transport.certFile", cert_file.is_some()),
            ("transport.keyFile", key_file.is_some()),
        ] {
            if set {
                p.push(
                    field,
                    format!(
                        "only valid with a {secure_scheme} endpoint, but transport.endpoint is {endpoint:?}; use {secure_scheme} or remove it"
                    ),
                );
            }
        }
        return None;
    }
    let read = |field: &str, path: &PathBuf| {
        edgebeat_hw::read_bounded(path, MAX_PEM_FILE_BYTES)
            .map_err(|e| invalid(field, e.to_string()))
    };
    let certificates = |field: &str, path: &PathBuf| {
        let pem = read(field, path)?;
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
    };
    let ca_pem = match ca_file {
        Some(file) => p.take(certificates("transport.caFile", &file)),
        None => {
            p.push(
                "transport.caFile",
                format!("required for a {secure_scheme} endpoint: the PEM CA certificate that signed the server's certificate"),
            );
            None
        }
    };
    let client = match (cert_file, key_file) {
        (None, None) => Some(None),
        (Some(cert), Some(key)) => {
            let cert_pem = p.take(certificates("transport.certFile", &cert));
            let key_pem = p.take(read("transport.keyFile", &key).and_then(|pem| {
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
    };
    let tls = ClientTls {
        ca_pem: ca_pem?,
        client_identity: client?,
    };
    // The transport builds this same rustls configuration when it connects: a CA that is
    // PEM but no usable trust anchor, or a key rustls cannot use with its certificate, is
    // refused now rather than at the first connection.
    #[cfg(any(feature = "grpc-tls", feature = "mqtt-tls"))]
    if let Err(why) = tls.rustls_config() {
        let field = if why.starts_with("CA") {
            "transport.caFile"
        } else if why.starts_with("client certificate:") {
            "transport.certFile"
        } else {
            "transport.keyFile"
        };
        p.push(field, format!("unusable for TLS: {why}"));
        return None;
    }
    Some(tls)
}
