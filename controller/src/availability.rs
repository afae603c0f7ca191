//! "Which networks are available, and where": for every Network, how many nodes currently
//! offer at least one free device its generated claims would accept.
//!
//! A device counts when it is published in the newest generation of its pool by a node-local
//! `knic.dev` slice, is not in any claim's allocation, and passes every selector the scheduler
//! would apply: the DeviceClass's and the template's request selectors, including the
//! exhaustion selector, so a full network reports zero nodes, exactly as the scheduler sees it.
//! Devices drawing on shared counters (an SR-IOV PF's VF budget) count only while the budget
//! has room (`availability/counters.rs`).
//! Selectors are evaluated by [`crate::cel`]; a Network whose selectors use CEL outside knic's
//! subset gets no number at all (the field is left unset) rather than a wrong one.
//!
//! The computation ([`available_nodes`], [`wanted_for`]) is pure. [`run`] keeps caches of
//! slices, claims, classes and Networks and rewrites `status.availableNodes` of the Networks
//! whose number changed, at most once per [`Settings::interval`]: claim and slice churn in a
//! big cluster must not become one status write per event. It patches that one field only, so
//! it never races the reconciler, which writes every other status field and never this one.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    Device, DeviceClass, ResourceClaim, ResourceClaimTemplateSpec, ResourceSlice,
};
use kube::ResourceExt;

use crate::cel::{self, Selector};
use crate::network::{CONDITION_INVALID, Network};
use crate::plan::{Plan, plan};
use crate::{Error, Result};

/// Timing of the availability loop.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The shortest time between two recomputations (changes in between are batched).
    pub interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            interval: Duration::from_secs(5),
        }
    }
}

/// A device's identity in allocations: driver, pool, device.
pub type DeviceKey = (String, String, String);

/// What a claim from a template asks for: `count` devices that each pass every selector.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    /// The DeviceClass's selectors, then the request's, compiled, in the scheduler's order.
    pub selectors: Vec<Selector>,
    /// Devices per claim (`interfacesPerPod`): a node offers the network only with this many.
    pub count: u32,
}

