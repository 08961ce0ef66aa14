use super::*;

const NOW: Duration = Duration::from_secs(1_800_000_000);
const MAX: Duration = Duration::from_secs(30);
const NOW_MS: i64 = 1_800_000_000_000;

#[test]
fn the_window_takes_its_edges_and_refuses_past_them() {
    assert_eq!(check_clock_window(NOW_MS, NOW, MAX), Ok(()));
    assert_eq!(check_clock_window(NOW_MS + 30_000, NOW, MAX), Ok(()));
    assert_eq!(check_clock_window(NOW_MS - 30_000, NOW, MAX), Ok(()));
    assert_eq!(
        check_clock_window(NOW_MS + 30_001, NOW, MAX),
        Err(ClockSkew {
            ahead_ms: 30_001,
            max: MAX
        })
    );
    assert_eq!(
        check_clock_window(NOW_MS - 30_001, NOW, MAX),
        Err(ClockSkew {
            ahead_ms: -30_001,
            max: MAX
        })
    );
}

#[test]
fn any_wall_time_is_judged_without_panic_or_wrap() {
    // The sender chooses wall_time_ms: i64's ends must be refused, not wrap into the
    // window (i64::MIN - now wraps to a large positive number without saturation).
    assert_eq!(
        check_clock_window(i64::MIN, NOW, MAX),
        Err(ClockSkew {
            ahead_ms: i64::MIN,
            max: MAX
        })
    );
    assert_eq!(
        check_clock_window(i64::MIN + 1, Duration::ZERO, MAX),
        Err(ClockSkew {
            ahead_ms: i64::MIN + 1,
            max: MAX
        })
    );
    assert_eq!(
        check_clock_window(i64::MAX, NOW, MAX),
        Err(ClockSkew {
            ahead_ms: i64::MAX - NOW_MS,
            max: MAX
        })
    );
    assert_eq!(
        check_clock_window(0, NOW, MAX),
        Err(ClockSkew {
            ahead_ms: -NOW_MS,
            max: MAX
        })
    );
    // A gateway clock beyond i64 milliseconds, and a window wider than i64's range.
    assert_eq!(
        check_clock_window(i64::MAX, Duration::MAX, MAX),
        Err(ClockSkew {
            ahead_ms: i64::MIN,
            max: MAX
        })
    );
    assert_eq!(check_clock_window(i64::MIN, NOW, Duration::MAX), Ok(()));
}

#[test]
fn the_refusal_says_by_how_much_and_what_to_fix() {
    let skew = check_clock_window(NOW_MS + 3_600_000, NOW, MAX).unwrap_err();
    assert_eq!(
        skew.to_string(),
        "signed wall time is 3600.0 s ahead of the gateway's clock, outside its ±30 s window: set this node's clock (NTP, or an RTC)"
    );
    let skew = check_clock_window(i64::MIN, NOW, MAX).unwrap_err();
    assert!(
        skew.to_string().contains("s behind the gateway's clock"),
        "{skew}"
    );
}
