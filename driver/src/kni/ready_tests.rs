//! Readiness as a pure function: every reason, and the facts it follows.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::claims::checkpoint::{PreparedClaim, PreparedDevice};
use crate::kni::catalog::builtin_classes;

fn network(name: &str, spec: serde_json::Value) -> Network {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("network")
}

fn spec(devices: serde_json::Value) -> serde_json::Value {
    json!({"devices": devices, "ipam": {"static": {}}, "namespaces": {"names": ["a"]}})
}

fn device(name: &str, attrs: serde_json::Value) -> Device {
    serde_json::from_value(json!({"name": name, "attributes": attrs})).expect("device")
}

fn holding(device: &str, share: Option<&str>) -> Checkpoint {
    let claim = PreparedClaim {
        network_label: None,
        namespace: "ns".into(),
        name: "c".into(),
        uid: "u".into(),
        pod_uid: "p".into(),
        pod_name: "pod".into(),
        devices: vec![PreparedDevice {
            request: "r".into(),
            pool: "n".into(),
            device: device.into(),
            share_id: share.map(str::to_owned),
            consumed: BTreeMap::new(),
            published: None,
        }],
        configs: vec![],
        prepared_at: 0,
        attachments: vec![],
        allocations: vec![],
        functions: vec![],
    };
    Checkpoint {
        claims: BTreeMap::from([("u".to_owned(), claim)]),
    }
}

fn answer(
    networks: &[Network],
    devices: &[Device],
    checkpoint: &Checkpoint,
    node: NodeFacts,
) -> NodeReadiness {
    node_readiness(Inputs {
        networks,
        classes: &builtin_classes(),
        devices,
        checkpoint,
        node,
        validate: true,
    })
}

#[test]
fn ready_needs_a_free_matching_device() {
    let vfs = network("vfs", spec(json!({"kind": "vf"})));
    let vf = device("vf-0", json!({"kind": {"string": "vf"}}));
    let nic = device("nic-0", json!({"kind": {"string": "nic"}}));
    let empty = Checkpoint::default();
    let r = answer(
        std::slice::from_ref(&vfs),
        &[vf.clone(), nic.clone()],
        &empty,
        NodeFacts::default(),
    );
    assert!(r.ready && r.networks[0].ready, "{r:?}");
    assert_eq!(r.networks[0].matching, ["vf-0"]);
    assert_eq!(r.networks[0].free, ["vf-0"]);

    let r = answer(
        std::slice::from_ref(&vfs),
        std::slice::from_ref(&nic),
        &empty,
        NodeFacts::default(),
    );
    assert_eq!(
        r.networks[0].reasons,
        ["no device offered on this node matches spec.devices (vf)"]
    );
    let busy = holding("vf-0", None);
    let r = answer(
        std::slice::from_ref(&vfs),
        std::slice::from_ref(&vf),
        &busy,
        NodeFacts::default(),
    );
    assert_eq!(
        r.networks[0].reasons,
        ["0 of 1 matching devices free, 1 needed per pod (in use: vf-0 by ns/c)"]
    );
    // A share of a port does not take it whole.
    let shared = holding("vf-0", Some("s"));
    assert!(
        answer(
            std::slice::from_ref(&vfs),
            std::slice::from_ref(&vf),
            &shared,
            NodeFacts::default()
        )
        .networks[0]
            .ready
    );
    // A shared port is free while offered, whoever holds shares of it.
    let port = device(
        "p-0",
        json!({"kind": {"string": "vf"}, "shareable": {"bool": true}}),
    );
    let held_port = holding("p-0", None);
    assert!(
        answer(
            std::slice::from_ref(&vfs),
            std::slice::from_ref(&port),
            &held_port,
            NodeFacts::default()
        )
        .networks[0]
            .ready
    );
}

#[test]
fn the_drivers_own_readiness_and_the_networks_state_count() {
    let nic = device("nic-0", json!({"kind": {"string": "nic"}}));
    let mut exhausted = network("full", spec(json!({"kind": "nic"})));
    exhausted.status = Some(
        serde_json::from_value(json!({"conditions": [
        {"type": "Exhausted", "status": "True", "reason": "NoFreeAddress", "message": "m",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}))
        .expect("status"),
    );
    let missing_class = network("odd", spec(json!({"deviceClassName": "gpu.example.com"})));
    let unsupported = network(
        "cap",
        spec(
            json!({"deviceClassName": "knic.dev", "selectors": ["device.capacity[\"knic.dev\"].bandwidth.isGreaterThan(quantity(\"1G\"))"]}),
        ),
    );
    let facts = NodeFacts {
        published: Some(true),
        registered: Some(false),
        nri: Some(false),
    };
    let r = answer(
        &[exhausted, missing_class, unsupported],
        std::slice::from_ref(&nic),
        &Checkpoint::default(),
        facts,
    );
    assert!(!r.ready);
    assert_eq!(
        r.reasons,
        [
            "kubelet registration not acknowledged",
            "NRI plugin not connected to the container runtime"
        ]
    );
    let by_name: BTreeMap<&str, &NetworkReadiness> =
        r.networks.iter().map(|n| (n.name.as_str(), n)).collect();
    assert_eq!(
        by_name["full"].reasons[0],
        "Network \"full\" is Exhausted: no free address for a new interface"
    );
    assert!(
        by_name["odd"].reasons[0]
            .starts_with("spec.devices: DeviceClass \"gpu.example.com\" does not exist"),
        "{:?}",
        by_name["odd"].reasons
    );
    assert!(
        by_name["cap"].reasons[0].contains("cannot be evaluated: unsupported CEL"),
        "{:?}",
        by_name["cap"].reasons
    );
    assert!(by_name.values().all(|n| {
        n.reasons
            .last()
            .is_some_and(|r| r.starts_with("NRI plugin"))
    }));
}

#[test]
fn standalone_networks_are_validated_here() {
    let nic = device("nic-0", json!({"kind": {"string": "nic"}}));
    let bad = network(
        "bad",
        json!({"devices": {"kind": "nic"}, "vlan": 5000, "ipam": {"static": {}}, "namespaces": {"names": ["a"]}}),
    );
    let r = answer(
        std::slice::from_ref(&bad),
        std::slice::from_ref(&nic),
        &Checkpoint::default(),
        NodeFacts::default(),
    );
    assert!(
        r.networks[0].reasons[0].starts_with("Network \"bad\" is Invalid: spec.vlan"),
        "{:?}",
        r.networks[0].reasons
    );
}
