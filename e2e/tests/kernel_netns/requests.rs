//! knic's netlink requests per attach + detach, counted by `Rtnl` against the real kernel:
//! the same figures as the fake's (`driver/src/netns/tests/requests.rs`), so the budget the
//! unit tests hold is the one the kernel sees.

use anyhow::{Context as _, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{AttachMode, Ns, attach, capture, detach};
use knic_e2e::harness::{Netns, in_netns, ip};

use super::{Links, cidr, host_link, plan};

/// A veth on the host, its peer in `peer_ns`.
fn veth(name: &str, peer: &str, peer_ns: &str) -> anyhow::Result<()> {
    ip(&[
        "link", "add", name, "type", "veth", "peer", "name", peer, "netns", peer_ns,
    ])?;
    Ok(())
}

/// (capture, attach, detach) requests of one cycle of `host_ifname` into `pod`.
async fn cycle(host_ifname: &str, pod: &Netns) -> anyhow::Result<[u64; 3]> {
    // A kernel of its own: other trials run at the same time on the shared one.
    let k = Rtnl::new(None);
    let p = plan(host_ifname, AttachMode::Move);
    let ns = Ns::Pod(pod.path());
    let restore = capture(&k, &p).await?;
    let captured = k.requests();
    let link = attach(&k, &p, &ns, &restore, false).await?;
    ensure!(link.up && link.addresses == p.addresses, "{link:?}");
    let attached = k.requests();
    detach(&k, &p, Some(&ns), &restore).await?;
    let detached = k.requests() - attached;
    let back = host_link(&k, host_ifname).await?;
    ensure!(
        back.as_ref() == Some(&restore.host),
        "{back:?} != {:?}",
        restore.host
    );
    Ok([captured, attached - captured, detached])
}

/// The attach bench's case (a device down on the host, without addresses): 11 requests (the
/// moves keep the device's index, so no lookup follows either move); one that is up with a
/// host address: 2 more (its address, up) to put it back.
pub(crate) async fn requests_per_cycle(_: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-r")?;
    let _peer = Netns::new("knt-peer-r")?;
    let _links = Links(vec!["knt-r0"]);
    veth("knt-r0", "knt-r1", "knt-peer-r")?;
    let counts = cycle("knt-r0", &pod).await?;
    ensure!(counts == [2, 7, 2], "capture, attach, detach: {counts:?}");

    ip(&["addr", "add", "198.51.100.7/24", "dev", "knt-r0"])?;
    ip(&["link", "set", "knt-r0", "up"])?;
    let counts = cycle("knt-r0", &pod).await?;
    ensure!(counts == [2, 7, 4], "capture, attach, detach: {counts:?}");
    let home = host_link(&Rtnl::new(None), "knt-r0").await?;
    ensure!(
        home.is_some_and(|l| l.up && l.addresses == [cidr("198.51.100.7/24")]),
        "the host address and state are back"
    );
    Ok(())
}

/// A pod whose own link has the device's ifindex: the kernel refuses the move that asks to
/// keep it (before moving anything), the device moves without under a new index, is looked
/// up in the pod, configured there, and comes home; the pod's own link is left alone. Proves
/// the refusal comes before the move on this kernel (a device moved by the refused request
/// would not be found home, and the attach would fail).
pub(crate) async fn a_move_onto_a_taken_index(_: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-x")?;
    let _peer = Netns::new("knt-peer-x")?;
    let _links = Links(vec!["knt-x0"]);
    veth("knt-x0", "knt-x1", "knt-peer-x")?;
    let k = Rtnl::new(None);
    let index = host_link(&k, "knt-x0").await?.context("knt-x0")?.index;
    let taken = index.to_string();
    ip(&[
        "-n", &pod.0, "link", "add", "knt-x9", "index", &taken, "type", "veth", "peer", "name",
        "knt-x8",
    ])?;
    let p = plan("knt-x0", AttachMode::Move);
    let ns = Ns::Pod(pod.path());
    let restore = capture(&k, &p).await?;
    let before = k.requests();
    let link = attach(&k, &p, &ns, &restore, false).await?;
    // 7, + the refused move and the host lookup that found the device still home, + the
    // pod lookup of its new index.
    ensure!(
        k.requests() - before == 10,
        "requests: {}",
        k.requests() - before
    );
    ensure!(link.index != index, "{link:?}");
    let pod_ifname = p.pod_ifname.clone();
    let in_pod = in_netns(&pod.path(), move || {
        let out = std::process::Command::new("ip")
            .args(["-o", "addr", "show", "dev", &pod_ifname])
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    })??;
    for a in &p.addresses {
        ensure!(
            in_pod.contains(&a.to_string()),
            "{a} not on {}: {in_pod}",
            p.pod_ifname
        );
    }
    let theirs = ip(&["-n", &pod.0, "-o", "addr", "show", "dev", "knt-x9"])?;
    ensure!(
        !theirs.contains("inet "),
        "the pod's own link got an address: {theirs}"
    );
    detach(&k, &p, Some(&ns), &restore).await?;
    let home = host_link(&k, "knt-x0").await?.context("knt-x0 is home")?;
    ensure!(
        home.mac == restore.host.mac && home.mtu == restore.host.mtu && home.index == index,
        "home under its own index {index}: {home:?}"
    );
    Ok(())
}
