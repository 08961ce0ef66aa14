//! Broker endpoints as the agent's `transport.endpoint` and the gateway's `--mqtt-endpoint`
//! write them, and the MQTT topic prefix and keepalive rules. Plain string handling, built
//! whatever the features, so that configuration is checked by any build with the rules the
//! transports apply: a config that loads is one the transport runs.

use std::time::Duration;

/// An MQTT broker endpoint: `mqtt://host[:port]` (port 1883) or `mqtts://host[:port]`
/// (MQTT over TLS, port 8883). An IPv6 address is written in brackets, `mqtt://[::1]:1883`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttEndpoint {
    /// Host name or address (an IPv6 address without its brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// `mqtts://`: TLS to the broker.
    pub tls: bool,
}

/// Why an MQTT endpoint is refused ([`MqttEndpoint`]'s `FromStr`): what is wrong with
/// the text `url`, which the message quotes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MqttEndpointError {
    /// A scheme other than `mqtt://` or `mqtts://`.
    #[error("{url:?} must start with mqtt:// or mqtts:// (TLS), e.g. mqtts://broker.example:8883")]
    Scheme {
        /// The text given.
        url: String,
    },
    /// A path after the host.
    #[error("{url:?} must not have a path")]
    Path {
        /// The text given.
        url: String,
    },
    /// A `[` without its `]`.
    #[error("{url:?} has an unclosed '['")]
    UnclosedBracket {
        /// The text given.
        url: String,
    },
    /// Text after `]` that is not `:port`.
    #[error("{url:?} has text after the IPv6 address")]
    AfterAddress {
        /// The text given.
        url: String,
    },
    /// A port that is not a number from 0 to 65535.
    #[error("{url:?} has an invalid port")]
    Port {
        /// The text given.
        url: String,
    },
    /// No host.
    #[error("{url:?} has no host")]
    NoHost {
        /// The text given.
        url: String,
    },
}

impl std::str::FromStr for MqttEndpoint {
    type Err = MqttEndpointError;

    /// Parses `mqtt://host[:port]` or `mqtts://host[:port]`.
    ///
    /// Errors: the [`MqttEndpointError`] for another scheme, a path, a bad port or no host.
    fn from_str(url: &str) -> Result<Self, MqttEndpointError> {
        use MqttEndpointError as E;
        let text = || url.to_owned();
        let (rest, port, tls) = match (url.strip_prefix("mqtt://"), url.strip_prefix("mqtts://")) {
            (Some(rest), _) => (rest, 1883, false),
            (None, Some(rest)) => (rest, 8883, true),
            (None, None) => return Err(E::Scheme { url: text() }),
        };
        if rest.contains('/') {
            return Err(E::Path { url: text() });
        }
        let (host, port_text) = match rest.strip_prefix('[') {
            Some(bracketed) => {
                let (host, after) = bracketed
                    .split_once(']')
                    .ok_or_else(|| E::UnclosedBracket { url: text() })?;
                match after {
                    "" => (host, None),
                    _ => (
                        host,
                        Some(
                            after
                                .strip_prefix(':')
                                .ok_or_else(|| E::AfterAddress { url: text() })?,
                        ),
                    ),
                }
            }
            None => match rest.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            },
        };
        let port = match port_text {
            Some(port) => port.parse::<u16>().map_err(|_| E::Port { url: text() })?,
            None => port,
        };
        if host.is_empty() {
            return Err(E::NoHost { url: text() });
        }
        Ok(Self {
            host: host.to_owned(),
            port,
            tls,
        })
    }
}

/// The nodes of one MQTT broker cluster, from a list of endpoints: the agent's
/// `transport.endpoints`, the gateway's `--mqtt-endpoint` given more than once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttCluster {
    /// `(host, port)` of each node, in the order given: the first is dialled first, the
    /// rest in turn after a lost connection.
    pub brokers: Vec<(String, u16)>,
    /// `mqtts://`: TLS to every node.
    pub tls: bool,
}

impl MqttCluster {
    /// Parses each endpoint as [`MqttEndpoint`]; the nodes share one set of TLS settings
    /// and credentials, so all must be `mqtts://` or all `mqtt://`.
    ///
    /// Errors: every problem, as `(index in urls, message quoting the text)`; an empty list
    /// is `(0, …)`.
    pub fn parse<S: AsRef<str>>(urls: &[S]) -> Result<Self, Vec<(usize, String)>> {
        let Some(first) = urls.first() else {
            return Err(vec![(0, "at least one broker is needed".to_owned())]);
        };
        let first = first.as_ref();
        let tls = first.starts_with("mqtts://");
        let mut brokers = Vec::with_capacity(urls.len());
        let mut problems = Vec::new();
        for (i, text) in urls.iter().map(AsRef::as_ref).enumerate() {
            match text.parse::<MqttEndpoint>() {
                Ok(e) if e.tls != tls => problems.push((
                    i,
                    format!(
                        "{text:?} and {first:?} differ in TLS: every broker of the list shares one set of TLS settings, so all are mqtts:// or all mqtt://"
                    ),
                )),
                Ok(e) => brokers.push((e.host, e.port)),
                Err(m) => problems.push((i, m.to_string())),
            }
        }
        if problems.is_empty() {
            Ok(Self { brokers, tls })
        } else {
            Err(problems)
        }
    }
}

