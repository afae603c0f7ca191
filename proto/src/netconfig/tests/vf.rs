//! `vf`: SR-IOV VF settings. Every refusal asserts its exact text, as in the parent module.

use serde_json::json;

use super::*;

rejects! {
    // shape
    reject_unknown_vf_field: { "vf": { "vlanId": 5 } }
        => ["vf.vlanId: unknown field"];
    reject_vf_not_an_object: { "vf": "02:00:00:00:00:01" }
        => ["vf: expected an object, got string \"02:00:00:00:00:01\""];
    reject_vf_spoof_chk_as_string: { "vf": { "spoofChk": "on" } }
        => ["vf.spoofChk: expected a boolean (true or false), got string \"on\""];
    reject_vf_trust_as_number: { "vf": { "trust": 1 } }
        => ["vf.trust: expected a boolean (true or false), got number 1"];
    reject_vf_mac_as_number: { "vf": { "mac": 2 } }
        => ["vf.mac: expected a string, got number 2"];
    reject_vf_rate_as_string: { "vf": { "maxTxRate": "1000" } }
        => ["vf.maxTxRate: expected an integer, got string \"1000\""];
    reject_negative_vf_rate: { "vf": { "minTxRate": -1 } }
        => ["vf.minTxRate: must be between 0 and 4294967295, got -1"];

    // vlan
    reject_vf_vlan_4095: { "vf": { "vlan": 4095 } }
        => ["vf.vlan: must be between 1 and 4094, or 0 for no VLAN, got 4095"];
    reject_vf_vlan_70000: { "vf": { "vlan": 70000 } }
        => ["vf.vlan: must be between 1 and 4094, or 0 for no VLAN, got 70000"];
    reject_negative_vf_vlan: { "vf": { "vlan": -1 } }
        => ["vf.vlan: must be between 1 and 4094, or 0 for no VLAN, got -1"];

    // qos
    reject_vf_qos_8: { "vf": { "vlan": 100, "qos": 8 } }
        => ["vf.qos: must be between 0 and 7, got 8"];
    reject_vf_qos_300: { "vf": { "vlan": 100, "qos": 300 } }
        => ["vf.qos: must be between 0 and 7, got 300"];
    reject_vf_qos_without_vlan: { "vf": { "qos": 3 } }
        => ["vf.qos: 3 is a VLAN priority and needs a VLAN; set vf.vlan (1-4094)"];
    reject_vf_qos_with_vlan_0: { "vf": { "vlan": 0, "qos": 3 } }
        => ["vf.qos: 3 is a VLAN priority and needs a VLAN; vf.vlan is 0 (no VLAN)"];

    // vlanProtocol
    reject_unknown_vf_vlan_protocol: { "vf": { "vlan": 100, "vlanProtocol": "802.1AD" } }
        => ["vf.vlanProtocol: must be \"802.1Q\" or \"802.1ad\", got \"802.1AD\""];
    reject_vf_802_1ad_without_vlan: { "vf": { "vlanProtocol": "802.1ad" } }
        => ["vf.vlanProtocol: \"802.1ad\" is a VLAN tag type and needs a VLAN; set vf.vlan (1-4094)"];
    reject_vf_802_1ad_with_vlan_0: { "vf": { "vlan": 0, "vlanProtocol": "802.1ad" } }
        => ["vf.vlanProtocol: \"802.1ad\" is a VLAN tag type and needs a VLAN; vf.vlan is 0 (no VLAN)"];

    // mac
    reject_vf_multicast_mac: { "vf": { "mac": "01:00:5e:00:00:01" } }
        => ["vf.mac: 01:00:5e:00:00:01 is a multicast address; a unicast address is required (the low bit of the first octet must be 0)"];
    reject_vf_zero_mac: { "vf": { "mac": "00:00:00:00:00:00" } }
        => ["vf.mac: 00:00:00:00:00:00 is all zeros, which is not a usable address"];
    reject_malformed_vf_mac: { "vf": { "mac": "02:00:00:00:01" } }
        => ["vf.mac: \"02:00:00:00:01\" is not a MAC address; expected six colon-separated hex pairs like 02:00:00:00:00:01"];
    reject_vf_mac_other_than_hardware_address: {
        "interface": { "hardwareAddress": "02:00:00:00:00:01" },
        "vf": { "mac": "02:00:00:00:00:02" }
    } => ["vf.mac: 02:00:00:00:00:02 differs from interface.hardwareAddress 02:00:00:00:00:01; the pod would see one and the PF enforce the other (set one, or both the same)"];

    // rates
    reject_vf_min_rate_above_max: { "vf": { "minTxRate": 5000, "maxTxRate": 1000 } }
        => ["vf.minTxRate: 5000 Mbit/s is above vf.maxTxRate 1000 Mbit/s; the guaranteed rate must not exceed the cap (a maxTxRate of 0 means no cap)"];

    // linkState
    reject_unknown_vf_link_state: { "vf": { "linkState": "up" } }
        => ["vf.linkState: must be \"auto\", \"enable\" or \"disable\", got \"up\""];
}

