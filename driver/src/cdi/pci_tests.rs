//! The CDI edits of vfio-pci functions and RDMA devices, and every spec shape knic writes
//! checked against the CDI specification's own JSON schema (`tests/fixtures/cdi/`).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::*;
use crate::claims::checkpoint::Attachment;
use crate::claims::functions::PciFunction;
use crate::netns::fake::plan;
use crate::sriov::rdma::RdmaDevice;
use crate::sriov::vfio::VfioBinding;
use knic_proto::netconfig::DeviceMode;

const VALIDATE: &str = r#"
import json, pathlib, sys
try:
    import jsonschema
    from referencing import Registry
    from referencing.jsonschema import DRAFT7
except ImportError as e:
    print(f"python3 cannot import jsonschema ({e}): install it with `python3 -m pip install 'jsonschema>=4.18'` (CI installs jsonschema==4.26.0 from PyPI)")
    sys.exit(3)
d = pathlib.Path(sys.argv[1])
schema = json.loads((d / "schema.json").read_text())
defs = json.loads((d / "defs.json").read_text())
registry = Registry().with_resource("defs.json", DRAFT7.create_resource(defs))
validator = jsonschema.Draft7Validator(schema, registry=registry)
errors = sorted(validator.iter_errors(json.load(sys.stdin)), key=lambda e: list(e.absolute_path))
for e in errors:
    print("/".join(str(p) for p in e.absolute_path), e.message)
sys.exit(1 if errors else 0)
"#;

/// The CDI schema's verdict on `spec`: `Ok` or the validator's messages. Panics with the
/// install instruction when Python's `jsonschema` is missing: the check must not pass
/// silently.
pub(crate) fn schema_verdict(spec: &Value) -> std::result::Result<(), String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cdi");
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(VALIDATE)
        .arg(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed to validate CDI specs against the CDI JSON schema");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(spec.to_string().as_bytes())
        .expect("write spec");
    let out = child.wait_with_output().expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    match out.status.code() {
        Some(0) => Ok(()),
        Some(1) => Err(text),
        _ => panic!("{text}{}", String::from_utf8_lossy(&out.stderr)),
    }
}

/// Schema-valid, and the shapes the schema leaves open are right: env entries `NAME=value`,
/// device node paths absolute.
pub(crate) fn assert_valid_cdi(spec: &Value) {
    if let Err(e) = schema_verdict(spec) {
        panic!("the CDI spec fails the CDI JSON schema:\n{e}\n{spec:#}");
    }
    for device in spec["devices"].as_array().expect("devices") {
        let edits = &device["containerEdits"];
        for env in edits["env"].as_array().into_iter().flatten() {
            let env = env.as_str().expect("env entries are strings");
            let (name, _) = env.split_once('=').expect("NAME=value");
            assert!(
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
                "{env}"
            );
        }
        for node in edits["deviceNodes"].as_array().into_iter().flatten() {
            assert!(
                node["path"].as_str().expect("path").starts_with("/dev/"),
                "{node}"
            );
        }
    }
}

fn function(device: &str, request: &str, address: &str, group: Option<u32>) -> PciFunction {
    PciFunction {
        device: device.into(),
        request: request.into(),
        pci_address: address.into(),
        mode: if group.is_some() {
            DeviceMode::VfioPci
        } else {
            DeviceMode::Netdev
        },
        vfio: group.map(|group| VfioBinding {
            group,
            original_driver: Some("mlx5_core".into()),
        }),
        rdma: Vec::new(),
        mac: None,
    }
}

/// A claim with one RDMA netdev (`dev-0` as `net1`) and two vfio-pci functions.
fn claim() -> PreparedClaim {
    let mut rdma = function("dev-0", "rdma", "0000:3b:00.3", None);
    rdma.rdma = vec![RdmaDevice {
        name: "mlx5_3".into(),
        uverbs: vec!["uverbs3".into()],
    }];
    PreparedClaim {
        network_label: None,
        namespace: "ns".into(),
        name: "c".into(),
        uid: "u1".into(),
        pod_uid: "p".into(),
        pod_name: "pod".into(),
        devices: vec![],
        configs: vec![],
        prepared_at: 0,
        attachments: vec![Attachment::planned(plan("dev-0", "eth0", "net1", &[]))],
        allocations: vec![],
        functions: vec![
            rdma,
            function("vf-a", "dpdk-a", "0000:3b:00.2", Some(200)),
            function("vf-b", "dpdk-b/fast", "0000:a2:01.0", Some(180)),
        ],
    }
}

