//! What the apiserver holds for the Nodes and Leases this gateway manages: the gateway's
//! informer.
//!
//! kubelet diffs every status update against the Node its informer holds
//! (`pkg/kubelet/kubelet_node_status.go: tryUpdateNodeStatus`) and renews its Lease from
//! the last object it wrote (`staging/src/k8s.io/component-helpers/apimachinery/lease/
//! controller.go: retryUpdateLease`). The gateway does the same for a fleet with one
//! [`ApiserverView`], fed from two sides:
//!
//! - a **watch** (kube-runtime's [`watcher()`](kube::runtime::watcher()), client-go's
//!   list+watch) of the Nodes and of the Leases in `kube-node-lease` that carry
//!   [`MANAGED_LABEL`], so what other writers do reaches every replica within the watch's
//!   latency: the node lifecycle controller
//!   setting conditions Unknown, another replica of a shared MQTT subscription writing a
//!   Lease or a new boot ID, an operator deleting a Node;
//! - the **answers to this replica's own writes**, so the next message of a node never
//!   waits for the watch to catch up.
//!
//! Only what the gateway diffs against is stored ([`NodeRecord`] and [`LeaseRecord`]: by
//! their types well under 1 KiB per node, the conditions in fixed slots), never whole
//! objects. Objects of both sources are
//! ordered by `metadata.resourceVersion` compared as integers, as the apiserver's own
//! storage does (`staging/src/k8s.io/apiserver/pkg/storage/etcd3/api_object_versioner.go:
//! APIObjectVersioner.ParseResourceVersion`); an older object never replaces a newer one.
//!
//! Without a working watch (RBAC without list/watch, the watch failing), the view is only
//! the write-through cache, and the gateway trusts it for `knowledge_ttl` after its last
//! write before reading the Node again ([`ApiserverView::nodes_watched`]).

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event, ExponentialBackoff, watcher};
use kube::{Api, ResourceExt};

use edgebeat_proto::NodeConditionType;
use edgebeat_transports::ingress::CertificateId;

use crate::apiserver::answers;
use crate::bodies::{LEASE_NAMESPACE, MANAGED_LABEL};

/// The label selector of [`MANAGED_LABEL`] (`key=value`).
pub fn managed_selector() -> String {
    format!("{}={}", MANAGED_LABEL.0, MANAGED_LABEL.1)
}

/// Whether an object at `incoming` may replace one at `held` (both integers: only if not
/// older; otherwise the later arrival wins).
fn not_older(incoming: Option<u64>, held: Option<u64>) -> bool {
    match (incoming, held) {
        (Some(new), Some(old)) => new >= old,
        _ => true,
    }
}

/// A kind the view follows: how an object becomes its record, and where those live.
trait Followed: ResourceExt {
    type Record;
    /// Its record; `None` when it holds nothing worth keeping (not a stored object).
    fn record(&self) -> Option<Self::Record>;
    /// The record's resourceVersion as an integer.
    fn record_version(record: &Self::Record) -> Option<u64>;
    /// The view's records of this kind.
    fn records(view: &ApiserverView) -> &Records<Self::Record>;
}

impl Followed for Node {
    type Record = NodeRecord;
    fn record(&self) -> Option<NodeRecord> {
        Some(NodeRecord::of(self))
    }
    fn record_version(record: &NodeRecord) -> Option<u64> {
        record.resource_version
    }
    fn records(view: &ApiserverView) -> &Records<NodeRecord> {
        &view.nodes
    }
}

impl Followed for PartialLease {
    type Record = LeaseRecord;
    fn record(&self) -> Option<LeaseRecord> {
        LeaseRecord::of(self)
    }
    fn record_version(record: &LeaseRecord) -> Option<u64> {
        integer_version(Some(&record.resource_version))
    }
    fn records(view: &ApiserverView) -> &Records<LeaseRecord> {
        &view.leases
    }
}

