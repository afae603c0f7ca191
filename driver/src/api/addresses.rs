//! IPAM's API calls: Networks, namespace labels, pod labels (only with `--pod-label-reads`),
//! and the `NetworkAddress` objects whose create-by-name makes an address unique.
//!
//! The client repeats reads and the release's deletes when the apiserver fails them, but not a
//! create: a create that took effect but whose answer was lost would come back as
//! `AlreadyExists`, which the allocator takes for another claim's address, leaving ours behind
//! for the claim's whole life. Only here is it known what "ours" means, so the create is
//! repeated here and an `AlreadyExists` is checked against the object's owner; likewise a 409
//! on a release is a failed uid precondition (someone else's object now) only when the object
//! says so, not because an apiserver answered 409 for a moment.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use knic_proto::backoff::{API_ATTEMPTS, API_MAX_BACKOFF, API_MIN_BACKOFF, Backoff};
use knic_proto::network::{NETWORK_LABEL, Network, NetworkAddress};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};

use crate::BoxFuture;
use crate::claims::ClaimRef;
use crate::claims::ipam::{AddressBook, ClaimState, Created, Requester, hold_patch};
use crate::error::{Error, Result};
use crate::events::{EventSink, Warning};

/// [`AddressBook`] over the Kubernetes API.
#[derive(Clone)]
pub struct KubeAddressBook {
    client: kube::Client,
    pod_label_reads: bool,
    events: Option<Arc<dyn EventSink>>,
}

impl KubeAddressBook {
    /// Wraps a client; no request is made until an allocation is needed. Reads no pods.
    pub fn new(client: kube::Client) -> Self {
        KubeAddressBook {
            client,
            pod_label_reads: false,
            events: None,
        }
    }

    /// Where `StableAddressInUse` Events go.
    pub fn with_events(mut self, events: Arc<dyn EventSink>) -> Self {
        self.events = Some(events);
        self
    }

    /// Reads a claim's pod for its labels (`stableAddresses.by: label`), which needs the
    /// chart's `driver.podLabelReads` grant: `get` on every pod, cluster-wide.
    pub fn with_pod_label_reads(mut self, reads: bool) -> Self {
        self.pod_label_reads = reads;
        self
    }
}

impl AddressBook for KubeAddressBook {
    fn network<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Network>>> {
        Box::pin(async move {
            let api: kube::Api<Network> = kube::Api::all(self.client.clone());
            Ok(api.get_opt(name).await?)
        })
    }

    fn reads_pod_labels(&self) -> bool {
        self.pod_label_reads
    }

