//! Preparing and unpreparing ResourceClaims: the logic behind the kubelet's two DRA calls.
//!
//! The split follows the dra-example-driver: [`resolve`] is a pure function from a claim object
//! to what this driver must remember about it; [`Preparer`] owns the checkpoint and is the one
//! place that decides "already prepared", "device busy" and "forget". Kubernetes is reached only
//! through [`ClaimSource`], so the same code runs against the real API, the e2e fake API and
//! in-memory test doubles.
//!
//! Claims whose config says `ipam: {network}` get their addresses here, at prepare time, from
//! [`crate::ipam`] (see there for why the driver allocates): the API calls happen before the
//! checkpoint lock is taken, the pure [`crate::plan::plans`] receives the addresses, and the
//! allocations are checkpointed with the claim so unprepare releases them before forgetting it.
//! Prepare and unprepare of one claim are serialised by a per-claim lock, so a repeated prepare
//! racing itself never allocates twice or releases what the other recorded.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::resource::v1::{Device, ResourceClaim};
use tokio::sync::{Mutex, watch};

use crate::checkpoint::{
    Attachment, Checkpoint, CheckpointStore, OpaqueConfig, PreparedClaim, PreparedDevice,
};
use crate::error::{Error, Result};
use crate::ipam::{AddressBook, Allocation, Requester};
use crate::plan::IpamAddresses;

/// Where ResourceClaims come from. A trait so tests and the demo can run without an apiserver.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim, or `None` when it does not exist.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ResourceClaim>>> + Send;
}

/// Reads claims from the Kubernetes API (`resource.k8s.io/v1`).
#[derive(Clone)]
pub struct KubeClaims {
    client: kube::Client,
}

impl KubeClaims {
    /// Wraps a client; no request is made until a claim is needed.
    pub fn new(client: kube::Client) -> Self {
        KubeClaims { client }
    }
}

impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>> {
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.client.clone(), namespace);
        Ok(api.get_opt(name).await?)
    }
}

/// What the kubelet names a claim by: namespace, name and the UID it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// Claim UID as the kubelet knows it.
    pub uid: String,
}

/// One device in a prepare answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedAnswer {
    /// Base request names (subrequest suffix stripped), as the kubelet expects.
    pub request_names: Vec<String>,
    /// Pool name.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// Consumable-capacity share ID, if any.
    pub share_id: Option<String>,
}

/// Computes what must be remembered about `claim` for `driver`, or why it cannot be prepared.
/// Pure: no I/O, no clock, so every rule is unit-testable.
pub fn resolve(
    driver: &str,
    wanted: &ClaimRef,
    claim: &ResourceClaim,
    now: u64,
) -> Result<PreparedClaim, String> {
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if uid != wanted.uid {
        return Err(format!(
            "metadata.uid is {uid:?} but the kubelet asked for {:?}: the claim was deleted and \
             recreated, refusing to prepare the replacement",
            wanted.uid
        ));
    }
    let status = claim.status.as_ref();
    let allocation = status
        .and_then(|s| s.allocation.as_ref())
        .ok_or("status.allocation is not set: the claim is not allocated")?;
    let devices = allocation.devices.as_ref();
    let results = devices
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let devices_for_us: Vec<PreparedDevice> = results
        .iter()
        .filter(|r| r.driver == driver)
        .map(|r| PreparedDevice {
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            share_id: r.share_id.clone(),
            published: None,
        })
        .collect();
    let mut configs: Vec<(u8, OpaqueConfig)> = devices
        .and_then(|d| d.config.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|c| {
            let opaque = c.opaque.as_ref().filter(|o| o.driver == driver)?;
            // Class config applies first, claim config overrides it.
            let rank = u8::from(c.source != "FromClass");
            Some((
                rank,
                OpaqueConfig {
                    source: c.source.clone(),
                    requests: c.requests.clone().unwrap_or_default(),
                    parameters: opaque.parameters.0.clone(),
                },
            ))
        })
        .collect();
    configs.sort_by_key(|(rank, _)| *rank);

    let pods: Vec<_> = status
        .and_then(|s| s.reserved_for.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .collect();
    let pod = match pods.as_slice() {
        [] => {
            return Err(
                "status.reservedFor names no pod: the claim is not reserved for a consumer yet"
                    .into(),
            );
        }
        [pod] => *pod,
        many => {
            let names: Vec<_> = many.iter().map(|p| p.name.as_str()).collect();
            return Err(format!(
                "status.reservedFor names {} pods ({}): a knic device is given to one pod at a \
                 time, so a shared claim cannot be prepared",
                many.len(),
                names.join(", ")
            ));
        }
    };
    Ok(PreparedClaim {
        namespace: wanted.namespace.clone(),
        name: wanted.name.clone(),
        uid: wanted.uid.clone(),
        pod_uid: pod.uid.clone(),
        pod_name: pod.name.clone(),
        devices: devices_for_us,
        configs: configs.into_iter().map(|(_, c)| c).collect(),
        prepared_at: now,
        attachments: Vec::new(),
        allocations: Vec::new(),
    })
}

/// The kubelet's answer for a prepared claim: one entry per device, base request names only.
pub fn answer(claim: &PreparedClaim) -> Vec<PreparedAnswer> {
    claim
        .devices
        .iter()
        .map(|d| PreparedAnswer {
            request_names: vec![d.request.split('/').next().unwrap_or_default().to_string()],
            pool: d.pool.clone(),
            device: d.device.clone(),
            share_id: d.share_id.clone(),
        })
        .collect()
}

/// Undoes what the runtime hooks did for a claim before it is forgotten (the pod's interfaces
/// back on the host); set by the pod-network layer, absent when only the kubelet plugin runs.
pub trait Releaser: Send + Sync + 'static {
    /// Puts back every device of `claim` that may still be away from the host.
    fn release<'a>(
        &'a self,
        claim: &'a PreparedClaim,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>>;
}

