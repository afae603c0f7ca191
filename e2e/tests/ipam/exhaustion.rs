//! A full Network end to end: a claim that finds no free address fails its prepare with the
//! exhaustion text and leaves nothing allocated; with the controller running in-process, the
//! Network's status and the node's slices then keep the network's template from accepting any
//! published device (new pods stay Pending), also across a driver restart, until an address
//! is freed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use knic_controller::reconcile;
use knic_controller::{availability, cel};
use knic_e2e::driver::DriverProcess;
use knic_e2e::harness::eventually;
use knic_e2e::kubelet;
use knic_proto::network::{
    CONDITION_EXHAUSTED, EXHAUSTED_ATTRIBUTE, Network, exhaustion_selector, exhaustion_token,
};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::{Env, WAIT};

/// Six claims race for the five addresses of a /29 with a gateway: five win, the sixth gets the
/// exhaustion text as its prepare error and nothing is left allocated for it; once an address
/// is released, the same claim prepares.
pub(super) async fn exhaustion_is_a_clean_prepare_error(env: &mut Env) -> anyhow::Result<()> {
    env.create_network(json!([{"cidr": "192.0.2.0/29", "gateway": "192.0.2.1"}]))
        .await?;
    let mut claims = Vec::new();
    for vf in 0..6 {
        claims.push((0, env.claim(&format!("full-{vf}"), vf).await?));
    }
    let outcomes = env.prepare_all(&claims).await?;
    let failed: Vec<usize> = (0..claims.len())
        .filter(|&i| !outcomes[i].error.is_empty())
        .collect();
    ensure!(failed.len() == 1, "exactly one must fail: {outcomes:?}");
    let loser = &claims[failed[0]].1;
    let want = format!(
        "ResourceClaim {}/{}: request nic: ipam.network: network {}: subnet 192.0.2.0/29 has no \
         free address (5 in use of 5)",
        env.cluster.namespace, loser.name, env.network
    );
    let got = &outcomes[failed[0]];
    ensure!(got.error == want, "{:?} != {want:?}", got.error);
    ensure!(got.devices.is_empty());
    let objects = env.addresses().await?;
    ensure!(objects.len() == 5, "{} allocations", objects.len());
    ensure!(objects.iter().all(|o| o.spec.claim.uid != loser.uid));
    ensure!(!env.checkpoint(0).contains(&loser.uid));

    // One pod goes away: the waiting claim now gets the freed address.
    let winner = &claims[if failed[0] == 0 { 1 } else { 0 }].1;
    let freed = objects
        .iter()
        .find(|o| o.spec.claim.uid == winner.uid)
        .map(|o| o.spec.address.clone())
        .context("winner has no allocation")?;
    ensure!(env.unprepare(0, winner).await?.is_empty());
    let retry = env.prepare(0, loser).await?;
    ensure!(retry.error.is_empty(), "retry: {}", retry.error);
    let objects = env.addresses().await?;
    let mine = objects
        .iter()
        .find(|o| o.spec.claim.uid == loser.uid)
        .context("retry left no allocation")?;
    ensure!(
        mine.spec.address == freed,
        "{} != {freed}",
        mine.spec.address
    );
    Ok(())
}

/// The controller, running in-process for the scenarios that need a Network's status.
struct Controller {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Controller {
    fn start(env: &Env) -> Controller {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let config = reconcile::Config {
            resync: Duration::from_secs(30),
            gc_interval: Duration::from_secs(30),
            identity_reads: true,
            retry: Duration::from_millis(250),
            instance: Some("knic-e2e-ipam".into()),
            availability: knic_controller::availability::Settings {
                interval: Duration::from_millis(200),
            },
        };
        let task = tokio::spawn(reconcile::run(env.cluster.client.clone(), config, async {
            let _ = stopped.await;
        }));
        Controller { stop, task }
    }

