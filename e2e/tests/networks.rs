//! Networks as a service against the API (fake in CI, a real cluster with
//! `KNIC_E2E_KUBECONFIG`): the controller's reconciler runs in-process on the test's client and
//! turns Networks into ResourceClaimTemplates in the selected namespaces, follows namespace
//! selection, marks conflicting Networks `Invalid` with the exact message and generates nothing
//! for them, cleans up through its finalizer, and collects allocations whose claim is gone.

use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use knic_controller::network::{
    CONDITION_INVALID, CONDITION_READY, NETWORK_LABEL, Network, NetworkAddress, validate_network,
};
use knic_controller::reconcile::{self, FINALIZER};
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::gates::Needs;
use knic_e2e::harness::{ScenarioEnv, eventually, scenario_trials};
use knic_proto::network::exhaustion_selector;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

#[path = "networks/overlay.rs"]
mod overlay;
use overlay::overlay_networks_compile_and_keep_their_vni;

const WAIT: Duration = Duration::from_secs(20);
const SELECT_KEY: &str = "knic-e2e/network";

struct Env {
    cluster: Cluster,
    /// Unique per test, so real-cluster runs in parallel never share a Network or a label.
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

    fn name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.id)
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

    async fn label_namespace(&self, name: &str, selected: bool) -> anyhow::Result<()> {
        let value = if selected {
            json!(self.id)
        } else {
            Value::Null
        };
        Api::<Namespace>::all(self.cluster.client.clone())
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {SELECT_KEY: value}}})),
            )
            .await?;
        Ok(())
    }

    /// Creates a Network of VFs of class `vf.knic.dev` with one CEL selector, selecting the
    /// namespaces labelled with this test's id.
    async fn create(
        &mut self,
        suffix: &str,
        vlan: u16,
        cidr: &str,
        gateway: &str,
    ) -> anyhow::Result<String> {
        let name = self.name(suffix);
        let network: Network = serde_json::from_value(json!({
            "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
            "metadata": {"name": name},
            "spec": {
                "devices": {"deviceClassName": "vf.knic.dev",
                            "selectors": ["device.attributes[\"knic.dev\"].kind == \"vf\""]},
                "vlan": vlan,
                "mtu": 9000,
                "ipam": {"subnets": [{"cidr": cidr, "gateway": gateway}]},
                "namespaces": {"selector": {"matchLabels": {SELECT_KEY: self.id}}},
            },
        }))?;
        self.networks()
            .create(&PostParams::default(), &network)
            .await?;
        self.networks.push(name.clone());
        Ok(name)
    }

    async fn patch_spec(&self, name: &str, spec: Value) -> anyhow::Result<()> {
        self.networks()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": spec})),
            )
            .await?;
        Ok(())
    }

    /// The namespaces holding a template generated for `network`, sorted.
    async fn template_namespaces(&self, network: &str) -> anyhow::Result<Vec<String>> {
        let api: Api<ResourceClaimTemplate> = Api::all(self.cluster.client.clone());
        let mut namespaces: Vec<String> = api
            .list(&ListParams::default().labels(&format!("{NETWORK_LABEL}={network}")))
            .await?
            .items
            .iter()
            .map(|t| t.namespace().unwrap_or_default())
            .collect();
        namespaces.sort();
        Ok(namespaces)
    }

    async fn wait_templates(&self, network: &str, want: &[&String]) -> anyhow::Result<()> {
        let mut want: Vec<String> = want.iter().map(|s| (*s).clone()).collect();
        want.sort();
        eventually(
            &format!("templates of {network} in exactly {want:?}"),
            WAIT,
            || async {
                let have = self.template_namespaces(network).await?;
                ensure!(have == want, "templates in {have:?}");
                Ok(Some(()))
            },
        )
        .await
    }

    /// Waits until the condition `type_` of `network` has `status` for the current generation
    /// and returns the Network.
    async fn wait_condition(
        &self,
        network: &str,
        type_: &str,
        status: &str,
    ) -> anyhow::Result<Network> {
        eventually(&format!("{network}: {type_}={status}"), WAIT, || async {
            let n = self.networks().get(network).await?;
            let st = n.status.clone().unwrap_or_default();
            let holds = st.observed_generation == n.metadata.generation
                && st
                    .conditions
                    .iter()
                    .any(|c| c.type_ == type_ && c.status == status);
            ensure!(holds, "status is {st:?}");
            Ok(Some(n))
        })
        .await
    }

    async fn events_for(&self, network: &str) -> anyhow::Result<Vec<Event>> {
        let api: Api<Event> = Api::namespaced(self.cluster.client.clone(), "default");
        Ok(api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(network))
            .collect())
    }
}

