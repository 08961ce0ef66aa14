//! Reading the host: file access under a [`HostRoot`], one function per fact.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use crate::parse;
use crate::root::host_relative;
use crate::{
    CgroupMode, CoolingDevice, FsStats, HostFacts, HostRoot, HugePages, HwError, MemoryFacts,
    Mount, ParseError, PidStats, PowerFacts, Psi, ResourceUsage, ThermalZone, TripPoint,
};

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
const MACHINE_ID: [&str; 2] = ["/etc/machine-id", "/var/lib/dbus/machine-id"];
const SYSTEM_UUID: [&str; 4] = [
    "/sys/class/dmi/id/product_uuid",
    "/proc/device-tree/system-id",
    "/proc/device-tree/vm,uuid",
    // cadvisor's s390x fallback (`s390xDevTree` = "/etc"), read on every architecture: a
    // board with neither DMI nor a device-tree ID (a Raspberry Pi) reports its machine ID.
    "/etc/machine-id",
];
const OSRELEASE: &str = "/proc/sys/kernel/osrelease";
const OS_RELEASE: [&str; 2] = ["/etc/os-release", "/usr/lib/os-release"];
const HOSTNAME: &str = "/proc/sys/kernel/hostname";
const CPU_ONLINE: &str = "/sys/devices/system/cpu/online";
const CPUINFO: &str = "/proc/cpuinfo";
const MEMINFO: &str = "/proc/meminfo";
const HUGEPAGES: &str = "/sys/kernel/mm/hugepages";
const CGROUP: &str = "/sys/fs/cgroup";
const CGROUP_V2_CONTROLLERS: &str = "/sys/fs/cgroup/cgroup.controllers";
const CGROUP_UNIFIED_CONTROLLERS: &str = "/sys/fs/cgroup/unified/cgroup.controllers";
/// v1 controller hierarchies whose presence means "v1 is mounted".
const CGROUP_V1_CONTROLLERS: [&str; 8] = [
    "memory", "cpu", "cpuacct", "cpuset", "pids", "blkio", "devices", "freezer",
];
const V1_MEMORY_USAGE: &str = "/sys/fs/cgroup/memory/memory.usage_in_bytes";
const V1_MEMORY_STAT: &str = "/sys/fs/cgroup/memory/memory.stat";
const V2_MEMORY_STAT: &str = "/sys/fs/cgroup/memory.stat";
const V1_CPUACCT_USAGE: &str = "/sys/fs/cgroup/cpuacct/cpuacct.usage";
const V2_CPU_STAT: &str = "/sys/fs/cgroup/cpu.stat";
const PROC_STAT: &str = "/proc/stat";
const PID_MAX: &str = "/proc/sys/kernel/pid_max";
const THREADS_MAX: &str = "/proc/sys/kernel/threads-max";
const LOADAVG: &str = "/proc/loadavg";
const ROUTE: &str = "/proc/net/route";
const FIB_TRIE: &str = "/proc/net/fib_trie";
const IF_INET6: &str = "/proc/net/if_inet6";
/// The host's mount table: init's (the host mount namespace, also from a container that
/// sees the host's `/proc`), else the agent's own.
const MOUNTINFO: [&str; 2] = ["/proc/1/mountinfo", "/proc/self/mountinfo"];
/// At most this much mount table is read (a host with thousands of container mounts
/// stays well below it).
const MOUNTINFO_LIMIT: u64 = 4 * 1024 * 1024;
const THERMAL: &str = "/sys/class/thermal";
const HWMON: &str = "/sys/class/hwmon";
const RPI_FIRMWARE_THROTTLED: &str = "/sys/devices/platform/soc/soc:firmware/get_throttled";
/// Bounds on what a sysfs walk reads: thermal zones and cooling devices per class, trip
/// points per zone, hwmon devices.
const MAX_SYSFS_ENTRIES: usize = 64;
const MAX_TRIP_POINTS: usize = 16;
const PSI: [&str; 3] = [
    "/proc/pressure/cpu",
    "/proc/pressure/memory",
    "/proc/pressure/io",
];

