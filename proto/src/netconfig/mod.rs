//! The `NetworkConfig` opaque-parameters contract (`apiVersion: knic.dev/v1alpha1`,
//! `kind: NetworkConfig`).
//!
//! Operators put these objects into DeviceClass and ResourceClaim `config` entries. They are
//! opaque to Kubernetes, so nothing checks them before knic does: this module is the only line
//! of defence between a typo in a YAML file and an interface that silently comes up wrong. It is
//! therefore deliberately strict and deliberately chatty:
//!
//! * [`parse`] turns one parameters object into the layered wire form, rejecting unknown fields
//!   and wrong JSON types with their path (a misspelt `mtuu` must fail, never do nothing);
//! * [`merge`] layers class entries under claim entries;
//! * [`validate`] checks every semantic rule on the merged result and returns the typed
//!   [`ValidConfig`] the driver acts on.
//!
//! Every stage reports *all* problems it finds, so an operator fixes a config in one round trip
//! instead of one error per `kubectl apply`.
//!
//! This crate is Kubernetes-free on purpose: the controller, the driver and the tests agree on
//! one contract without pulling `k8s-openapi` into every consumer.

mod addr;
mod addressing;
mod bandwidth;
mod child;
mod cidr;
mod ethtool;
mod mode;
mod neighbor;
mod parse;
mod routing;
mod sizes;
mod validate;
mod vf;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

pub use addr::{
    SpecialClass, check_address_range, check_interface_address, check_next_hop, check_not_reserved,
    check_route_destination, reserved_ends, reserved_role, special_class,
};
pub use addressing::{
    ADDRESSING_MODES, Addressing, AddressingConfig, DEFAULT_DHCP_TIMEOUT, MAX_ADDRESSING_TIMEOUT,
};
pub use bandwidth::{
    Bandwidth, BandwidthConfig, BandwidthSettings, MAX_BURST, MIN_EGRESS, parse_egress,
};
pub use child::{ChildKind, IPVLAN_MODES, IpvlanConfig, MACVLAN_MODES, MacvlanConfig};
pub(crate) use cidr::parse_ip_expecting;
pub use cidr::{Cidr, CidrError, parse_ip};
pub use ethtool::{
    ALIASES as ETHTOOL_ALIASES, Channels, Coalesce, EthtoolConfig, EthtoolSettings,
    GROUPS as ETHTOOL_GROUPS, KERNEL_FEATURES, Rings, group_members,
};
pub use mode::DeviceMode;
pub use neighbor::{MAX_NEIGHBORS, Neighbor, NeighborConfig};
pub use parse::parse;
pub use routing::{
    DEFAULT_RULE_PRIORITY, DEFAULT_SBR_TABLE, Family, RoutingSettings, Rule, RuleConfig,
    SourceRouting, SourceRoutingConfig, Vrf, VrfConfig,
};
pub use sizes::{MAX_OFFLOAD_SIZE, MIN_OFFLOAD_SIZE, OffloadSizes};
pub use validate::{check_interface_name, is_dns_label, sysctl_path, validate};
pub use vf::{VfConfig, VfLinkState, VfSettings, VfVlanProtocol};

/// The only `apiVersion` knic accepts: a config written for another version may mean something
/// else, so it is refused rather than guessed at.
pub const API_VERSION: &str = "knic.dev/v1alpha1";

/// The only `kind` knic accepts, so a parameters object meant for another driver or another
/// knic object is never misread as network configuration.
pub const KIND: &str = "NetworkConfig";

/// One validation problem, located precisely enough (`config[1].parameters.routes[0].gateway`)
/// that an operator can find it in a long claim without guessing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Where the problem is, in the wire (camelCase) spelling, with list indices and quoted map
    /// keys; empty only when the whole object is wrong and no prefix was given.
    pub path: String,
    /// Which rule was broken and, where useful, what would be accepted instead.
    pub message: String,
}

impl FieldError {
    /// Builds an error; a constructor keeps call sites short enough to list every rule inline.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// All problems of one config, so an operator fixes them in one round instead of discovering
/// them one `kubectl apply` at a time. Never empty when returned as an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<FieldError>);

/// At most this many problems are shown; a config with thousands of bad entries must not turn
/// into an error text larger than what the kubelet, an Event or a status condition can carry.
pub const MAX_SHOWN_PROBLEMS: usize = 20;

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().take(MAX_SHOWN_PROBLEMS).enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
        }
        if self.0.len() > MAX_SHOWN_PROBLEMS {
            write!(
                f,
                "; … and {} more problems",
                self.0.len() - MAX_SHOWN_PROBLEMS
            )?;
        }
        Ok(())
    }
}

