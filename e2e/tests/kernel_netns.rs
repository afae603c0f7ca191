//! Kernel tests of the executor: real veth and macvlan links, real network namespaces. The test
//! process first enters private network and mount namespaces (its "host"), so every link and
//! every `knt-` namespace it creates disappears with it, even on a crash; each trial also
//! deletes what it made. VLAN needs 8021q, which this kernel may lack: then the VLAN trial is
//! reported ignored with that reason, never passed; in the test VM (`e2e/vm/kernel-tests.sh`,
//! `KNIC_IN_VM=1`), whose kernel has it, that lack fails the trial instead. Nor does it have
//! SR-IOV: the VF-settings requests are checked here only as far as a device without VFs lets
//! them (the kernel must accept the VF-table query and refuse the change), and on real hardware
//! when `KNIC_TEST_SRIOV_PF` names a PF with VFs; otherwise that trial is ignored with the reason.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use anyhow::{Context, ensure};
use knic_driver::netns::rtnl::{Rtnl, kernel_has_8021q};
use knic_driver::netns::{
    AttachMode, AttachPlan, DeviceIdentity, Kernel, LinkState, Ns, Restore, Session, attach,
    capture, detach,
};
use knic_e2e::harness::{Netns, in_netns, ip, isolate, kernel_trial, udp_echo};
use knic_proto::netconfig::{ChildKind, Cidr, Route};
use libtest_mimic::Failed;

// Egress limits (issue 13), in a file of their own.
#[path = "kernel_netns/bandwidth.rs"]
mod bandwidth;
use bandwidth::{egress_limit_on_a_macvlan_child, egress_limit_on_a_moved_veth, has_tc};

// VF settings through the PF, in a file of their own.
#[path = "kernel_netns/vf.rs"]
mod vf;
use vf::{sriov_pf, vf_requests_on_a_device_without_vfs, vf_settings_on_sriov_hardware};

// Netlink requests per cycle against the real kernel (issue 14).
#[path = "kernel_netns/requests.rs"]
mod requests;

// IPv4 sysctls as attributes of the move (issue 14).
#[path = "kernel_netns/sysctl.rs"]
mod sysctl;

// Overlay segments across two namespaced nodes (issue 26).
#[path = "kernel_netns/overlay.rs"]
mod overlay;

// Moves the kernel refuses after moving the device, and a move home onto a taken name.
#[path = "kernel_netns/refused.rs"]
mod refused;

// Live update of a Network's routes and MTU in a pod (issue 26 part 4).
#[path = "kernel_netns/live.rs"]
mod live;

// Rules, source-based routing and VRF in the pod (issue 27).
#[path = "kernel_netns/routing.rs"]
mod routing;
// ethtool features and channels of a moved veth (issue 27).
#[path = "kernel_netns/ethtool.rs"]
mod ethtool;
// Static neighbors, ARP/ND sysctls, GSO/GRO sizes (issue 27).
#[path = "kernel_netns/link.rs"]
mod link;

/// Links in the test's host namespace, deleted on drop.
struct Links(Vec<&'static str>);
impl Drop for Links {
    fn drop(&mut self) {
        for l in &self.0 {
            let _ = ip(&["link", "del", l]);
        }
    }
}

fn cidr(s: &str) -> Cidr {
    s.parse().unwrap()
}

fn plan(host_ifname: &str, mode: AttachMode) -> AttachPlan {
    let mut sysctls = BTreeMap::new();
    sysctls.insert("ipv4.arp_ignore".to_string(), "1".to_string());
    AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        pool: "node".into(),
        device: host_ifname.into(),
        request: "nic".into(),
        host_ifname: host_ifname.into(),
        mode,
        pod_ifname: "net1".into(),
        mtu: Some(1400),
        mac: Some([0x02, 0, 0, 0, 0x4b, 0x10]),
        addresses: vec![cidr("192.0.2.10/24"), cidr("2001:db8::10/64")],
        routes: vec![Route {
            destination: cidr("203.0.113.0/24"),
            gateway: Some("192.0.2.1".parse().unwrap()),
            source: None,
            metric: Some(50),
            table: None,
        }],
        sysctls,
        identity: None,
        vf: None,
        bandwidth: None,
        ethtool: None,
        link: Default::default(),
    }
}

