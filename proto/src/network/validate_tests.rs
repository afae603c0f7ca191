//! Network tests: every rejection asserts its exact text (it is what the admin reads in the
//! Network's `Invalid` condition), the friendly form's CEL is pinned, and overlap between
//! networks is checked case by case.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;

/// A valid Network: VFs, one IPv4 subnet with a gateway, one namespace.
fn base() -> Value {
    json!({
        "devices": { "kind": "vf" },
        "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "192.0.2.1" }] },
        "namespaces": { "names": ["team-a"] }
    })
}

/// JSON merge patch (RFC 7386): objects merge, `null` removes, anything else replaces.
fn merge(target: &mut Value, patch: Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(target) = target {
                for (key, value) in fields {
                    if value.is_null() {
                        target.remove(&key);
                    } else {
                        merge(target.entry(key).or_insert(Value::Null), value);
                    }
                }
            }
        }
        other => *target = other,
    }
}

/// The base Network with `patch` applied.
fn with(patch: Value) -> NetworkSpec {
    let mut value = base();
    merge(&mut value, patch);
    serde_json::from_value(value).expect("test spec deserializes")
}

/// The base Network with `devices` replaced (not merged) and `patch` applied.
fn with_devices(devices: Value, patch: Value) -> NetworkSpec {
    let mut value = base();
    merge(&mut value, patch);
    value["devices"] = devices;
    serde_json::from_value(value).expect("test spec deserializes")
}

/// Every problem `validate_network` reports, as displayed.
fn problems(name: &str, spec: &NetworkSpec) -> Vec<String> {
    match validate_network(name, spec) {
        Ok(()) => panic!("expected errors for {spec:?}"),
        Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
    }
}

/// One `#[test]` per bad spec (the base Network with a patch), asserting the exact messages.
macro_rules! rejects {
    ($($name:ident: $patch:tt => [$($message:expr),+ $(,)?];)*) => {
        $(
            #[test]
            fn $name() {
                assert_eq!(
                    problems("blue", &with(json!($patch))),
                    vec![$($message.to_owned()),+]
                );
            }
        )*
    };
}

const DNS_LABEL: &str =
    "(1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)";
const LABEL_KEY: &str = "(an optional DNS subdomain prefix and '/', then 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)";

// The tests, by what they exercise (after the helpers and `rejects!`, which they use).

// Accepted forms, and what they compile to.
mod spec;

// Refusals of one Network.
mod rejections;

// Conflicts between Networks.
mod against;

// What the kernel would refuse (issue 11).
mod kernel;

// Overlay Networks (issue 26).
mod vxlan;
