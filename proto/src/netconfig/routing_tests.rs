//! `rules`, `sourceBasedRouting` and `vrf`: every refusal with its exact text, the defaults,
//! the family expansion and what [`RoutingSettings::expand`] installs.

use serde_json::{Value, json};

use super::super::{API_VERSION, KIND, merge, parse, validate};
use super::*;

fn object(fields: Value) -> Value {
    let mut value = json!({ "apiVersion": API_VERSION, "kind": KIND });
    let (Value::Object(base), Value::Object(extra)) = (&mut value, fields) else {
        panic!("test configs must be JSON objects");
    };
    base.extend(extra);
    value
}

fn problems(fields: Value) -> Vec<String> {
    match parse(&object(fields), "").and_then(|c| validate(&c)) {
        Ok(valid) => panic!("expected errors, got {valid:?}"),
        Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
    }
}

fn routing(fields: Value) -> RoutingSettings {
    let config = parse(&object(fields), "").expect("parses");
    validate(&config).expect("validates").routing
}

fn cidr(text: &str) -> Cidr {
    text.parse().expect("CIDR")
}

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
    rule_unknown_field: { "rules": [{ "table": 100, "src": "10.0.0.0/8" }] }
        => ["rules[0].src: unknown field"];
    rules_not_a_list: { "rules": { "table": 100 } }
        => ["rules: expected a list of rules, got an object"];
    rule_not_an_object: { "rules": ["from all"] }
        => ["rules[0]: expected an object, got string \"from all\""];
    rule_from_not_a_string: { "rules": [{ "from": 10, "table": 100 }] }
        => ["rules[0].from: expected a string, got number 10"];
    rule_bad_cidr: { "rules": [{ "from": "10.0.0.300/8", "table": 100 }] }
        => ["rules[0].from: \"10.0.0.300\" is not a valid IPv4 or IPv6 address"];
    rule_cidr_without_length: { "rules": [{ "to": "10.0.0.1", "table": 100 }] }
        => ["rules[0].to: 10.0.0.1 has no prefix length; CIDR form is required, e.g. 10.0.0.1/24"];
    rule_host_bits: { "rules": [{ "from": "10.1.2.3/8", "table": 100 }] }
        => ["rules[0].from: 10.1.2.3/8 has host bits set; did you mean 10.0.0.0/8?"];
    rule_family_mismatch_from_to: { "rules": [{ "from": "10.0.0.0/8", "to": "2001:db8::/32", "table": 100 }] }
        => ["rules[0].to: 2001:db8::/32 is IPv6 but from 10.0.0.0/8 is IPv4"];
    rule_family_mismatch_explicit: { "rules": [{ "family": "ipv6", "from": "10.0.0.0/8", "table": 100 }] }
        => ["rules[0].from: 10.0.0.0/8 is IPv4 but family is \"ipv6\""];
    rule_unknown_family: { "rules": [{ "family": "inet", "table": 100 }] }
        => ["rules[0].family: \"inet\" is not a family; use \"ipv4\" or \"ipv6\""];
    rule_table_missing: { "rules": [{ "from": "10.0.0.0/8" }] }
        => ["rules[0].table: required; the table this rule sends matching traffic to"];
    rule_table_zero: { "rules": [{ "table": 0 }] }
        => ["rules[0].table: 0 is not a table id (RT_TABLE_UNSPEC)"];
    rule_table_default: { "rules": [{ "table": 253 }] }
        => ["rules[0].table: 253 is reserved for the kernel's \"default\" table"];
    rule_table_local: { "rules": [{ "table": 255 }] }
        => ["rules[0].table: 255 is reserved for the kernel's \"local\" table"];
    rule_table_compat: { "rules": [{ "table": 252 }] }
        => ["rules[0].table: 252 is reserved for the kernel's \"compat\" table"];
    rule_table_too_big: { "rules": [{ "table": 4294967296u64 }] }
        => ["rules[0].table: must be between 1 and 4294967295, got 4294967296"];
    rule_table_negative: { "rules": [{ "table": -1 }] }
        => ["rules[0].table: must be between 1 and 4294967295, got -1"];
    rule_table_fraction: { "rules": [{ "table": 1.5 }] }
        => ["rules[0].table: expected an integer, got number 1.5"];
    rule_priority_zero: { "rules": [{ "table": 100, "priority": 0 }] }
        => ["rules[0].priority: 0 is the priority of the kernel's \"local\" rule; use another (1-32765 or above 32767)"];
    rule_priority_main: { "rules": [{ "table": 100, "priority": 32766 }] }
        => ["rules[0].priority: 32766 is the priority of the kernel's \"main\" rule; use another (1-32765 or above 32767)"];
    rule_priority_default: { "rules": [{ "table": 100, "priority": 32767 }] }
        => ["rules[0].priority: 32767 is the priority of the kernel's \"default\" rule; use another (1-32765 or above 32767)"];
    rule_priority_too_big: { "rules": [{ "table": 100, "priority": 4294967296u64 }] }
        => ["rules[0].priority: must be between 1 and 4294967295, got 4294967296"];
    rule_fwmask_without_fwmark: { "rules": [{ "table": 100, "fwmask": 255 }] }
        => ["rules[0].fwmask: requires fwmark (the mask applies to the mark being matched)"];
    rule_fwmark_too_big: { "rules": [{ "table": 100, "fwmark": 4294967296u64 }] }
        => ["rules[0].fwmark: must be between 0 and 4294967295, got 4294967296"];
    rule_unknown_iif_without_name: { "rules": [{ "table": 100, "iif": "eth0" }] }
        => ["rules[0].iif: \"eth0\" is not an interface of this claim in the pod; allowed: \"lo\"; set interface.name to name this interface"];
    rule_unknown_oif: { "interface": { "name": "data0" }, "vrf": { "name": "blue", "table": 10 },
                        "rules": [{ "table": 100, "oif": "eth0" }] }
        => ["rules[0].oif: \"eth0\" is not an interface of this claim in the pod; allowed: \"lo\", \"data0\" (interface.name), \"blue\" (vrf.name)"];
    rule_duplicate: { "rules": [{ "from": "10.0.0.0/8", "table": 100 }, { "from": "10.0.0.0/8", "table": 100 }] }
        => ["rules[1]: same rule as rules[0]"];
    rule_everything_wrong: { "rules": [{ "family": "ipv4", "from": "2001:db8::/32", "fwmask": 1, "priority": 32767 }] }
        => [
            "rules[0].from: 2001:db8::/32 is IPv6 but family is \"ipv4\"",
            "rules[0].fwmask: requires fwmark (the mask applies to the mark being matched)",
            "rules[0].table: required; the table this rule sends matching traffic to",
            "rules[0].priority: 32767 is the priority of the kernel's \"default\" rule; use another (1-32765 or above 32767)",
        ];
    sbr_unknown_field: { "sourceBasedRouting": { "tabel": 100 } }
        => ["sourceBasedRouting.tabel: unknown field"];
    sbr_not_an_object: { "sourceBasedRouting": true }
        => ["sourceBasedRouting: expected an object, got boolean true"];
    sbr_main_table: { "sourceBasedRouting": { "table": 254 } }
        => ["sourceBasedRouting.table: 254 is the main table; this needs a table of its own (e.g. 100)"];
    sbr_local_table: { "sourceBasedRouting": { "table": 255 } }
        => ["sourceBasedRouting.table: 255 is reserved for the kernel's \"local\" table"];
    sbr_reserved_priority: { "sourceBasedRouting": { "priority": 32766 } }
        => ["sourceBasedRouting.priority: 32766 is the priority of the kernel's \"main\" rule; use another (1-32765 or above 32767)"];
    sbr_with_vrf: { "sourceBasedRouting": {}, "vrf": { "name": "blue", "table": 10 } }
        => ["sourceBasedRouting: cannot be combined with vrf; the VRF's table already holds this interface's routes"];
    vrf_unknown_field: { "vrf": { "name": "blue", "table": 10, "mode": "strict" } }
        => ["vrf.mode: unknown field"];
    vrf_missing_both: { "vrf": {} }
        => ["vrf.name: required", "vrf.table: required"];
    vrf_bad_name: { "vrf": { "name": "a/b", "table": 10 } }
        => ["vrf.name: interface name \"a/b\" must not contain '/'"];
    vrf_named_like_interface: { "interface": { "name": "data0" }, "vrf": { "name": "data0", "table": 10 } }
        => ["vrf.name: \"data0\" is the interface's own name (interface.name); the VRF device needs another"];
    vrf_named_lo: { "vrf": { "name": "lo", "table": 10 } }
        => ["vrf.name: \"lo\" is the pod's loopback device"];
    vrf_main_table: { "vrf": { "name": "blue", "table": 254 } }
        => ["vrf.table: 254 is the main table; this needs a table of its own (e.g. 100)"];
    vrf_default_table: { "vrf": { "name": "blue", "table": 253 } }
        => ["vrf.table: 253 is reserved for the kernel's \"default\" table"];
    vrf_zero_table: { "vrf": { "name": "blue", "table": 0 } }
        => ["vrf.table: 0 is not a table id (RT_TABLE_UNSPEC)"];
    vrf_route_in_other_table: { "addresses": ["192.0.2.10/24"], "vrf": { "name": "blue", "table": 10 },
                                "routes": [{ "destination": "0.0.0.0/0", "gateway": "192.0.2.1", "table": 20 }] }
        => ["routes[0].table: 20 is not the VRF's table 10; leave table unset to route in the VRF"];
}

