//! The host facts hw reports: raw signals only; the agent turns them into a NodeStatus.

use std::net::IpAddr;

/// Everything hw measures about the host in one read (what kubelet's status setters and
/// eviction manager read; each field names its upstream source).
/// Built by [`read_host_facts`](crate::read_host_facts).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HostFacts {
    /// `nodeInfo.bootID`: `/proc/sys/kernel/random/boot_id`, trimmed (cadvisor
    /// `machine/info.go`). Changes on every boot.
    pub boot_id: String,
    /// `nodeInfo.machineID`: first non-empty of `/etc/machine-id`, `/var/lib/dbus/machine-id`,
    /// trimmed (cadvisor `machine/info.go`).
    pub machine_id: Option<String>,
    /// `nodeInfo.systemUUID`: first non-empty of `/sys/class/dmi/id/product_uuid` (root-only
    /// readable), `/proc/device-tree/system-id`, `/proc/device-tree/vm,uuid`; whitespace and
    /// NULs stripped (cadvisor `utils/sysfs`: `GetSystemUUID`).
    pub system_uuid: Option<String>,
    /// `nodeInfo.kernelVersion`: `/proc/sys/kernel/osrelease`, the same string as `uname -r`
    /// but readable under a [`HostRoot`](crate::HostRoot) (cadvisor `machine/info.go:
    /// KernelVersion`).
    pub kernel_version: Option<String>,
    /// `nodeInfo.osImage`: `PRETTY_NAME` of `/etc/os-release`, else `/usr/lib/os-release`;
    /// `"Linux"` if the key is missing, `"Unknown"` if neither file is readable (cadvisor
    /// `machine/operatingsystem_unix.go`). See [`os_image`](crate::parse::os_image).
    pub os_image: String,
    /// `/proc/sys/kernel/hostname`, trimmed.
    pub hostname: Option<String>,
    /// `nodeInfo.architecture`: Go's `GOARCH` name for this binary's architecture (kubelet
    /// `pkg/kubelet/nodestatus/setters.go: GoRuntime`); see [`go_arch`](crate::go_arch).
    pub architecture: &'static str,
    /// `nodeInfo.operatingSystem`: Go's `GOOS`, always `"linux"`.
    pub operating_system: &'static str,
    /// Logical CPUs online, the `cpu` capacity: `/sys/devices/system/cpu/online`, else the
    /// number of `processor` lines in `/proc/cpuinfo` (kubelet
    /// `pkg/kubelet/cadvisor/util.go: CapacityFromMachineInfo`).
    pub logical_cpus: u32,
    /// Memory capacity and the root cgroup's working set.
    pub memory: MemoryFacts,
    /// Pre-allocated huge pages per page size, sorted by page size; empty when the kernel has
    /// no hugetlbfs (cadvisor `utils/sysinfo/sysinfo.go: GetHugePagesInfo`).
    pub hugepages: Vec<HugePages>,
    /// How cgroups are mounted.
    pub cgroup: CgroupMode,
    /// `nodefs`: the filesystem holding kubelet's root dir (or its nearest existing ancestor);
    /// `None` if statvfs failed.
    pub nodefs: Option<FsStats>,
    /// `imagefs`: the filesystem holding the image store, when
    /// [`ReadOptions::image_fs_dir`](crate::ReadOptions::image_fs_dir) is set.
    pub imagefs: Option<FsStats>,
    /// PID limit and task count for the `pid.available` signal; `None` if unreadable.
    pub pid: Option<PidStats>,
    /// Addresses on local interfaces: the non-loopback IPv4 `/32 host LOCAL` entries of the
    /// Local table in `/proc/net/fib_trie` (numeric order), then the global IPv6 addresses of
    /// `/proc/net/if_inet6` (file order). What kubelet's `validateNodeIP` accepts for
    /// `--node-ip` (`pkg/kubelet/nodestatus/setters.go`).
    pub local_ips: Vec<IpAddr>,
    /// The IPv4 address of the default-route interface, kubelet's last-resort `InternalIP`
    /// (see [`default_route_ipv4`](crate::parse::default_route_ipv4)).
    pub default_route_ip: Option<IpAddr>,
    /// Pressure stall information from `/proc/pressure/{cpu,memory,io}`; `None` when none of
    /// the three is readable (kernel without `CONFIG_PSI` or booted with `psi=0`).
    pub psi: Option<Psi>,
}

