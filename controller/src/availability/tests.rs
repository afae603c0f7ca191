use super::*;
use serde_json::Value;
use serde_json::json;

fn network(name: &str, devices: Value) -> Network {
    let mut n: Network = serde_json::from_value(json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"devices": devices,
                 "ipam": {"subnets": [{"cidr": "192.0.2.0/24"}]},
                 "namespaces": {"names": ["a"]}},
    }))
    .unwrap();
    n.metadata.generation = Some(1);
    n
}

fn class(name: &str, expression: &str) -> DeviceClass {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }))
    .unwrap()
}

fn classes() -> Vec<DeviceClass> {
    vec![
        class("knic.dev", "device.driver == \"knic.dev\""),
        class(
            "vf.knic.dev",
            "device.driver == \"knic.dev\" && device.attributes[\"knic.dev\"].kind == \"vf\"",
        ),
    ]
}

/// A slice of `node` whose devices are `(name, kind, extra attributes)`.
fn slice(node: &str, generation: i64, devices: &[(&str, &str, Value)]) -> ResourceSlice {
    let devices: Vec<Value> = devices
        .iter()
        .map(|(name, kind, extra)| {
            let mut attributes = json!({"kind": {"string": kind}});
            if let (Some(a), Some(e)) = (attributes.as_object_mut(), extra.as_object()) {
                a.extend(e.clone());
            }
            json!({"name": name, "attributes": attributes})
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{generation}")},
        "spec": {"driver": "knic.dev", "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices},
    }))
    .unwrap()
}

fn claim(allocated: &[(&str, &str)]) -> ResourceClaim {
    let results: Vec<Value> = allocated
        .iter()
        .map(|(pool, device)| {
            json!({"request": "network", "driver": "knic.dev", "pool": pool,
                   "device": device})
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "a"},
        "spec": {},
        "status": {"allocation": {"devices": {"results": results}}},
    }))
    .unwrap()
}

const NO_CLAIMS: &[ResourceClaim] = &[];

fn vf_network() -> Network {
    network("blue", json!({"kind": "vf"}))
}

#[test]
fn counts_nodes_with_a_free_matching_device() {
    let slices = [
        slice(
            "node-a",
            1,
            &[("vf0", "vf", json!({})), ("pf0", "pf", json!({}))],
        ),
        slice("node-b", 1, &[("vf0", "vf", json!({}))]),
        slice("node-c", 1, &[("pf0", "pf", json!({}))]),
    ];
    let networks = [vf_network()];
    let numbers = compute(&networks, &slices, NO_CLAIMS, &classes());
    assert_eq!(numbers["blue"], Some(2), "node-c has no VF");
    let taken = [claim(&[("node-b", "vf0")])];
    let numbers = compute(&networks, &slices, &taken, &classes());
    assert_eq!(numbers["blue"], Some(1), "node-b's only VF is allocated");
    let taken = [claim(&[("node-b", "vf0"), ("node-a", "vf0")])];
    assert_eq!(
        compute(&networks, &slices, &taken, &classes())["blue"],
        Some(0)
    );
}

#[test]
fn a_node_needs_as_many_free_devices_as_a_pod_asks_for() {
    let slices = [
        slice(
            "node-a",
            1,
            &[("vf0", "vf", json!({})), ("vf1", "vf", json!({}))],
        ),
        slice(
            "node-b",
            1,
            &[("vf0", "vf", json!({})), ("pf0", "pf", json!({}))],
        ),
    ];
    let mut two = vf_network();
    two.spec.interfaces_per_pod = Some(2);
    assert_eq!(
        compute(std::slice::from_ref(&two), &slices, NO_CLAIMS, &classes())["blue"],
        Some(1)
    );
    let taken = [claim(&[("node-a", "vf1")])];
    assert_eq!(
        compute(&[two], &slices, &taken, &classes())["blue"],
        Some(0)
    );
}

#[test]
fn admin_access_does_not_take_a_device() {
    let slices = [slice("node-a", 1, &[("vf0", "vf", json!({}))])];
    let mut watching = claim(&[("node-a", "vf0")]);
    if let Some(results) = watching
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
    {
        results[0].admin_access = Some(true);
    }
    assert_eq!(
        compute(&[vf_network()], &slices, &[watching], &classes())["blue"],
        Some(1)
    );
}

