//! NetworkAttachmentDefinitions for Multus users (fake API in CI, the real cluster with
//! `KNIC_E2E_KUBECONFIG`, where the NAD CRD is the k8snetworkplumbingwg one from
//! `shared/fixtures/nad`): the controller runs in-process; a Network with
//! `spec.networkAttachmentDefinition: {}` gets one NAD per selected namespace with the exact
//! config, follows selection, rewrites nothing at rest, drops them when the field goes or the
//! Network is deleted, leaves a foreign NAD alone (NADConflict), and says when the CRD is
//! missing (fake only: the shared cluster's CRD set is not this test's to remove).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use knic_controller::nad::{
    REASON_CONFLICT, REASON_CRD_MISSING, api_resource, crd_missing_message,
};
use knic_controller::network::{CONDITION_READY, NETWORK_LABEL, Network};
use knic_controller::reconcile;
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::fakeapi::RequestFault;
use knic_e2e::gates::Needs;
use knic_e2e::harness::{ScenarioEnv, eventually, scenario_trials};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);
const SELECT_KEY: &str = "knic-e2e/nad";
const NAD_CRD: &str = "network-attachment-definitions.k8s.cni.cncf.io";

struct Env {
    cluster: Cluster,
    id: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    controller: Option<tokio::task::JoinHandle<()>>,
    namespaces: Vec<String>,
    networks: Vec<String>,
}

impl Env {
    fn networks(&self) -> Api<Network> {
        Api::all(self.cluster.client.clone())
    }

    fn nads(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.cluster.client.clone(), namespace, &api_resource())
    }

    async fn namespace(&mut self, suffix: &str, selected: bool) -> anyhow::Result<String> {
        let labels: Vec<(&str, &str)> = if selected {
            vec![(SELECT_KEY, self.id.as_str())]
        } else {
            Vec::new()
        };
        let name = self.cluster.create_extra_namespace(suffix, &labels).await?;
        self.namespaces.push(name.clone());
        Ok(name)
    }

    async fn select(&self, namespace: &str, selected: bool) -> anyhow::Result<()> {
        let value = if selected {
            json!(self.id)
        } else {
            Value::Null
        };
        Api::<Namespace>::all(self.cluster.client.clone())
            .patch(
                namespace,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {SELECT_KEY: value}}})),
            )
            .await?;
        Ok(())
    }

    /// A Network of VFs (static IPAM) selecting this test's namespaces, with the NAD field.
    async fn create(&mut self, suffix: &str) -> anyhow::Result<String> {
        let name = format!("{}-{suffix}", self.id);
        let network: Network = serde_json::from_value(json!({
            "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
            "metadata": {"name": name},
            "spec": {
                "devices": {"deviceClassName": "vf.knic.dev"},
                "ipam": {"static": {}},
                "namespaces": {"selector": {"matchLabels": {SELECT_KEY: self.id}}},
                "networkAttachmentDefinition": {},
            },
        }))?;
        self.networks()
            .create(&PostParams::default(), &network)
            .await?;
        self.networks.push(name.clone());
        Ok(name)
    }

    /// Namespaces holding a NAD of `network`'s name labelled for it, sorted.
    async fn nad_namespaces(&self, network: &str) -> anyhow::Result<Vec<String>> {
        let all: Api<DynamicObject> = Api::all_with(self.cluster.client.clone(), &api_resource());
        let mut namespaces: Vec<String> = all
            .list(&ListParams::default().labels(&format!("{NETWORK_LABEL}={network}")))
            .await?
            .items
            .iter()
            .map(|n| n.namespace().unwrap_or_default())
            .collect();
        namespaces.sort();
        Ok(namespaces)
    }

    async fn wait_nads(&self, network: &str, want: &[&String]) -> anyhow::Result<()> {
        let mut want: Vec<String> = want.iter().map(|s| (*s).clone()).collect();
        want.sort();
        eventually(
            &format!("NADs of {network} in exactly {want:?}"),
            WAIT,
            || async {
                let have = self.nad_namespaces(network).await?;
                ensure!(have == want, "NADs in {have:?}");
                Ok(Some(()))
            },
        )
        .await
    }

    /// Waits for Ready with `status`/`reason` on the current generation; returns the message.
    async fn wait_ready(
        &self,
        network: &str,
        status: &str,
        reason: &str,
    ) -> anyhow::Result<String> {
        eventually(
            &format!("{network}: Ready={status} ({reason})"),
            WAIT,
            || async {
                let n = self.networks().get(network).await?;
                let st = n.status.clone().unwrap_or_default();
                let ready = st.conditions.iter().find(|c| c.type_ == CONDITION_READY);
                let holds = st.observed_generation == n.metadata.generation
                    && ready.is_some_and(|c| c.status == status && c.reason == reason);
                ensure!(holds, "status is {st:?}");
                Ok(ready.map(|c| c.message.clone()))
            },
        )
        .await
    }

    async fn status_nads(&self, network: &str) -> anyhow::Result<Value> {
        let n = self.networks().get(network).await?;
        Ok(serde_json::to_value(
            n.status
                .map(|s| s.network_attachment_definitions)
                .unwrap_or_default(),
        )?)
    }
}

