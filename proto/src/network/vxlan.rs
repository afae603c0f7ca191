//! Overlay Networks (issue 26): a Network with `spec.vxlan` is one layer-2 segment spanning
//! nodes. Its pods get a veth on their node's bridge of the VNI, and each node learns where
//! other nodes' pods are from the `overlay` facts their NetworkAddress objects carry (the
//! allocations every addressed pod already creates, so announcing a pod costs no extra write).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{MAX_INTERFACES_PER_POD, NetworkSpec};
use crate::netconfig::{Cidr, FieldError};

/// The UDP port IANA assigned to VXLAN.
pub const DEFAULT_VXLAN_PORT: u16 = 4789;

/// Bytes of VXLAN encapsulation over an IPv4 underlay (outer Ethernet 14 + IPv4 20 + UDP 8 +
/// VXLAN 8): a pod's MTU is the underlay's minus this.
pub const VXLAN_OVERHEAD_V4: u32 = 50;
/// The same over an IPv6 underlay (40-byte header).
pub const VXLAN_OVERHEAD_V6: u32 = 70;

/// The label every NetworkAddress of an overlay Network carries, so each node watches only the
/// allocations that announce overlay pods.
pub const OVERLAY_LABEL: &str = "knic.dev/overlay";

/// The VXLAN segment of an overlay Network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Vxlan {
    /// The VXLAN network identifier (1–16777215), unique among Networks: two Networks on one
    /// VNI would be one layer-2 segment.
    pub vni: u32,
    /// UDP destination port on the underlay; unset is 4789 (IANA). Must not be a port the
    /// cluster's own CNI uses with the same VNI (flannel: 8472; Calico: 4789 with VNI 4096).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

impl Vxlan {
    /// The port with the default applied, so every reader agrees on what unset means.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(DEFAULT_VXLAN_PORT)
    }
}

/// Where one overlay pod interface is: what other nodes put in their forwarding tables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OverlayEndpoint {
    /// The Network's VNI when the address was allocated.
    pub vni: u32,
    /// The interface's MAC (`02:5e:1c:9a:33:07`).
    pub mac: String,
    /// The tunnel endpoint (underlay address) of the pod's node.
    pub vtep: String,
}

/// The DeviceClass of the nodes' overlay devices: a vxlan Network's claims ask for it, and only
/// such Networks may name it.
pub const OVERLAY_DEVICE_CLASS: &str = "overlay.knic.dev";

/// The largest VNI: the field is 24 bits.
const MAX_VNI: u32 = (1 << 24) - 1;
/// The smallest MTU of an overlay Network without IPv6 subnets: the datagram size every IPv4
/// host must accept (RFC 791), so a smaller segment breaks ordinary peers.
const MIN_OVERLAY_MTU_V4: u32 = 576;
/// With an IPv6 subnet, the IPv6 minimum (RFC 8200): the kernel disables IPv6 below it.
const MIN_OVERLAY_MTU_V6: u32 = 1280;
/// The largest link MTU the kernel has, minus the VXLAN overhead over IPv4: no underlay can
/// carry more.
const MAX_OVERLAY_MTU: u32 = 65535 - VXLAN_OVERHEAD_V4;

impl Vxlan {
    /// `vxlan vni=4242` (with ` port=8472` when not the default), for the `DEVICES` column.
    pub fn summary(&self) -> String {
        match self.port() {
            DEFAULT_VXLAN_PORT => format!("vxlan vni={}", self.vni),
            port => format!("vxlan vni={} port={port}", self.vni),
        }
    }
}

impl NetworkSpec {
    /// What the `DEVICES` column shows: the overlay's VNI for a vxlan Network (which names no
    /// devices), else [`Devices::summary`].
    ///
    /// [`Devices::summary`]: super::Devices::summary
    pub fn devices_summary(&self) -> String {
        match &self.vxlan {
            Some(vxlan) => vxlan.summary(),
            None => self.devices.summary(),
        }
    }
}

