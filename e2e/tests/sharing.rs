//! Shared parents end to end: the real `knic-driver`, given a share policy that names the SR-IOV
//! PF of a captured tree, publishes that PF only as shareable. With `DRAConsumableCapacity` on
//! (1.36) it is one device with `allowMultipleAllocations` and `children`/`bandwidth`
//! capacities, consuming no PF budget while its VFs keep theirs; with the gate off (the fake's
//! switch, as on 1.34/1.35) the driver notices the dropped fields, logs it once and publishes
//! child-slot devices instead. Either way the pool settles and the driver stops writing.

use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::driver::{DriverConfig, DriverProcess, fixture_tree};
use knic_e2e::gates::{CONSUMABLE, Needs, PARTITIONABLE};
use knic_e2e::harness::{ScenarioEnv, eventually, scenario_trials};
use knic_e2e::kubelet::{self, ClaimId, DraVersion};
use serde_json::json;

const PF: &str = "pci-0000-a2-00-0";
const VF0: &str = "pci-0000-a2-01-0";
const VF1: &str = "pci-0000-a2-01-1";
const SET: &str = "pf-0000-a2-00-0";
const SLOTS: [&str; 4] = [
    "pci-0000-a2-00-0-s0",
    "pci-0000-a2-00-0-s1",
    "pci-0000-a2-00-0-s2",
    "pci-0000-a2-00-0-s3",
];
const POLICY: &str = "parents:\n- pciAddresses: [\"0000:a2:00.0\"]\n  children: 4\n  bandwidth: 25G\n  defaultBandwidth: 100M\n  minBandwidth: 10M\n  bandwidthStep: 10M\n";
const GATE_WARNING: &str =
    "DRAConsumableCapacity is off: publishing shared parents as child-slot devices";

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
        let policy = cluster.tmp.path().join("share-policy.yaml");
        std::fs::write(&policy, POLICY)?;
        let config = DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig)
            .with_env("KNIC_SYSFS_ROOT", root.to_string_lossy())
            .with_env("KNIC_SHARE_POLICY", policy.to_string_lossy())
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

    /// The pool once it has `slices` slices, all announcing that count, with these devices.
    async fn pool(&self, slices: usize, names: &[&str]) -> anyhow::Result<Vec<ResourceSlice>> {
        eventually("the pool is published", Duration::from_secs(20), || async {
            let pool = self.cluster.slices().await?;
            let published: Vec<&str> = pool
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .map(|d| d.name.as_str())
                .collect();
            let complete = pool.len() == slices
                && pool
                    .iter()
                    .all(|s| s.spec.pool.resource_slice_count == slices as i64)
                && published == names;
            Ok(complete.then_some(pool))
        })
        .await
    }

    /// Fails if the driver writes slices after a settling pause, over three rescans.
    async fn no_more_writes(&self) -> anyhow::Result<()> {
        self.cluster.no_more_slice_writes().await
    }

    fn warnings(&self) -> usize {
        self.logs().matches(GATE_WARNING).count()
    }
}

fn devices(pool: &[ResourceSlice]) -> Vec<&Device> {
    pool.iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect()
}

/// The PF as one shareable device with exactly the policy's capacities, no PF budget taken,
/// and its VFs still drawing on the budget.
fn capacity_pool(pool: &[ResourceSlice]) -> anyhow::Result<()> {
    let all = devices(pool);
    let parent = all.iter().find(|d| d.name == PF).context("no parent")?;
    ensure!(parent.allow_multiple_allocations == Some(true));
    ensure!(
        parent.consumes_counters.is_none(),
        "the parent consumes {:?}",
        parent.consumes_counters
    );
    ensure!(
        serde_json::to_value(&parent.capacity)?
            == json!({
                "bandwidth": {"value": "25G", "requestPolicy": {"default": "100M",
                    "validRange": {"min": "10M", "step": "10M"}}},
                "children": {"value": "4", "requestPolicy": {"default": "1", "validValues": ["1"]}},
            }),
        "{:?}",
        parent.capacity
    );
    let attrs = parent.attributes.as_ref().context("attributes")?;
    ensure!(attrs["shareable"].bool == Some(true));
    ensure!(attrs["ifName"].string.as_deref() == Some("enp162s0f0np0"));
    ensure!(attrs["resource.kubernetes.io/pcieRoot"].string.is_some());
    for vf in all.iter().filter(|d| d.name != PF) {
        let c = vf
            .consumes_counters
            .as_ref()
            .context("a VF without budget")?;
        ensure!(c[0].counter_set == SET && c[0].counters["vfs"].value.0 == "1");
        ensure!(
            !vf.attributes
                .as_ref()
                .context("attributes")?
                .contains_key("shareable")
        );
    }
    let sets = pool
        .iter()
        .flat_map(|s| s.spec.shared_counters.iter().flatten())
        .collect::<Vec<_>>();
    ensure!(
        sets.len() == 1 && sets[0].counters["vfs"].value.0 == "2",
        "{sets:?}"
    );
    Ok(())
}

