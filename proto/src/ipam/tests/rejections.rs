//! What a pool refuses (subnets, gateways, exclusions), with the words Network validation uses.

use super::*;

#[test]
fn ipam_pool_rejections() {
    let cases: &[(&str, Option<&str>, &[&str], &str)] = &[
        (
            "192.0.2.10/24",
            None,
            &[],
            "192.0.2.10/24 has host bits set; did you mean 192.0.2.0/24?",
        ),
        (
            "224.0.0.0/24",
            None,
            &[],
            "224.0.0.0/24 is a multicast range; pods need unicast addresses",
        ),
        (
            "127.0.0.0/8",
            None,
            &[],
            "127.0.0.0/8 is a loopback range, which never leaves a host",
        ),
        (
            "192.0.2.0/24",
            Some("192.0.3.1"),
            &[],
            "192.0.3.1 is not inside subnet 192.0.2.0/24",
        ),
        (
            "192.0.2.0/24",
            Some("192.0.2.0"),
            &[],
            "192.0.2.0 is the network address of 192.0.2.0/24",
        ),
        (
            "192.0.2.0/24",
            Some("192.0.2.255"),
            &[],
            "192.0.2.255 is the broadcast address of 192.0.2.0/24",
        ),
        (
            "2001:db8::/64",
            Some("2001:db8::"),
            &[],
            "2001:db8:: is the subnet-router anycast address of 2001:db8::/64",
        ),
        (
            "2001:db8::/64",
            Some("192.0.2.1"),
            &[],
            "192.0.2.1 is IPv4 but subnet 2001:db8::/64 is IPv6",
        ),
        (
            "192.0.2.0/24",
            None,
            &["192.0.3.0/24"],
            "192.0.3.0/24 is not inside subnet 192.0.2.0/24",
        ),
        (
            "192.0.2.0/24",
            None,
            &["192.0.2.200-192.0.3.5"],
            "192.0.2.200-192.0.3.5 is not inside subnet 192.0.2.0/24",
        ),
        (
            "192.0.2.0/24",
            None,
            &["2001:db8::1"],
            "2001:db8::1 is IPv6 but subnet 192.0.2.0/24 is IPv4",
        ),
        (
            "192.0.2.0/24",
            Some("192.0.2.1"),
            &["192.0.2.2-192.0.2.254"],
            "192.0.2.0/24 has no address left to allocate after removing the gateway and exclusions",
        ),
        (
            "192.0.2.7/32",
            Some("192.0.2.7"),
            &[],
            "192.0.2.7/32 has no address left to allocate after removing the gateway and exclusions",
        ),
        (
            "2001:db8::/127",
            None,
            &["2001:db8::/127"],
            "2001:db8::/127 has no address left to allocate after removing the gateway and exclusions",
        ),
    ];
    for &(subnet, gateway, exclude, message) in cases {
        assert_eq!(pool_error(subnet, gateway, exclude), message);
    }
}

#[test]
fn ipam_exclusion_parsing() {
    for text in [
        "192.0.2.1",
        "192.0.2.10-192.0.2.19",
        "192.0.2.64/26",
        "2001:db8::1-2001:db8::ff",
    ] {
        let e: Exclusion = text.parse().expect(text);
        assert_eq!(e.to_string(), text);
    }
    assert_eq!(
        "192.0.2.10 - 192.0.2.19".parse::<Exclusion>(),
        Ok(Exclusion::Range {
            start: ip("192.0.2.10"),
            end: ip("192.0.2.19")
        })
    );
    let rejects: &[(&str, &str)] = &[
        (
            "192.0.2.9-192.0.2.5",
            "range start 192.0.2.9 is after its end 192.0.2.5",
        ),
        (
            "192.0.2.1-2001:db8::1",
            "range \"192.0.2.1-2001:db8::1\" mixes IPv4 and IPv6",
        ),
        (
            "192.0.2.10/30",
            "192.0.2.10/30 has host bits set; did you mean 192.0.2.8/30?",
        ),
        (
            "192.0.2.0/33",
            "prefix length 33 is out of range for IPv4 (0-32)",
        ),
        (
            "gateway",
            "\"gateway\" is not an IP address, a range (FIRST-LAST) or a CIDR (ADDRESS/PREFIX-LENGTH)",
        ),
        (
            "fe80::1%eth0",
            "\"fe80::1%eth0\" has a zone id (%...); zone ids are not allowed",
        ),
        (
            "192.0.2.1-",
            "\"\" is not an IP address, a range (FIRST-LAST) or a CIDR (ADDRESS/PREFIX-LENGTH)",
        ),
    ];
    for &(text, message) in rejects {
        assert_eq!(
            text.parse::<Exclusion>().map_err(|e| e.to_string()),
            Err(message.to_owned()),
            "{text}"
        );
    }
}

