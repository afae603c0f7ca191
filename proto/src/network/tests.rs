use super::*;

#[test]
fn exhaustion_tokens_are_stable_short_and_distinct() {
    // Pinned: controller and drivers of different versions must agree on every token.
    let blue = exhaustion_token("blue");
    assert_eq!(blue, "2ua2ki4v");
    assert_eq!(blue.len(), TOKEN_LEN);
    assert!(
        blue.chars()
            .all(|c| c.is_ascii_lowercase() || ('2'..='7').contains(&c))
    );
    let tokens: std::collections::BTreeSet<String> = (0..10_000)
        .map(|i| exhaustion_token(&format!("net-{i}")))
        .collect();
    assert_eq!(
        tokens.len(),
        10_000,
        "40-bit tokens collided among 10,000 names"
    );
}

#[test]
fn exhausted_attribute_fits_a_string_attribute_and_lists_the_first_seven() {
    assert_eq!(MAX_EXHAUSTED_LISTED, 7);
    assert_eq!(exhausted_attribute([]), None);
    assert_eq!(
        exhausted_attribute(["aaaaaaaa"]).as_deref(),
        Some(",aaaaaaaa,")
    );
    let names: Vec<String> = (0..9).map(|i| exhaustion_token(&format!("n{i}"))).collect();
    let value = exhausted_attribute(names.iter().map(String::as_str)).unwrap();
    assert!(value.len() <= 64, "{} bytes", value.len());
    assert!(value.contains(&format!(",{},", names[6])));
    assert!(!value.contains(&names[7]));
}

#[test]
fn exhaustion_selector_tests_the_delimited_token() {
    let token = exhaustion_token("blue");
    assert_eq!(
        exhaustion_selector("blue"),
        format!(
            r#"!has(device.attributes["knic.dev"].exhaustedNetworks) || !device.attributes["knic.dev"].exhaustedNetworks.contains(",{token},")"#
        )
    );
}

#[test]
fn conditions_of_an_older_generation_do_not_count() {
    let mut network = Network::new("blue", NetworkSpec::default());
    network.metadata.generation = Some(2);
    let condition = |generation: Option<i64>| Condition {
        type_: CONDITION_EXHAUSTED.into(),
        status: "True".into(),
        observed_generation: generation,
        reason: "NoFreeAddress".into(),
        message: String::new(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ),
    };
    assert!(!network.condition_is_true(CONDITION_EXHAUSTED));
    for (generation, counts) in [(Some(2), true), (None, true), (Some(1), false)] {
        network.status = Some(NetworkStatus {
            conditions: vec![condition(generation)],
            ..NetworkStatus::default()
        });
        assert_eq!(
            network.condition_is_true(CONDITION_EXHAUSTED),
            counts,
            "{generation:?}"
        );
    }
}

#[test]
fn devices_summary_names_the_form() {
    let raw = Devices {
        device_class_name: Some("vf.knic.dev".into()),
        selectors: vec!["a".into(), "b".into()],
        ..Devices::default()
    };
    assert_eq!(raw.summary(), "vf.knic.dev +2 selectors");
    let friendly = Devices {
        kind: Some(DeviceKind::Vf),
        vendor: Some("8086".into()),
        pf_name: Some("ens1f0".into()),
        min_speed: Some(25_000),
        numa_node: Some(0),
        rdma: Some(false),
        ..Devices::default()
    };
    assert_eq!(
        friendly.summary(),
        "vf vendor=8086 pf=ens1f0 speed>=25000 numa=0 no-rdma"
    );
}

#[test]
fn address_count_is_exact_decimal_strings() {
    let count = AddressCount {
        free: (1u128 << 64) - 3,
        total: (1u128 << 64) - 2,
        held: 0,
    };
    let json = serde_json::to_value(count).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"free": "18446744073709551613", "total": "18446744073709551614"})
    );
    assert_eq!(serde_json::from_value::<AddressCount>(json).unwrap(), count);
    assert_eq!(
        AddressCount {
            free: 250,
            total: 253,
            held: 2,
        }
        .summary(),
        "250/253"
    );
    let held = AddressCount {
        free: 1,
        total: 3,
        held: 2,
    };
    let json = serde_json::to_value(held).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"free": "1", "total": "3", "held": "2"})
    );
    assert_eq!(serde_json::from_value::<AddressCount>(json).unwrap(), held);
    for bad in [
        serde_json::json!({"free": 1, "total": "2"}),
        serde_json::json!({"free": "01", "total": "2"}),
        serde_json::json!({"free": "-1", "total": "2"}),
    ] {
        assert!(serde_json::from_value::<AddressCount>(bad).is_err());
    }
}

/// G2: allocations are machine-written, so an older reader must accept a NetworkAddress a
/// newer writer gave a field it does not know (in the spec and in its claim reference).
#[test]
fn a_network_address_with_unknown_fields_parses() {
    let a: NetworkAddress = serde_json::from_value(serde_json::json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkAddress",
        "metadata": {"name": "blue-192-0-2-10"},
        "spec": {
            "network": "blue", "address": "192.0.2.10/24", "node": "vm",
            "claim": {"namespace": "ns", "name": "c", "uid": "u", "futureClaimField": 1},
            "futureSpecField": {"vtep": "10.0.0.5", "mac": "02:00:00:00:00:01"}
        }
    }))
    .expect("a newer writer's allocation parses");
    assert_eq!(a.spec.address, "192.0.2.10/24");
    assert_eq!(a.spec.claim.uid, "u");
    // The human-written Network stays strict: a typo there is refused, naming the field.
    let err = serde_json::from_value::<NetworkSpec>(serde_json::json!({
        "devices": {"deviceClassName": "knic.dev"}, "mtuu": 1400
    }))
    .unwrap_err()
    .to_string();
    assert!(err.contains("unknown field `mtuu`"), "{err}");
}
