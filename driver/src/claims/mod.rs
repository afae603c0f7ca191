//! Preparing and unpreparing ResourceClaims: the logic behind the kubelet's two DRA calls.
//!
//! The split follows the dra-example-driver: [`resolve`] is a pure function from a claim object
//! to what this driver must remember about it; [`Preparer`] is the one place that decides
//! "already prepared", "device busy" and "forget", recording its decisions in the
//! [`ClaimStore`] that attach/detach update too. Kubernetes is reached only through
//! [`ClaimSource`] (the prepare path alone reads claims), so the same code runs against the real
//! API, the e2e fake API and in-memory test doubles.
//!
//! Claims whose config says `ipam: {network}` get their addresses here, at prepare time, from
//! [`crate::claims::ipam`] (see there for why the driver allocates): the API calls happen before the
//! checkpoint lock is taken, the pure [`crate::claims::plan::plans`] receives the addresses, and the
//! allocations are checkpointed with the claim so unprepare releases them before forgetting it.
//! Prepare and unprepare of one claim are serialised by a per-claim lock, so a repeated prepare
//! racing itself never allocates twice or releases what the other recorded.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::resource::v1::{Device, ResourceClaim};
use tokio::sync::{Mutex, watch};

pub(crate) mod answer;
pub mod budget;
pub mod checkpoint;
pub mod functions;
mod hooks;
pub mod ipam;
pub mod orphans;
pub mod plan;
mod store;

pub use store::{Change, ClaimStore, Locked, Retired};

use crate::BoxFuture;
use crate::cdi::CdiSpecs;
use crate::claims::checkpoint::{
    Attachment, Checkpoint, OpaqueConfig, PreparedClaim, PreparedDevice, shares_clash,
};
use crate::claims::ipam::{AddressBook, Allocation, Requester};
use crate::claims::plan::{DeviceConfigs, IpamAddresses};
use crate::error::{Error, Result};
use crate::sriov::vfio::Vfio;
use crate::sriov::writes::LiveWrites;
pub use answer::answer;
use answer::{answer_with_cdi, check_results};
pub use hooks::RUNTIME_HOOKS_WAIT;
use hooks::RuntimeHooks;

/// Where ResourceClaims come from. A trait so tests and the demo can run without an apiserver.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim, or `None` when it does not exist.
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>>>;
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
    /// The CDI devices whose hook checks the device's interface at container creation (see
    /// [`crate::cdi`]); empty without CDI or for a device that is not attached.
    pub cdi_device_ids: Vec<String>,
}

/// Computes what must be remembered about `claim` for `driver`, or why it cannot be prepared.
/// Pure: no I/O, no clock, so every rule is unit-testable.
pub fn resolve(
    driver: &str,
    wanted: &ClaimRef,
    claim: &ResourceClaim,
    now: u64,
) -> Result<PreparedClaim> {
    let refuse = |reason: String| Error::Claim {
        namespace: wanted.namespace.clone(),
        name: wanted.name.clone(),
        reason,
    };
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if uid != wanted.uid {
        return Err(refuse(format!(
            "metadata.uid is {uid:?} but the kubelet asked for {:?}: the claim was deleted and \
             recreated, refusing to prepare the replacement",
            wanted.uid
        )));
    }
    let status = claim.status.as_ref();
    let allocation = status
        .and_then(|s| s.allocation.as_ref())
        .ok_or_else(|| refuse("status.allocation is not set: the claim is not allocated".into()))?;
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
            consumed: r
                .consumed_capacity
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect(),
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
            return Err(refuse(
                "status.reservedFor names no pod: the claim is not reserved for a consumer yet"
                    .into(),
            ));
        }
        [pod] => *pod,
        many => {
            let names: Vec<_> = many.iter().map(|p| p.name.as_str()).collect();
            return Err(refuse(format!(
                "status.reservedFor names {} pods ({}): a knic device is given to one pod at a \
                 time, so a shared claim cannot be prepared",
                many.len(),
                names.join(", ")
            )));
        }
    };
    Ok(PreparedClaim {
        network_label: claim
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(knic_proto::network::NETWORK_LABEL))
            .cloned(),
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
        functions: Vec::new(),
    })
}

