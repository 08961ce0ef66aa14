//! Kubernetes resource quantities: the few parse and format rules the agent needs.
//!
//! Mirrors `k8s.io/apimachinery/pkg/api/resource` for whole numbers: parsing of decimal and
//! binary suffixes, and canonical formatting (`"4"`, `"3500m"`, `"8011400Ki"`, plain bytes
//! when not a multiple of 1024).

/// A parsed threshold or reservation: an absolute amount or a percentage of capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    /// Absolute value in the resource's base unit (bytes, PIDs), rounded up.
    Absolute(u64),
    /// Percentage of capacity, as kubelet keeps it: a float32 fraction (10% → 0.1).
    Percentage(f32),
}

impl Amount {
    /// The amount in base units against `capacity`: a percentage becomes
    /// `int64(capacity × percentage)` with the percentage as float32, as kubelet's
    /// `GetThresholdQuantity` does (so 10% of 62671097856 is 6267109878).
    pub fn resolve(self, capacity: u64) -> u64 {
        match self {
            Amount::Absolute(v) => v,
            // Go: int64(float64(capacity) * float64(float32 percentage)).
            Amount::Percentage(p) => (capacity as f64 * f64::from(p)) as u64,
        }
    }
}

/// Why a quantity string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid quantity {0:?}: use a number with an optional suffix such as 100Mi, 1Gi, 500M or a percentage such as 10%"
)]
pub struct QuantityError(pub String);

/// Parses a quantity (`"100Mi"`, `"1.5Gi"`, `"500M"`, `"1000"`) or, when `allow_percent`,
/// a percentage (`"10%"`) into an [`Amount`]. Fractions are rounded up to whole units.
///
/// Errors: [`QuantityError`] for anything else (negative, empty, unknown suffix, `m` on a
/// byte quantity).
pub fn parse_amount(text: &str, allow_percent: bool) -> Result<Amount, QuantityError> {
    let err = || QuantityError(text.to_owned());
    let t = text.trim();
    if let Some(p) = t.strip_suffix('%') {
        if !allow_percent {
            return Err(err());
        }
        let v: f32 = p.trim().parse().map_err(|_| err())?;
        if !(0.0..=100.0).contains(&v) {
            return Err(err());
        }
        return Ok(Amount::Percentage(v / 100.0));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    let multiplier: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return Err(err()),
    };
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err());
    }
    if frac_part.len() > 18 || int_part.len() > 20 {
        return Err(err());
    }
    let int: u128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().map_err(|_| err())?
    };
    let frac: u128 = if frac_part.is_empty() {
        0
    } else {
        frac_part.parse().map_err(|_| err())?
    };
    let scale = 10u128.pow(frac_part.len() as u32);
    let total = int
        .checked_mul(multiplier)
        .and_then(|v| v.checked_add((frac * multiplier).div_ceil(scale)))
        .ok_or_else(err)?;
    u64::try_from(total)
        .map(Amount::Absolute)
        .map_err(|_| err())
}

/// Formats bytes (or any binary-SI amount) canonically: the largest of Ki, Mi, Gi, Ti, Pi,
/// Ei that divides the value exactly, else the plain integer (`8203673600` → `"8011400Ki"`,
/// `56403987978` → `"56403987978"`, `0` → `"0"`).
pub fn format_binary(value: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if value == 0 {
        return "0".into();
    }
    let mut v = value;
    let mut idx = None;
    for (i, _) in SUFFIXES.iter().enumerate() {
        if !v.is_multiple_of(1024) {
            break;
        }
        v /= 1024;
        idx = Some(i);
    }
    match idx {
        Some(i) => format!("{v}{}", SUFFIXES[i]),
        None => value.to_string(),
    }
}

/// Formats a CPU amount in millicores canonically: whole cores as `"4"`, else `"3500m"`.
pub fn format_millicores(millis: u64) -> String {
    if millis.is_multiple_of(1000) {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

/// Parses a CPU quantity (`"500m"`, `"1"`, `"0.5"`) into millicores, rounding up.
///
/// Errors: [`QuantityError`] when it is not a CPU quantity.
pub fn parse_millicores(text: &str) -> Result<u64, QuantityError> {
    let t = text.trim();
    if let Some(m) = t.strip_suffix('m') {
        return m.parse().map_err(|_| QuantityError(text.to_owned()));
    }
    match parse_amount(&format!("{t}k"), false) {
        // "0.5" cores = 500 m: parse with a ×1000 suffix.
        Ok(Amount::Absolute(v)) => Ok(v),
        _ => Err(QuantityError(text.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes_and_fractions() {
        let cases = [
            ("100Mi", 104_857_600),
            ("1Gi", 1_073_741_824),
            ("1.5Gi", 1_610_612_736),
            ("500M", 500_000_000),
            ("1000", 1000),
            ("0.5Ki", 512),
            ("1.0001", 2),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_amount(text, false),
                Ok(Amount::Absolute(want)),
                "{text}"
            );
        }
        assert_eq!(parse_amount("10%", true), Ok(Amount::Percentage(0.1)));
        for bad in ["", "10%", "-1", "1Q", "1.2.3", "Mi", "1e3"] {
            assert_eq!(
                parse_amount(bad, false),
                Err(QuantityError(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(
            parse_amount("101%", true),
            Err(QuantityError("101%".into()))
        );
    }

    #[test]
    fn percentage_resolves_like_kubelet() {
        // kubelet converts with a float32 percentage (`pkg/kubelet/eviction/api/types.go:
        // GetThresholdQuantity`).
        assert_eq!(
            Amount::Percentage(0.1).resolve(62_671_097_856),
            6_267_109_878
        );
        assert_eq!(Amount::Absolute(5).resolve(1), 5);
    }

    #[test]
    fn formats_canonically() {
        assert_eq!(format_binary(8_203_673_600), "8011400Ki");
        assert_eq!(format_binary(56_403_987_978), "56403987978");
        assert_eq!(format_binary(2 * 1024 * 1024), "2Mi");
        assert_eq!(format_binary(1 << 30), "1Gi");
        assert_eq!(format_binary(0), "0");
        assert_eq!(format_binary(1000), "1000");
        assert_eq!(format_millicores(4000), "4");
        assert_eq!(format_millicores(3500), "3500m");
        assert_eq!(parse_millicores("500m"), Ok(500));
        assert_eq!(parse_millicores("2"), Ok(2000));
        assert_eq!(parse_millicores("0.25"), Ok(250));
        assert_eq!(parse_millicores("x"), Err(QuantityError("x".into())));
    }
}
