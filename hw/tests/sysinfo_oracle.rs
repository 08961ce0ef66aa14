//! `hw` against an independent reader of the live host: the `sysinfo` crate (its own
//! parsers of `/proc`, `uname(2)` and `sysconf`). `hw` stays the reader because it honours
//! the host root; this test checks that, on `/`, both agree on what they both report.

use std::time::{Duration, UNIX_EPOCH};

use edgebeat_hw::{Clock, HostRoot, ReadOptions, SystemClock, read_host_facts};
use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};

#[test]
fn hw_agrees_with_sysinfo_on_the_live_host() {
    let facts = read_host_facts(&HostRoot::default(), &ReadOptions::default()).unwrap();
    let sys = System::new_with_specifics(
        RefreshKind::nothing()
            .with_memory(MemoryRefreshKind::nothing().with_ram())
            .with_cpu(CpuRefreshKind::nothing()),
    )
    .unwrap();

    // MemTotal, bytes.
    assert_eq!(
        facts.memory.total_bytes,
        sys.total_memory(),
        "memory capacity"
    );
    // Online CPUs: hw reads /sys/devices/system/cpu/online, sysinfo the cpuN lines of
    // /proc/stat.
    assert_eq!(
        facts.logical_cpus as usize,
        sys.cpus().len(),
        "logical CPUs"
    );
    assert_eq!(
        facts.kernel_version,
        System::kernel_version().ok(),
        "kernel release"
    );
    assert_eq!(facts.hostname, System::host_name().ok(), "hostname");

    // Boot time: hw's clock gives wall time − CLOCK_BOOTTIME, sysinfo the `btime` line of
    // /proc/stat (whole seconds), so they agree to within a second plus rounding.
    let clock = SystemClock;
    let since_epoch = clock.now().duration_since(UNIX_EPOCH).unwrap();
    let booted_at = since_epoch.saturating_sub(clock.boottime());
    let sysinfo_booted_at = Duration::from_secs(System::boot_time().unwrap());
    let gap = booted_at.abs_diff(sysinfo_booted_at);
    assert!(
        gap <= Duration::from_secs(2),
        "boot time: hw {booted_at:?} sysinfo {sysinfo_booted_at:?}"
    );
}
