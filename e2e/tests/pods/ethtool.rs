//! ethtool settings through the real driver, killed (an abort at a failpoint, as abrupt as
//! `kill -9`) right after it tuned the device in the pod and before the link went up: the
//! restarted driver finishes the attach from its checkpoint, and the pod's stop puts back the
//! values the checkpoint recorded before the change. Read with knic's own ethtool netlink GET.

use std::time::Duration;

use anyhow::{Context, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{Kernel, Ns, Session};
use knic_e2e::harness::{Netns, eventually};
use knic_e2e::kubelet::DraVersion;
use knic_proto::netconfig::EthtoolSettings;
use serde_json::json;

use super::{Env, network_config};

/// (rx-gro on, tx-tcp-segmentation on) of `name` in `ns`.
async fn gro_tso(ns: &Ns, name: &str) -> anyhow::Result<(bool, bool)> {
    let asked = EthtoolSettings {
        features: [("rx-gro".to_owned(), true)].into(),
        ..EthtoolSettings::default()
    };
    let k = Rtnl::new(None);
    let mut s = k.open(ns).await?.context("namespace")?;
    let f = s
        .ethtool_state(name, &asked)
        .await?
        .features
        .context("features")?;
    Ok((
        f.active.contains("rx-gro"),
        f.active.contains("tx-tcp-segmentation"),
    ))
}

pub(crate) async fn ethtool_crash_after_apply_is_finished_and_restored(
    env: &mut Env,
) -> anyhow::Result<()> {
    let before = gro_tso(&Ns::Host, &env.dev(0)).await?;
    ensure!(before == (false, true), "a fresh veth: {before:?}");
    let c = env
        .cluster
        .create_claim_with_config(
            "tuned",
            Some(&[("knic.dev", &env.dev(0))]),
            Some(network_config(json!({
                "addresses": ["192.0.2.10/24"],
                "ethtool": {"features": {"gro": true, "tso": false}},
            }))),
        )
        .await?;
    ensure!(
        env.plugin.prepare(DraVersion::V1, &[env.id(&c)]).await?[&c.uid]
            .error
            .is_empty()
    );
    let ns = Netns::new(&format!("knt-pe-{}", env.tag))?;
    let pod = env.pod(&c, Some(&ns));
    env.restart_driver(Some("attach:after-ethtool"), vec![])
        .await?;
    ensure!(
        env.runtime.run_pod_sandbox(&pod).await.is_err(),
        "the hook must not succeed"
    );
    eventually("driver aborted", Duration::from_secs(5), || {
        let running = env.driver.is_running();
        async move { Ok((!running).then_some(())) }
    })
    .await?;
    // Tuned in the pod, but not up: the driver died right there.
    let pod_ns = Ns::Pod(ns.path());
    ensure!(gro_tso(&pod_ns, "net1").await? == (true, false), "tuned");

    // Restart: the attach resumes (tuning again changes nothing) and completes.
    env.restart_driver(None, vec![pod.clone()]).await?;
    let addr = knic_e2e::harness::ip(&["-n", &ns.0, "addr", "show", "net1"])?;
    ensure!(
        addr.contains("192.0.2.10/24") && addr.contains("UP"),
        "{addr}"
    );
    ensure!(
        gro_tso(&pod_ns, "net1").await? == (true, false),
        "still tuned"
    );

    // The pod stops: the device comes home with the recorded values.
    env.runtime
        .stop_pod_sandbox(&pod)
        .await
        .map_err(anyhow::Error::msg)?;
    let after = gro_tso(&Ns::Host, &env.dev(0)).await?;
    ensure!(after == before, "home {after:?}, before {before:?}");
    let out = env.plugin.unprepare(DraVersion::V1, &[env.id(&c)]).await?;
    ensure!(out[&c.uid].is_empty(), "{}", out[&c.uid]);
    Ok(())
}
