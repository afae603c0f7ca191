//! The contract's tests: every rejection asserts its exact text, because that text is what an
//! operator reads in a failed pod's events.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::{Value, json};

use super::*;

/// `fields` plus the mandatory `apiVersion`/`kind` (unless `fields` sets them itself).
fn object(fields: Value) -> Value {
    let mut value = json!({ "apiVersion": API_VERSION, "kind": KIND });
    let (Value::Object(base), Value::Object(extra)) = (&mut value, fields) else {
        panic!("test configs must be JSON objects");
    };
    base.extend(extra);
    value
}

/// Parse + validate one object and return every error as displayed to the operator.
fn problems(fields: Value) -> Vec<String> {
    let result = parse(&object(fields), "").and_then(|config| validate(&config));
    match result {
        Ok(valid) => panic!("expected errors, got {valid:?}"),
        Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
    }
}

fn valid(fields: Value) -> ValidConfig {
    let config = parse(&object(fields), "").expect("parses");
    validate(&config).expect("validates")
}

/// One `#[test]` per bad input, each asserting the exact messages in order.
macro_rules! rejects {
    ($($name:ident: $fields:tt => [$($message:expr),+ $(,)?];)*) => {
        $(
            #[test]
            fn $name() {
                assert_eq!(problems(json!($fields)), vec![$($message.to_owned()),+]);
            }
        )*
    };
}

