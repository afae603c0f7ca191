//! Held addresses and takeover (`stableAddresses.gracePeriodSeconds`): the rules that keep an
//! identity's address across pod re-creation without ever giving one address to two live pods.

use super::memory::MemBook;
use super::*;
use knic_proto::network::stable::{HELD_LABEL, HELD_SINCE_ANNOTATION};
use serde_json::json;

fn who(claim: &str, uid: &str, pod: &str, node: &str) -> Requester {
    Requester {
        namespace: "ns".into(),
        claim: claim.into(),
        uid: uid.into(),
        pod: pod.into(),
        node: node.into(),
        vtep: None,
    }
}

fn book(stable: serde_json::Value, cidr: &str) -> MemBook {
    let book = MemBook::default();
    book.add_network(
        "blue",
        json!({
            "devices": {"deviceClassName": "knic.dev"},
            "ipam": {"subnets": [{"cidr": cidr}]},
            "namespaces": {"names": ["ns"]},
            "stableAddresses": stable,
        }),
    );
    book
}

async fn alloc(book: &MemBook, who: &Requester) -> Result<Addressing> {
    let got = allocate(book, "blue", who, 0, &BTreeSet::new()).await?;
    book.set_claim(&who.claim, &who.uid, false);
    Ok(got)
}

/// The pod goes away: its claim is unprepared (hold) and deleted.
async fn pod_gone(book: &MemBook, who: &Requester, got: &Addressing) {
    release_or_hold(book, &who.uid, &got.allocations)
        .await
        .unwrap();
    book.drop_claim(&who.claim);
}

fn is_held(object: &NetworkAddress) -> bool {
    object
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HELD_LABEL))
        .is_some_and(|v| v == "true")
}

#[tokio::test]
async fn unprepare_holds_an_identitys_address_with_a_grace_period() {
    let book = book(
        json!({"by": "podName", "gracePeriodSeconds": 3600}),
        "10.0.0.0/24",
    );
    let a = who("db-0-x", "u1", "db-0", "node-a");
    let got = alloc(&book, &a).await.unwrap();
    assert_eq!(got.allocations[0].identity.as_deref(), Some("ns/db-0"));
    release_or_hold(&book, &a.uid, &got.allocations)
        .await
        .unwrap();
    let object = book
        .object_of(&got.allocations[0].address.to_string())
        .unwrap();
    assert!(is_held(&object), "{:?}", object.metadata);
    let since = &object.metadata.annotations.as_ref().unwrap()[HELD_SINCE_ANNOTATION];
    let parsed: k8s_openapi::jiff::Timestamp = since.parse().expect("RFC 3339");
    assert!((k8s_openapi::jiff::Timestamp::now().as_second() - parsed.as_second()).abs() < 5);
    // The spec is untouched: still the old claim's.
    assert_eq!(object.spec.claim.uid, "u1");
}

#[tokio::test]
async fn without_grace_without_identity_or_for_a_sandbox_unprepare_deletes() {
    // No grace period: today's behaviour.
    let b = book(json!({"by": "podName"}), "10.0.0.0/24");
    let a = who("c", "u1", "db-0", "node-a");
    let got = alloc(&b, &a).await.unwrap();
    release_or_hold(&b, &a.uid, &got.allocations).await.unwrap();
    assert!(b.addresses().is_empty());
    // A label identity missing on the pod: no identity, nothing to hold.
    let b = book(
        json!({"by": "label", "label": "app", "gracePeriodSeconds": 60}),
        "10.0.0.0/24",
    );
    b.pod_reads.store(true, std::sync::atomic::Ordering::SeqCst);
    let got = alloc(&b, &a).await.unwrap();
    assert_eq!(got.allocations[0].identity, None);
    release_or_hold(&b, &a.uid, &got.allocations).await.unwrap();
    assert!(b.addresses().is_empty());
    // A KNI sandbox's addresses are never held.
    let b = book(
        json!({"by": "podName", "gracePeriodSeconds": 60}),
        "10.0.0.0/24",
    );
    let sandbox = who("s", "kni.1234", "db-0", "node-a");
    let got = alloc(&b, &sandbox).await.unwrap();
    release_or_hold(&b, &sandbox.uid, &got.allocations)
        .await
        .unwrap();
    assert!(b.addresses().is_empty());
    // The Network deleted meanwhile: nothing left to hold for.
    let got = alloc(&b, &a).await.unwrap();
    b.networks.lock().unwrap().clear();
    release_or_hold(&b, &a.uid, &got.allocations).await.unwrap();
    assert!(b.addresses().is_empty());
}