    fn pod_labels<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>>> {
        Box::pin(async move {
            // The caller asks first; this keeps a missed check from becoming a GET the
            // ServiceAccount may not have.
            if !self.pod_label_reads {
                return Err(Error::Ipam(format!(
                    "pod {namespace}/{name}: this driver reads no pods \
                     (--pod-label-reads/KNIC_POD_LABEL_READS is false)"
                )));
            }
            let api: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), namespace);
            Ok(api
                .get_opt(name)
                .await?
                .map(|p| p.metadata.labels.unwrap_or_default()))
        })
    }

    fn namespace_labels<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>>> {
        Box::pin(async move {
            let api: kube::Api<Namespace> = kube::Api::all(self.client.clone());
            Ok(api
                .get_opt(name)
                .await?
                .map(|n| n.metadata.labels.unwrap_or_default()))
        })
    }

    fn list<'a>(&'a self, network: &'a str) -> BoxFuture<'a, Result<Vec<NetworkAddress>>> {
        Box::pin(async move {
            let api: kube::Api<NetworkAddress> = kube::Api::all(self.client.clone());
            let params = ListParams::default().labels(&format!("{NETWORK_LABEL}={network}"));
            Ok(api.list(&params).await?.items)
        })
    }

    fn create<'a>(&'a self, address: &'a NetworkAddress) -> BoxFuture<'a, Result<Created>> {
        Box::pin(async move {
            let api: kube::Api<NetworkAddress> = kube::Api::all(self.client.clone());
            let name = address.metadata.name.clone().unwrap_or_default();
            let mut backoff = Backoff::new(API_MIN_BACKOFF, API_MAX_BACKOFF, seed(&name));
            loop {
                let error = match api.create(&PostParams::default(), address).await {
                    Ok(stored) => {
                        return Ok(Created::Created(stored.metadata.uid.unwrap_or_default()));
                    }
                    Err(kube::Error::Api(e)) if e.is_already_exists() => {
                        // An earlier attempt of ours may have taken effect unanswered.
                        return Ok(match api.get_opt(&name).await? {
                            Some(found) if same_owner(&found, address) => {
                                Created::Created(found.metadata.uid.unwrap_or_default())
                            }
                            _ => Created::AlreadyExists,
                        });
                    }
                    Err(e) => e,
                };
                if !transient(&error) || backoff.failures() + 1 >= API_ATTEMPTS {
                    return Err(error.into());
                }
                let pause = backoff.fail();
                tracing::debug!(%name, error = %error, ?pause, "creating an allocation failed; repeating");
                tokio::time::sleep(pause).await;
            }
        })
    }

    fn claim_state<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<ClaimState>> {
        self.claim_state_of(namespace, name, uid)
    }

    fn hold<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
        since: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        self.hold_object(name, uid, since)
    }

    fn stable_in_use(&self, who: &Requester, message: String) {
        if let Some(events) = &self.events {
            events.warn(Warning {
                claim: ClaimRef {
                    namespace: who.namespace.clone(),
                    name: who.claim.clone(),
                    uid: who.uid.clone(),
                },
                pod: None,
                action: "PrepareResources",
                reason: "StableAddressInUse",
                message,
            });
        }
    }

    fn delete<'a>(&'a self, name: &'a str, uid: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let api: kube::Api<NetworkAddress> = kube::Api::all(self.client.clone());
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.to_owned()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            let mut backoff = Backoff::new(API_MIN_BACKOFF, API_MAX_BACKOFF, seed(name));
            loop {
                let error = match api.delete(name, &params).await {
                    Ok(_) => return Ok(()),
                    // Already released (or collected).
                    Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
                    // The precondition failed, so the name now belongs to another allocation,
                    // which must be left alone; unless the object is still ours, and the 409
                    // was the apiserver's, not the precondition's.
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        let still_ours = api
                            .get_opt(name)
                            .await?
                            .is_some_and(|a| a.metadata.uid.as_deref() == Some(uid));
                        if !still_ours {
                            return Ok(());
                        }
                        kube::Error::Api(e)
                    }
                    Err(e) => e,
                };
                if !transient(&error) || backoff.failures() + 1 >= API_ATTEMPTS {
                    return Err(error.into());
                }
                let pause = backoff.fail();
                tracing::debug!(%name, error = %error, ?pause, "releasing an allocation failed; repeating");
                tokio::time::sleep(pause).await;
            }
        })
    }
}

impl KubeAddressBook {
    fn claim_state_of<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<ClaimState>> {
        Box::pin(async move {
            let api: kube::Api<ResourceClaim> =
                kube::Api::namespaced(self.client.clone(), namespace);
            Ok(match api.get_opt(name).await? {
                Some(c) if c.metadata.uid.as_deref() == Some(uid) => {
                    if c.metadata.deletion_timestamp.is_some() {
                        ClaimState::Deleting
                    } else {
                        ClaimState::Live
                    }
                }
                _ => ClaimState::Gone,
            })
        })
    }

    fn hold_object<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
        since: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let api: kube::Api<NetworkAddress> = kube::Api::all(self.client.clone());
            let patch = hold_patch(uid, since);
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => Ok(()),
                // Gone: collected already, nothing left to hold.
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                // The uid in the patch did not match: the name is another allocation now.
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => {
                    let still_ours = api
                        .get_opt(name)
                        .await?
                        .is_some_and(|a| a.metadata.uid.as_deref() == Some(uid));
                    if still_ours {
                        Err(kube::Error::Api(e).into())
                    } else {
                        Ok(())
                    }
                }
                Err(e) => Err(e.into()),
            }
        })
    }
}

/// Whether `found` is the allocation `wanted` describes: same claim (by uid), node and address.
fn same_owner(found: &NetworkAddress, wanted: &NetworkAddress) -> bool {
    found.spec.claim.uid == wanted.spec.claim.uid
        && found.spec.node == wanted.spec.node
        && found.spec.network == wanted.spec.network
        && found.spec.address == wanted.spec.address
}

/// Failures that say nothing about the object: the apiserver failed, refused for now, lost a
/// storage race, or never answered.
fn transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(e) => e.code == 409 || e.code == 429 || e.code >= 500,
        kube::Error::Service(_) | kube::Error::HyperError(_) => true,
        _ => false,
    }
}

/// Jitter seed: allocators on many nodes failing together must not repeat in step.
fn seed(name: &str) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    name.bytes()
        .fold(nanos, |h, b| h.rotate_left(5) ^ u64::from(b))
}
