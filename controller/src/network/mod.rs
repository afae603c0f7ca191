//! The `Network` resource (`knic.dev/v1alpha1`, kind `Network`): a network as a service.
//!
//! An admin defines a Network once, with the administrative knowledge — which devices, which
//! VLAN, which subnets — and application developers ask for it by name through the
//! ResourceClaimTemplate the controller generates in each selected namespace.
//!
//! **Scope: cluster.** A Network describes shared infrastructure (NICs, VLANs, subnets) that
//! belongs to the platform, not to a tenant, and the rules that keep networks apart (no two
//! networks on the same devices with the same VLAN, no overlapping subnets on one segment) are
//! cluster-wide facts. A namespaced Network would let any namespace with create rights claim a
//! VLAN or a subnet, and would scatter the objects that must be checked against each other
//! across namespaces. Cluster scope keeps creation an admin privilege while `spec.namespaces`
//! decides which namespaces may use it, which is what "usable from chosen namespaces" needs.
//!
//! This module holds the spec types (serde, camelCase, unknown fields denied: a misspelt field
//! must fail, never do nothing), their validation ([`validate_network`], [`validate_against`])
//! and the pure translations the reconciler needs ([`NetworkSpec::device_request`],
//! [`template_config`], [`Namespaces::selects`], [`StableAddresses::identity`]). Addresses,
//! gateways and exclusions stay strings here, like in the driver's `NetworkConfig`, so
//! validation can report every malformed value with its path instead of failing on the first.

mod devices;
mod validate;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use knic_proto::netconfig::{
    self, Cidr, InterfaceConfig, IpamConfig, NetworkConfig, RouteConfig, VlanConfig,
};
use serde::{Deserialize, Serialize};

use crate::ipam::{Exclusion, Pool};
use crate::{Error, Result};

pub use devices::lint_cel;
pub use validate::{validate_against, validate_network};

/// The kind of the resource, next to [`netconfig::API_VERSION`] which it shares with the
/// driver's config: one API group, one version.
pub const KIND: &str = "Network";

/// The DeviceClass a friendly device description compiles against: the class that selects
/// every knic device, so the generated CEL expression alone decides, and is complete enough
/// to read in the template.
pub const FRIENDLY_DEVICE_CLASS: &str = knic_proto::DRIVER_NAME;

/// At most this many devices per ResourceClaim (`AllocationResultsMaxSize`), which bounds how
/// many interfaces one pod can ask for through one claim.
pub const MAX_INTERFACES_PER_POD: u32 = 32;

/// The desired state of a Network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkSpec {
    /// Which devices carry this network.
    pub devices: Devices,
    /// 802.1Q VLAN id (1–4094) the driver puts on top of each device; unset is untagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// Link MTU inside the pod; unset keeps the device's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Interface name inside the pod; unset lets the driver assign `net1`, `net2`, ….
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// How many interfaces (devices) of this network each pod gets; unset means 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interfaces_per_pod: Option<u32>,
    /// How pods get addresses.
    pub ipam: Ipam,
    /// Whether a pod keeps its address across restarts and rescheduling, and by what identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_addresses: Option<StableAddresses>,
    /// Which namespaces get a ResourceClaimTemplate for this network.
    pub namespaces: Namespaces,
}

/// Which devices carry the network: either a DeviceClass plus CEL selectors, for admins who
/// already have classes or need the full power of CEL, or the friendly fields, which cover the
/// common choices, compile to CEL ([`NetworkSpec::device_request`]) and can be checked for
/// overlap with other networks precisely (CEL cannot be, see [`validate_against`]).
///
/// The two forms are exclusive; an empty `devices` is refused rather than meaning "every knic
/// device" (write `deviceClassName: knic.dev` for that).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Devices {
    /// A DeviceClass name (e.g. `vf.knic.dev`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_class_name: Option<String>,
    /// CEL expressions that must all be true, as in a DRA request's `selectors[].cel`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<String>,
    /// Friendly form: whole ports (`nic`, which also matches SR-IOV PFs, like the
    /// `nic.knic.dev` class) or SR-IOV virtual functions (`vf`); unset matches either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<DeviceKind>,
    /// Friendly form: the PCI vendor, as its id (`8086` or `0x8086`, matched against the
    /// `pciVendor` attribute) or its name exactly as `pci.ids` spells it (`Intel Corporation`,
    /// matched against `vendorName`). Four hex digits always mean an id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Friendly form: only VFs of the PF with this interface name on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pf_name: Option<String>,
    /// Friendly form: minimum link speed in Mb/s (the `speed` attribute); devices whose speed
    /// is unknown (no link) do not match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_speed: Option<u32>,
    /// Friendly form: only devices attached to this NUMA node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// Friendly form: `true` for devices with an RDMA function, `false` for devices without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<bool>,
}

/// The friendly device kinds; PFs count as `nic` because a PF used as a whole port is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// A whole port: a physical NIC or an SR-IOV PF.
    Nic,
    /// An SR-IOV virtual function.
    Vf,
}

/// What the generated ResourceClaimTemplate's request asks for (`exactly`: class, selectors,
/// count), computed once so the reconciler and the overlap check agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRequest {
    /// The DeviceClass of the request.
    pub device_class_name: String,
    /// CEL selectors, in order.
    pub selectors: Vec<String>,
    /// Devices per claim, i.e. interfaces per pod.
    pub count: u32,
}

/// How pods of this network get addresses: allocated by knic from `subnets`, or `static`
/// (each claim carries its own addresses in its config). Exactly one is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ipam {
    /// Subnets to allocate from; a pod gets one address per family, from the first subnet of
    /// that family with a free address (later subnets of a family extend the first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnets: Vec<Subnet>,
    /// No allocation: addresses come from each claim.
    #[serde(default, rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_addresses: Option<StaticIpam>,
}

