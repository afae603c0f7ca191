use std::collections::BTreeMap;

use knic_proto::netconfig::{Cidr, Route};

use super::fake::FakeKernel;
use super::*;

fn cidr(s: &str) -> Cidr {
    s.parse().unwrap()
}

fn pod() -> Ns {
    Ns::Pod("/var/run/netns/cni-1".into())
}

fn plan(mode: AttachMode) -> AttachPlan {
    let mut sysctls = BTreeMap::new();
    sysctls.insert("ipv4.arp_ignore".to_string(), "1".to_string());
    AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        mode,
        mac: Some([0x02, 0, 0, 0, 0, 0x10]),
        routes: vec![Route {
            destination: cidr("203.0.113.0/24"),
            gateway: Some("192.0.2.1".parse().unwrap()),
            source: None,
            metric: None,
            table: None,
        }],
        sysctls,
        ..super::fake::plan(
            "pci-0000-a2-01-0",
            "ens1f0v0",
            "net1",
            &["192.0.2.10/24", "2001:db8::10/64"],
        )
    }
}

fn kernel() -> (FakeKernel, u32) {
    let k = FakeKernel::new();
    let index = k.add_link(
        &Ns::Host,
        "ens1f0v0",
        1500,
        [0xaa, 0, 0, 0, 0, 1],
        None,
        &[cidr("198.51.100.5/24")],
    );
    k.add_link(&Ns::Host, "eth0", 1500, [0xbb, 0, 0, 0, 0, 1], None, &[]);
    k.add_namespace(&pod());
    (k, index)
}

#[tokio::test]
async fn attach_moves_with_one_message_and_configures_in_order() {
    let (k, index) = kernel();
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    assert_eq!(restore.host.index, index);
    let link = attach(&k, &p, &pod(), &restore, false).await.unwrap();
    assert_eq!(link.name, "net1");
    assert_eq!(
        (link.mtu, link.mac, link.up),
        (9000, Some([2, 0, 0, 0, 0, 0x10]), true)
    );
    assert_eq!(
        link.addresses,
        vec![cidr("192.0.2.10/24"), cidr("2001:db8::10/64")]
    );
    assert_eq!(
        k.log(),
        vec![
            "host: link set ens1f0v0 netns /var/run/netns/cni-1 name net1 mtu 9000 address 02:00:00:00:00:10 ipv4conf ipv4.arp_ignore=1",
            "/var/run/netns/cni-1: addr add 192.0.2.10/24 dev net1",
            "/var/run/netns/cni-1: addr add 2001:db8::10/64 dev net1",
            "/var/run/netns/cni-1: link set net1 up",
            "/var/run/netns/cni-1: route add 203.0.113.0/24 via 192.0.2.1 dev net1",
        ]
    );
    assert_eq!(
        k.sysctl(&pod(), "net1", "ipv4.arp_ignore").as_deref(),
        Some("1")
    );
    // A repeated hook is a no-op.
    let before = k.log().len();
    let again = attach(&k, &p, &pod(), &restore, false).await.unwrap();
    assert_eq!(again.index, index);
    assert_eq!(k.log().len(), before);
}

#[tokio::test]
async fn resuming_a_cut_short_attach_completes_the_configuration() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    // A crash right after the move: the pod has the link, nothing else.
    k.fail_on("/var/run/netns/cni-1: sysctl", "killed");
    let mut host = k.open(&Ns::Host).await.unwrap().unwrap();
    host.move_link(
        "ens1f0v0",
        &pod(),
        &LinkChange {
            name: Some("net1".into()),
            mtu: Some(9000),
            mac: p.mac,
            up: None,
            ipv4_conf: vec![(19, 1)],
            index: None,
            sizes: Default::default(),
        },
    )
    .await
    .unwrap();
    let link = attach(&k, &p, &pod(), &restore, true).await.unwrap_err();
    assert!(link.to_string().contains("killed"));
    let link = attach(&k, &p, &pod(), &restore, true).await.unwrap();
    assert!(link.up);
    assert_eq!(link.addresses.len(), 2);
    assert_eq!(k.routes(&pod()).len(), 1);
}

