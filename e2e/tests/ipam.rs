//! IPAM end to end: claims whose config says `ipam: {network: NAME}` get their addresses from
//! the real `knic-driver` binary at prepare time, recorded as `NetworkAddress` objects in the
//! API (the fake in CI, a real cluster with `KNIC_E2E_KUBECONFIG`, where the CRDs must be
//! installed). Checked: the object names the claim and is deleted by unprepare, also after a
//! `kill -9` and restart; many claims racing on one Network from two driver processes never
//! share an address; exhaustion is a clean per-claim prepare error with the controller's text,
//! and (with the controller running in-process) keeps the network's template from accepting
//! any published device until an address is freed. Stable addresses by pod label are refused
//! unless the driver may read pods (`KNIC_POD_LABEL_READS`); by pod name they need no read.
//! With a grace period, identities keep their addresses through churn (see `stable`); a full
//! network is covered in `exhaustion`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::DeviceClass;
use knic_e2e::cluster::{Cluster, RealCluster, TestClaim};
use knic_e2e::driver::{DriverConfig, DriverProcess, VFS, vf_device};
use knic_e2e::harness::{ScenarioEnv, eventually, scenario_trials};
use knic_e2e::kubelet::{self, ClaimId, DraVersion, Plugin, Prepared};
use knic_proto::network::{NETWORK_LABEL, Network, NetworkAddress};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[path = "ipam/exhaustion.rs"]
mod exhaustion;
use exhaustion::{
    exhaustion_is_a_clean_prepare_error, exhaustion_keeps_new_claims_from_scheduling,
};

#[path = "ipam/stable.rs"]
mod stable;
use stable::stable_addresses_survive_churn;

/// How long a status or slice change may take to show.
const WAIT: Duration = Duration::from_secs(20);

/// One driver process playing one node.
struct Node {
    config: DriverConfig,
    driver: DriverProcess,
    plugin: Arc<Plugin>,
}

struct Env {
    cluster: Cluster,
    /// The test's own Network (cluster-scoped, so named per test run).
    network: String,
    nodes: Vec<Node>,
    /// The `knic.dev` DeviceClass this test made (a real cluster with the chart has its own,
    /// and the chart refuses to install over a class someone else left).
    made_class: bool,
}

impl Env {
    fn id(&self, claim: &TestClaim) -> ClaimId {
        ClaimId {
            namespace: self.cluster.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        }
    }

    /// Starts one more driver process, as node `name`, with its own directories.
    async fn add_node(&mut self, name: &str) -> anyhow::Result<()> {
        let dir = self.cluster.tmp.path().join(name);
        std::fs::create_dir_all(&dir)?;
        let config = DriverConfig::under(&dir, name, &self.cluster.kubeconfig);
        let driver = DriverProcess::start(&config)?;
        let plugin = match kubelet::register(&config.registry_dir).await {
            Ok(p) => Arc::new(p),
            Err(e) => anyhow::bail!("{e:#}\ndriver log:\n{}", driver.logs()),
        };
        self.nodes.push(Node {
            config,
            driver,
            plugin,
        });
        Ok(())
    }

    fn checkpoint(&self, node: usize) -> String {
        std::fs::read_to_string(self.nodes[node].config.plugin_dir.join("checkpoint.json"))
            .unwrap_or_default()
    }

    async fn create_network(&self, subnets: serde_json::Value) -> anyhow::Result<()> {
        self.create_stable_network(subnets, None).await
    }

    /// The test's Network, with `spec.stableAddresses` when `stable` is given.
    async fn create_stable_network(
        &self,
        subnets: serde_json::Value,
        stable: Option<serde_json::Value>,
    ) -> anyhow::Result<()> {
        let mut spec = json!({
            "devices": {"deviceClassName": "knic.dev"},
            "ipam": {"subnets": subnets},
            "namespaces": {"names": [self.cluster.namespace]},
        });
        if let Some(stable) = stable {
            spec["stableAddresses"] = stable;
        }
        let spec = serde_json::from_value(spec)?;
        Api::<Network>::all(self.cluster.client.clone())
            .create(&PostParams::default(), &Network::new(&self.network, spec))
            .await?;
        Ok(())
    }

