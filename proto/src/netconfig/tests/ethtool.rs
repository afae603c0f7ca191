//! `ethtool`: features, rings, channels, coalescing. Every refusal asserts its exact text.

use serde_json::json;

use super::*;

const UNKNOWN: &str = "unknown feature; use a kernel name as `ethtool -k` prints it (e.g. rx-gro, \
                       rx-gro-hw, tx-tcp-segmentation, rx-checksum, rx-vlan-filter) or an alias \
                       (rx, tx, sg, tso, gso, gro, lro, rxvlan, txvlan, ntuple, rxhash)";
const SHAPE: &str = "a feature name is 1-31 lowercase letters, digits, '-' or '_', as `ethtool -k` \
                     prints it (e.g. rx-gro, tx-tcp-segmentation)";

rejects! {
    // shape
    reject_unknown_ethtool_field: { "ethtool": { "offloads": {} } }
        => ["ethtool.offloads: unknown field"];
    reject_ethtool_not_an_object: { "ethtool": ["gro"] }
        => ["ethtool: expected an object, got an array"];
    reject_features_not_a_map: { "ethtool": { "features": "gro" } }
        => ["ethtool.features: expected a map of feature names to true/false, got string \"gro\""];
    reject_feature_value_not_a_boolean: { "ethtool": { "features": { "gro": "off" } } }
        => ["ethtool.features[\"gro\"]: expected a boolean (true or false), got string \"off\""];
    reject_unknown_rings_field: { "ethtool": { "rings": { "rx": 512, "rxBufLen": 2048 } } }
        => ["ethtool.rings.rxBufLen: unknown field"];
    reject_unknown_channels_field: { "ethtool": { "channels": { "queues": 4 } } }
        => ["ethtool.channels.queues: unknown field"];
    reject_unknown_coalesce_field: { "ethtool": { "coalesce": { "rx-usecs": 4 } } }
        => ["ethtool.coalesce.rx-usecs: unknown field"];
    reject_ring_as_string: { "ethtool": { "rings": { "rx": "512" } } }
        => ["ethtool.rings.rx: expected an integer, got string \"512\""];
    reject_negative_ring: { "ethtool": { "rings": { "tx": -1 } } }
        => [format!("ethtool.rings.tx: must be between 0 and {}, got -1", u32::MAX)];
    reject_fractional_channels: { "ethtool": { "channels": { "combined": 1.5 } } }
        => ["ethtool.channels.combined: expected an integer, got number 1.5"];
    reject_adaptive_as_number: { "ethtool": { "coalesce": { "adaptiveRx": 1 } } }
        => ["ethtool.coalesce.adaptiveRx: expected a boolean (true or false), got number 1"];

    // feature names
    reject_upper_case_feature: { "ethtool": { "features": { "GRO": false } } }
        => [format!("ethtool.features[\"GRO\"]: {SHAPE}")];
    reject_feature_with_space: { "ethtool": { "features": { "rx gro": false } } }
        => [format!("ethtool.features[\"rx gro\"]: {SHAPE}")];
    reject_empty_feature: { "ethtool": { "features": { "": false } } }
        => [format!("ethtool.features[\"\"]: {SHAPE}")];
    reject_too_long_feature: { "ethtool": { "features": { "tx-tcp-mangleid-segmentation-xyz": true } } }
        => [format!("ethtool.features[\"tx-tcp-mangleid-segmentation-xyz\"]: {SHAPE}")];
    reject_unknown_feature: { "ethtool": { "features": { "rx-gor": false } } }
        => [format!("ethtool.features[\"rx-gor\"]: {UNKNOWN}")];
    reject_ufo_gone_from_the_kernel: { "ethtool": { "features": { "ufo": false } } }
        => [format!("ethtool.features[\"ufo\"]: {UNKNOWN}")];
    reject_alias_contradicting_kernel_name: { "ethtool": { "features": { "gro": false, "rx-gro": true } } }
        => ["ethtool.features[\"rx-gro\"]: contradicts \"gro\": both set the kernel feature rx-gro, one on and one off"];
    reject_group_contradicting_member: { "ethtool": { "features": { "tso": true, "tx-tcp6-segmentation": false } } }
        => ["ethtool.features[\"tx-tcp6-segmentation\"]: contradicts \"tso\": both set the kernel feature tx-tcp6-segmentation, one on and one off"];

    // rings
    reject_zero_ring: { "ethtool": { "rings": { "rx": 0 } } }
        => ["ethtool.rings.rx: must be between 1 and 65536, got 0"];
    reject_too_large_ring: { "ethtool": { "rings": { "rxJumbo": 65537 } } }
        => ["ethtool.rings.rxJumbo: must be between 1 and 65536, got 65537"];
    reject_zero_rx_mini: { "ethtool": { "rings": { "rxMini": 0, "tx": 4096 } } }
        => ["ethtool.rings.rxMini: must be between 1 and 65536, got 0"];

    // channels
    reject_channels_all_zero: { "ethtool": { "channels": { "rx": 0, "tx": 0, "combined": 0 } } }
        => ["ethtool.channels: every count given is 0; a device needs at least one RX and one TX channel"];
    reject_only_combined_zero_and_rx_zero: { "ethtool": { "channels": { "combined": 0, "rx": 0, "tx": 2 } } }
        => ["ethtool.channels: combined 0 with rx 0 leaves no RX channel"];
    reject_combined_zero_and_tx_zero: { "ethtool": { "channels": { "combined": 0, "tx": 0, "rx": 2 } } }
        => ["ethtool.channels: combined 0 with tx 0 leaves no TX channel"];
    reject_only_combined_given_as_zero: { "ethtool": { "channels": { "combined": 0 } } }
        => ["ethtool.channels: every count given is 0; a device needs at least one RX and one TX channel"];
    reject_too_many_channels: { "ethtool": { "channels": { "combined": 4097 } } }
        => ["ethtool.channels.combined: must be between 0 and 4096, got 4097"];

    // coalescing
    reject_too_long_coalescing: { "ethtool": { "coalesce": { "rxUsecs": 1000001 } } }
        => ["ethtool.coalesce.rxUsecs: must be between 0 and 1000000, got 1000001"];
    reject_too_many_frames: { "ethtool": { "coalesce": { "txFrames": 2000000 } } }
        => ["ethtool.coalesce.txFrames: must be between 0 and 1000000, got 2000000"];

    // a vfio-pci function has no netdev to tune
    reject_ethtool_with_vfio: { "deviceMode": "vfio-pci", "ethtool": { "features": { "gro": false } } }
        => ["ethtool: cannot be set with deviceMode: \"vfio-pci\": the device is bound to vfio-pci and has no network interface to configure"];
}

