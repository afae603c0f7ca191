//! Pure IPAM tests: pool arithmetic for every prefix class, exclusions, stable identity,
//! exhaustion, allocation names, and a simulated many-allocator race.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};

use super::*;
use crate::Error;
use crate::netconfig::Cidr;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn cidr(s: &str) -> Cidr {
    s.parse().expect("test cidr")
}

fn pool(subnet: &str, gateway: Option<&str>, exclude: &[&str]) -> Pool {
    let exclude: Vec<Exclusion> = exclude
        .iter()
        .map(|e| e.parse().expect("test exclusion"))
        .collect();
    Pool::new(cidr(subnet), gateway.map(ip), &exclude).expect("valid pool")
}

fn pool_error(subnet: &str, gateway: Option<&str>, exclude: &[&str]) -> String {
    let exclude: Vec<Exclusion> = exclude
        .iter()
        .map(|e| e.parse().expect("test exclusion"))
        .collect();
    match Pool::new(cidr(subnet), gateway.map(ip), &exclude) {
        Ok(p) => panic!("expected an error, got {p:?}"),
        Err(e) => e.to_string(),
    }
}

/// A tiny deterministic PRNG (SplitMix64), so random samples are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn next_u128(&mut self) -> u128 {
        (u128::from(self.next()) << 64) | u128::from(self.next())
    }

    fn below(&mut self, n: u128) -> u128 {
        self.next_u128() % n
    }
}

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

#[test]
fn ipam_choose_starts_at_hint_walks_forward_and_wraps() {
    let p = pool("192.0.2.0/29", None, &[]); // .1-.6
    let taken: HashSet<IpAddr> = ["192.0.2.3", "192.0.2.4", "192.0.2.6"]
        .iter()
        .map(|s| ip(s))
        .collect();
    let is_taken = |a: IpAddr| taken.contains(&a);
    assert_eq!(choose(&p, is_taken, 0), Some(ip("192.0.2.1")));
    assert_eq!(
        choose(&p, is_taken, 2),
        Some(ip("192.0.2.5")),
        ".3 and .4 taken"
    );
    assert_eq!(
        choose(&p, is_taken, 5),
        Some(ip("192.0.2.1")),
        ".6 taken, wraps"
    );
    assert_eq!(
        choose(&p, is_taken, 6 + 4),
        Some(ip("192.0.2.5")),
        "hint modulo size"
    );
    assert_eq!(choose(&p, |_| true, 3), None);
    assert_eq!(choose(&p, |_| false, u128::MAX), p.nth(u128::MAX % 6));
}

#[test]
fn ipam_choose_probes_only_past_taken_addresses() {
    // In a /64 with a dense block taken in front of the hint, the walk touches the block once
    // and stops: cost is proportional to what is taken, never to the subnet.
    let p = pool("2001:db8::/64", None, &[]);
    let mut probes = 0u32;
    let got = choose(
        &p,
        |a| {
            probes += 1;
            pool::to_u128(a) & 0xffff_ffff < 1000
        },
        0,
    );
    assert_eq!(got, Some(ip("2001:db8::3e8")));
    assert_eq!(probes, 1000);
}

#[test]
fn ipam_exhaustion_error_message() {
    let p = pool("192.0.2.0/24", Some("192.0.2.1"), &[]);
    let err = allocate("blue", &p, |_| true, 17).expect_err("exhausted");
    assert_eq!(
        err.to_string(),
        "network blue: subnet 192.0.2.0/24 has no free address (253 in use of 253)"
    );
    assert!(matches!(
        err,
        Error::Exhausted {
            in_use: 253,
            size: 253,
            ..
        }
    ));
    assert_eq!(
        p.exhausted("blue", 250).to_string(),
        "network blue: subnet 192.0.2.0/24 has no free address (250 in use of 253)"
    );
    let v6 = pool("2001:db8::/126", None, &[]);
    assert_eq!(
        allocate("green", &v6, |_| true, 0)
            .expect_err("exhausted")
            .to_string(),
        "network green: subnet 2001:db8::/126 has no free address (3 in use of 3)"
    );
}