/// Puts a claim's devices back on the host before the claim is forgotten, for the case the
/// sandbox stop never ran or failed: the pod-network layer, absent when only the kubelet plugin
/// runs. Called with the [`ClaimStore`] locked (unprepare must not interleave with an attach),
/// so it must not call the store at all, not even to read: tokio's mutex is not re-entrant and
/// the call would hang unprepare and every NRI hook.
pub trait Release: Send + Sync + 'static {
    /// Puts back every device of `claim` that may still be away from the host; `checkpoint`
    /// is the store's current content (the claim still in it), for what other claims hold.
    fn release<'a>(
        &'a self,
        claim: &'a PreparedClaim,
        checkpoint: &'a Checkpoint,
    ) -> BoxFuture<'a, Result<()>>;
}

/// Decides prepare and unprepare, serialised per claim, and records them in the store.
pub struct Preparer {
    driver: String,
    source: Arc<dyn ClaimSource>,
    claims: Arc<ClaimStore>,
    /// The node's current devices, to snapshot what a prepared device looked like.
    inventory: Option<watch::Receiver<Vec<Device>>>,
    /// This node's pool; results naming another are refused.
    pool: Option<String>,
    /// Where the CDI specs of prepared claims go (fail-closed at container creation).
    cdi: Option<CdiSpecs>,
    /// Whether knic is registered with the runtime's NRI, and its socket; prepare waits for
    /// it, then refuses (fail-closed before the sandbox exists).
    runtime_hooks: Option<RuntimeHooks>,
    release: Option<Arc<dyn Release>>,
    /// Where IPAM allocations are made and this node's name; unset (demo, tests) means claims
    /// with `ipam` cannot be prepared.
    ipam: Option<(Arc<dyn AddressBook>, String)>,
    /// Where vfio-pci functions are bound and RDMA devices found (the host's `/sys` unless
    /// [`Preparer::with_pci`] says otherwise).
    pci: Vfio,
    /// The shared ports' policy, whose bandwidth prepare keeps (`None`: nothing is shared).
    sharing: Option<Arc<crate::sharing::Sharing>>,
    /// One lock per claim UID with a prepare or unprepare in flight.
    inflight: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

impl Preparer {
    /// A preparer recording in `claims`; the `with_*` methods add what the node has.
    pub fn new(
        driver: impl Into<String>,
        source: Arc<dyn ClaimSource>,
        claims: Arc<ClaimStore>,
    ) -> Self {
        Preparer {
            driver: driver.into(),
            source,
            claims,
            inventory: None,
            pool: None,
            cdi: None,
            runtime_hooks: None,
            release: None,
            ipam: None,
            pci: Vfio::new("/", Arc::new(LiveWrites)),
            sharing: None,
            inflight: std::sync::Mutex::default(),
        }
    }

    /// Records each prepared device's published form from `devices` (the node's current
    /// ResourceSlice devices), so it stays published while it is in a pod.
    pub fn with_devices(mut self, devices: watch::Receiver<Vec<Device>>) -> Self {
        self.inventory = Some(devices);
        self
    }

    /// Only results in `pool` (this node's pool, named after the node) are prepared.
    pub fn with_pool(mut self, pool: impl Into<String>) -> Self {
        self.pool = Some(pool.into());
        self
    }

    /// Every prepared claim gets a CDI spec in `specs` whose hook checks its interfaces at
    /// container creation, and the answer names its devices.
    pub fn with_cdi(mut self, specs: CdiSpecs) -> Self {
        self.cdi = Some(specs);
        self
    }

    /// New claims are refused while `connected` is false (knic not registered with the NRI
    /// socket `socket`), once a prepare call has waited [`RUNTIME_HOOKS_WAIT`] for it.
    pub fn with_runtime_hooks(
        mut self,
        connected: watch::Receiver<bool>,
        socket: impl Into<String>,
    ) -> Self {
        self.runtime_hooks = Some(RuntimeHooks::new(connected, socket));
        self
    }