fn message(n: &Network, type_: &str) -> String {
    n.status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.type_ == type_)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// Installs the CRDs on a real cluster from the same Rust types the chart's YAML is generated
/// from; the fake needs none.
impl ScenarioEnv for Env {
    async fn setup(real: Option<RealCluster>, test: String) -> anyhow::Result<Env> {
        setup(real, &test).await
    }

    async fn finish(mut self, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
        let cleanup = teardown(&mut self).await;
        outcome.and(cleanup)
    }
}

async fn setup(real: Option<RealCluster>, test: &str) -> anyhow::Result<Env> {
    let cluster = match &real {
        Some(r) => Cluster::real(r, test).await?,
        None => Cluster::fake(test).await?,
    };
    // The namespace ends in eight hex digits of a clock; with the test's slug that is unique.
    let tail: String = cluster
        .namespace
        .chars()
        .rev()
        .take(8)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let id = format!("e2e-{tail}");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = reconcile::Config {
        resync: Duration::from_secs(30),
        gc_interval: Duration::from_millis(300),
        identity_reads: true,
        retry: Duration::from_millis(250),
        instance: Some(format!("knic-e2e-{test}")),
        availability: knic_controller::availability::Settings {
            interval: Duration::from_millis(200),
        },
    };
    let controller = tokio::spawn(reconcile::run(cluster.client.clone(), config, async {
        let _ = stopped.await;
    }));
    Ok(Env {
        cluster,
        id,
        stop: Some(stop),
        controller: Some(controller),
        namespaces: Vec::new(),
        networks: Vec::new(),
    })
}

