//! ethtool settings on a real NIC driver (QEMU's 82576, Linux's igb): ring sizes, combined
//! channels, interrupt coalescing and GRO of the claim PF's netdev, moved into a pod by the
//! executor. The previous values are recorded on the host before the move, the new ones read
//! back in the pod with knic's own ethtool netlink GET (the VM has no ethtool binary), and the
//! old ones read back on the host after detach.

use std::collections::BTreeMap;

use anyhow::{Context, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{AttachMode, AttachPlan, Kernel, Ns, Session, attach, capture, detach};
use knic_e2e::harness::Netns;
use knic_proto::netconfig::{Channels, Coalesce, EthtoolSettings, Rings};

use super::rig::Machine;

fn all() -> EthtoolSettings {
    EthtoolSettings {
        features: [("rx-gro".to_owned(), true)].into(),
        rings: Some(Rings::default()),
        channels: Some(Channels::default()),
        coalesce: Some(Coalesce::default()),
    }
}

/// (rx-gro on, rx ring, tx ring, combined channels, rx-usecs) of `name` in `ns`.
async fn read(
    k: &Rtnl,
    ns: &Ns,
    name: &str,
) -> anyhow::Result<(bool, Option<u32>, Option<u32>, Option<u32>, Option<u32>)> {
    let mut s = k.open(ns).await?.context("namespace")?;
    let state = s.ethtool_state(name, &all()).await?;
    let rings = state.rings.context("rings")?;
    Ok((
        state
            .features
            .context("features")?
            .active
            .contains("rx-gro"),
        rings.rx,
        rings.tx,
        state.channels.context("channels")?.combined,
        state.coalesce.context("coalesce")?.rx_usecs,
    ))
}

pub async fn ethtool_on_a_moved_igb_port(m: Machine) -> anyhow::Result<()> {
    let pf = m.claim_pf().clone();
    // Earlier trials leave the PF with VFs (they take turns on one machine); a PF moves into a
    // pod without them, so they go first, and the count comes back afterwards.
    let vfs_before = pf.num_vfs()?;
    if vfs_before != 0 {
        pf.set_num_vfs(0)?;
    }
    let outcome = moved_igb_port(&pf).await;
    if vfs_before != 0 {
        pf.set_num_vfs(vfs_before)?;
    }
    outcome
}

async fn moved_igb_port(pf: &super::rig::Pf) -> anyhow::Result<()> {
    ensure!(pf.num_vfs()? == 0, "the claim PF still has VFs");
    let k = Rtnl::new(None);
    let pod = Netns::new("knt-pod-igb")?;
    let before = read(&k, &Ns::Host, &pf.name).await?;
    let (gro, rx, tx, combined, usecs) = before;
    let toggle = |v: Option<u32>, a: u32, b: u32| if v == Some(a) { b } else { a };
    let wanted = EthtoolSettings {
        features: [("rx-gro".to_owned(), !gro)].into(),
        rings: Some(Rings {
            rx: Some(toggle(rx, 512, 1024)),
            tx: Some(toggle(tx, 512, 1024)),
            ..Rings::default()
        }),
        channels: Some(Channels {
            combined: Some(toggle(combined, 1, 2)),
            ..Channels::default()
        }),
        coalesce: Some(Coalesce {
            rx_usecs: Some(toggle(usecs, 50, 100)),
            ..Coalesce::default()
        }),
    };
    let p = AttachPlan {
        network: None,
        from_template: false,
        pool: "vm".into(),
        device: pf.name.clone(),
        request: "nic".into(),
        host_ifname: pf.name.clone(),
        mode: AttachMode::Move,
        pod_ifname: "net1".into(),
        mtu: None,
        mac: None,
        addresses: Vec::new(),
        routes: Vec::new(),
        sysctls: BTreeMap::new(),
        identity: None,
        vf: None,
        bandwidth: None,
        ethtool: Some(wanted.clone()),
        routing: Default::default(),
        link: Default::default(),
        addressing: Default::default(),
    };
    let restore = capture(&k, &p).await?;
    let previous = restore.ethtool.clone().context("nothing recorded")?;
    ensure!(
        previous
            == EthtoolSettings {
                features: [("rx-gro".to_owned(), gro)].into(),
                rings: Some(Rings {
                    rx,
                    tx,
                    ..Rings::default()
                }),
                channels: Some(Channels {
                    combined,
                    ..Channels::default()
                }),
                coalesce: Some(Coalesce {
                    rx_usecs: usecs,
                    ..Coalesce::default()
                }),
            },
        "recorded {previous:?}, read {before:?}"
    );
    let started = std::time::Instant::now();
    let attached = attach(&k, &p, &Ns::Pod(pod.path()), &restore, false).await;
    let took = started.elapsed();
    if let Err(e) = attached {
        detach(&k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
        return Err(e.into());
    }
    let now = read(&k, &Ns::Pod(pod.path()), "net1").await?;
    let rings = wanted.rings.unwrap_or_default();
    let expected = (
        !gro,
        rings.rx,
        rings.tx,
        wanted.channels.and_then(|c| c.combined),
        wanted.coalesce.and_then(|c| c.rx_usecs),
    );
    let checked = if now == expected {
        Ok(())
    } else {
        Err(anyhow::anyhow!("in the pod {now:?}, wanted {expected:?}"))
    };
    detach(&k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
    checked?;
    let back = read(&k, &Ns::Host, &pf.name).await?;
    ensure!(back == before, "home {back:?}, before {before:?}");
    eprintln!(
        "igb {}: {before:?} -> {now:?} in {took:?} (attach with ethtool), back {back:?}",
        pf.name
    );
    Ok(())
}
