//! `transport`: which transport carries heartbeats, tagged on `kind`, checked at load into
//! the transports crate's own options ([`GrpcUplinkOptions`], [`MqttUplinkOptions`]): what
//! loads is exactly what the uplink runs with, files read and the MQTT signer loaded once.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::MAX_PEM_FILE_BYTES;
use super::error::{Problems, invalid};
use super::values::{Period, Text};

#[cfg(feature = "grpc")]
pub use edgebeat_transports::grpc::GrpcUplinkOptions;
#[cfg(feature = "mqtt")]
pub use edgebeat_transports::mqtt::MqttUplinkOptions;

/// TLS material of a transport on an `https://` (gRPC) or `mqtts://` (MQTT) endpoint, read and
/// checked at load (`transport.caFile`, `transport.certFile`, `transport.keyFile`): the
/// transports' own [`ClientTls`], which the agent hands them unchanged. Certificates are not
/// reloaded: after rotating the files, restart the agent.
pub use edgebeat_transports::tls::{ClientTls, TlsIdentity};

/// Which transport carries heartbeats, as the transports crate's options, built and checked
/// once at load (every field the config sets, defaults from the transports' constants).
/// A variant exists only in a build with that transport (cargo features `grpc`, `mqtt`): a
/// config naming another is refused at load, naming `transport.kind`.
#[derive(Debug, Clone, PartialEq)]
pub enum TransportConfig {
    /// gRPC to the gateway (`transport.kind: grpc`).
    #[cfg(feature = "grpc")]
    Grpc(GrpcUplinkOptions),
    /// MQTT 5 through a broker (`transport.kind: mqtt`). The options' `client_id` stays
    /// `None` unless `transport.clientID` is set: the uplink then uses
    /// `edgebeat-agent-<nodeName>`.
    #[cfg(feature = "mqtt")]
    Mqtt(MqttUplinkOptions),
}

impl TransportConfig {
    /// `transport.kind`: `grpc` or `mqtt` (also the agent's `transport` metric label).
    pub fn kind(&self) -> &'static str {
        match self {
            #[cfg(feature = "grpc")]
            Self::Grpc(_) => "grpc",
            #[cfg(feature = "mqtt")]
            Self::Mqtt(_) => "mqtt",
        }
    }

    /// The transport's TLS (`None` on `http://` and `mqtt://`).
    pub fn tls(&self) -> Option<&ClientTls> {
        match self {
            #[cfg(feature = "grpc")]
            Self::Grpc(g) => g.tls.as_ref(),
            #[cfg(feature = "mqtt-tls")]
            Self::Mqtt(m) => m.tls.as_ref(),
            #[cfg(all(feature = "mqtt", not(feature = "mqtt-tls")))]
            Self::Mqtt(_) => None,
        }
    }

    /// Sets the transport's TLS, with the checks a config file's gets at load (tests and
    /// tools that build a config in code): over MQTT the client certificate's key also signs
    /// every message.
    ///
    /// Errors: [`ConfigError::Invalid`](super::ConfigError::Invalid) naming
    /// `transport.keyFile` when MQTT cannot use the material (TLS refused, or a key that
    /// cannot sign), or `transport.caFile` in a build without MQTT TLS.
    pub fn set_tls(&mut self, tls: ClientTls) -> Result<(), super::ConfigError> {
        match self {
            #[cfg(feature = "grpc")]
            Self::Grpc(g) => {
                g.tls = Some(tls);
                Ok(())
            }
            #[cfg(feature = "mqtt-tls")]
            Self::Mqtt(m) => m
                .set_tls(tls)
                .map_err(|e| invalid("transport.keyFile", e.to_string())),
            #[cfg(all(feature = "mqtt", not(feature = "mqtt-tls")))]
            Self::Mqtt(_) => {
                drop(tls);
                Err(invalid(
                    "transport.caFile",
                    "this build has no MQTT TLS support (feature mqtt-tls)",
                ))
            }
        }
    }
}

