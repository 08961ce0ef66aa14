//! `read_host_facts` on the committed fixture trees (every field asserted), on a tree with
//! only the required files, and on the real host (invariants only).

// Test helpers outside #[test] fns panic on purpose: a failed setup is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use edgebeat_hw::{
    CgroupMode, CoolingDevice, FsStats, HostFacts, HostRoot, HugePages, MemoryFacts, Mount,
    PidStats, PowerFacts, Psi, PsiLine, PsiResource, ReadOptions, ThermalZone, Throttled, TripKind,
    TripPoint, read_host_facts,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// Go's GOARCH for this test binary, written out independently of the crate's mapping.
fn expected_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        other => other,
    }
}

/// A direct statvfs of `path`, computed the way the spec defines FsStats.
fn statvfs(path: &Path) -> FsStats {
    let s = nix::sys::statvfs::statvfs(path).unwrap();
    let frsize = widen(s.fragment_size());
    FsStats {
        capacity_bytes: widen(s.blocks()) * frsize,
        available_bytes: widen(s.blocks_available()) * frsize,
        inodes: widen(s.files()),
        inodes_free: widen(s.files_free()),
    }
}

/// statvfs fields are 32-bit on armv7 and 64-bit elsewhere.
fn widen<T: Into<u64>>(value: T) -> u64 {
    value.into()
}

