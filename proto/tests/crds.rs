//! The CRDs the chart installs are generated from the Rust types and committed; these tests
//! fail when the committed YAML is stale, and pin the properties of the CRDs that the rest of
//! knic relies on (scope, status subresource, printer columns, immutability, schemas the
//! apiserver accepts and that keep every field the Rust types write).
//!
//! `KNIC_UPDATE_CRDS=1 cargo test -p knic-proto --test crds` rewrites the committed files.

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use knic_proto::network::{
    AddressCount, ClaimRef, NadOptions, Network, NetworkAddress, NetworkAddressSpec, NetworkStatus,
    TemplateRef, validate_against, validate_network,
};
use kube::CustomResourceExt;
use serde_json::{Value, json};

const UPDATE_VAR: &str = "KNIC_UPDATE_CRDS";

fn chart_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../charts/knic")
        .join(relative)
}

/// The committed text of a CRD: a header saying where it comes from, then the YAML.
fn render(crd: &CustomResourceDefinition) -> String {
    let yaml = serde_yaml_ng::to_string(crd).expect("a CRD serializes");
    format!(
        "# Generated from proto/src/network.rs; do not edit.\n\
         # Regenerate with: {UPDATE_VAR}=1 cargo test -p knic-proto --test crds\n\
         {yaml}"
    )
}

