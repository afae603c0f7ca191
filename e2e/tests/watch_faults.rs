//! Watches that fail, end with an error event, expire (410) or are closed at once must not be
//! reopened in a tight loop, and must not stop the node from repairing what they would have
//! reported: the real `knic-driver` and the in-process controller against a fake API whose
//! watches misbehave on purpose. Fake API only: a real apiserver's watches cannot be made to
//! fail on demand (these trials are not registered for real clusters).

use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::ResourceSlice;
use knic_e2e::cluster::Cluster;
use knic_e2e::driver::{DriverConfig, DriverProcess};
use knic_e2e::fakeapi::{FakeApi, WatchFault};
use knic_e2e::harness::{eventually, trial};
use kube::Api;
use kube::api::DeleteParams;

/// How long request counts are observed.
const WINDOW: Duration = Duration::from_secs(6);
/// Watch requests allowed in [`WINDOW`]: paced, a failing watch is reopened after 0.25-0.5 s,
/// then twice that each time (about 5 in 6 s); unpaced it was thousands.
const MAX_WATCHES: usize = 12;

fn watches(fake: &FakeApi, resource: &str) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(&format!("/{resource}")))
        .filter(|r| r.query.contains("watch=true") || r.query.contains("watch=1"))
        .count()
}

/// Watch requests for `resource` during [`WINDOW`], while `fault` is on.
async fn watches_during_window(fake: &FakeApi, resource: &str) -> usize {
    let before = watches(fake, resource);
    tokio::time::sleep(WINDOW).await;
    watches(fake, resource) - before
}

/// A fake API whose watches of `resource` misbehave from the start (a watch opened before
/// the fault would live on healthy), and the driver against it.
async fn start_driver(
    test: &str,
    resource: &str,
    fault: WatchFault,
) -> anyhow::Result<(Cluster, DriverProcess)> {
    let cluster = Cluster::fake(test).await?;
    cluster
        .fake
        .as_ref()
        .context("fake API")?
        .fault_watches(resource, Some(fault));
    cluster.ensure_node().await?;
    let config = DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig);
    let driver = DriverProcess::start(&config)?;
    eventually(
        "the driver publishes its slices",
        Duration::from_secs(20),
        || async { Ok((!cluster.slices().await?.is_empty()).then_some(())) },
    )
    .await?;
    Ok((cluster, driver))
}

/// The driver's ResourceSlice watch under `fault`: paced, and a slice someone deletes comes
/// back within seconds although no watch event reports the deletion.
async fn driver_slice_watch(fault: WatchFault, test: &str) -> anyhow::Result<()> {
    let (cluster, driver) = start_driver(test, "resourceslices", fault).await?;
    let fake = cluster.fake.as_ref().context("fake API")?;
    let during = watches_during_window(fake, "resourceslices").await;
    ensure!(
        during <= MAX_WATCHES,
        "{fault:?}: {during} ResourceSlice watch requests in {WINDOW:?}"
    );
    ensure!(
        during >= 1,
        "{fault:?}: the driver stopped watching altogether"
    );

    let api: Api<ResourceSlice> = Api::all(cluster.client.clone());
    let slices = cluster.slices().await?;
    let victim = slices
        .first()
        .and_then(|s| s.metadata.name.clone())
        .context("a published slice")?;
    api.delete(&victim, &DeleteParams::default()).await?;
    let started = tokio::time::Instant::now();
    eventually(
        "the deleted slice is published again while the watch fails",
        Duration::from_secs(12),
        || async { Ok((!cluster.slices().await?.is_empty()).then_some(())) },
    )
    .await
    .with_context(|| format!("{fault:?}; driver log:\n{}", driver.logs()))?;
    eprintln!(
        "{fault:?}: {during} slice watches in {WINDOW:?}; deleted slice back after {:?}",
        started.elapsed()
    );
    Ok(())
}

/// The driver's Networks watch (a kube-runtime reflector) with streams that close at once:
/// kube-runtime reopens such a watch without backing off, so only the client's pacing bounds it.
async fn driver_networks_watch_closed() -> anyhow::Result<()> {
    let (cluster, _driver) = start_driver("net-closed", "networks", WatchFault::Closed).await?;
    let fake = cluster.fake.as_ref().context("fake API")?;
    let during = watches_during_window(fake, "networks").await;
    ensure!(
        (1..=MAX_WATCHES).contains(&during),
        "{during} Network watch requests in {WINDOW:?}"
    );
    Ok(())
}

/// The controller's watches (reconciler and availability caches), paced by its client.
async fn controller_watches_closed() -> anyhow::Result<()> {
    let cluster = Cluster::fake("ctl-closed").await?;
    let fake = cluster.fake.as_ref().context("fake API")?;
    for resource in [
        "networks",
        "resourceslices",
        "resourceclaims",
        "deviceclasses",
    ] {
        fake.fault_watches(resource, Some(WatchFault::Closed));
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = knic_controller::reconcile::Config {
        instance: Some("knic-e2e-watch-faults".into()),
        ..knic_controller::reconcile::Config::default()
    };
    let client = knic_controller::client::paced(cluster.client.clone());
    let controller = tokio::spawn(knic_controller::reconcile::run(client, config, async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut counts = Vec::new();
    let before: Vec<usize> = ["networks", "resourceslices"]
        .iter()
        .map(|r| watches(fake, r))
        .collect();
    tokio::time::sleep(WINDOW).await;
    for (r, b) in ["networks", "resourceslices"].iter().zip(before) {
        counts.push((*r, watches(fake, r) - b));
    }
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), controller).await;
    // The reconciler and the availability loop each watch Networks.
    ensure!(
        counts
            .iter()
            .all(|(r, n)| *n <= 2 * MAX_WATCHES && (*r != "networks" || *n >= 1)),
        "watch requests in {WINDOW:?}: {counts:?}"
    );
    Ok(())
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let trials = vec![
        trial("fake/driver_slice_watch_error_event".into(), false, || {
            driver_slice_watch(WatchFault::ErrorEvent, "wf-error")
        }),
        trial("fake/driver_slice_watch_expired".into(), false, || {
            driver_slice_watch(WatchFault::Expired, "wf-expired")
        }),
        trial("fake/driver_slice_watch_closed".into(), false, || {
            driver_slice_watch(WatchFault::Closed, "wf-closed")
        }),
        trial(
            "fake/driver_networks_watch_closed".into(),
            false,
            driver_networks_watch_closed,
        ),
        trial(
            "fake/controller_watches_closed".into(),
            false,
            controller_watches_closed,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
