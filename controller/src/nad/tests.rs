use super::*;
use crate::network::{Devices, NadOptions, Namespaces, NetworkSpec};

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

fn live(namespace: &str, ours: bool, current: bool) -> Live {
    Live {
        namespace: namespace.into(),
        uid: Some(format!("uid-{namespace}")),
        ours,
        current,
    }
}

fn refs(names: &[&str]) -> Vec<TemplateRef> {
    names
        .iter()
        .map(|ns| TemplateRef {
            namespace: (*ns).into(),
            name: "blue".into(),
        })
        .collect()
}

#[test]
fn without_the_field_nothing_is_applied_and_ours_are_removed() {
    let c = changes(
        "blue",
        false,
        &set(&["a", "b"]),
        &[live("a", true, true), live("b", false, false)],
    );
    assert_eq!(c.apply, Vec::<String>::new());
    assert_eq!(c.delete, vec![("a".to_owned(), Some("uid-a".to_owned()))]);
    assert!(c.present.is_empty() && c.foreign.is_empty(), "{c:?}");
}

#[test]
fn with_the_field_missing_and_drifted_are_applied_current_ones_are_not() {
    let c = changes(
        "blue",
        true,
        &set(&["a", "b", "c"]),
        &[live("a", true, true), live("b", true, false)],
    );
    assert_eq!(c.apply, vec!["b".to_owned(), "c".to_owned()]);
    assert!(c.delete.is_empty());
    assert_eq!(c.present, refs(&["a", "b", "c"]));
}

#[test]
fn at_rest_there_is_nothing_to_write() {
    let c = changes("blue", true, &set(&["a"]), &[live("a", true, true)]);
    assert_eq!(
        c,
        Changes {
            present: refs(&["a"]),
            ..Changes::default()
        }
    );
}

#[test]
fn deselection_removes_only_ours() {
    let c = changes(
        "blue",
        true,
        &set(&["b"]),
        &[
            live("a", true, true),
            live("b", true, true),
            live("x", false, true),
        ],
    );
    assert_eq!(c.delete, vec![("a".to_owned(), Some("uid-a".to_owned()))]);
    assert_eq!(c.present, refs(&["b"]));
}

#[test]
fn a_foreign_nad_is_left_alone_and_reported() {
    let c = changes("blue", true, &set(&["a", "b"]), &[live("a", false, false)]);
    assert_eq!(c.apply, vec!["b".to_owned()]);
    assert!(c.delete.is_empty());
    assert_eq!(c.present, refs(&["b"]));
    assert_eq!(
        c.foreign,
        vec![
            "namespace a: a NetworkAttachmentDefinition named \"blue\" that knic did not \
             generate already exists; it is left alone"
                .to_owned()
        ]
    );
}

#[test]
fn crd_missing_message_names_the_field_and_the_crd() {
    assert_eq!(
        crd_missing_message(),
        "spec.networkAttachmentDefinition: the NetworkAttachmentDefinition CRD \
         (k8s.cni.cncf.io/v1) is not installed; templates were generated, NADs were not"
    );
}

fn blue() -> Network {
    let mut n = Network::new(
        "blue",
        NetworkSpec {
            devices: Devices {
                device_class_name: Some("vf.knic.dev".into()),
                ..Devices::default()
            },
            namespaces: Namespaces {
                names: vec!["a".into()],
                ..Namespaces::default()
            },
            network_attachment_definition: Some(NadOptions {}),
            ..NetworkSpec::default()
        },
    );
    n.metadata.uid = Some("u-1".into());
    n
}

#[test]
fn desired_nad_is_labelled_owned_and_carries_the_config() {
    let want = desired(&blue(), "team-a");
    assert_eq!(
        want,
        json!({
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {
                "name": "blue", "namespace": "team-a",
                "labels": {"knic.dev/network": "blue"},
                "ownerReferences": [{"apiVersion": "knic.dev/v1alpha1", "kind": "Network",
                    "name": "blue", "uid": "u-1", "controller": true}],
            },
            "spec": {"config": r#"{"cniVersion":"1.0.0","name":"blue","type":"knic","network":"blue"}"#},
        })
    );
}

#[test]
fn a_listed_nad_is_current_only_when_label_owner_and_config_match() {
    let n = blue();
    let want = desired(&n, "a");
    let as_stored: DynamicObject = serde_json::from_value(want.clone()).expect("parses");
    assert!(is_current(&as_stored, &want));
    let mut edited = as_stored.clone();
    edited.data["spec"]["config"] = json!("{}");
    assert!(!is_current(&edited, &want));
    let mut unowned = as_stored.clone();
    unowned.metadata.owner_references = None;
    assert!(!is_current(&unowned, &want));
    let mut unlabelled = as_stored;
    unlabelled.metadata.labels = None;
    assert!(!is_current(&unlabelled, &want));
}
