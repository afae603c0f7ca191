//! Tests of the CEL subset: the devices, helpers and example selectors they share are here;
//! the tests, grouped by what they exercise, are in `tests/`.

use super::ast::Kind;
use super::*;
use std::collections::BTreeMap;

use serde::Deserialize as _;
use serde_json::json;

mod errors;
mod fuzz;
mod selectors;
mod semantics;

fn s(v: &str) -> Value {
    Value::String(v.to_owned())
}

fn i(v: i64) -> Value {
    Value::Int(v)
}

fn b(v: bool) -> Value {
    Value::Bool(v)
}

/// A device of `driver`; attribute names without a domain belong to the driver's.
fn device(driver: &str, attrs: &[(&str, Value)]) -> Device {
    let mut d = Device {
        driver: driver.to_owned(),
        attributes: BTreeMap::new(),
    };
    for (name, value) in attrs {
        let (domain, id) = name.split_once('/').unwrap_or((driver, name));
        d.attributes
            .entry(domain.to_owned())
            .or_default()
            .insert(id.to_owned(), value.clone());
    }
    d
}

fn knic(attrs: &[(&str, Value)]) -> Device {
    device("knic.dev", attrs)
}

fn intel_nic() -> Device {
    knic(&[
        ("kind", s("nic")),
        ("pciVendor", s("8086")),
        ("vendorName", s("Intel Corporation")),
        ("speed", i(25000)),
        ("numaNode", i(1)),
        ("rdma", b(true)),
    ])
}

fn intel_pf_slow() -> Device {
    knic(&[
        ("kind", s("pf")),
        ("pciVendor", s("8086")),
        ("speed", i(10000)),
        ("numaNode", i(1)),
        ("rdma", b(true)),
    ])
}

/// A VF without an `rdma` attribute.
fn mlx_vf() -> Device {
    knic(&[
        ("kind", s("vf")),
        ("pciVendor", s("15b3")),
        ("vendorName", s("Mellanox Technologies")),
        ("pfName", s("ens1f0")),
        ("speed", i(100_000)),
        ("numaNode", i(0)),
    ])
}

/// A knic device without any attribute.
fn bare() -> Device {
    knic(&[])
}

/// Another driver's device, whose attributes live in its own domain.
fn gpu() -> Device {
    device("gpu.example.com", &[("kind", s("nic"))])
}

/// `device` with `name` (in the knic.dev domain) set to `value`, added or replaced.
fn with(mut device: Device, name: &str, value: Value) -> Device {
    device
        .attributes
        .entry("knic.dev".to_owned())
        .or_default()
        .insert(name.to_owned(), value);
    device
}

fn without(mut device: Device, name: &str) -> Device {
    if let Some(attrs) = device.attributes.get_mut("knic.dev") {
        attrs.remove(name);
    }
    device
}

fn compile(src: &str) -> Selector {
    Selector::compile(src).unwrap_or_else(|e| panic!("{src:?} does not compile: {e}"))
}

/// `src` on `device`, errors as their message.
fn on(src: &str, device: &Device) -> Result<bool, String> {
    compile(src).matches(device).map_err(|e| e.to_string())
}

/// `src` on a device without attributes.
fn eval(src: &str) -> Result<bool, String> {
    on(src, &bare())
}

fn compile_err(src: &str) -> String {
    match Selector::compile(src) {
        Ok(selector) => panic!("{src:?} compiled to {selector:?}"),
        Err(e) => e.to_string(),
    }
}

fn missing(name: &str) -> Result<bool, String> {
    Err(format!(
        "CEL evaluation error: no such attribute: device.attributes[\"knic.dev\"].{name}"
    ))
}

/// The value of a literal expression.
fn lit(src: &str) -> Value {
    match compile(src).expr.kind {
        Kind::Lit(v) => v,
        other => panic!("{src:?} is not a literal: {other:?}"),
    }
}

const E1: &str = r#"device.driver == "knic.dev""#;
const E2: &str =
    r#"device.driver == "knic.dev" && device.attributes["knic.dev"].kind in ["nic", "pf"]"#;
const E3: &str = r#"device.attributes["knic.dev"].kind == "vf""#;
const E4: &str = r#"device.attributes["knic.dev"].?rdma.orValue(false)"#;
const E5: &str = r#"device.attributes["knic.dev"].kind in ["nic", "pf"] && device.attributes["knic.dev"].?pciVendor.orValue("") == "8086" && device.attributes["knic.dev"].?speed.orValue(0) >= 25000 && device.attributes["knic.dev"].?numaNode.orValue(-1) == 1 && device.attributes["knic.dev"].?rdma.orValue(false)"#;
const E6: &str = r#"device.attributes["knic.dev"].kind == "vf" && device.attributes["knic.dev"].?vendorName.orValue("") == "Mellanox Technologies" && device.attributes["knic.dev"].?pfName.orValue("") == "ens1f0" && !device.attributes["knic.dev"].?rdma.orValue(false)"#;
const E7: &str = r#"!device.attributes["knic.dev"].?exhausted.orValue("").contains(",ab12cd,")"#;
const EXAMPLES: [&str; 7] = [E1, E2, E3, E4, E5, E6, E7];
