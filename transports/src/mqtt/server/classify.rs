//! What one PUBLISH under the ingress's subscriptions is, by topic and size, before
//! anything decodes it.

use super::super::{WILL_KIND, parse_certificate_topic, parse_node_topic};
use super::{REJECT_MALFORMED, REJECT_TOO_LARGE, REJECT_UNKNOWN_TOPIC, REJECT_UPLINK};
use crate::ingress::Rejection;
use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{Header, MessageKind};
use prost::Message;

/// Largest payload taken on `P/usage`, 64 KiB (as a node's message): a replica's batch is
/// at most [`MAX_USAGE_BATCH_BYTES`] of samples, a signature and a certificate chain.
pub(super) const MAX_SHARED_USAGE_BYTES: usize = 64 * 1024;

/// What one PUBLISH under the subscriptions is.
#[derive(Debug, PartialEq)]
pub(super) enum Inbound<'t> {
    /// A message for `node` of `kind` (its topic level): not decoded yet, that (and the
    /// signature check) come next, in the event loop.
    Message { node: NodeName, kind: MessageKind },
    /// A Last Will: the broker lost `node`'s connection.
    Will {
        node: &'t str,
        header: Option<Header>,
    },
    /// `node`'s certificate chain (`P/certificates/{node}`).
    Certificate { node: &'t str },
    /// A site bridge's notification (`P/sites/{site}/uplink`): `Some(up)`, or `None` for
    /// an empty payload (a retained state cleared: taken as up).
    Uplink { site: &'t str, up: Option<bool> },
    /// A certificate request of `node` (`P/nodes/{node}/csr`), for the handler's
    /// enrollment ([`Handler::request_certificate`]).
    CertificateRequest { node: &'t str },
    /// A batch of usage samples another replica shares (`P/usage`): not decoded yet, that
    /// (and the signature check) come next, in the event loop.
    Usage,
}

/// Classifies one PUBLISH by topic and size: a message, a Last Will, a certificate, or the
/// rejection reason.
pub(super) fn classify<'t>(
    prefix: &str,
    topic: &'t [u8],
    payload: &[u8],
    max_bytes: usize,
) -> Result<Inbound<'t>, Rejection> {
    let topic = std::str::from_utf8(topic).map_err(|_| REJECT_UNKNOWN_TOPIC)?;
    // A node name the apiserver would refuse never gets a queue or a certificate check.
    let valid = |node: &'t str| {
        if crate::tls::is_node_name(node) {
            Ok(node)
        } else {
            Err(REJECT_MALFORMED)
        }
    };
    if topic
        .strip_prefix(prefix)
        .is_some_and(|t| t.starts_with("/sites/"))
    {
        let site = super::super::parse_uplink_topic(prefix, topic).ok_or(REJECT_UPLINK)?;
        let up = match payload {
            b"1" => Some(true),
            b"0" => Some(false),
            b"" => None,
            _ => return Err(REJECT_UPLINK),
        };
        return Ok(Inbound::Uplink { site, up });
    }
    if super::super::is_usage_topic(prefix, topic) {
        if payload.len() > MAX_SHARED_USAGE_BYTES {
            return Err(REJECT_TOO_LARGE);
        }
        return Ok(Inbound::Usage);
    }
    if let Some(node) = parse_certificate_topic(prefix, topic) {
        let node = valid(node)?;
        if payload.len() > max_bytes {
            return Err(REJECT_TOO_LARGE);
        }
        return Ok(Inbound::Certificate { node });
    }
    let (node, kind) = parse_node_topic(prefix, topic).ok_or(REJECT_UNKNOWN_TOPIC)?;
    if kind == WILL_KIND {
        let node = valid(node)?;
        let header = Header::decode(payload).ok();
        return Ok(Inbound::Will { node, header });
    }
    if kind == crate::enroll::CSR_KIND {
        let node = valid(node)?;
        if payload.len() > max_bytes {
            return Err(REJECT_TOO_LARGE);
        }
        return Ok(Inbound::CertificateRequest { node });
    }
    let node = NodeName::new(node).map_err(|_| REJECT_MALFORMED)?;
    let kind = MessageKind::from_name(kind).ok_or(REJECT_UNKNOWN_TOPIC)?;
    if payload.len() > max_bytes {
        return Err(REJECT_TOO_LARGE);
    }
    Ok(Inbound::Message { node, kind })
}
