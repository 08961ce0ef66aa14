//! The partition benchmark's short version (`scripts/faults.sh` runs the long one at
//! kubelet's cadence): real agents behind a veth link that is cut, on both transports, with
//! a 12 s lease (renewals every 3 s). A cut shorter than the lease expires nothing; a long
//! one expires exactly the nodes behind the link, which renew again once it returns;
//! nothing is written for them while it is down. Needs root: `#[ignore]`d for a plain
//! `cargo test`, run by scripts/test.sh as root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use edgebeat_tests::faults::{Fault, Scenario, run};
use edgebeat_tests::harness::Transport;
use edgebeat_tests::link::Link;

const LEASE: u32 = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root with ip netns: scripts/test.sh runs it as root"]
async fn partitions_expire_exactly_the_cut_nodes() {
    assert!(Link::available(), "needs root with `ip netns`");
    for transport in [Transport::Grpc, Transport::Mqtt] {
        let scenario = |fault| Scenario {
            transport,
            fault,
            cut_nodes: 2,
            control_nodes: 1,
            lease_duration_seconds: LEASE,
        };
        // Shorter than the lease by two renew intervals: nothing may expire.
        let short = run(scenario(Fault::Cut(Duration::from_secs(5))))
            .await
            .unwrap();
        println!("{transport:?} short cut: {short:?}");
        assert_eq!(
            (short.expired_cut, short.expired_control),
            (0, 0),
            "{short:?}"
        );
        assert_eq!(short.stale_writes, 0, "{short:?}");
        assert!(short.recovery.is_some(), "{short:?}");

        // Longer than the lease: exactly the cut nodes expire, and come back.
        let long = run(scenario(Fault::Cut(Duration::from_secs(20))))
            .await
            .unwrap();
        println!("{transport:?} long cut: {long:?}");
        assert_eq!((long.expired_cut, long.expired_control), (2, 0), "{long:?}");
        assert_eq!(long.stale_writes, 0, "{long:?}");
        assert!(
            long.recovery
                .is_some_and(|r| r < Duration::from_secs(LEASE.into())),
            "every cut node renews within one lease duration of the link's return: {long:?}"
        );
        assert!(
            long.max_age_control < Duration::from_secs(LEASE.into()),
            "{long:?}"
        );
    }
}
