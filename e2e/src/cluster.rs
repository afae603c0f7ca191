//! The API the e2e tests run against: the in-process fake in CI, or a real cluster when
//! `KNIC_E2E_KUBECONFIG` is set. Both are driven through the same `kube::Client` calls with
//! real objects and real field names, so the fake cannot drift into a private dialect.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::fakeapi::FakeApi;
use crate::gates::{self, ENV_FEATURE_GATES, ENV_HARNESS, Harness, Needs};

/// The environment variables that switch the e2e tests to a real cluster.
pub const ENV_KUBECONFIG: &str = "KNIC_E2E_KUBECONFIG";
/// Node name on the real cluster.
pub const ENV_NODE: &str = "KNIC_E2E_NODE";
/// Kubelet root directory on the real cluster's node.
pub const ENV_KUBELET_DIR: &str = "KNIC_E2E_KUBELET_DIR";
/// The runtime's NRI socket on the real cluster's node.
pub const ENV_NRI_SOCKET: &str = "KNIC_E2E_NRI_SOCKET";

/// Settings for a real cluster, read from the environment.
#[derive(Debug, Clone)]
pub struct RealCluster {
    /// Kubeconfig with rights to create namespaces, pods and claims.
    pub kubeconfig: PathBuf,
    /// The node the driver runs for.
    pub node: String,
    /// The node's kubelet root directory.
    pub kubelet_dir: PathBuf,
    /// The runtime's NRI socket.
    pub nri_socket: PathBuf,
    /// The shared cluster's kit, when `KNIC_E2E_HARNESS` names it: twins may then restart its
    /// apiserver with other feature gates.
    pub harness: Option<Harness>,
    /// `KNIC_E2E_FEATURE_GATES`, for a cluster without the kit.
    pub feature_gates: BTreeMap<String, bool>,
}

impl RealCluster {
    /// `Ok(None)` when `KNIC_E2E_KUBECONFIG` is unset (tests then report themselves skipped);
    /// an error naming the missing variable when it is set but incomplete.
    pub fn from_env() -> anyhow::Result<Option<RealCluster>> {
        let Ok(kubeconfig) = std::env::var(ENV_KUBECONFIG) else {
            return Ok(None);
        };
        let var = |name: &str| {
            std::env::var(name)
                .with_context(|| format!("{ENV_KUBECONFIG} is set, so {name} must be set too"))
        };
        Ok(Some(RealCluster {
            kubeconfig: kubeconfig.into(),
            node: var(ENV_NODE)?,
            kubelet_dir: var(ENV_KUBELET_DIR)?.into(),
            nri_socket: var(ENV_NRI_SOCKET)?.into(),
            harness: Harness::from_env()?,
            feature_gates: match std::env::var(ENV_FEATURE_GATES) {
                Ok(list) => gates::parse(&list).with_context(|| ENV_FEATURE_GATES)?,
                Err(_) => BTreeMap::new(),
            },
        }))
    }

    /// Which of [`gates::GATES`] the apiserver runs with off now.
    pub fn gates_off(&self) -> anyhow::Result<BTreeSet<String>> {
        Ok(match &self.harness {
            Some(h) => gates::off_in(&h.gates()?),
            None => gates::off_in(&self.feature_gates),
        })
    }

    /// Why a scenario with `needs` cannot run on this cluster, if it cannot: the kit can
    /// switch gates, a cluster without it runs only what its gates allow.
    pub fn refusal(&self, needs: Needs) -> Option<String> {
        let Some(want) = needs.off_at_start() else {
            let Needs::FakeOnly(why) = needs else {
                return None;
            };
            return Some(why.to_owned());
        };
        if self.harness.is_some() {
            return None;
        }
        let have = match self.gates_off() {
            Ok(have) => have,
            Err(e) => return Some(format!("{e:#}")),
        };
        if let Needs::TurnedOff(gate) = needs {
            return Some(format!(
                "turning {gate} off needs the harness kit ({ENV_HARNESS}) to restart the apiserver"
            ));
        }
        (have != want).then(|| {
            format!(
                "needs {} off, this cluster has {} off ({ENV_FEATURE_GATES}); with                  {ENV_HARNESS} the twin switches them itself",
                list(&want),
                list(&have)
            )
        })
    }
}