async fn teardown(env: &mut Env) -> anyhow::Result<()> {
    // Networks go first, while the controller still runs to remove their finalizers.
    for name in env.networks.clone() {
        match env.networks().delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
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

/// Templates land in the selected namespaces only, with the network's request and config, and
/// follow the selection; the status reports generation, templates, devices and addresses.
async fn templates_follow_namespaces(env: &mut Env) -> anyhow::Result<()> {
    let s1 = env.namespace("s1", true).await?;
    let s2 = env.namespace("s2", false).await?;
    let other = env.namespace("o", false).await?;
    let name = env.create("a", 101, "10.101.0.0/24", "10.101.0.1").await?;
    env.wait_templates(&name, &[&s1]).await?;

    let api: Api<ResourceClaimTemplate> = Api::namespaced(env.cluster.client.clone(), &s1);
    let template = api.get(&name).await?;
    assert_eq!(
        serde_json::to_value(&template.spec)?,
        json!({"metadata": {"labels": {"knic.dev/network": name}}, "spec": {"devices": {
            "requests": [{"name": "network", "exactly": {
                "deviceClassName": "vf.knic.dev",
                "selectors": [
                    {"cel": {"expression": "device.attributes[\"knic.dev\"].kind == \"vf\""}},
                    {"cel": {"expression": exhaustion_selector(&name)}},
                ],
                "allocationMode": "ExactCount", "count": 1}}],
            "config": [{"requests": ["network"], "opaque": {"driver": "knic.dev", "parameters": {
                "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                "interface": {"mtu": 9000}, "vlan": {"id": 101}, "ipam": {"network": name}}}}],
        }}})
    );
    let owner = template
        .owner_references()
        .first()
        .context("owner reference")?;
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Network", name.as_str())
    );
    for ns in [&s2, &other] {
        let api: Api<ResourceClaimTemplate> = Api::namespaced(env.cluster.client.clone(), ns);
        ensure!(
            api.get_opt(&name).await?.is_none(),
            "template in unselected {ns}"
        );
    }

    let n = env.wait_condition(&name, CONDITION_READY, "True").await?;
    assert!(
        n.finalizers().iter().any(|f| f == FINALIZER),
        "{:?}",
        n.finalizers()
    );
    let st = n.status.clone().context("status")?;
    assert_eq!(st.observed_generation, n.metadata.generation);
    assert_eq!(
        serde_json::to_value(&st.templates)?,
        json!([{"namespace": s1, "name": name}])
    );
    assert_eq!(
        st.devices_summary.as_deref(),
        Some("vf.knic.dev +1 selector")
    );
    assert_eq!(st.address_summary.as_deref(), Some("253/253"));
    assert_eq!(
        message(&n, CONDITION_READY),
        format!("ResourceClaimTemplate {name:?} applied in {s1}")
    );
    let invalid = st
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_INVALID)
        .context("Invalid")?;
    assert_eq!(
        (invalid.status.as_str(), invalid.reason.as_str()),
        ("False", "Valid")
    );

    // A live allocation (its claim exists, so the collector keeps it) lowers the free count;
    // releasing it restores it.
    let claim = env.cluster.create_claim("holder", None).await?;
    let address: NetworkAddress = serde_json::from_value(json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkAddress",
        "metadata": {"name": format!("{name}-10-101-0-10"), "labels": {NETWORK_LABEL: name}},
        "spec": {"network": name, "address": "10.101.0.10/24",
                 "claim": {"namespace": env.cluster.namespace, "name": claim.name, "uid": claim.uid}},
    }))?;
    let addresses: Api<NetworkAddress> = Api::all(env.cluster.client.clone());
    addresses.create(&PostParams::default(), &address).await?;
    for want in ["252/253", "253/253"] {
        eventually(&format!("addressSummary {want}"), WAIT, || async {
            let n = env.networks().get(&name).await?;
            let summary = n.status.and_then(|s| s.address_summary).unwrap_or_default();
            ensure!(summary == want, "addressSummary is {summary:?}");
            Ok(Some(()))
        })
        .await?;
        if want == "252/253" {
            addresses
                .delete(&address.name_any(), &DeleteParams::default())
                .await?;
        }
    }

    // Selecting one more namespace adds a template; deselecting removes it.
    env.label_namespace(&s2, true).await?;
    env.wait_templates(&name, &[&s1, &s2]).await?;
    // Those reconciles left the unchanged template alone: not deleted and re-created (as every
    // reconcile did on a real apiserver, which stores `metadata: {}`), not even rewritten.
    let again = api.get(&name).await?;
    ensure!(
        (
            again.metadata.uid.as_deref(),
            again.metadata.resource_version.as_deref()
        ) == (
            template.metadata.uid.as_deref(),
            template.metadata.resource_version.as_deref()
        ),
        "the template in {s1} was written again: uid/resourceVersion {:?}/{:?} -> {:?}/{:?}",
        template.metadata.uid,
        template.metadata.resource_version,
        again.metadata.uid,
        again.metadata.resource_version
    );
    env.label_namespace(&s1, false).await?;
    env.wait_templates(&name, &[&s2]).await?;
    // Deselection does not change the generation, so wait for the status to list it.
    let want = json!([{"namespace": s2, "name": name}]);
    let n = eventually("status lists the template in s2 only", WAIT, || async {
        let n = env.networks().get(&name).await?;
        let templates = n.status.clone().map(|s| s.templates).unwrap_or_default();
        Ok((serde_json::to_value(&templates)? == want).then_some(n))
    })
    .await?;

    // A spec change reaches the template and observedGeneration.
    // Template specs are immutable (the fake enforces it like the apiserver): the controller
    // replaces the template, so it comes back with a new UID.
    let before = n.metadata.generation.context("generation")?;
    let api: Api<ResourceClaimTemplate> = Api::namespaced(env.cluster.client.clone(), &s2);
    let old_uid = api.get(&name).await?.metadata.uid;
    env.patch_spec(&name, json!({"mtu": 1500, "interfacesPerPod": 2}))
        .await?;
    eventually("template follows the spec", WAIT, || async {
        let t = api.get(&name).await?;
        let uid = t.metadata.uid.clone();
        let t = serde_json::to_value(t.spec)?;
        let devices = &t["spec"]["devices"];
        Ok((devices["requests"][0]["exactly"]["count"] == json!(2)
            && devices["config"][0]["opaque"]["parameters"]["interface"]["mtu"] == json!(1500)
            && uid != old_uid)
            .then_some(()))
    })
    .await?;
    let n = env.wait_condition(&name, CONDITION_READY, "True").await?;
    ensure!(
        n.status.and_then(|s| s.observed_generation) == Some(before + 1),
        "observedGeneration did not follow the spec change"
    );
    let events = env.events_for(&name).await?;
    ensure!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("Generated")),
        "no Generated event: {events:?}"
    );
    Ok(())
}

