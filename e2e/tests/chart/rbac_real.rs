//! The driver's RBAC on a real apiserver, with a real token: the chart's rendered `knic-driver`
//! ClusterRole (default values) bound to a ServiceAccount, a token for it from the TokenRequest
//! API bound to the node object (as a driver pod's token names its node), and requests made
//! with that token alone. What the driver needs works (its node, its ResourceSlices, claims,
//! namespaces, Networks); a pod of another namespace is refused (403). With
//! `driver.podLabelReads: true` the same token reads that pod, env values and all: exactly what
//! the opt-in exposes. Every object it creates is deleted afterwards.
//!
//! The role and binding get names of their own (the test namespace's) so a release of the
//! chart installed on the cluster is never touched; the rules are the render's, unchanged.

use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::harness::eventually;
use knic_e2e::helm;
use knic_proto::network::Network;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::DRIVER_SA;

/// A literal env value of the other namespace's pod: what a pod read exposes.
const LITERAL: &str = "knt-literal-env-value";
/// How long RBAC changes may take to reach the apiserver's authorizer.
const PROPAGATION: Duration = Duration::from_secs(15);

/// The rules of the chart's `knic-driver` ClusterRole rendered with `values`.
fn driver_rules(values: &serde_json::Value) -> anyhow::Result<Vec<PolicyRule>> {
    let rendered = helm::render(values, None)?;
    let role = rendered
        .all::<ClusterRole>()
        .into_iter()
        .find(|r| r.metadata.name.as_deref() == Some("knic-driver"))
        .context("no ClusterRole knic-driver in the render")?;
    role.rules.clone().context("knic-driver has no rules")
}

/// A client that authenticates with `token` and nothing else, to the cluster of `real`.
async fn token_client(real: &RealCluster, token: &str) -> anyhow::Result<kube::Client> {
    let file = kube::config::Kubeconfig::read_from(&real.kubeconfig)?;
    let mut config = kube::Config::from_custom_kubeconfig(file, &Default::default()).await?;
    // The whole identity replaced: no client certificate of the admin's stays behind.
    config.auth_info = serde_json::from_value(json!({"token": token}))?;
    Ok(kube::Client::try_from(config)?)
}

/// The HTTP status of a failed request (`None`: it succeeded).
fn status<T>(result: &Result<T, kube::Error>) -> Option<u16> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(s.code),
        Err(_) => Some(0),
    }
}

pub(crate) async fn driver_token_reads_no_pod_by_default(real: RealCluster) -> anyhow::Result<()> {
    let cluster = Cluster::real(&real, "rbac-driver-token").await?;
    let outcome = scenario(&real, &cluster).await;
    let cleanup = cleanup(&cluster).await;
    outcome.and(cleanup)
}

