//! `/proc/meminfo`.

use crate::ParseError;

/// The `/proc/meminfo` values hw uses, in bytes (the file's `kB` are KiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meminfo {
    /// `MemTotal` × 1024, bytes: the node's memory capacity (cadvisor
    /// `machine/machine.go: GetMachineMemoryCapacity`).
    pub total_bytes: u64,
}

/// Parses `/proc/meminfo` (`Key:   1234 kB` lines). `MemTotal` is required; other lines are
/// ignored, so new kernel fields never break parsing.
pub fn parse_meminfo(text: &str) -> Result<Meminfo, ParseError> {
    let mut total = None;
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        if key.trim() == "MemTotal" {
            total = Some(kib_to_bytes(rest, "MemTotal value")?);
        }
    }
    Ok(Meminfo {
        total_bytes: total.ok_or(ParseError::Missing("MemTotal"))?,
    })
}

/// `"  1234 kB"` → 1234 × 1024 bytes.
fn kib_to_bytes(rest: &str, what: &'static str) -> Result<u64, ParseError> {
    let mut fields = rest.split_whitespace();
    match (fields.next(), fields.next(), fields.next()) {
        (Some(number), Some("kB"), None) => number
            .parse::<u64>()
            .ok()
            .and_then(|kib| kib.checked_mul(1024))
            .ok_or_else(|| ParseError::invalid(what, rest.trim())),
        _ => Err(ParseError::invalid(what, rest.trim())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_table() {
        let cases: &[(&str, Result<Meminfo, ParseError>)] = &[
            (
                "MemTotal:        3885540 kB\nMemFree:          512000 kB\nMemAvailable:    2900000 kB\nHugePages_Total:       0\n",
                Ok(Meminfo {
                    total_bytes: 3_978_792_960,
                }),
            ),
            (
                "MemTotal: 1 kB\nMemFree: lots kB\n",
                Ok(Meminfo { total_bytes: 1024 }),
            ),
            ("", Err(ParseError::Missing("MemTotal"))),
            (
                "MemFree: 1 kB\nnot a line\n",
                Err(ParseError::Missing("MemTotal")),
            ),
            (
                "MemTotal: 12 MB\n",
                Err(ParseError::invalid("MemTotal value", "12 MB")),
            ),
            (
                "MemTotal: -5 kB\n",
                Err(ParseError::invalid("MemTotal value", "-5 kB")),
            ),
            (
                "MemTotal:\n",
                Err(ParseError::invalid("MemTotal value", "")),
            ),
            (
                "MemTotal: 18446744073709551615 kB\n",
                Err(ParseError::invalid(
                    "MemTotal value",
                    "18446744073709551615 kB",
                )),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(&parse_meminfo(input), want, "{input:?}");
        }
    }
}
