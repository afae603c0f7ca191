use std::os::unix::fs::MetadataExt;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use serde_json::json;

use super::*;
use crate::cdi::CdiSpecs;
use crate::claims::checkpoint::{Attachment, PreparedDevice};
use crate::claims::functions::PciFunction;
use crate::netns::AttachMode;
use crate::netns::fake::plan;

fn published(mac: &str, pci: &str) -> Device {
    let mut attributes = std::collections::BTreeMap::new();
    attributes.insert(
        "mac".to_owned(),
        DeviceAttribute {
            string: Some(mac.into()),
            ..Default::default()
        },
    );
    attributes.insert(
        "resource.kubernetes.io/pciBusID".to_owned(),
        DeviceAttribute {
            string: Some(pci.into()),
            ..Default::default()
        },
    );
    attributes.insert(
        "mtu".to_owned(),
        DeviceAttribute {
            int: Some(1500),
            ..Default::default()
        },
    );
    Device {
        name: "x".into(),
        attributes: Some(attributes),
        ..Default::default()
    }
}

fn device(request: &str, name: &str, mac: &str, pci: &str) -> PreparedDevice {
    PreparedDevice {
        request: request.into(),
        pool: "node-a".into(),
        device: name.into(),
        share_id: None,
        consumed: Default::default(),
        published: Some(published(mac, pci)),
    }
}

/// Request `nic` with a moved VF and a macvlan child (no MAC until attach), request `dpdk/fast`
/// (a subrequest) with a function on vfio-pci.
fn claim() -> PreparedClaim {
    let mut child = plan("vf-1", "enp1s0v1", "net2", &[]);
    child.mode = AttachMode::Child {
        child: knic_proto::netconfig::ChildKind::Macvlan("bridge".into()),
        uplink: None,
    };
    PreparedClaim {
        network_label: None,
        namespace: "team".into(),
        name: "pod-a-net-x7k2p".into(),
        uid: "0f1e2d3c-aaaa-bbbb-cccc-000000000001".into(),
        pod_uid: "p".into(),
        pod_name: "pod-a".into(),
        devices: vec![
            device("nic", "vf-0", "02:00:00:00:00:10", "0000:3b:02.0"),
            device("nic", "vf-1", "02:00:00:00:00:11", "0000:3b:02.1"),
            device("dpdk/fast", "vf-2", "02:00:00:00:00:12", "0000:3b:02.2"),
        ],
        configs: vec![],
        prepared_at: 0,
        attachments: vec![
            Attachment::planned(plan("vf-0", "enp1s0v0", "net1", &["192.0.2.10/24"])),
            Attachment::planned(child),
        ],
        allocations: vec![],
        functions: vec![PciFunction {
            device: "vf-2".into(),
            request: "dpdk/fast".into(),
            pci_address: "0000:3b:02.2".into(),
            mode: knic_proto::netconfig::DeviceMode::VfioPci,
            vfio: Some(crate::sriov::vfio::VfioBinding {
                group: 42,
                original_driver: Some("iavf".into()),
            }),
            rdma: vec![],
            mac: None,
        }],
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("read")).expect("json")
}