fn list(gates: &BTreeSet<String>) -> String {
    if gates.is_empty() {
        "none".to_owned()
    } else {
        gates.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}

/// One test's view of the API: a client, a kubeconfig file for the driver, the node name and a
/// namespace of its own that is deleted at the end.
pub struct Cluster {
    /// Client for the test's own reads and writes.
    pub client: kube::Client,
    /// Kubeconfig the driver binary is started with.
    pub kubeconfig: PathBuf,
    /// Node name the driver runs as.
    pub node: String,
    /// The test's namespace.
    pub namespace: String,
    /// The fake, when running without a cluster.
    pub fake: Option<FakeApi>,
    /// The real cluster's settings, when running against one.
    pub real: Option<RealCluster>,
    /// Temporary files of this test.
    pub tmp: tempfile::TempDir,
}

/// A claim created for a test, with the pod it is reserved for.
#[derive(Debug, Clone)]
pub struct TestClaim {
    /// Claim name.
    pub name: String,
    /// Claim UID.
    pub uid: String,
    /// The consuming pod's UID.
    pub pod_uid: String,
}

impl Cluster {
    /// A fresh fake API with its own namespace.
    pub async fn fake(test: &str) -> anyhow::Result<Cluster> {
        Cluster::fake_on(test, "127.0.0.1".parse()?).await
    }

    /// [`Cluster::fake`] serving on `address` (see [`FakeApi::start_on`]).
    pub async fn fake_on(test: &str, address: std::net::IpAddr) -> anyhow::Result<Cluster> {
        let fake = FakeApi::start_on(address).await?;
        let tmp = tempfile::Builder::new().prefix("knic-e2e-").tempdir()?;
        let kubeconfig = tmp.path().join("kubeconfig");
        fake.write_kubeconfig(&kubeconfig)?;
        let cluster = Cluster {
            client: fake.client()?,
            kubeconfig,
            node: "knic-node-1".into(),
            namespace: namespace_for(test),
            fake: Some(fake),
            real: None,
            tmp,
        };
        cluster.create_namespace().await?;
        Ok(cluster)
    }

    /// A namespace of its own on the real cluster.
    pub async fn real(real: &RealCluster, test: &str) -> anyhow::Result<Cluster> {
        let file = kube::config::Kubeconfig::read_from(&real.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default()).await?;
        let cluster = Cluster {
            client: kube::Client::try_from(config)?,
            kubeconfig: real.kubeconfig.clone(),
            node: real.node.clone(),
            namespace: namespace_for(test),
            fake: None,
            real: Some(real.clone()),
            tmp: tempfile::Builder::new().prefix("knic-e2e-").tempdir()?,
        };
        ensure_crds(&cluster.client).await?;
        cluster.create_namespace().await?;
        Ok(cluster)
    }

    /// Sets the fake's gates as a scenario with [`Needs::Off`] needs them; on a real cluster
    /// the trial has already restarted the apiserver so (or the cluster runs so).
    pub fn start_with_gates_off(&self, off: &[&str]) -> anyhow::Result<()> {
        if self.fake.is_some() {
            for gate in off {
                self.turn_gate_off(gate)?;
            }
        }
        Ok(())
    }

    /// Turns `gate` off while the scenario runs: a flag on the fake; on the real cluster the
    /// apiserver restarts without it (the kit's `up --restart`), as an operator's change does.
    pub fn turn_gate_off(&self, gate: &str) -> anyhow::Result<()> {
        if let Some(fake) = &self.fake {
            match gate {
                gates::PARTITIONABLE => fake.set_partitionable_devices(false),
                gates::CONSUMABLE => fake.set_consumable_capacity(false),
                gates::TAINTS => fake.set_device_taints(false),
                other => anyhow::bail!("the fake API has no gate {other}"),
            }
            return Ok(());
        }
        let real = self
            .real
            .as_ref()
            .context("neither a fake nor a real cluster")?;
        let harness = real
            .harness
            .as_ref()
            .with_context(|| format!("turning {gate} off needs {ENV_HARNESS}"))?;
        let mut off = real.gates_off()?;
        off.insert(gate.to_owned());
        harness.switch(&off)?;
        Ok(())
    }

    async fn create_namespace(&self) -> anyhow::Result<()> {
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": self.namespace, "labels": {"app.kubernetes.io/part-of": "knic-e2e"}},
        }))?;
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        self.service_account_ready(&self.namespace).await
    }

    /// On a real cluster, makes sure the namespace's `default` ServiceAccount exists: the
    /// apiserver refuses a pod until it does ("error looking up service account …/default").
    /// The controller-manager makes it within a second normally, but after the twins restart
    /// the apiserver (gate switches) its failed requests back off for minutes, so after a
    /// short wait the test makes it itself, as the controller would.
    async fn service_account_ready(&self, namespace: &str) -> anyhow::Result<()> {
        if self.fake.is_some() {
            return Ok(());
        }
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client.clone(), namespace);
        let made = crate::harness::eventually(
            &format!("ServiceAccount {namespace}/default"),
            std::time::Duration::from_secs(15),
            || async { Ok(accounts.get_opt("default").await?.map(|_| ())) },
        )
        .await;
        if made.is_ok() {
            return Ok(());
        }
        eprintln!("{namespace}: no default ServiceAccount after 15 s; making it");
        let account = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": namespace},
        }))?;
        match accounts.create(&PostParams::default(), &account).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes sure the Node object exists (the fake starts empty; a real cluster has it) and
    /// returns its UID, which slices must carry in their owner reference.
    pub async fn ensure_node(&self) -> anyhow::Result<String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        if let Some(node) = nodes.get_opt(&self.node).await? {
            return node.metadata.uid.context("node without uid");
        }
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node},
        }))?;
        let node = nodes.create(&PostParams::default(), &node).await?;
        node.metadata.uid.context("node without uid")
    }

    /// This driver's slices for the node, in name order.
    pub async fn slices(&self) -> anyhow::Result<Vec<ResourceSlice>> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let fields = format!("spec.nodeName={},spec.driver=knic.dev", self.node);
        let mut items = api
            .list(&ListParams::default().fields(&fields))
            .await?
            .items;
        items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(items)
    }

    /// Deletes this driver's slices for the node, as the kubelet does when it restarts.
    pub async fn wipe_slices(&self) -> anyhow::Result<()> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let fields = format!("spec.nodeName={},spec.driver=knic.dev", self.node);
        api.delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields(&fields),
        )
        .await?;
        Ok(())
    }

    /// Deletes the test namespace (and with it, on a real cluster, its pods and claims).
    pub async fn cleanup(&self) -> anyhow::Result<()> {
        if self.fake.is_none() {
            // The pods go first, while the test's driver still runs: the real kubelet
            // unprepares their claims through it, and a pod whose driver was stopped first
            // stays Terminating with its claim prepared.
            self.delete_pods().await?;
            // Slices the test driver published for the real node must not outlive the test.
            self.wipe_slices().await?;
        }
        Api::<Namespace>::all(self.client.clone())
            .delete(&self.namespace, &DeleteParams::default())
            .await?;
        Ok(())
    }

    /// Deletes the namespace's pods and waits (bounded) until they are gone.
    async fn delete_pods(&self) -> anyhow::Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        pods.delete_collection(&DeleteParams::default(), &ListParams::default())
            .await?;
        crate::harness::eventually(
            &format!("the pods of {} gone", self.namespace),
            std::time::Duration::from_secs(120),
            || async {
                let left = pods.list(&ListParams::default()).await?.items;
                Ok(left.is_empty().then_some(()))
            },
        )
        .await
    }

    /// Creates a claim with one request `nic`, a pod that references it (held back from
    /// scheduling by a scheduling gate, so no real kubelet acts on it), and, unless
    /// `results` is `None`, an allocation with those `(driver, device)` results reserved for
    /// the pod: the state the scheduler leaves a claim in before the kubelet calls prepare.
    pub async fn create_claim(
        &self,
        name: &str,
        results: Option<&[(&str, &str)]>,
    ) -> anyhow::Result<TestClaim> {
        self.create_claim_with_config(name, results, None).await
    }

    /// Like [`Cluster::create_claim`], with opaque `knic.dev` parameters (a `NetworkConfig`)
    /// in the claim spec and, as the scheduler copies it, in the allocation.
    pub async fn create_claim_with_config(
        &self,
        name: &str,
        results: Option<&[(&str, &str)]>,
        parameters: Option<serde_json::Value>,
    ) -> anyhow::Result<TestClaim> {
        let pool = self.node.clone();
        self.create_claim_in_pool(name, &pool, results, parameters)
            .await
    }

    /// Like [`Cluster::create_claim_with_config`], allocated in `pool` (another node's: a
    /// driver prepares only results in its own node's pool).
    pub async fn create_claim_in_pool(
        &self,
        name: &str,
        pool: &str,
        results: Option<&[(&str, &str)]>,
        parameters: Option<serde_json::Value>,
    ) -> anyhow::Result<TestClaim> {
        let results = results.map(|results| {
            results
                .iter()
                .map(|(driver, device)| {
                    json!({"request": "nic", "driver": driver, "pool": pool, "device": device})
                })
                .collect()
        });
        self.create_claim_allocated(name, results, parameters).await
    }

    /// Like [`Cluster::create_claim_with_config`], with the allocation results written out
    /// whole (e.g. a share of a device: `shareID`, `consumedCapacity`), all for request `nic`.
    pub async fn create_claim_allocated(
        &self,
        name: &str,
        results: Option<Vec<serde_json::Value>>,
        parameters: Option<serde_json::Value>,
    ) -> anyhow::Result<TestClaim> {
        self.create_claim_for_pod(name, &format!("{name}-pod"), results, parameters)
            .await
    }

    /// Like [`Cluster::create_claim_allocated`], for a pod named `pod` (a stable identity that
    /// outlives its claims, like a StatefulSet pod re-created with a new claim).
    pub async fn create_claim_for_pod(
        &self,
        name: &str,
        pod_name: &str,
        results: Option<Vec<serde_json::Value>>,
        parameters: Option<serde_json::Value>,
    ) -> anyhow::Result<TestClaim> {
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut spec = json!({"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "knic.dev"}}]}});
        if let Some(p) = &parameters {
            spec["devices"]["config"] =
                json!([{"requests": ["nic"], "opaque": {"driver": "knic.dev", "parameters": p}}]);
        }
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": spec,
        }))?;
        let claim = claims.create(&PostParams::default(), &claim).await?;
        let uid = claim
            .metadata
            .uid
            .clone()
            .context("created claim has no uid")?;

        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": self.namespace},
            "spec": {
                "schedulingGates": [{"name": "knic.dev/e2e-hold"}],
                "resourceClaims": [{"name": "net", "resourceClaimName": name}],
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "net"}]}}],
            },
        }))?;
        let pod = pods.create(&PostParams::default(), &pod).await?;
        let pod_uid = pod.metadata.uid.clone().context("created pod has no uid")?;

        if let Some(results) = results {
            let config = match &parameters {
                Some(p) => json!([{"source": "FromClaim", "requests": ["nic"],
                                   "opaque": {"driver": "knic.dev", "parameters": p}}]),
                None => json!([]),
            };
            let status = json!({"status": {
                "allocation": {"devices": {"results": results, "config": config}},
                "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}],
            }});
            claims
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
        }
        Ok(TestClaim {
            name: name.into(),
            uid,
            pod_uid,
        })
    }

    /// Deletes a claim (its pod too), as happens when a pod goes away before unprepare.
    pub async fn delete_claim(&self, name: &str) -> anyhow::Result<()> {
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &self.namespace);
        claims.delete(name, &DeleteParams::default()).await?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        pods.delete(&format!("{name}-pod"), &DeleteParams::default())
            .await?;
        Ok(())
    }
}