/// The PF as four child slots carrying its attributes, no capacity anywhere.
fn slot_pool(pool: &[ResourceSlice]) -> anyhow::Result<()> {
    for (i, name) in SLOTS.iter().enumerate() {
        let slot = devices(pool)
            .into_iter()
            .find(|d| d.name == *name)
            .context("slot missing")?;
        ensure!(slot.allow_multiple_allocations.is_none() && slot.capacity.is_none());
        ensure!(slot.consumes_counters.is_none());
        let attrs = slot.attributes.as_ref().context("attributes")?;
        ensure!(attrs["shareable"].bool == Some(true));
        ensure!(attrs["parent"].string.as_deref() == Some(PF));
        ensure!(attrs["childSlot"].int == Some(i as i64));
        ensure!(attrs["ifName"].string.as_deref() == Some("enp162s0f0np0"));
    }
    Ok(())
}

async fn capacity_mode_publishes_a_shareable_parent(env: &mut Env) -> anyhow::Result<()> {
    env.start()?;
    let pool = env.pool(2, &[PF, VF0, VF1]).await?;
    capacity_pool(&pool)?;
    ensure!(env.warnings() == 0, "warned with the gate on");
    if env.cluster.fake.is_some() {
        env.no_more_writes().await?;
    }
    Ok(())
}

async fn gate_off_publishes_child_slots(env: &mut Env) -> anyhow::Result<()> {
    env.cluster.start_with_gates_off(&[CONSUMABLE])?;
    env.start()?;
    let names = [SLOTS.as_slice(), &[VF0, VF1]].concat();
    let pool = env.pool(2, &names).await?;
    slot_pool(&pool)?;
    env.no_more_writes().await?;
    slot_pool(&env.cluster.slices().await?)?;
    ensure!(env.warnings() == 1, "warned {} times", env.warnings());
    Ok(())
}

async fn gate_turned_off_later_falls_back_once(env: &mut Env) -> anyhow::Result<()> {
    env.start()?;
    capacity_pool(&env.pool(2, &[PF, VF0, VF1]).await?)?;
    // The apiserver restarts without the gate and the kubelet wipes the node's slices.
    env.cluster.turn_gate_off(CONSUMABLE)?;
    env.cluster.wipe_slices().await?;
    let names = [SLOTS.as_slice(), &[VF0, VF1]].concat();
    slot_pool(&env.pool(2, &names).await?)?;
    env.no_more_writes().await?;
    ensure!(env.warnings() == 1, "warned {} times", env.warnings());
    Ok(())
}

async fn both_gates_off_publish_plain_slots(env: &mut Env) -> anyhow::Result<()> {
    env.cluster
        .start_with_gates_off(&[CONSUMABLE, PARTITIONABLE])?;
    env.start()?;
    let names = [SLOTS.as_slice(), &[VF0, VF1]].concat();
    let pool = env.pool(1, &names).await?;
    slot_pool(&pool)?;
    ensure!(devices(&pool).iter().all(|d| d.consumes_counters.is_none()));
    env.no_more_writes().await?;
    ensure!(env.warnings() == 1, "warned {} times", env.warnings());
    Ok(())
}

