use std::collections::BTreeSet;

use serde_json::json;

use super::super::tests::{claim, config, device};
use super::super::{IpamAddresses, configure, plans};
use super::*;
use crate::claims::ipam::{Allocation, OverlayFacts};

const MAC: [u8; 6] = [2, 0x5e, 0x1c, 0x9a, 0x33, 7];

fn overlay_device() -> PreparedDevice {
    let mut d = device("network", "overlay", None);
    d.published = Some(
        serde_json::from_value(json!({"name": "overlay", "attributes": {
            "kind": {"string": "overlay"},
            "ifName": {"string": "eth0"},
            "vtep": {"string": "10.99.0.1"},
            "mtu": {"int": 1450},
            "shareable": {"bool": true},
        }}))
        .expect("device"),
    );
    d
}

fn addressing(overlay: bool) -> IpamAddresses {
    IpamAddresses::from([(
        0,
        Addressing {
            allocations: vec![Allocation {
                network: "ovl".into(),
                name: "ovl-10-42-0-17".into(),
                uid: "a-uid".into(),
                address: "10.42.0.17/24".parse().unwrap(),
                identity: None,
            }],
            routes: vec![],
            overlay: overlay.then_some(OverlayFacts {
                vni: 4242,
                port: 4789,
                mac: MAC,
            }),
        },
    )])
}

fn errors(body: serde_json::Value, ipam: &IpamAddresses) -> Vec<String> {
    let c = claim(vec![overlay_device()], vec![config("FromClaim", &[], body)]);
    match plans(&c, &configure(&c), &BTreeSet::new(), ipam) {
        Ok(p) => panic!("planned: {p:?}"),
        Err(e) => {
            e.0.iter()
                .map(|f| format!("{}: {}", f.path, f.message))
                .collect()
        }
    }
}

#[test]
fn an_overlay_claim_gets_a_veth_on_its_vnis_segment_with_the_announced_mac() {
    let c = claim(
        vec![overlay_device()],
        vec![config(
            "FromClaim",
            &[],
            json!({"ipam": {"network": "ovl"}}),
        )],
    );
    let p = plans(&c, &configure(&c), &BTreeSet::new(), &addressing(true)).expect("plans");
    assert_eq!(p.len(), 1);
    let p = &p[0];
    assert_eq!(
        p.mode,
        AttachMode::Overlay {
            segment: Segment::new(4242, 4789, "10.99.0.1".parse().unwrap(), "eth0", 1450),
            host_veth: host_veth("u", 0),
        }
    );
    assert_eq!((p.mtu, p.mac), (Some(1450), Some(MAC)));
    assert_eq!(p.host_ifname, "eth0");
    assert_eq!(p.addresses, vec!["10.42.0.17/24".parse().unwrap()]);
    // A smaller MTU is the claim's to choose.
    let c = claim(
        vec![overlay_device()],
        vec![config(
            "FromClaim",
            &[],
            json!({"ipam": {"network": "ovl"}, "interface": {"mtu": 1400}}),
        )],
    );
    let p = plans(&c, &configure(&c), &BTreeSet::new(), &addressing(true)).expect("plans");
    assert_eq!(p[0].mtu, Some(1400));
}

#[test]
fn host_veth_names_are_short_stable_and_distinct() {
    let a = host_veth("0b8f0c8e-0000-4000-8000-000000000001", 0);
    assert_eq!(a, host_veth("0b8f0c8e-0000-4000-8000-000000000001", 0));
    assert_ne!(a, host_veth("0b8f0c8e-0000-4000-8000-000000000001", 1));
    assert_ne!(a, host_veth("0b8f0c8e-0000-4000-8000-000000000002", 0));
    assert_eq!(a.len(), 15);
    assert!(a.starts_with("knh"));
}

#[test]
fn what_an_overlay_interface_cannot_be_is_refused_naming_the_field() {
    let ipam = addressing(true);
    assert_eq!(
        errors(
            json!({"ipam": {"network": "ovl"}, "interface": {"mtu": 9000}}),
            &ipam
        ),
        vec![
            "request network: interface.mtu: 9000 is more than the overlay on this node carries \
             (1450: its underlay eth0 less the VXLAN encapsulation)"
        ]
    );
    assert_eq!(
        errors(
            json!({"ipam": {"network": "ovl"}, "interface": {"hardwareAddress": "02:00:00:00:00:01"}}),
            &ipam
        ),
        vec![
            "request network: interface.hardwareAddress: an overlay interface's MAC is derived \
             from its Network and pod and announced to the other nodes; leave it unset"
        ]
    );
    assert_eq!(
        errors(
            json!({"ipam": {"network": "ovl"}, "vlan": {"id": 7}}),
            &ipam
        ),
        vec![
            "request network: vlan: device node-a/overlay is the node's overlay: pods get a veth \
             on its bridge (the VLAN of an overlay Network is its VNI)"
        ]
    );
    assert_eq!(
        errors(
            json!({"ipam": {"network": "ovl"}, "macvlan": {"mode": "bridge"}}),
            &ipam
        ),
        vec![
            "request network: macvlan/ipvlan: device node-a/overlay is the node's overlay: pods \
             get a veth on its bridge"
        ]
    );
    // A Network without spec.vxlan (its allocation has no overlay facts), or static addresses.
    let carries = "request network: ipam.network: device node-a/overlay carries VXLAN Networks \
                   only; name a Network with spec.vxlan";
    assert_eq!(
        errors(json!({"ipam": {"network": "blue"}}), &addressing(false)),
        vec![carries]
    );
    assert_eq!(
        errors(
            json!({"addresses": ["10.42.0.9/24"]}),
            &IpamAddresses::new()
        ),
        vec![carries]
    );
}
