//! What a node may write, whatever the transport: input limits on a reported status and a
//! per-node rate limit. What a registration may carry (NodeRestriction's label rules,
//! label and taint syntax) is [`edgebeat_proto::registration`], shared with the agent's
//! config. The gateway enforces both itself because in service-account mode the
//! apiserver's NodeRestriction does not apply to it.

use std::time::Duration;

use edgebeat_proto::{self as pb, NodeConditionType};
use tokio::time::Instant;

/// Why a reported NodeStatus is refused ([`crate::message_path::validate_status`],
/// [`validate_status_limits`]). `Display` is the reason the agent's `Rejected` answer and
/// the gateway's log carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// A condition type no agent reports (not [`NodeConditionType`]).
    #[error("malformed: condition type {type_:?} is not one kubelet or edgebeat reports")]
    UnknownConditionType {
        /// The type given.
        type_: String,
    },
    /// A condition type given twice.
    #[error("malformed: condition {type_} appears twice")]
    DuplicateCondition {
        /// The type given twice.
        type_: NodeConditionType,
    },
    /// A condition status other than `True` or `False`.
    #[error("malformed: condition {type_} has status {status:?}; only True or False")]
    ConditionStatus {
        /// The condition.
        type_: NodeConditionType,
        /// The status given.
        status: String,
    },
    /// A condition without a reason.
    #[error("malformed: condition {type_} has no reason")]
    NoReason {
        /// The condition.
        type_: NodeConditionType,
    },
    /// More than [`crate::restriction::MAX_ENTRIES`] addresses, capacity or allocatable
    /// entries.
    #[error(
        "status.{field} has {count} entries > {}",
        crate::restriction::MAX_ENTRIES
    )]
    TooManyEntries {
        /// `addresses`, `capacity` or `allocatable`.
        field: &'static str,
        /// How many there were.
        count: usize,
    },
    /// A text field over [`crate::restriction::MAX_TEXT_BYTES`].
    #[error(
        "a status field is {bytes} bytes > {}",
        crate::restriction::MAX_TEXT_BYTES
    )]
    TextTooLong {
        /// Its length, bytes.
        bytes: usize,
    },
}

/// Longest free-text field in a status (condition message, nodeInfo fields), in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;
/// Most addresses or resource entries in a status.
pub const MAX_ENTRIES: usize = 32;

/// Checks the sizes in a reported status: at most [`MAX_ENTRIES`] addresses and resource
/// entries each, text fields at most [`MAX_TEXT_BYTES`].
///
/// Errors: [`StatusError::TooManyEntries`] naming the field, or
/// [`StatusError::TextTooLong`].
pub fn validate_status_limits(status: &pb::NodeStatus) -> Result<(), StatusError> {
    for (field, count) in [
        ("addresses", status.addresses.len()),
        ("capacity", status.capacity.len()),
        ("allocatable", status.allocatable.len()),
    ] {
        if count > MAX_ENTRIES {
            return Err(StatusError::TooManyEntries { field, count });
        }
    }
    let info = status.node_info.as_ref();
    let texts = status
        .conditions
        .iter()
        .flat_map(|c| [&c.message, &c.reason])
        .chain(status.addresses.iter().map(|a| &a.address))
        .chain(
            status
                .capacity
                .iter()
                .chain(&status.allocatable)
                .flat_map(|(k, v)| [k, v]),
        )
        .chain(info.into_iter().flat_map(|i| {
            [
                &i.machine_id,
                &i.system_uuid,
                &i.boot_id,
                &i.kernel_version,
                &i.os_image,
                &i.container_runtime_version,
                &i.kubelet_version,
                &i.operating_system,
                &i.architecture,
            ]
        }));
    for text in texts {
        if text.len() > MAX_TEXT_BYTES {
            return Err(StatusError::TextTooLong { bytes: text.len() });
        }
    }
    Ok(())
}

/// A token bucket: `rate` messages per second on average, bursts of `burst`. One per node,
/// so a flooding node is refused before it costs an apiserver call and cannot use up the
/// gateway's shared apiserver budget (`--qps`) that every other node needs.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    at: Option<Instant>,
}

impl Default for TokenBucket {
    fn default() -> Self {
        Self {
            tokens: f64::INFINITY,
            at: None,
        }
    }
}

impl TokenBucket {
    /// Takes one token at `now` if there is one (refilling at `rate` per second up to
    /// `burst`); false means "over the limit".
    pub fn take(&mut self, now: Instant, rate: f64, burst: f64) -> bool {
        let elapsed = self
            .at
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
        self.tokens = (self.tokens.min(burst) + elapsed.as_secs_f64() * rate).min(burst);
        self.at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_sizes_are_bounded() {
        let mut s = pb::NodeStatus::default();
        validate_status_limits(&s).unwrap();
        s.conditions.push(pb::NodeCondition {
            message: "m".repeat(MAX_TEXT_BYTES + 1),
            ..Default::default()
        });
        assert_eq!(
            validate_status_limits(&s),
            Err(StatusError::TextTooLong {
                bytes: MAX_TEXT_BYTES + 1
            })
        );
        let s = pb::NodeStatus {
            addresses: vec![pb::NodeAddress::default(); MAX_ENTRIES + 1],
            ..Default::default()
        };
        assert_eq!(
            validate_status_limits(&s),
            Err(StatusError::TooManyEntries {
                field: "addresses",
                count: MAX_ENTRIES + 1
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn token_bucket_allows_bursts_then_the_rate() {
        let mut b = TokenBucket::default();
        let t0 = Instant::now();
        let granted = (0..30).filter(|_| b.take(t0, 2.0, 10.0)).count();
        assert_eq!(granted, 10, "the burst");
        tokio::time::advance(Duration::from_secs(2)).await;
        let granted = (0..30)
            .filter(|_| b.take(Instant::now(), 2.0, 10.0))
            .count();
        assert_eq!(granted, 4, "2 per second for 2 s");
    }
}
