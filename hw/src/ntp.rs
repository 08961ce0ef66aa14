//! The kernel clock's NTP state through `adjtimex(2)`.
//!
//! The only `unsafe` in edgebeat: no maintained crate wraps `adjtimex` (nix and rustix do
//! not), and the kernel keeps this state nowhere in `/proc` or `/sys`.
#![allow(unsafe_code)]

use crate::ClockSync;

/// `maxerror` at or above which systemd calls the clock unsynchronised (16 s in µs; the
/// kernel's `NTP_PHASE_LIMIT`), `src/basic/time-util.c: ntp_synced`.
const MAX_ERROR_LIMIT_US: i64 = 16_000_000;

/// Reads the kernel clock's state with `adjtimex(2)` and no modes (a read: it needs no
/// `CAP_SYS_TIME`). `None` when the call fails.
pub(crate) fn clock_sync() -> Option<ClockSync> {
    // SAFETY: `timex` is a plain C struct of integers; all-zero is a valid value and, with
    // `modes == 0`, asks the kernel to change nothing. `adjtimex` only writes into the
    // struct we own for the duration of the call.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pointer is to a live, exclusively borrowed `timex`.
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state < 0 {
        return None;
    }
    // `c_long`: 32 bits on armv7, 64 elsewhere.
    #[allow(clippy::useless_conversion)]
    let max_error_us = i64::from(tx.maxerror);
    Some(sync_state(state, tx.status, max_error_us))
}

/// systemd's `ntp_synced` rule on the values `adjtimex` returned.
fn sync_state(state: i32, status: i32, max_error_us: i64) -> ClockSync {
    ClockSync {
        synchronized: state != libc::TIME_ERROR
            && status & libc::STA_UNSYNC == 0
            && max_error_us < MAX_ERROR_LIMIT_US,
        max_error_us,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synchronized_needs_no_error_no_unsync_and_a_small_maxerror() {
        let cases = [
            (libc::TIME_OK, 0x2001, 120_000, true),
            (libc::TIME_ERROR, 0x2001, 120_000, false),
            (libc::TIME_OK, libc::STA_UNSYNC, 120_000, false),
            (libc::TIME_OK, 0x2001, MAX_ERROR_LIMIT_US, false),
            (libc::TIME_OK, 0x2001, MAX_ERROR_LIMIT_US - 1, true),
        ];
        for (state, status, max_error, want) in cases {
            let got = sync_state(state, status, max_error);
            assert_eq!(got.synchronized, want, "{state} {status:#x} {max_error}");
            assert_eq!(got.max_error_us, max_error);
        }
    }

    #[test]
    fn the_live_kernel_answers() {
        let sync = clock_sync().expect("adjtimex with no modes works unprivileged");
        assert!(sync.max_error_us >= 0);
        assert!(sync.max_error_us <= MAX_ERROR_LIMIT_US);
    }
}
