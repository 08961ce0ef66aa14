//! `edgebeat-faults`: faults on a real network path and at the apiserver, measured.
//!
//! Each row runs real `edgebeat-agent` processes, some in a network namespace behind a veth
//! pair (the cut nodes) and some on loopback (the control nodes), against a gateway, the
//! stand-in apiserver and (MQTT) Mosquitto, at kubelet's cadence, then cuts or slows the
//! link, or makes the apiserver fail ([`edgebeat_tests::faults`]), and prints one table
//! row: lease expiries of cut and control nodes, the largest Lease age, how long after the
//! fault every cut node renewed, Lease writes stamped during the fault, and this process's
//! RSS.
//!
//! Run as root: `scripts/faults.sh` (it builds this and the agent, release).

use std::time::Duration;

use clap::Parser;
use edgebeat_tests::faults::{Fault, Outcome, Scenario, run};
use edgebeat_tests::harness::Transport;
use edgebeat_tests::link::Link;

#[derive(Parser)]
#[command(about = "Partitions and slow links on a veth path, with real agents")]
struct Args {
    /// Agents behind the link.
    #[arg(long, default_value_t = 3)]
    cut_nodes: usize,
    /// Agents on loopback, unaffected.
    #[arg(long, default_value_t = 2)]
    control_nodes: usize,
    /// nodeLeaseDurationSeconds (kubelet: 40).
    #[arg(long, default_value_t = 40)]
    lease_duration: u32,
    /// A short cut, seconds (default: lease duration − 2 × renew interval, 20 s).
    #[arg(long)]
    short_cut: Option<u64>,
    /// A long cut, seconds (default: 90).
    #[arg(long, default_value_t = 90)]
    long_cut: u64,
    /// Rate of the slow link, kbit/s.
    #[arg(long, default_value_t = 8)]
    slow_kbit: u32,
    /// Length of the slow spell, seconds.
    #[arg(long, default_value_t = 60)]
    slow_length: u64,
    /// Length of the apiserver's outage (503) and overload (429) spells, seconds; 0 skips
    /// the apiserver rows. They run on the first transport only: the gateway's writes to
    /// the apiserver do not depend on the agents' transport.
    #[arg(long, default_value_t = 60)]
    apiserver_fault: u64,
    /// Transports: grpc, mqtt (default both).
    #[arg(long = "transport")]
    transports: Vec<String>,
    /// Only the apiserver rows (503, 429, 409), not the link's.
    #[arg(long)]
    apiserver_only: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    Link::require()?;
    let renew = u64::from(args.lease_duration) / 4;
    let short = args
        .short_cut
        .unwrap_or(u64::from(args.lease_duration).saturating_sub(2 * renew));
    let faults = [
        Fault::Cut(Duration::from_secs(short)),
        Fault::Cut(Duration::from_secs(args.long_cut)),
        Fault::Slow {
            kbit: args.slow_kbit,
            length: Duration::from_secs(args.slow_length),
        },
    ];
    let transports: Vec<Transport> = if args.transports.is_empty() {
        vec![Transport::Grpc, Transport::Mqtt]
    } else {
        args.transports
            .iter()
            .map(|t| match t.as_str() {
                "grpc" => Ok(Transport::Grpc),
                "mqtt" => Ok(Transport::Mqtt),
                other => Err(anyhow::anyhow!("--transport {other:?}: use grpc or mqtt")),
            })
            .collect::<anyhow::Result<_>>()?
    };
    println!(
        "nodeLeaseDurationSeconds {}; {} cut + {} control agents per row",
        args.lease_duration, args.cut_nodes, args.control_nodes
    );
    println!("{}", header());
    let apiserver = Duration::from_secs(args.apiserver_fault);
    let apiserver_faults = [
        Fault::Apiserver {
            code: 503,
            length: apiserver,
        },
        Fault::Apiserver {
            code: 429,
            length: apiserver,
        },
        Fault::LeaseConflicts {
            times: 20,
            length: Duration::from_secs(30),
        },
    ];
    for (i, transport) in transports.into_iter().enumerate() {
        let extra = if i == 0 && !apiserver.is_zero() {
            &apiserver_faults[..]
        } else {
            &[]
        };
        let link_rows = if args.apiserver_only {
            &[][..]
        } else {
            &faults[..]
        };
        for &fault in link_rows.iter().chain(extra) {
            let outcome = run(Scenario {
                transport,
                fault,
                cut_nodes: args.cut_nodes,
                control_nodes: args.control_nodes,
                lease_duration_seconds: args.lease_duration,
            })
            .await?;
            println!("{}", row(&outcome));
            for (node, at, gap) in &outcome.control_gaps {
                eprintln!(
                    "  control node {node}: {:.1} s between Lease writes, ending {at}",
                    gap.as_secs_f64()
                );
            }
        }
    }
    Ok(())
}

fn header() -> String {
    "| transport | fault | expired: cut / control | max Lease age: cut / control | every affected node renewed, after the fault | Lease writes during the fault (stale) | RSS before → after |\n|---|---|---|---|---|---|---|".to_owned()
}

fn row(o: &Outcome) -> String {
    let s = &o.scenario;
    let transport = match s.transport {
        Transport::Grpc => "gRPC",
        Transport::Mqtt => "MQTT",
    };
    let recovery = o
        .recovery
        .map_or("not within 3 lease durations".to_owned(), |d| {
            format!("{:.1} s", d.as_secs_f64())
        });
    let stale = match s.fault {
        Fault::Cut(_) => o.stale_writes.to_string(),
        _ => "n/a".to_owned(),
    };
    format!(
        "| {transport} | {} | {} of {} / {} of {} | {:.1} s / {:.1} s | {recovery} | {} ({}) | {} → {} MiB |",
        s.fault.describe(),
        o.expired_cut,
        s.cut_nodes,
        o.expired_control,
        s.control_nodes,
        o.max_age_cut.as_secs_f64(),
        o.max_age_control.as_secs_f64(),
        o.writes_during_fault,
        stale,
        o.rss_kib.0 / 1024,
        o.rss_kib.1 / 1024,
    )
}
