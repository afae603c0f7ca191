//! The bytes of the rule and VRF requests, read back with a walker of our own (not the
//! crate's parser), against the kernel's UAPI numbers (`linux/fib_rules.h`,
//! `linux/if_link.h`, `linux/rtnetlink.h`).

use knic_proto::netconfig::Cidr;
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage};
use netlink_packet_route::RouteNetlinkMessage;

use super::super::super::routing::{Family, Rule, Vrf, describe};
use super::*;

const RTM_NEWLINK: u16 = 16;
const RTM_SETLINK: u16 = 19;
const RTM_NEWRULE: u16 = 32;
const RTM_DELRULE: u16 = 33;
const FR_ACT_TO_TBL: u8 = 1;
const FRA_DST: u16 = 1;
const FRA_SRC: u16 = 2;
const FRA_IIFNAME: u16 = 3;
const FRA_PRIORITY: u16 = 6;
const FRA_FWMARK: u16 = 10;
const FRA_TABLE: u16 = 15;
const FRA_FWMASK: u16 = 16;
const FRA_OIFNAME: u16 = 17;
const IFLA_IFNAME: u16 = 3;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const IFLA_VRF_TABLE: u16 = 1;
const IFF_UP: u32 = 1;

/// The request as sent: (type, flags, payload after the 16-byte header).
fn bytes(message: RouteNetlinkMessage, flags: u16) -> (u16, u16, Vec<u8>) {
    let mut request = NetlinkMessage::from(message);
    request.header.flags = flags;
    request.finalize();
    let mut out = vec![0u8; request.buffer_len()];
    request.serialize(&mut out);
    let len = u32::from_ne_bytes(out[0..4].try_into().expect("len")) as usize;
    assert_eq!(len, out.len(), "nlmsg_len covers the message");
    let kind = u16::from_ne_bytes(out[4..6].try_into().expect("type"));
    let flags = u16::from_ne_bytes(out[6..8].try_into().expect("flags"));
    (kind, flags, out[16..].to_vec())
}

/// Attributes as (type without the nested/byte-order bits, value), aligned to 4 bytes.
fn attributes(mut data: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    while data.len() >= 4 {
        let len = u16::from_ne_bytes([data[0], data[1]]) as usize;
        let kind = u16::from_ne_bytes([data[2], data[3]]) & 0x3fff;
        assert!(len >= 4 && len <= data.len(), "attribute length {len}");
        out.push((kind, data[4..len].to_vec()));
        let aligned = (len + 3) & !3;
        data = &data[aligned.min(data.len())..];
    }
    out
}

fn value(attrs: &[(u16, Vec<u8>)], kind: u16) -> Vec<u8> {
    attrs
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no attribute {kind} in {attrs:?}"))
}

fn u32_of(v: &[u8]) -> u32 {
    u32::from_ne_bytes(v.try_into().expect("4 bytes"))
}

fn cidr(text: &str) -> Cidr {
    text.parse().expect("CIDR")
}

fn rule() -> Rule {
    Rule {
        family: Family::Ipv4,
        from: Some(cidr("192.0.2.10/32")),
        to: Some(cidr("198.51.100.0/24")),
        iif: Some("lo".into()),
        oif: Some("data0".into()),
        fwmark: Some(0x10),
        fwmask: Some(0xff),
        table: 100,
        priority: 10000,
    }
}

#[test]
fn a_rule_is_a_newrule_with_every_selector_and_its_table() {
    let (kind, flags, payload) = bytes(
        RouteNetlinkMessage::NewRule(rule_message(&rule())),
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE,
    );
    assert_eq!(kind, RTM_NEWRULE);
    // NLM_F_EXCL makes the kernel compare with the rules there: an identical one is EEXIST
    // (which the add treats as done), not a duplicate.
    assert_eq!(flags, 0x1 | 0x4 | 0x200 | 0x400);
    // struct fib_rule_hdr: family, dst_len, src_len, tos, table, res1, res2, action, flags.
    assert_eq!(&payload[..8], &[2, 24, 32, 0, 100, 0, 0, FR_ACT_TO_TBL]);
    assert_eq!(u32_of(&payload[8..12]), 0);
    let attrs = attributes(&payload[12..]);
    assert_eq!(u32_of(&value(&attrs, FRA_PRIORITY)), 10000);
    assert_eq!(value(&attrs, FRA_SRC), vec![192, 0, 2, 10]);
    assert_eq!(value(&attrs, FRA_DST), vec![198, 51, 100, 0]);
    assert_eq!(value(&attrs, FRA_IIFNAME), b"lo\0".to_vec());
    assert_eq!(value(&attrs, FRA_OIFNAME), b"data0\0".to_vec());
    assert_eq!(u32_of(&value(&attrs, FRA_FWMARK)), 0x10);
    assert_eq!(u32_of(&value(&attrs, FRA_FWMASK)), 0xff);
    assert_eq!(u32_of(&value(&attrs, FRA_TABLE)), 100);
    assert_eq!(attrs.len(), 8, "nothing else: {attrs:?}");
}