#[tokio::test]
async fn detach_restores_name_mtu_mac_addresses_and_state_idempotently() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    let host = k
        .links(&Ns::Host)
        .into_iter()
        .find(|l| l.name == "ens1f0v0")
        .unwrap();
    assert_eq!(host, restore.host, "the node is exactly as before");
    assert!(k.links(&pod()).is_empty());
    let before = k.log().len();
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    assert_eq!(k.log().len(), before, "a second detach changes nothing");
}

#[tokio::test]
async fn failure_mid_attach_undoes_everything() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    k.fail_on("/var/run/netns/cni-1: route add", "Network is unreachable");
    let err = attach(&k, &p, &pod(), &restore, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("Network is unreachable"), "{err}");
    let host = k
        .links(&Ns::Host)
        .into_iter()
        .find(|l| l.name == "ens1f0v0")
        .unwrap();
    assert_eq!(host, restore.host);
    assert!(k.links(&pod()).is_empty());
}

#[tokio::test]
async fn name_clash_in_the_pod_is_refused_before_anything_moves() {
    let (k, _) = kernel();
    k.add_link(
        &pod(),
        "net1",
        1500,
        [0xcc, 0, 0, 0, 0, 1],
        Some("veth"),
        &[],
    );
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    let err = attach(&k, &p, &pod(), &restore, false)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "/var/run/netns/cni-1: attaching node-a/pci-0000-a2-01-0: interface net1 already exists in the pod; choose another name (interface.name)"
    );
    assert!(k.log().is_empty(), "nothing was attempted: {:?}", k.log());
}

#[tokio::test]
async fn deleted_namespace_returns_a_physical_device_under_another_name_and_it_is_restored() {
    let (k, index) = kernel();
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    // Meanwhile something else took the original name.
    k.add_link(
        &Ns::Host,
        "ens1f0v0",
        1500,
        [0xdd, 0, 0, 0, 0, 1],
        Some("veth"),
        &[],
    );
    k.delete_namespace(&pod());
    // The kernel keeps the pod-side name when it is free on the host.
    let returned = k
        .links(&Ns::Host)
        .into_iter()
        .find(|l| l.index == index)
        .unwrap();
    assert_eq!(returned.name, "net1");
    // Detach finds it by index; the name is taken, so it is restored in every other respect.
    let err = detach(&k, &p, Some(&pod()), &restore).await;
    assert!(
        err.is_err(),
        "the original name is taken by another link: {err:?}"
    );
}

#[tokio::test]
async fn deleted_namespace_then_detach_restores_the_returned_device() {
    let (k, index) = kernel();
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    k.delete_namespace(&pod());
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    let host = k
        .links(&Ns::Host)
        .into_iter()
        .find(|l| l.index == index)
        .unwrap();
    assert_eq!(host, restore.host);
}

/// A NIC port (permanent MAC, PCI function) whose index the pod's own link had: attached under
/// another index, then returned by the kernel under that one when the pod's namespace died.
async fn returned_under_another_index() -> (FakeKernel, AttachPlan, Restore, LinkState) {
    let (k, index) = kernel();
    k.set_hardware(&Ns::Host, "ens1f0v0", [0x0c, 0, 0, 0, 0, 9], "0000:a2:01.0");
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    k.add_link(
        &pod(),
        "eth0",
        1500,
        [0xcc, 0, 0, 0, 0, 1],
        Some("veth"),
        &[],
    );
    k.renumber(&pod(), "eth0", index);
    let link = attach(&k, &p, &pod(), &restore, false).await.unwrap();
    assert_ne!(link.index, index);
    k.delete_namespace(&pod());
    (k, p, restore, link)
}

/// Its own index taken in the pod, the device moved in under another; the pod's namespace
/// died and the kernel returned it under that one. Detach finds it by its hardware (permanent
/// MAC, PCI function) and puts it back in every respect but the index, which only a move
/// could give back.
#[tokio::test]
async fn a_device_returned_under_another_index_is_found_by_its_hardware() {
    let (k, p, restore, link) = returned_under_another_index().await;
    let index = restore.host.index;
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    let home = k
        .links(&Ns::Host)
        .into_iter()
        .find(|l| l.pci_address == restore.host.pci_address)
        .expect("the device is on the host");
    assert_eq!(home.index, link.index);
    assert_eq!(LinkState { index, ..home }, restore.host);
}

