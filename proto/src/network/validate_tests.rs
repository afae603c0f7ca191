//! Network tests: every rejection asserts its exact text (it is what the admin reads in the
//! Network's `Invalid` condition), the friendly form's CEL is pinned, and overlap between
//! networks is checked case by case.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;

/// A valid Network: VFs, one IPv4 subnet with a gateway, one namespace.
fn base() -> Value {
    json!({
        "devices": { "kind": "vf" },
        "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "192.0.2.1" }] },
        "namespaces": { "names": ["team-a"] }
    })
}

/// JSON merge patch (RFC 7386): objects merge, `null` removes, anything else replaces.
fn merge(target: &mut Value, patch: Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(target) = target {
                for (key, value) in fields {
                    if value.is_null() {
                        target.remove(&key);
                    } else {
                        merge(target.entry(key).or_insert(Value::Null), value);
                    }
                }
            }
        }
        other => *target = other,
    }
}

/// The base Network with `patch` applied.
fn with(patch: Value) -> NetworkSpec {
    let mut value = base();
    merge(&mut value, patch);
    serde_json::from_value(value).expect("test spec deserializes")
}

/// The base Network with `devices` replaced (not merged) and `patch` applied.
fn with_devices(devices: Value, patch: Value) -> NetworkSpec {
    let mut value = base();
    merge(&mut value, patch);
    value["devices"] = devices;
    serde_json::from_value(value).expect("test spec deserializes")
}

/// Every problem `validate_network` reports, as displayed.
fn problems(name: &str, spec: &NetworkSpec) -> Vec<String> {
    match validate_network(name, spec) {
        Ok(()) => panic!("expected errors for {spec:?}"),
        Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
    }
}

/// One `#[test]` per bad spec (the base Network with a patch), asserting the exact messages.
macro_rules! rejects {
    ($($name:ident: $patch:tt => [$($message:expr),+ $(,)?];)*) => {
        $(
            #[test]
            fn $name() {
                assert_eq!(
                    problems("blue", &with(json!($patch))),
                    vec![$($message.to_owned()),+]
                );
            }
        )*
    };
}

const DNS_LABEL: &str =
    "(1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)";
const LABEL_KEY: &str = "(an optional DNS subdomain prefix and '/', then 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)";

#[test]
fn network_base_is_valid() {
    assert_eq!(validate_network("blue", &with(json!({}))), Ok(()));
}

#[test]
fn network_full_example_from_yaml() {
    let yaml = r#"
devices:
  kind: vf
  vendor: "0x15b3"
  pfName: ens1f0
  minSpeed: 25000
  numaNode: 0
  rdma: true
vlan: 100
mtu: 9000
interfaceName: data0
interfacesPerPod: 1
ipam:
  subnets:
    - cidr: 192.0.2.0/24
      gateway: 192.0.2.1
      exclude: ["192.0.2.2", "192.0.2.240-192.0.2.250", "192.0.2.64/28"]
      routes:
        - destination: 0.0.0.0/0
          gateway: 192.0.2.1
    - cidr: 2001:db8:100::/64
      gateway: 2001:db8:100::1
      routes:
        - destination: ::/0
          gateway: fe80::1
stableAddresses:
  by: label
  label: knic.dev/identity
namespaces:
  selector:
    matchLabels:
      team: a
"#;
    let spec: NetworkSpec = serde_yaml_ng::from_str(yaml).expect("example parses");
    assert_eq!(validate_network("blue", &spec), Ok(()));
    assert_eq!(validate_against("blue", &spec, &[]), vec![]);
    // Serialization round-trips and keeps the camelCase wire names.
    let value = serde_json::to_value(&spec).expect("serializes");
    assert_eq!(value["devices"]["pfName"], "ens1f0");
    assert_eq!(value["stableAddresses"]["by"], "label");
    assert_eq!(
        value["ipam"]["subnets"][0]["exclude"][1],
        "192.0.2.240-192.0.2.250"
    );
    let back: NetworkSpec = serde_json::from_value(value).expect("round trip");
    assert_eq!(back, spec);
    // The pools behind it.
    let pools: Vec<_> = spec
        .ipam
        .subnets
        .iter()
        .map(|s| s.pool().expect("pool"))
        .collect();
    assert_eq!(pools[0].size(), 253 - 1 - 11 - 16);
    assert_eq!(pools[1].size(), (1u128 << 64) - 2);
}

#[test]
fn network_static_ipam_is_valid() {
    let spec = with(json!({ "ipam": { "subnets": null, "static": {} } }));
    assert_eq!(validate_network("blue", &spec), Ok(()));
    assert_eq!(template_config("blue", &spec).ipam, None);
}

#[test]
fn network_unknown_fields_and_variants_are_serde_errors() {
    let mut value = base();
    merge(&mut value, json!({ "devices": { "speed": 1 } }));
    let err = serde_json::from_value::<NetworkSpec>(value)
        .expect_err("unknown field")
        .to_string();
    assert!(err.starts_with("unknown field `speed`"), "{err}");

    let mut value = base();
    merge(&mut value, json!({ "devices": { "kind": "pf" } }));
    let err = serde_json::from_value::<NetworkSpec>(value)
        .expect_err("unknown kind")
        .to_string();
    assert_eq!(err, "unknown variant `pf`, expected `nic` or `vf`");

    let mut value = base();
    merge(
        &mut value,
        json!({ "ipam": { "static": { "addresses": [] } } }),
    );
    let err = serde_json::from_value::<NetworkSpec>(value)
        .expect_err("static is empty")
        .to_string();
    assert!(err.starts_with("unknown field `addresses`"), "{err}");

    let mut value = base();
    merge(&mut value, json!({ "vlan": 70000 }));
    assert!(serde_json::from_value::<NetworkSpec>(value).is_err());
}

