//! `transport` of `kind: grpc`, checked into `GrpcUplinkOptions`: the endpoint, the
//! keepalive, the TLS files and, for an enrolled node, the enrollment endpoint. A build
//! without gRPC refuses the kind, naming `transport.kind`.

use crate::config::error::Problems;
#[cfg(feature = "grpc")]
use crate::config::values::{Period, Text};

#[cfg(feature = "grpc")]
use super::GrpcUplinkOptions;
#[cfg(feature = "grpc")]
use super::tls::validate_tls;
use super::{RawGrpc, TransportConfig};

#[cfg(not(feature = "grpc"))]
pub(super) fn grpc(
    p: &mut Problems,
    _: RawGrpc,
    _: bool,
) -> Option<(TransportConfig, Option<String>)> {
    p.push(
        "transport.kind",
        "this agent was built without gRPC (cargo feature grpc); use kind: mqtt or an agent built with it",
    );
    None
}

/// `kind: grpc`: the endpoint (`http://` or `https://` with `caFile`, and `certFile` with
/// `keyFile` for mTLS), the keepalive, and for an enrolled node the enrollment endpoint.
#[cfg(feature = "grpc")]
pub(super) fn grpc(
    p: &mut Problems,
    g: RawGrpc,
    enrolled: bool,
) -> Option<(TransportConfig, Option<String>)> {
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
