//! What a Network should produce — templates, conditions, address counts — decided without
//! I/O, so every rule is unit-tested and both the reconciler and the availability loop read
//! the same decisions.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClaim, DeviceClaimConfiguration, DeviceRequest as DraRequest,
    DeviceSelector, ExactDeviceRequest, OpaqueDeviceConfiguration, ResourceClaimSpec,
    ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::Result;
use crate::network::{
    AddressCount, CONDITION_READY, NETWORK_LABEL, Network, NetworkSpec, NetworkStatus, TemplateRef,
    template_config, validate_against, validate_network,
};
use knic_proto::netconfig::Cidr;
use knic_proto::network::{CONDITION_EXHAUSTED, exhaustion_selector};

/// The finalizer that keeps a deleted Network until its templates are gone: templates live in
/// other namespaces, and without it a Network deleted while the controller is down would leave
/// templates that still hand out its devices.
pub const FINALIZER: &str = "knic.dev/network-cleanup";

/// The name of the one request in every generated template, which the opaque config names in
/// `requests` so it applies to exactly the network's devices.
pub const REQUEST_NAME: &str = "network";

/// Reasons on the conditions and Events, stable strings for alerting and `kubectl wait`.
pub mod reason {
    /// Ready: every selected namespace has its template.
    pub const GENERATED: &str = "Generated";
    /// Invalid (and Ready=False): the Network breaks a rule alone or against older Networks.
    pub const INVALID: &str = "Invalid";
    /// Invalid=False: validation passed.
    pub const VALID: &str = "Valid";
    /// Ready=False: a ResourceClaimTemplate of the same name that knic did not generate exists
    /// in a selected namespace; it is left alone rather than overwritten.
    pub const TEMPLATE_CONFLICT: &str = "TemplateConflict";
    /// Event: the Network was deleted and its templates removed.
    pub const CLEANED_UP: &str = "CleanedUp";
    /// Exhausted=True (and a Warning Event): no allocatable address is left.
    pub const EXHAUSTED: &str = "NoFreeAddress";
    /// Exhausted=False (and a Normal Event when it was True): addresses are free again.
    pub const ADDRESSES_FREE: &str = "AddressesFree";
}

/// What a Network should produce, decided without I/O so every rule is unit-testable.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Nothing is generated; the message lists every problem with its path.
    Invalid(String),
    /// The template spec to apply in each selected namespace.
    Generate(Box<ResourceClaimTemplateSpec>),
}

/// Decides what `network` produces given every Network in the cluster (itself included, and
/// Networks being deleted, which are skipped): its own validation plus
/// [`validate_against`] the Networks created before it.
pub fn plan(network: &Network, all: &[Network]) -> Plan {
    let name = network.name_any();
    let spec = &network.spec;
    let mut errors = match validate_network(&name, spec) {
        Ok(()) => Vec::new(),
        Err(e) => e.0,
    };
    let mine = age(network);
    let older: Vec<(String, NetworkSpec)> = all
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none() && age(n) < mine)
        .map(|n| (n.name_any(), n.spec.clone()))
        .collect();
    errors.extend(validate_against(&name, spec, &older));
    if !errors.is_empty() {
        return Plan::Invalid(knic_proto::netconfig::ConfigErrors(errors).to_string());
    }
    match template_spec(&name, spec) {
        Ok(t) => Plan::Generate(Box::new(t)),
        Err(e) => Plan::Invalid(e.to_string()),
    }
}

/// Creation order: timestamp (second resolution), then name for a stable tie-break.
fn age(n: &Network) -> (Option<Timestamp>, String) {
    (
        n.metadata.creation_timestamp.as_ref().map(|t| t.0),
        n.name_any(),
    )
}

