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
    /// readable), `/proc/device-tree/system-id`, `/proc/device-tree/vm,uuid` and
    /// `/etc/machine-id` (cadvisor's s390x path, tried on every architecture, so boards
    /// without DMI or a device-tree ID report their machine ID, as kubelet does); whitespace
    /// and NULs stripped (cadvisor `utils/sysfs/sysfs.go: GetSystemUUID`).
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
    /// The mount holding kubelet's root dir (`nodefs`), from the host's mount table; `None`
    /// when the table is unreadable.
    pub nodefs_mount: Option<Mount>,
    /// The mount holding [`ReadOptions::image_fs_dir`](crate::ReadOptions::image_fs_dir)
    /// (`imagefs`), when set; `None` otherwise or when the table is unreadable.
    pub imagefs_mount: Option<Mount>,
    /// Thermal zones of `/sys/class/thermal/thermal_zone*` that report a temperature, in
    /// zone-number order (kernel `Documentation/driver-api/thermal/sysfs-api.rst`). Empty on
    /// hosts without thermal drivers (most VMs).
    pub thermal_zones: Vec<ThermalZone>,
    /// Cooling devices of `/sys/class/thermal/cooling_device*`, in device-number order.
    pub cooling_devices: Vec<CoolingDevice>,
    /// Power-supply signals of Raspberry Pi class boards; `None` on other boards.
    pub power: Option<PowerFacts>,
    /// The kernel clock's NTP synchronisation, from `adjtimex(2)`. Not read under the
    /// [`HostRoot`](crate::HostRoot): the running kernel's clock is the host's even from a
    /// container (time namespaces do not virtualise `CLOCK_REALTIME`). `None` if the call
    /// failed.
    pub clock_sync: Option<ClockSync>,
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
    /// `container/libcontainer/handler.go: setMemoryStats`), as kubelet v1.36 computes it
    /// (opencontainers/cgroups v0.0.6 through cadvisor v0.56). cgroup v1 (also on hybrid hosts):
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

/// The node's resource usage now, as kubelet's `/metrics/resource` reports it for the node
/// (`pkg/kubelet/metrics/collectors/resource_metrics.go`: `node_cpu_usage_seconds_total`,
/// `node_memory_working_set_bytes`, from cadvisor's root container), read by
/// [`read_resource_usage`](crate::read_resource_usage). `None` where the host does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceUsage {
    /// Cumulative CPU time of every task on the node, milliseconds: the root cgroup's
    /// `cpuacct/cpuacct.usage` (nanoseconds) on cgroup v1 and hybrid hosts, its `cpu.stat`
    /// `usage_usec` on v2, else the busy time of `/proc/stat`.
    pub cpu_usage_ms: Option<u64>,
    /// The root cgroup's working set, bytes ([`MemoryFacts::working_set_bytes`], the figure
    /// `memory.available` subtracts).
    pub memory_working_set_bytes: Option<u64>,
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

/// One entry of the host's mount table (`/proc/<pid>/mountinfo`, kernel
/// `Documentation/filesystems/proc.rst` §3.5): the mount that holds a path.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Mount {
    /// Mount point, host path (field 5, octal escapes such as `\040` decoded).
    pub mount_point: std::path::PathBuf,
    /// Filesystem type, e.g. `ext4` (the first field after `-`).
    pub fs_type: String,
    /// Mount source, e.g. `/dev/mmcblk0p2`.
    pub source: String,
    /// Read-only: `ro` in the per-mount options (field 6) or in the superblock options (the
    /// last field). A filesystem the kernel remounted read-only after I/O errors (ext4
    /// `errors=remount-ro`) shows `ro` in the superblock options while the mount itself
    /// still says `rw`, so both are read.
    pub read_only: bool,
}

/// One thermal zone: `/sys/class/thermal/thermal_zoneN/{type,temp,trip_point_*}`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ThermalZone {
    /// The directory name, e.g. `thermal_zone0`.
    pub zone: String,
    /// The zone's `type`, e.g. `cpu-thermal` (Raspberry Pi), `CPU-therm` (Jetson),
    /// `x86_pkg_temp`.
    pub kind: String,
    /// `temp`: temperature in millidegrees Celsius.
    pub temp_millicelsius: i64,
    /// `trip_point_<i>_type` and `_temp` pairs, in index order; unreadable ones skipped.
    pub trip_points: Vec<TripPoint>,
}

/// A thermal zone's trip point (`trip_point_<i>_type`, `trip_point_<i>_temp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TripPoint {
    /// What the kernel does when the zone reaches it.
    pub kind: TripKind,
    /// Temperature in millidegrees Celsius.
    pub temp_millicelsius: i64,
}

