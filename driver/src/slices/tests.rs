use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::*;
use crate::inventory::{AttrValue, DeviceKind, Inventory, NetDevice};

const DRIVER: &str = "knic.dev";

fn owner() -> PoolOwner {
    PoolOwner {
        node_name: "node-a".into(),
        node_uid: "node-uid".into(),
    }
}

fn device(i: usize) -> NetDevice {
    let mut attributes = BTreeMap::new();
    attributes.insert("ifName".to_string(), AttrValue::Str(format!("eth{i}")));
    attributes.insert("mtu".to_string(), AttrValue::Int(1500));
    attributes.insert("sriov".to_string(), AttrValue::Bool(false));
    NetDevice {
        name: format!("pci-0000-{:02x}-{:02x}-0", i / 32, i % 32),
        kind: DeviceKind::Nic,
        if_name: Some(format!("eth{i}")),
        pci_address: None,
        attributes,
    }
}

fn inventory(n: usize) -> Inventory {
    Inventory {
        devices: (0..n).map(device).collect(),
        excluded: vec![],
        overlay: None,
    }
}

/// What the apiserver would hold after executing `plan` on `existing`.
fn apply(existing: &[ResourceSlice], plan: &Plan) -> Vec<ResourceSlice> {
    let mut out: Vec<ResourceSlice> = existing
        .iter()
        .filter(|s| {
            !plan
                .deletes
                .iter()
                .any(|d| d.metadata.name == s.metadata.name)
        })
        .cloned()
        .collect();
    for u in &plan.updates {
        if let Some(slot) = out.iter_mut().find(|s| s.metadata.name == u.metadata.name) {
            *slot = u.clone();
        }
    }
    for (i, c) in plan.creates.iter().enumerate() {
        let mut c = c.clone();
        c.metadata.name = Some(format!(
            "{}r{i:04}",
            c.metadata.generate_name.clone().unwrap()
        ));
        out.push(c);
    }
    out
}

fn assert_valid(slices: &[ResourceSlice]) {
    for s in slices {
        let devices = s.spec.devices.as_deref().unwrap_or_default();
        assert!(devices.len() <= MAX_DEVICES_PER_SLICE);
        assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(s.spec.pool.resource_slice_count as usize, slices.len());
        for d in devices {
            assert!(is_dns_label(&d.name), "{}", d.name);
            let attrs = d.attributes.as_ref().map_or(0, BTreeMap::len);
            assert!(attrs <= MAX_ATTRIBUTES_PER_DEVICE);
        }
    }
    let gens: std::collections::BTreeSet<_> =
        slices.iter().map(|s| s.spec.pool.generation).collect();
    assert_eq!(gens.len(), 1, "one generation across the pool: {gens:?}");
}

#[test]
fn slice_counts_for_0_1_128_129_1000_devices() {
    for (n, want) in [(0, 1), (1, 1), (128, 1), (129, 2), (1000, 8)] {
        let d = desired(&inventory(n));
        assert_eq!(d.len(), want, "{n} devices");
        assert_eq!(d.iter().map(|s| s.devices.len()).sum::<usize>(), n);
        let p = plan(DRIVER, &owner(), &[], &d, &[]);
        assert_eq!(
            (p.creates.len(), p.updates.len(), p.deletes.len()),
            (want, 0, 0)
        );
        assert_eq!(p.generation, 1);
        let stored = apply(&[], &p);
        assert_valid(&stored);
        // The second sync with nothing changed writes nothing.
        let again = plan(DRIVER, &owner(), &stored, &d, &[]);
        assert!(again.is_empty(), "{n}: {again:?}");
        assert_eq!(again.generation, 1);
    }
}

#[test]
fn names_owner_and_empty_pool() {
    let p = plan(DRIVER, &owner(), &[], &desired(&inventory(0)), &[]);
    let s = &p.creates[0];
    assert_eq!(
        s.metadata.generate_name.as_deref(),
        Some("00000-knic.dev-node-a-")
    );
    assert_eq!(
        s.spec.devices, None,
        "an empty pool is one slice without devices"
    );
    let owner_ref = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner_ref.kind.as_str(),
            owner_ref.name.as_str(),
            owner_ref.uid.as_str()
        ),
        ("Node", "node-a", "node-uid")
    );
    assert_eq!(owner_ref.controller, Some(true));
    assert_eq!(name_prefix(DRIVER, "n", 17, 1000), "00011-knic.dev-n-");
    assert_eq!(
        name_prefix(DRIVER, "n", 3, 0x0010_0001),
        "000003-knic.dev-n-"
    );
}

