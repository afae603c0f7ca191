//! The VF messages at the byte level (this kernel has no SR-IOV: this is the only place the
//! requests can be checked), and the pure request/restore arithmetic.

use knic_proto::netconfig::{VfLinkState, VfSettings, VfVlanProtocol};
use netlink_packet_core::{Emitable, NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    self, LinkAttribute, LinkExtentMask, LinkMessage, LinkVfInfo, VfInfo, VfInfoLinkState,
    VfInfoMac, VfInfoRate, VfInfoSpoofCheck, VfInfoTrust, VfInfoVlan, VfVlan, VfVlanInfo,
    VlanProtocol,
};

use super::*;

const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const IFLA_VFINFO_LIST: u16 = 22;
const IFLA_VF_INFO: u16 = 1;
const IFLA_VF_MAC: u16 = 1;
const IFLA_EXT_MASK: u16 = 29;
const PF_INDEX: u32 = 7;

/// The bytes the kernel would receive.
fn wire(mut message: NetlinkMessage<RouteNetlinkMessage>) -> Vec<u8> {
    message.finalize();
    let mut buf = vec![0u8; message.buffer_len()];
    message.emit(&mut buf);
    buf
}

/// `bytes` parsed back the way a receiver would, split into header fields and link message.
fn parsed(bytes: &[u8]) -> (u16, u16, LinkMessage) {
    let message =
        NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes).expect("parses as rtnetlink");
    let (kind, flags) = (message.header.message_type, message.header.flags);
    let link = match message.payload {
        netlink_packet_core::NetlinkPayload::InnerMessage(
            RouteNetlinkMessage::SetLink(link) | RouteNetlinkMessage::GetLink(link),
        ) => link,
        other => panic!("not a link message: {other:?}"),
    };
    (kind, flags, link)
}

/// The attributes of the one `IFLA_VF_INFO` of a set request.
fn vf_infos(link: &LinkMessage) -> Vec<VfInfo> {
    match link.attributes.as_slice() {
        [LinkAttribute::VfInfoList(list)] => match list.as_slice() {
            [LinkVfInfo(infos)] => infos.clone(),
            other => panic!("expected one IFLA_VF_INFO, got {other:?}"),
        },
        other => panic!("expected only IFLA_VFINFO_LIST, got {other:?}"),
    }
}

