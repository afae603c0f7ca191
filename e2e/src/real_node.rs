//! One real node for the real-cluster twins: the real `knic-driver` registered with the node's
//! unmodified kubelet and connected to its runtime's NRI socket, offering veth pairs that play
//! NICs (the host end is the "NIC", the peer end sits in a namespace of its own with an address,
//! so a pod's interface can be proven to carry traffic). Real pods are created in a namespace of
//! the test's own, and everything — pods (so the kubelet unprepares through the running driver),
//! DeviceClasses, the namespace, the node's slices, links, namespaces, the driver — is removed by
//! [`RealNode::finish`], whatever the scenario's outcome; links and namespaces also on a panic.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use crate::cluster::{Cluster, RealCluster};
use crate::driver::{DriverConfig, DriverProcess};
use crate::harness::{Netns, host_link, ip};

/// How often the twins poll the real API: often enough to time things to a fraction of a
/// second, seldom enough not to load the shared apiserver on a 2-core machine.
pub const POLL: Duration = Duration::from_millis(250);

/// The app container's image: the only one the shared cluster has (no registry is reachable).
pub const IMAGE: &str = "registry.k8s.io/pause:3.10";

/// Polls `check` every [`POLL`] until it returns `Ok(Some(_))`; fails after `timeout` with the
/// last error (or `what`) and says how long it waited. Prints how long it took, since the real
/// components' timings are part of what a twin reports.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let started = Instant::now();
    let mut last = String::from("condition never held");
    loop {
        match check().await {
            Ok(Some(v)) => {
                println!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
                return Ok(v);
            }
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if started.elapsed() > timeout {
            bail!("{what}: not reached within {timeout:?} ({last})");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One veth pair playing a NIC.
#[derive(Debug, Clone)]
pub struct Nic {
    /// The host end: the device the driver offers.
    pub name: String,
    /// The namespace holding the peer end, which has `peer_address`.
    pub peer: PathBuf,
    /// The peer end's address in CIDR form (the pod's next hop).
    pub peer_address: String,
    /// The host end as `ip -o link` printed it before the test ([`host_link`]).
    pub before: String,
}

/// Deletes the host ends on drop (also on a panic); deleting the peers' namespaces afterwards
/// takes whatever pair is left.
struct Links(Vec<String>);

impl Drop for Links {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = ip(&["link", "del", name]);
        }
    }
}

/// Which claim a pod's `net` entry names.
#[derive(Debug, Clone)]
pub enum PodClaim {
    /// A ResourceClaim by name.
    Claim(String),
    /// A ResourceClaimTemplate by name (the resourceclaim controller makes the claim).
    Template(String),
}

/// The real node of one twin. Field order is drop order: the driver goes before the links.
pub struct RealNode {
    /// The cluster's settings.
    pub real: RealCluster,
    /// The test's API view and namespace.
    pub cluster: Cluster,
    /// The driver's settings (the node's real directories).
    pub config: DriverConfig,
    driver: DriverProcess,
    /// Whether the driver was stopped with SIGSTOP and not continued since.
    stopped: bool,
    /// The NICs, in the order given.
    pub nics: Vec<Nic>,
    classes: Vec<String>,
    _links: Links,
    _peers: Vec<Netns>,
    /// When the node was set up; the twins print their timings from here.
    pub started: Instant,
}

impl RealNode {
    /// Creates the test's namespace and one veth pair per entry of `peer_addresses` (host end
    /// `knt-<tag><i>`, peer end in namespace `knt-peer-<tag><i>` with that address), then starts
    /// the driver offering exactly those host ends, with `env` added to its environment, and
    /// waits until the kubelet and the runtime registered it and its slice lists the devices.
    pub async fn start(
        real: &RealCluster,
        test: &str,
        tag: &str,
        peer_addresses: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<RealNode> {
        ensure!(
            nix::unistd::geteuid().is_root(),
            "a real node needs root (links, namespaces, the kubelet's directories)"
        );
        schedulable(real).await?;
        let cluster = Cluster::real(real, test).await?;
        let mut links = Links(Vec::new());
        let mut peers = Vec::new();
        let mut nics = Vec::new();
        for (i, address) in peer_addresses.iter().enumerate() {
            let (name, peer_name) = (format!("knt-{tag}{i}"), format!("knt-{tag}{i}p"));
            let _ = ip(&["link", "del", &name]);
            let peer = Netns::new(&format!("knt-peer-{tag}{i}"))?;
            ip(&[
                "link", "add", &name, "type", "veth", "peer", "name", &peer_name, "netns", &peer.0,
            ])?;
            links.0.push(name.clone());
            ip(&["-n", &peer.0, "addr", "add", address, "dev", &peer_name])?;
            ip(&["-n", &peer.0, "link", "set", &peer_name, "up"])?;
            nics.push(Nic {
                before: host_link(&name)?,
                name,
                peer: peer.path(),
                peer_address: (*address).to_owned(),
            });
            peers.push(peer);
        }
        let include: Vec<String> = nics.iter().map(|n| format!("name={}", n.name)).collect();
        let mut config = DriverConfig::under(cluster.tmp.path(), &real.node, &real.kubeconfig)
            .with_env("KNIC_SYSFS_ROOT", "/")
            .with_env("KNIC_NETLINK", "true")
            .with_env("KNIC_INCLUDE", include.join(","))
            .with_env("KNIC_KUBELET_ROOT_DIR", real.kubelet_dir.to_string_lossy())
            .with_env("KNIC_NRI_SOCKET", real.nri_socket.to_string_lossy())
            // The real runtime reads CDI specs there and runs their hooks.
            .with_env("KNIC_CDI_DIR", "/var/run/cdi")
            .without_stand_in_runtime();
        config.registry_dir = real.kubelet_dir.join("plugins_registry");
        config.plugin_dir = real.kubelet_dir.join("plugins/knic.dev");
        for (k, v) in env {
            config = config.with_env(k, *v);
        }
        let driver = DriverProcess::start(&config)?;
        let node = RealNode {
            real: real.clone(),
            cluster,
            config,
            driver,
            stopped: false,
            nics,
            classes: Vec::new(),
            _links: links,
            _peers: peers,
            started: Instant::now(),
        };
        if let Err(e) = node.registered(0).await {
            let logs = node.driver.logs();
            let _ = node.finish(Ok(())).await;
            bail!("{e:#}\n--- driver log ---\n{logs}");
        }
        let want: Vec<String> = node.nics.iter().map(|n| n.name.clone()).collect();
        let published = wait_for("devices published", Duration::from_secs(30), || async {
            let mut names: Vec<String> = node
                .cluster
                .slices()
                .await?
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .map(|d| d.name.clone())
                .collect();
            names.sort();
            Ok((names == want).then_some(()))
        })
        .await;
        match published {
            Ok(()) => Ok(node),
            Err(e) => {
                let logs = node.driver.logs();
                let _ = node.finish(Ok(())).await;
                bail!("{e:#}\n--- driver log ---\n{logs}")
            }
        }
    }

    /// Seconds since the node was set up, for the twins' timing lines.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Prints a timing line.
    pub fn mark(&self, what: &str) {
        println!("[{:>6.1}s since setup] {what}", self.elapsed());
    }

    /// Whether the driver was given the runtime's own NRI socket (a test may give it one
    /// where no runtime listens yet).
    fn on_the_runtime(&self) -> bool {
        self.config.env_value("KNIC_NRI_SOCKET") == Some(&*self.real.nri_socket.to_string_lossy())
    }

    /// Waits until the driver's log, from byte `from` on, says the kubelet registered the
    /// plugin and (when the driver was given the runtime's socket) the runtime registered the
    /// NRI plugin.
    async fn registered(&self, from: usize) -> anyhow::Result<()> {
        let nri = self.on_the_runtime();
        wait_for(
            "the kubelet and the runtime registered the driver",
            Duration::from_secs(60),
            || async {
                let logs = self.driver.logs();
                let tail = logs.get(from..).unwrap_or_default();
                Ok((tail.contains("kubelet registered the plugin")
                    && (!nri || tail.contains("registered as an NRI plugin")))
                .then_some(()))
            },
        )
        .await
    }

    /// Waits until the driver's log, from byte `from` on, says the runtime registered its NRI
    /// plugin.
    pub async fn nri_registered(&self, from: usize) -> anyhow::Result<()> {
        wait_for(
            "the runtime registered the driver's NRI plugin",
            Duration::from_secs(60),
            || async {
                let logs = self.driver.logs();
                let tail = logs.get(from..).unwrap_or_default();
                Ok(tail.contains("registered as an NRI plugin").then_some(()))
            },
        )
        .await
    }

    /// The driver's log so far (across restarts).
    pub fn logs(&self) -> String {
        self.driver.logs()
    }

    /// The driver's process id.
    pub fn driver_pid(&mut self) -> anyhow::Result<i32> {
        let pid = self.driver.pid().context("the driver has exited")?;
        Ok(i32::try_from(pid)?)
    }

    /// Whether the driver process still runs (an armed failpoint aborts it).
    pub fn driver_running(&mut self) -> bool {
        self.driver.is_running()
    }

    /// SIGSTOP: the driver keeps its sockets but answers nothing, as a process frozen by the
    /// scheduler, a debugger or a cgroup freezer. Returns once every thread of it is stopped
    /// (the signal is delivered asynchronously, thread by thread).
    pub async fn freeze(&mut self) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(self.driver_pid()?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)?;
        self.stopped = true;
        let started = Instant::now();
        while !self.driver_stopped()? {
            if started.elapsed() > Duration::from_secs(5) {
                bail!("the driver did not stop within 5 s of SIGSTOP");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// SIGCONT after [`RealNode::freeze`].
    pub fn thaw(&mut self) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(self.driver_pid()?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT)?;
        self.stopped = false;
        Ok(())
    }

    /// Whether the driver is frozen ([`RealNode::freeze`] and not thawed since).
    pub fn frozen(&self) -> bool {
        self.stopped
    }

    /// Whether every thread of the driver is stopped (state `T`, or `t` when traced).
    pub fn driver_stopped(&mut self) -> anyhow::Result<bool> {
        let pid = self.driver_pid()?;
        let mut all = true;
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let stat = std::fs::read_to_string(task?.path().join("stat"))?;
            let (_, fields) = stat
                .rsplit_once(')')
                .context("/proc/<pid>/task/<tid>/stat without a name")?;
            all &= matches!(fields.trim_start().chars().next(), Some('T' | 't'));
        }
        Ok(all)
    }

    /// Waits until the driver exited by itself (an armed failpoint aborted it).
    pub async fn driver_exited(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        while self.driver.is_running() {
            if started.elapsed() > timeout {
                bail!("the driver still runs after {timeout:?}");
            }
            tokio::time::sleep(POLL).await;
        }
        self.mark("the driver aborted at its failpoint");
        Ok(())
    }

    /// Replaces the driver (SIGTERM if it runs) with a new one, with `failpoint` armed or none,
    /// and waits until the kubelet and the runtime registered it again.
    pub async fn restart_driver(&mut self, failpoint: Option<&str>) -> anyhow::Result<()> {
        if self.stopped {
            self.thaw()?;
        }
        if self.driver.is_running() {
            self.driver.terminate().await?;
        }
        let config = self
            .config
            .clone()
            .with_env("KNIC_FAILPOINT", failpoint.unwrap_or_default());
        let from = self.driver.logs().len();
        self.driver = DriverProcess::start(&config)?;
        self.registered(from).await?;
        self.mark(&format!(
            "driver restarted{}",
            failpoint
                .map(|f| format!(" with failpoint {f}"))
                .unwrap_or_default()
        ));
        Ok(())
    }

    /// A DeviceClass (named after the test's namespace and `suffix`) selecting exactly the
    /// devices named `devices`; deleted by [`RealNode::finish`].
    pub async fn device_class(&mut self, suffix: &str, devices: &[&str]) -> anyhow::Result<String> {
        let name = format!("{}-{suffix}.knic.dev", self.cluster.namespace);
        let names: Vec<String> = devices
            .iter()
            .map(|d| format!("device.attributes[\"knic.dev\"].ifName == \"{d}\""))
            .collect();
        let class: DeviceClass = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression":
                format!("device.driver == \"knic.dev\" && ({})", names.join(" || "))}}]},
        }))?;
        Api::<DeviceClass>::all(self.cluster.client.clone())
            .create(&PostParams::default(), &class)
            .await?;
        self.classes.push(name.clone());
        Ok(name)
    }

    /// A ResourceClaim `name` for one device of `class`, with `config` as its `NetworkConfig`.
    pub async fn claim(&self, name: &str, class: &str, config: Value) -> anyhow::Result<()> {
        let mut parameters = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig"});
        if let (Some(p), Some(c)) = (parameters.as_object_mut(), config.as_object()) {
            p.extend(c.clone());
        }
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": self.cluster.namespace},
            "spec": {"devices": {
                "requests": [{"name": "nic", "exactly": {"deviceClassName": class}}],
                "config": [{"requests": ["nic"],
                            "opaque": {"driver": "knic.dev", "parameters": parameters}}],
            }},
        }))?;
        self.claims().create(&PostParams::default(), &claim).await?;
        Ok(())
    }

    /// The test namespace's pods.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.cluster.client.clone(), &self.cluster.namespace)
    }

    /// The test namespace's claims.
    pub fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.cluster.client.clone(), &self.cluster.namespace)
    }

    /// The command-line marker of pod `name`'s app container, unique on the node.
    pub fn marker(&self, pod: &str) -> String {
        format!("knic-e2e-app-{}-{pod}", self.cluster.namespace)
    }

    /// A pod with one app container using the claim (the pause image, started with
    /// [`RealNode::marker`] as its argument, so its process can be told from every other).
    pub async fn create_pod(&self, name: &str, claim: &PodClaim) -> anyhow::Result<()> {
        let entry = match claim {
            PodClaim::Claim(c) => json!({"name": "net", "resourceClaimName": c}),
            PodClaim::Template(t) => json!({"name": "net", "resourceClaimTemplateName": t}),
        };
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.cluster.namespace},
            "spec": {
                "resourceClaims": [entry],
                "containers": [{"name": "app", "image": IMAGE, "imagePullPolicy": "Never",
                                "args": [self.marker(name)],
                                "resources": {"claims": [{"name": "net"}]}}],
                "terminationGracePeriodSeconds": 1,
            },
        }))?;
        self.pods().create(&PostParams::default(), &pod).await?;
        self.mark(&format!("pod {name} created"));
        Ok(())
    }

    /// Waits until every container of pod `name` runs and is ready, and returns the pod. The
    /// phase alone would not do: with restartPolicy Always a pod whose containers failed to
    /// start is reported Running too.
    pub async fn running(&self, name: &str, timeout: Duration) -> anyhow::Result<Pod> {
        let pods = self.pods();
        let waited = wait_for(&format!("pod {name} Running"), timeout, || async {
            let p = pods.get(name).await?;
            let status = p.status.clone().unwrap_or_default();
            let containers = status.container_statuses.unwrap_or_default();
            let up = status.phase.as_deref() == Some("Running")
                && !containers.is_empty()
                && containers
                    .iter()
                    .all(|c| c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()));
            Ok(up.then_some(p))
        })
        .await;
        match waited {
            Ok(pod) => {
                self.mark(&format!("pod {name} Running"));
                Ok(pod)
            }
            Err(e) => {
                let status = pods.get(name).await.map(|p| serde_json::to_value(p.status));
                bail!(
                    "{e:#}
pod status: {status:?}"
                )
            }
        }
    }

    /// The containers of pod `name` the kubelet reports running. (Not the phase: with
    /// restartPolicy Always a pod whose containers failed to start is reported Running.)
    pub async fn running_containers(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let p = self.pods().get(name).await?;
        Ok(p.status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            .map(|c| c.name)
            .collect())
    }

    /// Deletes pod `name` and waits until it is gone: the kubelet removes it only after it
    /// stopped the sandbox and unprepared its claims, so this is "unprepared" too.
    pub async fn delete_pod(&self, name: &str, timeout: Duration) -> anyhow::Result<()> {
        let pods = self.pods();
        match pods.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        wait_for(&format!("pod {name} gone"), timeout, || async {
            Ok(pods.get_opt(name).await?.is_none().then_some(()))
        })
        .await?;
        self.mark(&format!(
            "pod {name} gone (sandbox stopped, claims unprepared)"
        ));
        Ok(())
    }

    /// The name of the claim pod `name` uses (a template's generated claim once it exists).
    pub async fn claim_of(&self, pod: &str) -> anyhow::Result<String> {
        let p = self.pods().get(pod).await?;
        let status = p.status.unwrap_or_default();
        let spec = p.spec.unwrap_or_default();
        if let Some(name) = spec
            .resource_claims
            .iter()
            .flatten()
            .find_map(|c| c.resource_claim_name.clone())
        {
            return Ok(name);
        }
        status
            .resource_claim_statuses
            .iter()
            .flatten()
            .find_map(|s| s.resource_claim_name.clone())
            .with_context(|| format!("pod {pod} has no claim yet"))
    }

    /// A claim's `status` as JSON.
    pub async fn claim_status(&self, name: &str) -> anyhow::Result<Value> {
        Ok(serde_json::to_value(self.claims().get(name).await?.status)?)
    }

    /// Waits until claim `name` reports `networkData` for its device and returns the status.
    pub async fn configured(&self, claim: &str) -> anyhow::Result<Value> {
        wait_for(
            &format!("claim {claim} reports its interface"),
            Duration::from_secs(30),
            || async {
                let s = self.claim_status(claim).await?;
                Ok(s["devices"][0]["networkData"]["interfaceName"]
                    .is_string()
                    .then_some(s))
            },
        )
        .await
    }

    /// The network namespace of pod `name`'s sandbox: the one whose `eth0` has the pod's IP.
    pub async fn pod_netns(&self, name: &str) -> anyhow::Result<PathBuf> {
        let pod = self.pods().get(name).await?;
        let pod_ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .with_context(|| format!("pod {name} has no IP yet"))?;
        for entry in std::fs::read_dir("/var/run/netns")? {
            let ns = entry?.file_name().to_string_lossy().into_owned();
            let has = ip(&["-n", &ns, "-o", "addr", "show", "dev", "eth0"])
                .is_ok_and(|o| o.contains(&format!("inet {pod_ip}/")));
            if has {
                return Ok(PathBuf::from(format!("/var/run/netns/{ns}")));
            }
        }
        bail!("no network namespace has eth0 with pod {name}'s IP {pod_ip}")
    }

    /// Events of the test namespace, as `kind/name reason: message`, oldest first.
    pub async fn events(&self) -> anyhow::Result<Vec<String>> {
        let api: Api<Event> = Api::namespaced(self.cluster.client.clone(), &self.cluster.namespace);
        let mut events = api.list(&ListParams::default()).await?.items;
        events.sort_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or(e.event_time.as_ref().map(|t| t.0))
        });
        Ok(events
            .iter()
            .map(|e| {
                format!(
                    "{}/{} {}: {} (x{})",
                    e.involved_object.kind.clone().unwrap_or_default(),
                    e.involved_object.name.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    e.message.clone().unwrap_or_default().trim(),
                    e.count.unwrap_or(1)
                )
            })
            .collect())
    }

    /// The driver's checkpoint entries of this test's namespace (claim UID → entry).
    pub fn checkpoint(&self) -> anyhow::Result<serde_json::Map<String, Value>> {
        let path = self.config.plugin_dir.join("checkpoint.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
            Err(e) => return Err(e).with_context(|| path.display().to_string()),
        };
        let file: Value = serde_json::from_str(&text)?;
        let claims = file["data"]["claims"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        Ok(claims
            .into_iter()
            .filter(|(_, c)| c["namespace"] == json!(self.cluster.namespace))
            .collect())
    }

    /// Deletes every pod of the test (waiting until the kubelet unprepared them through a
    /// running driver: a driver left dead by a failpoint is replaced first), stops the driver,
    /// and removes the DeviceClasses, the node's slices and the namespace. Returns `outcome`
    /// decorated with the driver's log and the namespace's events when it is an error, else
    /// the clean-up's own result.
    pub async fn finish(mut self, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
        let events = match &outcome {
            Err(_) => self.events().await.unwrap_or_default(),
            Ok(()) => Vec::new(),
        };
        let cleanup = self.clean_up().await;
        match outcome {
            Ok(()) => cleanup,
            Err(e) => bail!(
                "{e:#}\n--- clean-up: {cleanup:?}\n--- events ---\n{}\n--- driver log ---\n{}",
                events.join("\n"),
                self.driver.logs()
            ),
        }
    }

    /// Deletes every pod of the test and waits until each is gone, i.e. until the kubelet
    /// stopped its sandbox and unprepared its claims, which needs a running driver: a frozen
    /// one is continued and one left dead by a failpoint is replaced first. A pod still there
    /// after two minutes is force-deleted (left Terminating it would hold the namespace
    /// forever; the kubelet still unprepares it when a driver registers) and reported.
    pub async fn delete_pods(&mut self) -> anyhow::Result<()> {
        let mut problems = Vec::new();
        if self.stopped
            && let Err(e) = self.thaw()
        {
            problems.push(format!("continuing the driver: {e:#}"));
        }
        if !self.driver.is_running()
            && let Err(e) = self.restart_driver(None).await
        {
            problems.push(format!("restarting the driver for the clean-up: {e:#}"));
        }
        let pods = match self.pods().list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(e) => {
                problems.push(format!("listing the pods: {e:#}"));
                Vec::new()
            }
        };
        for pod in pods {
            let name = pod.metadata.name.unwrap_or_default();
            if let Err(e) = self.delete_pod(&name, Duration::from_secs(120)).await {
                problems.push(format!("{e:#}"));
                let force = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                let _ = self.pods().delete(&name, &force).await;
            }
        }
        ensure!(problems.is_empty(), "{}", problems.join("; "));
        Ok(())
    }

    async fn clean_up(&mut self) -> anyhow::Result<()> {
        let mut problems = Vec::new();
        if let Err(e) = self.delete_pods().await {
            problems.push(format!("{e:#}"));
        }
        if self.driver.is_running()
            && let Err(e) = self.driver.terminate().await
        {
            problems.push(format!("stopping the driver: {e:#}"));
        }
        let classes: Api<DeviceClass> = Api::all(self.cluster.client.clone());
        for class in &self.classes {
            if let Err(e) = classes.delete(class, &DeleteParams::default()).await {
                problems.push(format!("deleting DeviceClass {class}: {e:#}"));
            }
        }
        if let Err(e) = self.cluster.cleanup().await {
            problems.push(format!("{e:#}"));
        }
        ensure!(problems.is_empty(), "clean-up: {}", problems.join("; "));
        Ok(())
    }
}

