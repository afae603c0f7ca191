//! Which knic Networks this node can serve now, and why not: the one answer behind KNI
//! `QueryNodeNetworks`, the device an attach gets, and the node readiness object.
//!
//! Pure: the Networks, the DeviceClasses' selectors, the devices as this node offers them
//! (published, minus the withheld), the prepared claims and the driver's own readiness come in;
//! nothing is read here. A Network is ready on this node when it is valid, not exhausted, its
//! selectors can be evaluated, the node has as many free matching devices as one pod of it
//! takes (`interfacesPerPod`), and the driver itself is ready (slices published, kubelet
//! registration acknowledged, NRI connected: the `/readyz` conditions, where they apply). A
//! device is free when no prepared claim holds it whole; a shared port (published
//! `shareable`) serves many claims and counts as free while it is offered. This is the
//! controller's `availableNodes` question asked for one node with the same CEL evaluator
//! (`knic_proto::cel`), except that the driver sees prepared claims, not allocations still
//! waiting for their prepare.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::Device;
use knic_proto::cel::{self, Selector};
use knic_proto::network::{
    CONDITION_EXHAUSTED, CONDITION_INVALID, Network, validate_against, validate_network,
};

use crate::claims::checkpoint::Checkpoint;
use crate::claims::plan::shared::SHAREABLE;

/// The driver's own readiness, each `None` where it does not apply (standalone mode has no
/// kubelet, no NRI and publishes no slices).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// ResourceSlices published.
    pub published: Option<bool>,
    /// The kubelet acknowledged the plugin registration.
    pub registered: Option<bool>,
    /// The NRI plugin is connected to the runtime.
    pub nri: Option<bool>,
}

impl NodeFacts {
    /// What keeps the driver from being ready, in `/readyz`'s words.
    pub fn missing(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.published == Some(false) {
            out.push("ResourceSlices not published yet".to_owned());
        }
        if self.registered == Some(false) {
            out.push("kubelet registration not acknowledged".to_owned());
        }
        if self.nri == Some(false) {
            out.push("NRI plugin not connected to the container runtime".to_owned());
        }
        out
    }
}

/// Everything the answer depends on.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Every Network known (cluster or standalone files).
    pub networks: &'a [Network],
    /// DeviceClass name → its CEL selectors; a class not in the map does not exist.
    pub classes: &'a super::catalog::Classes,
    /// This node's devices as offered (published, minus the withheld).
    pub devices: &'a [Device],
    /// The prepared claims.
    pub checkpoint: &'a Checkpoint,
    /// The driver's own readiness.
    pub node: NodeFacts,
    /// Standalone: no controller judges the Networks, so they are validated here, alone and
    /// against each other, with the controller's code.
    pub validate: bool,
}

/// One Network on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkReadiness {
    /// The Network's name.
    pub name: String,
    /// Usable now by one more pod (or sandbox).
    pub ready: bool,
    /// Why not, each naming the field or fact; empty when ready.
    pub reasons: Vec<String>,
    /// Offered devices its selectors accept, by name.
    pub matching: Vec<String>,
    /// Of those, the ones free now (shared ports included), in the order an attach takes them.
    pub free: Vec<String>,
    /// Devices one pod of it takes (`interfacesPerPod`).
    pub needed: u32,
}

/// The node as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReadiness {
    /// The driver is ready (the `/readyz` conditions that apply hold).
    pub ready: bool,
    /// What keeps it from being ready.
    pub reasons: Vec<String>,
    /// Every Network, by name.
    pub networks: Vec<NetworkReadiness>,
}

/// Devices held whole by a prepared claim (no shareID): device name → `namespace/name` of the
/// claim, for the reason text.
pub fn held(checkpoint: &Checkpoint) -> BTreeMap<String, String> {
    checkpoint
        .claims
        .values()
        .flat_map(|c| {
            c.devices
                .iter()
                .filter(|d| d.share_id.is_none())
                .map(move |d| (d.device.clone(), format!("{}/{}", c.namespace, c.name)))
        })
        .collect()
}

/// Whether the device is published as a shared port (or one of its slots).
pub fn is_shareable(device: &Device) -> bool {
    device
        .attributes
        .as_ref()
        .and_then(|a| a.get(SHAREABLE))
        .and_then(|a| a.bool)
        == Some(true)
}

