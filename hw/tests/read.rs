//! `read_host_facts` edge cases on small temporary trees: errors for required facts, and the
//! fallbacks and partial data of optional ones.

// Test helpers outside #[test] fns panic on purpose: a failed setup is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use edgebeat_hw::{
    CgroupMode, HostRoot, HugePages, HwError, ParseError, PidStats, Psi, PsiLine, PsiResource,
    ReadOptions, ResourceUsage, read_host_facts, read_resource_usage,
};
use tempfile::TempDir;

struct Tree(TempDir);

impl Tree {
    /// A tree holding just the three required files.
    fn minimal() -> Self {
        let tree = Self::empty();
        tree.write(
            "/proc/sys/kernel/random/boot_id",
            "0f9e8d7c-6b5a-4938-8271-605f4e3d2c1b\n",
        );
        tree.write("/proc/meminfo", "MemTotal: 1000 kB\nMemFree: 400 kB\n");
        tree.write("/sys/devices/system/cpu/online", "0-1\n");
        tree
    }

    fn empty() -> Self {
        Self(tempfile::tempdir().unwrap())
    }

    fn write(&self, host_path: &str, text: &str) {
        let path = HostRoot::new(self.0.path()).join(host_path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn remove(&self, host_path: &str) {
        std::fs::remove_file(HostRoot::new(self.0.path()).join(host_path)).unwrap();
    }

    fn mkdir(&self, host_path: &str) {
        std::fs::create_dir_all(HostRoot::new(self.0.path()).join(host_path)).unwrap();
    }

    fn root(&self) -> &Path {
        self.0.path()
    }

    fn read(&self) -> Result<edgebeat_hw::HostFacts, HwError> {
        read_host_facts(&HostRoot::new(self.root()), &ReadOptions::default())
    }
}

#[test]
fn missing_boot_id_names_the_path() {
    let tree = Tree::minimal();
    tree.remove("/proc/sys/kernel/random/boot_id");
    let err = tree.read().unwrap_err();
    assert!(
        matches!(&err, HwError::Read { path, .. } if path == Path::new("/proc/sys/kernel/random/boot_id"))
    );
    let msg = err.to_string();
    let prefix = format!(
        "reading /proc/sys/kernel/random/boot_id under {}: No such file or directory",
        tree.root().display()
    );
    assert!(msg.starts_with(&prefix), "{msg}");
}

#[test]
fn empty_boot_id_is_an_error() {
    let tree = Tree::minimal();
    tree.write("/proc/sys/kernel/random/boot_id", "\n");
    let err = tree.read().unwrap_err();
    assert!(
        matches!(
            &err,
            HwError::Parse {
                source: ParseError::Empty,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn meminfo_without_memtotal_is_an_error() {
    let tree = Tree::minimal();
    tree.write("/proc/meminfo", "MemFree: 400 kB\n");
    let err = tree.read().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "parsing /proc/meminfo under {}: missing MemTotal",
            tree.root().display()
        )
    );
}

#[test]
fn cpu_count_falls_back_to_cpuinfo() {
    let tree = Tree::minimal();
    tree.write("/sys/devices/system/cpu/online", "garbage\n");
    tree.write(
        "/proc/cpuinfo",
        "processor\t: 0\nBogoMIPS\t: 108.00\n\nprocessor\t: 1\n\nprocessor\t: 2\n",
    );
    assert_eq!(tree.read().unwrap().logical_cpus, 3);
}

#[test]
fn no_cpu_count_names_both_paths() {
    let tree = Tree::minimal();
    tree.remove("/sys/devices/system/cpu/online");
    let err = tree.read().unwrap_err();
    assert!(matches!(err, HwError::CpuCount { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("reading /sys/devices/system/cpu/online under"),
        "{msg}"
    );
    assert!(msg.contains("reading /proc/cpuinfo under"), "{msg}");
}

#[test]
fn identity_fallbacks() {
    let tree = Tree::minimal();
    // An empty machine-id (first boot, not yet initialised) falls through to D-Bus's copy.
    tree.write("/etc/machine-id", "\n");
    tree.write(
        "/var/lib/dbus/machine-id",
        "0123456789abcdef0123456789abcdef\n",
    );
    // No DMI: a device-tree system-id, NUL-terminated.
    tree.write("/proc/device-tree/system-id", "IBM,02781234X\0");
    tree.write(
        "/usr/lib/os-release",
        "NAME=\"Clear Linux OS\"\nPRETTY_NAME=\"Clear Linux OS\"\n",
    );
    let facts = tree.read().unwrap();
    assert_eq!(
        facts.machine_id.as_deref(),
        Some("0123456789abcdef0123456789abcdef")
    );
    assert_eq!(facts.system_uuid.as_deref(), Some("IBM,02781234X"));
    assert_eq!(facts.os_image, "Clear Linux OS");

    tree.remove("/proc/device-tree/system-id");
    tree.write(
        "/proc/device-tree/vm,uuid",
        "5e0f1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b\0",
    );
    tree.write("/sys/class/dmi/id/product_uuid", "\n");
    // /etc/os-release wins over /usr/lib even without PRETTY_NAME.
    tree.write("/etc/os-release", "NAME=Custom\nID=custom\n");
    let facts = tree.read().unwrap();
    assert_eq!(
        facts.system_uuid.as_deref(),
        Some("5e0f1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b")
    );
    assert_eq!(facts.os_image, "Linux");
}

#[test]
fn working_set_v1_and_v2() {
    // v2: usage is anon + file of the root memory.stat (runc ≥ 1.2), not MemTotal − MemFree
    // (here 600 KiB used by that count: kernel memory is not the root's usage).
    let tree = Tree::minimal();
    tree.write("/sys/fs/cgroup/cgroup.controllers", "cpu io memory pids\n");
    tree.write(
        "/sys/fs/cgroup/memory.stat",
        "anon 4096\nfile 204800\ninactive_file 102400\n",
    );
    let facts = tree.read().unwrap();
    assert_eq!(facts.cgroup, CgroupMode::V2);
    assert_eq!(
        facts.memory.working_set_bytes,
        Some(4096 + 204_800 - 102_400)
    );
    assert_eq!(
        facts.memory.available_bytes,
        Some(1000 * 1024 - (4096 + 204_800 - 102_400))
    );

    // v2 without MemFree: MemFree plays no part any more.
    tree.write("/proc/meminfo", "MemTotal: 1000 kB\n");
    assert_eq!(tree.read().unwrap().memory.working_set_bytes, Some(106_496));
    // v2 memory.stat without file: unknown, not a crash.
    tree.write(
        "/sys/fs/cgroup/memory.stat",
        "anon 4096\ninactive_file 102400\n",
    );
    assert_eq!(tree.read().unwrap().memory.working_set_bytes, None);

    // v1 takes precedence (a hybrid host); inactive larger than usage floors at 0.
    let tree = Tree::minimal();
    tree.write("/sys/fs/cgroup/memory/memory.usage_in_bytes", "500000\n");
    tree.write(
        "/sys/fs/cgroup/memory/memory.stat",
        "inactive_file 1\ntotal_inactive_file 900000\n",
    );
    tree.write("/sys/fs/cgroup/unified/cgroup.controllers", "");
    let facts = tree.read().unwrap();
    assert_eq!(facts.cgroup, CgroupMode::Hybrid);
    assert_eq!(facts.memory.working_set_bytes, Some(0));
    assert_eq!(facts.memory.available_bytes, Some(1000 * 1024));

    // v1 usage but memory.stat missing or without the key: unknown.
    tree.write("/sys/fs/cgroup/memory/memory.stat", "inactive_file 1\n");
    assert_eq!(tree.read().unwrap().memory.working_set_bytes, None);
    tree.remove("/sys/fs/cgroup/memory/memory.stat");
    assert_eq!(tree.read().unwrap().memory.working_set_bytes, None);
}

#[test]
fn cgroup_v1_without_memory_controller() {
    let tree = Tree::minimal();
    tree.mkdir("/sys/fs/cgroup/pids");
    tree.mkdir("/sys/fs/cgroup/cpu,cpuacct");
    let facts = tree.read().unwrap();
    assert_eq!(facts.cgroup, CgroupMode::V1);
    assert_eq!(facts.memory.working_set_bytes, None);
}

#[test]
fn pid_stats_use_whichever_limit_is_readable() {
    let tree = Tree::minimal();
    tree.write("/proc/loadavg", "0.00 0.01 0.05 1/93 4242\n");
    assert_eq!(tree.read().unwrap().pid, None);
    tree.write("/proc/sys/kernel/threads-max", "15000\n");
    assert_eq!(
        tree.read().unwrap().pid,
        Some(PidStats {
            max_pid: 15_000,
            running_tasks: 93
        })
    );
    tree.write("/proc/sys/kernel/pid_max", "32768\n");
    assert_eq!(tree.read().unwrap().pid.map(|p| p.max_pid), Some(15_000));
    tree.write("/proc/loadavg", "0.00 0.01 0.05\n");
    assert_eq!(tree.read().unwrap().pid, None);
}

#[test]
fn hugepages_skip_unreadable_entries_and_sort() {
    let tree = Tree::minimal();
    tree.write(
        "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
        "2\n",
    );
    tree.write(
        "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
        "512\n",
    );
    tree.write(
        "/sys/kernel/mm/hugepages/hugepages-64kB/nr_hugepages",
        "bogus\n",
    );
    tree.mkdir("/sys/kernel/mm/hugepages/hugepages-32768kB");
    tree.write("/sys/kernel/mm/hugepages/README", "not a size\n");
    assert_eq!(
        tree.read().unwrap().hugepages,
        vec![
            HugePages {
                page_size_bytes: 2 << 20,
                pages: 512
            },
            HugePages {
                page_size_bytes: 1 << 30,
                pages: 2
            },
        ]
    );
}

#[test]
fn psi_partial_and_malformed() {
    let tree = Tree::minimal();
    tree.write(
        "/proc/pressure/cpu",
        "some avg10=0.50 avg60=0.25 avg300=0.10 total=12345\n",
    );
    tree.write("/proc/pressure/memory", "garbage\n");
    let line = PsiLine {
        avg10: 0.5,
        avg60: 0.25,
        avg300: 0.1,
        total_us: 12_345,
    };
    assert_eq!(
        tree.read().unwrap().psi,
        Some(Psi {
            cpu: Some(PsiResource {
                some: line,
                full: None
            }),
            memory: None,
            io: None,
        })
    );
}

#[test]
fn malformed_network_files_give_no_addresses() {
    let tree = Tree::minimal();
    tree.write(
        "/proc/net/fib_trie",
        "Local:\n  |-- 10.0.0.300\n     /32 host LOCAL\n",
    );
    tree.write("/proc/net/route", "Iface\tDestination\nbroken\n");
    tree.write("/proc/net/if_inet6", "short line\n");
    let facts = tree.read().unwrap();
    assert!(facts.local_ips.is_empty());
    assert_eq!(facts.default_route_ip, None);
}

#[test]
fn missing_root_dir_stats_the_nearest_ancestor() {
    let tree = Tree::minimal();
    tree.mkdir("/var/lib");
    let direct = nix::sys::statvfs::statvfs(&tree.root().join("var/lib")).unwrap();
    let stats = edgebeat_hw::fs_stats(
        &HostRoot::new(tree.root()),
        Path::new("/var/lib/kubelet/../kubelet/pods"),
    )
    .unwrap();
    assert_eq!(stats.inodes, widen(direct.files()));

    let missing_root = HostRoot::new(tree.root().join("does-not-exist"));
    let err = edgebeat_hw::fs_stats(&missing_root, Path::new("/var/lib/kubelet")).unwrap_err();
    assert!(
        matches!(&err, HwError::Statvfs { path, .. } if path == Path::new("/")),
        "{err:?}"
    );
}

/// statvfs fields are 32-bit on armv7 and 64-bit elsewhere.
fn widen<T: Into<u64>>(value: T) -> u64 {
    value.into()
}

/// The node's CPU time comes from the v1 `cpuacct` controller first (hybrid hosts account
/// there), then v2's root `cpu.stat`, then `/proc/stat`; the working set as the status's.
#[test]
fn resource_usage_follows_the_cgroup_that_accounts_the_root() {
    let tree = Tree::empty();
    let root = HostRoot::new(tree.0.path());
    assert_eq!(read_resource_usage(&root), ResourceUsage::default());
    tree.write("/proc/stat", "cpu  100 0 50 900 0 0 10 0 0 0\n");
    assert_eq!(read_resource_usage(&root).cpu_usage_ms, Some(1_600));
    tree.write(
        "/sys/fs/cgroup/cpu.stat",
        "usage_usec 2500999\nuser_usec 1\n",
    );
    tree.write(
        "/sys/fs/cgroup/memory.stat",
        "anon 3000\nfile 5000\ninactive_file 2000\n",
    );
    assert_eq!(
        read_resource_usage(&root),
        ResourceUsage {
            cpu_usage_ms: Some(2_500),
            memory_working_set_bytes: Some(6_000),
        }
    );
    tree.write("/sys/fs/cgroup/cpuacct/cpuacct.usage", "7000000001\n");
    assert_eq!(read_resource_usage(&root).cpu_usage_ms, Some(7_000));
}
