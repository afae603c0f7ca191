use super::memory::MemBook;
use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use knic_proto::network::NetworkStatus;
use serde_json::json;
use std::sync::atomic::Ordering;

fn who(claim: &str, uid: &str, pod: &str) -> Requester {
    Requester {
        namespace: "ns".into(),
        claim: claim.into(),
        uid: uid.into(),
        pod: pod.into(),
        node: "node-a".into(),
        vtep: None,
    }
}

fn spec(subnets: serde_json::Value) -> serde_json::Value {
    json!({
        "devices": {"deviceClassName": "knic.dev"},
        "ipam": {"subnets": subnets},
        "namespaces": {"names": ["ns"]},
    })
}

fn book_with(subnets: serde_json::Value) -> MemBook {
    let book = MemBook::default();
    book.add_network("blue", spec(subnets));
    book
}

async fn alloc(book: &MemBook, who: &Requester) -> Result<Addressing> {
    allocate(book, "blue", who, 0, &BTreeSet::new()).await
}

#[tokio::test]
async fn allocates_from_the_subnet_records_the_owner_and_routes_via_the_gateway() {
    let book = book_with(json!([{
        "cidr": "192.0.2.0/24", "gateway": "192.0.2.1",
        "routes": [{"destination": "198.51.100.0/24"}, {"destination": "203.0.113.0/24", "gateway": "192.0.2.254"}],
    }]));
    let got = alloc(&book, &who("c", "u1", "p")).await.unwrap();
    assert_eq!(got.allocations.len(), 1);
    let a = &got.allocations[0];
    assert_eq!(a.address.prefix_len, 24);
    assert!(a.address.addr.to_string().starts_with("192.0.2."));
    assert_ne!(a.address.addr.to_string(), "192.0.2.1", "never the gateway");
    assert_eq!(a.name, allocation_name("blue", a.address.addr));
    let objects = book.objects.lock().unwrap();
    let object = &objects[&a.name];
    assert_eq!(object.metadata.uid.as_deref(), Some(a.uid.as_str()));
    assert_eq!(object.spec.claim.uid, "u1");
    assert_eq!(object.spec.node.as_deref(), Some("node-a"));
    assert_eq!(object.spec.address, a.address.to_string());
    assert_eq!(
        object.metadata.labels.as_ref().unwrap()[NETWORK_LABEL],
        "blue"
    );
    let gateways: Vec<_> = got.routes.iter().map(|r| r.gateway.as_deref()).collect();
    assert_eq!(gateways, [Some("192.0.2.1"), Some("192.0.2.254")]);
}

#[tokio::test]
async fn unselected_namespaces_invalid_and_deleted_networks_are_refused() {
    let book = MemBook::default();
    book.add_network(
        "blue",
        json!({"devices": {"deviceClassName": "knic.dev"},
               "ipam": {"subnets": [{"cidr": "192.0.2.0/29"}]},
               "namespaces": {"names": ["team-a", "team-b"]}}),
    );
    let err = alloc(&book, &who("c", "u1", "p")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "Network \"blue\" is not offered to namespace \"ns\" (spec.namespaces.names is \
         [team-a, team-b])"
    );

    book.add_network(
        "blue",
        json!({"devices": {"deviceClassName": "knic.dev"},
               "ipam": {"subnets": [{"cidr": "192.0.2.0/29"}]},
               "namespaces": {"selector": {"matchLabels": {"team": "a", "tier": "db"}}}}),
    );
    let err = alloc(&book, &who("c", "u1", "p")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "Network \"blue\" is not offered to namespace \"ns\" (the namespace does \
         not exist: spec.namespaces.selector.matchLabels is {team=a, tier=db})"
    );
    book.namespaces
        .lock()
        .unwrap()
        .insert("ns".into(), BTreeMap::from([("team".into(), "a".into())]));
    let err = alloc(&book, &who("c", "u1", "p")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "Network \"blue\" is not offered to namespace \"ns\" (its labels do not \
         match: spec.namespaces.selector.matchLabels is {team=a, tier=db})"
    );
    book.namespaces.lock().unwrap().insert(
        "ns".into(),
        BTreeMap::from([("team".into(), "a".into()), ("tier".into(), "db".into())]),
    );
    alloc(&book, &who("c", "u1", "p"))
        .await
        .expect("selected by labels");
    assert!(
        book.objects.lock().unwrap().len() == 1,
        "nothing else was created"
    );

    // Invalid for the current generation: refused; for an older one: served.
    let invalid = |generation: i64| Condition {
        type_: "Invalid".into(),
        status: "True".into(),
        reason: "Invalid".into(),
        message: "spec.vlan: 5000 is not a VLAN id (1..4094)".into(),
        observed_generation: Some(generation),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    };
    book.edit_network("blue", |blue| {
        blue.metadata.generation = Some(4);
        blue.status = Some(NetworkStatus {
            conditions: vec![invalid(4)],
            ..NetworkStatus::default()
        });
    });
    let err = alloc(&book, &who("c2", "u2", "p2")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "Network \"blue\" is Invalid, so it allocates no addresses: spec.vlan: 5000 is not \
         a VLAN id (1..4094)"
    );
    book.edit_network("blue", |n| n.metadata.generation = Some(5));
    alloc(&book, &who("c2", "u2", "p2"))
        .await
        .expect("the fixed spec is served");

    book.edit_network("blue", |n| {
        n.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    });
    let err = alloc(&book, &who("c3", "u3", "p3")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "Network \"blue\" is being deleted; it allocates no new addresses"
    );
    assert_eq!(
        book.objects.lock().unwrap().len(),
        2,
        "refusals create nothing"
    );
}

