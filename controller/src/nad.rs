//! The NetworkAttachmentDefinitions a Network with `spec.networkAttachmentDefinition` produces,
//! one per selected namespace, so Multus users can name the network (see the README, "Multus
//! and KubeVirt").
//!
//! No watch: the CRD is optional and often absent, and a watch of a missing resource fails
//! forever. Each reconcile lists the NADs of the Network's name (one list, all namespaces) and
//! writes only what differs, so a Network at rest costs one list and no write; a NAD deleted
//! or edited by hand is put back at the next resync.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, Preconditions,
};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::network::nad::{NAD_GROUP, NAD_KIND, NAD_PLURAL, NAD_VERSION, nad_config};
use crate::network::{NETWORK_LABEL, Network, TemplateRef};
use crate::{FIELD_MANAGER, Result};

/// Ready=False: the CRD is not installed, so no NAD could be written (templates were).
pub const REASON_CRD_MISSING: &str = "NetworkAttachmentDefinitionCRDMissing";
/// Ready=False: a NAD of the Network's name that knic did not generate exists in a selected
/// namespace; it is left alone.
pub const REASON_CONFLICT: &str = "NADConflict";

/// The message of [`REASON_CRD_MISSING`].
pub fn crd_missing_message() -> String {
    format!(
        "spec.networkAttachmentDefinition: the NetworkAttachmentDefinition CRD \
         ({NAD_GROUP}/{NAD_VERSION}) is not installed; templates were generated, NADs were not"
    )
}

/// What the NADs of a Network came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The Network does not ask for NADs (any it had are gone).
    Off,
    /// It asks, but the CRD is not installed.
    CrdMissing,
    /// NADs present (sorted), and one message per namespace skipped for a foreign NAD.
    Synced {
        /// The NADs present.
        nads: Vec<TemplateRef>,
        /// Why a selected namespace has none.
        foreign: Vec<String>,
    },
}

/// One NAD as listed: where, whether knic generated it for this Network, and whether it is
/// exactly the wanted object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Live {
    /// Its namespace.
    pub namespace: String,
    /// Its uid, the precondition of a delete.
    pub uid: Option<String>,
    /// Labelled for this Network.
    pub ours: bool,
    /// Equal to what knic would apply.
    pub current: bool,
}

/// The writes a reconcile makes, decided without I/O.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Namespaces to apply the NAD in (missing or drifted).
    pub apply: Vec<String>,
    /// Our NADs to delete: (namespace, uid) of namespaces no longer selected, or all when the
    /// Network no longer asks for NADs.
    pub delete: Vec<(String, Option<String>)>,
    /// NADs present afterwards.
    pub present: Vec<TemplateRef>,
    /// Why a selected namespace has none.
    pub foreign: Vec<String>,
}

/// Decides the writes for `network` given whether it wants NADs, the selected namespaces and
/// the NADs of its name that exist.
pub fn changes(network: &str, wanted: bool, selected: &BTreeSet<String>, live: &[Live]) -> Changes {
    let mut out = Changes::default();
    let by_namespace: BTreeMap<&str, &Live> =
        live.iter().map(|l| (l.namespace.as_str(), l)).collect();
    if wanted {
        for namespace in selected {
            match by_namespace.get(namespace.as_str()) {
                Some(l) if !l.ours => {
                    out.foreign.push(format!(
                        "namespace {namespace}: a NetworkAttachmentDefinition named {network:?} \
                         that knic did not generate already exists; it is left alone"
                    ));
                    continue;
                }
                Some(l) if l.current => {}
                _ => out.apply.push(namespace.clone()),
            }
            out.present.push(TemplateRef {
                namespace: namespace.clone(),
                name: network.to_owned(),
            });
        }
    }
    for l in live {
        if l.ours && !(wanted && selected.contains(&l.namespace)) {
            out.delete.push((l.namespace.clone(), l.uid.clone()));
        }
    }
    out
}

/// The API coordinates of the NAD CRD.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(NAD_GROUP, NAD_VERSION, NAD_KIND),
        NAD_PLURAL,
    )
}

/// The NAD knic wants in `namespace`: labelled with the network and owned by it, like the
/// templates.
pub fn desired(network: &Network, namespace: &str) -> Value {
    let name = network.name_any();
    let owners: Vec<Value> = network
        .controller_owner_ref(&())
        .into_iter()
        .filter_map(|o| serde_json::to_value(o).ok())
        .collect();
    json!({
        "apiVersion": format!("{NAD_GROUP}/{NAD_VERSION}"),
        "kind": NAD_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {NETWORK_LABEL: name},
            "ownerReferences": owners,
        },
        "spec": {"config": nad_config(&name)},
    })
}

/// Whether a listed NAD is exactly what [`desired`] writes (label, owner, config).
pub fn is_current(live: &DynamicObject, want: &Value) -> bool {
    let labels_ok = live.labels().get(NETWORK_LABEL).map(String::as_str)
        == want["metadata"]["labels"][NETWORK_LABEL].as_str();
    let owners = serde_json::to_value(&live.metadata.owner_references)
        .ok()
        .filter(|v| !v.is_null())
        .unwrap_or_else(|| json!([]));
    labels_ok && owners == want["metadata"]["ownerReferences"] && live.data["spec"] == want["spec"]
}

/// Applies, repairs and removes the Network's NADs; `selected` is the namespaces its templates
/// went to. A missing CRD is an outcome, not an error: templates still serve DRA users.
pub async fn sync(
    client: &Client,
    network: &Network,
    selected: &BTreeSet<String>,
) -> Result<Outcome> {
    let wanted = network.spec.network_attachment_definition.is_some();
    let name = network.name_any();
    let ar = api_resource();
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let listed = match all
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.code == 404 => {
            return Ok(if wanted {
                Outcome::CrdMissing
            } else {
                Outcome::Off
            });
        }
        Err(e) => return Err(e.into()),
    };
    let live: Vec<Live> = listed
        .iter()
        .filter(|n| n.name_any() == name)
        .map(|n| {
            let namespace = n.namespace().unwrap_or_default();
            Live {
                ours: n.labels().get(NETWORK_LABEL) == Some(&name),
                current: is_current(n, &desired(network, &namespace)),
                uid: n.uid(),
                namespace,
            }
        })
        .collect();
    let plan = changes(&name, wanted, selected, &live);
    for namespace in &plan.apply {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch(&name, &params, &Patch::Apply(&desired(network, namespace)))
            .await?;
    }
    for (namespace, uid) in &plan.delete {
        delete(client, namespace, &name, uid.clone()).await?;
    }
    Ok(if wanted {
        Outcome::Synced {
            nads: plan.present,
            foreign: plan.foreign,
        }
    } else {
        Outcome::Off
    })
}

/// Deletes every NAD knic generated for `network` (the Network is invalid or being deleted);
/// nothing to do without the CRD.
pub async fn delete_all(client: &Client, network: &str) -> Result<()> {
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource());
    let listed = match all
        .list(&ListParams::default().labels(&format!("{NETWORK_LABEL}={network}")))
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for n in listed {
        delete(
            client,
            &n.namespace().unwrap_or_default(),
            &n.name_any(),
            n.uid(),
        )
        .await?;
    }
    Ok(())
}

/// Deletes one NAD, guarded by its uid so a NAD re-created by someone else meanwhile stays.
async fn delete(client: &Client, namespace: &str, name: &str, uid: Option<String>) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &api_resource());
    let params = DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
