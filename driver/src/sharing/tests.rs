use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::*;
use crate::inventory::fixture::materialise;
use crate::inventory::{DeviceKind, NetDevice};
use crate::slices::{self, Mode, layout};

const PARENT: &str = "pci-0000-3b-00-0";
const OTHER: &str = "pci-0000-3b-00-1";

fn nic(name: &str, if_name: &str, pci: &str, speed: Option<i64>) -> NetDevice {
    let mut attributes = BTreeMap::from([
        ("ifName".to_owned(), AttrValue::Str(if_name.to_owned())),
        ("kind".to_owned(), AttrValue::Str("nic".to_owned())),
        ("pciAddress".to_owned(), AttrValue::Str(pci.to_owned())),
        ("numaNode".to_owned(), AttrValue::Int(1)),
        ("mtu".to_owned(), AttrValue::Int(1500)),
        (
            ATTR_PCIE_ROOT.to_owned(),
            AttrValue::Str("pci0000:3a".to_owned()),
        ),
    ]);
    if let Some(speed) = speed {
        attributes.insert("speed".to_owned(), AttrValue::Int(speed));
    }
    NetDevice {
        name: name.to_owned(),
        kind: DeviceKind::Nic,
        if_name: Some(if_name.to_owned()),
        pci_address: Some(pci.to_owned()),
        attributes,
    }
}

fn inventory(speed: Option<i64>) -> Inventory {
    Inventory {
        devices: vec![
            nic(PARENT, "ens1f0", "0000:3b:00.0", speed),
            nic(OTHER, "ens1f1", "0000:3b:00.1", speed),
        ],
        excluded: Vec::new(),
        overlay: None,
    }
}

fn sharing(policy: &str) -> Sharing {
    Sharing::new(SharePolicy::parse(policy).unwrap())
}

fn published(sharing: &Sharing, inventory: &Inventory, retained: &[Device]) -> Vec<Device> {
    let mut devices = slices::devices(inventory, retained);
    sharing.mark(&mut devices, inventory);
    devices
}

fn by_name<'a>(devices: &'a [Device], name: &str) -> &'a Device {
    devices
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("no device {name}"))
}

fn parent_attributes() -> Value {
    json!({
        "ifName": {"string": "ens1f0"},
        "kind": {"string": "nic"},
        "mtu": {"int": 1500},
        "numaNode": {"int": 1},
        "pciAddress": {"string": "0000:3b:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"},
        "shareable": {"bool": true},
        "speed": {"int": 25000},
    })
}

const POLICY: &str = "parents: [{names: [ens1f0], children: 32, defaultBandwidth: 100M, minBandwidth: 10M, bandwidthStep: 10M}]";

#[test]
fn sharing_capacity_form_has_exact_fields() {
    let devices = published(&sharing(POLICY), &inventory(Some(25_000)), &[]);
    assert_eq!(devices.len(), 2);
    assert_eq!(
        serde_json::to_value(by_name(&devices, PARENT)).unwrap(),
        json!({
            "name": PARENT,
            "allowMultipleAllocations": true,
            "attributes": parent_attributes(),
            "capacity": {
                "bandwidth": {
                    "value": "25G",
                    "requestPolicy": {"default": "100M", "validRange": {"min": "10M", "step": "10M"}},
                },
                "children": {
                    "value": "32",
                    "requestPolicy": {"default": "1", "validValues": ["1"]},
                },
            },
        })
    );
    let other = by_name(&devices, OTHER);
    assert_eq!(other.allow_multiple_allocations, None);
    assert_eq!(other.capacity, None);
    assert!(
        !other
            .attributes
            .as_ref()
            .unwrap()
            .contains_key(ATTR_SHAREABLE)
    );
    // Nothing shared without a policy entry.
    let plain = published(&Sharing::default(), &inventory(Some(25_000)), &[]);
    assert_eq!(plain, slices::devices(&inventory(Some(25_000)), &[]));
    assert_eq!(expand(&devices, ShareMode::Capacity), devices);
}

#[test]
fn sharing_slot_form_has_exact_fields() {
    let devices = published(&sharing(POLICY), &inventory(Some(25_000)), &[]);
    let slots = expand(&devices, ShareMode::Slots);
    let names: Vec<&str> = slots.iter().map(|d| d.name.as_str()).collect();
    let mut want: Vec<String> = (0..32).map(|i| format!("{PARENT}-s{i}")).collect();
    want.push(OTHER.to_owned());
    want.sort();
    assert_eq!(names, want);
    let mut attributes = parent_attributes();
    attributes["parent"] = json!({"string": PARENT});
    attributes["childSlot"] = json!({"int": 7});
    assert_eq!(
        serde_json::to_value(by_name(&slots, &format!("{PARENT}-s7"))).unwrap(),
        json!({"name": format!("{PARENT}-s7"), "attributes": attributes})
    );
    assert_eq!(by_name(&slots, OTHER), by_name(&devices, OTHER));
    for slot in slots.iter().filter(|d| d.name != OTHER) {
        assert!(is_slot(slot) && !is_shared_parent(slot), "{}", slot.name);
        assert_eq!(parent_of(slot), Some(PARENT));
    }
    // 33 plain devices fit one slice.
    let pool = layout(&slots, Mode::Partitionable);
    assert_eq!(pool.len(), 1);
    assert_eq!(pool[0].devices.len(), 33);
}

