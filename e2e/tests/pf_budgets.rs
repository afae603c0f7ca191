//! PF budgets end to end: the real `knic-driver` on a captured tree with an SR-IOV PF and two VFs
//! publishes the PF's budget as a counter slice that the PF and its VFs consume, which a strict
//! apiserver accepts; against an apiserver with `DRAPartitionableDevices` off (the fake's gate
//! switch) it ends with plain devices and no counter slice, and stops writing.

use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::driver::{DriverConfig, DriverProcess, fixture_tree};
use knic_e2e::gates::{Needs, PARTITIONABLE};
use knic_e2e::harness::{ScenarioEnv, eventually, scenario_trials};

const PF: &str = "pci-0000-a2-00-0";
const VF0: &str = "pci-0000-a2-01-0";
const VF1: &str = "pci-0000-a2-01-1";
const SET: &str = "pf-0000-a2-00-0";
const GATE_WARNING: &str =
    "DRAPartitionableDevices is off: publishing plain devices without PF budgets";

struct Env {
    cluster: Cluster,
    config: DriverConfig,
    driver: Option<DriverProcess>,
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
        let config = DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig)
            .with_env("KNIC_SYSFS_ROOT", root.to_string_lossy())
            .with_env("KNIC_RESCAN_SECONDS", "1");
        Ok(Env {
            cluster,
            config,
            driver: None,
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
    fn start(&mut self) -> anyhow::Result<()> {
        self.driver = Some(DriverProcess::start(&self.config)?);
        Ok(())
    }

    fn logs(&self) -> String {
        self.driver
            .as_ref()
            .map(DriverProcess::logs)
            .unwrap_or_default()
    }

    /// The pool once it has `slices` slices, all of one generation, with the fixture's devices.
    async fn pool(&self, slices: usize) -> anyhow::Result<Vec<ResourceSlice>> {
        eventually("the pool is published", Duration::from_secs(20), || async {
            let pool = self.cluster.slices().await?;
            let names: Vec<&str> = pool
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .map(|d| d.name.as_str())
                .collect();
            let complete = pool.len() == slices
                && pool
                    .iter()
                    .all(|s| s.spec.pool.resource_slice_count == slices as i64)
                && names == [PF, VF0, VF1];
            Ok(complete.then_some(pool))
        })
        .await
    }

    /// Fails if the driver writes slices during `quiet` after a settling pause.
    async fn no_more_writes(&self) -> anyhow::Result<()> {
        self.cluster.no_more_slice_writes().await
    }
}

fn consumes(device: &Device) -> Option<(String, String)> {
    let c = device.consumes_counters.as_ref()?;
    let first = c.first()?;
    Some((
        first.counter_set.clone(),
        first.counters.get("vfs")?.value.0.clone(),
    ))
}

fn plain_pool(pool: &[ResourceSlice]) -> anyhow::Result<()> {
    ensure!(pool.len() == 1, "{} slices", pool.len());
    ensure!(
        pool[0].spec.shared_counters.is_none(),
        "a counter set was stored"
    );
    for d in pool[0].spec.devices.iter().flatten() {
        ensure!(
            d.consumes_counters.is_none(),
            "{} consumes counters",
            d.name
        );
    }
    Ok(())
}

async fn budgets_published_as_counters(env: &mut Env) -> anyhow::Result<()> {
    env.start()?;
    let pool = env.pool(2).await?;
    let (devices, counters) = (&pool[0], &pool[1]);
    ensure!(
        devices.spec.shared_counters.is_none(),
        "the device slice holds counters"
    );
    ensure!(
        counters.spec.devices.is_none(),
        "the counter slice holds devices"
    );
    ensure!(
        counters
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with(&format!("00001-knic.dev-{}-", env.cluster.node))),
        "{:?}",
        counters.metadata.name
    );
    let sets = counters.spec.shared_counters.as_ref().context("no sets")?;
    ensure!(sets.len() == 1 && sets[0].name == SET, "{sets:?}");
    ensure!(sets[0].counters["vfs"].value.0 == "2", "{sets:?}");
    let want = [(PF, "2"), (VF0, "1"), (VF1, "1")];
    for (device, (name, amount)) in devices.spec.devices.iter().flatten().zip(want) {
        ensure!(device.name == name);
        ensure!(
            consumes(device) == Some((SET.to_owned(), amount.to_owned())),
            "{name}: {:?}",
            device.consumes_counters
        );
    }
    let vf1 = &devices.spec.devices.as_ref().context("devices")?[2];
    let attrs = vf1.attributes.as_ref().context("attributes")?;
    ensure!(attrs["pfPciAddress"].string.as_deref() == Some("0000:a2:00.0"));
    ensure!(attrs["pfName"].string.as_deref() == Some("enp162s0f0np0"));
    ensure!(attrs["vfIndex"].int == Some(1));
    ensure!(
        !env.logs().contains(GATE_WARNING),
        "warned with the gate on"
    );
    if env.cluster.fake.is_some() {
        env.no_more_writes().await?;
    }
    Ok(())
}

