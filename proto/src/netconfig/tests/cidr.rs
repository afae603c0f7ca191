//! `Cidr`: parsing, display, containment, serde and order.

use super::*;

#[test]
fn cidr_parse_and_display() {
    for text in [
        "192.0.2.10/24",
        "0.0.0.0/0",
        "10.0.0.1/32",
        "2001:db8::10/64",
        "::/0",
        "2001:db8::1/128",
        "::ffff:192.0.2.1/128",
    ] {
        assert_eq!(cidr(text).to_string(), text);
    }
    // Display is canonical (RFC 5952 for IPv6).
    assert_eq!(cidr("2001:DB8:0:0::1/64").to_string(), "2001:db8::1/64");
    let c = cidr("192.0.2.10/24");
    assert_eq!(c.addr, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10)));
    assert_eq!(c.prefix_len, 24);
    assert!(c.is_ipv4() && !c.is_ipv6());
    assert_eq!(c.max_prefix_len(), 32);
    assert_eq!(cidr("::/0").max_prefix_len(), 128);
}

#[test]
fn cidr_parse_errors() {
    let cases = [
        (
            "",
            "empty string is not a CIDR; write ADDRESS/PREFIX-LENGTH, e.g. 192.0.2.10/24",
        ),
        (
            "1.2.3.4",
            "1.2.3.4 has no prefix length; CIDR form is required, e.g. 1.2.3.4/24",
        ),
        (
            "pods",
            "\"pods\" is not in CIDR form (ADDRESS/PREFIX-LENGTH, e.g. 192.0.2.10/24)",
        ),
        (
            "1.2.3.4/",
            "prefix length \"\" is not a decimal number without sign or leading zeros",
        ),
        (
            "1.2.3.4/+8",
            "prefix length \"+8\" is not a decimal number without sign or leading zeros",
        ),
        (
            "1.2.3.4/08",
            "prefix length \"08\" is not a decimal number without sign or leading zeros",
        ),
        (
            "1.2.3.4/24/1",
            "prefix length \"24/1\" is not a decimal number without sign or leading zeros",
        ),
        (
            "1.2.3.4/ 24",
            "prefix length \" 24\" is not a decimal number without sign or leading zeros",
        ),
        (
            "1.2.3.4/300",
            "prefix length 300 is out of range for IPv4 (0-32)",
        ),
        (
            "1.2.3.4/99999999999999999999",
            "prefix length 99999999999999999999 is out of range for IPv4 (0-32)",
        ),
        (
            "::/129",
            "prefix length 129 is out of range for IPv6 (0-128)",
        ),
        ("[::1]/64", "\"[::1]\" is not a valid IPv4 or IPv6 address"),
        (
            "010.0.0.1/8",
            "\"010.0.0.1\" is not a valid IPv4 or IPv6 address",
        ),
        (
            " 1.2.3.4/8",
            "\" 1.2.3.4\" is not a valid IPv4 or IPv6 address",
        ),
        (
            "fe80::1%2/64",
            "\"fe80::1%2/64\" has a zone id (%...); zone ids are not allowed",
        ),
    ];
    for (text, message) in cases {
        let error = text.parse::<Cidr>().expect_err(text);
        assert_eq!(error.to_string(), message, "for {text:?}");
    }
    assert_eq!(
        Cidr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 33)
            .expect_err("too long")
            .to_string(),
        "prefix length 33 is out of range for IPv4 (0-32)"
    );
    assert_eq!(
        Cidr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
        Ok(cidr("::1/128"))
    );
}

#[test]
fn cidr_network_and_contains() {
    // /0 holds its whole family and nothing of the other.
    let any4 = cidr("0.0.0.0/0");
    assert!(any4.contains(ip("255.255.255.255")) && any4.contains(ip("0.0.0.0")));
    assert!(!any4.contains(ip("::")));
    assert_eq!(cidr("192.0.2.10/0").network(), any4);
    let any6 = cidr("::/0");
    assert!(any6.contains(ip("ffff::1")) && !any6.contains(ip("192.0.2.1")));
    assert_eq!(cidr("2001:db8::1/0").network(), any6);
    // IPv4-mapped addresses stay IPv6: never inside an IPv4 subnet.
    assert!(!any4.contains(ip("::ffff:192.0.2.1")));

    let c24 = cidr("192.0.2.10/24");
    assert_eq!(c24.network(), cidr("192.0.2.0/24"));
    assert!(c24.contains(ip("192.0.2.0")) && c24.contains(ip("192.0.2.255")));
    assert!(!c24.contains(ip("192.0.3.0")));

    let c31 = cidr("192.0.2.7/31");
    assert_eq!(c31.network(), cidr("192.0.2.6/31"));
    assert!(c31.contains(ip("192.0.2.6")) && c31.contains(ip("192.0.2.7")));
    assert!(!c31.contains(ip("192.0.2.8")) && !c31.contains(ip("192.0.2.5")));

    let c32 = cidr("192.0.2.7/32");
    assert_eq!(c32.network(), c32);
    assert!(c32.contains(ip("192.0.2.7")) && !c32.contains(ip("192.0.2.6")));

    let c64 = cidr("2001:db8::10/64");
    assert_eq!(c64.network(), cidr("2001:db8::/64"));
    assert!(c64.contains(ip("2001:db8::ffff:ffff:ffff:ffff")));
    assert!(!c64.contains(ip("2001:db8:0:1::")));

    let c127 = cidr("2001:db8::1/127");
    assert_eq!(c127.network(), cidr("2001:db8::/127"));
    assert!(c127.contains(ip("2001:db8::")) && !c127.contains(ip("2001:db8::2")));

    let c128 = cidr("2001:db8::1/128");
    assert_eq!(c128.network(), c128);
    assert!(c128.contains(ip("2001:db8::1")) && !c128.contains(ip("2001:db8::")));

    // A hand-built out-of-range prefix is clamped, never a panic.
    let wild = Cidr {
        addr: ip("192.0.2.1"),
        prefix_len: 200,
    };
    assert_eq!(wild.network(), cidr("192.0.2.1/32"));
    assert!(wild.contains(ip("192.0.2.1")) && !wild.contains(ip("192.0.2.2")));
}

#[test]
fn cidr_serde_and_order() {
    let c = cidr("2001:db8::10/64");
    assert_eq!(
        serde_json::to_value(c).expect("serializes"),
        json!("2001:db8::10/64")
    );
    let back: Cidr = serde_json::from_value(json!("2001:db8::10/64")).expect("deserializes");
    assert_eq!(back, c);
    let error = serde_json::from_value::<Cidr>(json!("10.0.0.1")).expect_err("no prefix");
    assert_eq!(
        error.to_string(),
        "10.0.0.1 has no prefix length; CIDR form is required, e.g. 10.0.0.1/24"
    );
    let mut list = vec![
        cidr("10.0.0.2/8"),
        cidr("::1/128"),
        cidr("10.0.0.1/16"),
        cidr("10.0.0.1/8"),
    ];
    list.sort();
    assert_eq!(
        list,
        [
            cidr("10.0.0.1/8"),
            cidr("10.0.0.1/16"),
            cidr("10.0.0.2/8"),
            cidr("::1/128")
        ]
    );
}