/// The wire form of one `NetworkConfig` parameters object.
///
/// Every field is optional because configs are layered ([`merge`]): a DeviceClass may set only
/// the MTU and leave addressing to each claim. Unknown fields are denied both here (for anyone
/// deserializing directly) and in [`parse`] (which also reports their paths, all at once).
/// `null` means "not set", exactly like an absent field, so it cannot clear a lower layer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkConfig {
    /// Must be [`API_VERSION`]; [`parse`] requires it so every object states what it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Must be [`KIND`]; required by [`parse`] for the same reason as `api_version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Link-level settings of the interface as it appears inside the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<InterfaceConfig>,
    /// Static addresses in interface CIDR form (`192.0.2.10/24`, host bits allowed, as in
    /// Kubernetes `networkData.ips`), so the prefix length also gives the on-link subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<String>>,
    /// Dynamic addressing from a named knic IPAM network; the alternative to `addresses`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<IpamConfig>,
    /// Routes installed in the pod's network namespace through this interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<Vec<RouteConfig>>,
    /// Tags the pod's traffic with an 802.1Q VLAN on top of the allocated device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<VlanConfig>,
    /// A macvlan child of the device goes into the pod (many pods share one port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macvlan: Option<MacvlanConfig>,
    /// An ipvlan child of the device goes into the pod (one MAC for all pods on the port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipvlan: Option<IpvlanConfig>,
    /// Per-interface sysctls, keyed by the short form `ipv4.<name>` / `ipv6.<name>` (the
    /// allowlist is documented on [`validate`]) because the interface's final name is only known
    /// once the driver assigns it. Values are strings, as in a pod's `securityContext.sysctls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sysctls: Option<BTreeMap<String, String>>,
    /// SR-IOV VF settings applied through the PF before the VF moves into the pod (MAC, VLAN,
    /// trust, rates…); only valid when the allocated device is a VF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vf: Option<VfConfig>,
    /// `netdev` (default) or `vfio-pci`; see [`DeviceMode`]. A string here so [`validate`]
    /// reports a wrong value with the accepted ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_mode: Option<String>,
    /// Egress rate cap of the pod's interface (`{egress: "2G", burst: "256Ki"}`): rates in
    /// bit/s, the burst in bytes, as Kubernetes quantities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<BandwidthConfig>,
    /// Policy routing rules (`ip rule`) installed in the pod's namespace; see [`RuleConfig`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<RuleConfig>>,
    /// A table for this interface and a `from <address>` rule per address (CNI `sbr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_based_routing: Option<SourceRoutingConfig>,
    /// A VRF device in the pod that this interface is enslaved to (CNI `vrf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrf: Option<VrfConfig>,
    /// Offloads, rings, channels and coalescing of the pod's interface (`ethtool -K/-G/-L/-C`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethtool: Option<EthtoolConfig>,
    /// Static ARP/NDP entries on the pod's interface (`[{address, hardwareAddress}]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbors: Option<Vec<NeighborConfig>>,
    /// How the interface gets addresses: `static` (default), `dhcp`, `slaac`, `unnumbered`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addressing: Option<AddressingConfig>,
}

/// Link-level settings; merged field by field so a class can fix the MTU while a claim names
/// the interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InterfaceConfig {
    /// The name inside the pod; when unset the driver assigns `net1`, `net2`, … so only pods
    /// that care about names have to pick them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Link MTU in bytes; unset keeps whatever the device has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Unicast MAC as `aa:bb:cc:dd:ee:ff`, for workloads whose licences or DHCP leases are tied
    /// to a fixed address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_address: Option<String>,
    /// `IFLA_GSO_MAX_SIZE` in bytes (Big TCP above 65536); unset keeps the device's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gso_max_size: Option<u32>,
    /// `IFLA_GRO_MAX_SIZE` in bytes; unset keeps the device's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gro_max_size: Option<u32>,
    /// `IFLA_GSO_IPV4_MAX_SIZE` in bytes (Linux 6.3+); unset keeps the device's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gso_ipv4_max_size: Option<u32>,
    /// `IFLA_GRO_IPV4_MAX_SIZE` in bytes (Linux 6.3+); unset keeps the device's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gro_ipv4_max_size: Option<u32>,
}

