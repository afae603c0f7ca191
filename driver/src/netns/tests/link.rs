//! Static neighbors through the fake kernel: added after the addresses and before the link goes
//! up, on a moved device and on a child alike; gone with a detach while the pod lives (the
//! kernel flushes them with the move home, or with the child); re-added on a resumed attach; a
//! refused entry fails the attach, which is undone.

use knic_proto::netconfig::{ChildKind, Neighbor};

use super::*;

fn neighbors() -> Vec<Neighbor> {
    vec![
        Neighbor {
            address: "192.0.2.1".parse().unwrap(),
            hardware_address: [2, 0xaa, 0, 0, 0, 1],
        },
        Neighbor {
            address: "2001:db8::1".parse().unwrap(),
            hardware_address: [2, 0xaa, 0, 0, 0, 2],
        },
    ]
}

fn with_neighbors(mode: AttachMode) -> AttachPlan {
    AttachPlan {
        link: LinkSettings {
            neighbors: neighbors(),
            ..LinkSettings::default()
        },
        ..plan(mode)
    }
}

fn position(log: &[String], what: &str) -> usize {
    log.iter()
        .position(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no {what:?} in {log:?}"))
}

fn expected() -> BTreeMap<std::net::IpAddr, [u8; 6]> {
    neighbors()
        .into_iter()
        .map(|n| (n.address, n.hardware_address))
        .collect()
}

#[tokio::test]
async fn a_moved_device_gets_its_neighbors_after_addresses_and_before_up_and_loses_them_home() {
    let (k, _) = kernel();
    let p = with_neighbors(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    let log = k.log();
    let address = position(&log, "addr add");
    let first = position(&log, "neigh replace");
    let up = position(&log, "link set net1 up");
    assert_eq!(
        log[first],
        "/var/run/netns/cni-1: neigh replace 192.0.2.1 lladdr 02:aa:00:00:00:01 nud permanent dev net1"
    );
    assert_eq!(
        log[first + 1],
        "/var/run/netns/cni-1: neigh replace 2001:db8::1 lladdr 02:aa:00:00:00:02 nud permanent dev net1"
    );
    assert!(address < first && first < up, "order: {log:?}");
    assert_eq!(k.neighbors(&pod(), "net1"), expected());

    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    assert!(k.neighbors(&pod(), "net1").is_empty());
    assert!(
        k.neighbors(&Ns::Host, "ens1f0v0").is_empty(),
        "the device comes home without the pod's entries"
    );
    let host = k
        .links(&Ns::Host)
        .into_iter()
        .find(|l| l.name == "ens1f0v0")
        .unwrap();
    assert_eq!(host, restore.host);
}

#[tokio::test]
async fn a_child_gets_its_neighbors_and_they_die_with_it() {
    let (k, _) = kernel();
    let p = with_neighbors(AttachMode::Child {
        child: ChildKind::Macvlan("bridge".into()),
        uplink: None,
    });
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    assert_eq!(k.neighbors(&pod(), "net1"), expected());
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    assert!(k.neighbors(&pod(), "net1").is_empty());
    assert!(!k.log().iter().any(|l| l.contains("neigh del")));
}

#[tokio::test]
async fn a_repeated_hook_adds_nothing_and_a_resumed_one_replaces_in_place() {
    let (k, _) = kernel();
    let p = with_neighbors(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    // A crash after the move and the addresses, before the neighbors: the device is in the
    // pod, configured but for them (an attach of the same plan without neighbors leaves that).
    let cut = AttachPlan {
        link: LinkSettings::default(),
        ..p.clone()
    };
    attach(&k, &cut, &pod(), &restore, false).await.unwrap();
    assert!(k.neighbors(&pod(), "net1").is_empty());
    let before = k.log().len();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    assert_eq!(k.log().len(), before, "a repeated hook changes nothing");
    attach(&k, &p, &pod(), &restore, true).await.unwrap();
    assert_eq!(k.neighbors(&pod(), "net1"), expected());
    attach(&k, &p, &pod(), &restore, true).await.unwrap();
    let replaced = k
        .log()
        .iter()
        .filter(|l| l.contains("neigh replace 192.0.2.1"))
        .count();
    assert_eq!(replaced, 2, "resume replaces in place: {:?}", k.log());
    assert_eq!(k.neighbors(&pod(), "net1"), expected());
}

#[tokio::test]
async fn a_refused_neighbor_fails_the_attach_and_the_device_goes_home() {
    let (k, _) = kernel();
    let p = with_neighbors(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    k.fail_on(
        "/var/run/netns/cni-1: neigh replace 2001:db8::1",
        "Network is down",
    );
    let err = attach(&k, &p, &pod(), &restore, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("Network is down"), "{err}");
    assert!(k.links(&pod()).is_empty(), "undone: {:?}", k.links(&pod()));
    assert!(k.neighbors(&pod(), "net1").is_empty());
    let host = k
        .links(&Ns::Host)
        .into_iter()
        .find(|l| l.name == "ens1f0v0")
        .unwrap();
    assert_eq!(host, restore.host);
}

/// A checkpoint written before knic had neighbors loads with none, and a plan with some keeps
/// them through the checkpoint's JSON.
#[test]
fn plans_round_trip_with_and_without_link_settings() {
    let old = plan(AttachMode::Move);
    let json = serde_json::to_value(&old).unwrap();
    assert!(json.get("link").is_none(), "{json}");
    assert_eq!(serde_json::from_value::<AttachPlan>(json).unwrap(), old);
    let new = with_neighbors(AttachMode::Move);
    let json = serde_json::to_value(&new).unwrap();
    assert_eq!(
        json["link"]["neighbors"][1],
        serde_json::json!({ "address": "2001:db8::1", "hardwareAddress": "02:aa:00:00:00:02" })
    );
    assert_eq!(serde_json::from_value::<AttachPlan>(json).unwrap(), new);
}
