//! Per-interface settings of issue 27 that ride on the pod's link itself: static neighbors
//! (permanent ARP/NDP entries) and the GSO/GRO maximum sizes (Big TCP).
//!
//! Neighbors need no undo record: the kernel flushes a device's neighbor entries when it leaves
//! a namespace (`neigh_ifdown` on unregister, including permanent ones) and when it is deleted,
//! so a detach while the pod lives (moved back, or child deleted) removes what knic added, and
//! a pod that dies takes them along. A resumed attach re-adds them with replace semantics.

use std::net::IpAddr;

use knic_proto::netconfig::{Neighbor, OffloadSizes};
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::RouteType;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use serde::{Deserialize, Serialize};

/// The issue-27 settings of the pod's link, carried in the [`super::AttachPlan`] (one field,
/// so older checkpoints, which have none, load unchanged).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkSettings {
    /// Permanent ARP/NDP entries added after the addresses, before the link goes up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub neighbors: Vec<Neighbor>,
    /// GSO/GRO maximum sizes, set by the move or creation request itself; a moved device's
    /// previous values are recorded in [`super::Restore`] first and put back by the move home.
    #[serde(default, skip_serializing_if = "OffloadSizes::is_empty")]
    pub sizes: OffloadSizes,
}

impl LinkSettings {
    /// Nothing to do (what a plan without the fields holds).
    pub fn is_empty(&self) -> bool {
        self.neighbors.is_empty() && self.sizes.is_empty()
    }
}

/// The attribute, the Linux release that brought it, for each size in
/// [`OffloadSizes::fields`] order.
const SIZE_ATTRIBUTES: [(&str, &str); 4] = [
    ("IFLA_GSO_MAX_SIZE", "4.16"),
    ("IFLA_GRO_MAX_SIZE", "5.16"),
    ("IFLA_GSO_IPV4_MAX_SIZE", "6.3"),
    ("IFLA_GRO_IPV4_MAX_SIZE", "6.3"),
];

/// Appends the sizes `sizes` sets to a link request (a move, a change or a creation: the
/// kernel takes them in each).
pub fn add_sizes(message: &mut LinkMessage, sizes: &OffloadSizes) {
    if let Some(v) = sizes.gso_max_size {
        message.attributes.push(LinkAttribute::GsoMaxSize(v));
    }
    if let Some(v) = sizes.gro_max_size {
        message.attributes.push(LinkAttribute::GroMaxSize(v));
    }
    if let Some(v) = sizes.gso_ipv4_max_size {
        message.attributes.push(LinkAttribute::GsoIpv4MaxSize(v));
    }
    if let Some(v) = sizes.gro_ipv4_max_size {
        message.attributes.push(LinkAttribute::GroIpv4MaxSize(v));
    }
}

/// The sizes an RTM_NEWLINK reply reports; one the kernel does not report is `None` (a kernel
/// that predates the attribute ignores it in a request too, silently: see [`unsupported`]).
pub fn reported_sizes(message: &LinkMessage) -> OffloadSizes {
    let mut sizes = OffloadSizes::default();
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::GsoMaxSize(v) => sizes.gso_max_size = Some(*v),
            LinkAttribute::GroMaxSize(v) => sizes.gro_max_size = Some(*v),
            LinkAttribute::GsoIpv4MaxSize(v) => sizes.gso_ipv4_max_size = Some(*v),
            LinkAttribute::GroIpv4MaxSize(v) => sizes.gro_ipv4_max_size = Some(*v),
            _ => {}
        }
    }
    sizes
}

/// Why this kernel cannot apply `wanted`, judged by what it reported of device `ifname`
/// (`reported`): a size it does not report is one it does not know, and a request with it
/// would be accepted and do nothing (rtnetlink ignores attributes beyond its `IFLA_MAX`).
pub fn unsupported(wanted: &OffloadSizes, reported: &OffloadSizes, ifname: &str) -> Option<String> {
    let missing: Vec<String> = wanted
        .fields()
        .iter()
        .zip(reported.fields())
        .zip(SIZE_ATTRIBUTES)
        .filter(|(((_, want), (_, have)), _)| want.is_some() && have.is_none())
        .map(|(((name, _), _), (attribute, release))| {
            format!("interface.{name} ({attribute}, Linux {release}+)")
        })
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "this kernel does not support {} (it reports no such size for {ifname}, and would \
             ignore the setting)",
            missing.join(", ")
        )
    })
}

/// The values `current` has of exactly the sizes `wanted` sets: what detach puts back.
pub fn previous(wanted: &OffloadSizes, current: &OffloadSizes) -> OffloadSizes {
    let pick = |want: Option<u32>, have: Option<u32>| want.and(have);
    OffloadSizes {
        gso_max_size: pick(wanted.gso_max_size, current.gso_max_size),
        gro_max_size: pick(wanted.gro_max_size, current.gro_max_size),
        gso_ipv4_max_size: pick(wanted.gso_ipv4_max_size, current.gso_ipv4_max_size),
        gro_ipv4_max_size: pick(wanted.gro_ipv4_max_size, current.gro_ipv4_max_size),
    }
}