/// What to stat for the filesystem signals. Paths are host paths, joined under the
/// [`HostRoot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOptions {
    /// Kubelet's `--root-dir` (default `/var/lib/kubelet`): `nodefs` is the filesystem
    /// holding it.
    pub root_dir: PathBuf,
    /// The container runtime's image store (what CRI `ImageFsInfo` reports, e.g.
    /// `/var/lib/containerd`): `imagefs`. `None` leaves [`HostFacts::imagefs`] `None`.
    pub image_fs_dir: Option<PathBuf>,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            root_dir: PathBuf::from("/var/lib/kubelet"),
            image_fs_dir: None,
        }
    }
}

/// Reads the node's resource usage under `root` now ([`ResourceUsage`]): a few small files,
/// cheap enough for every Lease renewal. CPU: the v1 `cpuacct` controller first (hybrid hosts
/// account there, as for memory), then v2's root `cpu.stat`, then `/proc/stat`.
pub fn read_resource_usage(root: &HostRoot) -> ResourceUsage {
    let host = Host { root };
    let cpu_usage_ms = host
        .parse_opt(V1_CPUACCT_USAGE, |t| parse::parse_u64(t, "cpuacct.usage"))
        .map(|ns| ns / 1_000_000)
        .or_else(|| {
            host.parse_opt(V2_CPU_STAT, parse::parse_cpu_stat_usage_usec)
                .map(|us| us / 1_000)
        })
        .or_else(|| host.parse_opt(PROC_STAT, parse::parse_proc_stat_busy_ms));
    ResourceUsage {
        cpu_usage_ms,
        memory_working_set_bytes: host.working_set(),
    }
}

/// Reads every host fact under `root` (kubelet's `pkg/kubelet/nodestatus/setters.go` and
/// cadvisor's `machine/info.go`, item by item on `HostFacts`).
///
/// Only the boot ID, `MemTotal` and the CPU count are required: if one of them cannot be
/// read the result is an [`HwError`] naming the path. Every other fact is optional and comes
/// back as `None` or empty when its file is missing or malformed.
pub fn read_host_facts(root: &HostRoot, opts: &ReadOptions) -> Result<HostFacts, HwError> {
    let host = Host { root };
    let boot_id = host.parse(BOOT_ID, |text| {
        parse::parse_id(text).ok_or(ParseError::Empty)
    })?;
    let meminfo = host.parse(MEMINFO, parse::parse_meminfo)?;
    let logical_cpus = host.logical_cpus()?;
    let cgroup = host.cgroup_mode();
    let working_set_bytes = host.working_set();
    let local_v4 = host.local_ipv4();
    let default_route_ip = host
        .parse_opt(ROUTE, parse::parse_route)
        .and_then(|routes| parse::default_route_ipv4(&routes, &local_v4))
        .map(IpAddr::V4);
    let mut local_ips: Vec<IpAddr> = local_v4.into_iter().map(IpAddr::V4).collect();
    local_ips.extend(host.global_ipv6());
    let mounts = host.mounts();
    let mount_of = |dir: &Path| {
        let path = Path::new("/").join(host_relative(dir));
        parse::mount_of(mounts.as_deref()?, &path).cloned()
    };

    Ok(HostFacts {
        boot_id,
        machine_id: host.first_id(&MACHINE_ID),
        system_uuid: host.first_id(&SYSTEM_UUID),
        kernel_version: host.first_id(&[OSRELEASE]),
        os_image: parse::os_image(OS_RELEASE.iter().find_map(|p| host.read_opt(p)).as_deref()),
        hostname: host.first_id(&[HOSTNAME]),
        architecture: crate::host_go_arch(),
        operating_system: "linux",
        logical_cpus,
        memory: MemoryFacts {
            total_bytes: meminfo.total_bytes,
            working_set_bytes,
            available_bytes: working_set_bytes.map(|ws| meminfo.total_bytes.saturating_sub(ws)),
        },
        hugepages: host.hugepages(),
        cgroup,
        nodefs: fs_stats(root, &opts.root_dir).ok(),
        imagefs: opts
            .image_fs_dir
            .as_ref()
            .and_then(|dir| fs_stats(root, dir).ok()),
        pid: host.pid_stats(),
        local_ips,
        default_route_ip,
        psi: host.psi(),
        nodefs_mount: mount_of(&opts.root_dir),
        imagefs_mount: opts.image_fs_dir.as_deref().and_then(mount_of),
        thermal_zones: host.thermal_zones(),
        cooling_devices: host.cooling_devices(),
        power: host.power(),
        clock_sync: crate::ntp::clock_sync(),
    })
}

