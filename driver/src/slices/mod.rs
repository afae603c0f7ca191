//! From an inventory to ResourceSlices, as pure functions.
//!
//! [`desired`] decides what the node publishes (devices validated against the apiserver's rules,
//! split into slices, plus the SR-IOV PF budgets of [`counters`] as counter-only slices where the
//! apiserver takes them, see [`Mode`]); [`plan`] compares that with what the API holds and decides the fewest
//! writes, the pool generation and the slice names, following the Go `resourceslice` controller
//! (shared/spec §4.2) so schedulers see the same pool semantics as with any Go driver. The
//! publisher in [`crate::api::slices`] is the only place that performs writes.

pub mod counters;
pub mod exhaustion;
pub mod limits;
pub mod rescan;
pub mod taints;
pub mod withhold;

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CounterSet, Device, DeviceAttribute, DeviceTaint, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::inventory::names::is_dns_label;
use crate::inventory::{AttrValue, Inventory, NetDevice};

/// The apiserver's cap on devices in one slice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// The cap when any device uses taints, counters or list attributes.
pub const MAX_DEVICES_PER_SLICE_ADVANCED: usize = 64;
/// The apiserver's cap on attributes plus capacities per device.
pub const MAX_ATTRIBUTES_PER_DEVICE: usize = 32;
/// The apiserver's cap on a string or version attribute value.
pub const MAX_ATTRIBUTE_STRING: usize = 64;

/// The Node that owns the pool: slices carry an owner reference so they go away with the Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOwner {
    /// Node name; also the pool name and `spec.nodeName`.
    pub node_name: String,
    /// Node UID, for the owner reference.
    pub node_uid: String,
}

fn is_c_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Checks an attribute key: a C identifier (≤ 32) in the driver's domain, or
/// `<DNS subdomain ≤ 63>/<C identifier ≤ 32>`.
pub fn is_qualified_name(key: &str) -> bool {
    match key.split_once('/') {
        None => key.len() <= 32 && is_c_identifier(key),
        Some((domain, id)) => {
            domain.len() <= 63
                && crate::check_dns_subdomain(domain).is_ok()
                && id.len() <= 32
                && is_c_identifier(id)
        }
    }
}

/// Converts one inventory device, leaving out (with a log line) whatever the apiserver would
/// reject: an invalid name drops the device, an invalid or over-long attribute drops the
/// attribute. A slice that is rejected would hide every other device on the node.
pub fn to_api_device(dev: &NetDevice) -> Option<Device> {
    if !is_dns_label(&dev.name) {
        tracing::warn!(device = %dev.name, "device name is not a DNS label; not published");
        return None;
    }
    let mut attributes = BTreeMap::new();
    for (key, value) in &dev.attributes {
        if !is_qualified_name(key) {
            tracing::warn!(device = %dev.name, attribute = %key, "attribute name is not a qualified name; left out");
            continue;
        }
        let attr = match value {
            AttrValue::Int(i) => DeviceAttribute {
                int: Some(*i),
                ..Default::default()
            },
            AttrValue::Bool(b) => DeviceAttribute {
                bool: Some(*b),
                ..Default::default()
            },
            AttrValue::Str(s) => DeviceAttribute {
                string: Some(s.clone()),
                ..Default::default()
            },
        };
        // Lengths and the count are [`limits::fit`]'s, applied once capacities are known.
        attributes.insert(key.clone(), attr);
    }
    Some(Device {
        name: dev.name.clone(),
        attributes: (!attributes.is_empty()).then_some(attributes),
        ..Default::default()
    })
}

fn uses_advanced_features(d: &Device) -> bool {
    d.taints.as_ref().is_some_and(|t| !t.is_empty())
        || d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
}

