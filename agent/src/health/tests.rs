use super::*;
use edgebeat_hw::{
    ClockSync, CoolingDevice, HostRoot, PowerFacts, Psi, PsiResource, ReadOptions, TripPoint,
};

const PERIOD: Duration = Duration::from_secs(300);

/// The healthy Raspberry Pi 4 tree, with a synchronised clock.
fn healthy() -> HostFacts {
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/rpi4-cgroup1");
    let mut facts =
        edgebeat_hw::read_host_facts(&HostRoot::new(root), &ReadOptions::default()).unwrap();
    facts.clock_sync = Some(ClockSync {
        synchronized: true,
        max_error_us: 80_000,
    });
    facts
}

/// Runs the checks over `steps` of (seconds since boot, facts), returning each step's
/// conditions.
fn run(settings: &HealthSettings, steps: &[(u64, HostFacts)]) -> Vec<Vec<Condition>> {
    let mut observed = BTreeMap::new();
    let mut previous = Vec::new();
    let mut out = Vec::new();
    for (t, facts) in steps {
        let now = Duration::from_secs(*t);
        previous = conditions(facts, settings, PERIOD, &previous, &mut observed, now);
        out.push(previous.clone());
    }
    out
}

fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn status_of(conditions: &[Condition], type_: &str) -> Option<(ConditionStatus, &'static str)> {
    get(conditions, type_).map(|c| (c.status, c.reason.as_str()))
}

fn memory_psi(facts: &mut HostFacts, avg10: f64, avg60: f64) {
    let line = PsiLine {
        avg10,
        avg60,
        avg300: 0.0,
        total_us: 0,
    };
    let psi = facts.psi.get_or_insert(Psi {
        cpu: None,
        memory: None,
        io: None,
    });
    psi.memory = Some(PsiResource {
        some: line,
        full: Some(line),
    });
}

#[test]
fn a_healthy_board_reports_every_condition_false() {
    let got = &run(&HealthSettings::default(), &[(100, healthy())])[0];
    let types: Vec<NodeConditionType> = got.iter().map(|c| c.type_).collect();
    assert_eq!(types, NodeConditionType::HEALTH);
    for c in got {
        assert_eq!(c.status, ConditionStatus::False, "{c:?}");
    }
    assert_eq!(
        status_of(got, "ReadonlyFilesystem"),
        Some((ConditionStatus::False, "FilesystemIsNotReadOnly"))
    );
}

#[test]
fn psi_follows_kep_5394_and_holds_for_the_transition_period() {
    let at = |avg10, avg60| {
        let mut f = healthy();
        memory_psi(&mut f, avg10, avg60);
        f
    };
    let steps = [
        (0, at(30.0, 5.0)),   // avg10 alone: a spike, not contention
        (10, at(30.0, 12.0)), // both ≥ 10 %: True
        (20, at(5.0, 14.0)),  // avg10 down, avg60 still up: held ("trending lower")
        (30, at(2.0, 8.0)),   // avg60 below: held for the period since it was last up
        (319, at(2.0, 3.0)),  // 299 s after: still held
        (320, at(2.0, 3.0)),  // 300 s: False
    ];
    let got = run(&HealthSettings::default(), &steps);
    let status: Vec<ConditionStatus> = got
        .iter()
        .map(|c| get(c, "SystemMemoryContentionPressure").unwrap().status)
        .collect();
    use ConditionStatus::{False, True};
    assert_eq!(status, [False, True, True, True, True, False]);
    let set = get(&got[1], "SystemMemoryContentionPressure").unwrap();
    assert_eq!(
        set.reason.as_str(),
        "KubeletHasSystemMemoryContentionPressure"
    );
    assert_eq!(
        set.message,
        "memory PSI full avg10 30.00% and avg60 12.00% at or above the threshold 10%"
    );
    // The figure of the crossing stays while True.
    let held = get(&got[2], "SystemMemoryContentionPressure").unwrap();
    assert_eq!(held.message, set.message);
    assert_eq!(held.last_transition, Duration::from_secs(10));
    assert_eq!(
        get(&got[5], "SystemMemoryContentionPressure")
            .unwrap()
            .reason
            .as_str(),
        "KubeletHasNoSystemMemoryContentionPressure"
    );
    // io stayed low throughout.
    assert_eq!(
        status_of(&got[1], "SystemDiskContentionPressure"),
        Some((False, "KubeletHasNoSystemDiskContentionPressure"))
    );
}

#[test]
fn unavailable_or_disabled_signals_give_no_condition() {
    let mut bare = healthy();
    bare.psi = None;
    bare.nodefs_mount = None;
    bare.thermal_zones.clear();
    bare.cooling_devices.clear();
    bare.power = None;
    bare.clock_sync = None;
    assert_eq!(run(&HealthSettings::default(), &[(1, bare)])[0], vec![]);

    assert_eq!(run(&HealthSettings::off(), &[(1, healthy())])[0], vec![]);
}

#[test]
fn a_read_only_filesystem_names_itself() {
    let mut f = healthy();
    if let Some(m) = f.nodefs_mount.as_mut() {
        m.read_only = true;
    }
    let got = &run(&HealthSettings::default(), &[(1, f)])[0];
    let c = get(got, "ReadonlyFilesystem").unwrap();
    assert_eq!(
        (c.status, c.reason.as_str()),
        (ConditionStatus::True, "FilesystemIsReadOnly")
    );
    assert_eq!(c.message, "nodefs (ext4 /dev/root on /) is read-only");
}

