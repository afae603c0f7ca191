//! The executor's request budget (issue 14), counted the way `rtnl` sends requests: one index
//! lookup per name per session, addresses only where detach needs them, addresses and routes
//! pipelined, no read-backs, no link-down before a move. The real kernel is held to the same
//! figures by `e2e/tests/kernel_netns/requests.rs`.

use super::*;

/// Requests made on `k` since `before`, which moves on to now.
fn since(k: &FakeKernel, before: &mut u64) -> u64 {
    let now = k.requests();
    let spent = now - *before;
    *before = now;
    spent
}

/// The attach bench's device: a physical device, down, without host addresses, into the pod
/// with two addresses and a route (no sysctls, MTU or MAC change).
fn bench_plan() -> AttachPlan {
    AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        mtu: None,
        mac: None,
        sysctls: BTreeMap::new(),
        ..plan(AttachMode::Move)
    }
}

fn bench_kernel() -> FakeKernel {
    let k = FakeKernel::new();
    k.add_link(
        &Ns::Host,
        "ens1f0v0",
        1500,
        [0xaa, 0, 0, 0, 0, 1],
        None,
        &[],
    );
    k.add_namespace(&pod());
    // Down, as the bench's device is on the host.
    k.set_down(&Ns::Host, "ens1f0v0");
    k
}

#[tokio::test]
async fn a_physical_cycle_makes_eleven_requests() {
    let k = bench_kernel();
    let p = bench_plan();
    let mut count = 0;
    let restore = capture(&k, &p).await.unwrap();
    // The link and its address dump.
    assert_eq!(since(&k, &mut count), 2);
    let link = attach(&k, &p, &pod(), &restore, false).await.unwrap();
    assert!(link.up);
    assert_eq!(link.addresses, p.addresses);
    // Pod name check and host lookup (one round), the move (which kept the device's index,
    // so no lookup in the pod), two addresses (one round), up, the route.
    assert_eq!(since(&k, &mut count), 7);
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    // The pod lookup and the move back: the move restored name, MTU and MAC, and the device
    // was down without addresses on the host, as it is now.
    assert_eq!(since(&k, &mut count), 2);
    assert_eq!(
        k.log(),
        vec![
            "host: link set ens1f0v0 netns /var/run/netns/cni-1 name net1",
            "/var/run/netns/cni-1: addr add 192.0.2.10/24 dev net1",
            "/var/run/netns/cni-1: addr add 2001:db8::10/64 dev net1",
            "/var/run/netns/cni-1: link set net1 up",
            "/var/run/netns/cni-1: route add 203.0.113.0/24 via 192.0.2.1 dev net1",
            "/var/run/netns/cni-1: link set net1 netns host name ens1f0v0 mtu 1500 address aa:00:00:00:00:01",
        ]
    );
    let home = k.links(&Ns::Host);
    assert_eq!(
        (home[0].name.as_str(), home[0].up, home[0].addresses.len()),
        ("ens1f0v0", false, 0)
    );
}

/// A pod that already has a link with the device's ifindex: the kernel refuses a move that
/// asks to keep it, so the device moves without (the kernel picks a new index), is looked up
/// in the pod, and is configured there like any other.
#[tokio::test]
async fn a_move_onto_a_taken_index_takes_a_new_one_and_looks_it_up() {
    let k = bench_kernel();
    let p = bench_plan();
    let restore = capture(&k, &p).await.unwrap();
    k.add_link(&pod(), "eth0", 1500, [0xcc, 0, 0, 0, 0, 1], None, &[]);
    k.renumber(&pod(), "eth0", restore.host.index);
    let mut count = k.requests();
    let link = attach(&k, &p, &pod(), &restore, false).await.unwrap();
    // 7, + the refused move and the host lookup that saw the device still home, + the pod
    // lookup of its new index.
    assert_eq!(since(&k, &mut count), 10);
    assert_ne!(link.index, restore.host.index);
    let in_pod = k.links(&pod());
    let net1 = in_pod
        .iter()
        .find(|l| l.name == "net1")
        .expect("net1 in the pod");
    assert_eq!((net1.index, net1.up), (link.index, true));
    assert_eq!(net1.addresses, p.addresses);
    let eth0 = in_pod
        .iter()
        .find(|l| l.name == "eth0")
        .expect("eth0 in the pod");
    assert!(
        eth0.addresses.is_empty(),
        "the pod's own link was left alone: {eth0:?}"
    );
    // Found in the pod by name and MAC (its index is not the recorded one) and moved home.
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    let names: Vec<String> = k.links(&pod()).into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["eth0"]);
    // Home under the index it had, not the one the pod gave it.
    assert!(
        k.links(&Ns::Host).iter().any(|l| l.name == "ens1f0v0"
            && l.mac == restore.host.mac
            && l.index == restore.host.index),
        "{:?}",
        k.links(&Ns::Host)
    );
}

