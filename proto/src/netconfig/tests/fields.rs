//! Field rules at the values they accept: gateways, MTU and VLAN bounds, interface names,
//! sysctl paths.

use super::*;

#[test]
fn gateway_subnet_rules_that_accept() {
    // IPv6 link-local gateways are on-link by definition.
    let v = valid(json!({
        "addresses": ["2001:db8::10/64"],
        "routes": [{ "destination": "::/0", "gateway": "fe80::1" }]
    }));
    assert_eq!(v.routes[0].gateway, Some(ip("fe80::1")));
    // With IPAM the addresses are unknown yet, so the driver checks gateways later.
    let v = valid(json!({
        "ipam": { "network": "pods" },
        "routes": [{ "destination": "0.0.0.0/0", "gateway": "203.0.113.1" }]
    }));
    assert_eq!(v.ipam_network.as_deref(), Some("pods"));
    // A /31 (RFC 3021) holds both ends of a point-to-point link.
    valid(json!({
        "addresses": ["192.0.2.0/31"],
        "routes": [{ "destination": "0.0.0.0/0", "gateway": "192.0.2.1" }]
    }));
    // Same destination in different tables or metrics is fine.
    valid(json!({
        "routes": [
            { "destination": "0.0.0.0/0" },
            { "destination": "0.0.0.0/0", "metric": 10 },
            { "destination": "0.0.0.0/0", "table": 100 }
        ]
    }));
}

#[test]
fn mtu_boundaries() {
    assert_eq!(valid(json!({ "interface": { "mtu": 68 } })).mtu, Some(68));
    assert_eq!(
        valid(json!({ "interface": { "mtu": 65535 } })).mtu,
        Some(65535)
    );
    let v = valid(json!({ "interface": { "mtu": 1280 }, "addresses": ["2001:db8::1/64"] }));
    assert_eq!(v.mtu, Some(1280));
    // Below 1280 is fine for an IPv4-only interface.
    assert_eq!(
        valid(json!({ "interface": { "mtu": 576 }, "addresses": ["192.0.2.1/24"] })).mtu,
        Some(576)
    );
}

#[test]
fn vlan_boundaries() {
    assert_eq!(valid(json!({ "vlan": { "id": 1 } })).vlan, Some(1));
    assert_eq!(valid(json!({ "vlan": { "id": 4094 } })).vlan, Some(4094));
}

#[test]
fn interface_names() {
    for name in [
        "net1",
        "eth0.100",
        "ens1f0v3",
        "abcdefghijklmno",
        "a",
        "x-y_z@w",
        "...",
        ".a",
    ] {
        assert_eq!(
            check_interface_name(name).map_err(|e| e.to_string()),
            Ok(()),
            "{name:?}"
        );
    }
    let cases = [
        (
            "eth\t0",
            "interface name \"eth\\t0\" must not contain whitespace",
        ),
        (
            "eth\u{a0}",
            "interface name \"eth\\u{a0}\" must not contain whitespace",
        ),
        (
            "eth\u{2003}",
            "interface name \"eth\\u{2003}\" must not contain whitespace",
        ),
        (
            "eth\0",
            "interface name \"eth\\0\" must not contain control characters",
        ),
        (
            "eth\u{7f}",
            "interface name \"eth\\u{7f}\" must not contain control characters",
        ),
        (".", "interface name \".\" is not allowed by Linux"),
    ];
    for (name, message) in cases {
        assert_eq!(
            check_interface_name(name).map_err(|e| e.to_string()),
            Err(message.to_owned()),
            "{name:?}"
        );
    }
    // Byte 0xA0 is kernel whitespace even inside a UTF-8 sequence ("à" is C3 A0).
    assert_eq!(
        check_interface_name("netà").map_err(|e| e.to_string()),
        Err("interface name \"netà\" must not contain whitespace".to_owned())
    );
}

#[test]
fn sysctl_paths() {
    assert_eq!(
        sysctl_path("ipv4.rp_filter", "net1").as_deref(),
        Some("/proc/sys/net/ipv4/conf/net1/rp_filter")
    );
    assert_eq!(
        sysctl_path("ipv6.disable_ipv6", "eth0.100").as_deref(),
        Some("/proc/sys/net/ipv6/conf/eth0.100/disable_ipv6")
    );
    assert_eq!(sysctl_path("ipv4.ip_forward", "net1"), None);
    assert_eq!(sysctl_path("ipv4.rp_filter", ".."), None);
    assert_eq!(sysctl_path("ipv4.rp_filter", "a/b"), None);
}

#[test]
fn arp_nd_sysctls_are_accepted_and_canonical() {
    let config = parse(
        &serde_json::json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "sysctls": {
                "ipv4.arp_accept": "2", "ipv4.arp_notify": "1", "ipv4.arp_filter": "1",
                "ipv4.drop_gratuitous_arp": "1", "ipv4.arp_evict_nocarrier": "0",
                "ipv4.proxy_arp_pvlan": "1", "ipv4.drop_unicast_in_l2_multicast": "1",
                "ipv6.ndisc_notify": "1", "ipv6.accept_dad": "0", "ipv6.dad_transmits": "03",
                "ipv6.proxy_ndp": "1", "ipv6.drop_unsolicited_na": "1",
                "ipv6.ndisc_evict_nocarrier": "0", "ipv6.accept_untracked_na": "1",
                "ipv6.drop_unicast_in_l2_multicast": "1"
            }
        }),
        "",
    )
    .expect("parses");
    let valid = validate(&config).expect("validates");
    assert_eq!(valid.sysctls.len(), 15);
    assert_eq!(valid.sysctls["ipv6.dad_transmits"], "3");
    assert_eq!(
        sysctl_path("ipv6.proxy_ndp", "net1").as_deref(),
        Some("/proc/sys/net/ipv6/conf/net1/proxy_ndp")
    );
}