/// Issue 11: a pool refuses what Network validation refuses, with the same words, so the
/// driver (which builds pools straight from the spec) never allocates from a subnet the
/// controller would have called invalid.
#[test]
fn ipam_pool_refuses_default_and_special_subnets() {
    let cases: &[(&str, Option<&str>, &str)] = &[
        (
            "0.0.0.0/0",
            None,
            "0.0.0.0/0 is every IPv4 address, not a subnet (0.0.0.0/0 and ::/0 are how a default route is written); write the link's own subnet",
        ),
        (
            "::/0",
            None,
            "::/0 is every IPv6 address, not a subnet (0.0.0.0/0 and ::/0 are how a default route is written); write the link's own subnet",
        ),
        (
            "240.0.0.0/4",
            None,
            "240.0.0.0/4 is in the reserved class E range 240.0.0.0/4, which hosts and routers drop",
        ),
        (
            "::ffff:0:0/96",
            None,
            "::ffff:0.0.0.0/96 is an IPv4-mapped IPv6 range; write the IPv4 subnet instead",
        ),
        (
            "0.0.0.0/24",
            None,
            "0.0.0.0/24 contains the unspecified address 0.0.0.0",
        ),
        ("::/127", None, "::/127 contains the unspecified address ::"),
        (
            "192.0.2.0/24",
            Some("127.0.0.1"),
            "127.0.0.1 is a loopback address, which never leaves a host",
        ),
        (
            "192.0.2.0/24",
            Some("224.0.0.1"),
            "224.0.0.1 is not a unicast address",
        ),
    ];
    for &(subnet, gateway, message) in cases {
        assert_eq!(
            pool_error(subnet, gateway, &[]),
            message,
            "{subnet} {gateway:?}"
        );
        // The same rule, unwrapped, is what validation reports with a path.
        let rule = match gateway {
            None => check_subnet(cidr(subnet)),
            Some(g) => check_gateway(cidr(subnet), ip(g)),
        };
        assert_eq!(rule.map_err(|e| e.to_string()), Err(message.to_owned()));
    }
}

/// The reserved ends a pool skips are exactly the ones the interface-address and gateway
/// checks refuse.
#[test]
fn ipam_reserved_ends_match_the_pool() {
    for subnet in [
        "192.0.2.0/24",
        "192.0.2.4/30",
        "192.0.2.4/31",
        "192.0.2.7/32",
        "2001:db8::/64",
        "2001:db8::/126",
        "2001:db8::/127",
        "2001:db8::5/128",
    ] {
        let p = pool(subnet, None, &[]);
        let c = cidr(subnet);
        let first = c.network().addr;
        let last = p.nth(p.size() - 1).expect("non-empty");
        let (first_reserved, _) = crate::netconfig::reserved_ends(c);
        assert_eq!(!p.contains_usable(first), first_reserved, "{subnet}");
        assert_eq!(
            crate::netconfig::reserved_role(c, first).is_some(),
            first_reserved,
            "{subnet}"
        );
        assert_eq!(crate::netconfig::reserved_role(c, last), None, "{subnet}");
        // The address after the last usable one, where the subnet has it, is the broadcast.
        let after = match last {
            IpAddr::V4(v4) => u32::from(v4).checked_add(1).map(|n| IpAddr::V4(n.into())),
            IpAddr::V6(v6) => u128::from(v6).checked_add(1).map(|n| IpAddr::V6(n.into())),
        }
        .filter(|a| c.contains(*a));
        assert_eq!(
            after.and_then(|a| crate::netconfig::reserved_role(c, a)),
            after.map(|_| "broadcast address"),
            "{subnet}"
        );
        assert_eq!(
            crate::netconfig::check_interface_address(Cidr {
                addr: first,
                prefix_len: c.prefix_len
            })
            .is_err(),
            first_reserved,
            "{subnet}"
        );
    }
}
