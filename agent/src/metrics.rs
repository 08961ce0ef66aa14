//! The agent's Prometheus metrics, all registered in [`AgentMetrics::new`] and served on
//! `/metrics` by the observe server (`healthzBindAddress`).
//!
//! | metric | type | labels | what it counts |
//! |---|---|---|---|
//! | `edgebeat_agent_lease_renewals_total` | counter | `result="ok\|failed"` | Lease renewal ticks: `ok` when the gateway wrote the Lease (renewals are quiet: no answer until the next one is due means written), `failed` when every attempt of the tick failed (kubelet's 5) |
//! | `edgebeat_agent_status_reports_total` | counter | `result="ok\|failed"` | status reports (one per report that was due), as above |
//! | `edgebeat_agent_registrations_total` | counter | | times the agent became registered with the gateway (`Register` acknowledged) |
//! | `edgebeat_agent_transport_reconnects_total` | counter | | times the agent lost its registration (see below) |
//! | `edgebeat_agent_messages_sent_bytes_total` | counter | `kind="register\|status\|lease"` | encoded protobuf `AgentMessage` bytes handed to the transport (see below) |
//! | `edgebeat_agent_registered` | gauge | | 1 while the gateway holds the agent's registration (`Register` acknowledged, the connection not lost since), else 0; also the unit's `STATUS=` under systemd (`crate::systemd`) |
//! | `edgebeat_agent_node_not_found` | gauge | | 1 once the gateway said this agent's Node was deleted (`kubectl delete node`): the agent sends nothing more and registers again only when restarted; 0 otherwise |
//! | `edgebeat_agent_last_lease_renewal_timestamp_seconds` | gauge | | wall-clock time of the last successful renewal, seconds since the epoch (0 before the first) |
//! | `edgebeat_agent_certificate_requests_total` | counter | `kind="enrollment\|rotation"`, `result="issued\|pending\|refused\|failed"` | certificate requests of an agent with `bootstrapTokenFile` (see `crate::certificates`): `issued` and stored, `pending` (manual approval, the apiserver slow), `refused` by the gateway, `failed` (no answer, unusable answer, not stored) |
//! | `edgebeat_agent_answers_refused_total` | counter | `reason="unsigned\|certificate\|signature\|malformed"` | answers on the ack topic (MQTT with signed messages) and to certificate requests that did not verify: not signed, a certificate no answer CA issued (else the site CA, for an agent that learnt none) or without serverAuth, a bad signature, signed bytes that do not decode (`edgebeat_transports::signing::AnswerVerifier`); nothing of them was acted on |
//! | `edgebeat_agent_certificate_expiration_timestamp_seconds` | gauge | | notAfter of the node certificate in use, seconds since the epoch (0 without a managed one) |
//! | `edgebeat_agent_info` | info | `node`, `transport`, `version` | always 1 |
//! | `edgebeat_agent_node_condition` | gauge | `condition` | 1 while the condition the agent reports is True, 0 while False; a health condition the host has no signal for has no series |
//! | `edgebeat_agent_pressure_stall_ratio` | gauge | `resource="cpu\|memory\|io"`, `line="some\|full"`, `window="10s\|60s\|300s"` | PSI averages of `/proc/pressure/*` as a fraction of wall time (kernel `Documentation/accounting/psi.rst`) |
//! | `edgebeat_agent_filesystem_readonly` | gauge | `filesystem="nodefs\|imagefs"` | 1 while the filesystem holding `rootDir` / `imageFsDir` is read-only |
//! | `edgebeat_agent_thermal_zone_temperature_celsius` | gauge | `zone`, `type` | each thermal zone's temperature, °C |
//! | `edgebeat_agent_cooling_device_state` | gauge | `device`, `type` | each cooling device's `cur_state` (0 = not cooling) |
//! | `edgebeat_agent_rpi_throttled` | gauge | | the Raspberry Pi firmware's `get_throttled` word (bits 0–3 now, 16–19 since boot) |
//! | `edgebeat_agent_under_voltage` | gauge | | 1 while the `rpi_volt` alarm or firmware bit 0 says under-voltage |
//! | `edgebeat_agent_clock_synchronized` | gauge | | 1 while the kernel clock is NTP-synchronised (`adjtimex`) |
//! | `edgebeat_agent_clock_max_error_seconds` | gauge | | the kernel's `maxerror` estimate, seconds |
//!
//! The health series are set on every status computation (`nodeStatusUpdateFrequency`), so
//! they show live figures where the conditions keep the figure of their last transition.
//!
//! **Reconnects.** The agent's loops see the transport only through
//! [`Uplink::registered`](edgebeat_transports::uplink::Uplink::registered), so
//! `transport_reconnects_total` counts its true → false transitions: a gRPC connection lost
//! after registering, or the Node found deleted. It does not count failed connection attempts while not
//! registered, nor MQTT broker reconnects, which keep the registration (the broker, not the
//! gateway, was the peer). A loss and re-registration faster than the agent's task is
//! scheduled (sub-millisecond) can be missed; the gRPC backoff makes that practically
//! impossible there.
//!
//! **Bytes.** `messages_sent_bytes_total` adds `prost::Message::encoded_len` of each message
//! the transport took (answered, timed out or lost with its connection; not those refused with
//! "not connected"). Framing is excluded — HTTP/2 and gRPC prefixes, MQTT headers and topic,
//! TCP/IP; `BENCHMARKS.md` has the measured wire bytes (a ~60-byte renewal is ~75 B on the
//! wire over gRPC, ~111 B over MQTT). `kind="register"` counts each `Register` built for the
//! transport; the MQTT transport also builds one per broker connection for its Last Will, of
//! which only the header goes out, so over MQTT it overstates by one `Register` per broker
//! connection.
//!
//! The hot path only increments atomics: every counter of every label value is created here,
//! once, and kept as a handle.