/// The whole answer.
pub fn node_readiness(inputs: Inputs<'_>) -> NodeReadiness {
    let reasons = inputs.node.missing();
    let others: Vec<(String, knic_proto::network::NetworkSpec)> = inputs
        .networks
        .iter()
        .map(|n| (n.metadata.name.clone().unwrap_or_default(), n.spec.clone()))
        .collect();
    let held = held(inputs.checkpoint);
    let mut networks: Vec<NetworkReadiness> = inputs
        .networks
        .iter()
        .map(|n| network_readiness(n, &inputs, &others, &held, &reasons))
        .collect();
    networks.sort_by(|a, b| a.name.cmp(&b.name));
    NodeReadiness {
        ready: reasons.is_empty(),
        reasons,
        networks,
    }
}

fn network_readiness(
    network: &Network,
    inputs: &Inputs<'_>,
    others: &[(String, knic_proto::network::NetworkSpec)],
    held: &BTreeMap<String, String>,
    node: &[String],
) -> NetworkReadiness {
    let name = network.metadata.name.clone().unwrap_or_default();
    let needed = network.spec.interfaces_per_pod();
    let mut reasons = Vec::new();
    if network.metadata.deletion_timestamp.is_some() {
        reasons.push(format!("Network {name:?} is being deleted"));
    }
    if network.condition_is_true(CONDITION_INVALID) {
        let why = network
            .condition(CONDITION_INVALID)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        reasons.push(format!("Network {name:?} is Invalid: {why}"));
    }
    if inputs.validate {
        let mut problems: Vec<String> = match validate_network(&name, &network.spec) {
            Ok(()) => Vec::new(),
            Err(e) => vec![e.to_string()],
        };
        problems.extend(
            validate_against(&name, &network.spec, others)
                .iter()
                .map(ToString::to_string),
        );
        if !problems.is_empty() {
            reasons.push(format!(
                "Network {name:?} is Invalid: {}",
                problems.join("; ")
            ));
        }
    }
    if network.condition_is_true(CONDITION_EXHAUSTED) {
        reasons.push(format!(
            "Network {name:?} is Exhausted: no free address for a new interface"
        ));
    }
    let (matching, free) = match matching_devices(network, inputs) {
        Ok(matching) => {
            let free: Vec<String> = matching
                .iter()
                .filter(|d| is_shareable(d) || !held.contains_key(&d.name))
                .map(|d| d.name.clone())
                .collect();
            let matching: Vec<String> = matching.iter().map(|d| d.name.clone()).collect();
            if matching.is_empty() {
                reasons.push(format!(
                    "no device offered on this node matches spec.devices ({})",
                    network.spec.devices_summary()
                ));
            } else if free.len() < needed as usize {
                let busy: Vec<String> = matching
                    .iter()
                    .filter_map(|d| held.get(d).map(|c| format!("{d} by {c}")))
                    .collect();
                reasons.push(format!(
                    "{} of {} matching devices free, {needed} needed per pod (in use: {})",
                    free.len(),
                    matching.len(),
                    busy.join(", ")
                ));
            }
            (matching, free)
        }
        Err(why) => {
            reasons.push(why);
            (Vec::new(), Vec::new())
        }
    };
    reasons.extend(node.iter().cloned());
    NetworkReadiness {
        ready: reasons.is_empty(),
        name,
        reasons,
        matching,
        free,
        needed,
    }
}

/// The offered devices the Network's claims would accept (its class's selectors and its own),
/// sorted by name; an error names what cannot be evaluated.
pub fn matching_devices<'a>(
    network: &Network,
    inputs: &Inputs<'a>,
) -> Result<Vec<&'a Device>, String> {
    let request = network
        .spec
        .device_request()
        .map_err(|e| format!("spec.devices: {e}"))?;
    let class = inputs
        .classes
        .get(&request.device_class_name)
        .ok_or_else(|| {
            format!(
                "spec.devices: DeviceClass {:?} does not exist",
                request.device_class_name
            )
        })?;
    let selectors: Vec<Selector> = class
        .iter()
        .chain(&request.selectors)
        .map(|source| {
            Selector::compile(source)
                .map_err(|e| format!("spec.devices: selector {source:?} cannot be evaluated: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut out: Vec<&Device> = inputs
        .devices
        .iter()
        .filter(|device| {
            let view = cel::Device::from_slice(knic_proto::DRIVER_NAME, device);
            // A selector that fails on a device (a missing attribute read without `.?`) does
            // not match it, as in the scheduler.
            selectors.iter().all(|s| s.matches(&view) == Ok(true))
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The names of the devices with a shared port's attribute among `names`.
pub fn shareable_names(devices: &[Device]) -> BTreeSet<String> {
    devices
        .iter()
        .filter(|d| is_shareable(d))
        .map(|d| d.name.clone())
        .collect()
}

#[cfg(test)]
#[path = "ready_tests.rs"]
mod tests;
