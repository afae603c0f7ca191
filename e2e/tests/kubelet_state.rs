//! The kubelet loses its DRA state under a running pod (a node reinstall, a wiped
//! `/var/lib/kubelet`), as found on the real cluster: the pod is deleted while the kubelet is
//! down, its generated claim is collected, and the kubelet comes back knowing nothing of the
//! claim, so it never unprepares it. knic must notice (the claim is gone from the API and no pod
//! uses it), withhold the device from its slice meanwhile, unprepare the claim itself after the
//! grace with an Event, and give the device to the next pod.
//!
//! Real cluster only (`KNIC_E2E_KUBECONFIG`), with the harness kit (`KNIC_E2E_HARNESS`) to stop
//! and start the node's kubelet; otherwise reported ignored with the reason.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use knic_e2e::cluster::RealCluster;
use knic_e2e::gates::Harness;
use knic_e2e::harness::{eventually, ip, trial, unpanicked};
use knic_e2e::real_node::{PodClaim, RealNode};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

const ADDRESS: &str = "192.0.2.31/24";
const WAIT: Duration = Duration::from_secs(180);

/// The node's kubelet, started again by the guard whatever happened to the test.
struct Kubelet<'a>(&'a Harness);

impl Drop for Kubelet<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.restart("kubelet") {
            eprintln!("error: could not start the kubelet again: {e:#}");
        }
    }
}

/// Whether the node's slices offer the device.
async fn offered(node: &RealNode, device: &str) -> anyhow::Result<bool> {
    Ok(node
        .cluster
        .slices()
        .await?
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .any(|d| d.name == device))
}

fn on_host(device: &str) -> bool {
    ip(&["-o", "link", "show", device]).is_ok()
}

async fn scenario(node: &mut RealNode, harness: &Harness) -> anyhow::Result<()> {
    let dev = node.nics[0].name.clone();
    let ns = node.cluster.namespace.clone();
    let class = node.device_class("nic", &[&dev]).await?;
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "nic", "namespace": ns},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "nic", "exactly": {"deviceClassName": class}}],
            "config": [{"requests": ["nic"], "opaque": {"driver": "knic.dev", "parameters": {
                "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                "addresses": [ADDRESS]}}}],
        }}},
    }))?;
    Api::<ResourceClaimTemplate>::namespaced(node.cluster.client.clone(), &ns)
        .create(&PostParams::default(), &template)
        .await?;
    let from_template = PodClaim::Template("nic".into());

    node.create_pod("first", &from_template).await?;
    node.running("first", WAIT).await?;
    let claim = node.claim_of("first").await?;
    let uid = node
        .claims()
        .get(&claim)
        .await?
        .metadata
        .uid
        .context("claim uid")?;
    ensure!(
        node.checkpoint()?.contains_key(&uid),
        "the claim is not prepared"
    );
    ensure!(
        !on_host(&dev),
        "{dev} is still on the host while the pod runs"
    );

    // The kubelet goes down and comes back with no DRA state; meanwhile the pod is deleted
    // from the API (force, as nothing runs to confirm it) and its claim is collected.
    let kubelet = Kubelet(harness);
    harness.stop("kubelet")?;
    let state = node.real.kubelet_dir.join("dra_manager_state");
    std::fs::remove_file(&state).with_context(|| format!("wiping {}", state.display()))?;
    node.pods()
        .delete("first", &DeleteParams::default().grace_period(0))
        .await?;
    let claims = node.claims();
    eventually(
        "the claim collected with its pod",
        Duration::from_secs(60),
        || async { Ok(claims.get_opt(&claim).await?.is_none().then_some(())) },
    )
    .await?;
    let gone_at = Instant::now();
    drop(kubelet);
    println!(
        "kubelet back without DRA state after {:.1?}",
        gone_at.elapsed()
    );

    // The kubelet stops the sandbox of the pod it no longer knows (the device comes home
    // through NRI) but never unprepares the claim; knic withholds the device, then unprepares.
    let withheld_seen = std::cell::Cell::new(false);
    eventually(
        "knic unprepared the orphaned claim",
        Duration::from_secs(120),
        || {
            let withheld = &withheld_seen;
            let (node, dev, uid) = (&*node, &dev, &uid);
            async move {
                let prepared = node.checkpoint()?.contains_key(uid);
                if prepared && on_host(dev) && !offered(node, dev).await? {
                    withheld.set(true);
                }
                Ok((!prepared).then_some(()))
            }
        },
    )
    .await?;
    println!(
        "orphan unprepared {:.1?} after the claim was deleted",
        gone_at.elapsed()
    );
    ensure!(
        withheld_seen.get(),
        "the device was offered while the orphaned claim was still prepared"
    );
    // The checkpoint shows the claim gone a moment before the driver logs it (CI read the
    // log in between once): the lines get a few seconds.
    let logged = eventually("the orphan's two log lines", Duration::from_secs(5), || {
        let logs = node.logs();
        async move {
            Ok((logs.contains("a prepared claim is gone from the API")
                && logs.contains("orphaned claim unprepared"))
            .then_some(()))
        }
    })
    .await;
    ensure!(
        logged.is_ok(),
        "the driver did not log the orphan's two steps"
    );
    let events: Api<Event> = Api::namespaced(node.cluster.client.clone(), &ns);
    let event = eventually("the Event", Duration::from_secs(30), || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("OrphanedClaimUnprepared")))
    })
    .await?;
    let note = event.note.unwrap_or_default();
    ensure!(
        note.starts_with(&format!(
            "knic unprepared claim {ns}/{claim} (uid {uid}) itself: its ResourceClaim no longer exists"
        )),
        "{note}"
    );
    eventually(
        "the device offered again",
        Duration::from_secs(30),
        || async { Ok(offered(node, &dev).await?.then_some(())) },
    )
    .await?;

    // The next pod gets the device: the one the stale checkpoint used to refuse.
    node.create_pod("second", &from_template).await?;
    node.running("second", WAIT).await?;
    let netns = node.pod_netns("second").await?;
    let name = netns
        .file_name()
        .context("netns path")?
        .to_string_lossy()
        .into_owned();
    let shown = ip(&["-n", &name, "addr", "show", "net1"])?;
    ensure!(shown.contains(ADDRESS), "net1 in the second pod: {shown}");
    Ok(())
}

async fn run(real: RealCluster) -> anyhow::Result<()> {
    let harness = real
        .harness
        .clone()
        .context("needs the harness kit to stop the kubelet")?;
    let mut node = RealNode::start(
        &real,
        "kubelet-state",
        "ks",
        &["192.0.2.1/24"],
        &[
            ("KNIC_ORPHAN_IDLE_SECONDS", "2"),
            ("KNIC_ORPHAN_GRACE_SECONDS", "8"),
        ],
    )
    .await?;
    let outcome = unpanicked(scenario(&mut node, &harness)).await;
    node.finish(outcome).await
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let real = knic_e2e::harness::real_cluster();
    let name = "real/kubelet_state_lost_claim_unprepared_by_knic".to_owned();
    let runnable = real.clone().filter(|r| r.harness.is_some());
    if real.is_some() && runnable.is_none() {
        eprintln!(
            "skipped: {name}: needs {} (the harness kit) to stop and start the kubelet",
            knic_e2e::gates::ENV_HARNESS
        );
    }
    let trials = vec![trial(name, runnable.is_none(), move || async move {
        run(runnable.context("no real cluster")?).await
    })];
    let conclusion = libtest_mimic::run(&args, trials);
    knic_e2e::driver::wait_for_the_kubelets_wipe();
    conclusion.exit();
}