rejects! {
    // apiVersion / kind
    reject_wrong_api_version: { "apiVersion": "knic.dev/v1" }
        => ["apiVersion: must be \"knic.dev/v1alpha1\", got \"knic.dev/v1\""];
    reject_wrong_kind: { "kind": "NetConfig" }
        => ["kind: must be \"NetworkConfig\", got \"NetConfig\""];
    reject_api_version_not_a_string: { "apiVersion": 1 }
        => ["apiVersion: expected a string, got number 1"];

    // unknown fields, everywhere
    reject_unknown_top_level_field: { "adresses": ["192.0.2.10/24"] }
        => ["adresses: unknown field"];
    reject_unknown_interface_field: { "interface": { "mtuu": 1500 } }
        => ["interface.mtuu: unknown field"];
    reject_unknown_route_field: {
        "routes": [
            { "destination": "0.0.0.0/0" },
            { "destination": "10.0.0.0/8", "gw": "192.0.2.1" }
        ]
    } => ["routes[1].gw: unknown field"];
    reject_unknown_vlan_field: { "vlan": { "id": 5, "pcp": 3 } }
        => ["vlan.pcp: unknown field"];
    reject_unknown_ipam_field: { "ipam": { "network": "pods", "pool": "a" } }
        => ["ipam.pool: unknown field"];

    // wrong JSON types
    reject_mtu_as_string: { "interface": { "mtu": "1500" } }
        => ["interface.mtu: expected an integer, got string \"1500\""];
    reject_mtu_as_float: { "interface": { "mtu": 1500.5 } }
        => ["interface.mtu: expected an integer, got number 1500.5"];
    reject_negative_mtu: { "interface": { "mtu": -1 } }
        => ["interface.mtu: must be between 68 and 65535, got -1"];
    reject_interface_not_an_object: { "interface": "eth0" }
        => ["interface: expected an object, got string \"eth0\""];
    reject_addresses_not_a_list: { "addresses": "192.0.2.10/24" }
        => ["addresses: expected a list of strings, got string \"192.0.2.10/24\""];
    reject_address_not_a_string: { "addresses": ["192.0.2.10/24", 7] }
        => ["addresses[1]: expected a string, got number 7"];
    reject_routes_not_a_list: { "routes": { "destination": "0.0.0.0/0" } }
        => ["routes: expected a list of routes, got an object"];
    reject_route_without_destination: { "routes": [{ "gateway": "192.0.2.1" }] }
        => ["routes[0].destination: required"];
    reject_metric_out_of_u32: { "routes": [{ "destination": "0.0.0.0/0", "metric": 4294967296u64 }] }
        => ["routes[0].metric: must be between 0 and 4294967295, got 4294967296"];
    reject_sysctl_value_as_number: { "sysctls": { "ipv4.rp_filter": 1 } }
        => ["sysctls[\"ipv4.rp_filter\"]: expected a string, got number 1 (quote it)"];
    reject_sysctls_as_list: { "sysctls": ["ipv4.rp_filter=1"] }
        => ["sysctls: expected a map of sysctl names to string values, got an array"];

    // interface.name
    reject_name_too_long: { "interface": { "name": "abcdefghijklmnop" } }
        => ["interface.name: interface name \"abcdefghijklmnop\" is 16 bytes; Linux allows at most 15"];
    reject_name_too_long_in_bytes: { "interface": { "name": "netééééééé" } }
        => ["interface.name: interface name \"netééééééé\" is 17 bytes; Linux allows at most 15"];
    reject_name_with_slash: { "interface": { "name": "net/1" } }
        => ["interface.name: interface name \"net/1\" must not contain '/'"];
    reject_name_with_colon: { "interface": { "name": "eth0:1" } }
        => ["interface.name: interface name \"eth0:1\" must not contain ':'"];
    reject_name_with_percent: { "interface": { "name": "net%d" } }
        => ["interface.name: interface name \"net%d\" must not contain '%'"];
    reject_name_with_space: { "interface": { "name": "net 1" } }
        => ["interface.name: interface name \"net 1\" must not contain whitespace"];
    reject_empty_name: { "interface": { "name": "" } }
        => ["interface.name: interface name must not be empty"];
    reject_dot_dot_name: { "interface": { "name": ".." } }
        => ["interface.name: interface name \"..\" is not allowed by Linux"];

    // interface.mtu
    reject_mtu_zero: { "interface": { "mtu": 0 } }
        => ["interface.mtu: must be between 68 and 65535, got 0"];
    reject_mtu_67: { "interface": { "mtu": 67 } }
        => ["interface.mtu: must be between 68 and 65535, got 67"];
    reject_mtu_70000: { "interface": { "mtu": 70000 } }
        => ["interface.mtu: must be between 68 and 65535, got 70000"];
    reject_ipv6_address_with_small_mtu: {
        "interface": { "mtu": 1000 },
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"]
    } => ["interface.mtu: 1000 is below 1280, the minimum MTU for IPv6 (addresses[1] is IPv6)"];

    // interface.hardwareAddress
    reject_multicast_mac: { "interface": { "hardwareAddress": "01:00:5E:00:00:01" } }
        => ["interface.hardwareAddress: 01:00:5e:00:00:01 is a multicast address; a unicast address is required (the low bit of the first octet must be 0)"];
    reject_broadcast_mac: { "interface": { "hardwareAddress": "ff:ff:ff:ff:ff:ff" } }
        => ["interface.hardwareAddress: ff:ff:ff:ff:ff:ff is a multicast address; a unicast address is required (the low bit of the first octet must be 0)"];
    reject_zero_mac: { "interface": { "hardwareAddress": "00:00:00:00:00:00" } }
        => ["interface.hardwareAddress: 00:00:00:00:00:00 is all zeros, which is not a usable address"];
    reject_short_mac: { "interface": { "hardwareAddress": "02:00:00:00:00" } }
        => ["interface.hardwareAddress: \"02:00:00:00:00\" is not a MAC address; expected six colon-separated hex pairs like 02:00:00:00:00:01"];
    reject_dashed_mac: { "interface": { "hardwareAddress": "02-00-00-00-00-01" } }
        => ["interface.hardwareAddress: \"02-00-00-00-00-01\" is not a MAC address; expected six colon-separated hex pairs like 02:00:00:00:00:01"];
    reject_mac_with_non_hex: { "interface": { "hardwareAddress": "02:00:00:00:00:0g" } }
        => ["interface.hardwareAddress: \"02:00:00:00:00:0g\" is not a MAC address; expected six colon-separated hex pairs like 02:00:00:00:00:01"];

    // addresses / ipam
    reject_address_without_prefix: { "addresses": ["192.0.2.10"] }
        => ["addresses[0]: 192.0.2.10 has no prefix length; CIDR form is required, e.g. 192.0.2.10/24"];
    reject_ipv6_address_without_prefix: { "addresses": ["2001:db8::10"] }
        => ["addresses[0]: 2001:db8::10 has no prefix length; CIDR form is required, e.g. 2001:db8::10/64"];
    reject_ipv4_prefix_33: { "addresses": ["192.0.2.10/33"] }
        => ["addresses[0]: prefix length 33 is out of range for IPv4 (0-32)"];
    reject_ipv6_prefix_129: { "addresses": ["2001:db8::10/129"] }
        => ["addresses[0]: prefix length 129 is out of range for IPv6 (0-128)"];
    reject_bad_ip: { "addresses": ["192.0.2.300/24"] }
        => ["addresses[0]: \"192.0.2.300\" is not a valid IPv4 or IPv6 address"];
    reject_ipv4_leading_zero_octet: { "addresses": ["192.0.02.10/24"] }
        => ["addresses[0]: \"192.0.02.10\" is not a valid IPv4 or IPv6 address"];
    reject_zone_id: { "addresses": ["fe80::1%eth0/64"] }
        => ["addresses[0]: \"fe80::1%eth0/64\" has a zone id (%...); zone ids are not allowed"];
    reject_prefix_with_leading_zero: { "addresses": ["192.0.2.10/024"] }
        => ["addresses[0]: prefix length \"024\" is not a decimal number without sign or leading zeros"];
    reject_duplicate_addresses: { "addresses": ["192.0.2.10/24", "2001:db8::1/64", "192.0.2.10/25"] }
        => ["addresses[2]: 192.0.2.10 is already listed at addresses[0]"];
    reject_unusable_addresses: { "addresses": ["0.0.0.0/0", "224.0.0.1/24", "::ffff:192.0.2.1/120"] }
        => [
            "addresses[0]: 0.0.0.0/0 is the unspecified address",
            "addresses[1]: 224.0.0.1/24 is a multicast address",
            "addresses[2]: ::ffff:192.0.2.1/120 is an IPv4-mapped IPv6 address; write the IPv4 address instead",
        ];
    reject_addresses_and_ipam: { "addresses": ["192.0.2.10/24"], "ipam": { "network": "pods" } }
        => ["ipam: cannot be combined with addresses; use static addresses or IPAM, not both"];
    reject_ipam_network_not_dns_label: { "ipam": { "network": "Pod_Net" } }
        => ["ipam.network: \"Pod_Net\" is not a DNS label (1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)"];
    reject_ipam_without_network: { "ipam": {} }
        => ["ipam.network: required"];

    // routes
    reject_destination_with_host_bits: { "routes": [{ "destination": "10.1.2.3/8" }] }
        => ["routes[0].destination: 10.1.2.3/8 has host bits set; did you mean 10.0.0.0/8?"];
    reject_destination_without_prefix: { "routes": [{ "destination": "10.0.0.0" }] }
        => ["routes[0].destination: 10.0.0.0 has no prefix length; CIDR form is required, e.g. 10.0.0.0/24"];
    reject_gateway_family_mismatch: {
        "addresses": ["192.0.2.10/24"],
        "routes": [{ "destination": "0.0.0.0/0", "gateway": "2001:db8::1" }]
    } => ["routes[0].gateway: 2001:db8::1 is IPv6 but destination 0.0.0.0/0 is IPv4"];
    reject_gateway_outside_subnets: {
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
        "routes": [
            { "destination": "::/0", "gateway": "2001:db8::1" },
            { "destination": "0.0.0.0/0", "gateway": "203.0.113.1" }
        ]
    } => ["routes[1].gateway: 203.0.113.1 is not inside any address's subnet"];
    reject_ipv6_gateway_with_only_ipv4_addresses: {
        "addresses": ["192.0.2.10/24"],
        "routes": [{ "destination": "::/0", "gateway": "2001:db8::1" }]
    } => ["routes[0].gateway: 2001:db8::1 is not inside any address's subnet"];
    reject_gateway_is_own_address: {
        "addresses": ["192.0.2.10/24"],
        "routes": [{ "destination": "0.0.0.0/0", "gateway": "192.0.2.10" }]
    } => ["routes[0].gateway: 192.0.2.10 is one of this interface's own addresses"];
    reject_gateway_with_prefix: { "routes": [{ "destination": "0.0.0.0/0", "gateway": "192.0.2.1/24" }] }
        => ["routes[0].gateway: \"192.0.2.1/24\" is not an IP address (write the address without a prefix length)"];
    reject_unspecified_gateway: { "routes": [{ "destination": "0.0.0.0/0", "gateway": "0.0.0.0" }] }
        => ["routes[0].gateway: 0.0.0.0 is not a unicast address"];
    reject_source_not_an_address: {
        "addresses": ["192.0.2.10/24"],
        "routes": [{ "destination": "198.51.100.0/24", "gateway": "192.0.2.1", "source": "192.0.2.11" }]
    } => ["routes[0].source: 192.0.2.11 is not one of this interface's static addresses"];
    reject_source_family_mismatch: {
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
        "routes": [{ "destination": "0.0.0.0/0", "source": "2001:db8::10" }]
    } => ["routes[0].source: 2001:db8::10 is IPv6 but destination 0.0.0.0/0 is IPv4"];
    reject_source_with_ipam: {
        "ipam": { "network": "pods" },
        "routes": [{ "destination": "0.0.0.0/0", "source": "192.0.2.10" }]
    } => ["routes[0].source: 192.0.2.10 is not one of this interface's static addresses"];
    reject_duplicate_routes: {
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
        "routes": [
            { "destination": "0.0.0.0/0", "gateway": "192.0.2.1" },
            { "destination": "::/0", "metric": 1024 },
            { "destination": "::/0" },
            { "destination": "0.0.0.0/0", "gateway": "192.0.2.254", "metric": 0, "table": 254 }
        ]
    } => [
        "routes[2]: same destination, table and metric as routes[1]",
        "routes[3]: same destination, table and metric as routes[0]",
    ];
    reject_reserved_tables: {
        "routes": [
            { "destination": "10.0.0.0/8", "table": 0 },
            { "destination": "10.0.0.0/8", "table": 252 },
            { "destination": "10.0.0.0/8", "table": 253 },
            { "destination": "10.0.0.0/8", "table": 255 }
        ]
    } => [
        "routes[0].table: 0 is not a table id; omit table (or use 254) for the main table",
        "routes[1].table: 252 is reserved for the kernel's \"compat\" table; use 254 (main) or an id of your own",
        "routes[2].table: 253 is reserved for the kernel's \"default\" table; use 254 (main) or an id of your own",
        "routes[3].table: 255 is reserved for the kernel's \"local\" table; use 254 (main) or an id of your own",
    ];

    // vlan
    reject_vlan_zero: { "vlan": { "id": 0 } }
        => ["vlan.id: must be between 1 and 4094, got 0"];
    reject_vlan_4095: { "vlan": { "id": 4095 } }
        => ["vlan.id: must be between 1 and 4094, got 4095"];
    reject_vlan_70000: { "vlan": { "id": 70000 } }
        => ["vlan.id: must be between 1 and 4094, got 70000"];
    reject_vlan_without_id: { "vlan": {} }
        => ["vlan.id: required"];

    // sysctls
    reject_unknown_sysctl: { "sysctls": { "ipv4.ip_forward": "1" } }
        => ["sysctls[\"ipv4.ip_forward\"]: unknown sysctl; allowed: ipv4.arp_announce, ipv4.arp_ignore, ipv4.forwarding, ipv4.proxy_arp, ipv4.rp_filter, ipv6.accept_ra, ipv6.autoconf, ipv6.disable_ipv6"];
    reject_long_form_sysctl: { "sysctls": { "net.ipv4.conf.net1.rp_filter": "1" } }
        => ["sysctls[\"net.ipv4.conf.net1.rp_filter\"]: unknown sysctl; allowed: ipv4.arp_announce, ipv4.arp_ignore, ipv4.forwarding, ipv4.proxy_arp, ipv4.rp_filter, ipv6.accept_ra, ipv6.autoconf, ipv6.disable_ipv6"];
    reject_bad_sysctl_values: {
        "sysctls": {
            "ipv4.rp_filter": "3",
            "ipv4.arp_ignore": "5",
            "ipv6.accept_ra": "-1",
            "ipv6.autoconf": "yes"
        }
    } => [
        "sysctls[\"ipv4.arp_ignore\"]: \"5\" is not allowed; allowed values: 0, 1, 2, 3, 8",
        "sysctls[\"ipv4.rp_filter\"]: \"3\" is not allowed; allowed values: 0, 1, 2",
        "sysctls[\"ipv6.accept_ra\"]: \"-1\" is not allowed; allowed values: 0, 1, 2",
        "sysctls[\"ipv6.autoconf\"]: \"yes\" is not allowed; allowed values: 0, 1",
    ];
    reject_disable_ipv6_with_ipv6_address: {
        "addresses": ["2001:db8::10/64"],
        "sysctls": { "ipv6.disable_ipv6": "1" }
    } => ["sysctls[\"ipv6.disable_ipv6\"]: \"1\" disables IPv6, but addresses[0] is IPv6"];
}

