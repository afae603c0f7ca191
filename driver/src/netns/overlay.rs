//! The messages behind an overlay segment (one VXLAN Network on one node): a bridge, the VXLAN
//! device enslaved to it, a veth per pod whose peer is created directly in the pod, and the
//! static forwarding entries that send frames to other nodes. Pure functions, so every attribute
//! is checked at the message level; the session sends them.
//!
//! Why a bridge and not the VXLAN device alone: two pods of one Network on one node must reach
//! each other without leaving the node, and a VXLAN device cannot hairpin between local ports.
//! Why static entries: no multicast is needed on the underlay (head-end replication to every node
//! with a pod of the segment), and the VXLAN device learns nothing from the wire, so a forged
//! packet cannot make it send a remote pod's frames elsewhere. (The bridge still learns which
//! of its ports a MAC is behind, as any Linux bridge does; see the README's "Operating it".)

use std::net::IpAddr;
use std::os::fd::RawFd;

use netlink_packet_route::link::{
    BridgeStpState, InfoBridge, InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkInfo,
    LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, route::RouteType};
use rtnetlink::{LinkBridge, LinkMessageBuilder, LinkUnspec, LinkVxlan};
use serde::{Deserialize, Serialize};

use super::{Kernel, LinkChange, Ns, Session, open};
use crate::error::Result;

/// One VXLAN segment on this node: what the bridge and the VXLAN device are made of. Their
/// names are fixed by the VNI, so every attachment of the segment finds the same ones and a
/// restarted driver recognises them (15 characters at most: `knb`/`knx` + 6 hex digits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Segment {
    /// The VXLAN network identifier (24 bits).
    pub vni: u32,
    /// UDP destination port of the encapsulation.
    pub port: u16,
    /// This node's tunnel endpoint address (the source of encapsulated frames).
    pub local: IpAddr,
    /// The underlay link holding `local`.
    pub underlay: String,
    /// MTU of the bridge and the VXLAN device (the pods' MTU).
    pub mtu: u32,
    /// The bridge's name ([`bridge_name`]).
    pub bridge: String,
    /// The VXLAN device's name ([`vxlan_name`]).
    pub vxlan: String,
}

impl Segment {
    /// The segment of VNI `vni` on `port`, from `local` on `underlay`, at `mtu`.
    pub fn new(vni: u32, port: u16, local: IpAddr, underlay: &str, mtu: u32) -> Segment {
        Segment {
            vni,
            port,
            local,
            underlay: underlay.to_owned(),
            mtu,
            bridge: bridge_name(vni),
            vxlan: vxlan_name(vni),
        }
    }
}

/// The bridge of VNI `vni`.
pub fn bridge_name(vni: u32) -> String {
    format!("knb{vni:06x}")
}

/// The VXLAN device of VNI `vni`.
pub fn vxlan_name(vni: u32) -> String {
    format!("knx{vni:06x}")
}

/// The VNI whose bridge or VXLAN device `name` is, when `name` has exactly knic's shape: the
/// sweep deletes only links it can prove are its own.
pub fn segment_vni(name: &str) -> Option<u32> {
    let hex = name
        .strip_prefix("knb")
        .or_else(|| name.strip_prefix("knx"))?;
    if hex.len() != 6
        || !hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return None;
    }
    u32::from_str_radix(hex, 16).ok()
}

/// The bridge: no STP (a segment has no loops: one VXLAN port plus veths) and no multicast
/// snooping (it would drop IPv6 neighbour discovery until a querier exists), up at once.
pub fn bridge_message(segment: &Segment) -> LinkMessage {
    LinkBridge::new(&segment.bridge)
        .set_info_data(InfoData::Bridge(vec![
            InfoBridge::StpState(BridgeStpState::Disabled),
            InfoBridge::MulticastSnooping(false),
        ]))
        .mtu(segment.mtu)
        .build()
}

/// The VXLAN device of `segment`, bound to the underlay (`underlay_index`) and the bridge
/// (`bridge_index`), learning off: where each MAC lives comes from the cluster, not the wire.
pub fn vxlan_message(segment: &Segment, underlay_index: u32, bridge_index: u32) -> LinkMessage {
    let mut b = LinkVxlan::new(&segment.vxlan, segment.vni)
        .dev(underlay_index)
        .port(segment.port)
        .learning(false);
    b = match segment.local {
        IpAddr::V4(a) => b.local(a),
        IpAddr::V6(a) => b.local6(a),
    };
    b.mtu(segment.mtu).controller(bridge_index).up().build()
}