impl Wanted {
    /// Whether `device` passes, evaluating the selectors in order like the scheduler: the first
    /// `false` settles it; an evaluation error is an `Err`, because in the scheduler it fails
    /// the pod's whole scheduling attempt rather than just this device.
    pub fn accepts(&self, device: &cel::Device) -> Result<bool> {
        for selector in &self.selectors {
            if !selector.matches(device)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// What `network`'s generated claims ask for: see [`wanted_by`]. `Err` says why the number
/// cannot be known (an Invalid Network, a missing DeviceClass, or CEL outside knic's subset).
pub fn wanted_for(
    network: &Network,
    all: &[Network],
    classes: &BTreeMap<String, DeviceClass>,
) -> Result<Wanted> {
    // Invalid also when only the apiserver refused the template (e.g. a selector its CEL
    // compiler rejects): then there is no template, and the selectors are not to be trusted.
    if network.condition_is_true(CONDITION_INVALID) {
        return Err(uncountable("the Network is Invalid"));
    }
    match plan(network, all) {
        Plan::Generate(template) => wanted_by(&template, classes),
        Plan::Invalid(_) => Err(uncountable("the Network is Invalid")),
    }
}

/// What a claim made from `template` asks for: its DeviceClass's selectors, then its request's
/// (knic templates have exactly one request), and the request's count.
pub fn wanted_by(
    template: &ResourceClaimTemplateSpec,
    classes: &BTreeMap<String, DeviceClass>,
) -> Result<Wanted> {
    let request = template
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref())
        .and_then(|r| r.first())
        .and_then(|r| r.exactly.as_ref())
        .ok_or_else(|| uncountable("the template has no exact request"))?;
    let class = classes.get(&request.device_class_name).ok_or_else(|| {
        uncountable(format!(
            "DeviceClass {:?} does not exist",
            request.device_class_name
        ))
    })?;
    let selectors = class
        .spec
        .selectors
        .iter()
        .flatten()
        .chain(request.selectors.iter().flatten())
        .map(|s| {
            let expression = &s
                .cel
                .as_ref()
                .ok_or_else(|| uncountable("a selector that is not CEL"))?
                .expression;
            Selector::compile(expression)
                .map_err(|e| uncountable(format!("selector {expression:?}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let count = request
        .count
        .map_or(Ok(1), u32::try_from)
        .map_err(|_| uncountable("the request's count is out of range"))?;
    Ok(Wanted { selectors, count })
}

/// The devices claims hold exclusively, so they are not counted as free. Admin-access
/// allocations share the device and do not take it, as for the scheduler.
pub fn allocated<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>) -> BTreeSet<DeviceKey> {
    claims
        .into_iter()
        .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref())
        .flat_map(|d| d.results.iter().flatten())
        .filter(|r| r.admin_access != Some(true))
        .map(|r| (r.driver.clone(), r.pool.clone(), r.device.clone()))
        .collect()
}

/// How many nodes publish at least `wanted.count` free devices that pass `wanted`'s
/// selectors. Only node-local slices of the newest generation of their pool count, like for
/// the scheduler. Devices that consume shared counters (an SR-IOV PF and its VFs share one
/// budget) count only while their pool's counters have room, after what allocated devices
/// consume: a PF with one VF taken is not free, nor are the VFs of a PF that is. `Err` when a
/// selector fails to evaluate on a free device, or a counter is not a whole number: the
/// scheduler would then fail pods of this network outright, so no number would be honest.
pub fn available_nodes(
    wanted: &Wanted,
    slices: &[&ResourceSlice],
    allocated: &BTreeSet<DeviceKey>,
) -> Result<u32> {
    let mut newest: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for s in slices {
        let key = (s.spec.driver.as_str(), s.spec.pool.name.as_str());
        let generation = newest.entry(key).or_insert(s.spec.pool.generation);
        *generation = (*generation).max(s.spec.pool.generation);
    }
    let current: Vec<&ResourceSlice> = slices
        .iter()
        .copied()
        .filter(|s| {
            let key = (s.spec.driver.as_str(), s.spec.pool.name.as_str());
            newest.get(&key) == Some(&s.spec.pool.generation)
        })
        .collect();
    let mut budgets = counters::Budgets::of(&current, allocated)?;
    // Per node, the free accepted devices with what each would consume.
    let mut candidates: BTreeMap<&str, Vec<(&str, &str, &Device)>> = BTreeMap::new();
    for s in &current {
        let Some(node) = s.spec.node_name.as_deref() else {
            continue;
        };
        for device in s.spec.devices.iter().flatten() {
            let id = (
                s.spec.driver.clone(),
                s.spec.pool.name.clone(),
                device.name.clone(),
            );
            if allocated.contains(&id) {
                continue;
            }
            let view = cel::Device::from_slice(&s.spec.driver, device);
            let accepted = wanted
                .accepts(&view)
                .map_err(|e| uncountable(format!("device {} of node {node}: {e}", device.name)))?;
            if accepted {
                candidates.entry(node).or_default().push((
                    s.spec.driver.as_str(),
                    s.spec.pool.name.as_str(),
                    device,
                ));
            }
        }
    }
    let mut nodes = 0usize;
    for (_, mut devices) in candidates {
        // Cheapest first, so a PF that would take a whole budget does not hide its VFs.
        devices.sort_by_key(|(_, _, d)| counters::total(d));
        let mut free = 0u32;
        for (driver, pool, device) in devices {
            if budgets.take(driver, pool, device)? {
                free += 1;
            }
        }
        if free >= wanted.count {
            nodes += 1;
        }
    }
    Ok(u32::try_from(nodes).unwrap_or(u32::MAX))
}

fn uncountable(why: impl Into<String>) -> Error {
    Error::Uncountable(why.into())
}

/// Every Network's number (or `None` when it cannot be known), from the caches' contents.
///
/// Generic over [`Borrow`] so the loop passes its caches' `Arc`s without copying every slice
/// and claim on each recomputation, and tests pass plain values.
pub fn compute<S, C, D>(
    networks: &[Network],
    slices: &[S],
    claims: &[C],
    classes: &[D],
) -> BTreeMap<String, Option<u32>>
where
    S: Borrow<ResourceSlice>,
    C: Borrow<ResourceClaim>,
    D: Borrow<DeviceClass>,
{
    let classes: BTreeMap<String, DeviceClass> = classes
        .iter()
        .map(|c| (c.borrow().name_any(), c.borrow().clone()))
        .collect();
    let slices: Vec<&ResourceSlice> = slices
        .iter()
        .map(Borrow::borrow)
        .filter(|s| s.spec.driver == knic_proto::DRIVER_NAME)
        .collect();
    let taken = allocated(claims.iter().map(Borrow::borrow));
    networks
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .map(|n| {
            let number = match wanted_for(n, networks, &classes)
                .and_then(|wanted| available_nodes(&wanted, &slices, &taken))
            {
                Ok(number) => Some(number),
                Err(why) => {
                    tracing::debug!(network = %n.name_any(), %why, "available nodes unknown");
                    None
                }
            };
            (n.name_any(), number)
        })
        .collect()
}

mod counters;
mod updater;
pub use updater::run;

#[cfg(test)]
mod tests;