#[test]
fn sharing_pf_parent_consumes_no_budget_and_keeps_its_vfs() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs/intel-e810-pf-with-vfs.derived.txt");
    let dir = tempfile::tempdir().unwrap();
    materialise(&std::fs::read_to_string(path).unwrap(), dir.path()).unwrap();
    let inventory = crate::inventory::discover(
        dir.path(),
        &Default::default(),
        &Default::default(),
        &Default::default(),
    );
    let s = sharing("parents: [{pciAddresses: [\"0000:a2:00.0\"], children: 4, bandwidth: 25G}]");
    let devices = published(&s, &inventory, &[]);
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["pci-0000-a2-00-0", "pci-0000-a2-01-0", "pci-0000-a2-01-1"]
    );
    let pf = &devices[0];
    assert!(is_shared_parent(pf));
    assert_eq!(pf.consumes_counters, None);
    let capacity = pf.capacity.as_ref().unwrap();
    assert_eq!(capacity[CAPACITY_BANDWIDTH].value.0, "25G");
    assert_eq!(
        capacity[CAPACITY_BANDWIDTH].request_policy,
        Some(CapacityRequestPolicy {
            default: Some(Quantity("1M".into())),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity("1M".into()),
                max: None,
                step: None
            }),
            valid_values: None,
        })
    );
    assert_eq!(capacity[CAPACITY_CHILDREN].value.0, "4");
    let attrs = pf.attributes.as_ref().unwrap();
    assert_eq!(attrs["ifName"].string.as_deref(), Some("enp162s0f0np0"));
    assert_eq!(attrs[ATTR_SHAREABLE].bool, Some(true));
    for vf in &devices[1..] {
        let c = vf.consumes_counters.as_ref().unwrap();
        assert_eq!(c[0].counter_set, "pf-0000-a2-00-0");
        assert_eq!(c[0].counters["vfs"].value.0, "1");
    }
    // The set is as large as the VFs alone: the parent takes none of it.
    let pool = layout(&devices, Mode::Partitionable);
    assert_eq!(pool.len(), 2);
    assert_eq!(pool[1].shared_counters[0].counters["vfs"].value.0, "2");
    let slots = expand(&devices, ShareMode::Slots);
    let names: Vec<&str> = slots.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "pci-0000-a2-00-0-s0",
            "pci-0000-a2-00-0-s1",
            "pci-0000-a2-00-0-s2",
            "pci-0000-a2-00-0-s3",
            "pci-0000-a2-01-0",
            "pci-0000-a2-01-1"
        ]
    );
    assert!(slots[..4].iter().all(|d| d.consumes_counters.is_none()));
}

#[test]
fn sharing_bandwidth_of_a_parent_or_slot_is_its_parents_policy() {
    let s = sharing(POLICY);
    let devices = published(&s, &inventory(Some(25_000)), &[]);
    let want = Some(BandwidthPolicy {
        total: 25_000_000_000,
        default: 100_000_000,
        min: 10_000_000,
        step: Some(10_000_000),
    });
    assert_eq!(s.bandwidth_of(by_name(&devices, PARENT)), want);
    for slot in expand(&devices, ShareMode::Slots)
        .iter()
        .filter(|d| d.name != OTHER)
    {
        assert_eq!(s.bandwidth_of(slot), want, "{}", slot.name);
    }
    assert_eq!(s.bandwidth_of(by_name(&devices, OTHER)), None);
    let no_speed = published(&s, &inventory(None), &[]);
    assert_eq!(s.bandwidth_of(by_name(&no_speed, PARENT)), None);
}

#[test]
fn sharing_without_a_fitting_bandwidth_publishes_child_slots_only() {
    let children_only = |devices: &[Device]| {
        let parent = by_name(devices, PARENT);
        assert!(is_shared_parent(parent));
        let keys: Vec<&String> = parent.capacity.as_ref().unwrap().keys().collect();
        assert_eq!(keys, [CAPACITY_CHILDREN]);
    };
    // No link speed, no bandwidth in the policy.
    children_only(&published(&sharing(POLICY), &inventory(None), &[]));
    // A 10 Mbit/s link cannot hold the policy's 100M default.
    children_only(&published(&sharing(POLICY), &inventory(Some(10)), &[]));
    // The policy's own total wins over the link speed.
    let fixed = sharing("parents: [{names: [ens1f0], children: 2, bandwidth: 1G}]");
    let devices = published(&fixed, &inventory(Some(25_000)), &[]);
    let capacity = by_name(&devices, PARENT).capacity.clone().unwrap();
    assert_eq!(capacity[CAPACITY_BANDWIDTH].value.0, "1G");
}

