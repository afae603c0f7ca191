//! Networks sharing a VLAN on purpose (`spec.vlanShareGroup`): every refusal with its exact
//! text, and the combinations that are accepted.

use serde_json::{Value, json};

use super::*;
use crate::ipam::Pool;

/// A valid Network on VFs with VLAN 100 and `group`, one subnet, MTU 9000, and `patch` merged
/// on top (one level deep: a patched `ipam` replaces the whole subnet list).
fn net(group: Option<&str>, patch: Value) -> NetworkSpec {
    let mut value = json!({
        "devices": { "kind": "vf" },
        "vlan": 100,
        "vlanShareGroup": group,
        "mtu": 9000,
        "ipam": { "subnets": [{ "cidr": "198.51.100.0/24" }] },
        "namespaces": { "names": ["team-a"] }
    });
    if let (Value::Object(target), Value::Object(fields)) = (&mut value, patch) {
        for (key, field) in fields {
            target.insert(key, field);
        }
    }
    serde_json::from_value(value).expect("test spec deserializes")
}

/// `blue` (`mine`) against the one older Network `red`, as displayed.
fn against(mine: &NetworkSpec, red: &NetworkSpec) -> Vec<String> {
    validate_against("blue", mine, &[("red".to_owned(), red.clone())])
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn subnet(cidr: &str, gateway: Option<&str>, exclude: &[&str]) -> Value {
    json!({ "subnets": [{ "cidr": cidr, "gateway": gateway, "exclude": exclude }] })
}

/// 192.0.2.0/24 split in two: `low` allocates .2-.127 behind gateway .1, `high` allocates
/// .128-.253 behind gateway .254, and each excludes the other's half and gateway.
fn split_halves() -> (Value, Value) {
    (
        subnet(
            "192.0.2.0/24",
            Some("192.0.2.1"),
            &["192.0.2.128-192.0.2.254"],
        ),
        subnet(
            "192.0.2.0/24",
            Some("192.0.2.254"),
            &["192.0.2.1-192.0.2.127"],
        ),
    )
}

#[test]
fn share_field_must_be_a_dns_label() {
    let spec = net(Some("Storage_A"), json!({}));
    assert_eq!(
        validate_network("blue", &spec)
            .expect_err("invalid group")
            .0
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec![
            "spec.vlanShareGroup: \"Storage_A\" is not a DNS label (1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)"
        ]
    );
    let long = "a".repeat(64);
    assert!(validate_network("blue", &net(Some(&long), json!({}))).is_err());
    assert_eq!(
        validate_network("blue", &net(Some(&"a".repeat(63)), json!({}))),
        Ok(())
    );
    assert_eq!(
        validate_network("blue", &net(Some("storage-a"), json!({}))),
        Ok(())
    );
}

#[test]
fn share_field_needs_a_vlan() {
    let spec = net(Some("storage"), json!({ "vlan": null }));
    assert_eq!(
        validate_network("blue", &spec)
            .expect_err("untagged with a group")
            .to_string(),
        "spec.vlanShareGroup: only applies when spec.vlan is set: it lets Networks share a VLAN id, and untagged Networks need no group to use the same devices"
    );
    // Both problems at once, in the spec's order after spec.vlan's own.
    let spec = net(Some(""), json!({ "vlan": 4095 }));
    let found: Vec<String> = validate_network("blue", &spec)
        .expect_err("bad vlan and group")
        .0
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("spec.vlan: "), "{found:?}");
    assert_eq!(
        found[1],
        "spec.vlanShareGroup: \"\" is not a DNS label (1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)"
    );
}

#[test]
fn share_refuses_same_vlan_without_the_field() {
    assert_eq!(
        against(&net(None, json!({})), &net(None, json!({}))),
        vec![
            "spec.vlan: VLAN 100 is already used by network \"red\" on overlapping devices; to share it on purpose, both Networks must set the same spec.vlanShareGroup",
            "spec.ipam.subnets[0].cidr: 198.51.100.0/24 overlaps 198.51.100.0/24 of network \"red\" on overlapping devices and the same VLAN (VLAN 100)",
        ]
    );
}

#[test]
fn share_refuses_the_group_on_one_side_only() {
    let disjoint = json!({ "ipam": subnet("203.0.113.0/24", None, &[]) });
    assert_eq!(
        against(
            &net(None, disjoint.clone()),
            &net(Some("storage"), json!({}))
        ),
        vec![
            "spec.vlan: VLAN 100 is already used by network \"red\" on overlapping devices, shared with group \"storage\"; set spec.vlanShareGroup to \"storage\" to join it"
        ]
    );
    assert_eq!(
        against(&net(Some("storage"), disjoint), &net(None, json!({}))),
        vec![
            "spec.vlanShareGroup: network \"red\" uses VLAN 100 on overlapping devices without a vlanShareGroup; a VLAN is shared only when every Network on it sets the same group (add vlanShareGroup: storage to \"red\")"
        ]
    );
}

