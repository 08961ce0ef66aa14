//! Small procfs/sysfs values: integers, identifiers, `/proc/loadavg`, hugepage dir names.

use crate::ParseError;

/// A single decimal integer file such as `/proc/sys/kernel/pid_max`,
/// `/sys/fs/cgroup/memory/memory.usage_in_bytes` or `nr_hugepages` (surrounding whitespace
/// allowed). `what` names the value in the error.
pub fn parse_u64(text: &str, what: &'static str) -> Result<u64, ParseError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(ParseError::Empty);
    }
    if !trimmed.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::invalid(what, trimmed));
    }
    trimmed
        .parse()
        .map_err(|_| ParseError::invalid(what, trimmed))
}

/// Busy CPU time of the whole host from `/proc/stat`'s first (`cpu`) line, milliseconds:
/// user + nice + system + irq + softirq + steal, in USER_HZ ticks (100 a second on every
/// Linux architecture, `USER_HZ` in the kernel's `include/asm-generic/param.h`; the fields:
/// `Documentation/filesystems/proc.rst`, "1.8 Miscellaneous kernel statistics"). Guest time
/// is already counted in user and nice. The fallback where no cgroup accounts the root.
pub fn parse_proc_stat_busy_ms(text: &str) -> Result<u64, ParseError> {
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix("cpu "))
        .ok_or(ParseError::Empty)?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .map(|f| parse_u64(f, "/proc/stat cpu field"))
        .collect::<Result<_, _>>()?;
    // user nice system idle iowait irq softirq steal
    let [user, nice, system, _idle, _iowait, irq, softirq, steal, ..] = fields[..] else {
        return Err(ParseError::invalid("/proc/stat cpu line", line.trim()));
    };
    let ticks = [user, nice, system, irq, softirq, steal]
        .iter()
        .fold(0u64, |sum, t| sum.saturating_add(*t));
    Ok(ticks.saturating_mul(10))
}

/// An identifier file (`boot_id`, `machine-id`, `product_uuid`, device-tree `system-id`…):
/// surrounding whitespace and NULs stripped (device-tree strings end in NUL). `None` when
/// nothing is left.
pub fn parse_id(text: &str) -> Option<String> {
    let id = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!id.is_empty()).then(|| id.to_owned())
}

/// Number of tasks (processes and threads) on the system: the denominator of the fourth field
/// of `/proc/loadavg`, `"0.27 0.16 0.06 1/84 3617"` → 84
/// (kubelet `pkg/kubelet/stats/pidlimit/pidlimit_linux.go: runningTaskCount`, which requires
/// at least 5 fields).
pub fn parse_loadavg(text: &str) -> Result<u64, ParseError> {
    let mut fields = text.split_whitespace();
    let tasks = fields.nth(3);
    if fields.next().is_none() {
        return Err(ParseError::invalid("loadavg (want 5 fields)", text.trim()));
    }
    let (_, total) = tasks
        .and_then(|tasks| tasks.split_once('/'))
        .ok_or_else(|| ParseError::invalid("loadavg task field", tasks.unwrap_or_default()))?;
    if total.is_empty() {
        return Err(ParseError::invalid("loadavg task count", total));
    }
    parse_u64(total, "loadavg task count")
}

/// Page size in bytes from a `/sys/kernel/mm/hugepages` entry name, `"hugepages-2048kB"` →
/// 2097152 (cadvisor `machine/info.go: GetHugePagesInfo`). `None` for any other name.
pub fn parse_hugepages_dir(name: &str) -> Option<u64> {
    let kib = name.strip_prefix("hugepages-")?.strip_suffix("kB")?;
    if kib.is_empty() || !kib.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    kib.parse::<u64>().ok()?.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_busy_time() {
        let stat =
            "cpu  2104239 0 485702 4250027 32610 0 17536 6054 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        assert_eq!(
            parse_proc_stat_busy_ms(stat),
            Ok((2_104_239 + 485_702 + 17_536 + 6_054) * 10)
        );
        assert_eq!(
            parse_proc_stat_busy_ms("intr 1 2\n"),
            Err(ParseError::Empty)
        );
        assert_eq!(
            parse_proc_stat_busy_ms("cpu  1 2 3\n"),
            Err(ParseError::invalid("/proc/stat cpu line", "1 2 3"))
        );
    }

    #[test]
    fn u64_table() {
        let cases: &[(&str, Result<u64, ParseError>)] = &[
            ("4194304\n", Ok(4_194_304)),
            (" 0 ", Ok(0)),
            ("18446744073709551615", Ok(u64::MAX)),
            ("", Err(ParseError::Empty)),
            ("\n", Err(ParseError::Empty)),
            ("-1\n", Err(ParseError::invalid("n", "-1"))),
            ("+1", Err(ParseError::invalid("n", "+1"))),
            ("12 34", Err(ParseError::invalid("n", "12 34"))),
            ("max\n", Err(ParseError::invalid("n", "max"))),
            (
                "18446744073709551616",
                Err(ParseError::invalid("n", "18446744073709551616")),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(&parse_u64(input, "n"), want, "{input:?}");
        }
    }

    #[test]
    fn id_table() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                "3f1c6a2e-8b4d-4e0f-9a57-2c1d9e7b6a40\n",
                Some("3f1c6a2e-8b4d-4e0f-9a57-2c1d9e7b6a40"),
            ),
            ("IBM,0123456789\0", Some("IBM,0123456789")),
            ("  abc \0\0\n", Some("abc")),
            ("", None),
            ("\n", None),
            ("\0", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_id(input).as_deref(), *want, "{input:?}");
        }
    }

    #[test]
    fn loadavg_table() {
        let cases: &[(&str, Result<u64, ParseError>)] = &[
            ("0.27 0.16 0.06 1/84 3617\n", Ok(84)),
            ("0.00 0.01 0.05 2/3518 12345", Ok(3518)),
            ("", Err(ParseError::invalid("loadavg (want 5 fields)", ""))),
            (
                "0.27 0.16 0.06 1/84\n",
                Err(ParseError::invalid(
                    "loadavg (want 5 fields)",
                    "0.27 0.16 0.06 1/84",
                )),
            ),
            (
                "0.27 0.16 0.06 184 3617",
                Err(ParseError::invalid("loadavg task field", "184")),
            ),
            (
                "0.27 0.16 0.06 1/x 3617",
                Err(ParseError::invalid("loadavg task count", "x")),
            ),
            (
                "0.27 0.16 0.06 1/ 3617",
                Err(ParseError::invalid("loadavg task count", "")),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(&parse_loadavg(input), want, "{input:?}");
        }
    }

    #[test]
    fn hugepages_dir_table() {
        let cases: &[(&str, Option<u64>)] = &[
            ("hugepages-2048kB", Some(2_097_152)),
            ("hugepages-1048576kB", Some(1_073_741_824)),
            ("hugepages-64kB", Some(65_536)),
            ("hugepages-kB", None),
            ("hugepages-2048", None),
            ("hugepages-2MB", None),
            ("hugepages--1kB", None),
            ("hugepages-99999999999999999999kB", None),
            ("hugepages-18014398509481984kB", None),
            ("README", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_hugepages_dir(input), *want, "{input:?}");
        }
    }
}
