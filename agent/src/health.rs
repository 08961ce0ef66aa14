//! Health conditions beyond kubelet's four: the failures of small boards that a data-centre
//! kubelet never reports, computed from [`HostFacts`] like the pressure conditions.
//!
//! | type | True when | source of the rule |
//! |---|---|---|
//! | `SystemMemoryContentionPressure` | memory PSI `full` avg10 and avg60 ≥ threshold | KEP-5394 |
//! | `SystemDiskContentionPressure` | io PSI `full` avg10 and avg60 ≥ threshold | KEP-5394 |
//! | `ReadonlyFilesystem` | the filesystem of `rootDir` or `imageFsDir` is read-only | node-problem-detector |
//! | `ThermalPressure` | a thermal zone at or past a passive/hot/critical trip point or `thermalLimitCelsius`, or the CPU thermally throttled | kernel thermal sysfs |
//! | `UnderVoltage` | the board's power supply is under-voltage now | Raspberry Pi firmware |
//! | `ClockUnsynchronized` | the kernel clock is not NTP-synchronised | systemd `ntp_synced` |
//!
//! **Hysteresis.** As kubelet's eviction manager does for its pressure conditions, a
//! condition stays True until `evictionPressureTransitionPeriod` has passed since its
//! signal was last seen (`nodeConditionsLastObservedAt`,
//! `pkg/kubelet/eviction/eviction_manager.go`). For the PSI conditions the signal is KEP-5394's:
//! the condition turns True when avg60 *and* avg10 reach the threshold (pressure that is
//! high and still rising), and the hold lasts while avg60 stays at or above it (the KEP's
//! "trending lower" state), then for the transition period after.
//!
//! **Messages carry the figure of the transition.** A True message names what crossed
//! which limit ("cpu-thermal (thermal_zone0) at 82.7 °C, at or past its passive trip point
//! 80.0 °C"). The figure is the one seen when the condition last changed status or reason,
//! and is kept while neither changes: a live temperature in the message would change the
//! status every `nodeStatusUpdateFrequency` and send a full status report each time, over
//! a metered link. The live figures are on the agent's `/metrics`.
//!
//! **Unknown is absent.** A signal the host does not expose (no `/proc/pressure`, no thermal
//! zones, not a Raspberry Pi, the mount table unreadable) gives no condition at all: the
//! agent never writes `Unknown`, which belongs to the node lifecycle controller.

use std::collections::BTreeMap;
use std::time::Duration;

use edgebeat_hw::{HostFacts, Mount, PsiLine, ThermalZone, Throttled, TripKind};
use edgebeat_proto::NodeConditionType;

use crate::condition::{Condition, MessageCarry, within_transition_period};
use edgebeat_proto::{ConditionReason, ConditionStatus};

pub use crate::config::health::{
    DEFAULT_CONTENTION_THRESHOLD, HealthSettings, OutOfRange, check_thermal_limit, check_threshold,
};

/// What a health check saw in one set of facts.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    /// The signal is present now (what `observed` remembers).
    signal: bool,
    /// Reason and message when the condition is True now (PSI: avg10 too; others: the
    /// signal); `None` otherwise.
    sets: Option<(ConditionReason, String)>,
    /// Reason and message when False.
    fine: (ConditionReason, String),
}