/// Why a gRPC endpoint is refused ([`check_grpc_endpoint`]), quoting the text given; its
/// `Display` ends with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrpcEndpointError {
    /// `http::Uri` does not parse it (`reason` is its message).
    #[error("{url:?} is not a URL ({reason}); {GRPC_ENDPOINT_FIX}")]
    NotAUrl {
        /// The text given.
        url: String,
        /// `http::Uri`'s reason.
        reason: String,
    },
    /// A scheme other than `http` or `https`.
    #[error("{url:?} must start with http:// or https:// for kind: grpc")]
    Scheme {
        /// The text given.
        url: String,
    },
    /// No host.
    #[error("{url:?} has no host; {GRPC_ENDPOINT_FIX}")]
    NoHost {
        /// The text given.
        url: String,
    },
    /// A port that is not a number, or user info (`user@`).
    #[error("{url:?} has an invalid port or user info; {GRPC_ENDPOINT_FIX}")]
    PortOrUserInfo {
        /// The text given.
        url: String,
    },
    /// A path or a query.
    #[error("{url:?} must not have a path or query; {GRPC_ENDPOINT_FIX}")]
    PathOrQuery {
        /// The text given.
        url: String,
    },
}

/// The fix every [`GrpcEndpointError`] ends with.
const GRPC_ENDPOINT_FIX: &str = "use http://host:port, or https://host:port for TLS";

/// Checks a gateway's gRPC endpoint (the agent's `transport.endpoint` for `kind: grpc`):
/// `http://host[:port]`, or `https://host[:port]` for TLS, parsed by `http::Uri` as tonic's
/// `Endpoint::from_shared` parses it when the uplink starts, so an endpoint the config
/// accepts is one the uplink takes.
///
/// Errors: the [`GrpcEndpointError`] saying what is wrong.
pub fn check_grpc_endpoint(url: &str) -> Result<(), GrpcEndpointError> {
    let uri: http::Uri =
        url.parse()
            .map_err(|e: http::uri::InvalidUri| GrpcEndpointError::NotAUrl {
                url: url.to_owned(),
                reason: e.to_string(),
            })?;
    let url = || url.to_owned();
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(GrpcEndpointError::Scheme { url: url() });
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(GrpcEndpointError::NoHost { url: url() });
    }
    // `http::Uri` takes `gw:x` with no port, and the connector would then dial port 80.
    let authority = uri.authority().map_or("", http::uri::Authority::as_str);
    let after_host = authority
        .rsplit_once(']')
        .map_or(authority, |(_, rest)| rest);
    if authority.contains('@') || (after_host.contains(':') && uri.port_u16().is_none()) {
        return Err(GrpcEndpointError::PortOrUserInfo { url: url() });
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(GrpcEndpointError::PathOrQuery { url: url() });
    }
    Ok(())
}

/// Checks an MQTT topic prefix (`transport.topicPrefix`, the gateway's `--mqtt-topic-prefix`):
/// not empty, no wildcard, no `$` start (reserved for the broker), no leading or trailing
/// `/`, no NUL (MQTT 5.0 §4.7). The one rule the agent's config, the MQTT uplink and the MQTT
/// ingress all apply.
///
/// Errors: what is wrong, to follow the field's name.
pub fn check_topic_prefix(prefix: &str) -> Result<(), &'static str> {
    if prefix.is_empty() {
        return Err("must not be empty");
    }
    if prefix.starts_with('$') {
        return Err("must not start with '$' (reserved by MQTT)");
    }
    if prefix.starts_with('/') || prefix.ends_with('/') {
        return Err("must not start or end with '/'");
    }
    if prefix.contains(['+', '#', '\0']) {
        return Err("must not contain '+', '#' or NUL");
    }
    Ok(())
}

/// Checks one topic level (node name, share group): not empty, no `/`, wildcard or NUL.
///
/// Errors: what is wrong.
pub fn check_topic_level(level: &str) -> Result<(), &'static str> {
    if level.is_empty() {
        return Err("must not be empty");
    }
    if level.contains(['/', '+', '#', '\0']) {
        return Err("must not contain '/', '+', '#' or NUL");
    }
    Ok(())
}