#[test]
fn parse_requires_api_version_and_kind() {
    let errors = parse(&json!({}), "").expect_err("must fail");
    assert_eq!(
        errors.to_string(),
        "apiVersion: required; must be \"knic.dev/v1alpha1\"; kind: required; must be \"NetworkConfig\""
    );
    // `null` is "not set", so it is just as missing.
    let errors = parse(&json!({ "apiVersion": null, "kind": KIND }), "").expect_err("must fail");
    assert_eq!(
        errors.to_string(),
        "apiVersion: required; must be \"knic.dev/v1alpha1\""
    );
}

#[test]
fn parse_rejects_non_object_with_prefix_as_path() {
    let errors = parse(&json!([1]), "config[0].parameters").expect_err("must fail");
    assert_eq!(
        errors.to_string(),
        "config[0].parameters: expected an object, got an array"
    );
    let errors = parse(&json!("x"), "").expect_err("must fail");
    assert_eq!(errors.to_string(), "expected an object, got string \"x\"");
}

#[test]
fn parse_prefixes_every_path() {
    let value = json!({
        "apiVersion": "knic.dev/v1beta1",
        "kind": KIND,
        "interface": { "mtuu": 1500, "name": 5 },
        "routes": [{ "destination": "0.0.0.0/0", "tabel": 100 }],
        "vlan": { "id": "7" },
        "sysctls": { "ipv4.rp_filter": true }
    });
    let errors = parse(&value, "config[1].parameters").expect_err("must fail");
    let paths: Vec<&str> = errors.0.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "config[1].parameters.apiVersion",
            "config[1].parameters.interface.mtuu",
            "config[1].parameters.interface.name",
            "config[1].parameters.routes[0].tabel",
            "config[1].parameters.vlan.id",
            "config[1].parameters.sysctls[\"ipv4.rp_filter\"]",
        ]
    );
    assert_eq!(
        errors.to_string(),
        "config[1].parameters.apiVersion: must be \"knic.dev/v1alpha1\", got \"knic.dev/v1beta1\"; \
         config[1].parameters.interface.mtuu: unknown field; \
         config[1].parameters.interface.name: expected a string, got number 5; \
         config[1].parameters.routes[0].tabel: unknown field; \
         config[1].parameters.vlan.id: expected an integer, got string \"7\"; \
         config[1].parameters.sysctls[\"ipv4.rp_filter\"]: expected a string, got boolean true"
    );
}