#[test]
fn network_reject_name_not_a_dns_label() {
    assert_eq!(
        problems("Blue", &with(json!({}))),
        vec![format!(
            "metadata.name: \"Blue\" is not a DNS label {DNS_LABEL}"
        )]
    );
}

#[test]
fn network_static_network_name_is_checked_too() {
    let spec = with(json!({ "ipam": { "subnets": null, "static": {} } }));
    assert_eq!(
        problems("blue.net", &spec),
        vec![format!(
            "metadata.name: \"blue.net\" is not a DNS label {DNS_LABEL}"
        )]
    );
}

#[test]
fn network_errors_come_in_spec_order() {
    let spec = with(json!({ "vlan": 0, "namespaces": { "names": null }, "mtu": 10 }));
    assert_eq!(
        problems("Blue", &spec),
        vec![
            format!("metadata.name: \"Blue\" is not a DNS label {DNS_LABEL}"),
            "spec.vlan: must be between 1 and 4094, got 0".to_owned(),
            "spec.mtu: must be between 68 and 65535, got 10".to_owned(),
            "spec.namespaces: set names or selector; a Network with neither is usable in no namespace".to_owned(),
        ]
    );
}

rejects! {
    // spec.devices: form
    network_reject_devices_both_forms: { "devices": { "deviceClassName": "vf.knic.dev" } }
        => ["spec.devices: set either deviceClassName (with optional selectors) or the device fields kind, vendor, pfName, minSpeed, numaNode and rdma, not both"];
    network_reject_devices_empty: { "devices": { "kind": null } }
        => ["spec.devices: set deviceClassName (with optional selectors) or at least one of kind, vendor, pfName, minSpeed, numaNode and rdma"];
    network_reject_selectors_without_class: { "devices": { "kind": null, "selectors": ["true"] } }
        => ["spec.devices.deviceClassName: is required when selectors are given"];
    network_reject_bad_class_name: { "devices": { "kind": null, "deviceClassName": "VF_class" } }
        => ["spec.devices.deviceClassName: \"VF_class\" is not a DeviceClass name (a DNS subdomain: at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"];

    // spec.devices: selectors
    network_reject_empty_selector: { "devices": { "kind": null, "deviceClassName": "knic.dev", "selectors": ["  "] } }
        => ["spec.devices.selectors[0]: must not be empty"];
    network_reject_selector_unmatched_close: {
        "devices": { "kind": null, "deviceClassName": "knic.dev", "selectors": ["device.driver == \"knic.dev\")"] }
    } => ["spec.devices.selectors[0]: unbalanced: ')' at byte 27 has no matching '('"];
    network_reject_selector_never_closed: {
        "devices": { "kind": null, "deviceClassName": "knic.dev", "selectors": [
            "true",
            "device.attributes[\"knic.dev\"].kind in [\"nic\", \"pf\""
        ] }
    } => ["spec.devices.selectors[1]: unbalanced: '[' at byte 38 is never closed"];
    network_reject_selector_crossed_brackets: {
        "devices": { "kind": null, "deviceClassName": "knic.dev", "selectors": ["size(x]"] }
    } => ["spec.devices.selectors[0]: unbalanced: ']' at byte 6 closes '(' opened at byte 4"];
    network_reject_selector_over_the_cost_limit: {
        "devices": { "kind": null, "deviceClassName": "knic.dev", "selectors": [
            "device.attributes[\"knic.dev\"].?ifName.orValue(\"\").startsWith(\"ens\")",
            "device.attributes[\"knic.dev\"].?ifName.orValue(\"\").contains(\"f0\")"
        ] }
    } => ["spec.devices.selectors[1]: Kubernetes refuses this selector (Forbidden: too complex, exceeds cost limit): contains() or matches() on an optional read .?NAME.orValue(…) has no length bound in the apiserver's cost estimate; read the attribute behind a guard instead, e.g. !has(device.attributes[\"DOMAIN\"].NAME) || !device.attributes[\"DOMAIN\"].NAME.contains(\"…\")"];
    network_reject_selector_that_is_not_cel: {
        "devices": { "kind": null, "deviceClassName": "knic.dev", "selectors": ["device.driver = \"knic.dev\" && 1.5 > 1"] }
    } => ["spec.devices.selectors[0]: CEL syntax error at byte 14: '=' is not an operator; compare with '=='"];
    network_reject_selector_unclosed_string: {
        "devices": { "kind": null, "deviceClassName": "knic.dev", "selectors": ["device.driver == \"knic.dev"] }
    } => ["spec.devices.selectors[0]: string literal starting at byte 17 is never closed"];

    // spec.devices: friendly form
    network_reject_vendor_empty: { "devices": { "vendor": "" } }
        => ["spec.devices.vendor: must not be empty; write a PCI vendor id (8086 or 0x8086) or the vendor's name as in pci.ids"];
    network_reject_vendor_short_hex: { "devices": { "vendor": "0x80" } }
        => ["spec.devices.vendor: \"0x80\" is not a PCI vendor id; write four hex digits, e.g. 0x8086"];
    network_reject_vendor_control_character: { "devices": { "vendor": "Intel\u{7}" } }
        => ["spec.devices.vendor: \"Intel\\u{7}\" must not contain control characters"];
    network_reject_pf_name_invalid: { "devices": { "pfName": "ens 1" } }
        => ["spec.devices.pfName: interface name \"ens 1\" must not contain whitespace"];
    network_reject_pf_name_too_long: { "devices": { "pfName": "enp216s0f0np0abc" } }
        => ["spec.devices.pfName: interface name \"enp216s0f0np0abc\" is 16 bytes; Linux allows at most 15"];
    network_reject_pf_name_with_nic: { "devices": { "kind": "nic", "pfName": "ens1f0" } }
        => ["spec.devices.pfName: only VFs have a PF name; use kind: vf or remove pfName"];
    network_reject_min_speed_zero: { "devices": { "minSpeed": 0 } }
        => ["spec.devices.minSpeed: must be at least 1 (Mb/s)"];

    // spec.vlan, spec.mtu, spec.interfaceName: the driver's own checks
    network_reject_vlan_zero: { "vlan": 0 } => ["spec.vlan: must be between 1 and 4094, got 0"];
    network_reject_vlan_4095: { "vlan": 4095 } => ["spec.vlan: must be between 1 and 4094, got 4095"];
    network_reject_mtu_too_large: { "mtu": 65536 } => ["spec.mtu: must be between 68 and 65535, got 65536"];
    network_reject_interface_name_slash: { "interfaceName": "net/1" }
        => ["spec.interfaceName: interface name \"net/1\" must not contain '/'"];
    network_reject_ipv6_mtu: {
        "mtu": 1200,
        "ipam": { "subnets": [{ "cidr": "192.0.2.0/24" }, { "cidr": "2001:db8::/64" }] }
    } => ["spec.mtu: 1200 is below 1280, the minimum MTU for IPv6 (spec.ipam.subnets[1] is IPv6)"];

    // spec.interfacesPerPod
    network_reject_zero_interfaces: { "interfacesPerPod": 0 }
        => ["spec.interfacesPerPod: must be between 1 and 32 (a ResourceClaim holds at most 32 devices), got 0"];
    network_reject_33_interfaces: { "interfacesPerPod": 33 }
        => ["spec.interfacesPerPod: must be between 1 and 32 (a ResourceClaim holds at most 32 devices), got 33"];
    network_reject_fixed_name_for_many_interfaces: { "interfacesPerPod": 2, "interfaceName": "data" }
        => ["spec.interfaceName: cannot be set when interfacesPerPod is 2: every interface would get the same name"];

    // spec.ipam: form
    network_reject_ipam_both: { "ipam": { "static": {} } }
        => ["spec.ipam: set either subnets or static, not both"];
    network_reject_ipam_neither: { "ipam": { "subnets": null } }
        => ["spec.ipam: set subnets (addresses allocated by knic) or static: {} (addresses given in each claim)"];

    // spec.ipam.subnets[].cidr
    network_reject_cidr_without_prefix: { "ipam": { "subnets": [{ "cidr": "192.0.2.0" }] } }
        => ["spec.ipam.subnets[0].cidr: 192.0.2.0 has no prefix length; CIDR form is required, e.g. 192.0.2.0/24"];
    network_reject_cidr_prefix_out_of_range: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/33" }] } }
        => ["spec.ipam.subnets[0].cidr: prefix length 33 is out of range for IPv4 (0-32)"];
    network_reject_cidr_not_an_address: { "ipam": { "subnets": [{ "cidr": "blue/24" }] } }
        => ["spec.ipam.subnets[0].cidr: \"blue\" is not a valid IPv4 or IPv6 address"];
    network_reject_cidr_host_bits: { "ipam": { "subnets": [{ "cidr": "192.0.2.1/24" }] } }
        => ["spec.ipam.subnets[0].cidr: 192.0.2.1/24 has host bits set; did you mean 192.0.2.0/24?"];
    network_reject_cidr_multicast: { "ipam": { "subnets": [{ "cidr": "ff00::/8" }] } }
        => ["spec.ipam.subnets[0].cidr: ff00::/8 is a multicast range; pods need unicast addresses"];
    network_reject_cidr_loopback: { "ipam": { "subnets": [{ "cidr": "127.0.0.0/8" }] } }
        => ["spec.ipam.subnets[0].cidr: 127.0.0.0/8 is a loopback range, which never leaves a host"];
    network_reject_subnets_overlap_each_other: {
        "ipam": { "subnets": [{ "cidr": "10.0.0.0/16" }, { "cidr": "2001:db8::/64" }, { "cidr": "10.0.5.0/24" }] }
    } => ["spec.ipam.subnets[2].cidr: 10.0.5.0/24 overlaps subnets[0] (10.0.0.0/16)"];

    // spec.ipam.subnets[].gateway
    network_reject_gateway_outside: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "192.0.3.1" }] } }
        => ["spec.ipam.subnets[0].gateway: 192.0.3.1 is not inside subnet 192.0.2.0/24"];
    network_reject_gateway_network_address: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "192.0.2.0" }] } }
        => ["spec.ipam.subnets[0].gateway: 192.0.2.0 is the network address of 192.0.2.0/24"];
    network_reject_gateway_broadcast: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "192.0.2.255" }] } }
        => ["spec.ipam.subnets[0].gateway: 192.0.2.255 is the broadcast address of 192.0.2.0/24"];
    network_reject_gateway_subnet_router_anycast: { "ipam": { "subnets": [{ "cidr": "2001:db8::/64", "gateway": "2001:db8::" }] } }
        => ["spec.ipam.subnets[0].gateway: 2001:db8:: is the subnet-router anycast address of 2001:db8::/64"];
    network_reject_gateway_other_family: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "2001:db8::1" }] } }
        => ["spec.ipam.subnets[0].gateway: 2001:db8::1 is IPv6 but subnet 192.0.2.0/24 is IPv4"];
    network_reject_gateway_not_an_address: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "router" }] } }
        => ["spec.ipam.subnets[0].gateway: \"router\" is not a valid IPv4 or IPv6 address"];
    network_reject_gateway_with_prefix: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "192.0.2.1/24" }] } }
        => ["spec.ipam.subnets[0].gateway: \"192.0.2.1/24\" is not an IP address (write the address without a prefix length)"];

    // spec.ipam.subnets[].exclude
    network_reject_exclusion_outside: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "exclude": ["192.0.2.5", "192.0.3.0/24"] }] } }
        => ["spec.ipam.subnets[0].exclude[1]: 192.0.3.0/24 is not inside subnet 192.0.2.0/24"];
    network_reject_exclusion_range_reaching_outside: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/25", "exclude": ["192.0.2.100-192.0.2.200"] }] } }
        => ["spec.ipam.subnets[0].exclude[0]: 192.0.2.100-192.0.2.200 is not inside subnet 192.0.2.0/25"];
    network_reject_exclusion_reversed_range: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "exclude": ["192.0.2.20-192.0.2.10"] }] } }
        => ["spec.ipam.subnets[0].exclude[0]: range start 192.0.2.20 is after its end 192.0.2.10"];
    network_reject_exclusion_other_family: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "exclude": ["2001:db8::/64"] }] } }
        => ["spec.ipam.subnets[0].exclude[0]: 2001:db8::/64 is IPv6 but subnet 192.0.2.0/24 is IPv4"];
    network_reject_exclusion_host_bits: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "exclude": ["192.0.2.10/30"] }] } }
        => ["spec.ipam.subnets[0].exclude[0]: 192.0.2.10/30 has host bits set; did you mean 192.0.2.8/30?"];
    network_reject_nothing_left: { "ipam": { "subnets": [{ "cidr": "192.0.2.4/30", "gateway": "192.0.2.5", "exclude": ["192.0.2.6"] }] } }
        => ["spec.ipam.subnets[0]: 192.0.2.4/30 has no address left to allocate after removing the gateway and exclusions"];
    network_reject_host_route_with_gateway: { "ipam": { "subnets": [{ "cidr": "192.0.2.9/32", "gateway": "192.0.2.9" }] } }
        => ["spec.ipam.subnets[0]: 192.0.2.9/32 has no address left to allocate after removing the gateway and exclusions"];

    // spec.ipam.subnets[].routes
    network_reject_route_source: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "192.0.2.1",
        "routes": [{ "destination": "0.0.0.0/0", "gateway": "192.0.2.1", "source": "192.0.2.9" }] }] } }
        => ["spec.ipam.subnets[0].routes[0].source: cannot be set on a Network: every pod gets its own address, so there is no fixed source"];
    network_reject_route_other_family: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24",
        "routes": [{ "destination": "2001:db8:1::/48" }] }] } }
        => ["spec.ipam.subnets[0].routes[0].destination: 2001:db8:1::/48 is IPv6 but subnet 192.0.2.0/24 is IPv4"];
    network_reject_route_gateway_off_link: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24",
        "routes": [{ "destination": "10.0.0.0/8", "gateway": "198.51.100.1" }] }] } }
        => ["spec.ipam.subnets[0].routes[0].gateway: 198.51.100.1 is not inside subnet 192.0.2.0/24, so pods cannot reach it"];
    network_reject_route_gateway_allocatable: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "192.0.2.1",
        "routes": [{ "destination": "10.0.0.0/8", "gateway": "192.0.2.50" }] }] } }
        => ["spec.ipam.subnets[0].routes[0].gateway: 192.0.2.50 could be allocated to a pod; make it the subnet's gateway or list it in exclude"];
    network_reject_route_driver_rules: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "192.0.2.1",
        "routes": [
            { "destination": "10.0.0.1/8" },
            { "destination": "10.1.0.0/16", "gateway": "224.0.0.1" },
            { "destination": "10.2.0.0/16", "table": 255 },
            { "destination": "10.2.0.0/16", "table": 255 }
        ] }] } }
        => [
            "spec.ipam.subnets[0].routes[0].destination: 10.0.0.1/8 has host bits set; did you mean 10.0.0.0/8?",
            "spec.ipam.subnets[0].routes[1].gateway: 224.0.0.1 is not a unicast address",
            "spec.ipam.subnets[0].routes[2].table: 255 is reserved for the kernel's \"local\" table; use 254 (main) or an id of your own",
            "spec.ipam.subnets[0].routes[3].table: 255 is reserved for the kernel's \"local\" table; use 254 (main) or an id of your own",
            "spec.ipam.subnets[0].routes[3]: same destination, table and metric as routes[2]",
        ];

    // spec.stableAddresses
    network_reject_stable_label_missing: { "stableAddresses": { "by": "label" } }
        => ["spec.stableAddresses.label: is required when by is label"];
    network_reject_stable_label_invalid: { "stableAddresses": { "by": "label", "label": "-bad" } }
        => [format!("spec.stableAddresses.label: \"-bad\" is not a label key {LABEL_KEY}")];
    network_reject_stable_label_bad_prefix: { "stableAddresses": { "by": "label", "label": "Knic.dev/id" } }
        => [format!("spec.stableAddresses.label: \"Knic.dev/id\" is not a label key {LABEL_KEY}")];
    network_reject_stable_label_with_pod_name: { "stableAddresses": { "by": "podName", "label": "app" } }
        => ["spec.stableAddresses.label: only applies when by is label"];
    network_reject_stable_with_static: { "ipam": { "subnets": null, "static": {} }, "stableAddresses": { "by": "podName" } }
        => ["spec.stableAddresses: requires subnets; with static addresses every claim already fixes its address"];

    // spec.namespaces
    network_reject_namespaces_both: { "namespaces": { "selector": { "matchLabels": { "team": "a" } } } }
        => ["spec.namespaces: set either names or selector, not both"];
    network_reject_namespaces_neither: { "namespaces": { "names": null } }
        => ["spec.namespaces: set names or selector; a Network with neither is usable in no namespace"];
    network_reject_namespace_name: { "namespaces": { "names": ["Team_A"] } }
        => [format!("spec.namespaces.names[0]: \"Team_A\" is not a namespace name (a DNS label: 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)")];
    network_reject_namespace_duplicate: { "namespaces": { "names": ["team-a", "team-b", "team-a"] } }
        => ["spec.namespaces.names[2]: \"team-a\" is already listed at names[0]"];
    network_reject_match_label_key: { "namespaces": { "names": null, "selector": { "matchLabels": { "bad key": "x" } } } }
        => [format!("spec.namespaces.selector.matchLabels[\"bad key\"]: \"bad key\" is not a label key {LABEL_KEY}")];
    network_reject_match_label_value: { "namespaces": { "names": null, "selector": { "matchLabels": { "team": "-x" } } } }
        => ["spec.namespaces.selector.matchLabels[\"team\"]: \"-x\" is not a label value (at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit, or empty)"];
}

