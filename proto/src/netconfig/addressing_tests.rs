use serde_json::{Value, json};

use super::*;
use crate::netconfig::{API_VERSION, KIND, ValidConfig, merge, parse, validate};

fn wire(fields: Value) -> Value {
    let mut wire = json!({"apiVersion": API_VERSION, "kind": KIND});
    wire.as_object_mut()
        .expect("object")
        .extend(fields.as_object().expect("object").clone());
    wire
}

fn config(fields: Value) -> NetworkConfig {
    parse(&wire(fields), "").expect("parses")
}

fn valid(fields: Value) -> ValidConfig {
    validate(&config(fields)).expect("valid")
}

fn errors(fields: Value) -> String {
    validate(&config(fields))
        .expect_err("must be refused")
        .to_string()
}

fn parse_errors(fields: Value) -> String {
    parse(&wire(fields), "config[0].parameters")
        .expect_err("must be refused")
        .to_string()
}

#[test]
fn static_is_the_default_and_omitted_from_checkpoints() {
    assert_eq!(valid(json!({})).addressing, Addressing::Static);
    let v = valid(json!({"addressing": {"mode": "static"}, "addresses": ["192.0.2.10/24"]}));
    assert_eq!(v.addressing, Addressing::Static);
    let stored = serde_json::to_value(&v).expect("json");
    assert!(stored.get("addressing").is_none(), "{stored}");
}

#[test]
fn dhcp_defaults_and_checkpoint_form() {
    let v = valid(json!({"addressing": {"mode": "dhcp"}}));
    assert_eq!(
        v.addressing,
        Addressing::Dhcp {
            timeout_seconds: 10,
            default_route: true,
            use_mtu: false
        }
    );
    assert_eq!(
        serde_json::to_value(&v).expect("json")["addressing"],
        json!({"mode": "dhcp", "timeoutSeconds": 10, "defaultRoute": true, "useMtu": false})
    );
    let back: ValidConfig =
        serde_json::from_value(serde_json::to_value(&v).expect("json")).expect("loads");
    assert_eq!(back, v);
    let v = valid(json!({
        "addressing": {"mode": "dhcp", "timeoutSeconds": 60, "defaultRoute": false, "useMtu": true},
        "addresses": ["2001:db8::10/64"],
    }));
    assert_eq!(
        v.addressing,
        Addressing::Dhcp {
            timeout_seconds: 60,
            default_route: false,
            use_mtu: true
        }
    );
    assert_eq!(v.addresses.len(), 1, "static IPv6 stays beside DHCPv4");
}

#[test]
fn dhcp_refuses_ipv4_statics_ipam_and_a_zero_timeout() {
    assert_eq!(
        errors(
            json!({"addressing": {"mode": "dhcp"}, "addresses": ["2001:db8::1/64", "192.0.2.10/24"]})
        ),
        "addresses[1]: 192.0.2.10/24 is IPv4, but addressing.mode dhcp gets the IPv4 address from a DHCP server; remove it or use mode static"
    );
    assert_eq!(
        errors(json!({"addressing": {"mode": "dhcp"}, "ipam": {"network": "blue"}})),
        "ipam: cannot be combined with addressing.mode dhcp; the DHCP server gives the address"
    );
    assert_eq!(
        errors(json!({"addressing": {"mode": "dhcp", "timeoutSeconds": 0}})),
        "addressing.timeoutSeconds: must be between 1 and 60 for mode dhcp, got 0"
    );
}

#[test]
fn slaac_turns_ras_on_and_refuses_what_would_stop_it() {
    let v = valid(json!({"addressing": {"mode": "slaac", "timeoutSeconds": 5}}));
    assert_eq!(v.addressing, Addressing::Slaac { timeout_seconds: 5 });
    assert_eq!(
        v.sysctls.get("ipv6.accept_ra").map(String::as_str),
        Some("2")
    );
    assert_eq!(
        v.sysctls.get("ipv6.autoconf").map(String::as_str),
        Some("1")
    );
    // An explicit accept_ra 1 is kept.
    let v = valid(json!({"addressing": {"mode": "slaac"}, "sysctls": {"ipv6.accept_ra": "1"}}));
    assert_eq!(
        v.sysctls.get("ipv6.accept_ra").map(String::as_str),
        Some("1")
    );
    assert_eq!(v.addressing, Addressing::Slaac { timeout_seconds: 0 });
    assert_eq!(
        errors(json!({
            "addressing": {"mode": "slaac"},
            "sysctls": {"ipv6.accept_ra": "0", "ipv6.autoconf": "0", "ipv6.disable_ipv6": "1"},
            "interface": {"mtu": 1200},
        })),
        "sysctls[\"ipv6.accept_ra\"]: \"0\" turns router advertisements off, which addressing.mode slaac needs; \
         sysctls[\"ipv6.autoconf\"]: \"0\" turns autoconfiguration off, which addressing.mode slaac needs; \
         sysctls[\"ipv6.disable_ipv6\"]: \"1\" disables IPv6, which addressing.mode slaac needs; \
         interface.mtu: 1200 is below 1280, the minimum MTU for IPv6 (addressing.mode is slaac)"
    );
}