#[test]
fn validate_reports_every_error_at_once() {
    let got = problems(json!({
        "interface": { "name": "a/b", "mtu": 9001000, "hardwareAddress": "00:00:00:00:00:00" },
        "addresses": ["192.0.2.10", "2001:db8::10/64"],
        "ipam": { "network": "pods" },
        "routes": [
            { "destination": "10.0.0.1/8", "gateway": "10.0.0.1", "table": 255 },
            { "destination": "0.0.0.0/0", "gateway": "192.0.2.1" }
        ],
        "vlan": { "id": 4095 },
        "sysctls": { "ipv4.rp_filter": "9", "ipv4.bogus": "1" }
    }));
    assert_eq!(
        got,
        [
            "interface.name: interface name \"a/b\" must not contain '/'",
            "interface.mtu: must be between 68 and 65535, got 9001000",
            "interface.hardwareAddress: 00:00:00:00:00:00 is all zeros, which is not a usable address",
            "addresses[0]: 192.0.2.10 has no prefix length; CIDR form is required, e.g. 192.0.2.10/24",
            "ipam: cannot be combined with addresses; use static addresses or IPAM, not both",
            "routes[0].destination: 10.0.0.1/8 has host bits set; did you mean 10.0.0.0/8?",
            "routes[0].table: 255 is reserved for the kernel's \"local\" table; use 254 (main) or an id of your own",
            "vlan.id: must be between 1 and 4094, got 4095",
            "sysctls[\"ipv4.bogus\"]: unknown sysctl; allowed: ipv4.arp_announce, ipv4.arp_ignore, ipv4.forwarding, ipv4.proxy_arp, ipv4.rp_filter, ipv6.accept_ra, ipv6.autoconf, ipv6.disable_ipv6",
            "sysctls[\"ipv4.rp_filter\"]: \"9\" is not allowed; allowed values: 0, 1, 2",
        ]
    );
}

#[test]
fn validate_checks_identity_only_when_present() {
    assert_eq!(
        validate(&NetworkConfig::default()),
        Ok(ValidConfig::default())
    );
    let config = NetworkConfig {
        kind: Some("Other".to_owned()),
        ..NetworkConfig::default()
    };
    let errors = validate(&config).expect_err("must fail");
    assert_eq!(
        errors.to_string(),
        "kind: must be \"NetworkConfig\", got \"Other\""
    );
}

fn full_config() -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "interface": { "name": "data0", "mtu": 9000, "hardwareAddress": "02:AB:cd:00:00:01" },
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
        "routes": [
            { "destination": "0.0.0.0/0", "gateway": "192.0.2.1", "metric": 100 },
            { "destination": "198.51.100.0/24", "gateway": "192.0.2.254", "source": "192.0.2.10", "table": 100 },
            { "destination": "::/0", "gateway": "fe80::1" },
            { "destination": "2001:db8:1::/48", "gateway": "2001:db8::1", "source": "2001:db8::10", "table": 254 },
            { "destination": "203.0.113.0/24" }
        ],
        "vlan": { "id": 100 },
        "sysctls": { "ipv4.rp_filter": "2", "ipv4.arp_ignore": "01", "ipv6.accept_ra": "0" },
        "bandwidth": { "egress": "2G", "burst": "256Ki" }
    })
}

fn cidr(text: &str) -> Cidr {
    text.parse().expect("valid CIDR")
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("valid IP")
}

