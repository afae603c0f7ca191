use super::ast::Kind;
use super::*;
use std::collections::BTreeMap;

use serde::Deserialize as _;
use serde_json::json;

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

#[test]
fn driver_selector() {
    assert_eq!(on(E1, &intel_nic()), Ok(true));
    assert_eq!(on(E1, &bare()), Ok(true));
    assert_eq!(on(E1, &gpu()), Ok(false));
}

#[test]
fn nic_class_selector() {
    assert_eq!(on(E2, &intel_nic()), Ok(true));
    assert_eq!(on(E2, &intel_pf_slow()), Ok(true));
    assert_eq!(on(E2, &mlx_vf()), Ok(false));
    // A knic device without `kind`: the missing attribute is an error...
    assert_eq!(on(E2, &bare()), missing("kind"));
    // ...which `false &&` absorbs for another driver's device (no knic.dev domain at all).
    assert_eq!(on(E2, &gpu()), Ok(false));
}

#[test]
fn vf_selector() {
    assert_eq!(on(E3, &mlx_vf()), Ok(true));
    assert_eq!(on(E3, &intel_nic()), Ok(false));
    assert_eq!(on(E3, &bare()), missing("kind"));
    assert_eq!(on(E3, &gpu()), missing("kind"));
}

#[test]
fn optional_bool_selector() {
    assert_eq!(on(E4, &intel_nic()), Ok(true));
    assert_eq!(on(E4, &with(intel_nic(), "rdma", b(false))), Ok(false));
    // Missing: the default.
    assert_eq!(on(E4, &mlx_vf()), Ok(false));
    assert_eq!(on(E4, &bare()), Ok(false));
    // Present with another type: the value, not the default, which is not a bool.
    assert_eq!(
        on(E4, &with(intel_nic(), "rdma", s("yes"))),
        Err("CEL evaluation error: selector evaluated to string, not bool".to_owned())
    );
}

#[test]
fn friendly_nic_selector() {
    assert_eq!(on(E5, &intel_nic()), Ok(true));
    assert_eq!(on(E5, &with(intel_nic(), "kind", s("pf"))), Ok(true));
    assert_eq!(on(E5, &with(intel_nic(), "speed", i(100_000))), Ok(true));
    assert_eq!(on(E5, &intel_pf_slow()), Ok(false), "too slow");
    assert_eq!(on(E5, &with(intel_nic(), "numaNode", i(0))), Ok(false));
    assert_eq!(on(E5, &without(intel_nic(), "numaNode")), Ok(false));
    assert_eq!(on(E5, &without(intel_nic(), "speed")), Ok(false));
    assert_eq!(on(E5, &without(intel_nic(), "pciVendor")), Ok(false));
    assert_eq!(on(E5, &without(intel_nic(), "rdma")), Ok(false));
    assert_eq!(
        on(E5, &with(intel_nic(), "pciVendor", s("15b3"))),
        Ok(false)
    );
    assert_eq!(on(E5, &mlx_vf()), Ok(false));
    // `kind` is missing (an error) but the vendor's default "" is false, which wins.
    assert_eq!(on(E5, &bare()), Ok(false));
    assert_eq!(on(E5, &without(intel_nic(), "kind")), missing("kind"));
    // A speed published as a string cannot be compared with an int.
    assert_eq!(
        on(E5, &with(intel_nic(), "speed", s("25000"))),
        Err("CEL evaluation error: no such overload: string >= int".to_owned())
    );
}

#[test]
fn friendly_vf_selector() {
    assert_eq!(on(E6, &mlx_vf()), Ok(true));
    assert_eq!(on(E6, &with(mlx_vf(), "rdma", b(false))), Ok(true));
    assert_eq!(on(E6, &with(mlx_vf(), "rdma", b(true))), Ok(false));
    assert_eq!(on(E6, &with(mlx_vf(), "pfName", s("ens1f1"))), Ok(false));
    assert_eq!(on(E6, &without(mlx_vf(), "pfName")), Ok(false));
    assert_eq!(
        on(E6, &with(mlx_vf(), "vendorName", s("Intel Corporation"))),
        Ok(false)
    );
    assert_eq!(on(E6, &intel_nic()), Ok(false));
    assert_eq!(on(E6, &bare()), Ok(false));
    assert_eq!(
        on(E6, &with(mlx_vf(), "rdma", i(1))),
        Err("CEL evaluation error: no such overload: !int".to_owned())
    );
}

#[test]
fn exhaustion_selector() {
    assert_eq!(on(E7, &intel_nic()), Ok(true));
    assert_eq!(
        on(E7, &with(bare(), "exhausted", s(",ab12cd,ef34gh,"))),
        Ok(false)
    );
    assert_eq!(on(E7, &with(bare(), "exhausted", s(",ef34gh,"))), Ok(true));
    assert_eq!(on(E7, &with(bare(), "exhausted", s(",xab12cd,"))), Ok(true));
    assert_eq!(
        on(E7, &with(bare(), "exhausted", i(5))),
        Err("CEL evaluation error: no such overload: int.contains(string)".to_owned())
    );

    // The selector knic really generates, against the attribute drivers really publish.
    use knic_proto::network::{
        EXHAUSTED_ATTRIBUTE, exhausted_attribute, exhaustion_selector, exhaustion_token,
    };
    let selector = compile(&exhaustion_selector("blue"));
    let listing = |networks: &[&str]| {
        let tokens: Vec<String> = networks.iter().map(|n| exhaustion_token(n)).collect();
        let value =
            exhausted_attribute(tokens.iter().map(String::as_str)).expect("something to list");
        with(intel_nic(), EXHAUSTED_ATTRIBUTE, s(&value))
    };
    assert_eq!(selector.matches(&intel_nic()), Ok(true));
    assert_eq!(selector.matches(&listing(&["red"])), Ok(true));
    assert_eq!(selector.matches(&listing(&["red", "blue"])), Ok(false));
    assert_eq!(selector.matches(&listing(&["blue"])), Ok(false));
}