#[test]
fn every_problem_is_reported_at_once() {
    assert_eq!(
        problems(json!({"ethtool": {
            "features": {"rx-gor": true, "gro": 1},
            "rings": {"rx": 0, "tx": 70000},
        }})),
        vec![
            "ethtool.features[\"gro\"]: expected a boolean (true or false), got number 1"
                .to_owned()
        ],
        "parse errors come first, alone"
    );
    assert_eq!(
        problems(json!({"ethtool": {
            "features": {"rx-gor": true},
            "rings": {"rx": 0, "tx": 70000},
        }})),
        vec![
            format!("ethtool.features[\"rx-gor\"]: {UNKNOWN}"),
            "ethtool.rings.rx: must be between 1 and 65536, got 0".to_owned(),
            "ethtool.rings.tx: must be between 1 and 65536, got 70000".to_owned(),
        ]
    );
}

#[test]
fn aliases_become_kernel_names_and_groups_keep_their_long_name() {
    let v = valid(json!({"ethtool": {"features": {
        "gro": false, "generic-segmentation-offload": true, "rx": true, "lro": false,
        "rx-gro-hw": false, "rx-vlan-filter": true, "tx": false, "sg": true,
        "tcp-segmentation-offload": false, "tx-tcp-segmentation": false,
        "rxvlan": true, "txvlan": true, "ntuple": false, "rxhash": true,
    }}}));
    let features = v.ethtool.expect("ethtool").features;
    let expected: BTreeMap<String, bool> = [
        ("rx-gro", false),
        ("tx-generic-segmentation", true),
        ("rx-checksum", true),
        ("rx-lro", false),
        ("rx-gro-hw", false),
        ("rx-vlan-filter", true),
        ("tx-checksumming", false),
        ("scatter-gather", true),
        ("tcp-segmentation-offload", false),
        ("tx-tcp-segmentation", false),
        ("rx-vlan-hw-parse", true),
        ("tx-vlan-hw-insert", true),
        ("rx-ntuple-filter", false),
        ("rx-hashing", true),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(features, expected);
    assert_eq!(
        group_members("tx-checksumming").map(<[_]>::len),
        Some(5),
        "tx-checksum-*"
    );
}

#[test]
fn every_alias_and_group_member_is_a_kernel_feature() {
    for (_, _, kernel) in ETHTOOL_ALIASES {
        assert!(KERNEL_FEATURES.contains(kernel), "{kernel}");
    }
    for (_, _, members) in ETHTOOL_GROUPS {
        for m in *members {
            assert!(KERNEL_FEATURES.contains(m), "{m}");
        }
    }
}

#[test]
fn rings_channels_coalesce_are_kept_and_empty_blocks_ask_for_nothing() {
    let v = valid(json!({"ethtool": {
        "rings": {"rx": 4096, "tx": 1024, "rxMini": 1, "rxJumbo": 65536},
        "channels": {"combined": 4, "other": 1, "rx": 0, "tx": 0},
        "coalesce": {"rxUsecs": 0, "txUsecs": 1000000, "rxFrames": 64, "txFrames": 0,
                     "adaptiveRx": true, "adaptiveTx": false},
    }}));
    let e = v.ethtool.expect("ethtool");
    assert_eq!(
        e.rings,
        Some(Rings {
            rx: Some(4096),
            tx: Some(1024),
            rx_mini: Some(1),
            rx_jumbo: Some(65536)
        })
    );
    assert_eq!(e.channels.expect("channels").combined, Some(4));
    assert_eq!(e.coalesce.expect("coalesce").adaptive_tx, Some(false));
    // The checkpoint form: camelCase, only what is set.
    assert_eq!(
        serde_json::to_value(&e).expect("json")["rings"],
        json!({"rx": 4096, "tx": 1024, "rxMini": 1, "rxJumbo": 65536})
    );
    let empty =
        valid(json!({"ethtool": {"features": {}, "rings": {}, "channels": {}, "coalesce": {}}}));
    assert_eq!(empty.ethtool, None);
    // Separate RX/TX channels instead of combined ones.
    valid(json!({"ethtool": {"channels": {"combined": 0, "rx": 2, "tx": 2}}}));
}

#[test]
fn layers_merge_features_by_key_and_groups_by_field() {
    let class = parse(
        &object(json!({"ethtool": {
            "features": {"gro": false, "lro": false},
            "rings": {"rx": 1024, "tx": 1024},
            "coalesce": {"adaptiveRx": true},
        }})),
        "",
    )
    .expect("class");
    let claim = parse(
        &object(json!({"ethtool": {
            "features": {"gro": true},
            "rings": {"tx": 2048},
            "channels": {"combined": 2},
        }})),
        "",
    )
    .expect("claim");
    let merged = merge(&[class, claim]);
    let e = validate(&merged).expect("valid").ethtool.expect("ethtool");
    assert_eq!(e.features.get("rx-gro"), Some(&true));
    assert_eq!(e.features.get("rx-lro"), Some(&false));
    assert_eq!(
        e.rings,
        Some(Rings {
            rx: Some(1024),
            tx: Some(2048),
            ..Rings::default()
        })
    );
    assert_eq!(e.channels.expect("channels").combined, Some(2));
    assert_eq!(e.coalesce.expect("coalesce").adaptive_rx, Some(true));
}

#[test]
fn the_hand_parser_and_the_derived_deserialize_agree_on_a_full_block() {
    let wire = object(json!({"ethtool": {
        "features": {"gro": false, "tx-checksumming": true},
        "rings": {"rx": 512, "tx": 512, "rxMini": 8, "rxJumbo": 16},
        "channels": {"rx": 1, "tx": 1, "other": 1, "combined": 2},
        "coalesce": {"rxUsecs": 8, "txUsecs": 8, "rxFrames": 32, "txFrames": 32,
                     "adaptiveRx": false, "adaptiveTx": true},
    }}));
    let parsed = parse(&wire, "").expect("parses");
    let derived: NetworkConfig = serde_json::from_value(wire.clone()).expect("derive parses");
    assert_eq!(parsed, derived);
    assert_eq!(serde_json::to_value(&parsed).expect("json"), wire);
}