#[test]
fn full_config_validates_and_round_trips() {
    let wire = full_config();
    let config = parse(&wire, "config[0].parameters").expect("parses");
    // The hand-written parser accepts exactly what the derived Deserialize accepts...
    let derived: NetworkConfig = serde_json::from_value(wire.clone()).expect("derive parses");
    assert_eq!(config, derived);
    // ...and the wire form serializes back to the same JSON.
    assert_eq!(serde_json::to_value(&config).expect("serializes"), wire);

    let valid = validate(&config).expect("validates");
    let expected = ValidConfig {
        interface_name: Some("data0".to_owned()),
        mtu: Some(9000),
        hardware_address: Some([0x02, 0xab, 0xcd, 0, 0, 1]),
        addresses: vec![cidr("192.0.2.10/24"), cidr("2001:db8::10/64")],
        ipam_network: None,
        routes: vec![
            Route {
                destination: cidr("0.0.0.0/0"),
                gateway: Some(ip("192.0.2.1")),
                source: None,
                metric: Some(100),
                table: None,
            },
            Route {
                destination: cidr("198.51.100.0/24"),
                gateway: Some(ip("192.0.2.254")),
                source: Some(ip("192.0.2.10")),
                metric: None,
                table: Some(100),
            },
            Route {
                destination: cidr("::/0"),
                gateway: Some(ip("fe80::1")),
                source: None,
                metric: None,
                table: None,
            },
            Route {
                destination: cidr("2001:db8:1::/48"),
                gateway: Some(ip("2001:db8::1")),
                source: Some(ip("2001:db8::10")),
                metric: None,
                table: Some(254),
            },
            Route {
                destination: cidr("203.0.113.0/24"),
                gateway: None,
                source: None,
                metric: None,
                table: None,
            },
        ],
        vlan: Some(100),
        sysctls: BTreeMap::from([
            ("ipv4.arp_ignore".to_owned(), "1".to_owned()),
            ("ipv4.rp_filter".to_owned(), "2".to_owned()),
            ("ipv6.accept_ra".to_owned(), "0".to_owned()),
        ]),
        vf: None,
        child: None,
        device_mode: DeviceMode::Netdev,
        bandwidth: Some(BandwidthSettings {
            egress: Some(2_000_000_000),
            burst: Some(262_144),
        }),
    };
    assert_eq!(valid, expected);

    // The checkpoint form: camelCase, readable MAC and CIDRs, and lossless.
    let stored = serde_json::to_value(&valid).expect("serializes");
    assert_eq!(stored["interfaceName"], "data0");
    assert_eq!(stored["hardwareAddress"], "02:ab:cd:00:00:01");
    assert_eq!(
        stored["addresses"],
        json!(["192.0.2.10/24", "2001:db8::10/64"])
    );
    assert_eq!(
        stored["routes"][1],
        json!({ "destination": "198.51.100.0/24", "gateway": "192.0.2.254", "source": "192.0.2.10", "table": 100 })
    );
    let restored: ValidConfig = serde_json::from_value(stored).expect("deserializes");
    assert_eq!(restored, valid);
    let empty: ValidConfig = serde_json::from_value(json!({})).expect("deserializes");
    assert_eq!(empty, ValidConfig::default());
}

#[test]
fn derived_deserialize_also_denies_unknown_fields() {
    let mut wire = full_config();
    wire["interface"]["mtuu"] = json!(1);
    assert!(serde_json::from_value::<NetworkConfig>(wire.clone()).is_err());
    assert_eq!(
        parse(&wire, "").expect_err("must fail").to_string(),
        "interface.mtuu: unknown field"
    );
}

#[test]
fn null_fields_are_unset() {
    let config = parse(
        &object(
            json!({ "interface": { "name": null, "mtu": 1500 }, "vlan": null, "routes": null }),
        ),
        "",
    )
    .expect("parses");
    assert_eq!(
        config.interface,
        Some(InterfaceConfig {
            mtu: Some(1500),
            ..InterfaceConfig::default()
        })
    );
    assert_eq!((config.vlan, config.routes), (None, None));
}

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
fn merge_layers_class_then_claim() {
    let class = parse(
        &object(json!({
            "interface": { "mtu": 9000, "name": "data0" },
            "ipam": { "network": "pods" },
            "routes": [{ "destination": "10.0.0.0/8" }],
            "vlan": { "id": 10 },
            "sysctls": { "ipv4.rp_filter": "2", "ipv4.arp_ignore": "1" }
        })),
        "config[0].parameters",
    )
    .expect("class parses");
    let claim = parse(
        &object(json!({
            "interface": { "name": "fast0", "hardwareAddress": "02:00:00:00:00:01" },
            "addresses": ["192.0.2.10/24"],
            "sysctls": { "ipv4.rp_filter": "0", "ipv6.accept_ra": "0" }
        })),
        "config[1].parameters",
    )
    .expect("claim parses");
    let merged = merge(&[class.clone(), claim]);
    let expected = parse(
        &object(json!({
            "interface": { "name": "fast0", "mtu": 9000, "hardwareAddress": "02:00:00:00:00:01" },
            // The claim's static addresses replace the class's IPAM as one choice.
            "addresses": ["192.0.2.10/24"],
            "routes": [{ "destination": "10.0.0.0/8" }],
            "vlan": { "id": 10 },
            "sysctls": { "ipv4.rp_filter": "0", "ipv4.arp_ignore": "1", "ipv6.accept_ra": "0" }
        })),
        "",
    )
    .expect("expected parses");
    assert_eq!(merged, expected);
    validate(&merged).expect("merged config validates");

    // A later list replaces an earlier one, even with an empty list; `addresses: []` also
    // switches a class's IPAM off.
    let clear = NetworkConfig {
        addresses: Some(Vec::new()),
        routes: Some(Vec::new()),
        ..NetworkConfig::default()
    };
    let merged = merge(&[class.clone(), clear]);
    assert_eq!((merged.addresses, merged.ipam), (Some(Vec::new()), None));
    assert_eq!(merged.routes, Some(Vec::new()));
    // Unset fields in a later layer leave earlier values alone.
    assert_eq!(merge(&[class.clone(), NetworkConfig::default()]), class);
    assert_eq!(merge(&[]), NetworkConfig::default());
}