/// Two host links carry the recorded hardware identity: detach refuses to pick one, names the
/// rule, and changes neither.
#[tokio::test]
async fn a_returned_device_is_not_guessed_among_lookalikes() {
    let (k, p, restore, _) = returned_under_another_index().await;
    k.add_link(
        &Ns::Host,
        "lookalike",
        1500,
        [0x0c, 0, 0, 0, 0, 8],
        None,
        &[],
    );
    k.set_hardware(
        &Ns::Host,
        "lookalike",
        [0x0c, 0, 0, 0, 0, 9],
        "0000:a2:01.0",
    );
    let before = k.links(&Ns::Host);
    let err = detach(&k, &p, Some(&pod()), &restore)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("2 host links match its recorded identity; not guessing"),
        "{err}"
    );
    assert_eq!(k.links(&Ns::Host), before);
}

#[tokio::test]
async fn virtual_device_destroyed_with_the_namespace_is_not_an_error() {
    let k = FakeKernel::new();
    k.add_link(
        &Ns::Host,
        "ens1f0v0",
        1500,
        [0xaa, 0, 0, 0, 0, 1],
        Some("macvlan"),
        &[],
    );
    k.add_namespace(&pod());
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    k.delete_namespace(&pod());
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    assert!(k.links(&Ns::Host).is_empty());
}

#[tokio::test]
async fn vlan_child_is_created_in_the_pod_in_one_request_and_deleted() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Vlan { id: 100 });
    let restore = capture(&k, &p).await.unwrap();
    let link = attach(&k, &p, &pod(), &restore, false).await.unwrap();
    assert_eq!(link.kind.as_deref(), Some("vlan"));
    // One RTM_NEWLINK names the parent (on the host) and the pod namespace, with the final
    // name, MTU and MAC: no temporary host name, no move.
    assert_eq!(
        k.log()[0],
        "host: link add link ens1f0v0 type vlan id 100 netns /var/run/netns/cni-1 name net1 \
         mtu 9000 address 02:00:00:00:00:10"
    );
    assert!(
        !k.log()
            .iter()
            .any(|l| l.contains(" netns ") && l.contains("link set")),
        "nothing moves: {:?}",
        k.log()
    );
    // The parent never left the host, and no child ever appeared there.
    let host: Vec<String> = k.links(&Ns::Host).iter().map(|l| l.name.clone()).collect();
    assert!(host.contains(&"ens1f0v0".to_owned()));
    assert!(!host.iter().any(|n| n.starts_with("knic")), "{host:?}");
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    assert_eq!(
        k.log().last().unwrap(),
        "/var/run/netns/cni-1: link del net1"
    );
    assert!(k.links(&pod()).is_empty());
}

#[tokio::test]
async fn a_vlan_child_whose_configuration_fails_is_deleted_in_the_pod() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Vlan { id: 100 });
    let restore = capture(&k, &p).await.unwrap();
    k.fail_on("/var/run/netns/cni-1: addr add", "No space left on device");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("the address fails");
    assert!(k.links(&pod()).is_empty(), "{:?}", k.links(&pod()));
    assert_eq!(
        k.log().last().unwrap(),
        "/var/run/netns/cni-1: link del net1"
    );
}

#[tokio::test]
async fn vlan_without_8021q_fails_cleanly() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Vlan { id: 100 });
    let restore = capture(&k, &p).await.unwrap();
    k.fail_on("host: link add", "Operation not supported");
    let err = attach(&k, &p, &pod(), &restore, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("Operation not supported"), "{err}");
    assert_eq!(k.links(&Ns::Host).len(), 2, "nothing left behind");
}

#[tokio::test]
async fn missing_pod_namespace_is_an_error_naming_it() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    let err = attach(
        &k,
        &p,
        &Ns::Pod("/var/run/netns/gone".into()),
        &restore,
        false,
    )
    .await
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "/var/run/netns/gone: entering the network namespace: it does not exist"
    );
}