#[test]
fn a_rule_without_prefix_or_family_is_installed_for_both_families() {
    let r = routing(json!({ "rules": [{ "fwmark": 16, "fwmask": 255, "table": 200 }] }));
    let families: Vec<Family> = r.rules.iter().map(|r| r.family).collect();
    assert_eq!(families, vec![Family::Ipv4, Family::Ipv6]);
    assert!(r.rules.iter().all(|r| r.fwmark == Some(16)
        && r.fwmask == Some(255)
        && r.table == 200
        && r.priority == DEFAULT_RULE_PRIORITY));
}

#[test]
fn a_family_or_a_prefix_picks_one_family() {
    let r = routing(json!({ "interface": { "name": "data0" }, "rules": [
        { "family": "ipv6", "iif": "data0", "table": 300, "priority": 5 },
        { "to": "198.51.100.0/24", "oif": "lo", "table": 254 },
    ] }));
    assert_eq!(r.rules.len(), 2);
    assert_eq!(r.rules[0].family, Family::Ipv6);
    assert_eq!(r.rules[0].iif.as_deref(), Some("data0"));
    assert_eq!(r.rules[0].priority, 5);
    assert_eq!(r.rules[1].family, Family::Ipv4);
    assert_eq!(r.rules[1].to, Some(cidr("198.51.100.0/24")));
    assert_eq!(r.rules[1].table, 254);
}