#[test]
fn merge_keeps_both_when_one_layer_sets_addresses_and_ipam() {
    let layer = NetworkConfig {
        addresses: Some(vec!["192.0.2.10/24".to_owned()]),
        ipam: Some(IpamConfig {
            network: "pods".to_owned(),
        }),
        ..NetworkConfig::default()
    };
    let merged = merge(&[NetworkConfig::default(), layer.clone()]);
    assert_eq!(merged, layer);
    assert!(validate(&merged).is_err());
}

#[test]
fn cidr_parse_and_display() {
    for text in [
        "192.0.2.10/24",
        "0.0.0.0/0",
        "10.0.0.1/32",
        "2001:db8::10/64",
        "::/0",
        "2001:db8::1/128",
        "::ffff:192.0.2.1/128",
    ] {
        assert_eq!(cidr(text).to_string(), text);
    }
    // Display is canonical (RFC 5952 for IPv6).
    assert_eq!(cidr("2001:DB8:0:0::1/64").to_string(), "2001:db8::1/64");
    let c = cidr("192.0.2.10/24");
    assert_eq!(c.addr, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10)));
    assert_eq!(c.prefix_len, 24);
    assert!(c.is_ipv4() && !c.is_ipv6());
    assert_eq!(c.max_prefix_len(), 32);
    assert_eq!(cidr("::/0").max_prefix_len(), 128);
}

#[test]
fn cidr_parse_errors() {
    let cases = [
        (
            "",
            "empty string is not a CIDR; write ADDRESS/PREFIX-LENGTH, e.g. 192.0.2.10/24",
        ),
        (
            "1.2.3.4",
            "1.2.3.4 has no prefix length; CIDR form is required, e.g. 1.2.3.4/24",
        ),
        (
            "pods",
            "\"pods\" is not in CIDR form (ADDRESS/PREFIX-LENGTH, e.g. 192.0.2.10/24)",
        ),
        (
            "1.2.3.4/",
            "prefix length \"\" is not a decimal number without sign or leading zeros",
        ),
        (
            "1.2.3.4/+8",
            "prefix length \"+8\" is not a decimal number without sign or leading zeros",
        ),
        (
            "1.2.3.4/08",
            "prefix length \"08\" is not a decimal number without sign or leading zeros",
        ),
        (
            "1.2.3.4/24/1",
            "prefix length \"24/1\" is not a decimal number without sign or leading zeros",
        ),
        (
            "1.2.3.4/ 24",
            "prefix length \" 24\" is not a decimal number without sign or leading zeros",
        ),
        (
            "1.2.3.4/300",
            "prefix length 300 is out of range for IPv4 (0-32)",
        ),
        (
            "1.2.3.4/99999999999999999999",
            "prefix length 99999999999999999999 is out of range for IPv4 (0-32)",
        ),
        (
            "::/129",
            "prefix length 129 is out of range for IPv6 (0-128)",
        ),
        ("[::1]/64", "\"[::1]\" is not a valid IPv4 or IPv6 address"),
        (
            "010.0.0.1/8",
            "\"010.0.0.1\" is not a valid IPv4 or IPv6 address",
        ),
        (
            " 1.2.3.4/8",
            "\" 1.2.3.4\" is not a valid IPv4 or IPv6 address",
        ),
        (
            "fe80::1%2/64",
            "\"fe80::1%2/64\" has a zone id (%...); zone ids are not allowed",
        ),
    ];
    for (text, message) in cases {
        let error = text.parse::<Cidr>().expect_err(text);
        assert_eq!(error.to_string(), message, "for {text:?}");
    }
    assert_eq!(
        Cidr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 33)
            .expect_err("too long")
            .to_string(),
        "prefix length 33 is out of range for IPv4 (0-32)"
    );
    assert_eq!(
        Cidr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
        Ok(cidr("::1/128"))
    );
}

#[test]
fn cidr_network_and_contains() {
    // /0 holds its whole family and nothing of the other.
    let any4 = cidr("0.0.0.0/0");
    assert!(any4.contains(ip("255.255.255.255")) && any4.contains(ip("0.0.0.0")));
    assert!(!any4.contains(ip("::")));
    assert_eq!(cidr("192.0.2.10/0").network(), any4);
    let any6 = cidr("::/0");
    assert!(any6.contains(ip("ffff::1")) && !any6.contains(ip("192.0.2.1")));
    assert_eq!(cidr("2001:db8::1/0").network(), any6);
    // IPv4-mapped addresses stay IPv6: never inside an IPv4 subnet.
    assert!(!any4.contains(ip("::ffff:192.0.2.1")));

    let c24 = cidr("192.0.2.10/24");
    assert_eq!(c24.network(), cidr("192.0.2.0/24"));
    assert!(c24.contains(ip("192.0.2.0")) && c24.contains(ip("192.0.2.255")));
    assert!(!c24.contains(ip("192.0.3.0")));

    let c31 = cidr("192.0.2.7/31");
    assert_eq!(c31.network(), cidr("192.0.2.6/31"));
    assert!(c31.contains(ip("192.0.2.6")) && c31.contains(ip("192.0.2.7")));
    assert!(!c31.contains(ip("192.0.2.8")) && !c31.contains(ip("192.0.2.5")));

    let c32 = cidr("192.0.2.7/32");
    assert_eq!(c32.network(), c32);
    assert!(c32.contains(ip("192.0.2.7")) && !c32.contains(ip("192.0.2.6")));

    let c64 = cidr("2001:db8::10/64");
    assert_eq!(c64.network(), cidr("2001:db8::/64"));
    assert!(c64.contains(ip("2001:db8::ffff:ffff:ffff:ffff")));
    assert!(!c64.contains(ip("2001:db8:0:1::")));

    let c127 = cidr("2001:db8::1/127");
    assert_eq!(c127.network(), cidr("2001:db8::/127"));
    assert!(c127.contains(ip("2001:db8::")) && !c127.contains(ip("2001:db8::2")));

    let c128 = cidr("2001:db8::1/128");
    assert_eq!(c128.network(), c128);
    assert!(c128.contains(ip("2001:db8::1")) && !c128.contains(ip("2001:db8::")));

    // A hand-built out-of-range prefix is clamped, never a panic.
    let wild = Cidr {
        addr: ip("192.0.2.1"),
        prefix_len: 200,
    };
    assert_eq!(wild.network(), cidr("192.0.2.1/32"));
    assert!(wild.contains(ip("192.0.2.1")) && !wild.contains(ip("192.0.2.2")));
}