/// Asks the controller's IPAM for an address instead of fixing one in the claim, so many pods
/// can share one claim template without address clashes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpamConfig {
    /// The IPAM network's name; a DNS label because it names a Kubernetes-style object.
    pub network: String,
}

/// One route as written by the operator; strings stay strings here so [`validate`] can report
/// every malformed value with its path instead of failing on the first.
// `JsonSchema` because routes are part of the `Network` CRD (`spec.ipam.subnets[].routes`),
// which is generated from the Rust types.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteConfig {
    /// Destination in network CIDR form (host bits zero); `0.0.0.0/0` / `::/0` for a default.
    pub destination: String,
    /// Next hop; unset makes the route on-link (directly reachable through this interface).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Preferred source address, for pods that must answer from one specific static address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Route priority; lower wins. Unset uses the kernel default (0 for IPv4, 1024 for IPv6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
    /// Routing table id for policy routing; unset means the main table (254).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
}

/// An 802.1Q VLAN on top of the allocated device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VlanConfig {
    /// VLAN id, `1..=4094` (0 means "priority tag only" and 4095 is reserved by 802.1Q).
    pub id: u16,
}

/// The checked, typed configuration the driver acts on and stores in its checkpoint, so a
/// restarted driver never has to re-validate (or re-interpret) operator input.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidConfig {
    /// Requested name inside the pod; `None` lets the driver assign `netN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// Requested MTU; `None` leaves the device's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Requested MAC; stored as `aa:bb:cc:dd:ee:ff` in the checkpoint so it stays readable.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "validate::mac_serde"
    )]
    pub hardware_address: Option<[u8; 6]>,
    /// Static addresses in the order given (the first of a family is the primary one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<Cidr>,
    /// IPAM network to allocate from; never set together with `addresses`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam_network: Option<String>,
    /// Routes in the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// VLAN id in `1..=4094`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// A macvlan or ipvlan child instead of the device itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<ChildKind>,
    /// Short sysctl key (`ipv4.rp_filter`) → canonical decimal value (`"01"` becomes `"1"`);
    /// [`sysctl_path`] turns a key into the real `/proc/sys` file once the name is known.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctls: BTreeMap<String, String>,
    /// VF settings; `None` when none were asked for (an empty `vf: {}` included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vf: Option<VfSettings>,
    /// How the device reaches the pod; omitted when `netdev`, so older checkpoints still load.
    #[serde(default, skip_serializing_if = "DeviceMode::is_netdev")]
    pub device_mode: DeviceMode,
    /// Egress limit; `None` when the config asks for none (the allocation's consumed
    /// `bandwidth` capacity may still set one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<BandwidthSettings>,
    /// Rules, source-based routing and VRF; empty when none are asked for.
    #[serde(default, skip_serializing_if = "RoutingSettings::is_empty")]
    pub routing: RoutingSettings,
    /// ethtool settings; `None` when none were asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethtool: Option<EthtoolSettings>,
    /// GSO/GRO maximum sizes of the pod's interface; empty leaves the device's own.
    #[serde(default, skip_serializing_if = "OffloadSizes::is_empty")]
    pub offload_sizes: OffloadSizes,
    /// Static neighbors, in the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub neighbors: Vec<Neighbor>,
    /// How the interface gets addresses; omitted when `static`, so older checkpoints load.
    #[serde(default, skip_serializing_if = "Addressing::is_static")]
    pub addressing: Addressing,
}

/// One checked route; every address is the same family as `destination`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// Network form (host bits zero).
    pub destination: Cidr,
    /// Next hop; `None` for an on-link route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Preferred source; always one of the config's static addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<IpAddr>,
    /// Priority as given; `None` means the kernel default for the family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
    /// Table as given; `None` means main (254).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
}

