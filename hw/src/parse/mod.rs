//! Pure parsers for the kernel and distribution text formats hw reads.
//!
//! No I/O here: each function takes a file's contents, so every format is table-tested
//! without a host. Malformed input gives a [`ParseError`](crate::ParseError) (or `None` where
//! the value is optional by nature); nothing panics.

mod cgroup;
mod cpu;
mod meminfo;
mod mountinfo;
mod net;
mod os_release;
mod proc;
mod psi;
mod thermal;

pub use cgroup::{parse_cpu_stat_usage_usec, parse_memory_stat, working_set_bytes};
pub use cpu::{parse_cpu_list, parse_cpuinfo_processors};
pub use meminfo::{Meminfo, parse_meminfo};
pub use mountinfo::{mount_of, parse_mountinfo};
pub use net::{
    Inet6Addr, Route, default_route_ipv4, parse_fib_trie_local, parse_if_inet6, parse_route,
};
pub use os_release::{os_image, parse_os_release};
pub use proc::{parse_hugepages_dir, parse_id, parse_loadavg, parse_proc_stat_busy_ms, parse_u64};
pub use psi::parse_psi;
pub use thermal::{parse_millicelsius, parse_throttled, parse_trip_kind};