/// The record is old (a repeated or resumed attach): another device took the name since
/// capture. Attach checks what carries the name now, in the lookup the move needs anyway.
#[tokio::test]
async fn attach_refuses_another_device_that_took_the_name_since_capture() {
    let (k, _) = kernel();
    let mut p = plan(AttachMode::Move);
    p.identity = Some(DeviceIdentity::Mac {
        address: [0xaa, 0, 0, 0, 0, 1],
    });
    let restore = capture(&k, &p).await.unwrap();
    let mut host = k.open(&Ns::Host).await.unwrap().unwrap();
    let rename = |name: &str| LinkChange {
        name: Some(name.to_owned()),
        ..Default::default()
    };
    host.set_link("ens1f0v0", &rename("ens1f0v0-old"))
        .await
        .unwrap();
    host.set_link("eth0", &rename("ens1f0v0")).await.unwrap();
    drop(host);
    let logged = k.log().len();
    let err = attach(&k, &p, &pod(), &restore, false)
        .await
        .expect_err("another device under the name");
    assert_eq!(
        err.to_string(),
        "interface ens1f0v0 is MAC bb:00:00:00:00:01, but the device was prepared as MAC \
         aa:00:00:00:00:01; refusing to move it into the pod"
    );
    assert_eq!(k.log().len(), logged, "nothing changed: {:?}", k.log());
    assert!(k.links(&pod()).is_empty());
}

#[tokio::test]
async fn capture_refuses_another_device_under_the_prepared_name() {
    let (k, _) = kernel();
    k.set_hardware(&Ns::Host, "ens1f0v0", [0xaa, 0, 0, 0, 0, 1], "0000:a2:01.1");
    let mut p = plan(AttachMode::Move);
    p.identity = Some(DeviceIdentity::Pci {
        address: "0000:a2:01.0".into(),
        mac: None,
    });
    let err = capture(&k, &p).await.expect_err("another PCI function");
    assert_eq!(
        err.to_string(),
        "interface ens1f0v0 is PCI function 0000:a2:01.1, but the device was prepared as PCI \
         function 0000:a2:01.0; refusing to move it into the pod"
    );
    p.identity = Some(DeviceIdentity::Mac {
        address: [0xaa, 0, 0, 0, 0, 2],
    });
    let err = capture(&k, &p).await.expect_err("another MAC");
    assert_eq!(
        err.to_string(),
        "interface ens1f0v0 is MAC aa:00:00:00:00:01, but the device was prepared as MAC \
         aa:00:00:00:00:02; refusing to move it into the pod"
    );
    // Nothing was changed: only reads happened (the fake logs changes only).
    assert!(k.log().is_empty(), "{:?}", k.log());
}

#[tokio::test]
async fn identity_survives_a_mac_change_through_the_permanent_mac() {
    let (k, _) = kernel();
    // The admin changed the current MAC; the burned-in one still identifies the port.
    k.set_hardware(&Ns::Host, "ens1f0v0", [0xaa, 0, 0, 0, 0, 9], "0000:a2:01.0");
    let mut p = plan(AttachMode::Move);
    p.identity = Some(DeviceIdentity::Mac {
        address: [0xaa, 0, 0, 0, 0, 9],
    });
    capture(&k, &p).await.expect("the permanent MAC matches");
    p.identity = Some(DeviceIdentity::Pci {
        address: "0000:a2:01.0".into(),
        mac: None,
    });
    let restore = capture(&k, &p).await.expect("the PCI function matches");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attach");
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detach");
}

#[tokio::test]
async fn detach_leaves_a_foreign_device_in_the_pod_alone() {
    let (k, index) = kernel();
    k.set_hardware(&Ns::Host, "ens1f0v0", [0xaa, 0, 0, 0, 0, 1], "0000:a2:01.0");
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.expect("capture");
    // Not attached by knic: the pod has its own net1 with the same ifindex and the MAC the
    // plan would set, but it is another port.
    k.add_link(&pod(), "net1", 1500, [0x02, 0, 0, 0, 0, 0x10], None, &[]);
    k.renumber(&pod(), "net1", index);
    k.set_hardware(&pod(), "net1", [0xcc, 0, 0, 0, 0, 1], "0000:b3:00.0");
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detach");
    assert!(
        k.log().iter().all(|l| !l.contains("netns")),
        "moved a device knic never moved: {:?}",
        k.log()
    );
}