impl ScenarioEnv for Env {
    async fn setup(real: Option<RealCluster>, test: String) -> anyhow::Result<Env> {
        let cluster = match &real {
            Some(r) => Cluster::real(r, &test).await?,
            None => Cluster::fake(&test).await?,
        };
        let tail: String = cluster
            .namespace
            .chars()
            .rev()
            .take(8)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let config = reconcile::Config {
            // Short, so "nothing is rewritten at rest" spans several reconciles.
            resync: Duration::from_millis(500),
            gc_interval: Duration::from_secs(60),
            retry: Duration::from_millis(250),
            instance: Some(format!("knic-e2e-{test}")),
            availability: knic_controller::availability::Settings {
                interval: Duration::from_secs(5),
            },
            identity_reads: true,
        };
        let controller = tokio::spawn(reconcile::run(cluster.client.clone(), config, async {
            let _ = stopped.await;
        }));
        Ok(Env {
            cluster,
            id: format!("nad-{tail}"),
            stop: Some(stop),
            controller: Some(controller),
            namespaces: Vec::new(),
            networks: Vec::new(),
        })
    }

    async fn finish(mut self, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
        let cleanup = teardown(&mut self).await;
        outcome.and(cleanup)
    }
}

async fn teardown(env: &mut Env) -> anyhow::Result<()> {
    if let Some(fake) = &env.cluster.fake {
        fake.clear_request_faults();
    }
    for name in env.networks.clone() {
        match env.networks().delete(&name, &DeleteParams::default()).await {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => return Err(e.into()),
        }
        eventually(&format!("{name} deleted"), WAIT, || async {
            Ok(env.networks().get_opt(&name).await?.is_none().then_some(()))
        })
        .await?;
    }
    if let Some(stop) = env.stop.take() {
        let _ = stop.send(());
    }
    if let Some(task) = env.controller.take() {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    for ns in env.namespaces.clone() {
        env.cluster.delete_namespace(&ns).await?;
    }
    env.cluster.cleanup().await
}

/// NADs land in the selected namespaces with the exact config, label and owner; at rest nothing
/// is rewritten; they follow selection, go when the field goes, and go with the Network.
async fn nads_follow_the_network(env: &mut Env) -> anyhow::Result<()> {
    let s1 = env.namespace("s1", true).await?;
    let s2 = env.namespace("s2", false).await?;
    let name = env.create("blue").await?;
    env.wait_nads(&name, &[&s1]).await?;
    let message = env.wait_ready(&name, "True", "Generated").await?;
    assert_eq!(
        message,
        format!(
            "ResourceClaimTemplate {name:?} applied in {s1}; NetworkAttachmentDefinition {name:?} applied in {s1}"
        )
    );
    let nad = env.nads(&s1).get(&name).await?;
    assert_eq!(
        nad.data["spec"],
        json!({"config": format!(r#"{{"cniVersion":"1.0.0","name":"{name}","type":"knic","network":"{name}"}}"#)})
    );
    assert_eq!(
        nad.labels(),
        &BTreeMap::from([(NETWORK_LABEL.to_owned(), name.clone())])
    );
    let owner = nad.owner_references().first().context("owner reference")?;
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Network", name.as_str())
    );
    assert_eq!(
        env.status_nads(&name).await?,
        json!([{"namespace": s1, "name": name}])
    );
    ensure!(
        env.nads(&s2).get_opt(&name).await?.is_none(),
        "NAD in unselected {s2}"
    );

    // At rest (resync every 0.5 s): the NAD is not written again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = env.nads(&s1).get(&name).await?;
    ensure!(
        again.resource_version() == nad.resource_version(),
        "the NAD was rewritten at rest: {:?} -> {:?}",
        nad.resource_version(),
        again.resource_version()
    );
    // Edited by hand: put back at the next resync.
    env.nads(&s1)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"config": "{}"}})),
        )
        .await?;
    eventually("the edited NAD is repaired", WAIT, || async {
        let n = env.nads(&s1).get(&name).await?;
        Ok((n.data["spec"] == nad.data["spec"]).then_some(()))
    })
    .await?;

    env.select(&s2, true).await?;
    env.wait_nads(&name, &[&s1, &s2]).await?;
    env.select(&s1, false).await?;
    env.wait_nads(&name, &[&s2]).await?;
    let want = json!([{"namespace": s2, "name": name}]);
    eventually("status lists the NAD in s2 only", WAIT, || async {
        Ok((env.status_nads(&name).await? == want).then_some(()))
    })
    .await?;
    // The template follows the same selection.
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(env.cluster.client.clone(), &s2);
    ensure!(
        templates.get_opt(&name).await?.is_some(),
        "template in {s2}"
    );

    // Without the field: NADs go, templates stay.
    env.networks()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"networkAttachmentDefinition": null}})),
        )
        .await?;
    env.wait_nads(&name, &[]).await?;
    let message = env.wait_ready(&name, "True", "Generated").await?;
    assert_eq!(
        message,
        format!("ResourceClaimTemplate {name:?} applied in {s2}")
    );
    assert_eq!(env.status_nads(&name).await?, json!([]));
    ensure!(
        templates.get_opt(&name).await?.is_some(),
        "template kept in {s2}"
    );

    // Back on, then the Network deleted: its NADs go with it.
    env.networks()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"networkAttachmentDefinition": {}}})),
        )
        .await?;
    env.wait_nads(&name, &[&s2]).await?;
    env.networks()
        .delete(&name, &DeleteParams::default())
        .await?;
    env.wait_nads(&name, &[]).await?;
    Ok(())
}

