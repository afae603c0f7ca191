//! SR-IOV VF provisioning end to end: the real `knic-driver` with `--sriov-policy` writes
//! `sriov_numvfs` (and driver bindings) into a sysfs fixture tree whose simulated kernel
//! ([`FixtureKernel::serve`]) answers like a live one, then publishes the VFs; it never takes
//! VFs from a prepared claim, and a bad policy stops it at start with the rule.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use knic_driver::sriov::fixture::{FixtureKernel, Serving};
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::driver::{DriverConfig, DriverProcess, fixture_tree};
use knic_e2e::harness::{ScenarioEnv, eventually, scenario_trials};
use knic_e2e::kubelet::{self, ClaimId, DraVersion};

const PF: &str = "pci-0000-a2-00-0";
const PF_DIR: &str = "sys/devices/pci0000:a2/0000:a2:00.0";

fn vf(n: u32) -> String {
    format!("pci-0000-a2-01-{n}")
}

struct Env {
    cluster: Cluster,
    config: DriverConfig,
    driver: Option<DriverProcess>,
    root: PathBuf,
    policy: PathBuf,
    _kernel: Serving,
}

impl ScenarioEnv for Env {
    async fn setup(real: Option<RealCluster>, test: String) -> anyhow::Result<Env> {
        let cluster = match &real {
            Some(r) => Cluster::real(r, &test).await?,
            None => Cluster::fake(&test).await?,
        };
        cluster.ensure_node().await?;
        let root = cluster.tmp.path().join("sysfs-root");
        fixture_tree("intel-e810-pf-with-vfs.derived.txt", &root)?;
        std::fs::create_dir_all(root.join("sys/bus/pci/drivers/vfio-pci"))?;
        let kernel = Arc::new(FixtureKernel::new(&root, "iavf")?).serve()?;
        let policy = cluster.tmp.path().join("sriov-policy.yaml");
        let config = DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig)
            .with_env("KNIC_SYSFS_ROOT", root.to_string_lossy())
            .with_env("KNIC_RESCAN_SECONDS", "1")
            .with_env("KNIC_SRIOV_POLICY", policy.to_string_lossy());
        Ok(Env {
            cluster,
            config,
            driver: None,
            root,
            policy,
            _kernel: kernel,
        })
    }

    async fn finish(self, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
        let cleanup = self.cluster.cleanup().await;
        match outcome {
            Ok(()) => cleanup,
            Err(e) => anyhow::bail!(
                "{e:#}\n--- driver log ---\n{}",
                self.driver
                    .as_ref()
                    .map(DriverProcess::logs)
                    .unwrap_or_default()
            ),
        }
    }
}

impl Env {
    fn start(&mut self, policy: &str) -> anyhow::Result<()> {
        std::fs::write(&self.policy, policy)?;
        self.driver = Some(DriverProcess::start(&self.config)?);
        Ok(())
    }

    fn numvfs(&self) -> anyhow::Result<String> {
        Ok(
            std::fs::read_to_string(self.root.join(PF_DIR).join("sriov_numvfs"))?
                .trim()
                .to_owned(),
        )
    }

    async fn published(&self, want: &[String]) -> anyhow::Result<()> {
        eventually(
            "slices publish the expected devices",
            Duration::from_secs(20),
            || async {
                let slices = self.cluster.slices().await?;
                let names: Vec<String> = slices
                    .iter()
                    .flat_map(|s| s.spec.devices.iter().flatten())
                    .map(|d| d.name.clone())
                    .collect();
                Ok((names == want).then_some(()))
            },
        )
        .await
    }

    fn logs(&self) -> String {
        self.driver
            .as_ref()
            .map(DriverProcess::logs)
            .unwrap_or_default()
    }
}

async fn policy_creates_vfs_before_the_first_publish(env: &mut Env) -> anyhow::Result<()> {
    env.start("pools:\n  - name: fabric\n    pfNames: [\"enp162s0f0*\"]\n    numVfs: 4\n")?;
    let want: Vec<String> = std::iter::once(PF.to_owned())
        .chain((0..4).map(vf))
        .collect();
    env.published(&want).await?;
    ensure!(env.numvfs()? == "4", "sriov_numvfs {}", env.numvfs()?);
    // Every device of the pool says so, for DeviceClasses selecting by pool.
    let slices = env.cluster.slices().await?;
    for device in slices.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
        let pool = device
            .attributes
            .as_ref()
            .and_then(|a| a.get("sriovPool"))
            .and_then(|a| a.string.as_deref());
        ensure!(
            pool == Some("fabric"),
            "{}: sriovPool {pool:?}",
            device.name
        );
    }
    // The first publish already had them: the slices were created once, never rewritten.
    if let Some(fake) = &env.cluster.fake {
        let writes: Vec<String> = fake
            .requests()
            .iter()
            .filter(|r| r.path.contains("/resourceslices") && r.method != "GET")
            .map(|r| r.method.clone())
            .collect();
        let slices = env.cluster.slices().await?.len();
        ensure!(
            writes.len() == slices && writes.iter().all(|m| m == "POST"),
            "slice writes {writes:?} for {slices} slices; the first publish must have the VFs"
        );
    }
    Ok(())
}