/// The node's devices as published: the inventory's devices validated for the apiserver, plus
/// `retained` devices (prepared for a pod, hence gone from the host's view, but still
/// allocated) that the inventory no longer shows; in name order, names unique. Devices of an
/// SR-IOV PF consume its budget ([`counters::consume`]); [`layout`] drops that where the
/// apiserver does not take it.
pub fn devices(inventory: &Inventory, retained: &[Device]) -> Vec<Device> {
    // A thousand devices' attribute maps: converted on the discovery pass's threads.
    let mut devices: Vec<Device> = crate::inventory::par_map(&inventory.devices, to_api_device)
        .into_iter()
        .flatten()
        .collect();
    if let Some(underlay) = &inventory.overlay {
        devices.push(crate::inventory::overlay::device(underlay));
    }
    for kept in retained {
        if !devices.iter().any(|d| d.name == kept.name) {
            devices.push(kept.clone());
        }
    }
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    devices.dedup_by(|b, a| {
        let dup = a.name == b.name;
        if dup {
            tracing::warn!(device = %b.name, "duplicate device name; only the first is published");
        }
        dup
    });
    counters::consume(&mut devices, &counters::budgets(inventory));
    devices
}

/// Splits devices into slices: at most 128 per slice (64 when any device uses taints or
/// counters), devices kept in order (the scheduler allocates first-fit in slice-name order, so
/// the order is stable), and always at least one slice: an empty pool and no pool mean
/// different things to the scheduler.
pub fn split(devices: &[Device]) -> Vec<Vec<Device>> {
    split_owned(devices.to_vec())
}

/// [`split`], moving the devices into the slices instead of copying them: with a thousand
/// devices each copy is megabytes of peak memory.
pub fn split_owned(devices: Vec<Device>) -> Vec<Vec<Device>> {
    let per_slice = if devices.iter().any(uses_advanced_features) {
        MAX_DEVICES_PER_SLICE_ADVANCED
    } else {
        MAX_DEVICES_PER_SLICE
    };
    if devices.is_empty() {
        return vec![Vec::new()];
    }
    let mut out = Vec::with_capacity(devices.len().div_ceil(per_slice));
    let mut rest = devices.into_iter().peekable();
    while rest.peek().is_some() {
        out.push(rest.by_ref().take(per_slice).collect());
    }
    out
}

/// What the apiserver takes: whether `DRAPartitionableDevices` is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// PF budgets are published as shared counters that the devices consume.
    Partitionable,
    /// The gate is off (the apiserver drops counters): plain devices only.
    Plain,
}

/// One desired slice: devices or counter sets, never both (the apiserver refuses both from
/// 1.35 on); both empty only for the one slice of an empty pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DesiredSlice {
    /// The slice's devices.
    pub devices: Vec<Device>,
    /// The slice's shared counter sets.
    pub shared_counters: Vec<CounterSet>,
}

impl From<Vec<Device>> for DesiredSlice {
    fn from(devices: Vec<Device>) -> Self {
        DesiredSlice {
            devices,
            shared_counters: Vec::new(),
        }
    }
}

/// The slices for `devices` (as [`devices`] makes them) in `mode`: device slices first (so the
/// device slices keep their names and indexes whether or not counters are published), then the
/// counter sets the devices consume, at most 8 per slice. In [`Mode::Plain`] the devices lose
/// their `consumesCounters`, so the pool never names a set it does not publish.
pub fn layout(devices: &[Device], mode: Mode) -> Vec<DesiredSlice> {
    layout_owned(devices.to_vec(), mode)
}

/// [`layout`], moving the devices into the slices instead of copying them.
pub fn layout_owned(mut devices: Vec<Device>, mode: Mode) -> Vec<DesiredSlice> {
    limits::fit_all(&mut devices);
    match mode {
        Mode::Plain => {
            for d in &mut devices {
                d.consumes_counters = None;
            }
            split_owned(devices)
                .into_iter()
                .map(DesiredSlice::from)
                .collect()
        }
        Mode::Partitionable => {
            let sets = counters::counter_sets(&devices);
            let mut out: Vec<DesiredSlice> = split_owned(devices)
                .into_iter()
                .map(DesiredSlice::from)
                .collect();
            out.extend(
                sets.chunks(counters::MAX_COUNTER_SETS_PER_SLICE)
                    .map(|chunk| DesiredSlice {
                        devices: Vec::new(),
                        shared_counters: chunk.to_vec(),
                    }),
            );
            out
        }
    }
}

/// The node's desired slices for an inventory with nothing retained, counters published.
pub fn desired(inventory: &Inventory) -> Vec<DesiredSlice> {
    layout_owned(devices(inventory, &[]), Mode::Partitionable)
}

