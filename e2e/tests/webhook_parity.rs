//! The webhook refuses a claim with the words the driver uses at prepare: the same claim and
//! class, once as the webhook sees it (unallocated, the class from its cache) and once as the
//! driver does (allocated by the scheduler, the class's config copied into the allocation,
//! resolved by `knic_driver::claims::resolve` and planned by `claims::plan`).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use knic_controller::webhook::Snapshot;
use knic_controller::webhook::review::answer;
use knic_driver::claims::plan::{IpamAddresses, configure, plans};
use knic_driver::claims::resolve;
use serde_json::{Value, json};

fn knic(parameters: Value) -> Value {
    let mut p = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig"});
    p.as_object_mut()
        .unwrap()
        .extend(parameters.as_object().unwrap().clone());
    json!({"driver": "knic.dev", "parameters": p})
}

/// The webhook's refusal of a claim whose request `eth` uses class `vf.knic.dev` carrying
/// `class_config`, with `claim_config` for `eth`; `None` when allowed.
fn webhook(class_config: &[Value], claim_config: &[Value]) -> Option<String> {
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": "vf.knic.dev"},
        "spec": {"config": class_config.iter().map(|o| json!({"opaque": o})).collect::<Vec<_>>()}
    }))
    .unwrap();
    let cluster = Snapshot {
        classes: [("vf.knic.dev".to_owned(), Arc::new(class))].into(),
        networks: Some(Vec::new()),
    };
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {
            "requests": [{"name": "eth", "exactly": {"deviceClassName": "vf.knic.dev"}}],
            "config": claim_config.iter()
                .map(|o| json!({"requests": ["eth"], "opaque": o})).collect::<Vec<_>>()}}});
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "operation": "CREATE", "object": claim,
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"}}});
    let reply = answer(&serde_json::to_vec(&review).unwrap(), &cluster);
    assert_eq!(reply.status, 200);
    let body: Value = serde_json::from_slice(&reply.body).unwrap();
    assert!(body["response"]["warnings"].is_null(), "{body}");
    let allowed = body["response"]["allowed"].as_bool().unwrap();
    (!allowed).then(|| {
        body["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .to_owned()
    })
}

/// The driver's refusal of the same claim once allocated: the scheduler copies the class's
/// config (`FromClass`) and the claim's (`FromClaim`) into the allocation.
fn driver(class_config: &[Value], claim_config: &[Value]) -> Option<String> {
    let config: Vec<Value> = class_config
        .iter()
        .map(|o| json!({"source": "FromClass", "requests": ["eth"], "opaque": o}))
        .chain(
            claim_config
                .iter()
                .map(|o| json!({"source": "FromClaim", "requests": ["eth"], "opaque": o})),
        )
        .collect();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "claim-uid"},
        "spec": {"devices": {"requests": [{"name": "eth",
            "exactly": {"deviceClassName": "vf.knic.dev"}}]}},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "eth", "driver": "knic.dev", "pool": "node-a",
                    "device": "d0"}],
                "config": config}},
            "reservedFor": [{"resource": "pods", "name": "pod", "uid": "pod-uid"}]}
    }))
    .unwrap();
    let wanted = knic_driver::claims::ClaimRef {
        namespace: "ns".into(),
        name: "c".into(),
        uid: "claim-uid".into(),
    };
    let mut prepared = resolve("knic.dev", &wanted, &claim, 0).unwrap();
    prepared.devices[0].published = Some(
        serde_json::from_value(json!({"name": "d0",
            "attributes": {"ifName": {"string": "ens1f0v0"}}}))
        .unwrap(),
    );
    let configs = configure(&prepared);
    plans(&prepared, &configs, &BTreeSet::new(), &IpamAddresses::new())
        .err()
        .map(|e| e.to_string())
}

#[test]
fn rule_violations_read_the_same_at_admission_and_at_prepare() {
    let cases: Vec<(Vec<Value>, Vec<Value>)> = vec![
        // The claim alone breaks rules.
        (
            vec![],
            vec![knic(json!({"interface": {"mtu": 50}, "vlan": {"id": 5000},
                "sysctls": {"ipv4.forwarding": "2"}}))],
        ),
        // Only the merge of class and claim breaks one.
        (
            vec![knic(json!({"interface": {"mtu": 1000}}))],
            vec![knic(json!({"addresses": ["2001:db8::10/64"]}))],
        ),
        // The claim's route gateway is outside the class's subnet.
        (
            vec![knic(json!({"addresses": ["192.0.2.10/24"]}))],
            vec![knic(json!({"routes": [{"destination": "0.0.0.0/0",
                "gateway": "198.51.100.1"}]}))],
        ),
    ];
    for (class, claim) in cases {
        let at_admission = webhook(&class, &claim);
        let at_prepare = driver(&class, &claim);
        assert!(at_prepare.is_some(), "the driver accepts {claim:?}");
        assert_eq!(at_admission, at_prepare, "class {class:?} claim {claim:?}");
    }
    assert_eq!(
        webhook(
            &[knic(json!({"interface": {"mtu": 1000}}))],
            &[knic(json!({"addresses": ["2001:db8::10/64"]}))]
        )
        .as_deref(),
        Some(
            "request eth: interface.mtu: 1000 is below 1280, the minimum MTU for IPv6 \
             (addresses[0] is IPv6)"
        )
    );
}

#[test]
fn what_the_driver_accepts_the_webhook_accepts() {
    let cases: Vec<(Vec<Value>, Vec<Value>)> = vec![
        // The class gives the address the claim's route takes as its source.
        (
            vec![knic(json!({"addresses": ["192.0.2.10/24"]}))],
            vec![knic(json!({"routes": [{"destination": "0.0.0.0/0",
                "source": "192.0.2.10", "gateway": "192.0.2.1"}]}))],
        ),
        // The claim overrides the class's MTU that IPv6 would refuse.
        (
            vec![knic(
                json!({"interface": {"mtu": 1000}, "addresses": ["2001:db8::10/64"]}),
            )],
            vec![knic(json!({"interface": {"mtu": 1500}}))],
        ),
        (
            vec![],
            vec![knic(
                json!({"interface": {"name": "fabric0"}, "vlan": {"id": 10}}),
            )],
        ),
    ];
    for (class, claim) in cases {
        assert_eq!(
            driver(&class, &claim),
            None,
            "class {class:?} claim {claim:?}"
        );
        assert_eq!(
            webhook(&class, &claim),
            None,
            "class {class:?} claim {claim:?}"
        );
    }
}

#[test]
fn parse_errors_name_the_same_field_and_rule() {
    // The paths differ only where each reads the entry from: the object the user wrote, or the
    // allocation's copy.
    let claim = [knic(json!({"interface": {"mtuu": 1500, "mtu": "big"}}))];
    let at_admission = webhook(&[], &claim).unwrap();
    let at_prepare = driver(&[], &claim).unwrap();
    assert_eq!(
        at_admission,
        "spec.devices.config[0].opaque.parameters.interface.mtuu: unknown field; \
         spec.devices.config[0].opaque.parameters.interface.mtu: expected an integer, got \
         string \"big\""
    );
    assert_eq!(
        at_admission.replace(
            "spec.devices.config[0].opaque.parameters",
            "config[0].parameters"
        ),
        at_prepare
    );
}