    /// A claim on VF `vf` whose config asks for an address from the test's Network.
    async fn claim(&self, name: &str, vf: usize) -> anyhow::Result<TestClaim> {
        self.claim_on(0, name, vf).await
    }

    /// A claim allocated VF `vf` of node `node` (index into `nodes`), in that node's pool.
    async fn claim_on(&self, node: usize, name: &str, vf: usize) -> anyhow::Result<TestClaim> {
        let config = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                            "ipam": {"network": self.network}});
        self.cluster
            .create_claim_in_pool(
                name,
                &self.nodes[node].config.node_name,
                Some(&[("knic.dev", vf_device(vf).as_str())]),
                Some(config),
            )
            .await
    }

    /// The Network's allocation objects, as the controller would list them.
    async fn addresses(&self) -> anyhow::Result<Vec<NetworkAddress>> {
        let api: Api<NetworkAddress> = Api::all(self.cluster.client.clone());
        let selector = format!("{NETWORK_LABEL}={}", self.network);
        Ok(api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items)
    }

    async fn prepare(&self, node: usize, claim: &TestClaim) -> anyhow::Result<Prepared> {
        let mut out = self.nodes[node]
            .plugin
            .prepare(DraVersion::V1, &[self.id(claim)])
            .await?;
        out.remove(&claim.uid).context("no entry for the claim")
    }

    async fn unprepare(&self, node: usize, claim: &TestClaim) -> anyhow::Result<String> {
        let mut out = self.nodes[node]
            .plugin
            .unprepare(DraVersion::V1, &[self.id(claim)])
            .await?;
        out.remove(&claim.uid).context("no entry for the claim")
    }

    /// Prepares every `(node, claim)` at once, each in its own kubelet call, as pods starting
    /// together on several nodes do.
    async fn prepare_all(&self, claims: &[(usize, TestClaim)]) -> anyhow::Result<Vec<Prepared>> {
        let mut tasks = Vec::new();
        for (node, claim) in claims {
            let plugin = self.nodes[*node].plugin.clone();
            let id = self.id(claim);
            tasks.push(tokio::spawn(async move {
                let uid = id.uid.clone();
                let mut out = plugin.prepare(DraVersion::V1, &[id]).await?;
                out.remove(&uid).context("no entry for the claim")
            }));
        }
        let mut out = Vec::new();
        for task in tasks {
            out.push(task.await??);
        }
        Ok(out)
    }

    /// Waits until the Network's `status.availableNodes` is `want`.
    async fn wait_available_nodes(&self, want: Option<u32>) -> anyhow::Result<()> {
        let networks: Api<Network> = Api::all(self.cluster.client.clone());
        eventually(
            &format!("status.availableNodes = {want:?}"),
            WAIT,
            || async {
                let n = networks.get(&self.network).await?;
                let have = n.status.and_then(|s| s.available_nodes);
                Ok((have == want).then_some(()))
            },
        )
        .await
    }

    /// Stops node `node`'s driver and starts it again with `key=value` added to its
    /// environment, registered anew.
    async fn restart_with(&mut self, node: usize, key: &str, value: &str) -> anyhow::Result<()> {
        let node = &mut self.nodes[node];
        node.driver.terminate().await?;
        node.config = node.config.clone().with_env(key, value);
        node.driver = DriverProcess::start(&node.config)?;
        node.plugin = match kubelet::register(&node.config.registry_dir).await {
            Ok(p) => Arc::new(p),
            Err(e) => anyhow::bail!("{e:#}\ndriver log:\n{}", node.driver.logs()),
        };
        Ok(())
    }

    /// GETs of pods the fake API served (`None` on a real cluster, which cannot count them).
    fn pod_reads(&self) -> Option<Vec<String>> {
        self.cluster.fake.as_ref().map(|fake| {
            fake.requests()
                .into_iter()
                .filter(|r| {
                    r.method == "GET" && r.path.starts_with("/api/v1/") && r.path.contains("/pods")
                })
                .map(|r| r.path)
                .collect()
        })
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {} ---\n{}", n.config.node_name, n.driver.logs()))
            .collect()
    }

    /// Removes what a real cluster would keep: the Network and its allocation objects are
    /// cluster-scoped, so deleting the test namespace does not take them along.
    async fn cleanup(&self) -> anyhow::Result<()> {
        let addresses: Api<NetworkAddress> = Api::all(self.cluster.client.clone());
        let selector = format!("{NETWORK_LABEL}={}", self.network);
        addresses
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&selector),
            )
            .await?;
        let networks: Api<Network> = Api::all(self.cluster.client.clone());
        if networks.get_opt(&self.network).await?.is_some() {
            networks
                .delete(&self.network, &DeleteParams::default())
                .await?;
        }
        if self.made_class {
            let classes: Api<DeviceClass> = Api::all(self.cluster.client.clone());
            match classes.delete("knic.dev", &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.cluster.cleanup().await
    }
}

