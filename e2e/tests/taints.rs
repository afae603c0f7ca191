//! Device taints end to end: the real `knic-driver` on a captured tree with an SR-IOV PF and two
//! VFs. The tree is changed under the running driver as the kernel would change sysfs: the PF's
//! link goes down (the PF is published with a `knic.dev/link-down` NoSchedule taint, the
//! apiserver's `timeAdded` kept while it stays down) and up again (the taint goes); a VF loses
//! its kernel driver (`knic.dev/driver-unbound`) and gets it back; a VF vanishes (it stays
//! published with `knic.dev/gone`) and returns. Against an apiserver with `DRADeviceTaints` off
//! (the fake's gate switch) the driver logs it once, publishes untainted devices and stops
//! writing. The kubelet health stream says the same devices are unhealthy, with the reason.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::{Device, DeviceTaint, ResourceSlice};
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::driver::{DriverConfig, DriverProcess, fixture_tree};
use knic_e2e::gates::{Needs, TAINTS};
use knic_e2e::harness::{ScenarioEnv, eventually, scenario_trials};
use knic_proto::health::v1::HealthStatus::{Healthy, Unhealthy};

const PF: &str = "pci-0000-a2-00-0";
const VF0: &str = "pci-0000-a2-01-0";
const VF1: &str = "pci-0000-a2-01-1";
const GATE_WARNING: &str = "DRADeviceTaints is off: publishing devices without taints";
const PF_OPERSTATE: &str = "sys/devices/pci0000:a2/0000:a2:00.0/net/enp162s0f0np0/operstate";
const VF1_DRIVER: &str = "sys/devices/pci0000:a2/0000:a2:01.1/driver";
/// The links through which VF0 is found, with their targets: removing them is the VF
/// vanishing (its PF's VF count lowered), putting them back its return.
const VF0_LINKS: [(&str, &str); 3] = [
    (
        "sys/class/net/enp162s0f0v0",
        "../../devices/pci0000:a2/0000:a2:01.0/net/enp162s0f0v0",
    ),
    (
        "sys/bus/pci/devices/0000:a2:01.0",
        "../../../devices/pci0000:a2/0000:a2:01.0",
    ),
    (
        "sys/devices/pci0000:a2/0000:a2:00.0/virtfn0",
        "../0000:a2:01.0",
    ),
];

struct Env {
    cluster: Cluster,
    config: DriverConfig,
    root: PathBuf,
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
            root,
            driver: None,
        })
    }

    async fn finish(self, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
        let cleanup = self.cluster.cleanup().await;
        match outcome {
            Ok(()) => cleanup,
            Err(e) => anyhow::bail!("{e:#}\n--- driver log ---\n{}", self.logs()),
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

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn set_pf_link(&self, state: &str) -> anyhow::Result<()> {
        std::fs::write(self.path(PF_OPERSTATE), format!("{state}\n"))?;
        Ok(())
    }

    /// The devices of the pool once `check` accepts them.
    async fn devices_when(
        &self,
        what: &str,
        check: impl Fn(&[Device]) -> bool,
    ) -> anyhow::Result<Vec<Device>> {
        eventually(what, Duration::from_secs(20), || async {
            let pool = self.cluster.slices().await?;
            let generation = pool.iter().map(|s| s.spec.pool.generation).max();
            let current: Vec<&ResourceSlice> = pool
                .iter()
                .filter(|s| Some(s.spec.pool.generation) == generation)
                .collect();
            let complete = current
                .iter()
                .all(|s| s.spec.pool.resource_slice_count == current.len() as i64);
            let devices: Vec<Device> = current
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten().cloned())
                .collect();
            Ok((complete && check(&devices)).then_some(devices))
        })
        .await
    }

    /// Fails if the driver writes slices after a settling pause, over three rescans (on a real
    /// cluster: if a slice's resourceVersion moves).
    async fn no_more_writes(&self) -> anyhow::Result<()> {
        self.cluster.no_more_slice_writes().await
    }
}

fn names(devices: &[Device]) -> Vec<&str> {
    devices.iter().map(|d| d.name.as_str()).collect()
}

