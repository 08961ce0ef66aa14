//! Figures of a process from Linux's `/proc` (proc(5)), for benchmarks and soak checks.

/// VmRSS of `pid` in KiB, from `/proc/<pid>/status`; `None` if the process is gone or the
/// line is missing.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// VmHWM of `pid` in KiB (its peak resident set), from `/proc/<pid>/status`; `None` if the
/// process is gone or the line is missing.
pub fn vm_hwm_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// CPU time `pid` has used, user and system, in seconds (`utime` + `stime` of
/// `/proc/<pid>/stat`, USER_HZ = 100); `None` if the process is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command: utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Open file descriptors of `pid`: the entries of `/proc/<pid>/fd` (0 if unreadable).
pub fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}