#[test]
fn network_reject_too_many_selectors() {
    let selectors: Vec<&str> = vec!["true"; 32];
    let spec = with(
        json!({ "devices": { "kind": null, "deviceClassName": "knic.dev", "selectors": selectors } }),
    );
    assert_eq!(
        problems("blue", &spec),
        vec![
            "spec.devices.selectors: has 32 entries; at most 31 (Kubernetes allows 32 and knic \
             adds the exhaustion selector)"
        ]
    );
    let selectors: Vec<&str> = vec!["true"; 31];
    let spec = with(
        json!({ "devices": { "kind": null, "deviceClassName": "knic.dev", "selectors": selectors } }),
    );
    assert!(validate_network("blue", &spec).is_ok());
    // Without subnets knic adds nothing, so Kubernetes' own limit applies.
    let mut static_spec = with(
        json!({ "devices": { "kind": null, "deviceClassName": "knic.dev", "selectors": vec!["true"; 32] } }),
    );
    static_spec.ipam = serde_json::from_value(json!({"static": {}})).unwrap();
    assert!(validate_network("blue", &static_spec).is_ok());
    static_spec.devices.selectors.push("true".into());
    assert_eq!(
        problems("blue", &static_spec),
        vec!["spec.devices.selectors: has 33 entries; Kubernetes allows at most 32"]
    );
}