#[test]
fn an_evaluation_error_on_a_free_device_makes_the_number_unknown() {
    // The scheduler fails a pod whose selector errors on a candidate device; knic does not
    // pretend to know where it would fit.
    let speedy = network(
        "speedy",
        json!({"deviceClassName": "knic.dev",
               "selectors": ["device.attributes[\"knic.dev\"].speed >= 25000"]}),
    );
    let slices = [slice("node-a", 1, &[("vf0", "vf", json!({}))])];
    assert_eq!(
        compute(
            std::slice::from_ref(&speedy),
            &slices,
            NO_CLAIMS,
            &classes()
        )["speedy"],
        None
    );
    let fast = json!({"speed": {"int": 100000}});
    let slices = [slice("node-a", 1, &[("vf0", "vf", fast)])];
    assert_eq!(
        compute(&[speedy], &slices, NO_CLAIMS, &classes())["speedy"],
        Some(1)
    );
}

#[test]
fn a_network_marked_invalid_gets_no_number() {
    // E.g. the apiserver refused its template: plan() alone would not know.
    let mut refused = vf_network();
    refused.status = Some(knic_proto::network::NetworkStatus {
        conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: CONDITION_INVALID.into(),
            status: "True".into(),
            reason: "Invalid".into(),
            message: "spec.devices.selectors[0]: compilation failed".into(),
            observed_generation: Some(1),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }],
        ..Default::default()
    });
    let slices = [slice("node-a", 1, &[("vf0", "vf", json!({}))])];
    assert_eq!(
        compute(&[refused], &slices, NO_CLAIMS, &classes())["blue"],
        None
    );
}

#[test]
fn only_the_newest_generation_of_a_pool_counts() {
    let slices = [
        slice("node-a", 1, &[("vf0", "vf", json!({}))]),
        slice("node-a", 2, &[("pf0", "pf", json!({}))]),
    ];
    assert_eq!(
        compute(&[vf_network()], &slices, NO_CLAIMS, &classes())["blue"],
        Some(0)
    );
}

#[test]
fn an_exhausted_network_is_available_nowhere_but_others_are() {
    let token = knic_proto::network::exhaustion_token("blue");
    let listed = json!({"exhaustedNetworks": {"string": format!(",{token},")}});
    let slices = [slice("node-a", 1, &[("vf0", "vf", listed)])];
    let mut red = network("red", json!({"kind": "vf"}));
    red.spec.ipam.subnets[0].cidr = "198.51.100.0/24".into();
    let networks = [vf_network(), red];
    let numbers = compute(&networks, &slices, NO_CLAIMS, &classes());
    assert_eq!(numbers["blue"], Some(0));
    assert_eq!(numbers["red"], Some(1));
}

#[test]
fn unknown_when_the_class_is_missing_the_cel_unsupported_or_the_network_invalid() {
    let slices = [slice("node-a", 1, &[("vf0", "vf", json!({}))])];
    let mut unknown_class = network(
        "raw",
        json!({"deviceClassName": "gpu.example.com", "selectors": []}),
    );
    unknown_class.spec.devices.kind = None;
    let unsupported = network(
        "regex",
        json!({"deviceClassName": "knic.dev",
               "selectors": ["device.attributes[\"knic.dev\"].kind.matches(\"^v\")"]}),
    );
    let mut invalid = vf_network();
    invalid.metadata.name = Some("invalid".into());
    invalid.spec.vlan = Some(5000);
    let networks = [unknown_class, unsupported, invalid];
    let numbers = compute(&networks, &slices, NO_CLAIMS, &classes());
    assert_eq!(numbers["raw"], None);
    assert_eq!(numbers["regex"], None);
    assert_eq!(numbers["invalid"], None);
    let all = networks.to_vec();
    let classes: BTreeMap<String, DeviceClass> =
        classes().into_iter().map(|c| (c.name_any(), c)).collect();
    assert_eq!(
        wanted_for(&networks[0], &all, &classes)
            .err()
            .map(|e| e.to_string())
            .as_deref(),
        Some("DeviceClass \"gpu.example.com\" does not exist")
    );
    assert_eq!(
        wanted_for(&networks[2], &all, &classes)
            .err()
            .map(|e| e.to_string())
            .as_deref(),
        Some("the Network is Invalid")
    );
    let regex = wanted_for(&networks[1], &all, &classes)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(regex.starts_with("selector \"device.attributes"), "{regex}");
}