#[test]
fn share_refuses_different_groups() {
    assert_eq!(
        against(
            &net(
                Some("storage-b"),
                json!({ "ipam": subnet("203.0.113.0/24", None, &[]) })
            ),
            &net(Some("storage-a"), json!({}))
        ),
        vec![
            "spec.vlanShareGroup: \"storage-b\" differs from group \"storage-a\" of network \"red\", which uses VLAN 100 on overlapping devices; Networks share a VLAN only with the same group"
        ]
    );
}

#[test]
fn share_accepts_one_group() {
    let none: Vec<String> = Vec::new();
    // Disjoint subnets (also of the other family), one MTU.
    let mine = net(
        Some("storage"),
        json!({ "ipam": { "subnets": [
            { "cidr": "203.0.113.0/24" },
            { "cidr": "2001:db8:2::/64" }
        ] } }),
    );
    let red = net(
        Some("storage"),
        json!({ "ipam": { "subnets": [
            { "cidr": "198.51.100.0/24" },
            { "cidr": "2001:db8:1::/64" }
        ] } }),
    );
    assert_eq!(validate_network("blue", &mine), Ok(()));
    assert_eq!(against(&mine, &red), none);
    assert_eq!(against(&red, &mine), none);
    // One subnet split in two halves behind two gateways, both MTUs unset.
    let (low, high) = split_halves();
    let low = net(Some("storage"), json!({ "ipam": low, "mtu": null }));
    let high = net(Some("storage"), json!({ "ipam": high, "mtu": null }));
    assert_eq!(validate_network("blue", &low), Ok(()));
    assert_eq!(validate_network("blue", &high), Ok(()));
    assert_eq!(against(&low, &high), none);
    assert_eq!(against(&high, &low), none);
    // One router for both: the same gateway is excluded from both pools already.
    let a = net(
        Some("storage"),
        json!({ "ipam": subnet("192.0.2.0/24", Some("192.0.2.1"), &["192.0.2.128-192.0.2.255"]) }),
    );
    let b = net(
        Some("storage"),
        json!({ "ipam": subnet("192.0.2.0/24", Some("192.0.2.1"), &["192.0.2.0/25"]) }),
    );
    assert_eq!(against(&a, &b), none);
    // Static addressing: nothing to compare, the claims carry the addresses.
    let fixed = net(Some("storage"), json!({ "ipam": { "static": {} } }));
    assert_eq!(against(&fixed, &red), none);
    // A group is no conflict where the devices are disjoint, whatever it says.
    let nics = net(Some("other"), json!({ "devices": { "kind": "nic" } }));
    assert_eq!(against(&nics, &red), none);
}

#[test]
fn share_refuses_different_mtus() {
    let red = net(Some("storage"), json!({}));
    let disjoint = subnet("203.0.113.0/24", None, &[]);
    assert_eq!(
        against(
            &net(
                Some("storage"),
                json!({ "ipam": disjoint.clone(), "mtu": 1500 })
            ),
            &red
        ),
        vec![
            "spec.mtu: 1500 differs from 9000 of network \"red\", which shares VLAN 100 (group \"storage\") on overlapping devices; Networks on one segment need one MTU (larger frames are dropped by the smaller side)"
        ]
    );
    assert_eq!(
        against(
            &net(Some("storage"), json!({ "ipam": disjoint, "mtu": null })),
            &red
        ),
        vec![
            "spec.mtu: unset (the device's own) differs from 9000 of network \"red\", which shares VLAN 100 (group \"storage\") on overlapping devices; Networks on one segment need one MTU (larger frames are dropped by the smaller side)"
        ]
    );
}

#[test]
fn share_refuses_overlapping_different_subnets() {
    assert_eq!(
        against(
            &net(
                Some("storage"),
                json!({ "ipam": subnet("198.51.100.128/25", None, &[]) })
            ),
            &net(Some("storage"), json!({}))
        ),
        vec![
            "spec.ipam.subnets[0].cidr: 198.51.100.128/25 overlaps 198.51.100.0/24 of network \"red\", which shares VLAN 100 (group \"storage\") on overlapping devices; Networks on one segment may split one subnet (the same CIDR) but not overlap with different prefixes, which disagree about on-link and broadcast addresses"
        ]
    );
}

