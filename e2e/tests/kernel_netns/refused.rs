//! A move the kernel refuses after moving the device: do_setlink changes the namespace first
//! and applies MAC, MTU and name in the target, so a refused one fails the request with the
//! device already in the pod. Attach must find it there and bring it home, so the node is as
//! it was and the error is the kernel's refusal. A plan's MTU is validated (68..=65535), so
//! what reaches the kernel is an MTU the device's driver refuses: a macvlan above its lower
//! device's MTU (EINVAL). A veth below its minimum (an unvalidated plan) takes the same path.
//! The other way, a move home onto a name taken on the host lands the device there under the
//! pod's name, with its MTU and MAC, and the retried detach finishes it once the name is free.

use anyhow::{Context, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{AttachMode, AttachPlan, Kernel, Ns, Session, attach, capture, detach};
use knic_e2e::harness::{Netns, ip};

use super::{Links, attach_error, host_link, plan};

/// The pod's links other than `lo`.
async fn left_in_pod(k: &Rtnl, pod: &Netns) -> anyhow::Result<Vec<String>> {
    let mut session = k.open(&Ns::Pod(pod.path())).await?.context("pod")?;
    Ok(session
        .links()
        .await?
        .into_iter()
        .map(|l| l.name)
        .filter(|n| n != "lo")
        .collect())
}

/// Attaches `p`, which the kernel must refuse with `reason` after the move; the device must
/// be back on the host exactly as captured and the pod empty.
async fn refused_and_undone(
    k: &Rtnl,
    p: &AttachPlan,
    pod: &Netns,
    reason: &str,
) -> anyhow::Result<()> {
    let restore = capture(k, p).await?;
    let err = attach_error(k, p, pod, &restore).await?;
    ensure!(err.contains(reason), "{err}");
    let host = host_link(k, &p.host_ifname)
        .await?
        .context("the device is not back on the host")?;
    ensure!(host == restore.host, "{host:?} != {:?}", restore.host);
    let left = left_in_pod(k, pod).await?;
    ensure!(left.is_empty(), "left in the pod: {left:?}");
    Ok(())
}

pub(crate) async fn a_move_refused_after_the_device_moved_is_undone(
    k: &Rtnl,
) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-r")?;
    let _links = Links(vec!["knt-r0", "knt-v0"]);
    ip(&[
        "link", "add", "knt-r0", "type", "veth", "peer", "name", "knt-r1",
    ])?;
    ip(&[
        "link", "add", "knt-rm", "link", "knt-r0", "type", "macvlan", "mode", "bridge",
    ])?;
    ip(&["addr", "add", "198.51.100.9/24", "dev", "knt-rm"])?;
    ip(&["link", "set", "knt-rm", "up"])?;
    // Valid for a plan, above the lower device's 1500: the macvlan refuses it in the pod.
    let p = AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        mtu: Some(9000),
        ..plan("knt-rm", AttachMode::Move)
    };
    refused_and_undone(k, &p, &pod, "Invalid argument").await?;
    // Below a veth's minimum (68), as the kernel words it.
    ip(&[
        "link", "add", "knt-v0", "type", "veth", "peer", "name", "knt-v1",
    ])?;
    let p = AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        mtu: Some(60),
        ..plan("knt-v0", AttachMode::Move)
    };
    refused_and_undone(k, &p, &pod, "Invalid argument").await?;
    // And the device still attaches with a plan it can take.
    let p = plan("knt-rm", AttachMode::Move);
    let restore = capture(k, &p).await?;
    attach(k, &p, &Ns::Pod(pod.path()), &restore, false).await?;
    detach(k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
    ensure!(host_link(k, "knt-rm").await? == Some(restore.host));
    Ok(())
}

pub(crate) async fn a_move_home_onto_a_taken_name_is_finished_by_the_retry(
    k: &Rtnl,
) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-h")?;
    let _links = Links(vec!["knt-h0", "net1"]);
    ip(&[
        "link", "add", "knt-h0", "type", "veth", "peer", "name", "knt-h1",
    ])?;
    ip(&["link", "set", "knt-h0", "up"])?;
    let p = plan("knt-h0", AttachMode::Move);
    let restore = capture(k, &p).await?;
    let ns = Ns::Pod(pod.path());
    attach(k, &p, &ns, &restore, false).await?;
    // Another device takes the name on the host while the pod has this one.
    ip(&[
        "link", "add", "knt-h0", "type", "veth", "peer", "name", "knt-h2",
    ])?;
    let err = detach(k, &p, Some(&ns), &restore)
        .await
        .err()
        .context("the detach must fail")?
        .to_string();
    ensure!(err.contains("File exists"), "{err}");
    let home = host_link(k, "net1")
        .await?
        .context("the device is not on the host under the pod's name")?;
    ensure!(
        home.index == restore.host.index
            && home.mtu == restore.host.mtu
            && home.mac == restore.host.mac,
        "{home:?} vs {:?}",
        restore.host
    );
    ensure!(left_in_pod(k, &pod).await?.is_empty());
    ip(&["link", "del", "knt-h0"])?;
    detach(k, &p, Some(&ns), &restore).await?;
    let back = host_link(k, "knt-h0").await?.context("not back")?;
    ensure!(back == restore.host, "{back:?} != {:?}", restore.host);
    Ok(())
}