#[test]
fn slices_without_a_node_and_of_other_drivers_are_ignored() {
    let mut shared = slice("node-a", 1, &[("vf0", "vf", json!({}))]);
    shared.spec.node_name = None;
    shared.spec.all_nodes = Some(true);
    let mut other = slice("node-b", 1, &[("vf0", "vf", json!({}))]);
    other.spec.driver = "other.example.com".into();
    assert_eq!(
        compute(&[vf_network()], &[shared, other], NO_CLAIMS, &classes())["blue"],
        Some(0)
    );
}

/// node-a's pool as knic publishes it with PF budgets: a PF and two VFs drawing on one
/// counter set (the PF takes the whole budget), the set in a slice of its own.
fn budget_slices() -> Vec<ResourceSlice> {
    let consumes = |n: i64| json!([{"counterSet": "pf-0000-a2-00-0", "counters": {"vfs": {"value": n.to_string()}}}]);
    let devices = json!([
        {"name": "pf0", "attributes": {"kind": {"string": "pf"}}, "consumesCounters": consumes(2)},
        {"name": "vf0", "attributes": {"kind": {"string": "vf"}}, "consumesCounters": consumes(1)},
        {"name": "vf1", "attributes": {"kind": {"string": "vf"}}, "consumesCounters": consumes(1)},
    ]);
    let spec = |devices: Value, counters: Value| {
        let mut spec = json!({"driver": "knic.dev", "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 2}});
        if !devices.is_null() {
            spec["devices"] = devices;
        }
        if !counters.is_null() {
            spec["sharedCounters"] = counters;
        }
        spec
    };
    [
        spec(devices, Value::Null),
        spec(
            Value::Null,
            json!([{"name": "pf-0000-a2-00-0", "counters": {"vfs": {"value": "2"}}}]),
        ),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, spec)| {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("node-a-{i}")}, "spec": spec,
        }))
        .unwrap()
    })
    .collect()
}

#[test]
fn a_pf_and_its_vfs_share_one_budget() {
    let slices = budget_slices();
    let pf = network("whole", json!({"kind": "nic"}));
    let mut classes = classes();
    classes.push(class(
        "nic.knic.dev",
        "device.driver == \"knic.dev\" && device.attributes[\"knic.dev\"].kind in [\"nic\", \"pf\"]",
    ));
    let mut two_vfs = vf_network();
    two_vfs.spec.interfaces_per_pod = Some(2);
    let count = |n: &Network, claims: &[ResourceClaim]| {
        compute(std::slice::from_ref(n), &slices, claims, &classes)[&n.name_any()]
    };
    assert_eq!(count(&pf, NO_CLAIMS), Some(1));
    assert_eq!(
        count(&two_vfs, NO_CLAIMS),
        Some(1),
        "both VFs fit the budget"
    );
    let one_vf = [claim(&[("node-a", "vf0")])];
    assert_eq!(
        count(&pf, &one_vf),
        Some(0),
        "a PF with a VF taken is not free"
    );
    assert_eq!(count(&vf_network(), &one_vf), Some(1));
    assert_eq!(count(&two_vfs, &one_vf), Some(0));
    let whole = [claim(&[("node-a", "pf0")])];
    assert_eq!(
        count(&vf_network(), &whole),
        Some(0),
        "no VF of a taken PF is free"
    );
    // A network any device passes: the VFs are counted before the PF would take the budget.
    let mut any_two = network("any", json!({"deviceClassName": "knic.dev"}));
    any_two.spec.interfaces_per_pod = Some(2);
    assert_eq!(count(&any_two, NO_CLAIMS), Some(1));
}

#[test]
fn a_counter_that_is_not_a_whole_number_leaves_the_number_unknown() {
    let mut slices = budget_slices();
    if let Some(sets) = slices[1].spec.shared_counters.as_mut() {
        sets[0].counters.get_mut("vfs").unwrap().value =
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into());
    }
    let numbers = compute(&[vf_network()], &slices, NO_CLAIMS, &classes());
    assert_eq!(numbers["blue"], None);
}
