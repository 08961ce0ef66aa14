//! `edgebeat-status-bytes`: what the health conditions add to a whole status report, in
//! encoded protobuf bytes (`NodeStatus` as carried in a `StatusReport`; transport framing and
//! the header excluded, both the same with or without them), for each committed fixture
//! tree, and what that costs per node-day on the link.
//!
//! Only whole status reports carry conditions: a renewal carries none, and a periodic
//! report of an unchanged node is `StatusReport.unchanged` without a status. A day of the
//! link benchmark (`edgebeat-link-bytes`) has 4 condition flips, so the health conditions
//! add 4 × the difference per node-day (plus once per agent start, in `Register`).
//!
//! The clock condition reads the running kernel; here it is pinned to "synchronised" so the
//! figures do not depend on the machine.
//!
//! Run: `cargo run --release -p edgebeat-tests --bin edgebeat-status-bytes`.

use std::time::Duration;

use anyhow::Context;
use edgebeat_agent::AgentConfig;
use edgebeat_agent::health::HealthSettings;
use edgebeat_agent::status::compute;
use edgebeat_hw::{ClockSync, HostRoot, ReadOptions, read_host_facts};
use edgebeat_tests::harness::fixture;
use prost::Message as _;

/// Condition flips in the link benchmark's day.
const FLIPS_PER_DAY: usize = 4;

fn main() -> anyhow::Result<()> {
    println!(
        "| tree | health conditions | NodeStatus without, B | with, B | added per whole report, B | added per node-day, B |"
    );
    println!("|---|---|---|---|---|---|");
    for tree in [
        "rpi4-cgroup1",
        "jetson-cgroup2",
        "nuc-hybrid",
        "rpi4-undervoltage",
        "rpi4-thermal-passive",
        "rpi4-readonly-root",
        "rpi4-memory-contention",
    ] {
        let mut facts = read_host_facts(&HostRoot::new(fixture(tree)), &ReadOptions::default())
            .with_context(|| format!("reading {tree}"))?;
        facts.clock_sync = Some(ClockSync {
            synchronized: true,
            max_error_us: 80_000,
        });
        let now = Duration::from_secs(600);
        let size = |health: HealthSettings| {
            let config = AgentConfig {
                health,
                ..AgentConfig::default()
            };
            let status = compute(&facts, &config, None, now);
            let extra = status.conditions.len() - 4;
            (status.to_proto(now).encoded_len(), extra)
        };
        let (without, _) = size(HealthSettings::off());
        let (with, extra) = size(HealthSettings::default());
        let added = with - without;
        println!(
            "| {tree} | {extra} | {without} | {with} | {added} | {} |",
            added * FLIPS_PER_DAY
        );
    }
    Ok(())
}