#[test]
fn source_routing_defaults_are_documented_values() {
    let r = routing(json!({ "sourceBasedRouting": {} }));
    assert_eq!(
        r.source_routing,
        Some(SourceRouting {
            table: 100,
            priority: 10000
        })
    );
}

#[test]
fn expand_moves_untabled_routes_into_the_sbr_table_and_adds_subnets_and_source_rules() {
    let r = routing(
        json!({ "sourceBasedRouting": { "table": 101, "priority": 50 },
                            "rules": [{ "fwmark": 1, "table": 7, "family": "ipv4" }] }),
    );
    let addresses = [cidr("192.0.2.10/24"), cidr("2001:db8::10/64")];
    let routes = [
        Route {
            destination: cidr("0.0.0.0/0"),
            gateway: Some("192.0.2.1".parse().expect("ip")),
            source: None,
            metric: None,
            table: None,
        },
        Route {
            destination: cidr("203.0.113.0/24"),
            gateway: None,
            source: None,
            metric: None,
            table: Some(42),
        },
    ];
    let (routes, rules) = r.expand(&addresses, &routes);
    let tables: Vec<(String, Option<u32>)> = routes
        .iter()
        .map(|r| (r.destination.to_string(), r.table))
        .collect();
    assert_eq!(
        tables,
        vec![
            ("0.0.0.0/0".to_owned(), Some(101)),
            ("203.0.113.0/24".to_owned(), Some(42)),
            ("192.0.2.0/24".to_owned(), Some(101)),
            ("2001:db8::/64".to_owned(), Some(101)),
        ]
    );
    assert_eq!(routes[2].source, Some("192.0.2.10".parse().expect("ip")));
    let froms: Vec<(Option<Cidr>, u32, u32)> = rules
        .iter()
        .map(|r| (r.from, r.table, r.priority))
        .collect();
    assert_eq!(
        froms,
        vec![
            (Some(cidr("192.0.2.10/32")), 101, 50),
            (Some(cidr("2001:db8::10/128")), 101, 50),
            (None, 7, DEFAULT_RULE_PRIORITY),
        ]
    );
}