/// Reads the facts while `stat_paths` are unchanged before and after: other builds share
/// this disk, so free space can move between two statvfs calls.
fn read_quiescent(
    root: &Path,
    opts: &ReadOptions,
    stat_paths: &[&Path],
) -> (HostFacts, Vec<FsStats>) {
    for _ in 0..50 {
        let before: Vec<FsStats> = stat_paths.iter().map(|p| statvfs(p)).collect();
        let facts = read_host_facts(&HostRoot::new(root), opts).unwrap();
        let after: Vec<FsStats> = stat_paths.iter().map(|p| statvfs(p)).collect();
        // Equal before and after can still hide a change and its undo in between: the
        // facts' own readings must be the settled ones too.
        let settled = |fs: Option<FsStats>| fs.is_none_or(|fs| after.contains(&fs));
        if before == after && settled(facts.nodefs) && settled(facts.imagefs) {
            return (facts, after);
        }
    }
    panic!("filesystem under {} never stayed still", root.display());
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn mount(point: &str, fs_type: &str, source: &str, read_only: bool) -> Mount {
    Mount {
        mount_point: point.into(),
        fs_type: fs_type.into(),
        source: source.into(),
        read_only,
    }
}

fn zone(n: u32, kind: &str, temp: i64, trips: &[(TripKind, i64)]) -> ThermalZone {
    ThermalZone {
        zone: format!("thermal_zone{n}"),
        kind: kind.into(),
        temp_millicelsius: temp,
        trip_points: trips
            .iter()
            .map(|&(kind, temp_millicelsius)| TripPoint {
                kind,
                temp_millicelsius,
            })
            .collect(),
    }
}

fn cooling(n: u32, kind: &str, cur_state: u64, max_state: u64) -> CoolingDevice {
    CoolingDevice {
        device: format!("cooling_device{n}"),
        kind: kind.into(),
        cur_state,
        max_state,
    }
}

fn psi_line(avg10: f64, avg60: f64, avg300: f64, total_us: u64) -> PsiLine {
    PsiLine {
        avg10,
        avg60,
        avg300,
        total_us,
    }
}

#[test]
fn rpi4_cgroup1() {
    let root = fixture("rpi4-cgroup1");
    let kubelet = root.join("var/lib/kubelet");
    let (facts, stats) = read_quiescent(&root, &ReadOptions::default(), &[&kubelet]);
    let want = HostFacts {
        boot_id: "5b3f0e2a-9c41-4d7e-8f26-1a7c3e9d0b54".into(),
        machine_id: Some("9e4c2b7a51d04f3e8a6b0c1d2e3f4a5b".into()),
        // No DMI, no device-tree ID: cadvisor falls back to /etc/machine-id.
        system_uuid: Some("9e4c2b7a51d04f3e8a6b0c1d2e3f4a5b".into()),
        kernel_version: Some("5.15.84-v8+".into()),
        os_image: "Debian GNU/Linux 11 (bullseye)".into(),
        hostname: Some("rpi4-edge-01".into()),
        architecture: expected_arch(),
        operating_system: "linux",
        logical_cpus: 4,
        memory: MemoryFacts {
            total_bytes: 3_978_792_960,
            // cgroup v1: memory.usage_in_bytes 1_841_754_112 − total_inactive_file
            // 991_285_248; available = MemTotal 3_885_540 KiB (3_978_792_960) − that.
            working_set_bytes: Some(850_468_864),
            available_bytes: Some(3_128_324_096),
        },
        hugepages: vec![],
        cgroup: CgroupMode::V1,
        nodefs: Some(stats[0]),
        imagefs: None,
        pid: Some(PidStats {
            max_pid: 30_355,
            running_tasks: 187,
        }),
        local_ips: vec![ip("172.17.0.1"), ip("192.168.1.42"), ip("192.168.4.61")],
        default_route_ip: Some(ip("192.168.1.42")),
        psi: Some(Psi {
            cpu: Some(PsiResource {
                some: psi_line(1.04, 0.87, 0.61, 48_210_337),
                full: Some(psi_line(0.0, 0.0, 0.0, 0)),
            }),
            memory: Some(PsiResource {
                some: psi_line(0.0, 0.11, 0.05, 2_214_512),
                full: Some(psi_line(0.0, 0.06, 0.02, 1_630_044)),
            }),
            io: Some(PsiResource {
                some: psi_line(0.51, 0.93, 0.72, 61_833_920),
                full: Some(psi_line(0.27, 0.58, 0.44, 40_157_301)),
            }),
        }),
        nodefs_mount: Some(mount("/", "ext4", "/dev/root", false)),
        imagefs_mount: None,
        thermal_zones: vec![zone(
            0,
            "cpu-thermal",
            48_312,
            &[(TripKind::Passive, 80_000), (TripKind::Critical, 110_000)],
        )],
        cooling_devices: vec![cooling(0, "cpufreq-cpu0", 0, 4)],
        power: Some(PowerFacts {
            under_voltage_alarm: Some(false),
            throttled: Some(Throttled(0)),
        }),
        clock_sync: facts.clock_sync,
    };
    assert_eq!(facts, want);
    assert_eq!(facts.pid.unwrap().available(), 30_168);
}

#[test]
fn jetson_cgroup2() {
    let root = fixture("jetson-cgroup2");
    let kubelet = root.join("var/lib/kubelet");
    // The image store does not exist in the tree: imagefs is the filesystem that would hold
    // it, i.e. that of its nearest existing ancestor /var/lib.
    let var_lib = root.join("var/lib");
    let opts = ReadOptions {
        root_dir: "/var/lib/kubelet".into(),
        image_fs_dir: Some("/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs".into()),
    };
    let (facts, stats) = read_quiescent(&root, &opts, &[&kubelet, &var_lib]);
    let want = HostFacts {
        boot_id: "c2a8e4f1-3b6d-4a9e-b07c-5d2f8e1a6c39".into(),
        machine_id: Some("4f8a1c3e9b2d47e6a05c7d9e1b3f5a72".into()),
        // No DMI, no device-tree ID: cadvisor falls back to /etc/machine-id.
        system_uuid: Some("4f8a1c3e9b2d47e6a05c7d9e1b3f5a72".into()),
        kernel_version: Some("5.15.136-tegra".into()),
        os_image: "Ubuntu 22.04.4 LTS".into(),
        hostname: Some("jetson-orin-nx-07".into()),
        architecture: expected_arch(),
        operating_system: "linux",
        logical_cpus: 8,
        memory: MemoryFacts {
            total_bytes: 16_032_591_872,
            // memory.stat: anon 1_237_524_480 + file 3_338_571_776 − inactive_file
            // 2_051_424_256 (runc ≥ 1.2 root usage). The old MemTotal − MemFree formula gave
            // 3_933_331_456 and 12_099_260_416 available.
            working_set_bytes: Some(2_524_672_000),
            // MemTotal 15_656_828 KiB = 16_032_591_872 − 2_524_672_000.
            available_bytes: Some(13_507_919_872),
        },
        hugepages: vec![
            HugePages {
                page_size_bytes: 65_536,
                pages: 0,
            },
            HugePages {
                page_size_bytes: 2_097_152,
                pages: 128,
            },
            HugePages {
                page_size_bytes: 33_554_432,
                pages: 0,
            },
            HugePages {
                page_size_bytes: 1_073_741_824,
                pages: 0,
            },
        ],
        cgroup: CgroupMode::V2,
        nodefs: Some(stats[0]),
        imagefs: Some(stats[1]),
        pid: Some(PidStats {
            max_pid: 122_289,
            running_tasks: 612,
        }),
        local_ips: vec![ip("172.17.0.1"), ip("192.168.50.23"), ip("192.168.55.1")],
        default_route_ip: Some(ip("192.168.50.23")),
        psi: Some(Psi {
            cpu: Some(PsiResource {
                some: psi_line(2.31, 1.87, 1.52, 184_467_213),
                full: Some(psi_line(0.0, 0.0, 0.0, 0)),
            }),
            memory: Some(PsiResource {
                some: psi_line(0.0, 0.04, 0.01, 1_203_345),
                full: Some(psi_line(0.0, 0.02, 0.0, 874_120)),
            }),
            io: Some(PsiResource {
                some: psi_line(0.12, 0.35, 0.29, 27_361_980),
                full: Some(psi_line(0.08, 0.21, 0.17, 19_214_472)),
            }),
        }),
        nodefs_mount: Some(mount("/", "ext4", "/dev/nvme0n1p1", false)),
        imagefs_mount: Some(mount("/", "ext4", "/dev/nvme0n1p1", false)),
        thermal_zones: [
            (0, "cpu-thermal", 45_500),
            (1, "gpu-thermal", 43_812),
            (2, "soc0-thermal", 44_718),
        ]
        .into_iter()
        .map(|(n, kind, temp)| {
            zone(
                n,
                kind,
                temp,
                &[(TripKind::Passive, 99_000), (TripKind::Critical, 104_500)],
            )
        })
        .collect(),
        cooling_devices: vec![cooling(0, "pwm-fan", 1, 3)],
        power: None,
        clock_sync: facts.clock_sync,
    };
    assert_eq!(facts, want);
    assert_eq!(facts.pid.unwrap().available(), 121_677);
}

#[test]
fn nuc_hybrid() {
    let root = fixture("nuc-hybrid");
    let kubelet = root.join("var/lib/kubelet");
    let (facts, stats) = read_quiescent(&root, &ReadOptions::default(), &[&kubelet]);
    let want = HostFacts {
        boot_id: "8d0f6b3a-2e57-4c19-a4b8-9f1e7c2d5a63".into(),
        machine_id: Some("b7e2d9f04a6c4183925e1f0a8c3d6b4e".into()),
        system_uuid: Some("e8c2a1f0-5d3b-11ec-8b6a-88aedd0a6c3e".into()),
        kernel_version: Some("6.1.0-18-amd64".into()),
        os_image: "Debian GNU/Linux 12 (bookworm)".into(),
        hostname: Some("nuc-lab-03".into()),
        architecture: expected_arch(),
        operating_system: "linux",
        logical_cpus: 8,
        memory: MemoryFacts {
            total_bytes: 33_372_606_464,
            working_set_bytes: Some(3_489_320_960),
            available_bytes: Some(29_883_285_504),
        },
        hugepages: vec![
            HugePages {
                page_size_bytes: 2_097_152,
                pages: 0,
            },
            HugePages {
                page_size_bytes: 1_073_741_824,
                pages: 0,
            },
        ],
        cgroup: CgroupMode::Hybrid,
        nodefs: Some(stats[0]),
        imagefs: None,
        pid: Some(PidStats {
            max_pid: 254_612,
            running_tasks: 436,
        }),
        local_ips: vec![
            ip("172.17.0.1"),
            ip("192.168.10.20"),
            ip("192.168.122.1"),
            ip("2001:db8:10:0:8aae:ddff:fe0a:6c3e"),
        ],
        default_route_ip: Some(ip("192.168.10.20")),
        psi: Some(Psi {
            cpu: Some(PsiResource {
                some: psi_line(0.47, 0.62, 0.55, 92_837_465),
                full: Some(psi_line(0.0, 0.0, 0.0, 0)),
            }),
            memory: Some(PsiResource {
                some: psi_line(0.0, 0.0, 0.0, 31_244),
                full: Some(psi_line(0.0, 0.0, 0.0, 28_931)),
            }),
            io: Some(PsiResource {
                some: psi_line(0.0, 0.05, 0.08, 6_034_421),
                full: Some(psi_line(0.0, 0.03, 0.06, 5_298_843)),
            }),
        }), // rootDir /var/lib/kubelet is on the separate /var/lib mount.
        nodefs_mount: Some(mount("/var/lib", "xfs", "/dev/nvme0n1p3", false)),
        imagefs_mount: None,
        thermal_zones: vec![
            zone(0, "acpitz", 27_800, &[(TripKind::Critical, 119_000)]),
            // x86_pkg_temp's writable trip points read 0 until someone sets them.
            zone(
                1,
                "x86_pkg_temp",
                41_000,
                &[(TripKind::Passive, 0), (TripKind::Passive, 0)],
            ),
        ],
        cooling_devices: (0..8).map(|n| cooling(n, "Processor", 0, 3)).collect(),
        power: None,
        clock_sync: facts.clock_sync,
    };
    assert_eq!(facts, want);
    assert_eq!(facts.pid.unwrap().available(), 254_176);
}

#[test]
fn only_required_files() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "proc/sys/kernel/random/boot_id",
        "0f9e8d7c-6b5a-4938-8271-605f4e3d2c1b\n",
    );
    write(
        "proc/meminfo",
        "MemTotal:        1012280 kB\nMemFree:          601344 kB\n",
    );
    write("sys/devices/system/cpu/online", "0\n");

    let opts = ReadOptions {
        root_dir: "/var/lib/kubelet".into(),
        image_fs_dir: None,
    };
    // /var/lib/kubelet is absent, so nodefs is the filesystem holding the tree's "/": the
    // one rule that still yields a value when optional files are missing.
    let (facts, stats) = read_quiescent(dir.path(), &opts, &[dir.path()]);
    let want = HostFacts {
        boot_id: "0f9e8d7c-6b5a-4938-8271-605f4e3d2c1b".into(),
        machine_id: None,
        system_uuid: None,
        kernel_version: None,
        os_image: "Unknown".into(),
        hostname: None,
        architecture: expected_arch(),
        operating_system: "linux",
        logical_cpus: 1,
        memory: MemoryFacts {
            total_bytes: 1_036_574_720,
            working_set_bytes: None,
            available_bytes: None,
        },
        hugepages: vec![],
        cgroup: CgroupMode::Unknown,
        nodefs: Some(stats[0]),
        imagefs: None,
        pid: None,
        local_ips: vec![],
        default_route_ip: None,
        psi: None,
        nodefs_mount: None,
        imagefs_mount: None,
        thermal_zones: vec![],
        cooling_devices: vec![],
        power: None,
        clock_sync: facts.clock_sync,
    };
    assert_eq!(facts, want);
}

