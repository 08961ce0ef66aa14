//! Registration: kubelet's `registerWithAPIServer` (`pkg/kubelet/kubelet_node_status.go`):
//! POST the Node; on AlreadyExists GET it and reconcile the default labels and hugepages;
//! kubelet's start events.

use super::{
    NodeWrites, Reboot, Writer, boot_id_of, condition_event, journal, retry, validate_status,
};
use crate::apiserver::answers;
use crate::bodies;
use crate::bodies::MANAGED_LABEL;
use crate::view::NodeRecord;
use edgebeat_proto as pb;
use edgebeat_proto::registration::NodeName;
use edgebeat_proto::{Answer, ConditionStatus, EventType, NodeConditionType};
use edgebeat_transports::ingress::RejectReason;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use std::collections::BTreeMap;

/// kubelet v1.36's message for a host on cgroup v1 (`pkg/kubelet/cm/container_manager.go:
/// CgroupV1DeprecatedWarning`), the `CgroupV1` Warning event's.
pub const CGROUP_V1_WARNING: &str = "cgroup v1 detected. cgroup v1 support is deprecated and will be removed in a future release. Please migrate to cgroup v2. More information at https://git.k8s.io/enhancements/keps/sig-node/5573-remove-cgroup-v1";

impl Writer {
    /// kubelet `registerWithAPIServer`: POST the Node (unless `skip_create`, kubelet's
    /// `registerNode: false`, or `registration_completed`: the agent's process registered
    /// before, and a Node missing now was deleted, answered `node_not_found`, as kubelet
    /// registers once per process); on AlreadyExists GET it and reconcile the default labels
    /// (PATCH only if they differ). When the boot ID differs from the one the apiserver
    /// holds, the status is written at once with the `Rebooted` event, as kubelet's
    /// `MachineInfo` setter does in its first status update after start. Only registration
    /// records `Rebooted` (an agent registers first after every start), comparing with the
    /// Node just read from the apiserver: a replica sharing the fleet that handles the next
    /// message of the new boot, before its watch has delivered the write, records nothing.
    pub(crate) async fn register(
        &self,
        w: &mut NodeWrites,
        name: &NodeName,
        register: &pb::Register,
    ) -> Answer {
        let status = match self.checked(register) {
            Ok(status) => status,
            Err(rejected) => return rejected,
        };
        let usable = self.usable_journal(name, &register.journal);
        let new_boot = status
            .node_info
            .as_ref()
            .map(|i| i.boot_id.as_str())
            .unwrap_or_default();
        // The header form is the ingress's to grant (`Asked::answer` sets it: every ingress
        // restores compact headers), not the writer's.
        let registered = Answer::Registered {
            headers: pb::HeaderForm::Full,
            resend_status: false,
            certificate_due: false,
        };
        let known = self.known(w, name);
        // A new connection of a process this replica registered: nothing to write. A new
        // process (even of the same boot) registers in full, with kubelet's start events.
        if register.registration_completed
            && w.registered
            && known.as_ref().and_then(|k| k.boot_id.as_deref()) == Some(new_boot)
        {
            return registered;
        }
        let now = self.now();
        let existing = if register.skip_create || register.registration_completed {
            match self.registered_before(w, name, register).await {
                Ok(node) => node,
                Err(answer) => return answer,
            }
        } else {
            let before = known.map(|k| k.conditions).unwrap_or_default();
            let mut conditions = bodies::conditions(status, now, &before);
            // Transitions made before the Node ever existed (its link was down from the
            // start) keep their times too.
            let journal = journal::timed(&usable, now, &before, name, new_boot);
            journal::transitions(&mut conditions, &journal, &before);
            let mut node =
                bodies::initial_node(name, register, self.node_status(status, conditions));
            if self.resource_metrics.is_some() {
                node.metadata.annotations = Some(resource_metrics_annotation(name));
            }
            match self.api.create_node(&node).await {
                Ok(created) => {
                    self.view.observe_node(&created);
                    w.registered = true;
                    w.status_written = true;
                    self.counters.registrations.inc();
                    tracing::info!(node = name.as_str(), "registered node");
                    self.start_events(name, register, &usable, now).await;
                    self.journal_events(&NodeRecord::default(), now, name, &journal)
                        .await;
                    return registered;
                }
                Err(e) if answers::is_already_exists(&e) => match self.api.get_node(name).await {
                    Ok(node) => node,
                    Err(e) => {
                        return retry(format!("reading existing node: {e}"));
                    }
                },
                Err(e) => return retry(format!("creating node: {e}")),
            }
        };
        self.view.observe_node(&existing);
        if let Err(e) = self.reconcile_labels(name, &existing, register).await {
            return retry(format!("reconciling node labels: {e}"));
        }
        if !register.registration_completed
            && let Err(e) = self.reconcile_hugepages(name, &existing, status).await
        {
            return retry(format!("reconciling hugepages: {e}"));
        }
        let held = NodeRecord::of(&existing);
        let reboot = Reboot::Record {
            booted: booted(&held, register.uptime_ms, now),
        };
        let journal = journal::timed(&usable, now, &held.conditions, name, boot_id_of(status));
        let new_boot = held.boot_id.as_deref().is_some_and(|b| b != new_boot);
        // A board's agent starts with its boot: its start events belong there.
        let started = match reboot {
            Reboot::Record {
                booted: Some(booted),
            } if new_boot => booted,
            _ => now,
        };
        if new_boot {
            // A new boot: write it now, with its event (see above).
            let answer = self
                .write_status(w, name, status, &held, now, reboot, &journal)
                .await;
            if matches!(answer, Answer::NodeNotFound { .. }) && !register.registration_completed {
                // Deleted while this first registration was under way: it creates the
                // Node when retried.
                return retry("node deleted during registration");
            }
            if !answer.is_written() {
                return answer;
            }
        }
        w.registered = true;
        self.counters.registrations.inc();
        if !register.registration_completed {
            self.start_events(name, register, &usable, started).await;
        }
        registered
    }

