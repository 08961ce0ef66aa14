//! The gateway's Prometheus metrics (`edgebeat_gateway_*`), every one registered here by
//! [`register`] (which [`Gateway::register_metrics`](crate::message_path::Gateway::register_metrics)
//! calls) and served on `/metrics` (`--metrics-listen`).
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `edgebeat_gateway_lease_renewals_total` | counter | | Lease renewals written |
//! | `edgebeat_gateway_lease_failures_total` | counter | | renewals that could not be written (apiserver errors, too late) |
//! | `edgebeat_gateway_stale_heartbeats_total` | counter | | renewals and status reports dropped as stale |
//! | `edgebeat_gateway_status_reports_total` | counter | | status PATCHes written |
//! | `edgebeat_gateway_rejected_messages_total` | counter | `reason` | messages rejected, by [`RejectReason`] (every reason is always exported, from 0) |
//! | `edgebeat_gateway_registrations_total` | counter | | Nodes created or reconciled |
//! | `edgebeat_gateway_nodes_not_found_total` | counter | | answers telling an agent its Node was deleted (`Ack.node_not_found`; it stops until restarted) |
//! | `edgebeat_gateway_node_certificates_recorded_total` | counter | | certificates recorded on their Node (a node's first identified message, then each rotation) |
//! | `edgebeat_gateway_tracked_nodes` | gauge | | nodes this replica keeps state for |
//! | `edgebeat_gateway_max_nodes` | gauge | | `--max-nodes`: further nodes are refused with reason `fleet_full` |
//! | `edgebeat_gateway_apiserver_backing_off` | gauge | | 1 while the gateway backs off from the apiserver (429, 5xx, no answer) |
//! | `edgebeat_gateway_unidentified_agents_allowed` | gauge | | 1 with `--allow-unidentified-agents` and an ingress that lets them in |
//! | `edgebeat_gateway_node_lease_age_seconds` | gauge | `node` | gateway wall clock − the `renewTime` this replica last wrote for the node's Lease |
//! | `edgebeat_gateway_node_clock_skew_seconds` | gauge | `node` | gateway wall clock − the agent's `Header.wall_time_ms`, at receipt of its last accepted message (signed: positive when the agent's clock is behind) |
//! | `edgebeat_gateway_per_node_metrics` | gauge | | 1 when the two per-node families above are exported (`--per-node-metrics`, default true) |
//! | `edgebeat_gateway_lease_age_seconds` | histogram (a gauge histogram) | `le` | every managed Lease's age now, as the watch holds it ([`crate::view::LEASE_AGE_BUCKETS`]) |
//! | `edgebeat_gateway_node_conditions` | gauge | `condition`, `status` | managed Nodes holding each condition type, by status, as the watch holds them |
//! | `edgebeat_gateway_certificate_lifetime_seconds` | gauge | | `--certificate-lifetime`, when this replica issues node certificates |
//! | `edgebeat_gateway_node_certificate_oldest_not_before_timestamp_seconds` | gauge | | earliest notBefore among the node certificates recorded on managed Nodes |
//! | `edgebeat_gateway_site_reachable` | gauge | `site` | 0 while the site is cut off ([`crate::sites`]), else 1; only sites of managed nodes with a zone |
//! | `edgebeat_gateway_site_nodes` | gauge | `site`, `state` | the site's live nodes: `renewing` or `silent` |
//! | `edgebeat_gateway_mqtt_sessions_taken_over_total` | counter | | times the broker ended this replica's MQTT session because another client connected with its client ID (MQTT 5 reason 0x8E); each also an ERROR |
//! | `edgebeat_gateway_sites_held` | gauge | | 1 while the sites' states hold as they were: the apiserver does not take this replica's Lease writes, or took them again less than two renew intervals ago ([`crate::sites`]) |
//! | `edgebeat_gateway_apiserver_request_duration_seconds` | histogram | `verb`, `resource`, `subresource`, `code` | the gateway's requests to kube-apiserver ([`crate::apiserver::requests`]) |
//! | `edgebeat_gateway_resource_metrics_requests_total` | counter | `code` | requests for kubelet's `/metrics/resource` ([`crate::resource_metrics::ResourceMetricsCounters`]): `200`, `400`, `401`, `403`, `404`, `405`, `429` (over a review budget), `500`, `other` |
//! | `edgebeat_gateway_resource_metrics_reviews_total` | counter | `call` | reviews asked of the apiserver: `token_review` (TokenReviews), `access_review` (SubjectAccessReviews); both always exported |
//! | `edgebeat_gateway_resource_metrics_reviews_refused_total` | counter | `budget` | reviews not asked because a review budget allowed none (each request answered 429): `address`, `global`, `served` ([`crate::resource_metrics::Budget`]); every budget always exported |
//! | `edgebeat_gateway_certificate_requests_total`, `…_certificate_signing_requests_pending` | counter, gauge | `proof`, `outcome` | enrollment ([`crate::enrollment::EnrollmentCounters`]) |
//! | `process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_start_time_seconds`, `process_open_fds` | | | the process ([`edgebeat_transports::observe::ProcessCollector`]) |
//!
//! **Fleet-wide series.** Every replica watches every managed Node and Lease, so
//! `edgebeat_gateway_lease_age_seconds` and `edgebeat_gateway_node_conditions` describe the
//! whole fleet on each replica, whoever wrote it: aggregate them with `max`, never `sum`.
//! They cost a fixed number of series whatever the fleet's size, and one pass over the
//! view per scrape. For fleets of thousands, `--per-node-metrics=false` drops the two
//! series per node (BENCHMARKS.md, "What a scrape costs").
//!
//! The counters are prometheus-client [`Counter`]s in [`Counters`], incremented on the
//! message path (one relaxed atomic add each); the gauges are read at scrape time by a
//! collector, from the slot map and the replica's settings.
//!
//! **Lease age** is computed at scrape time: the renewal path stores the written `renewTime`
//! with one atomic store, and each scrape subtracts it from the gateway clock. Updating a
//! gauge on write would be wrong (the age must grow while a node is silent, which is when it
//! matters) and a timer refreshing every node's gauge would cost work per node per tick for
//! no reader; scrape time costs one subtraction per node per scrape.
//!
//! **Clock skew** is set on receipt of each message that passed the replay and staleness
//! checks (an old message would read as skew); it includes the one-way transit time
//! (milliseconds on a LAN). Messages with `wall_time_ms` 0 (an agent clock before 1970) leave
//! it unchanged. Agents' clocks are never used for the apiserver: this is for spotting boards
//! without RTC or NTP.
//!
//! **Per replica.** With MQTT shared subscriptions or gRPC behind a load balancer, a node is
//! served by one replica at a time; the others keep its last values until its slot is evicted.
//! Aggregate with `min by (node)` for lease age. A node silent for 15 min loses its slot and
//! both per-node series (`Family::remove`), so series follow the live fleet; a node that dies
//! shows a growing lease age until then.