#[tokio::test]
async fn missing_and_static_networks_are_clear_errors() {
    let book = MemBook::default();
    let err = alloc(&book, &who("c", "u1", "p")).await.unwrap_err();
    assert_eq!(err.to_string(), "Network \"blue\" does not exist");
    book.add_network(
        "blue",
        json!({"devices": {"deviceClassName": "knic.dev"}, "ipam": {"static": {}}, "namespaces": {"names": ["ns"]}}),
    );
    let err = alloc(&book, &who("c", "u1", "p")).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("Network \"blue\" has static addressing"),
        "{err}"
    );
}

#[tokio::test]
async fn exhaustion_gives_the_controllers_message_and_leaves_nothing_behind() {
    // A /29 has 6 usable addresses; the gateway leaves 5.
    let book = book_with(json!([{"cidr": "192.0.2.0/29", "gateway": "192.0.2.1"}]));
    let mut seen = BTreeSet::new();
    for i in 0..5 {
        let got = alloc(&book, &who(&format!("c{i}"), &format!("u{i}"), "p"))
            .await
            .unwrap();
        assert!(seen.insert(got.allocations[0].address), "duplicate");
    }
    let err = alloc(&book, &who("c5", "u5", "p")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "network blue: subnet 192.0.2.0/29 has no free address (5 in use of 5)"
    );
    assert_eq!(book.objects.lock().unwrap().len(), 5);
}

#[tokio::test]
async fn a_reprepare_reuses_the_claims_existing_allocation() {
    let book = book_with(json!([{"cidr": "192.0.2.0/24"}]));
    let first = alloc(&book, &who("c", "u1", "p")).await.unwrap();
    let creates = book.creates.load(std::sync::atomic::Ordering::SeqCst);
    // The checkpoint write was lost (crash): the same claim asks again.
    let again = alloc(&book, &who("c", "u1", "p")).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(
        book.creates.load(std::sync::atomic::Ordering::SeqCst),
        creates,
        "no second create"
    );
    assert_eq!(book.objects.lock().unwrap().len(), 1);
    // A second interface of the same claim must not get the first one's address.
    let skip = BTreeSet::from([first.allocations[0].name.clone()]);
    let second = allocate(&book, "blue", &who("c", "u1", "p"), 1, &skip)
        .await
        .unwrap();
    assert_ne!(second.allocations[0].address, first.allocations[0].address);
}

#[tokio::test]
async fn another_nodes_allocation_for_the_claim_is_not_reused() {
    let book = book_with(json!([{"cidr": "192.0.2.0/24"}]));
    let mut elsewhere = who("c", "u1", "p");
    elsewhere.node = "node-b".into();
    let theirs = alloc(&book, &elsewhere).await.unwrap();
    // This node cannot release an object naming node-b (the chart's NetworkAddress policy),
    // so it allocates its own instead of adopting that one.
    let mine = alloc(&book, &who("c", "u1", "p")).await.unwrap();
    assert_ne!(mine.allocations[0].name, theirs.allocations[0].name);
    let objects = book.objects.lock().unwrap();
    assert_eq!(objects.len(), 2);
    assert_eq!(
        objects[&mine.allocations[0].name].spec.node.as_deref(),
        Some("node-a")
    );
}

