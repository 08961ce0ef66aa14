//! A node's [`Sample`] as kubelet's `/metrics/resource` writes it: the Prometheus text
//! format 0.0.4, with the node series of kubelet's resource metrics collector
//! (`pkg/kubelet/metrics/collectors/resource_metrics.go`) and nothing else (an edge node
//! reports no pod or container usage).
//!
//! metrics-server reads this with the Prometheus text parser (`sigs.k8s.io/metrics-server`
//! `pkg/scraper/client/resource/decode.go`) and asks for `text/plain` only; it keeps a node
//! only when both node series are present and non-zero.

use std::fmt::Write as _;

use super::Sample;

/// Content type of a `200` answer: the Prometheus text format 0.0.4, as kubelet sends it
/// (`github.com/prometheus/common` `expfmt.FmtText`).
pub const EXPOSITION_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// kubelet's `/metrics/resource` for one node, in the Prometheus text format 0.0.4 (every
/// line ends in `\n`, families sorted by name as client_golang gathers them):
///
/// ```text
/// # HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds
/// # TYPE node_cpu_usage_seconds_total counter
/// node_cpu_usage_seconds_total 10.5 1624396278302
/// # HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes
/// # TYPE node_memory_working_set_bytes gauge
/// node_memory_working_set_bytes 1000 1624396278302
/// # HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
/// # TYPE resource_scrape_error gauge
/// resource_scrape_error 0
/// ```
///
/// - CPU is [`Sample::cpu_usage_ms`] in seconds, printed exactly from the integer (`10.5`,
///   `3`, `0.001`: the milliseconds as a fraction of at most 3 digits, trailing zeros
///   trimmed; no float rounding). Memory is [`Sample::memory_working_set_bytes`] as an
///   integer. (kubelet prints both through Go's `strconv.FormatFloat(v, 'g', -1, 64)`, so
///   values from 10⁶ up come out as `1.5e+09`; the Prometheus parser reads either form as
///   the same number.)
/// - Both series carry [`Sample::timestamp_ms`], milliseconds since the Unix epoch, as
///   kubelet stamps them with the stats' own time (`NewLazyMetricWithTimestamp`).
/// - Without a sample, or with a sample whose CPU or memory is 0 (which metrics-server
///   drops anyway), the two node series are left out and `resource_scrape_error` is `1`:
///   what kubelet writes when it cannot get the node's stats.
pub fn exposition(sample: Option<&Sample>) -> String {
    let usable = sample.filter(|s| s.cpu_usage_ms > 0 && s.memory_working_set_bytes > 0);
    let mut text = String::with_capacity(640);
    if let Some(sample) = usable {
        let at = sample.timestamp_ms;
        let _ = write!(
            text,
            "# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds\n\
             # TYPE node_cpu_usage_seconds_total counter\n\
             node_cpu_usage_seconds_total {} {at}\n\
             # HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes\n\
             # TYPE node_memory_working_set_bytes gauge\n\
             node_memory_working_set_bytes {} {at}\n",
            cpu_seconds(sample.cpu_usage_ms),
            sample.memory_working_set_bytes,
        );
    }
    let _ = write!(
        text,
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n\
         # TYPE resource_scrape_error gauge\n\
         resource_scrape_error {}\n",
        u8::from(usable.is_none()),
    );
    text
}

/// `ms` milliseconds as seconds, exactly: `10500` → `10.5`, `3000` → `3`, `1` → `0.001`.
pub(super) fn cpu_seconds(ms: u64) -> String {
    let (whole, fraction) = (ms / 1000, ms % 1000);
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:03}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}
