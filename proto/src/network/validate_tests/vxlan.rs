//! Overlay Networks (`spec.vxlan`): what they compile to, every refusal with its exact text,
//! and the VNI clash between Networks.

use super::*;

/// The base Network as an overlay: no devices, VNI 4242, the base's IPv4 subnet.
fn overlay(patch: Value) -> NetworkSpec {
    let mut value = base();
    value.as_object_mut().expect("object").remove("devices");
    merge(&mut value, json!({ "vxlan": { "vni": 4242 } }));
    merge(&mut value, patch);
    serde_json::from_value(value).expect("test spec deserializes")
}

fn overlay_problems(patch: Value) -> Vec<String> {
    problems("ovl", &overlay(patch))
}

#[test]
fn network_vxlan_is_valid_and_compiles_to_the_overlay_class() {
    let spec = overlay(json!({ "mtu": 1400, "interfaceName": "ovl0" }));
    assert_eq!(validate_network("ovl", &spec), Ok(()));
    let request = spec.device_request().expect("compiles");
    assert_eq!(request.device_class_name, "overlay.knic.dev");
    assert_eq!(request.device_class_name, OVERLAY_DEVICE_CLASS);
    assert_eq!(request.selectors, Vec::<String>::new());
    assert_eq!(request.count, 1);
    assert_eq!(
        serde_json::to_value(template_config("ovl", &spec)).expect("serializes"),
        json!({
            "apiVersion": "knic.dev/v1alpha1",
            "kind": "NetworkConfig",
            "interface": { "name": "ovl0", "mtu": 1400 },
            "ipam": { "network": "ovl" }
        })
    );
}

#[test]
fn network_vxlan_yaml_without_devices_parses() {
    let spec: NetworkSpec = serde_yaml_ng::from_str(
        "vxlan: {vni: 4242, port: 8472}\nipam: {subnets: [{cidr: 10.42.0.0/24, gateway: 10.42.0.1}]}\nnamespaces: {names: [team-a]}\n",
    )
    .expect("parses");
    assert!(spec.devices.is_empty());
    assert_eq!(spec.vxlan.as_ref().map(Vxlan::port), Some(8472));
    assert_eq!(validate_network("ovl", &spec), Ok(()));
}

#[test]
fn network_vxlan_summary_names_vni_and_non_default_port() {
    assert_eq!(overlay(json!({})).devices_summary(), "vxlan vni=4242");
    assert_eq!(
        overlay(json!({ "vxlan": { "port": 4789 } })).devices_summary(),
        "vxlan vni=4242"
    );
    assert_eq!(
        overlay(json!({ "vxlan": { "port": 8472 } })).devices_summary(),
        "vxlan vni=4242 port=8472"
    );
    // Without vxlan the column is the devices' summary, as before.
    assert_eq!(with(json!({})).devices_summary(), "vf");
}

#[test]
fn network_vxlan_mtu_bounds_are_accepted_at_the_edges() {
    for mtu in [576, 65485] {
        assert_eq!(
            validate_network("ovl", &overlay(json!({ "mtu": mtu }))),
            Ok(()),
            "{mtu}"
        );
    }
    let v6 = json!({ "cidr": "2001:db8:42::/64" });
    let dual = json!({ "ipam": { "subnets": [{ "cidr": "10.42.0.0/24" }, v6] }, "mtu": 1280 });
    assert_eq!(validate_network("ovl", &overlay(dual)), Ok(()));
}

/// One `#[test]` per bad overlay (the overlay base with a patch), with the exact messages.
macro_rules! overlay_rejects {
    ($($name:ident: $patch:tt => [$($message:expr),+ $(,)?];)*) => {
        $(
            #[test]
            fn $name() {
                assert_eq!(
                    overlay_problems(json!($patch)),
                    vec![$($message.to_owned()),+]
                );
            }
        )*
    };
}

