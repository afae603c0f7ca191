//! Overlay Networks (issue 26): a Network with `spec.vxlan` is one layer-2 segment spanning
//! nodes. Its pods get a veth on their node's bridge of the VNI, and each node learns where
//! other nodes' pods are from the `overlay` facts their NetworkAddress objects carry (the
//! allocations every addressed pod already creates, so announcing a pod costs no extra write).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