use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

use edgebeat_hw::{HostFacts, UnixTime};
use edgebeat_proto::AgentMessage;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use prost::Message as _;

type Labels = [(&'static str, &'static str); 1];
type Dynamic = Vec<(&'static str, String)>;
type Ratio = Gauge<f64, AtomicU64>;

/// The health signals' series (see the module docs).
#[derive(Debug, Clone, Default)]
struct HealthMetrics {
    condition: Family<Dynamic, Gauge>,
    stall: Family<Dynamic, Ratio>,
    readonly: Family<Dynamic, Gauge>,
    temperature: Family<Dynamic, Ratio>,
    cooling: Family<Dynamic, Gauge>,
    rpi_throttled: Gauge,
    under_voltage: Gauge,
    clock_synchronized: Gauge,
    clock_max_error: Ratio,
}

/// Handles to the agent's metrics (see the module docs); cheap to use from the loops.
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    lease_ok: Counter,
    lease_failed: Counter,
    status_ok: Counter,
    status_failed: Counter,
    registrations: Counter,
    reconnects: Counter,
    sent_register: Counter,
    sent_status: Counter,
    sent_lease: Counter,
    last_renewal: Gauge<f64, AtomicU64>,
    node_not_found: Gauge,
    registered: Gauge,
    certificate_requests: Family<[(&'static str, &'static str); 2], Counter>,
    certificate_expiration: Gauge,
    health: HealthMetrics,
    #[cfg(any(feature = "grpc-tls", feature = "mqtt-tls"))]
    answers_refused: std::sync::Arc<edgebeat_transports::signing::AnswerRefusals>,
}

/// Why a certificate was asked for (`kind` of `edgebeat_agent_certificate_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateRequestKind {
    /// The first certificate, proved by the bootstrap token.
    Enrollment,
    /// A new certificate proved by the current one.
    Rotation,
}