#[test]
fn network_reject_selector_too_long() {
    let long = "a".repeat(10 * 1024 + 1);
    let spec = with(
        json!({ "devices": { "kind": null, "deviceClassName": "knic.dev", "selectors": [long] } }),
    );
    assert_eq!(
        problems("blue", &spec),
        vec!["spec.devices.selectors[0]: is 10241 bytes; Kubernetes allows at most 10240"]
    );
}

#[test]
fn network_reject_vendor_name_too_long() {
    let long = "x".repeat(65);
    assert_eq!(
        problems("blue", &with(json!({ "devices": { "vendor": long } }))),
        vec![format!(
            "spec.devices.vendor: \"{long}\" is 65 bytes; the driver publishes vendor names of at most 64 bytes"
        )]
    );
}

#[test]
fn network_lint_cel_accepts_brackets_inside_strings() {
    for ok in [
        "device.attributes[\"knic.dev\"].ifName == \"eth(0\"",
        "device.attributes[\"knic.dev\"].ifName == 'a\\'(b'",
        "device.attributes[\"knic.dev\"].ifName == r\"a\\\"",
        "device.attributes[\"knic.dev\"].ifName == \"\"\"a\"b(\"\"\"",
        "{'a': [1, (2)]}.size() == 1",
        // Valid CEL knic does not evaluate is still CEL.
        "device.attributes[\"x\"].speed > 2.5e3 && b\"(\" != b'''y)''' && 1u < .5",
    ] {
        assert_eq!(lint_cel(ok).map_err(|e| e.to_string()), Ok(()), "{ok}");
    }
    assert_eq!(
        lint_cel("\"\"\"abc\"\"").map_err(|e| e.to_string()),
        Err("string literal starting at byte 0 is never closed".to_owned())
    );
}