/// Holds the checkpoint and serialises every change to it.
pub struct Preparer<S> {
    driver: String,
    source: S,
    store: CheckpointStore,
    state: Mutex<State>,
    /// The node's current devices, to snapshot what a prepared device looked like.
    inventory: Option<watch::Receiver<Vec<Device>>>,
    /// Bumped after every checkpoint write, so the publisher can re-merge retained devices.
    changes: watch::Sender<u64>,
    releaser: std::sync::OnceLock<Arc<dyn Releaser>>,
    /// Where IPAM allocations are made and this node's name; unset (demo, tests) means claims
    /// with `ipam` cannot be prepared.
    ipam: std::sync::OnceLock<(Arc<dyn AddressBook>, String)>,
    /// One lock per claim UID with a prepare or unprepare in flight.
    inflight: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

struct State {
    /// `Err` holds the text of a checkpoint that could not be read; it is retried on every call
    /// so an operator's repair takes effect without a restart.
    checkpoint: std::result::Result<Checkpoint, String>,
}

impl<S: ClaimSource> Preparer<S> {
    /// Loads the checkpoint. A corrupt checkpoint does not stop the driver: it is logged and
    /// every prepare/unprepare answers with the error until the file is repaired or removed.
    pub fn new(driver: impl Into<String>, source: S, store: CheckpointStore) -> Arc<Self> {
        Self::build(driver.into(), source, store, None)
    }

    fn build(
        driver: String,
        source: S,
        store: CheckpointStore,
        inventory: Option<watch::Receiver<Vec<Device>>>,
    ) -> Arc<Self> {
        let checkpoint = store.load().map_err(|e| {
            tracing::error!(error = %e, "cannot read the checkpoint");
            e.to_string()
        });
        if let Ok(cp) = &checkpoint {
            tracing::info!(path = %store.path().display(), claims = cp.claims.len(), "checkpoint loaded");
        }
        Arc::new(Preparer {
            driver,
            source,
            store,
            state: Mutex::new(State { checkpoint }),
            inventory,
            changes: watch::channel(0).0,
            releaser: std::sync::OnceLock::new(),
            ipam: std::sync::OnceLock::new(),
            inflight: std::sync::Mutex::default(),
        })
    }

    /// Like [`Preparer::new`], also recording each prepared device's published form from
    /// `devices` (the node's current ResourceSlice devices).
    pub fn with_devices(
        driver: impl Into<String>,
        source: S,
        store: CheckpointStore,
        devices: watch::Receiver<Vec<Device>>,
    ) -> Arc<Self> {
        Self::build(driver.into(), source, store, Some(devices))
    }

    /// Installs the releaser unprepare calls before forgetting a claim (once).
    pub fn set_releaser(&self, releaser: Arc<dyn Releaser>) {
        let _ = self.releaser.set(releaser);
    }

    /// Installs the address book IPAM allocates through and this node's name, recorded on
    /// every allocation (once).
    pub fn set_address_book(&self, book: Arc<dyn AddressBook>, node: impl Into<String>) {
        let _ = self.ipam.set((book, node.into()));
    }

