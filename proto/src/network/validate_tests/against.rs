//! `validate_against`: conflicts between Networks, case by case.

use super::*;

fn against(spec: &NetworkSpec, others: &[(&str, NetworkSpec)]) -> Vec<String> {
    let others: Vec<(String, NetworkSpec)> = others
        .iter()
        .map(|(n, s)| ((*n).to_owned(), s.clone()))
        .collect();
    validate_against("blue", spec, &others)
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn subnet(cidr: &str) -> Value {
    json!({ "ipam": { "subnets": [{ "cidr": cidr }] } })
}

fn net(devices: Value, vlan: Option<u16>, cidr: &str) -> NetworkSpec {
    let mut patch = subnet(cidr);
    merge(&mut patch, json!({ "vlan": vlan }));
    with_devices(devices, patch)
}

#[test]
fn network_against_duplicate_vlan() {
    let mine = net(json!({ "kind": "vf" }), Some(100), "192.0.2.0/24");
    let red = net(json!({ "kind": "vf" }), Some(100), "198.51.100.0/24");
    assert_eq!(
        against(&mine, &[("red", red)]),
        vec![
            "spec.vlan: VLAN 100 is already used by network \"red\" on overlapping devices; to share it on purpose, both Networks must set the same spec.vlanShareGroup"
        ]
    );
}

#[test]
fn network_against_overlapping_subnets_untagged() {
    let mine = net(json!({ "kind": "vf" }), None, "192.0.2.0/24");
    let red = net(json!({ "kind": "vf" }), None, "192.0.2.128/25");
    assert_eq!(
        against(&mine, &[("red", red)]),
        vec![
            "spec.ipam.subnets[0].cidr: 192.0.2.0/24 overlaps 192.0.2.128/25 of network \"red\" on overlapping devices and the same VLAN (untagged)"
        ]
    );
}

#[test]
fn network_against_same_vlan_and_overlapping_subnets() {
    let mine = net(json!({ "kind": "vf" }), Some(7), "2001:db8::/64");
    let red = net(json!({ "kind": "vf" }), Some(7), "2001:db8::/48");
    assert_eq!(
        against(&mine, &[("red", red)]),
        vec![
            "spec.vlan: VLAN 7 is already used by network \"red\" on overlapping devices; to share it on purpose, both Networks must set the same spec.vlanShareGroup",
            "spec.ipam.subnets[0].cidr: 2001:db8::/64 overlaps 2001:db8::/48 of network \"red\" on overlapping devices and the same VLAN (VLAN 7)",
        ]
    );
}

#[test]
fn network_against_allowed_combinations() {
    let mine = net(
        json!({ "kind": "vf", "vendor": "8086", "pfName": "ens1f0", "numaNode": 0, "rdma": true }),
        Some(100),
        "192.0.2.0/24",
    );
    let allowed = [
        (
            "other VLAN",
            net(json!({ "kind": "vf" }), Some(101), "192.0.2.0/24"),
        ),
        (
            "untagged",
            net(json!({ "kind": "vf" }), None, "192.0.2.0/24"),
        ),
        (
            "other kind",
            net(json!({ "kind": "nic" }), Some(100), "192.0.2.0/24"),
        ),
        (
            "other vendor",
            net(json!({ "vendor": "0x15b3" }), Some(100), "192.0.2.0/24"),
        ),
        (
            "other PF",
            net(json!({ "pfName": "ens2f0" }), Some(100), "192.0.2.0/24"),
        ),
        (
            "other NUMA node",
            net(json!({ "numaNode": 1 }), Some(100), "192.0.2.0/24"),
        ),
        (
            "no RDMA",
            net(json!({ "rdma": false }), Some(100), "192.0.2.0/24"),
        ),
        (
            "other class",
            net(
                json!({ "deviceClassName": "example.com" }),
                Some(100),
                "192.0.2.0/24",
            ),
        ),
        (
            "NIC class",
            net(
                json!({ "deviceClassName": "nic.knic.dev" }),
                Some(100),
                "192.0.2.0/24",
            ),
        ),
        (
            "different selectors",
            net(
                json!({ "deviceClassName": "knic.dev", "selectors": ["x == 1"] }),
                Some(100),
                "192.0.2.0/24",
            ),
        ),
        (
            "itself",
            net(json!({ "kind": "vf" }), Some(100), "192.0.2.0/24"),
        ),
    ];
    for (what, other) in allowed {
        let name = if what == "itself" { "blue" } else { "red" };
        assert_eq!(
            against(&mine, &[(name, other)]),
            Vec::<String>::new(),
            "{what}"
        );
    }
    // Disjoint subnets on the same untagged devices are fine too.
    let mine = net(json!({ "kind": "vf" }), None, "192.0.2.0/25");
    let red = net(json!({ "kind": "vf" }), None, "192.0.2.128/25");
    assert_eq!(against(&mine, &[("red", red)]), Vec::<String>::new());
}

#[test]
fn network_against_devices_that_may_share() {
    let mine = net(
        json!({ "kind": "vf", "vendor": "8086", "pfName": "ens1f0", "minSpeed": 10000 }),
        Some(100),
        "192.0.2.0/24",
    );
    let conflicting = [
        (
            "unset kind",
            net(json!({ "rdma": true }), Some(100), "198.51.100.0/24"),
        ),
        (
            "faster minimum",
            net(json!({ "minSpeed": 100000 }), Some(100), "198.51.100.0/24"),
        ),
        (
            "vendor name vs id",
            net(
                json!({ "vendor": "Intel Corporation" }),
                Some(100),
                "198.51.100.0/24",
            ),
        ),
        (
            "same vendor spelt differently",
            net(json!({ "vendor": "0x8086" }), Some(100), "198.51.100.0/24"),
        ),
        (
            "all knic devices",
            net(
                json!({ "deviceClassName": "knic.dev" }),
                Some(100),
                "198.51.100.0/24",
            ),
        ),
        (
            "VF class",
            net(
                json!({ "deviceClassName": "vf.knic.dev" }),
                Some(100),
                "198.51.100.0/24",
            ),
        ),
        (
            "RDMA class",
            net(
                json!({ "deviceClassName": "rdma.knic.dev" }),
                Some(100),
                "198.51.100.0/24",
            ),
        ),
    ];
    for (what, other) in conflicting {
        assert_eq!(
            against(&mine, &[("red", other)]),
            vec![
                "spec.vlan: VLAN 100 is already used by network \"red\" on overlapping devices; to share it on purpose, both Networks must set the same spec.vlanShareGroup"
            ],
            "{what}"
        );
    }
}

#[test]
fn network_against_raw_selectors() {
    let class = |selectors: Value| {
        net(
            json!({ "deviceClassName": "vf.knic.dev", "selectors": selectors }),
            Some(5),
            "198.51.100.0/24",
        )
    };
    let mine = net(
        json!({ "deviceClassName": "vf.knic.dev", "selectors": ["a == 1", "b == 2"] }),
        Some(5),
        "192.0.2.0/24",
    );
    let conflict = vec![
        "spec.vlan: VLAN 5 is already used by network \"red\" on overlapping devices; to share it on purpose, both Networks must set the same spec.vlanShareGroup".to_owned(),
    ];
    assert_eq!(
        against(&mine, &[("red", class(json!(["b == 2", "a == 1"])))]),
        conflict,
        "same set"
    );
    assert_eq!(
        against(&mine, &[("red", class(json!(["  a == 1 "])))]),
        conflict,
        "subset, trimmed"
    );
    assert_eq!(
        against(&mine, &[("red", class(json!(["a == 1", "b == 2", "c"])))]),
        conflict,
        "superset"
    );
    let none: Vec<String> = Vec::new();
    assert_eq!(
        against(&mine, &[("red", class(json!(["a == 1", "c"])))]),
        none,
        "different"
    );
    // A friendly form against a raw one with the very expression it compiles to.
    let friendly = net(json!({ "kind": "vf" }), Some(5), "192.0.2.0/24");
    let raw = net(
        json!({ "deviceClassName": "knic.dev", "selectors": ["device.attributes[\"knic.dev\"].kind == \"vf\""] }),
        Some(5),
        "198.51.100.0/24",
    );
    assert_eq!(
        against(&friendly, &[("red", raw)]),
        conflict,
        "compiled form"
    );
}

#[test]
fn network_against_is_sorted_and_skips_invalid_others() {
    let mine = net(json!({ "kind": "vf" }), Some(9), "192.0.2.0/24");
    let bad_subnet = net(json!({ "kind": "vf" }), Some(9), "192.0.2.1/24");
    let bad_devices = net(
        json!({ "kind": "vf", "minSpeed": 0 }),
        Some(9),
        "192.0.2.0/24",
    );
    let zeta = net(json!({ "kind": "vf" }), Some(9), "198.51.100.0/24");
    let alpha = net(json!({ "kind": "vf" }), Some(9), "203.0.113.0/24");
    assert_eq!(
        against(
            &mine,
            &[
                ("zeta", zeta),
                ("bad-devices", bad_devices),
                ("alpha", alpha),
                ("bad-subnet", bad_subnet)
            ]
        ),
        vec![
            "spec.vlan: VLAN 9 is already used by network \"alpha\" on overlapping devices; to share it on purpose, both Networks must set the same spec.vlanShareGroup",
            "spec.vlan: VLAN 9 is already used by network \"bad-subnet\" on overlapping devices; to share it on purpose, both Networks must set the same spec.vlanShareGroup",
            "spec.vlan: VLAN 9 is already used by network \"zeta\" on overlapping devices; to share it on purpose, both Networks must set the same spec.vlanShareGroup",
        ]
    );
    // An invalid Network itself yields no cross-network findings (its own validation speaks).
    assert_eq!(
        against(
            &bad_devices_spec(),
            &[("red", net(json!({ "kind": "vf" }), Some(9), "192.0.2.0/24"))]
        ),
        Vec::<String>::new()
    );
}

fn bad_devices_spec() -> NetworkSpec {
    net(
        json!({ "kind": "vf", "deviceClassName": "vf.knic.dev" }),
        Some(9),
        "192.0.2.0/24",
    )
}