#[test]
fn network_friendly_form_compiles_to_cel() {
    let cases: &[(Value, &str)] = &[
        (
            json!({ "kind": "vf" }),
            r#"device.attributes["knic.dev"].kind == "vf""#,
        ),
        (
            json!({ "kind": "nic", "vendor": "0x8086", "minSpeed": 25000, "numaNode": 1, "rdma": true }),
            r#"device.attributes["knic.dev"].kind in ["nic", "pf"] && device.attributes["knic.dev"].?pciVendor.orValue("") == "8086" && device.attributes["knic.dev"].?speed.orValue(0) >= 25000 && device.attributes["knic.dev"].?numaNode.orValue(-1) == 1 && device.attributes["knic.dev"].?rdma.orValue(false)"#,
        ),
        (
            json!({ "kind": "vf", "vendor": "Mellanox Technologies", "pfName": "ens1f0", "rdma": false }),
            r#"device.attributes["knic.dev"].kind == "vf" && device.attributes["knic.dev"].?vendorName.orValue("") == "Mellanox Technologies" && device.attributes["knic.dev"].?pfName.orValue("") == "ens1f0" && !device.attributes["knic.dev"].?rdma.orValue(false)"#,
        ),
        (
            json!({ "vendor": "15B3" }),
            r#"device.attributes["knic.dev"].?pciVendor.orValue("") == "15b3""#,
        ),
        (
            json!({ "vendor": "0X15b3" }),
            r#"device.attributes["knic.dev"].?pciVendor.orValue("") == "15b3""#,
        ),
        (
            json!({ "vendor": "Odd \"Vendor\" \\ Inc" }),
            r#"device.attributes["knic.dev"].?vendorName.orValue("") == "Odd \"Vendor\" \\ Inc""#,
        ),
        (
            json!({ "pfName": "ens1f0" }),
            r#"device.attributes["knic.dev"].?pfName.orValue("") == "ens1f0""#,
        ),
    ];
    for (devices, expected) in cases {
        let spec = with_devices(devices.clone(), json!({ "interfacesPerPod": 2 }));
        let request = spec.device_request().expect("valid devices");
        assert_eq!(
            request,
            DeviceRequest {
                device_class_name: "knic.dev".to_owned(),
                selectors: vec![(*expected).to_owned()],
                count: 2,
            }
        );
        assert_eq!(
            lint_cel(expected).map_err(|e| e.to_string()),
            Ok(()),
            "{expected}"
        );
        assert_eq!(validate_network("blue", &spec), Ok(()));
    }
}