async fn scenario(real: &RealCluster, cluster: &Cluster) -> anyhow::Result<()> {
    let admin = cluster.client.clone();
    let ns = cluster.namespace.as_str();
    let name = format!("{ns}-driver");
    let default_rules = driver_rules(&json!({}))?;
    let opt_in_rules = driver_rules(&json!({"driver": {"podLabelReads": true}}))?;
    ensure!(
        default_rules != opt_in_rules,
        "podLabelReads changes nothing in the role"
    );

    // The driver's ServiceAccount and its role, as the chart binds them.
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": DRIVER_SA}}))?,
        )
        .await?;
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": name}, "rules": default_rules,
    }))?;
    roles.create(&PostParams::default(), &role).await?;
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": DRIVER_SA, "namespace": ns}],
            }))?,
        )
        .await?;

    // Another namespace's pod the node never runs (held by a scheduling gate), with a literal
    // env value, and a claim there.
    let other = cluster.create_extra_namespace("other", &[]).await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &other);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "elsewhere", "labels": {"app": "elsewhere"}},
            "spec": {
                "schedulingGates": [{"name": "knic.dev/e2e-hold"}],
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
                                "env": [{"name": "DB_PASSWORD", "value": LITERAL}]}],
            },
        }))?,
    )
    .await?;
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), &other);
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "claim"},
                "spec": {"devices": {"requests": [
                    {"name": "nic", "exactly": {"deviceClassName": "knic.dev"}}]}},
            }))?,
        )
        .await?;

    // A token bound to the node object, as a driver pod's token names its node.
    let node = Api::<Node>::all(admin.clone()).get(&real.node).await?;
    let node_uid = node.metadata.uid.context("node without uid")?;
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {
            "audiences": [],
            "expirationSeconds": 600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Node", "name": real.node,
                               "uid": node_uid},
        },
    }))?;
    let issued = accounts
        .create_token_request(DRIVER_SA, &PostParams::default(), &request)
        .await
        .context("TokenRequest bound to the Node")?;
    let token = issued.status.context("TokenRequest without status")?.token;
    let driver = token_client(real, &token).await?;

    // What the driver needs works (once the binding has reached the authorizer).
    let node_name = real.node.clone();
    eventually("the driver's token reads its node", PROPAGATION, || async {
        Ok(Api::<Node>::all(driver.clone())
            .get(&node_name)
            .await
            .ok()
            .map(|_| ()))
    })
    .await?;
    let own_slices =
        ListParams::default().fields(&format!("spec.nodeName={},spec.driver=knic.dev", real.node));
    Api::<ResourceSlice>::all(driver.clone())
        .list(&own_slices)
        .await
        .context("the driver's token lists its ResourceSlices")?;
    Api::<ResourceClaim>::namespaced(driver.clone(), &other)
        .get("claim")
        .await
        .context("the driver's token reads a claim")?;
    Api::<Namespace>::all(driver.clone())
        .get(&other)
        .await
        .context("the driver's token reads a namespace")?;
    Api::<Network>::all(driver.clone())
        .list(&ListParams::default())
        .await
        .context("the driver's token lists Networks")?;

    // A pod of another namespace is refused, read or list.
    let driver_pods: Api<Pod> = Api::namespaced(driver.clone(), &other);
    let read = driver_pods.get("elsewhere").await;
    ensure!(
        status(&read) == Some(403),
        "with default values the driver's token read pod {other}/elsewhere: {:?}",
        read.map(|p| p.metadata.name)
    );
    let listed = Api::<Pod>::all(driver.clone())
        .list(&ListParams::default())
        .await;
    ensure!(
        status(&listed) == Some(403),
        "pods listed: {:?}",
        listed.map(|l| l.items.len())
    );

    // With driver.podLabelReads: true, the same token reads the whole pod, env values and all.
    roles
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": opt_in_rules})),
        )
        .await?;
    let pod = eventually("the opted-in token reads the pod", PROPAGATION, || async {
        Ok(driver_pods.get("elsewhere").await.ok())
    })
    .await?;
    let env = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.env.as_ref())
        .and_then(|env| env.iter().find(|v| v.name == "DB_PASSWORD"))
        .and_then(|v| v.value.clone());
    ensure!(
        env.as_deref() == Some(LITERAL),
        "the opted-in read returned env {env:?}: the grant exposes the whole pod"
    );
    // Still only get: a list stays refused.
    let listed = Api::<Pod>::all(driver.clone())
        .list(&ListParams::default())
        .await;
    ensure!(
        status(&listed) == Some(403),
        "pods listed with the opt-in: {:?}",
        listed.map(|l| l.items.len())
    );
    Ok(())
}

/// Deletes the role, its binding and both namespaces (the ServiceAccount, pod and claim go with
/// them); what is already gone is fine.
async fn cleanup(cluster: &Cluster) -> anyhow::Result<()> {
    let name = format!("{}-driver", cluster.namespace);
    let gone = |r: Result<_, kube::Error>| match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(anyhow::Error::from(e)),
    };
    let client = cluster.client.clone();
    gone(
        Api::<ClusterRoleBinding>::all(client.clone())
            .delete(&name, &DeleteParams::default())
            .await
            .map(|_| ()),
    )?;
    gone(
        Api::<ClusterRole>::all(client)
            .delete(&name, &DeleteParams::default())
            .await
            .map(|_| ()),
    )?;
    cluster
        .delete_namespace(&format!("{}-other", cluster.namespace))
        .await?;
    cluster.delete_namespace(&cluster.namespace).await
}