    /// How long a prepare call waits for the runtime's registration (tests shorten it).
    pub fn waiting_for_runtime_hooks(mut self, wait: Duration) -> Self {
        if let Some(hooks) = &mut self.runtime_hooks {
            hooks.wait = wait;
        }
        self
    }

    /// The answer for a prepared claim, with its CDI spec (re)written first: a crash between
    /// the checkpoint and the spec is repaired by the kubelet's retry.
    fn answered(&self, claim: &PreparedClaim) -> Result<Vec<PreparedAnswer>> {
        if let Some(specs) = &self.cdi {
            specs.write(claim, None)?;
        }
        Ok(self.answer_of(claim))
    }

    /// Unprepare puts devices still in a pod back through `release` before forgetting them.
    pub fn with_release(mut self, release: Arc<dyn Release>) -> Self {
        self.release = Some(release);
        self
    }

    /// IPAM allocates through `book`, recording `node` on every allocation.
    pub fn with_address_book(
        mut self,
        book: Arc<dyn AddressBook>,
        node: impl Into<String>,
    ) -> Self {
        self.ipam = Some((book, node.into()));
        self
    }

    /// Keeps the bandwidth of shared ports at prepare (see [`budget`]).
    pub fn with_sharing(mut self, sharing: Arc<crate::sharing::Sharing>) -> Self {
        self.sharing = Some(sharing);
        self
    }

    /// vfio-pci binding and RDMA discovery go through `pci` (its sysfs root and writer).
    pub fn with_pci(mut self, pci: Vfio) -> Self {
        self.pci = pci;
        self
    }

    /// The store this preparer records in.
    pub fn claims(&self) -> &Arc<ClaimStore> {
        &self.claims
    }