/// Every selector of the shipped DeviceClasses, against the devices they are meant for.
#[test]
fn shipped_device_classes() {
    let yaml = include_str!("../../../deviceclasses/knic.yaml");
    let mut classes = BTreeMap::new();
    for document in serde_yaml_ng::Deserializer::from_str(yaml) {
        let class = serde_yaml_ng::Value::deserialize(document).expect("YAML");
        let name = class["metadata"]["name"].as_str().expect("name").to_owned();
        let selectors: Vec<Selector> = class["spec"]["selectors"]
            .as_sequence()
            .expect("selectors")
            .iter()
            .map(|s| compile(s["cel"]["expression"].as_str().expect("expression")))
            .collect();
        classes.insert(name, selectors);
    }
    let matches = |class: &str, device: &Device| -> Result<bool, CelError> {
        let mut all = true;
        for selector in &classes[class] {
            all &= selector.matches(device)?;
        }
        Ok(all)
    };
    let (nic, pf, vf, bare, gpu) = (intel_nic(), intel_pf_slow(), mlx_vf(), bare(), gpu());
    let table: [(&str, [Result<bool, ()>; 5]); 4] = [
        (
            "knic.dev",
            [Ok(true), Ok(true), Ok(true), Ok(true), Ok(false)],
        ),
        (
            "nic.knic.dev",
            [Ok(true), Ok(true), Ok(false), Err(()), Ok(false)],
        ),
        (
            "vf.knic.dev",
            [Ok(false), Ok(false), Ok(true), Err(()), Ok(false)],
        ),
        (
            "rdma.knic.dev",
            [Ok(true), Ok(true), Ok(false), Ok(false), Ok(false)],
        ),
    ];
    assert_eq!(classes.len(), table.len());
    for (class, expected) in table {
        let got: Vec<Result<bool, ()>> = [&nic, &pf, &vf, &bare, &gpu]
            .into_iter()
            .map(|d| matches(class, d).map_err(|_| ()))
            .collect();
        assert_eq!(got, expected, "{class}");
    }
}

/// The SR-IOV class and the selectors of the example claims (`deviceclasses/sriov.yaml`,
/// `deviceclasses/examples/`), against the devices they are meant for.
#[test]
fn shipped_sriov_class_and_examples() {
    let yaml = include_str!("../../../deviceclasses/sriov.yaml");
    let class = serde_yaml_ng::Value::deserialize(serde_yaml_ng::Deserializer::from_str(yaml))
        .expect("YAML");
    assert_eq!(class["metadata"]["name"].as_str(), Some("pf.knic.dev"));
    let pf_class = compile(
        class["spec"]["selectors"][0]["cel"]["expression"]
            .as_str()
            .expect("expression"),
    );
    let got: Vec<_> = [intel_nic(), intel_pf_slow(), mlx_vf(), gpu()]
        .iter()
        .map(|d| pf_class.matches(d))
        .collect();
    assert_eq!(got, [Ok(false), Ok(true), Ok(false), Ok(false)]);
    let example = include_str!("../../../deviceclasses/examples/vf-near-gpu.yaml");
    let template =
        serde_yaml_ng::Value::deserialize(serde_yaml_ng::Deserializer::from_str(example))
            .expect("YAML");
    let nic = compile(
        template["spec"]["spec"]["devices"]["requests"][1]["exactly"]["selectors"][0]["cel"]
            ["expression"]
            .as_str()
            .expect("expression"),
    );
    // An RDMA-capable VF qualifies, one without RDMA (or not saying) does not.
    assert_eq!(nic.matches(&with(mlx_vf(), "rdma", b(true))), Ok(true));
    assert_eq!(nic.matches(&mlx_vf()), Ok(false));
}