/// `ip -o addr show dev <dev>` inside the namespace at `netns` (a path, as NRI and `/proc` give
/// it), or `None` when the device is not there.
pub fn link_in(netns: &Path, dev: &str) -> Option<String> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["ip", "-o", "addr", "show", "dev", dev])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -o link` inside the namespace at `netns`.
pub fn links_in(netns: &Path) -> anyhow::Result<String> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["ip", "-o", "link"])
        .output()?;
    ensure!(
        out.status.success(),
        "ip -o link in {}: {}",
        netns.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Processes whose command line contains `marker`, with their network namespace
/// (`/proc/<pid>/ns/net`).
pub fn processes_with(marker: &str) -> Vec<(u32, PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .map(|pid| (pid, PathBuf::from(format!("/proc/{pid}/ns/net"))))
        .collect()
}

/// Every named network namespace whose links include one with MAC `mac`.
pub fn namespaces_holding(mac: &str) -> anyhow::Result<Vec<String>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/var/run/netns")? {
        let ns = entry?.file_name().to_string_lossy().into_owned();
        if ip(&["-n", &ns, "-o", "link"]).is_ok_and(|o| o.contains(mac)) {
            found.push(ns);
        }
    }
    Ok(found)
}

/// Waits (up to a minute) until the node is Ready and carries no taint that keeps pods off it,
/// and otherwise fails naming what it carries: a shared machine's node can be under disk
/// pressure for minutes, and a twin whose pods cannot be scheduled would only time out later
/// with a less clear message.
async fn schedulable(real: &RealCluster) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let file = kube::config::Kubeconfig::read_from(&real.kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default()).await?;
    let nodes: Api<Node> = Api::all(kube::Client::try_from(config)?);
    wait_for(
        &format!("node {} Ready and schedulable", real.node),
        Duration::from_secs(60),
        || async {
            let node = nodes.get(&real.node).await?;
            let taints: Vec<String> = node
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .into_iter()
                .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect();
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ensure!(
                ready && taints.is_empty(),
                "node {} is {}ready with taints {taints:?}",
                real.node,
                if ready { "" } else { "not " }
            );
            Ok(Some(()))
        },
    )
    .await
}
