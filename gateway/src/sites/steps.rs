//! The rule's steps for one site at a tick: whether its nodes make a partition
//! ([`assess`], [`assess_site`]), how a partition held moves ([`step_partition`]), and
//! which nodes' conditions change ([`mark_nodes`]). Pure: [`SiteTracker`](super::SiteTracker)
//! calls them with its state and acts on what they return.

use jiff::Timestamp;

use super::{
    Action, Cause, LIVE_INTERVALS, Member, Partition, PartitionRule, SILENT_INTERVALS, SiteState,
};

/// The partition of one site's `nodes` at `now` by `rule`, leaving out the stragglers of
/// its last partition (not heard since it ended: no news); with its bridge `down`, every
/// live node since the site was last heard.
pub(super) fn assess_site(
    rule: PartitionRule,
    state: &SiteState,
    nodes: &[Member],
    down: bool,
    now: Timestamp,
) -> Option<Partition> {
    if down {
        // The bridge said so: every live node, since the site was last heard.
        let live: Vec<&Member> = nodes.iter().filter(|m| m.live(now)).collect();
        return live.iter().map(|m| m.renewed).max().map(|since| Partition {
            cause: Cause::UplinkDown,
            since,
            nodes: live.iter().map(|m| m.node.clone()).collect(),
        });
    }
    // Stragglers of the last partition (not heard since it ended) are no news.
    let fresh: Vec<Member> = nodes
        .iter()
        .filter(|m| {
            !state.last.as_ref().is_some_and(|l| {
                l.nodes.contains(&m.node) && state.returned.is_some_and(|r| m.renewed < r)
            })
        })
        .cloned()
        .collect();
    assess(rule, &fresh, now)
}

/// One site's partition after a look: a new one (`assessed`, while none) is
/// [`Action::Partitioned`]; the current one ends, [`Action::Returned`], once any of its
/// nodes renewed after it began, or its bridge is up again (`down` no more). Returns
/// whether the site was heard again.
pub(super) fn step_partition(
    state: &mut SiteState,
    site: &str,
    nodes: &[Member],
    assessed: Option<Partition>,
    down: bool,
    now: Timestamp,
    actions: &mut Vec<Action>,
) -> bool {
    match (&state.partition, assessed) {
        (None, Some(partition)) => {
            state.before = Some((state.returned.take(), state.last.take()));
            actions.push(Action::Partitioned {
                site: site.into(),
                partition: partition.clone(),
            });
            state.partition = Some(partition);
            false
        }
        (Some(partition), _) => {
            // Heard again: any node of the partition renewed after it began, or
            // its bridge is up again.
            let back = nodes
                .iter()
                .filter(|m| {
                    partition.nodes.contains(&m.node)
                        && !m.silent(now)
                        && m.renewed > partition.since
                })
                .map(|m| m.renewed)
                .min()
                .or((partition.cause == Cause::UplinkDown && !down).then_some(now));
            let Some(at) = back else {
                return false;
            };
            actions.push(Action::Returned {
                site: site.into(),
                partition: partition.clone(),
                at,
            });
            state.last = state.partition.take();
            state.returned = Some(at);
            true
        }
        (None, None) => false,
    }
}

/// The nodes of one site to mark ([`Action::Unreachable`]: sharing its partition) or to
/// clear ([`Action::Reachable`]: a renewal after the partition it was marked for began,
/// or still silent long after its site returned, a dead node).
pub(super) fn mark_nodes(
    state: &SiteState,
    site: &str,
    nodes: &[Member],
    now: Timestamp,
    actions: &mut Vec<Action>,
) {
    // A marked node clears with a renewal after the partition it was marked for began.
    let began = state
        .partition
        .as_ref()
        .or(state.last.as_ref())
        .map(|p| p.since);
    for m in nodes {
        let shares = |p: &Partition| match p.cause {
            // Every node silent since the partition began shares it.
            Cause::Silent => m.silent(now) && m.renewed >= p.since,
            // Every node of the site when its bridge went down, until heard.
            Cause::UplinkDown => p.nodes.contains(&m.node) && m.renewed <= p.since,
        };
        match &state.partition {
            Some(p) if shares(p) && !m.unreachable => {
                actions.push(Action::Unreachable {
                    node: m.node.clone(),
                    site: site.into(),
                    since: p.since,
                    cause: p.cause,
                });
            }
            _ if m.unreachable && !m.silent(now) && began.is_none_or(|b| m.renewed > b) => {
                actions.push(Action::Reachable {
                    node: m.node.clone(),
                    at: m.renewed,
                });
            }
            // Still silent long after its site returned: a dead node.
            None if m.unreachable
                && state.returned.is_some_and(|r| {
                    now.duration_since(r) > m.renew_interval * LIVE_INTERVALS as i32
                }) =>
            {
                let at = state.returned.unwrap_or(now);
                actions.push(Action::Reachable {
                    node: m.node.clone(),
                    at,
                });
            }
            _ => {}
        }
    }
}

/// The silence rule of the module docs over `members` at `now`.
pub(super) fn assess(rule: PartitionRule, members: &[Member], now: Timestamp) -> Option<Partition> {
    let live = members.iter().filter(|m| m.live(now)).count();
    let mut silent: Vec<&Member> = members
        .iter()
        .filter(|m| m.live(now) && m.silent(now))
        .collect();
    silent.sort_by_key(|m| m.renewed);
    // The most nodes whose last renewals lie within one window of each other.
    let mut best: &[&Member] = &[];
    let mut start = 0;
    for end in 0..silent.len() {
        while let (Some(first), Some(last)) = (silent.get(start), silent.get(end)) {
            let window = first.renew_interval.max(last.renew_interval) * SILENT_INTERVALS as i32;
            if last.renewed.duration_since(first.renewed) <= window {
                break;
            }
            start += 1;
        }
        if let Some(group) = silent.get(start..=end)
            && group.len() > best.len()
        {
            best = group;
        }
    }
    let enough = best.len() >= rule.min_nodes && best.len() as f64 >= rule.share * live as f64;
    enough.then(|| Partition {
        cause: Cause::Silent,
        since: best.first().map_or(now, |m| m.renewed),
        nodes: best.iter().map(|m| m.node.clone()).collect(),
    })
}
