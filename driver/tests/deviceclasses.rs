//! The DeviceClasses admins install must be valid `resource.k8s.io/v1` objects and may only
//! select on attributes the driver actually publishes: a typo in a selector would make every
//! claim of that class unschedulable without any error.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::resource::v1::DeviceClass;
use serde::Deserialize;

/// Every knic.dev attribute key the inventory can publish.
const PUBLISHED: &[&str] = &[
    "ifName",
    "mac",
    "mtu",
    "state",
    "speed",
    "kind",
    "linkKind",
    "pciAddress",
    "pciVendor",
    "pciDevice",
    "pciSubsystem",
    "vendorName",
    "deviceName",
    "driver",
    "numaNode",
    "sriov",
    "sriovTotalVfs",
    "sriovNumVfs",
    "pfName",
    "pfPciAddress",
    "vfIndex",
    "eswitchMode",
    "vlanCapable",
    "rdma",
    "rdmaDevice",
];

fn classes() -> Vec<DeviceClass> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deviceclasses/knic.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| DeviceClass::deserialize(doc).unwrap())
        .collect()
}

fn referenced(expression: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let marker = "device.attributes[\"knic.dev\"].";
    let mut rest = expression;
    while let Some(i) = rest.find(marker) {
        rest = &rest[i + marker.len()..];
        let rest_trim = rest.trim_start_matches('?');
        let name: String = rest_trim
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        out.insert(name);
    }
    out
}

#[test]
fn classes_parse_and_select_published_attributes() {
    let classes = classes();
    let names: Vec<_> = classes
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        ["knic.dev", "nic.knic.dev", "vf.knic.dev", "rdma.knic.dev"]
    );
    for class in &classes {
        let selectors = class.spec.selectors.as_ref().unwrap();
        for s in selectors {
            let expr = &s.cel.as_ref().unwrap().expression;
            assert!(expr.contains("device.driver == \"knic.dev\""), "{expr}");
            for attr in referenced(expr) {
                assert!(
                    PUBLISHED.contains(&attr.as_str()),
                    "{expr}: unknown attribute {attr}"
                );
            }
        }
    }
}

#[test]
fn published_attribute_list_matches_the_inventory() {
    // Every attribute the fixtures produce must be in PUBLISHED, so the list above stays true.
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs");
    let mut seen = BTreeSet::new();
    for entry in std::fs::read_dir(fixtures).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "txt")
            || path.to_string_lossy().contains("pci-ids")
            || path.to_string_lossy().contains("ethtool")
        {
            continue;
        }
        let root = dir.path().join(path.file_stem().unwrap());
        knic_driver::inventory::fixture::materialise(
            &std::fs::read_to_string(&path).unwrap(),
            &root,
        )
        .unwrap();
        let filter = knic_driver::inventory::Filter::parse_lists(
            "kind=virtual,kind=nic,kind=pf,kind=vf",
            "",
        )
        .unwrap();
        let inv = knic_driver::inventory::discover(
            &root,
            &Default::default(),
            &Default::default(),
            &filter,
        );
        for d in inv
            .devices
            .iter()
            .chain(inv.excluded.iter().map(|e| &e.device))
        {
            seen.extend(d.attributes.keys().filter(|k| !k.contains('/')).cloned());
        }
    }
    for key in &seen {
        assert!(
            PUBLISHED.contains(&key.as_str()),
            "attribute {key} is published but not listed"
        );
    }
    assert!(
        seen.len() >= 20,
        "fixtures exercise most attributes: {seen:?}"
    );
}

#[test]
fn chart_ships_the_same_classes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let plain = std::fs::read_to_string(root.join("deviceclasses/knic.yaml")).unwrap();
    let chart = std::fs::read_to_string(root.join("charts/knic/files/deviceclasses.yaml")).unwrap();
    assert_eq!(
        plain, chart,
        "charts/knic/files/deviceclasses.yaml must be a copy of deviceclasses/knic.yaml"
    );
}