/// Computes the enabled health conditions for `facts` at boot-clock time `now` (see the
/// module docs), in [`NodeConditionType::HEALTH`] order, carrying transitions
/// and messages over from `previous` and updating `observed` (signal type → when last seen).
pub fn conditions(
    facts: &HostFacts,
    settings: &HealthSettings,
    period: Duration,
    previous: &[Condition],
    observed: &mut BTreeMap<NodeConditionType, Duration>,
    now: Duration,
) -> Vec<Condition> {
    let checks: [(NodeConditionType, Option<Seen>); 6] = [
        (
            NodeConditionType::SystemMemoryContentionPressure,
            contention(
                "memory",
                psi_full(facts, |p| p.memory.as_ref()),
                settings.system_memory_contention_threshold,
                [
                    ConditionReason::KubeletHasSystemMemoryContentionPressure,
                    ConditionReason::KubeletHasNoSystemMemoryContentionPressure,
                ],
            ),
        ),
        (
            NodeConditionType::SystemDiskContentionPressure,
            contention(
                "io",
                psi_full(facts, |p| p.io.as_ref()),
                settings.system_disk_contention_threshold,
                [
                    ConditionReason::KubeletHasSystemDiskContentionPressure,
                    ConditionReason::KubeletHasNoSystemDiskContentionPressure,
                ],
            ),
        ),
        (
            NodeConditionType::ReadonlyFilesystem,
            settings
                .readonly_filesystem
                .then(|| readonly(facts))
                .flatten(),
        ),
        (
            NodeConditionType::ThermalPressure,
            settings
                .thermal
                .then(|| thermal(facts, settings.thermal_limit_celsius))
                .flatten(),
        ),
        (
            NodeConditionType::UnderVoltage,
            settings
                .under_voltage
                .then(|| under_voltage(facts))
                .flatten(),
        ),
        (
            NodeConditionType::ClockUnsynchronized,
            settings.clock_sync.then(|| clock(facts)).flatten(),
        ),
    ];
    let mut out = Vec::new();
    for (type_, seen) in checks {
        let Some(seen) = seen else {
            observed.remove(&type_);
            continue;
        };
        if seen.signal {
            observed.insert(type_, now);
        }
        let before = previous.iter().find(|c| c.type_ == type_);
        let was_true = before.is_some_and(|c| c.status == ConditionStatus::True);
        let held = within_transition_period(observed.get(&type_).copied(), now, period);
        let condition = match (seen.sets, before) {
            (Some(sets), _) => carried(before, type_, ConditionStatus::True, sets, now),
            // Held: the reason and message of the crossing stay.
            (None, Some(before)) if was_true && held => before.clone(),
            (None, _) => carried(before, type_, ConditionStatus::False, seen.fine, now),
        };
        out.push(condition);
    }
    out
}

/// The health condition of `type_` following `before`: its transition time while the
/// status holds, and its message (with the figure of the transition) while status and
/// reason hold ([`MessageCarry::KeptWhileReasonHolds`]).
fn carried(
    before: Option<&Condition>,
    type_: NodeConditionType,
    status: ConditionStatus,
    (reason, message): (ConditionReason, String),
    now: Duration,
) -> Condition {
    Condition::next(
        before,
        type_,
        status,
        reason,
        message,
        MessageCarry::KeptWhileReasonHolds,
        now,
    )
}

fn psi_full(
    facts: &HostFacts,
    resource: impl Fn(&edgebeat_hw::Psi) -> Option<&edgebeat_hw::PsiResource>,
) -> Option<PsiLine> {
    resource(facts.psi.as_ref()?)?.full
}

/// KEP-5394: `full` PSI of `resource` against `threshold` (a fraction), with the True and
/// False reasons of its condition. `None` when off (threshold 0) or when the kernel gives no
/// `full` line.
fn contention(
    resource: &str,
    full: Option<PsiLine>,
    threshold: f64,
    [pressure, no_pressure]: [ConditionReason; 2],
) -> Option<Seen> {
    if threshold <= 0.0 {
        return None;
    }
    let full = full?;
    let limit = threshold * 100.0;
    let sets = full.avg60 >= limit && full.avg10 >= limit;
    Some(Seen {
        signal: full.avg60 >= limit,
        sets: sets.then(|| {
            let message = format!(
                "{resource} PSI full avg10 {:.2}% and avg60 {:.2}% at or above the threshold {limit}%",
                full.avg10, full.avg60
            );
            (pressure, message)
        }),
        fine: (
            no_pressure,
            format!("{resource} PSI full below the threshold {limit}%"),
        ),
    })
}

