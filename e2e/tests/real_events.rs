//! Real twins of what the driver reports, as the node's real kubelet and runtime drive it:
//! `/readyz` while the unmodified kubelet registers the plugin and containerd's NRI accepts,
//! loses and accepts it again, and the Events knic writes when the kubelet's prepare or the
//! runtime's sandbox creation fails, next to the kubelet's own. The driver runs as the chart
//! deploys it: its ServiceAccount's token bound to the node, with the chart's RBAC and
//! admission policies applied, so its slices, claim status and Events pass them for real.
//! Run only against a real cluster (`KNIC_E2E_KUBECONFIG`), as root.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::driver::{DriverConfig, DriverProcess, http_get};
use knic_e2e::harness::{eventually, ip, trial};
use knic_e2e::nodeauth::{Leftovers, driver_identity};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;

/// The veth end the driver publishes (the other end stays on the host).
const DEVICE: &str = "knt-ev0";
const PEER: &str = "knt-ev1";

/// A byte relay from a socket of the test's to the runtime's NRI socket: the driver talks to
/// the real containerd through it, and the test can cut the connection (what the driver sees
/// when the runtime restarts: the socket closes) and refuse new ones, without touching the
/// runtime every other pod on the node depends on.
struct Relay {
    path: PathBuf,
    target: PathBuf,
    accept: Option<JoinHandle<()>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    fn new(path: PathBuf, target: &Path) -> Relay {
        Relay {
            path,
            target: target.to_owned(),
            accept: None,
            connections: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Listens, relaying every connection to the runtime.
    fn open(&mut self) -> anyhow::Result<()> {
        let _ = std::fs::remove_file(&self.path);
        let listener = UnixListener::bind(&self.path)?;
        let (target, connections) = (self.target.clone(), self.connections.clone());
        self.accept = Some(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let relay = tokio::spawn(async move {
                    if let Ok(mut outbound) = UnixStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                connections
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(relay);
            }
        }));
        Ok(())
    }

    /// Closes every relayed connection (both ends see it closed) and stops listening.
    fn cut(&mut self) {
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
        for relay in self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            relay.abort();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

/// One twin's cluster side and its device.
struct Env {
    real: RealCluster,
    cluster: Cluster,
    leftovers: Leftovers,
    /// The driver's kubeconfig: its node-bound token.
    kubeconfig: PathBuf,
}

impl Env {
    /// The driver for the real node: the kubelet's own plugin directories (or, with
    /// `kubelet: false`, directories the kubelet never looks at), NRI at `nri`, the host's
    /// devices filtered to the test's veth, `/metrics` and `/readyz` on a free loopback port.
    fn driver(&self, kubelet: bool, nri: &Path) -> anyhow::Result<(DriverConfig, String)> {
        let real = &self.real;
        let (registry, plugin) = if kubelet {
            (
                real.kubelet_dir.join("plugins_registry"),
                real.kubelet_dir.join("plugins/knic.dev"),
            )
        } else {
            let dir = self.cluster.tmp.path();
            (dir.join("plugins_registry"), dir.join("plugins/knic.dev"))
        };
        DriverConfig::under(self.cluster.tmp.path(), &real.node, &self.kubeconfig)
            .with_env("KNIC_SYSFS_ROOT", "/")
            .with_env("KNIC_NETLINK", "true")
            .with_env("KNIC_INCLUDE", format!("name={DEVICE}"))
            .with_env("KNIC_KUBELET_ROOT_DIR", real.kubelet_dir.to_string_lossy())
            .with_env("KNIC_REGISTRY_DIR", registry.to_string_lossy())
            .with_env("KNIC_PLUGIN_DIR", plugin.to_string_lossy())
            .with_env("KNIC_NRI_SOCKET", nri.to_string_lossy())
            .with_env("KNIC_CDI_DIR", "/var/run/cdi")
            .without_stand_in_runtime()
            .with_http()
    }
}

type Body = for<'a> fn(&'a mut Env) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + 'a>>;

/// A namespace, the chart's identity for the driver, and the veth; all removed afterwards.
async fn run(real: RealCluster, test: &str, body: Body) -> anyhow::Result<()> {
    let cluster = Cluster::real(&real, test).await?;
    let mut leftovers = Leftovers::new(&real.kubeconfig);
    // Also on a panic, when the cleanup below never runs.
    leftovers.track::<Namespace>(&cluster.namespace);
    /// Deletes the veth pair when dropped, also on a panic.
    struct Veth;
    impl Drop for Veth {
        fn drop(&mut self) {
            let _ = ip(&["link", "del", DEVICE]);
        }
    }
    let veth = Veth;
    let setup = async {
        ip(&["link", "add", DEVICE, "type", "veth", "peer", "name", PEER])?;
        ip(&["link", "set", DEVICE, "up"])?;
        driver_identity(&cluster, &mut leftovers).await
    }
    .await;
    let (outcome, mut leftovers, cluster) = match setup {
        Ok(identity) => {
            let mut env = Env {
                real,
                cluster,
                leftovers,
                kubeconfig: identity.kubeconfig,
            };
            let outcome = body(&mut env).await;
            (outcome, env.leftovers, env.cluster)
        }
        Err(e) => (Err(e), leftovers, cluster),
    };
    drop(veth);
    let cleaned = cluster.cleanup().await;
    let removed = leftovers.remove().await;
    outcome?;
    removed?;
    cleaned
}

/// `/readyz` answers `status` with `body` within `within`; every distinct answer on the way
/// is printed.
async fn readyz(base: &str, status: u16, body: &str, within: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    let url = format!("{base}/readyz");
    let mut last: Option<(u16, String)> = None;
    loop {
        match http_get(&url).await {
            Ok(answer) => {
                if last.as_ref() != Some(&answer) {
                    println!("/readyz: {} {:?}", answer.0, answer.1);
                }
                if answer.0 == status && answer.1 == body {
                    return Ok(());
                }
                last = Some(answer);
            }
            Err(e) => last = Some((0, format!("{e:#}"))),
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "/readyz did not answer {status} {body:?} within {within:?}; last {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `/readyz` keeps answering `status` with `body` for `period`.
async fn readyz_holds(base: &str, status: u16, body: &str, period: Duration) -> anyhow::Result<()> {
    let until = tokio::time::Instant::now() + period;
    while tokio::time::Instant::now() < until {
        let (s, b) = http_get(&format!("{base}/readyz")).await?;
        ensure!(s == status && b == body, "/readyz turned {s} {b:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The value of the unlabelled metric `name` on `/metrics`.
async fn gauge(base: &str, name: &str) -> anyhow::Result<String> {
    let (_, text) = http_get(&format!("{base}/metrics")).await?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .map(str::to_owned)
        .with_context(|| format!("no {name} on /metrics"))
}

const NOT_REGISTERED: &str = "not ready: kubelet registration acknowledged\n";
const NO_NRI: &str = "not ready: NRI plugin connected\n";
const READY: &str = "ok\n";

/// `/readyz` needs both: with the runtime's NRI connected but no kubelet ever acknowledging
/// the registration it stays not ready; with the real kubelet's acknowledgement but no NRI it
/// stays not ready; with both it is ready; the runtime's connection lost makes it not ready
/// until the driver is back in the runtime.
async fn readyz_follows_the_kubelet_and_the_runtime(env: &mut Env) -> anyhow::Result<()> {
    let wait = Duration::from_secs(60);
    let mut relay = Relay::new(
        env.cluster.tmp.path().join("nri-relay.sock"),
        &env.real.nri_socket,
    );
    // No kubelet: the registration socket sits where the kubelet never looks.
    relay.open()?;
    let (config, base) = env.driver(false, &relay.path)?;
    let mut driver = DriverProcess::start(&config)?;
    let first = async {
        readyz(&base, 503, NOT_REGISTERED, wait).await?;
        readyz_holds(&base, 503, NOT_REGISTERED, Duration::from_secs(3)).await?;
        ensure!(gauge(&base, "knic_driver_nri_connected").await? == "1");
        ensure!(gauge(&base, "knic_driver_kubelet_registered").await? == "0");
        ensure!(http_get(&format!("{base}/healthz")).await? == (200, READY.into()));
        anyhow::Ok(())
    }
    .await;
    let _ = driver.terminate().await;
    first.with_context(|| format!("without the kubelet; driver log:\n{}", driver.logs()))?;

    // The real kubelet, and the runtime held back.
    relay.cut();
    let (config, base) = env.driver(true, &relay.path)?;
    let mut driver = DriverProcess::start(&config)?;
    let second = async {
        readyz(&base, 503, NO_NRI, wait).await?;
        ensure!(gauge(&base, "knic_driver_kubelet_registered").await? == "1");
        readyz_holds(&base, 503, NO_NRI, Duration::from_secs(3)).await?;
        relay.open()?;
        readyz(&base, 200, READY, wait).await?;
        ensure!(gauge(&base, "knic_driver_nri_connected").await? == "1");
        // The runtime's end closes, as when containerd restarts; nothing answers for a while.
        relay.cut();
        readyz(&base, 503, NO_NRI, Duration::from_secs(10)).await?;
        ensure!(gauge(&base, "knic_driver_nri_connected").await? == "0");
        readyz_holds(&base, 503, NO_NRI, Duration::from_secs(2)).await?;
        relay.open()?;
        readyz(&base, 200, READY, wait).await?;
        ensure!(http_get(&format!("{base}/healthz")).await? == (200, READY.into()));
        anyhow::Ok(())
    }
    .await;
    let _ = driver.terminate().await;
    second.with_context(|| format!("with the kubelet; driver log:\n{}", driver.logs()))
}

/// A DeviceClass for the test's veth, a claim for it with `config`, and a pod using it.
async fn pod_with_config(env: &mut Env, config: serde_json::Value) -> anyhow::Result<()> {
    let ns = env.cluster.namespace.clone();
    let class_name = format!("{ns}.knic.dev");
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": class_name},
        "spec": {"selectors": [{"cel": {"expression": format!(
            "device.driver == \"knic.dev\" && device.attributes[\"knic.dev\"].ifName == \"{DEVICE}\"")}}]},
    }))?;
    env.leftovers.track::<DeviceClass>(&class_name);
    let post = PostParams::default();
    Api::<DeviceClass>::all(env.cluster.client.clone())
        .create(&post, &class)
        .await?;
    let mut parameters = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig"});
    if let (Some(p), Some(extra)) = (parameters.as_object_mut(), config.as_object()) {
        p.extend(extra.clone());
    }
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "nic", "namespace": ns},
        "spec": {"devices": {
            "requests": [{"name": "nic", "exactly": {"deviceClassName": class_name}}],
            "config": [{"requests": ["nic"],
                        "opaque": {"driver": "knic.dev", "parameters": parameters}}],
        }},
    }))?;
    Api::<ResourceClaim>::namespaced(env.cluster.client.clone(), &ns)
        .create(&post, &claim)
        .await?;
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "with-nic", "namespace": ns},
        "spec": {
            "resourceClaims": [{"name": "net", "resourceClaimName": "nic"}],
            "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "net"}]}}],
            "terminationGracePeriodSeconds": 1,
        },
    }))?;
    Api::<Pod>::namespaced(env.cluster.client.clone(), &ns)
        .create(&post, &pod)
        .await?;
    Ok(())
}