fn taints<'a>(devices: &'a [Device], name: &str) -> Option<&'a [DeviceTaint]> {
    devices
        .iter()
        .find(|d| d.name == name)?
        .taints
        .as_deref()
        .filter(|t| !t.is_empty())
}

fn untainted(devices: &[Device]) -> bool {
    names(devices) == [PF, VF0, VF1] && devices.iter().all(|d| taints(devices, &d.name).is_none())
}

/// `(key, value, effect)` of a device's taints, with whether each has a `timeAdded`.
fn shape(devices: &[Device], name: &str) -> Vec<(String, String, String, bool)> {
    taints(devices, name)
        .unwrap_or_default()
        .iter()
        .map(|t| {
            (
                t.key.clone(),
                t.value.clone().unwrap_or_default(),
                t.effect.clone(),
                t.time_added.is_some(),
            )
        })
        .collect()
}

fn one(key: &str, value: &str) -> Vec<(String, String, String, bool)> {
    vec![(key.into(), value.into(), "NoSchedule".into(), true)]
}

/// The message for `device` in the driver's health stream (v1), once it says `health`.
async fn health_of(
    env: &Env,
    device: &str,
    health: knic_proto::health::v1::HealthStatus,
) -> anyhow::Result<String> {
    let plugin = knic_e2e::kubelet::register(&env.config.registry_dir).await?;
    eventually(
        "the health stream agrees",
        Duration::from_secs(10),
        || async {
            let snapshot = plugin.health(true).await?;
            Ok(snapshot
                .into_iter()
                .find(|(d, h, _)| d == device && *h == health as i32)
                .map(|(_, _, message)| message))
        },
    )
    .await
}

async fn link_down_taints_and_link_up_clears(env: &mut Env) -> anyhow::Result<()> {
    env.start()?;
    env.devices_when("the untainted pool", untainted).await?;
    env.set_pf_link("down")?;
    let down = env
        .devices_when("the PF tainted link-down", |d| taints(d, PF).is_some())
        .await?;
    ensure!(
        shape(&down, PF) == one("knic.dev/link-down", "down"),
        "{:?}",
        taints(&down, PF)
    );
    ensure!(taints(&down, VF0).is_none() && taints(&down, VF1).is_none());
    let message = health_of(env, PF, Unhealthy).await?;
    ensure!(message == "link is down", "{message}");
    let first_time = taints(&down, PF).context("taint")?[0].time_added.clone();
    env.no_more_writes().await?;
    let still = env
        .devices_when("the PF still tainted", |d| taints(d, PF).is_some())
        .await?;
    ensure!(
        taints(&still, PF).context("taint")?[0].time_added == first_time,
        "timeAdded moved while the link stayed down"
    );
    env.set_pf_link("up")?;
    env.devices_when("the taint cleared", untainted).await?;
    health_of(env, PF, Healthy).await?;
    env.no_more_writes().await?;
    Ok(())
}

async fn unbound_driver_taints_until_bound_again(env: &mut Env) -> anyhow::Result<()> {
    env.start()?;
    env.devices_when("the untainted pool", untainted).await?;
    let link = env.path(VF1_DRIVER);
    let target = std::fs::read_link(&link)?;
    std::fs::remove_file(&link)?;
    let unbound = env
        .devices_when("VF1 tainted driver-unbound", |d| taints(d, VF1).is_some())
        .await?;
    ensure!(
        shape(&unbound, VF1) == one("knic.dev/driver-unbound", "no-driver"),
        "{:?}",
        taints(&unbound, VF1)
    );
    let message = health_of(env, VF1, Unhealthy).await?;
    ensure!(
        message == "no kernel driver is bound to the PCI function",
        "{message}"
    );
    env.no_more_writes().await?;
    std::os::unix::fs::symlink(&target, &link)?;
    env.devices_when("the taint cleared", untainted).await?;
    env.no_more_writes().await?;
    Ok(())
}

fn vanish(root: &Path) -> anyhow::Result<()> {
    for (link, _) in VF0_LINKS {
        std::fs::remove_file(root.join(link)).with_context(|| link.to_owned())?;
    }
    Ok(())
}

