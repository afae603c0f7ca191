//! Networks that validate: the forms a spec takes, the CEL the friendly form compiles to, the
//! claim template and namespace selection it produces.

use super::*;

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
        "spec.devices: set deviceClassName (with optional selectors) or at least one of kind, vendor, pfName, minSpeed, numaNode and rdma; empty devices are allowed only with spec.vxlan"
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
        grace_period_seconds: None,
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
        grace_period_seconds: None,
    };
    assert_eq!(
        by_label.identity("ns", "db-7f9c", &labels, 0).as_deref(),
        Some("ns/db-primary")
    );
    assert_eq!(by_label.identity("ns", "x", &BTreeMap::new(), 0), None);
}
