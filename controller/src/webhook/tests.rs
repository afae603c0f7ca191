//! AdmissionReviews in and out for good and bad objects of every kind, with the refusal texts
//! the driver and the reconciler use.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::review::answer;
use super::rules::Snapshot;
use crate::network::{Devices, Ipam, Namespaces, Network, NetworkSpec, Subnet};

const RESOURCE: (&str, &str) = ("resource.k8s.io", "v1");
const KNIC: (&str, &str) = ("knic.dev", "v1alpha1");

/// A review of `object` (and `old` on update), answered against `cluster`: the HTTP status and
/// the parsed body (a JSON review, or the plain text as a JSON string).
fn ask(
    cluster: &Snapshot,
    (group, version): (&str, &str),
    kind: &str,
    operation: &str,
    object: Value,
    old: Option<Value>,
) -> (u16, Value) {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": "x"},
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    });
    let reply = answer(&serde_json::to_vec(&review).expect("json"), cluster);
    let body = serde_json::from_slice(&reply.body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&reply.body).into_owned()));
    (reply.status.as_u16(), body)
}

/// `(allowed, message, warnings)` of a 200 review, checking the envelope on the way.
fn verdict(answer: (u16, Value)) -> (bool, Option<String>, Vec<String>) {
    let (status, body) = answer;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(body["kind"], "AdmissionReview");
    let response = &body["response"];
    assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    let allowed = response["allowed"].as_bool().expect("allowed");
    let message = response["status"]["message"].as_str().map(str::to_owned);
    if !allowed {
        assert_eq!(response["status"]["code"], 422);
        assert_eq!(response["status"]["reason"], "Invalid");
    }
    let warnings = response["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .map(|w| w.as_str().expect("text").to_owned())
                .collect()
        })
        .unwrap_or_default();
    (allowed, message, warnings)
}

fn knic(parameters: Value) -> Value {
    let mut p = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig"});
    p.as_object_mut()
        .expect("object")
        .extend(parameters.as_object().expect("object").clone());
    json!({"opaque": {"driver": "knic.dev", "parameters": p}})
}

fn class(name: &str, config: Vec<Value>) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": name}, "spec": {"config": config}})
}

fn claim_spec(config: Vec<Value>) -> Value {
    json!({"devices": {
        "requests": [
            {"name": "eth", "exactly": {"deviceClassName": "vf.knic.dev"}},
            {"name": "alt", "firstAvailable": [
                {"name": "fast", "deviceClassName": "vf.knic.dev"},
                {"name": "slow", "deviceClassName": "unknown.example.com"}]}],
        "config": config}})
}

fn claim(config: Vec<Value>) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"}, "spec": claim_spec(config)})
}

fn template(config: Vec<Value>) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ns"}, "spec": {"spec": claim_spec(config)}})
}

fn with_requests(mut entry: Value, requests: &[&str]) -> Value {
    entry["requests"] = json!(requests);
    entry
}

/// A cluster with the class `vf.knic.dev` carrying `config`.
fn cluster_with_class(config: Vec<Value>) -> Snapshot {
    let class: DeviceClass =
        serde_json::from_value(class("vf.knic.dev", config)).expect("DeviceClass");
    Snapshot {
        classes: [("vf.knic.dev".to_owned(), Arc::new(class))].into(),
        networks: Some(Vec::new()),
    }
}

#[test]
fn device_class_with_a_good_config_is_allowed() {
    let object = class(
        "vf.knic.dev",
        vec![
            knic(json!({"interface": {"mtu": 9000}, "vlan": {"id": 100}})),
            json!({"opaque": {"driver": "other.example.com", "parameters": {"anything": 1}}}),
        ],
    );
    let got = verdict(ask(
        &Snapshot::default(),
        RESOURCE,
        "DeviceClass",
        "CREATE",
        object,
        None,
    ));
    assert_eq!(got, (true, None, vec![]));
}

