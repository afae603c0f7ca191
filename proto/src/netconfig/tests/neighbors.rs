//! `neighbors`: parse, merge, validation (exact texts) and the checkpoint form.

use super::*;

#[test]
fn neighbors_validate_in_order_with_canonical_macs() {
    let v = valid(json!({
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
        "neighbors": [
            { "address": "192.0.2.1", "hardwareAddress": "02:AA:bb:00:00:01" },
            { "address": "2001:db8::1", "hardwareAddress": "02:aa:bb:00:00:02" },
            { "address": "fe80::1", "hardwareAddress": "02:aa:bb:00:00:02" }
        ]
    }));
    assert_eq!(
        v.neighbors,
        vec![
            Neighbor {
                address: ip("192.0.2.1"),
                hardware_address: [2, 0xaa, 0xbb, 0, 0, 1]
            },
            Neighbor {
                address: ip("2001:db8::1"),
                hardware_address: [2, 0xaa, 0xbb, 0, 0, 2]
            },
            Neighbor {
                address: ip("fe80::1"),
                hardware_address: [2, 0xaa, 0xbb, 0, 0, 2]
            },
        ]
    );
    // The checkpoint form: readable MACs, and back.
    let stored = serde_json::to_value(&v).expect("serializes");
    assert_eq!(
        stored["neighbors"][0],
        json!({ "address": "192.0.2.1", "hardwareAddress": "02:aa:bb:00:00:01" })
    );
    let back: ValidConfig = serde_json::from_value(stored).expect("deserializes");
    assert_eq!(back, v);
    // A config without neighbors stores none (older checkpoints load).
    let plain = serde_json::to_value(valid(json!({}))).expect("serializes");
    assert!(plain.get("neighbors").is_none());
}

#[test]
fn neighbors_without_static_addresses_are_checked_by_class_only() {
    let v = valid(json!({
        "ipam": { "network": "pods" },
        "neighbors": [{ "address": "203.0.113.1", "hardwareAddress": "02:00:00:00:00:01" }]
    }));
    assert_eq!(v.neighbors.len(), 1);
    let v = valid(json!({
        "neighbors": [{ "address": "2001:db8::1", "hardwareAddress": "02:00:00:00:00:01" }]
    }));
    assert_eq!(v.neighbors.len(), 1);
}

#[test]
fn neighbors_merge_as_a_whole_list() {
    let class = parse(
        &object(json!({ "neighbors": [
            { "address": "192.0.2.1", "hardwareAddress": "02:00:00:00:00:01" },
            { "address": "192.0.2.2", "hardwareAddress": "02:00:00:00:00:02" }
        ] })),
        "",
    )
    .expect("parses");
    let claim = parse(
        &object(json!({ "neighbors": [
            { "address": "192.0.2.3", "hardwareAddress": "02:00:00:00:00:03" }
        ] })),
        "",
    )
    .expect("parses");
    let merged = merge(&[class.clone(), claim]);
    assert_eq!(
        merged.neighbors,
        Some(vec![NeighborConfig {
            address: "192.0.2.3".into(),
            hardware_address: "02:00:00:00:00:03".into()
        }])
    );
    // A claim without neighbors keeps the class's.
    let merged = merge(&[
        class.clone(),
        parse(&object(json!({})), "").expect("parses"),
    ]);
    assert_eq!(merged.neighbors, class.neighbors);
    // The derived Deserialize reads the same document.
    let derived: NetworkConfig = serde_json::from_value(object(json!({ "neighbors": [
        { "address": "192.0.2.1", "hardwareAddress": "02:00:00:00:00:01" },
        { "address": "192.0.2.2", "hardwareAddress": "02:00:00:00:00:02" }
    ] })))
    .expect("deserializes");
    assert_eq!(derived, class);
}

#[test]
fn too_many_neighbors() {
    let list: Vec<Value> = (0..=MAX_NEIGHBORS)
        .map(|i| json!({ "address": format!("10.0.{}.{}", i / 250, i % 250 + 1), "hardwareAddress": "02:00:00:00:00:01" }))
        .collect();
    assert_eq!(
        problems(json!({ "neighbors": list })),
        vec!["neighbors: 257 entries; at most 256 are allowed".to_owned()]
    );
}