    /// Prepares every claim; each gets its own outcome, so one bad claim never hides the others.
    /// The wait for the runtime's registration is one for the whole call, so a call of many
    /// claims still answers within the kubelet's deadline.
    pub async fn prepare(
        &self,
        claims: &[ClaimRef],
    ) -> HashMap<String, Result<Vec<PreparedAnswer>>> {
        let wait = self
            .runtime_hooks
            .as_ref()
            .map_or(Duration::ZERO, |h| h.wait);
        let deadline = tokio::time::Instant::now() + wait;
        let mut out = HashMap::new();
        for claim in claims {
            out.insert(claim.uid.clone(), self.prepare_one(claim, deadline).await);
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

    async fn prepare_one(
        &self,
        wanted: &ClaimRef,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<PreparedAnswer>> {
        let guard = self.claim_lock(&wanted.uid).await;
        let outcome = self.prepare_serialised(wanted, deadline).await;
        drop(guard);
        self.forget_idle_locks();
        outcome
    }

    async fn prepare_serialised(
        &self,
        wanted: &ClaimRef,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<PreparedAnswer>> {
        let claim_error = |reason: String| Error::Claim {
            namespace: wanted.namespace.clone(),
            name: wanted.name.clone(),
            reason,
        };
        // Already prepared: answer from the checkpoint without touching the API or the node.
        if let Some(done) = self.claims.claim(&wanted.uid).await? {
            tracing::debug!(claim = %wanted.name, "already prepared");
            // A crash between the record and the bind: the retry finishes the bind.
            functions::bind_all(&self.pci, &done.functions)
                .await
                .map_err(|e| claim_error(e.to_string()))?;
            return self.answered(&done);
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
        let mut prepared = resolve(&self.driver, wanted, &claim, now)?;
        if let Some(devices) = &self.inventory {
            let current = devices.borrow();
            for d in &mut prepared.devices {
                d.published = current.iter().find(|c| c.name == d.device).cloned();
            }
        }
        check_results(
            wanted,
            &prepared,
            self.pool.as_deref(),
            self.inventory.is_some(),
        )?;
        if let Some(hooks) = &self.runtime_hooks
            && !prepared.devices.is_empty()
            && !hooks.registered(wanted, deadline).await
        {
            return Err(Error::RuntimeHooksDown {
                socket: hooks.socket.clone(),
            });
        }
        if prepared.devices.is_empty() {
            tracing::warn!(claim = %wanted.name, namespace = %wanted.namespace,
                "no allocation result is for this driver; preparing with no devices");
        }

        // Addresses are allocated through the API outside the checkpoint lock, like the claim
        // read; the per-claim lock keeps a repeated prepare from allocating twice.
        // Each device's config is parsed and validated once, for IPAM and the plans alike.
        let configs = crate::claims::plan::configure(&prepared);
        let ipam = self.allocate(&prepared, &configs).await?;
        prepared.allocations = ipam
            .values()
            .flat_map(|a| a.allocations.iter().cloned())
            .collect();
        let allocations = prepared.allocations.clone();
        let pod_claim_name = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::cdi::metadata::POD_CLAIM_NAME_ANNOTATION))
            .cloned();
        let outcome = self
            .commit(wanted, prepared, &configs, &ipam, pod_claim_name.as_deref())
            .await;
        let keep: Vec<Allocation> = match &outcome {
            Ok((_, recorded)) => recorded.clone(),
            Err(_) => Vec::new(),
        };
        let orphans: Vec<Allocation> = allocations
            .into_iter()
            .filter(|a| !keep.contains(a))
            .collect();
        if !orphans.is_empty()
            && let Some((book, _)) = &self.ipam
            && let Err(e) = crate::claims::ipam::release(book.as_ref(), &orphans).await
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
        configs: &DeviceConfigs,
    ) -> Result<IpamAddresses> {
        let refuse = |reason: String| Error::Claim {
            namespace: prepared.namespace.clone(),
            name: prepared.name.clone(),
            reason,
        };
        let requests = crate::claims::plan::ipam_requests(configs);
        let mut out = IpamAddresses::new();
        if requests.is_empty() {
            return Ok(out);
        }
        let Some((book, node)) = &self.ipam else {
            return Err(refuse(format!(
                "request {}: ipam.network: this driver runs without API access, so it cannot \
                 allocate from network {:?}",
                prepared.devices[requests[0].0].request, requests[0].1
            )));
        };
        let who = Requester {
            namespace: prepared.namespace.clone(),
            claim: prepared.name.clone(),
            uid: prepared.uid.clone(),
            pod: prepared.pod_name.clone(),
            node: node.clone(),
            vtep: None,
        };
        let mut interfaces: HashMap<&str, u32> = HashMap::new();
        let mut skip = BTreeSet::new();
        for (index, network) in &requests {
            let interface = interfaces.entry(network).or_insert(0);
            // On the node's overlay device the allocation announces the interface's VTEP.
            let who = Requester {
                vtep: crate::claims::plan::overlay::vtep(&prepared.devices[*index]),
                ..who.clone()
            };
            match crate::claims::ipam::allocate(book.as_ref(), network, &who, *interface, &skip)
                .await
            {
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
                    if let Err(release) = crate::claims::ipam::release(book.as_ref(), &made).await {
                        tracing::warn!(claim = %prepared.name, error = %release,
                            "could not release the addresses of a failed prepare");
                    }
                    let request = &prepared.devices[*index].request;
                    return Err(refuse(format!("request {request}: ipam.network: {e}")));
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
        configs: &DeviceConfigs,
        ipam: &IpamAddresses,
        pod_claim_name: Option<&str>,
    ) -> Result<(Vec<PreparedAnswer>, Vec<Allocation>)> {
        let claim_error = |reason: String| Error::Claim {
            namespace: wanted.namespace.clone(),
            name: wanted.name.clone(),
            reason,
        };
        let mut locked = self.claims.lock().await;
        // With the claims other prepares have queued for the next write: any of them may be
        // on disk before this one.
        let checkpoint = &locked.with_queued()?;
        // A concurrent call for the same claim may have won the race while we read the API.
        if let Some(done) = checkpoint.claims.get(&wanted.uid) {
            // The winner wrote the spec; a failure here must not release addresses the
            // recorded claim may share with this attempt (IPAM reuses the claim's objects).
            return Ok((self.answer_of(done), done.allocations.clone()));
        }
        for device in &prepared.devices {
            // By device alone: the pool string is the claim's to get wrong. The same rule the
            // checkpoint enforces when it loads: shares of one device with distinct shareIDs
            // coexist, anything else is a second owner.
            let holder = checkpoint.claims.values().find_map(|other| {
                other
                    .devices
                    .iter()
                    .find(|d| {
                        d.device == device.device
                            && shares_clash(d.share_id.as_deref(), device.share_id.as_deref())
                    })
                    .map(|d| (other, d))
            });
            if let Some((other, theirs)) = holder {
                let what = match (&device.share_id, &theirs.share_id) {
                    (Some(mine), Some(_)) => format!(" with the same shareID {mine}"),
                    (None, Some(_)) => " as a share (this allocation is not)".to_owned(),
                    (Some(_), None) => " whole (this allocation is a share)".to_owned(),
                    (None, None) => String::new(),
                };
                return Err(claim_error(format!(
                    "device {}/{} is still prepared{what} for claim {}/{} (uid {}); it is \
                     released when that claim is unprepared",
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
        let plans = crate::claims::plan::plans(&prepared, configs, &taken, ipam)
            .map_err(|e| claim_error(e.to_string()))?;
        let pod_plans: Vec<&crate::netns::AttachPlan> = checkpoint
            .claims
            .values()
            .filter(|c| c.pod_uid == prepared.pod_uid && c.uid != prepared.uid)
            .flat_map(|c| c.attachments.iter().map(|a| &a.plan))
            .collect();
        let clashes = crate::claims::plan::routing::pod_clashes(&plans, &pod_plans);
        if !clashes.is_empty() {
            return Err(claim_error(
                knic_proto::netconfig::ConfigErrors(clashes).to_string(),
            ));
        }
        prepared.attachments = plans.into_iter().map(Attachment::planned).collect();
        prepared.functions = functions::functions(&prepared, configs, &self.pci)
            .map_err(|e| claim_error(e.to_string()))?;
        if let Some(sharing) = &self.sharing {
            budget::keep(&mut prepared, checkpoint, |d| {
                d.published.as_ref().and_then(|p| sharing.bandwidth_of(p))
            })
            .map_err(claim_error)?;
        }
        // The spec goes first: a spec without its claim only holds back containers of a pod
        // that has no claim yet, while a failed write after the save would fail prepare with
        // the claim (and its addresses) recorded.
        if let Some(specs) = &self.cdi {
            specs.write(&prepared, pod_claim_name)?;
        }
        if prepared.functions.iter().all(|f| f.vfio.is_none()) {
            // Nothing to bind under the lock: the write is shared with prepares at once.
            locked.add(prepared.clone()).await?;
        } else {
            let mut next = locked.checkpoint()?.clone();
            next.claims.insert(wanted.uid.clone(), prepared.clone());
            locked.save(next, true).await?;
            // Recorded first: a crash from here on leaves what unprepare needs to give them
            // back.
            if let Err(e) = functions::bind_all(&self.pci, &prepared.functions).await {
                return Err(self.undo_bind(&mut locked, &prepared, e).await);
            }
        }
        tracing::info!(claim = %wanted.name, namespace = %wanted.namespace, pod = %prepared.pod_name,
            devices = prepared.devices.len(), addresses = prepared.allocations.len(), "claim prepared");
        Ok((self.answer_of(&prepared), prepared.allocations))
    }

    /// The answer for a recorded claim, naming its CDI devices when specs are written (the
    /// spec itself is written by the caller, before or after the record as its path needs).
    fn answer_of(&self, claim: &PreparedClaim) -> Vec<PreparedAnswer> {
        match &self.cdi {
            Some(specs) => answer_with_cdi(
                claim,
                &specs
                    .metadata()
                    .map(|m| m.present(claim))
                    .unwrap_or_default(),
            ),
            None => answer(claim),
        }
    }

    /// A failed bind: gives every function back and forgets the claim, or, when a function
    /// cannot be given back, keeps the record so unprepare (or a retried prepare) finishes.
    async fn undo_bind(
        &self,
        locked: &mut Locked<'_>,
        prepared: &PreparedClaim,
        failure: Error,
    ) -> Error {
        let claim_error = |reason: String| Error::Claim {
            namespace: prepared.namespace.clone(),
            name: prepared.name.clone(),
            reason,
        };
        if let Err(restore) = functions::restore_all(&self.pci, &prepared.functions).await {
            return claim_error(format!(
                "{failure}; giving the functions back failed too, so the claim stays recorded \
                 for unprepare to retry: {restore}"
            ));
        }
        let forget = async {
            let mut next = locked.checkpoint()?.clone();
            next.claims.remove(&prepared.uid);
            locked.save(next, true).await?;
            if let Some(specs) = &self.cdi {
                specs.remove(&prepared.uid)?;
            }
            Ok::<(), Error>(())
        };
        if let Err(e) = forget.await {
            tracing::warn!(claim = %prepared.name, error = %e, "could not forget a claim whose bind failed; unprepare forgets it");
        }
        claim_error(failure.to_string())
    }

    async fn unprepare_one(&self, wanted: &ClaimRef) -> Result<()> {
        let guard = self.claim_lock(&wanted.uid).await;
        let outcome = self.unprepare_serialised(wanted).await;
        drop(guard);
        self.forget_idle_locks();
        outcome
    }

    async fn unprepare_serialised(&self, wanted: &ClaimRef) -> Result<()> {
        let (allocations, pci_functions) = {
            let mut locked = self.claims.lock().await;
            let checkpoint = locked.checkpoint()?;
            let Some(claim) = checkpoint.claims.get(&wanted.uid) else {
                tracing::debug!(claim = %wanted.name, "unprepare of a claim that is not prepared");
                // A crash after the claim was forgotten may have left its spec.
                if let Some(specs) = &self.cdi {
                    specs.remove(&wanted.uid)?;
                }
                return Ok(());
            };
            if claim.attachments.iter().any(|a| a.restore.is_some())
                && let Some(releaser) = &self.release
            {
                // The sandbox stop should have detached already; if it did not run (or failed),
                // the node is put back here, before the claim's memory is dropped.
                releaser.release(claim, checkpoint).await?;
            }
            (claim.allocations.clone(), claim.functions.clone())
        };
        // vfio-pci functions go back to their drivers before the claim (and its record of
        // those drivers) is forgotten; a failure keeps the claim for the kubelet's retry.
        functions::restore_all(&self.pci, &pci_functions)
            .await
            .map_err(|e| Error::Claim {
                namespace: wanted.namespace.clone(),
                name: wanted.name.clone(),
                reason: format!("giving its PCI functions back: {e}"),
            })?;
        // Addresses are released (or held for their stable identity, which needs the Network's
        // grace period: a Network that is gone holds nothing) from the checkpoint's record
        // (the claim may be gone), outside the checkpoint lock, and before the claim is forgotten:
        // a failed release leaves the claim prepared, so the kubelet's retry releases again.
        if !allocations.is_empty() {
            let Some((book, _)) = &self.ipam else {
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
            crate::claims::ipam::release_or_hold(book.as_ref(), &wanted.uid, &allocations)
                .await
                .map_err(|e| Error::Claim {
                    namespace: wanted.namespace.clone(),
                    name: wanted.name.clone(),
                    reason: format!("releasing its IPAM addresses: {e}"),
                })?;
        }
        let mut locked = self.claims.lock().await;
        let checkpoint = locked.checkpoint()?;
        if !checkpoint.claims.contains_key(&wanted.uid) {
            return Ok(());
        }
        let mut next = checkpoint.clone();
        next.claims.remove(&wanted.uid);
        locked.save(next, true).await?;
        if let Some(specs) = &self.cdi {
            // After the claim is forgotten: a spec without a claim only blocks containers of a
            // pod that is gone, a claim without its spec would let them start bare.
            specs.remove(&wanted.uid)?;
        }
        tracing::info!(claim = %wanted.name, namespace = %wanted.namespace, "claim unprepared");
        Ok(())
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod vfio_tests;