#[test]
fn network_raw_devices_pass_through() {
    let spec = with(
        json!({ "devices": { "kind": null, "deviceClassName": "vf.knic.dev",
        "selectors": ["device.attributes[\"knic.dev\"].pfName == \"ens1f0\""] } }),
    );
    assert_eq!(
        spec.device_request(),
        Ok(DeviceRequest {
            device_class_name: "vf.knic.dev".to_owned(),
            selectors: vec!["device.attributes[\"knic.dev\"].pfName == \"ens1f0\"".to_owned()],
            count: 1,
        })
    );
    let bad = with(json!({ "devices": { "kind": null } }));
    assert_eq!(
        bad.device_request().expect_err("invalid").to_string(),
        "spec.devices: set deviceClassName (with optional selectors) or at least one of kind, vendor, pfName, minSpeed, numaNode and rdma"
    );
}

#[test]
fn network_template_config_is_accepted_by_the_driver() {
    let spec = with(json!({ "vlan": 100, "mtu": 9000, "interfaceName": "data0" }));
    let config = template_config("blue", &spec);
    let valid = crate::netconfig::validate(&config).expect("driver accepts it");
    assert_eq!(valid.ipam_network.as_deref(), Some("blue"));
    assert_eq!(valid.vlan, Some(100));
    assert_eq!(valid.mtu, Some(9000));
    assert_eq!(valid.interface_name.as_deref(), Some("data0"));
    assert_eq!(
        serde_json::to_value(&config).expect("serializes"),
        json!({
            "apiVersion": "knic.dev/v1alpha1",
            "kind": "NetworkConfig",
            "interface": { "name": "data0", "mtu": 9000 },
            "ipam": { "network": "blue" },
            "vlan": { "id": 100 }
        })
    );
}