#[tokio::test]
async fn a_device_with_a_host_address_costs_two_more_to_restore() {
    // Up with 198.51.100.5/24 on the host.
    let (k, _) = kernel();
    let p = plan(AttachMode::Move);
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    assert_eq!(k.requests(), 9);
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    // + the address, + up (the move back kept the index: no host lookup).
    assert_eq!(k.requests(), 13);
    let log = k.log();
    assert_eq!(
        log[log.len() - 3..],
        [
            "/var/run/netns/cni-1: link set net1 netns host name ens1f0v0 mtu 1500 address aa:00:00:00:00:01",
            "host: addr add 198.51.100.5/24 dev ens1f0v0",
            "host: link set ens1f0v0 up",
        ]
    );
    let home = k.links(&Ns::Host);
    let dev = home.iter().find(|l| l.name == "ens1f0v0").unwrap();
    assert!(dev.up);
    assert_eq!(dev.addresses, vec![cidr("198.51.100.5/24")]);
}

#[tokio::test]
async fn a_child_cycle_makes_thirteen_requests() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Child {
        child: ChildKind::Macvlan("bridge".into()),
        uplink: None,
    });
    let mut count = 0;
    let restore = capture(&k, &p).await.unwrap();
    assert_eq!(since(&k, &mut count), 2);
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    // Pod name check, parent lookup, the creation, the pod lookup, two addresses, up, route.
    assert_eq!(since(&k, &mut count), 8);
    detach(&k, &p, Some(&pod()), &restore).await.unwrap();
    // The pod lookup, the delete (index known), the check for an old version's leftover.
    assert_eq!(since(&k, &mut count), 3);
}

#[tokio::test]
async fn a_move_onto_a_taken_name_moves_the_device_and_fails_like_the_kernel() {
    let k = bench_kernel();
    k.add_link(
        &pod(),
        "net1",
        1500,
        [0xcc, 0, 0, 0, 0, 1],
        Some("veth"),
        &[],
    );
    let mut host = k.open(&Ns::Host).await.unwrap().unwrap();
    let change = LinkChange {
        name: Some("net1".into()),
        ..Default::default()
    };
    let err = host
        .move_link("ens1f0v0", &pod(), &change)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("File exists"), "{err}");
    let names: Vec<_> = k.links(&pod()).into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["net1", "ens1f0v0"]);
}

#[tokio::test]
async fn ipv4_sysctls_ride_on_the_move_and_cost_no_request() {
    let k = bench_kernel();
    let sysctls: BTreeMap<String, String> = [
        ("ipv4.arp_ignore", "1"),
        ("net.ipv4.conf.net1.rp_filter", "0"),
        ("ipv4.forwarding", "1"),
        ("ipv6.accept_ra", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let p = AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        sysctls,
        ..bench_plan()
    };
    let restore = capture(&k, &p).await.unwrap();
    let mut count = k.requests();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    // As many as without sysctls.
    assert_eq!(since(&k, &mut count), 7);
    // Both devconf ones in the move (rp_filter as 0: a zero is sent too); forwarding (its
    // proc handler has side effects) and IPv6 stay files, written before the link goes up.
    assert_eq!(
        k.log()[..3],
        [
            "host: link set ens1f0v0 netns /var/run/netns/cni-1 name net1 ipv4conf ipv4.rp_filter=0,ipv4.arp_ignore=1",
            "/var/run/netns/cni-1: sysctl net1 ipv4.forwarding=1 ipv6.accept_ra=0",
            "/var/run/netns/cni-1: addr add 192.0.2.10/24 dev net1",
        ]
    );
    assert_eq!(
        k.sysctl(&pod(), "net1", "ipv4.rp_filter").as_deref(),
        Some("0")
    );
}

#[tokio::test]
async fn a_child_gets_its_sysctls_as_files_as_a_creation_refuses_them() {
    let (k, _) = kernel();
    let p = plan(AttachMode::Vlan { id: 100 });
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    let log = k.log();
    assert!(!log[0].contains("ipv4conf"), "{log:?}");
    assert_eq!(
        log[1],
        "/var/run/netns/cni-1: sysctl net1 ipv4.arp_ignore=1"
    );
}

#[tokio::test]
async fn below_the_ipv4_mtu_the_sysctls_stay_files_so_a_failure_is_undone() {
    let k = bench_kernel();
    let p = AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        mtu: Some(60),
        sysctls: BTreeMap::from([("ipv4.arp_ignore".to_owned(), "1".to_owned())]),
        ..bench_plan()
    };
    let restore = capture(&k, &p).await.unwrap();
    attach(&k, &p, &pod(), &restore, false).await.unwrap();
    assert_eq!(
        k.log()[..2],
        [
            "host: link set ens1f0v0 netns /var/run/netns/cni-1 name net1 mtu 60",
            "/var/run/netns/cni-1: sysctl net1 ipv4.arp_ignore=1",
        ]
    );
}
