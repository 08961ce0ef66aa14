//! The agent's journal (`StatusReport.journal`, `Register.journal`): condition transitions
//! the agent saw and had not had written, recorded at their true times.
//!
//! Each entry says how long before its message it happened (`ms_ago`, the agent's boot
//! clock); the gateway maps it onto its own clock (receipt − `ms_ago`), so the board's
//! wall clock plays no part. A journal is resent until a report carrying it is written, and
//! a Register and the report after it carry the same one: each transition is named by the
//! node, its boot and its time on that boot's clock (`boot_ms`), and its Event gets that
//! name on every replica and every resend, so the apiserver keeps one (409 for the rest).

use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{self as pb, ConditionStatus, NodeConditionType};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::bodies;

/// A report later than this after its transition says so in the transition's event: the
/// node's link was down or failing (a report goes out at the computation that saw the
/// transition, and its retries within one 10 s tick fit inside).
pub const LATE: SignedDuration = SignedDuration::from_secs(10);

/// How close to the held `lastTransitionTime` (whole seconds) a journal transition counts
/// as the one already recorded: the second it was truncated to, plus the jitter of mapping
/// a resent transition onto the clock again. (Saves the Event POSTs of a resent journal;
/// the Event names make a duplicate harmless anyway.)
const RECORDED_WITHIN: SignedDuration = SignedDuration::from_secs(1);

/// One journal entry on the gateway clock.
pub(super) struct Timed<'a> {
    pub(super) entry: &'a pb::ConditionTransition,
    /// The entry's type, parsed.
    pub(super) type_: NodeConditionType,
    /// The entry's status, parsed: `True` or `False`.
    pub(super) status: ConditionStatus,
    /// When it happened: receipt − `ms_ago`.
    pub(super) at: Timestamp,
    /// Its Event's name (see the module docs).
    pub(super) name: String,
}

/// Why one entry cannot be taken, or `Ok`.
fn check(t: &pb::ConditionTransition) -> Result<(), &'static str> {
    if NodeConditionType::from_name(&t.r#type).is_none() {
        Err("a type kubelet or edgebeat does not report")
    } else if !ConditionStatus::parse(&t.status).is_some_and(ConditionStatus::is_reported) {
        Err("a status other than True or False")
    } else if t.reason.is_empty() {
        Err("no reason")
    } else if t.reason.len().max(t.message.len()) > crate::restriction::MAX_TEXT_BYTES {
        Err("an oversized reason or message")
    } else if u128::from(t.ms_ago) > pb::MAX_JOURNAL_AGE.as_millis() {
        Err("a time older than a journal keeps (30 days)")
    } else {
        Ok(())
    }
}

/// The entries of `journal` the gateway takes: the newest [`pb::MAX_JOURNAL_ENTRIES`], each
/// of a type an agent reports, `True` or `False`, with a reason, texts at most
/// [`crate::restriction::MAX_TEXT_BYTES`], no older than [`pb::MAX_JOURNAL_AGE`]; and why
/// each other one was skipped (for the log and the `invalid` count). A bad entry never
/// costs the report it came with: the status is written all the same, or a journal the
/// agent keeps resending would stop the node's reports for good.
pub fn usable(journal: &[pb::ConditionTransition]) -> (Vec<&pb::ConditionTransition>, Vec<String>) {
    let skip = journal.len().saturating_sub(pb::MAX_JOURNAL_ENTRIES);
    let mut skipped = Vec::new();
    if skip > 0 {
        skipped.push(format!(
            "journal of {} entries: the oldest {skip} skipped",
            journal.len()
        ));
    }
    let taken = journal[skip..]
        .iter()
        .enumerate()
        .filter(|(i, t)| match check(t) {
            Ok(()) => true,
            Err(why) => {
                skipped.push(format!(
                    "journal entry {} ({}) has {why}",
                    i + skip,
                    t.r#type.chars().take(64).collect::<String>()
                ));
                false
            }
        })
        .map(|(_, t)| t)
        .collect();
    (taken, skipped)
}

/// `journal` (as [`usable`] returned it) mapped onto the gateway clock at `now` (the
/// report's receipt) for `node` in boot `boot_id`, without the transitions already
/// recorded: those no later than their condition's `lastTransitionTime` in `held` (plus
/// [`RECORDED_WITHIN`]) while it holds True or False (the node lifecycle controller's
/// Unknown, written while the node was away, recorded nothing of the node's own).
pub(super) fn timed<'a>(
    journal: &[&'a pb::ConditionTransition],
    now: Timestamp,
    held: &bodies::KnownConditions,
    node: &NodeName,
    boot_id: &str,
) -> Vec<Timed<'a>> {
    journal
        .iter()
        .filter_map(|&entry| {
            Some(Timed {
                entry,
                type_: NodeConditionType::from_name(&entry.r#type)?,
                status: ConditionStatus::parse(&entry.status)?,
                at: now
                    .checked_sub(SignedDuration::from_millis(
                        i64::try_from(entry.ms_ago).unwrap_or(i64::MAX),
                    ))
                    .unwrap_or(now),
                name: event_name(node, boot_id, entry),
            })
        })
        .filter(|t| {
            held.get(t.type_).is_none_or(|k| {
                k.status == ConditionStatus::Unknown || t.at > k.last_transition + RECORDED_WITHIN
            })
        })
        .collect()
}

