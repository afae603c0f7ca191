use std::net::{IpAddr, Ipv4Addr};

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{InfoBridge, InfoData, InfoKind, InfoVeth, InfoVxlan};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::neighbour::{NeighbourFlags, NeighbourMessage, NeighbourState};

use super::*;

fn segment() -> Segment {
    Segment::new(
        4242,
        4789,
        IpAddr::V4(Ipv4Addr::new(10, 99, 0, 1)),
        "knt-ul",
        1450,
    )
}

/// Emitted to bytes and parsed back, as the kernel would read it.
pub(crate) fn round_trip(message: RouteNetlinkMessage) -> RouteNetlinkMessage {
    let mut request = NetlinkMessage::from(message);
    request.finalize();
    let mut bytes = vec![0u8; request.buffer_len()];
    request.serialize(&mut bytes);
    match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes)
        .expect("parses")
        .payload
    {
        NetlinkPayload::InnerMessage(m) => m,
        other => panic!("not a route message: {other:?}"),
    }
}

/// A link request as the kernel reads it (also the child messages' tests).
pub(crate) fn link(message: LinkMessage) -> LinkMessage {
    match round_trip(RouteNetlinkMessage::NewLink(message)) {
        RouteNetlinkMessage::NewLink(m) => m,
        other => panic!("not a NewLink: {other:?}"),
    }
}

fn info(message: &LinkMessage) -> Vec<LinkInfo> {
    message
        .attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::LinkInfo(i) => Some(i.clone()),
            _ => None,
        })
        .expect("IFLA_LINKINFO")
}

fn has(message: &LinkMessage, attribute: &LinkAttribute) -> bool {
    message.attributes.contains(attribute)
}

#[test]
fn names_are_fixed_by_the_vni_and_fit_ifnamsiz() {
    assert_eq!(bridge_name(4242), "knb001092");
    assert_eq!(vxlan_name(0xff_ffff), "knxffffff");
    assert!(vxlan_name(0xff_ffff).len() <= 15);
    assert_eq!(segment_vni("knb001092"), Some(4242));
    assert_eq!(segment_vni("knxffffff"), Some(0xff_ffff));
    // Only knic's exact shape: the sweep must never take someone else's link.
    for foreign in [
        "knb00109",
        "knb0010922",
        "knbXYZ123",
        "knb00109A",
        "knh001092",
        "br0",
    ] {
        assert_eq!(segment_vni(foreign), None, "{foreign}");
    }
}

#[test]
fn the_bridge_has_no_stp_nor_snooping_and_the_segment_mtu() {
    let m = link(bridge_message(&segment()));
    assert!(has(&m, &LinkAttribute::IfName("knb001092".into())));
    assert!(has(&m, &LinkAttribute::Mtu(1450)));
    assert!(m.header.flags.contains(LinkFlags::Up));
    let info = info(&m);
    assert!(info.contains(&LinkInfo::Kind(InfoKind::Bridge)));
    let data = info
        .iter()
        .find_map(|i| match i {
            LinkInfo::Data(InfoData::Bridge(d)) => Some(d.clone()),
            _ => None,
        })
        .expect("bridge data");
    assert!(data.contains(&InfoBridge::StpState(
        netlink_packet_route::link::BridgeStpState::Disabled
    )));
    assert!(data.contains(&InfoBridge::MulticastSnooping(false)));
}

#[test]
fn the_vxlan_device_is_bound_to_underlay_and_bridge_without_learning() {
    let m = link(vxlan_message(&segment(), 7, 9));
    assert!(has(&m, &LinkAttribute::IfName("knx001092".into())));
    assert!(has(&m, &LinkAttribute::Controller(9)));
    assert!(has(&m, &LinkAttribute::Mtu(1450)));
    assert!(m.header.flags.contains(LinkFlags::Up));
    let info = info(&m);
    assert!(info.contains(&LinkInfo::Kind(InfoKind::Vxlan)));
    let data = info
        .iter()
        .find_map(|i| match i {
            LinkInfo::Data(InfoData::Vxlan(d)) => Some(d.clone()),
            _ => None,
        })
        .expect("vxlan data");
    for want in [
        InfoVxlan::Id(4242),
        InfoVxlan::Link(7),
        InfoVxlan::Port(4789),
        InfoVxlan::Learning(false),
        InfoVxlan::Local(Ipv4Addr::new(10, 99, 0, 1)),
    ] {
        assert!(data.contains(&want), "{want:?} missing from {data:?}");
    }
}

#[test]
fn the_vxlan_port_is_big_endian_on_the_wire() {
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::NewLink(vxlan_message(
        &segment(),
        7,
        9,
    )));
    request.finalize();
    let mut bytes = vec![0u8; request.buffer_len()];
    request.serialize(&mut bytes);
    // IFLA_VXLAN_PORT (15) is __be16: 4789 = 0x12b5 → bytes 12 b5 after its 4-byte header.
    let needle = [6u8, 0, 15, 0, 0x12, 0xb5];
    assert!(
        bytes.windows(needle.len()).any(|w| w == needle),
        "no big-endian IFLA_VXLAN_PORT in {bytes:02x?}"
    );
}