#[test]
fn sharing_parent_attributes_leave_room_for_capacities_and_exhaustion() {
    let mut inv = inventory(Some(25_000));
    for i in 0..30 {
        inv.devices[0]
            .attributes
            .insert(format!("x{i:02}"), AttrValue::Int(i));
    }
    let devices = published(&sharing(POLICY), &inv, &[]);
    let parent = by_name(&devices, PARENT);
    let attrs = parent.attributes.as_ref().unwrap();
    assert_eq!(attrs.len(), MAX_PARENT_ATTRIBUTES + 1);
    for key in [
        "ifName",
        "kind",
        "pciAddress",
        "numaNode",
        "speed",
        ATTR_PCIE_ROOT,
    ] {
        assert!(attrs.contains_key(key), "{key} was dropped");
    }
    assert!(attrs.contains_key("x00") && !attrs.contains_key("x29"));
    // The exhausted-networks attribute still fits, in both forms.
    let marked = crate::slices::exhaustion::mark(&devices, Some("net-a"));
    let parent = by_name(&marked, PARENT);
    let entries = parent.attributes.as_ref().unwrap().len() + 2;
    assert_eq!(entries, 32);
    assert!(
        parent
            .attributes
            .as_ref()
            .unwrap()
            .contains_key(knic_proto::network::EXHAUSTED_ATTRIBUTE)
    );
    for slot in expand(&marked, ShareMode::Slots) {
        assert!(
            slot.attributes.as_ref().unwrap().len() <= 32,
            "{}",
            slot.name
        );
    }
}

#[test]
fn sharing_retained_slots_yield_to_their_shared_parent() {
    let devices = published(&sharing(POLICY), &inventory(Some(25_000)), &[]);
    let slots = expand(&devices, ShareMode::Slots);
    let held = by_name(&slots, &format!("{PARENT}-s3")).clone();
    let mut orphan = held.clone();
    orphan.name = "gone-s0".into();
    orphan
        .attributes
        .as_mut()
        .unwrap()
        .insert(ATTR_PARENT.into(), attr_str("gone"));
    let again = published(
        &sharing(POLICY),
        &inventory(Some(25_000)),
        &[held, orphan.clone()],
    );
    let names: Vec<&str> = again.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gone-s0", PARENT, OTHER]);
    assert_eq!(expand(&again, ShareMode::Slots).len(), 32 + 2);
}

#[test]
fn sharing_slot_names_are_dns_labels_stable_and_short() {
    assert_eq!(slot_name(PARENT, 3), "pci-0000-3b-00-0-s3");
    let long = format!("net-{}", "a".repeat(56));
    assert_eq!(long.len(), 60);
    let a = slot_name(&long, 4095);
    assert!(a.len() <= 63 && is_dns_label(&a), "{a}");
    assert!(a.ends_with("-s4095") && a.starts_with("net-aaaa"), "{a}");
    assert_eq!(a, slot_name(&long, 4095));
    let mut sibling = long.clone();
    sibling.replace_range(59..60, "b");
    assert_ne!(slot_name(&sibling, 4095), a);
    assert_eq!(slot_name(&long, 1), format!("{long}-s1"));
    let ten = slot_name(&long, 10);
    assert!(
        ten.len() == 63 && ten.ends_with("-s10") && is_dns_label(&ten),
        "{ten}"
    );
    // A device already named like a slot keeps its name; the slot is left out.
    let mut devices = published(&sharing(POLICY), &inventory(Some(25_000)), &[]);
    devices.push(Device {
        name: format!("{PARENT}-s5"),
        ..Default::default()
    });
    let slots = expand(&devices, ShareMode::Slots);
    assert_eq!(slots.len(), 32 + 1);
    assert_eq!(by_name(&slots, &format!("{PARENT}-s5")).attributes, None);
}

#[tokio::test]
async fn sharing_follow_tracks_the_publishers_mode() {
    let devices = published(&sharing(POLICY), &inventory(Some(25_000)), &[]);
    let (devices_tx, devices_rx) = watch::channel(devices.clone());
    let (mode_tx, mode_rx) = watch::channel(ShareMode::Capacity);
    let (view_tx, mut view) = watch::channel(Vec::new());
    let task = tokio::spawn(follow(devices_rx, mode_rx, view_tx));
    let first = view.wait_for(|v| !v.is_empty()).await.unwrap().clone();
    assert_eq!(first, devices);
    mode_tx.send_replace(ShareMode::Slots);
    let slots = view.wait_for(|v| v.len() == 33).await.unwrap().clone();
    assert_eq!(slots, expand(&devices, ShareMode::Slots));
    // The mode's sender gone: the last mode stays, devices are still followed.
    drop(mode_tx);
    devices_tx.send_replace(devices[1..].to_vec());
    let rest = view.wait_for(|v| v.len() == 1).await.unwrap().clone();
    assert_eq!(rest[0].name, OTHER);
    drop(devices_tx);
    tokio::time::timeout(std::time::Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}
