//! The NRI connection lost and regained: fail-closed while knic cannot hear of sandboxes (no
//! container starts without its interface, new claims refused), and a runtime restart that
//! knic reconnects to.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use knic_driver::nri::runtime::TestRuntime;
use knic_e2e::driver::DriverConfig;
use knic_e2e::harness::{Netns, eventually, ip};
use knic_e2e::kubelet::DraVersion;
use serde_json::json;

use super::{Env, network_config};

/// A process in `ns` standing in for a container's first process: the runtime hands hooks its
/// pid; killed on drop.
struct ContainerProcess(std::process::Child);

impl ContainerProcess {
    fn start(ns: &Netns) -> anyhow::Result<ContainerProcess> {
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &ns.0, "sleep", "300"])
            .spawn()
            .context("starting a process in the pod namespace")?;
        Ok(ContainerProcess(child))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ContainerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Fail-closed: NRI disconnects between prepare and sandbox start, so knic never hears of the
/// sandbox. The container is still not created without its interface (the CDI hook fails),
/// new claims are refused while NRI is down, and once knic reconnects the runtime's Synchronize
/// gets the interface attached and the container's retry succeeds.
pub(crate) async fn no_container_starts_without_its_interface(env: &mut Env) -> anyhow::Result<()> {
    let c = env
        .cluster
        .create_claim_with_config(
            "fail-closed",
            Some(&[("knic.dev", &env.dev(0))]),
            Some(network_config(json!({"addresses": ["192.0.2.40/24"]}))),
        )
        .await?;
    let out = env.plugin.prepare(DraVersion::V1, &[env.id(&c)]).await?;
    ensure!(out[&c.uid].error.is_empty(), "{}", out[&c.uid].error);
    let cdi = out[&c.uid].devices[0].cdi_device_ids.clone();
    ensure!(
        cdi == [
            format!("knic.dev/interface={}-0", c.uid),
            format!("knic.dev/interface={}-meta-nic", c.uid)
        ],
        "CDI devices in the answer: {cdi:?}"
    );
    let cdi_dir = PathBuf::from(env_value(&env.config, "KNIC_CDI_DIR")?);

    // The runtime restarts; knic is not connected when the sandbox is created.
    let socket = PathBuf::from(env_value(&env.config, "KNIC_NRI_SOCKET")?);
    env.runtime.shutdown().await;
    let _ = std::fs::remove_file(&socket);
    let ns = Netns::new(&format!("knt-pf-{}", env.tag))?;
    let container = ContainerProcess::start(&ns)?;
    let created = knic_driver::nri::runtime::create_container(
        std::slice::from_ref(&cdi_dir),
        &cdi,
        "app",
        container.pid(),
    )
    .await;
    let err = created
        .err()
        .context("the container was created without its interface")?
        .to_string();
    ensure!(
        err.starts_with("OCI runtime create failed: error running createRuntime hook #0:")
            && err.contains(&format!(
                "claim {}/fail-closed: interface net1 is not configured: it is not in the pod's \
                 network namespace",
                env.cluster.namespace
            )),
        "{err}"
    );

    // While NRI is down, a new claim is refused rather than prepared for a bare pod.
    let other = env
        .cluster
        .create_claim_with_config(
            "while-down",
            Some(&[("knic.dev", &env.dev(2))]),
            Some(network_config(json!({"addresses": ["198.51.100.40/24"]}))),
        )
        .await?;
    eventually(
        "prepare refused while NRI is down",
        Duration::from_secs(10),
        || async {
            let out = env
                .plugin
                .prepare(DraVersion::V1, &[env.id(&other)])
                .await?;
            let error = out[&other.uid].error.clone();
            Ok(error
                .contains("knic is not connected to the container runtime's NRI socket")
                .then_some(error))
        },
    )
    .await?;

    // The runtime is back and lists the running sandbox: knic attaches, the retry succeeds.
    env.runtime = TestRuntime::listen(&socket).await?;
    let pod = env.pod(&c, Some(&ns));
    tokio::time::timeout(
        Duration::from_secs(20),
        env.runtime.accept(vec![pod.clone()]),
    )
    .await
    .context("no reconnect")??;
    eventually("the container starts", Duration::from_secs(10), || async {
        Ok(knic_driver::nri::runtime::create_container(
            std::slice::from_ref(&cdi_dir),
            &cdi,
            "app",
            container.pid(),
        )
        .await
        .ok())
    })
    .await?;
    ensure!(ip(&["-n", &ns.0, "addr", "show", "net1"])?.contains("192.0.2.40/24"));
    let out = env
        .plugin
        .prepare(DraVersion::V1, &[env.id(&other)])
        .await?;
    ensure!(
        out[&other.uid].error.is_empty(),
        "{}",
        out[&other.uid].error
    );

    drop(container);
    env.runtime
        .stop_pod_sandbox(&pod)
        .await
        .map_err(anyhow::Error::msg)?;
    for claim in [&c, &other] {
        let out = env
            .plugin
            .unprepare(DraVersion::V1, &[env.id(claim)])
            .await?;
        ensure!(out[&claim.uid].is_empty(), "{}", out[&claim.uid]);
    }
    let left: Vec<_> = std::fs::read_dir(&cdi_dir)?
        .flatten()
        .map(|e| e.path())
        .collect();
    ensure!(left.is_empty(), "CDI specs left after unprepare: {left:?}");
    Ok(())
}

/// The value the driver was started with for `key`.
fn env_value(config: &DriverConfig, key: &str) -> anyhow::Result<String> {
    config
        .env_value(key)
        .map(str::to_owned)
        .with_context(|| format!("{key} not set"))
}

pub(crate) async fn runtime_restart_reconnects(env: &mut Env) -> anyhow::Result<()> {
    let c = env
        .cluster
        .create_claim_with_config(
            "after-restart",
            Some(&[("knic.dev", &env.dev(2))]),
            Some(network_config(json!({
                "addresses": ["198.51.100.30/24"],
            }))),
        )
        .await?;
    ensure!(
        env.plugin.prepare(DraVersion::V1, &[env.id(&c)]).await?[&c.uid]
            .error
            .is_empty()
    );
    // containerd restarts: the connection drops, the socket comes back.
    let socket = PathBuf::from(
        env.config
            .env
            .iter()
            .find(|(k, _)| k == "KNIC_NRI_SOCKET")
            .map(|(_, v)| v.clone())
            .context("socket")?,
    );
    env.runtime.shutdown().await;
    let _ = std::fs::remove_file(&socket);
    env.runtime = TestRuntime::listen(&socket).await?;
    let registered = tokio::time::timeout(Duration::from_secs(20), env.runtime.accept(vec![]))
        .await
        .context("no reconnect")??;
    ensure!(registered.name == "knic");
    let ns = Netns::new(&format!("knt-pr-{}", env.tag))?;
    env.runtime
        .run_pod_sandbox(&env.pod(&c, Some(&ns)))
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(ip(&["-n", &ns.0, "addr", "show", "net1"])?.contains("198.51.100.30/24"));
    env.runtime
        .stop_pod_sandbox(&env.pod(&c, Some(&ns)))
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(env.plugin.unprepare(DraVersion::V1, &[env.id(&c)]).await?[&c.uid].is_empty());
    Ok(())
}
