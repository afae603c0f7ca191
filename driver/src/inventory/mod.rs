//! The node inventory: which network devices this node offers to pods, under which names and
//! with which attributes.
//!
//! Discovery is a pure function of its inputs — a sysfs tree under a root, the netlink
//! [`Sources`], the names of the interfaces carrying the node's default routes, and the admin's
//! [`Filter`] — so every rule is tested against captured and derived sysfs trees
//! (`driver/tests/fixtures/sysfs/`) with fake netlink sources. Sysfs is primary; netlink only
//! adds facts. Nothing here fails: an unreadable fact is an absent attribute, and a device that
//! is found but not offered is kept in [`Inventory::excluded`] with the reason, so an operator
//! can see why.
//!
//! What is offered: physical NICs, SR-IOV PFs and VFs (also VFs without a netdev: bound to
//! vfio-pci, or with their netdev moved into a pod), found both through `sys/class/net` and
//! through `sys/bus/pci/devices` (class 0x02). Never offered: the default-route interfaces and
//! their bond/bridge masters and those masters' slaves/ports, loopback, switchdev
//! representors, and whatever the filter excludes. Virtual interfaces only when included.

mod discover;
pub(crate) use discover::par_map;
pub mod filter;
pub mod fixture;
pub mod names;
pub mod netlink;
pub mod overlay;
pub mod pciids;
pub mod sources;
pub mod sysfs;
pub mod table;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

pub use filter::Filter;
pub use sources::{
    DevlinkSource, EswitchMode, EthtoolSource, FakeDevlink, FakeEthtool, FakeLinks, LinkInfo,
    LinkSource, Sources, VfInfo,
};
pub use sysfs::Sysfs;

/// Attribute key of the PCIe root complex, standardised by Kubernetes so schedulers can align
/// NICs with GPUs under the same root.
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// Attribute key of the PCI address, standardised by Kubernetes.
pub const ATTR_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// Kubernetes' limit on attributes per device; more would make the ResourceSlice invalid.
pub const MAX_ATTRIBUTES: usize = 32;
/// Kubernetes' limit on a string attribute's length (bytes); longer values are left out.
pub const MAX_STRING_LEN: usize = 64;

/// What a device is, which decides whether it is offered by default and how it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// A physical NIC without SR-IOV (or a PCI network function of another kind, e.g. virtio).
    Nic,
    /// An SR-IOV physical function (`sriov_totalvfs` > 0).
    Pf,
    /// An SR-IOV virtual function (`physfn` link), with or without a netdev.
    Vf,
    /// A software netdev (veth, bridge, macvlan, vxlan, bond, …): no `device` link.
    Virtual,
    /// A switchdev representor (`phys_port_name` `pf0vf1`, `c1pf0vf1`, `pf0sf2`, …): a control
    /// handle of a VF/SF, never offered.
    Representor,
    /// The loopback device, never offered.
    Loopback,
}

impl DeviceKind {
    /// The `kind` attribute value and the filter keyword.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Nic => "nic",
            DeviceKind::Pf => "pf",
            DeviceKind::Vf => "vf",
            DeviceKind::Virtual => "virtual",
            DeviceKind::Representor => "representor",
            DeviceKind::Loopback => "loopback",
        }
    }
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A device attribute value, typed as ResourceSlice attributes are so selectors can compare
/// numbers as numbers. Serialises like a Kubernetes `DeviceAttribute` (`{"int": 1500}`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum AttrValue {
    /// `int`.
    #[serde(rename = "int")]
    Int(i64),
    /// `bool`.
    #[serde(rename = "bool")]
    Bool(bool),
    /// `string` (at most [`MAX_STRING_LEN`] bytes).
    #[serde(rename = "string")]
    Str(String),
}

impl AttrValue {
    /// The string, if this is one; saves tests and table printers a match.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            AttrValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl std::fmt::Display for AttrValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttrValue::Int(v) => write!(f, "{v}"),
            AttrValue::Bool(v) => write!(f, "{v}"),
            AttrValue::Str(v) => f.write_str(v),
        }
    }
}

/// One device of the pool (or one that was found but not offered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetDevice {
    /// The ResourceSlice device name (see [`names`]): a DNS label, unique, stable across
    /// reboots and renames.
    pub name: String,
    /// What the device is.
    pub kind: DeviceKind,
    /// The interface name in the driver's network namespace; `None` for a VF bound to
    /// vfio-pci or whose netdev lives in a pod.
    pub if_name: Option<String>,
    /// The PCI address (`0000:a2:01.0`) of the function, for PCI-backed devices.
    pub pci_address: Option<String>,
    /// Attributes keyed as in the ResourceSlice: bare identifiers (`ifName`, `mtu`, …) live in
    /// the driver's domain; [`ATTR_PCIE_ROOT`] and [`ATTR_PCI_BUS_ID`] are fully qualified.
    pub attributes: BTreeMap<String, AttrValue>,
}

impl NetDevice {
    /// The attribute under `key`.
    pub fn attr(&self, key: &str) -> Option<&AttrValue> {
        self.attributes.get(key)
    }
}

/// A device that was found but is not offered, and why (for `knic inventory`-style tables and
/// for logs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExcludedDevice {
    /// The device as it would have been offered.
    pub device: NetDevice,
    /// Why it is not.
    pub reason: String,
    /// Whether the reason is the node's default route (the interface carries it, or is a
    /// master, slave or lower device of one that does): SR-IOV provisioning must not touch
    /// such a PF either.
    #[serde(skip)]
    pub default_route: bool,
}

/// The result of one discovery.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Inventory {
    /// The devices to publish, sorted by name (so the ResourceSlice is byte-stable).
    pub devices: Vec<NetDevice>,
    /// Devices found but not offered, sorted by name.
    pub excluded: Vec<ExcludedDevice>,
    /// The overlay's underlay when the node offers overlay networks and a link holds its
    /// tunnel endpoint (published as the synthetic device [`overlay::DEVICE_NAME`]).
    #[serde(skip)]
    pub overlay: Option<overlay::Underlay>,
}

impl Inventory {
    /// The offered device named `name`.
    pub fn device(&self, name: &str) -> Option<&NetDevice> {
        self.devices.iter().find(|d| d.name == name)
    }

    /// The excluded device named `name`.
    pub fn excluded(&self, name: &str) -> Option<&ExcludedDevice> {
        self.excluded.iter().find(|d| d.device.name == name)
    }
}

/// Discovers the devices below `root` (production: `/`).
///
/// `default_route_ifaces` are the interfaces carrying the node's IPv4 and IPv6 default routes
/// (the caller reads them from the routing table): taking them away would cut the node off.
pub fn discover(
    root: &Path,
    sources: &Sources,
    default_route_ifaces: &BTreeSet<String>,
    filter: &Filter,
) -> Inventory {
    discover_in(&Sysfs::new(root), sources, default_route_ifaces, filter)
}

/// [`discover`] with an explicit [`Sysfs`] reader, so tests can inject read faults.
pub fn discover_in(
    sysfs: &Sysfs,
    sources: &Sources,
    default_route_ifaces: &BTreeSet<String>,
    filter: &Filter,
) -> Inventory {
    discover::run(sysfs, sources, default_route_ifaces, filter)
}