/// The Event name of `entry` of `node` in boot `boot_id`: `{node}.j{hash}`, the hash (FNV-1a,
/// 64 bits) of the boot, type, status and `boot_ms`.
fn event_name(node: &NodeName, boot_id: &str, entry: &pb::ConditionTransition) -> String {
    use std::hash::Hasher as _;
    let mut hash = fnv::FnvHasher::default();
    for part in [boot_id, &entry.r#type, &entry.status] {
        hash.write(part.as_bytes());
        hash.write_u8(0);
    }
    hash.write_u64(entry.boot_ms);
    format!("{node}.j{:016x}", hash.finish())
}

/// Sets each condition's `lastTransitionTime` to the true time of its last transition in
/// `journal`, when that transition is to the status being written (a report made after an
/// outage says when things happened, not when they were heard of); except over the node
/// lifecycle controller's `Unknown` set after it: the condition then changed from that
/// `Unknown` when written, and keeps the write's time, as kubelet's setters give it.
pub(super) fn transitions(
    conditions: &mut [NodeCondition],
    journal: &[Timed<'_>],
    held: &bodies::KnownConditions,
) {
    for c in conditions {
        let Some(type_) = NodeConditionType::from_name(&c.type_) else {
            continue;
        };
        let last = journal.iter().rev().find(|t| t.type_ == type_);
        let Some(t) = last.filter(|t| t.status.as_str() == c.status) else {
            continue;
        };
        let after_unknown = held.get(type_).is_some_and(|k| {
            k.status == ConditionStatus::Unknown && bodies::whole_seconds(t.at) < k.last_transition
        });
        if !after_unknown {
            c.last_transition_time = Some(Time(bodies::whole_seconds(t.at)));
        }
    }
}

/// `d` as kubectl prints ages: `4m12s`, `2h5m`, `45s`.
pub(super) fn human(d: SignedDuration) -> String {
    let s = d.as_secs().max(0);
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(type_: &str, status: &str, ms_ago: u64, boot_ms: u64) -> pb::ConditionTransition {
        pb::ConditionTransition {
            ms_ago,
            r#type: type_.into(),
            status: status.into(),
            reason: "KubeletHasInsufficientMemory".into(),
            message: String::new(),
            boot_ms,
        }
    }

    #[test]
    fn bad_entries_are_skipped_not_the_report() {
        let journal = [
            entry("MemoryPressure", "True", 5_000, 1),
            entry("Bogus", "True", 5_000, 2),
            entry("MemoryPressure", "Unknown", 5_000, 3),
            entry("MemoryPressure", "False", 31 * 86_400_000, 4),
        ];
        let (taken, skipped) = usable(&journal);
        assert_eq!(taken.len(), 1);
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        let long: Vec<_> = (0..70)
            .map(|i| entry("MemoryPressure", "True", 1, i))
            .collect();
        let (taken, skipped) = usable(&long);
        assert_eq!(taken.len(), pb::MAX_JOURNAL_ENTRIES);
        assert_eq!(taken[0].boot_ms, 6, "the newest are kept");
        assert_eq!(skipped.len(), 1);
    }

    #[test]
    fn a_transition_has_one_name_whenever_and_wherever_it_is_sent() {
        let now: Timestamp = "2026-11-26T10:00:00Z".parse().unwrap();
        let later = now + SignedDuration::from_secs(7);
        let first = entry("MemoryPressure", "True", 60_000, 123_456);
        let resent = entry("MemoryPressure", "True", 67_000, 123_456);
        let held = bodies::KnownConditions::default();
        let n1 = NodeName::new("n1").unwrap();
        let a = timed(&[&first], now, &held, &n1, "boot-a");
        let b = timed(&[&resent], later, &held, &n1, "boot-a");
        assert_eq!(a[0].name, b[0].name);
        assert_eq!(a[0].at, b[0].at);
        let other_boot = timed(&[&first], now, &held, &n1, "boot-b");
        assert_ne!(a[0].name, other_boot[0].name);
        assert!(a[0].name.starts_with("n1.j"));
    }

    #[test]
    fn human_ages_read_like_kubectl() {
        assert_eq!(human(SignedDuration::from_secs(45)), "45s");
        assert_eq!(human(SignedDuration::from_secs(252)), "4m12s");
        assert_eq!(human(SignedDuration::from_secs(7_500)), "2h5m");
    }
}