/// The selectors the controller generates from friendly Networks.
#[test]
fn generated_selectors() {
    use crate::network::NetworkSpec;
    let selector = |devices: serde_json::Value| -> Selector {
        let spec: NetworkSpec = serde_json::from_value(json!({
            "devices": devices,
            "ipam": { "subnets": [{ "cidr": "192.0.2.0/24", "gateway": "192.0.2.1" }] },
            "namespaces": { "names": ["team-a"] }
        }))
        .expect("spec");
        let request = spec.device_request().expect("valid devices");
        assert_eq!(request.device_class_name, "knic.dev");
        assert_eq!(request.selectors.len(), 1, "{:?}", request.selectors);
        compile(&request.selectors[0])
    };
    let nic = selector(json!({
        "kind": "nic", "vendor": "8086", "minSpeed": 25000, "numaNode": 1, "rdma": true
    }));
    assert_eq!(nic.matches(&intel_nic()), Ok(true));
    assert_eq!(nic.matches(&intel_pf_slow()), Ok(false));
    assert_eq!(nic.matches(&mlx_vf()), Ok(false));

    let vf = selector(json!({
        "kind": "vf", "vendor": "Mellanox Technologies", "pfName": "ens1f0", "rdma": false
    }));
    assert_eq!(vf.matches(&mlx_vf()), Ok(true));
    assert_eq!(
        vf.matches(&with(mlx_vf(), "pfName", s("ens1f1"))),
        Ok(false)
    );
    assert_eq!(vf.matches(&intel_nic()), Ok(false));

    let by_id = selector(json!({ "vendor": "0X15B3" }));
    assert_eq!(by_id.matches(&mlx_vf()), Ok(true));
    assert_eq!(by_id.matches(&intel_nic()), Ok(false));

    // A vendor name that needs escaping round-trips through the generated literal.
    let odd = selector(json!({ "vendor": "Odd \"Vendor\" \\ Inc" }));
    let named = |name: &str| with(bare(), "vendorName", s(name));
    assert_eq!(odd.matches(&named("Odd \"Vendor\" \\ Inc")), Ok(true));
    assert_eq!(odd.matches(&named("Odd \"Vendor\" \\\\ Inc")), Ok(false));
    assert_eq!(odd.matches(&named("Odd Vendor Inc")), Ok(false));
}

