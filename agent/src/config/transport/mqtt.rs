//! `transport` of `kind: mqtt`, checked into `MqttUplinkOptions`: the broker(s), the
//! credentials, the topic prefix, the keepalive, the TLS files and the gateway's answer CA.
//! A build without MQTT refuses the kind, naming `transport.kind`.

#[cfg(feature = "mqtt")]
use std::path::PathBuf;
use std::time::Duration;

use crate::config::error::Problems;
#[cfg(feature = "mqtt")]
use crate::config::values::{Period, Text};

#[cfg(feature = "mqtt")]
use super::MqttUplinkOptions;
#[cfg(feature = "mqtt")]
use super::tls::{read_certificates, validate_tls};
use super::{RawTransport, TransportConfig};

#[cfg(not(feature = "mqtt"))]
pub(super) fn mqtt(
    p: &mut Problems,
    _: RawTransport,
    _: Duration,
    _: bool,
) -> Option<TransportConfig> {
    p.push(
        "transport.kind",
        "this agent was built without MQTT (cargo feature mqtt); use kind: grpc or an agent built with it",
    );
    None
}

/// `kind: mqtt`, from every field of `transport` but `kind` and `enrollmentEndpoint`
/// (which [`RawTransport::split`] checked): the broker(s), credentials, topic prefix,
/// keepalive and TLS, whose client certificate's key also signs every message. Renewals
/// expire at the broker after the renew interval (whole seconds, at least 1), so a broker
/// never hands a gateway a backlog of stale renewals.
#[cfg(feature = "mqtt")]
pub(super) fn mqtt(
    p: &mut Problems,
    m: RawTransport,
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
