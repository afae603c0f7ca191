//! A stable address on the real cluster: a real StatefulSet's pod `db-0` on a Network with
//! `stableAddresses: {by: podName, gracePeriodSeconds: 3600}` is deleted; the StatefulSet
//! controller re-creates it with a new claim, and the real kubelet and containerd start it with
//! the same address (the real driver held it at unprepare and took it over at prepare). Scaling
//! the StatefulSet to 0 then lets the real `knic-controller` (identity reads on) release the
//! hold: ordinal 0 can no longer return.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use knic_e2e::cluster::RealCluster;
use knic_e2e::harness::unpanicked;
use knic_e2e::real_node::{IMAGE, RealNode, link_in, wait_for};
use knic_proto::network::{NETWORK_LABEL, Network, NetworkAddress};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::networks::Controller;

const CIDR: &str = "10.232.0.0/29";
const GATEWAY: &str = "10.232.0.1";
const POD: &str = "db-0";

/// The twin: see the module comment; every step's time is printed.
pub(crate) async fn stable_address_across_pod_recreation(
    real: RealCluster,
    controller: PathBuf,
) -> anyhow::Result<()> {
    let mut node = RealNode::start(
        &real,
        "real-stable",
        "st",
        &["10.232.0.1/29", "10.232.0.1/29"],
        &[],
    )
    .await?;
    let outcome = async {
        let controller = Controller::start(&controller, &node)?;
        let network = format!("{}-st", node.cluster.namespace);
        let result = unpanicked(scenario(&mut node, &network)).await;
        let removed = remove(&node, &network).await;
        match result {
            Ok(()) => removed,
            Err(e) => anyhow::bail!(
                "{e:#}\n--- removal: {removed:?}\n--- controller log ---\n{}",
                controller.logs()
            ),
        }
    }
    .await;
    node.finish(outcome).await
}

async fn addresses(node: &RealNode, network: &str) -> anyhow::Result<Vec<NetworkAddress>> {
    let api: Api<NetworkAddress> = Api::all(node.cluster.client.clone());
    Ok(api
        .list(&ListParams::default().labels(&format!("{NETWORK_LABEL}={network}")))
        .await?
        .items)
}

/// Pod `db-0`'s claim, address (from the claim status, checked on `net1` in the pod) and the
/// claim's uid, once it runs.
async fn address_of_db0(node: &RealNode) -> anyhow::Result<(String, String, String)> {
    node.running(POD, Duration::from_secs(180)).await?;
    let claim = node.claim_of(POD).await?;
    let status = node.configured(&claim).await?;
    let address = status["devices"][0]["networkData"]["ips"][0]
        .as_str()
        .with_context(|| format!("claim {claim}: {status}"))?
        .to_owned();
    let netns = node.pod_netns(POD).await?;
    let net1 = link_in(&netns, "net1").context("net1 is not in the pod")?;
    ensure!(net1.contains(&format!("inet {address}")), "{net1}");
    let uid = node
        .claims()
        .get(&claim)
        .await?
        .metadata
        .uid
        .unwrap_or_default();
    Ok((claim, address, uid))
}

