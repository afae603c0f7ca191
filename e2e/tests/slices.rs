//! ResourceSlice publishing end to end: the real `knic-driver` discovers a captured sysfs tree
//! and publishes it to the API (fake in CI, a real cluster with `KNIC_E2E_KUBECONFIG`), keeps
//! it published across kubelet wipes and restarts with the fewest writes, and keeps a prepared
//! device published while it is gone from the host, and publishes a device with an over-long
//! `pci.ids` name shortened instead of losing the slice (the real apiserver refuses it whole).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::ResourceSlice;
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::driver::{DriverConfig, DriverProcess, fixture_tree};
use knic_e2e::harness::{ScenarioEnv, eventually, scenario_trials};
use knic_e2e::kubelet::{self, ClaimId, DraVersion};

const PF: &str = "pci-0000-a2-00-0";
const VF0: &str = "pci-0000-a2-01-0";
const VF1: &str = "pci-0000-a2-01-1";

struct Env {
    cluster: Cluster,
    config: DriverConfig,
    driver: DriverProcess,
    root: PathBuf,
    node_uid: String,
}

impl ScenarioEnv for Env {
    async fn setup(real: Option<RealCluster>, test: String) -> anyhow::Result<Env> {
        setup(real, &test).await
    }

    async fn finish(self, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
        let cleanup = self.cluster.cleanup().await;
        match outcome {
            Ok(()) => cleanup,
            Err(e) => anyhow::bail!("{e:#}\n--- driver log ---\n{}", self.driver.logs()),
        }
    }
}

async fn setup(real: Option<RealCluster>, test: &str) -> anyhow::Result<Env> {
    let cluster = match &real {
        Some(r) => Cluster::real(r, test).await?,
        None => Cluster::fake(test).await?,
    };
    let node_uid = cluster.ensure_node().await?;
    let root = cluster.tmp.path().join("sysfs-root");
    fixture_tree("intel-e810-pf-with-vfs.derived.txt", &root)?;
    let config = DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig)
        .with_env("KNIC_SYSFS_ROOT", root.to_string_lossy())
        .with_env("KNIC_RESCAN_SECONDS", "1");
    let driver = DriverProcess::start(&config)?;
    Ok(Env {
        cluster,
        config,
        driver,
        root,
        node_uid,
    })
}

fn device_names(slices: &[ResourceSlice]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| d.name.clone())
        .collect()
}

async fn published(env: &Env, want: &[&str]) -> anyhow::Result<Vec<ResourceSlice>> {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    eventually(
        "slices publish the expected devices",
        Duration::from_secs(20),
        || async {
            let slices = env.cluster.slices().await?;
            // The whole pool: the publisher creates its slices one request at a time, so the
            // device slice can be there before the counter slice.
            let complete = slices
                .iter()
                .all(|s| s.spec.pool.resource_slice_count == slices.len() as i64);
            Ok((complete && device_names(&slices) == want).then_some(slices))
        },
    )
    .await
}

async fn publish_fixture(env: &mut Env) -> anyhow::Result<()> {
    let slices = published(env, &[PF, VF0, VF1]).await?;
    // The devices, then the PF's budget as a counter slice (see tests/pf_budgets.rs).
    ensure!(slices.len() == 2, "{} slices", slices.len());
    ensure!(slices[1].spec.devices.is_none() && slices[1].spec.shared_counters.is_some());
    let s = &slices[0];
    ensure!(
        s.spec.driver == "knic.dev"
            && s.spec.node_name.as_deref() == Some(env.cluster.node.as_str())
    );
    ensure!(s.spec.pool.name == env.cluster.node && s.spec.pool.resource_slice_count == 2);
    ensure!(
        s.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with(&format!("00000-knic.dev-{}-", env.cluster.node)))
    );
    let owner = &s.metadata.owner_references.as_ref().context("no owner")?[0];
    ensure!(
        owner.kind == "Node" && owner.uid == env.node_uid && owner.controller == Some(true),
        "{owner:?}"
    );
    let vf1 = s
        .spec
        .devices
        .iter()
        .flatten()
        .find(|d| d.name == VF1)
        .context("vf1")?;
    let attrs = vf1.attributes.as_ref().context("attributes")?;
    ensure!(attrs["kind"].string.as_deref() == Some("vf"));
    ensure!(attrs["vfIndex"].int == Some(1));
    ensure!(attrs["pfName"].string.as_deref() == Some("enp162s0f0np0"));
    ensure!(attrs["resource.kubernetes.io/pciBusID"].string.as_deref() == Some("0000:a2:01.1"));
    Ok(())
}

async fn republish_after_kubelet_wipe(env: &mut Env) -> anyhow::Result<()> {
    let before = published(env, &[PF, VF0, VF1]).await?;
    env.cluster.wipe_slices().await?;
    let after = published(env, &[PF, VF0, VF1]).await?;
    ensure!(
        before[0].metadata.uid != after[0].metadata.uid,
        "the slice must be a new object"
    );
    Ok(())
}

async fn restart_writes_nothing(env: &mut Env) -> anyhow::Result<()> {
    let before = published(env, &[PF, VF0, VF1]).await?;
    // Let the first publish settle, then restart: an unchanged node must cost no writes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let writes = env.cluster.slice_writes();
    env.driver.terminate().await?;
    env.driver = DriverProcess::start(&env.config)?;
    kubelet::register(&env.config.registry_dir).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        env.cluster.slice_writes() == writes,
        "restart wrote {} times",
        env.cluster.slice_writes() - writes
    );
    let after = env.cluster.slices().await?;
    ensure!(after == before, "slices changed across a restart");
    Ok(())
}