    /// The prepared claims of one pod (NRI events arrive keyed by pod UID).
    pub async fn claims_for_pod(&self, pod_uid: &str) -> Result<Vec<PreparedClaim>> {
        let mut state = self.state.lock().await;
        Ok(self
            .checkpoint(&mut state)?
            .claims
            .values()
            .filter(|c| c.pod_uid == pod_uid)
            .cloned()
            .collect())
    }

    /// One prepared claim as the checkpoint has it now.
    pub async fn claim(&self, uid: &str) -> Result<Option<PreparedClaim>> {
        let mut state = self.state.lock().await;
        Ok(self.checkpoint(&mut state)?.claims.get(uid).cloned())
    }

    /// Changes one prepared claim durably (the checkpoint is written before this returns);
    /// a claim that is gone meanwhile is left alone.
    pub async fn update(&self, uid: &str, change: impl FnOnce(&mut PreparedClaim)) -> Result<()> {
        let mut state = self.state.lock().await;
        let checkpoint = self.checkpoint(&mut state)?;
        let Some(claim) = checkpoint.claims.get(uid) else {
            return Ok(());
        };
        let mut claim = claim.clone();
        change(&mut claim);
        if checkpoint.claims.get(uid) == Some(&claim) {
            return Ok(());
        }
        let mut next = checkpoint.clone();
        next.claims.insert(uid.to_string(), claim);
        self.save(next.clone()).await?;
        state.checkpoint = Ok(next);
        Ok(())
    }

    /// Fires after every change to the prepared set.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Prepares every claim; each gets its own outcome, so one bad claim never hides the others.
    pub async fn prepare(
        &self,
        claims: &[ClaimRef],
    ) -> HashMap<String, Result<Vec<PreparedAnswer>>> {
        let mut out = HashMap::new();
        for claim in claims {
            out.insert(claim.uid.clone(), self.prepare_one(claim).await);
        }
        out
    }

    /// Unprepares every claim from the checkpoint alone; unknown claims succeed.
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> HashMap<String, Result<()>> {
        let mut out = HashMap::new();
        for claim in claims {
            out.insert(claim.uid.clone(), self.unprepare_one(claim).await);
        }
        out
    }

    /// A snapshot of the prepared claims (for tests, the inventory and NRI reconciliation).
    pub async fn prepared(&self) -> Result<Checkpoint> {
        let mut state = self.state.lock().await;
        Ok(self.checkpoint(&mut state)?.clone())
    }

    /// Takes the per-claim lock: API calls happen outside the checkpoint lock, so without it
    /// two prepares of one claim could both allocate addresses before either is recorded.
    async fn claim_lock(&self, uid: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self
            .inflight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(uid.to_owned())
            .or_default()
            .clone();
        lock.lock_owned().await
    }

    /// Drops the per-claim locks nobody holds or waits for, so the map does not grow with
    /// every claim the node ever saw.
    fn forget_idle_locks(&self) {
        self.inflight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|_, lock| Arc::strong_count(lock) > 1);
    }

    async fn prepare_one(&self, wanted: &ClaimRef) -> Result<Vec<PreparedAnswer>> {
        let guard = self.claim_lock(&wanted.uid).await;
        let outcome = self.prepare_serialised(wanted).await;
        drop(guard);
        self.forget_idle_locks();
        outcome
    }

