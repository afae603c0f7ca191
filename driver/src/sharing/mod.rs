//! Shared parent ports: one port, many pods, each with a child interface (VLAN, macvlan,
//! ipvlan) and a share of the link.
//!
//! The admin names the parents in the share policy ([`policy`]); nothing is shared by default.
//! A shared parent is published only as shareable, never whole, in one of two forms:
//!
//! * [`ShareMode::Capacity`] (`DRAConsumableCapacity`, on from 1.36): the parent's own device
//!   with `allowMultipleAllocations` and two capacities, `children` (child slots, each claim
//!   takes exactly one) and `bandwidth` (bit/s, with the policy's default and valid range), so
//!   the scheduler subtracts what each claim takes and refuses what no longer fits.
//! * [`ShareMode::Slots`] (the gate is off, the 1.34/1.35 default): one plain device per child
//!   slot, `<parent>-s<i>`, carrying the parent's attributes plus `parent` and `childSlot`;
//!   bandwidth is then accounted at prepare.
//!
//! [`Sharing::mark`] turns the inventory's devices into the capacity form (a pure function of
//! the inventory and the policy); [`expand`] derives the slot form from it, so both modes
//! publish the same parents with the same attributes. The publisher
//! ([`crate::api::slices::Publisher`]) starts in capacity mode and switches for good when the
//! apiserver drops the fields; [`follow`] keeps the preparer's view of the devices in the same
//! mode, so a slot device's name resolves to its parent's attributes at prepare.

pub mod policy;
pub mod quantity;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tokio::sync::watch;

pub use policy::{BandwidthPolicy, ParentEntry, SharePolicy};

use crate::inventory::filter::Invalid;
use crate::inventory::names::is_dns_label;
use crate::inventory::{ATTR_PCI_BUS_ID, ATTR_PCIE_ROOT, AttrValue, Inventory, NetDevice};
use quantity::canonical;

/// Attribute of every shared parent and child slot, so classes and selectors can ask for (or
/// keep away from) shared ports.
pub const ATTR_SHAREABLE: &str = "shareable";
/// Attribute of a child slot: the device name of its parent.
pub const ATTR_PARENT: &str = "parent";
/// Attribute of a child slot: its index on the parent.
pub const ATTR_CHILD_SLOT: &str = "childSlot";
/// Capacity of a shared parent: child slots.
pub const CAPACITY_CHILDREN: &str = "children";
/// Capacity of a shared parent: bit/s (the shared contract's name).
pub const CAPACITY_BANDWIDTH: &str = "bandwidth";
/// Attributes a shared parent keeps besides `shareable`: the apiserver allows 32 attributes
/// plus capacities, and a parent needs room for two capacities (or, as slots, `parent` and
/// `childSlot`) and for the exhausted-networks attribute.
pub const MAX_PARENT_ATTRIBUTES: usize = 28;
/// Attributes never given up for that room: what the preparer and the usual selectors use.
const KEPT: [&str; 7] = [
    "ifName",
    "kind",
    "pciAddress",
    "numaNode",
    "speed",
    ATTR_PCIE_ROOT,
    ATTR_PCI_BUS_ID,
];

/// How shared parents are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShareMode {
    /// One device per parent with consumable capacity.
    #[default]
    Capacity,
    /// One plain device per child slot (the apiserver drops consumable capacity).
    Slots,
}

/// The node's share policy plus the warnings already given, so a rescan every minute does not
/// repeat them.
#[derive(Debug, Default)]
pub struct Sharing {
    policy: SharePolicy,
    warned: Mutex<BTreeSet<String>>,
}

