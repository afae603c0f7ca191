//! Pods get their interfaces end to end: a test kubelet prepares claims over the DRA socket, an
//! NRI test runtime speaking the real multiplexed ttrpc creates and stops sandboxes, and the
//! real `knic-driver` moves veth devices (playing NICs) into real network namespaces, writes
//! the claims' status to the API (the in-process fake) and puts everything back. Runs as root
//! in private network and mount namespaces; without root the trials report themselves ignored.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::ResourceClaim;
use knic_driver::nri::PodSandbox;
use knic_driver::nri::runtime::TestRuntime;
use knic_e2e::cluster::{Cluster, RealCluster, TestClaim};
use knic_e2e::driver::{DriverConfig, DriverProcess};
use knic_e2e::harness::{Netns, eventually, host_link, ip, isolate, trial, unisolate};
use knic_e2e::kubelet::{self, ClaimId, Plugin};
use serde_json::json;

// Two pods attached and detached, and a failed attach, in a file of their own.
#[path = "pods/attach.rs"]
mod attach;
use attach::{failed_attach_fails_the_sandbox, two_pods};

// The NRI connection lost (fail-closed) and regained.
#[path = "pods/nri.rs"]
mod nri;
use nri::{no_container_starts_without_its_interface, runtime_restart_reconnects};

// Crashes at failpoints and kill -9, each followed by a restart.
#[path = "pods/crash.rs"]
mod crash;
use crash::crash_at_every_step_converges;

// ethtool settings through the real driver, and a crash right after them (issue 27).
#[path = "pods/ethtool.rs"]
mod ethtool;
// `addressing: {mode: dhcp}` against dnsmasq, through a crash.
#[path = "pods/dhcp.rs"]
mod dhcp;
use dhcp::{dhcp_lease_follows_the_pod, slaac_and_unnumbered};

// The real kubelet and runtime of a real cluster.
#[path = "pods/real.rs"]
mod real;
use real::real_kubelet_and_runtime;

struct Env {
    cluster: Cluster,
    config: DriverConfig,
    driver: DriverProcess,
    runtime: TestRuntime,
    plugin: Plugin,
    peer: Netns,
    tag: &'static str,
}

impl Env {
    fn dev(&self, n: u8) -> String {
        format!("knt-{}{n}", self.tag)
    }

    fn id(&self, claim: &TestClaim) -> ClaimId {
        ClaimId {
            namespace: self.cluster.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        }
    }

    fn pod(&self, claim: &TestClaim, netns: Option<&Netns>) -> PodSandbox {
        PodSandbox {
            id: format!("sandbox-{}", claim.name),
            name: format!("{}-pod", claim.name),
            uid: claim.pod_uid.clone(),
            namespace: self.cluster.namespace.clone(),
            netns: netns.map(Netns::path),
            ips: vec!["10.244.0.5".into()],
        }
    }

    async fn claim_status(&self, name: &str) -> anyhow::Result<serde_json::Value> {
        let api: kube::Api<ResourceClaim> =
            kube::Api::namespaced(self.cluster.client.clone(), &self.cluster.namespace);
        Ok(serde_json::to_value(api.get(name).await?.status)?)
    }
}

async fn setup(root: &Path, tag: &'static str, real: Option<&RealCluster>) -> anyhow::Result<Env> {
    let cluster = match real {
        Some(r) => Cluster::real(r, &format!("pods-{tag}")).await?,
        None => Cluster::fake(&format!("pods-{tag}")).await?,
    };
    cluster.ensure_node().await?;
    let peer = Netns::new(&format!("knt-peer-{tag}"))?;
    let peer_name = peer.0.clone();
    for (host, other, addr) in [(0, 1, "192.0.2.1/24"), (2, 3, "198.51.100.1/24")] {
        let (h, o) = (format!("knt-{tag}{host}"), format!("knt-{tag}{other}"));
        ip(&[
            "link", "add", &h, "type", "veth", "peer", "name", &o, "netns", &peer_name,
        ])?;
        ip(&["link", "set", &h, "up"])?;
        ip(&["-n", &peer_name, "addr", "add", addr, "dev", &o])?;
        ip(&["-n", &peer_name, "link", "set", &o, "up"])?;
    }
    ip(&[
        "-n",
        &peer_name,
        "addr",
        "add",
        "2001:db8::1/64",
        "dev",
        &format!("knt-{tag}1"),
        "nodad",
    ])?;
    let nri_socket = cluster.tmp.path().join("nri.sock");
    let mut runtime = TestRuntime::listen(&nri_socket).await?;
    let config = DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig)
        .with_env("KNIC_SYSFS_ROOT", root.to_string_lossy())
        .with_env("KNIC_NETLINK", "true")
        .with_env("KNIC_INCLUDE", format!("name=knt-{tag}0,name=knt-{tag}2"))
        .with_env("KNIC_NRI_SOCKET", nri_socket.to_string_lossy())
        .without_stand_in_runtime();
    let driver = DriverProcess::start(&config)?;
    let registered = tokio::time::timeout(Duration::from_secs(20), runtime.accept(vec![]))
        .await
        .context("the driver never connected to the NRI runtime")??;
    ensure!(
        registered.name == "knic" && registered.index == "10" && registered.events == 7,
        "{registered:?}"
    );
    let plugin = kubelet::register(&config.registry_dir).await?;
    let env = Env {
        cluster,
        config,
        driver,
        runtime,
        plugin,
        peer,
        tag,
    };
    let want = vec![env.dev(0), env.dev(2)];
    eventually(
        "both veth devices published",
        Duration::from_secs(20),
        || async {
            let slices = env.cluster.slices().await?;
            let names: Vec<String> = slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .map(|d| d.name.clone())
                .collect();
            Ok((names == want).then_some(()))
        },
    )
    .await?;
    Ok(env)
}

