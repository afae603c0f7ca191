//! The socket against the kernel (lookups of the process's own links: no privilege needed),
//! and the framing and reading of answers against datagrams built here.

use super::*;
use netlink_packet_route::link::{LinkAttribute, LinkMessage};

fn get_link(name: &str) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut m = LinkMessage::default();
    m.attributes.push(LinkAttribute::IfName(name.to_owned()));
    NetlinkMessage::from(RouteNetlinkMessage::GetLink(m))
}

/// Answers come back per request, in one send, the failed one with its errno, the later
/// one still answered. Reads only the process's own links: no privilege needed.
#[test]
fn pipelined_requests_answer_each() {
    let mut wire = Wire::open().unwrap();
    let answers = wire
        .requests(vec![
            get_link("lo"),
            get_link("knt-absent0"),
            get_link("lo"),
        ])
        .unwrap();
    assert_eq!(answers.len(), 3);
    let index = |a: &Result<Vec<RouteNetlinkMessage>, Refusal>| match a {
        Ok(replies) => replies.iter().find_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => Some(l.header.index),
            _ => None,
        }),
        Err(_) => None,
    };
    assert_eq!(index(&answers[0]), Some(1));
    let Err(refused) = &answers[1] else {
        panic!("knt-absent0 found: {:?}", answers[1]);
    };
    assert_eq!(refused.errno, 19, "ENODEV");
    assert_eq!(index(&answers[2]), Some(1));
}

/// A dump is read to its end; the socket is usable after it.
#[test]
fn dump_then_request() {
    let mut wire = Wire::open().unwrap();
    let links = wire
        .dump(NetlinkMessage::from(RouteNetlinkMessage::GetLink(
            LinkMessage::default(),
        )))
        .unwrap();
    assert!(
        links
            .iter()
            .any(|m| matches!(m, RouteNetlinkMessage::NewLink(l) if l.header.index == 1))
    );
    assert!(!wire.request(get_link("lo")).unwrap().is_empty());
}

/// The kernel's extended-ack text is kept with the errno.
#[test]
fn refusal_reads_the_kernels_message() {
    let mut rest = vec![0u8; 16];
    let text = b"MTU greater than device maximum\0";
    let len = u16::try_from(4 + text.len()).unwrap();
    rest.extend_from_slice(&len.to_ne_bytes());
    rest.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
    rest.extend_from_slice(text);
    let r = refusal(-22, &rest, NLM_F_CAPPED | NLM_F_ACK_TLVS);
    assert_eq!(r.errno, 22);
    assert_eq!(
        r.message.as_deref(),
        Some("MTU greater than device maximum")
    );
    assert!(
        r.to_io().to_string().contains("Invalid argument"),
        "{}",
        r.to_io()
    );
}

/// More requests than one `sendmsg` carries: all answered, in order, and the socket is in
/// step after.
#[test]
fn many_requests_are_sent_in_batches() {
    let mut wire = Wire::open().unwrap();
    let n = BATCH * 3 + 5;
    let requests = (0..n)
        .map(|i| get_link(if i % 7 == 3 { "knt-absent0" } else { "lo" }))
        .collect();
    let answers = wire.requests(requests).unwrap();
    assert_eq!(answers.len(), n);
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a.is_err(), i % 7 == 3, "answer {i}: {a:?}");
    }
    assert!(!wire.request(get_link("lo")).unwrap().is_empty());
}

fn flags_of(bytes: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([bytes[at + 6], bytes[at + 7]])
}

/// `NLM_F_EXCL`/`NLM_F_REPLACE` share bits with `NLM_F_DUMP`: a creation keeps them (else
/// the kernel would add a second route beside an existing one, or replace a host link),
/// a lookup loses the dump bits.
#[test]
fn framing_keeps_creation_flags_and_strips_dump_from_lookups() {
    use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
    use netlink_packet_route::route::RouteMessage;
    let mut create = NetlinkMessage::from(RouteNetlinkMessage::NewRoute(RouteMessage::default()));
    create.header.flags = NLM_F_CREATE | NLM_F_EXCL;
    let mut replace = NetlinkMessage::from(RouteNetlinkMessage::NewLink(LinkMessage::default()));
    replace.header.flags = NLM_F_REPLACE;
    let mut lookup = get_link("lo");
    lookup.header.flags = NLM_F_DUMP;
    let (bytes, last) = frame(vec![create, replace, lookup], 41);
    assert_eq!(last, 44);
    let mut at = 0;
    let mut seen = Vec::new();
    while at < bytes.len() {
        let len = u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let seq = u32::from_ne_bytes(bytes[at + 8..at + 12].try_into().unwrap());
        seen.push((seq, flags_of(&bytes, at)));
        at += (len + 3) & !3;
    }
    assert_eq!(
        seen,
        vec![
            (42, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL),
            (43, NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE),
            (44, NLM_F_REQUEST | NLM_F_ACK),
        ]
    );
}