/// Default HTTP/2 keepalive of the agent's gRPC uplink, 5 min, for its config
/// (`transport.keepalive`) and its gRPC uplink alike: a ping after this long without
/// receiving anything. Renewals are answered only when not written, so a short interval
/// would ping every period on a metered link; while renewals flow, a dead link is noticed by
/// `TCP_USER_TIMEOUT` (20 s) instead.
pub const GRPC_AGENT_KEEPALIVE: Duration = Duration::from_secs(300);

/// Default MQTT keepalive of the agent, 30 min, for its config (`transport.keepalive`) and
/// its MQTT uplink alike.
///
/// With renewals every 10 s the broker hears from a live agent anyway, and a dead path to
/// the broker is noticed from unacknowledged renewals (`TCP_USER_TIMEOUT`, the MQTT
/// uplink's `user_timeout`), so PINGREQ only has to keep the broker's own limit
/// (1.5 × keepalive, 45 min) for a client that went silent without closing. rumqttc sends a
/// PINGREQ every keepalive whatever else was sent. At 30 s that cost 0.63 MB a day
/// (BENCHMARKS.md, "MQTT headers left to the topic": 2.08 against 1.45 MB at 5 min), about
/// 240 B an exchange, so about 0.01 MB a day at 30 min. It is the MQTT counterpart of the
/// gRPC uplink's pings only when idle.
pub const MQTT_AGENT_KEEPALIVE: Duration = Duration::from_secs(1800);

/// Checks an MQTT keepalive for rumqttc (which panics below 5 s) and MQTT (a 16-bit count of
/// seconds, MQTT 5.0 §3.1.2.10).
///
/// Errors: what is wrong.
pub fn check_mqtt_keepalive(keepalive: Duration) -> Result<(), &'static str> {
    if keepalive < Duration::from_secs(5) {
        return Err("must be at least 5 s");
    }
    if keepalive.as_secs() > u64::from(u16::MAX) {
        return Err("must be at most 65535 s");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<(String, u16, bool), String> {
        url.parse::<MqttEndpoint>()
            .map(|e| (e.host, e.port, e.tls))
            .map_err(|e| e.to_string())
    }

    /// Every endpoint the check accepts, tonic's parser takes (the uplink's); the ones it
    /// refuses once loaded and then failed when the agent started.
    #[test]
    fn grpc_endpoints_are_what_the_uplink_parses() {
        for good in [
            "http://gw:7443",
            "https://gateway.example:443",
            "http://10.0.0.1:7443/",
            "http://[::1]:7443",
        ] {
            assert_eq!(check_grpc_endpoint(good), Ok(()), "{good}");
        }
        use GrpcEndpointError as E;
        for bad in ["http://", "http://gw gw:7443"] {
            assert!(
                matches!(check_grpc_endpoint(bad), Err(E::NotAUrl { url, .. }) if url == bad),
                "{bad:?}"
            );
        }
        for (bad, err) in [
            (
                "http://gw:x",
                E::PortOrUserInfo {
                    url: "http://gw:x".into(),
                },
            ),
            (
                "gw:7443",
                E::Scheme {
                    url: "gw:7443".into(),
                },
            ),
            (
                "mqtt://gw:1883",
                E::Scheme {
                    url: "mqtt://gw:1883".into(),
                },
            ),
            (
                "http://gw:7443/heartbeat",
                E::PathOrQuery {
                    url: "http://gw:7443/heartbeat".into(),
                },
            ),
            (
                "http://:7443",
                E::NoHost {
                    url: "http://:7443".into(),
                },
            ),
        ] {
            assert_eq!(check_grpc_endpoint(bad), Err(err), "{bad:?}");
        }
    }

    #[test]
    fn schemes_ports_and_hosts() {
        assert_eq!(parse("mqtt://b"), Ok(("b".into(), 1883, false)));
        assert_eq!(parse("mqtts://b"), Ok(("b".into(), 8883, true)));
        assert_eq!(
            parse("mqtt://b.example:1"),
            Ok(("b.example".into(), 1, false))
        );
        assert_eq!(parse("mqtts://[::1]:8884"), Ok(("::1".into(), 8884, true)));
        assert_eq!(
            parse("mqtt://[fe80::1]"),
            Ok(("fe80::1".into(), 1883, false))
        );
        for (bad, words) in [
            ("tcp://b", "must start with"),
            ("mqtt://b/x", "path"),
            ("mqtt://b:x", "invalid port"),
            ("mqtt://b:70000", "invalid port"),
            ("mqtt://:1883", "no host"),
            ("mqtt://[::1", "unclosed"),
            ("mqtt://[::1]x", "after the IPv6"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(words), "{bad}: {err}");
        }
    }
}
