use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::*;
use crate::inventory::filter::Filter;
use crate::inventory::fixture::{materialise, synthetic_sriov};
use crate::inventory::sources::{EswitchMode, FakeDevlink, Sources};
use crate::slices::{DesiredSlice, MAX_DEVICES_PER_SLICE_ADVANCED, Mode, desired, devices, layout};

fn discover_text(text: &str, routes: &[&str]) -> Inventory {
    let dir = tempfile::tempdir().unwrap();
    materialise(text, dir.path()).unwrap();
    let routes: BTreeSet<String> = routes.iter().map(|r| (*r).to_owned()).collect();
    let sources = Sources {
        devlink: Box::new(FakeDevlink::default().with("0000:3b:00.0", EswitchMode::Switchdev)),
        ..Sources::default()
    };
    crate::inventory::discover(dir.path(), &sources, &routes, &Filter::default())
}

fn fixture(name: &str, routes: &[&str]) -> Inventory {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs")
        .join(name);
    discover_text(&std::fs::read_to_string(path).unwrap(), routes)
}

/// `(set, amount)` a device consumes, if any.
fn consumed(d: &Device) -> Option<(String, i64)> {
    let c = d.consumes_counters.as_ref()?;
    assert_eq!(c.len(), 1, "{}: one consumption per device", d.name);
    Some((c[0].counter_set.clone(), amount(&c[0])))
}

fn by_name<'a>(devices: &'a [Device], name: &str) -> &'a Device {
    devices.iter().find(|d| d.name == name).unwrap()
}

fn sizes(sets: &[CounterSet]) -> BTreeMap<String, i64> {
    sets.iter()
        .map(|s| {
            assert_eq!(s.counters.len(), 1, "{}", s.name);
            (s.name.clone(), s.counters[COUNTER].value.0.parse().unwrap())
        })
        .collect()
}

/// Checks the apiserver's and the Go controller's rules on a whole pool: devices or counters per
/// slice, ≤ 8 sets and ≤ 64 consuming devices per slice, set names DNS labels unique in the pool,
/// every consumption naming an existing set and counter, and the PF/VF arithmetic.
fn assert_pool_valid(pool: &[DesiredSlice]) {
    let mut sets = BTreeMap::new();
    for s in pool {
        assert!(
            s.devices.is_empty() || s.shared_counters.is_empty(),
            "devices and counters in one slice"
        );
        assert!(s.shared_counters.len() <= MAX_COUNTER_SETS_PER_SLICE);
        for set in &s.shared_counters {
            assert!(is_dns_label(&set.name), "{}", set.name);
            let size = sizes(std::slice::from_ref(set))[&set.name];
            assert!(
                sets.insert(set.name.clone(), size).is_none(),
                "duplicate set {}",
                set.name
            );
        }
        if s.devices.iter().any(|d| d.consumes_counters.is_some()) {
            assert!(s.devices.len() <= MAX_DEVICES_PER_SLICE_ADVANCED);
        }
    }
    let mut vf_use: BTreeMap<String, i64> = BTreeMap::new();
    for d in pool.iter().flat_map(|s| &s.devices) {
        assert!(
            d.consumes_counters
                .as_ref()
                .is_none_or(|c| c.len() <= MAX_CONSUMPTIONS_PER_DEVICE)
        );
        if let Some((set, n)) = consumed(d) {
            let size = *sets
                .get(&set)
                .unwrap_or_else(|| panic!("{}: set {set} not published", d.name));
            if vf_of(d).is_some() {
                assert_eq!(n, 1, "{}", d.name);
                *vf_use.entry(set).or_default() += 1;
            } else {
                assert_eq!(n, size, "{}: a PF takes its whole budget", d.name);
            }
        }
    }
    for (set, used) in vf_use {
        assert!(used <= sets[&set], "{set}: all VFs fit at once");
    }
}

#[test]
fn set_names_come_from_the_pf_address() {
    assert_eq!(set_name("0000:a2:00.0").as_deref(), Some("pf-0000-a2-00-0"));
    assert_eq!(set_name("0000:A2:00.0").as_deref(), Some("pf-0000-a2-00-0"));
    assert_eq!(set_name("0000:a2:00.0/x"), None, "not a DNS label");
    assert_eq!(set_name(&"0".repeat(70)), None, "over 63 characters");
}

#[test]
fn e810_vfs_and_pf_share_one_budget() {
    let inv = fixture("intel-e810-pf-with-vfs.derived.txt", &[]);
    assert_eq!(
        budgets(&inv),
        BTreeMap::from([("0000:a2:00.0".to_owned(), 2)])
    );
    let devs = devices(&inv, &[]);
    let set = "pf-0000-a2-00-0".to_owned();
    assert_eq!(
        consumed(by_name(&devs, "pci-0000-a2-00-0")),
        Some((set.clone(), 2))
    );
    assert_eq!(
        consumed(by_name(&devs, "pci-0000-a2-01-0")),
        Some((set.clone(), 1))
    );
    assert_eq!(
        consumed(by_name(&devs, "pci-0000-a2-01-1")),
        Some((set.clone(), 1))
    );
    assert_eq!(
        sizes(&counter_sets(&devs)),
        BTreeMap::from([(set.clone(), 2)])
    );
    let pool = desired(&inv);
    assert_eq!(pool.len(), 2, "one device slice, one counter slice");
    assert_eq!(pool[0].devices.len(), 3);
    assert_eq!(pool[1].shared_counters.len(), 1);
    assert_pool_valid(&pool);
}

