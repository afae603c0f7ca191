//! The release's objects in the API, and undoing everything a run made, whatever point it
//! reached: the release (uninstalled if the test did not get to it), the webhook's DNAT rules,
//! the namespace, DeviceClasses moved aside, the veth and its namespace, the imported image.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use knic_e2e::harness::{eventually, ip};
use knic_e2e::helm::{Rendered, release};
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::{Value, json};

use super::{HELM_TIMEOUT, HOST_LINK, Run, ctr, image_refs, node};

/// The chart's objects without a namespace (cluster-scoped), as the apiserver gets them.
pub fn cluster_scoped(rendered: &Rendered) -> Vec<Value> {
    rendered
        .objects
        .iter()
        .map(|s| s.object.to_json())
        .filter(|o| o["metadata"]["namespace"].is_null())
        .collect()
}

/// The object named like `object` (its kind, name, and `namespace` if namespaced), if it exists.
pub async fn get(
    client: &kube::Client,
    object: &Value,
    namespace: Option<&str>,
) -> anyhow::Result<Option<Value>> {
    let api_version = object["apiVersion"].as_str().context("no apiVersion")?;
    let kind = object["kind"].as_str().context("no kind")?;
    let name = object["metadata"]["name"].as_str().context("no name")?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {api_version} {kind}"))?;
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    Ok(match api.get_opt(name).await? {
        Some(o) => Some(serde_json::to_value(o)?),
        None => None,
    })
}

/// What of the release is still in the API after the uninstall: every rendered object but the
/// CRDs (Helm never deletes those: they must still be there) and the release records.
pub async fn release_objects_left(run: &Run) -> anyhow::Result<Vec<String>> {
    let mut left = Vec::new();
    for source in &run.rendered.objects {
        let object = source.object.to_json();
        let kind = object["kind"].as_str().unwrap_or_default();
        if kind == "CustomResourceDefinition" {
            if get(&run.cluster.client, &object, None).await?.is_none() {
                left.push(format!(
                    "CRD {} is gone after the uninstall (Helm keeps CRDs, and their objects)",
                    object["metadata"]["name"]
                ));
            }
            continue;
        }
        let namespace = (!object["metadata"]["namespace"].is_null()).then(|| run.ns());
        if get(&run.cluster.client, &object, namespace)
            .await?
            .is_some()
        {
            left.push(format!(
                "{kind} {} is still in the API after the uninstall",
                object["metadata"]["name"]
            ));
        }
    }
    let secrets: Api<Secret> = Api::namespaced(run.cluster.client.clone(), run.ns());
    for record in secrets
        .list(&ListParams::default().labels("owner=helm"))
        .await?
        .items
    {
        left.push(format!(
            "Helm's release record {:?} is still there",
            record.metadata.name
        ));
    }
    Ok(left)
}

/// Undoes a run, collecting every failure rather than stopping at the first.
pub struct Cleanup(Vec<String>);

impl Cleanup {
    fn note<T>(&mut self, what: &str, result: anyhow::Result<T>) {
        if let Err(e) = result {
            self.0.push(format!("{what}: {e:#}"));
        }
    }

    /// Undoes what `run` made; `failed`: the scenario failed, so slices the test's driver
    /// published may be left for the wipe.
    pub async fn undo(run: &mut Run, failed: bool) -> anyhow::Result<()> {
        let mut c = Cleanup(Vec::new());
        if run.installed && !run.uninstalled {
            // The test's pods go while the driver still runs: their claims must be unprepared
            // by it, or the kubelet holds the pods (and the namespace) in Terminating forever.
            let result = delete_test_pods(run).await;
            c.note("deleting the test's pods while the driver runs", result);
            let (kubeconfig, ns) = (run.kubeconfig().to_owned(), run.ns().to_owned());
            let outcome = tokio::task::spawn_blocking(move || {
                release::uninstall(&kubeconfig, &ns, HELM_TIMEOUT)
            })
            .await;
            c.note(
                "helm uninstall",
                outcome
                    .map_err(anyhow::Error::from)
                    .and_then(|r| r)
                    .and_then(|o| o.map_err(|refusal| anyhow::anyhow!("{refusal}"))),
            );
            run.uninstalled = true;
        }
        if run.installed {
            // Whatever of the release a failed uninstall left: only objects Helm labelled as
            // this release's, so nothing of anyone else's is touched.
            let result = delete_release_leftovers(run).await;
            c.note("deleting the release's cluster-scoped leftovers", result);
        }
        if let Some(vip) = run.vip.take() {
            c.note("removing the webhook's DNAT rules", node::unroute(&vip));
        }
        if failed && run.slices_before == 0 {
            c.note("wiping the node's knic.dev slices", wipe_slices(run).await);
        }
        let result = delete_namespace(run).await;
        c.note("deleting the test namespace", result);
        for crd in std::mem::take(&mut run.crds_made) {
            let api: Api<CustomResourceDefinition> = Api::all(run.cluster.client.clone());
            let result = api.delete(&crd, &DeleteParams::default()).await;
            c.note(
                &format!("deleting the CRD {crd} the install made"),
                result.map_err(Into::into),
            );
        }
        for class in std::mem::take(&mut run.moved) {
            let result = put_back(run, class).await;
            c.note("putting a DeviceClass back", result);
        }
        if ip(&["link", "show", HOST_LINK]).is_ok() {
            c.note("deleting the veth", ip(&["link", "del", HOST_LINK]));
        }
        // Deleting the peer's namespace deletes the veth with it, wherever its host end is.
        drop(run.peer.take());
        if let Some(before) = run.image_refs.take() {
            c.note(
                "removing the imported image",
                remove_new_images(run, &before),
            );
        }
        if c.0.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("{}", c.0.join("\n"))
        }
    }
}