/// The publisher itself against the gate-off fake: the first write comes back without the
/// consumable fields, the same sync republishes child slots and reports the mode to its
/// follower, and the next sync writes nothing.
async fn publisher_falls_back_within_one_sync(env: &mut Env) -> anyhow::Result<()> {
    use knic_driver::api::slices::Publisher;
    use knic_driver::sharing::{ShareMode, SharePolicy, Sharing};
    env.cluster.start_with_gates_off(&[CONSUMABLE])?;
    let root = env.cluster.tmp.path().join("sysfs-root");
    let inventory = knic_driver::inventory::discover(
        &root,
        &Default::default(),
        &Default::default(),
        &Default::default(),
    );
    let mut devices = knic_driver::slices::devices(&inventory, &[]);
    Sharing::new(SharePolicy::parse(POLICY)?).mark(&mut devices, &inventory);
    ensure!(knic_driver::sharing::is_shared_parent(&devices[0]));
    let (mode_tx, mode_rx) = tokio::sync::watch::channel(ShareMode::Capacity);
    let mut publisher = Publisher::new(env.cluster.client.clone(), "knic.dev", &env.cluster.node)
        .with_share_mode(mode_tx);
    let first = publisher.sync(&devices).await?;
    println!("first sync: {first:?}");
    ensure!(publisher.share_mode() == ShareMode::Slots && !first.capacity && first.counters);
    ensure!(*mode_rx.borrow() == ShareMode::Slots);
    // The device slice's create came back stripped (the counter slice was never written); the
    // slot pool is that slice rewritten plus the counter slice created.
    ensure!(
        (first.created, first.updated, first.deleted) == (2, 1, 0),
        "{first:?}"
    );
    slot_pool(&env.cluster.slices().await?)?;
    let again = publisher.sync(&devices).await?;
    ensure!(
        (again.created, again.updated, again.deleted) == (0, 0, 0),
        "{again:?}"
    );
    Ok(())
}

/// Shares of one port through the real kubelet socket (DRA v1): each claim's answer carries its
/// allocation's `shareID`; a share whose consumed bandwidth would take the port past its 25G is
/// refused naming the holders; the same shareID twice is refused; after an unprepare the
/// bandwidth is free again.
async fn shares_are_prepared_with_their_share_ids(env: &mut Env) -> anyhow::Result<()> {
    env.start()?;
    env.pool(2, &[PF, VF0, VF1]).await?;
    let plugin = kubelet::register(&env.config.registry_dir).await?;
    let share = |n: u8| format!("8e2f1b7a-0c43-4c1e-9a55-2f1d1c0b7e{n:02x}");
    let mut claims = Vec::new();
    for (name, share_id, bandwidth) in [
        ("a", share(1), "10G"),
        ("b", share(2), "10G"),
        ("c", share(3), "10G"),
        ("d", share(1), "1G"),
    ] {
        let result = json!({"request": "nic", "driver": "knic.dev", "pool": env.cluster.node,
            "device": PF, "shareID": share_id,
            "consumedCapacity": {"children": "1", "bandwidth": bandwidth}});
        let claim = env
            .cluster
            .create_claim_allocated(name, Some(vec![result]), None)
            .await?;
        claims.push(ClaimId {
            namespace: env.cluster.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        });
    }
    let prepare = |i: usize| plugin.prepare(DraVersion::V1, std::slice::from_ref(&claims[i]));
    for (i, want) in [(0, share(1)), (1, share(2))] {
        let out = prepare(i).await?;
        let answer = &out[&claims[i].uid];
        ensure!(answer.error.is_empty(), "{answer:?}");
        ensure!(
            answer.devices.len() == 1
                && answer.devices[0].device == PF
                && answer.devices[0].share_id.as_deref() == Some(want.as_str()),
            "{answer:?}"
        );
    }
    let ns = &env.cluster.namespace;
    let over = prepare(2).await?;
    let want = format!(
        "request nic: bandwidth.egress: 10Gbit/s on shared port enp162s0f0np0 would exceed its \
         total of 25Gbit/s: 20Gbit/s is prepared for other claims ({ns}/a 10Gbit/s, {ns}/b \
         10Gbit/s)"
    );
    ensure!(over[&claims[2].uid].error.contains(&want), "{:?}", over);
    let twice = prepare(3).await?;
    let want = format!(
        "device {node}/{PF} is still prepared with the same shareID {} for claim {ns}/a",
        share(1),
        node = env.cluster.node
    );
    ensure!(twice[&claims[3].uid].error.contains(&want), "{:?}", twice);
    // a goes: its 10G are free for c.
    let out = plugin
        .unprepare(DraVersion::V1, std::slice::from_ref(&claims[0]))
        .await?;
    ensure!(out[&claims[0].uid].is_empty(), "{out:?}");
    let out = prepare(2).await?;
    ensure!(out[&claims[2].uid].error.is_empty(), "{out:?}");
    ensure!(out[&claims[2].uid].devices[0].share_id.as_deref() == Some(share(3).as_str()));
    Ok(())
}