fn crds() -> [(&'static str, CustomResourceDefinition); 3] {
    [
        ("crds/networks.knic.dev.yaml", Network::crd()),
        ("crds/networkaddresses.knic.dev.yaml", NetworkAddress::crd()),
        (
            "crds/nodenetworks.knic.dev.yaml",
            knic_proto::network::readiness::NodeNetworks::crd(),
        ),
    ]
}

#[test]
fn committed_crds_are_current() {
    let update = std::env::var_os(UPDATE_VAR).is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (file, crd) in crds() {
        let path = chart_path(file);
        let want = render(&crd);
        if update {
            std::fs::write(&path, &want).expect("write CRD");
            continue;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale CRD YAML (the Rust types in proto/src/network.rs changed): {}\n\
         update with: {UPDATE_VAR}=1 cargo test -p knic-proto --test crds",
        stale.join(", ")
    );
}

#[test]
fn crd_file_names_are_the_crd_names() {
    // Helm installs `crds/` verbatim; a file named after its object is findable.
    for (file, crd) in crds() {
        let name = crd.metadata.name.expect("named");
        assert_eq!(file, format!("crds/{name}.yaml"));
    }
}

#[test]
fn network_crd_is_cluster_scoped_with_status_and_columns() {
    let crd = Network::crd();
    assert_eq!(crd.metadata.name.as_deref(), Some("networks.knic.dev"));
    assert_eq!(crd.spec.group, "knic.dev");
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.kind, "Network");
    assert_eq!(crd.spec.names.plural, "networks");
    let [version] = crd.spec.versions.as_slice() else {
        panic!("one version expected");
    };
    assert_eq!(version.name, "v1alpha1");
    assert!(version.served && version.storage);
    let status = version
        .subresources
        .as_ref()
        .and_then(|s| s.status.as_ref());
    assert!(status.is_some(), "status subresource missing");

    let columns = version
        .additional_printer_columns
        .as_ref()
        .expect("printer columns");
    let default: Vec<(&str, &str, &str)> = columns
        .iter()
        .filter(|c| c.priority.unwrap_or(0) == 0)
        .map(|c| (c.name.as_str(), c.type_.as_str(), c.json_path.as_str()))
        .collect();
    assert_eq!(
        default,
        [
            (
                "Ready",
                "string",
                r#".status.conditions[?(@.type=="Ready")].status"#
            ),
            ("Devices", "string", ".status.devicesSummary"),
            ("Addresses", "string", ".status.addressSummary"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ]
    );
    let wide: Vec<&str> = columns
        .iter()
        .filter(|c| c.priority.unwrap_or(0) > 0)
        .map(|c| c.json_path.as_str())
        .collect();
    assert_eq!(wide, [".status.availableNodes"]);
}

#[test]
fn optional_enum_keeps_the_field_description() {
    let crd = Network::crd();
    let devices = &schema(&crd).properties.as_ref().expect("properties")["spec"]
        .properties
        .as_ref()
        .expect("spec properties")["devices"];
    let kind = &devices.properties.as_ref().expect("devices properties")["kind"];
    assert!(
        kind.description
            .as_deref()
            .is_some_and(|d| d.starts_with("Friendly form: whole ports")),
        "{:?}",
        kind.description
    );
    assert_eq!(kind.nullable, Some(true));
    assert_eq!(kind.enum_.as_ref().map(Vec::len), Some(2));
}

#[test]
fn network_address_crd_is_cluster_scoped_and_immutable() {
    let crd = NetworkAddress::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("networkaddresses.knic.dev")
    );
    assert_eq!(crd.spec.scope, "Cluster");
    let spec = &schema(&crd).properties.as_ref().expect("properties")["spec"];
    let rules: Vec<&str> = spec
        .x_kubernetes_validations
        .iter()
        .flatten()
        .map(|r| r.rule.as_str())
        .collect();
    assert_eq!(rules, ["self == oldSelf"]);
    let mut required = spec.required.clone().unwrap_or_default();
    required.sort();
    assert_eq!(required, ["address", "claim", "network"]);
}

fn schema(crd: &CustomResourceDefinition) -> &JSONSchemaProps {
    crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("schema")
}

/// Rules the apiserver enforces on a CRD schema (structural schemas) that a derive can break:
/// every node has a type, and `additionalProperties` is never `false` nor beside `properties`.
fn check_structural(path: &str, s: &JSONSchemaProps, problems: &mut Vec<String>) {
    if s.type_.is_none() && s.x_kubernetes_int_or_string.is_none() {
        problems.push(format!("{path}: no type"));
    }
    if s.any_of.is_some() || s.one_of.is_some() || s.all_of.is_some() || s.ref_path.is_some() {
        problems.push(format!("{path}: anyOf/oneOf/allOf/$ref"));
    }
    match &s.additional_properties {
        Some(JSONSchemaPropsOrBool::Bool(false)) => {
            problems.push(format!("{path}: additionalProperties: false"));
        }
        Some(_) if s.properties.is_some() => {
            problems.push(format!("{path}: additionalProperties beside properties"));
        }
        Some(JSONSchemaPropsOrBool::Schema(inner)) => {
            check_structural(&format!("{path}.*"), inner, problems);
        }
        _ => {}
    }
    for (name, prop) in s.properties.iter().flatten() {
        check_structural(&format!("{path}.{name}"), prop, problems);
    }
    if let Some(items) = &s.items {
        match items {
            JSONSchemaPropsOrArray::Schema(inner) => {
                check_structural(&format!("{path}[]"), inner, problems);
            }
            JSONSchemaPropsOrArray::Schemas(_) => problems.push(format!("{path}: tuple items")),
        }
    }
}

#[test]
fn schemas_are_structural() {
    for (file, crd) in crds() {
        let mut problems = Vec::new();
        let root = schema(&crd);
        for (name, prop) in root.properties.iter().flatten() {
            check_structural(name, prop, &mut problems);
        }
        assert!(problems.is_empty(), "{file}: {problems:#?}");
    }
}

/// Formats kube-apiserver recognises in a CRD schema (apiextensions' supported formats); any
/// other makes `kubectl apply` of the CRD warn `unrecognized format`.
const KUBERNETES_FORMATS: [&str; 21] = [
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
];
const KUBERNETES_NUMERIC_AND_TIME_FORMATS: [&str; 7] = [
    "int32",
    "int64",
    "float",
    "double",
    "date",
    "date-time",
    "duration",
];

fn unknown_formats(path: &str, s: &JSONSchemaProps, out: &mut Vec<String>) {
    if let Some(format) = &s.format
        && !KUBERNETES_FORMATS.contains(&format.as_str())
        && !KUBERNETES_NUMERIC_AND_TIME_FORMATS.contains(&format.as_str())
    {
        out.push(format!("{path}: format {format:?}"));
    }
    for (name, prop) in s.properties.iter().flatten() {
        unknown_formats(&format!("{path}.{name}"), prop, out);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(items)) = &s.items {
        unknown_formats(&format!("{path}[]"), items, out);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(extra)) = &s.additional_properties {
        unknown_formats(&format!("{path}{{}}"), extra, out);
    }
}

#[test]
fn schemas_use_only_formats_kubernetes_knows() {
    for (file, crd) in crds() {
        let mut problems = Vec::new();
        unknown_formats("", schema(&crd), &mut problems);
        assert!(problems.is_empty(), "{file}: {problems:#?}");
    }
}

#[test]
fn unsigned_fields_keep_their_range() {
    let (_, crd) = &crds()[0];
    let spec = &schema(crd).properties.as_ref().expect("properties")["spec"];
    let vlan = &spec.properties.as_ref().expect("spec properties")["vlan"];
    assert_eq!(vlan.format.as_deref(), Some("int32"));
    assert_eq!((vlan.minimum, vlan.maximum), (Some(0.0), Some(65535.0)));
    let min_speed = &spec.properties.as_ref().expect("spec properties")["devices"]
        .properties
        .as_ref()
        .expect("devices properties")["minSpeed"];
    assert_eq!(min_speed.format.as_deref(), Some("int64"));
    assert_eq!(min_speed.maximum, Some(f64::from(u32::MAX)));
}

/// Every field of `value` is declared by `schema`, i.e. the apiserver would keep it rather than
/// prune it silently; returns the undeclared paths.
fn undeclared(path: &str, value: &Value, s: &JSONSchemaProps, out: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            if s.x_kubernetes_preserve_unknown_fields == Some(true) {
                return;
            }
            for (key, field) in fields {
                let inner = s.properties.as_ref().and_then(|p| p.get(key)).or(
                    match &s.additional_properties {
                        Some(JSONSchemaPropsOrBool::Schema(inner)) => Some(inner.as_ref()),
                        _ => None,
                    },
                );
                match inner {
                    Some(inner) => undeclared(&format!("{path}.{key}"), field, inner, out),
                    None => out.push(format!("{path}.{key}")),
                }
            }
        }
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(inner)) = &s.items {
                for (i, item) in items.iter().enumerate() {
                    undeclared(&format!("{path}[{i}]"), item, inner, out);
                }
            } else {
                out.push(format!("{path}[]"));
            }
        }
        _ => {
            let want = match value {
                Value::String(_) => "string",
                Value::Bool(_) => "boolean",
                Value::Number(n) if n.is_f64() => "number",
                Value::Number(_) => "integer",
                _ => "null",
            };
            if s.type_.as_deref() != Some(want) {
                out.push(format!(
                    "{path}: {want} where the schema says {:?}",
                    s.type_
                ));
            }
        }
    }
}

