//! `edgebeat-link-bytes`: what a metered edge link carries per node-day and per month.
//!
//! For each case (gRPC, gRPC over mTLS, MQTT, MQTT over TLS with signed messages) the real
//! `edgebeat-agent` binary runs in its own network namespace behind a veth pair
//! ([`edgebeat_tests::link`]) at kubelet's default cadence (a Lease renewal every 10 s),
//! talking to a gateway, the stand-in apiserver and (MQTT) Mosquitto on this side. The
//! veth's interface counters count every frame: Ethernet, IP and TCP headers, TCP ACKs,
//! keepalives, acks.
//!
//! Three steady windows per case: renewals only; renewals plus a periodic status report
//! every `--report-every` (an unchanged node's); renewals plus one condition flip
//! (MemoryPressure turns True: one report with the change). A node-day is the first
//! window's rate for 86,400 s plus 288 periodic reports (`nodeStatusReportFrequency` 5 min)
//! and 4 flips, each costing what it added in its window.
//!
//! With `--partition SECS` it measures instead what a partition of the link that long costs
//! when it heals ([`edgebeat_tests::link::measure_partition`]): a steady window, the link
//! down (a condition turning True meanwhile), and the same window from the link's return:
//! the difference is the heal's cost.
//!
//! Run as root: `scripts/link-bytes.sh` (or `cargo build --release -p edgebeat-agent -p
//! edgebeat-tests --bin edgebeat-link-bytes` and run `target/release/edgebeat-link-bytes`).

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use edgebeat_tests::link::{
    Case, FLIPS_PER_DAY, Link, REPORTS_PER_DAY, measure, measure_partition,
};

#[derive(Parser)]
#[command(about = "Bytes per node-day on an edge link (network namespace + veth counters)")]
struct Args {
    /// Length of each counted window, seconds.
    #[arg(long, default_value_t = 120)]
    window: u64,
    /// nodeStatusReportFrequency in the second window, seconds.
    #[arg(long, default_value_t = 30)]
    report_every: u64,
    /// transport.keepalive of the agents, seconds (default: the agent's, 5 min for gRPC and
    /// 30 min for MQTT).
    #[arg(long)]
    keepalive: Option<u64>,
    /// A kernel setting for the agent's side, `key=value` (repeatable), e.g.
    /// `net.ipv4.tcp_timestamps=0`: host tuning an operator could apply on the board.
    #[arg(long = "agent-sysctl")]
    agent_sysctls: Vec<String>,
    /// Measure a partition this long (seconds) and its heal instead of a node-day.
    #[arg(long)]
    partition: Option<u64>,
    /// Cases to run: grpc, grpc-mtls, mqtt, mqtt-tls (default: all).
    #[arg(long = "case", value_parser = parse_case)]
    cases: Vec<Case>,
}

fn parse_case(text: &str) -> Result<Case, String> {
    Case::parse(text).ok_or_else(|| format!("{text:?}: use grpc, grpc-mtls, mqtt or mqtt-tls"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    Link::require()?;
    let cases = if args.cases.is_empty() {
        Case::ALL.to_vec()
    } else {
        args.cases
    };
    let window = Duration::from_secs(args.window);
    if let Some(partition) = args.partition {
        println!(
            "partition of {partition} s, windows of {} s (MemoryPressure turns True 5 s into the partition)",
            args.window
        );
        println!(
            "| case | caught up after the link returns | steady window: bytes (packets) | window from the return: bytes (packets) | **the heal costs** | transition Event − file change (agent samples every 10 s) |"
        );
        println!("|---|---|---|---|---|---|");
        for case in cases {
            let h = measure_partition(
                case,
                Duration::from_secs(partition),
                window,
                args.keepalive.map(Duration::from_secs),
            )
            .await
            .with_context(|| case.name())?;
            println!(
                "| {} | {:.1} s | {} B ({}) | {} B ({}) | **{} B** | {} |",
                case.name(),
                h.caught_up.as_secs_f64(),
                h.steady.bytes(),
                h.steady.packets(),
                h.healed.bytes(),
                h.healed.packets(),
                h.heal_bytes(),
                h.event_off_by
                    .map_or("no Event".to_owned(), |s| format!("{s:.0} s")),
            );
        }
        return Ok(());
    }
    println!(
        "windows of {} s; a day = renewal rate × 86,400 s + {REPORTS_PER_DAY} periodic status reports + {FLIPS_PER_DAY} condition flips",
        args.window
    );
    println!(
        "| case | window: renewals, packets, bytes | per renewal (keepalives included) | per periodic status report | per flip | packets/day | **MB/node-day** | MB/month |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for case in cases {
        let m = measure(
            case,
            window,
            Duration::from_secs(args.report_every),
            args.keepalive.map(Duration::from_secs),
            &args.agent_sysctls,
        )
        .await
        .with_context(|| case.name())?;
        let r = &m.renewals;
        let per_renewal = r.counters.bytes() as f64 / r.renewals.max(1) as f64;
        let report = m
            .report_bytes()
            .map_or("n/a".to_owned(), |b| format!("{b:.0} B"));
        let flip = m
            .flip_bytes()
            .map_or("n/a".to_owned(), |b| format!("{b:.0} B"));
        let day = m.bytes_per_day();
        println!(
            "| {} | {} renewals, {} packets ({} ↑ / {} ↓), {} B ({} ↑ / {} ↓) | {per_renewal:.0} B | {report} ({} reports) | {flip} | {:.0} | **{:.2}** | {:.1} |",
            case.name(),
            r.renewals,
            r.counters.packets(),
            r.counters.up_packets,
            r.counters.down_packets,
            r.counters.bytes(),
            r.counters.up_bytes,
            r.counters.down_bytes,
            m.with_reports.reports,
            m.packets_per_day(),
            day / 1e6,
            day * 30.0 / 1e6,
        );
    }
    Ok(())
}