#[test]
fn cidr_serde_and_order() {
    let c = cidr("2001:db8::10/64");
    assert_eq!(
        serde_json::to_value(c).expect("serializes"),
        json!("2001:db8::10/64")
    );
    let back: Cidr = serde_json::from_value(json!("2001:db8::10/64")).expect("deserializes");
    assert_eq!(back, c);
    let error = serde_json::from_value::<Cidr>(json!("10.0.0.1")).expect_err("no prefix");
    assert_eq!(
        error.to_string(),
        "10.0.0.1 has no prefix length; CIDR form is required, e.g. 10.0.0.1/24"
    );
    let mut list = vec![
        cidr("10.0.0.2/8"),
        cidr("::1/128"),
        cidr("10.0.0.1/16"),
        cidr("10.0.0.1/8"),
    ];
    list.sort();
    assert_eq!(
        list,
        [
            cidr("10.0.0.1/8"),
            cidr("10.0.0.1/16"),
            cidr("10.0.0.2/8"),
            cidr("::1/128")
        ]
    );
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
fn errors_display() {
    let errors = ConfigErrors(vec![
        FieldError::new("a", "x"),
        FieldError::new("", "whole object"),
        FieldError::new("b[0].c", "y"),
    ]);
    assert_eq!(errors.to_string(), "a: x; whole object; b[0].c: y");
}

// Issue 11: validation that matches the kernel. Every class of address the kernel refuses, or
// accepts but cannot make work, is refused with its rule, at the path it was written at.
rejects! {
    // addresses: special classes
    reject_loopback_addresses: { "addresses": ["127.0.0.1/8", "::1/128"] }
        => [
            "addresses[0]: 127.0.0.1/8 is a loopback address, which never leaves a host",
            "addresses[1]: ::1/128 is a loopback address, which never leaves a host",
        ];
    reject_ipv6_unspecified_and_multicast_addresses: { "addresses": ["::/64", "ff02::1/64"] }
        => [
            "addresses[0]: ::/64 is the unspecified address",
            "addresses[1]: ff02::1/64 is a multicast address",
        ];
    reject_broadcast_and_class_e_addresses: { "addresses": ["255.255.255.255/32", "240.0.0.1/24", "254.1.2.3/32"] }
        => [
            "addresses[0]: 255.255.255.255/32 is the limited broadcast address",
            "addresses[1]: 240.0.0.1/24 is a reserved class E address (240.0.0.0/4), which hosts and routers drop",
            "addresses[2]: 254.1.2.3/32 is a reserved class E address (240.0.0.0/4), which hosts and routers drop",
        ];
    reject_ipv4_mapped_address_slash_96: { "addresses": ["::ffff:0:1/96"] }
        => ["addresses[0]: ::ffff:0.0.0.1/96 is an IPv4-mapped IPv6 address; write the IPv4 address instead"];

    // addresses: the subnet's own reserved addresses
    reject_network_and_broadcast_addresses: {
        "addresses": ["192.0.2.0/24", "198.51.100.7/30", "203.0.113.128/25", "2001:db8::/64"]
    } => [
        "addresses[0]: 192.0.2.0 is the network address of 192.0.2.0/24",
        "addresses[1]: 198.51.100.7 is the broadcast address of 198.51.100.4/30",
        "addresses[2]: 203.0.113.128 is the network address of 203.0.113.128/25",
        "addresses[3]: 2001:db8:: is the subnet-router anycast address of 2001:db8::/64",
    ];

    // routes[].gateway: address classes
    reject_special_gateways: {
        "routes": [
            { "destination": "10.0.0.0/8", "gateway": "127.0.0.1" },
            { "destination": "10.1.0.0/16", "gateway": "255.255.255.255" },
            { "destination": "10.2.0.0/16", "gateway": "240.0.0.1" },
            { "destination": "10.3.0.0/16", "gateway": "239.1.1.1" },
            { "destination": "::/0", "gateway": "::1" },
            { "destination": "2001:db8:1::/48", "gateway": "::ffff:192.0.2.1" },
            { "destination": "2001:db8:2::/48", "gateway": "ff02::2" },
            { "destination": "2001:db8:3::/48", "gateway": "::" }
        ]
    } => [
        "routes[0].gateway: 127.0.0.1 is a loopback address, which never leaves a host",
        "routes[1].gateway: 255.255.255.255 is not a unicast address",
        "routes[2].gateway: 240.0.0.1 is a reserved class E address (240.0.0.0/4), which hosts and routers drop",
        "routes[3].gateway: 239.1.1.1 is not a unicast address",
        "routes[4].gateway: ::1 is a loopback address, which never leaves a host",
        "routes[5].gateway: ::ffff:192.0.2.1 is an IPv4-mapped IPv6 address; write the IPv4 address instead",
        "routes[6].gateway: ff02::2 is not a unicast address",
        "routes[7].gateway: :: is not a unicast address",
    ];

    // routes[].gateway: reserved addresses of the subnet it is on
    reject_gateway_reserved_in_subnet: {
        "addresses": ["192.0.2.10/24", "198.51.100.10/25", "2001:db8::10/64"],
        "routes": [
            { "destination": "10.0.0.0/8", "gateway": "192.0.2.255" },
            { "destination": "10.1.0.0/16", "gateway": "192.0.2.0" },
            { "destination": "10.2.0.0/16", "gateway": "198.51.100.127" },
            { "destination": "::/0", "gateway": "2001:db8::" }
        ]
    } => [
        "routes[0].gateway: 192.0.2.255 is the broadcast address of 192.0.2.0/24",
        "routes[1].gateway: 192.0.2.0 is the network address of 192.0.2.0/24",
        "routes[2].gateway: 198.51.100.127 is the broadcast address of 198.51.100.0/25",
        "routes[3].gateway: 2001:db8:: is the subnet-router anycast address of 2001:db8::/64",
    ];

    // routes[].destination
    reject_loopback_and_mapped_destinations: {
        "routes": [
            { "destination": "127.0.0.0/8" },
            { "destination": "127.0.0.1/32" },
            { "destination": "::1/128" },
            { "destination": "::ffff:0:0/96" },
            { "destination": "::ffff:192.0.2.0/120" }
        ]
    } => [
        "routes[0].destination: 127.0.0.0/8 is a loopback range; the kernel's local routes always take it, so this route would never be used",
        "routes[1].destination: 127.0.0.1/32 is a loopback range; the kernel's local routes always take it, so this route would never be used",
        "routes[2].destination: ::1/128 is a loopback range; the kernel's local routes always take it, so this route would never be used",
        "routes[3].destination: ::ffff:0.0.0.0/96 is an IPv4-mapped IPv6 range, which the kernel sends as IPv4; write an IPv4 route instead",
        "routes[4].destination: ::ffff:192.0.2.0/120 is an IPv4-mapped IPv6 range, which the kernel sends as IPv4; write an IPv4 route instead",
    ];

    // interface.name: invisible characters
    reject_name_with_zero_width_space: { "interface": { "name": "net\u{200b}1" } }
        => ["interface.name: interface name \"net\\u{200b}1\" must not contain zero-width characters (U+200B found)"];
    reject_name_with_byte_order_mark: { "interface": { "name": "\u{feff}net1" } }
        => ["interface.name: interface name \"\\u{feff}net1\" must not contain zero-width characters (U+FEFF found)"];
    reject_name_with_right_to_left_override: { "interface": { "name": "net\u{202e}1" } }
        => ["interface.name: interface name \"net\\u{202e}1\" must not contain bidirectional control characters (U+202E found)"];
    reject_name_with_arabic_letter_mark: { "interface": { "name": "net\u{61c}" } }
        => ["interface.name: interface name \"net\\u{61c}\" must not contain bidirectional control characters (U+061C found)"];
    reject_name_with_escape: { "interface": { "name": "net\u{1b}[0m" } }
        => ["interface.name: interface name \"net\\u{1b}[0m\" must not contain control characters"];
}

#[test]
fn interface_names_refuse_every_invisible_character() {
    let zero_width = ['\u{200B}', '\u{200C}', '\u{200D}', '\u{2060}', '\u{FEFF}'];
    let bidi = [
        '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}',
        '\u{2068}', '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}',
    ];
    for (chars, rule) in [
        (&zero_width[..], "zero-width characters"),
        (&bidi[..], "bidirectional control characters"),
    ] {
        for c in chars {
            let name = format!("n{c}1");
            assert_eq!(
                check_interface_name(&name).map_err(|e| e.to_string()),
                Err(format!(
                    "interface name {name:?} must not contain {rule} (U+{:04X} found)",
                    u32::from(*c)
                )),
            );
        }
    }
    // Visible non-ASCII letters and their neighbours in the code charts stay allowed.
    for name in ["netä", "net\u{2010}1", "net\u{2070}"] {
        assert_eq!(
            check_interface_name(name).map_err(|e| e.to_string()),
            Ok(())
        );
    }
}

#[test]
fn kernel_edge_values_that_accept() {
    // RFC 3021 /31s have no network or broadcast address; /32s and /127s neither.
    let v = valid(json!({
        "addresses": ["192.0.2.0/31", "198.51.100.1/31", "203.0.113.7/32", "2001:db8::1/64", "2001:db8:1::/127", "2001:db8:2::/128"],
        "routes": [
            { "destination": "0.0.0.0/0", "gateway": "192.0.2.1" },
            { "destination": "::/0", "gateway": "2001:db8::ffff:ffff:ffff:ffff" },
            // Split defaults contain special ranges but are not inside one.
            { "destination": "0.0.0.0/1", "gateway": "198.51.100.0" },
            { "destination": "::/1", "gateway": "2001:db8:1::1" },
            // Multicast and class E destinations are real routes.
            { "destination": "224.0.0.0/4" },
            { "destination": "240.0.0.0/4" },
            { "destination": "ff00::/8" }
        ]
    }));
    assert_eq!(v.addresses.len(), 6);
    assert_eq!(v.routes.len(), 7);
    // An IPv4 address next to the network and broadcast addresses, IPv6's last address (no
    // broadcast), and the last unicast addresses below the special ranges.
    let v = valid(json!({
        "addresses": ["192.0.2.1/24", "192.0.2.254/24", "2001:db8::ffff:ffff:ffff:ffff/64", "126.255.255.254/8", "223.255.255.254/8", "::2/128"]
    }));
    assert_eq!(v.addresses.len(), 6);
    // Without static addresses the default routes stand alone.
    let v = valid(json!({
        "routes": [{ "destination": "0.0.0.0/0" }, { "destination": "::/0" }]
    }));
    assert_eq!(v.routes.len(), 2);
}

#[test]
fn a_flood_of_problems_is_shown_bounded() {
    let errors = ConfigErrors(
        (0..25)
            .map(|i| FieldError {
                path: format!("addresses[{i}]"),
                message: "bad".into(),
            })
            .collect(),
    );
    let text = errors.to_string();
    assert!(
        text.starts_with("addresses[0]: bad; addresses[1]: bad;"),
        "{text}"
    );
    assert!(
        text.contains("addresses[19]: bad; … and 5 more problems"),
        "{text}"
    );
    assert!(!text.contains("addresses[20]"), "{text}");
}

// The SR-IOV `vf` block (issue 12), in a file of its own: this one is long enough.
mod vf;

// The `bandwidth` block (issue 13).
mod bandwidth;