#[test]
fn real_host_invariants() {
    let facts = read_host_facts(&HostRoot::default(), &ReadOptions::default()).unwrap();
    // The kernel answers adjtimex to anyone, and the host has a mount table.
    assert!(facts.clock_sync.is_some());
    assert!(facts.nodefs_mount.is_some());
    assert_eq!(facts.boot_id.len(), 36, "{:?}", facts.boot_id);
    assert!(facts.logical_cpus > 0);
    assert!(facts.memory.total_bytes > 0);
    assert!(facts.kernel_version.is_some());
    assert!(!facts.os_image.is_empty());
    assert_eq!(facts.architecture, expected_arch());
    assert_eq!(facts.operating_system, "linux");
    assert!(facts.nodefs.is_some());
    assert!(facts.local_ips.iter().all(|ip| !ip.is_loopback()));
    if let Some(pid) = facts.pid {
        assert!(pid.running_tasks > 0 && pid.max_pid > 0);
    }
    // Wherever the root memory cgroup is readable (this project's CI host is hybrid, with
    // v1 memory), the working set must be known and below capacity.
    let memory_cgroup = Path::new("/sys/fs/cgroup/memory/memory.usage_in_bytes").exists()
        || Path::new("/sys/fs/cgroup/memory.stat").exists();
    if memory_cgroup {
        let ws = facts
            .memory
            .working_set_bytes
            .expect("working set on this host");
        assert!(ws > 0);
        assert_eq!(
            facts.memory.available_bytes,
            Some(facts.memory.total_bytes.saturating_sub(ws))
        );
        assert_ne!(facts.cgroup, CgroupMode::Unknown);
    }
}

