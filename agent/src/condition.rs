//! One NodeCondition the agent computes and how it follows the previous one: the rules
//! kubelet's setters and eviction manager share, used by kubelet's four conditions
//! ([`crate::status`]) and the health conditions ([`crate::health`]) alike.

use std::time::Duration;

use edgebeat_proto::{ConditionReason, ConditionStatus, NodeConditionType};

/// Whether a condition whose signal was last observed over its threshold at `observed`
/// (time since boot, `None`: never) still holds at `now`: for
/// `evictionPressureTransitionPeriod` (`period`) after that observation, and always at the
/// observation itself (a zero period). kubelet's eviction manager keeps a pressure
/// condition as long (`nodeConditionsObservedSince`, `pkg/kubelet/eviction/helpers.go`);
/// the health conditions of [`crate::health`] follow the same rule.
pub(crate) fn within_transition_period(
    observed: Option<Duration>,
    now: Duration,
    period: Duration,
) -> bool {
    observed.is_some_and(|t| now.saturating_sub(t) < period || now == t)
}

/// One computed NodeCondition with its transition on the agent's boot clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// kubelet's four or a health condition.
    pub type_: NodeConditionType,
    /// True or False (the agent never writes Unknown: the node lifecycle controller owns it).
    pub status: ConditionStatus,
    /// kubelet's reason, e.g. `KubeletHasSufficientMemory`.
    pub reason: ConditionReason,
    /// kubelet's message.
    pub message: String,
    /// When `status` last changed, as time since boot (CLOCK_BOOTTIME).
    pub last_transition: Duration,
}

/// How a condition's message carries over from the one it follows ([`Condition::next`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageCarry {
    /// The new message, always (kubelet's conditions: its setters write theirs afresh).
    Fresh,
    /// The previous message while status and reason hold: it keeps the figure seen at the
    /// transition (the health conditions).
    KeptWhileReasonHolds,
}

impl Condition {
    /// The condition of `type_` at `now` following `before` (the same type's previous one):
    /// `lastTransitionTime` stays `before`'s while the status holds and is `now` otherwise,
    /// as kubelet's setters (`pkg/kubelet/nodestatus/setters.go`) keep it; the message as
    /// `carry` says.
    pub fn next(
        before: Option<&Condition>,
        type_: NodeConditionType,
        status: ConditionStatus,
        reason: ConditionReason,
        message: String,
        carry: MessageCarry,
        now: Duration,
    ) -> Self {
        let held = before.filter(|b| b.status == status);
        let message = match held {
            Some(b) if carry == MessageCarry::KeptWhileReasonHolds && b.reason == reason => {
                b.message.clone()
            }
            _ => message,
        };
        Condition {
            type_,
            status,
            reason,
            message,
            last_transition: held.map_or(now, |b| b.last_transition),
        }
    }
}
