//! CPU counts: `/sys/devices/system/cpu/online` and `/proc/cpuinfo`.

use crate::ParseError;

/// Number of CPUs in a kernel CPU list, as in `/sys/devices/system/cpu/online`: comma-separated
/// ids or inclusive ranges, `"0-3,5"` → 5 (format: kernel
/// `Documentation/ABI/testing/sysfs-devices-system-cpu`, printed by `cpumap_print_to_pagebuf`).
/// Overlapping entries are counted twice; the kernel never prints them.
pub fn parse_cpu_list(text: &str) -> Result<u32, ParseError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(ParseError::Empty);
    }
    let mut count: u32 = 0;
    for item in text.split(',') {
        let item = item.trim();
        let (first, last) = match item.split_once('-') {
            Some((first, last)) => (cpu_id(first, item)?, cpu_id(last, item)?),
            None => {
                let id = cpu_id(item, item)?;
                (id, id)
            }
        };
        let n = last
            .checked_sub(first)
            .and_then(|span| span.checked_add(1))
            .ok_or_else(|| ParseError::invalid("CPU range", item))?;
        count = count
            .checked_add(n)
            .ok_or_else(|| ParseError::invalid("CPU list (too many CPUs)", text))?;
    }
    Ok(count)
}

fn cpu_id(text: &str, item: &str) -> Result<u32, ParseError> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::invalid("CPU list entry", item));
    }
    text.parse()
        .map_err(|_| ParseError::invalid("CPU list entry", item))
}

/// Number of `processor` lines in `/proc/cpuinfo` (one per online logical CPU on x86 and
/// arm64), the fallback when the online list is unreadable. Zero lines is an error.
pub fn parse_cpuinfo_processors(text: &str) -> Result<u32, ParseError> {
    let count = text
        .lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(key, _)| key.trim() == "processor")
        .count();
    match u32::try_from(count) {
        Ok(0) => Err(ParseError::Missing("processor lines")),
        Ok(n) => Ok(n),
        Err(_) => Err(ParseError::invalid("processor count", &count.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_list_table() {
        let cases: &[(&str, Result<u32, ParseError>)] = &[
            ("0\n", Ok(1)),
            ("0-3\n", Ok(4)),
            ("0-3,5", Ok(5)),
            ("0,2,4-7\n", Ok(6)),
            ("0-127", Ok(128)),
            (" 0-1 , 3 \n", Ok(3)),
            ("", Err(ParseError::Empty)),
            ("\n", Err(ParseError::Empty)),
            ("3-1", Err(ParseError::invalid("CPU range", "3-1"))),
            ("0-", Err(ParseError::invalid("CPU list entry", "0-"))),
            ("-1", Err(ParseError::invalid("CPU list entry", "-1"))),
            ("a-b", Err(ParseError::invalid("CPU list entry", "a-b"))),
            ("0,,1", Err(ParseError::invalid("CPU list entry", ""))),
            ("+1", Err(ParseError::invalid("CPU list entry", "+1"))),
            (
                "0-4294967295",
                Err(ParseError::invalid("CPU range", "0-4294967295")),
            ),
            (
                "0-4294967294,0-1",
                Err(ParseError::invalid(
                    "CPU list (too many CPUs)",
                    "0-4294967294,0-1",
                )),
            ),
            (
                "99999999999",
                Err(ParseError::invalid("CPU list entry", "99999999999")),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(&parse_cpu_list(input), want, "{input:?}");
        }
    }

    #[test]
    fn cpuinfo_table() {
        let arm = "processor\t: 0\nBogoMIPS\t: 108.00\n\nprocessor\t: 1\nBogoMIPS\t: 108.00\n\nHardware\t: BCM2835\n";
        let x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: x\n\nprocessor\t: 1\n\nprocessor\t: 2\n";
        let cases: &[(&str, Result<u32, ParseError>)] = &[
            (arm, Ok(2)),
            (x86, Ok(3)),
            ("", Err(ParseError::Missing("processor lines"))),
            (
                "processors: 4\nprocessor 0\n",
                Err(ParseError::Missing("processor lines")),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(&parse_cpuinfo_processors(input), want, "{input:?}");
        }
    }
}