#[test]
fn device_class_with_a_bad_config_is_refused_with_the_drivers_texts() {
    let object = class(
        "vf.knic.dev",
        vec![
            json!({"opaque": {"driver": "other.example.com", "parameters": {"mtuu": 1}}}),
            knic(json!({"interface": {"mtuu": 9000}})),
            knic(json!({"interface": {"mtu": 50}, "vlan": {"id": 5000}})),
        ],
    );
    let (allowed, message, _) = verdict(ask(
        &Snapshot::default(),
        RESOURCE,
        "DeviceClass",
        "CREATE",
        object,
        None,
    ));
    assert!(!allowed);
    assert_eq!(
        message.as_deref(),
        Some(
            "spec.config[1].opaque.parameters.interface.mtuu: unknown field; \
             spec.config: interface.mtu: must be between 68 and 65535, got 50; \
             spec.config: vlan.id: must be between 1 and 4094, got 5000"
        )
    );
    // The rule texts are the driver's own: the same function, the same words.
    let errors = knic_proto::netconfig::validate(&knic_proto::netconfig::NetworkConfig {
        interface: Some(knic_proto::netconfig::InterfaceConfig {
            mtu: Some(50),
            ..Default::default()
        }),
        ..Default::default()
    })
    .expect_err("invalid");
    assert_eq!(
        errors.to_string(),
        "interface.mtu: must be between 68 and 65535, got 50"
    );
}

#[test]
fn claim_with_a_good_config_is_allowed() {
    let object = claim(vec![with_requests(
        knic(json!({"interface": {"name": "fabric0"}, "addresses": ["192.0.2.10/24"]})),
        &["eth"],
    )]);
    let got = verdict(ask(
        &cluster_with_class(vec![]),
        RESOURCE,
        "ResourceClaim",
        "CREATE",
        object,
        None,
    ));
    assert_eq!(got, (true, None, vec![]));
}

#[test]
fn claim_with_a_bad_config_is_refused_per_request_as_the_driver_words_it() {
    let object = claim(vec![
        with_requests(knic(json!({"interface": {"mtu": "9000"}})), &["alt"]),
        with_requests(
            knic(json!({"addresses": ["192.0.2.0/24"], "sysctls": {"ipv4.forwarding": "2"}})),
            &["eth"],
        ),
    ]);
    let (allowed, message, warnings) = verdict(ask(
        &cluster_with_class(vec![]),
        RESOURCE,
        "ResourceClaim",
        "CREATE",
        object,
        None,
    ));
    assert!(!allowed);
    assert_eq!(
        message.as_deref(),
        Some(
            "spec.devices.config[0].opaque.parameters.interface.mtu: expected an integer, got \
             string \"9000\"; request eth: addresses[0]: 192.0.2.0 is the network address of \
             192.0.2.0/24; request eth: sysctls[\"ipv4.forwarding\"]: \"2\" is not allowed; \
             allowed values: 0, 1"
        )
    );
    assert_eq!(
        warnings,
        [
            "DeviceClass unknown.example.com is not known to the webhook; request alt/slow was \
          checked without the class's config"
        ]
    );
}

#[test]
fn claim_config_is_layered_on_its_class_as_the_driver_layers_it() {
    // The class gives the address; the claim's route takes it as its source: valid once merged.
    let cluster = cluster_with_class(vec![knic(json!({"addresses": ["192.0.2.10/24"]}))]);
    let route = knic(json!({"routes": [{"destination": "0.0.0.0/0", "source": "192.0.2.10"}]}));
    let object = claim(vec![with_requests(route.clone(), &["eth"])]);
    let got = verdict(ask(
        &cluster,
        RESOURCE,
        "ResourceClaim",
        "CREATE",
        object.clone(),
        None,
    ));
    assert_eq!(got, (true, None, vec![]));

    // Without the class the same route has no address to come from.
    let (allowed, message, warnings) = verdict(ask(
        &Snapshot::default(),
        RESOURCE,
        "ResourceClaim",
        "CREATE",
        object,
        None,
    ));
    assert!(!allowed);
    assert_eq!(
        message.as_deref(),
        Some(
            "request eth: routes[0].source: 192.0.2.10 is not one of this interface's static \
             addresses"
        )
    );
    assert_eq!(
        warnings,
        [
            "DeviceClass vf.knic.dev is not known to the webhook; request eth was checked \
          without the class's config"
        ]
    );

    // A class MTU below IPv6's minimum meets the claim's IPv6 address only in the merge.
    let cluster = cluster_with_class(vec![knic(json!({"interface": {"mtu": 1000}}))]);
    let object = claim(vec![with_requests(
        knic(json!({"addresses": ["2001:db8::10/64"]})),
        &["alt"],
    )]);
    let (allowed, message, _) = verdict(ask(
        &cluster,
        RESOURCE,
        "ResourceClaim",
        "CREATE",
        object,
        None,
    ));
    assert!(!allowed);
    assert_eq!(
        message.as_deref(),
        Some(
            "request alt/fast: interface.mtu: 1000 is below 1280, the minimum MTU for IPv6 \
             (addresses[0] is IPv6)"
        )
    );
}

