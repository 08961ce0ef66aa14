//! Errors: [`HwError`] for reading the host, [`ParseError`] for the pure parsers.

use std::path::PathBuf;

/// Why a required host fact could not be read. Optional facts never produce an error; they
/// come back as `None` or empty.
///
/// Every message names the host path and the root it was read under, e.g.
/// `reading /proc/meminfo under /x: No such file or directory (os error 2)`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HwError {
    /// A required file could not be read (missing, permission denied, not UTF-8…).
    #[error("reading {} under {}: {source}", path.display(), root.display())]
    Read {
        /// Host path, e.g. `/proc/meminfo`.
        path: PathBuf,
        /// The [`HostRoot`](crate::HostRoot) it was read under.
        root: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A required file was read but its contents were not understood.
    #[error("parsing {} under {}: {source}", path.display(), root.display())]
    Parse {
        /// Host path, e.g. `/proc/meminfo`.
        path: PathBuf,
        /// The [`HostRoot`](crate::HostRoot) it was read under.
        root: PathBuf,
        /// What was wrong with the text.
        #[source]
        source: ParseError,
    },
    /// Neither `/sys/devices/system/cpu/online` nor `/proc/cpuinfo` gave a CPU count.
    #[error("counting logical CPUs under {}: {online}; {cpuinfo}", root.display())]
    CpuCount {
        /// The [`HostRoot`](crate::HostRoot).
        root: PathBuf,
        /// Why `/sys/devices/system/cpu/online` failed.
        online: Box<HwError>,
        /// Why the `/proc/cpuinfo` fallback failed.
        cpuinfo: Box<HwError>,
    },
    /// `statvfs(3)` failed on the filesystem holding a host path.
    #[error("statvfs of {} under {}: {source}", path.display(), root.display())]
    Statvfs {
        /// Host path actually passed to statvfs (the nearest existing ancestor of the one
        /// asked for).
        path: PathBuf,
        /// The [`HostRoot`](crate::HostRoot).
        root: PathBuf,
        /// The errno.
        #[source]
        source: nix::errno::Errno,
    },
}

/// Why a parser rejected its input. Parsers never panic on malformed text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// The text was empty (or only whitespace and NULs).
    #[error("empty")]
    Empty,
    /// Something the format requires was absent, e.g. `MemTotal` in `/proc/meminfo`.
    #[error("missing {0}")]
    Missing(&'static str),
    /// A value did not have the expected form; `text` is the offending piece (shortened).
    #[error("invalid {what} {text:?}")]
    Invalid {
        /// What was expected, e.g. `MemTotal value`.
        what: &'static str,
        /// The offending text, at most 80 characters.
        text: String,
    },
}

impl ParseError {
    /// An [`ParseError::Invalid`] quoting at most 80 characters of `text`.
    pub(crate) fn invalid(what: &'static str, text: &str) -> Self {
        Self::Invalid {
            what,
            text: text.chars().take(80).collect(),
        }
    }
}
