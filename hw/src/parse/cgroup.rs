//! cgroup memory accounting: `memory.stat` and the working-set rule.

use std::collections::BTreeMap;

use crate::ParseError;

/// Parses a cgroup `memory.stat` file (v1 or v2: `key value` lines, values in bytes or
/// counts) into a map. Blank lines are skipped; any other line that is not `key <u64>` is an
/// error.
pub fn parse_memory_stat(text: &str) -> Result<BTreeMap<String, u64>, ParseError> {
    let mut stats = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        match (fields.next(), fields.next(), fields.next()) {
            (None, _, _) => {}
            (Some(key), Some(value), None) => {
                let value = value
                    .parse::<u64>()
                    .map_err(|_| ParseError::invalid("memory.stat line", line))?;
                stats.insert(key.to_owned(), value);
            }
            _ => return Err(ParseError::invalid("memory.stat line", line)),
        }
    }
    Ok(stats)
}

/// Working set in bytes: `usage − inactive_file`, floored at 0 (cadvisor
/// `container/libcontainer/handler.go: setMemoryStats`; kubelet eviction signal
/// `memory.available = capacity − workingSet`, `pkg/kubelet/eviction/helpers.go`).
pub fn working_set_bytes(usage_bytes: u64, inactive_file_bytes: u64) -> u64 {
    usage_bytes.saturating_sub(inactive_file_bytes)
}

/// `usage_usec` of a cgroup v2 `cpu.stat` (flat keyed: `key value` lines; kernel
/// `Documentation/admin-guide/cgroup-v2.rst`, "cpu.stat"): the CPU time of every task in the
/// cgroup, microseconds.
pub fn parse_cpu_stat_usage_usec(text: &str) -> Result<u64, ParseError> {
    text.lines()
        .find_map(|line| line.strip_prefix("usage_usec "))
        .ok_or(ParseError::Empty)
        .and_then(|value| super::parse_u64(value, "cpu.stat usage_usec"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_stat_usage() {
        let stat = "usage_usec 26074783096\nuser_usec 21042396874\nsystem_usec 5032386221\n";
        assert_eq!(parse_cpu_stat_usage_usec(stat), Ok(26_074_783_096));
        assert_eq!(
            parse_cpu_stat_usage_usec("user_usec 1\n"),
            Err(ParseError::Empty)
        );
        assert_eq!(
            parse_cpu_stat_usage_usec("usage_usec x\n"),
            Err(ParseError::invalid("cpu.stat usage_usec", "x"))
        );
    }

    #[test]
    fn memory_stat_table() {
        let ok = parse_memory_stat("cache 9289728\nrss 5058560\n\ntotal_inactive_file 262053888\n");
        let want: BTreeMap<String, u64> = [
            ("cache", 9_289_728),
            ("rss", 5_058_560),
            ("total_inactive_file", 262_053_888),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(ok, Ok(want));
        assert_eq!(parse_memory_stat(""), Ok(BTreeMap::new()));

        let bad: &[(&str, &str)] = &[
            ("cache\n", "cache"),
            ("cache 1 2\n", "cache 1 2"),
            ("cache -1\n", "cache -1"),
            ("cache 1.5\n", "cache 1.5"),
        ];
        for (input, line) in bad {
            assert_eq!(
                parse_memory_stat(input),
                Err(ParseError::invalid("memory.stat line", line)),
                "{input:?}"
            );
        }
    }

    #[test]
    fn working_set_table() {
        let cases = [
            (1000, 200, 800),
            (1000, 1000, 0),
            (1000, 5000, 0),
            (0, 0, 0),
            (u64::MAX, 0, u64::MAX),
        ];
        for (usage, inactive, want) in cases {
            assert_eq!(
                working_set_bytes(usage, inactive),
                want,
                "{usage} {inactive}"
            );
        }
    }
}
