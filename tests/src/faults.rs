//! Faults on a real network path and at the apiserver: real `edgebeat-agent` processes, some in the network
//! namespace of a [`Link`] (the "cut" nodes) and some on loopback (the control nodes), one
//! cluster (the stand-in apiserver, a gateway and, for MQTT, Mosquitto) on this side. The
//! link is cut by taking its gateway-side veth end down (`ip link set … down`), or slowed by
//! a token bucket on both ends (`tc qdisc … tbf`; this kernel has no `netem`).
//!
//! Every Lease write is recorded as it happens (the stand-in's change feed, no sampling), so
//! the figures are exact: a Lease's age at any instant is the time since its last
//! `renewTime`, and it expired when a gap between two writes (or since the last one)
//! exceeded `nodeLeaseDurationSeconds`, which is when kube-controller-manager's node
//! lifecycle controller would start counting the node as not ready.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use crate::harness::{Cluster, Transport};
use crate::link::{
    AGENT_INTERFACE, GATEWAY_IP, HOST_INTERFACE, Link, NAMESPACE, forward, run_tool, spawn_agent,
};

/// What happens to the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The link is down for this long: nothing crosses, no reset reaches either side.
    Cut(Duration),
    /// Both directions are limited to `kbit` kbit/s (token bucket, 5 s of queue) for
    /// `length`.
    Slow {
        /// Rate in kbit/s (1 kbit = 1,000 bits).
        kbit: u32,
        /// How long the limit stays.
        length: Duration,
    },
    /// The apiserver (the stand-in) answers every request with `code` for `length`: 503
    /// (down, a rolling restart) or 429 (API Priority and Fairness shedding load, with
    /// `Retry-After: 1`). Every node is affected; the link stays up.
    Apiserver {
        /// HTTP status of every answer.
        code: u16,
        /// How long.
        length: Duration,
    },
    /// The next `times` Lease PUTs are answered 409 Conflict (another writer got there
    /// first), then the fault ends after `length`.
    LeaseConflicts {
        /// PUTs answered 409.
        times: u32,
        /// How long the window lasts.
        length: Duration,
    },
}

impl Fault {
    /// How long the fault lasts.
    pub fn length(self) -> Duration {
        match self {
            Fault::Cut(d) => d,
            Fault::Slow { length, .. }
            | Fault::Apiserver { length, .. }
            | Fault::LeaseConflicts { length, .. } => length,
        }
    }

    /// Whether the fault is on the link (a cut, a slow link), reaching only the nodes behind
    /// it; otherwise it is the apiserver's and reaches every node.
    pub fn on_link(self) -> bool {
        matches!(self, Fault::Cut(_) | Fault::Slow { .. })
    }

    /// A short description for tables, e.g. `link cut 20 s` or `tbf 8 kbit/s both ways, 60 s`.
    pub fn describe(self) -> String {
        match self {
            Fault::Cut(d) => format!("link cut {} s", d.as_secs()),
            Fault::Slow { kbit, length } => {
                format!("tbf {kbit} kbit/s both ways, {} s", length.as_secs())
            }
            Fault::Apiserver { code, length } => {
                format!("apiserver answers {code}, {} s", length.as_secs())
            }
            Fault::LeaseConflicts { times, length } => {
                format!("{times} Lease PUTs answered 409, {} s", length.as_secs())
            }
        }
    }
}

/// One run: a transport, a fault, how many agents sit behind the link and beside it.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// The agents' transport (plaintext; the gateway allows unidentified agents).
    pub transport: Transport,
    /// What happens to the link.
    pub fault: Fault,
    /// Agents in the link's namespace (affected by the fault), named `cut-N`.
    pub cut_nodes: usize,
    /// Agents on loopback (unaffected), named `ctl-N`.
    pub control_nodes: usize,
    /// `nodeLeaseDurationSeconds` of every agent (kubelet: 40; renewals every quarter).
    pub lease_duration_seconds: u32,
}

