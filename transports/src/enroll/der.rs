//! The little DER and PEM that enrollment writes and reads by hand, so the agent carries no
//! ASN.1 or X.509 crate of its own: one TLV written or read, PEM armour, and a certificate's
//! validity dates.

use base64::Engine as _;

/// One DER TLV: `tag`, the definite length of `content`, `content`.
pub(super) fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let len = content.len();
    let mut out = Vec::with_capacity(content.len() + 6);
    out.push(tag);
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// PEM of `der` under `label`: base64 in 64-character lines (RFC 7468).
pub fn pem(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// `(notBefore, notAfter)` of an X.509 certificate (DER), Unix seconds; `None` when it does
/// not parse that far. A reader of the validity alone (RFC 5280 §4.1.2.5: UTCTime for years
/// before 2050, GeneralizedTime after), so that the agent judges its certificate's age
/// without a certificate parser of its own.
pub fn certificate_validity(der: &[u8]) -> Option<(i64, i64)> {
    let mut input = der;
    let (_, mut certificate) = read_tlv(&mut input, 0x30)?;
    let (_, mut tbs) = read_tlv(&mut certificate, 0x30)?;
    if tbs.first() == Some(&0xa0) {
        read_tlv(&mut tbs, 0xa0)?; // version
    }
    read_tlv(&mut tbs, 0x02)?; // serialNumber
    read_tlv(&mut tbs, 0x30)?; // signature
    read_tlv(&mut tbs, 0x30)?; // issuer
    let (_, mut validity) = read_tlv(&mut tbs, 0x30)?;
    let mut time = || {
        let tag = *validity.first()?;
        let (_, text) = read_tlv(&mut validity, tag)?;
        parse_time(tag, std::str::from_utf8(text).ok()?)
    };
    Some((time()?, time()?))
}

/// Reads one TLV of tag `tag` from the front of `input`: `(tag, content)`.
fn read_tlv<'a>(input: &mut &'a [u8], tag: u8) -> Option<(u8, &'a [u8])> {
    let (&found, rest) = input.split_first()?;
    if found != tag {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b))
    };
    if rest.len() < len {
        return None;
    }
    let (content, after) = rest.split_at(len);
    *input = after;
    Some((found, content))
}

/// A UTCTime (`0x17`, `YYMMDDHHMMSSZ`) or GeneralizedTime (`0x18`, `YYYYMMDDHHMMSSZ`) as
/// Unix seconds.
fn parse_time(tag: u8, text: &str) -> Option<i64> {
    let digits = text.strip_suffix('Z')?;
    let (year, rest) = match (tag, digits.len()) {
        (0x17, 12) => {
            let yy: i64 = digits.get(..2)?.parse().ok()?;
            (
                if yy < 50 { 2000 + yy } else { 1900 + yy },
                digits.get(2..)?,
            )
        }
        (0x18, 14) => (digits.get(..4)?.parse().ok()?, digits.get(4..)?),
        _ => return None,
    };
    let field = |i: usize| -> Option<i64> { rest.get(i..i + 2)?.parse().ok() };
    let (month, day, hour, minute, second) =
        (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
    // days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
}