overlay_rejects! {
    network_vxlan_reject_vni_zero: { "vxlan": { "vni": 0 } }
        => ["spec.vxlan.vni: must be between 1 and 16777215 (24 bits), got 0"];
    network_vxlan_reject_vni_over_24_bits: { "vxlan": { "vni": 16777216 } }
        => ["spec.vxlan.vni: must be between 1 and 16777215 (24 bits), got 16777216"];
    network_vxlan_reject_port_zero: { "vxlan": { "port": 0 } }
        => ["spec.vxlan.port: must be between 1 and 65535, got 0"];
    network_vxlan_reject_devices: { "devices": { "kind": "vf" } }
        => ["spec.devices: must be empty with spec.vxlan: overlay pods get a veth on the node's overlay bridge (device \"overlay\", class overlay.knic.dev)"];
    network_vxlan_reject_devices_class: { "devices": { "deviceClassName": "overlay.knic.dev" } }
        => ["spec.devices: must be empty with spec.vxlan: overlay pods get a veth on the node's overlay bridge (device \"overlay\", class overlay.knic.dev)"];
    network_vxlan_reject_vlan: { "vlan": 100 }
        => ["spec.vlan: cannot be set with spec.vxlan: the overlay is not on a VLAN of a device (its underlay may be)"];
    network_vxlan_reject_vlan_share_group: { "vlan": 100, "vlanShareGroup": "storage" }
        => [
            "spec.vlan: cannot be set with spec.vxlan: the overlay is not on a VLAN of a device (its underlay may be)",
            "spec.vlanShareGroup: cannot be set with spec.vxlan: the overlay is not on a VLAN of a device (its underlay may be)",
        ];
    network_vxlan_reject_share_group_alone: { "vlanShareGroup": "storage" }
        => ["spec.vlanShareGroup: cannot be set with spec.vxlan: the overlay is not on a VLAN of a device (its underlay may be)"];
    network_vxlan_reject_two_interfaces: { "interfacesPerPod": 2 }
        => ["spec.interfacesPerPod: must be 1 with spec.vxlan, got 2: every interface would join the same segment"];
    network_vxlan_reject_static: { "ipam": { "subnets": null, "static": {} } }
        => ["spec.vxlan: requires spec.ipam.subnets: nodes learn where each pod is from its NetworkAddress objects, which static addressing does not create"];
    network_vxlan_reject_mtu_below_ipv4_floor: { "mtu": 575 }
        => ["spec.mtu: 575 is below 576, the minimum MTU of an overlay Network (every IPv4 host accepts 576-byte datagrams; 1280 with an IPv6 subnet)"];
    network_vxlan_reject_mtu_below_ipv6_floor: { "mtu": 1279, "ipam": { "subnets": [{ "cidr": "2001:db8:42::/64" }] } }
        => ["spec.mtu: 1279 is below 1280, the minimum MTU for IPv6 (spec.ipam.subnets[0] is IPv6)"];
    network_vxlan_reject_mtu_above_underlay: { "mtu": 65486 }
        => ["spec.mtu: 65486 is above 65485, the largest MTU of an overlay Network (the largest underlay MTU, 65535, minus 50 bytes of VXLAN over IPv4)"];
    // Outside what any link takes, the driver's own rule speaks, once.
    network_vxlan_reject_mtu_out_of_range: { "mtu": 10 }
        => ["spec.mtu: must be between 68 and 65535, got 10"];
    network_vxlan_reject_everything_in_spec_order: {
        "vxlan": { "vni": 0, "port": 0 }, "devices": { "kind": "vf" }, "vlan": 7,
        "interfacesPerPod": 3, "mtu": 100
    } => [
        "spec.devices: must be empty with spec.vxlan: overlay pods get a veth on the node's overlay bridge (device \"overlay\", class overlay.knic.dev)",
        "spec.vxlan.vni: must be between 1 and 16777215 (24 bits), got 0",
        "spec.vxlan.port: must be between 1 and 65535, got 0",
        "spec.vlan: cannot be set with spec.vxlan: the overlay is not on a VLAN of a device (its underlay may be)",
        "spec.mtu: 100 is below 576, the minimum MTU of an overlay Network (every IPv4 host accepts 576-byte datagrams; 1280 with an IPv6 subnet)",
        "spec.interfacesPerPod: must be 1 with spec.vxlan, got 3: every interface would join the same segment",
    ];
}