impl Cluster {
    /// ResourceSlice writes the fake API has seen (0 on a real cluster, where they cannot be
    /// counted).
    pub fn slice_writes(&self) -> usize {
        self.fake.as_ref().map_or(0, |f| {
            f.requests()
                .iter()
                .filter(|r| r.path.contains("/resourceslices") && r.method != "GET")
                .count()
        })
    }

    /// The pool has settled: after a moment for the last sync, three seconds (three rescans at
    /// one per second, plus any resync the driver might be looping on) see no slice write.
    /// On a real cluster, where requests cannot be counted, the node's slices must keep their
    /// names and resourceVersions over those seconds (any write, even a no-op update that
    /// changed nothing, would have moved a resourceVersion).
    pub async fn no_more_slice_writes(&self) -> anyhow::Result<()> {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let before = self.slice_writes();
        let versions_before = self.slice_versions().await?;
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let during = self.slice_writes() - before;
        let versions_after = self.slice_versions().await?;
        println!("slice writes after settling: {during}");
        anyhow::ensure!(during == 0, "{during} slice writes after the pool settled");
        anyhow::ensure!(
            versions_before == versions_after,
            "the node's slices were written after the pool settled: {versions_before:?} -> \
             {versions_after:?}"
        );
        Ok(())
    }

