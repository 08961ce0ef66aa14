//! Host facts for edgebeat: what kubelet would report about this node.
//!
//! [`read_host_facts`] reads `/proc`, `/sys` and `/etc` under a [`HostRoot`] (so a container
//! can read the host through a bind mount and tests can read fixture trees) and returns raw
//! [`HostFacts`]: identity, capacity, the eviction signals' inputs, and the health signals of
//! small boards (PSI, read-only filesystems, thermal zones, power supply, clock sync). Turning them into a
//! NodeStatus is the agent's job. The text formats are parsed by pure functions in
//! [`parse`], table-tested without a host. [`Clock`] puts wall time and boot time behind a
//! trait tests replace. [`read_bounded`] reads operator-named files (configuration, secrets,
//! PEM) with a size limit, so a wrong path cannot hang or exhaust memory; [`parse_duration`]
//! reads durations in Go's grammar, the one both binaries take.
//!
//! The rules follow kubelet's status setters and eviction signals
//! (`pkg/kubelet/nodestatus/setters.go`, `pkg/kubelet/eviction/helpers.go`) and cadvisor;
//! each item's docs name its upstream source.
//!
//! Modules, one a line (private; their items are re-exported at the crate root, `parse` aside):
//! - `arch`: Go architecture names, as kubelet reports them ([`go_arch`]).
//! - `bounded`: bounded reads of operator-named files ([`read_bounded`]).
//! - `clock`: wall clock and boot-time clock behind one trait ([`Clock`]).
//! - `duration`: Go's duration grammar ([`parse_duration`]).
//! - `error`: [`HwError`] for reading the host, [`ParseError`] for the parsers.
//! - `facts`: the host facts hw reports, raw ([`HostFacts`]).
//! - `ntp`: the kernel clock's NTP state through `adjtimex(2)`.
//! - [`parse`]: pure parsers of the kernel's and distributions' text formats.
//! - `read`: reading the host, one function per fact ([`read_host_facts`]).
//! - `root`: the directory every host path is read under ([`HostRoot`]).

// Production functions of at most 100 lines (clippy.toml's too-many-lines-threshold,
// issue 51): a longer one is split into named steps. Tests are exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod arch;
mod bounded;
mod clock;
mod duration;
mod error;
mod facts;
mod ntp;
pub mod parse;
mod read;
mod root;

pub use arch::{go_arch, host_go_arch};
pub use bounded::{
    BoundedReadError, MAX_PASSWORD_FILE_BYTES, MAX_PEM_FILE_BYTES, read_bounded, read_password_file,
};
pub use clock::{Clock, ManualClock, SystemClock, UnixTime};
pub use duration::{DurationError, parse_duration};
pub use error::{HwError, ParseError};
pub use facts::{
    CgroupMode, ClockSync, CoolingDevice, FsStats, HostFacts, HugePages, MemoryFacts, Mount,
    PidStats, PowerFacts, Psi, PsiLine, PsiResource, ResourceUsage, ThermalZone, Throttled,
    TripKind, TripPoint,
};
pub use read::{ReadOptions, fs_stats, read_host_facts, read_resource_usage};
pub use root::HostRoot;