#[test]
fn network_namespaces_selects() {
    let labels: BTreeMap<String, String> = [("team", "a"), ("env", "prod")]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let by_name = with(json!({})).namespaces;
    assert!(by_name.selects("team-a", &BTreeMap::new()));
    assert!(!by_name.selects("team-b", &labels));
    let by_label = with(
        json!({ "namespaces": { "names": null, "selector": { "matchLabels": { "team": "a" } } } }),
    )
    .namespaces;
    assert!(by_label.selects("anything", &labels));
    assert!(!by_label.selects("team-a", &BTreeMap::new()));
    let everything = with(json!({ "namespaces": { "names": null, "selector": {} } })).namespaces;
    assert!(everything.selects("kube-system", &BTreeMap::new()));
}

#[test]
fn network_stable_identity() {
    let labels: BTreeMap<String, String> =
        [("knic.dev/id".to_owned(), "db-primary".to_owned())].into();
    let by_name = StableAddresses {
        by: StableBy::PodName,
        label: None,
    };
    assert_eq!(
        by_name.identity("ns", "db-0", &labels, 0).as_deref(),
        Some("ns/db-0")
    );
    assert_eq!(
        by_name.identity("ns", "db-0", &labels, 2).as_deref(),
        Some("ns/db-0#2")
    );
    let by_label = StableAddresses {
        by: StableBy::Label,
        label: Some("knic.dev/id".to_owned()),
    };
    assert_eq!(
        by_label.identity("ns", "db-7f9c", &labels, 0).as_deref(),
        Some("ns/db-primary")
    );
    assert_eq!(by_label.identity("ns", "x", &BTreeMap::new(), 0), None);
}

// ---- validate_against ----

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

// Issue 11: a Network that validates must not fail in the kernel (or quietly not work) for a
// reason validation could have known.
rejects! {
    // spec.ipam.subnets[].cidr: /0 and special ranges
    network_reject_cidr_ipv4_default: { "ipam": { "subnets": [{ "cidr": "0.0.0.0/0" }] } }
        => ["spec.ipam.subnets[0].cidr: 0.0.0.0/0 is every IPv4 address, not a subnet (0.0.0.0/0 and ::/0 are how a default route is written); write the link's own subnet"];
    network_reject_cidr_ipv6_default: { "ipam": { "subnets": [{ "cidr": "::/0" }] } }
        => ["spec.ipam.subnets[0].cidr: ::/0 is every IPv6 address, not a subnet (0.0.0.0/0 and ::/0 are how a default route is written); write the link's own subnet"];
    network_reject_cidr_special_ranges: { "ipam": { "subnets": [
        { "cidr": "240.0.0.0/24" },
        { "cidr": "255.255.255.255/32" },
        { "cidr": "::ffff:192.0.2.0/120" },
        { "cidr": "::1/128" },
        { "cidr": "ff02::/16" }
    ] } }
        => [
            "spec.ipam.subnets[0].cidr: 240.0.0.0/24 is in the reserved class E range 240.0.0.0/4, which hosts and routers drop",
            "spec.ipam.subnets[1].cidr: 255.255.255.255/32 is the limited broadcast address",
            "spec.ipam.subnets[2].cidr: ::ffff:192.0.2.0/120 is an IPv4-mapped IPv6 range; write the IPv4 subnet instead",
            "spec.ipam.subnets[3].cidr: ::1/128 is a loopback range, which never leaves a host",
            "spec.ipam.subnets[4].cidr: ff02::/16 is a multicast range; pods need unicast addresses",
        ];
    network_reject_cidr_containing_special_ranges: { "ipam": { "subnets": [
        { "cidr": "0.0.0.0/8" },
        { "cidr": "128.0.0.0/1" },
        { "cidr": "96.0.0.0/3" },
        { "cidr": "::/64" },
        { "cidr": "::/16" },
        { "cidr": "0.0.0.0/32" }
    ] } }
        => [
            "spec.ipam.subnets[0].cidr: 0.0.0.0/8 contains the unspecified address 0.0.0.0",
            "spec.ipam.subnets[1].cidr: 128.0.0.0/1 contains the multicast range 224.0.0.0/4; pods need unicast addresses",
            "spec.ipam.subnets[2].cidr: 96.0.0.0/3 contains the loopback range 127.0.0.0/8, which never leaves a host",
            "spec.ipam.subnets[3].cidr: ::/64 contains the unspecified address ::",
            "spec.ipam.subnets[4].cidr: ::/16 contains the unspecified address ::",
            "spec.ipam.subnets[5].cidr: 0.0.0.0/32 is the unspecified address",
        ];
    network_reject_cidr_containing_mapped_range: { "ipam": { "subnets": [{ "cidr": "0:0:0:0:0:fffe::/95" }] } }
        => ["spec.ipam.subnets[0].cidr: ::fffe:0:0/95 contains the IPv4-mapped range ::ffff:0.0.0.0/96, which never appears on the wire"];

    // spec.ipam.subnets[].gateway: address classes come first, even outside the subnet
    network_reject_gateway_loopback: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "127.0.0.1" }] } }
        => ["spec.ipam.subnets[0].gateway: 127.0.0.1 is a loopback address, which never leaves a host"];
    network_reject_gateway_limited_broadcast: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "255.255.255.255" }] } }
        => ["spec.ipam.subnets[0].gateway: 255.255.255.255 is not a unicast address"];
    network_reject_gateway_mapped: { "ipam": { "subnets": [{ "cidr": "2001:db8::/64", "gateway": "::ffff:192.0.2.1" }] } }
        => ["spec.ipam.subnets[0].gateway: ::ffff:192.0.2.1 is an IPv4-mapped IPv6 address; write the IPv4 address instead"];
    network_reject_gateway_network_address_slash_30: { "ipam": { "subnets": [{ "cidr": "198.51.100.4/30", "gateway": "198.51.100.4" }] } }
        => ["spec.ipam.subnets[0].gateway: 198.51.100.4 is the network address of 198.51.100.4/30"];

    // spec.ipam.subnets[].routes: gateways on the subnet's reserved addresses, special classes
    // and destinations
    network_reject_route_gateway_reserved: { "ipam": { "subnets": [
        { "cidr": "192.0.2.0/24", "gateway": "192.0.2.1", "routes": [
            { "destination": "10.0.0.0/8", "gateway": "192.0.2.255" },
            { "destination": "10.1.0.0/16", "gateway": "192.0.2.0" }
        ] },
        { "cidr": "2001:db8::/64", "gateway": "2001:db8::1", "routes": [
            { "destination": "2001:db8:1::/48", "gateway": "2001:db8::" }
        ] }
    ] } }
        => [
            "spec.ipam.subnets[0].routes[0].gateway: 192.0.2.255 is the broadcast address of 192.0.2.0/24",
            "spec.ipam.subnets[0].routes[1].gateway: 192.0.2.0 is the network address of 192.0.2.0/24",
            "spec.ipam.subnets[1].routes[0].gateway: 2001:db8:: is the subnet-router anycast address of 2001:db8::/64",
        ];
    network_reject_route_special_gateways_and_destinations: { "ipam": { "subnets": [
        { "cidr": "192.0.2.0/24", "gateway": "192.0.2.1", "routes": [
            { "destination": "10.0.0.0/8", "gateway": "127.0.0.1" },
            { "destination": "10.1.0.0/16", "gateway": "240.0.0.1" },
            { "destination": "127.0.0.0/8" }
        ] },
        { "cidr": "2001:db8::/64", "routes": [
            { "destination": "::ffff:0:0/96" },
            { "destination": "2001:db8:1::/48", "gateway": "::1" }
        ] }
    ] } }
        => [
            "spec.ipam.subnets[0].routes[0].gateway: 127.0.0.1 is a loopback address, which never leaves a host",
            "spec.ipam.subnets[0].routes[1].gateway: 240.0.0.1 is a reserved class E address (240.0.0.0/4), which hosts and routers drop",
            "spec.ipam.subnets[0].routes[2].destination: 127.0.0.0/8 is a loopback range; the kernel's local routes always take it, so this route would never be used",
            "spec.ipam.subnets[1].routes[0].destination: ::ffff:0.0.0.0/96 is an IPv4-mapped IPv6 range, which the kernel sends as IPv4; write an IPv4 route instead",
            "spec.ipam.subnets[1].routes[1].gateway: ::1 is a loopback address, which never leaves a host",
        ];

    // spec.interfaceName and spec.devices.pfName: invisible characters
    network_reject_interface_name_zero_width: { "interfaceName": "data\u{200d}0" }
        => ["spec.interfaceName: interface name \"data\\u{200d}0\" must not contain zero-width characters (U+200D found)"];
    network_reject_interface_name_bidi: { "interfaceName": "\u{2067}data0" }
        => ["spec.interfaceName: interface name \"\\u{2067}data0\" must not contain bidirectional control characters (U+2067 found)"];
    network_reject_interface_name_control: { "interfaceName": "data\u{85}" }
        => ["spec.interfaceName: interface name \"data\\u{85}\" must not contain whitespace"];
    network_reject_pf_name_bidi: { "devices": { "pfName": "ens1f0\u{200f}" } }
        => ["spec.devices.pfName: interface name \"ens1f0\\u{200f}\" must not contain bidirectional control characters (U+200F found)"];
}

