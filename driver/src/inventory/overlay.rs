//! The node's overlay device (issue 26): one synthetic device, `overlay`, published when the
//! driver is given its tunnel endpoint address (`--vtep-address`, the chart passes the node's
//! `status.hostIP`). Each claim of it gets a veth on the node's bridge of its Network's VNI, so
//! it is a shared parent with many child slots; the link holding the address is the underlay,
//! and the device's `mtu` is what a pod can carry over it (the underlay's minus the VXLAN
//! encapsulation), so selectors and plans agree on it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use futures::TryStreamExt;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use knic_proto::network::{VXLAN_OVERHEAD_V4, VXLAN_OVERHEAD_V6};
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::LinkAttribute;

use crate::sharing;

/// The device's name in the ResourceSlice.
pub const DEVICE_NAME: &str = "overlay";
/// Its `kind` attribute (what `overlay.knic.dev` selects).
pub const KIND: &str = "overlay";
/// Attribute: the node's tunnel endpoint.
pub const ATTR_VTEP: &str = "vtep";
/// Attribute: the MTU a pod interface of the overlay can have.
pub const ATTR_MTU: &str = "mtu";

/// What the admin asked for: the tunnel endpoint and how many overlay interfaces the node
/// offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayOffer {
    /// This node's underlay address (the source of its VXLAN packets).
    pub vtep: IpAddr,
    /// Overlay interfaces offered (child slots of the device).
    pub children: u32,
}

/// The offer with the link that holds its address, as found by a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Underlay {
    /// The offer.
    pub offer: OverlayOffer,
    /// The link holding the address.
    pub ifname: String,
    /// Its MTU.
    pub mtu: u32,
}

impl Underlay {
    /// The MTU a pod interface can have: the underlay's minus VXLAN over its family.
    pub fn pod_mtu(&self) -> u32 {
        let overhead = match self.offer.vtep {
            IpAddr::V4(_) => VXLAN_OVERHEAD_V4,
            IpAddr::V6(_) => VXLAN_OVERHEAD_V6,
        };
        self.mtu.saturating_sub(overhead)
    }
}

/// The published device: a shared parent (capacity form; the slot form derives from it).
pub fn device(underlay: &Underlay) -> Device {
    let text = |s: &str| DeviceAttribute {
        string: Some(s.to_owned()),
        ..Default::default()
    };
    let attributes = BTreeMap::from([
        ("kind".to_owned(), text(KIND)),
        ("ifName".to_owned(), text(&underlay.ifname)),
        (ATTR_VTEP.to_owned(), text(&underlay.offer.vtep.to_string())),
        (
            ATTR_MTU.to_owned(),
            DeviceAttribute {
                int: Some(i64::from(underlay.pod_mtu())),
                ..Default::default()
            },
        ),
    ]);
    let mut device = Device {
        name: DEVICE_NAME.to_owned(),
        attributes: Some(attributes),
        ..Default::default()
    };
    sharing::shared_parent(&mut device, underlay.offer.children, None);
    device
}

/// Finds the link holding `offer.vtep` in the current network namespace; `None` (with a
/// warning) when no link holds it, so no overlay is offered rather than a broken one.
pub async fn find(offer: &OverlayOffer) -> Option<Underlay> {
    match lookup(offer.vtep).await {
        Ok(Some((ifname, mtu))) => Some(Underlay {
            offer: offer.clone(),
            ifname,
            mtu,
        }),
        Ok(None) => {
            tracing::warn!(vtep = %offer.vtep,
                "no link holds --vtep-address: overlay networks not offered on this node");
            None
        }
        Err(e) => {
            tracing::warn!(vtep = %offer.vtep, error = %e,
                "could not read addresses to find the overlay's underlay; not offered this time");
            None
        }
    }
}

async fn lookup(vtep: IpAddr) -> std::io::Result<Option<(String, u32)>> {
    let (connection, handle, _) = rtnetlink::new_connection()?;
    let task = tokio::spawn(connection);
    let found = async {
        let mut addresses = handle.address().get().execute();
        let mut index = None;
        while let Some(msg) = addresses.try_next().await.map_err(std::io::Error::other)? {
            let holds = msg.attributes.iter().any(|a| {
                matches!(a, AddressAttribute::Local(ip) | AddressAttribute::Address(ip) if *ip == vtep)
            });
            if holds {
                index = Some(msg.header.index);
                break;
            }
        }
        let Some(index) = index else {
            return Ok(None);
        };
        let mut links = handle.link().get().match_index(index).execute();
        let Some(link) = links.try_next().await.map_err(std::io::Error::other)? else {
            return Ok(None);
        };
        let mut name = None;
        let mut mtu = None;
        for a in link.attributes {
            match a {
                LinkAttribute::IfName(n) => name = Some(n),
                LinkAttribute::Mtu(m) => mtu = Some(m),
                _ => {}
            }
        }
        Ok(name.zip(mtu))
    }
    .await;
    task.abort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharing::{CAPACITY_CHILDREN, is_shared_parent};

    fn underlay(vtep: &str, mtu: u32) -> Underlay {
        Underlay {
            offer: OverlayOffer {
                vtep: vtep.parse().unwrap(),
                children: 110,
            },
            ifname: "eth0".into(),
            mtu,
        }
    }

    #[test]
    fn the_device_is_a_shared_parent_with_the_pods_mtu() {
        let d = device(&underlay("192.168.10.12", 1500));
        assert_eq!(d.name, "overlay");
        assert!(is_shared_parent(&d));
        let a = d.attributes.as_ref().unwrap();
        assert_eq!(a["kind"].string.as_deref(), Some("overlay"));
        assert_eq!(a["ifName"].string.as_deref(), Some("eth0"));
        assert_eq!(a["vtep"].string.as_deref(), Some("192.168.10.12"));
        assert_eq!(a["mtu"].int, Some(1450));
        let children = &d.capacity.as_ref().unwrap()[CAPACITY_CHILDREN];
        assert_eq!(children.value.0, "110");
        // Over IPv6 the encapsulation is 20 bytes longer.
        let d = device(&underlay("fd00::12", 9000));
        assert_eq!(d.attributes.unwrap()["mtu"].int, Some(8930));
    }
}
