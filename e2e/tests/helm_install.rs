//! `helm install` of the chart with the image charts/image/build.sh builds, on the real
//! cluster, and `helm uninstall` leaving the node as it was.
//!
//! One trial, `real/helm_install_…`, against the shared single-node cluster (../shared/harness):
//! the image is built (`--profile dev`, static binaries) and imported into the harness's
//! containerd; the chart is installed by Helm v4's own engine (knic_e2e::helm::release) into a
//! fresh namespace with `image.pullPolicy: Never` and a driver filter offering only a veth made
//! for the test, the webhook on (the chart's default, its self-signed certificate) and its
//! Service routed by the harness's `route-service` (the cluster has no kube-proxy; the DNAT
//! stays on this machine). Then: the DaemonSet and the controller are Ready, the driver is
//! registered with the real kubelet and publishes the veth; a pod with a claim gets the
//! interface (name, MTU, address checked in its network namespace, a UDP echo to the veth's
//! peer), and deleting it puts the device back as it was; `helm uninstall` removes everything
//! of the release, the driver's graceful stop removes its empty checkpoint and CDI hook, the
//! kubelet wipes the node's slices, and the node is compared with how it was before.
//!
//! Reported ignored, with the reason printed, without a cluster (`KNIC_E2E_KUBECONFIG`), the
//! harness (`HARNESS_DIR`, its `route-service`) or a usable buildah; failed instead when
//! `KNIC_E2E_REQUIRE_IMAGE=1`, so CI can insist it runs. Run it under the cluster lock.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use knic_e2e::cluster::{Cluster, ENV_KUBECONFIG, RealCluster};
use knic_e2e::harness::{Netns, eventually, ip, trial};
use knic_e2e::helm::{self, Rendered, release};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use libtest_mimic::{Failed, Trial};
use serde_json::{Value, json};

#[path = "helm_install/cleanup.rs"]
mod cleanup;
#[path = "helm_install/node.rs"]
mod node;
#[path = "helm_install/pod.rs"]
mod pod;

const TRIAL: &str =
    "real/helm_install_a_pod_gets_its_interface_and_uninstall_leaves_the_node_as_it_was";
/// Set to `1` to fail, not skip, when the trial cannot run.
const ENV_REQUIRE: &str = "KNIC_E2E_REQUIRE_IMAGE";
/// The harness's data directory (`up` prints it): its `bin/ctr` imports the image.
const ENV_HARNESS_DIR: &str = "HARNESS_DIR";
/// The veth the driver is given to publish, its peer, and the peer's namespace.
const HOST_LINK: &str = "knt-h0";
const PEER_LINK: &str = "knt-h1";
const PEER_NS: &str = "knt-helm-peer";
/// TEST-NET-2: the host's own 192.0.2.0/24 (the node's address) is not reused.
const POD_ADDR: &str = "198.51.100.10/24";
const PEER_ADDR: &str = "198.51.100.1";
const POD_IF: &str = "data0";
const POD_MTU: u32 = 1400;
/// How long Helm waits for the release to be ready, or gone.
const HELM_TIMEOUT: Duration = Duration::from_secs(240);
const WAIT: Duration = Duration::from_secs(180);

/// The values the test installs with: the imported image, and only the test's veth offered.
fn values() -> Value {
    json!({
        "image": {"pullPolicy": "Never"},
        "driver": {"filter": {"include": [format!("name={HOST_LINK}")]}},
    })
}

/// The harness kit's `route-service`: `../shared/harness` beside the repository.
fn route_service() -> PathBuf {
    knic_e2e::image::repo().join("../shared/harness/route-service")
}

/// The cluster to run against, or why the trial cannot run here.
fn runnable(real: Option<RealCluster>) -> Result<RealCluster, String> {
    let Some(real) = real else {
        return Err(format!("{ENV_KUBECONFIG} is not set (no real cluster)"));
    };
    if std::env::var_os(ENV_HARNESS_DIR).is_none() {
        return Err(format!(
            "{ENV_HARNESS_DIR} is not set: the image is imported with the harness's ctr (source \
             the environment `../shared/harness/up` printed)"
        ));
    }
    if !route_service().is_file() {
        return Err(format!(
            "{} not found: the webhook's Service is routed with the harness's route-service",
            route_service().display()
        ));
    }
    match knic_e2e::image::buildah_unusable() {
        Some(reason) => Err(reason),
        None => Ok(real),
    }
}