impl AgentMetrics {
    /// Creates every metric of the agent speaking for `node` over `transport` (`grpc`,
    /// `mqtt` or `none`) and the registry that serves them.
    pub fn new(node: &str, transport: &str) -> (Self, Registry) {
        let mut registry = Registry::default();
        let renewals = Family::<Labels, Counter>::default();
        let reports = Family::<Labels, Counter>::default();
        let sent = Family::<Labels, Counter>::default();
        let get = |family: &Family<Labels, Counter>, key, value| {
            family.get_or_create(&[(key, value)]).clone()
        };
        let metrics = Self {
            lease_ok: get(&renewals, "result", "ok"),
            lease_failed: get(&renewals, "result", "failed"),
            status_ok: get(&reports, "result", "ok"),
            status_failed: get(&reports, "result", "failed"),
            registrations: Counter::default(),
            reconnects: Counter::default(),
            sent_register: get(&sent, "kind", "register"),
            sent_status: get(&sent, "kind", "status"),
            sent_lease: get(&sent, "kind", "lease"),
            last_renewal: Gauge::default(),
            node_not_found: Gauge::default(),
            registered: Gauge::default(),
            certificate_requests: Family::default(),
            certificate_expiration: Gauge::default(),
            health: HealthMetrics::default(),
            #[cfg(any(feature = "grpc-tls", feature = "mqtt-tls"))]
            answers_refused: std::sync::Arc::default(),
        };
        register_families(&mut registry, &metrics, [renewals, reports, sent]);
        registry.register(
            "edgebeat_agent",
            "The node this agent speaks for, its transport and version",
            Info::new([
                ("node", node.to_owned()),
                ("transport", transport.to_owned()),
                ("version", env!("CARGO_PKG_VERSION").to_owned()),
            ]),
        );
        // process_cpu_seconds_total, process_resident_memory_bytes…: the agent's own cost
        // on the board.
        registry.register_collector(Box::new(edgebeat_transports::observe::ProcessCollector));
        #[cfg(any(feature = "grpc-tls", feature = "mqtt-tls"))]
        registry.register_collector(Box::new(RefusedAnswers(metrics.answers_refused.clone())));
        (metrics, registry)
    }

    /// The counts of answers refused (`edgebeat_agent_answers_refused_total`), for every
    /// verifier of the gateway's answers the agent builds.
    #[cfg(any(feature = "grpc-tls", feature = "mqtt-tls"))]
    pub fn answers_refused(&self) -> std::sync::Arc<edgebeat_transports::signing::AnswerRefusals> {
        self.answers_refused.clone()
    }

    /// Records one Lease renewal tick; `ok` ones also set the last-renewal time to `now`.
    pub fn lease_renewal(&self, ok: bool, now: SystemTime) {
        if ok {
            self.lease_ok.inc();
            let seconds = UnixTime::from(now).seconds_f64();
            self.last_renewal.set(seconds);
        } else {
            self.lease_failed.inc();
        }
    }

    /// Records one status report (after its attempts).
    pub fn status_report(&self, ok: bool) {
        if ok {
            self.status_ok.inc();
        } else {
            self.status_failed.inc();
        }
    }

    /// Records a change of the registration: `true` counts a registration, `false` a lost
    /// one (`transport_reconnects_total`).
    pub fn registration_changed(&self, registered: bool) {
        self.registered.set(i64::from(registered));
        if registered {
            self.registrations.inc();
        } else {
            self.reconnects.inc();
        }
    }

    /// Counts one certificate request of `kind` that came to `result` (`issued`, `pending`,
    /// `refused`, `failed`).
    pub fn certificate_request(&self, kind: CertificateRequestKind, result: &'static str) {
        let kind = match kind {
            CertificateRequestKind::Enrollment => "enrollment",
            CertificateRequestKind::Rotation => "rotation",
        };
        self.certificate_requests
            .get_or_create(&[("kind", kind), ("result", result)])
            .inc();
    }

    /// Sets the node certificate's notAfter (Unix seconds).
    pub fn certificate_expires(&self, not_after: i64) {
        self.certificate_expiration.set(not_after);
    }

    /// Records that the gateway said this agent's Node was deleted (the gauge goes to 1).
    pub fn node_not_found(&self) {
        self.node_not_found.set(1);
    }

    /// Adds the encoded size of `message` to `messages_sent_bytes_total` of its kind.
    pub fn message_sent(&self, message: &AgentMessage) {
        if let Some(kind) = message.message_kind() {
            self.bytes_sent(kind, message.encoded_len());
        }
    }

