//! The `reason` of every NodeCondition the agent writes, as a type: a misspelt reason is a
//! compile error, and the text is in one place.

/// A NodeCondition `reason` (CamelCase, as the API's reasons are).
///
/// kubelet's four conditions use kubelet's own reasons (`pkg/kubelet/nodestatus/setters.go`:
/// `MemoryPressureCondition`, `DiskPressureCondition`, `PIDPressureCondition`,
/// `ReadyCondition`). The health conditions follow node-problem-detector's style
/// (`FilesystemIsReadOnly` is its reason, `config/readonly-monitor.json`) and edgebeat's own
/// names where it has none (see `crate::health`).
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