#[tokio::test]
async fn the_returning_identity_takes_its_held_address_over() {
    let b = book(
        json!({"by": "podName", "gracePeriodSeconds": 3600}),
        "10.0.0.0/24",
    );
    // Someone sits on db-0's offset address, so db-0 gets another one.
    let blocker = who("blocker", "ub", "x", "node-a");
    let offset_ip = {
        let pool = Subnet {
            cidr: "10.0.0.0/24".into(),
            ..Default::default()
        }
        .pool()
        .unwrap();
        let hint = stable_offset("blue", "ns/db-0", &pool);
        knic_proto::ipam::allocate("blue", &pool, |_| false, hint).unwrap()
    };
    b.racing.lock().unwrap().insert(
        allocation_name("blue", offset_ip),
        NetworkAddress::new(
            &allocation_name("blue", offset_ip),
            NetworkAddressSpec {
                network: "blue".into(),
                address: format!("{offset_ip}/24"),
                claim: ClaimRef {
                    namespace: "ns".into(),
                    name: blocker.claim.clone(),
                    uid: blocker.uid.clone(),
                },
                identity: None,
                node: Some("node-a".into()),
                overlay: None,
            },
        ),
    );
    let first = who("db-0-a", "u1", "db-0", "node-a");
    let got = alloc(&b, &first).await.unwrap();
    let held_address = got.allocations[0].address;
    assert_ne!(held_address.addr, offset_ip, "the offset was taken");
    pod_gone(&b, &first, &got).await;
    // The blocker leaves: the offset is free, but the identity's address is the held one.
    b.objects
        .lock()
        .unwrap()
        .remove(&allocation_name("blue", offset_ip));

    // Re-created on another node, with a new claim.
    let second = who("db-0-b", "u2", "db-0", "node-b");
    let again = alloc(&b, &second).await.unwrap();
    assert_eq!(again.allocations[0].address, held_address);
    let object = b.object_of(&held_address.to_string()).unwrap();
    assert_eq!(object.spec.claim.uid, "u2");
    assert_eq!(object.spec.node.as_deref(), Some("node-b"));
    assert!(!is_held(&object), "a fresh object, not the held one");
    assert_eq!(b.addresses().len(), 1);
}

#[tokio::test]
async fn a_claim_still_being_deleted_is_waited_for() {
    let b = book(
        json!({"by": "podName", "gracePeriodSeconds": 60}),
        "10.42.0.0/24",
    );
    let old = who("db-0-ovl-x7k2p", "u1", "db-0", "node-a");
    let got = alloc(&b, &old).await.unwrap();
    let ip = got.allocations[0].address.addr;
    // The old pod is terminating: its claim has a deletionTimestamp, unprepare not yet run.
    b.set_claim(&old.claim, &old.uid, true);
    let new = who("db-0-ovl-p9q8r", "u2", "db-0", "node-a");
    let err = alloc(&b, &new).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "address {ip} of identity ns/db-0 is still held by claim ns/db-0-ovl-x7k2p, which is \
             being deleted; retrying"
        )
    );
    assert_eq!(
        b.object_of(&got.allocations[0].address.to_string())
            .unwrap()
            .spec
            .claim
            .uid,
        "u1"
    );
    assert_eq!(
        b.addresses().len(),
        1,
        "nothing created for the refused claim"
    );
    // Once unprepared and gone, the retry gets the address.
    pod_gone(&b, &old, &got).await;
    let again = alloc(&b, &new).await.unwrap();
    assert_eq!(again.addresses(), got.addresses());
}

