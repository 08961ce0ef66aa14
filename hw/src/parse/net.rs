//! Local addresses and the default route: `/proc/net/route`, `/proc/net/fib_trie`,
//! `/proc/net/if_inet6`.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::ParseError;

/// One IPv4 route from `/proc/net/route`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Output interface, e.g. `eth0`.
    pub iface: String,
    /// Destination network (`0.0.0.0` for the default route).
    pub destination: Ipv4Addr,
    /// Next hop (`0.0.0.0` for a directly connected network).
    pub gateway: Ipv4Addr,
    /// `RTF_*` flags (`0x1` up, `0x2` gateway).
    pub flags: u16,
    /// Route priority; lower is preferred.
    pub metric: u32,
    /// Destination netmask.
    pub mask: Ipv4Addr,
}

/// Parses `/proc/net/route` (kernel `net/ipv4/fib_trie.c: fib_route_seq_show`).
///
/// Addresses are printed with `%08X` from a network-order `__be32`, i.e. in the host's byte
/// order: `"0101A8C0"` is 192.168.1.1 on a little-endian host. They are decoded in this
/// binary's native order, which is right for the host it runs on (all fixture trees come from
/// little-endian machines). The header line is skipped.
pub fn parse_route(text: &str) -> Result<Vec<Route>, ParseError> {
    let mut routes = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [] | ["Iface", ..] => {}
            [
                iface,
                destination,
                gateway,
                flags,
                _refcnt,
                _use,
                metric,
                mask,
                ..,
            ] => {
                let bad = || ParseError::invalid("route line", line);
                routes.push(Route {
                    iface: (*iface).to_owned(),
                    destination: route_addr(destination).ok_or_else(bad)?,
                    gateway: route_addr(gateway).ok_or_else(bad)?,
                    flags: u16::from_str_radix(flags, 16).map_err(|_| bad())?,
                    metric: metric.parse().map_err(|_| bad())?,
                    mask: route_addr(mask).ok_or_else(bad)?,
                });
            }
            _ => return Err(ParseError::invalid("route line", line)),
        }
    }
    Ok(routes)
}

fn route_addr(hex: &str) -> Option<Ipv4Addr> {
    if hex.len() != 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let raw = u32::from_str_radix(hex, 16).ok()?;
    Some(Ipv4Addr::from(raw.to_ne_bytes()))
}

/// The IPv4 addresses assigned to local interfaces: every `/32 host LOCAL` entry of the
/// `Local:` table in `/proc/net/fib_trie` (kernel `fib_trie_seq_show`), in trie (numeric)
/// order, without duplicates. Loopback addresses are included; callers filter them. Other
/// tables (`Main:`, `Id 100:`…) are ignored.
pub fn parse_fib_trie_local(text: &str) -> Result<Vec<Ipv4Addr>, ParseError> {
    let mut in_local = false;
    let mut leaf: Option<Ipv4Addr> = None;
    let mut local = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(char::is_whitespace) {
            // A table header such as "Main:" or "Local:".
            in_local = line.trim_end() == "Local:";
            leaf = None;
            continue;
        }
        if !in_local {
            continue;
        }
        let entry = line.trim_start();
        if let Some(addr) = entry.strip_prefix("|-- ") {
            let addr = addr.trim();
            leaf = Some(
                addr.parse()
                    .map_err(|_| ParseError::invalid("fib_trie leaf address", addr))?,
            );
        } else if entry.starts_with("+-- ") {
            leaf = None;
        } else if let Some(alias) = entry.strip_prefix('/') {
            let mut fields = alias.split_whitespace();
            if (fields.next(), fields.next(), fields.next())
                == (Some("32"), Some("host"), Some("LOCAL"))
            {
                let addr =
                    leaf.ok_or_else(|| ParseError::invalid("fib_trie entry without a leaf", line))?;
                if !local.contains(&addr) {
                    local.push(addr);
                }
            }
        }
    }
    Ok(local)
}

/// One line of `/proc/net/if_inet6` (kernel `net/ipv6/addrconf.c: if6_seq_show`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inet6Addr {
    /// The address.
    pub addr: Ipv6Addr,
    /// Interface index.
    pub ifindex: u32,
    /// Prefix length in bits.
    pub prefix_len: u8,
    /// Address scope: `0x00` global, `0x10` host, `0x20` link, `0x40` site (`IPV6_ADDR_*`
    /// scope bits).
    pub scope: u8,
    /// `IFA_F_*` flags (`0x80` permanent, `0x40` tentative…).
    pub flags: u32,
    /// Interface name.
    pub ifname: String,
}

impl Inet6Addr {
    /// A global address a node could be reached at: scope global, not `::1`, not in
    /// `fe80::/10`.
    pub fn is_global(&self) -> bool {
        self.scope == 0 && !self.addr.is_loopback() && (self.addr.segments()[0] & 0xffc0) != 0xfe80
    }
}

/// Parses `/proc/net/if_inet6`: `addr(32 hex) ifindex prefixlen scope flags ifname`, all hex.
pub fn parse_if_inet6(text: &str) -> Result<Vec<Inet6Addr>, ParseError> {
    let mut addrs = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [] => {}
            [addr, ifindex, prefix_len, scope, flags, ifname] => {
                let bad = || ParseError::invalid("if_inet6 line", line);
                if addr.len() != 32 || !addr.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad());
                }
                addrs.push(Inet6Addr {
                    addr: Ipv6Addr::from(u128::from_str_radix(addr, 16).map_err(|_| bad())?),
                    ifindex: u32::from_str_radix(ifindex, 16).map_err(|_| bad())?,
                    prefix_len: u8::from_str_radix(prefix_len, 16).map_err(|_| bad())?,
                    scope: u8::from_str_radix(scope, 16).map_err(|_| bad())?,
                    flags: u32::from_str_radix(flags, 16).map_err(|_| bad())?,
                    ifname: (*ifname).to_owned(),
                });
            }
            _ => return Err(ParseError::invalid("if_inet6 line", line)),
        }
    }
    Ok(addrs)
}

/// The IPv4 address of the default-route interface, the last step of kubelet's address
/// choice without a cloud provider (k8s.io/apimachinery `pkg/util/net/interface.go:
/// ChooseHostInterface`).
///
/// For each default route (destination and mask `0.0.0.0`) in file order, which the kernel
/// sorts by metric: take the connected subnets of its interface (routes on that interface with
/// gateway `0.0.0.0` and a non-default destination) and return the first of `local` (the
/// non-loopback local IPv4 addresses) that lies in one of them. `None` if no default route
/// leads to a local address, e.g. a point-to-point uplink with no connected subnet.
pub fn default_route_ipv4(routes: &[Route], local: &[Ipv4Addr]) -> Option<Ipv4Addr> {
    routes
        .iter()
        .filter(|r| r.destination.is_unspecified() && r.mask.is_unspecified())
        .find_map(|default| {
            routes
                .iter()
                .filter(|r| {
                    r.iface == default.iface
                        && r.gateway.is_unspecified()
                        && !r.destination.is_unspecified()
                })
                .find_map(|subnet| {
                    let mask = u32::from(subnet.mask);
                    let net = u32::from(subnet.destination) & mask;
                    local
                        .iter()
                        .copied()
                        .find(|ip| u32::from(*ip) & mask == net)
                })
        })
}

#[cfg(test)]
mod tests;
