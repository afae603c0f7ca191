use super::*;

#[test]
fn paths_parse_namespaced_cluster_and_subresources() {
    let t = parse_path("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status").unwrap();
    assert_eq!(
        (t.collection().as_str(), t.namespace.as_str()),
        ("apis/resource.k8s.io/v1/resourceclaims", "ns")
    );
    assert_eq!(
        (t.name.as_deref(), t.subresource.as_deref()),
        (Some("c"), Some("status"))
    );
    let t = parse_path("/api/v1/namespaces/ns").unwrap();
    assert_eq!(
        (t.resource.as_str(), t.name.as_deref(), t.namespace.as_str()),
        ("namespaces", Some("ns"), "")
    );
    let t = parse_path("/apis/resource.k8s.io/v1/resourceslices").unwrap();
    assert_eq!((t.resource.as_str(), t.name), ("resourceslices", None));
}

#[test]
fn merge_patch_follows_rfc7386() {
    let mut v = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
    merge_patch(&mut v, &json!({"a": {"b": null, "d": 3}, "l": [3]}));
    assert_eq!(v, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
}

#[test]
fn selectors_and_dates() {
    let obj = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": "n1", "driver": "knic.dev"}});
    assert!(selector_matches(
        &obj,
        "fieldSelector=spec.nodeName%3Dn1%2Cspec.driver%3Dknic.dev"
    ));
    assert!(!selector_matches(&obj, "fieldSelector=spec.nodeName%3Dn2"));
    assert!(selector_matches(&obj, "labelSelector=app%3Dx"));
    assert_eq!(now_rfc3339().len(), 20);
}

#[test]
fn request_faults_match_method_and_path_and_count_down() {
    let store = Store::new();
    for (matcher, count) in [("GET /resourceclaims/c", 2), ("* /resourceslices", 1)] {
        let armed = faults::Armed::new(matcher, RequestFault::Internal, count).unwrap();
        store.request_faults.lock().unwrap().push(armed);
    }
    let claim = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c";
    assert_eq!(store.take_fault(&Method::PATCH, claim), None);
    assert_eq!(
        store.take_fault(&Method::GET, claim),
        Some(RequestFault::Internal)
    );
    assert_eq!(
        store.take_fault(&Method::GET, claim),
        Some(RequestFault::Internal)
    );
    assert_eq!(store.take_fault(&Method::GET, claim), None, "armed for two");
    let slices = "/apis/resource.k8s.io/v1/resourceslices";
    assert_eq!(
        store.take_fault(&Method::POST, slices),
        Some(RequestFault::Internal)
    );
    assert_eq!(store.take_fault(&Method::PUT, slices), None);
}

#[test]
fn a_bad_request_matcher_is_refused_with_the_rule() {
    let e = faults::Armed::new("/resourceclaims", RequestFault::Hang, 1).unwrap_err();
    assert!(
        e.to_string().contains("want \"METHOD path-substring\""),
        "{e}"
    );
    let e = faults::Armed::new("G(T /x", RequestFault::Hang, 1).unwrap_err();
    assert!(e.to_string().contains("bad method"), "{e}");
}