/// A NAD of the Network's name that knic did not write is left alone and named in Ready=False
/// (NADConflict); other namespaces still get theirs, and the template is generated.
async fn foreign_nad_is_left_alone(env: &mut Env) -> anyhow::Result<()> {
    let s1 = env.namespace("s1", true).await?;
    let s2 = env.namespace("s2", true).await?;
    let name = format!("{}-red", env.id);
    let foreign: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": s1},
        "spec": {"config": r#"{"cniVersion":"0.3.1","type":"macvlan"}"#},
    }))?;
    env.nads(&s1)
        .create(&PostParams::default(), &foreign)
        .await?;
    env.create("red").await?;
    let message = env.wait_ready(&name, "False", REASON_CONFLICT).await?;
    assert_eq!(
        message,
        format!(
            "namespace {s1}: a NetworkAttachmentDefinition named {name:?} that knic did not generate already exists; it is left alone"
        )
    );
    env.wait_nads(&name, &[&s2]).await?;
    let kept = env.nads(&s1).get(&name).await?;
    assert_eq!(
        kept.data["spec"]["config"],
        json!(r#"{"cniVersion":"0.3.1","type":"macvlan"}"#)
    );
    ensure!(
        kept.labels().get(NETWORK_LABEL).is_none(),
        "the foreign NAD was labelled"
    );
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(env.cluster.client.clone(), &s1);
    ensure!(
        templates.get_opt(&name).await?.is_some(),
        "template in {s1}"
    );
    // Removing the foreign NAD lets knic write its own.
    env.nads(&s1)
        .delete(&name, &DeleteParams::default())
        .await?;
    env.wait_nads(&name, &[&s1, &s2]).await?;
    env.wait_ready(&name, "True", "Generated").await?;
    Ok(())
}