/// The writes that bring the API to the desired state, in the order they must happen.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Pool generation the written slices carry.
    pub generation: i64,
    /// Obsolete slices, deleted first (with uid and resourceVersion preconditions).
    pub deletes: Vec<ResourceSlice>,
    /// Existing slices with a new spec (metadata kept, so the resourceVersion guards the write).
    pub updates: Vec<ResourceSlice>,
    /// New slices (with `generateName` and the Node owner reference).
    pub creates: Vec<ResourceSlice>,
}

impl Plan {
    /// True when the API already holds the desired state.
    pub fn is_empty(&self) -> bool {
        self.deletes.is_empty() && self.updates.is_empty() && self.creates.is_empty()
    }
}

/// The `generateName` prefix for slice `index` of `count` (1.36+ scheme): the index in hex,
/// zero-padded, then driver and node.
pub fn name_prefix(driver: &str, node: &str, index: usize, count: usize) -> String {
    let digits = format!("{:x}", count.saturating_sub(1)).len().max(5);
    format!("{index:0digits$x}-{driver}-{node}-")
}

fn parse_index(name: &str, driver: &str, node: &str) -> Option<usize> {
    let (hex, rest) = name.split_once('-')?;
    if hex.len() < 5 || !rest.starts_with(&format!("{driver}-{node}-")) {
        return None;
    }
    usize::from_str_radix(hex, 16).ok()
}

fn spec(
    driver: &str,
    node: &str,
    generation: i64,
    count: usize,
    slice: DesiredSlice,
) -> ResourceSliceSpec {
    ResourceSliceSpec {
        driver: driver.into(),
        node_name: Some(node.into()),
        pool: ResourcePool {
            name: node.into(),
            generation,
            resource_slice_count: count as i64,
        },
        devices: (!slice.devices.is_empty()).then_some(slice.devices),
        shared_counters: (!slice.shared_counters.is_empty()).then_some(slice.shared_counters),
        ..Default::default()
    }
}

/// The taints of every device in `slices`, by device name: where the stored `timeAdded` of a
/// taint comes from when the slice is rewritten.
fn stored_taints<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSliceSpec>,
) -> BTreeMap<&'a str, &'a [DeviceTaint]> {
    slices
        .into_iter()
        .flat_map(|s| s.devices.iter().flatten())
        .filter_map(|d| Some((d.name.as_str(), d.taints.as_deref()?)))
        .collect()
}

/// Gives each taint in `spec` that `timeAdded` of the same taint (key, value, effect) in
/// `stored` when it has none (or, with `close`, one within a second of it), as the Go
/// controller does: the apiserver sets the time of a new taint, and carrying it over keeps it
/// the time the taint was first published instead of the time of the last write.
fn carry_time_added(
    spec: &mut ResourceSliceSpec,
    stored: &BTreeMap<&str, &[DeviceTaint]>,
    close: bool,
) {
    for device in spec.devices.iter_mut().flatten() {
        let Some(old) = stored.get(device.name.as_str()) else {
            continue;
        };
        for taint in device.taints.iter_mut().flatten() {
            let found = old
                .iter()
                .find(|o| o.key == taint.key && o.value == taint.value && o.effect == taint.effect);
            let Some(stored_time) = found.and_then(|o| o.time_added.as_ref()) else {
                continue;
            };
            let carry = match &taint.time_added {
                None => true,
                Some(t) => close && (t.0.as_second() - stored_time.0.as_second()).abs() <= 1,
            };
            if carry {
                taint.time_added = Some(stored_time.clone());
            }
        }
    }
}

/// Compares specs the way the apiserver stores them: an empty list is the same as none, and a
/// taint's unset `timeAdded` matches any (the apiserver fills it in), a set one any within a
/// second.
pub(crate) fn same(a: &ResourceSliceSpec, b: &ResourceSliceSpec) -> bool {
    let norm = |s: &ResourceSliceSpec, other: &ResourceSliceSpec, close: bool| {
        let mut s = s.clone();
        carry_time_added(&mut s, &stored_taints([other]), close);
        if s.devices.as_ref().is_some_and(Vec::is_empty) {
            s.devices = None;
        }
        if s.shared_counters.as_ref().is_some_and(Vec::is_empty) {
            s.shared_counters = None;
        }
        for d in s.devices.iter_mut().flatten() {
            if d.consumes_counters.as_ref().is_some_and(Vec::is_empty) {
                d.consumes_counters = None;
            }
            if d.taints.as_ref().is_some_and(Vec::is_empty) {
                d.taints = None;
            }
        }
        s
    };
    norm(a, b, true) == norm(b, a, false)
}

