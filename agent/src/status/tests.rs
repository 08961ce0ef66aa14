use super::*;
use edgebeat_hw::{CgroupMode, FsStats, HugePages, MemoryFacts, PidStats};

const GI: u64 = 1 << 30;

fn facts() -> HostFacts {
    HostFacts {
        boot_id: "5b3f0e2a-9c41-4d7e-8f26-1a7c3e9d0b54".into(),
        machine_id: Some("m".into()),
        system_uuid: None,
        kernel_version: Some("6.1.0".into()),
        os_image: "Debian GNU/Linux 12 (bookworm)".into(),
        hostname: Some("Edge-01".into()),
        architecture: "arm64",
        operating_system: "linux",
        logical_cpus: 4,
        memory: MemoryFacts {
            total_bytes: 8 * GI,
            working_set_bytes: Some(GI),
            available_bytes: Some(7 * GI),
        },
        hugepages: vec![HugePages {
            page_size_bytes: 2 << 20,
            pages: 64,
        }],
        cgroup: CgroupMode::V2,
        nodefs: Some(FsStats {
            capacity_bytes: 100 * GI,
            available_bytes: 50 * GI,
            inodes: 1000,
            inodes_free: 900,
        }),
        imagefs: None,
        pid: Some(PidStats {
            max_pid: 32768,
            running_tasks: 300,
        }),
        local_ips: vec!["10.0.3.7".parse().unwrap()],
        default_route_ip: Some("10.0.3.7".parse().unwrap()),
        psi: None,
        nodefs_mount: None,
        imagefs_mount: None,
        thermal_zones: vec![],
        cooling_devices: vec![],
        power: None,
        clock_sync: None,
    }
}

fn cond<'a>(s: &'a ComputedStatus, t: &str) -> &'a Condition {
    s.conditions.iter().find(|c| c.type_ == t).unwrap()
}

const T0: Duration = Duration::from_secs(100);

#[test]
fn capacity_and_allocatable() {
    let s = compute(&facts(), &AgentConfig::default(), None, T0);
    let cap: Vec<_> = s
        .capacity
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        cap,
        [
            ("cpu", "4"),
            ("ephemeral-storage", "100Gi"),
            ("hugepages-2Mi", "128Mi"),
            ("memory", "8Gi"),
            ("pods", "0")
        ]
    );
    assert_eq!(s.allocatable["pods"], "0", "no runtime: no pods by default");
    // memory: 8Gi − 100Mi eviction − 128Mi hugepages; storage: 100Gi − int64(100Gi × float32(0.1)).
    assert_eq!(
        s.allocatable["memory"],
        format_binary(8 * GI - (100 << 20) - (128 << 20))
    );
    assert_eq!(
        s.allocatable["ephemeral-storage"],
        ((100 * GI) - (100.0 * GI as f64 * f64::from(0.1f32)) as u64).to_string()
    );
    assert_eq!(s.allocatable["cpu"], "4");
}

#[test]
fn reservations_and_pods_per_core() {
    let config = AgentConfig {
        system_reserved: BTreeMap::from([("cpu".into(), 500), ("memory".into(), GI)]),
        kube_reserved: BTreeMap::from([("cpu".into(), 250)]),
        max_pods: 110,
        pods_per_core: 10,
        ..AgentConfig::default()
    };
    let s = compute(&facts(), &config, None, T0);
    assert_eq!(s.allocatable["cpu"], "3250m");
    assert_eq!(s.capacity["pods"], "40");
    assert_eq!(
        s.allocatable["memory"],
        format_binary(7 * GI - (100 << 20) - (128 << 20))
    );
}

#[test]
fn conditions_have_kubelets_reasons_and_ready_last() {
    let s = compute(&facts(), &AgentConfig::default(), None, T0);
    let got: Vec<_> = s
        .conditions
        .iter()
        .map(|c| {
            (
                c.type_.as_str(),
                c.status,
                c.reason.as_str(),
                c.message.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "MemoryPressure",
                ConditionStatus::False,
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available"
            ),
            (
                "DiskPressure",
                ConditionStatus::False,
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure"
            ),
            (
                "PIDPressure",
                ConditionStatus::False,
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available"
            ),
            (
                "Ready",
                ConditionStatus::True,
                "KubeletReady",
                "kubelet is posting ready status"
            ),
        ]
    );
    assert!(s.conditions.iter().all(|c| c.last_transition == T0));
}