    /// Each of the node's knic slices by name, with its resourceVersion.
    async fn slice_versions(&self) -> anyhow::Result<Vec<(String, String)>> {
        Ok(self
            .slices()
            .await?
            .into_iter()
            .map(|s| {
                (
                    s.metadata.name.unwrap_or_default(),
                    s.metadata.resource_version.unwrap_or_default(),
                )
            })
            .collect())
    }
}

impl Cluster {
    /// Creates another namespace for this test, with `labels`, for scenarios about which
    /// namespaces something reaches; the test deletes it (see [`Cluster::delete_namespace`]).
    pub async fn create_extra_namespace(
        &self,
        suffix: &str,
        labels: &[(&str, &str)],
    ) -> anyhow::Result<String> {
        let name = format!("{}-{suffix}", self.namespace);
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels},
        }))?;
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        self.service_account_ready(&name).await?;
        Ok(name)
    }

    /// Deletes a namespace created with [`Cluster::create_extra_namespace`].
    pub async fn delete_namespace(&self, name: &str) -> anyhow::Result<()> {
        match Api::<Namespace>::all(self.client.clone())
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

fn namespace_for(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let slug: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    format!("knic-e2e-{}-{nanos:08x}", slug.trim_matches('-'))
}

/// Creates knic's CRDs (`Network`, `NetworkAddress`, `NodeNetworks`, as the chart ships them:
/// all are generated from the same types) and waits until the apiserver serves them. A real twin then
/// never meets a cluster without them (the IPAM twins once failed with "404 page not found"
/// because nothing had installed them); CRDs already there (from the chart) are left as they are.
pub async fn ensure_crds(client: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use knic_proto::network::{Network, NetworkAddress};
    use kube::{CustomResourceExt, ResourceExt};
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        Network::crd(),
        NetworkAddress::crd(),
        knic_proto::network::readiness::NodeNetworks::crd(),
    ] {
        let name = crd.name_any();
        // Created when missing, never taken over: a forced apply made the tests the owner of
        // the fields, and `helm install` (Helm v4 applies the chart's CRDs server-side) then
        // failed on a conflict over `.spec.versions`.
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(anyhow::Error::new(e).context(format!("creating CRD {name}"))),
        }
        crate::harness::eventually(
            &format!("CRD {name} established"),
            std::time::Duration::from_secs(30),
            || async {
                let crd = api.get(&name).await?;
                let established = crd
                    .status
                    .iter()
                    .flat_map(|s| s.conditions.iter().flatten())
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(established.then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}