#[tokio::test]
async fn a_live_duplicate_identity_gets_another_address_and_an_event() {
    let b = book(
        json!({"by": "label", "label": "app", "gracePeriodSeconds": 60}),
        "10.0.0.0/24",
    );
    b.pod_reads.store(true, std::sync::atomic::Ordering::SeqCst);
    for pod in ["p1", "p2"] {
        b.pods.lock().unwrap().insert(
            ("ns".into(), pod.into()),
            [("app".to_owned(), "db".to_owned())].into(),
        );
    }
    let one = alloc(&b, &who("c1", "u1", "p1", "node-a")).await.unwrap();
    let two = alloc(&b, &who("c2", "u2", "p2", "node-a")).await.unwrap();
    assert_ne!(one.addresses(), two.addresses());
    let ip = one.allocations[0].address.addr;
    assert_eq!(
        b.in_use.lock().unwrap().as_slice(),
        [format!(
            "address {ip} of identity ns/db is in use by claim ns/c1, which is live (two pods \
             with one identity); this claim gets another address"
        )]
    );
    assert_eq!(
        b.object_of(&one.allocations[0].address.to_string())
            .unwrap()
            .spec
            .claim
            .uid,
        "u1"
    );
}

#[tokio::test]
async fn a_racing_takeover_loses_at_the_create_and_moves_on() {
    let b = book(
        json!({"by": "podName", "gracePeriodSeconds": 60}),
        "10.0.0.0/24",
    );
    let old = who("c1", "u1", "db-0", "node-a");
    let got = alloc(&b, &old).await.unwrap();
    pod_gone(&b, &old, &got).await;
    let name = got.allocations[0].name.clone();
    // Another allocator creates the name between our delete and our create.
    let mut racer = b.objects.lock().unwrap()[&name].clone();
    racer.spec.claim.uid = "u-racer".into();
    racer.metadata.uid = Some("uid-racer".into());
    racer.metadata.labels.as_mut().unwrap().remove(HELD_LABEL);
    b.racing.lock().unwrap().insert(name.clone(), racer);
    let new = alloc(&b, &who("c2", "u2", "db-0", "node-a")).await.unwrap();
    assert_ne!(new.addresses(), got.addresses());
    assert_eq!(b.objects.lock().unwrap()[&name].spec.claim.uid, "u-racer");
    assert_eq!(b.addresses().len(), 2);
}

#[tokio::test]
async fn another_nodes_allocation_is_taken_over_only_once_held() {
    let b = book(
        json!({"by": "podName", "gracePeriodSeconds": 60}),
        "10.0.0.0/24",
    );
    let old = who("c1", "u1", "db-0", "node-a");
    let got = alloc(&b, &old).await.unwrap();
    // Node a is lost: no unprepare, the claim is deleted; the controller has not marked it.
    b.drop_claim(&old.claim);
    let elsewhere = alloc(&b, &who("c2", "u2", "db-0", "node-b")).await.unwrap();
    assert_ne!(elsewhere.addresses(), got.addresses());
    assert_eq!(
        b.object_of(&got.allocations[0].address.to_string())
            .unwrap()
            .spec
            .claim
            .uid,
        "u1"
    );
    // On its own node the same object is taken over (the node may delete its own).
    let b = book(
        json!({"by": "podName", "gracePeriodSeconds": 60}),
        "10.0.0.0/24",
    );
    let got = alloc(&b, &old).await.unwrap();
    b.drop_claim(&old.claim);
    let here = alloc(&b, &who("c2", "u2", "db-0", "node-a")).await.unwrap();
    assert_eq!(here.addresses(), got.addresses());
}

#[tokio::test]
async fn kubevirt_identity_is_the_vm_and_other_pods_are_refused() {
    let b = book(
        json!({"by": "kubevirtVM", "gracePeriodSeconds": 60}),
        "10.0.0.0/24",
    );
    let first = who("c1", "u1", "virt-launcher-db-7x2kq", "node-a");
    let got = alloc(&b, &first).await.unwrap();
    assert_eq!(got.allocations[0].identity.as_deref(), Some("ns/db"));
    pod_gone(&b, &first, &got).await;
    // The VM restarts: a new launcher pod, new suffix, same VM.
    let again = alloc(&b, &who("c2", "u2", "virt-launcher-db-k2p9z", "node-a"))
        .await
        .unwrap();
    assert_eq!(again.addresses(), got.addresses());
    let err = alloc(&b, &who("c3", "u3", "web-0", "node-a"))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Network \"blue\" has spec.stableAddresses.by: kubevirtVM, but pod \"web-0\" is not a \
         KubeVirt launcher pod (virt-launcher-<vm>-<suffix>)"
    );
}

