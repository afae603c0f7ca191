//! PF budgets as shared counters (`DRAPartitionableDevices`), so the scheduler can never give a
//! claim a VF and its PF at once.
//!
//! Every SR-IOV PF that has VFs gets one counter set, named from its PCI address, holding one
//! counter [`COUNTER`] as large as the PF's VF budget. Each VF consumes 1 of its PF's set; the PF
//! itself consumes the whole budget, so the PF is allocatable only while none of its VFs is, and
//! the other way round. The budget counts the PF's VFs the host shows, offered or not (a PF that
//! carries the default route is not offered, but its VFs are and still draw on its set).
//!
//! The sets travel with the devices: [`consume`] writes each device's `consumesCounters`, and
//! [`counter_sets`] derives the sets from them, so a published pool can never name a set it does
//! not publish. A device retained for a pod (its copy taken at prepare time) is treated like a
//! discovered one; if its PF has vanished, the set is kept from the retained VFs alone (one unit
//! each), because the Go controller and the scheduler refuse a pool whose devices consume a set
//! nobody publishes, and that would hide every other device of the node.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Counter, CounterSet, Device, DeviceCounterConsumption};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::inventory::names::is_dns_label;
use crate::inventory::{AttrValue, DeviceKind, Inventory, NetDevice};

/// The one counter of a PF's set: how many VFs (or the PF as a whole) may be allocated.
pub const COUNTER: &str = "vfs";
/// The apiserver's cap on counter sets in one slice (1.35+).
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
/// The apiserver's cap on `consumesCounters` entries of one device.
pub const MAX_CONSUMPTIONS_PER_DEVICE: usize = 2;

const ATTR_PF: &str = "pfPciAddress";
const ATTR_PCI: &str = "pciAddress";

/// The counter set of the PF at `pf_pci` (`0000:a2:00.0` → `pf-0000-a2-00-0`): stable across
/// restarts and unique in the pool because PCI addresses are unique on a node. `None` when the
/// address cannot make a DNS label (the apiserver would refuse the slice).
pub fn set_name(pf_pci: &str) -> Option<String> {
    let name = format!(
        "pf-{}",
        pf_pci.to_ascii_lowercase().replace([':', '.'], "-")
    );
    is_dns_label(&name).then_some(name)
}

fn str_attr<'a>(dev: &'a NetDevice, key: &str) -> Option<&'a str> {
    match dev.attributes.get(key) {
        Some(AttrValue::Str(s)) => Some(s),
        _ => None,
    }
}

/// Each PF's VF budget, by PF PCI address: the VFs the host shows for it, offered or excluded.
pub fn budgets(inventory: &Inventory) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let all = inventory
        .devices
        .iter()
        .chain(inventory.excluded.iter().map(|e| &e.device));
    for dev in all.filter(|d| d.kind == DeviceKind::Vf) {
        if let Some(pf) = str_attr(dev, ATTR_PF) {
            *out.entry(pf.to_owned()).or_insert(0) += 1;
        }
    }
    out
}

fn api_str<'a>(dev: &'a Device, key: &str) -> Option<&'a str> {
    dev.attributes.as_ref()?.get(key)?.string.as_deref()
}

/// The PF a published device draws on as a VF.
fn vf_of(dev: &Device) -> Option<&str> {
    api_str(dev, ATTR_PF)
}

/// The PCI address of a published PF.
fn pf_address(dev: &Device) -> Option<&str> {
    (api_str(dev, "kind") == Some("pf"))
        .then(|| api_str(dev, ATTR_PCI))
        .flatten()
}

fn consumption(set: String, value: i64) -> DeviceCounterConsumption {
    DeviceCounterConsumption {
        counter_set: set,
        counters: BTreeMap::from([(
            COUNTER.to_owned(),
            Counter {
                value: Quantity(value.to_string()),
            },
        )]),
    }
}

/// Writes every device's `consumesCounters` from `budgets` (see [`budgets`]), replacing whatever
/// a retained copy carried: a VF consumes 1 of its PF's set, a PF with VFs its whole budget. The
/// budget is never below the VFs actually published, so a retained VF that the host no longer
/// shows still fits beside its siblings and the PF still excludes them all.
pub fn consume(devices: &mut [Device], budgets: &BTreeMap<String, i64>) {
    let mut published: BTreeMap<String, i64> = BTreeMap::new();
    for dev in devices.iter() {
        if let Some(pf) = vf_of(dev) {
            *published.entry(pf.to_owned()).or_insert(0) += 1;
        }
    }
    for dev in devices.iter_mut() {
        dev.consumes_counters = None;
        let (pf, amount) = if let Some(pf) = vf_of(dev) {
            (pf.to_owned(), 1)
        } else if let Some(pf) = pf_address(dev) {
            let budget = budgets
                .get(pf)
                .copied()
                .unwrap_or(0)
                .max(published.get(pf).copied().unwrap_or(0));
            if budget == 0 {
                continue;
            }
            (pf.to_owned(), budget)
        } else {
            continue;
        };
        match set_name(&pf) {
            Some(set) => dev.consumes_counters = Some(vec![consumption(set, amount)]),
            None => tracing::warn!(device = %dev.name, pf = %pf,
                "PF address makes no counter set name; published without a PF budget"),
        }
    }
}

fn amount(c: &DeviceCounterConsumption) -> i64 {
    c.counters
        .get(COUNTER)
        .and_then(|q| q.value.0.parse().ok())
        .unwrap_or(0)
}

/// The counter sets `devices` consume, in name order. A set is as large as its largest single
/// consumer (the PF, which takes all) and at least the sum of what its VFs take, so every VF fits
/// at once and the PF fits only alone, whether or not the PF itself is published.
pub fn counter_sets(devices: &[Device]) -> Vec<CounterSet> {
    let mut sizes: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for dev in devices {
        let is_vf = vf_of(dev).is_some();
        for c in dev.consumes_counters.iter().flatten() {
            let (largest, vfs) = sizes.entry(c.counter_set.clone()).or_insert((0, 0));
            *largest = (*largest).max(amount(c));
            if is_vf {
                *vfs += amount(c);
            }
        }
    }
    sizes
        .into_iter()
        .map(|(name, (largest, vfs))| CounterSet {
            name,
            counters: BTreeMap::from([(
                COUNTER.to_owned(),
                Counter {
                    value: Quantity(largest.max(vfs).to_string()),
                },
            )]),
        })
        .collect()
}

#[cfg(test)]
#[path = "counters_tests.rs"]
mod tests;
