//! Validation that matches the kernel (issue 11): what it refuses or cannot make work, and the
//! edge values it takes.

use super::*;

// Issue 11: validation that matches the kernel. Every class of address the kernel refuses, or
// accepts but cannot make work, is refused with its rule, at the path it was written at.
rejects! {
    // addresses: special classes
    reject_loopback_addresses: { "addresses": ["127.0.0.1/8", "::1/128"] }
        => [
            "addresses[0]: 127.0.0.1/8 is a loopback address, which never leaves a host",
            "addresses[1]: ::1/128 is a loopback address, which never leaves a host",
        ];
    reject_ipv6_unspecified_and_multicast_addresses: { "addresses": ["::/64", "ff02::1/64"] }
        => [
            "addresses[0]: ::/64 is the unspecified address",
            "addresses[1]: ff02::1/64 is a multicast address",
        ];
    reject_broadcast_and_class_e_addresses: { "addresses": ["255.255.255.255/32", "240.0.0.1/24", "254.1.2.3/32"] }
        => [
            "addresses[0]: 255.255.255.255/32 is the limited broadcast address",
            "addresses[1]: 240.0.0.1/24 is a reserved class E address (240.0.0.0/4), which hosts and routers drop",
            "addresses[2]: 254.1.2.3/32 is a reserved class E address (240.0.0.0/4), which hosts and routers drop",
        ];
    reject_ipv4_mapped_address_slash_96: { "addresses": ["::ffff:0:1/96"] }
        => ["addresses[0]: ::ffff:0.0.0.1/96 is an IPv4-mapped IPv6 address; write the IPv4 address instead"];

    // addresses: the subnet's own reserved addresses
    reject_network_and_broadcast_addresses: {
        "addresses": ["192.0.2.0/24", "198.51.100.7/30", "203.0.113.128/25", "2001:db8::/64"]
    } => [
        "addresses[0]: 192.0.2.0 is the network address of 192.0.2.0/24",
        "addresses[1]: 198.51.100.7 is the broadcast address of 198.51.100.4/30",
        "addresses[2]: 203.0.113.128 is the network address of 203.0.113.128/25",
        "addresses[3]: 2001:db8:: is the subnet-router anycast address of 2001:db8::/64",
    ];

    // routes[].gateway: address classes
    reject_special_gateways: {
        "routes": [
            { "destination": "10.0.0.0/8", "gateway": "127.0.0.1" },
            { "destination": "10.1.0.0/16", "gateway": "255.255.255.255" },
            { "destination": "10.2.0.0/16", "gateway": "240.0.0.1" },
            { "destination": "10.3.0.0/16", "gateway": "239.1.1.1" },
            { "destination": "::/0", "gateway": "::1" },
            { "destination": "2001:db8:1::/48", "gateway": "::ffff:192.0.2.1" },
            { "destination": "2001:db8:2::/48", "gateway": "ff02::2" },
            { "destination": "2001:db8:3::/48", "gateway": "::" }
        ]
    } => [
        "routes[0].gateway: 127.0.0.1 is a loopback address, which never leaves a host",
        "routes[1].gateway: 255.255.255.255 is not a unicast address",
        "routes[2].gateway: 240.0.0.1 is a reserved class E address (240.0.0.0/4), which hosts and routers drop",
        "routes[3].gateway: 239.1.1.1 is not a unicast address",
        "routes[4].gateway: ::1 is a loopback address, which never leaves a host",
        "routes[5].gateway: ::ffff:192.0.2.1 is an IPv4-mapped IPv6 address; write the IPv4 address instead",
        "routes[6].gateway: ff02::2 is not a unicast address",
        "routes[7].gateway: :: is not a unicast address",
    ];

    // routes[].gateway: reserved addresses of the subnet it is on
    reject_gateway_reserved_in_subnet: {
        "addresses": ["192.0.2.10/24", "198.51.100.10/25", "2001:db8::10/64"],
        "routes": [
            { "destination": "10.0.0.0/8", "gateway": "192.0.2.255" },
            { "destination": "10.1.0.0/16", "gateway": "192.0.2.0" },
            { "destination": "10.2.0.0/16", "gateway": "198.51.100.127" },
            { "destination": "::/0", "gateway": "2001:db8::" }
        ]
    } => [
        "routes[0].gateway: 192.0.2.255 is the broadcast address of 192.0.2.0/24",
        "routes[1].gateway: 192.0.2.0 is the network address of 192.0.2.0/24",
        "routes[2].gateway: 198.51.100.127 is the broadcast address of 198.51.100.0/25",
        "routes[3].gateway: 2001:db8:: is the subnet-router anycast address of 2001:db8::/64",
    ];

    // routes[].destination
    reject_loopback_and_mapped_destinations: {
        "routes": [
            { "destination": "127.0.0.0/8" },
            { "destination": "127.0.0.1/32" },
            { "destination": "::1/128" },
            { "destination": "::ffff:0:0/96" },
            { "destination": "::ffff:192.0.2.0/120" }
        ]
    } => [
        "routes[0].destination: 127.0.0.0/8 is a loopback range; the kernel's local routes always take it, so this route would never be used",
        "routes[1].destination: 127.0.0.1/32 is a loopback range; the kernel's local routes always take it, so this route would never be used",
        "routes[2].destination: ::1/128 is a loopback range; the kernel's local routes always take it, so this route would never be used",
        "routes[3].destination: ::ffff:0.0.0.0/96 is an IPv4-mapped IPv6 range, which the kernel sends as IPv4; write an IPv4 route instead",
        "routes[4].destination: ::ffff:192.0.2.0/120 is an IPv4-mapped IPv6 range, which the kernel sends as IPv4; write an IPv4 route instead",
    ];

    // interface.name: invisible characters
    reject_name_with_zero_width_space: { "interface": { "name": "net\u{200b}1" } }
        => ["interface.name: interface name \"net\\u{200b}1\" must not contain zero-width characters (U+200B found)"];
    reject_name_with_byte_order_mark: { "interface": { "name": "\u{feff}net1" } }
        => ["interface.name: interface name \"\\u{feff}net1\" must not contain zero-width characters (U+FEFF found)"];
    reject_name_with_right_to_left_override: { "interface": { "name": "net\u{202e}1" } }
        => ["interface.name: interface name \"net\\u{202e}1\" must not contain bidirectional control characters (U+202E found)"];
    reject_name_with_arabic_letter_mark: { "interface": { "name": "net\u{61c}" } }
        => ["interface.name: interface name \"net\\u{61c}\" must not contain bidirectional control characters (U+061C found)"];
    reject_name_with_escape: { "interface": { "name": "net\u{1b}[0m" } }
        => ["interface.name: interface name \"net\\u{1b}[0m\" must not contain control characters"];
}