#[test]
fn network_vxlan_devices_empty_without_vxlan_is_refused_with_the_hint() {
    let mut value = base();
    value.as_object_mut().expect("object").remove("devices");
    let spec: NetworkSpec = serde_json::from_value(value).expect("deserializes");
    assert_eq!(
        problems("blue", &spec),
        vec![
            "spec.devices: set deviceClassName (with optional selectors) or at least one of kind, vendor, pfName, minSpeed, numaNode and rdma; empty devices are allowed only with spec.vxlan"
        ]
    );
}

#[test]
fn network_vxlan_overlay_class_without_vxlan_is_refused() {
    let spec = with_devices(json!({ "deviceClassName": "overlay.knic.dev" }), json!({}));
    assert_eq!(
        problems("blue", &spec),
        vec![
            "spec.devices.deviceClassName: overlay.knic.dev selects the nodes' overlay devices, which carry only Networks with spec.vxlan"
        ]
    );
}

#[test]
fn network_vxlan_device_request_refuses_devices() {
    let spec = overlay(json!({ "devices": { "kind": "vf" } }));
    let errors = spec.device_request().expect_err("devices with vxlan");
    assert_eq!(
        errors.to_string(),
        "spec.devices: must be empty with spec.vxlan: overlay pods get a veth on the node's overlay bridge (device \"overlay\", class overlay.knic.dev)"
    );
}

fn clash(mine: &NetworkSpec, others: &[(&str, NetworkSpec)]) -> Vec<String> {
    let others: Vec<(String, NetworkSpec)> = others
        .iter()
        .map(|(n, s)| ((*n).to_owned(), s.clone()))
        .collect();
    validate_against("ovl", mine, &others)
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn network_vxlan_against_same_vni_is_refused_whatever_the_port_and_subnets() {
    let mine = overlay(json!({ "vxlan": { "port": 8472 } }));
    let blue = overlay(json!({ "ipam": { "subnets": [{ "cidr": "10.9.0.0/16" }] } }));
    assert_eq!(
        clash(&mine, &[("blue", blue.clone()), ("ovl", mine.clone())]),
        vec![
            "spec.vxlan.vni: VNI 4242 is already used by network \"blue\"; two Networks on one VNI would be one layer-2 segment (pick another vni)"
        ]
    );
    // Two clashes are reported in name order, so the status does not churn.
    assert_eq!(
        clash(&mine, &[("red", blue.clone()), ("blue", blue)]),
        vec![
            "spec.vxlan.vni: VNI 4242 is already used by network \"blue\"; two Networks on one VNI would be one layer-2 segment (pick another vni)",
            "spec.vxlan.vni: VNI 4242 is already used by network \"red\"; two Networks on one VNI would be one layer-2 segment (pick another vni)",
        ]
    );
}

#[test]
fn network_vxlan_against_other_vnis_and_device_networks_is_fine() {
    let mine = overlay(json!({}));
    let other_vni = overlay(json!({ "vxlan": { "vni": 4243 } }));
    // Same subnet as the base device Network: separate segments, separate allocators.
    assert_eq!(
        clash(&mine, &[("green", other_vni), ("vf", with(json!({})))]),
        Vec::<String>::new()
    );
    // And the device Network does not see the overlay either.
    let others = vec![("ovl".to_owned(), mine)];
    assert_eq!(validate_against("vf", &with(json!({})), &others), vec![]);
}