/// The per-signal trees differ from `rpi4-cgroup1` in one signal each (the rest are relative
/// symlinks into it).
#[test]
fn per_signal_trees_change_one_signal_each() {
    let read = |name: &str| {
        read_host_facts(&HostRoot::new(fixture(name)), &ReadOptions::default()).unwrap()
    };
    let healthy = read("rpi4-cgroup1");
    let strip = |mut f: HostFacts| {
        f.nodefs = None;
        f
    };

    let mut want = strip(healthy.clone());
    want.power = Some(PowerFacts {
        under_voltage_alarm: Some(true),
        throttled: Some(Throttled(0x50005)),
    });
    assert_eq!(strip(read("rpi4-undervoltage")), want);

    let mut want = strip(healthy.clone());
    want.thermal_zones[0].temp_millicelsius = 82_700;
    assert_eq!(strip(read("rpi4-thermal-passive")), want);

    let mut want = strip(healthy.clone());
    want.nodefs_mount = Some(mount("/", "ext4", "/dev/root", true));
    assert_eq!(strip(read("rpi4-readonly-root")), want);

    let mut want = strip(healthy);
    if let Some(psi) = want.psi.as_mut() {
        psi.memory = Some(PsiResource {
            some: psi_line(38.21, 31.50, 12.07, 391_822_410),
            full: Some(psi_line(24.66, 19.93, 7.41, 240_311_872)),
        });
    }
    assert_eq!(strip(read("rpi4-memory-contention")), want);
}