/// `transport` as written: `kind` and the fields of either kind, read flat and split by
/// [`RawTransport::split`] (serde's internally tagged enums buffer the whole mapping
/// through a generic content type, about 50 KB of an aarch64 agent, for the same result).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawTransport {
    kind: Option<String>,
    endpoint: Option<Text>,
    enrollment_endpoint: Option<Text>,
    endpoints: Option<Vec<Text>>,
    keepalive: Option<Period>,
    #[serde(rename = "clientID")]
    client_id: Option<Text>,
    username: Option<Text>,
    password_file: Option<PathBuf>,
    topic_prefix: Option<Text>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    #[serde(rename = "gatewayCAFile")]
    gateway_ca_file: Option<PathBuf>,
}

/// `transport` of one kind.
enum Kinded {
    Grpc(RawGrpc),
    Mqtt(RawMqtt),
}

impl RawTransport {
    /// The fields of its `kind`; a field of the other kind, or a missing or unknown `kind`,
    /// goes to `p` (`None` for the kind).
    fn split(self, p: &mut Problems) -> Option<Kinded> {
        let other = |p: &mut Problems, field: &str, set: bool, message: &str| {
            if set {
                p.push(format!("transport.{field}"), message);
            }
        };
        match self.kind.as_deref() {
            Some("grpc") => {
                for (field, set) in [
                    ("endpoints", self.endpoints.is_some()),
                    ("clientID", self.client_id.is_some()),
                    ("username", self.username.is_some()),
                    ("passwordFile", self.password_file.is_some()),
                    ("topicPrefix", self.topic_prefix.is_some()),
                    ("gatewayCAFile", self.gateway_ca_file.is_some()),
                ] {
                    other(
                        p,
                        field,
                        set,
                        "only valid with kind: mqtt; remove it or set kind: mqtt",
                    );
                }
                Some(Kinded::Grpc(RawGrpc {
                    endpoint: self.endpoint,
                    enrollment_endpoint: self.enrollment_endpoint,
                    keepalive: self.keepalive,
                    ca_file: self.ca_file,
                    cert_file: self.cert_file,
                    key_file: self.key_file,
                }))
            }
            Some("mqtt") => {
                other(
                    p,
                    "enrollmentEndpoint",
                    self.enrollment_endpoint.is_some(),
                    "only valid with kind: grpc (over MQTT, certificate requests go through the broker); remove it",
                );
                Some(Kinded::Mqtt(RawMqtt {
                    endpoint: self.endpoint,
                    endpoints: self.endpoints,
                    keepalive: self.keepalive,
                    client_id: self.client_id,
                    username: self.username,
                    password_file: self.password_file,
                    topic_prefix: self.topic_prefix,
                    ca_file: self.ca_file,
                    cert_file: self.cert_file,
                    key_file: self.key_file,
                    gateway_ca_file: self.gateway_ca_file,
                }))
            }
            None => {
                p.push("transport.kind", "required; use grpc or mqtt");
                None
            }
            Some(other) => {
                p.push(
                    "transport.kind",
                    format!("{other:?} is not a transport; use grpc or mqtt"),
                );
                None
            }
        }
    }
}