/// One kind's records by object name, and whether its watch follows.
#[derive(Debug)]
struct Records<R> {
    map: Mutex<HashMap<Box<str>, R>>,
    watched: AtomicBool,
}

impl<R> Default for Records<R> {
    fn default() -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            watched: AtomicBool::new(false),
        }
    }
}

impl<R> Records<R> {
    fn map(&self) -> MutexGuard<'_, HashMap<Box<str>, R>> {
        self.map.lock()
    }
}

/// Upper bounds, in seconds, of the Lease-age buckets of [`FleetSummary::lease_ages`]
/// (`edgebeat_gateway_lease_age_seconds`): around the 10 s renew interval and the 40 s
/// `leaseDurationSeconds` kube-controller-manager's node lifecycle controller waits
/// before it marks a node Unknown, then minutes for dead nodes.
pub const LEASE_AGE_BUCKETS: [f64; 9] = [5.0, 10.0, 20.0, 30.0, 40.0, 60.0, 120.0, 300.0, 900.0];

/// The managed fleet at one instant, as [`ApiserverView::fleet_summary`] counts it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetSummary {
    /// Leases per age bucket: `[i]` holds those at most [`LEASE_AGE_BUCKETS`]`[i]` seconds
    /// old and older than the bucket before (not cumulative); the last, older than 900 s.
    pub lease_ages: [u64; LEASE_AGE_BUCKETS.len() + 1],
    /// Sum of every counted Lease's age, seconds.
    pub lease_age_sum: f64,
    /// Managed Nodes per condition type holding it, by status: `[True, False, Unknown]`
    /// (indexed by [`ConditionStatus`] as `usize`), in [`NodeConditionType`] order.
    pub conditions: Vec<(NodeConditionType, [u64; 3])>,
    /// The earliest `notBefore` (Unix seconds) of the node certificates the managed Nodes'
    /// annotations record; `None` when none is.
    pub oldest_certificate_not_before: Option<i64>,
}

/// The gateway's view of the apiserver (see the module docs). Shared by every message
/// handler and the two watch tasks; each kind's map sits behind its own short-held lock.
#[derive(Debug, Default)]
pub struct ApiserverView {
    nodes: Records<NodeRecord>,
    leases: Records<LeaseRecord>,
    watch_events: AtomicU64,
    watch_errors: AtomicU64,
    /// Woken whenever a watch starts following.
    following: tokio::sync::Notify,
}

impl ApiserverView {
    /// An empty view, watching nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the Node watch has listed every managed Node and is following changes: the
    /// view then *is* the apiserver's state, give or take the watch's latency, and a node
    /// missing from it does not exist (or was registered without [`MANAGED_LABEL`]).
    pub fn nodes_watched(&self) -> bool {
        self.nodes.watched.load(Ordering::Relaxed)
    }

    /// Whether the Lease watch has listed and is following (as [`Self::nodes_watched`]).
    pub fn leases_watched(&self) -> bool {
        self.leases.watched.load(Ordering::Relaxed)
    }

    /// Returns once both watches have listed and follow ([`Self::nodes_watched`],
    /// [`Self::leases_watched`]): at once if they do. Ingresses start after it, so the
    /// first messages meet the cluster's record of every managed node (its certificate
    /// among it); bound the wait, since a watch may never list (RBAC without list).
    pub async fn synced(&self) {
        loop {
            let following = self.following.notified();
            tokio::pin!(following);
            following.as_mut().enable();
            if self.nodes_watched() && self.leases_watched() {
                return;
            }
            following.await;
        }
    }

    /// Watch events applied since start, and watch errors (each followed by kube-runtime's
    /// backoff and a resumed or fresh list+watch).
    pub fn watch_counts(&self) -> (u64, u64) {
        (
            self.watch_events.load(Ordering::Relaxed),
            self.watch_errors.load(Ordering::Relaxed),
        )
    }

    /// A copy of what is known of Node `name`.
    pub fn node(&self, name: &str) -> Option<NodeRecord> {
        self.nodes.map().get(name).cloned()
    }