/// Memory capacity and the `memory.available` eviction signal (kubelet
/// `pkg/kubelet/eviction/helpers.go: makeSignalObservations`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MemoryFacts {
    /// `MemTotal` × 1024, bytes: the `memory` capacity (cadvisor `machine/machine.go:
    /// GetMachineMemoryCapacity`).
    pub total_bytes: u64,
    /// Root cgroup working set in bytes, usage − inactive file, floored at 0 (cadvisor
    /// `container/libcontainer/handler.go: setMemoryStats`), as kubelet v1.33 computes it
    /// (runc 1.2 through cadvisor). cgroup v1 (also on hybrid hosts):
    /// `memory/memory.usage_in_bytes` − `total_inactive_file` of `memory/memory.stat`.
    /// cgroup v2, whose root has no `memory.current`: `anon` + `file` − `inactive_file`, all
    /// of the root `memory.stat` (runc `libcontainer/cgroups/fs2/memory.go:
    /// rootStatsFromMeminfo`, since runc 1.1.9 and 1.2.0; `opencontainers/cgroups`
    /// `fs2/memory.go` after it). runc ≤ 1.1.8 used `MemTotal` − `MemFree` instead, which
    /// counts kernel memory and reports pressure earlier. `None` if those files are
    /// unreadable or lack a key.
    pub working_set_bytes: Option<u64>,
    /// `memory.available` in bytes: `total_bytes − working_set_bytes`, floored at 0; `None`
    /// when the working set is unknown.
    pub available_bytes: Option<u64>,
}

/// How the cgroup hierarchy is mounted under `/sys/fs/cgroup` (runc
/// `libcontainer/cgroups/utils.go: IsCgroup2UnifiedMode`, `IsCgroup2HybridMode`; detected
/// from files rather than statfs magic so fixture trees can express it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum CgroupMode {
    /// Legacy: v1 controller hierarchies only.
    V1,
    /// Unified: `/sys/fs/cgroup/cgroup.controllers` exists.
    V2,
    /// v1 controllers plus a cgroup2 mount at `/sys/fs/cgroup/unified` (with
    /// `cgroup.controllers`); memory accounting comes from v1.
    Hybrid,
    /// Neither was found (e.g. cgroups not mounted in this view of the host).
    Unknown,
}

/// Huge pages of one size: `/sys/kernel/mm/hugepages/hugepages-<N>kB/nr_hugepages`. Kubelet
/// reports capacity `hugepages-<size>` = `page_size_bytes × pages`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HugePages {
    /// Page size in bytes (`N` × 1024).
    pub page_size_bytes: u64,
    /// Number of pre-allocated pages (`nr_hugepages`).
    pub pages: u64,
}

/// `statvfs(3)` of a filesystem (cadvisor `fs/fs.go: getVfsStats`; kubelet `nodefs.*` and
/// `imagefs.*` eviction signals).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FsStats {
    /// `f_blocks × f_frsize`, bytes.
    pub capacity_bytes: u64,
    /// `f_bavail × f_frsize`, bytes available to unprivileged users.
    pub available_bytes: u64,
    /// `f_files`, inodes.
    pub inodes: u64,
    /// `f_ffree`, free inodes.
    pub inodes_free: u64,
}

/// The `pid.available` signal's inputs (kubelet
/// `pkg/kubelet/stats/pidlimit/pidlimit_linux.go: Stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PidStats {
    /// Tasks allowed system-wide: min(`/proc/sys/kernel/pid_max`,
    /// `/proc/sys/kernel/threads-max`), or whichever of the two is readable.
    pub max_pid: u64,
    /// Tasks (processes and threads) now: the denominator of field 4 of `/proc/loadavg`.
    pub running_tasks: u64,
}

impl PidStats {
    /// `pid.available`, tasks: `max_pid − running_tasks`, floored at 0.
    pub fn available(&self) -> u64 {
        self.max_pid.saturating_sub(self.running_tasks)
    }
}

/// Pressure stall information, one entry per `/proc/pressure/*` file (kernel
/// `Documentation/accounting/psi.rst`). A missing or malformed file gives `None`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Psi {
    /// `/proc/pressure/cpu`.
    pub cpu: Option<PsiResource>,
    /// `/proc/pressure/memory`.
    pub memory: Option<PsiResource>,
    /// `/proc/pressure/io`.
    pub io: Option<PsiResource>,
}

/// One PSI file: the `some` line and, when printed, the `full` line.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PsiResource {
    /// Share of time at least one task was stalled.
    pub some: PsiLine,
    /// Share of time all non-idle tasks were stalled (absent for cpu before Linux 5.13).
    pub full: Option<PsiLine>,
}

/// One PSI line: `some avg10=1.56 avg60=1.62 avg300=1.04 total=5074370`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PsiLine {
    /// Stall percentage (0–100) averaged over the last 10 seconds.
    pub avg10: f64,
    /// Stall percentage (0–100) averaged over the last 60 seconds.
    pub avg60: f64,
    /// Stall percentage (0–100) averaged over the last 300 seconds.
    pub avg300: f64,
    /// Total stall time since boot, microseconds.
    pub total_us: u64,
}