/// The veth of one pod: the host end `host` on the bridge, up; the peer created directly in the
/// namespace open at `netns_fd`, named, sized and addressed per `change` (it comes up after its
/// addresses, like a child).
pub fn veth_message(
    host: &str,
    bridge_index: u32,
    netns_fd: RawFd,
    mtu: u32,
    change: &LinkChange,
) -> LinkMessage {
    let mut peer = LinkMessageBuilder::<LinkUnspec>::new()
        .name(change.name.clone().unwrap_or_else(|| host.to_owned()))
        .setns_by_fd(netns_fd)
        .mtu(change.mtu.unwrap_or(mtu));
    if let Some(mac) = change.mac {
        peer = peer.address(mac.to_vec());
    }
    let mut peer = peer.build();
    super::link::add_sizes(&mut peer, &change.sizes);
    LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
        .name(host.to_owned())
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .mtu(mtu)
        .controller(bridge_index)
        .up()
        .build()
}

/// One static forwarding entry of a VXLAN device: frames for `mac` go to the node at `dst`. The
/// all-zero MAC is the flood list: broadcast, unknown unicast and multicast go to every `dst` of
/// it (head-end replication).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FdbEntry {
    /// Destination MAC, or all zeros for the flood list.
    pub mac: [u8; 6],
    /// The remote tunnel endpoint.
    pub dst: IpAddr,
}

impl FdbEntry {
    /// Whether this is a flood-list entry.
    pub fn is_flood(&self) -> bool {
        self.mac == [0; 6]
    }
}

impl std::fmt::Display for FdbEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.mac;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x} dst {}",
            m[0], m[1], m[2], m[3], m[4], m[5], self.dst
        )
    }
}

/// The RTM_NEWNEIGH / RTM_DELNEIGH body of `entry` on the VXLAN device `vxlan_index`: family
/// `AF_BRIDGE`, `NTF_SELF` (the VXLAN device's own table, not the bridge's), permanent.
pub fn fdb_message(vxlan_index: u32, entry: &FdbEntry) -> NeighbourMessage {
    let mut message = NeighbourMessage::default();
    message.header.family = AddressFamily::Bridge;
    message.header.ifindex = vxlan_index;
    message.header.state = NeighbourState::Permanent;
    message.header.flags = NeighbourFlags::Own;
    message.header.kind = RouteType::Unspec;
    message
        .attributes
        .push(NeighbourAttribute::LinkLayerAddress(entry.mac.to_vec()));
    message
        .attributes
        .push(NeighbourAttribute::Destination(match entry.dst {
            IpAddr::V4(a) => NeighbourAddress::Inet(a),
            IpAddr::V6(a) => NeighbourAddress::Inet6(a),
        }));
    message
}

/// The static remote entries in a dump of the bridge family's neighbours, for the VXLAN device
/// `vxlan_index` only: entries without a remote (the device's own, the bridge's learned ones)
/// are not knic's to manage.
pub fn fdb_entries(dump: &[NeighbourMessage], vxlan_index: u32) -> Vec<FdbEntry> {
    let mut entries: Vec<FdbEntry> = dump
        .iter()
        .filter(|m| m.header.ifindex == vxlan_index)
        .filter_map(|m| {
            let mut mac = None;
            let mut dst = None;
            for attribute in &m.attributes {
                match attribute {
                    NeighbourAttribute::LinkLayerAddress(bytes) if bytes.len() == 6 => {
                        mac = <[u8; 6]>::try_from(bytes.as_slice()).ok();
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                        dst = Some(IpAddr::V4(*a));
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                        dst = Some(IpAddr::V6(*a));
                    }
                    // In the bridge family the library cannot know the remote's family: the
                    // length tells it.
                    NeighbourAttribute::Destination(NeighbourAddress::Other(bytes)) => {
                        dst = match bytes.len() {
                            4 => <[u8; 4]>::try_from(bytes.as_slice()).ok().map(IpAddr::from),
                            16 => <[u8; 16]>::try_from(bytes.as_slice())
                                .ok()
                                .map(IpAddr::from),
                            _ => None,
                        };
                    }
                    _ => {}
                }
            }
            Some(FdbEntry {
                mac: mac?,
                dst: dst?,
            })
        })
        .collect();
    entries.sort();
    entries.dedup();
    entries
}