fn set(vf: u32, state: &VfState) -> (u16, u16, LinkMessage) {
    parsed(&wire(set_message(PF_INDEX, vf, state)))
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

#[test]
fn a_mac_request_is_rtm_setlink_on_the_pf_with_one_vf_info_nest() {
    let state = VfState {
        mac: Some([0x02, 0, 0, 0, 0, 0x33]),
        ..VfState::default()
    };
    let bytes = wire(set_message(PF_INDEX, 3, &state));
    // Read raw, independent of the crate's parser: nlmsghdr (16) + ifinfomsg (16), then
    // IFLA_VFINFO_LIST ⊃ IFLA_VF_INFO ⊃ IFLA_VF_MAC {u32 vf; u8 mac[32]}.
    assert_eq!(u16_at(&bytes, 4), RTM_SETLINK);
    assert_eq!(u16_at(&bytes, 6), NLM_F_REQUEST | NLM_F_ACK);
    assert_eq!(u32_at(&bytes, 16 + 4), PF_INDEX, "ifi_index is the PF");
    assert_eq!(u16_at(&bytes, 32 + 2), IFLA_VFINFO_LIST);
    assert_eq!(u16_at(&bytes, 36 + 2), IFLA_VF_INFO);
    assert_eq!(u16_at(&bytes, 40 + 2), IFLA_VF_MAC);
    assert_eq!(u32_at(&bytes, 44), 3, "the VF index");
    assert_eq!(&bytes[48..54], &[0x02, 0, 0, 0, 0, 0x33]);
    assert_eq!(u32_at(&bytes, 0) as usize, bytes.len(), "nlmsg_len");

    let (kind, flags, link) = parsed(&bytes);
    assert_eq!((kind, flags), (RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK));
    assert_eq!(link.header.index, PF_INDEX);
    assert_eq!(
        vf_infos(&link),
        [VfInfo::Mac(VfInfoMac::new(3, &[0x02, 0, 0, 0, 0, 0x33]))]
    );
}

#[test]
fn an_802_1q_vlan_goes_as_ifla_vf_vlan_with_its_priority() {
    let state = VfState {
        vlan: Some(VfVlanTag {
            id: 100,
            qos: 5,
            protocol: VfVlanProtocol::Dot1Q,
        }),
        ..VfState::default()
    };
    let (_, _, link) = set(2, &state);
    assert_eq!(vf_infos(&link), [VfInfo::Vlan(VfInfoVlan::new(2, 100, 5))]);
}

#[test]
fn an_802_1ad_vlan_goes_as_a_vlan_list_with_the_ethertype_big_endian() {
    let state = VfState {
        vlan: Some(VfVlanTag {
            id: 300,
            qos: 1,
            protocol: VfVlanProtocol::Dot1Ad,
        }),
        ..VfState::default()
    };
    let bytes = wire(set_message(PF_INDEX, 4, &state));
    // struct ifla_vf_vlan_info { u32 vf; u32 vlan; u32 qos; __be16 vlan_proto; }
    let mut info = Vec::new();
    info.extend_from_slice(&4u32.to_ne_bytes());
    info.extend_from_slice(&300u32.to_ne_bytes());
    info.extend_from_slice(&1u32.to_ne_bytes());
    info.extend_from_slice(&[0x88, 0xa8]);
    assert!(
        bytes.windows(info.len()).any(|w| w == info.as_slice()),
        "IFLA_VF_VLAN_INFO payload not found in {bytes:02x?}"
    );
    let (_, _, link) = set(4, &state);
    assert_eq!(
        vf_infos(&link),
        [VfInfo::VlanList(vec![VfVlan::Info(VfVlanInfo::new(
            4,
            300,
            1,
            VlanProtocol::Ieee8021Ad
        ))])]
    );
}

#[test]
fn rates_spoofchk_trust_and_link_state_each_have_their_attribute() {
    let state = VfState {
        rate: Some((1000, 25000)),
        spoof_chk: Some(false),
        trust: Some(true),
        link_state: Some(VfLinkState::Disable),
        ..VfState::default()
    };
    let (_, _, link) = set(5, &state);
    assert_eq!(
        vf_infos(&link),
        [
            VfInfo::Rate(VfInfoRate::new(5, 1000, 25000)),
            VfInfo::SpoofCheck(VfInfoSpoofCheck::new(5, false)),
            VfInfo::Trust(VfInfoTrust::new(5, true)),
            VfInfo::LinkState(VfInfoLinkState::new(5, link::VfLinkState::Disable)),
        ]
    );
    for (ours, theirs) in [
        (VfLinkState::Auto, link::VfLinkState::Auto),
        (VfLinkState::Enable, link::VfLinkState::Enable),
    ] {
        let state = VfState {
            link_state: Some(ours),
            ..VfState::default()
        };
        assert_eq!(
            vf_infos(&set(0, &state).2),
            [VfInfo::LinkState(VfInfoLinkState::new(0, theirs))]
        );
    }
    let both = VfState {
        spoof_chk: Some(true),
        trust: Some(false),
        ..VfState::default()
    };
    assert_eq!(
        vf_infos(&set(0, &both).2),
        [
            VfInfo::SpoofCheck(VfInfoSpoofCheck::new(0, true)),
            VfInfo::Trust(VfInfoTrust::new(0, false)),
        ]
    );
}

#[test]
fn every_setting_at_once_goes_in_one_message_in_kernel_order() {
    let state = VfState {
        mac: Some([0x02, 0, 0, 0, 0, 1]),
        vlan: Some(VfVlanTag {
            id: 10,
            qos: 0,
            protocol: VfVlanProtocol::Dot1Q,
        }),
        rate: Some((0, 500)),
        spoof_chk: Some(true),
        trust: Some(false),
        link_state: Some(VfLinkState::Auto),
    };
    let (kind, _, link) = set(9, &state);
    assert_eq!(kind, RTM_SETLINK);
    let kinds: Vec<&str> = vf_infos(&link)
        .iter()
        .map(|i| match i {
            VfInfo::Mac(m) if m.vf_id == 9 => "mac",
            VfInfo::Vlan(v) if v.vf_id == 9 => "vlan",
            VfInfo::Rate(r) if r.vf_id == 9 => "rate",
            VfInfo::SpoofCheck(s) if s.vf_id == 9 => "spoofchk",
            VfInfo::Trust(t) if t.vf_id == 9 => "trust",
            VfInfo::LinkState(l) if l.vf_id == 9 => "link_state",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        ["mac", "vlan", "rate", "spoofchk", "trust", "link_state"]
    );
}

#[test]
fn the_state_read_asks_the_pf_for_its_vf_table() {
    let bytes = wire(get_message(PF_INDEX));
    assert_eq!(u16_at(&bytes, 4), RTM_GETLINK);
    assert_eq!(u16_at(&bytes, 6), NLM_F_REQUEST, "one link, not a dump");
    assert_eq!(u32_at(&bytes, 16 + 4), PF_INDEX);
    assert_eq!(u16_at(&bytes, 32 + 2), IFLA_EXT_MASK);
    assert_eq!(
        u32_at(&bytes, 36),
        1 | 8,
        "RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS"
    );
    let (kind, _, link) = parsed(&bytes);
    assert_eq!(kind, RTM_GETLINK);
    assert_eq!(
        link.attributes,
        [LinkAttribute::ExtMask(vec![
            LinkExtentMask::Vf,
            LinkExtentMask::SkipStats
        ])]
    );
}

/// A PF's reply with VF 0 (plain VLAN) and VF 1 (802.1ad through the VLAN list), as bytes.
fn pf_reply() -> LinkMessage {
    let vf = |index: u32, mac: u8, vlan: Vec<VfInfo>| {
        let mut infos = vec![VfInfo::Mac(VfInfoMac::new(index, &[0x02, 0, 0, 0, 0, mac]))];
        infos.extend(vlan);
        infos.extend([
            VfInfo::Rate(VfInfoRate::new(index, 10, 20 + index)),
            VfInfo::SpoofCheck(VfInfoSpoofCheck::new(index, index == 0)),
            VfInfo::Trust(VfInfoTrust::new(index, index == 1)),
            VfInfo::LinkState(VfInfoLinkState::new(index, link::VfLinkState::Enable)),
        ]);
        LinkVfInfo(infos)
    };
    let mut reply = LinkMessage::default();
    reply.header.index = PF_INDEX;
    reply.attributes.push(LinkAttribute::VfInfoList(vec![
        vf(0, 0xa0, vec![VfInfo::Vlan(VfInfoVlan::new(0, 0, 0))]),
        vf(
            1,
            0xa1,
            vec![
                VfInfo::Vlan(VfInfoVlan::new(1, 300, 2)),
                VfInfo::VlanList(vec![VfVlan::Info(VfVlanInfo::new(
                    1,
                    300,
                    2,
                    VlanProtocol::Ieee8021Ad,
                ))]),
            ],
        ),
    ]));
    let bytes = wire(NetlinkMessage::from(RouteNetlinkMessage::NewLink(reply)));
    match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes)
        .expect("parses")
        .payload
    {
        netlink_packet_core::NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) => l,
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_vf_table_reply_yields_the_state_of_the_asked_vf() {
    let reply = pf_reply();
    assert_eq!(
        state_of(&reply, 0),
        Some(VfState {
            mac: Some([0x02, 0, 0, 0, 0, 0xa0]),
            vlan: Some(VfVlanTag {
                id: 0,
                qos: 0,
                protocol: VfVlanProtocol::Dot1Q
            }),
            rate: Some((10, 20)),
            spoof_chk: Some(true),
            trust: Some(false),
            link_state: Some(VfLinkState::Enable),
        })
    );
    let one = state_of(&reply, 1).expect("VF 1");
    assert_eq!(
        one.vlan,
        Some(VfVlanTag {
            id: 300,
            qos: 2,
            protocol: VfVlanProtocol::Dot1Ad
        }),
        "the VLAN list says the ethertype"
    );
    assert_eq!((one.rate, one.trust), (Some((10, 21)), Some(true)));
    assert_eq!(state_of(&reply, 2), None, "no such VF");
    assert_eq!(state_of(&LinkMessage::default(), 0), None, "no VF table");
}

fn current() -> VfState {
    VfState {
        mac: Some([0; 6]),
        vlan: Some(VfVlanTag {
            id: 0,
            qos: 0,
            protocol: VfVlanProtocol::Dot1Q,
        }),
        rate: Some((100, 0)),
        spoof_chk: Some(true),
        trust: Some(false),
        link_state: Some(VfLinkState::Auto),
    }
}

#[test]
fn a_request_sets_only_what_is_asked_and_completes_what_the_kernel_takes_together() {
    let settings = VfSettings {
        vlan: Some(42),
        max_tx_rate: Some(5000),
        ..VfSettings::default()
    };
    let request = request(&settings, &current());
    assert_eq!(
        request,
        VfState {
            vlan: Some(VfVlanTag {
                id: 42,
                qos: 0,
                protocol: VfVlanProtocol::Dot1Q
            }),
            // The guarantee the VF had stays; the kernel sets both rates at once.
            rate: Some((100, 5000)),
            ..VfState::default()
        }
    );
    // What detach puts back: the previous values of exactly those settings.
    assert_eq!(
        previous(&request, &current()),
        VfState {
            vlan: current().vlan,
            rate: Some((100, 0)),
            ..VfState::default()
        }
    );
    // A PF that reports no rates: the other rate is 0 (no guarantee / no cap), and there is
    // nothing to put back for it.
    let unreported = VfState {
        rate: None,
        ..current()
    };
    let only_min = VfSettings {
        min_tx_rate: Some(10),
        ..VfSettings::default()
    };
    let request = super::request(&only_min, &unreported);
    assert_eq!(request.rate, Some((10, 0)));
    assert!(previous(&request, &unreported).is_empty());
    // `vlan: 0` is untagged whatever the protocol setting says.
    let untag = VfSettings {
        vlan: Some(0),
        vlan_protocol: Some(VfVlanProtocol::Dot1Ad),
        ..VfSettings::default()
    };
    assert_eq!(
        super::request(&untag, &current()).vlan,
        Some(VfVlanTag {
            id: 0,
            qos: 0,
            protocol: VfVlanProtocol::Dot1Q
        })
    );
}

#[test]
fn the_request_text_reads_like_ip_link() {
    assert_eq!(
        describe(&current()),
        "mac 00:00:00:00:00:00 vlan 0 qos 0 proto 802.1Q min_tx_rate 100 max_tx_rate 0 \
         spoofchk on trust off state auto"
    );
}

#[test]
fn detach_sets_only_what_differs_from_the_record() {
    let changed = VfState {
        mac: Some([0x02, 0, 0, 0, 0, 1]),
        trust: Some(true),
        ..current()
    };
    assert_eq!(
        differences(&current(), &changed),
        VfState {
            mac: Some([0; 6]),
            trust: Some(false),
            ..VfState::default()
        }
    );
    assert!(differences(&current(), &current()).is_empty());
    // A setting the PF stopped reporting is set again rather than assumed.
    let unreported = VfState {
        link_state: None,
        ..current()
    };
    assert_eq!(
        differences(&current(), &unreported).link_state,
        Some(VfLinkState::Auto)
    );
}