/// The spec of the generated ResourceClaimTemplate: one request of `interfacesPerPod` devices
/// with the network's class and selectors, and the network's `NetworkConfig` as opaque
/// `knic.dev` parameters for that request.
pub fn template_spec(name: &str, spec: &NetworkSpec) -> Result<ResourceClaimTemplateSpec> {
    let mut request = spec
        .device_request()
        .map_err(|e| knic_proto::Error::Invalid(e.to_string()))?;
    if !spec.ipam.subnets.is_empty() {
        // Keeps new claims off every device while the network has no free address, without
        // touching allocated claims (see `knic_proto::network::EXHAUSTED_ATTRIBUTE`).
        request.selectors.push(exhaustion_selector(name));
    }
    let selectors = (!request.selectors.is_empty()).then(|| {
        request
            .selectors
            .iter()
            .map(|expression| DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: expression.clone(),
                }),
            })
            .collect()
    });
    let parameters = serde_json::to_value(template_config(name, spec))?;
    Ok(ResourceClaimTemplateSpec {
        // Kubernetes copies the template's metadata into every claim it creates: the label
        // tells the driver which Network a pod's claim belongs to (live updates of routes and
        // MTU find the pods by it), independent of what the opaque config says.
        metadata: Some(ObjectMeta {
            labels: Some(BTreeMap::from([(
                NETWORK_LABEL.to_owned(),
                name.to_owned(),
            )])),
            ..ObjectMeta::default()
        }),
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DraRequest {
                    name: REQUEST_NAME.to_owned(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: request.device_class_name,
                        selectors,
                        allocation_mode: Some("ExactCount".to_owned()),
                        count: Some(i64::from(request.count)),
                        ..ExactDeviceRequest::default()
                    }),
                    first_available: None,
                }]),
                config: Some(vec![DeviceClaimConfiguration {
                    requests: Some(vec![REQUEST_NAME.to_owned()]),
                    opaque: Some(OpaqueDeviceConfiguration {
                        driver: knic_proto::DRIVER_NAME.to_owned(),
                        parameters: RawExtension(parameters),
                    }),
                }]),
                constraints: None,
            }),
        },
    })
}

/// The full template object for `namespace`: labelled with the network (deselection and
/// deletion find templates by label) and owned by it (the garbage collector of a real cluster
/// is the second line of defence should the finalizer ever be removed by hand).
pub fn template(
    network: &Network,
    namespace: &str,
    spec: ResourceClaimTemplateSpec,
) -> ResourceClaimTemplate {
    let name = network.name_any();
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(NETWORK_LABEL.to_owned(), name)])),
            owner_references: network.controller_owner_ref(&()).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec,
    }
}

/// Free and total allocatable addresses: pool sizes minus the live allocations that fall into
/// one of the pools (a stray object for an address outside every subnet frees nothing).
/// `None` for `static` IPAM, where knic allocates nothing.
pub fn address_count(spec: &NetworkSpec, allocated: &[&str]) -> Option<AddressCount> {
    address_count_held(spec, allocated, &[])
}

/// [`address_count`] with `held`, the subset of `allocated` held for stable identities whose
/// pods are gone: used (not free), and counted apart so `status.addresses.held` says how many.
pub fn address_count_held(
    spec: &NetworkSpec,
    allocated: &[&str],
    held: &[&str],
) -> Option<AddressCount> {
    if spec.ipam.subnets.is_empty() {
        return None;
    }
    let pools: Vec<_> = spec
        .ipam
        .subnets
        .iter()
        .filter_map(|s| s.pool().ok())
        .collect();
    let total = pools
        .iter()
        .fold(0u128, |sum, p| sum.saturating_add(p.size()));
    let count = |addresses: &[&str]| {
        addresses
            .iter()
            .filter_map(|a| a.split('/').next()?.parse::<IpAddr>().ok())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|ip| pools.iter().any(|p| p.contains_usable(*ip)))
            .count() as u128
    };
    Some(AddressCount {
        free: total.saturating_sub(count(allocated)),
        total,
        held: count(held),
    })
}

/// A condition that keeps its previous `lastTransitionTime` when its status did not change, so
/// the time says when the Network became (in)valid, not when it was last reconciled.
pub fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    previous: &[Condition],
) -> Condition {
    let status = if status { "True" } else { "False" };
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(Timestamp::now()));
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time,
    }
}