#[tokio::test]
async fn release_deletes_with_the_uid_precondition() {
    let book = book_with(json!([{"cidr": "192.0.2.0/24"}]));
    let got = alloc(&book, &who("c", "u1", "p")).await.unwrap();
    // A stale record (other UID) must not delete the object someone else now owns.
    let mut stale = got.allocations.clone();
    stale[0].uid = "someone-else".into();
    release(&book, &stale).await.unwrap();
    assert_eq!(book.objects.lock().unwrap().len(), 1);
    release(&book, &got.allocations).await.unwrap();
    assert!(book.objects.lock().unwrap().is_empty());
    // Releasing again (already gone) is success.
    release(&book, &got.allocations).await.unwrap();
}

#[tokio::test]
async fn a_create_lost_to_another_node_moves_on_to_the_next_address() {
    let book = book_with(json!([{"cidr": "192.0.2.0/24"}]));
    // Learn where this claim would start, then let another node take exactly that address
    // after our LIST (the 409 path).
    let probe = book_with(json!([{"cidr": "192.0.2.0/24"}]));
    let wanted = alloc(&probe, &who("c", "u1", "p"))
        .await
        .unwrap()
        .allocations[0]
        .clone();
    let mut theirs = probe.objects.lock().unwrap()[&wanted.name].clone();
    theirs.spec.claim.uid = "other".into();
    book.racing
        .lock()
        .unwrap()
        .insert(wanted.name.clone(), theirs);
    let got = alloc(&book, &who("c", "u1", "p")).await.unwrap();
    assert_ne!(got.allocations[0].address, wanted.address);
    assert_eq!(
        book.creates.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "one lost create, one won"
    );
    let objects = book.objects.lock().unwrap();
    assert_eq!(objects[&wanted.name].spec.claim.uid, "other");
    assert_eq!(objects[&got.allocations[0].name].spec.claim.uid, "u1");
}