#[test]
fn interface_names_refuse_every_invisible_character() {
    let zero_width = ['\u{200B}', '\u{200C}', '\u{200D}', '\u{2060}', '\u{FEFF}'];
    let bidi = [
        '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}',
        '\u{2068}', '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}',
    ];
    for (chars, rule) in [
        (&zero_width[..], "zero-width characters"),
        (&bidi[..], "bidirectional control characters"),
    ] {
        for c in chars {
            let name = format!("n{c}1");
            assert_eq!(
                check_interface_name(&name).map_err(|e| e.to_string()),
                Err(format!(
                    "interface name {name:?} must not contain {rule} (U+{:04X} found)",
                    u32::from(*c)
                )),
            );
        }
    }
    // Visible non-ASCII letters and their neighbours in the code charts stay allowed.
    for name in ["netä", "net\u{2010}1", "net\u{2070}"] {
        assert_eq!(
            check_interface_name(name).map_err(|e| e.to_string()),
            Ok(())
        );
    }
}

#[test]
fn kernel_edge_values_that_accept() {
    // RFC 3021 /31s have no network or broadcast address; /32s and /127s neither.
    let v = valid(json!({
        "addresses": ["192.0.2.0/31", "198.51.100.1/31", "203.0.113.7/32", "2001:db8::1/64", "2001:db8:1::/127", "2001:db8:2::/128"],
        "routes": [
            { "destination": "0.0.0.0/0", "gateway": "192.0.2.1" },
            { "destination": "::/0", "gateway": "2001:db8::ffff:ffff:ffff:ffff" },
            // Split defaults contain special ranges but are not inside one.
            { "destination": "0.0.0.0/1", "gateway": "198.51.100.0" },
            { "destination": "::/1", "gateway": "2001:db8:1::1" },
            // Multicast and class E destinations are real routes.
            { "destination": "224.0.0.0/4" },
            { "destination": "240.0.0.0/4" },
            { "destination": "ff00::/8" }
        ]
    }));
    assert_eq!(v.addresses.len(), 6);
    assert_eq!(v.routes.len(), 7);
    // An IPv4 address next to the network and broadcast addresses, IPv6's last address (no
    // broadcast), and the last unicast addresses below the special ranges.
    let v = valid(json!({
        "addresses": ["192.0.2.1/24", "192.0.2.254/24", "2001:db8::ffff:ffff:ffff:ffff/64", "126.255.255.254/8", "223.255.255.254/8", "::2/128"]
    }));
    assert_eq!(v.addresses.len(), 6);
    // Without static addresses the default routes stand alone.
    let v = valid(json!({
        "routes": [{ "destination": "0.0.0.0/0" }, { "destination": "::/0" }]
    }));
    assert_eq!(v.routes.len(), 2);
}