use edgebeat_transports::observe::register_family;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Why a message was rejected: the `reason` label of
/// `edgebeat_gateway_rejected_messages_total`, one fixed set shared with the transports.
use edgebeat_transports::ingress::RejectReason;
use std::time::SystemTime;

use edgebeat_hw::{Clock, UnixTime};

use crate::view::{FleetSummary, LEASE_AGE_BUCKETS};
use jiff::Timestamp;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::{EncodeLabelSet, NoLabelSet};
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

/// Label of `edgebeat_gateway_rejected_messages_total`: `reason="<RejectReason::as_str>"`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// [`RejectReason::as_str`], e.g. `fleet_full`.
    pub reason: &'static str,
}

/// The gateway's counters, for logs, tests and `/metrics`: each a prometheus-client
/// [`Counter`] (exported as `<name>_total`), registered by [`Counters::register`].
#[derive(Debug)]
pub struct Counters {
    /// Lease renewals written.
    pub lease_renewals: Counter,
    /// Lease renewals that could not be written (apiserver errors, too late to write).
    pub lease_failures: Counter,
    /// Heartbeats (renewals and status reports) dropped as stale.
    pub stale_renewals: Counter,
    /// Status PATCHes written.
    pub status_reports: Counter,
    /// Messages rejected, by [`RejectReason`]; see [`Counters::rejections`] and
    /// [`Counters::rejected`]. Every reason's series exists from the start, at 0.
    rejected_by_reason: Family<ReasonLabel, Counter>,
    /// Nodes created or reconciled.
    pub registrations: Counter,
    /// Answers `node_not_found`: the Node of a registered agent was deleted, and the agent
    /// stops until restarted.
    pub nodes_not_found: Counter,
    /// Certificates recorded on their Node's annotations (see
    /// [`crate::bodies::CERTIFICATE_SHA256_ANNOTATION`]).
    pub certificates_recorded: Counter,
    /// Which rejections are also logged: every one is counted, a flood is not written
    /// line by line ([`LogLimiter`](edgebeat_transports::log_limit::LogLimiter)).
    pub rejection_log: edgebeat_transports::log_limit::LogLimiter,
}