#[test]
fn claim_template_is_checked_at_its_inner_spec() {
    let good = template(vec![knic(json!({"vlan": {"id": 10}}))]);
    let got = verdict(ask(
        &cluster_with_class(vec![]),
        RESOURCE,
        "ResourceClaimTemplate",
        "CREATE",
        good,
        None,
    ));
    let unknown = "DeviceClass unknown.example.com is not known to the webhook; request \
                   alt/slow was checked without the class's config";
    assert_eq!(got, (true, None, vec![unknown.to_owned()]));

    let bad = template(vec![
        knic(json!({"ipam": {"network": "Blue_Net"}, "interface": {"name": "a/b"}})),
        json!({"opaque": {"driver": "knic.dev", "parameters": {"kind": "NetworkConfig"}}}),
    ]);
    let (allowed, message, _) = verdict(ask(
        &cluster_with_class(vec![]),
        RESOURCE,
        "ResourceClaimTemplate",
        "CREATE",
        bad,
        None,
    ));
    assert!(!allowed);
    let rules = "interface.name: interface name \"a/b\" must not contain '/'; REQ: \
                 ipam.network: \"Blue_Net\" is not a DNS label (1-63 lowercase letters, \
                 digits or '-', starting and ending with a letter or digit)";
    let per_request = |r: &str| {
        format!(
            "request {r}: {}",
            rules.replace("REQ", &format!("request {r}"))
        )
    };
    assert_eq!(
        message.unwrap_or_default(),
        format!(
            "spec.spec.devices.config[1].opaque.parameters.apiVersion: required; must be \
             \"knic.dev/v1alpha1\"; {}; {}; {}",
            per_request("eth"),
            per_request("alt/fast"),
            per_request("alt/slow")
        )
    );
}

fn network(name: &str, created: Option<i64>, vlan: u16, cidr: &str) -> Network {
    let mut n = Network::new(
        name,
        NetworkSpec {
            devices: Devices {
                device_class_name: Some("vf.knic.dev".into()),
                ..Devices::default()
            },
            vlan: Some(vlan),
            ipam: Ipam {
                subnets: vec![Subnet {
                    cidr: cidr.into(),
                    ..Subnet::default()
                }],
                ..Ipam::default()
            },
            namespaces: Namespaces {
                names: vec!["a".into()],
                ..Namespaces::default()
            },
            ..NetworkSpec::default()
        },
    );
    n.metadata.creation_timestamp =
        created.map(|s| Time(Timestamp::from_second(1_700_000_000 + s).expect("timestamp")));
    n
}

fn json_of(n: &Network) -> Value {
    serde_json::to_value(n).expect("json")
}

#[test]
fn network_alone_is_checked_with_the_reconcilers_text() {
    let cluster = Snapshot {
        networks: Some(Vec::new()),
        ..Snapshot::default()
    };
    let good = network("blue", None, 100, "192.0.2.0/24");
    let got = verdict(ask(
        &cluster,
        KNIC,
        "Network",
        "CREATE",
        json_of(&good),
        None,
    ));
    assert_eq!(got, (true, None, vec![]));

    let mut bad = network("blue", None, 100, "192.0.2.1/24");
    bad.spec.mtu = Some(40);
    let (allowed, message, _) = verdict(ask(
        &cluster,
        KNIC,
        "Network",
        "CREATE",
        json_of(&bad),
        None,
    ));
    assert!(!allowed);
    let crate::plan::Plan::Invalid(reconciler) = crate::plan::plan(&bad, &[]) else {
        panic!("the reconciler must refuse it too");
    };
    assert_eq!(message.as_deref(), Some(reconciler.as_str()));
    assert_eq!(
        reconciler,
        "spec.mtu: must be between 68 and 65535, got 40; spec.ipam.subnets[0].cidr: \
         192.0.2.1/24 has host bits set; did you mean 192.0.2.0/24?"
    );
}