#[test]
fn network_kernel_edge_values_that_accept() {
    let spec = with(json!({
        "interfaceName": "netä0",
        "ipam": { "subnets": [
            // RFC 3021: a /31 has no network or broadcast address, so either end is a gateway.
            { "cidr": "192.0.2.0/31", "gateway": "192.0.2.0", "routes": [
                { "destination": "0.0.0.0/0", "gateway": "192.0.2.0" },
                { "destination": "224.0.0.0/4" },
                { "destination": "240.0.0.0/4" }
            ] },
            { "cidr": "198.51.100.9/32" },
            { "cidr": "2001:db8::/64", "gateway": "2001:db8::1", "routes": [
                { "destination": "::/0", "gateway": "2001:db8::1" },
                { "destination": "::/1", "gateway": "fe80::1" },
                { "destination": "ff00::/8" }
            ] },
            // RFC 6164: a /127 has no subnet-router anycast address.
            { "cidr": "2001:db8:1::/127", "gateway": "2001:db8:1::" },
            // Just below and above the special ranges.
            { "cidr": "126.0.0.0/8" },
            { "cidr": "128.0.0.0/2" },
            { "cidr": "0.0.0.64/26" },
            { "cidr": "::2/127" }
        ] }
    }));
    assert_eq!(validate_network("blue", &spec), Ok(()));
    // The pools agree with validation: each one builds.
    for subnet in &spec.ipam.subnets {
        assert!(subnet.pool().is_ok(), "{subnet:?}");
    }
}