/// A second Network on the same devices and VLAN with an overlapping subnet is `Invalid` with
/// the exact message and generates nothing; fixing it makes it Ready. A Network invalid on its
/// own reports the validation's message verbatim.
async fn overlap_is_invalid_until_fixed(env: &mut Env) -> anyhow::Result<()> {
    let ns = env.namespace("s1", true).await?;
    let first = env.create("a", 102, "10.102.0.0/24", "10.102.0.1").await?;
    env.wait_condition(&first, CONDITION_READY, "True").await?;
    let second = env
        .create("b", 102, "10.102.0.128/25", "10.102.0.129")
        .await?;
    let n = env
        .wait_condition(&second, CONDITION_INVALID, "True")
        .await?;
    let expected = format!(
        "spec.vlan: VLAN 102 is already used by network {first:?} on overlapping devices; \
         to share it on purpose, both Networks must set the same spec.vlanShareGroup; \
         spec.ipam.subnets[0].cidr: 10.102.0.128/25 overlaps 10.102.0.0/24 of network {first:?} \
         on overlapping devices and the same VLAN (VLAN 102)"
    );
    assert_eq!(message(&n, CONDITION_INVALID), expected);
    assert_eq!(message(&n, CONDITION_READY), expected);
    let ready = n
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.type_ == CONDITION_READY);
    assert_eq!(
        ready.map(|c| (c.status.as_str(), c.reason.as_str())),
        Some(("False", "Invalid"))
    );
    let st = n.status.clone().unwrap_or_default();
    ensure!(
        st.templates.is_empty() && st.addresses.is_none(),
        "invalid network reports {st:?}"
    );
    // Nothing generated for it, and the first is untouched.
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        env.template_namespaces(&second).await?.is_empty(),
        "templates for an invalid network"
    );
    assert_eq!(env.template_namespaces(&first).await?, vec![ns.clone()]);
    env.wait_condition(&first, CONDITION_READY, "True").await?;
    let events = env.events_for(&second).await?;
    ensure!(
        events.iter().any(|e| e.reason.as_deref() == Some("Invalid")
            && e.note.as_deref() == Some(expected.as_str())),
        "no Invalid event with the message: {events:?}"
    );

    // Another VLAN separates them.
    env.patch_spec(&second, json!({"vlan": 202})).await?;
    let n = env.wait_condition(&second, CONDITION_READY, "True").await?;
    assert_eq!(message(&n, CONDITION_INVALID), "");
    env.wait_templates(&second, &[&ns]).await?;

    // Breaking it on its own: the validation's message, and its templates are withdrawn.
    env.patch_spec(
        &second,
        json!({"ipam": {"subnets": [{"cidr": "10.202.0.0/24", "gateway": "10.9.9.9"}]}}),
    )
    .await?;
    let n = env
        .wait_condition(&second, CONDITION_INVALID, "True")
        .await?;
    let own = validate_network(&second, &n.spec)
        .expect_err("gateway outside")
        .to_string();
    assert_eq!(
        own,
        "spec.ipam.subnets[0].gateway: 10.9.9.9 is not inside subnet 10.202.0.0/24"
    );
    assert_eq!(message(&n, CONDITION_INVALID), own);
    env.wait_templates(&second, &[]).await?;
    Ok(())
}