/// Removes the image references the import added: the name and the `sha256:` alias of its
/// config that containerd's CRI plugin adds (removing only the name would leave the image).
fn remove_new_images(run: &Run, before: &BTreeSet<String>) -> anyhow::Result<()> {
    for reference in image_refs(&run.harness)?.into_keys() {
        if !before.contains(&reference) {
            ctr(&run.harness, &["images", "rm", &reference])?;
        }
    }
    Ok(())
}

async fn delete_release_leftovers(run: &Run) -> anyhow::Result<()> {
    for object in cluster_scoped(&run.rendered) {
        if object["kind"] == "CustomResourceDefinition" {
            continue;
        }
        let Some(found) = get(&run.cluster.client, &object, None).await? else {
            continue;
        };
        let ours =
            found["metadata"]["annotations"]["meta.helm.sh/release-namespace"] == json!(run.ns());
        if !ours {
            continue;
        }
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk =
            GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap_or_default());
        let (resource, _) = kube::discovery::pinned_kind(&run.cluster.client, &gvk).await?;
        let api: Api<DynamicObject> = Api::all_with(run.cluster.client.clone(), &resource);
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        api.delete(name, &DeleteParams::default()).await?;
        println!("helm_install: deleted the release's leftover {gvk:?} {name}");
    }
    Ok(())
}

/// Deletes the pods and claims the test made in the release's namespace (not the release's
/// own pods) and waits until the pods are gone.
async fn delete_test_pods(run: &Run) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(run.cluster.client.clone(), run.ns());
    let ours = ListParams::default().labels("!app.kubernetes.io/name");
    pods.delete_collection(&DeleteParams::default(), &ours)
        .await?;
    let claims: Api<ResourceClaim> = Api::namespaced(run.cluster.client.clone(), run.ns());
    claims
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    eventually(
        "the test's pods are gone",
        Duration::from_secs(120),
        || async { Ok(pods.list(&ours).await?.items.is_empty().then_some(())) },
    )
    .await
}

async fn wipe_slices(run: &Run) -> anyhow::Result<()> {
    let api: Api<ResourceSlice> = Api::all(run.cluster.client.clone());
    let fields = format!("spec.nodeName={},spec.driver=knic.dev", run.real.node);
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().fields(&fields),
    )
    .await?;
    Ok(())
}

async fn delete_namespace(run: &Run) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(run.cluster.client.clone());
    match namespaces.delete(run.ns(), &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    eventually(
        "the test namespace is gone",
        Duration::from_secs(120),
        || async { Ok(namespaces.get_opt(run.ns()).await?.is_none().then_some(())) },
    )
    .await
}

/// A DeviceClass moved aside, created again as it was (its name, labels, annotations, spec).
async fn put_back(run: &Run, class: DeviceClass) -> anyhow::Result<()> {
    let api: Api<DeviceClass> = Api::all(run.cluster.client.clone());
    let name = class.metadata.name.clone().unwrap_or_default();
    let fresh: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {
            "name": name,
            "labels": class.metadata.labels,
            "annotations": class.metadata.annotations,
        },
        "spec": class.spec,
    }))?;
    api.create(&PostParams::default(), &fresh)
        .await
        .with_context(|| format!("creating DeviceClass {name} again"))?;
    println!("helm_install: put DeviceClass {name} back");
    Ok(())
}