#[test]
fn one_changed_slice_keeps_the_generation_two_bump_it() {
    let d = desired(&inventory(300));
    let stored = apply(&[], &plan(DRIVER, &owner(), &[], &d, &[]));
    // Change one device in the last slice: a single update at the same generation.
    let mut inv = inventory(300);
    inv.devices[299]
        .attributes
        .insert("mtu".into(), AttrValue::Int(9000));
    let p = plan(DRIVER, &owner(), &stored, &desired(&inv), &[]);
    assert_eq!(
        (
            p.updates.len(),
            p.creates.len(),
            p.deletes.len(),
            p.generation
        ),
        (1, 0, 0, 1)
    );
    let stored = apply(&stored, &p);
    assert_valid(&stored);
    // Change devices in two slices: generation bumps and every slice is rewritten.
    inv.devices[0]
        .attributes
        .insert("mtu".into(), AttrValue::Int(9000));
    inv.devices[200]
        .attributes
        .insert("mtu".into(), AttrValue::Int(9000));
    let p = plan(DRIVER, &owner(), &stored, &desired(&inv), &[]);
    assert_eq!((p.updates.len(), p.generation), (3, 2));
    assert_valid(&apply(&stored, &p));
}

#[test]
fn shrinking_deletes_obsolete_slices_and_bumps() {
    let stored = apply(
        &[],
        &plan(DRIVER, &owner(), &[], &desired(&inventory(300)), &[]),
    );
    let p = plan(DRIVER, &owner(), &stored, &desired(&inventory(10)), &[]);
    assert_eq!(
        (
            p.deletes.len(),
            p.updates.len(),
            p.creates.len(),
            p.generation
        ),
        (2, 1, 0, 2)
    );
    let after = apply(&stored, &p);
    assert_eq!(after.len(), 1);
    assert_valid(&after);
}

#[test]
fn foreign_and_unparseable_slices() {
    let mut stored = apply(
        &[],
        &plan(DRIVER, &owner(), &[], &desired(&inventory(3)), &[]),
    );
    let mut stray = stored[0].clone();
    stray.metadata.name = Some("node-a-knic.dev-x7k2p".into()); // pre-1.36 naming
    stored.push(stray);
    let mut other_node = stored[0].clone();
    other_node.spec.pool.name = "node-b".into();
    other_node.metadata.name = Some("00000-knic.dev-node-b-zzzzz".into());
    stored.push(other_node);
    let p = plan(DRIVER, &owner(), &stored, &desired(&inventory(3)), &[]);
    let deleted: Vec<_> = p
        .deletes
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        deleted,
        vec!["node-a-knic.dev-x7k2p".to_string()],
        "other pools are not ours"
    );
}

#[test]
fn over_long_and_invalid_values_are_left_out() {
    let mut inv = inventory(1);
    let dev = &mut inv.devices[0];
    dev.attributes
        .insert("deviceName".into(), AttrValue::Str("x".repeat(65)));
    dev.attributes
        .insert("vendorName".into(), AttrValue::Str("y".repeat(64)));
    dev.attributes.insert("bad key".into(), AttrValue::Int(1));
    dev.attributes.insert(
        "resource.kubernetes.io/pcieRoot".into(),
        AttrValue::Str("pci0000:00".into()),
    );
    dev.attributes
        .insert("pciAddress".into(), AttrValue::Str("0".repeat(65)));
    let mut api = to_api_device(dev).unwrap();
    super::limits::fit(&mut api);
    let attrs = api.attributes.unwrap();
    assert_eq!(
        attrs["deviceName"].string.as_deref(),
        Some(format!("{}…", "x".repeat(61)).as_str()),
        "65 bytes is over the limit: a description is shortened"
    );
    assert!(
        !attrs.contains_key("pciAddress"),
        "an identifier is left out"
    );
    assert!(attrs.contains_key("vendorName"), "64 bytes is allowed");
    assert!(attrs.contains_key("resource.kubernetes.io/pcieRoot"));
    assert!(!attrs.contains_key("bad key"));
    let mut many = device(2);
    for i in 0..40 {
        many.attributes
            .insert(format!("extra{i:02}"), AttrValue::Int(i));
    }
    let mut api = to_api_device(&many).unwrap();
    super::limits::fit(&mut api);
    let attrs = api.attributes.unwrap();
    assert_eq!(attrs.len(), MAX_ATTRIBUTES_PER_DEVICE);
    assert!(
        attrs.contains_key("ifName") && attrs.contains_key("extra00"),
        "identities stay, others go from the end: {:?}",
        attrs.keys()
    );
    let mut bad = device(1);
    bad.name = "Bad_Name".into();
    assert!(to_api_device(&bad).is_none());
}

