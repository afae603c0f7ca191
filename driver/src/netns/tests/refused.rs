//! A move the kernel refuses after it has moved the device (do_setlink changes the namespace
//! first, then MAC, MTU and name in the target): attach finds the device in the pod and brings
//! it home, so the error is the kernel's refusal and the node is as it was; a refused move back
//! leaves the device on the host, where the retried detach finishes it.

use super::*;

/// The host device as it is now.
fn host_device(k: &FakeKernel, name: &str) -> Option<LinkState> {
    k.links(&Ns::Host).into_iter().find(|l| l.name == name)
}

/// Leaves the device as a half-applied move whose undo a crash cut short: in the pod, still
/// under its host name.
async fn half_moved(k: &FakeKernel) {
    let mut host = k.open(&Ns::Host).await.unwrap().unwrap();
    let stay = LinkChange {
        name: None,
        mtu: None,
        mac: None,
        up: None,
        ipv4_conf: Vec::new(),
        index: None,
        sizes: Default::default(),
    };
    host.move_link("ens1f0v0", &pod(), &stay).await.unwrap();
}

/// Attaches `p`, which must fail, and returns the error text.
async fn refused(k: &FakeKernel, p: &AttachPlan, restore: &Restore) -> String {
    attach(k, p, &pod(), restore, false)
        .await
        .unwrap_err()
        .to_string()
}

#[tokio::test]
async fn an_mtu_the_device_refuses_after_the_move_is_undone() {
    let (k, _) = kernel();
    k.limit_mtu(&Ns::Host, "ens1f0v0", 68, 1500);
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    let err = refused(&k, &p, &restore).await;
    assert!(err.contains("mtu greater than device maximum"), "{err}");
    assert_eq!(host_device(&k, "ens1f0v0"), Some(restore.host.clone()));
    assert!(k.links(&pod()).is_empty(), "{:?}", k.links(&pod()));
    let log = k.log();
    assert_eq!(
        log[log.len() - 3..],
        [
            // The MAC came before the MTU, under the host name (the name comes after).
            "/var/run/netns/cni-1: link set ens1f0v0 netns host name ens1f0v0 mtu 1500 \
             address aa:00:00:00:00:01",
            "host: addr add 198.51.100.5/24 dev ens1f0v0",
            "host: link set ens1f0v0 up",
        ],
        "{log:?}"
    );
}

#[tokio::test]
async fn a_mac_the_device_refuses_after_the_move_is_undone() {
    let (k, _) = kernel();
    let p = AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        mac: Some([0x01, 0, 0x5e, 0, 0, 1]),
        ..plan(AttachMode::Move)
    };
    let restore = capture(&k, &p).await.unwrap();
    let err = refused(&k, &p, &restore).await;
    assert!(err.contains("Cannot assign requested address"), "{err}");
    assert_eq!(host_device(&k, "ens1f0v0"), Some(restore.host.clone()));
    assert!(k.links(&pod()).is_empty(), "{:?}", k.links(&pod()));
}

#[tokio::test]
async fn a_device_landed_under_the_pod_name_beside_a_namesake_is_found_by_its_mac() {
    let (k, index) = kernel();
    k.limit_mtu(&Ns::Host, "ens1f0v0", 68, 1500);
    // The pod has its own ens1f0v0, with the device's index too (indexes are per namespace):
    // the device moves under the pod's name and gets a new index there (the kernel picks one
    // when the device's own is taken), so only the MAC tells the two apart.
    k.add_link(&pod(), "ens1f0v0", 1500, [0xcc, 0, 0, 0, 0, 1], None, &[]);
    k.renumber(&pod(), "ens1f0v0", index);
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    let err = refused(&k, &p, &restore).await;
    assert!(err.contains("mtu greater than device maximum"), "{err}");
    // Home as it was, under the index it came back with.
    let home = host_device(&k, "ens1f0v0").expect("the device is home");
    assert_eq!(
        LinkState {
            index: restore.host.index,
            ..home
        },
        restore.host
    );
    let left: Vec<_> = k.links(&pod()).into_iter().map(|l| l.mac).collect();
    assert_eq!(
        left,
        [Some([0xcc, 0, 0, 0, 0, 1])],
        "only the pod's own link stays"
    );
}

#[tokio::test]
async fn a_refusal_of_the_whole_move_leaves_nothing_to_undo() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    k.fail_on("host: link set ens1f0v0 netns", "Operation not permitted");
    let before = k.requests();
    let err = refused(&k, &p, &restore).await;
    assert!(err.contains("Operation not permitted"), "{err}");
    assert_eq!(host_device(&k, "ens1f0v0"), Some(restore.host.clone()));
    // The two lookups, the move, and the one dump that found nothing in the pod.
    assert_eq!(k.requests() - before, 4);
    assert!(!k.log().iter().any(|l| l.contains("netns host")));
}

#[tokio::test]
async fn a_move_home_refused_on_the_host_is_finished_by_the_retried_detach() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    // Meanwhile another device took the name on the host: the kernel moves the device home
    // under the pod's name, gives it its MTU and MAC, and refuses the rename.
    k.add_link(
        &Ns::Host,
        "ens1f0v0",
        1500,
        [0xdd, 0, 0, 0, 0, 1],
        None,
        &[],
    );
    let err = detach(&k, &p, Some(&pod()), &restore)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("File exists"), "{err}");
    let home = host_device(&k, "net1").expect("the device is on the host");
    assert_eq!(
        (home.index, home.mtu, home.mac),
        (restore.host.index, 1500, restore.host.mac)
    );
    assert!(k.links(&pod()).is_empty());
    // Once the name is free, the retried detach finds the device by its index.
    let mut host = k.open(&Ns::Host).await.unwrap().unwrap();
    host.del_link("ens1f0v0").await.unwrap();
    let impostor = host_device(&k, "ens1f0v0");
    assert!(impostor.is_none(), "{impostor:?}");
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    assert_eq!(host_device(&k, "ens1f0v0"), Some(restore.host.clone()));
}

#[tokio::test]
async fn a_device_left_in_the_pod_by_a_crash_during_the_undo_is_brought_home_by_detach() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    half_moved(&k).await;
    assert!(host_device(&k, "ens1f0v0").is_none());
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    assert_eq!(host_device(&k, "ens1f0v0"), Some(restore.host.clone()));
    assert!(k.links(&pod()).is_empty(), "{:?}", k.links(&pod()));
}

#[tokio::test]
async fn a_detach_that_cannot_read_the_pod_fails_instead_of_forgetting_the_device() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    half_moved(&k).await;
    k.fail_on(
        "/var/run/netns/cni-1: link show",
        "No buffer space available",
    );
    let err = detach(&k, &p, Some(&pod()), &restore)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("No buffer space available"), "{err}");
    // The retried detach finds it and brings it home.
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    assert_eq!(host_device(&k, "ens1f0v0"), Some(restore.host.clone()));
}
