//! Every refusal of a live update with its exact text (what `kubectl apply` prints), and the
//! changes running pods follow or that touch only new pods pass.

use serde_json::{Value, json};

use super::*;

/// A Network with a VLAN, two subnets and 3 of 506 addresses in use.
fn blue(patch: impl FnOnce(&mut Value)) -> Network {
    let mut n = json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": "blue", "generation": 6},
        "spec": {
            "devices": {"kind": "vf"},
            "vlan": 200, "mtu": 1450, "interfaceName": "data",
            "ipam": {"subnets": [
                {"cidr": "192.0.2.0/24", "gateway": "192.0.2.1",
                 "routes": [{"destination": "198.51.100.0/24"}]},
                {"cidr": "10.7.0.0/24", "gateway": "10.7.0.1"}
            ]},
            "namespaces": {"names": ["team-a"]}
        },
        "status": {"addresses": {"free": "503", "total": "506"}}
    });
    patch(&mut n);
    serde_json::from_value(n).expect("a Network")
}

/// An edit of the Network's JSON.
type Patch = Box<dyn Fn(&mut Value)>;

fn refusals(old: &Network, new: &Network) -> Vec<String> {
    validate_update(old, new)
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn every_refusal_names_its_field_and_why() {
    let old = blue(|_| {});
    let cases: Vec<(&str, Patch, &str)> = vec![
        (
            "vlan",
            Box::new(|n| n["spec"]["vlan"] = json!(300)),
            "spec.vlan: cannot change from 200 to 300: running pods stay on VLAN 200 and cannot \
             be moved live; create another Network and move the workloads",
        ),
        (
            "vlan removed",
            Box::new(|n| {
                n["spec"]
                    .as_object_mut()
                    .unwrap()
                    .remove("vlan")
                    .map(drop)
                    .unwrap()
            }),
            "spec.vlan: cannot change from 200 to none: running pods stay on VLAN 200 and cannot \
             be moved live; create another Network and move the workloads",
        ),
        (
            "devices",
            Box::new(|n| n["spec"]["devices"] = json!({"kind": "nic"})),
            "spec.devices: cannot change from vf to nic: running pods keep the devices they have \
             and cannot be moved live; create another Network and move the workloads",
        ),
        (
            "devices, same summary",
            Box::new(|n| n["spec"]["devices"] = json!({"kind": "vf", "selectors": ["true"]})),
            "spec.devices: cannot change from vf to +1 selector vf: running pods keep the devices \
             they have and cannot be moved live; create another Network and move the workloads",
        ),
        (
            "interfaceName",
            Box::new(|n| n["spec"]["interfaceName"] = json!("fast")),
            "spec.interfaceName: cannot change from data to fast: running pods keep data and \
             cannot be moved live; create another Network and move the workloads",
        ),
        (
            "interfaceName removed",
            Box::new(|n| n["spec"]["interfaceName"] = Value::Null),
            "spec.interfaceName: cannot change from data to the default name: running pods keep \
             data and cannot be moved live; create another Network and move the workloads",
        ),
        (
            "cidr",
            Box::new(|n| n["spec"]["ipam"]["subnets"][0]["cidr"] = json!("198.18.0.0/24")),
            "spec.ipam.subnets[0].cidr: cannot change 192.0.2.0/24 to 198.18.0.0/24: pods hold \
             addresses of it; add the new subnet as another entry",
        ),
        (
            "gateway",
            Box::new(|n| n["spec"]["ipam"]["subnets"][0]["gateway"] = json!("192.0.2.254")),
            "spec.ipam.subnets[0].gateway: cannot change from 192.0.2.1 to 192.0.2.254: the new \
             gateway may be allocated to a pod, and running pods route through the old one; add \
             the subnet with the new gateway to another Network",
        ),
        (
            "gateway removed",
            Box::new(|n| n["spec"]["ipam"]["subnets"][1]["gateway"] = Value::Null),
            "spec.ipam.subnets[1].gateway: cannot change from 10.7.0.1 to none: the new gateway \
             may be allocated to a pod, and running pods route through the old one; add the \
             subnet with the new gateway to another Network",
        ),
        (
            "subnet removed while in use",
            Box::new(|n| {
                n["spec"]["ipam"]["subnets"]
                    .as_array_mut()
                    .unwrap()
                    .remove(0);
            }),
            "spec.ipam.subnets: cannot remove 192.0.2.0/24 while the Network has addresses in \
             use (3 of 506)",
        ),
        (
            "subnets to static",
            Box::new(|n| n["spec"]["ipam"] = json!({"static": {}})),
            "spec.ipam: cannot switch between subnets and static",
        ),
    ];
    for (what, patch, text) in cases {
        let mut new = serde_json::to_value(&old).unwrap();
        patch(&mut new);
        let new: Network = serde_json::from_value(new).expect(what);
        assert_eq!(refusals(&old, &new), [text], "{what}");
    }
    // And back: static to subnets.
    let stat = blue(|n| n["spec"]["ipam"] = json!({"static": {}}));
    assert_eq!(
        refusals(&stat, &old),
        ["spec.ipam: cannot switch between subnets and static"]
    );
}

#[test]
fn several_refusals_come_in_spec_order() {
    let old = blue(|_| {});
    let new = blue(|n| {
        n["spec"]["vlan"] = json!(201);
        n["spec"]["ipam"]["subnets"][1]["gateway"] = json!("10.7.0.9");
    });
    let got = refusals(&old, &new);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].starts_with("spec.vlan: cannot change from 200 to 201"));
    assert!(got[1].starts_with("spec.ipam.subnets[1].gateway: cannot change from 10.7.0.1"));
}