/// The claim's address is an object naming the claim, found again on a repeated prepare, kept
/// across a `kill -9`, and released by unprepare from the checkpoint alone.
async fn address_end_to_end(env: &mut Env) -> anyhow::Result<()> {
    env.create_network(json!([{
        "cidr": "192.0.2.0/24", "gateway": "192.0.2.1",
        "routes": [{"destination": "198.51.100.0/24"}],
    }]))
    .await?;
    let claim = env.claim("addr", 0).await?;
    let got = env.prepare(0, &claim).await?;
    ensure!(got.error.is_empty(), "prepare: {}", got.error);
    let objects = env.addresses().await?;
    ensure!(objects.len() == 1, "one allocation, got {objects:?}");
    let object = &objects[0];
    let address = object.spec.address.clone();
    ensure!(
        object.spec.claim.uid == claim.uid
            && object.spec.claim.name == "addr"
            && object.spec.claim.namespace == env.cluster.namespace,
        "owner: {:?}",
        object.spec.claim
    );
    ensure!(
        address.starts_with("192.0.2.") && address.ends_with("/24") && address != "192.0.2.1/24",
        "address {address}"
    );
    ensure!(object.spec.node.as_deref() == Some(env.cluster.node.as_str()));
    let name = object
        .metadata
        .name
        .clone()
        .context("object without name")?;
    let ip = address.trim_end_matches("/24").replace('.', "-");
    ensure!(name == format!("{}-{ip}", env.network), "name {name}");
    let cp = env.checkpoint(0);
    ensure!(
        cp.contains(&name) && cp.contains(&address),
        "checkpoint lacks the allocation: {cp}"
    );

    // A repeated prepare answers from the checkpoint: no second allocation.
    let again = env.prepare(0, &claim).await?;
    ensure!(again == got, "{again:?} != {got:?}");
    ensure!(env.addresses().await?.len() == 1);

    // kill -9, the claim goes away, the driver comes back: unprepare still releases.
    env.nodes[0].driver.kill9().await?;
    env.cluster.delete_claim("addr").await?;
    let node = &mut env.nodes[0];
    node.driver = DriverProcess::start(&node.config)?;
    node.plugin = Arc::new(kubelet::register(&node.config.registry_dir).await?);
    let out = env.unprepare(0, &claim).await?;
    ensure!(out.is_empty(), "unprepare: {out}");
    ensure!(
        env.addresses().await?.is_empty(),
        "unprepare must delete the NetworkAddress"
    );
    ensure!(!env.checkpoint(0).contains(&claim.uid));
    Ok(())
}

