//! The gateway core: checks each agent message (shape, identity, sequence, freshness) and
//! writes Node, status and Lease through kube-rs exactly as kubelet would.
//!
//! Per node it keeps a small state slot (boot ID, last sequence number, the Lease returned by
//! the last write, the conditions last written); one node's messages are handled one at a
//! time, different nodes concurrently.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgebeat_hw::Clock;
use edgebeat_proto::{self as pb, Ack, AckCode, agent_message::Kind};
use edgebeat_transports::ingress::{Handler, Peer};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::time::Instant;

use crate::freshness::Freshness;
use crate::patch::{self, KnownCondition, LEASE_NAMESPACE};

/// Gateway behaviour settings.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// Oldest Lease renewal still written, measured on the agent's boot clock against the
    /// freshest message seen from that boot (default 5 s). Older renewals are dropped,
    /// never written late: a late renewal would hide a dead node (spec pitfall 4).
    pub max_renewal_age: Duration,
    /// Clock-drift allowance for that measurement, in parts per million (default 1000).
    pub drift_ppm: u64,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        Self {
            max_renewal_age: Duration::from_secs(5),
            drift_ppm: 1000,
        }
    }
}

/// Counters the gateway keeps (exported as metrics by the binary).
#[derive(Debug, Default)]
pub struct Counters {
    /// Lease renewals written.
    pub lease_renewals: AtomicU64,
    /// Lease renewals that could not be written (apiserver errors).
    pub lease_failures: AtomicU64,
    /// Lease renewals dropped as stale.
    pub stale_renewals: AtomicU64,
    /// Status PATCHes written.
    pub status_reports: AtomicU64,
    /// Messages rejected (malformed, foreign, replayed, undecodable).
    pub rejected: AtomicU64,
    /// Nodes created or reconciled.
    pub registrations: AtomicU64,
}

#[derive(Default)]
struct NodeSlot {
    boot_id: Vec<u8>,
    last_seq: u64,
    /// Age estimator for this boot's messages.
    freshness: Option<Freshness>,
    registered: bool,
    uid: Option<String>,
    /// nodeInfo.bootID the apiserver holds (for the Rebooted event).
    known_boot_id: Option<String>,
    latest_lease: Option<Lease>,
    last_renew: Option<Timestamp>,
    conditions: BTreeMap<String, KnownCondition>,
}

/// The gateway: a [`Handler`] for every transport.
pub struct Gateway {
    nodes: Api<Node>,
    leases: Api<Lease>,
    events: Api<Event>,
    clock: Arc<dyn Clock>,
    options: GatewayOptions,
    started: Instant,
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<NodeSlot>>>>,
    /// Counters, shared with the metrics endpoint.
    pub counters: Arc<Counters>,
}