/// Layers configs in order (class entries first, then claim entries) so that the claim, the
/// more specific object, overrides the class's defaults.
///
/// Rules, chosen so a later layer can always express what it wants:
/// * a scalar set in a later layer wins (`null` and absent both mean "not set", so a layer can
///   never unset a lower layer's value: leave fields you want claims to choose out of classes);
/// * `interface` merges field by field (`name`, `mtu`, `hardwareAddress`, the GSO/GRO sizes);
/// * `addresses` and `ipam` are **one** choice, "how does this interface get addresses": a
///   layer that sets either replaces both, so a claim with static `addresses` overrides a
///   class's `ipam` (and `addresses: []` turns a class's IPAM off) instead of producing a
///   "both set" error the claim author could not fix;
/// * lists (`addresses`, `routes`, `neighbors`) replace as a whole, because appending would make a route
///   list impossible to shrink and its order matters;
/// * `sysctls` merge key by key, later value wins;
/// * `vf`, `bandwidth` and `addressing` merge field by field, like `interface`;
/// * `ethtool` merges `features` key by key and `rings`/`channels`/`coalesce` field by field.
///
/// The result is not validated; run [`validate`] on it.
pub fn merge(layers: &[NetworkConfig]) -> NetworkConfig {
    let mut merged = NetworkConfig::default();
    for layer in layers {
        if layer.api_version.is_some() {
            merged.api_version.clone_from(&layer.api_version);
        }
        if layer.kind.is_some() {
            merged.kind.clone_from(&layer.kind);
        }
        if let Some(interface) = &layer.interface {
            let target = merged
                .interface
                .get_or_insert_with(InterfaceConfig::default);
            if interface.name.is_some() {
                target.name.clone_from(&interface.name);
            }
            if interface.mtu.is_some() {
                target.mtu = interface.mtu;
            }
            if interface.hardware_address.is_some() {
                target
                    .hardware_address
                    .clone_from(&interface.hardware_address);
            }
            for (field, value) in [
                (&mut target.gso_max_size, interface.gso_max_size),
                (&mut target.gro_max_size, interface.gro_max_size),
                (&mut target.gso_ipv4_max_size, interface.gso_ipv4_max_size),
                (&mut target.gro_ipv4_max_size, interface.gro_ipv4_max_size),
            ] {
                if value.is_some() {
                    *field = value;
                }
            }
        }
        if layer.addresses.is_some() || layer.ipam.is_some() {
            merged.addresses.clone_from(&layer.addresses);
            merged.ipam.clone_from(&layer.ipam);
        }
        if layer.routes.is_some() {
            merged.routes.clone_from(&layer.routes);
        }
        if layer.neighbors.is_some() {
            merged.neighbors.clone_from(&layer.neighbors);
        }
        if layer.vlan.is_some() {
            merged.vlan.clone_from(&layer.vlan);
        }
        if layer.macvlan.is_some() {
            merged.macvlan.clone_from(&layer.macvlan);
        }
        if layer.ipvlan.is_some() {
            merged.ipvlan.clone_from(&layer.ipvlan);
        }
        if let Some(vf) = &layer.vf {
            merged
                .vf
                .get_or_insert_with(VfConfig::default)
                .merge_from(vf);
        }
        if let Some(bandwidth) = &layer.bandwidth {
            merged
                .bandwidth
                .get_or_insert_with(BandwidthConfig::default)
                .merge_from(bandwidth);
        }
        // Policy routing replaces as a whole, like routes: rules are ordered, and a half-merged
        // VRF or source-routing block would mix two layers' tables.
        if layer.rules.is_some() {
            merged.rules.clone_from(&layer.rules);
        }
        if layer.source_based_routing.is_some() {
            merged
                .source_based_routing
                .clone_from(&layer.source_based_routing);
        }
        if layer.vrf.is_some() {
            merged.vrf.clone_from(&layer.vrf);
        }
        if let Some(ethtool) = &layer.ethtool {
            merged
                .ethtool
                .get_or_insert_with(EthtoolConfig::default)
                .merge_from(ethtool);
        }
        if let Some(addressing) = &layer.addressing {
            merged
                .addressing
                .get_or_insert_with(AddressingConfig::default)
                .merge_from(addressing);
        }
        if layer.device_mode.is_some() {
            merged.device_mode.clone_from(&layer.device_mode);
        }
        if let Some(sysctls) = &layer.sysctls {
            let target = merged.sysctls.get_or_insert_with(BTreeMap::new);
            for (key, value) in sysctls {
                target.insert(key.clone(), value.clone());
            }
        }
    }
    merged
}