#[test]
fn thermal_rules() {
    let zone = |temp, trips: &[(TripKind, i64)]| ThermalZone {
        zone: "thermal_zone0".into(),
        kind: "cpu-thermal".into(),
        temp_millicelsius: temp,
        trip_points: trips
            .iter()
            .map(|&(kind, temp_millicelsius)| TripPoint {
                kind,
                temp_millicelsius,
            })
            .collect(),
    };
    let reason = |zones: Vec<ThermalZone>, cooling: Vec<CoolingDevice>, limit| {
        let mut f = healthy();
        f.thermal_zones = zones;
        f.cooling_devices = cooling;
        let settings = HealthSettings {
            thermal_limit_celsius: limit,
            ..HealthSettings::default()
        };
        let got = run(&settings, &[(1, f)]).remove(0);
        status_of(&got, "ThermalPressure")
    };
    use ConditionStatus::{False, True};
    let passive = [(TripKind::Active, 50_000), (TripKind::Passive, 80_000)];
    assert_eq!(
        reason(vec![zone(79_999, &passive)], vec![], None),
        Some((False, "TemperatureNormal")),
        "an active trip (a fan) is normal"
    );
    assert_eq!(
        reason(vec![zone(80_000, &passive)], vec![], None),
        Some((True, "TemperatureAboveTripPoint"))
    );
    assert_eq!(
        reason(vec![zone(41_000, &[(TripKind::Passive, 0)])], vec![], None),
        Some((False, "TemperatureNormal")),
        "a trip at 0 is unset"
    );
    assert_eq!(
        reason(vec![zone(75_000, &passive)], vec![], Some(75.0)),
        Some((True, "TemperatureAboveLimit"))
    );
    let cooling = |kind: &str, cur_state| CoolingDevice {
        device: "cooling_device0".into(),
        kind: kind.into(),
        cur_state,
        max_state: 4,
    };
    assert_eq!(
        reason(vec![], vec![cooling("cpufreq-cpu0", 2)], None),
        Some((True, "CPUThermallyThrottled"))
    );
    assert_eq!(
        reason(vec![], vec![cooling("pwm-fan", 3)], None),
        Some((False, "TemperatureNormal"))
    );
}

#[test]
fn a_live_temperature_does_not_change_the_condition() {
    let at = |temp| {
        let mut f = healthy();
        f.thermal_zones[0].temp_millicelsius = temp;
        f
    };
    let got = run(
        &HealthSettings::default(),
        &[(0, at(81_000)), (10, at(83_500)), (20, at(86_000))],
    );
    let c: Vec<&Condition> = got
        .iter()
        .map(|c| get(c, "ThermalPressure").unwrap())
        .collect();
    assert_eq!(
        c[0].message,
        "cpu-thermal (thermal_zone0) at 81.0 °C, at or past its passive trip point 80.0 °C"
    );
    assert_eq!(c[1], c[0]);
    assert_eq!(c[2], c[0]);
}

#[test]
fn under_voltage_now_and_since_boot() {
    let with = |alarm: Option<bool>, word: Option<u32>| {
        let mut f = healthy();
        f.power = Some(PowerFacts {
            under_voltage_alarm: alarm,
            throttled: word.map(Throttled),
        });
        let got = run(&HealthSettings::default(), &[(1, f)]).remove(0);
        get(&got, "UnderVoltage").cloned().unwrap()
    };
    let now = with(Some(true), Some(0x50005));
    assert_eq!(
        (now.status, now.reason.as_str()),
        (ConditionStatus::True, "UnderVoltageDetected")
    );
    assert_eq!(
        now.message,
        "the power supply is under-voltage (rpi_volt in0_lcrit_alarm=1, firmware throttled=0x50005: now under-voltage, throttled; since boot under-voltage, throttling)"
    );
    let past = with(Some(false), Some(0x50000));
    assert_eq!(
        (past.status, past.reason.as_str()),
        (ConditionStatus::False, "UnderVoltageOccurred")
    );
    let fine = with(Some(false), None);
    assert_eq!(
        (fine.status, fine.reason.as_str()),
        (ConditionStatus::False, "SufficientVoltage")
    );
    assert_eq!(with(None, Some(0x1)).status, ConditionStatus::True);
}

#[test]
fn an_unsynchronized_clock() {
    let mut f = healthy();
    f.clock_sync = Some(ClockSync {
        synchronized: false,
        max_error_us: 16_000_000,
    });
    let got = &run(&HealthSettings::default(), &[(1, f)])[0];
    let c = get(got, "ClockUnsynchronized").unwrap();
    assert_eq!(
        (c.status, c.reason.as_str()),
        (ConditionStatus::True, "NTPNotSynchronized")
    );
    assert!(c.message.contains("maxerror 16.0 s"), "{}", c.message);
}

#[test]
fn thresholds_are_fractions() {
    assert_eq!(check_threshold(0.0), Ok(0.0));
    assert_eq!(check_threshold(1.0), Ok(1.0));
    for bad in [10.0, -0.1] {
        let e = check_threshold(bad).unwrap_err();
        assert!(
            e.value == bad && e.expected.starts_with("a fraction of time"),
            "{e}"
        );
    }
    let e = check_thermal_limit(0.0).unwrap_err();
    assert!(
        e.value == 0.0 && e.expected.starts_with("degrees Celsius"),
        "{e}"
    );
    assert_eq!(check_thermal_limit(80.0), Ok(80.0));
}
