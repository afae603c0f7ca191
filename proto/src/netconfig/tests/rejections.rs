//! Every refusal of a field's shape or rule, each asserting its exact text, as in the parent
//! module.

use super::*;

rejects! {
    // apiVersion / kind
    reject_wrong_api_version: { "apiVersion": "knic.dev/v1" }
        => ["apiVersion: must be \"knic.dev/v1alpha1\", got \"knic.dev/v1\""];
    reject_wrong_kind: { "kind": "NetConfig" }
        => ["kind: must be \"NetworkConfig\", got \"NetConfig\""];
    reject_api_version_not_a_string: { "apiVersion": 1 }
        => ["apiVersion: expected a string, got number 1"];

    // unknown fields, everywhere
    reject_unknown_top_level_field: { "adresses": ["192.0.2.10/24"] }
        => ["adresses: unknown field"];
    reject_unknown_interface_field: { "interface": { "mtuu": 1500 } }
        => ["interface.mtuu: unknown field"];
    reject_unknown_route_field: {
        "routes": [
            { "destination": "0.0.0.0/0" },
            { "destination": "10.0.0.0/8", "gw": "192.0.2.1" }
        ]
    } => ["routes[1].gw: unknown field"];
    reject_unknown_vlan_field: { "vlan": { "id": 5, "pcp": 3 } }
        => ["vlan.pcp: unknown field"];
    reject_unknown_ipam_field: { "ipam": { "network": "pods", "pool": "a" } }
        => ["ipam.pool: unknown field"];

    // wrong JSON types
    reject_mtu_as_string: { "interface": { "mtu": "1500" } }
        => ["interface.mtu: expected an integer, got string \"1500\""];
    reject_mtu_as_float: { "interface": { "mtu": 1500.5 } }
        => ["interface.mtu: expected an integer, got number 1500.5"];
    reject_negative_mtu: { "interface": { "mtu": -1 } }
        => ["interface.mtu: must be between 68 and 65535, got -1"];
    reject_interface_not_an_object: { "interface": "eth0" }
        => ["interface: expected an object, got string \"eth0\""];
    reject_addresses_not_a_list: { "addresses": "192.0.2.10/24" }
        => ["addresses: expected a list of strings, got string \"192.0.2.10/24\""];
    reject_address_not_a_string: { "addresses": ["192.0.2.10/24", 7] }
        => ["addresses[1]: expected a string, got number 7"];
    reject_routes_not_a_list: { "routes": { "destination": "0.0.0.0/0" } }
        => ["routes: expected a list of routes, got an object"];
    reject_route_without_destination: { "routes": [{ "gateway": "192.0.2.1" }] }
        => ["routes[0].destination: required"];
    reject_metric_out_of_u32: { "routes": [{ "destination": "0.0.0.0/0", "metric": 4294967296u64 }] }
        => ["routes[0].metric: must be between 0 and 4294967295, got 4294967296"];
    reject_sysctl_value_as_number: { "sysctls": { "ipv4.rp_filter": 1 } }
        => ["sysctls[\"ipv4.rp_filter\"]: expected a string, got number 1 (quote it)"];
    reject_sysctls_as_list: { "sysctls": ["ipv4.rp_filter=1"] }
        => ["sysctls: expected a map of sysctl names to string values, got an array"];

    // interface.name
    reject_name_too_long: { "interface": { "name": "abcdefghijklmnop" } }
        => ["interface.name: interface name \"abcdefghijklmnop\" is 16 bytes; Linux allows at most 15"];
    reject_name_too_long_in_bytes: { "interface": { "name": "netééééééé" } }
        => ["interface.name: interface name \"netééééééé\" is 17 bytes; Linux allows at most 15"];
    reject_name_with_slash: { "interface": { "name": "net/1" } }
        => ["interface.name: interface name \"net/1\" must not contain '/'"];
    reject_name_with_colon: { "interface": { "name": "eth0:1" } }
        => ["interface.name: interface name \"eth0:1\" must not contain ':'"];
    reject_name_with_percent: { "interface": { "name": "net%d" } }
        => ["interface.name: interface name \"net%d\" must not contain '%'"];
    reject_name_with_space: { "interface": { "name": "net 1" } }
        => ["interface.name: interface name \"net 1\" must not contain whitespace"];
    reject_empty_name: { "interface": { "name": "" } }
        => ["interface.name: interface name must not be empty"];
    reject_dot_dot_name: { "interface": { "name": ".." } }
        => ["interface.name: interface name \"..\" is not allowed by Linux"];

    // interface.mtu
    reject_mtu_zero: { "interface": { "mtu": 0 } }
        => ["interface.mtu: must be between 68 and 65535, got 0"];
    reject_mtu_67: { "interface": { "mtu": 67 } }
        => ["interface.mtu: must be between 68 and 65535, got 67"];
    reject_mtu_70000: { "interface": { "mtu": 70000 } }
        => ["interface.mtu: must be between 68 and 65535, got 70000"];
    reject_ipv6_address_with_small_mtu: {
        "interface": { "mtu": 1000 },
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"]
    } => ["interface.mtu: 1000 is below 1280, the minimum MTU for IPv6 (addresses[1] is IPv6)"];

    // interface.hardwareAddress
    reject_multicast_mac: { "interface": { "hardwareAddress": "01:00:5E:00:00:01" } }
        => ["interface.hardwareAddress: 01:00:5e:00:00:01 is a multicast address; a unicast address is required (the low bit of the first octet must be 0)"];
    reject_broadcast_mac: { "interface": { "hardwareAddress": "ff:ff:ff:ff:ff:ff" } }
        => ["interface.hardwareAddress: ff:ff:ff:ff:ff:ff is a multicast address; a unicast address is required (the low bit of the first octet must be 0)"];
    reject_zero_mac: { "interface": { "hardwareAddress": "00:00:00:00:00:00" } }
        => ["interface.hardwareAddress: 00:00:00:00:00:00 is all zeros, which is not a usable address"];
    reject_short_mac: { "interface": { "hardwareAddress": "02:00:00:00:00" } }
        => ["interface.hardwareAddress: \"02:00:00:00:00\" is not a MAC address; expected six colon-separated hex pairs like 02:00:00:00:00:01"];
    reject_dashed_mac: { "interface": { "hardwareAddress": "02-00-00-00-00-01" } }
        => ["interface.hardwareAddress: \"02-00-00-00-00-01\" is not a MAC address; expected six colon-separated hex pairs like 02:00:00:00:00:01"];
    reject_mac_with_non_hex: { "interface": { "hardwareAddress": "02:00:00:00:00:0g" } }
        => ["interface.hardwareAddress: \"02:00:00:00:00:0g\" is not a MAC address; expected six colon-separated hex pairs like 02:00:00:00:00:01"];

    // addresses / ipam
    reject_address_without_prefix: { "addresses": ["192.0.2.10"] }
        => ["addresses[0]: 192.0.2.10 has no prefix length; CIDR form is required, e.g. 192.0.2.10/24"];
    reject_ipv6_address_without_prefix: { "addresses": ["2001:db8::10"] }
        => ["addresses[0]: 2001:db8::10 has no prefix length; CIDR form is required, e.g. 2001:db8::10/64"];
    reject_ipv4_prefix_33: { "addresses": ["192.0.2.10/33"] }
        => ["addresses[0]: prefix length 33 is out of range for IPv4 (0-32)"];
    reject_ipv6_prefix_129: { "addresses": ["2001:db8::10/129"] }
        => ["addresses[0]: prefix length 129 is out of range for IPv6 (0-128)"];
    reject_bad_ip: { "addresses": ["192.0.2.300/24"] }
        => ["addresses[0]: \"192.0.2.300\" is not a valid IPv4 or IPv6 address"];
    reject_ipv4_leading_zero_octet: { "addresses": ["192.0.02.10/24"] }
        => ["addresses[0]: \"192.0.02.10\" is not a valid IPv4 or IPv6 address"];
    reject_zone_id: { "addresses": ["fe80::1%eth0/64"] }
        => ["addresses[0]: \"fe80::1%eth0/64\" has a zone id (%...); zone ids are not allowed"];
    reject_prefix_with_leading_zero: { "addresses": ["192.0.2.10/024"] }
        => ["addresses[0]: prefix length \"024\" is not a decimal number without sign or leading zeros"];
    reject_duplicate_addresses: { "addresses": ["192.0.2.10/24", "2001:db8::1/64", "192.0.2.10/25"] }
        => ["addresses[2]: 192.0.2.10 is already listed at addresses[0]"];
    reject_unusable_addresses: { "addresses": ["0.0.0.0/0", "224.0.0.1/24", "::ffff:192.0.2.1/120"] }
        => [
            "addresses[0]: 0.0.0.0/0 is the unspecified address",
            "addresses[1]: 224.0.0.1/24 is a multicast address",
            "addresses[2]: ::ffff:192.0.2.1/120 is an IPv4-mapped IPv6 address; write the IPv4 address instead",
        ];
    reject_addresses_and_ipam: { "addresses": ["192.0.2.10/24"], "ipam": { "network": "pods" } }
        => ["ipam: cannot be combined with addresses; use static addresses or IPAM, not both"];
    reject_ipam_network_not_dns_label: { "ipam": { "network": "Pod_Net" } }
        => ["ipam.network: \"Pod_Net\" is not a DNS label (1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)"];
    reject_ipam_without_network: { "ipam": {} }
        => ["ipam.network: required"];

    // routes
    reject_destination_with_host_bits: { "routes": [{ "destination": "10.1.2.3/8" }] }
        => ["routes[0].destination: 10.1.2.3/8 has host bits set; did you mean 10.0.0.0/8?"];
    reject_destination_without_prefix: { "routes": [{ "destination": "10.0.0.0" }] }
        => ["routes[0].destination: 10.0.0.0 has no prefix length; CIDR form is required, e.g. 10.0.0.0/24"];
    reject_gateway_family_mismatch: {
        "addresses": ["192.0.2.10/24"],
        "routes": [{ "destination": "0.0.0.0/0", "gateway": "2001:db8::1" }]
    } => ["routes[0].gateway: 2001:db8::1 is IPv6 but destination 0.0.0.0/0 is IPv4"];
    reject_gateway_outside_subnets: {
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
        "routes": [
            { "destination": "::/0", "gateway": "2001:db8::1" },
            { "destination": "0.0.0.0/0", "gateway": "203.0.113.1" }
        ]
    } => ["routes[1].gateway: 203.0.113.1 is not inside any address's subnet"];
    reject_ipv6_gateway_with_only_ipv4_addresses: {
        "addresses": ["192.0.2.10/24"],
        "routes": [{ "destination": "::/0", "gateway": "2001:db8::1" }]
    } => ["routes[0].gateway: 2001:db8::1 is not inside any address's subnet"];
    reject_gateway_is_own_address: {
        "addresses": ["192.0.2.10/24"],
        "routes": [{ "destination": "0.0.0.0/0", "gateway": "192.0.2.10" }]
    } => ["routes[0].gateway: 192.0.2.10 is one of this interface's own addresses"];
    reject_gateway_with_prefix: { "routes": [{ "destination": "0.0.0.0/0", "gateway": "192.0.2.1/24" }] }
        => ["routes[0].gateway: \"192.0.2.1/24\" is not an IP address (write the address without a prefix length)"];
    reject_unspecified_gateway: { "routes": [{ "destination": "0.0.0.0/0", "gateway": "0.0.0.0" }] }
        => ["routes[0].gateway: 0.0.0.0 is not a unicast address"];
    reject_source_not_an_address: {
        "addresses": ["192.0.2.10/24"],
        "routes": [{ "destination": "198.51.100.0/24", "gateway": "192.0.2.1", "source": "192.0.2.11" }]
    } => ["routes[0].source: 192.0.2.11 is not one of this interface's static addresses"];
    reject_source_family_mismatch: {
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
        "routes": [{ "destination": "0.0.0.0/0", "source": "2001:db8::10" }]
    } => ["routes[0].source: 2001:db8::10 is IPv6 but destination 0.0.0.0/0 is IPv4"];
    reject_source_with_ipam: {
        "ipam": { "network": "pods" },
        "routes": [{ "destination": "0.0.0.0/0", "source": "192.0.2.10" }]
    } => ["routes[0].source: 192.0.2.10 is not one of this interface's static addresses"];
    reject_duplicate_routes: {
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
        "routes": [
            { "destination": "0.0.0.0/0", "gateway": "192.0.2.1" },
            { "destination": "::/0", "metric": 1024 },
            { "destination": "::/0" },
            { "destination": "0.0.0.0/0", "gateway": "192.0.2.254", "metric": 0, "table": 254 }
        ]
    } => [
        "routes[2]: same destination, table and metric as routes[1]",
        "routes[3]: same destination, table and metric as routes[0]",
    ];
    reject_reserved_tables: {
        "routes": [
            { "destination": "10.0.0.0/8", "table": 0 },
            { "destination": "10.0.0.0/8", "table": 252 },
            { "destination": "10.0.0.0/8", "table": 253 },
            { "destination": "10.0.0.0/8", "table": 255 }
        ]
    } => [
        "routes[0].table: 0 is not a table id; omit table (or use 254) for the main table",
        "routes[1].table: 252 is reserved for the kernel's \"compat\" table; use 254 (main) or an id of your own",
        "routes[2].table: 253 is reserved for the kernel's \"default\" table; use 254 (main) or an id of your own",
        "routes[3].table: 255 is reserved for the kernel's \"local\" table; use 254 (main) or an id of your own",
    ];

    // vlan
    reject_vlan_zero: { "vlan": { "id": 0 } }
        => ["vlan.id: must be between 1 and 4094, got 0"];
    reject_vlan_4095: { "vlan": { "id": 4095 } }
        => ["vlan.id: must be between 1 and 4094, got 4095"];
    reject_vlan_70000: { "vlan": { "id": 70000 } }
        => ["vlan.id: must be between 1 and 4094, got 70000"];
    reject_vlan_without_id: { "vlan": {} }
        => ["vlan.id: required"];

    // sysctls
    reject_unknown_sysctl: { "sysctls": { "ipv4.ip_forward": "1" } }
        => ["sysctls[\"ipv4.ip_forward\"]: unknown sysctl; allowed: ipv4.arp_accept, ipv4.arp_announce, ipv4.arp_evict_nocarrier, ipv4.arp_filter, ipv4.arp_ignore, ipv4.arp_notify, ipv4.drop_gratuitous_arp, ipv4.drop_unicast_in_l2_multicast, ipv4.forwarding, ipv4.proxy_arp, ipv4.proxy_arp_pvlan, ipv4.rp_filter, ipv6.accept_dad, ipv6.accept_ra, ipv6.accept_untracked_na, ipv6.autoconf, ipv6.dad_transmits, ipv6.disable_ipv6, ipv6.drop_unicast_in_l2_multicast, ipv6.drop_unsolicited_na, ipv6.ndisc_evict_nocarrier, ipv6.ndisc_notify, ipv6.proxy_ndp"];
    reject_long_form_sysctl: { "sysctls": { "net.ipv4.conf.net1.rp_filter": "1" } }
        => ["sysctls[\"net.ipv4.conf.net1.rp_filter\"]: unknown sysctl; allowed: ipv4.arp_accept, ipv4.arp_announce, ipv4.arp_evict_nocarrier, ipv4.arp_filter, ipv4.arp_ignore, ipv4.arp_notify, ipv4.drop_gratuitous_arp, ipv4.drop_unicast_in_l2_multicast, ipv4.forwarding, ipv4.proxy_arp, ipv4.proxy_arp_pvlan, ipv4.rp_filter, ipv6.accept_dad, ipv6.accept_ra, ipv6.accept_untracked_na, ipv6.autoconf, ipv6.dad_transmits, ipv6.disable_ipv6, ipv6.drop_unicast_in_l2_multicast, ipv6.drop_unsolicited_na, ipv6.ndisc_evict_nocarrier, ipv6.ndisc_notify, ipv6.proxy_ndp"];
    reject_bad_sysctl_values: {
        "sysctls": {
            "ipv4.rp_filter": "3",
            "ipv4.arp_ignore": "5",
            "ipv6.accept_ra": "-1",
            "ipv6.autoconf": "yes"
        }
    } => [
        "sysctls[\"ipv4.arp_ignore\"]: \"5\" is not allowed; allowed values: 0, 1, 2, 3, 8",
        "sysctls[\"ipv4.rp_filter\"]: \"3\" is not allowed; allowed values: 0, 1, 2",
        "sysctls[\"ipv6.accept_ra\"]: \"-1\" is not allowed; allowed values: 0, 1, 2",
        "sysctls[\"ipv6.autoconf\"]: \"yes\" is not allowed; allowed values: 0, 1",
    ];
    reject_bad_arp_nd_sysctl_values: {
        "sysctls": {
            "ipv4.arp_accept": "3",
            "ipv4.arp_notify": "2",
            "ipv4.drop_gratuitous_arp": "true",
            "ipv6.accept_dad": "3",
            "ipv6.dad_transmits": "11",
            "ipv6.proxy_ndp": "",
            "ipv6.ndisc_notify": "01x"
        }
    } => [
        "sysctls[\"ipv4.arp_accept\"]: \"3\" is not allowed; allowed values: 0, 1, 2",
        "sysctls[\"ipv4.arp_notify\"]: \"2\" is not allowed; allowed values: 0, 1",
        "sysctls[\"ipv4.drop_gratuitous_arp\"]: \"true\" is not allowed; allowed values: 0, 1",
        "sysctls[\"ipv6.accept_dad\"]: \"3\" is not allowed; allowed values: 0, 1, 2",
        "sysctls[\"ipv6.dad_transmits\"]: \"11\" is not allowed; allowed values: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10",
        "sysctls[\"ipv6.ndisc_notify\"]: \"01x\" is not allowed; allowed values: 0, 1",
        "sysctls[\"ipv6.proxy_ndp\"]: \"\" is not allowed; allowed values: 0, 1",
    ];
    reject_global_arp_sysctl: { "sysctls": { "ipv4.neigh.gc_thresh1": "1" } }
        => ["sysctls[\"ipv4.neigh.gc_thresh1\"]: unknown sysctl; allowed: ipv4.arp_accept, ipv4.arp_announce, ipv4.arp_evict_nocarrier, ipv4.arp_filter, ipv4.arp_ignore, ipv4.arp_notify, ipv4.drop_gratuitous_arp, ipv4.drop_unicast_in_l2_multicast, ipv4.forwarding, ipv4.proxy_arp, ipv4.proxy_arp_pvlan, ipv4.rp_filter, ipv6.accept_dad, ipv6.accept_ra, ipv6.accept_untracked_na, ipv6.autoconf, ipv6.dad_transmits, ipv6.disable_ipv6, ipv6.drop_unicast_in_l2_multicast, ipv6.drop_unsolicited_na, ipv6.ndisc_evict_nocarrier, ipv6.ndisc_notify, ipv6.proxy_ndp"];
    reject_disable_ipv6_with_ipv6_address: {
        "addresses": ["2001:db8::10/64"],
        "sysctls": { "ipv6.disable_ipv6": "1" }
    } => ["sysctls[\"ipv6.disable_ipv6\"]: \"1\" disables IPv6, but addresses[0] is IPv6"];
}