/// `change` (a move home) also putting back the sizes `restore` recorded.
pub(super) fn restoring(
    mut change: super::LinkChange,
    restore: &super::Restore,
) -> super::LinkChange {
    if let Some(sizes) = restore.sizes {
        change.sizes = sizes;
    }
    change
}

/// Before anything changes: refuses sizes this kernel does not know (judged on the plan's
/// host device, the device itself or a child's parent), and returns the previous values of
/// the sizes a move changes, for [`super::Restore`].
pub(super) async fn capture_sizes<S: super::Session>(
    host: &mut S,
    plan: &super::AttachPlan,
) -> crate::error::Result<Option<OffloadSizes>> {
    let wanted = &plan.link.sizes;
    if wanted.is_empty() {
        return Ok(None);
    }
    let context = || format!("reading the GSO/GRO sizes of {}", plan.host_ifname);
    let reported = host
        .offload_sizes(&plan.host_ifname)
        .await?
        .ok_or_else(|| {
            crate::error::Error::kernel(
                super::Ns::Host,
                context(),
                format!(
                    "interface {} is not in the host namespace",
                    plan.host_ifname
                ),
            )
        })?;
    if let Some(why) = unsupported(wanted, &reported, &plan.host_ifname) {
        return Err(crate::error::Error::kernel(
            super::Ns::Host,
            format!("setting the GSO/GRO sizes of {}/{}", plan.pool, plan.device),
            why,
        ));
    }
    Ok(matches!(plan.mode, super::AttachMode::Move).then(|| previous(wanted, &reported)))
}

/// A VLAN, macvlan or ipvlan child gets its GSO/GRO sizes in a change right after its creation,
/// in the pod, before it goes up (also when a resumed attach finds it there): its creation
/// cannot carry a GSO size above 64 KiB, because the kernel checks it against the new device's
/// `tso_max_size` before the child inherits its parent's (6.18: "too big gso_max_size"). A
/// moved device and an overlay veth get them in their one request.
pub(super) async fn size_child<S: super::Session>(
    plan: &super::AttachPlan,
    pod: &mut S,
) -> crate::error::Result<()> {
    if plan.link.sizes.is_empty() || plan.mode.new_child().is_none() {
        return Ok(());
    }
    let change = super::LinkChange {
        sizes: plan.link.sizes,
        ..super::LinkChange::default()
    };
    pod.set_link(&plan.pod_ifname, &change).await
}

/// `ip neigh replace ADDRESS lladdr MAC nud permanent dev INDEX`: RTM_NEWNEIGH with
/// `NLM_F_CREATE | NLM_F_REPLACE`, so a repeated attach (or an entry the kernel learned
/// meanwhile) ends as exactly the configured permanent entry.
pub fn neighbor_message(index: u32, neighbor: &Neighbor) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut message = NeighbourMessage::default();
    message.header.family = match neighbor.address {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    message.header.ifindex = index;
    message.header.state = NeighbourState::Permanent;
    message.header.kind = RouteType::Unspec;
    message
        .attributes
        .push(NeighbourAttribute::Destination(match neighbor.address {
            IpAddr::V4(a) => NeighbourAddress::Inet(a),
            IpAddr::V6(a) => NeighbourAddress::Inet6(a),
        }));
    message
        .attributes
        .push(NeighbourAttribute::LinkLayerAddress(
            neighbor.hardware_address.to_vec(),
        ));
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::NewNeighbour(message));
    request.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
    request
}