#[test]
fn expand_puts_untabled_routes_into_the_vrf_table() {
    let r = routing(
        json!({ "addresses": ["192.0.2.10/24"], "vrf": { "name": "blue", "table": 10 },
                            "routes": [{ "destination": "0.0.0.0/0", "gateway": "192.0.2.1" }] }),
    );
    let route = Route {
        destination: cidr("0.0.0.0/0"),
        gateway: Some("192.0.2.1".parse().expect("ip")),
        source: None,
        metric: None,
        table: None,
    };
    let (routes, rules) = r.expand(&[cidr("192.0.2.10/24")], &[route]);
    assert_eq!(routes.len(), 1);
    assert_eq!(routes[0].table, Some(10));
    assert!(rules.is_empty());
    assert_eq!(
        r.vrf,
        Some(Vrf {
            name: "blue".into(),
            table: 10
        })
    );
}

#[test]
fn routing_blocks_replace_lower_layers_whole() {
    let class = parse(
        &object(json!({ "rules": [{ "table": 5 }], "vrf": { "name": "red", "table": 5 } })),
        "",
    )
    .expect("parses");
    let claim = parse(
        &object(json!({ "vrf": { "name": "blue" }, "sourceBasedRouting": { "table": 7 } })),
        "",
    )
    .expect("parses");
    let merged = merge(&[class, claim]);
    assert_eq!(merged.rules.as_ref().map(Vec::len), Some(1));
    assert_eq!(
        merged.vrf,
        Some(VrfConfig {
            name: Some("blue".into()),
            table: None
        })
    );
    assert_eq!(
        problems(serde_json::to_value(&merged).expect("json")),
        vec![
            "vrf.table: required",
            "sourceBasedRouting: cannot be combined with vrf; the VRF's table already holds this interface's routes",
        ]
    );
}

#[test]
fn the_derived_deserializer_reads_what_parse_reads() {
    let fields = object(json!({
        "interface": { "name": "data0" },
        "rules": [{ "from": "10.0.0.0/8", "to": "10.1.0.0/16", "iif": "lo", "oif": "data0",
                    "fwmark": 1, "fwmask": 3, "table": 100, "priority": 7, "family": "ipv4" }],
        "sourceBasedRouting": { "table": 101, "priority": 9 },
        "vrf": { "name": "blue", "table": 10 }
    }));
    let parsed = parse(&fields, "").expect("parses");
    let derived: super::super::NetworkConfig = serde_json::from_value(fields).expect("derives");
    assert_eq!(parsed, derived);
}