/// What a link of the segment's name must be for knic to take it as its own: the bridge a
/// bridge, the VXLAN device one of this VNI, port and local address. `None` when it is.
pub fn foreign_reason(link: &LinkMessage, segment: &Segment, want_vxlan: bool) -> Option<String> {
    let info: Vec<&LinkInfo> = link
        .attributes
        .iter()
        .filter_map(|a| match a {
            LinkAttribute::LinkInfo(i) => Some(i),
            _ => None,
        })
        .flatten()
        .collect();
    let kind = info.iter().find_map(|i| match i {
        LinkInfo::Kind(k) => Some(k.clone()),
        _ => None,
    });
    if !want_vxlan {
        return match kind {
            Some(InfoKind::Bridge) => None,
            other => Some(format!("a {} link of that name exists", kind_name(other))),
        };
    }
    if kind != Some(InfoKind::Vxlan) {
        return Some(format!("a {} link of that name exists", kind_name(kind)));
    }
    let Some(data) = info.iter().find_map(|i| match i {
        LinkInfo::Data(InfoData::Vxlan(d)) => Some(d),
        _ => None,
    }) else {
        // Settings that cannot be read cannot be shown to be knic's.
        return Some("a vxlan link of that name exists whose settings cannot be read".into());
    };
    let mut vni = None;
    let mut port = None;
    let mut local = None;
    for d in data {
        match d {
            InfoVxlan::Id(v) => vni = Some(*v),
            InfoVxlan::Port(p) => port = Some(*p),
            InfoVxlan::Local(a) => local = Some(IpAddr::V4(*a)),
            InfoVxlan::Local6(a) => local = Some(IpAddr::V6(*a)),
            _ => {}
        }
    }
    if vni == Some(segment.vni) && port == Some(segment.port) && local == Some(segment.local) {
        return None;
    }
    Some(format!(
        "a vxlan link of that name exists with VNI {} port {} local {}",
        vni.map_or("?".into(), |v| v.to_string()),
        port.map_or("?".into(), |p| p.to_string()),
        local.map_or("none".into(), |l| l.to_string()),
    ))
}

fn kind_name(kind: Option<InfoKind>) -> String {
    match kind {
        None => "plain".into(),
        Some(InfoKind::Other(k)) => k,
        Some(k) => format!("{k:?}").to_lowercase(),
    }
}

/// Deletes the VXLAN device and the bridge of VNI `vni` from the host, each only when it is
/// there with knic's kind; the caller has established that no recorded attachment uses the
/// segment. The forwarding entries go with the device.
pub async fn release<K: Kernel>(kernel: &K, vni: u32) -> Result<()> {
    let mut host = open(kernel, &Ns::Host).await?;
    for (name, kind) in [(vxlan_name(vni), "vxlan"), (bridge_name(vni), "bridge")] {
        if host
            .find_link(&name)
            .await?
            .is_some_and(|l| l.kind.as_deref() == Some(kind))
        {
            host.del_link(&name).await?;
        }
    }
    tracing::info!(vni, "overlay segment no pod uses any more deleted");
    Ok(())
}

/// The segments present on the host, by their bridge's name (a VXLAN device left without its
/// bridge counts too), for the start-up sweep.
pub async fn present<K: Kernel>(kernel: &K) -> Result<Vec<String>> {
    let mut host = open(kernel, &Ns::Host).await?;
    let mut found: Vec<String> = host
        .links()
        .await?
        .into_iter()
        .filter(|l| {
            let shape = |prefix: &str| l.name.starts_with(prefix) && segment_vni(&l.name).is_some();
            (l.kind.as_deref() == Some("bridge") && shape("knb"))
                || (l.kind.as_deref() == Some("vxlan") && shape("knx"))
        })
        .filter_map(|l| segment_vni(&l.name).map(bridge_name))
        .collect();
    found.sort();
    found.dedup();
    Ok(found)
}

#[cfg(test)]
#[path = "overlay_tests.rs"]
pub(crate) mod tests;