impl Sharing {
    /// Shares what `policy` names.
    pub fn new(policy: SharePolicy) -> Self {
        Sharing {
            policy,
            warned: Mutex::default(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &SharePolicy {
        &self.policy
    }

    fn warn_once(&self, device: &str, why: &str) {
        let Ok(mut warned) = self.warned.lock() else {
            return;
        };
        if warned.insert(format!("{device}: {why}")) {
            tracing::warn!(device, "{why}");
        }
    }

    /// Turns the policy's parents among `devices` (as [`crate::slices::devices`] makes them
    /// from `inventory`) into their shareable capacity form (see [`shared_parent`]), and drops
    /// the retained copies of child slots whose parent is shared again (the slot form is
    /// derived anew from the parent). A parent must be offered (never a default-route
    /// interface: discovery excludes those) and a netdev. Its bandwidth is the policy's or the
    /// link speed; without either, or when the policy's range does not fit the link, the
    /// parent is shared by child slots alone, with a warning.
    pub fn mark(&self, devices: &mut Vec<Device>, inventory: &Inventory) {
        if self.policy.is_empty() {
            return;
        }
        let mut shared = BTreeSet::new();
        for dev in &inventory.devices {
            let Some(if_name) = dev.if_name.as_deref() else {
                continue;
            };
            let Some(entry) = self.policy.entry_for(if_name, dev.pci_address.as_deref()) else {
                continue;
            };
            let Some(published) = devices.iter_mut().find(|d| d.name == dev.name) else {
                continue;
            };
            let bandwidth = match entry.bandwidth.or_else(|| link_bits(dev)) {
                None => {
                    self.warn_once(
                        &dev.name,
                        "shared parent without link speed and without bandwidth in the share \
                         policy: published with child slots only (claims asking for bandwidth \
                         do not fit it)",
                    );
                    None
                }
                Some(total) => match entry.bandwidth_policy(total) {
                    Ok(policy) => Some(policy),
                    Err(Invalid(why)) => {
                        self.warn_once(
                            &dev.name,
                            &format!("share policy {why}: published with child slots only"),
                        );
                        None
                    }
                },
            };
            shared_parent(published, entry.children, bandwidth.as_ref());
            shared.insert(dev.name.clone());
        }
        devices.retain(|d| !(is_slot(d) && parent_of(d).is_some_and(|p| shared.contains(p))));
    }
}

impl Sharing {
    /// The bandwidth policy of the shared parent that `device` (as published: the parent in
    /// capacity form, or one of its child slots) stands for, from the attributes it carries.
    /// In slot mode the apiserver accounts nothing, so prepare enforces this instead: the
    /// default for a claim that asks for no bandwidth, and the total across the parent's
    /// children. `None` when the device is not shared or its bandwidth is unknown (published
    /// with child slots only).
    pub fn bandwidth_of(&self, device: &Device) -> Option<BandwidthPolicy> {
        if attribute(device, ATTR_SHAREABLE).and_then(|a| a.bool) != Some(true) {
            return None;
        }
        let if_name = attribute(device, "ifName")?.string.as_deref()?;
        let pci = attribute(device, "pciAddress").and_then(|a| a.string.as_deref());
        let entry = self.policy.entry_for(if_name, pci)?;
        let speed = attribute(device, "speed")
            .and_then(|a| a.int)
            .filter(|mbits| *mbits > 0)
            .and_then(|mbits| (mbits as u64).checked_mul(1_000_000));
        entry.bandwidth_policy(entry.bandwidth.or(speed)?).ok()
    }
}

/// The link speed in bit/s (`speed` is in Mbit/s, as sysfs reports it).
fn link_bits(dev: &NetDevice) -> Option<u64> {
    match dev.attr("speed") {
        Some(AttrValue::Int(mbits)) if *mbits > 0 => (*mbits as u64).checked_mul(1_000_000),
        _ => None,
    }
}

fn quantity(value: u64) -> Quantity {
    Quantity(canonical(value))
}

fn attr_bool(b: bool) -> DeviceAttribute {
    DeviceAttribute {
        bool: Some(b),
        ..Default::default()
    }
}

fn attr_str(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_owned()),
        ..Default::default()
    }
}

fn attr_int(i: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i),
        ..Default::default()
    }
}

/// Makes `device` a shared parent in capacity form: `shareable: true`,
/// `allowMultipleAllocations`, `children` (each claim takes exactly 1 of `children`) and, when
/// known, `bandwidth` with its request policy. It consumes no PF budget: its VFs stay
/// allocatable beside its children. Attributes beyond [`MAX_PARENT_ATTRIBUTES`] are left out,
/// the last in key order first, never those in `KEPT`.
pub fn shared_parent(device: &mut Device, children: u32, bandwidth: Option<&BandwidthPolicy>) {
    device.consumes_counters = None;
    let mut attributes = device.attributes.take().unwrap_or_default();
    attributes.remove(ATTR_SHAREABLE);
    while attributes.len() > MAX_PARENT_ATTRIBUTES {
        let Some(key) = attributes
            .keys()
            .rev()
            .find(|k| !KEPT.contains(&k.as_str()))
            .cloned()
        else {
            break;
        };
        tracing::warn!(device = %device.name, attribute = %key,
            "no room on a shared parent for this attribute; left out");
        attributes.remove(&key);
    }
    attributes.insert(ATTR_SHAREABLE.to_owned(), attr_bool(true));
    device.attributes = Some(attributes);
    device.allow_multiple_allocations = Some(true);
    let mut capacity = BTreeMap::from([(
        CAPACITY_CHILDREN.to_owned(),
        DeviceCapacity {
            value: quantity(u64::from(children)),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(quantity(1)),
                valid_values: Some(vec![quantity(1)]),
                valid_range: None,
            }),
        },
    )]);
    if let Some(b) = bandwidth {
        capacity.insert(
            CAPACITY_BANDWIDTH.to_owned(),
            DeviceCapacity {
                value: quantity(b.total),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(quantity(b.default)),
                    valid_values: None,
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: quantity(b.min),
                        max: None,
                        step: b.step.map(quantity),
                    }),
                }),
            },
        );
    }
    device.capacity = Some(capacity);
}