#[test]
fn unnumbered_has_no_address_and_on_link_routes_only() {
    let v = valid(json!({
        "addressing": {"mode": "unnumbered"},
        "routes": [{"destination": "10.0.0.0/8"}, {"destination": "::/0", "gateway": "fe80::1"}],
    }));
    assert_eq!(v.addressing, Addressing::Unnumbered);
    assert!(v.addresses.is_empty());
    assert_eq!(
        v.sysctls.get("ipv6.autoconf").map(String::as_str),
        Some("0")
    );
    assert_eq!(
        errors(json!({
            "addressing": {"mode": "unnumbered"},
            "addresses": ["192.0.2.10/24"],
            "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1"}],
            "sysctls": {"ipv6.autoconf": "1"},
        })),
        "addresses: must be empty with addressing.mode unnumbered, which gives the interface no address; \
         routes[0].gateway: 192.0.2.1 cannot be reached through an unnumbered interface (it has no subnet); omit the gateway for an on-link route, or use an IPv6 link-local one; \
         sysctls[\"ipv6.autoconf\"]: \"1\" would give the interface addresses, but addressing.mode is unnumbered"
    );
    assert_eq!(
        errors(json!({"addressing": {"mode": "unnumbered"}, "ipam": {"network": "blue"}})),
        "ipam: cannot be combined with addressing.mode unnumbered, which gives the interface no address"
    );
}

#[test]
fn unknown_modes_and_misplaced_fields_are_named() {
    assert_eq!(
        errors(json!({"addressing": {"mode": "DHCP"}})),
        "addressing.mode: \"DHCP\" is not an addressing mode; use one of static, dhcp, slaac, unnumbered"
    );
    assert_eq!(
        errors(json!({"addressing": {"timeoutSeconds": 5, "defaultRoute": true, "useMtu": false}})),
        "addressing.timeoutSeconds: applies only to mode dhcp or slaac, not static; \
         addressing.defaultRoute: applies only to mode dhcp, not static; \
         addressing.useMtu: applies only to mode dhcp, not static"
    );
    assert_eq!(
        errors(json!({"addressing": {"mode": "slaac", "useMtu": true}})),
        "addressing.useMtu: applies only to mode dhcp, not slaac"
    );
}

#[test]
fn parse_names_every_structural_problem() {
    assert_eq!(
        parse_errors(json!({"addressing": "dhcp"})),
        "config[0].parameters.addressing: expected an object, got string \"dhcp\""
    );
    assert_eq!(
        parse_errors(
            json!({"addressing": {"mode": 4, "timeoutSeconds": 61, "defaultRoute": "yes", "useMtu": 1, "lease": 3}})
        ),
        "config[0].parameters.addressing.lease: unknown field; \
         config[0].parameters.addressing.mode: expected a string, got number 4; \
         config[0].parameters.addressing.timeoutSeconds: must be between 0 and 60, got 61; \
         config[0].parameters.addressing.defaultRoute: expected a boolean (true or false), got string \"yes\"; \
         config[0].parameters.addressing.useMtu: expected a boolean (true or false), got number 1"
    );
    assert_eq!(
        parse_errors(json!({"addressing": {"timeoutSeconds": -1}})),
        "config[0].parameters.addressing.timeoutSeconds: must be between 0 and 60, got -1"
    );
    assert_eq!(
        parse_errors(json!({"addressing": {"timeoutSeconds": 1.5}})),
        "config[0].parameters.addressing.timeoutSeconds: expected an integer, got number 1.5"
    );
}

#[test]
fn layers_merge_field_by_field() {
    let class = config(json!({"addressing": {"mode": "dhcp", "timeoutSeconds": 20}}));
    let claim = config(json!({"addressing": {"defaultRoute": false}}));
    let v = validate(&merge(&[class.clone(), claim])).expect("valid");
    assert_eq!(
        v.addressing,
        Addressing::Dhcp {
            timeout_seconds: 20,
            default_route: false,
            use_mtu: false
        }
    );
    // A claim goes back to static addresses by saying so.
    let claim = config(
        json!({"addressing": {"mode": "static", "timeoutSeconds": null}, "addresses": ["192.0.2.10/24"]}),
    );
    let merged = merge(&[class, claim]);
    assert_eq!(
        validate(&merged)
            .expect_err("timeout left from the class")
            .to_string(),
        "addressing.timeoutSeconds: applies only to mode dhcp or slaac, not static"
    );
}

#[test]
fn dynamic_modes_refuse_what_needs_the_address_at_prepare() {
    // Routes go on before the lease: an IPv4 gateway is not reachable then.
    assert_eq!(
        errors(json!({"addressing": {"mode": "dhcp"},
                      "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1"}]})),
        "routes[0].gateway: 192.0.2.1 is IPv4, but with addressing.mode dhcp the interface has no IPv4 subnet until the lease arrives; use addressing.defaultRoute for the server's router, or mode static"
    );
    // An on-link route is fine.
    valid(json!({"addressing": {"mode": "dhcp"}, "routes": [{"destination": "10.0.0.0/8"}]}));
    assert_eq!(
        errors(json!({"addressing": {"mode": "dhcp"}, "ipvlan": {"mode": "l2"}})),
        "ipvlan: cannot be combined with addressing.mode dhcp: ipvlan children share the parent's MAC, so every pod on the port would get the same lease; use macvlan"
    );
    valid(json!({"addressing": {"mode": "dhcp"}, "macvlan": {"mode": "bridge"}}));
    assert_eq!(
        errors(json!({"addressing": {"mode": "slaac"},
                      "routes": [{"destination": "2001:db8:1::/48", "gateway": "2001:db8::1"}]})),
        "routes[0].gateway: 2001:db8::1 is not link-local, and with addressing.mode slaac the interface has no global IPv6 subnet until a router advertises one; use the router's link-local address"
    );
    valid(json!({"addressing": {"mode": "slaac"},
                 "routes": [{"destination": "2001:db8:1::/48", "gateway": "fe80::1"}]}));
    for mode in ["dhcp", "slaac", "unnumbered"] {
        assert_eq!(
            errors(json!({"addressing": {"mode": mode}, "sourceBasedRouting": {}})),
            format!(
                "sourceBasedRouting: cannot be combined with addressing.mode {mode}: its rules are made from the addresses known at prepare; use mode static or ipam"
            )
        );
    }
}
