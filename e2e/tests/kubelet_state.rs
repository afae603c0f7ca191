//! The kubelet loses its DRA state under a running pod (a node reinstall, a wiped
//! `/var/lib/kubelet`), as found on the real cluster: the pod is deleted while the kubelet is
//! down, its generated claim is collected, and the kubelet comes back knowing nothing of the
//! claim, so it never unprepares it. knic must notice (the claim is gone from the API and no pod
//! uses it), withhold the device from its slice meanwhile, unprepare the claim itself after the
//! grace with an Event, and give the device to the next pod.
//!
//! Real cluster only (`KNIC_E2E_KUBECONFIG`), with the harness kit (`KNIC_E2E_HARNESS`) to stop
//! and start the node's kubelet; otherwise reported ignored with the reason.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::driver::{DriverConfig, DriverProcess};
use knic_e2e::gates::Harness;
use knic_e2e::harness::{eventually, ip, trial, unpanicked};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

const DEV: &str = "knt-ks0";
const ADDRESS: &str = "192.0.2.31/24";

/// The node's kubelet, started again by the guard whatever happened to the test.
struct Kubelet<'a>(&'a Harness);

impl Drop for Kubelet<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.restart("kubelet") {
            eprintln!("error: could not start the kubelet again: {e:#}");
        }
    }
}

/// The host link playing the NIC, removed whatever happened.
struct Veth;

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", DEV]);
    }
}

fn pod(namespace: &str, name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "resourceClaims": [{"name": "net", "resourceClaimTemplateName": "nic"}],
            "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "net"}]}}],
            "terminationGracePeriodSeconds": 1,
        },
    }))?)
}

/// The generated claim of a running pod: its name and UID.
async fn running_with_claim(pods: &Api<Pod>, name: &str) -> anyhow::Result<(String, String)> {
    eventually(
        &format!("pod {name} Running with its claim"),
        Duration::from_secs(180),
        || async {
            let p = pods.get(name).await?;
            let status = p.status.unwrap_or_default();
            let claim = status
                .resource_claim_statuses
                .unwrap_or_default()
                .into_iter()
                .find_map(|s| s.resource_claim_name);
            Ok((status.phase.as_deref() == Some("Running"))
                .then_some(claim)
                .flatten()
                .map(|c| (c, p.metadata.uid.unwrap_or_default())))
        },
    )
    .await
}

fn checkpoint(plugin_dir: &Path) -> String {
    std::fs::read_to_string(plugin_dir.join("checkpoint.json")).unwrap_or_default()
}

async fn offered(cluster: &Cluster) -> anyhow::Result<bool> {
    let slices = cluster.slices().await?;
    Ok(slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .any(|d| {
            d.attributes.as_ref().is_some_and(|a| {
                a.get("ifName")
                    .and_then(|v| v.string.as_deref())
                    .is_some_and(|n| n == DEV)
            })
        }))
}