#[test]
fn qualified_names() {
    for ok in ["ifName", "resource.kubernetes.io/pcieRoot", "a_b", "x.y/z"] {
        assert!(is_qualified_name(ok), "{ok}");
    }
    for bad in ["", "1abc", "a-b", "Dom.ain/x", "a/b/c", &"a".repeat(33)] {
        assert!(!is_qualified_name(bad), "{bad}");
    }
}

#[test]
fn dropped_fields_are_accepted_not_rewritten() {
    let d = desired(&inventory(2));
    let stored = apply(&[], &plan(DRIVER, &owner(), &[], &d, &[]));
    // The apiserver stored a form without one attribute (a gate was off).
    let mut dropped = stored.clone();
    dropped[0].spec.devices.as_mut().unwrap()[0]
        .attributes
        .as_mut()
        .unwrap()
        .remove("sriov");
    let p = plan(DRIVER, &owner(), &dropped, &d, &[]);
    assert_eq!(p.updates.len(), 1, "without acceptance it would rewrite");
    let accepted = vec![(stored[0].spec.clone(), dropped[0].spec.clone())];
    assert!(plan(DRIVER, &owner(), &dropped, &d, &accepted).is_empty());
}

fn sriov_inventory(pfs: usize, vfs: usize) -> Inventory {
    let dir = tempfile::tempdir().unwrap();
    crate::inventory::fixture::materialise(
        &crate::inventory::fixture::synthetic_sriov(pfs, vfs),
        dir.path(),
    )
    .unwrap();
    crate::inventory::discover(
        dir.path(),
        &crate::inventory::sources::Sources::default(),
        &Default::default(),
        &Default::default(),
    )
}

#[test]
fn counter_slices_come_after_device_slices_and_plain_mode_drops_them() {
    let inv = sriov_inventory(1, 80);
    let d = desired(&inv);
    let p = plan(DRIVER, &owner(), &[], &d, &[]);
    let prefixes: Vec<_> = p
        .creates
        .iter()
        .map(|s| s.metadata.generate_name.clone().unwrap())
        .collect();
    assert_eq!(
        prefixes,
        [
            "00000-knic.dev-node-a-",
            "00001-knic.dev-node-a-",
            "00002-knic.dev-node-a-"
        ]
    );
    let counter_slice = &p.creates[2].spec;
    assert_eq!(
        counter_slice.devices, None,
        "a counter slice holds no devices"
    );
    assert_eq!(
        counter_slice.shared_counters.as_ref().map(Vec::len),
        Some(1)
    );
    assert!(
        p.creates[..2]
            .iter()
            .all(|s| s.spec.shared_counters.is_none())
    );
    let stored = apply(&[], &p);
    assert_valid(&stored);
    assert!(plan(DRIVER, &owner(), &stored, &d, &[]).is_empty());

    // The apiserver drops counters: the plain pool is one slice of 81 devices, the counter slice
    // and the second device slice go, and the generation moves.
    let plain = layout(&devices(&inv, &[]), Mode::Plain);
    let p = plan(DRIVER, &owner(), &stored, &plain, &[]);
    assert_eq!(
        (
            p.deletes.len(),
            p.updates.len(),
            p.creates.len(),
            p.generation
        ),
        (2, 1, 0, 2)
    );
    let after = apply(&stored, &p);
    assert_valid(&after);
    assert_eq!(after.len(), 1);
    let spec = &after[0].spec;
    assert_eq!(spec.shared_counters, None);
    assert_eq!(spec.devices.as_ref().map(Vec::len), Some(81));
    assert!(
        spec.devices
            .iter()
            .flatten()
            .all(|d| d.consumes_counters.is_none())
    );
    assert!(plan(DRIVER, &owner(), &after, &plain, &[]).is_empty());
}

#[test]
fn a_new_vf_changes_a_budget_and_a_device_slice_so_the_generation_moves() {
    let stored = apply(
        &[],
        &plan(DRIVER, &owner(), &[], &desired(&sriov_inventory(9, 2)), &[]),
    );
    assert_eq!(stored.len(), 3);
    // One more VF on some PF changes its budget (counter slice) and adds a device (device
    // slice): two slices change, so the generation moves and everything is rewritten.
    let p = plan(
        DRIVER,
        &owner(),
        &stored,
        &desired(&sriov_inventory(9, 3)),
        &[],
    );
    assert_eq!((p.updates.len(), p.generation), (3, 2));
    assert_valid(&apply(&stored, &p));
}
