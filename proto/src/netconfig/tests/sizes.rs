//! `interface.gsoMaxSize` / `groMaxSize` / `gsoIpv4MaxSize` / `groIpv4MaxSize`.

use super::*;

#[test]
fn sizes_validate_merge_and_store() {
    let v = valid(json!({
        "interface": { "gsoMaxSize": 185000, "groMaxSize": 524280, "gsoIpv4MaxSize": 1280, "groIpv4MaxSize": 65536 }
    }));
    assert_eq!(
        v.offload_sizes,
        OffloadSizes {
            gso_max_size: Some(185_000),
            gro_max_size: Some(524_280),
            gso_ipv4_max_size: Some(1280),
            gro_ipv4_max_size: Some(65_536),
        }
    );
    let stored = serde_json::to_value(&v).expect("serializes");
    assert_eq!(
        stored["offloadSizes"],
        json!({ "gsoMaxSize": 185000, "groMaxSize": 524280, "gsoIpv4MaxSize": 1280, "groIpv4MaxSize": 65536 })
    );
    assert_eq!(serde_json::from_value::<ValidConfig>(stored).unwrap(), v);
    assert!(
        serde_json::to_value(valid(json!({})))
            .unwrap()
            .get("offloadSizes")
            .is_none()
    );

    // Field by field: the claim's GRO size over the class's, the class's GSO size kept.
    let class = parse(
        &object(json!({ "interface": { "gsoMaxSize": 65536, "groMaxSize": 65536 } })),
        "",
    )
    .unwrap();
    let claim = parse(
        &object(json!({ "interface": { "groMaxSize": 185000, "mtu": 9000 } })),
        "",
    )
    .unwrap();
    let merged = validate(&merge(&[class, claim])).unwrap();
    assert_eq!(merged.offload_sizes.gso_max_size, Some(65_536));
    assert_eq!(merged.offload_sizes.gro_max_size, Some(185_000));
    assert_eq!(merged.mtu, Some(9000));
}

rejects! {
    reject_sizes_out_of_range: {
        "interface": { "gsoMaxSize": 1279, "groMaxSize": 524281, "gsoIpv4MaxSize": 0, "groIpv4MaxSize": 4294967295u32 }
    } => [
        "interface.gsoMaxSize: must be between 1280 and 524280 bytes (the kernel's GRO_MAX_SIZE), got 1279",
        "interface.groMaxSize: must be between 1280 and 524280 bytes (the kernel's GRO_MAX_SIZE), got 524281",
        "interface.gsoIpv4MaxSize: must be between 1280 and 524280 bytes (the kernel's GRO_MAX_SIZE), got 0",
        "interface.groIpv4MaxSize: must be between 1280 and 524280 bytes (the kernel's GRO_MAX_SIZE), got 4294967295",
    ];
    reject_sizes_wrong_types: {
        "interface": { "gsoMaxSize": "64k", "groMaxSize": 65536.5, "gsoIpv4MaxSize": -1, "groIpv4MaxSize": 4294967296u64 }
    } => [
        "interface.gsoMaxSize: expected an integer, got string \"64k\"",
        "interface.groMaxSize: expected an integer, got number 65536.5",
        "interface.gsoIpv4MaxSize: must be between 1280 and 524280, got -1",
        "interface.groIpv4MaxSize: must be between 1280 and 524280, got 4294967296",
    ];
    reject_sizes_misspelt: { "interface": { "gsoMaxSiz": 65536 } }
        => ["interface.gsoMaxSiz: unknown field"];
}
