//! Bounded logging of refusals: a flood of bad messages must not flood the log.
//!
//! Every refusal is counted in metrics; the log gets, per reason, one line per source per
//! [`LogLimiter::interval`] for at most [`LogLimiter::sources`] sources, and one line for all
//! the others together; each line says how many like it were not written since the last
//! one (`suppressed`). 20,000 forged messages from as many sources in 20 s so write about
//! three intervals' worth of lines per reason, not 20,000 lines. I/O free: the caller passes
//! the time (tokio's, so tests pause it) and writes the line.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// Per reason and source, whether to log a refusal now (see the module docs).
#[derive(Debug)]
pub struct LogLimiter {
    interval: Duration,
    sources: usize,
    reasons: Mutex<HashMap<&'static str, Reason>>,
}

#[derive(Debug)]
struct Reason {
    /// When the current interval began.
    since: Instant,
    /// The sources with a line of their own: refusals not written since their last line,
    /// and whether one was written in this interval.
    sources: HashMap<String, Source>,
    /// Refusals of the other sources not written since the last line for them, and whether
    /// that line was written in this interval.
    others: Source,
}

#[derive(Debug, Default, Clone, Copy)]
struct Source {
    suppressed: u64,
    logged: bool,
}

/// Whether to write a refusal's line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLine {
    /// Write it, saying `suppressed` like it were not written since the previous one.
    Write {
        /// Refusals of this reason and source (or of the other sources) not written since.
        suppressed: u64,
        /// The line stands for every source beyond [`LogLimiter`]'s limit.
        others: bool,
    },
    /// Counted, not written.
    Suppress,
}

impl Default for LogLimiter {
    /// One line per source per 10 s, for at most 4 sources per reason.
    fn default() -> Self {
        Self::new(Duration::from_secs(10), 4)
    }
}

impl LogLimiter {
    /// One line per source per `interval`, at most `sources` sources per reason (and one
    /// line for the others).
    pub fn new(interval: Duration, sources: usize) -> Self {
        Self {
            interval,
            sources,
            reasons: Mutex::new(HashMap::new()),
        }
    }

    /// Whether to log a refusal for `reason` from `source` at `now`.
    pub fn check(&self, reason: &'static str, source: &str, now: Instant) -> LogLine {
        let mut reasons = self.reasons.lock();
        let entry = reasons.entry(reason).or_insert_with(|| Reason {
            since: now,
            sources: HashMap::new(),
            others: Source::default(),
        });
        if now.duration_since(entry.since) >= self.interval {
            // A new interval: a source with nothing unwritten gives its place up; the
            // others may each write a line again, with their counts.
            entry.since = now;
            entry.sources.retain(|_, s| s.suppressed > 0);
            for s in entry.sources.values_mut() {
                s.logged = false;
            }
            entry.others.logged = false;
        }
        let (slot, others) =
            if entry.sources.contains_key(source) || entry.sources.len() < self.sources {
                (entry.sources.entry(source.to_owned()).or_default(), false)
            } else {
                (&mut entry.others, true)
            };
        if slot.logged {
            slot.suppressed += 1;
            LogLine::Suppress
        } else {
            slot.logged = true;
            LogLine::Write {
                suppressed: std::mem::take(&mut slot.suppressed),
                others,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_source_and_interval_and_one_for_the_rest() {
        let limiter = LogLimiter::new(Duration::from_secs(10), 2);
        let now = Instant::now();
        let log = |suppressed, others| LogLine::Write { suppressed, others };
        assert_eq!(limiter.check("forged", "a", now), log(0, false));
        assert_eq!(limiter.check("forged", "a", now), LogLine::Suppress);
        assert_eq!(limiter.check("forged", "b", now), log(0, false));
        // Beyond two sources: one line for all others, then nothing.
        assert_eq!(limiter.check("forged", "c", now), log(0, true));
        assert_eq!(limiter.check("forged", "d", now), LogLine::Suppress);
        assert_eq!(limiter.check("forged", "e", now), LogLine::Suppress);
        // Another reason has its own budget.
        assert_eq!(limiter.check("replayed", "c", now), log(0, false));
        // Within the interval: still suppressed.
        let later = now + Duration::from_secs(9);
        assert_eq!(limiter.check("forged", "a", later), LogLine::Suppress);
        // The next interval: a source logs again with what it suppressed; b, with nothing
        // unwritten, gave its place to the next new source.
        let next = now + Duration::from_secs(10);
        assert_eq!(limiter.check("forged", "a", next), log(2, false));
        assert_eq!(limiter.check("forged", "a", next), LogLine::Suppress);
        assert_eq!(limiter.check("forged", "f", next), log(0, false));
        // The others' line again, with the two not written.
        assert_eq!(limiter.check("forged", "g", next), log(2, true));
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_distinct_sources_writes_a_few_lines() {
        let limiter = LogLimiter::default();
        let start = Instant::now();
        let mut lines = 0;
        // 20,000 refusals from 20,000 sources over 20 s.
        for i in 0..20_000u32 {
            let now = start + Duration::from_millis(u64::from(i));
            if limiter.check("forged", &format!("node-{i}"), now) != LogLine::Suppress {
                lines += 1;
            }
        }
        assert!(lines <= 3 * 5, "{lines} lines");
    }
}
