//! Every ethtool netlink request, byte for byte (x86-64 byte order, as the kernel reads them),
//! the answers' parsing, and a GET against this kernel's `lo` (no privilege needed).

use std::collections::BTreeMap;

use super::*;

const FAMILY: u16 = 0x1a;

/// `nlmsghdr` (request + ack) and `genlmsghdr` of a message of `len` bytes.
fn head(len: u8, family: u16, seq: u8, cmd: u8, version: u8) -> Vec<u8> {
    let f = family.to_le_bytes();
    vec![
        len, 0, 0, 0, f[0], f[1], 5, 0, seq, 0, 0, 0, 0, 0, 0, 0, cmd, version, 0, 0,
    ]
}

/// The `ETHTOOL_A_*_HEADER` nest naming `eth0`.
const HEADER_ETH0: [u8; 16] = [
    16, 0, 1, 0x80, 9, 0, 2, 0, b'e', b't', b'h', b'0', 0, 0, 0, 0,
];

#[test]
fn the_family_lookup_asks_the_controller_for_ethtool() {
    let mut want = head(32, 0x10, 1, 3, 2);
    want.extend([12, 0, 2, 0, b'e', b't', b'h', b't', b'o', b'o', b'l', 0]);
    assert_eq!(family_request(1), want);
}

#[test]
fn each_get_names_the_device_in_its_header_and_asks_nothing_else() {
    for (cmd, seq) in [
        (FEATURES_GET, 2),
        (RINGS_GET, 3),
        (CHANNELS_GET, 4),
        (COALESCE_GET, 5),
    ] {
        let mut want = head(36, FAMILY, seq, cmd, 1);
        want.extend(HEADER_ETH0);
        assert_eq!(
            get_request(FAMILY, cmd, u32::from(seq), "eth0"),
            want,
            "{cmd}"
        );
    }
}

#[test]
fn features_set_lists_each_bit_by_name_with_value_only_when_on() {
    let features: BTreeMap<String, bool> =
        [("rx-gro".to_owned(), true), ("rx-lro".to_owned(), false)].into();
    let mut want = head(80, FAMILY, 6, FEATURES_SET, 1);
    want.extend(HEADER_ETH0);
    want.extend([44, 0, 3, 0x80]); // WANTED
    want.extend([40, 0, 3, 0x80]); // BITS (no NOMASK: only listed bits change)
    want.extend([20, 0, 1, 0x80]); // BIT
    want.extend([11, 0, 2, 0, b'r', b'x', b'-', b'g', b'r', b'o', 0, 0]);
    want.extend([4, 0, 3, 0]); // VALUE
    want.extend([16, 0, 1, 0x80]); // BIT
    want.extend([11, 0, 2, 0, b'r', b'x', b'-', b'l', b'r', b'o', 0, 0]);
    assert_eq!(features_request(FAMILY, 6, "eth0", &features), want);
}

#[test]
fn rings_channels_coalesce_sets_carry_only_the_given_values() {
    let mut want = head(52, FAMILY, 7, RINGS_SET, 1);
    want.extend(HEADER_ETH0);
    want.extend([8, 0, 6, 0, 0, 2, 0, 0, 8, 0, 9, 0, 0, 4, 0, 0]);
    let rings = Rings {
        rx: Some(512),
        tx: Some(1024),
        ..Rings::default()
    };
    assert_eq!(rings_request(FAMILY, 7, "eth0", &rings), want);
    let mut want = head(52, FAMILY, 8, RINGS_SET, 1);
    want.extend(HEADER_ETH0);
    want.extend([8, 0, 7, 0, 1, 0, 0, 0, 8, 0, 8, 0, 2, 0, 0, 0]);
    let rings = Rings {
        rx_mini: Some(1),
        rx_jumbo: Some(2),
        ..Rings::default()
    };
    assert_eq!(rings_request(FAMILY, 8, "eth0", &rings), want);

    let mut want = head(68, FAMILY, 9, CHANNELS_SET, 1);
    want.extend(HEADER_ETH0);
    want.extend([8, 0, 6, 0, 1, 0, 0, 0]);
    want.extend([8, 0, 7, 0, 2, 0, 0, 0]);
    want.extend([8, 0, 8, 0, 3, 0, 0, 0]);
    want.extend([8, 0, 9, 0, 4, 0, 0, 0]);
    let channels = Channels {
        rx: Some(1),
        tx: Some(2),
        other: Some(3),
        combined: Some(4),
    };
    assert_eq!(channels_request(FAMILY, 9, "eth0", &channels), want);

    let mut want = head(84, FAMILY, 10, COALESCE_SET, 1);
    want.extend(HEADER_ETH0);
    want.extend([8, 0, 2, 0, 50, 0, 0, 0]); // rx-usecs
    want.extend([8, 0, 3, 0, 64, 0, 0, 0]); // rx-frames
    want.extend([8, 0, 6, 0, 20, 0, 0, 0]); // tx-usecs
    want.extend([8, 0, 7, 0, 0, 0, 0, 0]); // tx-frames
    want.extend([5, 0, 11, 0, 1, 0, 0, 0]); // adaptive-rx (u8)
    want.extend([5, 0, 12, 0, 0, 0, 0, 0]); // adaptive-tx
    let coalesce = Coalesce {
        rx_usecs: Some(50),
        tx_usecs: Some(20),
        rx_frames: Some(64),
        tx_frames: Some(0),
        adaptive_rx: Some(true),
        adaptive_tx: Some(false),
    };
    assert_eq!(coalesce_request(FAMILY, 10, "eth0", &coalesce), want);
}