#[test]
fn share_refuses_addresses_both_may_allocate() {
    let (low, _) = split_halves();
    let whole = net(
        Some("storage"),
        json!({ "ipam": subnet("192.0.2.0/24", Some("192.0.2.1"), &[]) }),
    );
    assert_eq!(
        against(&net(Some("storage"), json!({ "ipam": low })), &whole),
        vec![
            "spec.ipam.subnets[0].exclude: 126 addresses of 192.0.2.0/24 (from 192.0.2.2) can be allocated by both this network and network \"red\", which shares VLAN 100 (group \"storage\") on overlapping devices; exclude the other network's range so no address goes to two pods"
        ]
    );
    // One address in common is found as precisely, here in the second subnet of a /64.
    let mine = net(
        Some("storage"),
        json!({ "ipam": { "subnets": [
            { "cidr": "203.0.113.0/24" },
            { "cidr": "2001:db8::/64", "exclude": ["2001:db8::1-2001:db8::ffff"] }
        ] } }),
    );
    let red = net(
        Some("storage"),
        json!({ "ipam": { "subnets": [
            { "cidr": "2001:db8::/64", "exclude": ["2001:db8::1:1-2001:db8::ffff:ffff:ffff:ffff"] }
        ] } }),
    );
    assert_eq!(
        against(&mine, &red),
        vec![
            "spec.ipam.subnets[1].exclude: 1 address of 2001:db8::/64 (from 2001:db8::1:0) can be allocated by both this network and network \"red\", which shares VLAN 100 (group \"storage\") on overlapping devices; exclude the other network's range so no address goes to two pods"
        ]
    );
}

#[test]
fn share_refuses_a_gateway_the_other_may_allocate() {
    // `low` keeps its gateway .1 out of `high`'s pool only through `high`'s exclude, and
    // `high`'s gateway .254 out of its own only through its own exclude: drop each in turn.
    let (low, _) = split_halves();
    let high_without_low_gateway = net(
        Some("storage"),
        json!({ "ipam": subnet("192.0.2.0/24", Some("192.0.2.254"), &["192.0.2.2-192.0.2.127"]) }),
    );
    assert_eq!(
        against(
            &net(Some("storage"), json!({ "ipam": low })),
            &high_without_low_gateway
        ),
        vec![
            "spec.ipam.subnets[0].gateway: 192.0.2.1 can be allocated to a pod by network \"red\", which shares VLAN 100 (group \"storage\") on overlapping devices with subnet 192.0.2.0/24; that network must list it in exclude"
        ]
    );
    let (_, high) = split_halves();
    let low_without_high_gateway = net(
        Some("storage"),
        json!({ "ipam": subnet("192.0.2.0/24", Some("192.0.2.1"), &["192.0.2.128-192.0.2.253"]) }),
    );
    assert_eq!(
        against(
            &low_without_high_gateway,
            &net(Some("storage"), json!({ "ipam": high }))
        ),
        vec![
            "spec.ipam.subnets[0].exclude: 192.0.2.254 is the gateway of network \"red\", which shares VLAN 100 (group \"storage\") on overlapping devices with subnet 192.0.2.0/24, and can be allocated to a pod here; list it in exclude"
        ]
    );
}

#[test]
fn share_pool_common_addresses() {
    let pool = |cidr: &str, gateway: Option<&str>, exclude: &[&str]| {
        crate::network::Subnet {
            cidr: cidr.to_owned(),
            gateway: gateway.map(str::to_owned),
            exclude: exclude.iter().map(|e| (*e).to_owned()).collect(),
            ..crate::network::Subnet::default()
        }
        .pool()
        .expect("valid pool")
    };
    let ip = |s: &str| s.parse::<std::net::IpAddr>().expect("address");
    let whole: Pool = pool("192.0.2.0/24", None, &[]);
    assert_eq!(whole.common(&whole), Some((ip("192.0.2.1"), 254)));
    // Holes on both sides, interleaved: .1-.9 and .20-.29 against .5-.24.
    let a = pool(
        "192.0.2.0/24",
        None,
        &["192.0.2.10-192.0.2.19", "192.0.2.30-192.0.2.255"],
    );
    let b = pool(
        "192.0.2.0/24",
        None,
        &["192.0.2.0/30", "192.0.2.4", "192.0.2.25-192.0.2.254"],
    );
    assert_eq!(a.common(&b), Some((ip("192.0.2.5"), 5 + 5)));
    assert_eq!(b.common(&a), a.common(&b));
    // Adjacent, not overlapping.
    let low = pool("192.0.2.0/24", None, &["192.0.2.128/25"]);
    let high = pool("192.0.2.0/24", None, &["192.0.2.0/25"]);
    assert_eq!(low.common(&high), None);
    // Other family, and a whole /64 against itself without enumerating it.
    let v6 = pool("2001:db8::/64", Some("2001:db8::1"), &[]);
    assert_eq!(low.common(&v6), None);
    assert_eq!(v6.common(&v6), Some((ip("2001:db8::2"), (1u128 << 64) - 2)));
}