/// A Network whose addresses are stable by pod label needs the pod's labels at prepare. The
/// driver reads no pods by default: the claim is refused naming the Network, the field and the
/// opt-in, before any pod read or allocation. Restarted with `KNIC_POD_LABEL_READS=true` (the
/// chart's `driver.podLabelReads`), the driver reads the pod and allocates with the label's
/// value as the identity.
async fn stable_by_label_needs_pod_label_reads(env: &mut Env) -> anyhow::Result<()> {
    env.create_stable_network(
        json!([{"cidr": "192.0.2.0/24"}]),
        Some(json!({"by": "label", "label": "app"})),
    )
    .await?;
    let claim = env.claim("lbl", 0).await?;
    Api::<Pod>::namespaced(env.cluster.client.clone(), &env.cluster.namespace)
        .patch(
            "lbl-pod",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "db-0"}}})),
        )
        .await?;

    let refused = env.prepare(0, &claim).await?;
    let want = knic_driver::claims::ipam::pod_label_reads_off(&env.network, "app");
    ensure!(
        refused.error.contains(&want),
        "prepare without pod reads: {:?}, want it to contain {want:?}",
        refused.error
    );
    ensure!(
        env.addresses().await?.is_empty(),
        "an address was allocated"
    );
    if let Some(reads) = env.pod_reads() {
        ensure!(reads.is_empty(), "the driver read pods: {reads:?}");
    }

    env.restart_with(0, "KNIC_POD_LABEL_READS", "true").await?;
    let got = env.prepare(0, &claim).await?;
    ensure!(
        got.error.is_empty(),
        "prepare with pod reads: {}",
        got.error
    );
    let objects = env.addresses().await?;
    ensure!(objects.len() == 1, "one allocation, got {objects:?}");
    let identity = objects[0].spec.identity.clone();
    let want = format!("{}/db-0", env.cluster.namespace);
    ensure!(
        identity.as_deref() == Some(want.as_str()),
        "identity {identity:?}, want {want:?} (the pod's label)"
    );
    if let Some(reads) = env.pod_reads() {
        let path = format!("/api/v1/namespaces/{}/pods/lbl-pod", env.cluster.namespace);
        ensure!(reads == [path], "pod reads {reads:?}");
    }
    ensure!(env.unprepare(0, &claim).await?.is_empty());
    Ok(())
}

/// `stableAddresses.by: podName` works without any pod read: the name is the claim's
/// `reservedFor`.
async fn stable_by_pod_name_reads_no_pod(env: &mut Env) -> anyhow::Result<()> {
    env.create_stable_network(
        json!([{"cidr": "192.0.2.0/24"}]),
        Some(json!({"by": "podName"})),
    )
    .await?;
    let claim = env.claim("byname", 0).await?;
    let got = env.prepare(0, &claim).await?;
    ensure!(got.error.is_empty(), "prepare: {}", got.error);
    let objects = env.addresses().await?;
    ensure!(objects.len() == 1, "one allocation, got {objects:?}");
    let want = format!("{}/byname-pod", env.cluster.namespace);
    ensure!(
        objects[0].spec.identity.as_deref() == Some(want.as_str()),
        "identity {:?}, want {want:?}",
        objects[0].spec.identity
    );
    if let Some(reads) = env.pod_reads() {
        ensure!(reads.is_empty(), "the driver read pods: {reads:?}");
    }
    ensure!(env.unprepare(0, &claim).await?.is_empty());
    Ok(())
}

