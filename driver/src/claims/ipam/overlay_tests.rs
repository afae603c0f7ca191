//! Allocations of overlay Networks announce where the interface is.

use std::collections::BTreeSet;

use knic_proto::network::{NETWORK_LABEL, OVERLAY_LABEL};
use serde_json::json;

use super::memory::MemBook;
use super::*;

fn who(uid: &str, vtep: Option<&str>) -> Requester {
    Requester {
        namespace: "ns".into(),
        claim: format!("claim-{uid}"),
        uid: uid.into(),
        pod: format!("pod-{uid}"),
        node: "node-a".into(),
        vtep: vtep.map(|v| v.parse().unwrap()),
    }
}

fn book() -> MemBook {
    let book = MemBook::default();
    book.add_network(
        "ovl",
        json!({"vxlan": {"vni": 4242},
               "ipam": {"subnets": [{"cidr": "10.42.0.0/24", "gateway": "10.42.0.1"}]},
               "namespaces": {"names": ["ns"]}}),
    );
    book
}

#[tokio::test]
async fn an_overlay_allocation_announces_vni_mac_and_vtep_with_its_label() {
    let book = book();
    let got = allocate(
        &book,
        "ovl",
        &who("u1", Some("10.99.0.1")),
        0,
        &BTreeSet::new(),
    )
    .await
    .expect("allocated");
    let facts = got.overlay.clone().expect("overlay facts");
    assert_eq!((facts.vni, facts.port), (4242, 4789));
    assert_eq!(facts.mac, knic_proto::ipam::overlay_mac("ovl", "u1"));
    // A block, not `drop`: the guard must visibly end before the next await.
    {
        let objects = book.objects.lock().unwrap();
        let object = &objects[&got.allocations[0].name];
        let announced = object.spec.overlay.as_ref().expect("spec.overlay");
        assert_eq!(announced.vni, 4242);
        assert_eq!(announced.vtep, "10.99.0.1");
        assert_eq!(announced.mac, crate::netns::mac_text(&facts.mac));
        let labels = object.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[OVERLAY_LABEL], "true");
        assert_eq!(labels[NETWORK_LABEL], "ovl");
    }

    // The claim's second interface on the Network gets another MAC.
    let second = allocate(
        &book,
        "ovl",
        &who("u1", Some("10.99.0.1")),
        1,
        &got.allocations.iter().map(|a| a.name.clone()).collect(),
    )
    .await
    .expect("second");
    assert_ne!(second.overlay.unwrap().mac, facts.mac);
}

#[tokio::test]
async fn an_overlay_network_needs_the_overlay_device_and_others_announce_nothing() {
    let book = book();
    let err = allocate(&book, "ovl", &who("u1", None), 0, &BTreeSet::new())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Network \"ovl\" is an overlay (spec.vxlan): its pods need the node's overlay device \
         (class overlay.knic.dev), which this device is not"
    );
    assert!(book.objects.lock().unwrap().is_empty(), "nothing allocated");
    book.add_network(
        "blue",
        json!({"devices": {"deviceClassName": "knic.dev"},
               "ipam": {"subnets": [{"cidr": "192.0.2.0/24"}]},
               "namespaces": {"names": ["ns"]}}),
    );
    let got = allocate(
        &book,
        "blue",
        &who("u2", Some("10.99.0.1")),
        0,
        &BTreeSet::new(),
    )
    .await
    .expect("allocated");
    assert!(got.overlay.is_none());
    let objects = book.objects.lock().unwrap();
    let object = &objects[&got.allocations[0].name];
    assert!(object.spec.overlay.is_none());
    assert!(
        !object
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key(OVERLAY_LABEL)
    );
}