/// Spec pairs `(sent, stored)` where the apiserver dropped fields (a feature gate is off): the
/// stored form is accepted as meaning the sent one, so the publisher does not loop rewriting it.
pub type Accepted = [(ResourceSliceSpec, ResourceSliceSpec)];

fn unchanged(existing: &ResourceSliceSpec, want: &ResourceSliceSpec, accepted: &Accepted) -> bool {
    same(existing, want)
        || accepted
            .iter()
            .any(|(sent, stored)| same(sent, want) && same(stored, existing))
}

/// Decides the writes for one pool. Pure: `existing` is what a LIST returned for this driver and
/// node. Generation rule (Go controller): it stays the same only if no slice is created or
/// deleted and at most one slice changes; otherwise it is bumped and every slice rewritten, so a
/// consumer never mixes slices of two states.
pub fn plan(
    driver: &str,
    owner: &PoolOwner,
    existing: &[ResourceSlice],
    desired: &[DesiredSlice],
    accepted: &Accepted,
) -> Plan {
    plan_owned(driver, owner, existing, desired.to_vec(), accepted)
}

/// [`plan`], moving the desired slices into the written ones instead of copying them.
pub fn plan_owned(
    driver: &str,
    owner: &PoolOwner,
    existing: &[ResourceSlice],
    desired: Vec<DesiredSlice>,
    accepted: &Accepted,
) -> Plan {
    let node = owner.node_name.as_str();
    let ours: Vec<&ResourceSlice> = existing
        .iter()
        .filter(|s| s.spec.driver == driver && s.spec.pool.name == node)
        .collect();
    let current = ours
        .iter()
        .map(|s| s.spec.pool.generation)
        .max()
        .unwrap_or(0);
    let count = desired.len();

    // Match existing slices to desired indexes; among duplicates keep the newest generation.
    let mut matched: Vec<Option<&ResourceSlice>> = vec![None; count];
    let mut deletes = Vec::new();
    let mut sorted = ours.clone();
    sorted.sort_by(|a, b| {
        b.spec
            .pool
            .generation
            .cmp(&a.spec.pool.generation)
            .then(a.metadata.name.cmp(&b.metadata.name))
    });
    for slice in sorted {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        match parse_index(name, driver, node) {
            Some(i) if i < count && matched[i].is_none() => matched[i] = Some(slice),
            _ => deletes.push(slice.clone()),
        }
    }

    let keep_generation = current.max(1);
    let changed: Vec<usize> = (0..count)
        .filter(|&i| {
            matched[i].is_some_and(|s| {
                !unchanged(
                    &s.spec,
                    &spec(driver, node, keep_generation, count, desired[i].clone()),
                    accepted,
                )
            })
        })
        .collect();
    let missing = matched.iter().any(Option::is_none);
    let bump = current == 0 || missing || !deletes.is_empty() || changed.len() > 1;
    let generation = if bump { current + 1 } else { keep_generation };

    let stored = stored_taints(ours.iter().map(|s| &s.spec));
    let mut updates = Vec::new();
    let mut creates = Vec::new();
    for (i, slice) in desired.into_iter().enumerate() {
        let mut want = spec(driver, node, generation, count, slice);
        carry_time_added(&mut want, &stored, true);
        match matched[i] {
            Some(slice) if bump || changed.contains(&i) => {
                let mut next = slice.clone();
                next.spec = want;
                updates.push(next);
            }
            Some(_) => {}
            None => creates.push(ResourceSlice {
                metadata: ObjectMeta {
                    generate_name: Some(name_prefix(driver, node, i, count)),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: node.into(),
                        uid: owner.node_uid.clone(),
                        controller: Some(true),
                        block_owner_deletion: None,
                    }]),
                    ..Default::default()
                },
                spec: want,
            }),
        }
    }
    if updates.is_empty() && creates.is_empty() && deletes.is_empty() {
        return Plan {
            generation: current,
            ..Default::default()
        };
    }
    Plan {
        generation,
        deletes,
        updates,
        creates,
    }
}

#[cfg(test)]
mod tests;