/// The `Exhausted` condition: `True` as soon as one address family the Network allocates from
/// has fewer free addresses than one pod needs (one per interface), because every interface needs one address per family (a dual-stack
/// network whose IPv4 subnets are full cannot serve a new pod, however much IPv6 is left). The
/// message names the full family and its subnets, and says what happens to pods meanwhile.
/// `None` for `static` IPAM, which knic never allocates from.
pub fn exhausted_condition(
    spec: &NetworkSpec,
    allocated: &[&str],
    generation: Option<i64>,
    previous: &NetworkStatus,
) -> Option<Condition> {
    let overall = address_count(spec, allocated)?;
    // A pod takes one address per interface, and a pod that cannot get all of them fails.
    let need = spec.interfaces_per_pod().max(1);
    let mut full = Vec::new();
    for (family, v4) in [("IPv4", true), ("IPv6", false)] {
        let mut one = spec.clone();
        one.ipam
            .subnets
            .retain(|s| s.cidr.parse::<Cidr>().is_ok_and(|c| c.addr.is_ipv4() == v4));
        let Some(count) = address_count(&one, allocated) else {
            continue;
        };
        let subnets: Vec<&str> = one.ipam.subnets.iter().map(|s| s.cidr.as_str()).collect();
        if count.free == 0 {
            full.push(format!(
                "all {} allocatable {family} addresses of {} are in use",
                count.total,
                subnets.join(", ")
            ));
        } else if count.free < u128::from(need) {
            full.push(format!(
                "only {} of {} allocatable {family} addresses of {} are free and each pod needs {need}",
                count.free,
                count.total,
                subnets.join(", ")
            ));
        }
    }
    let (exhausted, why, message) = if full.is_empty() {
        (
            false,
            reason::ADDRESSES_FREE,
            format!("{} of {} addresses free", overall.free, overall.total),
        )
    } else {
        (
            true,
            reason::EXHAUSTED,
            format!(
                "{}; new pods of this network stay Pending (unschedulable) until an address is \
                 released or a subnet is added, running pods keep theirs",
                full.join("; ")
            ),
        )
    };
    Some(condition(
        CONDITION_EXHAUSTED,
        exhausted,
        why,
        &message,
        generation,
        &previous.conditions,
    ))
}

/// Whether the status says Ready=True (Events are published on the transitions).
pub fn is_ready(status: &NetworkStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_READY && c.status == "True")
}

/// The Ready condition's message: which template (and NetworkAttachmentDefinition, when the
/// Network asks for them) went to which namespaces.
pub fn generated_message(templates: &[TemplateRef], nads: &[TemplateRef]) -> String {
    if templates.is_empty() {
        return "no namespace is selected; no ResourceClaimTemplate generated".to_owned();
    }
    let applied = |kind: &str, refs: &[TemplateRef]| {
        let namespaces: Vec<&str> = refs.iter().map(|t| t.namespace.as_str()).collect();
        format!(
            "{kind} {:?} applied in {}",
            refs.first().map(|t| t.name.as_str()).unwrap_or_default(),
            namespaces.join(", ")
        )
    };
    let mut message = applied("ResourceClaimTemplate", templates);
    if !nads.is_empty() {
        message = format!(
            "{message}; {}",
            applied("NetworkAttachmentDefinition", nads)
        );
    }
    message
}

/// Equal up to condition timestamps, which [`condition`] already carries over, so a status
/// that did not change is not written (and does not wake watchers).
pub fn same_status(a: &NetworkStatus, b: &NetworkStatus) -> bool {
    a == b
}

/// Whether a live template's spec is the one knic wants, as the apiserver stores it: it keeps
/// the claim template's `spec.metadata` as an empty object (`metadata: {}`) where knic sends
/// none. Compared plainly, every reconcile on a real cluster found the template changed and
/// deleted and re-created it (pods created in that gap waited for their claim); the fake API
/// had echoed knic's own form back.
pub fn same_template_spec(
    live: &ResourceClaimTemplateSpec,
    desired: &ResourceClaimTemplateSpec,
) -> bool {
    let empty = ObjectMeta::default();
    live.spec == desired.spec
        && live.metadata.as_ref().unwrap_or(&empty) == desired.metadata.as_ref().unwrap_or(&empty)
}

/// Whether a template of that name is one knic generated for `network` (its label says so).
pub fn is_ours(template: &ResourceClaimTemplate, network: &str) -> bool {
    template.labels().get(NETWORK_LABEL).map(String::as_str) == Some(network)
}

#[cfg(test)]
mod tests;