/// `statvfs(3)` of the filesystem holding host path `host_path`: if it does not exist, of its
/// nearest existing ancestor (kubelet reports the filesystem that *would* hold
/// `/var/lib/kubelet`; cadvisor `fs/fs.go: getVfsStats`).
pub fn fs_stats(root: &HostRoot, host_path: &Path) -> Result<FsStats, HwError> {
    let mut relative = host_relative(host_path);
    while !root.root().join(&relative).exists() && relative.pop() {}
    let path = Path::new("/").join(&relative);
    let stat = nix::sys::statvfs::statvfs(&root.root().join(&relative)).map_err(|source| {
        HwError::Statvfs {
            path,
            root: root.root().to_path_buf(),
            source,
        }
    })?;
    let frsize = widen(stat.fragment_size());
    Ok(FsStats {
        capacity_bytes: widen(stat.blocks()).saturating_mul(frsize),
        available_bytes: widen(stat.blocks_available()).saturating_mul(frsize),
        inodes: widen(stat.files()),
        inodes_free: widen(stat.files_free()),
    })
}

/// statvfs fields are `c_ulong`/`fsblkcnt_t`: 32 bits on armv7, 64 elsewhere.
fn widen<T: Into<u64>>(value: T) -> u64 {
    value.into()
}

/// The [`HostRoot`] with the file helpers every fact uses.
struct Host<'a> {
    root: &'a HostRoot,
}