fn ack(seq: u64, code: AckCode, reason: impl Into<String>) -> Ack {
    Ack {
        seq,
        code: code.into(),
        reason: reason.into(),
        ..Default::default()
    }
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

impl Gateway {
    /// A gateway writing through `client` (whose rate limit bounds apiserver QPS), stamping
    /// times from `clock`.
    pub fn new(client: kube::Client, clock: Arc<dyn Clock>, options: GatewayOptions) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client.clone(), LEASE_NAMESPACE),
            events: Api::namespaced(client, patch::EVENT_NAMESPACE),
            clock,
            options,
            started: Instant::now(),
            slots: Mutex::new(HashMap::new()),
            counters: Arc::new(Counters::default()),
        }
    }

    fn slot(&self, name: &str) -> Arc<tokio::sync::Mutex<NodeSlot>> {
        let mut slots = match self.slots.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        slots.entry(name.to_owned()).or_default().clone()
    }

    fn now(&self) -> Timestamp {
        Timestamp::try_from(self.clock.now()).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn reject(&self, seq: u64, reason: String) -> Ack {
        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%reason, "message rejected");
        ack(seq, AckCode::Rejected, reason)
    }

    async fn handle_message(&self, peer: &Peer, message: pb::AgentMessage) -> Ack {
        let Some(header) = message.header().cloned() else {
            return self.reject(0, "malformed: no header or unknown message kind".into());
        };
        let seq = header.seq;
        let name = header.node_name.as_str();
        if let Err(why) = validate_node_name(name) {
            return self.reject(seq, why);
        }
        if let Some(identity) = &peer.identity
            && identity != name
        {
            return self.reject(
                seq,
                format!("node {identity:?} may not speak for node {name:?}"),
            );
        }
        let slot = self.slot(name);
        let mut slot = slot.lock().await;
        if slot.boot_id != header.boot_id {
            // A new boot (or the first message seen): sequence and clock offset restart.
            slot.boot_id = header.boot_id.clone();
            slot.last_seq = 0;
            slot.freshness = None;
        } else if seq <= slot.last_seq {
            return self.reject(
                seq,
                format!(
                    "replayed or reordered: seq {seq} ≤ last accepted {}",
                    slot.last_seq
                ),
            );
        }
        slot.last_seq = seq;
        let now = Instant::now();
        let age = match &mut slot.freshness {
            Some(f) => f.observe(seq, now, self.options.drift_ppm),
            None => {
                slot.freshness = Some(Freshness::new(self.started, seq, now));
                Duration::ZERO
            }
        };
        match message.kind {
            Some(Kind::Register(register)) => self.register(&mut slot, name, seq, &register).await,
            Some(Kind::Status(report)) => {
                self.report(&mut slot, name, seq, report.status.as_ref())
                    .await
            }
            Some(Kind::Lease(renewal)) => {
                if age > self.options.max_renewal_age {
                    self.counters.stale_renewals.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(node = name, ?age, "dropping a stale lease renewal");
                    return ack(seq, AckCode::Rejected, format!("stale: {age:?} old"));
                }
                self.renew(&mut slot, name, seq, renewal.lease_duration_seconds)
                    .await
            }
            None => self.reject(seq, "malformed: unknown message kind".into()),
        }
    }

    /// kubelet `registerWithAPIServer`: POST the Node; on AlreadyExists GET it and reconcile
    /// the default labels (PATCH only if they differ); emit `Rebooted` when the boot ID
    /// changed.
    async fn register(
        &self,
        slot: &mut NodeSlot,
        name: &str,
        seq: u64,
        register: &pb::Register,
    ) -> Ack {
        let Some(status) = register.status.as_ref() else {
            return self.reject(seq, "malformed: Register without status".into());
        };
        let new_boot = status
            .node_info
            .as_ref()
            .map(|i| i.boot_id.clone())
            .unwrap_or_default();
        if slot.registered && slot.known_boot_id.as_deref() == Some(new_boot.as_str()) {
            return Ack {
                registered: true,
                ..ack(seq, AckCode::Ok, "")
            };
        }
        let now = self.now();
        let conditions = patch::conditions(status, now, &slot.conditions);
        let node = patch::initial_node(
            name,
            register,
            patch::node_status(status, conditions.clone()),
        );
        match self.nodes.create(&PostParams::default(), &node).await {
            Ok(created) => {
                slot.uid = created.metadata.uid.clone();
                self.remember(slot, &conditions, now, name).await;
                tracing::info!(node = name, "registered node");
            }
            Err(e) if api_code(&e) == Some(409) => match self.nodes.get(name).await {
                Ok(existing) => {
                    slot.uid = existing.metadata.uid.clone();
                    if let Some(existing_status) = &existing.status {
                        for c in existing_status.conditions.iter().flatten() {
                            if let Some(t) = &c.last_transition_time {
                                slot.conditions.insert(
                                    c.type_.clone(),
                                    KnownCondition {
                                        status: c.status.clone(),
                                        last_transition: t.0,
                                    },
                                );
                            }
                        }
                        slot.known_boot_id = existing_status
                            .node_info
                            .as_ref()
                            .map(|i| i.boot_id.clone());
                    }
                    if let Err(e) = self.reconcile_labels(name, &existing, register).await {
                        return ack(seq, AckCode::Retry, format!("reconciling node labels: {e}"));
                    }
                }
                Err(e) => return ack(seq, AckCode::Retry, format!("reading existing node: {e}")),
            },
            Err(e) => return ack(seq, AckCode::Retry, format!("creating node: {e}")),
        }
        if let Some(old) = slot.known_boot_id.as_deref()
            && !old.is_empty()
            && old != new_boot
        {
            self.event(
                name,
                "Warning",
                "Rebooted",
                format!("Node {name} has been rebooted, boot id: {new_boot}"),
                now,
            )
            .await;
        }
        slot.known_boot_id = Some(new_boot);
        slot.registered = true;
        self.counters.registrations.fetch_add(1, Ordering::Relaxed);
        Ack {
            registered: true,
            ..ack(seq, AckCode::Ok, "")
        }
    }

    /// kubelet `updateDefaultLabels`: force the labels kubelet computes (hostname, os, arch
    /// and their beta forms) to the agent's values; patch only when something differs.
    async fn reconcile_labels(
        &self,
        name: &str,
        existing: &Node,
        register: &pb::Register,
    ) -> Result<(), kube::Error> {
        const DEFAULT_LABELS: [&str; 5] = [
            "kubernetes.io/hostname",
            "kubernetes.io/os",
            "kubernetes.io/arch",
            "beta.kubernetes.io/os",
            "beta.kubernetes.io/arch",
        ];
        let current = existing.metadata.labels.clone().unwrap_or_default();
        let wanted: BTreeMap<String, String> = DEFAULT_LABELS
            .iter()
            .filter_map(|k| {
                register
                    .labels
                    .get(*k)
                    .map(|v| ((*k).to_owned(), v.clone()))
            })
            .filter(|(k, v)| current.get(k) != Some(v))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let body = serde_json::json!({ "metadata": { "labels": wanted } });
        self.nodes
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(body))
            .await
            .map(|_| ())
    }

    async fn remember(
        &self,
        slot: &mut NodeSlot,
        written: &[k8s_openapi::api::core::v1::NodeCondition],
        now: Timestamp,
        name: &str,
    ) {
        for c in written {
            let previous = slot.conditions.get(&c.type_).map(|k| k.status.clone());
            if c.type_ == "Ready" && previous.as_deref() != Some(c.status.as_str()) {
                let reason = if c.status == "True" {
                    "NodeReady"
                } else {
                    "NodeNotReady"
                };
                self.event(
                    name,
                    "Normal",
                    reason,
                    format!("Node {name} status is now: {reason}"),
                    now,
                )
                .await;
            }
            if let Some(t) = &c.last_transition_time {
                slot.conditions.insert(
                    c.type_.clone(),
                    KnownCondition {
                        status: c.status.clone(),
                        last_transition: t.0,
                    },
                );
            }
        }
    }

    /// kubelet `patchNodeStatus`: strategic-merge PATCH of `nodes/{name}/status`.
    async fn report(
        &self,
        slot: &mut NodeSlot,
        name: &str,
        seq: u64,
        status: Option<&pb::NodeStatus>,
    ) -> Ack {
        let Some(status) = status else {
            return self.reject(seq, "malformed: StatusReport without status".into());
        };
        if !slot.registered {
            return ack(
                seq,
                AckCode::Retry,
                "node not registered through this gateway yet",
            );
        }
        let now = self.now();
        let conditions = patch::conditions(status, now, &slot.conditions);
        let body = match patch::status_patch(&patch::node_status(status, conditions.clone()), None)
        {
            Ok(b) => b,
            Err(e) => return self.reject(seq, format!("cannot encode status: {e}")),
        };
        match self
            .nodes
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(body))
            .await
        {
            Ok(node) => {
                slot.uid = node.metadata.uid.clone().or(slot.uid.take());
                self.remember(slot, &conditions, now, name).await;
                slot.known_boot_id = status.node_info.as_ref().map(|i| i.boot_id.clone());
                self.counters.status_reports.fetch_add(1, Ordering::Relaxed);
                ack(seq, AckCode::Ok, "")
            }
            Err(e) => {
                if api_code(&e) == Some(404) {
                    // The Node was deleted: register again on the next Register.
                    slot.registered = false;
                }
                ack(seq, AckCode::Retry, format!("patching node status: {e}"))
            }
        }
    }

    /// renewTime from the gateway clock with microsecond precision, strictly after the last
    /// one written for this Lease (spec pitfall 3).
    fn renew_time(&self, slot: &mut NodeSlot) -> Timestamp {
        let now = self.now();
        let micros = Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now);
        let t = match slot.last_renew {
            Some(last) if micros <= last => last
                .checked_add(jiff::SignedDuration::from_micros(1))
                .unwrap_or(micros),
            _ => micros,
        };
        slot.last_renew = Some(t);
        t
    }

    /// kubelet's lease controller: PUT the cached Lease with a fresh renewTime (no GET on the
    /// happy path); on 409 or no cache, GET (or create when missing) and retry; up to 5
    /// attempts.
    async fn renew(&self, slot: &mut NodeSlot, name: &str, seq: u64, duration: i32) -> Ack {
        if !slot.registered {
            return ack(
                seq,
                AckCode::Retry,
                "node not registered through this gateway yet",
            );
        }
        if duration <= 0 {
            return self.reject(
                seq,
                format!("leaseDurationSeconds must be > 0, got {duration}"),
            );
        }
        let mut last_error = String::new();
        for _ in 0..5 {
            let base = match slot.latest_lease.take() {
                Some(lease) => lease,
                None => match self.leases.get_opt(name).await {
                    Ok(Some(lease)) => lease,
                    Ok(None) => return self.create_lease(slot, name, seq, duration).await,
                    Err(e) => {
                        last_error = format!("reading lease: {e}");
                        continue;
                    }
                },
            };
            let renew = self.renew_time(slot);
            let lease = patch::renewed_lease(&base, name, slot.uid.as_deref(), duration, renew);
            match self
                .leases
                .replace(name, &PostParams::default(), &lease)
                .await
            {
                Ok(written) => {
                    slot.latest_lease = Some(written);
                    self.counters.lease_renewals.fetch_add(1, Ordering::Relaxed);
                    return ack(seq, AckCode::Ok, "");
                }
                Err(e) => {
                    last_error = format!("updating lease: {e}");
                    match api_code(&e) {
                        // Conflict or gone: fall back to GET (kubelet backoffEnsureLease).
                        Some(409) | Some(404) => continue,
                        _ => break,
                    }
                }
            }
        }
        self.counters.lease_failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(node = name, error = %last_error, "lease renewal failed");
        ack(seq, AckCode::Retry, last_error)
    }

    async fn create_lease(&self, slot: &mut NodeSlot, name: &str, seq: u64, duration: i32) -> Ack {
        let uid = match &slot.uid {
            Some(uid) => uid.clone(),
            None => match self.nodes.get(name).await {
                Ok(node) => match node.metadata.uid {
                    Some(uid) => {
                        slot.uid = Some(uid.clone());
                        uid
                    }
                    None => return ack(seq, AckCode::Retry, "node has no uid yet"),
                },
                // kubelet skips creation this round when the owner Node cannot be read.
                Err(e) => {
                    return ack(
                        seq,
                        AckCode::Retry,
                        format!("reading node for the lease owner: {e}"),
                    );
                }
            },
        };
        let renew = self.renew_time(slot);
        match self
            .leases
            .create(
                &PostParams::default(),
                &patch::new_lease(name, &uid, duration, renew),
            )
            .await
        {
            Ok(created) => {
                slot.latest_lease = Some(created);
                self.counters.lease_renewals.fetch_add(1, Ordering::Relaxed);
                ack(seq, AckCode::Ok, "")
            }
            Err(e) => {
                self.counters.lease_failures.fetch_add(1, Ordering::Relaxed);
                ack(seq, AckCode::Retry, format!("creating lease: {e}"))
            }
        }
    }

    async fn event(&self, name: &str, type_: &str, reason: &str, message: String, now: Timestamp) {
        let event = patch::node_event(name, type_, reason, message, now);
        if let Err(error) = self.events.create(&PostParams::default(), &event).await {
            tracing::warn!(node = name, reason, %error, "could not record event");
        }
    }
}