#[test]
fn ipam_stable_offset_is_pinned_and_deterministic() {
    let p = pool("192.0.2.0/24", Some("192.0.2.1"), &[]);
    // Pinned: changing the hash moves every stable address on upgrade.
    let pinned: Vec<(&str, u128)> = ["ns/db-0", "ns/db-1", "ns/db-2", "other/db-0"]
        .iter()
        .map(|id| (*id, stable_offset("blue", id, &p)))
        .collect();
    assert_eq!(
        pinned,
        vec![
            ("ns/db-0", 79),
            ("ns/db-1", 196),
            ("ns/db-2", 163),
            ("other/db-0", 221)
        ]
    );
    let v6 = pool("2001:db8::/64", None, &[]);
    assert_eq!(
        stable_offset("blue", "ns/db-0", &v6),
        6_736_192_423_097_997_939
    );
    // Same inputs, same offset; the network is part of the hash.
    assert_eq!(stable_offset("blue", "ns/db-0", &p), pinned[0].1);
    assert_ne!(stable_offset("red", "ns/db-0", &p), pinned[0].1);
}

#[test]
fn ipam_stable_offsets_spread() {
    let p = pool("192.0.2.0/24", Some("192.0.2.1"), &[]);
    let offsets: HashSet<u128> = (0..1000)
        .map(|i| stable_offset("blue", &format!("ns/pod-{i}"), &p))
        .collect();
    assert!(offsets.iter().all(|o| *o < p.size()));
    // 1000 balls in 253 bins leave about 253 * e^-3.95 ≈ 5 bins empty.
    assert!(
        offsets.len() > 230,
        "only {} distinct offsets",
        offsets.len()
    );
}

/// A pod gets its stable address back when it is free, the next one along when it is not,
/// and an exclusion elsewhere does not move it.
#[test]
fn ipam_stable_identity_keeps_its_address() {
    let p = pool("192.0.2.0/24", Some("192.0.2.1"), &[]);
    let id = "ns/db-0";
    let first = choose(&p, |_| false, stable_offset("blue", id, &p)).expect("free");
    // Restart: released, then allocated again with the same identity.
    let again = choose(&p, |_| false, stable_offset("blue", id, &p)).expect("free");
    assert_eq!(first, again);
    // Someone else holds it meanwhile: the pod gets the next free address, not a failure.
    let moved = choose(&p, |a| a == first, stable_offset("blue", id, &p)).expect("free");
    assert_ne!(moved, first);
    // The admin excludes an unrelated range: the pod's address stays.
    let unrelated = if p.index_of(first).expect("usable") > 100 {
        "192.0.2.2-192.0.2.50"
    } else {
        "192.0.2.200-192.0.2.250"
    };
    let p2 = pool("192.0.2.0/24", Some("192.0.2.1"), &[unrelated]);
    assert_eq!(
        choose(&p2, |_| false, stable_offset("blue", id, &p2)),
        Some(first)
    );
    // The admin excludes the pod's own address: it moves to the next usable one.
    let own = first.to_string();
    let p3 = pool("192.0.2.0/24", Some("192.0.2.1"), &[own.as_str()]);
    let next = choose(&p3, |_| false, stable_offset("blue", id, &p3)).expect("free");
    assert_eq!(
        p3.index_of(next),
        Some(p.index_of(first).expect("usable") % p3.size())
    );
}

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

/// Stand-in for the apiserver: `create` succeeds for exactly one caller per name.
#[derive(Default)]
struct FakeApi {
    objects: Mutex<HashSet<String>>,
}

impl FakeApi {
    fn exists(&self, name: &str) -> bool {
        self.objects.lock().expect("lock").contains(name)
    }

    fn create(&self, name: String) -> bool {
        self.objects.lock().expect("lock").insert(name)
    }
}