/// Without the CRD the Network is Ready=False with the exact reason and text; templates are
/// still generated; once the CRD appears the NADs follow.
async fn crd_missing_is_reported(env: &mut Env) -> anyhow::Result<()> {
    env.cluster
        .fake
        .as_ref()
        .context("fake only")?
        .fault_requests(
            "* /network-attachment-definitions",
            RequestFault::NoSuchResource,
            usize::MAX,
        )?;
    let s1 = env.namespace("s1", true).await?;
    let name = env.create("green").await?;
    let message = env.wait_ready(&name, "False", REASON_CRD_MISSING).await?;
    assert_eq!(message, crd_missing_message());
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(env.cluster.client.clone(), &s1);
    ensure!(
        templates.get_opt(&name).await?.is_some(),
        "template in {s1}"
    );
    if let Some(fake) = &env.cluster.fake {
        fake.clear_request_faults();
    }
    env.wait_nads(&name, &[&s1]).await?;
    env.wait_ready(&name, "True", "Generated").await?;
    Ok(())
}

/// On the real cluster: installs the fixture NAD CRD when absent (and removes it at the end),
/// and makes sure the Network CRD knows the new field (additive server-side apply, own field
/// manager, so other writers' fields stay).
fn prepare_real() -> anyhow::Result<bool> {
    let Some(real) = knic_e2e::harness::real_cluster() else {
        return Ok(false);
    };
    let kubectl = |args: &[&str]| -> anyhow::Result<std::process::Output> {
        Ok(std::process::Command::new("kubectl")
            .env("KUBECONFIG", &real.kubeconfig)
            .args(args)
            .output()?)
    };
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let network_crd = manifest.join("../charts/knic/crds/networks.knic.dev.yaml");
    let out = kubectl(&[
        "apply",
        "--server-side",
        "--field-manager=knic-e2e-nad",
        "--force-conflicts",
        "-f",
        &network_crd.to_string_lossy(),
    ])?;
    ensure!(
        out.status.success(),
        "applying the Network CRD: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created = !kubectl(&["get", "crd", NAD_CRD])?.status.success();
    if created {
        let fixture = manifest.join("../../shared/fixtures/nad/networks-crd.yaml");
        let out = kubectl(&["create", "-f", &fixture.to_string_lossy()])?;
        ensure!(
            out.status.success(),
            "creating the NAD CRD: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for crd in [NAD_CRD, "networks.knic.dev"] {
        let out = kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=30s",
            &format!("crd/{crd}"),
        ])?;
        ensure!(
            out.status.success(),
            "{crd} established: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(created)
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let created = match prepare_real() {
        Ok(created) => created,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    let trials = scenario_trials::<Env>(&knic_e2e::scenarios![
        nads_follow_the_network,
        foreign_nad_is_left_alone,
        crd_missing_is_reported => Needs::FakeOnly(
            "the shared cluster's NAD CRD is not this test's to remove while others may use it"
        ),
    ]);
    let conclusion = libtest_mimic::run(&args, trials);
    if created && let Some(real) = knic_e2e::harness::real_cluster() {
        let _ = std::process::Command::new("kubectl")
            .env("KUBECONFIG", &real.kubeconfig)
            .args(["delete", "crd", NAD_CRD, "--wait=true"])
            .status();
    }
    conclusion.exit();
}