#[tokio::test]
async fn without_a_pci_parent_from_the_kernel_the_mac_decides() {
    // virtio-net (parent virtio0) or a kernel before 5.16: no PCI function on the link.
    let (k, _) = kernel();
    let mut p = plan(AttachMode::Move);
    p.identity = Some(DeviceIdentity::Pci {
        address: "0000:00:03.0".into(),
        mac: Some([0xaa, 0, 0, 0, 0, 1]),
    });
    capture(&k, &p).await.expect("same MAC: accepted");
    p.identity = Some(DeviceIdentity::Pci {
        address: "0000:00:03.0".into(),
        mac: Some([0xaa, 0, 0, 0, 0, 2]),
    });
    let err = capture(&k, &p).await.expect_err("another MAC");
    assert_eq!(
        err.to_string(),
        "interface ens1f0v0 is MAC aa:00:00:00:00:01, but the device was prepared as PCI \
         function 0000:00:03.0; refusing to move it into the pod"
    );
}

#[tokio::test]
async fn a_device_recorded_before_identities_still_comes_home() {
    let (k, _) = kernel();
    k.set_hardware(&Ns::Host, "ens1f0v0", [0xaa, 0, 0, 0, 0, 1], "0000:a2:01.0");
    let p = plan(AttachMode::Move);
    let mut restore = capture(&k, &p).await.expect("capture");
    attach(&k, &p, &pod(), &restore, false)
        .await
        .expect("attach");
    // The restore record of an older knic: no permanent MAC, no PCI function.
    restore.host.permanent_mac = None;
    restore.host.pci_address = None;
    detach(&k, &p, Some(&pod()), &restore)
        .await
        .expect("detach");
    assert!(
        k.links(&pod()).is_empty(),
        "left in the pod: {:?}",
        k.links(&pod())
    );
}

/// What a PF reports for a VF nothing was assigned to: any PF before knic touches the VF, and
/// igb right after creating it (the VF tests and the igb model start from it).
fn unassigned_vf() -> VfState {
    VfState {
        mac: Some([0; 6]),
        vlan: Some(super::vf::VfVlanTag {
            id: 0,
            qos: 0,
            protocol: knic_proto::netconfig::VfVlanProtocol::Dot1Q,
        }),
        rate: Some((0, 0)),
        spoof_chk: Some(true),
        trust: Some(false),
        link_state: Some(knic_proto::netconfig::VfLinkState::Auto),
    }
}

// SR-IOV VF settings made through the PF (issue 12), in a file of its own.
mod vf;

// VF settings through a PF driven like igb, as the test VM's real one answered.
mod igb;

// Egress limits on the pod's interface (issue 13), in a file of its own.
mod bandwidth;

#[tokio::test]
async fn macvlan_and_ipvlan_children_are_created_in_the_pod_and_deleted() {
    for (child, kind) in [
        (ChildKind::Macvlan("bridge".into()), "macvlan"),
        (ChildKind::Ipvlan("l3".into()), "ipvlan"),
    ] {
        let (k, _) = kernel();
        let mut p = plan(AttachMode::Child {
            child: child.clone(),
            uplink: None,
        });
        if kind == "ipvlan" {
            p.mac = None;
        }
        let restore = capture(&k, &p).await.unwrap();
        let link = attach(&k, &p, &pod(), &restore, false).await.unwrap();
        assert_eq!(link.kind.as_deref(), Some(kind));
        let mode = match &child {
            ChildKind::Macvlan(m) | ChildKind::Ipvlan(m) => m.clone(),
        };
        assert!(
            k.log()[0].starts_with(&format!(
                "host: link add link ens1f0v0 type {kind} mode {mode} netns /var/run/netns/cni-1 name net1"
            )),
            "{:?}",
            k.log()
        );
        // The parent stays, configured as it was; a repeated hook is a no-op.
        assert!(k.links(&Ns::Host).iter().any(|l| l.name == "ens1f0v0"));
        let again = attach(&k, &p, &pod(), &restore, false).await.unwrap();
        assert_eq!(again.index, link.index);
        detach(&k, &p, Some(&pod()), &restore).await.unwrap();
        assert_eq!(
            k.log().last().unwrap(),
            "/var/run/netns/cni-1: link del net1"
        );
        assert!(k.links(&pod()).is_empty());
        assert!(k.links(&Ns::Host).iter().any(|l| l.name == "ens1f0v0"));
    }
}

// Netlink requests per attach and detach (issue 14), in a file of their own.
mod requests;

// Moves the kernel refuses after moving the device, in a file of their own.
mod refused;

// ethtool settings of the pod's interface (issue 27), in a file of its own.
mod ethtool;
// Static neighbors and GSO/GRO sizes (issue 27).
mod link;