impl Default for Counters {
    fn default() -> Self {
        let counters = Self {
            lease_renewals: Counter::default(),
            lease_failures: Counter::default(),
            stale_renewals: Counter::default(),
            status_reports: Counter::default(),
            rejected_by_reason: Family::default(),
            rejection_log: Default::default(),
            registrations: Counter::default(),
            nodes_not_found: Counter::default(),
            certificates_recorded: Counter::default(),
        };
        for why in RejectReason::ALL {
            let _series = counters.rejected_by_reason.get_or_create(&reason(why));
        }
        counters
    }
}

fn reason(why: RejectReason) -> ReasonLabel {
    ReasonLabel {
        reason: why.as_str(),
    }
}

impl Counters {
    /// Counts one rejection for `why`.
    pub fn count_rejection(&self, why: RejectReason) {
        self.rejected_by_reason.get_or_create(&reason(why)).inc();
    }

    /// Rejections counted so far, all reasons.
    pub fn rejected(&self) -> u64 {
        RejectReason::ALL
            .iter()
            .map(|why| self.rejections(*why))
            .sum()
    }

    /// Rejections counted for `why` so far.
    pub fn rejections(&self, why: RejectReason) -> u64 {
        self.rejected_by_reason.get_or_create(&reason(why)).get()
    }

