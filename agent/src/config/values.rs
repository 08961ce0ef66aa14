//! Scalar values of the configuration: durations, counts, addresses, node names, paths,
//! reserved resources. Most scalar fields' rule is their type's `TryFrom`, which serde runs
//! as it reads the field (`#[serde(try_from)]`), so a value that loads is one the agent can
//! run with, and the error names the field it came from. Floats are the exception (see
//! `AgentConfig`'s `validate`), as are the maps (`systemReserved`, `evictionHard`, …),
//! whose entries are checked one by one so each error names its key.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::Problems;
use edgebeat_proto::registration::{self, NodeName};

use crate::quantity::{Amount, parse_amount, parse_millicores};

/// Why a value of the config file or a flag is refused: the text given, and the fix. Its
/// `Display` is the message the operator reads (the caller names the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValueError {
    /// Not an `IP:port` ([`parse_bind_address`]).
    #[error(
        "{text:?} is not an IP:port address, e.g. 127.0.0.1:10248 or [::1]:10248 (remove the field to turn the server off)"
    )]
    NotAnAddress {
        /// The text given.
        text: String,
    },
    /// An `IP:port` with port 0 ([`parse_bind_address`]).
    #[error(
        "{text:?} has port 0; use a fixed port such as 10248 so probes and scrapers can find it"
    )]
    PortZero {
        /// The text given.
        text: String,
    },
    /// Not a Go duration ([`parse_duration`]).
    #[error("invalid duration {text:?}; use a Go duration such as \"10s\", \"5m\" or \"1m30s\"")]
    Duration {
        /// The text given.
        text: String,
    },
    /// Not a valid Node name ([`parse_node_name`]).
    #[error(transparent)]
    NodeName(#[from] registration::RegistrationError),
    /// A valid Node name too long for the `kubernetes.io/hostname` label
    /// ([`parse_node_name`]).
    #[error(
        "{name:?} is {} characters; a node name is also its kubernetes.io/hostname label, which allows at most {}",
        name.len(),
        registration::MAX_LABEL_VALUE_BYTES
    )]
    NodeNameTooLong {
        /// The name given.
        name: String,
    },
}

/// Parses the observe server's address (`healthzBindAddress`, `--healthz-bind-address`): an
/// `IP:port` (`[v6]:port` for IPv6) with a port other than 0. A host name is not accepted:
/// the agent binds before any resolver is needed, as kubelet does.
///
/// Errors: [`ValueError::NotAnAddress`], [`ValueError::PortZero`].
pub fn parse_bind_address(text: &str) -> Result<SocketAddr, ValueError> {
    let addr: SocketAddr = text.trim().parse().map_err(|_| ValueError::NotAnAddress {
        text: text.to_owned(),
    })?;
    if addr.port() == 0 {
        return Err(ValueError::PortZero {
            text: text.to_owned(),
        });
    }
    Ok(addr)
}

/// `systemReserved` / `kubeReserved`: resource → amount (cpu in millicores, the others in
/// bytes or a count); every invalid entry goes to `p` and is left out.
pub(super) fn parse_reserved(
    p: &mut Problems,
    field: &str,
    map: Option<BTreeMap<String, String>>,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (resource, value) in map.unwrap_or_default() {
        let f = format!("{field}[{resource:?}]");
        let v = match resource.as_str() {
            "cpu" => parse_millicores(&value).map_err(|e| e.to_string()),
            "memory" | "ephemeral-storage" | "pid" => match parse_amount(&value, false) {
                Ok(Amount::Absolute(v)) => Ok(v),
                Ok(Amount::Percentage(_)) => Err("percentages are not allowed here".to_owned()),
                Err(e) => Err(e.to_string()),
            },
            _ => Err("unknown resource; use cpu, memory, ephemeral-storage or pid".to_owned()),
        };
        match v {
            Ok(v) => {
                out.insert(resource, v);
            }
            Err(m) => p.push(f, m),
        }
    }
    out
}

pub(super) fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// A Node name for this agent: a [`NodeName`] (a DNS-1123 subdomain, lower-case
/// alphanumerics, `-` and `.`, starting and ending alphanumeric, as the apiserver validates
/// it), and at most 63 characters, because it is also the value of the Node's
/// `kubernetes.io/hostname` label ([`registration::check_value`]); a longer name would load
/// and then never register.
///
/// Errors: [`ValueError::NodeName`], [`ValueError::NodeNameTooLong`].
pub fn parse_node_name(name: &str) -> Result<NodeName, ValueError> {
    let node = NodeName::new(name)?;
    if registration::check_value(name).is_err() {
        return Err(ValueError::NodeNameTooLong {
            name: name.to_owned(),
        });
    }
    Ok(node)
}

/// Longest period any duration field accepts (one day); longer values are mistakes and
/// would overflow timer arithmetic.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// A string field of the `transport` mapping: any YAML scalar read as its text (`username:
/// 1000`, `topicPrefix: 2024`), as YAML string fields are read elsewhere in the file. Needed
/// because `transport` is tagged on `kind`: serde buffers a tagged mapping's values before
/// it knows their types, and would see a number where the field wants text. Floats are
/// refused with the fix (their text is not kept: `1.50` would become `1.5`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Text(pub(super) String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Scalar;
        impl serde::de::Visitor<'_> for Scalar {
            type Value = Text;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Text, E> {
                Ok(Text(v))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Text, E> {
                Err(E::custom(format!(
                    "a number ({v}) where text is expected; quote it, e.g. \"{v}\""
                )))
            }
        }
        d.deserialize_any(Scalar)
    }
}