#[test]
fn network_conflicting_with_an_older_one_is_refused_and_checked_alone_without_the_cache() {
    let older = network("red", Some(0), 100, "198.51.100.0/24");
    let cluster = Snapshot {
        networks: Some(vec![Arc::new(older)]),
        ..Snapshot::default()
    };
    let new = network("blue", None, 100, "192.0.2.0/24");
    let (allowed, message, _) = verdict(ask(
        &cluster,
        KNIC,
        "Network",
        "CREATE",
        json_of(&new),
        None,
    ));
    assert!(!allowed);
    assert_eq!(
        message.as_deref(),
        Some(
            "spec.vlan: VLAN 100 is already used by network \"red\" on overlapping devices; to share it on purpose, both Networks must set the same spec.vlanShareGroup"
        )
    );

    let (allowed, message, warnings) = verdict(ask(
        &Snapshot::default(),
        KNIC,
        "Network",
        "CREATE",
        json_of(&new),
        None,
    ));
    assert!(allowed, "{message:?}");
    assert_eq!(
        warnings,
        [
            "the webhook's cache of Networks is not ready: checked alone; the controller still \
          checks conflicts with other Networks"
        ]
    );
}

#[test]
fn network_that_is_not_one_is_refused() {
    let object = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": "blue"}, "spec": {"devices": {}, "mtu": "big"}});
    let (allowed, message, _) = verdict(ask(
        &Snapshot::default(),
        KNIC,
        "Network",
        "CREATE",
        object,
        None,
    ));
    assert!(!allowed);
    let message = message.unwrap_or_default();
    assert!(
        message.starts_with("not a knic.dev/v1alpha1 Network: "),
        "{message}"
    );
}

#[test]
fn updates_that_leave_the_checked_part_alone_are_allowed() {
    // Stored before the webhook existed: the finalizer must still come off.
    let mut stored = network("blue", Some(0), 100, "192.0.2.1/24");
    stored.metadata.finalizers = Some(vec![crate::plan::FINALIZER.to_owned()]);
    let mut released = stored.clone();
    released.metadata.finalizers = None;
    let got = verdict(ask(
        &Snapshot::default(),
        KNIC,
        "Network",
        "UPDATE",
        json_of(&released),
        Some(json_of(&stored)),
    ));
    assert_eq!(got, (true, None, vec![]));

    // A changed spec is checked.
    let mut edited = released.clone();
    edited.spec.vlan = Some(0);
    let (allowed, message, _) = verdict(ask(
        &Snapshot::default(),
        KNIC,
        "Network",
        "UPDATE",
        json_of(&edited),
        Some(json_of(&stored)),
    ));
    assert!(!allowed);
    assert!(
        message
            .as_deref()
            .unwrap_or_default()
            .starts_with("spec.vlan: "),
        "{message:?}"
    );

    // A class's labels change, its bad config stays: allowed; its config changes: checked.
    let bad = class("vf.knic.dev", vec![knic(json!({"vlan": {"id": 0}}))]);
    let mut labelled = bad.clone();
    labelled["metadata"]["labels"] = json!({"team": "net"});
    let got = verdict(ask(
        &Snapshot::default(),
        RESOURCE,
        "DeviceClass",
        "UPDATE",
        labelled,
        Some(bad.clone()),
    ));
    assert_eq!(got, (true, None, vec![]));
    let good = class("vf.knic.dev", vec![knic(json!({"vlan": {"id": 1}}))]);
    let (allowed, message, _) = verdict(ask(
        &Snapshot::default(),
        RESOURCE,
        "DeviceClass",
        "UPDATE",
        bad,
        Some(good),
    ));
    assert!(!allowed);
    assert_eq!(
        message.as_deref(),
        Some("spec.config: vlan.id: must be between 1 and 4094, got 0")
    );
}