    /// Registers every counter in `registry` under its `edgebeat_gateway_*` name (the
    /// table in the module docs). prometheus-client ends each help text with a period.
    pub fn register(&self, registry: &mut Registry) {
        for (name, help, counter) in [
            (
                "edgebeat_gateway_lease_renewals",
                "Lease renewals written",
                &self.lease_renewals,
            ),
            (
                "edgebeat_gateway_lease_failures",
                "Lease renewals that could not be written (apiserver errors, too late to write)",
                &self.lease_failures,
            ),
            (
                "edgebeat_gateway_stale_heartbeats",
                "Heartbeats (Lease renewals and status reports) dropped as stale",
                &self.stale_renewals,
            ),
            (
                "edgebeat_gateway_status_reports",
                "Node status PATCHes written",
                &self.status_reports,
            ),
            (
                "edgebeat_gateway_registrations",
                "Nodes created or reconciled",
                &self.registrations,
            ),
            (
                "edgebeat_gateway_nodes_not_found",
                "Answers telling an agent that its Node was deleted (the agent stops sending until it is restarted)",
                &self.nodes_not_found,
            ),
            (
                "edgebeat_gateway_node_certificates_recorded",
                "Node certificates recorded on their Node (a node's first identified message, then each rotation)",
                &self.certificates_recorded,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        register_family(
            registry,
            "edgebeat_gateway_rejected_messages",
            "Messages rejected, by reason (see edgebeat_transports::ingress::RejectReason)",
            None,
            self.rejected_by_reason.clone(),
        );
    }
}

/// Label set of the per-node families: `node="<name>"`.
pub type NodeLabel = [(&'static str, String); 1];

fn label(node: &str) -> NodeLabel {
    [("node", node.to_owned())]
}

/// `gateway_now − agent wall clock` in seconds (positive: the agent's clock is behind), or
/// `None` when the agent sent no wall time (0).
pub fn clock_skew_seconds(gateway_now: SystemTime, agent_wall_ms: i64) -> Option<f64> {
    if agent_wall_ms == 0 {
        return None;
    }
    Some((UnixTime::from(gateway_now).micros() as f64 / 1e6) - (agent_wall_ms as f64 / 1e3))
}

/// `now − renewed` in seconds, where `renewed` is microseconds since the epoch (a Lease
/// `renewTime`). Negative only if the gateway clock stepped back.
pub fn lease_age_seconds(now: SystemTime, renewed_micros: i64) -> f64 {
    (UnixTime::from(now).micros() - renewed_micros) as f64 / 1e6
}

/// One node's Lease age: the last written `renewTime`, turned into an age when scraped.
#[derive(Clone)]
pub struct LeaseAge {
    renewed_micros: Arc<AtomicI64>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for LeaseAge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseAge")
            .field(
                "renewed_micros",
                &self.renewed_micros.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl LeaseAge {
    /// Records a successful renewal written with `renew_time`.
    pub fn renewed(&self, renew_time: Timestamp) {
        self.renewed_micros
            .store(renew_time.as_microsecond(), Ordering::Relaxed);
    }
}

impl TypedMetric for LeaseAge {
    const TYPE: MetricType = MetricType::Gauge;
}

impl EncodeMetric for LeaseAge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let renewed = self.renewed_micros.load(Ordering::Relaxed);
        encoder.encode_gauge(&lease_age_seconds(self.clock.now(), renewed))
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Makes [`LeaseAge`]s that read one clock.
#[derive(Clone)]
pub struct LeaseAgeConstructor(Arc<dyn Clock>);

impl MetricConstructor<LeaseAge> for LeaseAgeConstructor {
    fn new_metric(&self) -> LeaseAge {
        LeaseAge {
            renewed_micros: Arc::new(AtomicI64::new(0)),
            clock: self.0.clone(),
        }
    }
}

/// A clock-skew gauge (seconds, `f64`).
pub type SkewGauge = Gauge<f64, AtomicU64>;

/// The per-node families. Series are created on a node's first accepted message (skew) or
/// first written renewal (age) and removed with its slot.
#[derive(Clone)]
pub struct NodeMetrics {
    /// `edgebeat_gateway_node_lease_age_seconds`.
    pub lease_age: Family<NodeLabel, LeaseAge, LeaseAgeConstructor>,
    /// `edgebeat_gateway_node_clock_skew_seconds`.
    pub clock_skew: Family<NodeLabel, SkewGauge>,
}

impl NodeMetrics {
    /// Empty families whose lease ages read `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            lease_age: Family::new_with_constructor(LeaseAgeConstructor(clock)),
            clock_skew: Family::default(),
        }
    }

    /// The lease-age series of `node` (created if missing), to keep in its slot.
    pub fn lease_age(&self, node: &str) -> LeaseAge {
        self.lease_age.get_or_create_owned(&label(node))
    }

    /// The clock-skew series of `node` (created if missing), to keep in its slot.
    pub fn clock_skew(&self, node: &str) -> SkewGauge {
        self.clock_skew.get_or_create_owned(&label(node))
    }

    /// Drops both series of `node` (its slot was evicted).
    pub fn remove(&self, node: &str) {
        let label = label(node);
        self.lease_age.remove(&label);
        self.clock_skew.remove(&label);
    }
}

/// A node's series handles, kept in its slot so the message path only stores atomics.
#[derive(Default)]
pub struct NodeSeries {
    /// Set on the first written renewal.
    pub lease_age: Option<LeaseAge>,
    /// Set on the first accepted message with a wall time.
    pub clock_skew: Option<SkewGauge>,
}

/// Registers every gateway metric in `registry`: the [`Counters`], the per-node families of
/// `node_metrics` (none when `None`: `--per-node-metrics=false`), and the gauges `gauges` reads at scrape time (through a collector; `None`
/// once the gateway is gone, which then reports none).
#[rustfmt::skip]
pub fn register(
    registry: &mut Registry,
    counters: &Counters,
    node_metrics: Option<&NodeMetrics>,
    gauges: impl Fn() -> Option<ReplicaGauges> + Send + Sync + 'static,
) {
    counters.register(registry);
    registry.register_collector(Box::new(ReplicaCollector(Box::new(gauges))));
    let Some(node_metrics) = node_metrics else {
        return;
    };
    register_family(registry, "edgebeat_gateway_node_lease_age", "Gateway wall clock minus the renewTime this replica last wrote for the node's Lease", Some(Unit::Seconds), node_metrics.lease_age.clone());
    register_family(registry, "edgebeat_gateway_node_clock_skew", "Gateway wall clock minus the agent's header wall time at receipt of its last accepted message; positive when the agent's clock is behind", Some(Unit::Seconds), node_metrics.clock_skew.clone());
}

/// What a replica's scrape-time gauges show.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaGauges {
    /// `edgebeat_gateway_tracked_nodes`.
    pub tracked_nodes: usize,
    /// `edgebeat_gateway_max_nodes` (`--max-nodes`).
    pub max_nodes: usize,
    /// `edgebeat_gateway_apiserver_backing_off`.
    pub backing_off: bool,
    /// `edgebeat_gateway_unidentified_agents_allowed`.
    pub unidentified_allowed: bool,
    /// `edgebeat_gateway_per_node_metrics` (`--per-node-metrics`).
    pub per_node_metrics: bool,
    /// `edgebeat_gateway_certificate_lifetime_seconds` (`--certificate-lifetime`), when
    /// this replica issues node certificates.
    pub certificate_lifetime: Option<std::time::Duration>,
    /// The managed fleet as the replica's watches hold it: `edgebeat_gateway_lease_age_seconds`,
    /// `edgebeat_gateway_node_conditions` and
    /// `edgebeat_gateway_node_certificate_oldest_not_before_timestamp_seconds`.
    pub fleet: FleetSummary,
    /// Per site (`site`, reachable, live nodes, silent nodes):
    /// `edgebeat_gateway_site_reachable` and `edgebeat_gateway_site_nodes`.
    pub sites: Vec<(Box<str>, bool, usize, usize)>,
    /// `edgebeat_gateway_sites_held`.
    pub sites_held: bool,
    /// `edgebeat_gateway_mqtt_sessions_taken_over_total`.
    pub mqtt_sessions_taken_over: u64,
}

/// Reads [`ReplicaGauges`] at scrape time.
struct ReplicaCollector(Box<dyn Fn() -> Option<ReplicaGauges> + Send + Sync>);

impl std::fmt::Debug for ReplicaCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplicaCollector")
    }
}

impl Collector for ReplicaCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(g) = (self.0)() else {
            return Ok(());
        };
        let gauges = [
            (
                "edgebeat_gateway_tracked_nodes",
                "Nodes this gateway replica keeps state for (silent ones are dropped after 15 min).",
                g.tracked_nodes,
            ),
            (
                "edgebeat_gateway_max_nodes",
                "Most nodes this replica keeps state for (--max-nodes); messages of further nodes are refused with reason fleet_full.",
                g.max_nodes,
            ),
            (
                "edgebeat_gateway_apiserver_backing_off",
                "1 while the gateway backs off from the apiserver (it answered 429, 5xx or nothing; one probe request at a time), else 0.",
                usize::from(g.backing_off),
            ),
            (
                "edgebeat_gateway_sites_held",
                "1 while the sites' states hold as they were, not judged: the apiserver does not take this replica's Lease writes (or took them again less than two renew intervals ago), so Lease ages say nothing of the sites; else 0.",
                usize::from(g.sites_held),
            ),
            (
                "edgebeat_gateway_unidentified_agents_allowed",
                "1 when messages without a node identity are let in (--allow-unidentified-agents), else 0.",
                usize::from(g.unidentified_allowed),
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        let per_node = ConstGauge::new(i64::from(g.per_node_metrics));
        per_node.encode(encoder.encode_descriptor(
            "edgebeat_gateway_per_node_metrics",
            "1 when the per-node series (edgebeat_gateway_node_lease_age_seconds, edgebeat_gateway_node_clock_skew_seconds) are exported (--per-node-metrics), else 0.",
            None,
            MetricType::Gauge,
        )?)?;
        if let Some(lifetime) = g.certificate_lifetime {
            let gauge = ConstGauge::new(lifetime.as_secs_f64());
            gauge.encode(encoder.encode_descriptor(
                "edgebeat_gateway_certificate_lifetime",
                "Lifetime of the node certificates this replica issues (--certificate-lifetime); agents rotate at 70 to 90 % of it.",
                Some(&Unit::Seconds),
                MetricType::Gauge,
            )?)?;
        }
        if let Some(not_before) = g.fleet.oldest_certificate_not_before {
            let gauge = ConstGauge::new(not_before);
            gauge.encode(encoder.encode_descriptor(
                "edgebeat_gateway_node_certificate_oldest_not_before_timestamp",
                "Earliest notBefore of the node certificates recorded on managed Nodes (Unix seconds): the certificate closest to expiry when all share one lifetime.",
                Some(&Unit::Seconds),
                MetricType::Gauge,
            )?)?;
        }
        let taken = ConstCounter::new(g.mqtt_sessions_taken_over);
        taken.encode(encoder.encode_descriptor(
            "edgebeat_gateway_mqtt_sessions_taken_over",
            "Times the MQTT broker ended this replica's session because another client connected with its client ID (MQTT 5 reason 0x8E, Session taken over): while that goes on the replica hears no node.",
            None,
            MetricType::Counter,
        )?)?;
        encode_fleet(&g.fleet, &mut encoder)?;
        encode_sites(&g.sites, &mut encoder)
    }
}

/// `edgebeat_gateway_site_reachable{site}` and `edgebeat_gateway_site_nodes{site, state}`
/// (see [`crate::sites`]); nothing when no managed node has a zone.
fn encode_sites(
    sites: &[(Box<str>, bool, usize, usize)],
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    if sites.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(
        "edgebeat_gateway_site_reachable",
        "0 while the site (topology.kubernetes.io/zone) is cut off: most of its live nodes went silent together; else 1. The same on every replica: aggregate with min.",
        None,
        MetricType::Gauge,
    )?;
    for (site, reachable, _, _) in sites {
        ConstGauge::new(i64::from(*reachable))
            .encode(family.encode_family(&[("site", &**site)])?)?;
    }
    let mut family = encoder.encode_descriptor(
        "edgebeat_gateway_site_nodes",
        "Managed nodes of each site by state: renewing, or silent (two renewals missed); nodes silent for twelve renew intervals are no longer counted.",
        None,
        MetricType::Gauge,
    )?;
    for (site, _, live, silent) in sites {
        for (state, n) in [
            ("renewing", live.saturating_sub(*silent)),
            ("silent", *silent),
        ] {
            let gauge = ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
            gauge.encode(family.encode_family(&[("site", &**site), ("state", state)])?)?;
        }
    }
    Ok(())
}

/// `edgebeat_gateway_lease_age_seconds` and `edgebeat_gateway_node_conditions` from `fleet`.
///
/// The Lease ages are a *gauge histogram* (OpenMetrics `gaugehistogram`: the distribution
/// now, not events counted since start), which prometheus-client cannot type; it is
/// exposed as a histogram. Query its buckets as they are (`max by (le) (…_bucket)` across
/// replicas, `histogram_quantile` on that); never `rate()` it.
fn encode_fleet(
    fleet: &FleetSummary,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let mut buckets = [(f64::INFINITY, 0u64); LEASE_AGE_BUCKETS.len() + 1];
    for (i, (slot, count)) in buckets.iter_mut().zip(fleet.lease_ages).enumerate() {
        *slot = (
            LEASE_AGE_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY),
            count,
        );
    }
    let count = fleet.lease_ages.iter().sum();
    let mut metric = encoder.encode_descriptor(
        "edgebeat_gateway_lease_age",
        "Ages of every managed node Lease as this replica's watch holds it (gateway wall clock minus renewTime), now: the same fleet on every replica, so aggregate with max by (le); never rate() it.",
        Some(&Unit::Seconds),
        MetricType::Histogram,
    )?;
    metric.encode_histogram::<NoLabelSet>(fleet.lease_age_sum, count, &buckets, None)?;
    let mut family = encoder.encode_descriptor(
        "edgebeat_gateway_node_conditions",
        "Managed Nodes holding each condition type, by status, as this replica's watch holds them (the same fleet on every replica: aggregate with max).",
        None,
        MetricType::Gauge,
    )?;
    for (type_, by_status) in &fleet.conditions {
        for (status, n) in edgebeat_proto::ConditionStatus::ALL
            .into_iter()
            .zip(by_status)
        {
            let labels = [("condition", type_.as_str()), ("status", status.as_str())];
            let gauge = ConstGauge::new(i64::try_from(*n).unwrap_or(i64::MAX));
            gauge.encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "metrics/tests.rs"]
mod tests;