/// What a [`Scenario`] measured. Ages and durations are from the gateway's `renewTime`
/// stamps (this host's clock).
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The scenario.
    pub scenario: Scenario,
    /// Cut nodes whose Lease expired (a gap between writes over the lease duration).
    pub expired_cut: usize,
    /// Control nodes whose Lease expired: 0 unless the fault leaked beyond the link.
    pub expired_control: usize,
    /// Largest Lease age of a cut node, from one lease duration before the fault to the end.
    pub max_age_cut: Duration,
    /// Largest Lease age of a control node over the same span.
    pub max_age_control: Duration,
    /// For each affected node (the cut nodes for a fault of the link, every node for one of
    /// the apiserver), time from the fault's end to its first Lease write after it; the
    /// largest. `None` when some affected node had not renewed by the deadline.
    pub recovery: Option<Duration>,
    /// Lease writes of cut nodes stamped from 1 s into a cut to its end: nothing can cross a
    /// cut link, so each would be a renewal the gateway held back and wrote late. 0 for other
    /// faults, where it would not tell (a slow link and conflicts let writes through; during
    /// an apiserver outage no write can succeed at all).
    pub stale_writes: usize,
    /// Lease writes of affected nodes during the fault.
    pub writes_during_fault: usize,
    /// VmRSS of this process (stand-in, gateway and relay run in it), KiB, before and after.
    pub rss_kib: (u64, u64),
    /// For a fault of the link, gaps longer than 1.5 renew intervals between two Lease writes
    /// of a control node: `(node, the write that ended the gap, the gap)`. Empty when the
    /// fault stayed on the link (and for apiserver faults, which reach every node).
    pub control_gaps: Vec<(String, Timestamp, Duration)>,
}