    /// Whether Node `name` is in the view and carries [`MANAGED_LABEL`], and its capacity
    /// ([`NodeRecord::capacity`]) when it is.
    pub fn managed_capacity(
        &self,
        name: &str,
    ) -> Option<Option<crate::resource_metrics::Capacity>> {
        let nodes = self.nodes.map();
        let record = nodes.get(name)?;
        record.managed.then_some(record.capacity)
    }

    /// The certificate Node `name` speaks with, as its annotations record it (see
    /// [`NodeRecord::certificate`]).
    pub fn certificate(&self, name: &str) -> Option<CertificateId> {
        self.nodes.map().get(name)?.certificate
    }

    /// `status.nodeInfo.bootID` of Node `name`, as the view holds it.
    pub fn boot_id(&self, name: &str) -> Option<Box<str>> {
        self.nodes.map().get(name)?.boot_id.clone()
    }

    /// Whether Node `name` is known to hold an `Unknown` condition.
    pub fn node_has_unknown_condition(&self, name: &str) -> bool {
        self.nodes
            .map()
            .get(name)
            .is_some_and(NodeRecord::has_unknown_condition)
    }

    /// Takes `node` (a write's answer, a read or a watch event) unless the view already
    /// holds a newer version of it.
    pub fn observe_node(&self, node: &Node) {
        self.observe(node);
    }

    /// Drops Node `name` (found missing by a write).
    pub fn forget_node(&self, name: &str) {
        self.nodes.map().remove(name);
    }

    /// A copy of what is known of Lease `name` in `kube-node-lease`.
    pub fn lease(&self, name: &str) -> Option<LeaseRecord> {
        self.leases.map().get(name).cloned()
    }

    /// Takes `lease` unless the view already holds a newer version of it.
    pub fn observe_lease(&self, lease: &PartialLease) {
        self.observe(lease);
    }

    /// Drops Lease `name`.
    pub fn forget_lease(&self, name: &str) {
        self.leases.map().remove(name);
    }

    /// What the view holds of the whole managed fleet at `now` (gateway clock), for the
    /// scrape-time metrics ([`crate::metrics`]): every Lease's age by
    /// [`LEASE_AGE_BUCKETS`], managed Nodes by condition status, and the oldest node
    /// certificate recorded. One pass over each map under its lock (about 10 µs per 1,000
    /// nodes), no allocation but the summary's few condition rows.
    ///
    /// Every replica watches every managed Node and Lease, so every replica's summary is
    /// the fleet's, whoever wrote it; without a watch it covers what this replica wrote.
    pub fn fleet_summary(&self, now: Timestamp) -> FleetSummary {
        let mut summary = FleetSummary::default();
        for lease in self.leases.map().values() {
            let Some(renewed) = lease.renew_time else {
                continue;
            };
            let age = now.duration_since(renewed).as_secs_f64();
            let bucket = LEASE_AGE_BUCKETS
                .iter()
                .position(|upper| age <= *upper)
                .unwrap_or(LEASE_AGE_BUCKETS.len());
            if let Some(count) = summary.lease_ages.get_mut(bucket) {
                *count += 1;
            }
            summary.lease_age_sum += age;
        }
        for node in self.nodes.map().values().filter(|n| n.managed) {
            for (type_, condition) in node.conditions.iter() {
                let row = match summary.conditions.iter_mut().find(|(t, _)| *t == type_) {
                    Some((_, row)) => row,
                    None => {
                        summary.conditions.push((type_, [0; 3]));
                        match summary.conditions.last_mut() {
                            Some((_, row)) => row,
                            None => continue,
                        }
                    }
                };
                row[condition.status as usize] += 1;
            }
            if let Some(certificate) = &node.certificate {
                summary.oldest_certificate_not_before = Some(
                    summary
                        .oldest_certificate_not_before
                        .map_or(certificate.not_before, |o| o.min(certificate.not_before)),
                );
            }
        }
        summary.conditions.sort_by_key(|(t, _)| *t);
        summary
    }

