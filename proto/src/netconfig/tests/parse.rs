//! Parsing, validation as a whole, the round trip through the wire form, merging layers, and
//! how the error list reads.

use super::*;

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
            "sysctls[\"ipv4.bogus\"]: unknown sysctl; allowed: ipv4.arp_accept, ipv4.arp_announce, ipv4.arp_evict_nocarrier, ipv4.arp_filter, ipv4.arp_ignore, ipv4.arp_notify, ipv4.drop_gratuitous_arp, ipv4.drop_unicast_in_l2_multicast, ipv4.forwarding, ipv4.proxy_arp, ipv4.proxy_arp_pvlan, ipv4.rp_filter, ipv6.accept_dad, ipv6.accept_ra, ipv6.accept_untracked_na, ipv6.autoconf, ipv6.dad_transmits, ipv6.disable_ipv6, ipv6.drop_unicast_in_l2_multicast, ipv6.drop_unsolicited_na, ipv6.ndisc_evict_nocarrier, ipv6.ndisc_notify, ipv6.proxy_ndp",
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
        routing: RoutingSettings::default(),
        ethtool: None,
        neighbors: vec![],
        offload_sizes: OffloadSizes::default(),
        addressing: Default::default(),
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
fn errors_display() {
    let errors = ConfigErrors(vec![
        FieldError::new("a", "x"),
        FieldError::new("", "whole object"),
        FieldError::new("b[0].c", "y"),
    ]);
    assert_eq!(errors.to_string(), "a: x; whole object; b[0].c: y");
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