#[test]
fn template_claims_get_one_file_per_request_at_the_kep_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metadata = Metadata::new(dir.path());
    let claim = claim();
    let mounts = metadata.ensure(&claim, Some("net")).expect("ensure");
    let uid = &claim.uid;
    assert_eq!(
        mounts,
        vec![
            Mount {
                request: "nic".into(),
                host_path: dir.path().join(uid).join("nic").join(FILE_NAME),
                container_path: "/var/run/kubernetes.io/dra-device-attributes/\
                                 resourceclaimtemplates/net/nic/knic.dev-metadata.json"
                    .into(),
            },
            Mount {
                request: "dpdk".into(),
                host_path: dir.path().join(uid).join("dpdk").join(FILE_NAME),
                container_path: "/var/run/kubernetes.io/dra-device-attributes/\
                                 resourceclaimtemplates/net/dpdk/knic.dev-metadata.json"
                    .into(),
            },
        ]
    );
    let nic = read_json(&mounts[0].host_path);
    assert_eq!(
        nic,
        json!({
            "apiVersion": "metadata.resource.k8s.io/v1alpha1",
            "kind": "DeviceMetadata",
            "metadata": {"name": "pod-a-net-x7k2p", "namespace": "team", "uid": uid,
                         "generation": 1},
            "podClaimName": "net",
            "requests": [{"name": "nic", "devices": [
                {"driver": "knic.dev", "pool": "node-a", "name": "vf-0",
                 "attributes": {"mac": {"string": "02:00:00:00:00:10"}, "mtu": {"int": 1500},
                                "resource.kubernetes.io/pciBusID": {"string": "0000:3b:02.0"}},
                 // A moved device keeps its MAC: known before attach.
                 "networkData": {"interfaceName": "net1", "ips": ["192.0.2.10/24"],
                                 "hardwareAddress": "02:00:00:00:00:10"}},
                {"driver": "knic.dev", "pool": "node-a", "name": "vf-1",
                 "attributes": {"mac": {"string": "02:00:00:00:00:11"}, "mtu": {"int": 1500},
                                "resource.kubernetes.io/pciBusID": {"string": "0000:3b:02.1"}},
                 // A child's MAC is the kernel's pick: only after attach.
                 "networkData": {"interfaceName": "net2"}},
            ]}],
        })
    );
    let dpdk = read_json(&mounts[1].host_path);
    assert_eq!(
        dpdk["requests"][0]["name"], "dpdk/fast",
        "the full request reference"
    );
    let vf2 = &dpdk["requests"][0]["devices"][0];
    assert_eq!(vf2["attributes"]["vfioGroup"], json!({"int": 42}));
    assert_eq!(
        vf2["attributes"]["deviceMode"],
        json!({"string": "vfio-pci"})
    );
    assert_eq!(
        vf2["attributes"]["resource.kubernetes.io/pciBusID"],
        json!({"string": "0000:3b:02.2"})
    );
    assert!(vf2.get("networkData").is_none(), "{vf2}");
}

#[test]
fn a_direct_claim_is_under_its_name_and_a_repeated_prepare_keeps_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metadata = Metadata::new(dir.path());
    let claim = claim();
    let first = metadata.ensure(&claim, None).expect("ensure");
    assert_eq!(
        first[0].container_path,
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/pod-a-net-x7k2p/nic/\
         knic.dev-metadata.json"
    );
    // A template claim prepared again from the checkpoint (no annotation at hand): the file
    // written at first prepare keeps its path, and its raised generation.
    let dir2 = tempfile::tempdir().expect("tempdir");
    let metadata = Metadata::new(dir2.path());
    metadata.ensure(&claim, Some("net")).expect("ensure");
    metadata
        .update(
            &claim,
            &[NetworkData {
                device: "vf-1".into(),
                interface_name: Some("net2".into()),
                ips: vec![],
                hardware_address: Some("5a:11:22:33:44:55".into()),
            }],
        )
        .expect("update");
    let again = metadata.ensure(&claim, None).expect("ensure");
    assert!(
        again[0]
            .container_path
            .contains("/resourceclaimtemplates/net/nic/")
    );
    assert_eq!(read_json(&again[0].host_path)["metadata"]["generation"], 2);
    assert_eq!(metadata.present(&claim), vec!["nic", "dpdk"]);
}

#[test]
fn an_update_raises_the_generation_only_on_change_and_keeps_the_inode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metadata = Metadata::new(dir.path());
    let claim = claim();
    let mounts = metadata.ensure(&claim, Some("net")).expect("ensure");
    let inode = std::fs::metadata(&mounts[0].host_path).expect("stat").ino();
    let attached = NetworkData {
        device: "vf-1".into(),
        interface_name: Some("net2".into()),
        ips: vec!["198.51.100.7/24".into()],
        hardware_address: Some("5a:11:22:33:44:55".into()),
    };
    metadata
        .update(&claim, std::slice::from_ref(&attached))
        .expect("update");
    let nic = read_json(&mounts[0].host_path);
    assert_eq!(nic["metadata"]["generation"], 2);
    assert_eq!(
        nic["requests"][0]["devices"][1]["networkData"],
        json!({"interfaceName": "net2", "ips": ["198.51.100.7/24"],
               "hardwareAddress": "5a:11:22:33:44:55"})
    );
    // The bind mount in a running container holds this inode: it must be the same file.
    assert_eq!(
        std::fs::metadata(&mounts[0].host_path).expect("stat").ino(),
        inode
    );
    // The same data again (a live update that changed routes only): no new generation.
    metadata.update(&claim, &[attached]).expect("update");
    assert_eq!(read_json(&mounts[0].host_path)["metadata"]["generation"], 2);
    // The vfio request had nothing to change.
    assert_eq!(read_json(&mounts[1].host_path)["metadata"]["generation"], 1);
    // A shorter document leaves no tail of the longer one.
    metadata.update(&claim, &[]).expect("update");
    assert_eq!(read_json(&mounts[0].host_path)["metadata"]["generation"], 3);
}

