//! The Node as Kubernetes JSON (`core/v1` field names), for `--once`: what the agent would
//! register (name, labels, taints) and the NodeStatus it would report.
//!
//! Times are absent on purpose: the agent never stamps them, the gateway does with its own
//! clock. Everything else is what the gateway writes.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::Taint;
use crate::status::ComputedStatus;

/// A `core/v1` Node as the agent would register it: `apiVersion`, `kind`, `metadata.name`
/// and `labels`, `spec.taints` and `spec.unschedulable` (kubelet `initialNode`), and
/// `status` ([`NodeStatusView`]).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: MetadataView<'a>,
    spec: SpecView<'a>,
    status: NodeStatusView<'a>,
}

#[derive(Debug, Serialize)]
struct MetadataView<'a> {
    name: &'a str,
    labels: &'a BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
struct SpecView<'a> {
    #[serde(skip_serializing_if = "<[Taint]>::is_empty")]
    taints: &'a [Taint],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    unschedulable: bool,
}

impl<'a> NodeView<'a> {
    /// Borrows what the agent registers: `name`, `labels` (see
    /// [`crate::run::node_labels`]), the registration taints and schedulability of `config`,
    /// and `status`.
    pub fn new(
        name: &'a str,
        labels: &'a BTreeMap<String, String>,
        config: &'a crate::AgentConfig,
        status: &'a ComputedStatus,
    ) -> Self {
        Self {
            api_version: "v1",
            kind: "Node",
            metadata: MetadataView { name, labels },
            spec: SpecView {
                taints: &config.register_with_taints,
                unschedulable: !config.register_schedulable,
            },
            status: NodeStatusView::new(status),
        }
    }
}

/// `core/v1` NodeStatus fields the agent computes, serialized with Kubernetes' names.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatusView<'a> {
    capacity: &'a std::collections::BTreeMap<String, String>,
    allocatable: &'a std::collections::BTreeMap<String, String>,
    conditions: Vec<ConditionView<'a>>,
    addresses: Vec<AddressView<'a>>,
    node_info: NodeInfoView<'a>,
}

#[derive(Debug, Serialize)]
struct ConditionView<'a> {
    #[serde(rename = "type")]
    type_: &'a str,
    status: &'a str,
    reason: &'a str,
    message: &'a str,
}

#[derive(Debug, Serialize)]
struct AddressView<'a> {
    #[serde(rename = "type")]
    type_: &'a str,
    address: &'a str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeInfoView<'a> {
    #[serde(rename = "machineID")]
    machine_id: &'a str,
    #[serde(rename = "systemUUID")]
    system_uuid: &'a str,
    #[serde(rename = "bootID")]
    boot_id: &'a str,
    kernel_version: &'a str,
    os_image: &'a str,
    container_runtime_version: &'a str,
    kubelet_version: &'a str,
    operating_system: &'a str,
    architecture: &'a str,
}

impl<'a> NodeStatusView<'a> {
    /// Borrows `status` as Kubernetes-shaped JSON.
    pub fn new(status: &'a ComputedStatus) -> Self {
        let i = &status.node_info;
        Self {
            capacity: &status.capacity,
            allocatable: &status.allocatable,
            conditions: status
                .conditions
                .iter()
                .map(|c| ConditionView {
                    type_: c.type_.as_str(),
                    status: c.status.as_str(),
                    reason: c.reason.as_str(),
                    message: &c.message,
                })
                .collect(),
            addresses: status
                .addresses
                .iter()
                .map(|(t, a)| AddressView {
                    type_: t,
                    address: a,
                })
                .collect(),
            node_info: NodeInfoView {
                machine_id: &i.machine_id,
                system_uuid: &i.system_uuid,
                boot_id: &i.boot_id,
                kernel_version: &i.kernel_version,
                os_image: &i.os_image,
                container_runtime_version: &i.container_runtime_version,
                kubelet_version: &i.kubelet_version,
                operating_system: &i.operating_system,
                architecture: &i.architecture,
            },
        }
    }
}
