//! Plans on the node's overlay device (issue 26): a veth on the bridge of the claim's Network's
//! VNI, with the MAC its allocation announced and an MTU the underlay can carry. What a config
//! may not ask of it is refused here, naming the field, before anything is allocated on the
//! node.

use std::net::IpAddr;

use knic_proto::netconfig::{DeviceMode, FieldError, ValidConfig};

use crate::claims::checkpoint::PreparedDevice;
use crate::claims::ipam::Addressing;
use crate::inventory::overlay::{ATTR_MTU, ATTR_VTEP, KIND};
use crate::netns::AttachMode;
use crate::netns::overlay::Segment;

fn attribute<'a>(
    device: &'a PreparedDevice,
    key: &str,
) -> Option<&'a k8s_openapi::api::resource::v1::DeviceAttribute> {
    device.published.as_ref()?.attributes.as_ref()?.get(key)
}

/// Whether `device` is a node's overlay device.
pub fn is_overlay(device: &PreparedDevice) -> bool {
    attribute(device, "kind").and_then(|a| a.string.as_deref()) == Some(KIND)
}

/// The tunnel endpoint of `device` when it is an overlay device.
pub fn vtep(device: &PreparedDevice) -> Option<IpAddr> {
    if !is_overlay(device) {
        return None;
    }
    attribute(device, ATTR_VTEP)?
        .string
        .as_deref()?
        .parse()
        .ok()
}

/// What an overlay interface gets: its mode, MTU and MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayPlan {
    /// [`AttachMode::Overlay`].
    pub mode: AttachMode,
    /// The pod interface's MTU.
    pub mtu: u32,
    /// The MAC the allocation announced.
    pub mac: [u8; 6],
}

/// The plan of interface `index` of claim `claim_uid` on the overlay device `device` (whose
/// netdev attribute is the underlay `underlay`), or every refusal.
pub fn plan(
    device: &PreparedDevice,
    valid: &ValidConfig,
    addressing: Option<&Addressing>,
    underlay: &str,
    claim_uid: &str,
    index: usize,
) -> Result<OverlayPlan, Vec<FieldError>> {
    let at = |field: &str| format!("request {}: {field}", device.request);
    let what = format!(
        "device {}/{} is the node's overlay: pods get a veth on its bridge",
        device.pool, device.device
    );
    let mut out = Vec::new();
    if valid.device_mode == DeviceMode::VfioPci {
        out.push(FieldError::new(at("deviceMode"), what.clone()));
    }
    if valid.vlan.is_some() {
        out.push(FieldError::new(
            at("vlan"),
            format!("{what} (the VLAN of an overlay Network is its VNI)"),
        ));
    }
    if valid.child.is_some() {
        out.push(FieldError::new(at("macvlan/ipvlan"), what.clone()));
    }
    if valid.vf.is_some() {
        out.push(FieldError::new(at("vf"), what.clone()));
    }
    if valid.hardware_address.is_some() {
        out.push(FieldError::new(
            at("interface.hardwareAddress"),
            "an overlay interface's MAC is derived from its Network and pod and announced to \
             the other nodes; leave it unset",
        ));
    }
    let facts = addressing.and_then(|a| a.overlay.as_ref());
    let (Some(facts), Some(vtep)) = (facts, vtep(device)) else {
        out.push(FieldError::new(
            at("ipam.network"),
            format!(
                "device {}/{} carries VXLAN Networks only; name a Network with spec.vxlan",
                device.pool, device.device
            ),
        ));
        return Err(out);
    };
    let carried = attribute(device, ATTR_MTU)
        .and_then(|a| a.int)
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or(1450);
    let mtu = valid.mtu.unwrap_or(carried);
    if mtu > carried {
        out.push(FieldError::new(
            at("interface.mtu"),
            format!(
                "{mtu} is more than the overlay on this node carries ({carried}: its underlay \
                 {underlay} less the VXLAN encapsulation)"
            ),
        ));
    }
    if !out.is_empty() {
        return Err(out);
    }
    Ok(OverlayPlan {
        mode: AttachMode::Overlay {
            segment: Segment::new(facts.vni, facts.port, vtep, underlay, carried),
            host_veth: host_veth(claim_uid, index),
        },
        mtu,
        mac: facts.mac,
    })
}

/// The host end of interface `index` of claim `claim_uid`: `knh` + 12 hex digits of a hash
/// (FNV-1a), 15 characters (the kernel's limit), the same on a repeated prepare; 48 bits, so
/// two claims of a node sharing one (detach deletes the host end by name) is beyond reach.
pub fn host_veth(claim_uid: &str, index: usize) -> String {
    let hash = claim_uid
        .bytes()
        .chain(std::iter::once(0xff))
        .chain(index.to_string().bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("knh{:012x}", hash & 0xffff_ffff_ffff)
}

#[cfg(test)]
#[path = "overlay_tests.rs"]
mod tests;
