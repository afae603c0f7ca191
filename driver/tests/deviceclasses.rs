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
        [
            "knic.dev",
            "nic.knic.dev",
            "vf.knic.dev",
            "rdma.knic.dev",
            "overlay.knic.dev"
        ]
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

fn yaml_file(rel: &str) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

fn published_vfs(tree: &str) -> Vec<knic_driver::inventory::NetDevice> {
    let dir = tempfile::tempdir().unwrap();
    knic_driver::inventory::fixture::materialise(tree, dir.path()).unwrap();
    let inv = knic_driver::inventory::discover(
        dir.path(),
        &Default::default(),
        &Default::default(),
        &Default::default(),
    );
    inv.devices
        .into_iter()
        .filter(|d| d.kind == knic_driver::inventory::DeviceKind::Vf)
        .collect()
}

fn str_attr<'a>(d: &'a knic_driver::inventory::NetDevice, key: &str) -> Option<&'a str> {
    d.attr(key).and_then(|v| v.as_str())
}

#[test]
fn sriov_class_selects_published_attributes() {
    let class: DeviceClass = serde_json::from_value(yaml_file("deviceclasses/sriov.yaml")).unwrap();
    assert_eq!(class.metadata.name.as_deref(), Some("pf.knic.dev"));
    for s in class.spec.selectors.as_ref().unwrap() {
        let expr = &s.cel.as_ref().unwrap().expression;
        assert!(expr.contains("device.driver == \"knic.dev\""), "{expr}");
        assert_eq!(referenced(expr), BTreeSet::from(["kind".to_owned()]));
    }
}

/// Example (a): two VFs on distinct PFs. The constraint names an attribute every VF carries,
/// and a node with VFs on two PFs can satisfy it while a node with one PF cannot.
#[test]
fn example_vfs_on_distinct_pfs() {
    use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
    let t: ResourceClaimTemplate =
        serde_json::from_value(yaml_file("deviceclasses/examples/vfs-on-distinct-pfs.yaml"))
            .unwrap();
    let devices = &t.spec.spec.devices.unwrap();
    let requests = devices.requests.as_ref().unwrap();
    assert!(requests.iter().all(|r| {
        r.exactly
            .as_ref()
            .is_some_and(|e| e.device_class_name == "vf.knic.dev")
    }));
    let c = &devices.constraints.as_ref().unwrap()[0];
    assert_eq!(
        c.distinct_attribute.as_deref(),
        Some("knic.dev/pfPciAddress")
    );
    assert_eq!(
        c.requests.as_deref().unwrap(),
        requests.iter().map(|r| r.name.clone()).collect::<Vec<_>>()
    );
    assert!(PUBLISHED.contains(&"pfPciAddress"));
    let pfs = |vfs: &[knic_driver::inventory::NetDevice]| -> BTreeSet<String> {
        vfs.iter()
            .map(|d| str_attr(d, "pfPciAddress").unwrap().to_owned())
            .collect()
    };
    let two = published_vfs(&knic_driver::inventory::fixture::synthetic_sriov(2, 2));
    assert_eq!(pfs(&two).len(), 2, "satisfiable on two PFs");
    let one = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sysfs/intel-e810-pf-with-vfs.derived.txt"),
    )
    .unwrap();
    assert_eq!(pfs(&published_vfs(&one)).len(), 1, "not on one PF");
}

/// Example (b): a VF on the same PCIe root as a GPU. The constraint spans the knic request and
/// the GPU request and names the standard attribute knic publishes for every VF.
#[test]
fn example_vf_near_gpu() {
    use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
    let t: ResourceClaimTemplate =
        serde_json::from_value(yaml_file("deviceclasses/examples/vf-near-gpu.yaml")).unwrap();
    let devices = &t.spec.spec.devices.unwrap();
    let classes: Vec<(String, String)> = devices
        .requests
        .as_ref()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.name.clone(),
                r.exactly.as_ref().unwrap().device_class_name.clone(),
            )
        })
        .collect();
    assert_eq!(
        classes,
        [
            ("gpu".to_owned(), "gpu.nvidia.com".to_owned()),
            ("nic".to_owned(), "vf.knic.dev".to_owned())
        ]
    );
    let c = &devices.constraints.as_ref().unwrap()[0];
    assert_eq!(
        c.match_attribute.as_deref(),
        Some("resource.kubernetes.io/pcieRoot")
    );
    assert_eq!(c.requests.as_deref().unwrap(), ["gpu", "nic"]);
    let vfs = published_vfs(&knic_driver::inventory::fixture::synthetic_sriov(1, 2));
    assert!(!vfs.is_empty());
    for vf in &vfs {
        assert_eq!(
            str_attr(vf, "resource.kubernetes.io/pcieRoot"),
            Some("pci0000:10"),
            "{}",
            vf.name
        );
    }
}