    /// The managed nodes that have a site and a Lease, by site, for
    /// [`crate::sites::SiteTracker::look`]: each node's renewTime and renew interval
    /// (`leaseDurationSeconds` × 0.25, kubelet's). The nodes with a site are read first
    /// (none, and nothing more is done, in a fleet without zones), then their Leases: the
    /// two locks are never held together.
    pub fn site_members(&self) -> BTreeMap<Box<str>, Vec<crate::sites::Member>> {
        let sited: Vec<(Box<str>, Box<str>, bool)> = self
            .nodes
            .map()
            .iter()
            .filter(|(_, n)| n.managed)
            .filter_map(|(name, n)| Some((name.clone(), n.site.clone()?, n.site_unreachable)))
            .collect();
        if sited.is_empty() {
            return BTreeMap::new();
        }
        let leases = self.leases.map();
        crate::sites::group(sited.into_iter().filter_map(|(name, site, unreachable)| {
            let lease = leases.get(&name)?;
            let renewed = lease.renew_time?;
            let duration = lease.duration_seconds.filter(|d| *d > 0)?;
            Some((
                name,
                site,
                renewed,
                jiff::SignedDuration::from_millis(i64::from(duration) * 250),
                unreachable,
            ))
        }))
    }

    /// Takes `obj`'s record unless one of a newer version is held.
    fn observe<K: Followed>(&self, obj: &K) {
        let (Some(name), Some(record)) = (obj.meta().name.as_deref(), obj.record()) else {
            return;
        };
        let mut map = K::records(self).map();
        match map.get_mut(name) {
            Some(held) if !not_older(K::record_version(&record), K::record_version(held)) => {}
            Some(held) => *held = record,
            None => {
                map.insert(Box::from(name), record);
            }
        }
    }

    /// Drops the record of `obj`, deleted at its resourceVersion, unless a newer one is
    /// held (say the Node registered again since, written through by this replica).
    fn deleted<K: Followed>(&self, obj: &K) {
        let Some(name) = obj.meta().name.as_deref() else {
            return;
        };
        let deleted = integer_version(obj.meta().resource_version.as_deref());
        let mut map = K::records(self).map();
        if map
            .get(name)
            .is_some_and(|held| not_older(deleted, K::record_version(held)))
        {
            map.remove(name);
        }
    }

    /// Follows the managed Nodes until the stream ends (it does not: kube-runtime's
    /// watcher re-lists after a `410 Gone` and retries errors). Errors are counted and
    /// logged, and mark the view unwatched until the stream delivers again; the next try
    /// waits [`watch_backoff`], and a re-list after `410 Gone` none at all.
    pub async fn watch_nodes(self: Arc<Self>, client: kube::Client) {
        let api: Api<Node> = Api::all(client);
        let config = watcher::Config::default().labels(&managed_selector());
        self.follow(watcher(api, config), watch_backoff(), "Node")
            .await;
    }

    /// Follows the managed Leases in `kube-node-lease` (as [`Self::watch_nodes`]).
    pub async fn watch_leases(self: Arc<Self>, client: kube::Client) {
        // Parsed in part: every renewal of the fleet, this replica's and the others', comes
        // through here (see [`PartialLease`]).
        let api: Api<PartialLease> = Api::namespaced(client, LEASE_NAMESPACE);
        let config = watcher::Config::default().labels(&managed_selector());
        self.follow(watcher(api, config), watch_backoff(), "Lease")
            .await;
    }