fn assert_all_declared(crd: &CustomResourceDefinition, value: &Value) {
    let mut out = Vec::new();
    let root = schema(crd);
    for key in ["spec", "status"] {
        if let (Some(v), Some(s)) = (
            value.get(key),
            root.properties.as_ref().and_then(|p| p.get(key)),
        ) {
            undeclared(key, v, s, &mut out);
        }
    }
    assert!(out.is_empty(), "not in the CRD schema: {out:#?}");
}

fn sample() -> Value {
    let text = std::fs::read_to_string(chart_path("examples/network-blue.yaml")).expect("sample");
    serde_yaml_ng::from_str(&text).expect("sample is YAML")
}

#[test]
fn sample_network_round_trips_and_fits_the_crd() {
    let value = sample();
    let network: Network = serde_json::from_value(value.clone()).expect("sample is a Network");
    assert_eq!(network.metadata.name.as_deref(), Some("blue"));
    assert_eq!(network.spec.vlan, Some(100));
    assert_eq!(network.spec.ipam.subnets.len(), 2);
    assert_eq!(
        network.spec.devices.summary(),
        "vf vendor=8086 speed>=25000"
    );
    assert_eq!(serde_json::to_value(&network).expect("serializes"), value);
    assert_all_declared(&Network::crd(), &value);
}

#[test]
fn sample_network_with_an_unknown_field_is_rejected() {
    for (pointer, field) in [
        ("/spec", "vlanId"),
        ("/spec/devices", "speed"),
        ("/spec/ipam/subnets/0", "gw"),
        ("/spec/ipam/subnets/0/routes/0", "via"),
        ("/spec/namespaces/selector", "matchExpressions"),
    ] {
        let mut value = sample();
        value
            .pointer_mut(pointer)
            .and_then(Value::as_object_mut)
            .expect("pointer into the sample")
            .insert(field.to_owned(), json!(1));
        let error = serde_json::from_value::<Network>(value)
            .expect_err(&format!("{pointer}/{field} must be refused"))
            .to_string();
        assert!(
            error.contains(&format!("unknown field `{field}`")),
            "{pointer}/{field}: {error}"
        );
    }
}

#[test]
fn nad_field_is_an_empty_object_that_refuses_options() {
    let mut value = sample();
    value["spec"]["networkAttachmentDefinition"] = json!({});
    let network: Network = serde_json::from_value(value.clone()).expect("parses");
    assert_eq!(
        network.spec.network_attachment_definition,
        Some(NadOptions {})
    );
    assert_eq!(serde_json::to_value(&network).expect("serializes"), value);
    value["spec"]["networkAttachmentDefinition"] = json!({"resourceName": "x"});
    let error = serde_json::from_value::<Network>(value)
        .expect_err("an unknown option must be refused")
        .to_string();
    assert!(error.contains("unknown field `resourceName`"), "{error}");
}