/// Deleting a Network removes its templates in every namespace, then the Network itself.
async fn deletion_cleans_up(env: &mut Env) -> anyhow::Result<()> {
    let s1 = env.namespace("s1", true).await?;
    let s2 = env.namespace("s2", true).await?;
    let name = env.create("a", 103, "10.103.0.0/24", "10.103.0.1").await?;
    env.wait_templates(&name, &[&s1, &s2]).await?;
    env.wait_condition(&name, CONDITION_READY, "True").await?;
    env.networks()
        .delete(&name, &DeleteParams::default())
        .await?;
    eventually("network and templates gone", WAIT, || async {
        let templates = env.template_namespaces(&name).await?;
        let network = env.networks().get_opt(&name).await?;
        ensure!(templates.is_empty(), "templates left in {templates:?}");
        Ok(network.is_none().then_some(()))
    })
    .await?;
    if let Some(fake) = &env.cluster.fake {
        // The finalizer held the Network while the templates went.
        let mut deleted: Vec<String> = fake
            .requests()
            .into_iter()
            .filter(|r| r.method == "DELETE" && r.path.contains("resourceclaimtemplates"))
            .map(|r| r.path)
            .collect();
        deleted.dedup();
        let want: Vec<String> = [&s1, &s2]
            .iter()
            .map(|ns| {
                format!("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates/{name}")
            })
            .collect();
        assert_eq!(deleted, want);
    }
    // The Event follows the finalizer's removal, so it may arrive just after the Network went.
    eventually("CleanedUp event", WAIT, || async {
        let events = env.events_for(&name).await?;
        let found = events.iter().any(|e| {
            e.reason.as_deref() == Some("CleanedUp")
                && e.note.as_deref() == Some("removed every ResourceClaimTemplate generated for it")
        });
        ensure!(found, "no CleanedUp event: {events:?}");
        Ok(Some(()))
    })
    .await
}

/// An allocation whose claim is gone (or was recreated under another uid) is collected; one
/// whose claim lives is kept.
async fn orphaned_addresses_collected(env: &mut Env) -> anyhow::Result<()> {
    let claim = env.cluster.create_claim("live", None).await?;
    let network = env.name("gc");
    let addresses: Api<NetworkAddress> = Api::all(env.cluster.client.clone());
    let mk = |ip: &str, claim_name: &str, uid: &str| -> anyhow::Result<NetworkAddress> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkAddress",
            "metadata": {"name": format!("{network}-{}", ip.replace('.', "-")),
                         "labels": {NETWORK_LABEL: network}},
            "spec": {"network": network, "address": format!("{ip}/24"),
                     "claim": {"namespace": env.cluster.namespace, "name": claim_name, "uid": uid}},
        }))?)
    };
    let live = mk("10.104.0.2", "live", &claim.uid)?;
    let gone = mk("10.104.0.3", "gone", "uid-gone")?;
    let stale = mk("10.104.0.4", "live", "uid-of-an-older-claim")?;
    // A KNI sandbox's address: no ResourceClaim exists for it, and its node's driver releases
    // it at DetachInterface; the collector must not take it away from the sandbox.
    let sandbox = mk("10.104.0.5", "kni-sbx1-gc", "kni.sbx1.network.gc")?;
    for a in [&live, &gone, &stale, &sandbox] {
        addresses.create(&PostParams::default(), a).await?;
    }
    eventually("orphans collected", WAIT, || async {
        let left: Vec<String> = addresses
            .list(&ListParams::default().labels(&format!("{NETWORK_LABEL}={network}")))
            .await?
            .items
            .iter()
            .map(|a| a.name_any())
            .collect();
        ensure!(
            left == vec![live.name_any(), sandbox.name_any()],
            "left: {left:?}"
        );
        Ok(Some(()))
    })
    .await?;
    for a in [&live, &sandbox] {
        addresses
            .delete(&a.name_any(), &DeleteParams::default())
            .await?;
    }
    Ok(())
}