/// One run's state: what it made, so [`cleanup::Cleanup`] undoes exactly that.
pub struct Run {
    real: RealCluster,
    harness: PathBuf,
    cluster: Cluster,
    rendered: Rendered,
    /// containerd's image references before the import: the import's new ones are removed.
    image_refs: Option<BTreeSet<String>>,
    /// DeviceClasses of the chart's names that existed, not Helm's: put back at the end.
    moved: Vec<DeviceClass>,
    installed: bool,
    uninstalled: bool,
    /// The chart's CRDs the install made (none existed): deleted at the end.
    crds_made: Vec<String>,
    /// The webhook Service's ClusterIP, once routed.
    vip: Option<String>,
    peer: Option<Netns>,
    slices_before: usize,
    started: Instant,
    phases: Vec<String>,
}

impl Run {
    fn phase(&mut self, what: &str, since: Instant) {
        let line = format!("{what}: {:.1} s", since.elapsed().as_secs_f64());
        println!("helm_install: {line}");
        self.phases.push(line);
    }

    fn kubeconfig(&self) -> &Path {
        &self.real.kubeconfig
    }

    fn ns(&self) -> &str {
        &self.cluster.namespace
    }
}

/// containerd's image references (`ctr images ls`: the names, and the `sha256:` aliases its
/// CRI plugin adds) with the manifest digest each points at.
fn image_refs(harness: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    Ok(ctr(harness, &["images", "ls"])?
        .lines()
        .skip(1)
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            Some((fields.first()?.to_string(), fields.get(2)?.to_string()))
        })
        .collect())
}