    /// Adds `bytes` to `messages_sent_bytes_total{kind}` (for callers that measured the
    /// message before handing it over).
    pub fn bytes_sent(&self, kind: MessageKind, bytes: usize) {
        let counter = match kind {
            MessageKind::Register => &self.sent_register,
            MessageKind::Status => &self.sent_status,
            MessageKind::Lease => &self.sent_lease,
        };
        counter.inc_by(u64::try_from(bytes).unwrap_or(u64::MAX));
    }
}

impl AgentMetrics {
    /// Sets the health series from one status computation: `facts` as read, and the
    /// conditions computed from them as (type, True?).
    pub fn observe_health(
        &self,
        facts: &HostFacts,
        conditions: impl IntoIterator<Item = (&'static str, bool)>,
    ) {
        let h = &self.health;
        let mut present = Vec::new();
        for (type_, is_true) in conditions {
            present.push(type_);
            h.condition
                .get_or_create(&vec![("condition", type_.to_owned())])
                .set(i64::from(is_true));
        }
        for type_ in edgebeat_proto::NodeConditionType::HEALTH.map(|t| t.as_str()) {
            if !present.contains(&type_) {
                h.condition.remove(&vec![("condition", type_.to_owned())]);
            }
        }
        if let Some(psi) = &facts.psi {
            let resources = [("cpu", &psi.cpu), ("memory", &psi.memory), ("io", &psi.io)];
            for (resource, r) in resources {
                let Some(r) = r else { continue };
                for (line, l) in [("some", Some(r.some)), ("full", r.full)] {
                    let Some(l) = l else { continue };
                    for (window, avg) in [("10s", l.avg10), ("60s", l.avg60), ("300s", l.avg300)] {
                        let labels = vec![
                            ("resource", resource.to_owned()),
                            ("line", line.to_owned()),
                            ("window", window.to_owned()),
                        ];
                        h.stall.get_or_create(&labels).set(avg / 100.0);
                    }
                }
            }
        }
        for (name, mount) in [
            ("nodefs", &facts.nodefs_mount),
            ("imagefs", &facts.imagefs_mount),
        ] {
            if let Some(m) = mount {
                h.readonly
                    .get_or_create(&vec![("filesystem", name.to_owned())])
                    .set(i64::from(m.read_only));
            }
        }
        for z in &facts.thermal_zones {
            let celsius = z.temp_millicelsius as f64 / 1000.0;
            h.temperature
                .get_or_create(&vec![("zone", z.zone.clone()), ("type", z.kind.clone())])
                .set(celsius);
        }
        for d in &facts.cooling_devices {
            h.cooling
                .get_or_create(&vec![
                    ("device", d.device.clone()),
                    ("type", d.kind.clone()),
                ])
                .set(i64::try_from(d.cur_state).unwrap_or(i64::MAX));
        }
        if let Some(power) = facts.power {
            if let Some(t) = power.throttled {
                h.rpi_throttled.set(i64::from(t.0));
            }
            let now = power.under_voltage_alarm.unwrap_or(false)
                || power.throttled.is_some_and(|t| t.under_voltage());
            h.under_voltage.set(i64::from(now));
        }
        if let Some(sync) = facts.clock_sync {
            h.clock_synchronized.set(i64::from(sync.synchronized));
            h.clock_max_error.set(sync.max_error_us as f64 / 1e6);
        }
    }
}

/// The `kind` label of `messages_sent_bytes_total`: the proto's message kinds.
/// Registers every family of the module docs' table but `edgebeat_agent_info` and the
/// collectors: `renewals`, `reports` and `sent` are the labelled families `metrics`' counters
/// were taken from. A table, one family a line.
#[rustfmt::skip]
fn register_families(
    registry: &mut Registry,
    metrics: &AgentMetrics,
    [renewals, reports, sent]: [Family<Labels, Counter>; 3],
) {
    use edgebeat_transports::observe::register_family as family;
    let h = &metrics.health;
    family(registry, "edgebeat_agent_lease_renewals", "Lease renewal ticks by result: ok when the gateway wrote the Lease, failed when every attempt of the tick failed", None, renewals);
    family(registry, "edgebeat_agent_status_reports", "Node status reports by result: ok when the gateway wrote the status, failed when every attempt failed", None, reports);
    family(registry, "edgebeat_agent_registrations", "Times the gateway acknowledged this agent's Register", None, metrics.registrations.clone());
    family(registry, "edgebeat_agent_transport_reconnects", "Times the agent lost its registration with the gateway (gRPC connection lost, or its Node deleted); MQTT broker reconnects keep it and are not counted", None, metrics.reconnects.clone());
    family(registry, "edgebeat_agent_messages_sent", "Encoded protobuf AgentMessage bytes handed to the transport, by kind; transport framing excluded", Some(Unit::Bytes), sent);
    family(registry, "edgebeat_agent_last_lease_renewal_timestamp", "Wall-clock time of the last successful Lease renewal, seconds since the epoch (0 before the first)", Some(Unit::Seconds), metrics.last_renewal.clone());
    family(registry, "edgebeat_agent_registered", "1 while the gateway holds this agent's registration (Register acknowledged, the connection not lost since), else 0", None, metrics.registered.clone());
    family(registry, "edgebeat_agent_node_not_found", "1 once the gateway said this agent's Node was deleted: nothing more is sent, and the agent registers again only when restarted", None, metrics.node_not_found.clone());
    family(registry, "edgebeat_agent_certificate_requests", "Node certificate requests by kind (enrollment, rotation) and result (issued, pending, refused, failed)", None, metrics.certificate_requests.clone());
    family(registry, "edgebeat_agent_certificate_expiration_timestamp", "notAfter of the node certificate in use, seconds since the epoch (0 without a managed one)", Some(Unit::Seconds), metrics.certificate_expiration.clone());
    family(registry, "edgebeat_agent_node_condition", "1 while the node condition the agent reports is True, 0 while False", None, h.condition.clone());
    family(registry, "edgebeat_agent_pressure_stall_ratio", "PSI averages of /proc/pressure as a fraction of wall time", None, h.stall.clone());
    family(registry, "edgebeat_agent_filesystem_readonly", "1 while the filesystem holding rootDir (nodefs) or imageFsDir (imagefs) is read-only", None, h.readonly.clone());
    family(registry, "edgebeat_agent_thermal_zone_temperature", "Temperature of each thermal zone", Some(Unit::Celsius), h.temperature.clone());
    family(registry, "edgebeat_agent_cooling_device_state", "cur_state of each cooling device (0 = not cooling)", None, h.cooling.clone());
    family(registry, "edgebeat_agent_rpi_throttled", "The Raspberry Pi firmware's get_throttled word: bits 0-3 now, 16-19 since boot", None, h.rpi_throttled.clone());
    family(registry, "edgebeat_agent_under_voltage", "1 while the board's power supply is under-voltage", None, h.under_voltage.clone());
    family(registry, "edgebeat_agent_clock_synchronized", "1 while the kernel clock is NTP-synchronised", None, h.clock_synchronized.clone());
    family(registry, "edgebeat_agent_clock_max_error", "The kernel clock's maxerror estimate", Some(Unit::Seconds), h.clock_max_error.clone());
}

pub use edgebeat_proto::MessageKind;

/// Encodes `edgebeat_agent_answers_refused_total{reason}` from the shared counts at scrape
/// time.
#[cfg(any(feature = "grpc-tls", feature = "mqtt-tls"))]
#[derive(Debug)]
struct RefusedAnswers(std::sync::Arc<edgebeat_transports::signing::AnswerRefusals>);

#[cfg(any(feature = "grpc-tls", feature = "mqtt-tls"))]
impl prometheus_client::collector::Collector for RefusedAnswers {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use edgebeat_transports::signing::AnswerRefusals;
        use prometheus_client::encoding::EncodeMetric as _;
        use prometheus_client::metrics::TypedMetric as _;
        use prometheus_client::metrics::counter::ConstCounter;
        let mut family = encoder.encode_descriptor(
            "edgebeat_agent_answers_refused",
            "Answers from the gateway's side that did not verify and were not acted on, by reason",
            None,
            ConstCounter::<u64>::TYPE,
        )?;
        for (reason, count) in AnswerRefusals::REASONS.iter().zip(self.0.counts()) {
            ConstCounter::new(count).encode(family.encode_family(&[("reason", *reason)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn every_series_exists_from_the_start() {
        let (_, registry) = AgentMetrics::new("edge-01", "grpc");
        let out = text(&registry);
        for line in [
            "edgebeat_agent_lease_renewals_total{result=\"ok\"} 0",
            "edgebeat_agent_lease_renewals_total{result=\"failed\"} 0",
            "edgebeat_agent_status_reports_total{result=\"ok\"} 0",
            "edgebeat_agent_status_reports_total{result=\"failed\"} 0",
            "edgebeat_agent_registrations_total 0",
            "edgebeat_agent_transport_reconnects_total 0",
            "edgebeat_agent_messages_sent_bytes_total{kind=\"lease\"} 0",
            "# UNIT edgebeat_agent_messages_sent_bytes bytes",
            "edgebeat_agent_last_lease_renewal_timestamp_seconds 0.0",
            "edgebeat_agent_node_not_found 0",
            "edgebeat_agent_registered 0",
            "# TYPE edgebeat_agent info",
            "edgebeat_agent_info{node=\"edge-01\",transport=\"grpc\",version=\"",
        ] {
            assert!(out.contains(line), "missing {line:?} in\n{out}");
        }
    }

    #[test]
    fn health_signals_show_live_figures() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/rpi4-undervoltage");
        let facts = edgebeat_hw::read_host_facts(
            &edgebeat_hw::HostRoot::new(root),
            &edgebeat_hw::ReadOptions::default(),
        )
        .unwrap();
        let (m, registry) = AgentMetrics::new("edge-01", "mqtt");
        m.observe_health(
            &facts,
            [
                ("Ready", true),
                ("UnderVoltage", true),
                ("ThermalPressure", false),
            ],
        );
        let out = text(&registry);
        for line in [
            "edgebeat_agent_node_condition{condition=\"UnderVoltage\"} 1\n",
            "edgebeat_agent_node_condition{condition=\"ThermalPressure\"} 0\n",
            "edgebeat_agent_node_condition{condition=\"Ready\"} 1\n",
            "edgebeat_agent_under_voltage 1\n",
            "edgebeat_agent_rpi_throttled 327685\n", // 0x50005
            "edgebeat_agent_thermal_zone_temperature_celsius{zone=\"thermal_zone0\",type=\"cpu-thermal\"} 48.312\n",
            "edgebeat_agent_cooling_device_state{device=\"cooling_device0\",type=\"cpufreq-cpu0\"} 0\n",
            "edgebeat_agent_filesystem_readonly{filesystem=\"nodefs\"} 0\n",
            "edgebeat_agent_pressure_stall_ratio{resource=\"io\",line=\"full\",window=\"60s\"} 0.0058",
        ] {
            assert!(out.contains(line), "missing {line:?} in\n{out}");
        }
        // A condition the next computation no longer has loses its series.
        m.observe_health(&facts, [("Ready", true)]);
        assert!(!text(&registry).contains("condition=\"UnderVoltage\""));
    }

    #[test]
    fn renewals_set_the_timestamp_and_registration_changes_count() {
        let (m, registry) = AgentMetrics::new("edge-01", "mqtt");
        m.lease_renewal(true, UNIX_EPOCH + Duration::from_millis(1_700_000_000_500));
        m.lease_renewal(false, UNIX_EPOCH);
        m.registration_changed(true);
        m.registration_changed(false);
        m.registration_changed(true);
        m.node_not_found();
        let out = text(&registry);
        assert!(out.contains("edgebeat_agent_node_not_found 1\n"));
        assert!(out.contains("edgebeat_agent_last_lease_renewal_timestamp_seconds 1700000000.5\n"));
        assert!(out.contains("edgebeat_agent_lease_renewals_total{result=\"failed\"} 1\n"));
        assert!(out.contains("edgebeat_agent_registrations_total 2\n"));
        assert!(out.contains("edgebeat_agent_transport_reconnects_total 1\n"));
        assert!(out.contains("edgebeat_agent_registered 1\n"));
        m.registration_changed(false);
        assert!(text(&registry).contains("edgebeat_agent_registered 0\n"));
    }
}
