//! Kernel test: real links in a throwaway network namespace with its own sysfs mount. The test
//! process unshares its network and mount namespaces before any thread starts, so every link it
//! creates (all named `knt-*`), the sysfs mount and the fake API's loopback vanish with the
//! process, whatever happens. The real `knic-driver` runs inside it with netlink on and the
//! periodic rescan set to an hour, so every republish here is driven by link events.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use knic_e2e::cluster::Cluster;
use knic_e2e::driver::{DriverConfig, DriverProcess};
use knic_e2e::harness::{eventually, ip, isolate, trial, unisolate};

fn ip_batch(lines: &[String]) -> anyhow::Result<()> {
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), lines.join("\n") + "\n")?;
    ip(&["-batch", &file.path().to_string_lossy()]).map(|_| ())
}

async fn start(root: &Path, test: &str, include: &str) -> anyhow::Result<(Cluster, DriverProcess)> {
    let cluster = Cluster::fake(test).await?;
    cluster.ensure_node().await?;
    let config = DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig)
        .with_env("KNIC_SYSFS_ROOT", root.to_string_lossy())
        .with_env("KNIC_NETLINK", "true")
        .with_env("KNIC_INCLUDE", include)
        .with_env("KNIC_RESCAN_SECONDS", "3600");
    let driver = DriverProcess::start(&config)?;
    Ok((cluster, driver))
}

async fn devices(cluster: &Cluster) -> anyhow::Result<Vec<(String, Option<i64>)>> {
    Ok(cluster
        .slices()
        .await?
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| {
            (
                d.name.clone(),
                d.attributes
                    .as_ref()
                    .and_then(|a| a.get("mtu"))
                    .and_then(|m| m.int),
            )
        })
        .collect())
}

/// Deletes the links of a trial even if it failed half-way (the namespace dies with the
/// process anyway; this keeps trials independent).
struct Links(Vec<String>);
impl Drop for Links {
    fn drop(&mut self) {
        let _ = ip_batch(
            &self
                .0
                .iter()
                .map(|l| format!("link del {l}"))
                .collect::<Vec<_>>(),
        );
    }
}

async fn veth_lifecycle(root: PathBuf) -> anyhow::Result<()> {
    let (cluster, driver) = start(&root, "veth-lifecycle", "name=knt-a*").await?;
    let wait = |want: Vec<(&'static str, Option<i64>)>| {
        let cluster = &cluster;
        async move {
            let want: Vec<(String, Option<i64>)> =
                want.into_iter().map(|(n, m)| (n.to_string(), m)).collect();
            eventually("published devices", Duration::from_secs(15), || async {
                let got = devices(cluster).await?;
                Ok((got == want).then_some(()))
            })
            .await
        }
    };
    let result = async {
        wait(vec![]).await.context("the empty pool")?;
        let _links = Links(vec!["knt-a0".into()]);
        ip(&[
            "link", "add", "knt-a0", "type", "veth", "peer", "name", "knt-a1",
        ])?;
        wait(vec![("knt-a0", Some(1500)), ("knt-a1", Some(1500))])
            .await
            .context("veth pair appears")?;
        ip(&["link", "set", "knt-a0", "mtu", "9000"])?;
        wait(vec![("knt-a0", Some(9000)), ("knt-a1", Some(1500))])
            .await
            .context("MTU change")?;
        ip(&["link", "del", "knt-a0"])?;
        wait(vec![]).await.context("veth pair disappears")?;
        anyhow::Ok(())
    }
    .await;
    let cleanup = cluster.cleanup().await;
    result.map_err(|e| anyhow::anyhow!("{e:#}\n--- driver log ---\n{}", driver.logs()))?;
    cleanup
}

async fn burst_is_coalesced(root: PathBuf) -> anyhow::Result<()> {
    let (cluster, driver) = start(&root, "burst", "name=knt-b*").await?;
    let fake = cluster.fake.as_ref().context("fake API")?;
    let writes = || {
        fake.requests()
            .iter()
            .filter(|r| r.path.contains("/resourceslices") && r.method != "GET")
            .count()
    };
    let count = |n: usize| {
        let cluster = &cluster;
        async move {
            eventually("device count", Duration::from_secs(30), || async {
                Ok((devices(cluster).await?.len() == n).then_some(()))
            })
            .await
        }
    };
    let result = async {
        count(0).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = writes();
        // 128 veth pairs in one batch: 256 links, each with several netlink notifications.
        let names: Vec<String> = (0..128).map(|i| format!("knt-b{i:03}")).collect();
        let _links = Links(names.clone());
        ip_batch(
            &names
                .iter()
                .map(|n| format!("link add {n} type veth peer name {n}p"))
                .collect::<Vec<_>>(),
        )?;
        count(256).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let during = writes() - before;
        println!("burst: 256 links created, {during} slice writes");
        ensure!(
            during <= 8,
            "a burst of 256 link events cost {during} slice writes"
        );
        let slices = cluster.slices().await?;
        ensure!(
            slices.len() == 2,
            "256 devices need 2 slices, got {}",
            slices.len()
        );
        ensure!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 2));
        anyhow::Ok(())
    }
    .await;
    let cleanup = cluster.cleanup().await;
    result.map_err(|e| anyhow::anyhow!("{e:#}\n--- driver log ---\n{}", driver.logs()))?;
    cleanup
}

fn main() {
    let args = knic_e2e::harness::arguments();
    // Before anything else starts a thread.
    let isolated = isolate();
    if let Err(reason) = &isolated {
        eprintln!("skipped: kernel tests: {reason}");
    }
    let root = isolated.clone().unwrap_or_default();
    let ignored = isolated.is_err();
    let r1 = root.clone();
    let trials = vec![
        trial(
            "kernel/veth_lifecycle_republished".into(),
            ignored,
            move || veth_lifecycle(r1),
        ),
        trial(
            "kernel/burst_of_link_events_is_coalesced".into(),
            ignored,
            move || burst_is_coalesced(root),
        ),
    ];
    let conclusion = libtest_mimic::run(&args, trials);
    if let Ok(root) = &isolated {
        unisolate(root);
    }
    conclusion.exit();
}