/// The API refuses a template whose selector a real v1.36 apiserver finds too costly (the form
/// knic once generated for every Network), with the apiserver's message, and accepts the form
/// knic generates now; a Network whose own selector has that form is `Invalid` before anything
/// is generated.
async fn unbounded_selectors_are_refused(env: &mut Env) -> anyhow::Result<()> {
    let ns = env.namespace("cel", true).await?;
    let api: Api<ResourceClaimTemplate> = Api::namespaced(env.cluster.client.clone(), &ns);
    let template = |name: &str, expression: &str| -> anyhow::Result<ResourceClaimTemplate> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "network", "exactly": {
                "deviceClassName": "knic.dev",
                "selectors": [{"cel": {"expression": expression}}]}}]}}},
        }))?)
    };
    let legacy =
        r#"!device.attributes["knic.dev"].?exhaustedNetworks.orValue("").contains(",ab12cd34,")"#;
    match api
        .create(&PostParams::default(), &template("legacy", legacy)?)
        .await
    {
        Err(kube::Error::Api(status)) => {
            ensure!(status.code == 422, "{status:?}");
            ensure!(
                status.message.ends_with(
                    "\"legacy\" is invalid: spec.spec.devices.requests[0].exactly.selectors[0].cel.expression: Forbidden: too complex, exceeds cost limit"
                ),
                "{}",
                status.message
            );
        }
        other => anyhow::bail!("the legacy exhaustion selector was not refused: {other:?}"),
    }
    api.create(
        &PostParams::default(),
        &template("current", &exhaustion_selector("blue"))?,
    )
    .await
    .context("the exhaustion selector knic generates must be accepted")?;

    let name = env.name("costly");
    let network: Network = serde_json::from_value(json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": name},
        "spec": {
            "devices": {"deviceClassName": "knic.dev", "selectors": [
                "device.attributes[\"knic.dev\"].?ifName.orValue(\"\").contains(\"f0\")"]},
            "ipam": {"subnets": [{"cidr": "10.120.0.0/24", "gateway": "10.120.0.1"}]},
            "namespaces": {"names": [ns.clone()]},
        },
    }))?;
    env.networks()
        .create(&PostParams::default(), &network)
        .await?;
    env.networks.push(name.clone());
    let n = env.wait_condition(&name, CONDITION_INVALID, "True").await?;
    let message = message(&n, CONDITION_INVALID);
    ensure!(
        message.contains("spec.devices.selectors[0]: Kubernetes refuses this selector (Forbidden: too complex, exceeds cost limit)"),
        "{message}"
    );
    ensure!(
        api.get_opt(&name).await?.is_none(),
        "a template was generated"
    );
    Ok(())
}

/// Upgrade: a template an older knic generated with the exhaustion selector a v1.36 apiserver
/// refuses (stored by an apiserver that accepted it) is replaced by one with today's selector.
/// Fake API only: a real v1.36 apiserver cannot hold such a template.
async fn legacy_templates_are_replaced(env: &mut Env) -> anyhow::Result<()> {
    let ns = env.namespace("up", true).await?;
    let fake = env.cluster.fake.as_ref().context("fake API")?;
    let name = env.name("up");
    let legacy = format!(
        r#"!device.attributes["knic.dev"].?exhaustedNetworks.orValue("").contains(",{},")"#,
        knic_proto::network::exhaustion_token(&name)
    );
    fake.seed(
        &format!("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates/{name}"),
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns, "labels": {NETWORK_LABEL: name}},
            "spec": {"spec": {"devices": {"requests": [{"name": "network", "exactly": {
                "deviceClassName": "vf.knic.dev",
                "selectors": [
                    {"cel": {"expression": "device.attributes[\"knic.dev\"].kind == \"vf\""}},
                    {"cel": {"expression": legacy}},
                ],
                "allocationMode": "ExactCount", "count": 1}}]}}},
        }),
    )?;
    let api: Api<ResourceClaimTemplate> = Api::namespaced(env.cluster.client.clone(), &ns);
    let old_uid = api.get(&name).await?.metadata.uid;
    let created = env.create("up", 102, "10.102.0.0/24", "10.102.0.1").await?;
    ensure!(created == name);
    let want = exhaustion_selector(&name);
    let template = eventually(
        "the legacy template is replaced",
        Duration::from_secs(20),
        || {
            let api = api.clone();
            let want = want.clone();
            let name = name.clone();
            async move {
                let t = api.get(&name).await?;
                let selectors: Vec<String> = t
                    .spec
                    .spec
                    .devices
                    .iter()
                    .flat_map(|d| d.requests.iter().flatten())
                    .filter_map(|r| r.exactly.as_ref()?.selectors.clone())
                    .flatten()
                    .filter_map(|s| Some(s.cel?.expression))
                    .collect();
                Ok(selectors.contains(&want).then_some(t))
            }
        },
    )
    .await?;
    ensure!(
        template.metadata.uid != old_uid,
        "replaced, not patched (specs are immutable)"
    );
    Ok(())
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let trials = scenario_trials::<Env>(&knic_e2e::scenarios![
        templates_follow_namespaces,
        overlap_is_invalid_until_fixed,
        deletion_cleans_up,
        legacy_templates_are_replaced => Needs::FakeOnly(
            "a real v1.36 apiserver refuses the legacy template this starts from"
        ),
        unbounded_selectors_are_refused,
        orphaned_addresses_collected,
        overlay_networks_compile_and_keep_their_vni,
    ]);
    libtest_mimic::run(&args, trials).exit();
}