#[test]
fn the_pod_end_of_the_veth_is_created_in_the_pod_named_and_addressed() {
    let change = LinkChange {
        name: Some("net1".into()),
        mtu: None,
        mac: Some([2, 0x5e, 0x1c, 0x9a, 0x33, 7]),
        up: None,
        ipv4_conf: Vec::new(),
        index: None,
        sizes: Default::default(),
    };
    let m = link(veth_message("knh0a1b2c3d", 9, 42, 1450, &change));
    assert!(has(&m, &LinkAttribute::IfName("knh0a1b2c3d".into())));
    assert!(has(&m, &LinkAttribute::Controller(9)));
    assert!(has(&m, &LinkAttribute::Mtu(1450)));
    assert!(m.header.flags.contains(LinkFlags::Up));
    // The host end stays here: no namespace attribute on it.
    assert!(
        !m.attributes
            .iter()
            .any(|a| matches!(a, LinkAttribute::NetNsFd(_)))
    );
    let info = info(&m);
    assert!(info.contains(&LinkInfo::Kind(InfoKind::Veth)));
    let peer = info
        .iter()
        .find_map(|i| match i {
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(p))) => Some(p.clone()),
            _ => None,
        })
        .expect("VETH_INFO_PEER");
    assert!(has(&peer, &LinkAttribute::IfName("net1".into())));
    assert!(has(&peer, &LinkAttribute::NetNsFd(42)));
    assert!(has(&peer, &LinkAttribute::Mtu(1450)));
    assert!(has(
        &peer,
        &LinkAttribute::Address(vec![2, 0x5e, 0x1c, 0x9a, 0x33, 7])
    ));
    // The pod end comes up after its addresses, as a child does.
    assert!(!peer.header.flags.contains(LinkFlags::Up));
}

fn neighbour(message: NeighbourMessage) -> NeighbourMessage {
    match round_trip(RouteNetlinkMessage::NewNeighbour(message)) {
        RouteNetlinkMessage::NewNeighbour(m) => m,
        other => panic!("not a NewNeighbour: {other:?}"),
    }
}

#[test]
fn fdb_entries_are_permanent_self_entries_of_the_bridge_family_and_read_back() {
    let flood = FdbEntry {
        mac: [0; 6],
        dst: "10.99.0.2".parse().unwrap(),
    };
    let pod = FdbEntry {
        mac: [2, 0x5e, 0x1c, 0x9a, 0x33, 7],
        dst: "fd00::2".parse().unwrap(),
    };
    let m = neighbour(fdb_message(11, &flood));
    assert_eq!(m.header.family, AddressFamily::Bridge);
    assert_eq!(m.header.ifindex, 11);
    assert_eq!(m.header.state, NeighbourState::Permanent);
    assert_eq!(m.header.flags, NeighbourFlags::Own);
    assert!(flood.is_flood() && !pod.is_flood());
    assert_eq!(pod.to_string(), "02:5e:1c:9a:33:07 dst fd00::2");
    // A dump holds other devices' entries and entries without a remote: only ours come back.
    let mut other_device = fdb_message(12, &pod);
    other_device.header.ifindex = 12;
    let mut no_remote = fdb_message(11, &pod);
    no_remote
        .attributes
        .retain(|a| !matches!(a, NeighbourAttribute::Destination(_)));
    let dump = vec![
        neighbour(fdb_message(11, &pod)),
        m,
        neighbour(other_device),
        neighbour(no_remote),
        neighbour(fdb_message(11, &pod)),
    ];
    assert_eq!(fdb_entries(&dump, 11), vec![flood, pod]);
}

#[test]
fn a_link_of_the_segments_name_is_ours_only_when_it_matches() {
    let s = segment();
    let bridge = link(bridge_message(&s));
    let vxlan = link(vxlan_message(&s, 7, 9));
    assert_eq!(foreign_reason(&bridge, &s, false), None);
    assert_eq!(foreign_reason(&vxlan, &s, true), None);
    assert_eq!(
        foreign_reason(&vxlan, &s, false).as_deref(),
        Some("a vxlan link of that name exists")
    );
    assert_eq!(
        foreign_reason(&bridge, &s, true).as_deref(),
        Some("a bridge link of that name exists")
    );
    let other = Segment::new(5, 8472, segment().local, "knt-ul", 1450);
    let theirs = link(vxlan_message(&other, 7, 9));
    assert_eq!(
        foreign_reason(&theirs, &s, true).as_deref(),
        Some("a vxlan link of that name exists with VNI 5 port 8472 local 10.99.0.1")
    );
}