async fn gate_off_publishes_plain_devices(env: &mut Env) -> anyhow::Result<()> {
    env.cluster.start_with_gates_off(&[PARTITIONABLE])?;
    env.start()?;
    let pool = env.pool(1).await?;
    plain_pool(&pool)?;
    env.no_more_writes().await?;
    plain_pool(&env.cluster.slices().await?)?;
    let warnings = env.logs().matches(GATE_WARNING).count();
    ensure!(warnings == 1, "warned {warnings} times");
    Ok(())
}

async fn gate_turned_off_later_falls_back_once(env: &mut Env) -> anyhow::Result<()> {
    env.start()?;
    env.pool(2).await?;
    // The apiserver restarts without the gate and the kubelet wipes the node's slices.
    env.cluster.turn_gate_off(PARTITIONABLE)?;
    env.cluster.wipe_slices().await?;
    let pool = env.pool(1).await?;
    plain_pool(&pool)?;
    env.no_more_writes().await?;
    let warnings = env.logs().matches(GATE_WARNING).count();
    ensure!(warnings == 1, "warned {warnings} times");
    Ok(())
}

/// The publisher itself against the gate-off fake, write by write: the first write comes back
/// without counters, the same sync republishes plain devices, and the next sync writes nothing.
async fn publisher_falls_back_within_one_sync(env: &mut Env) -> anyhow::Result<()> {
    use knic_driver::api::slices::Publisher;
    use knic_driver::slices::Mode;
    env.cluster.start_with_gates_off(&[PARTITIONABLE])?;
    let root = env.cluster.tmp.path().join("sysfs-root");
    let inventory = knic_driver::inventory::discover(
        &root,
        &Default::default(),
        &Default::default(),
        &Default::default(),
    );
    let devices = knic_driver::slices::devices(&inventory, &[]);
    ensure!(devices.iter().all(|d| d.consumes_counters.is_some()));
    let mut publisher = Publisher::new(env.cluster.client.clone(), "knic.dev", &env.cluster.node);
    let first = publisher.sync(&devices).await?;
    println!("first sync: {first:?}");
    ensure!(publisher.mode() == Mode::Plain && !first.counters);
    // The device slice's create came back stripped (the counter slice was never written); the
    // plain pool is that one slice rewritten, a single update, so the generation stays.
    ensure!(
        (
            first.created,
            first.updated,
            first.deleted,
            first.generation
        ) == (1, 1, 0, 1),
        "{first:?}"
    );
    plain_pool(&env.cluster.slices().await?)?;
    let again = publisher.sync(&devices).await?;
    ensure!(
        (again.created, again.updated, again.deleted) == (0, 0, 0),
        "{again:?}"
    );
    Ok(())
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let trials = scenario_trials::<Env>(&knic_e2e::scenarios![
        budgets_published_as_counters,
        // Ordered so the shared cluster's apiserver restarts as few times as it can: the gate
        // is turned off once, and the gate-off scenarios then find it off.
        gate_turned_off_later_falls_back_once => Needs::TurnedOff(PARTITIONABLE),
        gate_off_publishes_plain_devices => Needs::Off(&[PARTITIONABLE]),
        publisher_falls_back_within_one_sync => Needs::Off(&[PARTITIONABLE]),
    ]);
    knic_e2e::harness::run_trials(&args, trials);
}
