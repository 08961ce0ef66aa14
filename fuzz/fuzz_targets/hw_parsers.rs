//! The pure `/proc`, `/sys` and `/etc` text parsers of `edgebeat_hw::parse`, each fed the
//! same input (bytes read as lossy UTF-8): meminfo, CPU lists, cpuinfo, loadavg,
//! os-release, the IPv4 route table, fib_trie, if_inet6, PSI, cgroup memory.stat, and the
//! small helpers (numbers, IDs, hugepage directory names).
//!
//! Checks: no parser panics (the module's own contract: "Malformed input gives a
//! ParseError ... nothing panics"); the default-route pick works on whatever parsed.
#![no_main]

use edgebeat_hw::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();

    let _ = parse::parse_meminfo(text);
    let _ = parse::parse_cpu_list(text);
    let _ = parse::parse_cpuinfo_processors(text);
    let _ = parse::parse_loadavg(text);
    let _ = parse::parse_os_release(text);
    let _ = parse::os_image(Some(text));
    let _ = parse::parse_psi(text);
    let _ = parse::parse_memory_stat(text);
    let _ = parse::parse_u64(text, "fuzz");
    let _ = parse::parse_id(text);
    let _ = parse::parse_hugepages_dir(text);
    let _ = parse::parse_if_inet6(text).map(|addrs| addrs.iter().filter(|a| a.is_global()).count());

    // The default-route pick needs a route table and a fib_trie at once: an input with a NUL
    // is read as `route NUL fib_trie` for it.
    let (route_text, fib_text) = text.split_once('\0').unwrap_or((text, text));
    let routes = parse::parse_route(route_text).unwrap_or_default();
    let local = parse::parse_fib_trie_local(fib_text).unwrap_or_default();
    let _ = parse::default_route_ipv4(&routes, &local);
});
