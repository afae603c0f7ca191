//! A Network that validates must not fail in the kernel (issue 11).

use super::*;

// Issue 11: a Network that validates must not fail in the kernel (or quietly not work) for a
// reason validation could have known.
rejects! {
    // spec.ipam.subnets[].cidr: /0 and special ranges
    network_reject_cidr_ipv4_default: { "ipam": { "subnets": [{ "cidr": "0.0.0.0/0" }] } }
        => ["spec.ipam.subnets[0].cidr: 0.0.0.0/0 is every IPv4 address, not a subnet (0.0.0.0/0 and ::/0 are how a default route is written); write the link's own subnet"];
    network_reject_cidr_ipv6_default: { "ipam": { "subnets": [{ "cidr": "::/0" }] } }
        => ["spec.ipam.subnets[0].cidr: ::/0 is every IPv6 address, not a subnet (0.0.0.0/0 and ::/0 are how a default route is written); write the link's own subnet"];
    network_reject_cidr_special_ranges: { "ipam": { "subnets": [
        { "cidr": "240.0.0.0/24" },
        { "cidr": "255.255.255.255/32" },
        { "cidr": "::ffff:192.0.2.0/120" },
        { "cidr": "::1/128" },
        { "cidr": "ff02::/16" }
    ] } }
        => [
            "spec.ipam.subnets[0].cidr: 240.0.0.0/24 is in the reserved class E range 240.0.0.0/4, which hosts and routers drop",
            "spec.ipam.subnets[1].cidr: 255.255.255.255/32 is the limited broadcast address",
            "spec.ipam.subnets[2].cidr: ::ffff:192.0.2.0/120 is an IPv4-mapped IPv6 range; write the IPv4 subnet instead",
            "spec.ipam.subnets[3].cidr: ::1/128 is a loopback range, which never leaves a host",
            "spec.ipam.subnets[4].cidr: ff02::/16 is a multicast range; pods need unicast addresses",
        ];
    network_reject_cidr_containing_special_ranges: { "ipam": { "subnets": [
        { "cidr": "0.0.0.0/8" },
        { "cidr": "128.0.0.0/1" },
        { "cidr": "96.0.0.0/3" },
        { "cidr": "::/64" },
        { "cidr": "::/16" },
        { "cidr": "0.0.0.0/32" }
    ] } }
        => [
            "spec.ipam.subnets[0].cidr: 0.0.0.0/8 contains the unspecified address 0.0.0.0",
            "spec.ipam.subnets[1].cidr: 128.0.0.0/1 contains the multicast range 224.0.0.0/4; pods need unicast addresses",
            "spec.ipam.subnets[2].cidr: 96.0.0.0/3 contains the loopback range 127.0.0.0/8, which never leaves a host",
            "spec.ipam.subnets[3].cidr: ::/64 contains the unspecified address ::",
            "spec.ipam.subnets[4].cidr: ::/16 contains the unspecified address ::",
            "spec.ipam.subnets[5].cidr: 0.0.0.0/32 is the unspecified address",
        ];
    network_reject_cidr_containing_mapped_range: { "ipam": { "subnets": [{ "cidr": "0:0:0:0:0:fffe::/95" }] } }
        => ["spec.ipam.subnets[0].cidr: ::fffe:0:0/95 contains the IPv4-mapped range ::ffff:0.0.0.0/96, which never appears on the wire"];

    // spec.ipam.subnets[].gateway: address classes come first, even outside the subnet
    network_reject_gateway_loopback: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "127.0.0.1" }] } }
        => ["spec.ipam.subnets[0].gateway: 127.0.0.1 is a loopback address, which never leaves a host"];
    network_reject_gateway_limited_broadcast: { "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "255.255.255.255" }] } }
        => ["spec.ipam.subnets[0].gateway: 255.255.255.255 is not a unicast address"];
    network_reject_gateway_mapped: { "ipam": { "subnets": [{ "cidr": "2001:db8::/64", "gateway": "::ffff:192.0.2.1" }] } }
        => ["spec.ipam.subnets[0].gateway: ::ffff:192.0.2.1 is an IPv4-mapped IPv6 address; write the IPv4 address instead"];
    network_reject_gateway_network_address_slash_30: { "ipam": { "subnets": [{ "cidr": "198.51.100.4/30", "gateway": "198.51.100.4" }] } }
        => ["spec.ipam.subnets[0].gateway: 198.51.100.4 is the network address of 198.51.100.4/30"];

    // spec.ipam.subnets[].routes: gateways on the subnet's reserved addresses, special classes
    // and destinations
    network_reject_route_gateway_reserved: { "ipam": { "subnets": [
        { "cidr": "192.0.2.0/24", "gateway": "192.0.2.1", "routes": [
            { "destination": "10.0.0.0/8", "gateway": "192.0.2.255" },
            { "destination": "10.1.0.0/16", "gateway": "192.0.2.0" }
        ] },
        { "cidr": "2001:db8::/64", "gateway": "2001:db8::1", "routes": [
            { "destination": "2001:db8:1::/48", "gateway": "2001:db8::" }
        ] }
    ] } }
        => [
            "spec.ipam.subnets[0].routes[0].gateway: 192.0.2.255 is the broadcast address of 192.0.2.0/24",
            "spec.ipam.subnets[0].routes[1].gateway: 192.0.2.0 is the network address of 192.0.2.0/24",
            "spec.ipam.subnets[1].routes[0].gateway: 2001:db8:: is the subnet-router anycast address of 2001:db8::/64",
        ];
    network_reject_route_special_gateways_and_destinations: { "ipam": { "subnets": [
        { "cidr": "192.0.2.0/24", "gateway": "192.0.2.1", "routes": [
            { "destination": "10.0.0.0/8", "gateway": "127.0.0.1" },
            { "destination": "10.1.0.0/16", "gateway": "240.0.0.1" },
            { "destination": "127.0.0.0/8" }
        ] },
        { "cidr": "2001:db8::/64", "routes": [
            { "destination": "::ffff:0:0/96" },
            { "destination": "2001:db8:1::/48", "gateway": "::1" }
        ] }
    ] } }
        => [
            "spec.ipam.subnets[0].routes[0].gateway: 127.0.0.1 is a loopback address, which never leaves a host",
            "spec.ipam.subnets[0].routes[1].gateway: 240.0.0.1 is a reserved class E address (240.0.0.0/4), which hosts and routers drop",
            "spec.ipam.subnets[0].routes[2].destination: 127.0.0.0/8 is a loopback range; the kernel's local routes always take it, so this route would never be used",
            "spec.ipam.subnets[1].routes[0].destination: ::ffff:0.0.0.0/96 is an IPv4-mapped IPv6 range, which the kernel sends as IPv4; write an IPv4 route instead",
            "spec.ipam.subnets[1].routes[1].gateway: ::1 is a loopback address, which never leaves a host",
        ];

    // spec.interfaceName and spec.devices.pfName: invisible characters
    network_reject_interface_name_zero_width: { "interfaceName": "data\u{200d}0" }
        => ["spec.interfaceName: interface name \"data\\u{200d}0\" must not contain zero-width characters (U+200D found)"];
    network_reject_interface_name_bidi: { "interfaceName": "\u{2067}data0" }
        => ["spec.interfaceName: interface name \"\\u{2067}data0\" must not contain bidirectional control characters (U+2067 found)"];
    network_reject_interface_name_control: { "interfaceName": "data\u{85}" }
        => ["spec.interfaceName: interface name \"data\\u{85}\" must not contain whitespace"];
    network_reject_pf_name_bidi: { "devices": { "pfName": "ens1f0\u{200f}" } }
        => ["spec.devices.pfName: interface name \"ens1f0\\u{200f}\" must not contain bidirectional control characters (U+200F found)"];
}

