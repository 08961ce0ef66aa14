//! `evictionHard` signals (`pkg/kubelet/eviction/api/types.go`).

/// An eviction signal kubelet knows, a key of `evictionHard`
/// (`pkg/kubelet/eviction/api/types.go`). The status computes pressure from
/// [`AgentConfig::eviction_hard`](super::AgentConfig::eviction_hard) by these values, so a
/// misspelt signal is a compile error, not a threshold that silently never applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EvictionSignal {
    /// `memory.available`: bytes of memory available (MemoryPressure).
    MemoryAvailable,
    /// `nodefs.available`: bytes free on the node's root filesystem (DiskPressure).
    NodeFsAvailable,
    /// `nodefs.inodesFree`: inodes free on it (DiskPressure).
    NodeFsInodesFree,
    /// `imagefs.available`: bytes free on the image filesystem, when separate (DiskPressure).
    ImageFsAvailable,
    /// `imagefs.inodesFree`: inodes free on it (DiskPressure).
    ImageFsInodesFree,
    /// `pid.available`: process IDs left below `pid_max` (PIDPressure).
    PidAvailable,
}

impl EvictionSignal {
    /// Every signal, in kubelet's order.
    pub const ALL: [Self; 6] = [
        Self::MemoryAvailable,
        Self::NodeFsAvailable,
        Self::NodeFsInodesFree,
        Self::ImageFsAvailable,
        Self::ImageFsInodesFree,
        Self::PidAvailable,
    ];

    /// kubelet's name, the `evictionHard` key: `memory.available`, `nodefs.available`…
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }
}

/// A name that is not one of kubelet's eviction signals ([`EvictionSignal::ALL`]); its
/// `Display` lists them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown signal; use one of {}",
    EvictionSignal::ALL.map(EvictionSignal::as_str).join(", ")
)]
pub struct UnknownSignal {
    /// The name given.
    pub name: String,
}

impl std::str::FromStr for EvictionSignal {
    type Err = UnknownSignal;

    /// Parses kubelet's name of a signal.
    ///
    /// Errors: [`UnknownSignal`], listing the signals kubelet knows.
    fn from_str(name: &str) -> Result<Self, UnknownSignal> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or_else(|| UnknownSignal {
                name: name.to_owned(),
            })
    }
}

impl std::fmt::Display for EvictionSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
