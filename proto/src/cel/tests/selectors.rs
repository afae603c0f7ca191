//! The selectors knic ships and generates, against the devices they are meant for, and devices
//! built from ResourceSlices.

use super::*;

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
    use crate::network::{
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
    let yaml = include_str!("../../../../deviceclasses/knic.yaml");
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
    // The node's overlay device (issue 26), as the driver is to publish it.
    let overlay = knic(&[
        ("kind", s("overlay")),
        ("vtep", s("192.168.10.12")),
        ("mtu", i(1450)),
    ]);
    let table: [(&str, [Result<bool, ()>; 6]); 5] = [
        (
            "knic.dev",
            [Ok(true), Ok(true), Ok(true), Ok(true), Ok(false), Ok(false)],
        ),
        (
            "nic.knic.dev",
            [Ok(true), Ok(true), Ok(false), Err(()), Ok(false), Ok(false)],
        ),
        (
            "vf.knic.dev",
            [
                Ok(false),
                Ok(false),
                Ok(true),
                Err(()),
                Ok(false),
                Ok(false),
            ],
        ),
        (
            "rdma.knic.dev",
            [
                Ok(true),
                Ok(true),
                Ok(false),
                Ok(false),
                Ok(false),
                Ok(false),
            ],
        ),
        (
            "overlay.knic.dev",
            [
                Ok(false),
                Ok(false),
                Ok(false),
                Err(()),
                Ok(false),
                Ok(true),
            ],
        ),
    ];
    assert_eq!(classes.len(), table.len());
    for (class, expected) in table {
        let got: Vec<Result<bool, ()>> = [&nic, &pf, &vf, &bare, &gpu, &overlay]
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
    let yaml = include_str!("../../../../deviceclasses/sriov.yaml");
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
    let example = include_str!("../../../../deviceclasses/examples/vf-near-gpu.yaml");
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
