//! Pool arithmetic: sizes and bounds for every prefix class, reserved addresses, the gateway,
//! exclusions, and `nth`/`index_of` against random samples and a brute-force model.

use super::*;

/// (subnet, gateway, size, first usable, last usable) for every prefix class the issue names
/// and the point-to-point edge cases.
#[test]
fn ipam_sizes_and_bounds_per_prefix() {
    let cases: &[(&str, Option<&str>, u128, &str, &str)] = &[
        ("10.1.0.0/16", None, 65534, "10.1.0.1", "10.1.255.254"),
        (
            "10.1.0.0/16",
            Some("10.1.0.1"),
            65533,
            "10.1.0.2",
            "10.1.255.254",
        ),
        ("192.0.2.0/24", None, 254, "192.0.2.1", "192.0.2.254"),
        (
            "192.0.2.0/24",
            Some("192.0.2.1"),
            253,
            "192.0.2.2",
            "192.0.2.254",
        ),
        (
            "192.0.2.0/24",
            Some("192.0.2.254"),
            253,
            "192.0.2.1",
            "192.0.2.253",
        ),
        ("192.0.2.4/30", None, 2, "192.0.2.5", "192.0.2.6"),
        (
            "192.0.2.4/30",
            Some("192.0.2.5"),
            1,
            "192.0.2.6",
            "192.0.2.6",
        ),
        ("192.0.2.4/31", None, 2, "192.0.2.4", "192.0.2.5"),
        (
            "192.0.2.4/31",
            Some("192.0.2.4"),
            1,
            "192.0.2.5",
            "192.0.2.5",
        ),
        ("192.0.2.7/32", None, 1, "192.0.2.7", "192.0.2.7"),
        (
            "2001:db8::/64",
            None,
            (1u128 << 64) - 1,
            "2001:db8::1",
            "2001:db8::ffff:ffff:ffff:ffff",
        ),
        (
            "2001:db8::/64",
            Some("2001:db8::1"),
            (1u128 << 64) - 2,
            "2001:db8::2",
            "2001:db8::ffff:ffff:ffff:ffff",
        ),
        ("2001:db8::/120", None, 255, "2001:db8::1", "2001:db8::ff"),
        (
            "2001:db8::/120",
            Some("2001:db8::ff"),
            254,
            "2001:db8::1",
            "2001:db8::fe",
        ),
        ("2001:db8::/126", None, 3, "2001:db8::1", "2001:db8::3"),
        ("2001:db8::/127", None, 2, "2001:db8::", "2001:db8::1"),
        ("2001:db8::5/128", None, 1, "2001:db8::5", "2001:db8::5"),
        // The largest pools left once /0 and the special ranges are refused.
        (
            "128.0.0.0/2",
            None,
            (1 << 30) - 2,
            "128.0.0.1",
            "191.255.255.254",
        ),
        (
            "4000::/2",
            None,
            (1u128 << 126) - 1,
            "4000::1",
            "7fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ),
    ];
    for &(subnet, gateway, size, first, last) in cases {
        let p = pool(subnet, gateway, &[]);
        let what = format!("{subnet} gateway {gateway:?}");
        assert_eq!(p.size(), size, "{what}");
        assert_eq!(p.nth(0), Some(ip(first)), "{what}");
        assert_eq!(p.nth(size - 1), Some(ip(last)), "{what}");
        assert_eq!(p.nth(size), None, "{what}");
        assert_eq!(p.index_of(ip(first)), Some(0), "{what}");
        assert_eq!(p.index_of(ip(last)), Some(size - 1), "{what}");
        if let Some(g) = gateway {
            assert!(!p.contains_usable(ip(g)), "{what}");
        }
    }
}

#[test]
fn ipam_reserved_addresses_are_never_usable() {
    let v4 = pool("192.0.2.0/24", None, &[]);
    assert_eq!(v4.index_of(ip("192.0.2.0")), None, "network address");
    assert_eq!(v4.index_of(ip("192.0.2.255")), None, "broadcast address");
    assert_eq!(v4.index_of(ip("192.0.3.1")), None, "outside");
    assert_eq!(v4.index_of(ip("2001:db8::1")), None, "other family");
    let v6 = pool("2001:db8::/64", None, &[]);
    assert_eq!(v6.index_of(ip("2001:db8::")), None, "subnet-router anycast");
    assert_eq!(v6.index_of(ip("192.0.2.1")), None, "other family");
    assert_eq!(v6.index_of(ip("2001:db9::1")), None, "outside");
}

#[test]
fn ipam_gateway_in_the_middle_is_skipped() {
    let p = pool("192.0.2.0/24", Some("192.0.2.100"), &[]);
    assert_eq!(p.size(), 253);
    assert_eq!(p.nth(98), Some(ip("192.0.2.99")));
    assert_eq!(p.nth(99), Some(ip("192.0.2.101")));
    assert_eq!(p.index_of(ip("192.0.2.101")), Some(99));
    assert_eq!(p.index_of(ip("192.0.2.100")), None);
    assert_eq!(p.gateway(), Some(ip("192.0.2.100")));
}

#[test]
fn ipam_exclusions_single_range_cidr_and_merging() {
    // Single addresses, a range, a CIDR, an overlap (.20-.40 with .32/28), an adjacency
    // (.41 right after the merged block) and a duplicate of the gateway.
    let p = pool(
        "192.0.2.0/24",
        Some("192.0.2.1"),
        &[
            "192.0.2.1",
            "192.0.2.10",
            "192.0.2.20-192.0.2.40",
            "192.0.2.32/28",
            "192.0.2.41",
            "192.0.2.250-192.0.2.255",
        ],
    );
    // Excluded: .1, .10, .20-.47 (28), .250-.254 (5; .255 is broadcast anyway) = 35 of 254.
    assert_eq!(p.size(), 254 - 35);
    assert_eq!(p.nth(0), Some(ip("192.0.2.2")));
    assert_eq!(p.nth(7), Some(ip("192.0.2.9")));
    assert_eq!(p.nth(8), Some(ip("192.0.2.11")));
    assert_eq!(p.nth(16), Some(ip("192.0.2.19")));
    assert_eq!(p.nth(17), Some(ip("192.0.2.48")));
    assert_eq!(p.nth(p.size() - 1), Some(ip("192.0.2.249")));
    for excluded in [
        "192.0.2.10",
        "192.0.2.20",
        "192.0.2.33",
        "192.0.2.47",
        "192.0.2.252",
    ] {
        assert!(!p.contains_usable(ip(excluded)), "{excluded}");
    }
    assert_eq!(p.index_of(ip("192.0.2.48")), Some(17));
}

#[test]
fn ipam_exclusions_ipv6() {
    let p = pool(
        "2001:db8::/64",
        Some("2001:db8::1"),
        &[
            "2001:db8::/120",
            "2001:db8::1:0-2001:db8::1:ffff",
            "2001:db8::ffff:ffff:ffff:ffff",
        ],
    );
    assert_eq!(p.size(), (1u128 << 64) - 1 - 255 - 65536 - 1);
    assert_eq!(p.nth(0), Some(ip("2001:db8::100")));
    assert_eq!(p.index_of(ip("2001:db8::ffff")), Some(0xffff - 0x100));
    assert_eq!(p.nth(0xffff - 0x100 + 1), Some(ip("2001:db8::2:0")));
    assert_eq!(
        p.nth(p.size() - 1),
        Some(ip("2001:db8::ffff:ffff:ffff:fffe"))
    );
}

/// `nth` and `index_of` are inverse and monotonic on random samples of large pools with many
/// random exclusions.
#[test]
fn ipam_nth_index_of_round_trip_random() {
    let mut rng = Rng(42);
    for subnet in [
        "10.0.0.0/16",
        "2001:db8::/64",
        "2001:db8::/48",
        "2001:db8::/120",
    ] {
        let c = cidr(subnet);
        let width: u32 = if c.is_ipv4() { 32 } else { 128 };
        let span = 1u128 << (width - u32::from(c.prefix_len));
        let base = pool::to_u128(c.addr);
        let at = |offset: u128| -> IpAddr {
            if c.is_ipv4() {
                IpAddr::from(std::net::Ipv4Addr::from(
                    u32::try_from(base + offset).expect("ipv4"),
                ))
            } else {
                IpAddr::from(std::net::Ipv6Addr::from(base + offset))
            }
        };
        let mut exclude = Vec::new();
        // Many exclusions, but far from covering even the /120.
        let count = if span > 1 << 16 { 200 } else { 4 };
        for _ in 0..count {
            let a = rng.below(span);
            let len = rng.below(16);
            let b = (a + len).min(span - 1);
            exclude.push(Exclusion::Range {
                start: at(a),
                end: at(b),
            });
        }
        let p = Pool::new(c, None, &exclude).expect("pool");
        for _ in 0..2000 {
            let k = rng.below(p.size());
            let addr = p.nth(k).expect("k < size");
            assert_eq!(p.index_of(addr), Some(k), "{subnet} k={k} addr={addr}");
            if k + 1 < p.size() {
                let next = p.nth(k + 1).expect("k+1 < size");
                assert!(
                    pool::to_u128(next) > pool::to_u128(addr),
                    "{subnet} monotonic"
                );
            }
            // A random address is usable exactly when it round-trips.
            let probe = at(rng.below(span));
            match p.index_of(probe) {
                Some(i) => assert_eq!(p.nth(i), Some(probe)),
                None => assert!(
                    exclude.iter().any(|e| {
                        let (s, e) = e.bounds();
                        (pool::to_u128(s)..=pool::to_u128(e)).contains(&pool::to_u128(probe))
                    }) || probe == at(0)
                        || (c.is_ipv4() && probe == at(span - 1)),
                    "{subnet}: {probe} refused without a reason"
                ),
            }
        }
    }
}

/// Small pools against a brute-force model: the interval arithmetic agrees with filtering a
/// list, for many random exclusion sets.
#[test]
fn ipam_matches_brute_force_on_small_pools() {
    let mut rng = Rng(7);
    for subnet in [
        "192.0.2.0/24",
        "192.0.2.0/28",
        "2001:db8::/120",
        "2001:db8::/124",
    ] {
        let c = cidr(subnet);
        let base = pool::to_u128(c.addr);
        let width: u32 = if c.is_ipv4() { 32 } else { 128 };
        let span = 1u128 << (width - u32::from(c.prefix_len));
        for _ in 0..200 {
            let at = |o: u128| pool::to_u128(c.addr) + o;
            let mk = |v: u128| -> IpAddr {
                if c.is_ipv4() {
                    IpAddr::from(std::net::Ipv4Addr::from(u32::try_from(v).expect("v4")))
                } else {
                    IpAddr::from(std::net::Ipv6Addr::from(v))
                }
            };
            let mut exclude = Vec::new();
            for _ in 0..rng.below(6) {
                let a = rng.below(span);
                let b = (a + rng.below(span / 4)).min(span - 1);
                exclude.push(Exclusion::Range {
                    start: mk(at(a)),
                    end: mk(at(b)),
                });
            }
            let gateway = (rng.below(2) == 0).then(|| mk(at(1 + rng.below(span - 2))));
            let model: Vec<IpAddr> = (1..span - u128::from(c.is_ipv4()))
                .map(|o| mk(base + o))
                .filter(|a| Some(*a) != gateway)
                .filter(|a| {
                    !exclude.iter().any(|e| {
                        let (s, e) = e.bounds();
                        (pool::to_u128(s)..=pool::to_u128(e)).contains(&pool::to_u128(*a))
                    })
                })
                .collect();
            match Pool::new(c, gateway, &exclude) {
                Ok(p) => {
                    assert_eq!(p.size(), model.len() as u128);
                    for (k, addr) in model.iter().enumerate() {
                        assert_eq!(p.nth(k as u128), Some(*addr));
                        assert_eq!(p.index_of(*addr), Some(k as u128));
                    }
                }
                Err(e) => assert!(model.is_empty(), "{e}"),
            }
        }
    }
}