#[test]
fn from_slice_sorts_attributes_into_domains() {
    use k8s_openapi::api::resource::v1::{Device as ApiDevice, DeviceAttribute};
    let attr = |f: fn(&mut DeviceAttribute)| {
        let mut a = DeviceAttribute::default();
        f(&mut a);
        a
    };
    let api = ApiDevice {
        name: "eth0".to_owned(),
        attributes: Some(BTreeMap::from([
            (
                "kind".to_owned(),
                attr(|a| a.string = Some("nic".to_owned())),
            ),
            ("speed".to_owned(), attr(|a| a.int = Some(25000))),
            ("rdma".to_owned(), attr(|a| a.bool = Some(true))),
            (
                "firmware".to_owned(),
                attr(|a| a.version = Some("1.2.3+b7".to_owned())),
            ),
            (
                "resource.kubernetes.io/pcieRoot".to_owned(),
                attr(|a| a.string = Some("pci0000:00".to_owned())),
            ),
            ("empty".to_owned(), DeviceAttribute::default()),
        ])),
        ..ApiDevice::default()
    };
    let d = Device::from_slice("knic.dev", &api);
    let expected = Device {
        driver: "knic.dev".to_owned(),
        attributes: BTreeMap::from([
            (
                "knic.dev".to_owned(),
                BTreeMap::from([
                    ("kind".to_owned(), s("nic")),
                    ("speed".to_owned(), i(25000)),
                    ("rdma".to_owned(), b(true)),
                    ("firmware".to_owned(), Value::Version("1.2.3+b7".to_owned())),
                ]),
            ),
            (
                "resource.kubernetes.io".to_owned(),
                BTreeMap::from([("pcieRoot".to_owned(), s("pci0000:00"))]),
            ),
        ]),
    };
    assert_eq!(d, expected);
    assert_eq!(
        on(
            r#"device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00""#,
            &d
        ),
        Ok(true)
    );
    assert_eq!(on(E5, &d), Ok(false), "no pciVendor");
    assert_eq!(on(E2, &d), Ok(true));
    assert_eq!(
        on(r#"has(device.attributes["knic.dev"].empty)"#, &d),
        Ok(false)
    );
    assert_eq!(
        Device::from_slice("knic.dev", &ApiDevice::default()),
        knic(&[]),
        "no attributes at all"
    );
}

#[test]
fn string_literals_and_escapes() {
    let cases: [(&str, &str); 16] = [
        (r#""plain""#, "plain"),
        (r#"'single'"#, "single"),
        (r#""""#, ""),
        (r#""a\\b""#, "a\\b"),
        (r#""say \"hi\"""#, "say \"hi\""),
        (r#"'it\'s'"#, "it's"),
        (r#""it's""#, "it's"),
        (r#"'"'"#, "\""),
        (r#""\n\r\t""#, "\n\r\t"),
        (r#""\a\b\f\v\?\`""#, "\u{7}\u{8}\u{c}\u{b}?`"),
        (r#""\u00e9\U0001F600""#, "é😀"),
        (r#""\x41\X42\101""#, "ABA"),
        (r#""ñ und 😀""#, "ñ und 😀"),
        (r#"r"a\nb\""#, "a\\nb\\"),
        (r#"R'\d+'"#, "\\d+"),
        (r#""\u0000""#, "\u{0}"),
    ];
    for (src, expected) in cases {
        assert_eq!(lit(src), s(expected), "{src}");
    }
    // An escaped quote does not end the literal, and `//` inside one is text.
    assert_eq!(eval(r#""a\"b" == 'a"b'"#), Ok(true));
    assert_eq!(lit(r#""// not a comment""#), s("// not a comment"));
}

#[test]
fn other_literals() {
    assert_eq!(lit("0"), i(0));
    assert_eq!(lit("42"), i(42));
    assert_eq!(lit("-1"), i(-1));
    assert_eq!(lit("0x1F"), i(31));
    assert_eq!(lit("-0x10"), i(-16));
    assert_eq!(lit("9223372036854775807"), i(i64::MAX));
    assert_eq!(lit("-9223372036854775808"), i(i64::MIN));
    assert_eq!(lit("true"), b(true));
    assert_eq!(lit("false"), b(false));
    assert_eq!(eval("--1 == 1"), Ok(true));
    assert_eq!(eval("[1, 'a', true] == [1, 'a', true,]"), Ok(true));
    assert_eq!(eval("[] == []"), Ok(true));
    assert_eq!(eval("[1] == [1, 2]"), Ok(false));
    assert_eq!(eval("[1, 2] == [1, 3]"), Ok(false));
    assert_eq!(eval("[1] == ['a']"), Ok(false), "heterogeneous equality");
    assert_eq!(
        eval("[1] < [2]"),
        Err("CEL evaluation error: no such overload: list < list".to_owned())
    );
    assert_eq!(
        eval("device.driver == 'knic.dev' // the driver\n && true"),
        Ok(true)
    );
}

#[test]
fn attribute_access_forms() {
    let nic = intel_nic();
    assert_eq!(
        on(r#"device.attributes["knic.dev"]["kind"] == "nic""#, &nic),
        Ok(true)
    );
    assert_eq!(
        on(r#"device.attributes['knic.dev'].speed == 25000"#, &nic),
        Ok(true)
    );
    assert_eq!(
        on(
            r#"device.attributes["knic.dev"][?"numaNode"].orValue(-1) == 1"#,
            &nic
        ),
        Ok(true)
    );
    assert_eq!(
        on(
            r#"device.attributes["knic.dev"][?"pfName"].orValue("none") == "none""#,
            &nic
        ),
        Ok(true)
    );
    assert_eq!(
        on(r#"device.attributes["knic.dev"].?speed.value() > 0"#, &nic),
        Ok(true)
    );
    assert_eq!(
        on(
            r#"device.attributes["knic.dev"].?pfName.value() == """#,
            &nic
        ),
        missing("pfName")
    );
    assert_eq!(
        on(r#"device.attributes["knic.dev"].?rdma.hasValue()"#, &nic),
        Ok(true)
    );
    assert_eq!(
        on(r#"device.attributes["knic.dev"].?pfName.hasValue()"#, &nic),
        Ok(false)
    );
    assert_eq!(
        on(r#"has(device.attributes["knic.dev"].rdma)"#, &nic),
        Ok(true)
    );
    assert_eq!(
        on(r#"!has(device.attributes["knic.dev"].rdma)"#, &mlx_vf()),
        Ok(true)
    );
    // A domain by field selection, as CEL allows for map keys.
    assert_eq!(
        on(
            r#"device.attributes.example.x == 1"#,
            &device("example", &[("x", i(1))])
        ),
        Ok(true)
    );
    // An unknown domain reads as an empty map.
    assert_eq!(
        on(r#"device.attributes["nope.dev"].x == 1"#, &nic),
        Err(
            "CEL evaluation error: no such attribute: device.attributes[\"nope.dev\"].x".to_owned()
        )
    );
    assert_eq!(
        on(r#"device.attributes["nope.dev"].?x.orValue(7) == 7"#, &nic),
        Ok(true)
    );
    // Another driver's device may publish into the knic.dev domain with a qualified name;
    // its own bare names stay in its domain.
    let other = device("other.dev", &[("knic.dev/kind", s("vf")), ("kind", s("x"))]);
    assert_eq!(on(E3, &other), Ok(true));
    assert_eq!(
        on(
            r#"device.attributes["other.dev"].?kind.orValue("") == "x""#,
            &other
        ),
        Ok(true)
    );
}

#[test]
fn relations_and_types() {
    let cases: [(&str, bool); 22] = [
        ("1 < 2", true),
        ("2 < 1", false),
        ("1 <= 1", true),
        ("2 <= 1", false),
        ("2 > 1", true),
        ("1 > 1", false),
        ("1 >= 1", true),
        ("1 >= 2", false),
        ("1 == 1", true),
        ("1 != 1", false),
        ("-5 < -4", true),
        ("'a' < 'b'", true),
        ("'B' < 'a'", true),
        ("'é' > 'z'", true),
        ("'ab' < 'abc'", true),
        ("false < true", true),
        ("true <= false", false),
        ("'x' != 'y'", true),
        ("2 in [1, 2]", true),
        ("3 in [1, 2]", false),
        ("'a' in []", false),
        ("1 < 2 == true", true),
    ];
    for (src, expected) in cases {
        assert_eq!(eval(src), Ok(expected), "{src}");
    }
    // Heterogeneous equality (cel-go's, hence the scheduler's): other types are unequal.
    assert_eq!(eval("1 == '1'"), Ok(false));
    assert_eq!(eval("'1' != 1"), Ok(true));
    assert_eq!(eval("2 in ['a', 1]"), Ok(false));
    let errors: [(&str, &str); 6] = [
        ("true < 1", "no such overload: bool < int"),
        ("'a' >= false", "no such overload: string >= bool"),
        ("1 in 1", "no such overload: int in int"),
        ("1 < 2 < 3", "no such overload: bool < int"),
        ("-'a' == 1", "no such overload: -string"),
        (
            "1.startsWith('a')",
            "no such overload: int.startsWith(string)",
        ),
    ];
    for (src, message) in errors {
        assert_eq!(
            eval(src),
            Err(format!("CEL evaluation error: {message}")),
            "{src}"
        );
    }
    // Elements of another type are simply unequal.
    assert_eq!(eval("1 in ['a', 1]"), Ok(true));
    let speed = with(intel_nic(), "speed", i(25000));
    assert_eq!(
        on(r#"device.attributes["knic.dev"].speed == "25000""#, &speed),
        Ok(false)
    );
    assert_eq!(
        on(
            r#"device.attributes["knic.dev"].speed in [10000, 25000]"#,
            &speed
        ),
        Ok(true)
    );
    assert_eq!(
        on(r#"-device.attributes["knic.dev"].speed == -25000"#, &speed),
        Ok(true)
    );
    assert_eq!(
        on(
            r#"-device.attributes["knic.dev"].speed > 0"#,
            &with(bare(), "speed", i(i64::MIN))
        ),
        Err("CEL evaluation error: integer overflow in -".to_owned())
    );
    assert_eq!(
        eval("device.driver"),
        Err("CEL evaluation error: selector evaluated to string, not bool".to_owned())
    );
    assert_eq!(
        eval("[true]"),
        Err("CEL evaluation error: selector evaluated to list, not bool".to_owned())
    );
}

#[test]
fn versions_compare_only_with_versions() {
    let d = device(
        "knic.dev",
        &[
            ("firmware", Value::Version("1.2.3+b7".to_owned())),
            ("x.dev/firmware", Value::Version("1.2.3".to_owned())),
            ("y.dev/firmware", Value::Version("1.2.4".to_owned())),
        ],
    );
    let fw = |domain: &str| format!("device.attributes[{domain:?}].firmware");
    let (k, x, y) = (fw("knic.dev"), fw("x.dev"), fw("y.dev"));
    assert_eq!(
        on(&format!("{k} == {x}"), &d),
        Ok(true),
        "build metadata ignored"
    );
    assert_eq!(on(&format!("{k} != {y}"), &d), Ok(true));
    assert_eq!(on(&format!("{x} in [{y}, {k}]"), &d), Ok(true));
    assert_eq!(on(&format!("{x} == '1.2.3'"), &d), Ok(false));
    assert_eq!(
        on(&format!("{x} < {y}"), &d),
        Err("CEL evaluation error: no such overload: version < version".to_owned())
    );
}

#[test]
fn string_methods() {
    let cases: [(&str, bool); 9] = [
        ("'ens1f0'.startsWith('ens')", true),
        ("'ens1f0'.startsWith('f0')", false),
        ("'ens1f0'.endsWith('f0')", true),
        ("'ens1f0'.endsWith('ens')", false),
        ("'ens1f0'.contains('1f')", true),
        ("'ens1f0'.contains('2')", false),
        ("''.contains('')", true),
        ("!'abc'.contains('b')", false),
        (
            "device.driver.endsWith('.dev') && device.driver.startsWith('knic')",
            true,
        ),
    ];
    for (src, expected) in cases {
        assert_eq!(eval(src), Ok(expected), "{src}");
    }
    assert_eq!(
        eval("'a'.contains(1)"),
        Err("CEL evaluation error: no such overload: string.contains(int)".to_owned())
    );
}

#[test]
fn precedence() {
    // && binds tighter than ||.
    assert_eq!(eval("true || false && false"), Ok(true));
    assert_eq!(eval("(true || false) && false"), Ok(false));
    assert_eq!(eval("false && false || true"), Ok(true));
    assert_eq!(eval("false && (false || true)"), Ok(false));
    // Relations bind tighter than && and ||.
    assert_eq!(eval("1 == 1 && 2 == 2"), Ok(true));
    assert_eq!(eval("1 == 2 || 'a' in ['a']"), Ok(true));
    // ! binds tighter than relations: (!1) == 1, not !(1 == 1).
    assert_eq!(
        eval("!1 == 1"),
        Err("CEL evaluation error: no such overload: !int".to_owned())
    );
    assert_eq!(eval("!(1 == 1)"), Ok(false));
    assert_eq!(eval("!!true"), Ok(true));
    assert_eq!(eval("!!!true"), Ok(false));
    // Relations are left-associative: (1 == 1) == true.
    assert_eq!(eval("1 == 1 == true"), Ok(true));
    // Methods bind tighter than !.
    assert_eq!(eval("!'abc'.startsWith('a') == false"), Ok(true));
}

/// `false && error` is false and `true || error` is true, in either order; otherwise the
/// first error wins. Non-bool operands are errors too.
#[test]
fn logical_operators_absorb_errors() {
    const ERR: &str = r#"device.attributes["knic.dev"].missing"#;
    let err = missing("missing");
    let cases: [(String, Result<bool, String>); 16] = [
        (format!("false && {ERR}"), Ok(false)),
        (format!("{ERR} && false"), Ok(false)),
        (format!("true && {ERR}"), err.clone()),
        (format!("{ERR} && true"), err.clone()),
        (format!("true || {ERR}"), Ok(true)),
        (format!("{ERR} || true"), Ok(true)),
        (format!("false || {ERR}"), err.clone()),
        (format!("{ERR} || false"), err.clone()),
        (format!("true && {ERR} && false"), Ok(false)),
        (format!("false || {ERR} || true"), Ok(true)),
        (format!("{ERR} && 1"), err.clone()),
        ("1 && false".to_owned(), Ok(false)),
        ("'x' || true".to_owned(), Ok(true)),
        (
            "1 && true".to_owned(),
            Err("CEL evaluation error: no such overload: int && ...".to_owned()),
        ),
        (
            "false || 'x'".to_owned(),
            Err("CEL evaluation error: no such overload: string || ...".to_owned()),
        ),
        // Relations are strict: an error operand is an error.
        (format!("{ERR} == false"), err.clone()),
    ];
    for (src, expected) in cases {
        assert_eq!(eval(&src), expected, "{src}");
    }
    assert_eq!(eval("true && true && true"), Ok(true));
    assert_eq!(eval("false || false || false"), Ok(false));
}

#[test]
fn syntax_errors() {
    let cases: [(&str, usize, &str); 40] = [
        ("", 0, "empty expression"),
        ("  // only a comment", 0, "empty expression"),
        (
            "device.driver == ",
            17,
            "unexpected end of input, expected an expression",
        ),
        (
            r#"(device.driver == "a""#,
            21,
            "expected ')', found end of input",
        ),
        (
            r#"device.driver = "a""#,
            14,
            "'=' is not an operator; compare with '=='",
        ),
        ("true & false", 5, "'&' is not an operator; use '&&'"),
        ("true | false", 5, "'|' is not an operator; use '||'"),
        (r#""abc"#, 0, "unterminated string literal"),
        (r#"'abc""#, 0, "unterminated string literal"),
        (r#"x == r"abc"#, 5, "unterminated string literal"),
        (r#""abc\"#, 0, "unterminated string literal"),
        (r#""a\qb""#, 2, r"invalid escape sequence '\q'"),
        (
            r#""\u12""#,
            1,
            r"invalid escape sequence: '\u' needs 4 hex digits",
        ),
        (
            r#""\U0001F6""#,
            1,
            r"invalid escape sequence: '\U' needs 8 hex digits",
        ),
        (
            r#""\xg""#,
            1,
            r"invalid escape sequence: '\x' needs 2 hex digits",
        ),
        (
            r#""\ud800""#,
            1,
            "invalid escape sequence: U+D800 is not a Unicode scalar value",
        ),
        (
            r#""\U00110000""#,
            1,
            "invalid escape sequence: U+110000 is not a Unicode scalar value",
        ),
        (
            r#""\18""#,
            1,
            "invalid escape sequence: octal escapes need 3 digits",
        ),
        ("\"a\nb\"", 2, r"line break in string literal (write \n)"),
        (
            r#"device.driver == "a" "b""#,
            21,
            "expected an operator or the end of the expression, found string literal",
        ),
        (
            "true false",
            5,
            "expected an operator or the end of the expression, found identifier 'false'",
        ),
        (
            "device.",
            7,
            "expected a field name after '.', found end of input",
        ),
        (
            "device..driver",
            7,
            "expected a field name after '.', found '.'",
        ),
        (
            r#"device.attributes["knic.dev""#,
            28,
            "expected ']', found end of input",
        ),
        ("[1 2]", 3, "expected ',' or ']', found integer 2"),
        ("[1,", 3, "unexpected end of input, expected an expression"),
        ("[,]", 1, "expected an expression, found ','"),
        (
            r#""a".startsWith("a" "b")"#,
            19,
            "expected ',' or ')', found string literal",
        ),
        (
            r#""a".startsWith("b",)"#,
            19,
            "expected an expression, found ')'",
        ),
        (
            r#""a".startsWith()"#,
            4,
            "startsWith() takes 1 argument, got 0",
        ),
        (
            r#""a".contains("a", "b")"#,
            4,
            "contains() takes 1 argument, got 2",
        ),
        (
            r#"device.attributes["d"].?x.orValue()"#,
            26,
            "orValue() takes 1 argument, got 0",
        ),
        (
            r#"device.attributes["d"].?x.hasValue(1)"#,
            26,
            "hasValue() takes 0 arguments, got 1",
        ),
        (
            "9223372036854775808 == 1",
            0,
            "integer literal out of range",
        ),
        (
            "-9223372036854775809 == 1",
            1,
            "integer literal out of range",
        ),
        ("99999999999999999999", 0, "integer literal out of range"),
        ("0x == 1", 0, "expected hex digits after '0x'"),
        ("1 # 2", 2, "unexpected character '#'"),
        (")", 0, "expected an expression, found ')'"),
        ("!-1", 1, "expected an expression, found '-'"),
    ];
    for (src, at, message) in cases {
        assert_eq!(
            Selector::compile(src).map(|_| ()),
            Err(CelError::Syntax {
                at,
                message: message.to_owned()
            }),
            "{src:?}"
        );
        assert_eq!(
            compile_err(src),
            format!("CEL syntax error at byte {at}: {message}")
        );
    }
    assert_eq!(
        compile_err("é"),
        "CEL syntax error at byte 0: unexpected character 'é'"
    );
    assert_eq!(
        compile_err("in [1]"),
        "CEL syntax error at byte 0: expected an expression, found 'in'"
    );
    assert_eq!(
        compile_err("(true"),
        "CEL syntax error at byte 5: expected ')', found end of input"
    );
}

#[test]
fn unsupported_constructs() {
    let cases: [(&str, &str); 38] = [
        (
            r#"device.capacity["knic.dev"].x > 1"#,
            "device.capacity is not evaluated by knic (at byte 7)",
        ),
        (
            "device.allowMultipleAllocations",
            "device.allowMultipleAllocations is not evaluated by knic (at byte 7)",
        ),
        (
            r#"device.driver.matches("^k")"#,
            "matches() (regular expressions) is not evaluated by knic (at byte 14)",
        ),
        ("device.driver.size() > 1", "method size() (at byte 14)"),
        ("size(device.driver) > 1", "function 'size()' (at byte 0)"),
        (
            "cel.bind(x, 1, x == 1)",
            "identifier 'cel' (only 'device' is declared) (at byte 0)",
        ),
        ("1 + 2 == 3", "arithmetic operator '+' (at byte 2)"),
        ("2 - 1 == 1", "arithmetic operator '-' (at byte 2)"),
        ("2 * 1 == 2", "arithmetic operator '*' (at byte 2)"),
        ("2 / 1 == 2", "arithmetic operator '/' (at byte 2)"),
        ("2 % 1 == 0", "arithmetic operator '%' (at byte 2)"),
        (
            "true ? true : false",
            "the conditional operator '? :' (at byte 5)",
        ),
        (r#"{"a": 1}"#, "map literals (at byte 0)"),
        ("1.5 > 1", "floating-point literals (at byte 0)"),
        ("x == .5", "floating-point literals (at byte 5)"),
        ("1e3 > 1", "floating-point literals (at byte 0)"),
        ("1u > 0", "unsigned integer literals (at byte 0)"),
        (r#"b"x" == b"x""#, "bytes literals (at byte 0)"),
        (r#"rb'x' == b"x""#, "bytes literals (at byte 0)"),
        (r#""""x""" == "x""#, "triple-quoted strings (at byte 0)"),
        (r#"r'''x''' == "x""#, "triple-quoted strings (at byte 0)"),
        ("null == 1", "the null literal (at byte 0)"),
        (
            "foo == 1",
            "identifier 'foo' (only 'device' is declared) (at byte 0)",
        ),
        (
            r#".device.driver == "x""#,
            "leading '.' (root-scoped identifiers) (at byte 0)",
        ),
        ("Foo{}", "message literals (at byte 0)"),
        (
            "device == 1",
            "'device' used as a value (select .driver or .attributes) (at byte 0)",
        ),
        (
            "device.attributes == 1",
            "device.attributes used as a value (index it with a domain) (at byte 0)",
        ),
        (
            r#"device.attributes["d"] == 1"#,
            r#"device.attributes["d"] used as a value (select an attribute) (at byte 0)"#,
        ),
        (
            r#"device.attributes["d"].?x == 1"#,
            r#"optional device.attributes["d"].?x used without .orValue() (at byte 0)"#,
        ),
        (
            r#"device.attributes["d"].?x.orValue(device.driver)"#,
            "orValue() with a default that is not a literal (at byte 26)",
        ),
        (
            "device.attributes[device.driver].x == 1",
            "an attribute map indexed by something other than a string literal (at byte 17)",
        ),
        (
            "device.driver[0] == 1",
            "indexing anything but device.attributes and its domains (at byte 13)",
        ),
        (
            r#"device.attributes["d"].x.y"#,
            "field selection .y on a value that is not an attribute map (at byte 25)",
        ),
        (
            "device.?driver",
            "optional selection device.?driver (at byte 8)",
        ),
        (
            "device.attributes.?d.x",
            "optional selection of an attribute domain (device.attributes.?d) (at byte 19)",
        ),
        (
            r#"device.attributes[?"d"].x"#,
            "optional index of an attribute domain (device.attributes[?...]) (at byte 17)",
        ),
        (
            "has(device.driver)",
            r#"has() of anything but device.attributes["DOMAIN"].NAME (at byte 4)"#,
        ),
        (
            r#"has(device.attributes["d"]["x"])"#,
            r#"has() of anything but device.attributes["DOMAIN"].NAME (at byte 4)"#,
        ),
    ];
    for (src, message) in cases {
        assert_eq!(
            Selector::compile(src).map(|_| ()),
            Err(CelError::Unsupported(message.to_owned())),
            "{src:?}"
        );
        assert_eq!(compile_err(src), format!("unsupported CEL: {message}"));
    }
    assert_eq!(
        compile_err(r#"device.attributes["d"].?x.foo()"#),
        "unsupported CEL: method foo() on an optional value (at byte 26)"
    );
    assert_eq!(
        compile_err("device.attributes.size()"),
        "unsupported CEL: method size() on device or an attribute map (at byte 18)"
    );
}

#[test]
fn nesting_is_bounded() {
    let parens = |n: usize| format!("{}true{}", "(".repeat(n), ")".repeat(n));
    assert_eq!(eval(&parens(63)), Ok(true));
    assert_eq!(
        compile_err(&parens(64)),
        "unsupported CEL: nesting deeper than 64 levels (at byte 64)"
    );
    let lists = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
    assert_eq!(
        eval(&lists(63)),
        Err("CEL evaluation error: selector evaluated to list, not bool".to_owned())
    );
    assert_eq!(
        compile_err(&lists(64)),
        "unsupported CEL: nesting deeper than 64 levels (at byte 64)"
    );
    // Operators applied to operators nest the tree without nesting the parser.
    let nots = |n: usize| format!("{}true", "!".repeat(n));
    assert_eq!(eval(&nots(63)), Ok(false));
    assert_eq!(
        compile_err(&nots(64)),
        "unsupported CEL: nesting deeper than 64 levels (at byte 0)"
    );
    let relations = |n: usize| format!("true{}", " == true".repeat(n));
    assert_eq!(eval(&relations(63)), Ok(true));
    assert_eq!(
        compile_err(&relations(64)),
        "unsupported CEL: nesting deeper than 64 levels (at byte 509)"
    );
    // `has(` nests the parser without passing through a whole expression.
    let has = |n: usize| format!("{}x{}", "has(".repeat(n), ")".repeat(n));
    assert!(compile_err(&has(64)).starts_with("unsupported CEL: nesting deeper than 64"));
    assert!(compile_err(&has(100_000)).starts_with("unsupported CEL: nesting deeper"));
    let methods = |n: usize| format!("'a'{}", ".contains('a')".repeat(n));
    assert!(compile_err(&methods(64)).starts_with("unsupported CEL: nesting deeper than 64"));
    // Hostile sizes return errors instead of overflowing the stack.
    for hostile in [
        parens(100_000),
        lists(100_000),
        nots(100_000),
        format!("{}1 == 1", "-".repeat(100_000)),
        relations(100_000),
        methods(100_000),
        format!("{}true", "(!".repeat(50_000)),
        format!(
            "'a'.contains({}'a'{})",
            "(".repeat(100_000),
            ")".repeat(100_000)
        ),
    ] {
        assert!(
            compile_err(&hostile).starts_with("unsupported CEL: nesting deeper than 64 levels"),
            "{}",
            &hostile[..20]
        );
    }
    // Long flat chains of && and || are not deep.
    let long = vec![E1; 10_000].join(" && ");
    assert_eq!(on(&long, &intel_nic()), Ok(true));
    assert_eq!(on(&long, &gpu()), Ok(false));
    let long = vec![E3; 10_000].join(" || ");
    assert_eq!(on(&long, &mlx_vf()), Ok(true));
    assert_eq!(on(&long, &bare()), missing("kind"));
}

/// A small xorshift generator, so the fuzz test is repeatable without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n.max(1)).expect("fits");
        usize::try_from(self.next() % n).expect("fits")
    }

    /// A char boundary of `s` (its length included).
    fn boundary(&mut self, s: &str) -> usize {
        let mut at = self.below(s.len() + 1);
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        at
    }
}

/// Truncated and mutated versions of the examples compile to errors or selectors that
/// evaluate to results or errors; nothing panics, and syntax errors point into the text.
#[test]
fn mutated_examples_never_panic() {
    let devices = [intel_nic(), intel_pf_slow(), mlx_vf(), bare(), gpu()];
    let mut outcomes = BTreeMap::<&str, usize>::new();
    let mut check = |src: &str| match Selector::compile(src) {
        Ok(selector) => {
            for d in &devices {
                let kind = match selector.matches(d) {
                    Ok(_) => "evaluated",
                    Err(CelError::Eval(m)) => {
                        assert!(!m.is_empty());
                        "eval error"
                    }
                    Err(other) => panic!("{src:?} evaluated to {other:?}"),
                };
                *outcomes.entry(kind).or_default() += 1;
            }
        }
        Err(CelError::Syntax { at, message }) => {
            assert!(at <= src.len(), "{src:?}: {at} {message}");
            assert!(!message.is_empty());
            *outcomes.entry("syntax").or_default() += 1;
        }
        Err(CelError::Unsupported(m)) => {
            assert!(m.contains("(at byte "), "{src:?}: {m}");
            *outcomes.entry("unsupported").or_default() += 1;
        }
        Err(CelError::Eval(m)) => panic!("{src:?} failed to compile with {m}"),
    };
    for example in EXAMPLES {
        for end in 0..=example.len() {
            check(&example[..end]);
            check(&example[end..]);
        }
    }
    let fragments = [
        "(",
        ")",
        "[",
        "]",
        ".",
        ".?",
        "?",
        ":",
        "!",
        "-",
        "&&",
        "||",
        "==",
        "!=",
        "<",
        " in ",
        "\"",
        "'",
        "\\",
        "\\u",
        "\\U0010",
        "r\"",
        "1",
        "-1",
        "0x",
        "99999999999999999999",
        "1.5",
        "device",
        ".attributes",
        "[\"knic.dev\"]",
        ".orValue(",
        ",",
        "é",
        "😀",
        "//",
        "\n",
        "has(",
        "true",
        "{",
        "+",
        " ",
        ".contains(",
        ".matches(",
        "null",
        "[?",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let mut src = EXAMPLES[rng.below(EXAMPLES.len())].to_owned();
        for _ in 0..1 + rng.below(3) {
            match rng.below(4) {
                0 => {
                    let at = rng.boundary(&src);
                    src.truncate(at);
                }
                1 => {
                    let (a, b) = (rng.boundary(&src), rng.boundary(&src));
                    src.replace_range(a.min(b)..a.max(b), "");
                }
                2 => {
                    let at = rng.boundary(&src);
                    src.insert_str(at, fragments[rng.below(fragments.len())]);
                }
                _ => {
                    let (a, b) = (rng.boundary(&src), rng.boundary(&src));
                    let piece = src[a.min(b)..a.max(b)].to_owned();
                    let at = rng.boundary(&src);
                    src.insert_str(at, &piece);
                }
            }
        }
        check(&src);
    }
    // Every kind of outcome happened often, so the loop did exercise all the paths.
    for kind in ["evaluated", "eval error", "syntax", "unsupported"] {
        assert!(
            outcomes.get(kind).copied().unwrap_or(0) > 50,
            "{kind}: {outcomes:?}"
        );
    }
}