/// Live update: what running pods follow (MTU, routes) is allowed; a VLAN or subnet change
/// is refused with `validate_update`'s text, before the reconciler's own checks.
#[test]
fn network_updates_running_pods_cannot_follow_are_refused() {
    let cluster = Snapshot {
        networks: Some(Vec::new()),
        ..Snapshot::default()
    };
    let stored = network("blue", Some(0), 200, "192.0.2.0/24");
    let update = |new: &Network| {
        verdict(ask(
            &cluster,
            KNIC,
            "Network",
            "UPDATE",
            json_of(new),
            Some(json_of(&stored)),
        ))
    };
    let mut live = stored.clone();
    live.spec.mtu = Some(1400);
    live.spec.ipam.subnets[0].routes =
        serde_json::from_value(json!([{"destination": "203.0.113.0/24"}])).expect("routes");
    assert_eq!(update(&live), (true, None, vec![]));

    let mut vlan = stored.clone();
    vlan.spec.vlan = Some(300);
    assert_eq!(
        update(&vlan),
        (
            false,
            Some(
                "spec.vlan: cannot change from 200 to 300: running pods stay on VLAN 200 and \
                 cannot be moved live; create another Network and move the workloads"
                    .to_owned()
            ),
            vec![]
        )
    );
    let mut cidr = stored.clone();
    cidr.spec.ipam.subnets[0].cidr = "198.51.100.0/24".into();
    assert_eq!(
        update(&cidr).1.as_deref(),
        Some(
            "spec.ipam.subnets[0].cidr: cannot change 192.0.2.0/24 to 198.51.100.0/24: pods \
             hold addresses of it; add the new subnet as another entry"
        )
    );
    // A create has no old object: the same VLAN 300 Network is fine.
    let got = verdict(ask(
        &cluster,
        KNIC,
        "Network",
        "CREATE",
        json_of(&vlan),
        None,
    ));
    assert_eq!(got, (true, None, vec![]));
}

#[test]
fn deletes_other_kinds_and_other_versions_are_allowed_unchecked() {
    let bad = class("vf.knic.dev", vec![knic(json!({"vlan": {"id": 0}}))]);
    let got = verdict(ask(
        &Snapshot::default(),
        RESOURCE,
        "DeviceClass",
        "DELETE",
        Value::Null,
        Some(bad.clone()),
    ));
    assert_eq!(got, (true, None, vec![]));
    let got = verdict(ask(
        &Snapshot::default(),
        ("resource.k8s.io", "v1beta1"),
        "DeviceClass",
        "CREATE",
        bad.clone(),
        None,
    ));
    assert_eq!(
        got,
        (
            true,
            None,
            vec![
                "knic does not validate resource.k8s.io/v1beta1 DeviceClass; allowed unchecked"
                    .to_owned()
            ]
        )
    );
    let got = verdict(ask(
        &Snapshot::default(),
        ("", "v1"),
        "Pod",
        "CREATE",
        json!({"metadata": {"name": "p"}}),
        None,
    ));
    assert_eq!(got.2, ["knic does not validate /v1 Pod; allowed unchecked"]);
    // A terminating object is never refused: only its finalizers may change now.
    let mut terminating = bad;
    terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let got = verdict(ask(
        &Snapshot::default(),
        RESOURCE,
        "DeviceClass",
        "UPDATE",
        terminating,
        None,
    ));
    assert_eq!(got, (true, None, vec![]));
}

