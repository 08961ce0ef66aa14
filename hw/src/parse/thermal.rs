//! Thermal and power sysfs values: temperatures, trip point types, the Raspberry Pi
//! firmware's throttled word.

use crate::{ParseError, Throttled, TripKind};

/// A thermal zone `temp` or `trip_point_<i>_temp`: a signed decimal integer of millidegrees
/// Celsius (kernel `Documentation/driver-api/thermal/sysfs-api.rst`), e.g. `"48312\n"`.
pub fn parse_millicelsius(text: &str) -> Result<i64, ParseError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(ParseError::Empty);
    }
    trimmed
        .parse()
        .map_err(|_| ParseError::invalid("millidegrees Celsius", trimmed))
}

/// A `trip_point_<i>_type`: `active`, `passive`, `hot` or `critical` (kernel
/// `drivers/thermal/thermal_sysfs.c: trip_point_type_show`). `None` for anything else.
pub fn parse_trip_kind(text: &str) -> Option<TripKind> {
    Some(match text.trim() {
        "active" => TripKind::Active,
        "passive" => TripKind::Passive,
        "hot" => TripKind::Hot,
        "critical" => TripKind::Critical,
        _ => return None,
    })
}

/// The Raspberry Pi firmware's `get_throttled` attribute: hexadecimal, with or without
/// `0x` (`"50005\n"`, or `vcgencmd`'s `"throttled=0x50005"`).
pub fn parse_throttled(text: &str) -> Result<Throttled, ParseError> {
    let trimmed = text.trim();
    let value = trimmed.strip_prefix("throttled=").unwrap_or(trimmed);
    let hex = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
        .unwrap_or(value);
    if hex.is_empty() {
        return Err(ParseError::Empty);
    }
    u32::from_str_radix(hex, 16)
        .map(Throttled)
        .map_err(|_| ParseError::invalid("throttled word", trimmed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperatures() {
        assert_eq!(parse_millicelsius("48312\n"), Ok(48312));
        assert_eq!(parse_millicelsius("-4000"), Ok(-4000));
        assert_eq!(parse_millicelsius(" \n"), Err(ParseError::Empty));
        assert_eq!(
            parse_millicelsius("48.3"),
            Err(ParseError::Invalid {
                what: "millidegrees Celsius",
                text: "48.3".into()
            })
        );
    }

    #[test]
    fn trip_kinds() {
        assert_eq!(parse_trip_kind("passive\n"), Some(TripKind::Passive));
        assert_eq!(parse_trip_kind("critical"), Some(TripKind::Critical));
        assert_eq!(parse_trip_kind("hot"), Some(TripKind::Hot));
        assert_eq!(parse_trip_kind("active"), Some(TripKind::Active));
        assert_eq!(parse_trip_kind("warm"), None);
    }

    #[test]
    fn throttled_words_and_their_bits() {
        let t = parse_throttled("50005\n").unwrap();
        assert_eq!(t, Throttled(0x50005));
        assert!(t.under_voltage() && t.throttled() && !t.frequency_capped());
        assert!(t.under_voltage_occurred() && t.throttled_occurred());
        assert!(!t.soft_temp_limit() && !t.soft_temp_limit_occurred());
        assert_eq!(parse_throttled("throttled=0x80008"), Ok(Throttled(0x80008)));
        assert!(parse_throttled("0x80008").unwrap().soft_temp_limit());
        assert_eq!(parse_throttled("0"), Ok(Throttled(0)));
        assert_eq!(
            parse_throttled("zz"),
            Err(ParseError::Invalid {
                what: "throttled word",
                text: "zz".into()
            })
        );
        assert_eq!(parse_throttled("0x"), Err(ParseError::Empty));
    }
}
