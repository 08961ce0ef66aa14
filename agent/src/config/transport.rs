//! `transport`: which transport carries heartbeats, tagged on `kind`, checked at load into
//! the transports crate's own options ([`GrpcUplinkOptions`], [`MqttUplinkOptions`]): what
//! loads is exactly what the uplink runs with, files read and the MQTT signer loaded once.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::Problems;
#[cfg(feature = "mqtt")]
use super::error::invalid;
use super::values::{Period, Text};

mod grpc;
mod mqtt;
mod tls;

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
/// The MQTT kind uses every field but `kind` and `enrollmentEndpoint`, so it is checked
/// from this struct itself; gRPC's few are split into [`RawGrpc`].
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

/// `transport` of one kind: gRPC's fields, or for MQTT the whole [`RawTransport`] (the MQTT
/// kind uses every field but `kind` and `enrollmentEndpoint`, which `split` checked unset).
enum Kinded {
    Grpc(RawGrpc),
    Mqtt(RawTransport),
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
                Some(Kinded::Mqtt(self))
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
        Kinded::Grpc(g) => grpc::grpc(p, g, enrolled),
        Kinded::Mqtt(m) => mqtt::mqtt(p, m, renew_interval, enrolled).map(|t| (t, None)),
    };
    (p.len() == before).then_some(transport?)
}