/// A period field (`nodeStatusUpdateFrequency`, `transport.keepalive`…): a Go duration
/// ([`parse_duration`]) greater than zero and at most [`MAX_DURATION`]. Checked where serde
/// reads it, so the error names the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub(super) struct Period(pub(super) Duration);

impl TryFrom<String> for Period {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let d = parse_duration(&text).map_err(|e| e.to_string())?;
        if d.is_zero() || d > MAX_DURATION {
            return Err(format!(
                "{text:?} must be greater than zero and at most 24h"
            ));
        }
        Ok(Self(d))
    }
}

/// `evictionPressureTransitionPeriod`: a Go duration from zero (no hold) to [`MAX_DURATION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub(super) struct HoldPeriod(pub(super) Duration);

impl TryFrom<String> for HoldPeriod {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        match parse_duration(&text).map_err(|e| e.to_string())? {
            d if d <= MAX_DURATION => Ok(Self(d)),
            _ => Err(format!("{text:?} must be at most 24h")),
        }
    }
}

/// `nodeLeaseDurationSeconds`: a positive number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "i64")]
pub(super) struct LeaseSeconds(pub(super) u32);

impl TryFrom<i64> for LeaseSeconds {
    type Error = String;

    fn try_from(v: i64) -> Result<Self, String> {
        u32::try_from(v)
            .ok()
            .filter(|v| *v > 0)
            .map(Self)
            .ok_or_else(|| format!("got {v}; must be a positive number of seconds, e.g. 40"))
    }
}

/// `maxPods`: 0 (no pods: the default, an edgebeat node runs none) or a positive count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "i64")]
pub(super) struct MaxPods(pub(super) u32);

impl TryFrom<i64> for MaxPods {
    type Error = String;

    fn try_from(v: i64) -> Result<Self, String> {
        u32::try_from(v)
            .map(Self)
            .map_err(|_| format!("got {v}; must be 0 (no pods: the default) or positive"))
    }
}

/// `podsPerCore`: 0 (off) or a positive count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "i64")]
pub(super) struct PodsPerCore(pub(super) u32);

impl TryFrom<i64> for PodsPerCore {
    type Error = String;

    fn try_from(v: i64) -> Result<Self, String> {
        u32::try_from(v)
            .map(Self)
            .map_err(|_| format!("got {v}; must be 0 (off) or positive"))
    }
}

/// `nodeName`: empty means not set (the hostname is used); otherwise [`parse_node_name`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub(super) struct NodeNameField(pub(super) Option<NodeName>);

impl TryFrom<String> for NodeNameField {
    type Error = String;

    fn try_from(name: String) -> Result<Self, String> {
        if name.is_empty() {
            return Ok(Self(None));
        }
        parse_node_name(&name)
            .map(|n| Self(Some(n)))
            .map_err(|e| e.to_string())
    }
}

/// `nodeIP`: the node's own address, as kubelet's `validateNodeIP`
/// (`pkg/kubelet/kubelet_node_status.go`): not loopback, link-local, multicast or
/// unspecified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub(super) struct NodeIp(pub(super) IpAddr);

impl TryFrom<String> for NodeIp {
    type Error = String;

    fn try_from(ip: String) -> Result<Self, String> {
        let parsed: IpAddr = ip
            .parse()
            .map_err(|_| format!("{ip:?} is not an IP address"))?;
        if parsed.is_loopback()
            || parsed.is_multicast()
            || parsed.is_unspecified()
            || is_link_local(&parsed)
        {
            return Err(format!(
                "{ip} is loopback, link-local, multicast or unspecified; use the node's own address (kubelet validateNodeIP)"
            ));
        }
        Ok(Self(parsed))
    }
}

/// `healthzBindAddress`: [`parse_bind_address`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub(super) struct BindAddress(pub(super) SocketAddr);

impl TryFrom<String> for BindAddress {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        parse_bind_address(&text)
            .map(Self)
            .map_err(|e| e.to_string())
    }
}

/// `rootDir`, `imageFsDir`: an absolute path on the host.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "PathBuf")]
pub(super) struct AbsolutePath(pub(super) PathBuf);

impl TryFrom<PathBuf> for AbsolutePath {
    type Error = String;

    fn try_from(path: PathBuf) -> Result<Self, String> {
        if path.is_absolute() {
            Ok(Self(path))
        } else {
            Err(format!(
                "{:?} is not absolute; give an absolute path on the host",
                path.display().to_string()
            ))
        }
    }
}

/// Parses a Go duration (`metav1.Duration` as in KubeletConfiguration) with
/// [`edgebeat_hw::parse_duration`], the grammar the gateway's flags take too: decimal
/// numbers with units `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`, e.g. `"10s"`, `"1m30s"`,
/// `"1.5h"`, `"300ms"`; `"0"` alone is zero.
///
/// Errors: [`ValueError::Duration`], with the rejected text.
pub fn parse_duration(text: &str) -> Result<Duration, ValueError> {
    edgebeat_hw::parse_duration(text).map_err(|e| ValueError::Duration { text: e.text })
}
