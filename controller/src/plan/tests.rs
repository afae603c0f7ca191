use super::*;
use crate::network::{Devices, Ipam, Namespaces, Subnet};

fn network(name: &str, created: i64, vlan: u16, cidr: &str) -> Network {
    let mut n = Network::new(
        name,
        NetworkSpec {
            devices: Devices {
                device_class_name: Some("vf.knic.dev".into()),
                ..Devices::default()
            },
            vlan: Some(vlan),
            mtu: Some(9000),
            ipam: Ipam {
                subnets: vec![Subnet {
                    cidr: cidr.into(),
                    gateway: None,
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
    n.metadata.creation_timestamp = Some(Time(
        Timestamp::from_second(1_700_000_000 + created).expect("timestamp"),
    ));
    n
}

#[test]
fn template_carries_request_and_config() {
    let mut n = network("blue", 0, 100, "192.0.2.0/24");
    n.spec.interfaces_per_pod = Some(2);
    let Plan::Generate(spec) = plan(&n, std::slice::from_ref(&n)) else {
        panic!("valid network must generate");
    };
    let json = serde_json::to_value(&*spec).expect("json");
    assert_eq!(
        json,
        serde_json::json!({"metadata": {"labels": {"knic.dev/network": "blue"}}, "spec": {"devices": {
            "requests": [{"name": "network", "exactly": {
                "deviceClassName": "vf.knic.dev", "allocationMode": "ExactCount", "count": 2,
                "selectors": [{"cel": {"expression": exhaustion_selector("blue")}}]}}],
            "config": [{"requests": ["network"], "opaque": {"driver": "knic.dev", "parameters": {
                "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                "interface": {"mtu": 9000}, "vlan": {"id": 100}, "ipam": {"network": "blue"}}}}],
        }}})
    );
}

#[test]
fn static_networks_get_no_exhaustion_selector() {
    let mut n = network("blue", 0, 100, "192.0.2.0/24");
    n.spec.ipam.subnets.clear();
    n.spec.ipam.static_addresses = Some(crate::network::StaticIpam {});
    let spec = template_spec("blue", &n.spec).expect("valid");
    let requests = spec
        .spec
        .devices
        .and_then(|d| d.requests)
        .expect("requests");
    let exactly = requests[0].exactly.as_ref().expect("exactly");
    assert_eq!(exactly.selectors, None);
}

#[test]
fn exhausted_condition_says_which_subnets_and_what_pods_do() {
    let n = network("blue", 0, 100, "192.0.2.0/29");
    let six: Vec<String> = (1..=6).map(|i| format!("192.0.2.{i}/29")).collect();
    let six: Vec<&str> = six.iter().map(String::as_str).collect();
    let c =
        exhausted_condition(&n.spec, &six, Some(3), &NetworkStatus::default()).expect("subnets");
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        ("Exhausted", "True", "NoFreeAddress")
    );
    assert_eq!(
        c.message,
        "all 6 allocatable IPv4 addresses of 192.0.2.0/29 are in use; new pods of this network \
         stay Pending (unschedulable) until an address is released or a subnet is added, \
         running pods keep theirs"
    );
    assert_eq!(c.observed_generation, Some(3));
    let c = exhausted_condition(&n.spec, &six[..4], Some(3), &NetworkStatus::default())
        .expect("subnets");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("False", "AddressesFree", "2 of 6 addresses free")
    );
    let mut static_ipam = n.clone();
    static_ipam.spec.ipam.subnets.clear();
    assert_eq!(
        exhausted_condition(&static_ipam.spec, &[], None, &NetworkStatus::default()),
        None
    );
}

#[test]
fn one_full_family_exhausts_a_dual_stack_network() {
    let mut n = network("blue", 0, 100, "192.0.2.0/30");
    n.spec.ipam.subnets.push(Subnet {
        cidr: "2001:db8::/64".into(),
        ..Subnet::default()
    });
    // The /30 has two usable addresses; the /64 has plenty left.
    let used = ["192.0.2.1/30", "192.0.2.2/30", "2001:db8::1/64"];
    let c = exhausted_condition(&n.spec, &used, None, &NetworkStatus::default()).expect("subnets");
    assert_eq!(c.status, "True");
    assert!(
        c.message
            .starts_with("all 2 allocatable IPv4 addresses of 192.0.2.0/30 are in use; new pods"),
        "{}",
        c.message
    );
    let c =
        exhausted_condition(&n.spec, &used[..1], None, &NetworkStatus::default()).expect("subnets");
    assert_eq!(c.status, "False");
}

#[test]
fn fewer_free_addresses_than_a_pod_needs_is_exhausted() {
    let mut n = network("blue", 0, 100, "192.0.2.0/29");
    n.spec.interfaces_per_pod = Some(2);
    let five = [
        "192.0.2.1/29",
        "192.0.2.2/29",
        "192.0.2.3/29",
        "192.0.2.4/29",
        "192.0.2.5/29",
    ];
    let c = exhausted_condition(&n.spec, &five, None, &NetworkStatus::default()).expect("subnets");
    assert_eq!(c.status, "True");
    assert!(
        c.message.starts_with(
            "only 1 of 6 allocatable IPv4 addresses of 192.0.2.0/29 are free and each pod needs 2; \
             new pods"
        ),
        "{}",
        c.message
    );
    let c =
        exhausted_condition(&n.spec, &five[..4], None, &NetworkStatus::default()).expect("subnets");
    assert_eq!(c.status, "False");
}

#[test]
fn older_network_wins_a_conflict() {
    let a = network("net-a", 0, 100, "192.0.2.0/24");
    let b = network("net-b", 5, 100, "192.0.2.128/25");
    let all = [a.clone(), b.clone()];
    assert!(matches!(plan(&a, &all), Plan::Generate(_)));
    assert_eq!(
        plan(&b, &all),
        Plan::Invalid(
            "spec.vlan: VLAN 100 is already used by network \"net-a\" on overlapping devices; \
             to share it on purpose, both Networks must set the same spec.vlanShareGroup; \
             spec.ipam.subnets[0].cidr: 192.0.2.128/25 overlaps 192.0.2.0/24 of network \"net-a\" \
             on overlapping devices and the same VLAN (VLAN 100)"
                .into()
        )
    );
    // Same second: the name decides, so both replicas and every reconcile agree.
    let b_same_second = network("net-b", 0, 100, "192.0.2.128/25");
    assert!(matches!(
        plan(&b_same_second, &[a.clone(), b_same_second.clone()]),
        Plan::Invalid(_)
    ));
    // A deleting Network no longer blocks anyone.
    let mut deleting = a;
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    assert!(matches!(
        plan(&b, &[deleting, b.clone()]),
        Plan::Generate(_)
    ));
}

#[test]
fn networks_sharing_a_vlan_on_purpose_are_both_generated() {
    let shared = |name: &str, created: i64, cidr: &str, group: &str| {
        let mut n = network(name, created, 100, cidr);
        n.spec.vlan_share_group = Some(group.into());
        n
    };
    let a = shared("net-a", 0, "192.0.2.0/25", "storage");
    let b = shared("net-b", 5, "192.0.2.128/25", "storage");
    let all = [a.clone(), b.clone()];
    assert!(matches!(plan(&a, &all), Plan::Generate(_)));
    assert!(matches!(plan(&b, &all), Plan::Generate(_)));
    // The group does not reach the template: the driver keys a shared VLAN by (parent, id).
    let (Plan::Generate(with_group), Plan::Generate(without)) = (
        plan(&b, &all),
        plan(&network("net-b", 5, 100, "192.0.2.128/25"), &[]),
    ) else {
        panic!("both valid");
    };
    assert_eq!(with_group, without);
    // Another group on the newer one: only it is refused, with the reason in its message.
    let c = shared("net-c", 9, "198.51.100.0/24", "backup");
    assert_eq!(
        plan(&c, &[a, b, c.clone()]),
        Plan::Invalid(
            "spec.vlanShareGroup: \"backup\" differs from group \"storage\" of network \"net-a\", \
             which uses VLAN 100 on overlapping devices; Networks share a VLAN only with the same \
             group; spec.vlanShareGroup: \"backup\" differs from group \"storage\" of network \
             \"net-b\", which uses VLAN 100 on overlapping devices; Networks share a VLAN only with \
             the same group"
                .into()
        )
    );
}

#[test]
fn own_validation_errors_are_the_message() {
    let n = network("blue", 0, 5000, "192.0.2.1/24");
    let Plan::Invalid(message) = plan(&n, std::slice::from_ref(&n)) else {
        panic!("must be invalid");
    };
    let direct = validate_network("blue", &n.spec)
        .expect_err("invalid")
        .to_string();
    assert_eq!(message, direct);
    assert!(message.contains("spec.vlan"), "{message}");
    assert!(message.contains("spec.ipam.subnets[0].cidr"), "{message}");
}

#[test]
fn generated_template_is_labelled_and_owned() {
    let mut n = network("blue", 0, 100, "192.0.2.0/24");
    n.metadata.uid = Some("u-1".into());
    let Plan::Generate(spec) = plan(&n, std::slice::from_ref(&n)) else {
        panic!("valid");
    };
    let t = template(&n, "a", *spec);
    assert_eq!(
        t.labels().get(NETWORK_LABEL).map(String::as_str),
        Some("blue")
    );
    let owner = t.owner_references().first().cloned().expect("owner");
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Network", "blue", "u-1")
    );
    assert_eq!(owner.controller, Some(true));
}

#[test]
fn addresses_count_live_allocations_inside_pools() {
    let mut n = network("blue", 0, 100, "192.0.2.0/24");
    n.spec.ipam.subnets[0].gateway = Some("192.0.2.1".into());
    n.spec.ipam.subnets.push(Subnet {
        cidr: "2001:db8::/126".into(),
        ..Subnet::default()
    });
    // 253 + 3 (a /126 keeps all but the subnet-router anycast address).
    let total = address_count(&n.spec, &[]).expect("subnets").total;
    let count = address_count(
        &n.spec,
        &[
            "192.0.2.10/24",
            "192.0.2.10/24",
            "198.51.100.1/24",
            "2001:db8::1/126",
            "junk",
        ],
    )
    .expect("subnets");
    assert_eq!((count.free, count.total), (total - 2, total));
    assert_eq!(count.summary(), format!("{}/{}", total - 2, total));
    assert_eq!(count.held, 0);
    // Held addresses are used (not free) and counted apart; one outside every pool is not.
    let with_held = address_count_held(
        &n.spec,
        &["192.0.2.10/24", "192.0.2.11/24", "2001:db8::1/126"],
        &["192.0.2.11/24", "198.51.100.1/24"],
    )
    .expect("subnets");
    assert_eq!(
        (with_held.free, with_held.total, with_held.held),
        (total - 3, total, 1)
    );
    n.spec.ipam.subnets.clear();
    assert_eq!(address_count(&n.spec, &["192.0.2.10/24"]), None);
}

#[test]
fn conditions_keep_transition_time_while_status_holds() {
    let old = Time(Timestamp::from_second(1_600_000_000).expect("ts"));
    let previous = vec![Condition {
        type_: CONDITION_READY.into(),
        status: "True".into(),
        reason: reason::GENERATED.into(),
        message: "m".into(),
        observed_generation: Some(1),
        last_transition_time: old.clone(),
    }];
    let same = condition(
        CONDITION_READY,
        true,
        reason::GENERATED,
        "m2",
        Some(2),
        &previous,
    );
    assert_eq!(same.last_transition_time, old);
    assert_eq!(
        (same.message.as_str(), same.observed_generation),
        ("m2", Some(2))
    );
    let flipped = condition(
        CONDITION_READY,
        false,
        reason::INVALID,
        "x",
        Some(2),
        &previous,
    );
    assert_ne!(flipped.last_transition_time, old);
    assert_eq!(flipped.status, "False");
}

#[test]
fn finalizer_is_knic_owned() {
    assert!(FINALIZER.starts_with(knic_proto::DRIVER_NAME));
}

/// The template as a real v1.36 apiserver gives it back: `spec.metadata` as knic sent it (the
/// Network label), and before knic sent any, `{}`. The first is unchanged; a pre-label template
/// (`{}` or none) differs, so every template is replaced once on upgrade and its claims carry
/// the label from then on.
#[test]
fn the_claim_label_counts_in_the_template_comparison() {
    let n = network("blue", 0, 100, "192.0.2.0/24");
    let Plan::Generate(desired) = plan(&n, std::slice::from_ref(&n)) else {
        panic!("valid network must generate");
    };
    let labels = desired.metadata.as_ref().and_then(|m| m.labels.clone());
    assert_eq!(
        labels,
        Some(BTreeMap::from([(
            NETWORK_LABEL.to_owned(),
            "blue".to_owned()
        )])),
        "claims made from the template are labelled with their Network"
    );
    let stored = serde_json::to_value(&*desired).expect("json");
    let live: ResourceClaimTemplateSpec =
        serde_json::from_value(stored.clone()).expect("template spec");
    assert!(same_template_spec(&live, &desired));
    for before_labels in [serde_json::json!({}), serde_json::Value::Null] {
        let mut old = stored.clone();
        old["metadata"] = before_labels;
        let old: ResourceClaimTemplateSpec = serde_json::from_value(old).expect("template spec");
        assert!(
            !same_template_spec(&old, &desired),
            "replaced once on upgrade"
        );
    }
    // A real difference still counts, in the spec and in the claim metadata alike.
    let mut other = live.clone();
    other.metadata = Some(ObjectMeta {
        labels: Some(BTreeMap::from([("a".to_owned(), "b".to_owned())])),
        ..ObjectMeta::default()
    });
    assert!(!same_template_spec(&other, &desired));
    let Plan::Generate(mtu) = plan(&network("blue", 0, 101, "192.0.2.0/24"), &[]) else {
        panic!("valid network must generate");
    };
    assert!(!same_template_spec(&live, &mtu));
}

fn overlay(name: &str, created: i64, vni: u32) -> Network {
    let mut n = network(name, created, 1, "10.42.0.0/24");
    n.spec.devices = Devices::default();
    n.spec.vlan = None;
    n.spec.mtu = Some(1400);
    n.spec.vxlan = Some(crate::network::Vxlan { vni, port: None });
    n
}

#[test]
fn overlay_template_asks_for_the_overlay_class_with_only_the_exhaustion_selector() {
    let n = overlay("ovl", 0, 4242);
    let Plan::Generate(spec) = plan(&n, std::slice::from_ref(&n)) else {
        panic!("valid overlay Network must generate");
    };
    assert_eq!(
        serde_json::to_value(&*spec).expect("json"),
        serde_json::json!({"metadata": {"labels": {"knic.dev/network": "ovl"}}, "spec": {"devices": {
            "requests": [{"name": "network", "exactly": {
                "deviceClassName": "overlay.knic.dev", "allocationMode": "ExactCount", "count": 1,
                "selectors": [{"cel": {"expression": exhaustion_selector("ovl")}}]}}],
            "config": [{"requests": ["network"], "opaque": {"driver": "knic.dev", "parameters": {
                "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                "interface": {"mtu": 1400}, "ipam": {"network": "ovl"}}}}],
        }}})
    );
    assert_eq!(n.spec.devices_summary(), "vxlan vni=4242");
}

#[test]
fn older_overlay_keeps_its_vni() {
    let blue = overlay("blue", 0, 4242);
    let ovl = overlay("ovl", 5, 4242);
    let other = overlay("green", 7, 4243);
    let all = [ovl.clone(), blue.clone(), other.clone()];
    assert!(matches!(plan(&blue, &all), Plan::Generate(_)));
    assert!(matches!(plan(&other, &all), Plan::Generate(_)));
    assert_eq!(
        plan(&ovl, &all),
        Plan::Invalid(
            "spec.vxlan.vni: VNI 4242 is already used by network \"blue\"; two Networks on one \
             VNI would be one layer-2 segment (pick another vni)"
                .into()
        )
    );
    // Once the older one is being deleted, the newer one takes the VNI.
    let mut deleting = blue;
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    assert!(matches!(
        plan(&ovl, &[deleting, ovl.clone()]),
        Plan::Generate(_)
    ));
}
