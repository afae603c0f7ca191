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
use knic_e2e::harness::{Netns, eventually, ip, isolate, trial, udp_echo, unisolate};
use knic_e2e::kubelet::{self, ClaimId, DraVersion, Plugin};
use serde_json::json;

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

/// Host state of a link as `ip -o link` prints it (name, mtu, mac, state).
fn host_link(name: &str) -> anyhow::Result<String> {
    let out = ip(&["-o", "link", "show", name])?;
    let fields: Vec<&str> = out.split_whitespace().collect();
    let mtu = fields
        .iter()
        .position(|f| *f == "mtu")
        .map(|i| fields[i + 1])
        .unwrap_or_default();
    let mac = fields
        .iter()
        .position(|f| *f == "link/ether")
        .map(|i| fields[i + 1])
        .unwrap_or_default();
    let up = out.contains(",UP") || out.contains("<UP");
    Ok(format!("{name} mtu {mtu} mac {mac} up {up}"))
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

async fn two_pods(env: &mut Env) -> anyhow::Result<()> {
    let before = (host_link(&env.dev(0))?, host_link(&env.dev(2))?);
    let a = env
        .cluster
        .create_claim_with_config(
            "claim-a",
            Some(&[("knic.dev", &env.dev(0))]),
            Some(network_config(json!({
                "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
                "routes": [{"destination": "203.0.113.0/24", "gateway": "192.0.2.1"}],
                "sysctls": {"ipv4.arp_ignore": "1"},
            }))),
        )
        .await?;
    let b = env
        .cluster
        .create_claim_with_config(
            "claim-b",
            Some(&[("knic.dev", &env.dev(2))]),
            Some(network_config(json!({
                "interface": {"name": "data0", "mtu": 1400, "hardwareAddress": "02:00:00:00:00:b0"},
                "addresses": ["198.51.100.10/24"],
            }))),
        )
        .await?;
    for claim in [&a, &b] {
        let out = env.plugin.prepare(DraVersion::V1, &[env.id(claim)]).await?;
        ensure!(
            out[&claim.uid].error.is_empty(),
            "prepare {}: {}",
            claim.name,
            out[&claim.uid].error
        );
    }
    let (ns_a, ns_b) = (
        Netns::new(&format!("knt-pa-{}", env.tag))?,
        Netns::new(&format!("knt-pb-{}", env.tag))?,
    );
    env.runtime
        .run_pod_sandbox(&env.pod(&a, Some(&ns_a)))
        .await
        .map_err(anyhow::Error::msg)?;
    env.runtime
        .run_pod_sandbox(&env.pod(&b, Some(&ns_b)))
        .await
        .map_err(anyhow::Error::msg)?;

    // Inside the pods, before any container would start.
    let net1 = ip(&["-n", &ns_a.0, "addr", "show", "net1"])?;
    ensure!(
        net1.contains("inet 192.0.2.10/24")
            && net1.contains("inet6 2001:db8::10/64")
            && net1.contains("UP"),
        "{net1}"
    );
    let routes = ip(&["-n", &ns_a.0, "route", "show", "203.0.113.0/24"])?;
    ensure!(routes.contains("via 192.0.2.1 dev net1"), "{routes}");
    udp_echo(&ns_a.path(), &env.peer.path(), "192.0.2.1").context("traffic through net1")?;
    let data0 = ip(&["-n", &ns_b.0, "link", "show", "data0"])?;
    ensure!(
        data0.contains("mtu 1400") && data0.contains("02:00:00:00:00:b0"),
        "{data0}"
    );
    udp_echo(&ns_b.path(), &env.peer.path(), "198.51.100.1").context("traffic through data0")?;
    ensure!(
        ip(&["link", "show", &env.dev(0)]).is_err(),
        "the device left the host"
    );

    // Status written by server-side apply, field manager knic.dev.
    let status = eventually("claim-a status", Duration::from_secs(10), || async {
        let s = env.claim_status("claim-a").await?;
        Ok(s["devices"][0]["networkData"]["interfaceName"]
            .is_string()
            .then_some(s))
    })
    .await?;
    let entry = &status["devices"][0];
    ensure!(
        entry["driver"] == "knic.dev"
            && entry["device"] == json!(env.dev(0))
            && entry["pool"] == json!(env.cluster.node),
        "{entry}"
    );
    ensure!(entry["networkData"]["interfaceName"] == "net1", "{entry}");
    ensure!(
        entry["networkData"]["ips"] == json!(["192.0.2.10/24", "2001:db8::10/64"]),
        "{entry}"
    );
    ensure!(
        entry["networkData"]["hardwareAddress"]
            .as_str()
            .is_some_and(|m| m.len() == 17),
        "{entry}"
    );
    let ready = &entry["conditions"][0];
    ensure!(
        ready["type"] == "Ready"
            && ready["status"] == "True"
            && ready["reason"] == "InterfaceConfigured",
        "{ready}"
    );
    ensure!(ready["lastTransitionTime"].is_string());
    let requests = env.cluster.fake.as_ref().map(|f| f.requests());
    ensure!(
        requests.is_none_or(|log| log.iter().any(|r| r.method == "PATCH"
            && r.path.ends_with("/resourceclaims/claim-a/status")
            && r.field_manager.as_deref() == Some("knic.dev"))),
        "no server-side apply by knic.dev"
    );
    let status_b = eventually("claim-b status", Duration::from_secs(10), || async {
        let s = env.claim_status("claim-b").await?;
        Ok(s["devices"][0]["networkData"]["interfaceName"]
            .is_string()
            .then_some(s))
    })
    .await?;
    ensure!(
        status_b["devices"][0]["networkData"]["hardwareAddress"] == "02:00:00:00:00:b0",
        "{status_b}"
    );

    // Pods go away: stop, remove, unprepare; the node is exactly as before.
    for (claim, ns) in [(&a, &ns_a), (&b, &ns_b)] {
        env.runtime
            .stop_pod_sandbox(&env.pod(claim, Some(ns)))
            .await
            .map_err(anyhow::Error::msg)?;
        env.runtime
            .remove_pod_sandbox(&env.pod(claim, None))
            .await
            .map_err(anyhow::Error::msg)?;
        let out = env
            .plugin
            .unprepare(DraVersion::V1, &[env.id(claim)])
            .await?;
        ensure!(out[&claim.uid].is_empty(), "unprepare: {}", out[&claim.uid]);
    }
    ensure!(
        (host_link(&env.dev(0))?, host_link(&env.dev(2))?) == before,
        "host links differ after detach"
    );
    ensure!(
        ip(&["-n", &ns_a.0, "link", "show", "net1"]).is_err(),
        "net1 left in the pod"
    );
    let checkpoint = std::fs::read_to_string(env.config.plugin_dir.join("checkpoint.json"))?;
    ensure!(
        checkpoint.contains("\"claims\":{}"),
        "checkpoint not empty: {checkpoint}"
    );
    Ok(())
}

async fn failed_attach_fails_the_sandbox(env: &mut Env) -> anyhow::Result<()> {
    let before = host_link(&env.dev(0))?;
    // `lo` exists in every pod: the clash is only visible at attach time.
    let c = env
        .cluster
        .create_claim_with_config(
            "clash",
            Some(&[("knic.dev", &env.dev(0))]),
            Some(network_config(json!({
                "interface": {"name": "lo"}, "addresses": ["192.0.2.20/24"],
            }))),
        )
        .await?;
    let out = env
        .plugin
        .prepare(DraVersion::V1beta1, &[env.id(&c)])
        .await?;
    ensure!(out[&c.uid].error.is_empty(), "{}", out[&c.uid].error);
    let ns = Netns::new(&format!("knt-pc-{}", env.tag))?;
    let err = env
        .runtime
        .run_pod_sandbox(&env.pod(&c, Some(&ns)))
        .await
        .err()
        .context("attach must fail")?
        .to_string();
    ensure!(
        err.contains("interface lo already exists in the pod"),
        "{err}"
    );
    ensure!(
        host_link(&env.dev(0))? == before,
        "the device must be back on the host unchanged"
    );
    let status = eventually("Ready=False", Duration::from_secs(10), || async {
        let s = env.claim_status("clash").await?;
        Ok((s["devices"][0]["conditions"][0]["status"] == "False").then_some(s))
    })
    .await?;
    ensure!(
        status["devices"][0]["conditions"][0]["reason"] == "AttachFailed",
        "{status}"
    );
    // The kubelet gives up on the pod: unprepare leaves nothing behind.
    let out = env
        .plugin
        .unprepare(DraVersion::V1beta1, &[env.id(&c)])
        .await?;
    ensure!(out[&c.uid].is_empty());
    Ok(())
}

/// A process in `ns` standing in for a container's first process: the runtime hands hooks its
/// pid; killed on drop.
struct ContainerProcess(std::process::Child);

impl ContainerProcess {
    fn start(ns: &Netns) -> anyhow::Result<ContainerProcess> {
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &ns.0, "sleep", "300"])
            .spawn()
            .context("starting a process in the pod namespace")?;
        Ok(ContainerProcess(child))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ContainerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Fail-closed: NRI disconnects between prepare and sandbox start, so knic never hears of the
/// sandbox. The container is still not created without its interface (the CDI hook fails),
/// new claims are refused while NRI is down, and once knic reconnects the runtime's Synchronize
/// gets the interface attached and the container's retry succeeds.
async fn no_container_starts_without_its_interface(env: &mut Env) -> anyhow::Result<()> {
    let c = env
        .cluster
        .create_claim_with_config(
            "fail-closed",
            Some(&[("knic.dev", &env.dev(0))]),
            Some(network_config(json!({"addresses": ["192.0.2.40/24"]}))),
        )
        .await?;
    let out = env.plugin.prepare(DraVersion::V1, &[env.id(&c)]).await?;
    ensure!(out[&c.uid].error.is_empty(), "{}", out[&c.uid].error);
    let cdi = out[&c.uid].devices[0].cdi_device_ids.clone();
    ensure!(
        cdi == [format!("knic.dev/interface={}-0", c.uid)],
        "CDI devices in the answer: {cdi:?}"
    );
    let cdi_dir = PathBuf::from(env_value(&env.config, "KNIC_CDI_DIR")?);

    // The runtime restarts; knic is not connected when the sandbox is created.
    let socket = PathBuf::from(env_value(&env.config, "KNIC_NRI_SOCKET")?);
    env.runtime.shutdown().await;
    let _ = std::fs::remove_file(&socket);
    let ns = Netns::new(&format!("knt-pf-{}", env.tag))?;
    let container = ContainerProcess::start(&ns)?;
    let created = knic_driver::nri::runtime::create_container(
        std::slice::from_ref(&cdi_dir),
        &cdi,
        "app",
        container.pid(),
    )
    .await;
    let err = created
        .err()
        .context("the container was created without its interface")?
        .to_string();
    ensure!(
        err.starts_with("OCI runtime create failed: error running createRuntime hook #0:")
            && err.contains(&format!(
                "claim {}/fail-closed: interface net1 is not configured: it is not in the pod's \
                 network namespace",
                env.cluster.namespace
            )),
        "{err}"
    );

    // While NRI is down, a new claim is refused rather than prepared for a bare pod.
    let other = env
        .cluster
        .create_claim_with_config(
            "while-down",
            Some(&[("knic.dev", &env.dev(2))]),
            Some(network_config(json!({"addresses": ["198.51.100.40/24"]}))),
        )
        .await?;
    eventually(
        "prepare refused while NRI is down",
        Duration::from_secs(10),
        || async {
            let out = env
                .plugin
                .prepare(DraVersion::V1, &[env.id(&other)])
                .await?;
            let error = out[&other.uid].error.clone();
            Ok(error
                .contains("knic is not connected to the container runtime's NRI socket")
                .then_some(error))
        },
    )
    .await?;

    // The runtime is back and lists the running sandbox: knic attaches, the retry succeeds.
    env.runtime = TestRuntime::listen(&socket).await?;
    let pod = env.pod(&c, Some(&ns));
    tokio::time::timeout(
        Duration::from_secs(20),
        env.runtime.accept(vec![pod.clone()]),
    )
    .await
    .context("no reconnect")??;
    eventually("the container starts", Duration::from_secs(10), || async {
        Ok(knic_driver::nri::runtime::create_container(
            std::slice::from_ref(&cdi_dir),
            &cdi,
            "app",
            container.pid(),
        )
        .await
        .ok())
    })
    .await?;
    ensure!(ip(&["-n", &ns.0, "addr", "show", "net1"])?.contains("192.0.2.40/24"));
    let out = env
        .plugin
        .prepare(DraVersion::V1, &[env.id(&other)])
        .await?;
    ensure!(
        out[&other.uid].error.is_empty(),
        "{}",
        out[&other.uid].error
    );

    drop(container);
    env.runtime
        .stop_pod_sandbox(&pod)
        .await
        .map_err(anyhow::Error::msg)?;
    for claim in [&c, &other] {
        let out = env
            .plugin
            .unprepare(DraVersion::V1, &[env.id(claim)])
            .await?;
        ensure!(out[&claim.uid].is_empty(), "{}", out[&claim.uid]);
    }
    let left: Vec<_> = std::fs::read_dir(&cdi_dir)?
        .flatten()
        .map(|e| e.path())
        .collect();
    ensure!(left.is_empty(), "CDI specs left after unprepare: {left:?}");
    Ok(())
}

/// The value the driver was started with for `key`.
fn env_value(config: &DriverConfig, key: &str) -> anyhow::Result<String> {
    config
        .env_value(key)
        .map(str::to_owned)
        .with_context(|| format!("{key} not set"))
}

async fn runtime_restart_reconnects(env: &mut Env) -> anyhow::Result<()> {
    let c = env
        .cluster
        .create_claim_with_config(
            "after-restart",
            Some(&[("knic.dev", &env.dev(2))]),
            Some(network_config(json!({
                "addresses": ["198.51.100.30/24"],
            }))),
        )
        .await?;
    ensure!(
        env.plugin.prepare(DraVersion::V1, &[env.id(&c)]).await?[&c.uid]
            .error
            .is_empty()
    );
    // containerd restarts: the connection drops, the socket comes back.
    let socket = PathBuf::from(
        env.config
            .env
            .iter()
            .find(|(k, _)| k == "KNIC_NRI_SOCKET")
            .map(|(_, v)| v.clone())
            .context("socket")?,
    );
    env.runtime.shutdown().await;
    let _ = std::fs::remove_file(&socket);
    env.runtime = TestRuntime::listen(&socket).await?;
    let registered = tokio::time::timeout(Duration::from_secs(20), env.runtime.accept(vec![]))
        .await
        .context("no reconnect")??;
    ensure!(registered.name == "knic");
    let ns = Netns::new(&format!("knt-pr-{}", env.tag))?;
    env.runtime
        .run_pod_sandbox(&env.pod(&c, Some(&ns)))
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(ip(&["-n", &ns.0, "addr", "show", "net1"])?.contains("198.51.100.30/24"));
    env.runtime
        .stop_pod_sandbox(&env.pod(&c, Some(&ns)))
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(env.plugin.unprepare(DraVersion::V1, &[env.id(&c)]).await?[&c.uid].is_empty());
    Ok(())
}

impl Env {
    /// Replaces the running driver (SIGTERM, or already dead) with a new one, optionally armed
    /// with a failpoint, and lets the runtime accept it with `pods` in Synchronize.
    async fn restart_driver(
        &mut self,
        failpoint: Option<&str>,
        pods: Vec<PodSandbox>,
    ) -> anyhow::Result<()> {
        if self.driver.is_running() {
            self.driver.terminate().await?;
        }
        let config = match failpoint {
            Some(f) => self.config.clone().with_env("KNIC_FAILPOINT", f),
            None => self.config.clone(),
        };
        self.driver = DriverProcess::start(&config)?;
        tokio::time::timeout(Duration::from_secs(20), self.runtime.accept(pods))
            .await
            .context("the restarted driver never connected to NRI")??;
        self.plugin = kubelet::register(&self.config.registry_dir).await?;
        Ok(())
    }
}

/// `kill -9` (an abort at a failpoint) after the checkpoint, mid-attach and mid-detach, each
/// followed by a restart: Synchronize plus the checkpoint converge, no interface is lost, nothing
/// is attached twice, and the host gets back its address and state. `attach:after-checkpoint`
/// fires once per pod, after the one durable write that records all its devices; after
/// `attach:after-move` the "attached" mark was never written (it is only noted in memory), so
/// the restart must find the device in the pod and finish it, not trust or repeat the move.
async fn crash_at_every_step_converges(env: &mut Env) -> anyhow::Result<()> {
    ip(&["addr", "add", "192.0.2.99/32", "dev", &env.dev(0)])?;
    let before = (
        host_link(&env.dev(0))?,
        ip(&["-o", "addr", "show", "dev", &env.dev(0), "scope", "global"])?,
    );
    for (round, failpoint) in ["attach:after-checkpoint", "attach:after-move"]
        .into_iter()
        .enumerate()
    {
        let name = format!("crash-{round}");
        let c = env
            .cluster
            .create_claim_with_config(
                &name,
                Some(&[("knic.dev", &env.dev(0))]),
                Some(network_config(json!({
                    "addresses": ["192.0.2.10/24"],
                    "routes": [{"destination": "203.0.113.0/24", "gateway": "192.0.2.1"}],
                }))),
            )
            .await?;
        ensure!(
            env.plugin.prepare(DraVersion::V1, &[env.id(&c)]).await?[&c.uid]
                .error
                .is_empty()
        );
        let ns = Netns::new(&format!("knt-pk{round}-{}", env.tag))?;
        let pod = env.pod(&c, Some(&ns));

        // The driver dies mid-attach: the runtime's call fails.
        env.restart_driver(Some(failpoint), vec![]).await?;
        ensure!(
            env.runtime.run_pod_sandbox(&pod).await.is_err(),
            "{failpoint}: the hook must not succeed"
        );
        eventually("driver aborted", Duration::from_secs(5), || {
            let running = env.driver.is_running();
            async move { Ok((!running).then_some(())) }
        })
        .await?;

        // Restart: Synchronize reports the running pod; the attach resumes and completes.
        env.restart_driver(None, vec![pod.clone()]).await?;
        let addr = ip(&["-n", &ns.0, "addr", "show", "net1"])
            .with_context(|| format!("{failpoint}: net1 missing"))?;
        ensure!(
            addr.contains("192.0.2.10/24") && addr.contains("UP"),
            "{failpoint}: {addr}"
        );
        ensure!(
            ip(&["-n", &ns.0, "route", "show", "203.0.113.0/24"])?.contains("via 192.0.2.1"),
            "{failpoint}: route"
        );
        udp_echo(&ns.path(), &env.peer.path(), "192.0.2.1")?;
        // The runtime repeating RunPodSandbox must not attach twice.
        env.runtime
            .run_pod_sandbox(&pod)
            .await
            .map_err(anyhow::Error::msg)?;
        ensure!(
            ip(&["-n", &ns.0, "-o", "link"])?.lines().count() == 2,
            "lo and net1 only"
        );
        // kill -9 with the attach finished: its "attached" mark was only in memory, so the
        // restart finds a recorded, unmarked device, checks the kernel and leaves it as it is.
        env.driver.kill9().await?;
        env.restart_driver(None, vec![pod.clone()]).await?;
        let addr = ip(&["-n", &ns.0, "addr", "show", "net1"])
            .with_context(|| format!("{failpoint}: net1 missing after kill -9"))?;
        ensure!(
            addr.contains("192.0.2.10/24") && addr.contains("UP"),
            "{failpoint}, after kill -9: {addr}"
        );
        ensure!(
            ip(&["-n", &ns.0, "route", "show", "203.0.113.0/24"])?.contains("via 192.0.2.1"),
            "{failpoint}, after kill -9: route"
        );
        ensure!(
            ip(&["-n", &ns.0, "-o", "link"])?.lines().count() == 2,
            "{failpoint}, after kill -9: lo and net1 only"
        );

        // The driver dies mid-detach: the device is back on the host but not yet restored.
        env.restart_driver(Some("detach:after-move"), vec![pod.clone()])
            .await?;
        let stopped = env.runtime.stop_pod_sandbox(&pod).await;
        ensure!(stopped.is_err(), "detach must be cut short: {stopped:?}");
        eventually("driver aborted", Duration::from_secs(5), || {
            let running = env.driver.is_running();
            async move { Ok((!running).then_some(())) }
        })
        .await?;
        // Restart with the pod gone: Synchronize puts the node back.
        env.restart_driver(None, vec![]).await?;
        let after = (
            host_link(&env.dev(0))?,
            ip(&["-o", "addr", "show", "dev", &env.dev(0), "scope", "global"])?,
        );
        ensure!(
            after == before,
            "{failpoint}: host not restored\nbefore {before:?}\nafter  {after:?}"
        );
        let out = env.plugin.unprepare(DraVersion::V1, &[env.id(&c)]).await?;
        ensure!(out[&c.uid].is_empty(), "{}", out[&c.uid]);
    }
    Ok(())
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

/// The fully real path: knic-driver registered with the node's real kubelet and connected to
/// its real runtime's NRI socket; a real pod with a real claim is scheduled, the kubelet
/// prepares, the runtime calls the hook, and the interface is checked inside the pod's network
/// namespace; deleting the pod puts the device back.
async fn real_kubelet_and_runtime(real: RealCluster) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::resource::v1::DeviceClass;
    use kube::Api;
    use kube::api::{DeleteParams, PostParams};

    let cluster = Cluster::real(&real, "real-pod").await?;
    let peer = Netns::new("knt-peer-r")?;
    ip(&[
        "link", "add", "knt-r0", "type", "veth", "peer", "name", "knt-r1", "netns", &peer.0,
    ])?;
    struct Veth;
    impl Drop for Veth {
        fn drop(&mut self) {
            let _ = ip(&["link", "del", "knt-r0"]);
        }
    }
    let _veth = Veth;
    ip(&[
        "-n",
        &peer.0,
        "addr",
        "add",
        "192.0.2.1/24",
        "dev",
        "knt-r1",
    ])?;
    ip(&["-n", &peer.0, "link", "set", "knt-r1", "up"])?;
    let before = host_link("knt-r0")?;

    let config = DriverConfig::under(cluster.tmp.path(), &real.node, &real.kubeconfig)
        .with_env("KNIC_SYSFS_ROOT", "/")
        .with_env("KNIC_NETLINK", "true")
        .with_env("KNIC_INCLUDE", "name=knt-r0")
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
        // The real runtime reads CDI specs there and runs their hooks.
        .with_env("KNIC_CDI_DIR", "/var/run/cdi")
        .without_stand_in_runtime();
    let mut driver = DriverProcess::start(&config)?;

    let classes: Api<DeviceClass> = Api::all(cluster.client.clone());
    let class_name = format!("{}.knic.dev", cluster.namespace);
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": class_name},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == \"knic.dev\" && device.attributes[\"knic.dev\"].ifName == \"knt-r0\""}}]},
    }))?;
    classes.create(&PostParams::default(), &class).await?;
    let result = async {
        let claims: Api<ResourceClaim> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "nic", "namespace": cluster.namespace},
            "spec": {"devices": {
                "requests": [{"name": "nic", "exactly": {"deviceClassName": class_name}}],
                "config": [{"requests": ["nic"], "opaque": {"driver": "knic.dev", "parameters": network_config(json!({
                    "addresses": ["192.0.2.10/24"],
                }))}}],
            }},
        }))?;
        claims.create(&PostParams::default(), &claim).await?;
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "with-nic", "namespace": cluster.namespace},
            "spec": {
                "nodeName": null,
                "resourceClaims": [{"name": "net", "resourceClaimName": "nic"}],
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "net"}]}}],
                "terminationGracePeriodSeconds": 1,
            },
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        eventually("the pod is Running", Duration::from_secs(180), || async {
            let p = pods.get("with-nic").await?;
            let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
            Ok((phase == "Running").then_some(()))
        })
        .await?;
        let status = eventually("claim status", Duration::from_secs(30), || async {
            let c = claims.get("nic").await?;
            let s = serde_json::to_value(c.status)?;
            Ok(s["devices"][0]["networkData"]["interfaceName"].is_string().then_some(s))
        })
        .await?;
        ensure!(status["devices"][0]["networkData"]["ips"] == json!(["192.0.2.10/24"]), "{status}");
        // Find the pod's namespace: the one whose net1 carries the address.
        let mut found = None;
        for entry in std::fs::read_dir("/var/run/netns")? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if ip(&["-n", &name, "addr", "show", "net1"]).is_ok_and(|o| o.contains("192.0.2.10/24")) {
                found = Some(name);
            }
        }
        let netns = found.context("no pod network namespace has net1 with 192.0.2.10/24")?;
        udp_echo(&PathBuf::from(format!("/var/run/netns/{netns}")), &peer.path(), "192.0.2.1")?;
        pods.delete("with-nic", &DeleteParams::default()).await?;
        eventually("the device is back on the host", Duration::from_secs(120), || async {
            Ok((host_link("knt-r0").ok().as_deref() == Some(before.as_str())).then_some(()))
        })
        .await?;
        anyhow::Ok(())
    }
    .await;
    let _ = classes.delete(&class_name, &DeleteParams::default()).await;
    let cleanup = cluster.cleanup().await;
    let _ = driver.terminate().await;
    match result {
        Ok(()) => cleanup,
        Err(e) => anyhow::bail!("{e:#}\n--- driver log ---\n{}", driver.logs()),
    }
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
    ];
    let tags: [&'static str; 10] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
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
    if let (Ok(root), None) = (&isolated, &real) {
        unisolate(root);
    }
    conclusion.exit();
}