#[tokio::test]
async fn dual_stack_gets_one_address_per_family() {
    let book = book_with(json!([
        {"cidr": "2001:db8::/64", "gateway": "2001:db8::1", "routes": [{"destination": "2001:db8:1::/48"}]},
        {"cidr": "192.0.2.0/24"},
    ]));
    let got = alloc(&book, &who("c", "u1", "p")).await.unwrap();
    let addresses: Vec<String> = got.addresses().iter().map(Cidr::to_string).collect();
    assert_eq!(addresses.len(), 2);
    assert!(addresses[0].starts_with("192.0.2.") && addresses[0].ends_with("/24"));
    assert!(addresses[1].starts_with("2001:db8::") && addresses[1].ends_with("/64"));
    assert_eq!(got.routes.len(), 1);
    assert_eq!(got.routes[0].gateway.as_deref(), Some("2001:db8::1"));
    assert_eq!(book.objects.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn later_subnets_of_a_family_extend_the_first() {
    let book = book_with(json!([{"cidr": "192.0.2.0/30"}, {"cidr": "198.51.100.0/30"}]));
    let mut got = Vec::new();
    for i in 0..4 {
        got.push(
            alloc(&book, &who(&format!("c{i}"), &format!("u{i}"), "p"))
                .await
                .unwrap()
                .allocations[0]
                .address
                .to_string(),
        );
    }
    got.sort();
    assert_eq!(
        got,
        [
            "192.0.2.1/30",
            "192.0.2.2/30",
            "198.51.100.1/30",
            "198.51.100.2/30"
        ]
    );
    let err = alloc(&book, &who("c9", "u9", "p")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "network blue: subnet 192.0.2.0/30 has no free address (2 in use of 2); \
         network blue: subnet 198.51.100.0/30 has no free address (2 in use of 2)"
    );
}

#[tokio::test]
async fn a_stable_identity_gets_its_address_back_after_release() {
    let book = MemBook::default();
    let mut s = spec(json!([{"cidr": "10.0.0.0/16"}]));
    s["stableAddresses"] = json!({"by": "podName"});
    book.add_network("blue", s);
    let first = alloc(&book, &who("c", "u1", "db-0")).await.unwrap();
    let object = book.objects.lock().unwrap()[&first.allocations[0].name].clone();
    assert_eq!(object.spec.identity.as_deref(), Some("ns/db-0"));
    release(&book, &first.allocations).await.unwrap();
    // The pod comes back with a new claim (new UID): same address.
    let again = alloc(&book, &who("c2", "u2", "db-0")).await.unwrap();
    assert_eq!(first.addresses(), again.addresses());
    let other = alloc(&book, &who("c3", "u3", "db-1")).await.unwrap();
    assert_ne!(other.addresses(), again.addresses());
}

#[tokio::test]
async fn a_label_identity_reads_the_pods_labels() {
    let book = MemBook::default();
    book.pod_reads.store(true, Ordering::SeqCst);
    let mut s = spec(json!([{"cidr": "10.0.0.0/16"}]));
    s["stableAddresses"] = json!({"by": "label", "label": "app.kubernetes.io/instance"});
    book.add_network("blue", s);
    for pod in ["a-x1", "a-y2"] {
        book.pods.lock().unwrap().insert(
            ("ns".into(), pod.into()),
            BTreeMap::from([("app.kubernetes.io/instance".into(), "one".into())]),
        );
    }
    let first = alloc(&book, &who("c", "u1", "a-x1")).await.unwrap();
    release(&book, &first.allocations).await.unwrap();
    let again = alloc(&book, &who("c2", "u2", "a-y2")).await.unwrap();
    assert_eq!(first.addresses(), again.addresses());
    let object = book.objects.lock().unwrap()[&again.allocations[0].name].clone();
    assert_eq!(object.spec.identity.as_deref(), Some("ns/one"));
    assert_eq!(book.pod_reads_made.load(Ordering::SeqCst), 2);
}

/// Without `--pod-label-reads` a label identity is refused before anything is read or
/// created, naming the Network, the field, the rule, the way out and what the grant exposes.
#[tokio::test]
async fn a_label_identity_without_pod_reads_is_refused_and_reads_nothing() {
    let book = MemBook::default();
    let mut s = spec(json!([{"cidr": "10.0.0.0/16"}]));
    s["stableAddresses"] = json!({"by": "label", "label": "app.kubernetes.io/instance"});
    book.add_network("blue", s);
    book.pods.lock().unwrap().insert(
        ("ns".into(), "a-x1".into()),
        BTreeMap::from([("app.kubernetes.io/instance".into(), "one".into())]),
    );
    let err = alloc(&book, &who("c", "u1", "a-x1")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "Network \"blue\" has spec.stableAddresses.by: label (label \
         \"app.kubernetes.io/instance\"), which needs the pod's labels when the claim is \
         prepared, and this driver reads no pods (--pod-label-reads/KNIC_POD_LABEL_READS is \
         false, the chart's default). Either use spec.stableAddresses.by: podName (no pod read: \
         the pod's name comes from the claim's reservedFor), or install the chart with \
         driver.podLabelReads: true, which grants every node's driver get on every pod in every \
         namespace: the whole object, spec and literal env values included, not only its labels"
    );
    assert_eq!(book.pod_reads_made.load(Ordering::SeqCst), 0);
    assert_eq!(book.creates.load(Ordering::SeqCst), 0);
    assert!(book.addresses().is_empty());
}

/// `by: podName` takes the name from the claim's reservedFor: no pod is read, with or
/// without `--pod-label-reads`.
#[tokio::test]
async fn a_pod_name_identity_reads_no_pod() {
    for reads in [false, true] {
        let book = MemBook::default();
        book.pod_reads.store(reads, Ordering::SeqCst);
        let mut s = spec(json!([{"cidr": "10.0.0.0/16"}]));
        s["stableAddresses"] = json!({"by": "podName"});
        book.add_network("blue", s);
        let got = alloc(&book, &who("c", "u1", "db-0")).await.unwrap();
        let object = book.objects.lock().unwrap()[&got.allocations[0].name].clone();
        assert_eq!(object.spec.identity.as_deref(), Some("ns/db-0"));
        assert_eq!(
            book.pod_reads_made.load(Ordering::SeqCst),
            0,
            "reads {reads}"
        );
    }
}

#[tokio::test]
async fn many_claims_never_share_an_address() {
    let book = book_with(json!([{"cidr": "192.0.2.0/24", "gateway": "192.0.2.1"}]));
    let mut seen = BTreeSet::new();
    for i in 0..253 {
        let got = alloc(&book, &who(&format!("c{i}"), &format!("uid-{i}"), "p"))
            .await
            .unwrap();
        assert!(seen.insert(got.allocations[0].address));
    }
    let err = alloc(&book, &who("x", "x", "p")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "network blue: subnet 192.0.2.0/24 has no free address (253 in use of 253)"
    );
    assert_eq!(book.addresses().len(), 253);
}