#[test]
fn a_big_table_is_only_in_fra_table_and_an_ipv6_rule_has_af_inet6() {
    let rule = Rule {
        family: Family::Ipv6,
        from: None,
        to: Some(cidr("2001:db8::/32")),
        iif: None,
        oif: None,
        fwmark: None,
        fwmask: None,
        table: 100_000,
        priority: 7,
    };
    let (kind, _, payload) = bytes(RouteNetlinkMessage::NewRule(rule_message(&rule)), 0);
    assert_eq!(kind, RTM_NEWRULE);
    assert_eq!(&payload[..8], &[10, 32, 0, 0, 0, 0, 0, FR_ACT_TO_TBL]);
    let attrs = attributes(&payload[12..]);
    assert_eq!(u32_of(&value(&attrs, FRA_TABLE)), 100_000);
    let mut dst = vec![0x20, 0x01, 0x0d, 0xb8];
    dst.extend([0; 12]);
    assert_eq!(value(&attrs, FRA_DST), dst);
    assert_eq!(attrs.len(), 3, "priority, dst, table: {attrs:?}");
}

#[test]
fn a_delete_carries_the_same_selectors_as_the_add() {
    let (add_kind, _, add) = bytes(RouteNetlinkMessage::NewRule(rule_message(&rule())), 0);
    let (del_kind, _, del) = bytes(RouteNetlinkMessage::DelRule(rule_message(&rule())), 0);
    assert_eq!((add_kind, del_kind), (RTM_NEWRULE, RTM_DELRULE));
    assert_eq!(
        add, del,
        "the kernel deletes the rule matching every attribute given"
    );
}

#[test]
fn a_vrf_is_created_up_with_its_table() {
    let vrf = Vrf {
        name: "blue".into(),
        table: 10,
    };
    let (kind, _, payload) = bytes(RouteNetlinkMessage::NewLink(vrf_message(&vrf)), 0);
    assert_eq!(kind, RTM_NEWLINK);
    // struct ifinfomsg: family, pad, type, index, flags, change.
    assert_eq!(u32_of(&payload[4..8]), 0, "a new link: no index");
    assert_eq!(u32_of(&payload[8..12]) & IFF_UP, IFF_UP);
    assert_eq!(u32_of(&payload[12..16]) & IFF_UP, IFF_UP);
    let attrs = attributes(&payload[16..]);
    assert_eq!(value(&attrs, IFLA_IFNAME), b"blue\0".to_vec());
    let info = attributes(&value(&attrs, IFLA_LINKINFO));
    // NUL-terminated, as iproute2 sends it (the kernel compares with nla_strcmp).
    assert_eq!(value(&info, IFLA_INFO_KIND), b"vrf\0".to_vec());
    let data = attributes(&value(&info, IFLA_INFO_DATA));
    assert_eq!(u32_of(&value(&data, IFLA_VRF_TABLE)), 10);
}

#[test]
fn enslaving_sets_ifla_master_on_the_member() {
    let (kind, _, payload) = bytes(RouteNetlinkMessage::SetLink(master_message(7, 12)), 0);
    assert_eq!(kind, RTM_SETLINK);
    assert_eq!(u32_of(&payload[4..8]), 7, "the member's index");
    let attrs = attributes(&payload[16..]);
    assert_eq!(u32_of(&value(&attrs, IFLA_MASTER)), 12);
}

#[test]
fn a_rule_reads_like_ip_rule_in_errors() {
    assert_eq!(
        describe(&rule()),
        "-4 rule priority 10000 from 192.0.2.10/32 to 198.51.100.0/24 iif lo oif data0 fwmark 0x10/0xff lookup 100"
    );
}
