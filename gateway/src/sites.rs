//! Sites: a whole site cut off is told apart from its nodes dying.
//!
//! **A site is a zone.** The site of a node is its `topology.kubernetes.io/zone` label
//! ([`ZONE_LABEL`]; the agent sets it through `nodeLabels`, which NodeRestriction allows a
//! node to set on itself), prefixed by `topology.kubernetes.io/region` and `/` when that is
//! set too ([`site_of`]), which is how kube-controller-manager's node lifecycle controller
//! groups nodes (`pkg/controller/nodelifecycle/node_lifecycle_controller.go:
//! ComputeZoneState`, zone key from `staging/src/k8s.io/component-helpers/node/topology:
//! GetZoneKey`). Nodes without a zone belong to no site and are never part of a partition.
//!
//! **The rule** ([`SiteTracker::assess`], I/O-free): each node's silence is read from its
//! Lease as the replica's watch holds it (so every replica sees the same fleet and reaches
//! the same verdict). With `r` a node's renew interval (`leaseDurationSeconds` × 0.25, as
//! kubelet renews):
//!
//! - a node is **live** when its Lease was renewed within [`LIVE_INTERVALS`] × `r` (a node
//!   dead for longer no longer counts for its site), and **silent** when it was not renewed
//!   within [`SILENT_INTERVALS`] × `r` (two renewals missed: one lost renewal is not
//!   silence);
//! - a site is **cut off** when at least [`PartitionRule::min_nodes`] (3) of its silent
//!   nodes went silent *together* — their last renewals within [`SILENT_INTERVALS`] × `r` of
//!   each other — and those are at least [`PartitionRule::share`] (80 %) of the site's live
//!   nodes. One silent node is a node; nodes dying one by one over minutes never fall in
//!   one window; a site of one or two nodes cannot be told from its nodes and is never
//!   called cut off.
//!
//! While a site is cut off, each of its silent nodes carries the NodeCondition
//! [`SITE_CONDITION`] (`SiteUnreachable`, status `True`, reason [`REASON_SILENT`], a message
//! naming the site and since when), patched by type as node-problem-detector patches its
//! conditions; kube-controller-manager's `Unknown` on kubelet's four conditions stays as it
//! is, so `kubectl describe node` shows both. The site is reachable again as soon as one of
//! those nodes renews: one Event records the partition ([`REASON_SILENT`], Warning) and one
//! its end ([`REASON_REACHABLE`], Normal), each about the first node of the site by name.
//! A node's condition turns `False` (reason [`REASON_REACHABLE`]) once its own Lease is
//! renewed again; a node still silent [`LIVE_INTERVALS`] × `r` after its site came back is
//! just a dead node, and its condition turns `False` too (the node lifecycle controller's
//! `Unknown` then says all there is). Leases of silent nodes are never renewed.
//!
//! **Bridged sites say so themselves.** An MQTT site whose broker is bridged to the
//! cluster's (Mosquitto `connection` with `notifications true` and `notification_topic
//! P/sites/{site}/uplink`) publishes a retained `1` when its bridge connects and, through
//! the bridge's Last Will, `0` when the cluster's broker loses it (at 1.5 × the bridge's
//! `keepalive_interval` at the latest). Every replica follows those notifications
//! ([`SiteTracker::uplink`]): a `0` makes the site cut off at once, cause
//! [`Cause::UplinkDown`], every live node of it marked with reason [`REASON_UPLINK_DOWN`]
//! and one Warning Event; a `1` (or any of its nodes heard again) ends it. The rule above
//! stays the fallback for a bridge that says nothing.
//!
//! **An apiserver that does not take writes is not a silent site.** A Lease's age is what
//! the site's nodes said *and* whether the gateway could write it: while the apiserver
//! answers this replica's writes with 429, 5xx or nothing (an outage, a drain, etcd
//! trouble), every Lease it holds ages although its boards are heard. So the replica does
//! not judge its sites then ([`held`], from its Lease writes): the sites' states hold as they
//! were (no new partition, no return, no condition written; `edgebeat_gateway_sites_held` 1
//! says why), until the apiserver has taken writes again for [`SILENT_INTERVALS`] renew
//! intervals ([`hold_after`]), time for every connected board's renewal to be written. A
//! replica that writes no Lease learns of the outage from its own first write, the
//! partition's Event: a partition whose Event the apiserver did not take is taken back
//! ([`SiteTracker::retract`]) and the sites held for as long, then judged again (the Event
//! tried again). A site really cut off during an outage is told once the hold ends, if the
//! outage was short enough for its nodes to still count as live ([`LIVE_INTERVALS`]); after a
//! longer one they are dead nodes to the rule, and only the node lifecycle controller's
//! NotReady tells of them.
//!
//! **Replicas agree without talking.** Every replica computes the same verdict from the
//! same Leases, and what it writes is the same bytes: the condition's times are the
//! partition's start (the last renewal of the first node to go silent) and each node's
//! renewal, not the moment a replica noticed, and an Event's name is made from the site and
//! that start ([`event_name`]), so the second replica's POST is refused with 409 and its
//! condition patch changes nothing. One partition is one Event, whatever the replica count.
//! A bridged site's partition begins at the site's last renewal before its bridge went
//! down, which every replica's watch holds alike by the time the broker notices (1.5 ×
//! the bridge's keepalive after the cut). What may differ between replicas is only text:
//! the time in a recovery Event's message is each replica's own look (the first POST
//! wins), and the `False` of a node found dead after its site returned.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use edgebeat_proto::ConditionStatus;
use jiff::{SignedDuration, Timestamp};
use serde_json::json;

