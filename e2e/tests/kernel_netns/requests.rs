//! knic's netlink requests per attach + detach, counted by `Rtnl` against the real kernel:
//! the same figures as the fake's (`driver/src/netns/tests/requests.rs`), so the budget the
//! unit tests hold is the one the kernel sees.

use anyhow::ensure;
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{AttachMode, Ns, attach, capture, detach};
use knic_e2e::harness::{Netns, ip};

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

/// The attach bench's case (a device down on the host, without addresses): 12 requests; one
/// that is up with a host address: 3 more (its lookup and address, up) to put it back.
pub(crate) async fn requests_per_cycle(_: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-r")?;
    let _peer = Netns::new("knt-peer-r")?;
    let _links = Links(vec!["knt-r0"]);
    veth("knt-r0", "knt-r1", "knt-peer-r")?;
    let counts = cycle("knt-r0", &pod).await?;
    ensure!(counts == [2, 8, 2], "capture, attach, detach: {counts:?}");

    ip(&["addr", "add", "198.51.100.7/24", "dev", "knt-r0"])?;
    ip(&["link", "set", "knt-r0", "up"])?;
    let counts = cycle("knt-r0", &pod).await?;
    ensure!(counts == [2, 8, 5], "capture, attach, detach: {counts:?}");
    let home = host_link(&Rtnl::new(None), "knt-r0").await?;
    ensure!(
        home.is_some_and(|l| l.up && l.addresses == [cidr("198.51.100.7/24")]),
        "the host address and state are back"
    );
    Ok(())
}
