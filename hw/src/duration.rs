//! Go's duration grammar, as `metav1.Duration` fields of KubeletConfiguration are written
//! (`time.ParseDuration` in Go's `src/time/format.go`): the one grammar of every duration
//! edgebeat reads, in the agent's configuration file and in the gateway's flags.

use std::time::Duration;

/// A text that is not a Go duration ([`parse_duration`]): the text given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a duration: give numbers with units ns, us, ms, s, m or h, e.g. 10s, 1m30s, 1.5h or 24h"
)]
pub struct DurationError {
    /// The text given.
    pub text: String,
}

/// Parses a Go duration: a sequence of decimal numbers, each with a unit `ns`, `us`/`µs`,
/// `ms`, `s`, `m` or `h`, e.g. `"10s"`, `"1m30s"`, `"1.5h"`, `"300ms"`; `"0"` alone is
/// zero. Surrounding white space is ignored; negative durations are refused (nothing
/// edgebeat reads can be negative).
///
/// # Errors
/// [`DurationError`], with the text, for anything else (no unit, an unknown unit such as
/// `d`, a sign, an empty text, or a value too large for a [`Duration`]).
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        text: text.to_owned(),
    };
    let t = text.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() {
        return Err(err());
    }
    let mut rest = t;
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if num_end == 0 {
            return Err(err());
        }
        let value: f64 = rest[..num_end].parse().map_err(|_| err())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += value * seconds;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| err())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_and_others_are_refused_with_their_text() {
        for (text, want) in [
            ("10s", Duration::from_secs(10)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("300ms", Duration::from_millis(300)),
            ("24h", Duration::from_secs(86_400)),
            (" 0 ", Duration::ZERO),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for bad in ["", "10", "7d", "-1s", "1x", "s", "1e400h"] {
            assert_eq!(
                parse_duration(bad),
                Err(DurationError {
                    text: bad.to_owned()
                }),
                "{bad}"
            );
        }
    }
}
