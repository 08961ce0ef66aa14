//! The words of NodeConditions and their Events, defined once for the agent and the
//! gateway: condition types ([`NodeConditionType`]), statuses ([`ConditionStatus`]), the
//! reasons an agent writes ([`ConditionReason`]), Event types ([`EventType`]) and kubelet's
//! event reason for each condition transition ([`NodeConditionType::event_reason`]).
//! Strings from the wire or the apiserver are parsed into these at the edge
//! ([`NodeConditionType::from_name`], [`ConditionStatus::parse`],
//! [`ConditionStatus::from_api`]); nothing else compares condition text.

/// Status of a NodeCondition (`k8s.io/api/core/v1` `ConditionStatus`). An agent reports
/// only `True` or `False` ([`ConditionStatus::is_reported`]): `Unknown` is what the node
/// lifecycle controller writes when a node stops renewing
/// (`pkg/controller/nodelifecycle/node_lifecycle_controller.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// `"True"`.
    True,
    /// `"False"`.
    False,
    /// `"Unknown"`.
    Unknown,
}

impl ConditionStatus {
    /// The three, in the order of `k8s.io/api/core/v1` (`ConditionTrue`, `ConditionFalse`,
    /// `ConditionUnknown`); `status as usize` indexes it.
    pub const ALL: [Self; 3] = [Self::True, Self::False, Self::Unknown];

    /// The API string: `"True"`, `"False"` or `"Unknown"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }

    /// The status spelt exactly `status` (case-sensitive, as the API); `None` for any other
    /// text. For what an agent sends, where anything but `True`/`False` is refused.
    pub fn parse(status: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == status)
    }

    /// A status as the apiserver holds it: `True` and `False` as themselves, anything else
    /// (`Unknown`, or text some other writer put there) as `Unknown`.
    pub fn from_api(status: &str) -> Self {
        Self::parse(status).unwrap_or(Self::Unknown)
    }

    /// `True` or `False`: what an agent reports.
    pub const fn is_reported(self) -> bool {
        !matches!(self, Self::Unknown)
    }

    /// `True` as `true`, anything else as `false`.
    pub const fn is_true(self) -> bool {
        matches!(self, Self::True)
    }

    /// `True` when `true`, else `False`.
    pub const fn from_bool(value: bool) -> Self {
        if value { Self::True } else { Self::False }
    }
}

impl std::fmt::Display for ConditionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Type of an Event (`k8s.io/api/core/v1` `EventTypeNormal`, `EventTypeWarning`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// `"Normal"`: nothing to act on.
    Normal,
    /// `"Warning"`: something may need attention.
    Warning,
}

impl EventType {
    /// The API string: `"Normal"` or `"Warning"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A NodeCondition type edgebeat reports (`k8s.io/api/core/v1` `NodeConditionType`):
/// kubelet's four ([`NodeConditionType::KUBELET`]) and the agent's health conditions
/// ([`NodeConditionType::HEALTH`]). On the wire and in the apiserver it is its
/// [`NodeConditionType::as_str`]; the gateway writes no other type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeConditionType {
    /// `MemoryPressure` (kubelet).
    MemoryPressure,
    /// `DiskPressure` (kubelet).
    DiskPressure,
    /// `PIDPressure` (kubelet).
    PidPressure,
    /// `Ready` (kubelet).
    Ready,
    /// `SystemMemoryContentionPressure` (KEP-5394).
    SystemMemoryContentionPressure,
    /// `SystemDiskContentionPressure` (KEP-5394).
    SystemDiskContentionPressure,
    /// `ReadonlyFilesystem` (node-problem-detector).
    ReadonlyFilesystem,
    /// `ThermalPressure` (edgebeat).
    ThermalPressure,
    /// `UnderVoltage` (edgebeat).
    UnderVoltage,
    /// `ClockUnsynchronized` (edgebeat).
    ClockUnsynchronized,
}

impl NodeConditionType {
    /// The types kubelet reports, in kubelet's order (`pkg/kubelet/kubelet_node_status.go`
    /// `defaultNodeStatusFuncs`): the agent reports all four, Ready last.
    pub const KUBELET: [Self; 4] = [
        Self::MemoryPressure,
        Self::DiskPressure,
        Self::PidPressure,
        Self::Ready,
    ];

