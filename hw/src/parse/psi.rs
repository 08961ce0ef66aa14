//! Pressure stall information: `/proc/pressure/{cpu,memory,io}`.

use crate::{ParseError, PsiLine, PsiResource};

/// Parses one `/proc/pressure/*` file (kernel `Documentation/accounting/psi.rst`):
///
/// ```text
/// some avg10=1.56 avg60=1.62 avg300=1.04 total=5074370
/// full avg10=0.00 avg60=0.00 avg300=0.00 total=0
/// ```
///
/// `some` is required; `full` is optional (kernels before 5.13 print no `full` line for cpu).
pub fn parse_psi(text: &str) -> Result<PsiResource, ParseError> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        match fields.next() {
            None => {}
            Some("some") => some = Some(psi_line(fields, line)?),
            Some("full") => full = Some(psi_line(fields, line)?),
            Some(_) => return Err(ParseError::invalid("PSI line", line)),
        }
    }
    Ok(PsiResource {
        some: some.ok_or(ParseError::Missing("PSI some line"))?,
        full,
    })
}

fn psi_line<'a>(fields: impl Iterator<Item = &'a str>, line: &str) -> Result<PsiLine, ParseError> {
    let bad = || ParseError::invalid("PSI line", line);
    let (mut avg10, mut avg60, mut avg300, mut total_us) = (None, None, None, None);
    for field in fields {
        let (key, value) = field.split_once('=').ok_or_else(bad)?;
        match key {
            "avg10" => avg10 = Some(percent(value).ok_or_else(bad)?),
            "avg60" => avg60 = Some(percent(value).ok_or_else(bad)?),
            "avg300" => avg300 = Some(percent(value).ok_or_else(bad)?),
            "total" => total_us = Some(value.parse::<u64>().map_err(|_| bad())?),
            // Unknown keys are tolerated so a future kernel field does not break parsing.
            _ => {}
        }
    }
    match (avg10, avg60, avg300, total_us) {
        (Some(avg10), Some(avg60), Some(avg300), Some(total_us)) => Ok(PsiLine {
            avg10,
            avg60,
            avg300,
            total_us,
        }),
        _ => Err(bad()),
    }
}

/// A finite, non-negative percentage such as `1.56`.
fn percent(value: &str) -> Option<f64> {
    let v: f64 = value.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(avg10: f64, avg60: f64, avg300: f64, total_us: u64) -> PsiLine {
        PsiLine {
            avg10,
            avg60,
            avg300,
            total_us,
        }
    }

    #[test]
    fn psi_table() {
        let cases: &[(&str, Result<PsiResource, ParseError>)] = &[
            (
                "some avg10=1.56 avg60=1.62 avg300=1.04 total=5074370\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
                Ok(PsiResource {
                    some: line(1.56, 1.62, 1.04, 5_074_370),
                    full: Some(line(0.0, 0.0, 0.0, 0)),
                }),
            ),
            (
                "some avg10=0.00 avg60=0.12 avg300=0.30 total=123\n",
                Ok(PsiResource {
                    some: line(0.0, 0.12, 0.30, 123),
                    full: None,
                }),
            ),
            (
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=1 extra=7\n",
                Ok(PsiResource {
                    some: line(0.0, 0.0, 0.0, 1),
                    full: None,
                }),
            ),
            ("", Err(ParseError::Missing("PSI some line"))),
            (
                "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
                Err(ParseError::Missing("PSI some line")),
            ),
            (
                "some avg10=0.00 avg60=0.00 total=0\n",
                Err(ParseError::invalid(
                    "PSI line",
                    "some avg10=0.00 avg60=0.00 total=0",
                )),
            ),
            (
                "some avg10=NaN avg60=0.00 avg300=0.00 total=0\n",
                Err(ParseError::invalid(
                    "PSI line",
                    "some avg10=NaN avg60=0.00 avg300=0.00 total=0",
                )),
            ),
            (
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=-1\n",
                Err(ParseError::invalid(
                    "PSI line",
                    "some avg10=0.00 avg60=0.00 avg300=0.00 total=-1",
                )),
            ),
            (
                "some avg10 0.00\n",
                Err(ParseError::invalid("PSI line", "some avg10 0.00")),
            ),
            (
                "partial avg10=0.00\n",
                Err(ParseError::invalid("PSI line", "partial avg10=0.00")),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(&parse_psi(input), want, "{input:?}");
        }
    }
}