/// The kernel's trip point types (`trip_point_<i>_type`, kernel
/// `drivers/thermal/thermal_sysfs.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum TripKind {
    /// `active`: turn on a fan. Reaching it is normal operation.
    Active,
    /// `passive`: throttle the CPU to cool down.
    Passive,
    /// `hot`: the platform is told the zone is hot.
    Hot,
    /// `critical`: the kernel shuts the system down.
    Critical,
}

impl TripKind {
    /// The sysfs spelling: `active`, `passive`, `hot`, `critical`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Passive => "passive",
            Self::Hot => "hot",
            Self::Critical => "critical",
        }
    }
}

/// One cooling device: `/sys/class/thermal/cooling_deviceN/{type,cur_state,max_state}`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CoolingDevice {
    /// The directory name, e.g. `cooling_device0`.
    pub device: String,
    /// `type`, e.g. `cpufreq-cpu0`, `thermal-cpufreq-0`, `Processor`, `pwm-fan`.
    pub kind: String,
    /// `cur_state`: 0 = not cooling; higher = more.
    pub cur_state: u64,
    /// `max_state`.
    pub max_state: u64,
}

impl CoolingDevice {
    /// A device that cools by slowing the CPU: cpufreq cooling (`cpufreq-cpu<N>`,
    /// `thermal-cpufreq-<N>`, kernel `drivers/thermal/cpufreq_cooling.c`), ACPI processor
    /// throttling (`Processor`) or `intel_powerclamp`. A fan (`pwm-fan`) is not one.
    pub fn throttles_cpu(&self) -> bool {
        self.kind.contains("cpufreq") || self.kind == "Processor" || self.kind == "intel_powerclamp"
    }
}

/// What a Raspberry Pi class board says about its power supply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PowerFacts {
    /// `in0_lcrit_alarm` of the `rpi_volt` hwmon device (kernel
    /// `drivers/hwmon/raspberrypi-hwmon.c`): 1 when the firmware reported under-voltage
    /// since the driver's previous poll (every 2 s), i.e. now. `None` without the driver.
    pub under_voltage_alarm: Option<bool>,
    /// The firmware's throttled word, `/sys/devices/platform/soc/soc:firmware/get_throttled`
    /// (Raspberry Pi kernels; the value `vcgencmd get_throttled` prints). `None` where
    /// absent.
    pub throttled: Option<Throttled>,
}

/// The Raspberry Pi firmware's throttled bits (Raspberry Pi documentation, "`vcgencmd
/// get_throttled`"): bits 0–3 describe now, bits 16–19 what has occurred since boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Throttled(pub u32);

impl Throttled {
    /// Bit 0: under-voltage now.
    pub fn under_voltage(self) -> bool {
        self.0 & 1 != 0
    }
    /// Bit 1: ARM frequency capped now.
    pub fn frequency_capped(self) -> bool {
        self.0 & (1 << 1) != 0
    }
    /// Bit 2: throttled now.
    pub fn throttled(self) -> bool {
        self.0 & (1 << 2) != 0
    }
    /// Bit 3: soft temperature limit active now.
    pub fn soft_temp_limit(self) -> bool {
        self.0 & (1 << 3) != 0
    }
    /// Bit 16: under-voltage has occurred since boot. The firmware clears its sticky bits
    /// when asked to; the `rpi_volt` driver asks on every poll, so with that driver loaded
    /// this bit means "within the last poll" rather than "since boot".
    pub fn under_voltage_occurred(self) -> bool {
        self.0 & (1 << 16) != 0
    }
    /// Bit 17: frequency capping has occurred.
    pub fn frequency_capped_occurred(self) -> bool {
        self.0 & (1 << 17) != 0
    }
    /// Bit 18: throttling has occurred.
    pub fn throttled_occurred(self) -> bool {
        self.0 & (1 << 18) != 0
    }
    /// Bit 19: the soft temperature limit has occurred.
    pub fn soft_temp_limit_occurred(self) -> bool {
        self.0 & (1 << 19) != 0
    }
}

/// The kernel clock's NTP state (`adjtimex(2)` with no modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ClockSync {
    /// Synchronised, by systemd's rule (`src/basic/time-util.c: ntp_synced`, what
    /// `timedatectl` shows as "System clock synchronized"): the call did not return
    /// `TIME_ERROR`, `STA_UNSYNC` is clear, and `maxerror` is below 16 s.
    pub synchronized: bool,
    /// `maxerror`: the kernel's maximum error estimate, microseconds. The kernel adds
    /// 500 µs per second while no time daemon updates it, and caps it at 16 s.
    pub max_error_us: i64,
}
