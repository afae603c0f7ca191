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

use knic_proto::netconfig::OffloadSizes;

fn big_tcp() -> OffloadSizes {
    OffloadSizes {
        gso_max_size: Some(185_000),
        gro_max_size: Some(185_000),
        gso_ipv4_max_size: Some(185_000),
        gro_ipv4_max_size: None,
    }
}

fn sized(mode: AttachMode) -> AttachPlan {
    AttachPlan {
        link: LinkSettings {
            sizes: big_tcp(),
            ..LinkSettings::default()
        },
        ..plan(mode)
    }
}

#[tokio::test]
async fn a_moved_device_gets_its_sizes_with_the_move_and_they_go_back_with_the_move_home() {
    let (k, _) = kernel();
    let before = OffloadSizes {
        gso_max_size: Some(65_536),
        gro_max_size: Some(32_768),
        gso_ipv4_max_size: Some(65_536),
        gro_ipv4_max_size: Some(20_000),
    };
    k.set_sizes(&Ns::Host, "ens1f0v0", &before);
    let p = sized(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    // Exactly the sizes the plan changes, as they were.
    assert_eq!(
        restore.sizes,
        Some(OffloadSizes {
            gso_max_size: Some(65_536),
            gro_max_size: Some(32_768),
            gso_ipv4_max_size: Some(65_536),
            gro_ipv4_max_size: None,
        })
    );
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    let log = k.log();
    let moved = position(&log, "link set ens1f0v0 netns");
    assert!(
        log[moved].ends_with("gso_max_size 185000 gro_max_size 185000 gso_ipv4_max_size 185000"),
        "one request: {}",
        log[moved]
    );
    assert_eq!(
        k.sizes(&pod(), "net1"),
        Some(OffloadSizes {
            gro_ipv4_max_size: Some(20_000),
            ..big_tcp()
        })
    );

    // The record goes through the checkpoint (JSON) before detach reads it.
    let json = serde_json::to_value(&restore).unwrap();
    assert_eq!(
        json["sizes"],
        serde_json::json!({"gsoMaxSize": 65536, "groMaxSize": 32768, "gsoIpv4MaxSize": 65536})
    );
    let restore: Restore = serde_json::from_value(json).unwrap();
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    let log = k.log();
    let home = position(&log, "link set net1 netns host");
    assert!(
        log[home].ends_with("gso_max_size 65536 gro_max_size 32768 gso_ipv4_max_size 65536"),
        "{}",
        log[home]
    );
    assert_eq!(k.sizes(&Ns::Host, "ens1f0v0"), Some(before));
}

#[tokio::test]
async fn a_child_is_sized_right_after_its_creation_and_records_nothing() {
    let (k, _) = kernel();
    let p = sized(AttachMode::Child {
        child: ChildKind::Macvlan("bridge".into()),
        uplink: None,
    });
    let restore = capture(&k, &p).await.unwrap();
    assert_eq!(restore.sizes, None, "a child starts fresh");
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    let log = k.log();
    let created = position(&log, "link add link ens1f0v0 type macvlan");
    assert!(!log[created].contains("gso"), "{}", log[created]);
    // Sized right after, in the pod, before the link goes up.
    let sized = position(&log, "link set net1 gso_max_size");
    assert_eq!(
        log[sized],
        "/var/run/netns/cni-1: link set net1 gso_max_size 185000 gro_max_size 185000 \
         gso_ipv4_max_size 185000"
    );
    assert!(
        created < sized && sized < position(&log, "link set net1 up"),
        "{log:?}"
    );
    assert_eq!(k.sizes(&pod(), "net1").unwrap().gso_max_size, Some(185_000));
    assert_eq!(
        k.sizes(&Ns::Host, "ens1f0v0").unwrap().gso_max_size,
        Some(65_536),
        "the parent is untouched"
    );
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    assert_eq!(k.sizes(&pod(), "net1"), None);
}

#[tokio::test]
async fn a_kernel_without_the_ipv4_sizes_refuses_them_by_name_before_anything_changes() {
    let (k, _) = kernel();
    k.without_ipv4_sizes();
    let mut p = sized(AttachMode::Move);
    p.link.sizes.gro_ipv4_max_size = Some(100_000);
    let err = capture(&k, &p).await.unwrap_err().to_string();
    assert_eq!(
        err,
        "host: setting the GSO/GRO sizes of node-a/pci-0000-a2-01-0: this kernel does not \
         support interface.gsoIpv4MaxSize (IFLA_GSO_IPV4_MAX_SIZE, Linux 6.3+), \
         interface.groIpv4MaxSize (IFLA_GRO_IPV4_MAX_SIZE, Linux 6.3+) (it reports no such \
         size for ens1f0v0, and would ignore the setting)"
    );
    assert!(k.log().is_empty(), "nothing changed: {:?}", k.log());
    // The sizes it knows are fine.
    p.link.sizes.gso_ipv4_max_size = None;
    p.link.sizes.gro_ipv4_max_size = None;
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    assert_eq!(k.sizes(&pod(), "net1").unwrap().gso_max_size, Some(185_000));
}

/// A crash after the move, then the pod's namespace gone before the retried detach: the kernel
/// hands the device back by itself with the pod's sizes, and detach puts the recorded ones back.
#[tokio::test]
async fn a_device_returned_by_the_kernel_gets_its_sizes_back() {
    let (k, _) = kernel();
    let p = sized(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    k.delete_namespace(&pod());
    let returned = k.links(&Ns::Host);
    let name = &returned
        .iter()
        .find(|l| l.index == restore.host.index)
        .unwrap()
        .name;
    assert_eq!(
        k.sizes(&Ns::Host, name).unwrap().gso_max_size,
        Some(185_000)
    );
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    assert_eq!(
        k.sizes(&Ns::Host, "ens1f0v0"),
        Some(OffloadSizes {
            gso_max_size: Some(65_536),
            gro_max_size: Some(65_536),
            gso_ipv4_max_size: Some(65_536),
            gro_ipv4_max_size: Some(65_536),
        })
    );
}

/// A failed attach (the pod refuses the link's up) is undone: the move home puts the sizes back.
#[tokio::test]
async fn a_failed_attach_puts_the_sizes_back() {
    let (k, _) = kernel();
    let p = sized(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    k.fail_on("/var/run/netns/cni-1: link set net1 up", "Network is down");
    attach(&k, &p, &pod(), &restore, false).await.unwrap_err();
    assert_eq!(
        k.sizes(&Ns::Host, "ens1f0v0").unwrap().gso_max_size,
        Some(65_536)
    );
}

#[test]
fn old_checkpoints_without_sizes_load() {
    let json = serde_json::json!({
        "host": {"index": 7, "name": "eth0", "mtu": 1500, "mac": null, "up": true,
                 "addresses": [], "kind": null}
    });
    let restore: Restore = serde_json::from_value(json).unwrap();
    assert_eq!(restore.sizes, None);
}
