//! The contract's tests: every rejection asserts its exact text, because that text is what an
//! operator reads in a failed pod's events.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::{Value, json};

use super::*;

/// `fields` plus the mandatory `apiVersion`/`kind` (unless `fields` sets them itself).
fn object(fields: Value) -> Value {
    let mut value = json!({ "apiVersion": API_VERSION, "kind": KIND });
    let (Value::Object(base), Value::Object(extra)) = (&mut value, fields) else {
        panic!("test configs must be JSON objects");
    };
    base.extend(extra);
    value
}

/// Parse + validate one object and return every error as displayed to the operator.
fn problems(fields: Value) -> Vec<String> {
    let result = parse(&object(fields), "").and_then(|config| validate(&config));
    match result {
        Ok(valid) => panic!("expected errors, got {valid:?}"),
        Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
    }
}

fn valid(fields: Value) -> ValidConfig {
    let config = parse(&object(fields), "").expect("parses");
    validate(&config).expect("validates")
}

/// One `#[test]` per bad input, each asserting the exact messages in order.
macro_rules! rejects {
    ($($name:ident: $fields:tt => [$($message:expr),+ $(,)?];)*) => {
        $(
            #[test]
            fn $name() {
                assert_eq!(problems(json!($fields)), vec![$($message.to_owned()),+]);
            }
        )*
    };
}

fn full_config() -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "interface": { "name": "data0", "mtu": 9000, "hardwareAddress": "02:AB:cd:00:00:01" },
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
        "routes": [
            { "destination": "0.0.0.0/0", "gateway": "192.0.2.1", "metric": 100 },
            { "destination": "198.51.100.0/24", "gateway": "192.0.2.254", "source": "192.0.2.10", "table": 100 },
            { "destination": "::/0", "gateway": "fe80::1" },
            { "destination": "2001:db8:1::/48", "gateway": "2001:db8::1", "source": "2001:db8::10", "table": 254 },
            { "destination": "203.0.113.0/24" }
        ],
        "vlan": { "id": 100 },
        "sysctls": { "ipv4.rp_filter": "2", "ipv4.arp_ignore": "01", "ipv6.accept_ra": "0" },
        "bandwidth": { "egress": "2G", "burst": "256Ki" },
        "addressing": { "mode": "static" }
    })
}

fn cidr(text: &str) -> Cidr {
    text.parse().expect("valid CIDR")
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("valid IP")
}

// The SR-IOV `vf` block (issue 12), in a file of its own: this one is long enough.
mod vf;

// The `bandwidth` block (issue 13).
mod bandwidth;

// Refusals with their exact texts.
mod rejections;

// Parse, validate, round trip, merge, the error list.
mod parse;

// Field rules that accept.
mod fields;

// `Cidr`.
mod cidr;

// Validation that matches the kernel (issue 11).
mod kernel;

// The `ethtool` block (issue 27).
mod ethtool;
// Static neighbors (issue 27).
mod neighbors;

// GSO/GRO maximum sizes (issue 27).
mod sizes;
