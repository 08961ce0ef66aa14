//! How old an agent message is, without trusting the agent's wall clock.
//!
//! Every header carries `seq`, the agent's CLOCK_BOOTTIME in microseconds. For one boot,
//! `gateway monotonic time − seq` is a constant plus the message's delay. The smallest value
//! seen belongs to the least-delayed message, so a message's age is its offset above that
//! minimum. The minimum may creep up by a drift allowance per elapsed second, so that a
//! board clock running slow is not taken for growing delay.

use std::time::Duration;

use tokio::time::Instant;

/// Per-boot age estimator (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Freshness {
    origin: Instant,
    min_offset_us: i128,
    at: Instant,
}

impl Freshness {
    /// Starts from a first message with `seq` received at `now` (taken as fresh).
    pub fn new(origin: Instant, seq: u64, now: Instant) -> Self {
        Self {
            origin,
            min_offset_us: offset(origin, seq, now),
            at: now,
        }
    }

    /// Age of a message with `seq` received at `now`, updating the minimum. `drift_ppm`
    /// is the clock-drift allowance in parts per million.
    pub fn observe(&mut self, seq: u64, now: Instant, drift_ppm: u64) -> Duration {
        let offset = offset(self.origin, seq, now);
        let elapsed_us = now.saturating_duration_since(self.at).as_micros() as i128;
        let allowance = elapsed_us * i128::from(drift_ppm) / 1_000_000;
        self.min_offset_us = (self.min_offset_us + allowance).min(offset);
        self.at = now;
        Duration::from_micros(u64::try_from(offset - self.min_offset_us).unwrap_or(u64::MAX))
    }
}

impl Freshness {
    /// How far ahead of this boot's clock a message with `seq` received at `now` claims to
    /// be (0 when it is not): the reference offset minus its offset, without updating.
    pub fn ahead(&self, seq: u64, now: Instant) -> Duration {
        let ahead = self.min_offset_us - offset(self.origin, seq, now);
        Duration::from_micros(u64::try_from(ahead).unwrap_or(0))
    }
}

fn offset(origin: Instant, seq: u64, now: Instant) -> i128 {
    now.saturating_duration_since(origin).as_micros() as i128 - i128::from(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000;

    #[tokio::test(start_paused = true)]
    async fn timely_messages_are_fresh_and_late_ones_are_old() {
        let origin = Instant::now();
        let mut f = Freshness::new(origin, 1_000 * SEC, origin);
        // 10 s later on both clocks: fresh.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(f.observe(1_010 * SEC, Instant::now(), 0), Duration::ZERO);
        // A renewal sent at agent time 1_020 s but delivered 30 s late.
        tokio::time::advance(Duration::from_secs(40)).await;
        assert_eq!(
            f.observe(1_020 * SEC, Instant::now(), 0),
            Duration::from_secs(30)
        );
        // The next timely one is fresh again.
        assert_eq!(f.observe(1_050 * SEC, Instant::now(), 0), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delayed_first_message_is_corrected_by_later_ones() {
        let origin = Instant::now();
        // The first message arrived 2 s late; the next one on time becomes the reference.
        let mut f = Freshness::new(origin, 0, origin + Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(12)).await;
        assert_eq!(f.observe(12 * SEC, Instant::now(), 0), Duration::ZERO);
        assert_eq!(
            f.observe(12 * SEC - 3 * SEC, Instant::now(), 0),
            Duration::from_secs(3)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn slow_board_clock_drift_is_not_taken_for_delay() {
        let origin = Instant::now();
        let mut f = Freshness::new(origin, 0, origin);
        // The board's clock runs 500 ppm slow: after 1 h it is 1.8 s behind.
        for hour_tenth in 1..=10u64 {
            tokio::time::advance(Duration::from_secs(360)).await;
            let seq = hour_tenth * 360 * SEC - hour_tenth * 360 * SEC / 2000;
            assert!(f.observe(seq, Instant::now(), 1000) < Duration::from_millis(200));
        }
        // Without the allowance, the same drift would look like 1.8 s of delay.
        let mut strict = Freshness::new(origin, 0, origin);
        assert!(
            strict.observe(3600 * SEC - 1_800_000, Instant::now(), 0)
                >= Duration::from_millis(1800)
        );
    }
}