/// Link `name` as the host namespace sees it now.
async fn host_link(k: &Rtnl, name: &str) -> anyhow::Result<Option<LinkState>> {
    Ok(k.open(&Ns::Host).await?.context("host")?.link(name).await?)
}

/// The error text of an attach that must fail.
async fn attach_error(
    k: &Rtnl,
    p: &AttachPlan,
    pod: &Netns,
    restore: &Restore,
) -> anyhow::Result<String> {
    Ok(attach(k, p, &Ns::Pod(pod.path()), restore, false)
        .await
        .err()
        .context("the attach must fail")?
        .to_string())
}

async fn veth_attach_detach(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-a")?;
    let peer = Netns::new("knt-peer-a")?;
    let _links = Links(vec!["knt-a0"]);
    ip(&[
        "link",
        "add",
        "knt-a0",
        "type",
        "veth",
        "peer",
        "name",
        "knt-a1",
        "netns",
        "knt-peer-a",
    ])?;
    ip(&["addr", "add", "198.51.100.5/24", "dev", "knt-a0"])?;
    ip(&["link", "set", "knt-a0", "up"])?;
    ip(&[
        "-n",
        "knt-peer-a",
        "addr",
        "add",
        "192.0.2.1/24",
        "dev",
        "knt-a1",
    ])?;
    ip(&["-n", "knt-peer-a", "link", "set", "knt-a1", "up"])?;

    let p = plan("knt-a0", AttachMode::Move);
    let restore = capture(k, &p).await?;
    ensure!(
        restore.host.addresses == vec![cidr("198.51.100.5/24")],
        "{:?}",
        restore.host
    );
    let link = attach(k, &p, &Ns::Pod(pod.path()), &restore, false).await?;
    ensure!(
        link.name == "net1" && link.mtu == 1400 && link.mac == p.mac && link.up,
        "{link:?}"
    );
    ensure!(
        link.addresses.contains(&cidr("192.0.2.10/24"))
            && link.addresses.contains(&cidr("2001:db8::10/64")),
        "{link:?}"
    );
    let routes = ip(&["-n", "knt-pod-a", "route", "show", "203.0.113.0/24"])?;
    ensure!(
        routes.contains("via 192.0.2.1 dev net1") && routes.contains("metric 50"),
        "routes: {routes}"
    );
    let arp = in_netns(&pod.path(), || {
        std::fs::read_to_string("/proc/sys/net/ipv4/conf/net1/arp_ignore")
    })??;
    ensure!(arp.trim() == "1", "arp_ignore {arp}");
    ensure!(host_link(k, "knt-a0").await?.is_none(), "still on the host");
    udp_echo(&pod.path(), &peer.path(), "192.0.2.1")?;

    // A repeated hook changes nothing.
    let again = attach(k, &p, &Ns::Pod(pod.path()), &restore, false).await?;
    ensure!(again.index == link.index);

    detach(k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
    let back = host_link(k, "knt-a0").await?.context("not back")?;
    ensure!(
        back == restore.host,
        "restored {back:?} != before {:?}",
        restore.host
    );
    ensure!(
        k.open(&Ns::Pod(pod.path()))
            .await?
            .context("pod")?
            .link("net1")
            .await?
            .is_none()
    );
    detach(k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
    Ok(())
}

async fn name_clash(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-b")?;
    let _links = Links(vec!["knt-b0"]);
    ip(&[
        "link", "add", "knt-b0", "type", "veth", "peer", "name", "knt-b1",
    ])?;
    ip(&[
        "-n",
        "knt-pod-b",
        "link",
        "add",
        "net1",
        "type",
        "veth",
        "peer",
        "name",
        "knt-b3",
    ])?;
    let p = plan("knt-b0", AttachMode::Move);
    let restore = capture(k, &p).await?;
    let err = attach_error(k, &p, &pod, &restore).await?;
    ensure!(
        err.contains("interface net1 already exists in the pod"),
        "{err}"
    );
    let host = host_link(k, "knt-b0").await?.context("moved anyway")?;
    ensure!(host == restore.host);
    Ok(())
}

/// Sysctls written through the host's `/proc/sys/net` mounted elsewhere (what the chart does
/// for an unprivileged driver) land in the pod's namespace. IPv6 ones, as IPv4 devconf ones
/// go with the move, not through the files.
async fn sysctls_through_a_mounted_proc_sys_net(_: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-s")?;
    let _links = Links(vec!["knt-s0"]);
    ip(&[
        "link", "add", "knt-s0", "type", "veth", "peer", "name", "knt-s1",
    ])?;
    let mount = std::env::temp_dir().join(format!("knt-sysctl-{}", std::process::id()));
    std::fs::create_dir_all(&mount)?;
    nix::mount::mount(
        Some("/proc/sys/net"),
        &mount,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )?;
    let k = Rtnl::new(None).with_sysctl_root(&mount);
    let mut p = plan("knt-s0", AttachMode::Move);
    p.sysctls = BTreeMap::from([("ipv6.accept_ra".to_owned(), "0".to_owned())]);
    let outcome = async {
        let restore = capture(&k, &p).await?;
        attach(&k, &p, &Ns::Pod(pod.path()), &restore, false).await?;
        let ra = in_netns(&pod.path(), || {
            std::fs::read_to_string("/proc/sys/net/ipv6/conf/net1/accept_ra")
        })??;
        ensure!(ra.trim() == "0", "accept_ra {ra}");
        detach(&k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
        anyhow::Ok(())
    }
    .await;
    let _ = nix::mount::umount(&mount);
    let _ = std::fs::remove_dir(&mount);
    outcome
}

/// The MAC of `name` in the host namespace, as `ip` reads it.
fn mac_of(name: &str) -> anyhow::Result<[u8; 6]> {
    let out = ip(&["-br", "link", "show", "dev", name])?;
    let text = out
        .split_whitespace()
        .nth(2)
        .context("no MAC in ip -br link")?;
    let bytes: Vec<u8> = text
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()?;
    bytes
        .try_into()
        .map_err(|_| anyhow::anyhow!("{text}: not a MAC"))
}

/// An admin renames the prepared device away and gives its name to another interface between
/// prepare and pod start: attach refuses with both identities named, and nothing moves.
async fn renamed_device_is_refused(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-i")?;
    let _links = Links(vec!["knt-i0", "knt-i2", "knt-iold"]);
    ip(&[
        "link", "add", "knt-i0", "type", "veth", "peer", "name", "knt-i1",
    ])?;
    ip(&[
        "link", "add", "knt-i2", "type", "veth", "peer", "name", "knt-i3",
    ])?;
    let mut p = plan("knt-i0", AttachMode::Move);
    let prepared = mac_of("knt-i0")?;
    p.identity = Some(DeviceIdentity::Mac { address: prepared });
    // The swap: the prepared device is renamed, an unoffered one takes its name.
    ip(&["link", "set", "knt-i0", "name", "knt-iold"])?;
    ip(&["link", "set", "knt-i2", "name", "knt-i0"])?;
    let impostor = mac_of("knt-i0")?;
    let err = capture(k, &p)
        .await
        .err()
        .context("capture must refuse the impostor")?
        .to_string();
    let want = format!(
        "interface knt-i0 is MAC {}, but the device was prepared as MAC {}; refusing to move \
         it into the pod",
        knic_driver::netns::mac_text(&impostor),
        knic_driver::netns::mac_text(&prepared)
    );
    ensure!(err == want, "{err}\nwanted: {want}");
    let pod_links = ip(&["-n", "knt-pod-i", "-br", "link"])?;
    ensure!(!pod_links.contains("net1"), "moved anyway: {pod_links}");
    ensure!(
        host_link(k, "knt-i0").await?.is_some(),
        "the impostor left the host"
    );
    // Renamed back, the prepared device is accepted again.
    ip(&["link", "set", "knt-i0", "name", "knt-i2"])?;
    ip(&["link", "set", "knt-iold", "name", "knt-i0"])?;
    let restore = capture(k, &p).await?;
    attach(k, &p, &Ns::Pod(pod.path()), &restore, false).await?;
    detach(k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
    ensure!(host_link(k, "knt-i0").await? == Some(restore.host.clone()));
    Ok(())
}

async fn failed_attach_is_undone(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-c")?;
    let _links = Links(vec!["knt-c0"]);
    ip(&[
        "link", "add", "knt-c0", "type", "veth", "peer", "name", "knt-c1",
    ])?;
    ip(&["addr", "add", "198.51.100.7/24", "dev", "knt-c0"])?;
    ip(&["link", "set", "knt-c0", "up"])?;
    let mut p = plan("knt-c0", AttachMode::Move);
    // The kernel refuses a gateway no address can reach: a failure after the move.
    p.routes[0].gateway = Some("10.255.255.1".parse()?);
    let restore = capture(k, &p).await?;
    let err = attach_error(k, &p, &pod, &restore).await?;
    ensure!(
        err.contains("adding route 203.0.113.0/24 via net1"),
        "{err}"
    );
    let host = host_link(k, "knt-c0").await?.context("lost")?;
    ensure!(host == restore.host, "{host:?} != {:?}", restore.host);
    ensure!(
        k.open(&Ns::Pod(pod.path()))
            .await?
            .context("pod")?
            .links()
            .await?
            .iter()
            .all(|l| l.name == "lo")
    );
    Ok(())
}

async fn namespace_deleted_before_detach(k: &Rtnl) -> anyhow::Result<()> {
    let _links = Links(vec!["knt-d0", "knt-m0"]);
    ip(&[
        "link", "add", "knt-d0", "type", "veth", "peer", "name", "knt-d1",
    ])?;
    ip(&[
        "link", "add", "knt-m0", "link", "knt-d0", "type", "macvlan", "mode", "bridge",
    ])?;
    let p = plan("knt-m0", AttachMode::Move);
    let restore = capture(k, &p).await?;
    ensure!(restore.host.kind.as_deref() == Some("macvlan"));
    {
        let pod = Netns::new("knt-pod-d")?;
        attach(k, &p, &Ns::Pod(pod.path()), &restore, false).await?;
    } // the namespace is deleted here, taking the macvlan with it
    detach(
        k,
        &p,
        Some(&Ns::Pod("/run/netns/knt-pod-d".into())),
        &restore,
    )
    .await?;
    let host = k.open(&Ns::Host).await?.context("host")?;
    let mut host = host;
    ensure!(
        host.link("knt-m0").await?.is_none(),
        "a macvlan dies with its namespace"
    );
    ensure!(
        host.link("knt-d0").await?.is_some(),
        "its parent is untouched"
    );
    Ok(())
}

/// The parent is up, as a host NIC carrying VLANs is: the kernel refuses to bring a VLAN child
/// up over a parent that is down (ENETDOWN).
async fn vlan_child(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-v")?;
    let _links = Links(vec!["knt-v0"]);
    ip(&[
        "link", "add", "knt-v0", "type", "veth", "peer", "name", "knt-v1",
    ])?;
    ip(&["link", "set", "knt-v0", "up"])?;
    let p = plan("knt-v0", AttachMode::Vlan { id: 100 });
    let restore = capture(k, &p).await?;
    let link = attach(k, &p, &Ns::Pod(pod.path()), &restore, false).await?;
    ensure!(link.kind.as_deref() == Some("vlan"));
    detach(k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
    ensure!(
        k.open(&Ns::Pod(pod.path()))
            .await?
            .context("pod")?
            .link("net1")
            .await?
            .is_none()
    );
    Ok(())
}

/// A macvlan or ipvlan child is created directly in the pod (one RTM_NEWLINK naming the parent
/// on the host and the pod's namespace), configured there like any device, and deleted on
/// detach; the parent never leaves the host.
async fn child_into_pod(k: &Rtnl, child: ChildKind) -> anyhow::Result<()> {
    let kind = match &child {
        ChildKind::Macvlan(_) => "macvlan",
        ChildKind::Ipvlan(_) => "ipvlan",
    };
    // Names of their own per kind: the trials run in parallel.
    let (parent, peer, pod_name) = match kind {
        "macvlan" => ("knt-cm0", "knt-cm1", "knt-pod-cm"),
        _ => ("knt-ci0", "knt-ci1", "knt-pod-ci"),
    };
    let pod = Netns::new(pod_name)?;
    let _links = Links(vec![parent]);
    ip(&["link", "add", parent, "type", "veth", "peer", "name", peer])?;
    ip(&["link", "set", parent, "up"])?;
    let mut p = plan(
        parent,
        AttachMode::Child {
            child,
            uplink: None,
        },
    );
    if kind == "ipvlan" {
        p.mac = None; // ipvlan children share the parent's MAC
    }
    let restore = capture(k, &p).await?;
    let link = attach(k, &p, &Ns::Pod(pod.path()), &restore, false).await?;
    ensure!(link.kind.as_deref() == Some(kind), "{link:?}");
    ensure!(link.mtu == 1400 && link.up, "{link:?}");
    if kind == "macvlan" {
        ensure!(link.mac == Some([0x02, 0, 0, 0, 0x4b, 0x10]), "{link:?}");
    } else {
        ensure!(
            link.mac == restore.host.mac,
            "ipvlan shares the parent's MAC: {link:?}"
        );
    }
    let mut host = k.open(&Ns::Host).await?.context("host")?;
    let on_host = host
        .link(parent)
        .await?
        .context("the parent left the host")?;
    ensure!(on_host.up && on_host.name == parent, "{on_host:?}");
    // A repeated hook finds it and changes nothing.
    let again = attach(k, &p, &Ns::Pod(pod.path()), &restore, false).await?;
    ensure!(again.index == link.index);
    detach(k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
    ensure!(
        k.open(&Ns::Pod(pod.path()))
            .await?
            .context("pod")?
            .link("net1")
            .await?
            .is_none(),
        "the child is gone from the pod"
    );
    ensure!(host.link(parent).await?.is_some(), "the parent stays");
    Ok(())
}

/// Two pods on VLAN 300 of one shared port, through the pod layer the NRI hooks run: one host
/// VLAN (`knv….300`) made by the first attach, each pod's macvlan on top of it, traffic from one
/// pod to the other over it, the VLAN kept while the second pod still uses it and deleted by
/// the last pod out; the port itself never leaves the host.
async fn two_pods_share_a_host_vlan(_k: &Rtnl) -> anyhow::Result<()> {
    use std::sync::Arc;

    use knic_driver::claims::ClaimStore;
    use knic_driver::claims::checkpoint::{Attachment, CheckpointStore, PreparedClaim};
    use knic_driver::netns::Uplink;
    use knic_driver::nri::{NriHandler, PodSandbox};
    use knic_driver::pods::{LogStatus, PodNetworks};

    let parent = "knt-sv0";
    let _links = Links(vec![parent]);
    ip(&[
        "link", "add", parent, "type", "veth", "peer", "name", "knt-sv1",
    ])?;
    // Both ends up: the port has carrier, as a cabled NIC does, so its VLAN and the pods'
    // macvlans on it do too.
    ip(&["link", "set", "knt-sv1", "up"])?;
    ip(&["link", "set", parent, "up"])?;
    let pods = [Netns::new("knt-pod-sva")?, Netns::new("knt-pod-svb")?];
    let dir = tempfile::tempdir()?;
    let store = Arc::new(ClaimStore::open(CheckpointStore::new(dir.path())));
    let uplink = Uplink::new(parent, 300);
    {
        let mut locked = store.lock().await;
        let mut next = locked.checkpoint()?.clone();
        for (i, pod) in pods.iter().enumerate() {
            let mut p = plan(
                parent,
                AttachMode::Child {
                    child: ChildKind::Macvlan("bridge".into()),
                    uplink: Some(uplink.clone()),
                },
            );
            p.device = format!("{parent}-s{i}");
            p.mac = Some([0x02, 0, 0, 0, 0x4c, i as u8]);
            p.addresses = vec![cidr(&format!("192.0.2.{}/24", 10 + i))];
            p.routes.clear();
            let claim = PreparedClaim {
                network_label: None,
                namespace: "ns".into(),
                name: format!("c{i}"),
                uid: format!("claim-{i}"),
                pod_uid: format!("pod-{i}"),
                pod_name: pod.0.clone(),
                devices: vec![],
                configs: vec![],
                prepared_at: 0,
                attachments: vec![Attachment::planned(p)],
                allocations: vec![],
                functions: vec![],
            };
            next.claims.insert(claim.uid.clone(), claim);
        }
        locked.save(next, true).await?;
    }
    let hooks = PodNetworks::new(Rtnl::new(None), store, Arc::new(LogStatus));
    let sandbox = |i: usize| PodSandbox {
        id: format!("sandbox-{i}"),
        name: pods[i].0.clone(),
        uid: format!("pod-{i}"),
        namespace: "ns".into(),
        netns: Some(pods[i].path()),
        ips: vec![],
    };
    let k = Rtnl::new(None);
    let vlan_on_host = || async {
        anyhow::Ok(
            host_link(&k, &uplink.name)
                .await?
                .is_some_and(|l| l.kind.as_deref() == Some("vlan") && l.up),
        )
    };
    hooks.run_pod_sandbox(sandbox(0)).await?;
    ensure!(vlan_on_host().await?, "the first pod makes the host VLAN");
    hooks.run_pod_sandbox(sandbox(1)).await?;
    for pod in &pods {
        let child = k
            .open(&Ns::Pod(pod.path()))
            .await?
            .context("pod")?
            .link("net1")
            .await?
            .context("no child in the pod")?;
        ensure!(
            child.kind.as_deref() == Some("macvlan") && child.up,
            "{child:?}"
        );
    }
    udp_echo(&pods[0].path(), &pods[1].path(), "192.0.2.11")?;
    hooks.stop_pod_sandbox(sandbox(0)).await?;
    ensure!(vlan_on_host().await?, "the second pod still uses it");
    ensure!(
        k.open(&Ns::Pod(pods[1].path()))
            .await?
            .context("pod")?
            .link("net1")
            .await?
            .is_some(),
        "the second pod's child survived the first pod's detach"
    );
    hooks.stop_pod_sandbox(sandbox(1)).await?;
    ensure!(!vlan_on_host().await?, "the last pod out deletes it");
    ensure!(host_link(&k, parent).await?.is_some(), "the port stays");
    Ok(())
}

/// A pod session's socket is made by the calling thread inside the pod's namespace, and the
/// thread is back in its own before `open` returns: the session sees the pod's links only, and
/// every thread that ran an open is still in the host's namespace.
async fn sessions_leave_the_caller_in_its_namespace(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-ns")?;
    let here = || std::fs::read_link("/proc/thread-self/ns/net");
    let host = here()?;
    for _ in 0..50 {
        let mut session = k.open(&Ns::Pod(pod.path())).await?.context("pod")?;
        ensure!(here()? == host, "the caller stayed in the pod's namespace");
        let names: Vec<String> = session.links().await?.into_iter().map(|l| l.name).collect();
        ensure!(names == ["lo"], "the session is not in the pod: {names:?}");
        let mut host_session = k.open(&Ns::Host).await?.context("host")?;
        ensure!(
            host_session.link("lo").await?.is_some() && here()? == host,
            "the host session or the caller moved"
        );
    }
    Ok(())
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let isolated = isolate();
    // In the test VM nothing is skipped for a missing kernel feature: it fails the trial there.
    let in_vm = knic_e2e::harness::in_vm();
    let unisolated = isolated
        .as_ref()
        .err()
        .map(|reason| format!("kernel executor tests: {reason}"));
    if let (Some(reason), false) = (&unisolated, in_vm) {
        eprintln!("skipped: {reason}");
    }
    let no_vlan = (!kernel_has_8021q()).then(|| "kernel has no 8021q".to_string());
    if let (Some(reason), false) = (&no_vlan, in_vm) {
        eprintln!("skipped: kernel/vlan_child_into_pod: {reason}");
        eprintln!("skipped: kernel/two_pods_share_a_host_vlan: {reason}");
    }
    let no_ipvlan = (!std::path::Path::new("/sys/module/ipvlan").exists())
        .then(|| "kernel has no ipvlan".to_string());
    if let (Some(reason), false) = (&no_ipvlan, in_vm) {
        eprintln!("skipped: kernel/ipvlan_child_into_pod: {reason}");
    }
    let no_vrf = match &unisolated {
        None => routing::vrf_missing(),
        Some(_) => None,
    };
    if let (Some(reason), false) = (&no_vrf, in_vm) {
        eprintln!("skipped: kernel/vrf_in_the_pod: {reason}");
    }
    let no_tbf = (!has_tc()).then(|| "no tc (iproute2) to read qdiscs back".to_string());
    if let (Some(reason), false) = (&no_tbf, in_vm) {
        eprintln!("skipped: kernel/egress_limit_*: {reason}");
    }
    let sriov = sriov_pf().is_some();
    if !sriov {
        eprintln!(
            "skipped: kernel/vf_settings_on_sriov_hardware: no SR-IOV PF given \
             (KNIC_TEST_SRIOV_PF unset; this kernel has no SR-IOV); VF requests are checked at \
             the message level and against the fake kernel instead"
        );
    }
    type Case = fn(
        &'static Rtnl,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>>>>;
    static KERNEL: std::sync::OnceLock<Rtnl> = std::sync::OnceLock::new();
    let k: &'static Rtnl = KERNEL.get_or_init(|| Rtnl::new(None));
    // What each trial lacks here (see `kernel_trial`), and whether it needs hardware the VM
    // cannot have either (SR-IOV), which only ever skips it.
    let cases: Vec<(&str, Case, Option<String>, bool)> = vec![
        (
            "kernel/veth_attach_detach_ipv4_ipv6_routes_mtu_mac_rename",
            |k| Box::pin(veth_attach_detach(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/requests_per_attach_detach_cycle",
            |k| Box::pin(requests::requests_per_cycle(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/a_move_onto_a_taken_index_takes_a_new_one",
            |k| Box::pin(requests::a_move_onto_a_taken_index(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/ipv4_sysctls_ride_on_the_move",
            |k| Box::pin(sysctl::ipv4_sysctls_ride_on_the_move(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/sessions_leave_the_caller_in_its_namespace",
            |k| Box::pin(sessions_leave_the_caller_in_its_namespace(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/name_clash_in_pod",
            |k| Box::pin(name_clash(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/sysctls_through_a_mounted_proc_sys_net",
            |k| Box::pin(sysctls_through_a_mounted_proc_sys_net(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/renamed_device_is_refused",
            |k| Box::pin(renamed_device_is_refused(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/failed_attach_is_undone",
            |k| Box::pin(failed_attach_is_undone(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/a_move_refused_after_the_device_moved_is_undone",
            |k| Box::pin(refused::a_move_refused_after_the_device_moved_is_undone(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/a_move_home_onto_a_taken_name_is_finished_by_the_retry",
            |k| Box::pin(refused::a_move_home_onto_a_taken_name_is_finished_by_the_retry(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/live_update_changes_routes_and_mtu_in_place",
            |k| Box::pin(live::routes_and_mtu_change_in_place(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/source_based_routing_and_rules_on_a_veth",
            |k| Box::pin(routing::source_based_routing_and_rules_on_a_veth(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/vrf_in_the_pod",
            |k| Box::pin(routing::vrf_in_the_pod(k)),
            unisolated.clone().or(no_vrf.clone()),
            false,
        ),
        (
            "kernel/namespace_deleted_before_detach",
            |k| Box::pin(namespace_deleted_before_detach(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/vlan_child_into_pod",
            |k| Box::pin(vlan_child(k)),
            unisolated.clone().or(no_vlan.clone()),
            false,
        ),
        (
            "kernel/two_pods_share_a_host_vlan",
            |k| Box::pin(two_pods_share_a_host_vlan(k)),
            unisolated.clone().or(no_vlan.clone()),
            false,
        ),
        (
            "kernel/macvlan_child_into_pod",
            |k| Box::pin(child_into_pod(k, ChildKind::Macvlan("bridge".into()))),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/ipvlan_child_into_pod",
            |k| Box::pin(child_into_pod(k, ChildKind::Ipvlan("l2".into()))),
            unisolated.clone().or(no_ipvlan),
            false,
        ),
        (
            "kernel/egress_limit_on_a_macvlan_child",
            |k| Box::pin(egress_limit_on_a_macvlan_child(k)),
            unisolated.clone().or(no_tbf.clone()),
            false,
        ),
        (
            "kernel/egress_limit_on_a_moved_veth",
            |k| Box::pin(egress_limit_on_a_moved_veth(k)),
            unisolated.clone().or(no_tbf),
            false,
        ),
        (
            "kernel/overlay_two_nodes_one_segment",
            |k| Box::pin(overlay::two_nodes_one_segment(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/ethtool_on_a_moved_veth",
            |k| Box::pin(ethtool::ethtool_on_a_moved_veth(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/static_neighbors_on_a_moved_veth",
            |k| Box::pin(link::static_neighbors_on_a_moved_veth(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/ethtool_refusals_name_device_setting_and_kernel_text",
            |k| Box::pin(ethtool::ethtool_refusals_name_device_setting_and_kernel_text(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/static_neighbors_on_a_macvlan_child",
            |k| Box::pin(link::static_neighbors_on_a_macvlan_child(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/gso_gro_sizes_on_a_moved_veth_and_a_child",
            |k| Box::pin(link::gso_gro_sizes_on_a_moved_veth_and_a_child(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/arp_nd_sysctls_land_in_the_pod",
            |k| Box::pin(link::arp_nd_sysctls_land_in_the_pod(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/vf_requests_on_a_device_without_vfs",
            |k| Box::pin(vf_requests_on_a_device_without_vfs(k)),
            unisolated.clone(),
            false,
        ),
        (
            "kernel/vf_settings_on_sriov_hardware",
            |k| Box::pin(vf_settings_on_sriov_hardware(k)),
            unisolated.clone(),
            !sriov,
        ),
    ];
    let trials = cases
        .into_iter()
        .map(|(name, case, missing, no_hardware)| {
            let trial = kernel_trial(name, missing, move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| Failed::from(e.to_string()))?;
                rt.block_on(case(k))
                    .map_err(|e| Failed::from(format!("{e:#}")))
            });
            if no_hardware {
                trial.with_ignored_flag(true)
            } else {
                trial
            }
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    if let Ok(root) = &isolated {
        knic_e2e::harness::unisolate(root);
    }
    conclusion.exit();
}