/// A 71-byte (64-character) `pci.ids` name for the PF: the slice still goes through, with the
/// name shortened by rule (slices::limits); against a real apiserver, the unshortened value is
/// shown to be refused, so the rule is the apiserver's and not a guess.
async fn oversized_facts_keep_the_slice(env: &mut Env) -> anyhow::Result<()> {
    const LONG: &str = "Ethernet Controller E810-C für QSFP — 100 GbE Dual-Port, Ünïcödé";
    const SHORT: &str = "Ethernet Controller E810-C für QSFP — 100 GbE Dual-Port,…";
    ensure!(LONG.len() == 71 && LONG.chars().count() == 64);
    let id = std::fs::read_to_string(env.root.join("sys/bus/pci/devices/0000:a2:00.0/device"))?;
    let id = id.trim().trim_start_matches("0x");
    let ids = env.root.join("usr/share/misc/pci.ids");
    std::fs::create_dir_all(ids.parent().context("parent")?)?;
    std::fs::write(&ids, format!("8086  Intel Corporation\n\t{id}  {LONG}\n"))?;
    env.driver.terminate().await?;
    env.driver = DriverProcess::start(&env.config)?;
    let slices = eventually(
        "the PF published with its shortened name",
        Duration::from_secs(20),
        || async {
            let slices = env.cluster.slices().await?;
            let name = slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .find(|d| d.name == PF)
                .and_then(|d| d.attributes.as_ref()?.get("deviceName")?.string.clone());
            Ok((name.as_deref() == Some(SHORT)).then_some(slices))
        },
    )
    .await?;
    ensure!(
        device_names(&slices) == [PF, VF0, VF1],
        "{:?}",
        device_names(&slices)
    );
    ensure!(
        env.driver.logs().contains("shortened"),
        "no log line says what was shortened:\n{}",
        env.driver.logs()
    );
    if env.cluster.real.is_some() {
        // The same slice with the name as pci.ids has it: the apiserver refuses it whole.
        let mut raw = slices[0].clone();
        raw.metadata = kube::api::ObjectMeta {
            name: Some(format!("{}-oversized", env.cluster.namespace)),
            ..Default::default()
        };
        raw.spec.pool.name = format!("{}-oversized", env.cluster.namespace);
        raw.spec.node_name = None;
        raw.spec.all_nodes = Some(true);
        for d in raw.spec.devices.iter_mut().flatten() {
            if let Some(a) = d.attributes.as_mut().and_then(|a| a.get_mut("deviceName")) {
                a.string = Some(LONG.into());
            }
        }
        let api: kube::Api<ResourceSlice> = kube::Api::all(env.cluster.client.clone());
        match api.create(&Default::default(), &raw).await {
            Err(kube::Error::Api(e)) if e.code == 422 => {
                println!(
                    "the real apiserver refuses the unshortened name: {}",
                    e.message
                );
                ensure!(
                    e.message
                        .contains("deviceName].string: Too long: may not be more than 64 bytes"),
                    "{}",
                    e.message
                );
            }
            Ok(_) => {
                let _ = api
                    .delete(
                        raw.metadata.name.as_deref().unwrap_or_default(),
                        &Default::default(),
                    )
                    .await;
                anyhow::bail!("the real apiserver took a 71-byte attribute value");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

async fn prepared_device_stays_published(env: &mut Env) -> anyhow::Result<()> {
    published(env, &[PF, VF0, VF1]).await?;
    let plugin = kubelet::register(&env.config.registry_dir).await?;
    let claim = env
        .cluster
        .create_claim("vf", Some(&[("knic.dev", VF1)]))
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
    // The VF vanishes from the host (its netdev went to the pod, the function was reset...).
    for p in [
        "sys/class/net/enp162s0f0v1",
        "sys/bus/pci/devices/0000:a2:01.1",
        "sys/bus/pci/drivers/iavf/0000:a2:01.1",
    ] {
        std::fs::remove_file(env.root.join(p))?;
    }
    std::fs::remove_dir_all(env.root.join("sys/devices/pci0000:a2/0000:a2:01.1"))?;
    // Several rescans later it is still published, from the checkpoint's copy.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let slices = published(env, &[PF, VF0, VF1]).await?;
    let vf1 = slices[0]
        .spec
        .devices
        .iter()
        .flatten()
        .find(|d| d.name == VF1)
        .context("vf1")?;
    ensure!(
        vf1.attributes
            .as_ref()
            .is_some_and(|a| a["vfIndex"].int == Some(1)),
        "{vf1:?}"
    );
    // Once unprepared and still gone, it is withdrawn.
    let out = plugin.unprepare(DraVersion::V1, &[id]).await?;
    ensure!(out[&claim.uid].is_empty());
    published(env, &[PF, VF0]).await?;
    Ok(())
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let trials = scenario_trials::<Env>(&knic_e2e::scenarios![
        publish_fixture,
        republish_after_kubelet_wipe,
        restart_writes_nothing,
        prepared_device_stays_published,
        oversized_facts_keep_the_slice,
    ]);
    libtest_mimic::run(&args, trials).exit();
}