    /// The status of `register`, checked: a Register without one is malformed, and its
    /// status and registration fields must be valid and within the input limits
    /// ([`crate::restriction`]).
    ///
    /// Errors: the rejection to answer, counted.
    fn checked<'r>(&self, register: &'r pb::Register) -> Result<&'r pb::NodeStatus, Answer> {
        let Some(status) = register.status.as_ref() else {
            return Err(self.reject(
                RejectReason::Malformed,
                "malformed: Register without status".into(),
            ));
        };
        if let Err(why) = validate_status(status)
            .and_then(|()| crate::restriction::validate_status_limits(status))
            .map_err(|e| e.to_string())
            .and_then(|()| pb::registration::validate_register(register).map_err(|e| e.to_string()))
        {
            return Err(self.reject(RejectReason::Invalid, why));
        }
        Ok(status)
    }

    /// The Node `name` as the apiserver holds it, for a Register that creates none
    /// (`skip_create`, kubelet's `registerNode: false`, or `registration_completed`).
    ///
    /// Errors: the answer instead: the node forgotten (`node_not_found`) when the agent's
    /// process registered it before and it was deleted since, a retry when it does not
    /// exist yet or cannot be read.
    async fn registered_before(
        &self,
        w: &mut NodeWrites,
        name: &NodeName,
        register: &pb::Register,
    ) -> Result<Node, Answer> {
        match self.api.get_node_opt(name).await {
            Ok(Some(node)) => Ok(node),
            // The agent registered it before, on another connection: deleted since.
            Ok(None) if register.registration_completed => Err(self.forget(w, name)),
            Ok(None) => Err(retry("node does not exist and registerNode is false")),
            Err(e) => Err(retry(format!("reading node: {e}"))),
        }
    }

    /// kubelet's condition events of a start: at registration its setters run on a fresh
    /// `initialNode`, where every pressure condition is new (`Unknown`, then its status), so
    /// each records its event — `NodeHasSufficientMemory`, `NodeHasNoDiskPressure`,
    /// `NodeHasSufficientPID` or the insufficient forms — while a new Ready records none
    /// (`pkg/kubelet/nodestatus/setters.go`; `initialNode` in
    /// `pkg/kubelet/kubelet_node_status.go`). Recorded once per agent process (not for a
    /// `Register` with `registration_completed`). Each is of the status the condition had
    /// at the start: the one before its first transition in `journal`, when it has one
    /// (the transitions themselves are recorded with the status write), stamped `at`. A
    /// health condition with transitions records none here: its event's reason is the
    /// condition's own, known only for the status it has now. Before them, on a cgroup v1
    /// host (`Register.cgroup_version` 1), kubelet's `CgroupV1` Warning
    /// ([`CGROUP_V1_WARNING`], `pkg/kubelet/kubelet_linux.go: cgroupVersionCheck`, run at
    /// every kubelet start).
    pub(super) async fn start_events(
        &self,
        name: &NodeName,
        register: &pb::Register,
        journal: &[&pb::ConditionTransition],
        at: Timestamp,
    ) {
        if register.cgroup_version == 1 {
            self.event(
                name,
                EventType::Warning,
                "CgroupV1",
                CGROUP_V1_WARNING.to_owned(),
                at,
            )
            .await;
        }
        let Some(status) = register.status.as_ref() else {
            return;
        };
        for c in &status.conditions {
            // Checked at the edge ([`validate_status`], [`usable`]): skipped, never misread.
            let (Some(type_), Some(now)) = (
                NodeConditionType::from_name(&c.r#type),
                ConditionStatus::parse(&c.status),
            ) else {
                continue;
            };
            let first = journal.iter().find(|t| t.r#type == c.r#type);
            let at_start = match first.map(|t| ConditionStatus::from_api(&t.status)) {
                None => now,
                Some(_) if !type_.is_kubelets() => continue,
                Some(status) => ConditionStatus::from_bool(!status.is_true()),
            };
            if let Some((kind, reason)) = condition_event(type_, at_start, &c.reason, None) {
                self.condition_event(name, kind, &reason, at).await;
            }
        }
    }

    /// kubelet `reconcileHugePageResource` (`pkg/kubelet/kubelet_node_status.go`), run when
    /// a starting kubelet finds its Node already there: a `hugepages-<size>` in the Node's
    /// capacity that the host no longer has (the agent does not report it) is removed from
    /// capacity and allocatable, with a strategic-merge `null`. Only then: status reports,
    /// like kubelet's, never remove a key.
    ///
    /// Errors: the PATCH's.
    pub(super) async fn reconcile_hugepages(
        &self,
        name: &NodeName,
        existing: &Node,
        status: &pb::NodeStatus,
    ) -> Result<(), kube::Error> {
        let held = existing.status.as_ref();
        let gone: Vec<&String> = held
            .and_then(|s| s.capacity.as_ref())
            .into_iter()
            .flat_map(|c| c.keys())
            .filter(|k| k.starts_with("hugepages-") && !status.capacity.contains_key(*k))
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        tracing::info!(node = name.as_str(), resources = ?gone, "removing huge page resources no longer supported");
        let removed: serde_json::Map<String, serde_json::Value> = gone
            .iter()
            .map(|k| ((*k).clone(), serde_json::Value::Null))
            .collect();
        let body = serde_json::json!({
            "status": { "capacity": removed, "allocatable": removed }
        });
        let node = self.api.patch_node_status(name, body).await?;
        self.view.observe_node(&node);
        Ok(())
    }

    /// Records on Node `name` that it speaks with certificate `id`
    /// ([`bodies::CERTIFICATE_SHA256_ANNOTATION`], [`bodies::CERTIFICATE_NOT_BEFORE_ANNOTATION`]),
    /// in a patch of `nodes/{name}/status` whose metadata the apiserver keeps (as
    /// `reconcile_labels`), and takes the answer into the view. Called when an identified
    /// node's certificate is newer than (or missing from) the Node's record: at its first
    /// identified message and after each rotation, so a write per node and certificate.
    ///
    /// Errors: the apiserver's (`kube::Error`).
    pub(crate) async fn record_certificate(
        &self,
        name: &NodeName,
        id: edgebeat_transports::ingress::CertificateId,
    ) -> Result<(), kube::Error> {
        let not_before = jiff::Timestamp::from_second(id.not_before)
            .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_default();
        let body = serde_json::json!({ "metadata": { "annotations": {
            bodies::CERTIFICATE_SHA256_ANNOTATION: id.sha256_hex(),
            bodies::CERTIFICATE_NOT_BEFORE_ANNOTATION: not_before,
        } } });
        let node = self.api.patch_node_status(name, body).await?;
        self.view.observe_node(&node);
        self.counters.certificates_recorded.inc();
        tracing::info!(node = name.as_str(), certificate = ?id, "recorded the node's certificate");
        Ok(())
    }

    /// kubelet `updateDefaultLabels` (`pkg/kubelet/kubelet_node_status.go`): force the labels
    /// kubelet computes (hostname, os, arch and their beta forms, and edgebeat's
    /// `edgebeat.io/container-runtime`) to the agent's values, plus [`MANAGED_LABEL`] (the
    /// selector of the gateway's watch); patch only when something differs.
    ///
    /// Errors: the apiserver's (`kube::Error`).
    pub(super) async fn reconcile_labels(
        &self,
        name: &NodeName,
        existing: &Node,
        register: &pb::Register,
    ) -> Result<(), kube::Error> {
        let current = existing.metadata.labels.clone().unwrap_or_default();
        let wanted: BTreeMap<String, String> = pb::registration::DEFAULT_LABEL_KEYS
            .iter()
            .filter_map(|k| {
                register
                    .labels
                    .get(*k)
                    .map(|v| ((*k).to_owned(), v.clone()))
            })
            .chain([(MANAGED_LABEL.0.to_owned(), MANAGED_LABEL.1.to_owned())])
            .filter(|(k, v)| current.get(k) != Some(v))
            .collect();
        // metrics-server's path annotation is not reconciled here: it rides the status write
        // that names this replica ([`Writer::write_status`]), asked for by the answer to the
        // node's first renewal here (`resend_status`) when no status was written.
        if wanted.is_empty() {
            return Ok(());
        }
        let body = serde_json::json!({ "metadata": { "labels": wanted } });
        let node = self.api.patch_node_status(name, body).await?;
        self.view.observe_node(&node);
        Ok(())
    }
}

/// The annotation telling metrics-server where on a replica `name`'s resource metrics are
/// ([`crate::resource_metrics::PATH_ANNOTATION`]).
pub(super) fn resource_metrics_annotation(name: &NodeName) -> BTreeMap<String, String> {
    BTreeMap::from([(
        crate::resource_metrics::PATH_ANNOTATION.to_owned(),
        crate::resource_metrics::node_path(name),
    )])
}

/// The boot time of a registering agent, from its uptime (`uptime_ms`, 0 for unknown) on
/// this replica's clock at `now`; an uptime that puts it before the last transition the
/// old boot wrote (in `held`) is not believed (`None`).
fn booted(held: &NodeRecord, uptime_ms: u64, now: Timestamp) -> Option<Timestamp> {
    let old_boot_seen = held.conditions.iter().map(|(_, k)| k.last_transition).max();
    (uptime_ms > 0)
        .then(|| {
            now.checked_sub(SignedDuration::from_millis(
                i64::try_from(uptime_ms).unwrap_or(i64::MAX),
            ))
            .ok()
        })
        .flatten()
        .filter(|booted| old_boot_seen.is_none_or(|seen| *booted >= seen))
}