#[test]
fn a_corrupt_file_is_written_again_and_files_are_removed_and_swept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metadata = Metadata::new(dir.path());
    let claim = claim();
    let mounts = metadata.ensure(&claim, Some("net")).expect("ensure");
    std::fs::write(&mounts[0].host_path, b"{\"apiVersion\": \"metadata.res").expect("corrupt");
    metadata.ensure(&claim, Some("net")).expect("ensure");
    assert_eq!(read_json(&mounts[0].host_path)["metadata"]["generation"], 1);

    let mut other = claim.clone();
    other.uid = "0f1e2d3c-aaaa-bbbb-cccc-000000000002".into();
    metadata.ensure(&other, None).expect("ensure");
    std::fs::create_dir(dir.path().join("not a uid")).expect("foreign dir");
    let removed = metadata.sweep(&|uid| uid == claim.uid).expect("sweep");
    assert_eq!(removed, vec![other.uid.clone()]);
    assert!(dir.path().join(&claim.uid).is_dir());
    assert!(
        dir.path().join("not a uid").is_dir(),
        "not knic's: left alone"
    );
    metadata.remove(&claim.uid).expect("remove");
    metadata
        .remove(&claim.uid)
        .expect("a second remove is fine");
    assert!(!dir.path().join(&claim.uid).exists());
    assert!(metadata.present(&claim).is_empty());
}

#[test]
fn names_that_are_not_dns_names_never_become_paths() {
    let metadata = Metadata::new("/m");
    let err = metadata.file("../x", "nic").expect_err("uid");
    assert_eq!(
        err.to_string(),
        "naming a device metadata file: claim UID \"../x\" is not a DNS name (letters, digits, \
         '-' and '.')"
    );
    let err = metadata.file("u1", "..").expect_err("request");
    assert_eq!(
        err.to_string(),
        "naming a device metadata file: request \"..\" is not a DNS name (letters, digits, '-' \
         and '.')"
    );
    assert_eq!(
        metadata.file("u1", "nic/sub").expect("subrequest"),
        Path::new("/m/u1/nic/knic.dev-metadata.json")
    );
}

#[test]
fn the_spec_mounts_each_request_read_only_and_the_answer_names_it_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let specs = CdiSpecs::new(dir.path().join("cdi"), "/hook")
        .with_metadata(Metadata::new(dir.path().join("meta")));
    let claim = claim();
    let requests = specs.write(&claim, Some("net")).expect("write");
    assert_eq!(requests, vec!["nic", "dpdk"]);
    let spec = read_json(&specs.path(&claim.uid));
    let devices = spec["devices"].as_array().expect("devices");
    let meta: Vec<&Value> = devices
        .iter()
        .filter(|d| d["name"].as_str().is_some_and(|n| n.contains("-meta-")))
        .collect();
    assert_eq!(meta.len(), 2);
    assert_eq!(meta[0]["name"], format!("{}-meta-nic", claim.uid));
    assert_eq!(
        meta[0]["containerEdits"]["mounts"],
        json!([{
            "hostPath": dir.path().join("meta").join(&claim.uid).join("nic").join(FILE_NAME),
            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/\
                              resourceclaimtemplates/net/nic/knic.dev-metadata.json",
            "options": ["ro", "bind"],
        }])
    );
    let answers = crate::claims::answer::answer_with_cdi(&claim, &requests);
    let ids: Vec<&Vec<String>> = answers.iter().map(|a| &a.cdi_device_ids).collect();
    assert_eq!(
        ids,
        vec![
            &vec![
                CdiSpecs::device_id(&claim.uid, 0),
                format!("knic.dev/interface={}-meta-nic", claim.uid),
            ],
            // The request's second device: its file is mounted once, by the first.
            &vec![CdiSpecs::device_id(&claim.uid, 1)],
            &vec![
                CdiSpecs::vfio_device_id(&claim.uid, 0),
                format!("knic.dev/interface={}-meta-dpdk", claim.uid),
            ],
        ]
    );
    specs.remove(&claim.uid).expect("remove");
    assert!(!dir.path().join("meta").join(&claim.uid).exists());
}

#[test]
fn a_pod_claim_name_that_is_not_a_dns_label_never_becomes_a_container_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metadata = Metadata::new(dir.path());
    let claim = claim();
    let mounts = metadata.ensure(&claim, Some("../../etc")).expect("ensure");
    assert_eq!(
        mounts[0].container_path,
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/pod-a-net-x7k2p/nic/\
         knic.dev-metadata.json"
    );
    assert!(
        read_json(&mounts[0].host_path)
            .get("podClaimName")
            .is_none()
    );
}