    async fn prepare_serialised(&self, wanted: &ClaimRef) -> Result<Vec<PreparedAnswer>> {
        let claim_error = |reason: String| Error::Claim {
            namespace: wanted.namespace.clone(),
            name: wanted.name.clone(),
            reason,
        };
        // Already prepared: answer from the checkpoint without touching the API or the node.
        {
            let mut state = self.state.lock().await;
            if let Some(done) = self.checkpoint(&mut state)?.claims.get(&wanted.uid) {
                tracing::debug!(claim = %wanted.name, "already prepared");
                return Ok(answer(done));
            }
        }
        // The API read happens outside the lock, so a slow apiserver never serialises pods.
        let claim = self
            .source
            .get(&wanted.namespace, &wanted.name)
            .await?
            .ok_or_else(|| claim_error("not found in the API".into()))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut prepared = resolve(&self.driver, wanted, &claim, now).map_err(claim_error)?;
        if let Some(devices) = &self.inventory {
            let current = devices.borrow();
            for d in &mut prepared.devices {
                d.published = current.iter().find(|c| c.name == d.device).cloned();
            }
        }
        if prepared.devices.is_empty() {
            tracing::warn!(claim = %wanted.name, namespace = %wanted.namespace,
                "no allocation result is for this driver; preparing with no devices");
        }

        // Addresses are allocated through the API outside the checkpoint lock, like the claim
        // read; the per-claim lock keeps a repeated prepare from allocating twice.
        let ipam = self.allocate(&prepared).await.map_err(claim_error)?;
        prepared.allocations = ipam
            .values()
            .flat_map(|a| a.allocations.iter().cloned())
            .collect();
        let allocations = prepared.allocations.clone();
        let outcome = self.commit(wanted, prepared, &ipam).await;
        let keep: Vec<Allocation> = match &outcome {
            Ok((_, recorded)) => recorded.clone(),
            Err(_) => Vec::new(),
        };
        let orphans: Vec<Allocation> = allocations
            .into_iter()
            .filter(|a| !keep.contains(a))
            .collect();
        if !orphans.is_empty()
            && let Some((book, _)) = self.ipam.get()
            && let Err(e) = crate::ipam::release(book.as_ref(), &orphans).await
        {
            tracing::warn!(claim = %wanted.name, error = %e,
                "could not release the addresses of a failed prepare; the controller collects them once the claim is gone");
        }
        outcome.map(|(answer, _)| answer)
    }

    /// Allocates the addresses of every device whose config asks for IPAM, interface by
    /// interface per network (the stable identity's `#N`). On error the ones already made are
    /// released, and the message says which request failed.
    async fn allocate(
        &self,
        prepared: &PreparedClaim,
    ) -> std::result::Result<IpamAddresses, String> {
        let requests = crate::plan::ipam_requests(prepared);
        let mut out = IpamAddresses::new();
        if requests.is_empty() {
            return Ok(out);
        }
        let Some((book, node)) = self.ipam.get() else {
            return Err(format!(
                "request {}: ipam.network: this driver runs without API access, so it cannot \
                 allocate from network {:?}",
                prepared.devices[requests[0].0].request, requests[0].1
            ));
        };
        let who = Requester {
            namespace: prepared.namespace.clone(),
            claim: prepared.name.clone(),
            uid: prepared.uid.clone(),
            pod: prepared.pod_name.clone(),
            node: node.clone(),
        };
        let mut interfaces: HashMap<&str, u32> = HashMap::new();
        let mut skip = BTreeSet::new();
        for (index, network) in &requests {
            let interface = interfaces.entry(network).or_insert(0);
            match crate::ipam::allocate(book.as_ref(), network, &who, *interface, &skip).await {
                Ok(addressing) => {
                    skip.extend(addressing.allocations.iter().map(|a| a.name.clone()));
                    out.insert(*index, addressing);
                    *interface += 1;
                }
                Err(e) => {
                    let made: Vec<Allocation> = out
                        .values()
                        .flat_map(|a| a.allocations.iter().cloned())
                        .collect();
                    if let Err(release) = crate::ipam::release(book.as_ref(), &made).await {
                        tracing::warn!(claim = %prepared.name, error = %release,
                            "could not release the addresses of a failed prepare");
                    }
                    let request = &prepared.devices[*index].request;
                    return Err(format!("request {request}: ipam.network: {e}"));
                }
            }
        }
        Ok(out)
    }