/// `ADDRESS lladdr MAC` as `ip neigh` shows it, for errors and the fake's log.
pub fn describe_neighbor(neighbor: &Neighbor) -> String {
    format!(
        "{} lladdr {}",
        neighbor.address,
        super::mac_text(&neighbor.hardware_address)
    )
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{Emitable, NetlinkHeader, NetlinkPayload};

    use super::*;

    fn wire(request: NetlinkMessage<RouteNetlinkMessage>) -> (NetlinkHeader, NeighbourMessage) {
        let mut request = request;
        request.finalize();
        let mut bytes = vec![0u8; request.buffer_len()];
        request.serialize(&mut bytes);
        let parsed = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes).expect("parses");
        match parsed.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(m)) => {
                (parsed.header, m)
            }
            other => panic!("not RTM_NEWNEIGH: {other:?}"),
        }
    }

    #[test]
    fn an_ipv4_neighbor_is_a_permanent_arp_entry_replaced_in_place() {
        let neighbor = Neighbor {
            address: "192.0.2.1".parse().unwrap(),
            hardware_address: [2, 0xaa, 0, 0, 0, 1],
        };
        let (header, message) = wire(neighbor_message(7, &neighbor));
        assert_eq!(header.message_type, 28, "RTM_NEWNEIGH");
        assert_eq!(
            header.flags,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
        );
        assert_eq!(message.header.family, AddressFamily::Inet);
        assert_eq!(message.header.ifindex, 7);
        assert_eq!(message.header.state, NeighbourState::Permanent);
        assert_eq!(
            message.attributes,
            vec![
                NeighbourAttribute::Destination(NeighbourAddress::Inet(
                    "192.0.2.1".parse().unwrap()
                )),
                NeighbourAttribute::LinkLayerAddress(vec![2, 0xaa, 0, 0, 0, 1]),
            ]
        );
        // NUD_PERMANENT is 0x80 on the wire.
        let mut bytes = vec![0u8; message.buffer_len()];
        message.emit(&mut bytes);
        assert_eq!(u16::from_ne_bytes([bytes[8], bytes[9]]), 0x80);
        assert_eq!(
            describe_neighbor(&neighbor),
            "192.0.2.1 lladdr 02:aa:00:00:00:01"
        );
    }

    #[test]
    fn an_ipv6_neighbor_is_an_ndp_entry() {
        let neighbor = Neighbor {
            address: "2001:db8::1".parse().unwrap(),
            hardware_address: [2, 0, 0, 0, 0, 2],
        };
        let (_, message) = wire(neighbor_message(3, &neighbor));
        assert_eq!(message.header.family, AddressFamily::Inet6);
        assert_eq!(
            message.attributes[0],
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(
                "2001:db8::1".parse().unwrap()
            ))
        );
    }

    #[test]
    fn sizes_ride_as_u32_attributes_and_read_back() {
        let mut message = LinkMessage::default();
        message.header.index = 9;
        let sizes = OffloadSizes {
            gso_max_size: Some(185_000),
            gro_max_size: None,
            gso_ipv4_max_size: Some(65_536),
            gro_ipv4_max_size: Some(524_280),
        };
        add_sizes(&mut message, &sizes);
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::SetLink(message));
        request.finalize();
        let mut bytes = vec![0u8; request.buffer_len()];
        request.serialize(&mut bytes);
        // Netlink and link headers (16 bytes each), then each attribute: length 8, type, u32.
        let attributes: Vec<(u16, u16, u32)> = bytes[32..]
            .chunks(8)
            .map(|a| {
                (
                    u16::from_ne_bytes([a[0], a[1]]),
                    u16::from_ne_bytes([a[2], a[3]]),
                    u32::from_ne_bytes([a[4], a[5], a[6], a[7]]),
                )
            })
            .collect();
        // IFLA_GSO_MAX_SIZE 41, IFLA_GSO_IPV4_MAX_SIZE 63, IFLA_GRO_IPV4_MAX_SIZE 64.
        assert_eq!(
            attributes,
            vec![(8, 41, 185_000), (8, 63, 65_536), (8, 64, 524_280)]
        );
        let parsed = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes).expect("parses");
        let NetlinkPayload::InnerMessage(RouteNetlinkMessage::SetLink(parsed)) = parsed.payload
        else {
            panic!("not RTM_SETLINK");
        };
        assert_eq!(reported_sizes(&parsed), sizes);
        let mut plain = LinkMessage::default();
        add_sizes(&mut plain, &OffloadSizes::default());
        assert!(plain.attributes.is_empty());
    }

    #[test]
    fn unsupported_sizes_are_named_and_previous_values_are_exactly_the_changed_ones() {
        let wanted = OffloadSizes {
            gso_max_size: Some(185_000),
            gro_ipv4_max_size: Some(185_000),
            ..OffloadSizes::default()
        };
        let kernel_6_1 = OffloadSizes {
            gso_max_size: Some(65_536),
            gro_max_size: Some(65_536),
            ..OffloadSizes::default()
        };
        assert_eq!(
            unsupported(&wanted, &kernel_6_1, "eth1").as_deref(),
            Some(
                "this kernel does not support interface.groIpv4MaxSize (IFLA_GRO_IPV4_MAX_SIZE, \
                 Linux 6.3+) (it reports no such size for eth1, and would ignore the setting)"
            )
        );
        let kernel_6_18 = OffloadSizes {
            gso_ipv4_max_size: Some(65_536),
            gro_ipv4_max_size: Some(40_000),
            ..kernel_6_1
        };
        assert_eq!(unsupported(&wanted, &kernel_6_18, "eth1"), None);
        assert_eq!(
            previous(&wanted, &kernel_6_18),
            OffloadSizes {
                gso_max_size: Some(65_536),
                gro_ipv4_max_size: Some(40_000),
                ..OffloadSizes::default()
            }
        );
    }

    #[test]
    fn settings_without_fields_are_left_out_of_the_checkpoint() {
        assert!(LinkSettings::default().is_empty());
        assert_eq!(
            serde_json::to_value(LinkSettings::default()).unwrap(),
            serde_json::json!({})
        );
    }
}