/// The Events of the test's namespace.
async fn events(env: &Env) -> anyhow::Result<Vec<Event>> {
    Ok(
        Api::<Event>::namespaced(env.cluster.client.clone(), &env.cluster.namespace)
            .list(&ListParams::default())
            .await?
            .items,
    )
}

fn describe(e: &Event) -> String {
    let regarding = e.regarding.as_ref();
    format!(
        "{} {}/{} {} by {}/{}: {}",
        e.type_.as_deref().unwrap_or(""),
        regarding.and_then(|r| r.kind.as_deref()).unwrap_or(""),
        regarding.and_then(|r| r.name.as_deref()).unwrap_or(""),
        e.reason.as_deref().unwrap_or(""),
        e.reporting_controller.as_deref().unwrap_or(""),
        e.reporting_instance.as_deref().unwrap_or(""),
        e.note.as_deref().unwrap_or("")
    )
}

/// Waits for knic's Warning `reason` on the claim and on the pod, and for the kubelet's own
/// Warning `kubelet_reason` on the pod, each carrying `words`; prints them.
async fn reported(
    env: &Env,
    reason: &str,
    kubelet_reason: &str,
    words: &str,
) -> anyhow::Result<()> {
    let instance = format!("knic-driver-{}", env.cluster.node);
    let found = eventually(
        &format!("knic's {reason} on the claim and the pod, the kubelet's {kubelet_reason}"),
        Duration::from_secs(120),
        || async {
            let all = events(env).await?;
            let by = |controller: &str, reason: &str, kind: &str, name: &str| {
                all.iter()
                    .find(|e| {
                        e.type_.as_deref() == Some("Warning")
                            && e.reporting_controller.as_deref() == Some(controller)
                            && e.reason.as_deref() == Some(reason)
                            && e.regarding.as_ref().is_some_and(|r| {
                                r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                            })
                            && e.note.as_deref().is_some_and(|n| n.contains(words))
                    })
                    .cloned()
            };
            let claim = by("knic.dev/driver", reason, "ResourceClaim", "nic");
            let pod = by("knic.dev/driver", reason, "Pod", "with-nic");
            let kubelet = by("kubelet", kubelet_reason, "Pod", "with-nic");
            Ok(match (claim, pod, kubelet) {
                (Some(c), Some(p), Some(k)) => Some([c, p, k]),
                _ => None,
            })
        },
    )
    .await;
    let found = match found {
        Ok(found) => found,
        Err(e) => {
            let all: Vec<String> = events(env).await?.iter().map(describe).collect();
            anyhow::bail!("{e:#}\nevents:\n  {}", all.join("\n  "));
        }
    };
    for e in &found {
        println!("{}", describe(e));
    }
    for knic in &found[..2] {
        ensure!(
            knic.reporting_instance.as_deref() == Some(instance.as_str()),
            "{}",
            describe(knic)
        );
    }
    Ok(())
}