/// Runs `scenario`: starts the cluster, the link and the agents, waits until every node
/// renewed twice, applies the fault for its length, waits (up to three lease durations) for
/// every affected node to renew after it, watches one more lease duration and reports.
///
/// Errors: the link, the cluster or an agent could not start, a node never renewed, or a
/// `tc`/`ip` command failed.
pub async fn run(scenario: Scenario) -> anyhow::Result<Outcome> {
    let link = Link::create()?;
    let cluster = Cluster::start(scenario.transport).await?;
    let upstream: SocketAddr = match &cluster.broker {
        Some(b) => SocketAddr::new(b.host().parse()?, b.port()),
        None => cluster.grpc_url.trim_start_matches("http://").parse()?,
    };
    let port = forward(upstream).await?;
    let dir = tempfile::tempdir()?;
    let host = crate::harness::fixture_copy("rpi4-cgroup1")?;
    let lease = Duration::from_secs(scenario.lease_duration_seconds.into());
    let mut agents = Vec::new();
    let mut cut = Vec::new();
    let mut control = Vec::new();
    for i in 0..scenario.cut_nodes + scenario.control_nodes {
        let behind = i < scenario.cut_nodes;
        let name = if behind {
            format!("cut-{i}")
        } else {
            format!("ctl-{}", i - scenario.cut_nodes)
        };
        let endpoint = if behind {
            SocketAddr::new(GATEWAY_IP.parse()?, port)
        } else {
            upstream
        };
        let config = dir.path().join(format!("{name}.yaml"));
        let (kind, scheme) = match scenario.transport {
            Transport::Grpc => ("grpc", "http"),
            Transport::Mqtt => ("mqtt", "mqtt"),
        };
        std::fs::write(
            &config,
            format!(
                "apiVersion: edgebeat.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {name}\nhostRoot: {}\nnodeLeaseDurationSeconds: {}\nclockSyncCondition: false\ntransport: {{kind: {kind}, endpoint: \"{scheme}://{endpoint}\"}}\n",
                host.path().display(),
                scenario.lease_duration_seconds,
            ),
        )?;
        let binary = crate::link::agent_binary()?;
        let command = if behind {
            link.command(&binary)
        } else {
            let mut c = tokio::process::Command::new(&binary);
            c.kill_on_drop(true);
            c
        };
        let log = dir.path().join(format!("{name}.log"));
        agents.push(spawn_agent(command, &config, &log)?);
        if behind { &mut cut } else { &mut control }.push(name);
    }

    let writes = Writes::record(&cluster);
    let everyone: Vec<String> = cut.iter().chain(&control).cloned().collect();
    let steady = writes
        .until(lease * 3 + Duration::from_secs(30), |w| {
            everyone
                .iter()
                .all(|n| w.get(n).is_some_and(|t| t.len() >= 2))
        })
        .await;
    if !steady {
        let logs = logs(dir.path(), &everyone);
        bail!("not every node renewed twice within the deadline\n{logs}");
    }
    let rss_before = rss_kib();
    let watched_from = Timestamp::now() - jiff::SignedDuration::try_from(lease)?;

    let fault_start = Timestamp::now();
    apply(&cluster, scenario.fault, true)?;
    tokio::time::sleep(scenario.fault.length()).await; // the fault's own length
    apply(&cluster, scenario.fault, false)?;
    let fault_end = Timestamp::now();

    // Every affected node renews after the fault, within three lease durations: the cut
    // nodes for a fault of the link, every node for one of the apiserver.
    let affected: &[String] = if scenario.fault.on_link() {
        &cut
    } else {
        &everyone
    };
    let recovered = writes
        .until(lease * 3, |w| {
            affected
                .iter()
                .all(|n| w.get(n).is_some_and(|t| t.iter().any(|&x| x > fault_end)))
        })
        .await;
    // One more lease duration of normal running: an expiry caused late would show.
    tokio::time::sleep(lease).await; // an observation window, not a wait for state
    let end = Timestamp::now();
    let rss_after = rss_kib();
    let written = writes.stop();
    drop(agents);

    let age = |name: &str| max_age(written.get(name).map_or(&[][..], |t| t), watched_from, end);
    let ages = |names: &[String]| names.iter().map(|n| age(n)).collect::<Vec<_>>();
    let (cut_ages, control_ages) = (ages(&cut), ages(&control));
    let expired = |ages: &[Duration]| ages.iter().filter(|a| **a > lease).count();
    let stale_from = fault_start + jiff::SignedDuration::from_secs(1);
    let in_span = |from: Timestamp, to: Timestamp| {
        affected
            .iter()
            .map(|n| {
                written
                    .get(n)
                    .map_or(0, |t| t.iter().filter(|&&x| x >= from && x < to).count())
            })
            .sum::<usize>()
    };
    let recovery = recovered.then(|| {
        affected
            .iter()
            .filter_map(|n| written.get(n)?.iter().find(|&&x| x > fault_end).copied())
            .map(|x| Duration::try_from(x - fault_end).unwrap_or_default())
            .max()
            .unwrap_or_default()
    });
    let renew = lease / 4;
    let control_gaps = control
        .iter()
        .filter(|_| scenario.fault.on_link())
        .flat_map(|n| {
            let times = written.get(n).cloned().unwrap_or_default();
            times
                .windows(2)
                .filter(|w| w[1] > watched_from)
                .filter_map(|w| {
                    let gap = Duration::try_from(w[1] - w[0]).ok()?;
                    (gap > renew * 3 / 2).then(|| (n.clone(), w[1], gap))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    Ok(Outcome {
        control_gaps,
        scenario,
        expired_cut: expired(&cut_ages),
        expired_control: expired(&control_ages),
        max_age_cut: cut_ages.into_iter().max().unwrap_or_default(),
        max_age_control: control_ages.into_iter().max().unwrap_or_default(),
        recovery,
        stale_writes: match scenario.fault {
            Fault::Cut(_) => in_span(stale_from, fault_end),
            _ => 0,
        },
        writes_during_fault: in_span(fault_start, fault_end),
        rss_kib: (rss_before, rss_after),
    })
}

/// The largest Lease age between `from` and `to` given the sorted write times `writes`: the
/// longest gap between consecutive writes (the first from the last write at or before
/// `from`; before a Lease's first write there is no age), or since the last write until
/// `to`. With no write at all, the whole span.
pub fn max_age(writes: &[Timestamp], from: Timestamp, to: Timestamp) -> Duration {
    let mut last = writes.iter().rev().find(|&&t| t <= from).copied();
    let mut longest = Duration::ZERO;
    for &t in writes.iter().filter(|&&t| t > from && t <= to) {
        if let Some(since) = last {
            longest = longest.max(Duration::try_from(t - since).unwrap_or_default());
        }
        last = Some(t);
    }
    let tail = Duration::try_from(to - last.unwrap_or(from)).unwrap_or_default();
    longest.max(tail)
}

/// Takes the fault on (`on`) or off.
fn apply(cluster: &Cluster, fault: Fault, on: bool) -> anyhow::Result<()> {
    use crate::standin::FaultRule;
    match fault {
        Fault::Apiserver { code, .. } => {
            if on {
                cluster
                    .standin
                    .inject(FaultRule::status(None, "", code, u32::MAX));
            } else {
                cluster.standin.clear_faults();
            }
            Ok(())
        }
        Fault::LeaseConflicts { times, .. } => {
            if on {
                cluster.standin.inject(FaultRule::status(
                    Some(http::Method::PUT),
                    "/leases/",
                    409,
                    times,
                ));
            } else {
                cluster.standin.clear_faults();
            }
            Ok(())
        }
        Fault::Cut(_) => run_tool(
            "ip",
            &[
                "link",
                "set",
                HOST_INTERFACE,
                if on { "down" } else { "up" },
            ],
        ),
        Fault::Slow { kbit, .. } => {
            let rate = format!("{kbit}kbit");
            for (netns, dev) in [(None, HOST_INTERFACE), (Some(NAMESPACE), AGENT_INTERFACE)] {
                let mut args: Vec<&str> = Vec::new();
                if let Some(ns) = netns {
                    args.extend(["-n", ns]);
                }
                if on {
                    // Burst of one full frame; 5 s of queue before tbf drops.
                    args.extend([
                        "qdisc", "replace", "dev", dev, "root", "tbf", "rate", &rate, "burst",
                        "1600", "latency", "5s",
                    ]);
                } else {
                    args.extend(["qdisc", "del", "dev", dev, "root"]);
                }
                run_tool("tc", &args)?;
            }
            Ok(())
        }
    }
}

/// VmRSS of this process in KiB (0 if unreadable).
fn rss_kib() -> u64 {
    crate::procfs::vm_rss_kib(std::process::id()).unwrap_or(0)
}

fn logs(dir: &std::path::Path, names: &[String]) -> String {
    names
        .iter()
        .map(|n| {
            let log = std::fs::read_to_string(dir.join(format!("{n}.log"))).unwrap_or_default();
            format!("--- {n}\n{log}")
        })
        .collect()
}

/// Every distinct `renewTime` of every Lease, recorded from the stand-in's change feed.
struct Writes {
    seen: Arc<Mutex<BTreeMap<String, Vec<Timestamp>>>>,
    changed: tokio::sync::watch::Receiver<u64>,
    cancel: CancellationToken,
}

impl Writes {
    fn record(cluster: &Cluster) -> Self {
        let seen: Arc<Mutex<BTreeMap<String, Vec<Timestamp>>>> = Arc::default();
        let cancel = CancellationToken::new();
        let standin = cluster.standin.clone();
        let mut changes = standin.changes();
        let changed = standin.changes();
        let (into, stop) = (seen.clone(), cancel.clone());
        tokio::spawn(async move {
            loop {
                changes.borrow_and_update();
                let now = standin.lease_renew_times();
                {
                    let mut seen = into.lock();
                    for (name, t) in now {
                        let times = seen.entry(name).or_default();
                        if times.last() != Some(&t) {
                            times.push(t);
                        }
                    }
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    r = changes.changed() => if r.is_err() { return },
                }
            }
        });
        Self {
            seen,
            changed,
            cancel,
        }
    }

    /// Waits up to `deadline` until `done` holds for the recorded writes; returns whether
    /// it did.
    async fn until(
        &self,
        deadline: Duration,
        done: impl Fn(&BTreeMap<String, Vec<Timestamp>>) -> bool,
    ) -> bool {
        crate::wait::until(
            "the recorded Lease writes",
            deadline,
            || std::future::ready(done(&self.seen.lock())),
            || {
                // Up to date before the check: a change during it is seen.
                let mut changed = self.changed.clone();
                changed.borrow_and_update();
                async move {
                    if changed.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            },
        )
        .await
        .is_ok()
    }

    fn stop(self) -> BTreeMap<String, Vec<Timestamp>> {
        self.cancel.cancel();
        self.seen.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_is_the_longest_gap_or_the_tail() {
        let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let writes = [t(0), t(10), t(20), t(65), t(75)];
        assert_eq!(max_age(&writes, t(5), t(80)), Duration::from_secs(45));
        // From before the first write counted in the window: the write before it counts.
        assert_eq!(max_age(&writes, t(12), t(30)), Duration::from_secs(10));
        // No write after the last: the tail.
        assert_eq!(max_age(&writes, t(70), t(130)), Duration::from_secs(55));
        assert_eq!(max_age(&[], t(0), t(7)), Duration::from_secs(7));
        // A Lease written first inside the span: no age before that write.
        assert_eq!(
            max_age(&[t(30), t(40)], t(0), t(45)),
            Duration::from_secs(10)
        );
    }
}