#[test]
fn network_kernel_edge_values_that_accept() {
    let spec = with(json!({
        "interfaceName": "netä0",
        "ipam": { "subnets": [
            // RFC 3021: a /31 has no network or broadcast address, so either end is a gateway.
            { "cidr": "192.0.2.0/31", "gateway": "192.0.2.0", "routes": [
                { "destination": "0.0.0.0/0", "gateway": "192.0.2.0" },
                { "destination": "224.0.0.0/4" },
                { "destination": "240.0.0.0/4" }
            ] },
            { "cidr": "198.51.100.9/32" },
            { "cidr": "2001:db8::/64", "gateway": "2001:db8::1", "routes": [
                { "destination": "::/0", "gateway": "2001:db8::1" },
                { "destination": "::/1", "gateway": "fe80::1" },
                { "destination": "ff00::/8" }
            ] },
            // RFC 6164: a /127 has no subnet-router anycast address.
            { "cidr": "2001:db8:1::/127", "gateway": "2001:db8:1::" },
            // Just below and above the special ranges.
            { "cidr": "126.0.0.0/8" },
            { "cidr": "128.0.0.0/2" },
            { "cidr": "0.0.0.64/26" },
            { "cidr": "::2/127" }
        ] }
    }));
    assert_eq!(validate_network("blue", &spec), Ok(()));
    // The pools agree with validation: each one builds.
    for subnet in &spec.ipam.subnets {
        assert!(subnet.pool().is_ok(), "{subnet:?}");
    }
}
