//! Figures of a process from Linux's `/proc` (proc(5)), for benchmarks and soak checks.

/// VmRSS of `pid` in KiB, from `/proc/<pid>/status`; `None` if the process is gone or the
/// line is missing.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Open file descriptors of `pid`: the entries of `/proc/<pid>/fd` (0 if unreadable).
pub fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}