/// Claims prepared all at once, on two driver processes (one on a real cluster, where a second
/// node cannot be faked), each get their own address of one small subnet.
async fn concurrent_claims_get_unique_addresses(env: &mut Env) -> anyhow::Result<()> {
    let nodes = if env.cluster.fake.is_some() { 2 } else { 1 };
    if nodes == 2 {
        let second = format!("{}-b", env.cluster.node);
        env.add_node(&second).await?;
    }
    // A /25: 126 usable addresses for 64 claims, so racers collide now and then but all fit.
    env.create_network(json!([{"cidr": "10.20.0.0/25"}]))
        .await?;
    let mut claims = Vec::new();
    for node in 0..nodes {
        for vf in 0..VFS {
            let claim = env
                .claim_on(node, &format!("par-{node}-{vf:02}"), vf)
                .await?;
            claims.push((node, claim));
        }
    }
    let outcomes = env.prepare_all(&claims).await?;
    for ((node, claim), got) in claims.iter().zip(&outcomes) {
        ensure!(
            got.error.is_empty(),
            "node {node} claim {}: {}",
            claim.name,
            got.error
        );
    }
    let objects = env.addresses().await?;
    let addresses: BTreeSet<&str> = objects.iter().map(|o| o.spec.address.as_str()).collect();
    let owners: BTreeSet<&str> = objects.iter().map(|o| o.spec.claim.uid.as_str()).collect();
    ensure!(
        objects.len() == claims.len()
            && addresses.len() == claims.len()
            && owners.len() == claims.len(),
        "{} claims, {} objects, {} distinct addresses, {} distinct owners",
        claims.len(),
        objects.len(),
        addresses.len(),
        owners.len()
    );
    ensure!(
        addresses
            .iter()
            .all(|a| a.starts_with("10.20.0.") && a.ends_with("/25")),
        "{addresses:?}"
    );
    for (node, claim) in &claims {
        let out = env.unprepare(*node, claim).await?;
        ensure!(out.is_empty(), "unprepare {}: {out}", claim.name);
    }
    let left = env.addresses().await?;
    ensure!(left.is_empty(), "{} allocations left", left.len());
    Ok(())
}

impl ScenarioEnv for Env {
    async fn setup(real: Option<RealCluster>, test: String) -> anyhow::Result<Env> {
        setup(real, &test).await
    }

    async fn finish(self, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
        let cleanup = self.cleanup().await;
        match outcome {
            Ok(()) => cleanup,
            Err(e) => anyhow::bail!("{e:#}\n{}", self.logs()),
        }
    }
}

async fn setup(real: Option<RealCluster>, test: &str) -> anyhow::Result<Env> {
    let cluster = match &real {
        Some(r) => Cluster::real(r, test).await?,
        None => Cluster::fake(test).await?,
    };
    // Cluster-scoped and DNS-label short, so runs (and trials) never share a Network.
    let network = format!(
        "e2e-{}",
        cluster
            .namespace
            .rsplit('-')
            .next()
            .context("namespace without suffix")?
    );
    let first = cluster.node.clone();
    let mut env = Env {
        cluster,
        network,
        nodes: Vec::new(),
        made_class: false,
    };
    let dir = env.cluster.tmp.path().join(&first);
    std::fs::create_dir_all(&dir)?;
    let config = DriverConfig::under(&dir, &first, &env.cluster.kubeconfig);
    let driver = DriverProcess::start(&config)?;
    let plugin = match kubelet::register(&config.registry_dir).await {
        Ok(p) => Arc::new(p),
        Err(e) => anyhow::bail!("{e:#}\ndriver log:\n{}", driver.logs()),
    };
    env.nodes.push(Node {
        config,
        driver,
        plugin,
    });
    Ok(env)
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let trials = scenario_trials::<Env>(&knic_e2e::scenarios![
        address_end_to_end,
        concurrent_claims_get_unique_addresses,
        exhaustion_is_a_clean_prepare_error,
        exhaustion_keeps_new_claims_from_scheduling,
        stable_by_label_needs_pod_label_reads,
        stable_by_pod_name_reads_no_pod,
        stable_addresses_survive_churn,
    ]);
    libtest_mimic::run(&args, trials).exit();
}
