//! Collection of NetworkAddress objects: addresses whose claim is gone are released, or held
//! for their stable identity (`stableAddresses.gracePeriodSeconds`) until the grace period
//! passes or the identity cannot return.
//!
//! The decision is [`decide`], a pure function of what one sweep read, so every rule is
//! unit-tested without an apiserver; [`collect_addresses`] reads and acts.

use std::collections::HashMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;
use knic_proto::network::stable::{
    HELD_LABEL, HELD_SINCE_ANNOTATION, split_identity, statefulset_ordinal,
};
use knic_proto::network::{Network, NetworkAddress, StableBy};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::Result;

/// Whether an identity can still come back, as far as reads can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityFate {
    /// Not known (label identities, reads off, or a pod name that is no StatefulSet's).
    Unknown,
    /// Its StatefulSet (with the ordinal below `replicas`) or VirtualMachine exists.
    Alive,
    /// Its StatefulSet is gone or scaled below the ordinal, or its VirtualMachine is gone.
    Gone,
}

/// What one sweep knows about one allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The allocation's claim (namespace, name and uid) exists.
    pub claim_exists: bool,
    /// Labelled `knic.dev/held=true`.
    pub held: bool,
    /// The `knic.dev/held-since` time, if it parses.
    pub held_since: Option<Timestamp>,
    /// The allocation carries a stable identity.
    pub has_identity: bool,
    /// The Network's grace period in seconds (0: no Network, no stableAddresses, or none set).
    pub grace: u64,
    /// The identity's namespace exists.
    pub namespace_exists: bool,
    /// What reads say about the identity.
    pub identity: IdentityFate,
}

/// What to do with one allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Leave it.
    Keep,
    /// Mark it held since now: its claim vanished without an unprepare (node lost).
    MarkHeld,
    /// Delete it (uid precondition), for the reason given.
    Delete(&'static str),
}

/// The collection rule for one allocation at `now`.
///
/// A held allocation is not in use (its claim was unprepared, or is gone), so it may be deleted
/// whether or not its claim still exists; an allocation that is not held is deleted, or marked
/// held, only once its claim is gone.
pub fn decide(facts: &Facts, now: Timestamp) -> Decision {
    if !facts.held {
        if facts.claim_exists {
            return Decision::Keep;
        }
        if !facts.has_identity || facts.grace == 0 {
            return Decision::Delete("claim gone");
        }
        if !facts.namespace_exists {
            return Decision::Delete("claim gone and its namespace too");
        }
        return Decision::MarkHeld;
    }
    if facts.grace == 0 {
        return Decision::Delete("held, but the Network has no grace period (any more)");
    }
    if !facts.namespace_exists {
        return Decision::Delete("held, and the identity's namespace is gone");
    }
    let Some(since) = facts.held_since else {
        // Unreadable start: restart the period rather than guess.
        return Decision::MarkHeld;
    };
    let grace = i64::try_from(facts.grace).unwrap_or(i64::MAX);
    if now.as_second().saturating_sub(since.as_second()) >= grace {
        return Decision::Delete("held, and the grace period passed");
    }
    if facts.identity == IdentityFate::Gone {
        return Decision::Delete("held, and the identity cannot return");
    }
    Decision::Keep
}

/// The held-since time of an allocation, `None` when missing or not RFC 3339.
pub fn held_since(address: &NetworkAddress) -> Option<Timestamp> {
    address
        .annotations()
        .get(HELD_SINCE_ANNOTATION)
        .and_then(|s| s.parse().ok())
}

/// Whether an allocation is marked held.
pub fn is_held(address: &NetworkAddress) -> bool {
    address
        .labels()
        .get(HELD_LABEL)
        .is_some_and(|v| v == "true")
}

/// The StatefulSet an identity's pod name belongs to and whether it keeps that ordinal:
/// `replicas` (unset means 1) above the ordinal.
pub fn statefulset_fate(set: Option<&StatefulSet>, ordinal: u32) -> IdentityFate {
    match set {
        None => IdentityFate::Gone,
        Some(s) => {
            let replicas = s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            if i64::from(ordinal) >= i64::from(replicas) {
                IdentityFate::Gone
            } else {
                IdentityFate::Alive
            }
        }
    }
}

