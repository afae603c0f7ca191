//! Choosing an address: the hint, taken addresses, exhaustion, stable identity.

use std::collections::HashSet;

use super::*;
use crate::Error;

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

const PINNED_MAC: [u8; 6] = [0x02, 0x7d, 0xf0, 0x38, 0xdc, 0x18];

#[test]
fn overlay_macs_are_pinned_local_unicast_and_spread() {
    let a = overlay_mac("blue", "ns/db-0");
    // Pinned: a changed hash would give every returning stable pod a new MAC on upgrade.
    assert_eq!(a, PINNED_MAC);
    assert_eq!(a[0], 0x02, "locally administered, unicast");
    assert_eq!(overlay_mac("blue", "ns/db-0"), a);
    assert_ne!(overlay_mac("red", "ns/db-0"), a, "per Network");
    let macs: std::collections::BTreeSet<[u8; 6]> = (0..1000)
        .map(|i| overlay_mac("blue", &format!("uid-{i}#0")))
        .collect();
    assert_eq!(macs.len(), 1000, "no collision among 1000 claims");
    assert!(macs.iter().all(|m| m[0] == 0x02));
}