#[test]
fn pressure_table() {
    struct Case {
        name: &'static str,
        tweak: fn(&mut HostFacts, &mut AgentConfig),
        want: [ConditionStatus; 3],
    }
    use ConditionStatus::{False as F, True as T};
    let cases = [
        Case {
            name: "healthy",
            tweak: |_, _| {},
            want: [F, F, F],
        },
        Case {
            name: "memory below 100Mi",
            tweak: |f, _| f.memory.available_bytes = Some(99 << 20),
            want: [T, F, F],
        },
        Case {
            name: "memory exactly 100Mi is not below",
            tweak: |f, _| f.memory.available_bytes = Some(100 << 20),
            want: [F, F, F],
        },
        Case {
            name: "memory unobservable",
            tweak: |f, _| f.memory.available_bytes = None,
            want: [F, F, F],
        },
        Case {
            name: "nodefs below 10%",
            tweak: |f, _| f.nodefs.as_mut().unwrap().available_bytes = 9 * GI,
            want: [F, T, F],
        },
        Case {
            name: "nodefs inodes below 5%",
            tweak: |f, _| f.nodefs.as_mut().unwrap().inodes_free = 49,
            want: [F, T, F],
        },
        Case {
            name: "imagefs below 15%",
            tweak: |f, _| {
                f.imagefs = Some(FsStats {
                    capacity_bytes: 100,
                    available_bytes: 14,
                    inodes: 10,
                    inodes_free: 10,
                })
            },
            want: [F, T, F],
        },
        Case {
            name: "no pid default threshold",
            tweak: |f, _| f.pid.as_mut().unwrap().running_tasks = 32767,
            want: [F, F, F],
        },
        Case {
            name: "pid.available threshold",
            tweak: |f, c| {
                c.eviction_hard
                    .insert(EvictionSignal::PidAvailable, Amount::Percentage(0.1));
                f.pid.as_mut().unwrap().running_tasks = 30000;
            },
            want: [F, F, T],
        },
        Case {
            name: "evictionHard replaces defaults",
            tweak: |f, c| {
                c.eviction_hard =
                    BTreeMap::from([(EvictionSignal::MemoryAvailable, Amount::Absolute(GI))]);
                f.nodefs.as_mut().unwrap().available_bytes = 0;
                f.memory.available_bytes = Some(GI - 1);
            },
            want: [T, F, F],
        },
    ];
    for case in cases {
        let mut f = facts();
        let mut c = AgentConfig::default();
        (case.tweak)(&mut f, &mut c);
        let s = compute(&f, &c, None, T0);
        let got = [
            cond(&s, "MemoryPressure").status,
            cond(&s, "DiskPressure").status,
            cond(&s, "PIDPressure").status,
        ];
        assert_eq!(got, case.want, "{}", case.name);
    }
}

#[test]
fn pressure_is_held_for_the_transition_period() {
    let config = AgentConfig::default(); // evictionPressureTransitionPeriod 5m
    let mut low = facts();
    low.memory.available_bytes = Some(50 << 20);
    let s1 = compute(&low, &config, None, T0);
    assert_eq!(cond(&s1, "MemoryPressure").status, ConditionStatus::True);
    let s2 = compute(&facts(), &config, Some(&s1), T0 + Duration::from_secs(299));
    assert_eq!(
        cond(&s2, "MemoryPressure").status,
        ConditionStatus::True,
        "held within the period"
    );
    assert_eq!(cond(&s2, "MemoryPressure").last_transition, T0);
    let s3 = compute(&facts(), &config, Some(&s2), T0 + Duration::from_secs(300));
    assert_eq!(
        cond(&s3, "MemoryPressure").status,
        ConditionStatus::False,
        "released after it"
    );
    assert_eq!(
        cond(&s3, "MemoryPressure").last_transition,
        T0 + Duration::from_secs(300)
    );
    assert_eq!(
        cond(&s3, "Ready").last_transition,
        T0,
        "Ready unchanged keeps its transition"
    );
    assert!(has_changed(&s2, &s3));
}

#[test]
fn ready_false_when_capacity_is_missing() {
    let mut f = facts();
    f.nodefs = None;
    let s = compute(&f, &AgentConfig::default(), None, T0);
    let ready = s.ready().unwrap();
    assert_eq!(
        (ready.status, ready.reason.as_str()),
        (ConditionStatus::False, "KubeletNotReady")
    );
    assert_eq!(
        ready.message,
        "missing node capacity for resources: ephemeral-storage"
    );
}

#[test]
fn unchanged_facts_are_not_a_change_but_new_facts_are() {
    let config = AgentConfig::default();
    let s1 = compute(&facts(), &config, None, T0);
    let s2 = compute(&facts(), &config, Some(&s1), T0 + Duration::from_secs(10));
    assert!(!has_changed(&s1, &s2), "time alone is not a change");
    let mut f = facts();
    f.boot_id = "new".into();
    assert!(has_changed(&s2, &compute(&f, &config, Some(&s2), T0)));
    let mut f = facts();
    f.nodefs.as_mut().unwrap().capacity_bytes += 1;
    assert!(
        has_changed(&s2, &compute(&f, &config, Some(&s2), T0)),
        "capacity counts"
    );
}