/// One message that cannot be decoded is reported as such; the others around it are
/// still read (so their requests are answered and the socket stays in step).
#[test]
fn an_undecodable_message_does_not_hide_the_others() {
    let ack = |seq: u32| {
        let mut m = vec![0u8; 36];
        m[0..4].copy_from_slice(&36u32.to_ne_bytes());
        m[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m[6..8].copy_from_slice(&NLM_F_CAPPED.to_ne_bytes());
        m[8..12].copy_from_slice(&seq.to_ne_bytes());
        m
    };
    // RTM_NEWLINK with 4 bytes where its 16-byte ifinfomsg belongs.
    let mut odd = vec![0u8; 20];
    odd[0..4].copy_from_slice(&20u32.to_ne_bytes());
    odd[4..6].copy_from_slice(&16u16.to_ne_bytes());
    odd[8..12].copy_from_slice(&2u32.to_ne_bytes());
    let datagram = [ack(1), odd, ack(2)].concat();
    let parsed = parse(&datagram).unwrap();
    assert_eq!(parsed.len(), 3);
    assert!(parsed[0].message.is_ok());
    let err = parsed[1].message.as_ref().unwrap_err().to_string();
    assert!(err.contains("undecodable netlink answer"), "{err}");
    assert_eq!((parsed[1].sequence, parsed[1].kind), (2, 16));
    assert!(parsed[2].message.is_ok());
    assert_eq!(parsed[2].sequence, 2);
}

/// Without `NLM_F_CAPPED` the error carries the whole request before the attributes;
/// without `NLM_F_ACK_TLVS` there are none to read.
#[test]
fn refusal_skips_an_uncapped_request() {
    let mut rest = vec![0u8; 24];
    rest[0..4].copy_from_slice(&22u32.to_ne_bytes()); // 22, padded to 24
    let text = b"Invalid prefix\0";
    let len = u16::try_from(4 + text.len()).unwrap();
    rest.extend_from_slice(&len.to_ne_bytes());
    rest.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
    rest.extend_from_slice(text);
    let r = refusal(-22, &rest, NLM_F_ACK_TLVS);
    assert_eq!(r.message.as_deref(), Some("Invalid prefix"));
    assert_eq!(refusal(-22, &rest, 0).message, None);
}

/// After a failed exchange the socket refuses further ones instead of handing their
/// caller the failed one's late answers.
#[test]
fn a_socket_out_of_step_refuses_further_exchanges() {
    let mut wire = Wire::open().unwrap();
    wire.out_of_step = true;
    let e = wire
        .request(get_link("lo"))
        .unwrap_err()
        .into_io()
        .to_string();
    assert!(e.contains("out of step"), "{e}");
    let e = wire
        .dump(NetlinkMessage::from(RouteNetlinkMessage::GetLink(
            LinkMessage::default(),
        )))
        .unwrap_err()
        .into_io()
        .to_string();
    assert!(e.contains("out of step"), "{e}");
}

/// `message` as the kernel would send it in answer to request `sequence`.
fn answer(mut message: NetlinkMessage<RouteNetlinkMessage>, sequence: u32, flags: u16) -> Vec<u8> {
    message.header.sequence_number = sequence;
    message.header.flags = flags;
    message.finalize();
    let mut bytes = vec![0; message.buffer_len()];
    message.serialize(&mut bytes);
    bytes
}

fn link(sequence: u32, flags: u16) -> Vec<u8> {
    let mut l = LinkMessage::default();
    l.header.index = 7;
    answer(
        NetlinkMessage::from(RouteNetlinkMessage::NewLink(l)),
        sequence,
        flags,
    )
}

fn done(sequence: u32, code: i32, extended_ack: Vec<u8>) -> Vec<u8> {
    let mut d = netlink_packet_core::DoneMessage::default();
    d.code = code;
    d.extended_ack = extended_ack;
    let mut m = NetlinkMessage::new(
        netlink_packet_core::NetlinkHeader::default(),
        NetlinkPayload::<RouteNetlinkMessage>::Done(d),
    );
    m.finalize();
    answer(m, sequence, netlink_packet_core::NLM_F_MULTIPART)
}

/// A dump read over several datagrams: other requests' answers skipped, its replies kept
/// until the end-of-dump.
#[test]
fn a_dump_ends_at_its_done() {
    const MULTI: u16 = netlink_packet_core::NLM_F_MULTIPART;
    let mut read = DumpRead::default();
    let first = [link(9, MULTI), link(4, MULTI)].concat();
    assert!(!read.take(parse(&first).unwrap(), 9));
    let second = [link(9, MULTI), done(9, 0, Vec::new())].concat();
    assert!(read.take(parse(&second).unwrap(), 9));
    let Ok(Dumped::Whole(links)) = read.outcome() else {
        panic!("not a whole dump");
    };
    assert_eq!(links.len(), 2);
}

/// A table that changed while it was dumped is read again, not taken as it came.
#[test]
fn an_interrupted_dump_is_marked() {
    const MULTI: u16 = netlink_packet_core::NLM_F_MULTIPART;
    let mut read = DumpRead::default();
    let datagram = [link(3, MULTI | NLM_F_DUMP_INTR), done(3, 0, Vec::new())].concat();
    assert!(read.take(parse(&datagram).unwrap(), 3));
    assert!(matches!(read.outcome(), Ok(Dumped::Interrupted)));
}

/// A dump the kernel ends with a negative code failed, with the kernel's text; its
/// replies until then are not taken for the whole table.
#[test]
fn a_dump_ended_with_an_error_code_is_refused() {
    const MULTI: u16 = netlink_packet_core::NLM_F_MULTIPART;
    let text = b"dump failed\0";
    let mut tlv = u16::try_from(4 + text.len())
        .unwrap()
        .to_ne_bytes()
        .to_vec();
    tlv.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
    tlv.extend_from_slice(text);
    let mut read = DumpRead::default();
    let datagram = [link(5, MULTI), done(5, -16, tlv)].concat();
    assert!(read.take(parse(&datagram).unwrap(), 5));
    match read.outcome() {
        Err(Failure::Refused(r)) => {
            assert_eq!(r.errno, 16);
            assert_eq!(r.message.as_deref(), Some("dump failed"));
        }
        Err(Failure::Io(e)) => panic!("{e}"),
        Ok(_) => panic!("a failed dump was taken as whole"),
    }
}