async fn policy_binds_vfs_to_vfio_pci(env: &mut Env) -> anyhow::Result<()> {
    env.start("pools: [{pciIds: [\"8086:159b\"], numVfs: 2, vfDriver: vfio-pci}]")?;
    let want = [PF.to_owned(), vf(0), vf(1)];
    env.published(&want).await?;
    eventually("VFs bound to vfio-pci", Duration::from_secs(20), || async {
        let slices = env.cluster.slices().await?;
        let drivers: Vec<Option<String>> = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .filter(|d| d.name != PF)
            .map(|d| {
                d.attributes
                    .as_ref()
                    .and_then(|a| a.get("driver"))
                    .and_then(|a| a.string.clone())
            })
            .collect();
        Ok((drivers == [Some("vfio-pci".to_owned()), Some("vfio-pci".to_owned())]).then_some(()))
    })
    .await
}

async fn prepared_vfs_are_never_taken(env: &mut Env) -> anyhow::Result<()> {
    // No change wanted at first: the two VFs stay and one is prepared.
    env.start("pools: [{pfNames: [\"enp162s0f0np0\"], numVfs: 2}]")?;
    env.published(&[PF.to_owned(), vf(0), vf(1)]).await?;
    let plugin = kubelet::register(&env.config.registry_dir).await?;
    let claim = env
        .cluster
        .create_claim("vf", Some(&[("knic.dev", vf(1).as_str())]))
        .await?;
    let id = ClaimId {
        namespace: env.cluster.namespace.clone(),
        name: claim.name.clone(),
        uid: claim.uid.clone(),
    };
    let out = plugin
        .prepare(DraVersion::V1, std::slice::from_ref(&id))
        .await?;
    ensure!(out[&claim.uid].error.is_empty(), "{:?}", out[&claim.uid]);
    // The admin shrinks the pool; the driver restarts with the new policy.
    env.driver.as_mut().context("driver")?.terminate().await?;
    env.start("pools: [{pfNames: [\"enp162s0f0np0\"], numVfs: 1}]")?;
    let refusal = format!(
        "SR-IOV PF enp162s0f0np0 (0000:a2:00.0): numVfs 1 wanted, but it or its VFs are prepared \
         for claims {}/{}",
        env.cluster.namespace, claim.name
    );
    eventually("the refusal is logged", Duration::from_secs(20), || async {
        let logs = env.logs();
        Ok(log_values(&logs, "error")
            .iter()
            .any(|e| e.starts_with(&refusal))
            .then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(env.numvfs()? == "2", "a prepared VF was destroyed");
    // Released: the next rescan applies the policy.
    let plugin = kubelet::register(&env.config.registry_dir).await?;
    let out = plugin.unprepare(DraVersion::V1, &[id]).await?;
    ensure!(out[&claim.uid].is_empty(), "{out:?}");
    env.published(&[PF.to_owned(), vf(0)]).await?;
    ensure!(env.numvfs()? == "1");
    Ok(())
}

async fn a_bad_policy_stops_the_driver_at_start(env: &mut Env) -> anyhow::Result<()> {
    env.start("pools: [{pfNames: [\"enp*\"], numVfs: 1, vfDriver: igb_uio}]")?;
    let driver = env.driver.as_mut().context("driver")?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while driver.is_running() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the driver still runs with a bad policy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let want = format!(
        "invalid setting --sriov-policy/KNIC_SRIOV_POLICY: sriov policy {}: pools[0].vfDriver \
         \"igb_uio\": must be netdev or vfio-pci",
        env.policy.display()
    );
    // The fatal error goes out as the `error` field of "stopped by an error" (the shared log
    // setup, `knic_proto::logging`).
    let logs = env.logs();
    ensure!(
        log_values(&logs, "error").contains(&want),
        "no {want:?} in\n{logs}"
    );
    ensure!(env.numvfs()? == "2", "nothing may change");
    Ok(())
}

/// The values of `key` in the driver's JSON log lines.
fn log_values(logs: &str, key: &str) -> Vec<String> {
    logs.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get(key).and_then(|m| m.as_str()).map(str::to_owned))
        .collect()
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let trials = scenario_trials::<Env>(&knic_e2e::scenarios![
        policy_creates_vfs_before_the_first_publish,
        policy_binds_vfs_to_vfio_pci,
        prepared_vfs_are_never_taken,
        a_bad_policy_stops_the_driver_at_start,
    ]);
    libtest_mimic::run(&args, trials).exit();
}