use crate::bodies;

/// The zone label (`topology.kubernetes.io/zone`).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The region label (`topology.kubernetes.io/region`).
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
/// The NodeCondition type on each silent node of a cut-off site.
pub const SITE_CONDITION: &str = "SiteUnreachable";
/// Reason of [`SITE_CONDITION`] `True` and of the partition's Event.
pub const REASON_SILENT: &str = "SiteSilent";
/// Reason of [`SITE_CONDITION`] `True` and of the partition's Event when the site broker's
/// bridge said its uplink is down.
pub const REASON_UPLINK_DOWN: &str = "SiteUplinkDown";
/// Reason of [`SITE_CONDITION`] `False` and of the recovery's Event.
pub const REASON_REACHABLE: &str = "SiteReachable";
/// Renew intervals without a renewal after which a node is silent.
pub const SILENT_INTERVALS: i64 = 2;
/// Renew intervals within which a node renewed to count as live for its site.
pub const LIVE_INTERVALS: i64 = 12;
/// How often the replica looks (seconds): well inside one renew interval.
pub const TICK: Duration = Duration::from_secs(2);
/// Most uplink-down notifications kept for sites not seen at the last look
/// ([`SiteTracker::uplink`]).
pub const MAX_UNSEEN_UPLINKS: usize = 1024;

/// The site of a node with `labels`: its zone, as `region/zone` when a region is set;
/// `None` without a zone label (or an empty one).
pub fn site_of<'a>(mut label: impl FnMut(&str) -> Option<&'a str>) -> Option<Box<str>> {
    let zone = label(ZONE_LABEL).filter(|z| !z.is_empty())?;
    Some(match label(REGION_LABEL).filter(|r| !r.is_empty()) {
        Some(region) => format!("{region}/{zone}").into(),
        None => zone.into(),
    })
}

/// When a site counts as cut off (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartitionRule {
    /// Fewest nodes going silent together that can be a partition (default 3).
    pub min_nodes: usize,
    /// Least share of the site's live nodes they must be (default 0.8).
    pub share: f64,
}

impl Default for PartitionRule {
    fn default() -> Self {
        Self {
            min_nodes: 3,
            share: 0.8,
        }
    }
}