async fn scenario(
    real: &RealCluster,
    harness: &Harness,
    cluster: &Cluster,
    driver: &mut DriverProcess,
    config: &DriverConfig,
) -> anyhow::Result<()> {
    let ns = &cluster.namespace;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(cluster.client.clone(), ns);
    let class = format!("{ns}.knic.dev");
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
    templates.create(&PostParams::default(), &template).await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client.clone(), ns);

    pods.create(&PostParams::default(), &pod(ns, "first")?)
        .await?;
    let (claim, _) = running_with_claim(&pods, "first").await?;
    let uid = claims
        .get(&claim)
        .await?
        .metadata
        .uid
        .context("claim uid")?;
    ensure!(checkpoint(&config.plugin_dir).contains(&uid));
    ensure!(
        ip(&["-o", "link", "show", DEV]).is_err(),
        "{DEV} is still on the host while the pod runs"
    );

    // The kubelet goes down and comes back with no DRA state; meanwhile the pod is deleted
    // from the API (force, as nothing runs to confirm it) and its claim is collected.
    let kubelet = Kubelet(harness);
    harness.stop("kubelet")?;
    let state = real.kubelet_dir.join("dra_manager_state");
    std::fs::remove_file(&state).with_context(|| format!("wiping {}", state.display()))?;
    pods.delete("first", &DeleteParams::default().grace_period(0))
        .await?;
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
            let prepared = checkpoint(&config.plugin_dir).contains(&uid);
            let withheld = &withheld_seen;
            async move {
                if prepared && ip(&["-o", "link", "show", DEV]).is_ok() && !offered(cluster).await?
                {
                    withheld.set(true);
                }
                Ok((!prepared).then_some(()))
            }
        },
    )
    .await?;
    let withheld_seen = withheld_seen.get();
    println!(
        "orphan unprepared {:.1?} after the claim was deleted",
        gone_at.elapsed()
    );
    ensure!(
        withheld_seen,
        "the device was offered while the orphaned claim was still prepared"
    );
    let logs = driver.logs();
    ensure!(
        logs.contains("a prepared claim is gone from the API")
            && logs.contains("orphaned claim unprepared"),
        "driver log:\n{logs}"
    );
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), ns);
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
        || async { Ok(offered(cluster).await?.then_some(())) },
    )
    .await?;

    // The next pod gets the device: the one the stale checkpoint used to refuse.
    pods.create(&PostParams::default(), &pod(ns, "second")?)
        .await?;
    running_with_claim(&pods, "second").await?;
    let mut found = false;
    for entry in std::fs::read_dir("/var/run/netns")? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if ip(&["-n", &name, "addr", "show", "net1"]).is_ok_and(|o| o.contains(ADDRESS)) {
            found = true;
        }
    }
    ensure!(found, "no pod namespace has net1 with {ADDRESS}");
    pods.delete("second", &DeleteParams::default()).await?;
    eventually("the device home", Duration::from_secs(120), || async {
        Ok(ip(&["-o", "link", "show", DEV]).is_ok().then_some(()))
    })
    .await?;
    Ok(())
}

async fn run(real: RealCluster) -> anyhow::Result<()> {
    let harness = real
        .harness
        .clone()
        .context("needs the harness kit to stop the kubelet")?;
    let cluster = Cluster::real(&real, "kubelet-state").await?;
    ip(&[
        "link", "add", DEV, "type", "veth", "peer", "name", "knt-ks1",
    ])?;
    let _veth = Veth;
    ip(&["link", "set", DEV, "up"])?;
    let config = DriverConfig::under(cluster.tmp.path(), &real.node, &real.kubeconfig)
        .with_env("KNIC_SYSFS_ROOT", "/")
        .with_env("KNIC_NETLINK", "true")
        .with_env("KNIC_INCLUDE", format!("name={DEV}"))
        .with_env("KNIC_KUBELET_ROOT_DIR", real.kubelet_dir.to_string_lossy())
        .with_env(
            "KNIC_REGISTRY_DIR",
            real.kubelet_dir.join("plugins_registry").to_string_lossy(),
        )
        .with_env(
            "KNIC_PLUGIN_DIR",
            real.kubelet_dir.join("plugins/knic.dev").to_string_lossy(),
        )
        .with_env("KNIC_NRI_SOCKET", real.nri_socket.to_string_lossy())
        .with_env("KNIC_CDI_DIR", "/var/run/cdi")
        .with_env("KNIC_ORPHAN_IDLE_SECONDS", "2")
        .with_env("KNIC_ORPHAN_GRACE_SECONDS", "8")
        .without_stand_in_runtime();
    let config = DriverConfig {
        plugin_dir: real.kubelet_dir.join("plugins/knic.dev"),
        ..config
    };
    let mut driver = DriverProcess::start(&config)?;
    let classes: Api<DeviceClass> = Api::all(cluster.client.clone());
    let class_name = format!("{}.knic.dev", cluster.namespace);
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": class_name},
        "spec": {"selectors": [{"cel": {"expression": format!(
            "device.driver == \"knic.dev\" && device.attributes[\"knic.dev\"].ifName == \"{DEV}\"")}}]},
    }))?;
    classes.create(&PostParams::default(), &class).await?;
    let outcome = unpanicked(scenario(&real, &harness, &cluster, &mut driver, &config)).await;
    let _ = classes.delete(&class_name, &DeleteParams::default()).await;
    let cleanup = cluster.cleanup().await;
    let _ = driver.terminate().await;
    match outcome {
        Ok(()) => cleanup,
        Err(e) => anyhow::bail!("{e:#}\n--- driver log ---\n{}", driver.logs()),
    }
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
    libtest_mimic::run(&args, trials).exit();
}