/// The pod has not started a container, and keeps not starting one for `period`.
async fn no_container_starts(env: &Env, period: Duration) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(env.cluster.client.clone(), &env.cluster.namespace);
    let until = tokio::time::Instant::now() + period;
    while tokio::time::Instant::now() < until {
        let status = pods.get("with-nic").await?.status.unwrap_or_default();
        let started: Vec<String> = status
            .container_statuses
            .unwrap_or_default()
            .into_iter()
            .filter(|c| {
                c.state
                    .as_ref()
                    .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
            })
            .map(|c| c.name)
            .collect();
        ensure!(
            started.is_empty() && status.phase.as_deref() == Some("Pending"),
            "the pod started {started:?} (phase {:?})",
            status.phase
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// Deletes the pod and waits until it is gone, so the kubelet has unprepared its claim
/// through the driver before the driver stops.
async fn delete_pod(env: &Env) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(env.cluster.client.clone(), &env.cluster.namespace);
    pods.delete("with-nic", &DeleteParams::default()).await?;
    eventually("the pod is gone", Duration::from_secs(120), || async {
        Ok(pods.get_opt("with-nic").await?.is_none().then_some(()))
    })
    .await
}

/// Starts the driver against the real kubelet and runtime, runs `scenario` with a pod whose
/// claim carries `config`, and deletes the pod before the driver stops.
async fn with_pod(
    env: &mut Env,
    config: serde_json::Value,
    scenario: impl AsyncFnOnce(&Env) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let nri = env.real.nri_socket.clone();
    let (config_, base) = env.driver(true, &nri)?;
    let mut driver = DriverProcess::start(&config_)?;
    let outcome = async {
        readyz(&base, 200, READY, Duration::from_secs(60)).await?;
        pod_with_config(env, config).await?;
        scenario(env).await
    }
    .await;
    let deleted = delete_pod(env).await;
    let _ = driver.terminate().await;
    outcome
        .and(deleted)
        .with_context(|| format!("driver log:\n{}", driver.logs()))
}

/// An MTU no interface can have: the kubelet's prepare fails with knic's words for the field
/// and the rule, in the kubelet's Event on the pod and in knic's on the claim and the pod, and
/// no container starts.
async fn bad_config_fails_prepare_with_events(env: &mut Env) -> anyhow::Result<()> {
    with_pod(env, json!({"interface": {"mtu": 50}}), async |env| {
        let words = "interface.mtu: must be between 68 and 65535, got 50";
        reported(env, "PrepareFailed", "FailedPrepareDynamicResources", words).await?;
        no_container_starts(env, Duration::from_secs(5)).await
    })
    .await
}

/// The interface name the pod's network already uses: the runtime's sandbox creation fails
/// through knic's NRI hook, knic reports it on the claim (status and Event) and the pod, the
/// kubelet reports the failed sandbox, no container starts, and the device is back on the
/// host.
async fn name_clash_fails_attach_with_events(env: &mut Env) -> anyhow::Result<()> {
    let before = ip(&["-o", "link", "show", DEVICE])?;
    ensure!(before.contains(DEVICE), "{before}");
    with_pod(env, json!({"interface": {"name": "eth0"}}), async |env| {
        let words =
            "interface eth0 already exists in the pod; choose another name (interface.name)";
        reported(env, "AttachFailed", "FailedCreatePodSandBox", words).await?;
        no_container_starts(env, Duration::from_secs(5)).await?;
        let claim =
            Api::<ResourceClaim>::namespaced(env.cluster.client.clone(), &env.cluster.namespace)
                .get("nic")
                .await?;
        let status = serde_json::to_value(claim.status)?;
        let condition = &status["devices"][0]["conditions"][0];
        ensure!(
            condition["reason"] == "AttachFailed"
                && condition["status"] == "False"
                && condition["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(words)),
            "claim status: {status}"
        );
        eventually(
            "the device is back on the host",
            Duration::from_secs(30),
            || async { Ok(ip(&["-o", "link", "show", DEVICE]).is_ok().then_some(())) },
        )
        .await
    })
    .await
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let real = knic_e2e::harness::real_cluster();
    let root = nix::unistd::geteuid().is_root();
    if real.is_some() && !root {
        eprintln!("skipped: real/* event and readiness twins: they need root (host links)");
    }
    let twins: [(&str, &str, Body); 3] = [
        (
            "readyz/follows_the_kubelet_and_the_runtime",
            "ev-readyz",
            |e| Box::pin(readyz_follows_the_kubelet_and_the_runtime(e)),
        ),
        ("events/bad_config_fails_prepare", "ev-prepare", |e| {
            Box::pin(bad_config_fails_prepare_with_events(e))
        }),
        ("events/name_clash_fails_attach", "ev-attach", |e| {
            Box::pin(name_clash_fails_attach_with_events(e))
        }),
    ];
    let trials = twins
        .into_iter()
        .map(|(name, slug, body)| {
            let real = real.clone();
            let ignored = real.is_none() || !root;
            trial(format!("real/{name}"), ignored, move || async move {
                match real {
                    Some(r) => run(r, slug, body).await,
                    None => Ok(()),
                }
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    knic_e2e::driver::wait_for_the_kubelets_wipe();
    conclusion.exit();
}