/// One managed node of a site, as the view holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// The node's name.
    pub node: Box<str>,
    /// Its Lease's `renewTime`.
    pub renewed: Timestamp,
    /// Its renew interval (`leaseDurationSeconds` × 0.25).
    pub renew_interval: SignedDuration,
    /// Whether the Node holds [`SITE_CONDITION`] `True`.
    pub unreachable: bool,
}

impl Member {
    fn age(&self, now: Timestamp) -> SignedDuration {
        now.duration_since(self.renewed)
    }

    fn silent(&self, now: Timestamp) -> bool {
        self.age(now) > self.renew_interval * SILENT_INTERVALS as i32
    }

    fn live(&self, now: Timestamp) -> bool {
        self.age(now) <= self.renew_interval * LIVE_INTERVALS as i32
    }
}

/// How a site was found cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Its live nodes went silent together (the rule of the module docs).
    Silent,
    /// Its broker's bridge to the cluster's broker is down (bridge notification `0`).
    UplinkDown,
}

impl Cause {
    /// The reason of the condition and of the partition's Event.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Silent => REASON_SILENT,
            Self::UplinkDown => REASON_UPLINK_DOWN,
        }
    }

    /// What the partition's Event name says ([`event_name`]).
    pub(crate) fn event_word(self) -> &'static str {
        match self {
            Self::Silent => "silent",
            Self::UplinkDown => "uplink-down",
        }
    }
}

/// A site cut off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// How it was found.
    pub cause: Cause,
    /// When the site was last heard whole: for [`Cause::Silent`] the last renewal of the
    /// first of its nodes to go silent, for [`Cause::UplinkDown`] the site's last renewal
    /// before its bridge went down.
    pub since: Timestamp,
    /// The nodes that went silent with it.
    pub nodes: Vec<Box<str>>,
}

/// What one site is, for `/metrics` and the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SiteState {
    /// Live nodes (see the module docs).
    pub live: usize,
    /// Silent ones among them.
    pub silent: usize,
    /// The partition, while cut off.
    pub partition: Option<Partition>,
    /// When the site was last heard again after a partition, until its stragglers are
    /// settled.
    returned: Option<Timestamp>,
    /// The last partition's nodes and start, once it ended: a node of it not heard since is
    /// a straggler of that partition, not news of another, and a node marked for it clears
    /// only with a renewal after its start.
    last: Option<Partition>,
    /// `returned` and `last` as they were before the current partition was found, for
    /// [`SiteTracker::retract`].
    before: Option<(Option<Timestamp>, Option<Partition>)>,
}

/// What the replica does about the sites after one look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `site` is cut off: one Warning Event.
    Partitioned {
        /// The site.
        site: Box<str>,
        /// Its partition.
        partition: Partition,
    },
    /// `site` is heard again at `at`, after its partition: one Normal Event.
    Returned {
        /// The site.
        site: Box<str>,
        /// The partition that ended.
        partition: Partition,
        /// The first renewal heard from the site again.
        at: Timestamp,
    },
    /// Set [`SITE_CONDITION`] `True` on `node`, transition at `since`.
    Unreachable {
        /// The node.
        node: Box<str>,
        /// Its site.
        site: Box<str>,
        /// The partition's start.
        since: Timestamp,
        /// How the partition was found.
        cause: Cause,
    },
    /// Set [`SITE_CONDITION`] `False` on `node`, transition at `at`.
    Reachable {
        /// The node.
        node: Box<str>,
        /// Its renewal that showed it reachable, or when its site's return settled it.
        at: Timestamp,
    },
}