    /// The checkpoint half of prepare: device and name checks, plans, the durable write.
    /// Returns the answer and the allocations the checkpoint now records for the claim.
    async fn commit(
        &self,
        wanted: &ClaimRef,
        mut prepared: PreparedClaim,
        ipam: &IpamAddresses,
    ) -> Result<(Vec<PreparedAnswer>, Vec<Allocation>)> {
        let claim_error = |reason: String| Error::Claim {
            namespace: wanted.namespace.clone(),
            name: wanted.name.clone(),
            reason,
        };
        let mut state = self.state.lock().await;
        let checkpoint = self.checkpoint(&mut state)?;
        // A concurrent call for the same claim may have won the race while we read the API.
        if let Some(done) = checkpoint.claims.get(&wanted.uid) {
            return Ok((answer(done), done.allocations.clone()));
        }
        for device in &prepared.devices {
            let holder = checkpoint.claims.values().find(|other| {
                other.devices.iter().any(|d| {
                    d.pool == device.pool && d.device == device.device && d.share_id.is_none()
                })
            });
            if let Some(other) = holder {
                return Err(claim_error(format!(
                    "device {}/{} is still prepared for claim {}/{} (uid {}); it is released when \
                     that claim is unprepared",
                    device.pool, device.device, other.namespace, other.name, other.uid
                )));
            }
        }
        let taken: std::collections::BTreeSet<String> = checkpoint
            .claims
            .values()
            .filter(|c| c.pod_uid == prepared.pod_uid)
            .flat_map(|c| c.attachments.iter().map(|a| a.plan.pod_ifname.clone()))
            .collect();
        let plans =
            crate::plan::plans(&prepared, &taken, ipam).map_err(|e| claim_error(e.to_string()))?;
        prepared.attachments = plans
            .into_iter()
            .map(|plan| Attachment {
                plan,
                restore: None,
                netns: None,
                attached: false,
            })
            .collect();
        let mut next = checkpoint.clone();
        next.claims.insert(wanted.uid.clone(), prepared.clone());
        self.save(next.clone()).await?;
        state.checkpoint = Ok(next);
        self.changes.send_modify(|n| *n += 1);
        tracing::info!(claim = %wanted.name, namespace = %wanted.namespace, pod = %prepared.pod_name,
            devices = prepared.devices.len(), addresses = prepared.allocations.len(), "claim prepared");
        Ok((answer(&prepared), prepared.allocations))
    }

    async fn unprepare_one(&self, wanted: &ClaimRef) -> Result<()> {
        let guard = self.claim_lock(&wanted.uid).await;
        let outcome = self.unprepare_serialised(wanted).await;
        drop(guard);
        self.forget_idle_locks();
        outcome
    }

    async fn unprepare_serialised(&self, wanted: &ClaimRef) -> Result<()> {
        let allocations = {
            let mut state = self.state.lock().await;
            let checkpoint = self.checkpoint(&mut state)?;
            let Some(claim) = checkpoint.claims.get(&wanted.uid) else {
                tracing::debug!(claim = %wanted.name, "unprepare of a claim that is not prepared");
                return Ok(());
            };
            if claim.attachments.iter().any(|a| a.restore.is_some())
                && let Some(releaser) = self.releaser.get()
            {
                // The sandbox stop should have detached already; if it did not run (or failed),
                // the node is put back here, before the claim's memory is dropped.
                releaser.release(claim).await?;
            }
            claim.allocations.clone()
        };
        // Addresses are released from the checkpoint's record alone (the claim and even the
        // Network may be gone), outside the checkpoint lock, and before the claim is forgotten:
        // a failed release leaves the claim prepared, so the kubelet's retry releases again.
        if !allocations.is_empty() {
            let Some((book, _)) = self.ipam.get() else {
                return Err(Error::Claim {
                    namespace: wanted.namespace.clone(),
                    name: wanted.name.clone(),
                    reason: format!(
                        "holds {} IPAM address(es) but this driver runs without API access to \
                         release them",
                        allocations.len()
                    ),
                });
            };
            crate::ipam::release(book.as_ref(), &allocations)
                .await
                .map_err(|e| Error::Claim {
                    namespace: wanted.namespace.clone(),
                    name: wanted.name.clone(),
                    reason: format!("releasing its IPAM addresses: {e}"),
                })?;
        }
        let mut state = self.state.lock().await;
        let checkpoint = self.checkpoint(&mut state)?;
        if !checkpoint.claims.contains_key(&wanted.uid) {
            return Ok(());
        }
        let mut next = checkpoint.clone();
        next.claims.remove(&wanted.uid);
        self.save(next.clone()).await?;
        state.checkpoint = Ok(next);
        self.changes.send_modify(|n| *n += 1);
        tracing::info!(claim = %wanted.name, namespace = %wanted.namespace, "claim unprepared");
        Ok(())
    }