#[tokio::test]
async fn a_held_address_is_taken_over_while_its_old_claim_lingers() {
    let b = book(
        json!({"by": "podName", "gracePeriodSeconds": 60}),
        "10.0.0.0/24",
    );
    let old = who("c1", "u1", "db-0", "node-a");
    let got = alloc(&b, &old).await.unwrap();
    // Unprepared (held), but the claim object is still there, even being deleted.
    release_or_hold(&b, &old.uid, &got.allocations)
        .await
        .unwrap();
    b.set_claim(&old.claim, &old.uid, true);
    let new = who("c2", "u2", "db-0", "node-b");
    let again = alloc(&b, &new).await.unwrap();
    assert_eq!(again.addresses(), got.addresses());
    assert_eq!(b.addresses().len(), 1);
}

#[tokio::test]
async fn a_claim_prepared_again_after_its_hold_gets_an_unheld_allocation() {
    let b = book(
        json!({"by": "podName", "gracePeriodSeconds": 60}),
        "10.0.0.0/24",
    );
    let shared = who("c1", "u1", "db-0", "node-a");
    let got = alloc(&b, &shared).await.unwrap();
    release_or_hold(&b, &shared.uid, &got.allocations)
        .await
        .unwrap();
    let again = alloc(&b, &shared).await.unwrap();
    assert_eq!(again.addresses(), got.addresses());
    let object = b
        .object_of(&got.allocations[0].address.to_string())
        .unwrap();
    assert!(!is_held(&object), "in use again, so not held");
    assert_ne!(
        again.allocations[0].uid, got.allocations[0].uid,
        "re-created"
    );
}

#[tokio::test]
async fn a_takeover_reservation_keeps_the_address_taken_and_a_stale_one_is_cleared() {
    let b = book(
        json!({"by": "podName", "gracePeriodSeconds": 60}),
        "10.0.0.0/29",
    );
    let old = who("c1", "u1", "db-0", "node-a");
    let got = alloc(&b, &old).await.unwrap();
    pod_gone(&b, &old, &got).await;
    let address = got.allocations[0].address;
    // Another claim's reservation of the address (a takeover in flight elsewhere): taken.
    let reservation = |claim: &str, uid: &str| {
        let mut r = NetworkAddress::new(
            &format!("takeover-{}", got.allocations[0].name),
            NetworkAddressSpec {
                network: "blue".into(),
                address: address.to_string(),
                claim: ClaimRef {
                    namespace: "ns".into(),
                    name: claim.into(),
                    uid: uid.into(),
                },
                identity: None,
                node: Some("node-a".into()),
                overlay: None,
            },
        );
        r.metadata.labels = Some(BTreeMap::from([
            (NETWORK_LABEL.to_owned(), "blue".to_owned()),
            (TAKEOVER_LABEL.to_owned(), "true".to_owned()),
        ]));
        r.metadata.uid = Some(format!("r-{uid}"));
        r
    };
    b.objects.lock().unwrap().insert(
        format!("takeover-{}", got.allocations[0].name),
        reservation("x", "ux"),
    );
    // The held allocation is gone meanwhile (the other taker deleted it).
    b.objects.lock().unwrap().remove(&got.allocations[0].name);
    let other = alloc(&b, &who("o", "uo", "web", "node-a")).await.unwrap();
    assert_ne!(other.addresses(), got.addresses(), "reserved: taken");
    // This claim's own reservation, left by a crash mid-takeover, is not in its way.
    b.objects.lock().unwrap().insert(
        format!("takeover-{}", got.allocations[0].name),
        reservation("c2", "u2"),
    );
    let again = alloc(&b, &who("c2", "u2", "db-0", "node-a")).await.unwrap();
    assert_eq!(again.addresses(), got.addresses());
    let names: Vec<String> = b.objects.lock().unwrap().keys().cloned().collect();
    assert!(
        names.iter().all(|n| !n.starts_with("takeover-")),
        "reservations left: {names:?}"
    );
}
