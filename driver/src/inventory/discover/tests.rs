use super::attrs::Attrs;
use super::ports::{is_representor_port, is_uplink_port, is_zero_mac};
use super::*;
use crate::inventory::{MAX_ATTRIBUTES, MAX_STRING_LEN};

#[test]
fn inventory_port_names() {
    for rep in [
        "pf0vf0", "pf1vf12", "pf0sf2", "c1pf0vf1", "c1pf0", "pf0hpf", "pf0vfr1",
    ] {
        assert!(is_representor_port(rep), "{rep}");
    }
    for not in [
        "p0", "p1", "pf0", "pf", "pfvf1", "c1", "cpf0vf1", "pf0vf", "sby", "",
    ] {
        assert!(!is_representor_port(not), "{not}");
    }
    assert!(is_uplink_port("p0") && is_uplink_port("p12"));
    assert!(!is_uplink_port("p") && !is_uplink_port("pf0vf0"));
    assert_eq!(
        pcie_root(Path::new("sys/devices/pci0000:a2/0000:a2:00.0")).as_deref(),
        Some("pci0000:a2")
    );
    assert_eq!(pcie_root(Path::new("bus/pci/devices/0000:a2:00.0")), None);
    assert!(is_zero_mac("00:00:00:00:00:00") && !is_zero_mac("02:00:00:00:00:00"));
}

#[test]
fn inventory_attrs_limits() {
    let mut attrs = Attrs::default();
    attrs.str("long", &"x".repeat(MAX_STRING_LEN + 1));
    // Sorts first, so it survives the trim to the limit.
    attrs.str("a-edge", &"x".repeat(MAX_STRING_LEN));
    for i in 0..40 {
        attrs.int(&format!("a{i:02}"), i);
    }
    let map = attrs.finish("dev");
    assert!(!map.contains_key("long"));
    assert!(map.contains_key("a-edge"));
    assert!(!map.contains_key("a39"));
    assert_eq!(map.len(), MAX_ATTRIBUTES);
}

/// The scan classifies a function's netdevs through the function's descriptors, but
/// `class/net` still decides where a name lives: pointed at a software device of the same
/// name, the VF loses its port and the name is that software device's.
#[test]
fn inventory_class_net_wins_over_a_functions_net_entry() {
    use crate::inventory::{AttrValue, fixture};
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    fixture::materialise(&fixture::synthetic_sriov(1, 2), dir.path()).unwrap();
    let discover = || {
        crate::inventory::discover(
            dir.path(),
            &Sources::sysfs_only(),
            &BTreeSet::new(),
            &Filter::default(),
        )
    };
    let before = discover();
    let vf = before
        .devices
        .iter()
        .find(|d| d.kind == DeviceKind::Vf && d.if_name.is_some())
        .unwrap();
    let if_name = vf.if_name.clone().unwrap();
    let soft = dir.path().join("sys/devices/virtual/net").join(&if_name);
    std::fs::create_dir_all(&soft).unwrap();
    std::fs::write(soft.join("mtu"), "9000\n").unwrap();
    std::fs::write(soft.join("type"), "1\n").unwrap();
    let link = dir.path().join("sys/class/net").join(&if_name);
    std::fs::remove_file(&link).unwrap();
    symlink(format!("../../devices/virtual/net/{if_name}"), &link).unwrap();

    let after = discover();
    let function = after.devices.iter().find(|d| d.name == vf.name).unwrap();
    assert_eq!(function.if_name, None);
    assert_eq!(function.attributes.get("ifName"), None);
    let soft = after
        .excluded
        .iter()
        .find(|e| e.device.if_name.as_deref() == Some(if_name.as_str()))
        .unwrap();
    assert_eq!(soft.device.kind, DeviceKind::Virtual);
    assert_eq!(
        soft.device.attributes.get("mtu"),
        Some(&AttrValue::Int(9000))
    );
    assert_eq!(
        soft.reason,
        "virtual interface: offered only when a filter include entry matches it"
    );
    assert_eq!(after.devices.len(), before.devices.len());
}

/// A PCI function's identity comes from its `uevent` when the kernel wrote one, from the single
/// files otherwise: the same tree either way gives the same inventory, and where the two
/// disagree the `uevent` (the kernel's one read) is what counts, so the fallback is not what
/// the first case passed on.
#[test]
fn inventory_uevent_and_identity_files_agree() {
    use crate::inventory::{AttrValue, fixture};
    let discover = |text: &str| {
        let dir = tempfile::tempdir().unwrap();
        fixture::materialise(text, dir.path()).unwrap();
        let inv = crate::inventory::discover(
            dir.path(),
            &Sources::sysfs_only(),
            &BTreeSet::new(),
            &Filter::default(),
        );
        (dir, inv)
    };
    let (_a, with) = discover(&fixture::synthetic_sriov_with(2, 3, true));
    let (_b, without) = discover(&fixture::synthetic_sriov_with(2, 3, false));
    assert_eq!(with.devices.len(), 8);
    assert_eq!(
        format!("{:?}", with.devices),
        format!("{:?}", without.devices)
    );

    // The device file says one thing, `uevent` another: `uevent` wins.
    let text =
        fixture::synthetic_sriov_with(1, 1, true).replace("PCI_ID=8086:1889", "PCI_ID=8086:1592");
    let (_c, changed) = discover(&text);
    let vf = changed
        .devices
        .iter()
        .find(|d| d.kind == DeviceKind::Vf)
        .unwrap();
    assert_eq!(
        vf.attributes.get("pciDevice"),
        Some(&AttrValue::Str("1592".into())),
        "{:?}",
        vf.attributes
    );
}