fn come_back(root: &Path) -> anyhow::Result<()> {
    for (link, target) in VF0_LINKS {
        std::os::unix::fs::symlink(target, root.join(link)).with_context(|| link.to_owned())?;
    }
    Ok(())
}

async fn vanished_device_stays_tainted_until_it_returns(env: &mut Env) -> anyhow::Result<()> {
    env.start()?;
    env.devices_when("the untainted pool", untainted).await?;
    vanish(&env.root)?;
    let gone = env
        .devices_when("VF0 tainted gone", |d| taints(d, VF0).is_some())
        .await?;
    ensure!(names(&gone) == [PF, VF0, VF1], "{:?}", names(&gone));
    ensure!(
        shape(&gone, VF0) == one("knic.dev/gone", "vanished"),
        "{:?}",
        taints(&gone, VF0)
    );
    let vf0 = gone.iter().find(|d| d.name == VF0).context("VF0")?;
    ensure!(
        vf0.consumes_counters.is_none(),
        "a vanished VF kept its budget"
    );
    let message = health_of(env, VF0, Unhealthy).await?;
    ensure!(message == "the device vanished from the node", "{message}");
    env.no_more_writes().await?;
    come_back(&env.root)?;
    env.devices_when("VF0 back untainted", untainted).await?;
    env.no_more_writes().await?;
    Ok(())
}

async fn gate_off_publishes_untainted_devices(env: &mut Env) -> anyhow::Result<()> {
    env.cluster.start_with_gates_off(&[TAINTS])?;
    env.set_pf_link("down")?;
    env.start()?;
    env.devices_when("the pool with the PF down", |d| {
        names(d) == [PF, VF0, VF1] && d.iter().all(|d| d.taints.is_none())
    })
    .await?;
    eventually("the gate warning", Duration::from_secs(10), || async {
        Ok(env.logs().contains(GATE_WARNING).then_some(()))
    })
    .await?;
    env.no_more_writes().await?;
    // Another cause later: still no taint written, no loop.
    std::fs::remove_file(env.path(VF1_DRIVER))?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.no_more_writes().await?;
    let pool = env.cluster.slices().await?;
    ensure!(
        pool.iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .all(|d| d.taints.is_none())
    );
    let warnings = env.logs().matches(GATE_WARNING).count();
    ensure!(warnings == 1, "warned {warnings} times");
    Ok(())
}

/// The publisher itself against the gate-off fake: the first write comes back without the
/// taints, the same sync republishes without them, and the next sync writes nothing.
async fn publisher_stops_sending_taints_within_one_sync(env: &mut Env) -> anyhow::Result<()> {
    use knic_driver::api::slices::Publisher;
    env.cluster.start_with_gates_off(&[TAINTS])?;
    env.set_pf_link("down")?;
    let inventory = knic_driver::inventory::discover(
        &env.root,
        &Default::default(),
        &Default::default(),
        &Default::default(),
    );
    let mut devices = knic_driver::slices::devices(&inventory, &[]);
    knic_driver::slices::taints::apply(&mut devices);
    ensure!(taints(&devices, PF).is_some(), "the PF is not tainted");
    let mut publisher = Publisher::new(env.cluster.client.clone(), "knic.dev", &env.cluster.node);
    let first = publisher.sync(&devices).await?;
    println!("first sync: {first:?}");
    ensure!(
        !first.taints && !publisher.taints() && first.counters,
        "{first:?}"
    );
    // The device slice's create came back stripped (the counter slice was never written); the
    // untainted pool is that slice rewritten plus the counter slice created.
    ensure!(
        (first.created, first.updated, first.deleted) == (2, 1, 0),
        "{first:?}"
    );
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
        link_down_taints_and_link_up_clears,
        unbound_driver_taints_until_bound_again,
        vanished_device_stays_tainted_until_it_returns,
        gate_off_publishes_untainted_devices => Needs::Off(&[TAINTS]),
        publisher_stops_sending_taints_within_one_sync => Needs::Off(&[TAINTS]),
    ]);
    knic_e2e::harness::run_trials(&args, trials);
}
