//! Allocation names: the `NetworkAddress` object name that makes an address unique.

use std::collections::HashSet;

use super::*;

#[test]
fn ipam_allocation_names() {
    let cases = [
        ("blue", "192.0.2.10", "blue-192-0-2-10"),
        ("blue", "0.0.0.0", "blue-0-0-0-0"),
        (
            "blue",
            "2001:db8::10",
            "blue-2001-0db8-0000-0000-0000-0000-0000-0010",
        ),
        (
            "blue",
            "2001:db8::",
            "blue-2001-0db8-0000-0000-0000-0000-0000-0000",
        ),
        ("blue", "::", "blue-0000-0000-0000-0000-0000-0000-0000-0000"),
        (
            "b-1",
            "::ffff:192.0.2.1",
            "b-1-0000-0000-0000-0000-0000-ffff-c000-0201",
        ),
    ];
    for (network, addr, name) in cases {
        assert_eq!(allocation_name(network, ip(addr)), name);
        assert_eq!(parse_allocation_name(name), Some((network, ip(addr))));
    }
    // Network names contain '-' and digits, yet IPv4 and IPv6 names never collide.
    let a = allocation_name("a-1-2-3-4", ip("5.6.7.8"));
    let b = allocation_name("a", ip("1:2:3:4:5:6:7:8"));
    assert_eq!(a, "a-1-2-3-4-5-6-7-8");
    assert_eq!(b, "a-0001-0002-0003-0004-0005-0006-0007-0008");
    assert_eq!(
        parse_allocation_name(&a),
        Some(("a-1-2-3-4", ip("5.6.7.8")))
    );
    for junk in [
        "",
        "blue",
        "192-0-2-10",
        "blue-192-0-2-256",
        "blue-192-0-2-010",
        "blue-2001-0db8-0000-0000-0000-0000-0010",
        "blue-2001-0DB8-0000-0000-0000-0000-0000-0010",
        "-1-2-3-4",
        "Blue-1-2-3-4",
    ] {
        assert_eq!(parse_allocation_name(junk), None, "{junk:?}");
    }
}

/// Every name is a valid DNS subdomain and one-to-one with (network, address), on random
/// samples of both families and network names at the length limit.
#[test]
fn ipam_allocation_names_random_are_valid_and_unique() {
    let mut rng = Rng(99);
    let long = "n".repeat(63);
    let networks = ["a", "blue", "a-1", "a-1-2-3-4", "x9", long.as_str()];
    let mut seen = HashSet::new();
    for _ in 0..20_000 {
        let network = networks[rng.below(networks.len() as u128) as usize];
        let addr = if rng.below(2) == 0 {
            IpAddr::from(std::net::Ipv4Addr::from(rng.next() as u32))
        } else {
            // Mostly-zero addresses stress the all-zero groups.
            IpAddr::from(std::net::Ipv6Addr::from(rng.next_u128() & rng.next_u128()))
        };
        let name = allocation_name(network, addr);
        assert!(name.len() <= 253 && name.len() <= 63 + 40, "{name}");
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
            "{name}"
        );
        assert!(name.as_bytes()[0].is_ascii_alphanumeric(), "{name}");
        assert!(
            name.as_bytes()[name.len() - 1].is_ascii_alphanumeric(),
            "{name}"
        );
        // The name determines (network, address), so distinct pairs never share a name.
        assert_eq!(parse_allocation_name(&name), Some((network, addr)));
        seen.insert((network, addr));
    }
    assert!(
        seen.len() > 19_000,
        "the sample should be mostly distinct pairs"
    );
}

/// The `NetworkAddress` object's name is the contract that makes an address unique; an object
/// built the documented way must name exactly its network and address.
#[test]
fn network_address_object_is_named_by_allocation_name() {
    use crate::network::{ClaimRef, NetworkAddress, NetworkAddressSpec};
    for (network, address) in [("blue", "192.0.2.10/24"), ("blue-v6", "2001:db8::a/64")] {
        let ip = ip(address.split('/').next().expect("interface form"));
        let object = NetworkAddress::new(
            &allocation_name(network, ip),
            NetworkAddressSpec {
                network: network.to_owned(),
                address: address.to_owned(),
                claim: ClaimRef {
                    namespace: "team-a".to_owned(),
                    name: "db-0-net".to_owned(),
                    uid: "uid-1".to_owned(),
                },
                identity: None,
                node: None,
                overlay: None,
            },
        );
        let name = object.metadata.name.as_deref().expect("named");
        assert_eq!(parse_allocation_name(name), Some((network, ip)));
    }
}