/// `static: {}`; an object rather than a boolean so options can be added without a new field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticIpam {}

/// One subnet to allocate from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Subnet {
    /// The subnet in network form (`192.0.2.0/24`, `2001:db8::/64`).
    pub cidr: String,
    /// The router on the subnet; never allocated, and the next hop pods use for `routes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Addresses never allocated: single addresses, ranges `FIRST-LAST`, or CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Routes installed with an address of this subnet, in the driver's route syntax (without
    /// `source`, since each pod's address differs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteConfig>,
}

impl Subnet {
    /// The allocation pool of this subnet; the error is the first problem
    /// [`validate_network`] would report (validate first to get all of them with paths).
    pub fn pool(&self) -> Result<Pool> {
        let cidr: Cidr = self
            .cidr
            .parse()
            .map_err(|e| Error::Invalid(format!("{e}")))?;
        let gateway = self
            .gateway
            .as_deref()
            .map(validate::parse_ip)
            .transpose()
            .map_err(Error::Invalid)?;
        let exclude = self
            .exclude
            .iter()
            .map(|e| e.parse::<Exclusion>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Error::Invalid)?;
        Pool::new(cidr, gateway, &exclude)
    }
}

/// Stable addresses: a pod whose allocation was released (pod deleted and recreated, or
/// rescheduled) gets the same address again when it is still free, because its allocation
/// starts from [`crate::ipam::stable_offset`] of its identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StableAddresses {
    /// What identifies a pod across restarts.
    pub by: StableBy,
    /// The label key whose value is the identity; required with `by: label`, refused otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// The identity a stable address follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StableBy {
    /// The pod's name: right for StatefulSets, whose pods keep their names.
    PodName,
    /// The value of a chosen label, for controllers that do not keep names.
    Label,
}

impl StableAddresses {
    /// The identity string for a pod's `interface`-th interface, or `None` when the pod has no
    /// identity (the label is missing) and gets an ordinary allocation.
    ///
    /// The namespace is part of the identity because a Network is cluster-scoped: `db-0` in two
    /// namespaces are different pods and must not compete for one address. Interfaces after the
    /// first get `#N` appended, so each interface of a pod has its own stable address.
    pub fn identity(
        &self,
        namespace: &str,
        pod_name: &str,
        pod_labels: &BTreeMap<String, String>,
        interface: u32,
    ) -> Option<String> {
        let key = match self.by {
            StableBy::PodName => pod_name,
            StableBy::Label => pod_labels.get(self.label.as_deref()?)?.as_str(),
        };
        Some(if interface == 0 {
            format!("{namespace}/{key}")
        } else {
            format!("{namespace}/{key}#{interface}")
        })
    }
}

/// Which namespaces get the network's ResourceClaimTemplate: a fixed list, or a label selector
/// so new namespaces of a team get it without editing the Network. Exactly one is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Namespaces {
    /// Namespace names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Namespaces whose labels match; `matchLabels: {}` selects every namespace, as in
    /// Kubernetes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<NamespaceSelector>,
}

/// A label selector with `matchLabels` only: equality is what namespace selection needs, and a
/// smaller language is easier to validate exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceSelector {
    /// Every pair must be present on the namespace.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

impl Namespaces {
    /// Whether namespace `name` with `labels` gets a template, so the reconciler decides
    /// creation and removal with the same rule.
    pub fn selects(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        if let Some(selector) = &self.selector {
            return selector
                .match_labels
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v));
        }
        self.names.iter().any(|n| n == name)
    }
}

impl NetworkSpec {
    /// Interfaces per pod with the default applied.
    pub fn interfaces_per_pod(&self) -> u32 {
        self.interfaces_per_pod.unwrap_or(1)
    }

    /// The device request of the generated claim template: the given class and selectors, or
    /// the friendly fields compiled into one CEL expression against [`FRIENDLY_DEVICE_CLASS`].
    /// Fails with the same errors [`validate_network`] reports for `spec.devices`.
    pub fn device_request(&self) -> std::result::Result<DeviceRequest, netconfig::ConfigErrors> {
        let mut errors = Vec::new();
        match devices::check(&self.devices, &mut errors) {
            Some((device_class_name, selectors)) if errors.is_empty() => Ok(DeviceRequest {
                device_class_name,
                selectors,
                count: self.interfaces_per_pod(),
            }),
            _ => Err(netconfig::ConfigErrors(errors)),
        }
    }
}

/// The opaque `NetworkConfig` the generated claim template carries for the driver: interface
/// name and MTU, VLAN, and `ipam: {network: NAME}` when knic allocates. Validation runs the
/// driver's own [`netconfig::validate`] on exactly this object, so a Network that validates
/// produces a config the driver accepts.
pub fn template_config(name: &str, spec: &NetworkSpec) -> NetworkConfig {
    let interface =
        (spec.interface_name.is_some() || spec.mtu.is_some()).then(|| InterfaceConfig {
            name: spec.interface_name.clone(),
            mtu: spec.mtu,
            hardware_address: None,
        });
    NetworkConfig {
        api_version: Some(netconfig::API_VERSION.to_owned()),
        kind: Some(netconfig::KIND.to_owned()),
        interface,
        ipam: (!spec.ipam.subnets.is_empty()).then(|| IpamConfig {
            network: name.to_owned(),
        }),
        vlan: spec.vlan.map(|id| VlanConfig { id }),
        ..NetworkConfig::default()
    }
}