/// Child-slot mode (gate off): the scheduler counts slots only, so prepare keeps the port's
/// 25G: a slot whose config asks 20G fits, a second asking 10G is refused naming the first, and
/// a slot asking nothing gets the policy's 100M default.
async fn slots_keep_the_ports_bandwidth_at_prepare(env: &mut Env) -> anyhow::Result<()> {
    env.cluster.start_with_gates_off(&[CONSUMABLE])?;
    env.start()?;
    let mut names = SLOTS.to_vec();
    names.extend([VF0, VF1]);
    env.pool(2, &names).await?;
    let plugin = kubelet::register(&env.config.registry_dir).await?;
    let mut claims = Vec::new();
    for (name, slot, egress) in [
        ("a", SLOTS[0], Some("20G")),
        ("b", SLOTS[1], Some("10G")),
        ("c", SLOTS[2], None),
    ] {
        let result = json!({"request": "nic", "driver": "knic.dev", "pool": env.cluster.node,
            "device": slot});
        let config = egress.map(|e| {
            json!({"apiVersion": "knic.dev/v1alpha1",
            "kind": "NetworkConfig", "bandwidth": {"egress": e}})
        });
        let claim = env
            .cluster
            .create_claim_allocated(name, Some(vec![result]), config)
            .await?;
        claims.push(ClaimId {
            namespace: env.cluster.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        });
    }
    let ns = env.cluster.namespace.clone();
    // a first: which of a and b is refused must not depend on the order within one call.
    let out = plugin
        .prepare(DraVersion::V1, std::slice::from_ref(&claims[0]))
        .await?;
    ensure!(out[&claims[0].uid].error.is_empty(), "{out:?}");
    let out = plugin.prepare(DraVersion::V1, &claims[1..]).await?;
    let want = format!(
        "request nic: bandwidth.egress: 10Gbit/s on shared port enp162s0f0np0 would exceed its \
         total of 25Gbit/s: 20Gbit/s is prepared for other claims ({ns}/a 20Gbit/s"
    );
    ensure!(out[&claims[1].uid].error.contains(&want), "{out:?}");
    ensure!(out[&claims[2].uid].error.is_empty(), "{out:?}");
    ensure!(out[&claims[2].uid].devices[0].share_id.is_none(), "{out:?}");
    Ok(())
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let trials = scenario_trials::<Env>(&knic_e2e::scenarios![
        capacity_mode_publishes_a_shareable_parent,
        shares_are_prepared_with_their_share_ids,
        // Ordered so the shared cluster's apiserver restarts as few times as it can.
        gate_turned_off_later_falls_back_once => Needs::TurnedOff(CONSUMABLE),
        gate_off_publishes_child_slots => Needs::Off(&[CONSUMABLE]),
        publisher_falls_back_within_one_sync => Needs::Off(&[CONSUMABLE]),
        slots_keep_the_ports_bandwidth_at_prepare => Needs::Off(&[CONSUMABLE]),
        both_gates_off_publish_plain_slots => Needs::Off(&[CONSUMABLE, PARTITIONABLE]),
    ]);
    knic_e2e::harness::run_trials(&args, trials);
}