/// `transport` fields of `kind: grpc` (split in any build, so that a build without gRPC
/// names `transport.kind` as the problem).
#[cfg_attr(not(feature = "grpc"), allow(dead_code))]
struct RawGrpc {
    endpoint: Option<Text>,
    enrollment_endpoint: Option<Text>,
    keepalive: Option<Period>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

/// `transport` fields of `kind: mqtt` (split in any build, as [`RawGrpc`]).
#[cfg_attr(not(feature = "mqtt"), allow(dead_code))]
struct RawMqtt {
    endpoint: Option<Text>,
    endpoints: Option<Vec<Text>>,
    keepalive: Option<Period>,
    client_id: Option<Text>,
    username: Option<Text>,
    password_file: Option<PathBuf>,
    topic_prefix: Option<Text>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    gateway_ca_file: Option<PathBuf>,
}

/// The `transport` mapping of a file that did not deserialize as a whole, field by field, so
/// that every bad field is named: `check` deserializes one `transport` value alone and gives
/// serde's message. A missing `kind` is the one problem named (the other fields mean
/// nothing without it); otherwise each field is checked with the `kind` beside it. Returns
/// what passed, with its `kind`, for `validate` (which names a field of the other kind).
pub(super) fn name_bad_fields(
    p: &mut Problems,
    value: serde_json::Value,
    check: impl Fn(serde_json::Value) -> Result<(), String>,
) -> Option<serde_json::Value> {
    let serde_json::Value::Object(fields) = value else {
        if let Err(m) = check(value) {
            p.push("transport", m);
        }
        return None;
    };
    let Some(kind) = fields.get("kind").cloned() else {
        p.push("transport.kind", "required; use grpc or mqtt");
        return None;
    };
    let with_kind = |more: Option<(&String, &serde_json::Value)>| {
        let mut one = serde_json::Map::from_iter([("kind".to_owned(), kind.clone())]);
        one.extend(more.map(|(k, v)| (k.clone(), v.clone())));
        serde_json::Value::Object(one)
    };
    if let Err(m) = check(with_kind(None)) {
        p.push("transport.kind", m);
        return None;
    }
    let mut kept = serde_json::Map::new();
    for (field, v) in &fields {
        match check(with_kind(Some((field, v)))) {
            Ok(()) => {
                kept.insert(field.clone(), v.clone());
            }
            Err(m) => p.push(format!("transport.{field}"), m),
        }
    }
    Some(serde_json::Value::Object(kept))
}

/// `transport`, checked into the transport's options: every invalid field goes to `p`;
/// `None` when any did. `renew_interval` is the Lease renew interval (MQTT renewals expire
/// at the broker after it). With `enrolled` (`bootstrapTokenFile` set) the node's
/// certificate comes from enrollment: `certFile`/`keyFile` are refused, `caFile` may be
/// left out (the site CA enrollment brings then verifies the server), and gRPC needs
/// `enrollmentEndpoint`, which is returned beside the transport.
pub(super) fn validate_transport(
    p: &mut Problems,
    raw: RawTransport,
    renew_interval: Duration,
    enrolled: bool,
) -> Option<(TransportConfig, Option<String>)> {
    let before = p.len();
    let transport = match raw.split(p)? {
        Kinded::Grpc(g) => grpc(p, g, enrolled),
        Kinded::Mqtt(m) => mqtt(p, m, renew_interval, enrolled).map(|t| (t, None)),
    };
    (p.len() == before).then_some(transport?)
}

#[cfg(not(feature = "grpc"))]
fn grpc(p: &mut Problems, _: RawGrpc, _: bool) -> Option<(TransportConfig, Option<String>)> {
    p.push(
        "transport.kind",
        "this agent was built without gRPC (cargo feature grpc); use kind: mqtt or an agent built with it",
    );
    None
}

/// `kind: grpc`: the endpoint (`http://` or `https://` with `caFile`, and `certFile` with
/// `keyFile` for mTLS), the keepalive, and for an enrolled node the enrollment endpoint.
#[cfg(feature = "grpc")]
fn grpc(p: &mut Problems, g: RawGrpc, enrolled: bool) -> Option<(TransportConfig, Option<String>)> {
    let Some(Text(endpoint)) = g.endpoint else {
        p.push(
            "transport.endpoint",
            "required for kind: grpc, e.g. http://gateway.example:7443",
        );
        return None;
    };
    if let Err(m) = edgebeat_transports::endpoint::check_grpc_endpoint(&endpoint) {
        p.push("transport.endpoint", m.to_string());
        return None;
    }
    if endpoint.starts_with("https://") && !cfg!(feature = "grpc-tls") {
        p.push(
            "transport.endpoint",
            "this build has no gRPC TLS support (feature grpc-tls); use http:// or an agent built with TLS",
        );
    }
    let has_ca = g.ca_file.is_some();
    if enrolled && !endpoint.starts_with("https://") {
        p.push(
            "transport.endpoint",
            "with bootstrapTokenFile use https://: the enrolled certificate is the node's identity over mTLS",
        );
    }
    let tls = validate_tls(
        p,
        &endpoint,
        "https://",
        [g.ca_file, g.cert_file, g.key_file],
        enrolled,
    );
    let enrollment = enrollment_endpoint(p, g.enrollment_endpoint, enrolled, has_ca);
    let mut options = GrpcUplinkOptions::new(endpoint);
    if let Some(Period(keepalive)) = g.keepalive {
        options.keepalive = keepalive;
    }
    options.tls = tls;
    Some((TransportConfig::Grpc(options), enrollment))
}

/// `transport.enrollmentEndpoint` (gRPC): where an enrolled node asks for its certificates,
/// `http://host:port` (requests and answers are authenticated end to end) or `https://`
/// (with `caFile`, which the board has before its first certificate). Required with
/// `bootstrapTokenFile`, refused without.
#[cfg(feature = "grpc")]
fn enrollment_endpoint(
    p: &mut Problems,
    endpoint: Option<Text>,
    enrolled: bool,
    has_ca: bool,
) -> Option<String> {
    const FIELD: &str = "transport.enrollmentEndpoint";
    match (endpoint, enrolled) {
        (None, false) => None,
        (Some(_), false) => {
            p.push(
                FIELD,
                "only valid with bootstrapTokenFile; remove it or add that",
            );
            None
        }
        (None, true) => {
            p.push(
                FIELD,
                "required with bootstrapTokenFile: the gateway's enrollment listener, e.g. http://gateway.example:7444",
            );
            None
        }
        (Some(Text(url)), true) => {
            if let Err(m) = edgebeat_transports::endpoint::check_grpc_endpoint(&url) {
                p.push(FIELD, m.to_string());
                return None;
            }
            if url.starts_with("https://") && !has_ca {
                p.push(
                    FIELD,
                    "https:// needs transport.caFile, which a board has before its first certificate; or use http:// (requests and answers are authenticated end to end)",
                );
            }
            Some(url)
        }
    }
}

#[cfg(not(feature = "mqtt"))]
fn mqtt(p: &mut Problems, _: RawMqtt, _: Duration, _: bool) -> Option<TransportConfig> {
    p.push(
        "transport.kind",
        "this agent was built without MQTT (cargo feature mqtt); use kind: grpc or an agent built with it",
    );
    None
}

/// `kind: mqtt`: the broker(s), credentials, topic prefix, keepalive and TLS, whose client
/// certificate's key also signs every message. Renewals expire at the broker after the
/// renew interval (whole seconds, at least 1), so a broker never hands a gateway a backlog of
/// stale renewals.
#[cfg(feature = "mqtt")]
fn mqtt(
    p: &mut Problems,
    m: RawMqtt,
    renew_interval: Duration,
    enrolled: bool,
) -> Option<TransportConfig> {
    use edgebeat_transports::endpoint;

    let keepalive = m
        .keepalive
        .map_or(endpoint::MQTT_AGENT_KEEPALIVE, |Period(d)| d);
    if let Err(why) = endpoint::check_mqtt_keepalive(keepalive) {
        p.push("transport.keepalive", format!("{why} for MQTT"));
    }
    let credentials = mqtt_credentials(p, m.username.map(|Text(u)| u), m.password_file);
    let topic_prefix = m.topic_prefix.map_or_else(
        || edgebeat_transports::mqtt::DEFAULT_TOPIC_PREFIX.to_owned(),
        |Text(prefix)| prefix,
    );
    if let Err(why) = endpoint::check_topic_prefix(&topic_prefix) {
        p.push(
            "transport.topicPrefix",
            format!("{topic_prefix:?} {why}; a plain topic path, e.g. edgebeat/v1"),
        );
    }
    let client_id = m.client_id.map(|Text(id)| id);
    if let Some(id) = &client_id
        && (id.is_empty() || id.len() > 256)
    {
        p.push("transport.clientID", "must be 1 to 256 characters");
    }
    let (urls, field) = broker_urls(
        p,
        m.endpoint.map(|Text(url)| url),
        m.endpoints
            .map(|list| list.into_iter().map(|Text(url)| url).collect()),
    )?;
    let mut brokers = match endpoint::MqttCluster::parse(&urls) {
        Ok(cluster) => cluster.brokers,
        Err(problems) => {
            for (i, why) in problems {
                p.push(field(i), why);
            }
            return None;
        }
    };
    let (host, port) = brokers.remove(0);
    let mut options = MqttUplinkOptions::new(host, port);
    options.failover = brokers;
    options.client_id = client_id;
    options.credentials = credentials?;
    options.topic_prefix = topic_prefix;
    options.keepalive = keepalive;
    options.lease_expiry = Duration::from_secs(renew_interval.as_secs().max(1));
    if enrolled && !urls[0].starts_with("mqtts://") {
        p.push(
            "transport.endpoint",
            "with bootstrapTokenFile use mqtts://: the enrolled key signs every message and TLS presents its certificate",
        );
    }
    let tls = validate_tls(
        p,
        &urls[0],
        "mqtts://",
        [m.ca_file, m.cert_file, m.key_file],
        enrolled,
    );
    let signs = tls.as_ref().is_some_and(|t| t.client_identity.is_some());
    #[cfg(feature = "mqtt-tls")]
    if let Some(tls) = tls
        && let Err(e) = options.set_tls(tls)
    {
        p.push("transport.keyFile", e.to_string());
    }
    match m.gateway_ca_file {
        Some(_) if enrolled => p.push(
            "transport.gatewayCAFile",
            "not used with bootstrapTokenFile: the site CA comes with the enrollment, pinned by the token; remove it",
        ),
        Some(file) => gateway_ca(p, &mut options, &file, signs),
        None => {}
    }
    #[cfg(not(feature = "mqtt-tls"))]
    if tls.is_some() || urls[0].starts_with("mqtts://") {
        p.push(
            "transport.endpoint",
            "this build has no MQTT TLS support (feature mqtt-tls); use mqtt:// or an agent built with TLS",
        );
    }
    Some(TransportConfig::Mqtt(options))
}

/// `transport.gatewayCAFile`: the CA that issued the gateway's answer key, when it is not
/// `caFile` (the broker's CA): best an answer CA that issues the gateway's answer key alone
/// (README "MQTT over TLS with signed messages"), so that nothing else the site CA issued
/// can answer. Only with a node key (`certFile`, `keyFile`), whose messages are signed and
/// whose answers are verified. An enrolled agent trusts the answer CAs it learnt instead.
#[cfg(feature = "mqtt")]
fn gateway_ca(
    p: &mut Problems,
    options: &mut MqttUplinkOptions,
    file: &std::path::Path,
    signs: bool,
) {
    const FIELD: &str = "transport.gatewayCAFile";
    if !signs {
        p.push(
            FIELD,
            "only valid with transport.certFile and transport.keyFile (signed messages, whose answers it verifies); remove it or add them",
        );
        return;
    }
    let Some(pem) = p.take(read_certificates(FIELD, file)) else {
        return;
    };
    #[cfg(feature = "mqtt-tls")]
    if let Err(e) = options.set_gateway_ca(&pem) {
        p.push(FIELD, e.to_string());
    }
    #[cfg(not(feature = "mqtt-tls"))]
    let _ = (options, pem);
}

/// `transport.endpoint`, or the several broker URLs of `transport.endpoints`, with the field
/// name of the `i`-th for its problems; `None` (the problem in `p`) when neither gives one.
#[cfg(feature = "mqtt")]
fn broker_urls(
    p: &mut Problems,
    endpoint: Option<String>,
    endpoints: Option<Vec<String>>,
) -> Option<(Vec<String>, impl Fn(usize) -> String + use<>)> {
    const EXAMPLE: &str = "mqtt://broker.example:1883";
    let listed = endpoints.is_some();
    let urls = match (endpoint, endpoints) {
        (Some(one), None) => vec![one],
        (None, Some(list)) => list,
        (None, None) => {
            p.push(
                "transport.endpoint",
                format!("required for kind: mqtt, e.g. {EXAMPLE}"),
            );
            return None;
        }
        (Some(_), Some(list)) => {
            p.push(
                "transport.endpoints",
                "set transport.endpoint or transport.endpoints, not both",
            );
            list
        }
    };
    if urls.is_empty() {
        p.push(
            "transport.endpoints",
            format!("must list at least one URL, e.g. [{EXAMPLE}]"),
        );
        return None;
    }
    let field = move |i: usize| match listed {
        true => format!("transport.endpoints[{i}]"),
        false => "transport.endpoint".to_owned(),
    };
    Some((urls, field))
}

/// `transport.username` and `transport.passwordFile` (read now): both or neither.
/// `Some(None)`: neither; `None`: an error went to `p`.
#[cfg(feature = "mqtt")]
fn mqtt_credentials(
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
fn read_pem(field: &str, path: &std::path::Path) -> Result<Vec<u8>, super::ConfigError> {
    edgebeat_hw::read_bounded(path, MAX_PEM_FILE_BYTES).map_err(|e| invalid(field, e.to_string()))
}

/// A PEM file of at least one certificate named by `field`.
fn read_certificates(field: &str, path: &std::path::Path) -> Result<Vec<u8>, super::ConfigError> {
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