    /// The health conditions an agent may add to kubelet's four, each optional (off in the
    /// agent's config, or its signal unreadable on the host):
    ///
    /// - `SystemMemoryContentionPressure`, `SystemDiskContentionPressure`: KEP-5394 (PSI
    ///   based node conditions, `kubernetes/enhancements`
    ///   `keps/sig-node/5394-psi-node-conditions`);
    /// - `ReadonlyFilesystem`: node-problem-detector's (`config/readonly-monitor.json`);
    /// - `ThermalPressure`, `UnderVoltage`, `ClockUnsynchronized`: edgebeat's own.
    ///
    /// The README section "Health conditions" gives each one's rule.
    pub const HEALTH: [Self; 6] = [
        Self::SystemMemoryContentionPressure,
        Self::SystemDiskContentionPressure,
        Self::ReadonlyFilesystem,
        Self::ThermalPressure,
        Self::UnderVoltage,
        Self::ClockUnsynchronized,
    ];

    /// Every type: [`NodeConditionType::KUBELET`], then [`NodeConditionType::HEALTH`],
    /// in declaration order, so `type_ as usize` is a type's place in it (both checked as
    /// it is built).
    pub const ALL: [Self; 10] = {
        let mut all = [Self::Ready; 10];
        assert!(Self::KUBELET.len() + Self::HEALTH.len() == all.len());
        let mut i = 0;
        while i < all.len() {
            all[i] = if i < Self::KUBELET.len() {
                Self::KUBELET[i]
            } else {
                Self::HEALTH[i - Self::KUBELET.len()]
            };
            assert!(all[i] as usize == i);
            i += 1;
        }
        all
    };

    /// The API's spelling, e.g. `PIDPressure`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MemoryPressure => "MemoryPressure",
            Self::DiskPressure => "DiskPressure",
            Self::PidPressure => "PIDPressure",
            Self::Ready => "Ready",
            Self::SystemMemoryContentionPressure => "SystemMemoryContentionPressure",
            Self::SystemDiskContentionPressure => "SystemDiskContentionPressure",
            Self::ReadonlyFilesystem => "ReadonlyFilesystem",
            Self::ThermalPressure => "ThermalPressure",
            Self::UnderVoltage => "UnderVoltage",
            Self::ClockUnsynchronized => "ClockUnsynchronized",
        }
    }

    /// The type spelt `name` (case-sensitive, as the API); `None` for a type edgebeat does
    /// not report.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// One of kubelet's four.
    pub fn is_kubelets(self) -> bool {
        Self::KUBELET.contains(&self)
    }
}