/// The sites one replica follows: the rule applied to every look (I/O-free).
#[derive(Debug, Default)]
pub struct SiteTracker {
    rule: PartitionRule,
    sites: BTreeMap<Box<str>, SiteState>,
    /// Sites whose bridge said `0` last.
    uplinks_down: BTreeSet<Box<str>>,
    /// Sites not seen at the last look whose bridge said `0` since (at most
    /// [`MAX_UNSEEN_UPLINKS`]).
    unseen_down: BTreeSet<Box<str>>,
    /// The sites are not judged now ([`held`]).
    held: bool,
}

/// Whether a replica whose apiserver Lease writes are `failing`, or took writes again
/// `since_recovery` ago, must not judge the sites of `members` now (see the module docs):
/// while failing, and for [`hold_after`] after.
pub fn held(
    failing: bool,
    since_recovery: Option<Duration>,
    members: &BTreeMap<Box<str>, Vec<Member>>,
) -> bool {
    failing || since_recovery.is_some_and(|ago| ago < hold_after(members))
}

/// Longest renew interval that sets [`hold_after`], 60 s (a 240 s Lease): one node's long
/// Lease (its agent's `nodeLeaseDurationSeconds`) must not hold every site for long.
pub const MAX_HOLD_INTERVAL: Duration = Duration::from_secs(60);

/// How long the sites stay held after the apiserver takes writes again: [`SILENT_INTERVALS`]
/// of the longest renew interval among `members` (10 s, kubelet's, when none is known; at
/// most [`MAX_HOLD_INTERVAL`]) plus one [`TICK`], time for every connected node's renewal
/// to be written.
pub fn hold_after(members: &BTreeMap<Box<str>, Vec<Member>>) -> Duration {
    let longest = members
        .values()
        .flatten()
        .map(|m| m.renew_interval)
        .max()
        .and_then(|r| Duration::try_from(r).ok())
        .unwrap_or(Duration::from_secs(10))
        .min(MAX_HOLD_INTERVAL);
    longest.saturating_mul(u32::try_from(SILENT_INTERVALS).unwrap_or(2)) + TICK
}

impl SiteTracker {
    /// A tracker with `rule`.
    pub fn new(rule: PartitionRule) -> Self {
        Self {
            rule,
            sites: BTreeMap::new(),
            uplinks_down: BTreeSet::new(),
            unseen_down: BTreeSet::new(),
            held: false,
        }
    }

    /// Holds the sites' states as they are (`true`, see [`held`]) or judges them again.
    pub fn hold(&mut self, held: bool) {
        self.held = held;
    }

    /// Whether the sites' states are held ([`SiteTracker::hold`]).
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// Takes back the partition of `site` that [`SiteTracker::look`] just found, whose
    /// Event the apiserver did not take (it is in trouble, see the module docs): the site
    /// is as it was before that look, and is judged again once the hold ends.
    pub fn retract(&mut self, site: &str) {
        if let Some(state) = self.sites.get_mut(site) {
            state.partition = None;
            if let Some((returned, last)) = state.before.take() {
                state.returned = returned;
                state.last = last;
            }
        }
    }

    /// The bridge of `site` says its uplink is `up` (notification `1`) or down (`0`); the
    /// next [`SiteTracker::look`] acts on it.
    ///
    /// Anyone on the broker can publish a notification, so what is kept is bounded by what
    /// exists: a `0` for a site not seen at the last look (a retained one delivered before
    /// the first, or a made-up site) is kept only while fewer than [`MAX_UNSEEN_UPLINKS`]
    /// are, and every look drops those of sites without managed nodes. Returns whether
    /// `site` was seen at the last look: only then is a look needed at once.
    pub fn uplink(&mut self, site: &str, up: bool) -> bool {
        let seen = self.sites.contains_key(site);
        if up {
            self.uplinks_down.remove(site);
            self.unseen_down.remove(site);
        } else if seen {
            self.uplinks_down.insert(site.into());
        } else if self.unseen_down.len() < MAX_UNSEEN_UPLINKS {
            self.unseen_down.insert(site.into());
        }
        seen
    }