fn attribute<'a>(device: &'a Device, key: &str) -> Option<&'a DeviceAttribute> {
    device.attributes.as_ref()?.get(key)
}

/// Whether `device` is a shared parent in capacity form.
pub fn is_shared_parent(device: &Device) -> bool {
    device.allow_multiple_allocations == Some(true)
        && attribute(device, ATTR_SHAREABLE).and_then(|a| a.bool) == Some(true)
}

/// Whether `device` is a child slot.
pub fn is_slot(device: &Device) -> bool {
    attribute(device, ATTR_CHILD_SLOT).is_some_and(|a| a.int.is_some())
        && parent_of(device).is_some()
}

/// The parent device a child slot belongs to.
pub fn parent_of(device: &Device) -> Option<&str> {
    attribute(device, ATTR_PARENT)?.string.as_deref()
}

/// The device name of child slot `slot` of `parent`: `<parent>-s<slot>`, or, when that is
/// longer than a DNS label may be, the parent's name cut short plus a hash of the whole name,
/// so it stays stable across restarts and distinct between parents that share a prefix.
pub fn slot_name(parent: &str, slot: u32) -> String {
    let plain = format!("{parent}-s{slot}");
    if plain.len() <= 63 {
        return plain;
    }
    // FNV-1a: stable across builds and platforms, unlike the standard library's hasher.
    let hash = parent.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let suffix = format!("-{:010x}-s{slot}", hash & 0xff_ffff_ffff);
    let mut end = (63 - suffix.len()).min(parent.len());
    while !parent.is_char_boundary(end) {
        end -= 1;
    }
    let mut cut = parent[..end].to_owned();
    while cut.ends_with('-') {
        cut.pop();
    }
    format!("{cut}{suffix}")
}

fn slot_count(parent: &Device) -> u32 {
    parent
        .capacity
        .as_ref()
        .and_then(|c| c.get(CAPACITY_CHILDREN))
        .and_then(|c| quantity::parse_bits(&c.value.0).ok())
        .map_or(0, |n| n.min(u64::from(policy::MAX_CHILDREN)) as u32)
}

/// The child slots of a shared parent in capacity form: its attributes plus `parent` and
/// `childSlot`, no capacity; its taints, since a slot is no more usable than its parent.
pub fn slots(parent: &Device) -> Vec<Device> {
    (0..slot_count(parent))
        .map(|i| {
            let mut attributes = parent.attributes.clone().unwrap_or_default();
            attributes.insert(ATTR_PARENT.to_owned(), attr_str(&parent.name));
            attributes.insert(ATTR_CHILD_SLOT.to_owned(), attr_int(i64::from(i)));
            Device {
                name: slot_name(&parent.name, i),
                attributes: Some(attributes),
                taints: parent.taints.clone(),
                ..Default::default()
            }
        })
        .collect()
}

/// `devices` as published in `mode`: unchanged in capacity mode; in slot mode every shared
/// parent replaced by its [`slots`], in name order, a slot whose name another device already
/// has left out (with a warning: a device named like `<parent>-s<i>` exists on the node).
pub fn expand(devices: &[Device], mode: ShareMode) -> Vec<Device> {
    if mode == ShareMode::Capacity || !devices.iter().any(is_shared_parent) {
        return devices.to_vec();
    }
    let taken: BTreeSet<&str> = devices
        .iter()
        .filter(|d| !is_shared_parent(d))
        .map(|d| d.name.as_str())
        .collect();
    let mut out: Vec<Device> = Vec::with_capacity(devices.len());
    for device in devices {
        if !is_shared_parent(device) {
            out.push(device.clone());
            continue;
        }
        for slot in slots(device) {
            if taken.contains(slot.name.as_str()) || !is_dns_label(&slot.name) {
                tracing::warn!(device = %slot.name, parent = %device.name,
                    "child slot name is taken by another device; slot not published");
                continue;
            }
            out.push(slot);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Keeps `out` equal to `devices` as published in the publisher's current `mode`, until
/// `devices`' sender is dropped: the preparer resolves an allocated device name (a slot's too)
/// through it. Once the mode's sender is gone, the last mode stays in force.
pub async fn follow(
    devices: watch::Receiver<Vec<Device>>,
    mode: watch::Receiver<ShareMode>,
    out: watch::Sender<Vec<Device>>,
) {
    crate::watches::derive(devices, mode, out, |d, m| expand(d, *m)).await;
}