    /// Takes `stream`'s events into the view, waiting `backoff` after each error but a
    /// `410 Gone` (see [`watch_backoff`]).
    async fn follow<K: Followed>(
        &self,
        stream: impl futures_util::Stream<Item = Result<Event<K>, watcher::Error>>,
        mut backoff: impl Backoff,
        kind: &'static str,
    ) {
        let watched = &K::records(self).watched;
        futures_util::pin_mut!(stream);
        // Names listed since the last Init: what a re-list did not return was deleted
        // while the watch was down.
        let mut listed: Option<HashSet<String>> = None;
        // Whether a failure was logged since the watch last followed (once per outage,
        // including the first one of a watch that never listed).
        let mut warned = false;
        // When a 410 Gone was last listed again at once: at most one a [`RELIST_AT_ONCE_EVERY`]
        // (a 410 after every list, from an apiserver whose watch cache lags, is no storm).
        let mut relisted_at_once: Option<tokio::time::Instant> = None;
        while let Some(item) = stream.next().await {
            let event = match item {
                Ok(event) => event,
                Err(error) => {
                    self.watch_errors.fetch_add(1, Ordering::Relaxed);
                    watched.store(false, Ordering::Relaxed);
                    if !warned {
                        // An error, not a warning: while it lasts nothing is known of the
                        // cluster (an unreachable apiserver, missing RBAC).
                        warned = true;
                        tracing::error!(
                            kind,
                            error = %edgebeat_transports::observe::error_report(&error),
                            "watch failed; reading objects again until it recovers"
                        );
                    } else {
                        tracing::debug!(kind, %error, "watch still failing");
                    }
                    let gone =
                        matches!(&error, watcher::Error::WatchError(s) if answers::is_gone(s));
                    let now = tokio::time::Instant::now();
                    if gone
                        && relisted_at_once
                            .is_none_or(|at| now.duration_since(at) >= RELIST_AT_ONCE_EVERY)
                    {
                        relisted_at_once = Some(now);
                    } else if let Some(wait) = backoff.next().filter(|w| !w.is_zero()) {
                        tokio::time::sleep(wait).await;
                    }
                    continue;
                }
            };
            self.watch_events.fetch_add(1, Ordering::Relaxed);
            match event {
                Event::Init => listed = Some(HashSet::new()),
                Event::InitApply(obj) => {
                    self.observe(&obj);
                    if let Some(names) = listed.as_mut() {
                        names.insert(obj.name_any());
                    }
                }
                Event::InitDone => {
                    if let Some(names) = listed.take() {
                        K::records(self)
                            .map()
                            .retain(|k, _| names.contains(k.as_ref()));
                        tracing::info!(kind, objects = names.len(), "watch listed and following");
                    }
                }
                Event::Apply(obj) => self.observe(&obj),
                Event::Delete(obj) => self.deleted(&obj),
            }
            // A watch resumed after an error from its last resourceVersion has missed
            // nothing: following again with its next event (a re-list waits for InitDone).
            if listed.is_none() && !watched.swap(true, Ordering::Relaxed) {
                warned = false;
                backoff.reset();
                self.following.notify_waiters();
            }
        }
        watched.store(false, Ordering::Relaxed);
    }
}

/// Least time between two re-lists at once after `410 Gone` ([`watch_backoff`]); a 410
/// sooner waits its backoff like any other error.
pub const RELIST_AT_ONCE_EVERY: Duration = Duration::from_secs(30);

/// The wait between a watch's tries while it fails: 250 ms doubling to 2 s, each with up to
/// as much again of jitter, so at most 4 s, reset once the watch follows again; after a
/// `410 Gone` (its resourceVersion too old, as after every kube-apiserver restart, whose
/// watch cache starts at etcd's current revision) it lists again at once.
///
/// kube-runtime's `default_backoff` (800 ms doubling to 30 s, up to twice that with
/// jitter, reset only after 120 s without an error) grows through an outage of tens of
/// seconds to waits of 30-60 s, so a watch resumed after the apiserver's return waited that
/// long again before its re-list, and the replica's view (and its sites) with it. At most
/// one re-list at once per [`RELIST_AT_ONCE_EVERY`].
pub fn watch_backoff() -> ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(Duration::from_secs(2))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

mod partial;
mod records;
pub use partial::{LeaseExtras, PartialLease, PartialLeaseSpec};
use records::integer_version;
pub use records::{LeaseRecord, NodeRecord};

#[cfg(test)]
mod tests;
