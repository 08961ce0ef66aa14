//! The health conditions' settings ([`crate::health`] computes the conditions): the
//! agent configuration's KubeletConfiguration-style fields and their ranges.

/// The agent's health-condition settings (KubeletConfiguration-style fields of the agent
/// config; see [`crate::config`]), computed by [`crate::health`].
#[derive(Debug, Clone, PartialEq)]
pub struct HealthSettings {
    /// `systemMemoryContentionThreshold` (KEP-5394's name): memory PSI as a fraction of wall
    /// time, 0–1 (default 0.1 = 10 %); 0 turns `SystemMemoryContentionPressure` off.
    pub system_memory_contention_threshold: f64,
    /// `systemDiskContentionThreshold`: as above for io PSI and
    /// `SystemDiskContentionPressure`.
    pub system_disk_contention_threshold: f64,
    /// `readonlyFilesystemCondition` (default true): report `ReadonlyFilesystem`.
    pub readonly_filesystem: bool,
    /// `thermalCondition` (default true): report `ThermalPressure`.
    pub thermal: bool,
    /// `thermalLimitCelsius`: a temperature, °C, at or above which any thermal zone makes
    /// `ThermalPressure` True even below its trip points (default none).
    pub thermal_limit_celsius: Option<f64>,
    /// `underVoltageCondition` (default true): report `UnderVoltage`.
    pub under_voltage: bool,
    /// `clockSyncCondition` (default true): report `ClockUnsynchronized`.
    pub clock_sync: bool,
}

impl Default for HealthSettings {
    fn default() -> Self {
        Self {
            system_memory_contention_threshold: DEFAULT_CONTENTION_THRESHOLD,
            system_disk_contention_threshold: DEFAULT_CONTENTION_THRESHOLD,
            readonly_filesystem: true,
            thermal: true,
            thermal_limit_celsius: None,
            under_voltage: true,
            clock_sync: true,
        }
    }
}

impl HealthSettings {
    /// Every health condition off: kubelet's four conditions alone.
    pub fn off() -> Self {
        Self {
            system_memory_contention_threshold: 0.0,
            system_disk_contention_threshold: 0.0,
            readonly_filesystem: false,
            thermal: false,
            thermal_limit_celsius: None,
            under_voltage: false,
            clock_sync: false,
        }
    }
}

/// Default PSI threshold, a fraction of wall time (10 %). KEP-5394 leaves the default to
/// experiment; 10 % of time with *every* non-idle task stalled is well past a slow moment
/// and far below where systemd-oomd acts (60 % by default), so a node stops taking work
/// before anything is killed.
pub const DEFAULT_CONTENTION_THRESHOLD: f64 = 0.1;

/// A health setting outside its range: the value given and what the field takes. Its
/// `Display` is the config error's text (the caller names the field), e.g. `got 10; a
/// fraction of time between 0 (off) and 1, e.g. 0.1 for 10 %`.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("got {value}; {expected}")]
pub struct OutOfRange {
    /// The value given.
    pub value: f64,
    /// The range the field takes, with an example.
    pub expected: &'static str,
}

/// Checks a PSI threshold field: a fraction in `[0, 1]`.
///
/// Errors: [`OutOfRange`] for the config error of that field.
pub fn check_threshold(value: f64) -> Result<f64, OutOfRange> {
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(OutOfRange {
            value,
            expected: "a fraction of time between 0 (off) and 1, e.g. 0.1 for 10 %",
        })
    }
}

/// Checks `thermalLimitCelsius`: above 0 and at most 150 °C (no board runs hotter).
///
/// Errors: [`OutOfRange`] for the config error of that field.
pub fn check_thermal_limit(value: f64) -> Result<f64, OutOfRange> {
    if value > 0.0 && value <= 150.0 {
        Ok(value)
    } else {
        Err(OutOfRange {
            value,
            expected: "degrees Celsius above 0 and at most 150, e.g. 80",
        })
    }
}