async fn scenario(node: &mut RealNode, network: &str) -> anyhow::Result<()> {
    let ns = node.cluster.namespace.clone();
    let nics: Vec<String> = node.nics.iter().map(|n| n.name.clone()).collect();
    let class = node.device_class("nics", &[&nics[0], &nics[1]]).await?;
    let spec = serde_json::from_value(json!({
        "devices": {"deviceClassName": class},
        "ipam": {"subnets": [{"cidr": CIDR, "gateway": GATEWAY}]},
        "stableAddresses": {"by": "podName", "gracePeriodSeconds": 3600},
        "namespaces": {"names": [ns]},
    }))?;
    let networks: Api<Network> = Api::all(node.cluster.client.clone());
    networks
        .create(&PostParams::default(), &Network::new(network, spec))
        .await?;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(node.cluster.client.clone(), &ns);
    wait_for(
        "the Network's template",
        Duration::from_secs(30),
        || async { Ok(templates.get_opt(network).await?.map(|_| ())) },
    )
    .await?;
    let sets: Api<StatefulSet> = Api::namespaced(node.cluster.client.clone(), &ns);
    let set: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": ns},
        "spec": {
            "replicas": 1, "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {
                    "resourceClaims": [{"name": "net", "resourceClaimTemplateName": network}],
                    "containers": [{"name": "app", "image": IMAGE, "imagePullPolicy": "Never",
                                    "resources": {"claims": [{"name": "net"}]}}],
                    "terminationGracePeriodSeconds": 1,
                },
            },
        },
    }))?;
    sets.create(&PostParams::default(), &set).await?;
    let (first_claim, first, first_uid) = address_of_db0(node).await?;
    println!("{POD}: claim {first_claim}, {first}");

    // The pod is deleted; the StatefulSet controller re-creates it with a new claim.
    node.pods().delete(POD, &DeleteParams::default()).await?;
    let recreated = wait_for("db-0 re-created", Duration::from_secs(120), || async {
        let p = node.pods().get_opt(POD).await?;
        Ok(p.filter(|p| {
            p.metadata.deletion_timestamp.is_none() && node_claim_differs(p, &first_claim)
        })
        .map(|_| ()))
    })
    .await;
    recreated?;
    let (second_claim, second, second_uid) = address_of_db0(node).await?;
    println!("{POD} re-created: claim {second_claim}, {second}");
    ensure!(
        second_claim != first_claim && second_uid != first_uid,
        "the claim is new"
    );
    ensure!(
        second == first,
        "re-created {POD} got {second}, before {first}"
    );
    let objects = addresses(node, network).await?;
    let owners: Vec<(String, String)> = objects
        .iter()
        .map(|o| (o.spec.address.clone(), o.spec.claim.uid.clone()))
        .collect();
    ensure!(
        owners == vec![(first.clone(), second_uid.clone())],
        "allocations of {network}: {owners:?}"
    );
    let log = node.logs();
    ensure!(
        log.contains("address held for its identity")
            && log.contains("taking over the identity's held address"),
        "the driver's log shows no hold and takeover"
    );
    node.mark("db-0 kept its address across re-creation");

    // Scaled to 0: the pod goes, its address is held, and the controller releases it because
    // ordinal 0 of a StatefulSet with 0 replicas cannot return.
    sets.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 0}})),
    )
    .await?;
    wait_for("db-0 gone", Duration::from_secs(120), || async {
        Ok(node.pods().get_opt(POD).await?.is_none().then_some(()))
    })
    .await?;
    node.mark("db-0 gone (scaled to 0)");
    wait_for(
        "the held address released by the controller",
        Duration::from_secs(60),
        || async { Ok(addresses(node, network).await?.is_empty().then_some(())) },
    )
    .await?;
    node.mark("hold released: StatefulSet db has 0 replicas");
    Ok(())
}

/// Whether pod `p` uses another claim than `claim` (or none yet: a new pod's claim is made by
/// the resourceclaim controller after it).
fn node_claim_differs(p: &k8s_openapi::api::core::v1::Pod, claim: &str) -> bool {
    !p.status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .any(|s| s.resource_claim_name.as_deref() == Some(claim))
}

/// Deletes the StatefulSet and the Network (the controller removes its finalizer), then any
/// allocation object left.
async fn remove(node: &RealNode, network: &str) -> anyhow::Result<()> {
    let sets: Api<StatefulSet> =
        Api::namespaced(node.cluster.client.clone(), &node.cluster.namespace);
    match sets.delete("db", &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    node.delete_pod(POD, Duration::from_secs(120)).await?;
    let networks: Api<Network> = Api::all(node.cluster.client.clone());
    match networks.delete(network, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    wait_for(
        &format!("Network {network} deleted"),
        Duration::from_secs(60),
        || async { Ok(networks.get_opt(network).await?.is_none().then_some(())) },
    )
    .await?;
    let api: Api<NetworkAddress> = Api::all(node.cluster.client.clone());
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(&format!("{NETWORK_LABEL}={network}")),
    )
    .await?;
    Ok(())
}