#[test]
fn live_and_new_pod_only_changes_pass() {
    let old = blue(|_| {});
    let free: Vec<(&str, Patch)> = vec![
        ("mtu", Box::new(|n| n["spec"]["mtu"] = json!(1400))),
        (
            "routes",
            Box::new(|n| {
                n["spec"]["ipam"]["subnets"][0]["routes"] =
                    json!([{"destination": "203.0.113.0/24", "gateway": "192.0.2.1"}]);
            }),
        ),
        (
            "appended subnet",
            Box::new(|n| {
                n["spec"]["ipam"]["subnets"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"cidr": "10.8.0.0/24"}));
            }),
        ),
        (
            "reordered subnets",
            Box::new(|n| {
                n["spec"]["ipam"]["subnets"]
                    .as_array_mut()
                    .unwrap()
                    .reverse();
            }),
        ),
        (
            "exclude",
            Box::new(|n| n["spec"]["ipam"]["subnets"][0]["exclude"] = json!(["192.0.2.9"])),
        ),
        (
            "namespaces",
            Box::new(|n| n["spec"]["namespaces"] = json!({"names": ["team-b"]})),
        ),
        (
            "interfacesPerPod",
            Box::new(|n| n["spec"]["interfacesPerPod"] = json!(2)),
        ),
        (
            "stableAddresses",
            Box::new(|n| n["spec"]["stableAddresses"] = json!({"by": "podName"})),
        ),
    ];
    for (what, patch) in free {
        let mut new = serde_json::to_value(&old).unwrap();
        patch(&mut new);
        let new: Network = serde_json::from_value(new).expect(what);
        assert_eq!(refusals(&old, &new), Vec::<String>::new(), "{what}");
    }
}

/// A subnet may go while nothing is allocated, or before the controller counted anything.
#[test]
fn an_unused_subnet_may_be_removed() {
    let drop_first = |n: &mut Value| {
        n["spec"]["ipam"]["subnets"]
            .as_array_mut()
            .unwrap()
            .remove(0);
    };
    for status in [
        json!({"addresses": {"free": "506", "total": "506"}}),
        json!({}),
    ] {
        let old = blue(|n| n["status"] = status.clone());
        let new = blue(|n| {
            n["status"] = status.clone();
            drop_first(n);
        });
        assert_eq!(refusals(&old, &new), Vec::<String>::new(), "{status}");
    }
}

#[test]
fn an_overlays_segment_cannot_change_under_its_pods() {
    let ovl = |vxlan: Value| {
        blue(move |n| {
            let spec = n["spec"].as_object_mut().unwrap();
            spec.remove("devices");
            spec.remove("vlan");
            if !vxlan.is_null() {
                spec.insert("vxlan".into(), vxlan.clone());
            }
        })
    };
    let old = ovl(json!({"vni": 4242}));
    let tail = "running pods stay on their segment and cannot be moved live; create another \
                Network and move the workloads";
    assert_eq!(
        refusals(&old, &ovl(json!({"vni": 4243}))),
        vec![format!(
            "spec.vxlan.vni: cannot change from VNI 4242 port 4789 to VNI 4243 port 4789: {tail}"
        )]
    );
    assert_eq!(
        refusals(&old, &ovl(json!({"vni": 4242, "port": 8472}))),
        vec![format!(
            "spec.vxlan.port: cannot change from VNI 4242 port 4789 to VNI 4242 port 8472: {tail}"
        )]
    );
    assert_eq!(
        refusals(&old, &ovl(Value::Null)),
        vec![format!(
            "spec.vxlan: cannot change from VNI 4242 port 4789 to no overlay: {tail}"
        )]
    );
    // Writing out the default port is no change.
    assert!(refusals(&old, &ovl(json!({"vni": 4242, "port": 4789}))).is_empty());
}