    fn checkpoint<'a>(&self, state: &'a mut State) -> Result<&'a Checkpoint> {
        if state.checkpoint.is_err() {
            // Re-read: the operator may have repaired or removed the file.
            state.checkpoint = self.store.load().map_err(|e| e.to_string());
        }
        state
            .checkpoint
            .as_ref()
            .map_err(|reason| Error::CheckpointUnreadable(reason.clone()))
    }

    async fn save(&self, next: Checkpoint) -> Result<()> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.save(&next))
            .await
            .map_err(|e| Error::io("checkpoint writer", std::io::Error::other(e)))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashMap as Map;
    use std::sync::Mutex as StdMutex;

    const DRIVER: &str = "knic.dev";

    /// A claim builder over the real JSON shape, so fixtures read like `kubectl get -o json`.
    struct ClaimBuilder(serde_json::Value);

    impl ClaimBuilder {
        fn new(name: &str, uid: &str) -> Self {
            ClaimBuilder(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "ns", "uid": uid},
                "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "knic.dev"}}]}},
            }))
        }
        fn allocated(mut self, results: &[(&str, &str, &str)]) -> Self {
            let results: Vec<_> = results
                .iter()
                .map(|(req, driver, dev)| json!({"request": req, "driver": driver, "pool": "node-a", "device": dev}))
                .collect();
            self.0["status"]["allocation"] = json!({"devices": {"results": results, "config": []}});
            self
        }
        fn config(mut self, source: &str, driver: &str, params: serde_json::Value) -> Self {
            self.0["status"]["allocation"]["devices"]["config"]
                .as_array_mut()
                .unwrap()
                .push(
                    json!({"source": source, "opaque": {"driver": driver, "parameters": params}}),
                );
            self
        }
        fn reserved_for(mut self, pods: &[(&str, &str)]) -> Self {
            self.0["status"]["reservedFor"] = pods
                .iter()
                .map(|(n, u)| json!({"resource": "pods", "name": n, "uid": u}))
                .collect();
            self
        }
        fn build(self) -> ResourceClaim {
            serde_json::from_value(self.0).unwrap()
        }
    }

    fn wanted(uid: &str) -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "claim".into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn resolve_keeps_only_this_drivers_results_and_orders_config() {
        let claim = ClaimBuilder::new("claim", "u1")
            .allocated(&[
                ("nic/fast", DRIVER, "pci-0000-03-00-0"),
                ("gpu", "gpu.example.com", "gpu-0"),
            ])
            .config("FromClaim", DRIVER, json!({"claim": 1}))
            .config("FromClass", "other.example.com", json!({"other": 1}))
            .config("FromClass", DRIVER, json!({"class": 1}))
            .reserved_for(&[("pod-a", "pod-uid-a")])
            .build();
        let p = resolve(DRIVER, &wanted("u1"), &claim, 5).unwrap();
        assert_eq!(p.pod_uid, "pod-uid-a");
        assert_eq!(p.pod_name, "pod-a");
        assert_eq!(p.devices.len(), 1);
        assert_eq!(p.devices[0].device, "pci-0000-03-00-0");
        let params: Vec<_> = p.configs.iter().map(|c| c.parameters.clone()).collect();
        assert_eq!(params, vec![json!({"class": 1}), json!({"claim": 1})]);
        let a = answer(&p);
        assert_eq!(
            a[0].request_names,
            vec!["nic".to_string()],
            "subrequest suffix stripped"
        );
    }

    #[test]
    fn resolve_rejections_name_the_field() {
        let unallocated = ClaimBuilder::new("claim", "u1").build();
        assert_eq!(
            resolve(DRIVER, &wanted("u1"), &unallocated, 0).unwrap_err(),
            "status.allocation is not set: the claim is not allocated"
        );
        let replaced = ClaimBuilder::new("claim", "u2").allocated(&[]).build();
        let err = resolve(DRIVER, &wanted("u1"), &replaced, 0).unwrap_err();
        assert!(
            err.starts_with("metadata.uid is \"u2\" but the kubelet asked for \"u1\""),
            "{err}"
        );
        let unreserved = ClaimBuilder::new("claim", "u1")
            .allocated(&[("nic", DRIVER, "d")])
            .build();
        assert!(
            resolve(DRIVER, &wanted("u1"), &unreserved, 0)
                .unwrap_err()
                .starts_with("status.reservedFor names no pod")
        );
        let shared = ClaimBuilder::new("claim", "u1")
            .allocated(&[("nic", DRIVER, "d")])
            .reserved_for(&[("a", "1"), ("b", "2")])
            .build();
        let err = resolve(DRIVER, &wanted("u1"), &shared, 0).unwrap_err();
        assert!(
            err.starts_with("status.reservedFor names 2 pods (a, b)"),
            "{err}"
        );
    }

    #[derive(Default)]
    struct MemClaims {
        claims: StdMutex<Map<String, ResourceClaim>>,
        gets: std::sync::atomic::AtomicUsize,
    }

    impl ClaimSource for Arc<MemClaims> {
        async fn get(&self, _ns: &str, name: &str) -> Result<Option<ResourceClaim>> {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(self.claims.lock().unwrap().get(name).cloned())
        }
    }

    /// The node's published devices, as the inventory would give them.
    fn devices() -> watch::Receiver<Vec<Device>> {
        let devices = ["dev-a", "dev-b"]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                serde_json::from_value(
                    json!({"name": name, "attributes": {"ifName": {"string": format!("eth{i}")}}}),
                )
                .unwrap()
            })
            .collect();
        watch::channel(devices).1
    }

    fn add(source: &Arc<MemClaims>, claim: ResourceClaim) {
        let name = claim.metadata.name.clone().unwrap();
        source.claims.lock().unwrap().insert(name, claim);
    }

    #[tokio::test]
    async fn prepare_is_idempotent_and_unprepare_needs_no_api() {
        let dir = tempfile::tempdir().unwrap();
        let source = Arc::new(MemClaims::default());
        add(
            &source,
            ClaimBuilder::new("claim", "u1")
                .allocated(&[("nic", DRIVER, "dev-a")])
                .reserved_for(&[("p", "pu")])
                .build(),
        );
        let preparer = Preparer::with_devices(
            DRIVER,
            source.clone(),
            CheckpointStore::new(dir.path()),
            devices(),
        );
        let first = preparer
            .prepare(&[wanted("u1")])
            .await
            .remove("u1")
            .unwrap()
            .unwrap();
        let again = preparer
            .prepare(&[wanted("u1")])
            .await
            .remove("u1")
            .unwrap()
            .unwrap();
        assert_eq!(first, again);
        assert_eq!(
            source.gets.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "repeat must not re-read the API"
        );

        // A fresh process sees the same state from disk.
        let reloaded = Preparer::new(DRIVER, source.clone(), CheckpointStore::new(dir.path()));
        assert!(reloaded.prepared().await.unwrap().claims.contains_key("u1"));
        source.claims.lock().unwrap().clear();
        reloaded
            .unprepare(&[wanted("u1")])
            .await
            .remove("u1")
            .unwrap()
            .unwrap();
        assert!(reloaded.prepared().await.unwrap().claims.is_empty());
        reloaded
            .unprepare(&[wanted("never")])
            .await
            .remove("never")
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_device_prepared_for_one_claim_is_refused_to_another() {
        let dir = tempfile::tempdir().unwrap();
        let source = Arc::new(MemClaims::default());
        let mut other = ClaimBuilder::new("other", "u2")
            .allocated(&[("nic", DRIVER, "dev-a")])
            .reserved_for(&[("q", "qu")]);
        other.0["metadata"]["name"] = json!("other");
        add(
            &source,
            ClaimBuilder::new("claim", "u1")
                .allocated(&[("nic", DRIVER, "dev-a")])
                .reserved_for(&[("p", "pu")])
                .build(),
        );
        add(&source, other.build());
        let preparer =
            Preparer::with_devices(DRIVER, source, CheckpointStore::new(dir.path()), devices());
        preparer
            .prepare(&[wanted("u1")])
            .await
            .remove("u1")
            .unwrap()
            .unwrap();
        let second = ClaimRef {
            namespace: "ns".into(),
            name: "other".into(),
            uid: "u2".into(),
        };
        let err = preparer
            .prepare(&[second])
            .await
            .remove("u2")
            .unwrap()
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "ResourceClaim ns/other: device node-a/dev-a is still prepared for claim ns/claim (uid \
             u1); it is released when that claim is unprepared"
        );
    }

    fn ipam_claim(name: &str, uid: &str, device: &str) -> ResourceClaim {
        let mut b = ClaimBuilder::new(name, uid)
            .allocated(&[("nic", DRIVER, device)])
            .config(
                "FromClaim",
                DRIVER,
                json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig", "ipam": {"network": "blue"}}),
            )
            .reserved_for(&[(&format!("{name}-pod"), &format!("{uid}-pod"))]);
        b.0["metadata"]["name"] = json!(name);
        b.build()
    }

    fn claim_ref(name: &str, uid: &str) -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    #[tokio::test]
    async fn ipam_addresses_are_planned_checkpointed_and_released_by_unprepare() {
        let dir = tempfile::tempdir().unwrap();
        let source = Arc::new(MemClaims::default());
        add(&source, ipam_claim("a", "ua", "dev-a"));
        add(&source, ipam_claim("b", "ub", "dev-b"));
        add(&source, ipam_claim("c", "uc", "dev-a"));
        let book = Arc::new(crate::ipam::memory::MemBook::default());
        // A /30 has two usable addresses.
        book.add_network(
            "blue",
            json!({"devices": {"deviceClassName": "knic.dev"}, "namespaces": {"names": ["ns"]},
                   "ipam": {"subnets": [{"cidr": "192.0.2.0/30"}]}}),
        );
        let preparer =
            Preparer::with_devices(DRIVER, source, CheckpointStore::new(dir.path()), devices());
        preparer.set_address_book(book.clone(), "node-a");
        let out = preparer
            .prepare(&[claim_ref("a", "ua"), claim_ref("a", "ua")])
            .await;
        out["ua"].as_ref().unwrap();
        let prepared = preparer.claim("ua").await.unwrap().unwrap();
        assert_eq!(
            prepared.allocations.len(),
            1,
            "a repeated prepare allocates once"
        );
        let address = prepared.allocations[0].address;
        assert_eq!(prepared.attachments[0].plan.addresses, [address]);
        assert_eq!(book.addresses(), [address.to_string()]);

        preparer.prepare(&[claim_ref("b", "ub")]).await["ub"]
            .as_ref()
            .unwrap();
        // The subnet is full now, and "c" also wants a device "a" holds: the exhaustion text
        // is the claim's error, and nothing stays allocated for it.
        let err = preparer.prepare(&[claim_ref("c", "uc")]).await["uc"]
            .as_ref()
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "ResourceClaim ns/c: request nic: ipam.network: network blue: subnet 192.0.2.0/30 \
             has no free address (2 in use of 2)"
        );
        preparer
            .unprepare(&[claim_ref("b", "ub")])
            .await
            .remove("ub")
            .unwrap()
            .unwrap();
        assert_eq!(book.addresses(), [address.to_string()]);
        // Now an address is free but the device is busy: the allocation made for the failed
        // prepare is released again.
        let err = preparer.prepare(&[claim_ref("c", "uc")]).await["uc"]
            .as_ref()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("device node-a/dev-a is still prepared"),
            "{err}"
        );
        assert_eq!(book.addresses(), [address.to_string()]);

        // A fresh process releases from the checkpoint alone.
        let reloaded = Preparer::new(
            DRIVER,
            Arc::new(MemClaims::default()),
            CheckpointStore::new(dir.path()),
        );
        reloaded.set_address_book(book.clone(), "node-a");
        reloaded
            .unprepare(&[claim_ref("a", "ua")])
            .await
            .remove("ua")
            .unwrap()
            .unwrap();
        assert!(book.addresses().is_empty());
        assert!(reloaded.prepared().await.unwrap().claims.is_empty());
    }

    #[tokio::test]
    async fn ipam_without_an_address_book_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let source = Arc::new(MemClaims::default());
        add(&source, ipam_claim("a", "ua", "dev-a"));
        let preparer =
            Preparer::with_devices(DRIVER, source, CheckpointStore::new(dir.path()), devices());
        let err = preparer.prepare(&[claim_ref("a", "ua")]).await["ua"]
            .as_ref()
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "ResourceClaim ns/a: request nic: ipam.network: this driver runs without API access, \
             so it cannot allocate from network \"blue\""
        );
    }

    #[tokio::test]
    async fn corrupt_checkpoint_refuses_work_until_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        std::fs::write(store.path(), b"{\"version\":1,\"crc32\":\"00").unwrap();
        let source = Arc::new(MemClaims::default());
        add(
            &source,
            ClaimBuilder::new("claim", "u1")
                .allocated(&[("nic", DRIVER, "dev-a")])
                .reserved_for(&[("p", "pu")])
                .build(),
        );
        let preparer = Preparer::with_devices(DRIVER, source, store.clone(), devices());
        let err = preparer
            .unprepare(&[wanted("u1")])
            .await
            .remove("u1")
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(err.contains("is corrupt: the file is truncated"), "{err}");
        let err = preparer
            .prepare(&[wanted("u1")])
            .await
            .remove("u1")
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("prepare/unprepare are refused until it is repaired or removed"),
            "{err}"
        );
        assert!(
            store.path().exists(),
            "the corrupt file is kept for the operator"
        );
        // The operator removes it: the next call works without a restart.
        std::fs::remove_file(store.path()).unwrap();
        preparer
            .prepare(&[wanted("u1")])
            .await
            .remove("u1")
            .unwrap()
            .unwrap();
    }
}
