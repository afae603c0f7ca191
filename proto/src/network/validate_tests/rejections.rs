//! Every refusal of a single Network, with its exact text, in spec order.

use super::*;

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
        => ["spec.devices: set deviceClassName (with optional selectors) or at least one of kind, vendor, pfName, minSpeed, numaNode and rdma; empty devices are allowed only with spec.vxlan"];
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
    network_reject_stable_label_with_kubevirt: { "stableAddresses": { "by": "kubevirtVM", "label": "app" } }
        => ["spec.stableAddresses.label: only applies when by is label"];
    network_reject_stable_grace_over_a_year: { "stableAddresses": { "by": "podName", "gracePeriodSeconds": 31536001u64 } }
        => ["spec.stableAddresses.gracePeriodSeconds: must be at most 31536000 (one year), got 31536001"];
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