fn ctr(harness: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(harness.join("bin/ctr"))
        .args(["-n", "k8s.io"])
        .args(args)
        .output()
        .context("running the harness's ctr")?;
    ensure!(
        out.status.success(),
        "ctr {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The chart's image as Helm renders it with the test's values.
fn rendered_image(rendered: &Rendered) -> anyhow::Result<String> {
    rendered
        .all::<DaemonSet>()
        .first()
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.clone())
        .context("the chart renders no DaemonSet image")
}

/// Builds the image and imports it into the harness's containerd.
async fn image(run: &mut Run) -> anyhow::Result<()> {
    let started = Instant::now();
    let archive = run.cluster.tmp.path().join("knic.oci.tar");
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("image-build");
    let built = {
        let archive = archive.clone();
        tokio::task::spawn_blocking(move || knic_e2e::image::build("dev", &archive, &target))
            .await??
    };
    let want = rendered_image(&run.rendered)?;
    ensure!(
        built.reference == want,
        "build.sh tagged {}, the chart runs {want}",
        built.reference
    );
    run.phase("image build (build.sh --profile dev)", started);
    let started = Instant::now();
    let before = image_refs(&run.harness)?;
    run.image_refs = Some(before.keys().cloned().collect());
    ctr(
        &run.harness,
        &["images", "import", &archive.to_string_lossy()],
    )?;
    ensure!(
        image_refs(&run.harness)?.contains_key(&built.reference),
        "containerd has no {} after the import",
        built.reference
    );
    run.phase("image import (ctr -n k8s.io images import)", started);
    Ok(())
}

/// The veth the driver publishes: `knt-h0` on the host (down, no address), its peer with the
/// address the pod talks to in a namespace of its own.
fn make_veth(run: &mut Run) -> anyhow::Result<()> {
    let peer = Netns::new(PEER_NS)?;
    run.peer = Some(peer);
    ip(&[
        "link", "add", HOST_LINK, "type", "veth", "peer", "name", PEER_LINK, "netns", PEER_NS,
    ])?;
    ip(&[
        "-n",
        PEER_NS,
        "addr",
        "add",
        &format!("{PEER_ADDR}/24"),
        "dev",
        PEER_LINK,
    ])?;
    ip(&["-n", PEER_NS, "link", "set", PEER_LINK, "up"])?;
    Ok(())
}

/// DeviceClasses with the chart's names that exist and are not Helm's (an earlier test, or
/// `kubectl apply -f deviceclasses/`) would make Helm refuse the install: they are moved
/// aside and put back at the end. Any other object of the chart that exists already stops
/// the test before it changes anything.
async fn clear_the_way(run: &mut Run) -> anyhow::Result<()> {
    let classes: Api<DeviceClass> = Api::all(run.cluster.client.clone());
    for object in cleanup::cluster_scoped(&run.rendered) {
        let (kind, name) = (object["kind"].as_str(), object["metadata"]["name"].as_str());
        let (Some(kind), Some(name)) = (kind, name) else {
            continue;
        };
        if kind == "CustomResourceDefinition" {
            continue;
        }
        let Some(existing) = cleanup::get(&run.cluster.client, &object, None).await? else {
            continue;
        };
        if kind == "DeviceClass" {
            let class = classes.get(name).await?;
            classes.delete(name, &DeleteParams::default()).await?;
            println!("helm_install: moved DeviceClass {name} aside (not Helm's); it is put back");
            run.moved.push(class);
            continue;
        }
        bail!(
            "{kind} {name} exists already ({}); helm install would refuse it: remove what an \
             earlier install or test left",
            existing["metadata"]["annotations"]
        );
    }
    Ok(())
}

/// Whether the install skips the chart's CRDs: when they exist already. Helm v4 server-side
/// applies crds/, so CRDs another field manager applied with other content (other twins apply
/// them from their own types) would be a conflict; a user whose CRDs are managed elsewhere
/// installs with `--skip-crds` too. When none exists Helm makes them, the uninstall keeps them
/// (Helm never deletes CRDs) and the cleanup deletes them.
async fn crds(run: &mut Run) -> anyhow::Result<bool> {
    let mut existing = Vec::new();
    let mut missing = Vec::new();
    for object in cleanup::cluster_scoped(&run.rendered) {
        if object["kind"] != "CustomResourceDefinition" {
            continue;
        }
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match cleanup::get(&run.cluster.client, &object, None).await? {
            Some(_) => existing.push(name),
            None => missing.push(name),
        }
    }
    match (existing.is_empty(), missing.is_empty()) {
        (true, _) => {
            run.crds_made = missing;
            Ok(false)
        }
        (false, true) => {
            println!("helm_install: the CRDs exist ({existing:?}): installing with --skip-crds");
            Ok(true)
        }
        (false, false) => bail!(
            "of the chart's CRDs {existing:?} exist and {missing:?} do not: apply \
             charts/knic/crds/ or delete them first"
        ),
    }
}

/// The driver pod of the DaemonSet, once it and the controller are Ready.
async fn running(run: &Run) -> anyhow::Result<String> {
    let ns = run.ns().to_owned();
    let client = run.cluster.client.clone();
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    let ds = daemonsets.get("knic-driver").await?;
    let status = ds.status.context("DaemonSet without status")?;
    ensure!(
        status.desired_number_scheduled == 1 && status.number_ready == 1,
        "DaemonSet knic-driver: {status:?}"
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = deployments.get("knic-controller").await?;
    let want = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let ready = deployment
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    ensure!(ready == want, "controller: {ready}/{want} replicas ready");
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let drivers = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=knic-driver"))
        .await?
        .items;
    let [driver] = drivers.as_slice() else {
        bail!("{} driver pods, want 1", drivers.len());
    };
    let spec = driver.spec.as_ref().context("driver pod without spec")?;
    ensure!(
        spec.node_name.as_deref() == Some(run.real.node.as_str()),
        "driver pod on {:?}",
        spec.node_name
    );
    let status = driver
        .status
        .as_ref()
        .context("driver pod without status")?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ensure!(
        status.phase.as_deref() == Some("Running") && ready,
        "driver pod {:?}, ready {ready}",
        status.phase
    );
    driver
        .metadata
        .name
        .clone()
        .context("driver pod without a name")
}

/// The driver is registered with the real kubelet and publishes the veth, and only it.
async fn registered(run: &Run) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let kubelet = &run.real.kubelet_dir;
    let registration = kubelet.join("plugins_registry/knic.dev-reg.sock");
    for socket in [&registration, &kubelet.join("plugins/knic.dev/dra.sock")] {
        let meta = std::fs::symlink_metadata(socket)
            .with_context(|| format!("{} is missing", socket.display()))?;
        ensure!(
            meta.file_type().is_socket(),
            "{} is not a socket",
            socket.display()
        );
    }
    let hook = kubelet.join("plugins/knic.dev/bin/knic-driver");
    ensure!(
        hook.is_file(),
        "the CDI hook {} is not installed",
        hook.display()
    );
    // /readyz holds only once the kubelet acknowledged the registration (and NRI is connected
    // and the slices are published); the DaemonSet is hostNetwork, so it is the node's port.
    let (code, body) = knic_e2e::driver::http_get("http://127.0.0.1:9461/readyz").await?;
    ensure!(code == 200, "driver /readyz {code}: {body}");
    let slices = published(run).await?;
    ensure!(
        slices.iter().any(|n| n == HOST_LINK),
        "the node's knic.dev slices do not offer {HOST_LINK}: {slices:?}"
    );
    ensure!(
        !slices
            .iter()
            .any(|n| ["eth0", "lo", "cni0"].contains(&n.as_str())),
        "the filter let host interfaces through: {slices:?}"
    );
    Ok(())
}

/// The interface names the node's knic.dev slices offer.
async fn published(run: &Run) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for slice in knic_slices(run).await? {
        for device in slice.spec.devices.iter().flatten() {
            let name = device
                .attributes
                .as_ref()
                .and_then(|a| a.get("knic.dev/ifName").or_else(|| a.get("ifName")))
                .and_then(|a| a.string.clone())
                .unwrap_or_else(|| device.name.clone());
            names.push(name);
        }
    }
    Ok(names)
}

