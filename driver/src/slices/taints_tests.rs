use std::path::Path;

use k8s_openapi::api::resource::v1::DeviceTaint;

use super::*;
use crate::inventory::Filter;
use crate::inventory::fixture::materialise;

const PF: &str = "pci-0000-a2-00-0";
const VF0: &str = "pci-0000-a2-01-0";
const VF1: &str = "pci-0000-a2-01-1";

fn fixture_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs/intel-e810-pf-with-vfs.derived.txt");
    std::fs::read_to_string(path).unwrap()
}

/// The E810 tree's devices as published (knic taints applied), after `edit` changed the text.
fn published(edit: impl Fn(String) -> String) -> Vec<Device> {
    let dir = tempfile::tempdir().unwrap();
    materialise(&edit(fixture_text()), dir.path()).unwrap();
    let inventory = crate::inventory::discover(
        dir.path(),
        &Default::default(),
        &Default::default(),
        &Filter::default(),
    );
    let mut devices = crate::slices::devices(&inventory, &[]);
    apply(&mut devices);
    devices
}

fn by_name<'a>(devices: &'a [Device], name: &str) -> &'a Device {
    devices.iter().find(|d| d.name == name).unwrap()
}

fn expected(key: &str, value: &str) -> DeviceTaint {
    DeviceTaint {
        key: key.into(),
        value: Some(value.into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

fn link_down(text: String) -> String {
    text.replace(
        "net/enp162s0f0np0/operstate = up",
        "net/enp162s0f0np0/operstate = down",
    )
}

fn vf1_unbound(text: String) -> String {
    text.lines()
        .filter(|l| !l.starts_with("sys/devices/pci0000:a2/0000:a2:01.1/driver ->"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn healthy_devices_carry_no_taints() {
    let devices = published(|t| t);
    assert_eq!(devices.len(), 3);
    for d in &devices {
        assert_eq!(d.taints, None, "{}", d.name);
        assert_eq!(message(d), None);
    }
}

#[test]
fn link_down_is_tainted_with_the_state_and_cleared_when_up() {
    let down = published(link_down);
    assert_eq!(
        by_name(&down, PF).taints,
        Some(vec![expected("knic.dev/link-down", "down")])
    );
    assert_eq!(message(by_name(&down, PF)).as_deref(), Some("link is down"));
    assert_eq!(by_name(&down, VF0).taints, None);
    let up = published(|t| t);
    assert_eq!(by_name(&up, PF).taints, None);
    let lower = published(|t| {
        t.replace(
            "net/enp162s0f0v0/operstate = up",
            "net/enp162s0f0v0/operstate = lowerlayerdown",
        )
    });
    assert_eq!(
        by_name(&lower, VF0).taints,
        Some(vec![expected("knic.dev/link-down", "lowerlayerdown")])
    );
    let dormant = published(|t| {
        t.replace(
            "net/enp162s0f0v0/operstate = up",
            "net/enp162s0f0v0/operstate = dormant",
        )
    });
    assert_eq!(by_name(&dormant, VF0).taints, None, "dormant is no failure");
}

#[test]
fn unbound_pci_function_is_tainted_and_cleared_when_bound() {
    let unbound = published(vf1_unbound);
    assert_eq!(
        by_name(&unbound, VF1).taints,
        Some(vec![expected("knic.dev/driver-unbound", "no-driver")])
    );
    assert_eq!(
        message(by_name(&unbound, VF1)).as_deref(),
        Some("no kernel driver is bound to the PCI function")
    );
    assert_eq!(by_name(&unbound, VF0).taints, None);
    assert_eq!(by_name(&published(|t| t), VF1).taints, None);
}

#[test]
fn both_causes_are_listed_in_key_order() {
    let devices = published(|t| {
        vf1_unbound(t).replace(
            "net/enp162s0f0v1/operstate = up",
            "net/enp162s0f0v1/operstate = down",
        )
    });
    assert_eq!(
        by_name(&devices, VF1).taints,
        Some(vec![
            expected("knic.dev/driver-unbound", "no-driver"),
            expected("knic.dev/link-down", "down"),
        ])
    );
}

#[test]
fn an_interface_nobody_set_up_is_not_link_down() {
    let devices = published(|t| {
        link_down(t).replace(
            "net/enp162s0f0np0/flags = 0x1003",
            "net/enp162s0f0np0/flags = 0x1002",
        )
    });
    let pf = by_name(&devices, PF);
    let attrs = pf.attributes.as_ref().unwrap();
    assert_eq!(attrs["adminDown"].bool, Some(true));
    assert_eq!(attrs["state"].string.as_deref(), Some("down"));
    assert_eq!(pf.taints, None);
    assert_eq!(
        crate::kubelet::health::judge(pf),
        (
            crate::kubelet::health::Health::Unknown,
            "link is administratively down (set up when prepared)".into()
        )
    );
    // Set up without a carrier: a broken link.
    assert!(
        !published(link_down).iter().any(|d| d
            .attributes
            .as_ref()
            .unwrap()
            .contains_key("adminDown"))
    );
}

#[test]
fn software_links_are_never_tainted_nor_kept_when_deleted() {
    let veth: Device = serde_json::from_value(serde_json::json!({
        "name": "veth0",
        "attributes": {"kind": {"string": "virtual"}, "state": {"string": "down"}}
    }))
    .unwrap();
    assert_eq!(causes(&veth), Vec::<DeviceTaint>::new());
    let mut gone = Gone::default();
    let t0 = SystemTime::UNIX_EPOCH;
    gone.update(&mut vec![veth], &[], t0, GONE_GRACE);
    let mut now = Vec::new();
    gone.update(&mut now, &[], t0 + Duration::from_secs(1), GONE_GRACE);
    assert!(now.is_empty(), "{now:?}");
}

#[test]
fn virtual_devices_without_a_driver_are_not_unbound() {
    let device: Device = serde_json::from_value(serde_json::json!({
        "name": "veth0",
        "attributes": {"kind": {"string": "virtual"}, "state": {"string": "up"}}
    }))
    .unwrap();
    assert_eq!(causes(&device), Vec::<DeviceTaint>::new());
}

#[test]
fn stale_knic_taints_are_replaced_and_foreign_ones_kept() {
    let mut devices = published(|t| t);
    let foreign = DeviceTaint {
        key: "example.com/maintenance".into(),
        value: None,
        effect: "NoExecute".into(),
        time_added: None,
    };
    devices[0].taints = Some(vec![
        expected("knic.dev/link-down", "down"),
        foreign.clone(),
    ]);
    apply(&mut devices);
    assert_eq!(devices[0].taints, Some(vec![foreign]));
}

#[test]
fn a_vanished_device_is_tainted_until_it_returns_or_the_grace_ends() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let grace = Duration::from_secs(600);
    let mut gone = Gone::default();
    let mut all = published(|t| t);
    gone.update(&mut all, &[], t0, grace);
    assert!(all.iter().all(|d| d.taints.is_none()));
    let before = by_name(&all, VF1).clone();

    let mut without: Vec<Device> = all.iter().filter(|d| d.name != VF1).cloned().collect();
    gone.update(&mut without, &[], t0 + Duration::from_secs(1), grace);
    let names: Vec<&str> = without.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, [PF, VF0, VF1], "kept, in name order");
    let kept = by_name(&without, VF1);
    assert_eq!(
        kept.taints,
        Some(vec![expected("knic.dev/gone", "vanished")])
    );
    assert_eq!(kept.attributes, before.attributes);
    assert!(before.consumes_counters.is_some());
    assert_eq!(kept.consumes_counters, None, "no budget for a vanished VF");
    assert_eq!(
        message(kept).as_deref(),
        Some("the device vanished from the node")
    );

    // Still missing just before the grace ends: the same copy.
    let mut later: Vec<Device> = all.iter().filter(|d| d.name != VF1).cloned().collect();
    gone.update(&mut later, &[], t0 + Duration::from_secs(600), grace);
    assert_eq!(by_name(&later, VF1), kept);
    // Grace over (counted from when it went missing): dropped, and not brought back.
    let mut expired: Vec<Device> = all.iter().filter(|d| d.name != VF1).cloned().collect();
    gone.update(&mut expired, &[], t0 + Duration::from_secs(601), grace);
    assert_eq!(expired.len(), 2);
    let mut again: Vec<Device> = all.iter().filter(|d| d.name != VF1).cloned().collect();
    gone.update(&mut again, &[], t0 + Duration::from_secs(602), grace);
    assert_eq!(again.len(), 2);
}

#[test]
fn a_returning_device_loses_the_gone_taint() {
    let t0 = SystemTime::UNIX_EPOCH;
    let grace = Duration::from_secs(600);
    let mut gone = Gone::default();
    let mut all = published(|t| t);
    gone.update(&mut all, &[], t0, grace);
    let mut without: Vec<Device> = all.iter().filter(|d| d.name != VF0).cloned().collect();
    gone.update(&mut without, &[], t0 + Duration::from_secs(5), grace);
    assert!(by_name(&without, VF0).taints.is_some());
    let mut back = published(|t| t);
    gone.update(&mut back, &[], t0 + Duration::from_secs(10), grace);
    assert_eq!(by_name(&back, VF0).taints, None);
    // Vanishing again starts a new grace period.
    let mut twice: Vec<Device> = all.iter().filter(|d| d.name != VF0).cloned().collect();
    gone.update(&mut twice, &[], t0 + Duration::from_secs(700), grace);
    assert_eq!(
        by_name(&twice, VF0).taints,
        Some(vec![expected("knic.dev/gone", "vanished")])
    );
}

#[test]
fn vfs_removed_by_the_sriov_policy_are_withdrawn_not_gone() {
    let t0 = SystemTime::UNIX_EPOCH;
    let grace = Duration::from_secs(600);
    let mut gone = Gone::default();
    let mut all = published(|t| t);
    gone.update(&mut all, &[], t0, grace);
    gone.forget(&["0000:a2:00.0".to_owned()]);
    let mut pf_only: Vec<Device> = all.iter().filter(|d| d.name == PF).cloned().collect();
    gone.update(&mut pf_only, &[], t0 + Duration::from_secs(1), grace);
    assert_eq!(names_of(&pf_only), [PF]);
    // Another PF's change leaves these VFs' memory alone.
    let mut all = published(|t| t);
    gone.update(&mut all, &[], t0 + Duration::from_secs(2), grace);
    gone.forget(&["0000:3b:00.0".to_owned()]);
    let mut pf_only: Vec<Device> = all.iter().filter(|d| d.name == PF).cloned().collect();
    gone.update(&mut pf_only, &[], t0 + Duration::from_secs(3), grace);
    assert_eq!(names_of(&pf_only), [PF, VF0, VF1]);
}

/// A device a prepared claim holds is not gone while held (the checkpoint's copy stays
/// published, untainted); released while still missing, it vanished while allocated and is
/// withdrawn at once.
#[test]
fn held_devices_are_not_gone_and_are_withdrawn_when_released() {
    let t0 = SystemTime::UNIX_EPOCH;
    let grace = Duration::from_secs(600);
    let mut gone = Gone::default();
    let mut all = published(|t| t);
    gone.update(&mut all, &[], t0, grace);
    // VF0 was given to a pod: the inventory lost it, the checkpoint's copy keeps it published.
    let copy = by_name(&all, VF0).clone();
    let dir = tempfile::tempdir().unwrap();
    let text: String = fixture_text()
        .lines()
        .filter(|l| {
            !(l.starts_with("sys/class/net/enp162s0f0v0 ")
                || l.starts_with("sys/bus/pci/devices/0000:a2:01.0 ")
                || l.starts_with("sys/devices/pci0000:a2/0000:a2:00.0/virtfn0 "))
        })
        .collect::<Vec<_>>()
        .join("\n");
    materialise(&text, dir.path()).unwrap();
    let inventory = crate::inventory::discover(
        dir.path(),
        &Default::default(),
        &Default::default(),
        &Filter::default(),
    );
    assert!(!inventory.devices.iter().any(|d| d.name == VF0));
    let held = [copy];
    let mut devices = crate::slices::devices(&inventory, &held);
    apply(&mut devices);
    gone.update(&mut devices, &held, t0 + Duration::from_secs(1), grace);
    assert_eq!(by_name(&devices, VF0).taints, None);
    let mut released = crate::slices::devices(&inventory, &[]);
    apply(&mut released);
    gone.update(&mut released, &[], t0 + Duration::from_secs(2), grace);
    assert_eq!(names_of(&released), [PF, VF1]);
}

fn names_of(devices: &[Device]) -> Vec<&str> {
    devices.iter().map(|d| d.name.as_str()).collect()
}

#[test]
fn tainted_devices_lower_the_slice_cap() {
    let mut devices: Vec<Device> = (0..100)
        .map(|i| Device {
            name: format!("d{i:03}"),
            ..Default::default()
        })
        .collect();
    assert_eq!(crate::slices::split(&devices).len(), 1);
    devices[7].taints = Some(vec![expected(KEY_GONE, VALUE_GONE)]);
    let split = crate::slices::split(&devices);
    assert_eq!(split.iter().map(Vec::len).collect::<Vec<_>>(), [64, 36]);
}

mod publishing {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::slices::{DesiredSlice, Mode, Plan, PoolOwner, layout, plan, same};

    fn owner() -> PoolOwner {
        PoolOwner {
            node_name: "node-a".into(),
            node_uid: "uid".into(),
        }
    }

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
    }

    /// What the apiserver holds after `plan`: names given, unset taint times set to `now`.
    fn store(existing: &[ResourceSlice], plan: &Plan, now: i64) -> Vec<ResourceSlice> {
        let mut out: Vec<ResourceSlice> = existing.to_vec();
        for u in &plan.updates {
            let slot = out
                .iter_mut()
                .find(|s| s.metadata.name == u.metadata.name)
                .unwrap();
            *slot = u.clone();
        }
        for (i, c) in plan.creates.iter().enumerate() {
            let mut c = c.clone();
            c.metadata.name = Some(format!("{}x{i}", c.metadata.generate_name.clone().unwrap()));
            out.push(c);
        }
        for s in &mut out {
            for d in s.spec.devices.iter_mut().flatten() {
                for t in d.taints.iter_mut().flatten() {
                    t.time_added.get_or_insert_with(|| at(now));
                }
            }
        }
        out
    }

    fn desired(devices: &[Device]) -> Vec<DesiredSlice> {
        layout(devices, Mode::Partitionable)
    }

    fn time_of(slices: &[ResourceSlice], device: &str) -> Option<Time> {
        slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| d.name == device)?
            .taints
            .as_ref()?
            .first()?
            .time_added
            .clone()
    }

    #[test]
    fn the_servers_time_added_is_kept_and_never_rewritten() {
        let down = published(link_down);
        let first = plan("knic.dev", &owner(), &[], &desired(&down), &[]);
        let stored = store(&[], &first, 1000);
        assert_eq!(time_of(&stored, PF), Some(at(1000)));
        // Same devices again: nothing to write although the desired taint has no time.
        assert!(plan("knic.dev", &owner(), &stored, &desired(&down), &[]).is_empty());

        // Another device of the PF's slice goes: the slice is rewritten, the PF's taint keeps
        // its first time.
        let fewer: Vec<Device> = down.iter().filter(|d| d.name != VF1).cloned().collect();
        let bump = plan("knic.dev", &owner(), &stored, &desired(&fewer), &[]);
        let written = bump
            .updates
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| d.name == PF)
            .unwrap();
        assert_eq!(
            written.taints.as_ref().unwrap()[0].time_added,
            Some(at(1000))
        );
        let after = store(&stored, &bump, 2000);
        assert_eq!(time_of(&after, PF), Some(at(1000)));

        // Recovered: the taint goes, one slice update.
        let up = published(|t| t);
        let cleared = plan("knic.dev", &owner(), &after, &desired(&up[..2]), &[]);
        assert_eq!(cleared.updates.len(), 1);
        assert_eq!(
            cleared.updates[0].spec.devices.as_ref().unwrap()[0].taints,
            None
        );
        // Down again later: a new taint, a new time.
        let again = store(&after, &cleared, 3000);
        let redo = plan("knic.dev", &owner(), &again, &desired(&down[..2]), &[]);
        let stored_again = store(&again, &redo, 4000);
        assert_eq!(time_of(&stored_again, PF), Some(at(4000)));
    }

    #[test]
    fn same_ignores_unset_and_near_taint_times_only() {
        let down = published(link_down);
        let spec = |t: Option<Time>| {
            let mut d = by_name(&down, PF).clone();
            d.taints.as_mut().unwrap()[0].time_added = t;
            k8s_openapi::api::resource::v1::ResourceSliceSpec {
                devices: Some(vec![d]),
                ..Default::default()
            }
        };
        assert!(same(&spec(None), &spec(Some(at(10)))));
        assert!(same(&spec(Some(at(10))), &spec(None)));
        assert!(same(&spec(Some(at(10))), &spec(Some(at(11)))));
        assert!(!same(&spec(Some(at(10))), &spec(Some(at(12)))));
        let mut other_value = spec(None);
        other_value.devices.as_mut().unwrap()[0]
            .taints
            .as_mut()
            .unwrap()[0]
            .value = Some("lowerlayerdown".into());
        assert!(!same(&other_value, &spec(Some(at(10)))));
        let mut empty = spec(None);
        empty.devices.as_mut().unwrap()[0].taints = Some(vec![]);
        let mut none = spec(None);
        none.devices.as_mut().unwrap()[0].taints = None;
        assert!(same(&empty, &none));
    }
}
