//! Per-interface settings of issue 27 that ride on the pod's link itself: static neighbors
//! (permanent ARP/NDP entries) and the GSO/GRO maximum sizes (Big TCP).
//!
//! Neighbors need no undo record: the kernel flushes a device's neighbor entries when it leaves
//! a namespace (`neigh_ifdown` on unregister, including permanent ones) and when it is deleted,
//! so a detach while the pod lives (moved back, or child deleted) removes what knic added, and
//! a pod that dies takes them along. A resumed attach re-adds them with replace semantics.

use std::net::IpAddr;

use knic_proto::netconfig::Neighbor;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage,
};
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
}

impl LinkSettings {
    /// Nothing to do (what a plan without the fields holds).
    pub fn is_empty(&self) -> bool {
        self.neighbors.is_empty()
    }
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
    fn settings_without_fields_are_left_out_of_the_checkpoint() {
        assert!(LinkSettings::default().is_empty());
        assert_eq!(
            serde_json::to_value(LinkSettings::default()).unwrap(),
            serde_json::json!({})
        );
    }
}