#[test]
fn bodies_that_are_no_v1_review_get_400_with_the_reason() {
    let cluster = Snapshot::default();
    let text = |body: &[u8]| {
        let reply = answer(body, &cluster);
        (
            reply.status.as_u16(),
            reply.content_type,
            String::from_utf8(reply.body).expect("utf-8"),
        )
    };
    let (status, content_type, message) = text(b"{\"apiVersion\": ");
    assert_eq!((status, content_type), (400, "text/plain; charset=utf-8"));
    assert!(
        message.starts_with("malformed AdmissionReview: EOF while parsing"),
        "{message}"
    );
    assert_eq!(
        text(br#"{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}"#),
        (
            400,
            "text/plain; charset=utf-8",
            "expected an admission.k8s.io/v1 AdmissionReview, got \"admission.k8s.io/v1beta1\" \
             \"AdmissionReview\""
                .to_owned()
        )
    );
    assert_eq!(
        text(br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#).2,
        "AdmissionReview has no request"
    );
    assert_eq!(
        text(br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u"}}"#).2,
        "malformed AdmissionReview request: missing field `kind`"
    );
    assert_eq!(
        text(
            br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request":
                {"uid": "", "kind": {"group": "knic.dev", "version": "v1alpha1", "kind": "Network"},
                 "operation": "CREATE", "object": {}}}"#
        )
        .2,
        "AdmissionReview request has no uid"
    );
    assert_eq!(
        text(
            br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request":
                {"uid": "u", "kind": {"group": "knic.dev", "version": "v1alpha1", "kind": "Network"},
                 "operation": "CREATE"}}"#
        )
        .2,
        "AdmissionReview request of a CREATE has no object"
    );
    let (status, _, message) = text(&[0xff, 0xfe, 0x00]);
    assert_eq!(status, 400);
    assert!(
        message.starts_with("malformed AdmissionReview: "),
        "{message}"
    );
}

#[test]
fn a_config_with_many_problems_is_capped_like_the_drivers() {
    let routes: Vec<Value> = (0..30)
        .map(|i| json!({"destination": format!("10.{i}.0.1/16")}))
        .collect();
    let object = class("vf.knic.dev", vec![knic(json!({"routes": routes}))]);
    let (allowed, message, _) = verdict(ask(
        &Snapshot::default(),
        RESOURCE,
        "DeviceClass",
        "CREATE",
        object,
        None,
    ));
    assert!(!allowed);
    let message = message.unwrap_or_default();
    assert!(
        message.starts_with(
            "spec.config: routes[0].destination: 10.0.0.1/16 has host bits set; did you mean \
             10.0.0.0/16?; "
        ),
        "{message}"
    );
    assert!(message.ends_with("; … and 10 more problems"), "{message}");
}

fn overlay(name: &str, created: Option<i64>, vni: u32) -> Network {
    let mut n = network(name, created, 1, "10.42.0.0/24");
    n.spec.devices = Devices::default();
    n.spec.vlan = None;
    n.spec.vxlan = Some(crate::network::Vxlan { vni, port: None });
    n
}

#[test]
fn overlay_networks_are_admitted_refused_alone_and_refused_on_a_taken_vni() {
    let blue = overlay("blue", Some(0), 4242);
    let cluster = Snapshot {
        networks: Some(vec![Arc::new(blue.clone())]),
        ..Snapshot::default()
    };
    let ask_network =
        |n: &Network| verdict(ask(&cluster, KNIC, "Network", "CREATE", json_of(n), None));
    // The JSON it is sent as has no devices at all.
    assert_eq!(json_of(&blue)["spec"].get("devices"), None);
    assert_eq!(
        ask_network(&overlay("green", None, 4243)),
        (true, None, vec![])
    );

    let (allowed, message, _) = ask_network(&overlay("ovl", None, 4242));
    assert!(!allowed);
    assert_eq!(
        message.as_deref(),
        Some(
            "spec.vxlan.vni: VNI 4242 is already used by network \"blue\"; two Networks on one VNI would be one layer-2 segment (pick another vni)"
        )
    );

    let mut bad = overlay("ovl", None, 0);
    bad.spec.interfaces_per_pod = Some(2);
    let (allowed, message, _) = ask_network(&bad);
    assert!(!allowed);
    assert_eq!(
        message.as_deref(),
        Some(
            "spec.vxlan.vni: must be between 1 and 16777215 (24 bits), got 0; \
             spec.interfacesPerPod: must be 1 with spec.vxlan, got 2: every interface would join the same segment"
        )
    );
}