/// Deletes or marks held every NetworkAddress as [`decide`] says and returns how many were
/// deleted; a KNI sandbox's (claim uid `kni.…`) is its driver's to release. Each claim is read
/// directly rather than from a cache, so a claim created a moment ago is never taken for gone;
/// every write is guarded by the allocation's uid, so one recreated in between is left alone.
/// With `identity_reads`, StatefulSets and KubeVirt VirtualMachines of held identities are read.
pub async fn collect_addresses(client: &Client, identity_reads: bool) -> Result<usize> {
    let addresses: Api<NetworkAddress> = Api::all(client.clone());
    let networks: Api<Network> = Api::all(client.clone());
    let mut claims: HashMap<(String, String), Option<String>> = HashMap::new();
    let mut graces: HashMap<String, (u64, Option<StableBy>)> = HashMap::new();
    let mut namespaces: HashMap<String, bool> = HashMap::new();
    let mut fates: HashMap<(String, String, String), IdentityFate> = HashMap::new();
    let now = Timestamp::now();
    let mut collected = 0;
    for address in addresses.list(&ListParams::default()).await?.items {
        let claim = &address.spec.claim;
        // A KNI sandbox's address has no ResourceClaim: the driver of its node releases it
        // when the sandbox is detached.
        if knic_proto::names::is_sandbox_claim_uid(&claim.uid) {
            continue;
        }
        let key = (claim.namespace.clone(), claim.name.clone());
        let uid = match claims.get(&key) {
            Some(uid) => uid.clone(),
            None => {
                let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.namespace);
                let uid = api.get_opt(&claim.name).await?.and_then(|c| c.metadata.uid);
                claims.insert(key, uid.clone());
                uid
            }
        };
        let claim_exists = uid.as_deref() == Some(claim.uid.as_str());
        let held = is_held(&address);
        if claim_exists && !held {
            continue;
        }
        let (grace, by) = match graces.get(&address.spec.network) {
            Some(g) => *g,
            None => {
                let g = networks
                    .get_opt(&address.spec.network)
                    .await?
                    .filter(|n| n.metadata.deletion_timestamp.is_none())
                    .and_then(|n| n.spec.stable_addresses)
                    .map_or((0, None), |s| (s.grace(), Some(s.by)));
                graces.insert(address.spec.network.clone(), g);
                g
            }
        };
        let identity = address.spec.identity.as_deref().and_then(split_identity);
        let namespace = identity.map_or(claim.namespace.as_str(), |(ns, _)| ns);
        let namespace_exists = match namespaces.get(namespace) {
            Some(e) => *e,
            None => {
                let api: Api<Namespace> = Api::all(client.clone());
                let exists = api
                    .get_opt(namespace)
                    .await?
                    .is_some_and(|n| n.metadata.deletion_timestamp.is_none());
                namespaces.insert(namespace.to_owned(), exists);
                exists
            }
        };
        let fate = match (identity, by) {
            (Some((ns, key)), Some(by)) if identity_reads && held && grace > 0 => {
                let cache_key = (format!("{by:?}"), ns.to_owned(), key.to_owned());
                match fates.get(&cache_key) {
                    Some(f) => *f,
                    None => {
                        let f = identity_fate(client, by, ns, key).await?;
                        fates.insert(cache_key, f);
                        f
                    }
                }
            }
            _ => IdentityFate::Unknown,
        };
        let facts = Facts {
            claim_exists,
            held,
            held_since: held_since(&address),
            has_identity: identity.is_some(),
            grace,
            namespace_exists,
            identity: fate,
        };
        let name = address.name_any();
        let object_uid = address.uid().unwrap_or_default();
        match decide(&facts, now) {
            Decision::Keep => {}
            Decision::MarkHeld => {
                let since = Timestamp::from_second(now.as_second()).unwrap_or(now);
                let patch = json!({"metadata": {
                    "uid": object_uid,
                    "labels": {HELD_LABEL: "true"},
                    "annotations": {HELD_SINCE_ANNOTATION: since.to_string()},
                }});
                match addresses
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        tracing::info!(%name, identity = address.spec.identity.as_deref().unwrap_or_default(),
                        grace, "claim gone without unprepare; address held for its identity")
                    }
                    Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Decision::Delete(why) => {
                let params = DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid: Some(object_uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match addresses.delete(&name, &params).await {
                    Ok(_) => {
                        tracing::info!(%name, address = %address.spec.address, why, "address released");
                        collected += 1;
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(collected)
}

/// Reads whether identity `key` in `namespace` can return: a StatefulSet pod name's set and
/// replicas, a VM's VirtualMachine. A KubeVirt not installed has no VMs: gone.
async fn identity_fate(
    client: &Client,
    by: StableBy,
    namespace: &str,
    key: &str,
) -> Result<IdentityFate> {
    match by {
        StableBy::Label => Ok(IdentityFate::Unknown),
        StableBy::PodName => {
            let Some((set, ordinal)) = statefulset_ordinal(key) else {
                return Ok(IdentityFate::Unknown);
            };
            let api: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
            Ok(statefulset_fate(api.get_opt(set).await?.as_ref(), ordinal))
        }
        StableBy::KubevirtVm => {
            let gvk = GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine");
            let resource = ApiResource::from_gvk_with_plural(&gvk, "virtualmachines");
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &resource);
            Ok(match api.get_opt(key).await? {
                Some(_) => IdentityFate::Alive,
                None => IdentityFate::Gone,
            })
        }
    }
}

#[cfg(test)]
mod tests;