/// A verbose bitset with `bits` (name, value flag); `nomask` for the list form.
fn bitset_attr(nomask: bool, bits: &[(&str, bool)]) -> Attrs {
    let mut list = Attrs::default();
    for (name, on) in bits {
        let mut bit = Attrs::default();
        bit.u32(1, 0).string(A_BITSET_BIT_NAME, name);
        if *on {
            bit.flag(A_BITSET_BIT_VALUE);
        }
        list.nested(A_BITSET_BITS_BIT, &bit);
    }
    let mut set = Attrs::default();
    if nomask {
        set.flag(A_BITSET_NOMASK);
    }
    set.u32(2, 64).nested(A_BITSET_BITS, &list);
    set
}

#[test]
fn answers_are_read_as_the_kernel_writes_them() {
    let mut family = Attrs::default();
    family
        .string(CTRL_ATTR_FAMILY_NAME, "ethtool")
        .raw(CTRL_ATTR_FAMILY_ID, &[0x1a, 0]);
    assert_eq!(family_id(&family.0), Some(0x1a));

    // FEATURES_GET: list forms (set bits only), as the kernel sends hw/active/nochange.
    let mut reply = Attrs::default();
    reply
        .nested(A_HEADER, &Attrs::default())
        .nested(
            A_FEATURES_HW,
            &bitset_attr(
                true,
                &[
                    ("rx-gro", false),
                    ("rx-checksum", false),
                    ("netns-local", false),
                ],
            ),
        )
        .nested(
            A_FEATURES_WANTED,
            &bitset_attr(true, &[("rx-checksum", false)]),
        )
        .nested(
            A_FEATURES_ACTIVE,
            &bitset_attr(true, &[("rx-checksum", false), ("highdma", false)]),
        )
        .nested(
            A_FEATURES_NOCHANGE,
            &bitset_attr(true, &[("netns-local", false)]),
        );
    let f = features(&reply.0);
    assert_eq!(
        f.changeable.iter().map(String::as_str).collect::<Vec<_>>(),
        ["rx-checksum", "rx-gro"]
    );
    assert_eq!(
        f.active.iter().map(String::as_str).collect::<Vec<_>>(),
        ["highdma", "rx-checksum"]
    );

    // FEATURES_SET's reply: WANTED in the mask form lists the bits not taken as asked.
    let mut set_reply = Attrs::default();
    set_reply.nested(
        A_FEATURES_WANTED,
        &bitset_attr(false, &[("rx-vlan-filter", false), ("rx-gro", true)]),
    );
    let missed = not_taken(&set_reply.0);
    assert_eq!(
        missed.iter().map(String::as_str).collect::<Vec<_>>(),
        ["rx-gro", "rx-vlan-filter"]
    );
    let (listed, on) = bitset(&bitset_attr(false, &[("a", true), ("b", false)]).0);
    assert_eq!((listed.len(), on.len()), (2, 1));

    let mut rings_reply = Attrs::default();
    rings_reply
        .u32(2, 4096)
        .u32(5, 4096)
        .u32(6, 256)
        .u32(9, 512);
    assert_eq!(
        rings(&rings_reply.0),
        (
            Rings {
                rx: Some(256),
                tx: Some(512),
                ..Rings::default()
            },
            Rings {
                rx: Some(4096),
                tx: Some(4096),
                ..Rings::default()
            }
        )
    );
    let mut channels_reply = Attrs::default();
    channels_reply.u32(2, 2).u32(3, 2).u32(6, 1).u32(7, 1);
    let (now, max) = channels(&channels_reply.0);
    assert_eq!((now.rx, now.tx, now.combined), (Some(1), Some(1), None));
    assert_eq!((max.rx, max.tx), (Some(2), Some(2)));
    let mut coalesce_reply = Attrs::default();
    coalesce_reply.u32(2, 3).u32(6, 7).u8(11, 1).u8(12, 0);
    assert_eq!(
        coalesce(&coalesce_reply.0),
        Coalesce {
            rx_usecs: Some(3),
            tx_usecs: Some(7),
            rx_frames: None,
            tx_frames: None,
            adaptive_rx: Some(true),
            adaptive_tx: Some(false)
        }
    );
}

/// The kernel's own answer for `lo`: GETs need no privilege. `lo`'s `loopback` feature is
/// on and fixed, and it has neither rings nor coalescing.
#[test]
fn this_kernel_answers_the_gets_for_lo() {
    let mut genl = match Genl::open().expect("a generic netlink socket") {
        Ok(genl) => genl,
        Err(e) => panic!("no ethtool family on this kernel: {:?}", e.errno()),
    };
    let asked = EthtoolSettings {
        features: [("loopback".to_owned(), false)].into(),
        ..EthtoolSettings::default()
    };
    let state = read(&mut genl, "lo", &asked).expect("lo's features");
    let f = state.features.expect("features");
    assert!(f.active.contains("loopback"), "{f:?}");
    assert!(!f.changeable.contains("loopback"), "{f:?}");
    let rings = EthtoolSettings {
        rings: Some(Rings::default()),
        ..EthtoolSettings::default()
    };
    match read(&mut genl, "lo", &rings) {
        Err(("rings", Failure::Refused(r))) => assert_eq!(r.errno, EOPNOTSUPP),
        other => panic!("lo has no rings: {other:?}"),
    }
}
