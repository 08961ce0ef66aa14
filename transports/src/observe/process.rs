//! The process's own metrics (client_golang's `process` collector), read from procfs at
//! scrape time.

/// The process's own metrics, as every Prometheus client library exports them
/// (client_golang's `process` collector): `process_cpu_seconds_total` (user + system CPU,
/// seconds), `process_resident_memory_bytes` (RSS, bytes), `process_start_time_seconds`
/// (Unix seconds) and `process_open_fds`. Read from procfs at scrape time (proc(5):
/// `/proc/self/stat` fields 14, 15 and 22 in clock ticks, `/proc/self/status` `VmRSS` in
/// KiB, `/proc/stat` `btime`, the entries of `/proc/self/fd`). Register it with
/// `registry.register_collector(Box::new(ProcessCollector))`.
///
/// Clock ticks are taken as 100 per second (`USER_HZ`, which the kernel fixes at 100 for
/// user space on every architecture edgebeat builds for), as prometheus/procfs does
/// (`proc_stat.go: userHZ`) rather than calling `sysconf` through unsafe code. A series
/// whose file cannot be read (no procfs) is left out of the scrape; the others stay.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessCollector;

/// Clock ticks per second in `/proc/self/stat` (`USER_HZ`).
const USER_HZ: f64 = 100.0;

/// What [`ProcessCollector`] reads, `None` for what could not be read.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    /// User + system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size, bytes.
    pub resident_bytes: Option<u64>,
    /// Start time, Unix seconds.
    pub start_time_seconds: Option<f64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
}

impl ProcessStats {
    /// Reads this process's figures from `/proc` (see [`ProcessCollector`]).
    pub fn read() -> Self {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let fields = stat.as_deref().and_then(stat_fields);
        let btime = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        Self {
            cpu_seconds: fields.map(|(utime, stime, _)| (utime + stime) as f64 / USER_HZ),
            resident_bytes: std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| vm_rss_bytes(&s)),
            start_time_seconds: fields
                .zip(btime)
                .map(|((_, _, start), btime)| btime as f64 + start as f64 / USER_HZ),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|dir| dir.count() as u64),
        }
    }
}

/// `utime`, `stime` and `starttime` (fields 14, 15 and 22 of proc(5)'s `/proc/pid/stat`,
/// clock ticks). Fields are counted after the command name's closing parenthesis, since the
/// name itself may hold spaces and parentheses.
pub(super) fn stat_fields(stat: &str) -> Option<(u64, u64, u64)> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // After the name come field 3 (state) onwards.
    let mut fields = after_comm.split_ascii_whitespace();
    let field = |fields: &mut std::str::SplitAsciiWhitespace<'_>, skip: usize| {
        fields.nth(skip).and_then(|f| f.parse::<u64>().ok())
    };
    let utime = field(&mut fields, 14 - 3)?;
    let stime = field(&mut fields, 0)?;
    let start = field(&mut fields, 22 - 15 - 1)?;
    Some((utime, stime, start))
}

/// `VmRSS` of `/proc/pid/status` in bytes (the file says kB: KiB).
pub(super) fn vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line["VmRSS:".len()..]
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// `btime` of `/proc/stat`: the boot time, Unix seconds.
pub(super) fn boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric as _;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        use prometheus_client::registry::Unit;
        let stats = ProcessStats::read();
        if let Some(cpu) = stats.cpu_seconds {
            let counter = ConstCounter::new(cpu);
            let metric = encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds.",
                Some(&Unit::Seconds),
                counter.metric_type(),
            )?;
            counter.encode(metric)?;
        }
        let gauges = [
            (
                "process_resident_memory",
                "Resident memory size in bytes.",
                Some(Unit::Bytes),
                stats.resident_bytes.map(|b| b as f64),
            ),
            (
                "process_start_time",
                "Start time of the process since unix epoch in seconds.",
                Some(Unit::Seconds),
                stats.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                stats.open_fds.map(|n| n as f64),
            ),
        ];
        for (name, help, unit, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(value);
            let metric =
                encoder.encode_descriptor(name, help, unit.as_ref(), gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}