/// node-problem-detector's `ReadonlyFilesystem`, for the filesystems of `rootDir` and
/// `imageFsDir`. `None` when the mount table was unreadable.
fn readonly(facts: &HostFacts) -> Option<Seen> {
    let mounts: Vec<(&str, &Mount)> = [
        ("nodefs", facts.nodefs_mount.as_ref()),
        ("imagefs", facts.imagefs_mount.as_ref()),
    ]
    .into_iter()
    .filter_map(|(name, m)| Some((name, m?)))
    .collect();
    if mounts.is_empty() {
        return None;
    }
    let read_only: Vec<String> = mounts
        .iter()
        .filter(|(_, m)| m.read_only)
        .map(|(name, m)| {
            format!(
                "{name} ({} {} on {}) is read-only",
                m.fs_type,
                m.source,
                m.mount_point.display()
            )
        })
        .collect();
    Some(Seen {
        signal: !read_only.is_empty(),
        sets: (!read_only.is_empty())
            .then(|| (ConditionReason::FilesystemIsReadOnly, read_only.join("; "))),
        fine: (
            ConditionReason::FilesystemIsNotReadOnly,
            "Filesystem is not read-only".into(),
        ),
    })
}

fn celsius(millicelsius: i64) -> f64 {
    // Thermal sysfs values fit f64 exactly (|value| < 2^53).
    millicelsius as f64 / 1000.0
}

/// The lowest trip point of `zone` that means "too hot": passive, hot or critical. Active
/// trips (a fan) are normal operation; a temperature ≤ 0 is an unset trip (x86_pkg_temp's
/// writable trips read 0 until set).
fn hot_trip(zone: &ThermalZone) -> Option<(TripKind, i64)> {
    zone.trip_points
        .iter()
        .filter(|t| t.kind != TripKind::Active && t.temp_millicelsius > 0)
        .map(|t| (t.kind, t.temp_millicelsius))
        .min_by_key(|(_, temp)| *temp)
}

/// `ThermalPressure`: thermal zones against their trip points and `limit`, cooling devices
/// that slow the CPU, and the Raspberry Pi firmware's soft temperature limit. `None` when the
/// host has none of those.
fn thermal(facts: &HostFacts, limit: Option<f64>) -> Option<Seen> {
    let soft_limit = facts
        .power
        .and_then(|p| p.throttled)
        .map(Throttled::soft_temp_limit);
    if facts.thermal_zones.is_empty() && facts.cooling_devices.is_empty() && soft_limit.is_none() {
        return None;
    }
    let past_trip = facts.thermal_zones.iter().find_map(|z| {
        let (kind, trip) = hot_trip(z)?;
        (z.temp_millicelsius >= trip).then(|| {
            format!(
                "{} ({}) at {:.1} °C, at or past its {} trip point {:.1} °C",
                z.kind,
                z.zone,
                celsius(z.temp_millicelsius),
                kind.as_str(),
                celsius(trip)
            )
        })
    });
    let past_limit = limit.and_then(|limit| {
        facts
            .thermal_zones
            .iter()
            .find(|z| celsius(z.temp_millicelsius) >= limit)
            .map(|z| {
                format!(
                    "{} ({}) at {:.1} °C, at or past thermalLimitCelsius {limit} °C",
                    z.kind,
                    z.zone,
                    celsius(z.temp_millicelsius)
                )
            })
    });
    let throttled = facts
        .cooling_devices
        .iter()
        .find(|d| d.throttles_cpu() && d.cur_state > 0)
        .map(|d| {
            format!(
                "the CPU is throttled by {} ({}) at state {} of {}",
                d.kind, d.device, d.cur_state, d.max_state
            )
        })
        .or_else(|| {
            soft_limit.unwrap_or(false).then(|| {
                "the firmware's soft temperature limit is active (the CPU is capped)".to_owned()
            })
        });
    let problem = past_trip
        .map(|m| (ConditionReason::TemperatureAboveTripPoint, m))
        .or_else(|| past_limit.map(|m| (ConditionReason::TemperatureAboveLimit, m)))
        .or_else(|| throttled.map(|m| (ConditionReason::CpuThermallyThrottled, m)));
    let fine = match limit {
        Some(limit) => format!(
            "no thermal zone at a passive, hot or critical trip point or {limit} °C; the CPU is not thermally throttled"
        ),
        None => "no thermal zone at a passive, hot or critical trip point; the CPU is not thermally throttled".to_owned(),
    };
    Some(Seen {
        signal: problem.is_some(),
        sets: problem,
        fine: (ConditionReason::TemperatureNormal, fine),
    })
}