#[test]
fn full_status_fits_the_crd() {
    let mut network: Network = serde_json::from_value(sample()).expect("sample");
    network.spec.network_attachment_definition = Some(NadOptions {});
    let addresses = AddressCount {
        free: (1 << 64) + 250,
        total: (1 << 64) + 253,
        held: 2,
    };
    network.status = Some(NetworkStatus {
        observed_generation: Some(3),
        conditions: vec![Condition {
            last_transition_time: Time(Default::default()),
            message: "templates applied in 2 namespaces".into(),
            observed_generation: Some(3),
            reason: "Applied".into(),
            status: "True".into(),
            type_: knic_proto::network::CONDITION_READY.into(),
        }],
        templates: vec![TemplateRef {
            namespace: "blue-a".into(),
            name: "blue".into(),
        }],
        network_attachment_definitions: vec![TemplateRef {
            namespace: "blue-a".into(),
            name: "blue".into(),
        }],
        addresses: Some(addresses),
        address_summary: Some(addresses.summary()),
        devices_summary: Some(network.spec.devices.summary()),
        available_nodes: Some(4),
    });
    let value = serde_json::to_value(&network).expect("serializes");
    assert_all_declared(&Network::crd(), &value);
    let back: Network = serde_json::from_value(value).expect("parses");
    assert_eq!(back, network);
}

#[test]
fn network_address_round_trips_and_fits_the_crd() {
    let mut address = NetworkAddress::new(
        "blue-192-0-2-10",
        NetworkAddressSpec {
            network: "blue".into(),
            address: "192.0.2.10/24".into(),
            claim: ClaimRef {
                namespace: "blue-a".into(),
                name: "db-0-blue".into(),
                uid: "0b8f0c8e-0000-4000-8000-000000000001".into(),
            },
            identity: Some("blue-a/db-0".into()),
            node: Some("node-1".into()),
            overlay: None,
        },
    );
    address.metadata.labels = Some(
        [(knic_proto::network::NETWORK_LABEL.to_owned(), "blue".into())]
            .into_iter()
            .collect(),
    );
    let value = serde_json::to_value(&address).expect("serializes");
    assert_eq!(value["apiVersion"], "knic.dev/v1alpha1");
    assert_eq!(value["kind"], "NetworkAddress");
    assert_all_declared(&NetworkAddress::crd(), &value);
    assert_eq!(
        serde_json::from_value::<NetworkAddress>(value).expect("parses"),
        address
    );
}

/// The documented example of two Networks sharing a VLAN: each fits the CRD and validates, the
/// pair passes the cross-network check in both orders, and it is the group that makes it pass.
#[test]
fn shared_vlan_example_validates() {
    let text = std::fs::read_to_string(chart_path("examples/networks-shared-vlan.yaml"))
        .expect("shared VLAN example");
    let values: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("a YAML document"))
        .collect();
    let networks: Vec<(String, knic_proto::network::NetworkSpec)> = values
        .iter()
        .map(|value| {
            assert_all_declared(&Network::crd(), value);
            let network: Network = serde_json::from_value(value.clone()).expect("a Network");
            let name = network.metadata.name.clone().expect("a name");
            assert_eq!(validate_network(&name, &network.spec), Ok(()), "{name}");
            (name, network.spec)
        })
        .collect();
    let [(a, a_spec), (b, b_spec)] = networks.as_slice() else {
        panic!("two Networks expected, got {}", networks.len());
    };
    assert_eq!(b_spec.vlan_share_group.as_deref(), Some("storage"));
    assert_eq!(validate_against(b, b_spec, &networks), vec![]);
    assert_eq!(validate_against(a, a_spec, &networks), vec![]);
    // Without the group on the newer one, the same pair is a conflict.
    let mut alone = b_spec.clone();
    alone.vlan_share_group = None;
    assert_eq!(
        validate_against(b, &alone, std::slice::from_ref(&networks[0]))
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec![
            "spec.vlan: VLAN 200 is already used by network \"storage-a\" on overlapping devices, shared with group \"storage\"; set spec.vlanShareGroup to \"storage\" to join it",
            "spec.ipam.subnets[0].cidr: 10.20.0.0/24 overlaps 10.20.0.0/24 of network \"storage-a\" on overlapping devices and the same VLAN (VLAN 200)",
        ]
    );
}