async fn knic_slices(run: &Run) -> anyhow::Result<Vec<ResourceSlice>> {
    let api: Api<ResourceSlice> = Api::all(run.cluster.client.clone());
    let fields = format!("spec.nodeName={},spec.driver=knic.dev", run.real.node);
    Ok(api
        .list(&ListParams::default().fields(&fields))
        .await?
        .items)
}

/// Routes the webhook Service (no kube-proxy here) and shows the webhook answering: a claim
/// with a bad knic config is refused by it.
async fn route_webhook(run: &mut Run) -> anyhow::Result<()> {
    let services: Api<Service> = Api::namespaced(run.cluster.client.clone(), run.ns());
    let vip = services
        .get("knic-webhook")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("knic-webhook has no ClusterIP")?;
    run.vip = Some(vip.clone());
    let out = std::process::Command::new(route_service())
        .arg(format!("{}/knic-webhook", run.ns()))
        .env("KUBECONFIG", run.kubeconfig())
        .output()
        .context("running route-service")?;
    ensure!(
        out.status.success(),
        "route-service: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let claims: Api<ResourceClaim> = Api::namespaced(run.cluster.client.clone(), run.ns());
    let bad = pod::claim("bad", json!(["not-an-address"]))?;
    let refusal = eventually("the webhook answers", Duration::from_secs(30), || async {
        match claims.create(&PostParams::default(), &bad).await {
            Ok(_) => bail!("a claim with address \"not-an-address\" was accepted"),
            Err(kube::Error::Api(e)) if e.message.contains("denied the request") => {
                Ok(Some(e.message))
            }
            // Not reachable yet (the endpoints were just routed): asked again.
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    ensure!(
        refusal.contains("admission webhook \"resourceclaims.validate.knic.dev\" denied")
            && refusal.contains("not-an-address"),
        "refusal: {refusal}"
    );
    Ok(())
}

/// `helm uninstall`, then the driver's graceful stop (its log), the kubelet's slice wipe, and
/// the node and the API compared with before.
async fn uninstall(run: &mut Run, driver_pod: &str, before: &node::Node) -> anyhow::Result<()> {
    // Followed until the container exits: the lines of its graceful stop.
    let pods: Api<Pod> = Api::namespaced(run.cluster.client.clone(), run.ns());
    let follow = pod::follow_log(run, driver_pod);
    let started = Instant::now();
    let (kubeconfig, ns) = (run.kubeconfig().to_owned(), run.ns().to_owned());
    let outcome =
        tokio::task::spawn_blocking(move || release::uninstall(&kubeconfig, &ns, HELM_TIMEOUT))
            .await??;
    run.uninstalled = true;
    outcome.map_err(|refusal| anyhow::anyhow!("helm uninstall failed: {refusal}"))?;
    run.phase("helm uninstall (--wait)", started);
    eventually("the release's pods are gone", WAIT, || async {
        Ok(pods
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    run.phase("helm uninstall until its pods are gone", started);
    let log = pod::ended(follow).await?;
    ensure!(
        log.contains("nothing prepared: removed the empty checkpoint and the CDI hook"),
        "the driver's graceful stop did not tidy up; its last lines:\n{}",
        pod::tail(&log, 15)
    );
    let slices_gone = Instant::now();
    eventually(
        "the kubelet wipes the node's knic.dev slices",
        WAIT,
        || async { Ok(knic_slices(run).await?.is_empty().then_some(())) },
    )
    .await?;
    run.phase(
        "slices wiped by the kubelet after the uninstall",
        slices_gone,
    );

    // The webhook's DNAT is the test's own doing, not the release's: gone before the compare.
    if let Some(vip) = run.vip.take() {
        node::unroute(&vip)?;
    }
    let after = node::read(&run.real.kubelet_dir)?;
    let mut problems = node::differences(before, &after);
    for dir in node::made_dirs(before, &after) {
        if std::fs::read_dir(&dir)?.next().is_some() {
            problems.push(format!(
                "{} was made for the DaemonSet and is not empty",
                dir.display()
            ));
        } else {
            println!(
                "helm_install: {} (made by the kubelet for the DaemonSet's hostPath) stays, empty",
                dir.display()
            );
        }
    }
    for file in &after.files {
        problems.push(format!(
            "knic file on the node after the uninstall: {}",
            file.display()
        ));
    }
    problems.extend(cleanup::release_objects_left(run).await?);
    if !problems.is_empty() {
        let note = if before.files.is_empty() {
            String::new()
        } else {
            format!(
                "\n(knic files before the install, left by an earlier run: {:?})",
                before.files
            )
        };
        bail!(
            "the node or the API is not as before the install:\n{}{note}",
            problems.join("\n")
        );
    }
    Ok(())
}

async fn scenario(run: &mut Run) -> anyhow::Result<()> {
    image(run).await?;
    make_veth(run)?;
    // The node as the release will find it (with the test's veth): the uninstall must leave
    // exactly this.
    let before = node::read(&run.real.kubelet_dir)?;
    if !before.files.is_empty() {
        println!(
            "helm_install: knic files on the node before the install (an earlier run's): {:?}",
            before.files
        );
    }
    run.slices_before = knic_slices(run).await?.len();
    clear_the_way(run).await?;
    let skip_crds = crds(run).await?;

    let started = Instant::now();
    let (kubeconfig, ns) = (run.kubeconfig().to_owned(), run.ns().to_owned());
    run.installed = true;
    let outcome = tokio::task::spawn_blocking(move || {
        release::install(&kubeconfig, &ns, &values(), HELM_TIMEOUT, skip_crds)
    })
    .await??;
    let summary = outcome.map_err(|refusal| anyhow::anyhow!("helm install failed: {refusal}"))?;
    ensure!(summary["status"] == "deployed", "release: {summary}");
    run.phase(
        "helm install (--wait: DaemonSet and controller ready)",
        started,
    );
    running(run).await?;
    registered(run).await?;

    let started = Instant::now();
    route_webhook(run).await?;
    pod::pod_gets_its_interface(run).await?;
    run.phase(
        "a pod with a claim: Running, checked, the driver restarted, deleted, device back",
        started,
    );
    let driver_pod = running(run).await?;
    uninstall(run, &driver_pod, &before).await
}

async fn body(real: RealCluster) -> anyhow::Result<()> {
    let harness =
        PathBuf::from(std::env::var_os(ENV_HARNESS_DIR).context("HARNESS_DIR is not set")?);
    let cluster = Cluster::real(&real, "helm").await?;
    let rendered = {
        let values = values();
        tokio::task::spawn_blocking(move || helm::render(&values, Some("1.36.2"))).await??
    };
    let mut run = Run {
        real,
        harness,
        cluster,
        rendered,
        image_refs: None,
        moved: Vec::new(),
        installed: false,
        uninstalled: false,
        crds_made: Vec::new(),
        vip: None,
        peer: None,
        slices_before: 0,
        started: Instant::now(),
        phases: Vec::new(),
    };
    let outcome = scenario(&mut run).await;
    let cleaned = cleanup::Cleanup::undo(&mut run, outcome.is_err()).await;
    println!(
        "helm_install: total {:.1} s ({})",
        run.started.elapsed().as_secs_f64(),
        run.phases.join("; ")
    );
    match (outcome, cleaned) {
        (Ok(()), Ok(())) => Ok(()),
        (Ok(()), Err(e)) => Err(e.context("cleaning up after the test")),
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(c)) => Err(e.context(format!("and cleaning up failed too: {c:#}"))),
    }
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let real = match RealCluster::from_env() {
        Ok(real) => real,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    let required = std::env::var(ENV_REQUIRE).is_ok_and(|v| v == "1");
    let trial = match runnable(real) {
        Ok(real) => trial(TRIAL.into(), false, move || body(real)),
        Err(reason) if required => Trial::test(TRIAL, move || {
            Err(Failed::from(format!("{ENV_REQUIRE}=1, but: {reason}")))
        }),
        Err(reason) => {
            eprintln!("skipped: {TRIAL}: {reason}");
            Trial::test(TRIAL, || Ok(())).with_ignored_flag(true)
        }
    };
    libtest_mimic::run(&args, vec![trial]).exit();
}
