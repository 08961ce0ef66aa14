use std::net::Ipv6Addr;

use super::*;

const ROUTE_HEADER: &str = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT                                                       \n";

fn v4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn route(iface: &str, dest: &str, gw: &str, flags: u16, metric: u32, mask: &str) -> Route {
    Route {
        iface: iface.to_owned(),
        destination: v4(dest),
        gateway: v4(gw),
        flags,
        metric,
        mask: v4(mask),
    }
}

#[cfg(target_endian = "little")]
#[test]
fn route_parses_little_endian_rows() {
    let text = format!(
        "{ROUTE_HEADER}eth0\t00000000\t0101A8C0\t0003\t0\t0\t202\t00000000\t0\t0\t0      \n\
         docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
    );
    assert_eq!(
        parse_route(&text),
        Ok(vec![
            route("eth0", "0.0.0.0", "192.168.1.1", 3, 202, "0.0.0.0"),
            route("docker0", "172.17.0.0", "0.0.0.0", 1, 0, "255.255.0.0"),
        ])
    );
    assert_eq!(parse_route(ROUTE_HEADER), Ok(vec![]));
    assert_eq!(parse_route(""), Ok(vec![]));
}

#[test]
fn route_rejects_malformed_rows() {
    let bad = [
        "eth0\t00000000\t0101A8C0\n",
        "eth0\t0000000G\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0",
        "eth0\t000000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0",
        "eth0\t00000000\t0101A8C0\t0003\t0\t0\t-1\t00000000\t0\t0\t0",
        "eth0\t00000000\t0101A8C0\tFFFFF\t0\t0\t0\t00000000\t0\t0\t0",
    ];
    for line in bad {
        assert_eq!(
            parse_route(line),
            Err(ParseError::invalid("route line", line.trim_end())),
            "{line:?}"
        );
    }
}

const FIB_TRIE: &str = "Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     |-- 10.9.9.9
        /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 192.0.2.0/24 2 0 2
        +-- 192.0.2.0/30 2 0 2
           |-- 192.0.2.0
              /24 link UNICAST
           |-- 192.0.2.2
              /32 host LOCAL
              /32 host LOCAL tos=16
        |-- 192.0.2.255
           /32 link BROADCAST
Id 100:
  +-- 0.0.0.0/0 3 0 5
     |-- 198.51.100.7
        /32 host LOCAL
";

#[test]
fn fib_trie_local_table() {
    let cases: &[(&str, Result<Vec<Ipv4Addr>, ParseError>)] = &[
        (FIB_TRIE, Ok(vec![v4("127.0.0.1"), v4("192.0.2.2")])),
        ("", Ok(vec![])),
        ("Main:\n  |-- 10.0.0.1\n     /32 host LOCAL\n", Ok(vec![])),
        (
            "Local:\n  |-- 10.0.0.300\n     /32 host LOCAL\n",
            Err(ParseError::invalid("fib_trie leaf address", "10.0.0.300")),
        ),
        (
            "Local:\n  +-- 10.0.0.0/8 2 0 2\n     /32 host LOCAL\n",
            Err(ParseError::invalid(
                "fib_trie entry without a leaf",
                "     /32 host LOCAL",
            )),
        ),
        ("Local:\n  garbage\n", Ok(vec![])),
    ];
    for (input, want) in cases {
        assert_eq!(&parse_fib_trie_local(input), want, "{input:?}");
    }
}

#[test]
fn if_inet6_table() {
    let text = "00000000000000000000000000000001 01 80 10 80       lo\n\
                fe80000000000000dea632fffe8b4e17 02 40 20 80     eth0\n\
                20010db8001000008aaeddfffe0a6c3e 02 40 00 00     eno1\n\
                fd000000000000000000000000000002 04 40 00 82     eth0\n";
    let got = parse_if_inet6(text).unwrap();
    let addrs: Vec<Ipv6Addr> = got.iter().map(|a| a.addr).collect();
    assert_eq!(
        addrs,
        vec![
            Ipv6Addr::LOCALHOST,
            "fe80::dea6:32ff:fe8b:4e17".parse::<Ipv6Addr>().unwrap(),
            "2001:db8:10:0:8aae:ddff:fe0a:6c3e"
                .parse::<Ipv6Addr>()
                .unwrap(),
            "fd00::2".parse::<Ipv6Addr>().unwrap(),
        ]
    );
    assert_eq!(
        got[3],
        Inet6Addr {
            addr: "fd00::2".parse().unwrap(),
            ifindex: 4,
            prefix_len: 64,
            scope: 0,
            flags: 0x82,
            ifname: "eth0".to_owned(),
        }
    );
    let global: Vec<bool> = got.iter().map(Inet6Addr::is_global).collect();
    assert_eq!(global, vec![false, false, true, true]);
    // A link-local address whose scope field claims global is still excluded.
    let odd = parse_if_inet6("fe800000000000000000000000000001 02 40 00 80 eth0\n").unwrap();
    assert!(!odd[0].is_global());
    assert_eq!(parse_if_inet6(""), Ok(vec![]));

    let bad = [
        "0000000000000000000000000000001 01 80 10 80 lo",
        "0000000000000000000000000000000g 01 80 10 80 lo",
        "00000000000000000000000000000001 01 80 10 80",
        "00000000000000000000000000000001 01 800 10 80 lo",
        "00000000000000000000000000000001 zz 80 10 80 lo",
    ];
    for line in bad {
        assert_eq!(
            parse_if_inet6(line),
            Err(ParseError::invalid("if_inet6 line", line)),
            "{line:?}"
        );
    }
}

#[test]
fn default_route_table() {
    let routes = vec![
        route("eth0", "0.0.0.0", "192.168.1.1", 3, 202, "0.0.0.0"),
        route("wlan0", "0.0.0.0", "192.168.4.1", 3, 303, "0.0.0.0"),
        route("docker0", "172.17.0.0", "0.0.0.0", 1, 0, "255.255.0.0"),
        route("eth0", "10.0.0.0", "192.168.1.254", 3, 0, "255.0.0.0"),
        route("eth0", "192.168.1.0", "0.0.0.0", 1, 202, "255.255.255.0"),
        route("wlan0", "192.168.4.0", "0.0.0.0", 1, 303, "255.255.255.0"),
    ];
    let local = [v4("172.17.0.1"), v4("192.168.1.42"), v4("192.168.4.61")];
    let cases: &[(&[Route], &[Ipv4Addr], Option<Ipv4Addr>)] = &[
        (&routes, &local, Some(v4("192.168.1.42"))),
        // eth0 has no address: the next default route (wlan0) wins.
        (
            &routes,
            &[v4("172.17.0.1"), v4("192.168.4.61")],
            Some(v4("192.168.4.61")),
        ),
        (&routes, &[v4("172.17.0.1")], None),
        (&routes[2..], &local, None),
        (&[], &local, None),
        (&routes, &[], None),
        // Point-to-point default route with no connected subnet.
        (
            &[route("ppp0", "0.0.0.0", "0.0.0.0", 1, 0, "0.0.0.0")],
            &[v4("100.64.1.2")],
            None,
        ),
    ];
    for (routes, local, want) in cases {
        assert_eq!(default_route_ipv4(routes, local), *want, "{local:?}");
    }
}