rejects! {
    reject_neighbors_not_a_list: { "neighbors": { "address": "192.0.2.1" } }
        => ["neighbors: expected a list of neighbors, got an object"];
    reject_neighbor_not_an_object: { "neighbors": ["192.0.2.1"] }
        => ["neighbors[0]: expected an object, got string \"192.0.2.1\""];
    reject_neighbor_unknown_field: {
        "neighbors": [{ "address": "192.0.2.1", "hardwareAddress": "02:00:00:00:00:01", "state": "permanent" }]
    } => ["neighbors[0].state: unknown field"];
    reject_neighbor_missing_fields: { "neighbors": [{}] }
        => ["neighbors[0].address: required", "neighbors[0].hardwareAddress: required"];
    reject_neighbor_wrong_types: { "neighbors": [{ "address": 1, "hardwareAddress": true }] }
        => [
            "neighbors[0].address: expected a string, got number 1",
            "neighbors[0].hardwareAddress: expected a string, got boolean true",
        ];
    reject_neighbor_bad_address: {
        "neighbors": [{ "address": "192.0.2.300", "hardwareAddress": "02:00:00:00:00:01" }]
    } => ["neighbors[0].address: \"192.0.2.300\" is not a valid IPv4 or IPv6 address"];
    reject_neighbor_multicast: {
        "neighbors": [
            { "address": "224.0.0.1", "hardwareAddress": "02:00:00:00:00:01" },
            { "address": "ff02::1", "hardwareAddress": "02:00:00:00:00:01" }
        ]
    } => [
        "neighbors[0].address: 224.0.0.1 is not a unicast address",
        "neighbors[1].address: ff02::1 is not a unicast address",
    ];
    reject_neighbor_unspecified_and_broadcast: {
        "neighbors": [
            { "address": "0.0.0.0", "hardwareAddress": "02:00:00:00:00:01" },
            { "address": "::", "hardwareAddress": "02:00:00:00:00:01" },
            { "address": "255.255.255.255", "hardwareAddress": "02:00:00:00:00:01" }
        ]
    } => [
        "neighbors[0].address: 0.0.0.0 is not a unicast address",
        "neighbors[1].address: :: is not a unicast address",
        "neighbors[2].address: 255.255.255.255 is not a unicast address",
    ];
    reject_neighbor_loopback: {
        "neighbors": [{ "address": "127.0.0.2", "hardwareAddress": "02:00:00:00:00:01" }]
    } => ["neighbors[0].address: 127.0.0.2 is a loopback address, which never leaves a host"];
    reject_neighbor_multicast_mac: {
        "neighbors": [{ "address": "192.0.2.1", "hardwareAddress": "01:00:5e:00:00:01" }]
    } => ["neighbors[0].hardwareAddress: 01:00:5e:00:00:01 is a multicast address; a unicast address is required (the low bit of the first octet must be 0)"];
    reject_neighbor_zero_and_malformed_mac: {
        "neighbors": [
            { "address": "192.0.2.1", "hardwareAddress": "00:00:00:00:00:00" },
            { "address": "192.0.2.2", "hardwareAddress": "02:00:00:00:00" }
        ]
    } => [
        "neighbors[0].hardwareAddress: 00:00:00:00:00:00 is all zeros, which is not a usable address",
        "neighbors[1].hardwareAddress: \"02:00:00:00:00\" is not a MAC address; expected six colon-separated hex pairs like 02:00:00:00:00:01",
    ];
    reject_neighbor_duplicate_address: {
        "neighbors": [
            { "address": "192.0.2.1", "hardwareAddress": "02:00:00:00:00:01" },
            { "address": "2001:db8::1", "hardwareAddress": "02:00:00:00:00:01" },
            { "address": "192.0.2.1", "hardwareAddress": "02:00:00:00:00:02" }
        ]
    } => ["neighbors[2].address: 192.0.2.1 is already listed at neighbors[0]"];
    reject_neighbor_own_address: {
        "addresses": ["192.0.2.10/24"],
        "neighbors": [{ "address": "192.0.2.10", "hardwareAddress": "02:00:00:00:00:01" }]
    } => ["neighbors[0].address: 192.0.2.10 is one of this interface's own addresses"];
    reject_neighbor_off_link: {
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
        "neighbors": [
            { "address": "198.51.100.1", "hardwareAddress": "02:00:00:00:00:01" },
            { "address": "2001:db8:1::1", "hardwareAddress": "02:00:00:00:00:01" }
        ]
    } => [
        "neighbors[0].address: 198.51.100.1 is not inside any address's subnet, so it is not on-link and its entry would never be used",
        "neighbors[1].address: 2001:db8:1::1 is not inside any address's subnet, so it is not on-link and its entry would never be used",
    ];
    reject_neighbor_other_family_only: {
        "addresses": ["192.0.2.10/24"],
        "neighbors": [{ "address": "2001:db8::1", "hardwareAddress": "02:00:00:00:00:01" }]
    } => ["neighbors[0].address: 2001:db8::1 is not inside any address's subnet, so it is not on-link and its entry would never be used"];
    reject_neighbor_subnet_broadcast: {
        "addresses": ["192.0.2.10/24"],
        "neighbors": [
            { "address": "192.0.2.255", "hardwareAddress": "02:00:00:00:00:01" },
            { "address": "192.0.2.0", "hardwareAddress": "02:00:00:00:00:01" }
        ]
    } => [
        "neighbors[0].address: 192.0.2.255 is the broadcast address of 192.0.2.0/24",
        "neighbors[1].address: 192.0.2.0 is the network address of 192.0.2.0/24",
    ];
}