impl std::fmt::Display for NodeConditionType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compares with the API's spelling, so `condition.type_ == "Ready"` reads as it would in
/// client-go.
impl PartialEq<&str> for NodeConditionType {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for NodeConditionType {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl NodeConditionType {
    /// kubelet's Event reason for a condition of this type that reaches `status`
    /// (`pkg/kubelet/events/event.go`, recorded by the setters of
    /// `pkg/kubelet/nodestatus/setters.go`): `NodeReady`/`NodeNotReady` for Ready, e.g.
    /// `NodeHasSufficientMemory` for MemoryPressure False. `None` for a pressure condition
    /// reaching `Unknown` (kubelet never writes it) and for the health conditions, whose
    /// Event reason is the condition's own reason, as node-problem-detector's.
    pub const fn event_reason(self, status: ConditionStatus) -> Option<&'static str> {
        use ConditionStatus::{False, True};
        Some(match (self, status) {
            (Self::Ready, True) => "NodeReady",
            (Self::Ready, _) => "NodeNotReady",
            (Self::MemoryPressure, True) => "NodeHasInsufficientMemory",
            (Self::MemoryPressure, False) => "NodeHasSufficientMemory",
            (Self::DiskPressure, True) => "NodeHasDiskPressure",
            (Self::DiskPressure, False) => "NodeHasNoDiskPressure",
            (Self::PidPressure, True) => "NodeHasInsufficientPID",
            (Self::PidPressure, False) => "NodeHasSufficientPID",
            _ => return None,
        })
    }
}

/// A NodeCondition `reason` (CamelCase, as the API's reasons are).
///
/// kubelet's four conditions use kubelet's own reasons (`pkg/kubelet/nodestatus/setters.go`:
/// `MemoryPressureCondition`, `DiskPressureCondition`, `PIDPressureCondition`,
/// `ReadyCondition`). The health conditions follow node-problem-detector's style
/// (`FilesystemIsReadOnly` is its reason, `config/readonly-monitor.json`) and edgebeat's own
/// names where it has none (the agent's `health` module; README "Health conditions").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConditionReason {
    /// MemoryPressure True.
    KubeletHasInsufficientMemory,
    /// MemoryPressure False.
    KubeletHasSufficientMemory,
    /// DiskPressure True.
    KubeletHasDiskPressure,
    /// DiskPressure False.
    KubeletHasNoDiskPressure,
    /// PIDPressure True.
    KubeletHasInsufficientPid,
    /// PIDPressure False.
    KubeletHasSufficientPid,
    /// Ready True.
    KubeletReady,
    /// Ready False (capacity missing).
    KubeletNotReady,
    /// SystemMemoryContentionPressure True (memory PSI `full` over the threshold).
    KubeletHasSystemMemoryContentionPressure,
    /// SystemMemoryContentionPressure False.
    KubeletHasNoSystemMemoryContentionPressure,
    /// SystemDiskContentionPressure True (io PSI `full` over the threshold).
    KubeletHasSystemDiskContentionPressure,
    /// SystemDiskContentionPressure False.
    KubeletHasNoSystemDiskContentionPressure,
    /// ReadonlyFilesystem True.
    FilesystemIsReadOnly,
    /// ReadonlyFilesystem False.
    FilesystemIsNotReadOnly,
    /// ThermalPressure True: a thermal zone at a passive, hot or critical trip point.
    TemperatureAboveTripPoint,
    /// ThermalPressure True: a zone at or over `thermalLimitCelsius`.
    TemperatureAboveLimit,
    /// ThermalPressure True: a cooling device throttles the CPU, or the firmware's soft
    /// temperature limit is active.
    CpuThermallyThrottled,
    /// ThermalPressure False.
    TemperatureNormal,
    /// UnderVoltage True.
    UnderVoltageDetected,
    /// UnderVoltage False, but under-voltage occurred since boot.
    UnderVoltageOccurred,
    /// UnderVoltage False.
    SufficientVoltage,
    /// ClockUnsynchronized True.
    NtpNotSynchronized,
    /// ClockUnsynchronized False.
    NtpSynchronized,
}

impl ConditionReason {
    /// The API text, e.g. `KubeletHasSufficientMemory`, `CPUThermallyThrottled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::KubeletHasInsufficientMemory => "KubeletHasInsufficientMemory",
            Self::KubeletHasSufficientMemory => "KubeletHasSufficientMemory",
            Self::KubeletHasDiskPressure => "KubeletHasDiskPressure",
            Self::KubeletHasNoDiskPressure => "KubeletHasNoDiskPressure",
            Self::KubeletHasInsufficientPid => "KubeletHasInsufficientPID",
            Self::KubeletHasSufficientPid => "KubeletHasSufficientPID",
            Self::KubeletReady => "KubeletReady",
            Self::KubeletNotReady => "KubeletNotReady",
            Self::KubeletHasSystemMemoryContentionPressure => {
                "KubeletHasSystemMemoryContentionPressure"
            }
            Self::KubeletHasNoSystemMemoryContentionPressure => {
                "KubeletHasNoSystemMemoryContentionPressure"
            }
            Self::KubeletHasSystemDiskContentionPressure => {
                "KubeletHasSystemDiskContentionPressure"
            }
            Self::KubeletHasNoSystemDiskContentionPressure => {
                "KubeletHasNoSystemDiskContentionPressure"
            }
            Self::FilesystemIsReadOnly => "FilesystemIsReadOnly",
            Self::FilesystemIsNotReadOnly => "FilesystemIsNotReadOnly",
            Self::TemperatureAboveTripPoint => "TemperatureAboveTripPoint",
            Self::TemperatureAboveLimit => "TemperatureAboveLimit",
            Self::CpuThermallyThrottled => "CPUThermallyThrottled",
            Self::TemperatureNormal => "TemperatureNormal",
            Self::UnderVoltageDetected => "UnderVoltageDetected",
            Self::UnderVoltageOccurred => "UnderVoltageOccurred",
            Self::SufficientVoltage => "SufficientVoltage",
            Self::NtpNotSynchronized => "NTPNotSynchronized",
            Self::NtpSynchronized => "NTPSynchronized",
        }
    }
}

impl std::fmt::Display for ConditionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
