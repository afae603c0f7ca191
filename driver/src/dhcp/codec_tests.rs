use std::net::Ipv4Addr;

use super::*;

const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x10];

/// A server's reply as raw bytes: header fields by hand, then `options` verbatim.
fn reply(yiaddr: [u8; 4], options: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 236];
    b[0] = BOOTREPLY;
    b[1] = 1;
    b[2] = 6;
    b[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    b[16..20].copy_from_slice(&yiaddr);
    b[28..34].copy_from_slice(&MAC);
    b.extend_from_slice(&[99, 130, 83, 99]);
    b.extend_from_slice(options);
    b
}

#[test]
fn discover_bytes_are_rfc_2131() {
    let m = Message {
        flags: FLAG_BROADCAST,
        ..Message::request(MessageType::Discover, 0xdead_beef, MAC)
    }
    .with(opt::PARAMETER_REQUEST, vec![1, 3, 26]);
    let b = m.encode();
    assert_eq!(b.len(), 300, "padded to the BOOTP minimum");
    assert_eq!(&b[0..4], &[1, 1, 6, 0]);
    assert_eq!(&b[4..8], &[0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(&b[10..12], &[0x80, 0x00], "broadcast flag");
    assert_eq!(&b[28..34], &MAC);
    assert!(b[34..236].iter().all(|&x| x == 0));
    assert_eq!(&b[236..240], &[99, 130, 83, 99]);
    assert_eq!(&b[240..249], &[53, 1, 1, 55, 3, 1, 3, 26, 255]);
    assert_eq!(Message::decode(&b).unwrap(), m);
}

#[test]
fn ack_options_read_back() {
    let b = reply(
        [10, 77, 0, 59],
        &[
            53, 1, 5, 54, 4, 10, 77, 0, 1, 51, 4, 0, 0, 0, 120, 58, 4, 0, 0, 0, 60, 59, 4, 0, 0, 0,
            105, 1, 4, 255, 255, 255, 0, 3, 8, 10, 77, 0, 1, 10, 77, 0, 2, 26, 2, 5, 220, 0, 0,
            255,
        ],
    );
    let m = Message::decode(&b).unwrap();
    assert_eq!(m.op, BOOTREPLY);
    assert_eq!(m.xid, 0x1234_5678);
    assert_eq!(m.yiaddr, Ipv4Addr::new(10, 77, 0, 59));
    assert_eq!(m.message_type().unwrap(), MessageType::Ack);
    assert_eq!(
        m.addr(opt::SERVER_ID).unwrap(),
        Some(Ipv4Addr::new(10, 77, 0, 1))
    );
    assert_eq!(m.seconds(opt::LEASE_TIME).unwrap(), Some(120));
    assert_eq!(m.seconds(opt::RENEWAL_TIME).unwrap(), Some(60));
    assert_eq!(m.seconds(opt::REBINDING_TIME).unwrap(), Some(105));
    assert_eq!(
        m.addr(opt::SUBNET_MASK).unwrap(),
        Some(Ipv4Addr::new(255, 255, 255, 0))
    );
    assert_eq!(m.router().unwrap(), Some(Ipv4Addr::new(10, 77, 0, 1)));
    assert_eq!(m.mtu().unwrap(), Some(1500));
}

#[test]
fn nak_message_is_printable_and_bounded() {
    let mut opts = vec![53, 1, 6, 56, 200];
    opts.extend(std::iter::repeat_n(b'x', 198));
    opts.extend([b'\n', 7, 255]);
    let m = Message::decode(&reply([0; 4], &opts)).unwrap();
    assert_eq!(m.message_type().unwrap(), MessageType::Nak);
    let text = m.server_message().unwrap();
    assert_eq!(text.len(), 120);
    assert!(text.chars().all(|c| c == 'x'));
}

#[test]
fn malformed_replies_are_refused_with_reasons() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            vec![2; 100],
            "100 bytes is too short for a DHCP message (at least 240)",
        ),
        (
            reply([0; 4], &vec![0; 1300]),
            "1540 bytes is longer than the 1472 bytes knic reads",
        ),
        (
            {
                let mut b = reply([0; 4], &[255]);
                b[236] = 1;
                b
            },
            "no DHCP magic cookie (found [1, 130, 83, 99])",
        ),
        (
            {
                let mut b = reply([0; 4], &[255]);
                b[2] = 16;
                b
            },
            "hardware type 1 length 16 is not Ethernet (1, 6)",
        ),
        (
            reply([0; 4], &[53, 1, 2, 54, 9, 1, 2]),
            "option 54 at byte 243 claims 9 bytes but only 2 remain",
        ),
        (
            reply([0; 4], &[53, 1, 2, 54]),
            "option 54 at byte 243 claims 1 bytes but only 0 remain",
        ),
        (
            reply([0; 4], &[53, 1, 2]),
            "options do not end with option 255",
        ),
    ];
    for (bytes, want) in cases {
        assert_eq!(Message::decode(&bytes).unwrap_err().to_string(), want);
    }
}

#[test]
fn wrong_option_sizes_are_refused() {
    let m = Message::decode(&reply(
        [0; 4],
        &[
            53, 1, 9, 54, 3, 1, 2, 3, 51, 2, 0, 1, 3, 5, 1, 2, 3, 4, 5, 26, 1, 5, 255,
        ],
    ))
    .unwrap();
    assert_eq!(
        m.message_type().unwrap_err().to_string(),
        "message type (option 53) missing or unknown"
    );
    assert_eq!(
        m.addr(opt::SERVER_ID).unwrap_err().to_string(),
        "option 54 has 3 bytes; expected 4"
    );
    assert_eq!(
        m.seconds(opt::LEASE_TIME).unwrap_err().to_string(),
        "option 51 has 2 bytes; expected 4"
    );
    assert_eq!(
        m.router().unwrap_err().to_string(),
        "option 3 has 5 bytes; expected a multiple of 4"
    );
    assert_eq!(
        m.mtu().unwrap_err().to_string(),
        "option 26 has 1 bytes; expected 2"
    );
}

#[test]
fn pads_are_skipped_and_long_values_split() {
    let m = Message::decode(&reply([0; 4], &[0, 0, 53, 1, 2, 0, 255])).unwrap();
    assert_eq!(m.message_type().unwrap(), MessageType::Offer);
    let long = Message::request(MessageType::Discover, 1, MAC).with(opt::CLIENT_ID, vec![7; 300]);
    let b = long.encode();
    assert_eq!(&b[243..245], &[61, 255]);
    assert_eq!(&b[500..502], &[61, 45]);
}

/// Arbitrary bytes never panic the decoder (a cheap fuzz over every truncation and every
/// single-byte corruption of a real ACK).
#[test]
fn decoding_garbage_never_panics() {
    let ack = reply(
        [10, 77, 0, 59],
        &[53, 1, 5, 54, 4, 10, 77, 0, 1, 51, 4, 0, 0, 0, 120, 255],
    );
    for n in 0..ack.len() {
        let _ = Message::decode(&ack[..n]);
    }
    for i in 0..ack.len() {
        for v in [0u8, 1, 4, 53, 255] {
            let mut b = ack.clone();
            b[i] = v;
            if let Ok(m) = Message::decode(&b) {
                let _ = (m.message_type(), m.router(), m.mtu(), m.server_message());
            }
        }
    }
}