impl Host<'_> {
    fn read(&self, path: &str) -> Result<String, HwError> {
        std::fs::read_to_string(self.root.join(path))
            .map_err(|source| self.read_error(path, source))
    }

    fn read_error(&self, path: &str, source: io::Error) -> HwError {
        HwError::Read {
            path: PathBuf::from(path),
            root: self.root.root().to_path_buf(),
            source,
        }
    }

    /// Reads and parses a required file.
    fn parse<T>(
        &self,
        path: &str,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Result<T, HwError> {
        parse(&self.read(path)?).map_err(|source| HwError::Parse {
            path: PathBuf::from(path),
            root: self.root.root().to_path_buf(),
            source,
        })
    }

    /// An optional file: any read error is `None`.
    fn read_opt(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(path)).ok()
    }

    /// An optional file: read or parse errors are `None`.
    fn parse_opt<T>(
        &self,
        path: &str,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Option<T> {
        parse(&self.read_opt(path)?).ok()
    }

    fn exists(&self, path: &str) -> bool {
        self.root.join(path).exists()
    }

    /// The first of `paths` that is readable and non-empty after trimming.
    fn first_id(&self, paths: &[&str]) -> Option<String> {
        paths
            .iter()
            .find_map(|path| self.read_opt(path).as_deref().and_then(parse::parse_id))
    }

    fn logical_cpus(&self) -> Result<u32, HwError> {
        let online = match self.parse(CPU_ONLINE, parse::parse_cpu_list) {
            Ok(n) => return Ok(n),
            Err(err) => err,
        };
        self.parse(CPUINFO, parse::parse_cpuinfo_processors)
            .map_err(|cpuinfo| HwError::CpuCount {
                root: self.root.root().to_path_buf(),
                online: Box::new(online),
                cpuinfo: Box::new(cpuinfo),
            })
    }

    fn cgroup_mode(&self) -> CgroupMode {
        if self.exists(CGROUP_V2_CONTROLLERS) {
            return CgroupMode::V2;
        }
        let cgroup = self.root.join(CGROUP);
        let v1 = CGROUP_V1_CONTROLLERS
            .iter()
            .any(|controller| cgroup.join(controller).is_dir());
        match (v1, self.exists(CGROUP_UNIFIED_CONTROLLERS)) {
            (true, true) => CgroupMode::Hybrid,
            (true, false) => CgroupMode::V1,
            (false, _) => CgroupMode::Unknown,
        }
    }

    /// Root cgroup working set, bytes: v1 memory controller first (hybrid hosts account
    /// memory there), then v2 (see [`MemoryFacts::working_set_bytes`]).
    fn working_set(&self) -> Option<u64> {
        if self.exists(V1_MEMORY_USAGE) {
            let usage = self.parse_opt(V1_MEMORY_USAGE, |t| {
                parse::parse_u64(t, "memory.usage_in_bytes")
            })?;
            let stat = self.parse_opt(V1_MEMORY_STAT, parse::parse_memory_stat)?;
            return Some(parse::working_set_bytes(
                usage,
                *stat.get("total_inactive_file")?,
            ));
        }
        // The root has no memory.current: runc ≥ 1.1.9 / 1.2 `rootStatsFromMeminfo` takes
        // anon + file of the root memory.stat as usage.
        let stat = self.parse_opt(V2_MEMORY_STAT, parse::parse_memory_stat)?;
        let usage = stat.get("anon")?.saturating_add(*stat.get("file")?);
        Some(parse::working_set_bytes(usage, *stat.get("inactive_file")?))
    }

    fn hugepages(&self) -> Vec<HugePages> {
        let Ok(entries) = std::fs::read_dir(self.root.join(HUGEPAGES)) else {
            return Vec::new();
        };
        let mut pages: Vec<HugePages> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name();
                let page_size_bytes = parse::parse_hugepages_dir(name.to_str()?)?;
                let count = std::fs::read_to_string(entry.path().join("nr_hugepages")).ok()?;
                Some(HugePages {
                    page_size_bytes,
                    pages: parse::parse_u64(&count, "nr_hugepages").ok()?,
                })
            })
            .collect();
        pages.sort_by_key(|p| p.page_size_bytes);
        pages
    }

    fn pid_stats(&self) -> Option<PidStats> {
        let limit = |path| self.parse_opt(path, |t| parse::parse_u64(t, "task limit"));
        let max_pid = match (limit(PID_MAX), limit(THREADS_MAX)) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        let running_tasks = self.parse_opt(LOADAVG, parse::parse_loadavg)?;
        Some(PidStats {
            max_pid,
            running_tasks,
        })
    }

    /// Non-loopback IPv4 addresses from the fib_trie Local table.
    fn local_ipv4(&self) -> Vec<Ipv4Addr> {
        let mut ips = self
            .parse_opt(FIB_TRIE, parse::parse_fib_trie_local)
            .unwrap_or_default();
        ips.retain(|ip| !ip.is_loopback());
        ips
    }

    fn global_ipv6(&self) -> impl Iterator<Item = IpAddr> {
        self.parse_opt(IF_INET6, parse::parse_if_inet6)
            .unwrap_or_default()
            .into_iter()
            .filter(parse::Inet6Addr::is_global)
            .map(|a| IpAddr::V6(a.addr))
    }

    /// The host's mount table ([`MOUNTINFO`]); `None` when unreadable or malformed.
    fn mounts(&self) -> Option<Vec<Mount>> {
        MOUNTINFO.iter().find_map(|path| {
            let bytes = crate::read_bounded(&self.root.join(path), MOUNTINFO_LIMIT).ok()?;
            parse::parse_mountinfo(std::str::from_utf8(&bytes).ok()?).ok()
        })
    }

    /// The entries `<prefix><N>` of sysfs class directory `class`, by `N`, at most
    /// [`MAX_SYSFS_ENTRIES`].
    fn numbered(&self, class: &str, prefix: &str) -> Vec<(String, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(self.root.join(class)) else {
            return Vec::new();
        };
        let mut found: Vec<(u32, String, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let n = name.strip_prefix(prefix)?.parse().ok()?;
                Some((n, name, entry.path()))
            })
            .take(4 * MAX_SYSFS_ENTRIES)
            .collect();
        found.sort_by_key(|(n, ..)| *n);
        found
            .into_iter()
            .take(MAX_SYSFS_ENTRIES)
            .map(|(_, name, path)| (name, path))
            .collect()
    }

    /// Thermal zones with a readable `temp` (a zone whose sensor fails reads `EIO` or
    /// `ENODATA` and is left out).
    fn thermal_zones(&self) -> Vec<ThermalZone> {
        self.numbered(THERMAL, "thermal_zone")
            .into_iter()
            .filter_map(|(zone, dir)| {
                let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
                let temp_millicelsius = parse::parse_millicelsius(&read("temp")?).ok()?;
                let trip_points = (0..MAX_TRIP_POINTS)
                    .map_while(|i| {
                        let kind = read(&format!("trip_point_{i}_type"))?;
                        Some((kind, read(&format!("trip_point_{i}_temp"))))
                    })
                    .filter_map(|(kind, temp)| {
                        Some(TripPoint {
                            kind: parse::parse_trip_kind(&kind)?,
                            temp_millicelsius: parse::parse_millicelsius(&temp?).ok()?,
                        })
                    })
                    .collect();
                Some(ThermalZone {
                    zone,
                    kind: read("type").as_deref().and_then(parse::parse_id)?,
                    temp_millicelsius,
                    trip_points,
                })
            })
            .collect()
    }

    fn cooling_devices(&self) -> Vec<CoolingDevice> {
        self.numbered(THERMAL, "cooling_device")
            .into_iter()
            .filter_map(|(device, dir)| {
                let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
                Some(CoolingDevice {
                    device,
                    kind: read("type").as_deref().and_then(parse::parse_id)?,
                    cur_state: parse::parse_u64(&read("cur_state")?, "cur_state").ok()?,
                    max_state: parse::parse_u64(&read("max_state")?, "max_state").ok()?,
                })
            })
            .collect()
    }

    /// The `rpi_volt` hwmon alarm and the firmware's throttled word; `None` when the board
    /// has neither.
    fn power(&self) -> Option<PowerFacts> {
        let under_voltage_alarm = self
            .numbered(HWMON, "hwmon")
            .into_iter()
            .find(|(_, dir)| {
                std::fs::read_to_string(dir.join("name")).is_ok_and(|n| n.trim() == "rpi_volt")
            })
            .and_then(|(_, dir)| std::fs::read_to_string(dir.join("in0_lcrit_alarm")).ok())
            .and_then(|text| parse::parse_u64(&text, "in0_lcrit_alarm").ok())
            .map(|alarm| alarm != 0);
        let throttled = self.parse_opt(RPI_FIRMWARE_THROTTLED, parse::parse_throttled);
        (under_voltage_alarm.is_some() || throttled.is_some()).then_some(PowerFacts {
            under_voltage_alarm,
            throttled,
        })
    }

    fn psi(&self) -> Option<Psi> {
        let [cpu, memory, io] = PSI.map(|path| self.parse_opt(path, parse::parse_psi));
        (cpu.is_some() || memory.is_some() || io.is_some()).then_some(Psi { cpu, memory, io })
    }
}
