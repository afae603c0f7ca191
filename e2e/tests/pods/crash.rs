//! Crash safety: the driver killed at failpoints mid-attach and mid-detach, and by `kill -9`
//! after an attach, converges on restart.

use std::time::Duration;

use anyhow::{Context, ensure};
use knic_driver::nri::PodSandbox;
use knic_e2e::driver::DriverProcess;
use knic_e2e::harness::{Netns, eventually, ip, udp_echo};
use knic_e2e::kubelet::{self, DraVersion};
use serde_json::json;

use super::{Env, host_link, network_config};

impl Env {
    /// Replaces the running driver (SIGTERM, or already dead) with a new one, optionally armed
    /// with a failpoint, and lets the runtime accept it with `pods` in Synchronize.
    pub(crate) async fn restart_driver(
        &mut self,
        failpoint: Option<&str>,
        pods: Vec<PodSandbox>,
    ) -> anyhow::Result<()> {
        if self.driver.is_running() {
            self.driver.terminate().await?;
        }
        let config = match failpoint {
            Some(f) => self.config.clone().with_env("KNIC_FAILPOINT", f),
            None => self.config.clone(),
        };
        self.driver = DriverProcess::start(&config)?;
        tokio::time::timeout(Duration::from_secs(20), self.runtime.accept(pods))
            .await
            .context("the restarted driver never connected to NRI")??;
        self.plugin = kubelet::register(&self.config.registry_dir).await?;
        Ok(())
    }
}

/// `kill -9` (an abort at a failpoint) after the checkpoint, mid-attach and mid-detach, each
/// followed by a restart: Synchronize plus the checkpoint converge, no interface is lost, nothing
/// is attached twice, and the host gets back its address and state. `attach:after-checkpoint`
/// fires once per pod, after the one durable write that records all its devices; after
/// `attach:after-move` the "attached" mark was never written (it is only noted in memory), so
/// the restart must find the device in the pod and finish it, not trust or repeat the move.
pub(crate) async fn crash_at_every_step_converges(env: &mut Env) -> anyhow::Result<()> {
    ip(&["addr", "add", "192.0.2.99/32", "dev", &env.dev(0)])?;
    let before = (
        host_link(&env.dev(0))?,
        ip(&["-o", "addr", "show", "dev", &env.dev(0), "scope", "global"])?,
    );
    for (round, failpoint) in ["attach:after-checkpoint", "attach:after-move"]
        .into_iter()
        .enumerate()
    {
        let name = format!("crash-{round}");
        let c = env
            .cluster
            .create_claim_with_config(
                &name,
                Some(&[("knic.dev", &env.dev(0))]),
                Some(network_config(json!({
                    "addresses": ["192.0.2.10/24"],
                    "routes": [{"destination": "203.0.113.0/24", "gateway": "192.0.2.1"}],
                }))),
            )
            .await?;
        ensure!(
            env.plugin.prepare(DraVersion::V1, &[env.id(&c)]).await?[&c.uid]
                .error
                .is_empty()
        );
        let ns = Netns::new(&format!("knt-pk{round}-{}", env.tag))?;
        let pod = env.pod(&c, Some(&ns));

        // The driver dies mid-attach: the runtime's call fails.
        env.restart_driver(Some(failpoint), vec![]).await?;
        ensure!(
            env.runtime.run_pod_sandbox(&pod).await.is_err(),
            "{failpoint}: the hook must not succeed"
        );
        eventually("driver aborted", Duration::from_secs(5), || {
            let running = env.driver.is_running();
            async move { Ok((!running).then_some(())) }
        })
        .await?;

        // Restart: Synchronize reports the running pod; the attach resumes and completes.
        env.restart_driver(None, vec![pod.clone()]).await?;
        let addr = ip(&["-n", &ns.0, "addr", "show", "net1"])
            .with_context(|| format!("{failpoint}: net1 missing"))?;
        ensure!(
            addr.contains("192.0.2.10/24") && addr.contains("UP"),
            "{failpoint}: {addr}"
        );
        ensure!(
            ip(&["-n", &ns.0, "route", "show", "203.0.113.0/24"])?.contains("via 192.0.2.1"),
            "{failpoint}: route"
        );
        udp_echo(&ns.path(), &env.peer.path(), "192.0.2.1")?;
        // The runtime repeating RunPodSandbox must not attach twice.
        env.runtime
            .run_pod_sandbox(&pod)
            .await
            .map_err(anyhow::Error::msg)?;
        ensure!(
            ip(&["-n", &ns.0, "-o", "link"])?.lines().count() == 2,
            "lo and net1 only"
        );
        // kill -9 with the attach finished: its "attached" mark was only in memory, so the
        // restart finds a recorded, unmarked device, checks the kernel and leaves it as it is.
        env.driver.kill9().await?;
        env.restart_driver(None, vec![pod.clone()]).await?;
        let addr = ip(&["-n", &ns.0, "addr", "show", "net1"])
            .with_context(|| format!("{failpoint}: net1 missing after kill -9"))?;
        ensure!(
            addr.contains("192.0.2.10/24") && addr.contains("UP"),
            "{failpoint}, after kill -9: {addr}"
        );
        ensure!(
            ip(&["-n", &ns.0, "route", "show", "203.0.113.0/24"])?.contains("via 192.0.2.1"),
            "{failpoint}, after kill -9: route"
        );
        ensure!(
            ip(&["-n", &ns.0, "-o", "link"])?.lines().count() == 2,
            "{failpoint}, after kill -9: lo and net1 only"
        );

        // The driver dies mid-detach: the device is back on the host but not yet restored.
        env.restart_driver(Some("detach:after-move"), vec![pod.clone()])
            .await?;
        let stopped = env.runtime.stop_pod_sandbox(&pod).await;
        ensure!(stopped.is_err(), "detach must be cut short: {stopped:?}");
        eventually("driver aborted", Duration::from_secs(5), || {
            let running = env.driver.is_running();
            async move { Ok((!running).then_some(())) }
        })
        .await?;
        // Restart with the pod gone: Synchronize puts the node back.
        env.restart_driver(None, vec![]).await?;
        let after = (
            host_link(&env.dev(0))?,
            ip(&["-o", "addr", "show", "dev", &env.dev(0), "scope", "global"])?,
        );
        ensure!(
            after == before,
            "{failpoint}: host not restored\nbefore {before:?}\nafter  {after:?}"
        );
        let out = env.plugin.unprepare(DraVersion::V1, &[env.id(&c)]).await?;
        ensure!(out[&c.uid].is_empty(), "{}", out[&c.uid]);
    }
    Ok(())
}