/// What one race produced: the addresses each allocator won, and how many creates lost.
struct Race {
    won: Vec<Vec<IpAddr>>,
    conflicts: usize,
}

/// Runs 64 allocators on one /24, released together by a barrier, until each sees the subnet
/// exhausted. With `same_hint` every allocator starts at the same address (the worst case, to
/// force lost creates); otherwise each claim's hint is its own, as in production.
fn race(p: &Pool, repetition: usize, same_hint: bool) -> Race {
    let api = FakeApi::default();
    let start = Barrier::new(64);
    let conflicts = AtomicUsize::new(0);
    let won = std::thread::scope(|s| {
        let handles: Vec<_> = (0..64)
            .map(|t| {
                let (api, start, conflicts) = (&api, &start, &conflicts);
                s.spawn(move || {
                    start.wait();
                    let mut won = Vec::new();
                    for n in 0.. {
                        let claim = format!("claim-{repetition}-{t}-{n}");
                        let hint = if same_hint {
                            0
                        } else {
                            stable_offset("blue", &claim, p)
                        };
                        let got = loop {
                            // Check-then-create is racy on purpose: only the create decides.
                            let candidate =
                                choose(p, |a| api.exists(&allocation_name("blue", a)), hint);
                            let Some(candidate) = candidate else {
                                break None;
                            };
                            if api.create(allocation_name("blue", candidate)) {
                                break Some(candidate);
                            }
                            conflicts.fetch_add(1, Ordering::Relaxed);
                        };
                        match got {
                            Some(a) => won.push(a),
                            None => break,
                        }
                        // A real allocator spends an API round trip per allocation; yielding
                        // lets the others interleave on a machine with few cores.
                        std::thread::yield_now();
                    }
                    won
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("allocator thread"))
            .collect()
    });
    Race {
        won,
        conflicts: conflicts.into_inner(),
    }
}

fn check_race(p: &Pool, expected: usize) {
    let mut conflicts = 0;
    let mut shared = 0;
    for repetition in 0..100 {
        let race = race(p, repetition, repetition % 2 == 1);
        conflicts += race.conflicts;
        let all: Vec<IpAddr> = race.won.iter().flatten().copied().collect();
        let unique: HashSet<IpAddr> = all.iter().copied().collect();
        assert_eq!(
            all.len(),
            expected,
            "repetition {repetition}: duplicates or losses"
        );
        assert_eq!(unique.len(), expected, "repetition {repetition}");
        assert!(all.iter().all(|a| p.contains_usable(*a)));
        if race.won.iter().filter(|w| !w.is_empty()).count() > 1 {
            shared += 1;
        }
        // Clean exhaustion once everything is out.
        let err = allocate("blue", p, |a| unique.contains(&a), 0).expect_err("exhausted");
        assert_eq!(
            err.to_string(),
            format!(
                "network blue: subnet 192.0.2.0/24 has no free address ({expected} in use of {expected})"
            )
        );
    }
    // The race was real: allocators interleaved, and some creates lost and were retried.
    assert!(
        shared > 50,
        "only {shared} of 100 repetitions had more than one winner"
    );
    assert!(conflicts > 0, "no allocator ever lost a create");
}

/// The concurrency requirement: 64 allocators on one /24, create-by-unique-name as
/// the only arbiter, 100 repetitions: exactly 253 unique addresses with a gateway (it is never
/// handed out), then a clean exhaustion error.
#[test]
fn ipam_concurrent_allocators_with_gateway_get_253_unique() {
    check_race(&pool("192.0.2.0/24", Some("192.0.2.1"), &[]), 253);
}

/// Without a gateway, all 254 host addresses are handed out.
#[test]
fn ipam_concurrent_allocators_without_gateway_get_254_unique() {
    check_race(&pool("192.0.2.0/24", None, &[]), 254);
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
            },
        );
        let name = object.metadata.name.as_deref().expect("named");
        assert_eq!(parse_allocation_name(name), Some((network, ip)));
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