#[test]
fn addresses_follow_kubelets_order() {
    let mut config = AgentConfig::default();
    let s = compute(&facts(), &config, None, T0);
    assert_eq!(
        s.addresses,
        [
            ("InternalIP", "10.0.3.7".to_owned()),
            ("Hostname", "edge-01".to_owned())
        ]
    );
    config.node_ip = Some("192.168.7.9".parse().unwrap());
    let s = compute(&facts(), &config, None, T0);
    assert_eq!(s.addresses[0], ("InternalIP", "192.168.7.9".to_owned()));
    let mut f = facts();
    f.default_route_ip = None;
    let s = compute(&f, &AgentConfig::default(), None, T0);
    assert_eq!(s.addresses, [("Hostname", "edge-01".to_owned())]);
    // nodeName is kubelet's --hostname-override: it names the Hostname address too.
    let named = AgentConfig {
        node_name: Some("judge-node-0".parse().unwrap()),
        ..AgentConfig::default()
    };
    let s = compute(&f, &named, None, T0);
    assert_eq!(s.addresses, [("Hostname", "judge-node-0".to_owned())]);
}

#[test]
fn proto_carries_relative_transitions() {
    let s = compute(&facts(), &AgentConfig::default(), None, T0);
    let p = s.to_proto(T0 + Duration::from_millis(42_900));
    assert!(
        p.conditions
            .iter()
            .all(|c| c.seconds_since_transition == 42)
    );
    assert_eq!(p.node_info.unwrap().kubelet_version, KUBELET_VERSION);
}

#[test]
fn the_journal_keeps_each_transition_with_its_time_until_written() {
    let config = AgentConfig::default();
    let mut low = facts();
    low.memory.available_bytes = Some(50 << 20);
    let mut journal = Journal::default();
    let s0 = compute(&facts(), &config, None, T0);
    let s1 = compute(&low, &config, Some(&s0), T0 + Duration::from_secs(10));
    journal.observe(&s0, &s1, T0 + Duration::from_secs(10));
    // Unchanged: nothing recorded.
    let s2 = compute(&low, &config, Some(&s1), T0 + Duration::from_secs(20));
    journal.observe(&s1, &s2, T0 + Duration::from_secs(20));
    let s3 = compute(&facts(), &config, Some(&s2), T0 + Duration::from_secs(320));
    journal.observe(&s2, &s3, T0 + Duration::from_secs(320));
    let wire = journal.to_proto(T0 + Duration::from_secs(330));
    let seen: Vec<_> = wire
        .iter()
        .map(|t| (t.r#type.as_str(), t.status.as_str(), t.ms_ago))
        .collect();
    assert_eq!(
        seen,
        [
            ("MemoryPressure", "True", 320_000),
            ("MemoryPressure", "False", 10_000)
        ]
    );
    assert_eq!(wire[0].reason, "KubeletHasInsufficientMemory");
    journal.written(1);
    assert_eq!(journal.len(), 1);
    journal.written(5);
    assert!(journal.is_empty());
}

#[test]
fn the_journal_drops_the_oldest_beyond_its_bound() {
    let config = AgentConfig::default();
    let mut low = facts();
    low.memory.available_bytes = Some(50 << 20);
    let mut journal = Journal::default();
    let mut previous = compute(&facts(), &config, None, T0);
    for i in 1..=(JOURNAL_ENTRIES as u64 + 3) {
        // Past the transition period each time, so every step flips MemoryPressure.
        let f = if i % 2 == 1 { &low } else { &facts() };
        let now = T0 + Duration::from_secs(301 * i);
        let next = compute(f, &config, Some(&previous), now);
        journal.observe(&previous, &next, now);
        previous = next;
    }
    assert_eq!(journal.len(), JOURNAL_ENTRIES);
    assert_eq!(journal.dropped(), 3);
    let now = T0 + Duration::from_secs(301 * (JOURNAL_ENTRIES as u64 + 3));
    assert_eq!(
        journal.to_proto(now).last().map(|t| t.ms_ago),
        Some(0),
        "the newest is kept"
    );
}

#[test]
fn the_journal_forgets_what_the_gateway_would_not_take() {
    let config = AgentConfig::default();
    let mut low = facts();
    low.memory.available_bytes = Some(50 << 20);
    let mut journal = Journal::default();
    let s0 = compute(&facts(), &config, None, T0);
    let s1 = compute(&low, &config, Some(&s0), T0 + Duration::from_secs(10));
    journal.observe(&s0, &s1, T0 + Duration::from_secs(10));
    assert_eq!(journal.len(), 1);
    // Nothing changes for longer than the journal keeps: the old transition goes.
    let later = T0 + Duration::from_secs(10) + JOURNAL_MAX_AGE + Duration::from_secs(1);
    journal.observe(&s1, &s1, later);
    assert!(journal.is_empty());
    assert_eq!(journal.dropped(), 1);
}