#[test]
fn cx5_only_the_pf_with_vfs_gets_a_set_and_vfs_keep_their_pf_facts() {
    let inv = fixture("mellanox-cx5-pf-vfs-rdma.derived.txt", &[]);
    let devs = devices(&inv, &[]);
    let set = "pf-0000-3b-00-0".to_owned();
    assert_eq!(
        consumed(by_name(&devs, "pci-0000-3b-00-0")),
        Some((set.clone(), 2))
    );
    assert_eq!(
        consumed(by_name(&devs, "pci-0000-3b-00-1")),
        None,
        "no VFs, no budget"
    );
    let vf = by_name(&devs, "pci-0000-3b-00-2");
    assert_eq!(consumed(vf), Some((set.clone(), 1)));
    for (key, want) in [
        ("pfPciAddress", "0000:3b:00.0"),
        ("pfName", "enp59s0f0np0"),
        ("eswitchMode", "switchdev"),
    ] {
        assert_eq!(api_str(vf, key), Some(want), "{key}");
    }
    assert_eq!(vf.attributes.as_ref().unwrap()["vfIndex"].int, Some(0));
    assert_eq!(sizes(&counter_sets(&devs)), BTreeMap::from([(set, 2)]));
    assert_pool_valid(&desired(&inv));
}

#[test]
fn vfs_of_a_pf_on_the_default_route_still_draw_on_its_budget() {
    let inv = fixture("intel-e810-pf-with-vfs.derived.txt", &["enp162s0f0np0"]);
    assert!(
        inv.device("pci-0000-a2-00-0").is_none(),
        "the PF is not offered"
    );
    assert_eq!(budgets(&inv)["0000:a2:00.0"], 2);
    let devs = devices(&inv, &[]);
    assert_eq!(devs.len(), 2);
    assert!(
        devs.iter()
            .all(|d| consumed(d) == Some(("pf-0000-a2-00-0".into(), 1)))
    );
    assert_eq!(sizes(&counter_sets(&devs))["pf-0000-a2-00-0"], 2);
    assert_pool_valid(&desired(&inv));
}

#[test]
fn retained_vfs_keep_the_pool_consistent() {
    let full = fixture("intel-e810-pf-with-vfs.derived.txt", &[]);
    let copies = devices(&full, &[]);
    let vf1 = by_name(&copies, "pci-0000-a2-01-1").clone();
    // VF1 went to a pod and vanished from the host: the PF still takes the whole budget,
    // counting the retained copy.
    let mut gone = full.clone();
    gone.devices.retain(|d| d.name != "pci-0000-a2-01-1");
    assert_eq!(budgets(&gone)["0000:a2:00.0"], 1);
    let devs = devices(&gone, std::slice::from_ref(&vf1));
    assert_eq!(devs.len(), 3);
    assert_eq!(
        consumed(by_name(&devs, "pci-0000-a2-00-0")),
        Some(("pf-0000-a2-00-0".into(), 2))
    );
    assert_pool_valid(&layout(&devs, Mode::Partitionable));
    // The whole card vanished (PF included) while VF1 is in a pod: the set is kept from the
    // retained copy, so the pool does not name a set nobody publishes.
    let mut stale = vf1.clone();
    stale.consumes_counters = Some(vec![consumption("something-else".into(), 7)]);
    let devs = devices(&Inventory::default(), &[stale]);
    assert_eq!(
        consumed(&devs[0]),
        Some(("pf-0000-a2-00-0".into(), 1)),
        "recomputed"
    );
    let pool = layout(&devs, Mode::Partitionable);
    assert_eq!(
        sizes(&pool[1].shared_counters),
        BTreeMap::from([("pf-0000-a2-00-0".into(), 1)])
    );
    assert_pool_valid(&pool);
}

#[test]
fn nine_pfs_need_two_counter_slices() {
    let inv = discover_text(&synthetic_sriov(9, 2), &[]);
    assert_eq!(inv.devices.len(), 27);
    let pool = desired(&inv);
    let counter_slices: Vec<usize> = pool
        .iter()
        .filter(|s| !s.shared_counters.is_empty())
        .map(|s| s.shared_counters.len())
        .collect();
    assert_eq!(counter_slices, vec![8, 1]);
    assert_eq!(pool.len(), 3);
    assert_pool_valid(&pool);
}

#[test]
fn over_64_consuming_devices_split_at_64_and_plain_mode_at_128() {
    let inv = discover_text(&synthetic_sriov(1, 80), &[]);
    assert_eq!(inv.devices.len(), 81);
    let pool = desired(&inv);
    let shape: Vec<(usize, usize)> = pool
        .iter()
        .map(|s| (s.devices.len(), s.shared_counters.len()))
        .collect();
    assert_eq!(shape, vec![(64, 0), (17, 0), (0, 1)]);
    assert_eq!(sizes(&pool[2].shared_counters)["pf-0000-10-00-0"], 80);
    assert_pool_valid(&pool);
    let plain = layout(&devices(&inv, &[]), Mode::Plain);
    assert_eq!(
        plain.len(),
        1,
        "no counters: 128 per slice, no counter slice"
    );
    assert_eq!(plain[0].devices.len(), 81);
    assert!(
        plain[0]
            .devices
            .iter()
            .all(|d| d.consumes_counters.is_none())
    );
    assert!(plain[0].shared_counters.is_empty());
}

#[test]
fn a_node_without_vfs_publishes_no_counters() {
    let inv = fixture("intel-e810-xxv-pf.real.txt", &[]);
    let pool = desired(&inv);
    assert_eq!(pool.len(), 1);
    assert!(
        pool[0]
            .devices
            .iter()
            .all(|d| d.consumes_counters.is_none())
    );
    assert_eq!(
        desired(&Inventory::default()),
        vec![DesiredSlice::default()]
    );
}