#[test]
fn every_vf_problem_is_reported_at_once() {
    assert_eq!(
        problems(json!({
            "vf": {
                "mac": "ff:ff:ff:ff:ff:ff", "vlan": 5000, "qos": 9, "vlanProtocol": "qinq",
                "minTxRate": 10, "maxTxRate": 5, "linkState": "on"
            }
        })),
        [
            "vf.mac: ff:ff:ff:ff:ff:ff is a multicast address; a unicast address is required (the low bit of the first octet must be 0)",
            "vf.vlan: must be between 1 and 4094, or 0 for no VLAN, got 5000",
            "vf.qos: must be between 0 and 7, got 9",
            "vf.vlanProtocol: must be \"802.1Q\" or \"802.1ad\", got \"qinq\"",
            "vf.minTxRate: 10 Mbit/s is above vf.maxTxRate 5 Mbit/s; the guaranteed rate must not exceed the cap (a maxTxRate of 0 means no cap)",
            "vf.linkState: must be \"auto\", \"enable\" or \"disable\", got \"on\"",
        ]
    );
}

#[test]
fn vf_parse_errors_carry_the_config_prefix() {
    let err = parse(
        &object(json!({ "vf": { "trust": "yes" } })),
        "config[1].parameters",
    )
    .expect_err("must fail");
    assert_eq!(
        err.to_string(),
        "config[1].parameters.vf.trust: expected a boolean (true or false), got string \"yes\""
    );
}

fn full_vf() -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "interface": { "hardwareAddress": "02:AB:00:00:00:01" },
        "vf": {
            "mac": "02:ab:00:00:00:01",
            "vlan": 100,
            "qos": 5,
            "vlanProtocol": "802.1ad",
            "spoofChk": true,
            "trust": false,
            "minTxRate": 1000,
            "maxTxRate": 10000,
            "linkState": "enable"
        }
    })
}

#[test]
fn full_vf_block_validates_and_round_trips() {
    let wire = full_vf();
    let config = parse(&wire, "").expect("parses");
    let derived: NetworkConfig = serde_json::from_value(wire.clone()).expect("derive parses");
    assert_eq!(config, derived);
    assert_eq!(serde_json::to_value(&config).expect("serializes"), wire);

    let valid = validate(&config).expect("validates");
    let expected = VfSettings {
        mac: Some([0x02, 0xab, 0, 0, 0, 1]),
        vlan: Some(100),
        qos: Some(5),
        vlan_protocol: Some(VfVlanProtocol::Dot1Ad),
        spoof_chk: Some(true),
        trust: Some(false),
        min_tx_rate: Some(1000),
        max_tx_rate: Some(10000),
        link_state: Some(VfLinkState::Enable),
    };
    assert_eq!(valid.vf, Some(expected));

    // The checkpoint form is camelCase, with the MAC and the enumerations as written.
    let stored = serde_json::to_value(&valid).expect("serializes");
    assert_eq!(
        stored["vf"],
        json!({
            "mac": "02:ab:00:00:00:01", "vlan": 100, "qos": 5, "vlanProtocol": "802.1ad",
            "spoofChk": true, "trust": false, "minTxRate": 1000, "maxTxRate": 10000,
            "linkState": "enable"
        })
    );
    let restored: ValidConfig = serde_json::from_value(stored).expect("deserializes");
    assert_eq!(restored, valid);
}