/// The set bits of a Raspberry Pi throttled word, in words: "under-voltage, throttled".
fn describe(t: Throttled, since_boot: bool) -> String {
    let bits = if since_boot {
        [
            (t.under_voltage_occurred(), "under-voltage"),
            (t.frequency_capped_occurred(), "frequency capping"),
            (t.throttled_occurred(), "throttling"),
            (t.soft_temp_limit_occurred(), "soft temperature limit"),
        ]
    } else {
        [
            (t.under_voltage(), "under-voltage"),
            (t.frequency_capped(), "frequency capped"),
            (t.throttled(), "throttled"),
            (t.soft_temp_limit(), "soft temperature limit"),
        ]
    };
    let set: Vec<&str> = bits.iter().filter(|(on, _)| *on).map(|(_, w)| *w).collect();
    if set.is_empty() {
        "none".to_owned()
    } else {
        set.join(", ")
    }
}

/// `UnderVoltage`: the `rpi_volt` alarm or firmware bit 0. False says whether under-voltage
/// occurred since boot (bit 16). `None` on boards without either source.
fn under_voltage(facts: &HostFacts) -> Option<Seen> {
    let power = facts.power?;
    let now = power.under_voltage_alarm.unwrap_or(false)
        || power.throttled.is_some_and(Throttled::under_voltage);
    let word = power.throttled.map(|t| {
        format!(
            "firmware throttled=0x{:x}: now {}; since boot {}",
            t.0,
            describe(t, false),
            describe(t, true)
        )
    });
    let source = match (power.under_voltage_alarm, &word) {
        (Some(true), Some(w)) => format!("rpi_volt in0_lcrit_alarm=1, {w}"),
        (Some(true), None) => "rpi_volt in0_lcrit_alarm=1".to_owned(),
        (_, Some(w)) => w.clone(),
        (_, None) => "rpi_volt in0_lcrit_alarm=0".to_owned(),
    };
    let occurred = power
        .throttled
        .is_some_and(Throttled::under_voltage_occurred);
    Some(Seen {
        signal: now,
        sets: now.then(|| {
            (
                ConditionReason::UnderVoltageDetected,
                format!("the power supply is under-voltage ({source})"),
            )
        }),
        fine: if occurred {
            (
                ConditionReason::UnderVoltageOccurred,
                format!("no under-voltage now, but it occurred since boot ({source})"),
            )
        } else {
            (
                ConditionReason::SufficientVoltage,
                "the power supply voltage is sufficient".into(),
            )
        },
    })
}

/// `ClockUnsynchronized`: the kernel's NTP state. `None` when `adjtimex` failed.
fn clock(facts: &HostFacts) -> Option<Seen> {
    let sync = facts.clock_sync?;
    let max_error_s = sync.max_error_us as f64 / 1e6;
    Some(Seen {
        signal: !sync.synchronized,
        sets: (!sync.synchronized).then(|| {
            (
                ConditionReason::NtpNotSynchronized,
                format!(
                    "the kernel clock is not synchronized (adjtimex maxerror {max_error_s:.1} s); Lease and status times come from the gateway's clock"
                ),
            )
        }),
        fine: (ConditionReason::NtpSynchronized, "the kernel clock is synchronized".into()),
    })
}

#[cfg(test)]
mod tests;