fn network_config(body: serde_json::Value) -> serde_json::Value {
    let mut v = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig"});
    if let (Some(v), Some(b)) = (v.as_object_mut(), body.as_object()) {
        v.extend(b.clone());
    }
    v
}
/// The README's first command: `knic-driver demo` does the whole job and leaves nothing.
async fn demo_leaves_nothing_behind(root: PathBuf) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(knic_e2e::driver::binary()?)
        .arg("demo")
        .env("KNIC_SYSFS_ROOT", &root)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "NodePrepareResources over gRPC",
        "NRI plugin knic (index 10) registered",
        "inside the pod: net1 mtu 1400",
        "inet 192.0.2.10/24",
        "inet6 2001:db8::10/64",
        "UDP echo 192.0.2.10 → 192.0.2.1 through net1",
        "nothing left behind",
    ] {
        ensure!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    // Other trials create links in this namespace concurrently: look for the demo's own.
    let left: Vec<String> = ip(&["-o", "link"])?
        .lines()
        .filter(|l| l.contains(": knd"))
        .map(str::to_string)
        .collect();
    ensure!(left.is_empty(), "the demo left links behind: {left:?}");
    Ok(())
}

type Scenario = knic_e2e::harness::Scenario<Env>;

fn main() {
    let args = knic_e2e::harness::arguments();
    let real = knic_e2e::harness::real_cluster();
    // With a real cluster the apiserver must stay reachable, so the tests run in the host's
    // namespaces (every link and namespace they create is knt- named and deleted by guards);
    // otherwise they run in private namespaces that vanish with the process.
    let isolated: Result<PathBuf, String> = match &real {
        Some(_) if nix::unistd::geteuid().is_root() => Ok(PathBuf::from("/")),
        Some(_) => Err("pod e2e tests need root".into()),
        None => isolate(),
    };
    if let Err(reason) = &isolated {
        eprintln!("skipped: pod e2e tests: {reason}");
    }
    let root = isolated.clone().unwrap_or_default();
    let ignored = isolated.is_err();
    let scenarios: Vec<(&str, Scenario)> = vec![
        (
            "two_pods_get_their_interfaces_and_the_node_is_restored",
            |e| Box::pin(two_pods(e)),
        ),
        ("failed_attach_fails_the_sandbox_and_restores", |e| {
            Box::pin(failed_attach_fails_the_sandbox(e))
        }),
        ("runtime_restart_reconnects", |e| {
            Box::pin(runtime_restart_reconnects(e))
        }),
        ("crash_at_every_step_converges", |e| {
            Box::pin(crash_at_every_step_converges(e))
        }),
        ("no_container_starts_without_its_interface", |e| {
            Box::pin(no_container_starts_without_its_interface(e))
        }),
        ("ethtool_crash_after_apply_is_finished_and_restored", |e| {
            Box::pin(ethtool::ethtool_crash_after_apply_is_finished_and_restored(
                e,
            ))
        }),
        ("dhcp_lease_follows_the_pod", |e| {
            Box::pin(dhcp_lease_follows_the_pod(e))
        }),
        ("slaac_and_unnumbered", |e| {
            Box::pin(slaac_and_unnumbered(e))
        }),
    ];
    let tags: [&'static str; 16] = [
        "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p",
    ];
    let mut trials = Vec::new();
    for (backend, offset) in [("fake", 0), ("real", scenarios.len())] {
        for (i, (name, scenario)) in scenarios.iter().enumerate() {
            let (root, scenario, tag) = (root.clone(), *scenario, tags[offset + i]);
            let cluster = if backend == "real" {
                real.clone()
            } else {
                None
            };
            let skip = ignored || (backend == "real" && real.is_none());
            trials.push(trial(
                format!("{backend}/{name}"),
                skip,
                move || async move {
                    let mut env = setup(&root, tag, cluster.as_ref()).await?;
                    let outcome = scenario(&mut env).await;
                    let _ = ip(&["link", "del", &env.dev(0)]);
                    let _ = ip(&["link", "del", &env.dev(2)]);
                    let cleanup = env.cluster.cleanup().await;
                    match outcome {
                        Ok(()) => cleanup,
                        Err(e) => anyhow::bail!("{e:#}\n--- driver log ---\n{}", env.driver.logs()),
                    }
                },
            ));
        }
    }
    let demo_root = root.clone();
    trials.push(trial(
        "demo/leaves_nothing_behind".into(),
        ignored,
        move || demo_leaves_nothing_behind(demo_root),
    ));
    let full = real.clone();
    trials.push(trial(
        "real/pod_through_the_real_kubelet_and_runtime".into(),
        ignored || real.is_none(),
        move || async move {
            match full {
                Some(r) => real_kubelet_and_runtime(r).await,
                None => Ok(()),
            }
        },
    ));
    let conclusion = libtest_mimic::run(&args, trials);
    knic_e2e::driver::wait_for_the_kubelets_wipe();
    if let (Ok(root), None) = (&isolated, &real) {
        unisolate(root);
    }
    conclusion.exit();
}