    /// The state of every site seen.
    pub fn sites(&self) -> &BTreeMap<Box<str>, SiteState> {
        &self.sites
    }

    /// The partition of `members` (one site's nodes) at `now`, if the rule finds one.
    pub fn assess(&self, members: &[Member], now: Timestamp) -> Option<Partition> {
        assess(self.rule, members, now)
    }
    /// Looks at every site's `members` at `now` and returns what to write.
    pub fn look(
        &mut self,
        members: &BTreeMap<Box<str>, Vec<Member>>,
        now: Timestamp,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        self.sites.retain(|site, _| members.contains_key(site));
        for site in std::mem::take(&mut self.unseen_down) {
            if members.contains_key(&site) {
                self.uplinks_down.insert(site);
            }
        }
        self.uplinks_down.retain(|site| members.contains_key(site));
        for (site, nodes) in members {
            let down = self.uplinks_down.contains(site);
            let state = self.sites.entry(site.clone()).or_default();
            let assessed = assess_site(self.rule, state, nodes, down, now);
            state.live = nodes.iter().filter(|m| m.live(now)).count();
            state.silent = nodes
                .iter()
                .filter(|m| m.live(now) && m.silent(now))
                .count();
            let heard = step_partition(state, site, nodes, assessed, down, now, &mut actions);
            if heard {
                // Heard is stronger than a bridge's last word (an `up` lost).
                self.uplinks_down.remove(site);
            }
            mark_nodes(state, site, nodes, now, &mut actions);
        }
        actions
    }
}

/// The partition of one site's `nodes` at `now` by `rule`, leaving out the stragglers of
/// its last partition (not heard since it ended: no news); with its bridge `down`, every
/// live node since the site was last heard.
fn assess_site(
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
fn step_partition(
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
fn mark_nodes(
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
fn assess(rule: PartitionRule, members: &[Member], now: Timestamp) -> Option<Partition> {
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

/// The Event name of `what` (`silent`, `uplink-down` or `reachable`) for the partition of `site` that began
/// at `since`: the same on every replica, so the apiserver keeps one (a DNS subdomain:
/// the site lower-cased, characters other than `a-z0-9-.` as `-`).
pub fn event_name(site: &str, what: &str, since: Timestamp) -> String {
    let site: String = site
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    format!(
        "edgebeat-site-{}.{what}.{:x}",
        site.trim_matches(|c| c == '-' || c == '.'),
        since.as_second()
    )
}

/// The strategic-merge patch setting [`SITE_CONDITION`] on a Node's status.
pub fn condition_patch(
    status: bool,
    reason: &str,
    message: &str,
    at: Timestamp,
) -> serde_json::Value {
    let at = bodies::whole_seconds(at).to_string();
    json!({"status": {"conditions": [{
        "type": SITE_CONDITION,
        "status": ConditionStatus::from_bool(status).as_str(),
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": at,
        "lastTransitionTime": at,
    }]}})
}

/// Per-site figures for `/metrics`: `(site, reachable, live, silent)`.
pub fn figures(tracker: &Mutex<SiteTracker>) -> Vec<(Box<str>, bool, usize, usize)> {
    tracker
        .lock()
        .sites()
        .iter()
        .map(|(site, s)| (site.clone(), s.partition.is_none(), s.live, s.silent))
        .collect()
}

/// Builds per-site member lists from `(node, site, renewed, renew interval, unreachable)`.
pub fn group(
    nodes: impl IntoIterator<Item = (Box<str>, Box<str>, Timestamp, SignedDuration, bool)>,
) -> BTreeMap<Box<str>, Vec<Member>> {
    let mut sites: BTreeMap<Box<str>, Vec<Member>> = BTreeMap::new();
    for (node, site, renewed, renew_interval, unreachable) in nodes {
        sites.entry(site).or_default().push(Member {
            node,
            renewed,
            renew_interval,
            unreachable,
        });
    }
    sites
}

#[cfg(test)]
mod tests;
