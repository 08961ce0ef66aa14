//! The link-bytes benchmark's short version (`scripts/link-bytes.sh` runs the long one):
//! the real agent in a network namespace behind a veth pair, both transports. Checks that
//! the measurement measures (renewals written, frames counted both ways, a changed status
//! report's bytes seen); the figures themselves are printed, not asserted. Needs root:
//! `#[ignore]`d for a plain `cargo test`, run by scripts/test.sh as root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use edgebeat_tests::link::{Case, Link, measure};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root with ip netns: scripts/test.sh runs it as root"]
async fn the_link_is_measured_on_both_transports() {
    assert!(Link::available(), "needs root with `ip netns`");
    for case in [Case::Grpc, Case::Mqtt] {
        let m = measure(
            case,
            Duration::from_secs(12),
            Duration::from_secs(10),
            None,
            &[],
        )
        .await
        .unwrap();
        let r = &m.renewals;
        println!(
            "{}: {} renewals, {} B in 12 s; {:.0} B per periodic report, {:.0} B per flip; {:.2} MB/node-day",
            case.name(),
            r.renewals,
            r.counters.bytes(),
            m.report_bytes().unwrap_or(0.0),
            m.flip_bytes().unwrap_or(0.0),
            m.bytes_per_day() / 1e6
        );
        assert!(r.renewals >= 1, "{case:?}: {r:?}");
        assert!(
            r.counters.up_packets >= r.renewals as u64 && r.counters.down_packets >= 1,
            "{case:?}: every renewal crossed the link: {r:?}"
        );
        assert_eq!(m.with_flip.reports, 1, "{case:?}: {m:?}");
        assert!(
            m.flip_bytes().is_some_and(|b| b > 300.0),
            "{case:?}: a changed status goes whole, hundreds of bytes: {m:?}"
        );
        assert!(
            m.flip_bytes() > m.report_bytes(),
            "{case:?}: an unchanged report costs less than a change: {m:?}"
        );
    }
}