#[test]
fn a_vfio_function_gets_its_group_the_container_device_and_its_address() {
    let spec = spec(&claim(), Path::new("/hook"));
    let devices = spec["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 3);
    assert_eq!(
        devices[1],
        json!({
            "name": "u1-vfio-1",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/vfio/200"}, {"path": "/dev/vfio/vfio"}],
                "env": [
                    "KNIC_PCI_ADDRESS_DPDK_A=0000:3b:00.2",
                    "PCIDEVICE_KNIC_DEV=0000:3b:00.2,0000:a2:01.0",
                ],
            }
        })
    );
    assert_eq!(
        devices[2]["containerEdits"]["env"][0],
        "KNIC_PCI_ADDRESS_DPDK_B=0000:a2:01.0"
    );
    // No interface to check: no hook.
    assert!(devices[1]["containerEdits"].get("hooks").is_none());
    assert_eq!(
        CdiSpecs::vfio_device_id("u1", 1),
        "knic.dev/interface=u1-vfio-1"
    );
    assert_valid_cdi(&spec);
}

#[test]
fn an_rdma_netdev_keeps_its_hook_and_gets_the_verbs_devices() {
    let spec = spec(&claim(), Path::new("/hook"));
    let edits = &spec["devices"][0]["containerEdits"];
    assert_eq!(edits["hooks"][0]["hookName"], "createRuntime");
    assert_eq!(
        edits["deviceNodes"],
        json!([{"path": "/dev/infiniband/uverbs3"}, {"path": "/dev/infiniband/rdma_cm"}])
    );
    assert_eq!(edits["env"], json!(["KNIC_RDMA_DEVICES_NIC=mlx5_3"]));
}

#[test]
fn every_spec_shape_is_valid_against_the_cdi_schema() {
    // Netdev only (the existing shape), vfio only, and the mix above.
    let mut netdev = claim();
    netdev.functions.clear();
    assert_valid_cdi(&spec(&netdev, Path::new("/hook")));
    let mut vfio = claim();
    vfio.attachments.clear();
    vfio.functions.remove(0);
    assert_valid_cdi(&spec(&vfio, Path::new("/hook")));
    // The validator is not vacuous: a device node without its path, an unknown top-level
    // field and a device without edits are refused.
    let mut bad = spec(&vfio, Path::new("/hook"));
    bad["devices"][0]["containerEdits"]["deviceNodes"][0] = json!({"hostPath": "/dev/vfio/200"});
    bad["extra"] = json!(1);
    bad["devices"][1] = json!({"name": "x"});
    let verdict = schema_verdict(&bad).expect_err("invalid");
    for expected in [
        " Additional properties are not allowed ('extra' was unexpected)",
        "devices/0/containerEdits/deviceNodes/0 'path' is a required property",
        "devices/1 'containerEdits' is a required property",
    ] {
        assert!(verdict.contains(expected), "{verdict}");
    }
}

#[test]
fn a_claim_with_only_vfio_functions_gets_a_spec_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let specs = CdiSpecs::new(dir.path(), "/hook");
    let mut vfio = claim();
    vfio.attachments.clear();
    specs.write(&vfio, None).expect("write");
    let written: Value =
        serde_json::from_slice(&std::fs::read(specs.path("u1")).expect("read")).expect("json");
    assert_eq!(written["devices"].as_array().map(Vec::len), Some(2));
    assert_valid_cdi(&written);
    let mut none = claim();
    none.attachments.clear();
    none.functions.truncate(1);
    specs.remove("u1").expect("remove");
    specs.write(&none, None).expect("nothing to write");
    assert!(!specs.path("u1").exists());
}

#[test]
fn several_devices_of_one_request_share_one_variable_with_all_their_values() {
    // `count: 2`: both devices set KNIC_PCI_ADDRESS_DPDK, so each must carry both addresses
    // (the runtime keeps whichever edit comes last).
    let mut claim = claim();
    claim.functions[2].request = "dpdk-a".into();
    let spec = spec(&claim, Path::new("/hook"));
    let devices = spec["devices"].as_array().expect("devices");
    for device in &devices[1..] {
        assert_eq!(
            device["containerEdits"]["env"][0], "KNIC_PCI_ADDRESS_DPDK_A=0000:3b:00.2,0000:a2:01.0",
            "{device}"
        );
    }
    assert_valid_cdi(&spec);
}