    /// Deletes the Network while the controller still runs (its finalizer needs it), then
    /// stops the controller.
    async fn stop(self, env: &Env) -> anyhow::Result<()> {
        let networks: Api<Network> = Api::all(env.cluster.client.clone());
        if networks.get_opt(&env.network).await?.is_some() {
            networks
                .delete(&env.network, &DeleteParams::default())
                .await?;
        }
        eventually("the Network is gone", WAIT, || async {
            Ok(networks
                .get_opt(&env.network)
                .await?
                .is_none()
                .then_some(()))
        })
        .await?;
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        Ok(())
    }
}

/// The DeviceClass the test's Network uses, created unless it exists (a real cluster has it from
/// the chart, with this very selector: `deviceclasses/knic.yaml`); one it made is deleted at
/// the end.
async fn ensure_device_class(env: &mut Env) -> anyhow::Result<()> {
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "knic.dev"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == \"knic.dev\""}}]},
    }))?;
    let api: Api<DeviceClass> = Api::all(env.cluster.client.clone());
    match api.create(&PostParams::default(), &class).await {
        Ok(_) => {
            env.made_class = true;
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// How many of the node's published devices a claim from `template` may get, and how many
/// there are: the DeviceClass (read from the API) and request selectors, evaluated the way the
/// scheduler does (an evaluation error fails the device).
async fn accepted(env: &Env, template: &ResourceClaimTemplate) -> anyhow::Result<(usize, usize)> {
    let classes: BTreeMap<String, DeviceClass> =
        Api::<DeviceClass>::all(env.cluster.client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|c| (c.name_any(), c))
            .collect();
    let wanted =
        availability::wanted_by(&template.spec, &classes).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut yes = 0;
    let mut all = 0;
    for slice in env.cluster.slices().await? {
        for device in slice.spec.devices.iter().flatten() {
            all += 1;
            let view = cel::Device::from_slice(&slice.spec.driver, device);
            if wanted.accepts(&view).map_err(|e| anyhow::anyhow!("{e}"))? {
                yes += 1;
            }
        }
    }
    Ok((yes, all))
}

/// A full Network says so in its status, and the node's slices then carry it in
/// `exhaustedNetworks`, so the network's generated template accepts no device (the scheduler
/// keeps new pods Pending) while a template of another network still accepts every one. The
/// allocated claims are untouched; freeing one address lifts all of it.
pub(super) async fn exhaustion_keeps_new_claims_from_scheduling(
    env: &mut Env,
) -> anyhow::Result<()> {
    let controller = Controller::start(env);
    let outcome = exhaustion_scenario(env).await;
    let stopped = controller.stop(env).await;
    outcome.and(stopped)
}

async fn exhaustion_scenario(env: &mut Env) -> anyhow::Result<()> {
    // Slices are owned by their Node; the fake API has none until asked.
    env.cluster.ensure_node().await?;
    ensure_device_class(env).await?;
    env.create_network(json!([{"cidr": "192.0.2.0/29", "gateway": "192.0.2.1"}]))
        .await?;
    let networks: Api<Network> = Api::all(env.cluster.client.clone());
    let templates: Api<ResourceClaimTemplate> =
        Api::namespaced(env.cluster.client.clone(), &env.cluster.namespace);
    let template = eventually("the generated template", WAIT, || async {
        Ok(templates.get_opt(&env.network).await?)
    })
    .await?;
    // Another network's template: what a full network must not block.
    let mut other = template.clone();
    let other_selector = exhaustion_selector("some-other-network");
    for request in other
        .spec
        .spec
        .devices
        .iter_mut()
        .flat_map(|d| d.requests.iter_mut().flatten())
    {
        for selector in request
            .exactly
            .iter_mut()
            .flat_map(|e| e.selectors.iter_mut().flatten())
        {
            if let Some(cel) = selector.cel.as_mut()
                && cel.expression == exhaustion_selector(&env.network)
            {
                cel.expression = other_selector.clone();
            }
        }
    }

    eventually(
        "the node's devices published and accepted",
        WAIT,
        || async {
            let (yes, all) = accepted(env, &template).await?;
            ensure!(all > 0 && yes == all, "{yes} of {all} devices accepted");
            Ok(Some(()))
        },
    )
    .await?;
    env.wait_available_nodes(Some(1)).await?;

    let mut claims = Vec::new();
    for vf in 0..5 {
        let claim = env.claim(&format!("fill-{vf}"), vf).await?;
        let got = env.prepare(0, &claim).await?;
        ensure!(got.error.is_empty(), "prepare {vf}: {}", got.error);
        claims.push(claim);
    }
    let full = eventually("Exhausted=True", WAIT, || async {
        let n = networks.get(&env.network).await?;
        Ok(n.condition_is_true(CONDITION_EXHAUSTED).then_some(n))
    })
    .await?;
    let condition = full
        .condition(CONDITION_EXHAUSTED)
        .context("no condition")?;
    ensure!(condition.reason == "NoFreeAddress", "{condition:?}");
    ensure!(
        condition.message
            == "all 5 allocatable IPv4 addresses of 192.0.2.0/29 are in use; new pods of this \
                network stay Pending (unschedulable) until an address is released or a subnet is added, \
                running pods keep theirs",
        "{}",
        condition.message
    );
    ensure!(
        full.status
            .as_ref()
            .and_then(|s| s.address_summary.as_deref())
            == Some("0/5")
    );

    let token = exhaustion_token(&env.network);
    eventually("every published device lists the network", WAIT, || async {
        let (yes, all) = accepted(env, &template).await?;
        Ok((all > 0 && yes == 0).then_some(()))
    })
    .await?;
    for slice in env.cluster.slices().await? {
        for device in slice.spec.devices.iter().flatten() {
            let value = device
                .attributes
                .as_ref()
                .and_then(|a| a.get(EXHAUSTED_ATTRIBUTE))
                .and_then(|a| a.string.clone());
            ensure!(
                value == Some(format!(",{token},")),
                "{}: {value:?}",
                device.name
            );
        }
    }
    let (yes, all) = accepted(env, &other).await?;
    ensure!(
        yes == all,
        "another network's template accepts {yes} of {all}"
    );
    env.wait_available_nodes(Some(0)).await?;

    // A driver restart never un-marks the devices: its first publish waits for the Networks.
    env.nodes[0].driver.kill9().await?;
    let node = &mut env.nodes[0];
    node.driver = DriverProcess::start(&node.config)?;
    node.plugin = Arc::new(kubelet::register(&node.config.registry_dir).await?);
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        let (yes, all) = accepted(env, &template).await?;
        ensure!(
            yes == 0,
            "after a restart {yes} of {all} devices were offered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Running pods keep theirs: all five allocations and checkpoint entries are still there.
    ensure!(env.addresses().await?.len() == 5);
    for claim in &claims {
        ensure!(env.checkpoint(0).contains(&claim.uid));
    }

    // One pod goes: the network is not full any more, and every device is offered again.
    ensure!(env.unprepare(0, &claims[0]).await?.is_empty());
    eventually("Exhausted=False", WAIT, || async {
        let n = networks.get(&env.network).await?;
        let c = n.condition(CONDITION_EXHAUSTED).cloned();
        Ok(c.filter(|c| c.status == "False" && c.message == "1 of 5 addresses free"))
    })
    .await?;
    eventually("the attribute is gone again", WAIT, || async {
        let slices = env.cluster.slices().await?;
        let marked = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .any(|d| {
                d.attributes
                    .as_ref()
                    .is_some_and(|a| a.contains_key(EXHAUSTED_ATTRIBUTE))
            });
        Ok((!marked).then_some(()))
    })
    .await?;
    let (yes, all) = accepted(env, &template).await?;
    ensure!(yes == all, "after release: {yes} of {all} devices accepted");
    env.wait_available_nodes(Some(1)).await?;
    for claim in &claims[1..] {
        ensure!(env.unprepare(0, claim).await?.is_empty());
    }
    Ok(())
}