/// The rules `spec.vxlan` adds to a single Network (and the ones it lifts: `spec.devices` is
/// empty with it, required without it). `subnets` are the Network's parsed subnets, to pick
/// the MTU floor.
pub(super) fn check(spec: &NetworkSpec, subnets: &[Option<Cidr>], errors: &mut Vec<FieldError>) {
    let mut error = |path: &str, message: String| errors.push(FieldError::new(path, message));
    let Some(vxlan) = &spec.vxlan else {
        if spec.devices.device_class_name.as_deref() == Some(OVERLAY_DEVICE_CLASS) {
            error(
                "spec.devices.deviceClassName",
                format!(
                    "{OVERLAY_DEVICE_CLASS} selects the nodes' overlay devices, which carry only Networks with spec.vxlan"
                ),
            );
        }
        return;
    };
    if !spec.devices.is_empty() {
        error(
            "spec.devices",
            format!(
                "must be empty with spec.vxlan: overlay pods get a veth on the node's overlay bridge (device \"overlay\", class {OVERLAY_DEVICE_CLASS})"
            ),
        );
    }
    if !(1..=MAX_VNI).contains(&vxlan.vni) {
        error(
            "spec.vxlan.vni",
            format!(
                "must be between 1 and {MAX_VNI} (24 bits), got {}",
                vxlan.vni
            ),
        );
    }
    if vxlan.port == Some(0) {
        error(
            "spec.vxlan.port",
            "must be between 1 and 65535, got 0".to_owned(),
        );
    }
    if spec.ipam.subnets.is_empty() {
        error(
            "spec.vxlan",
            "requires spec.ipam.subnets: nodes learn where each pod is from its NetworkAddress objects, which static addressing does not create".to_owned(),
        );
    }
    let not_on_vlan = "the overlay is not on a VLAN of a device (its underlay may be)";
    if spec.vlan.is_some() {
        error(
            "spec.vlan",
            format!("cannot be set with spec.vxlan: {not_on_vlan}"),
        );
    }
    if spec.vlan_share_group.is_some() {
        error(
            "spec.vlanShareGroup",
            format!("cannot be set with spec.vxlan: {not_on_vlan}"),
        );
    }
    let count = spec.interfaces_per_pod();
    if (2..=MAX_INTERFACES_PER_POD).contains(&count) {
        error(
            "spec.interfacesPerPod",
            format!(
                "must be 1 with spec.vxlan, got {count}: every interface would join the same segment"
            ),
        );
    }
    // Outside 68..=65535 the driver's own check (run on the template) already said so.
    if let Some(mtu) = spec.mtu.filter(|m| (68..=65535).contains(m)) {
        let ipv6 = subnets.iter().position(|c| c.is_some_and(|c| c.is_ipv6()));
        match ipv6 {
            Some(i) if mtu < MIN_OVERLAY_MTU_V6 => error(
                "spec.mtu",
                format!(
                    "{mtu} is below {MIN_OVERLAY_MTU_V6}, the minimum MTU for IPv6 (spec.ipam.subnets[{i}] is IPv6)"
                ),
            ),
            None if mtu < MIN_OVERLAY_MTU_V4 => error(
                "spec.mtu",
                format!(
                    "{mtu} is below {MIN_OVERLAY_MTU_V4}, the minimum MTU of an overlay Network (every IPv4 host accepts {MIN_OVERLAY_MTU_V4}-byte datagrams; {MIN_OVERLAY_MTU_V6} with an IPv6 subnet)"
                ),
            ),
            _ if mtu > MAX_OVERLAY_MTU => error(
                "spec.mtu",
                format!(
                    "{mtu} is above {MAX_OVERLAY_MTU}, the largest MTU of an overlay Network (the largest underlay MTU, 65535, minus {VXLAN_OVERHEAD_V4} bytes of VXLAN over IPv4)"
                ),
            ),
            _ => {}
        }
    }
}

/// The VNI clash with `others` (already filtered to the Networks this one must not conflict
/// with, and sorted by name): two Networks on one VNI would be one layer-2 segment, and the
/// nodes name their bridge and VXLAN link after the VNI alone.
pub(super) fn against(
    spec: &NetworkSpec,
    others: &[&(String, NetworkSpec)],
    errors: &mut Vec<FieldError>,
) {
    let Some(mine) = &spec.vxlan else {
        return;
    };
    for (other_name, other) in others {
        if other.vxlan.as_ref().is_some_and(|v| v.vni == mine.vni) {
            errors.push(FieldError::new(
                "spec.vxlan.vni",
                format!(
                    "VNI {} is already used by network {other_name:?}; two Networks on one VNI would be one layer-2 segment (pick another vni)",
                    mine.vni
                ),
            ));
        }
    }
}