/// Checks a Node name is a DNS-1123 subdomain, as the apiserver requires.
///
/// Errors: a message naming the problem.
pub fn validate_node_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!("malformed: {name:?} is not a valid node name"))
    }
}

impl Handler for Gateway {
    async fn handle(&self, peer: &Peer, message: pb::AgentMessage) -> Ack {
        self.handle_message(peer, message).await
    }

    fn rejected(&self, peer: &Peer, reason: &str) {
        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(transport = peer.transport.as_str(), remote = ?peer.remote, reason, "undecodable message rejected");
    }
}

/// Builds the kube-rs client the gateway writes with: `config` with a 10 s read/write
/// timeout (kubelet's heartbeat client timeout) and a client-side rate limit of `qps`
/// requests per second (tower `RateLimitLayer`), so a reconnect storm of thousands of
/// agents cannot flood the apiserver.
///
/// Errors: kube's error when the config cannot produce a client (bad TLS material).
pub fn kube_client(mut config: kube::Config, qps: u64) -> Result<kube::Client, kube::Error> {
    config.read_timeout = Some(Duration::from_secs(10));
    config.write_timeout = Some(Duration::from_secs(10));
    let limit = tower::limit::RateLimitLayer::new(qps.max(1), Duration::from_secs(1));
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&limit)
        .build())
}