#[test]
fn derived_deserialize_denies_unknown_vf_fields() {
    let mut wire = full_vf();
    wire["vf"]["vfIndex"] = json!(3);
    assert!(serde_json::from_value::<NetworkConfig>(wire.clone()).is_err());
    assert_eq!(
        parse(&wire, "").expect_err("must fail").to_string(),
        "vf.vfIndex: unknown field"
    );
}

#[test]
fn vf_values_at_the_edges_that_accept() {
    let vf = |fields: Value| valid(json!({ "vf": fields })).vf.expect("settings");
    assert_eq!(vf(json!({ "vlan": 1 })).vlan, Some(1));
    assert_eq!(vf(json!({ "vlan": 4094, "qos": 7 })).qos, Some(7));
    // 0 is "no VLAN"; the defaults of priority and tag type are harmless without one, so a
    // claim can turn a class's VLAN off by zeroing all three.
    let off = vf(json!({ "vlan": 0, "qos": 0, "vlanProtocol": "802.1Q" }));
    assert_eq!(
        (off.vlan, off.qos, off.vlan_protocol),
        (Some(0), Some(0), Some(VfVlanProtocol::Dot1Q))
    );
    // A cap of 0 is "no cap", so any guarantee fits under it; equal rates are fine.
    let uncapped = vf(json!({ "minTxRate": 5000, "maxTxRate": 0 }));
    assert_eq!(
        (uncapped.min_tx_rate, uncapped.max_tx_rate),
        (Some(5000), Some(0))
    );
    assert_eq!(
        vf(json!({ "minTxRate": 100, "maxTxRate": 100 })).min_tx_rate,
        Some(100)
    );
    for (text, state) in [
        ("auto", VfLinkState::Auto),
        ("enable", VfLinkState::Enable),
        ("disable", VfLinkState::Disable),
    ] {
        assert_eq!(vf(json!({ "linkState": text })).link_state, Some(state));
    }
    // The same MAC in both places, spelt differently, is no conflict.
    let same = valid(json!({
        "interface": { "hardwareAddress": "02:AB:00:00:00:01" },
        "vf": { "mac": "02:ab:00:00:00:01" }
    }));
    assert_eq!(same.vf.and_then(|v| v.mac), same.hardware_address);
    // An empty block asks for nothing.
    assert_eq!(valid(json!({ "vf": {} })).vf, None);
    assert_eq!(valid(json!({ "vf": { "trust": null } })).vf, None);
}

#[test]
fn vf_merges_field_by_field_class_then_claim() {
    let class = parse(
        &object(json!({ "vf": { "vlan": 100, "qos": 3, "spoofChk": true, "maxTxRate": 10000 } })),
        "config[0].parameters",
    )
    .expect("class parses");
    let claim = parse(
        &object(json!({ "vf": { "mac": "02:00:00:00:00:07", "maxTxRate": 2000, "trust": true } })),
        "config[1].parameters",
    )
    .expect("claim parses");
    let merged = merge(&[class.clone(), claim]);
    assert_eq!(
        merged.vf,
        Some(VfConfig {
            mac: Some("02:00:00:00:00:07".to_owned()),
            vlan: Some(100),
            qos: Some(3),
            spoof_chk: Some(true),
            trust: Some(true),
            max_tx_rate: Some(2000),
            ..VfConfig::default()
        })
    );
    validate(&merged).expect("merged config validates");
    assert_eq!(merge(&[class.clone(), NetworkConfig::default()]), class);

    // A claim turning the class's VLAN off must also zero its priority, and is told so.
    let untag = parse(&object(json!({ "vf": { "vlan": 0 } })), "").expect("parses");
    let errors = validate(&merge(&[class.clone(), untag])).expect_err("must fail");
    assert_eq!(
        errors.to_string(),
        "vf.qos: 3 is a VLAN priority and needs a VLAN; vf.vlan is 0 (no VLAN)"
    );
    let untag = parse(&object(json!({ "vf": { "vlan": 0, "qos": 0 } })), "").expect("parses");
    let valid = validate(&merge(&[class, untag])).expect("validates");
    assert_eq!(valid.vf.map(|v| (v.vlan, v.qos)), Some((Some(0), Some(0))));
}
