//! Pod networks: what happens when the runtime creates, stops and removes a pod sandbox.
//!
//! The NRI hooks land here. Attach ([`attach`]) executes the plans made at prepare time,
//! recording the host state of all the pod's devices in one durable checkpoint write *before*
//! the first change, so a crash at any step leaves enough to put the node back; a failing
//! attach undoes everything this hook did and fails the sandbox (the runtime tears it down and
//! the kubelet retries). Detach puts devices back and forgets their records in one write per
//! pod. Synchronize
//! after a (re)connect converges: devices of running pods are (re)attached, devices of pods that
//! are gone are returned. The claim status write happens after the hook has answered.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::BoxFuture;
use crate::claims::checkpoint::{Checkpoint, PreparedClaim};
use crate::claims::{Change, ClaimStore, Release};
use crate::error::{Error, Result};
use crate::events::{EventSink, NoEvents, PodRef, Warning};
use crate::metrics::metrics;
use crate::netns::{self, Kernel, Ns};
use crate::nri::{NriHandler, PodSandbox};
use crate::sriov::rdma::{KernelRdma, NetnsMode, RdmaNamespaces, no_rdma_core};

mod attach;
pub mod dhcp;
pub mod update;
mod uplinks;

/// One device's line in a claim's `status.devices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceStatus {
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// `Ready` condition status.
    pub ready: bool,
    /// Condition reason (CamelCase, required by the apiserver).
    pub reason: String,
    /// Condition message.
    pub message: String,
    /// Interface name in the pod.
    pub interface_name: Option<String>,
    /// Addresses in CIDR interface form.
    pub ips: Vec<String>,
    /// MAC in the pod (or, for a function without a netdev, as published).
    pub hardware_address: Option<String>,
    /// Device data for the status's `data` (PCI address, VFIO group, RDMA devices, mode): what
    /// a VM or DPDK user needs to find the function.
    pub data: Option<serde_json::Value>,
    /// The `NetworkUpdated` condition, once a live update of the device's Network ran.
    pub updated: Option<update::Updated>,
}

/// The status `data` of an attached device: its PCI function's (address, mode, RDMA devices)
/// and the egress limit the kernel enforces, `bandwidth: {egress: "<bit/s>"}` (whole bytes
/// per second, so a rate that is not a multiple of 8 shows rounded down), so a pod's owner
/// can see the limit that was really set, whether it came from the config or the allocation.
pub fn attached_data(claim: &PreparedClaim, plan: &netns::AttachPlan) -> Option<serde_json::Value> {
    let mut data = claim
        .functions
        .iter()
        .find(|f| f.device == plan.device)
        .map(crate::claims::functions::PciFunction::status_data);
    if let Some(bandwidth) = &plan.bandwidth {
        let egress = netns::tbf::enforced_egress(bandwidth).to_string();
        data.get_or_insert_with(|| serde_json::json!({}))["bandwidth"] =
            serde_json::json!({ "egress": egress });
    }
    data
}

/// Where claim status goes: the API in production, a recorder in tests.
pub trait StatusSink: Send + Sync + 'static {
    /// Writes the whole set of this driver's entries for the claim (server-side apply removes
    /// what the same manager omits, so partial writes would erase earlier fields).
    fn write<'a>(
        &'a self,
        claim: &'a PreparedClaim,
        devices: &'a [DeviceStatus],
    ) -> BoxFuture<'a, Result<()>>;
}

/// Logs instead of writing (the demo, or a driver without API access).
pub struct LogStatus;

impl StatusSink for LogStatus {
    fn write<'a>(
        &'a self,
        claim: &'a PreparedClaim,
        devices: &'a [DeviceStatus],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            for d in devices {
                tracing::info!(claim = %claim.name, device = %d.device, ready = d.ready, reason = %d.reason, "claim status");
            }
            Ok(())
        })
    }
}

/// The runtime-hook side of the driver: attach and detach, recorded in the claim store.
pub struct PodNetworks<K> {
    kernel: K,
    claims: Arc<ClaimStore>,
    status: Arc<dyn StatusSink>,
    /// Pod UID → netns path, cached from RunPodSandbox/Synchronize (Remove carries none).
    netns: Mutex<HashMap<String, PathBuf>>,
    /// Where RDMA devices change namespace in exclusive mode, and the host's namespace to
    /// bring them back to.
    rdma: std::sync::Mutex<(Arc<dyn RdmaNamespaces>, PathBuf)>,
    /// Serialises "record an attachment, then ensure its shared host VLAN" against "see that
    /// nothing records a host VLAN, then delete it", so a pod's child never loses its uplink
    /// to another pod's detach. Taken only for plans with an uplink.
    uplinks: Mutex<()>,
    /// Where attach failures are reported as Events.
    events: std::sync::Mutex<Arc<dyn EventSink>>,
    /// Woken after pods joined overlay segments, so the node's forwarding entries for a new
    /// segment are written at once, not at the sync loop's next period.
    overlay_joined: Arc<tokio::sync::Notify>,
    /// The device metadata files configured interfaces are written to, when written.
    metadata: std::sync::Mutex<Option<crate::cdi::metadata::Metadata>>,
    /// Renewal tasks of DHCP leases, stopped on detach.
    leases: dhcp::Keepers,
}

/// The driver's own network namespace: it runs with the host network, so this is the host's.
pub const HOST_NETNS: &str = "/proc/self/ns/net";

impl<K: Kernel> PodNetworks<K> {
    /// Wires the hooks to the kernel, the prepared claims and the status sink. Give the result
    /// to the preparer as its [`Release`], so unprepare can always put devices back.
    pub fn new(kernel: K, claims: Arc<ClaimStore>, status: Arc<dyn StatusSink>) -> Arc<Self> {
        Arc::new(PodNetworks {
            kernel,
            claims,
            status,
            netns: Mutex::default(),
            rdma: std::sync::Mutex::new((Arc::new(KernelRdma), PathBuf::from(HOST_NETNS))),
            uplinks: Mutex::default(),
            events: std::sync::Mutex::new(Arc::new(NoEvents)),
            overlay_joined: Arc::default(),
            metadata: std::sync::Mutex::new(None),
            leases: Default::default(),
        })
    }

    /// Configured interfaces are written to their claims' device metadata files too (see
    /// [`crate::cdi::metadata`]), before the hook answers, so containers read them as set.
    pub fn set_metadata(&self, metadata: crate::cdi::metadata::Metadata) {
        *self
            .metadata
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(metadata);
    }

    /// Notified after an attach put pods on overlay segments (see `crate::overlay::sync`).
    pub fn overlay_joined(&self) -> Arc<tokio::sync::Notify> {
        self.overlay_joined.clone()
    }

    /// Attach failures become Events on the claim and the pod through `events`.
    pub fn set_events(&self, events: Arc<dyn EventSink>) {
        *self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = events;
    }

    fn warn(
        &self,
        claim: &PreparedClaim,
        pod: (&str, &str),
        reason: &'static str,
        message: String,
    ) {
        // A KNI attachment has no ResourceClaim to report on: its caller gets the error.
        if knic_proto::names::is_sandbox_claim_uid(&claim.uid) {
            return;
        }
        let sink = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        sink.warn(Warning {
            claim: crate::claims::ClaimRef {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                uid: claim.uid.clone(),
            },
            pod: Some(PodRef {
                name: pod.0.to_owned(),
                uid: pod.1.to_owned(),
            }),
            action: "AttachInterfaces",
            reason,
            message,
        });
    }

    /// RDMA devices move through `rdma`, and back into `host_netns` (tests use a recorder).
    pub fn set_rdma(&self, rdma: Arc<dyn RdmaNamespaces>, host_netns: PathBuf) {
        *self
            .rdma
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (rdma, host_netns);
    }

    fn rdma(&self) -> (Arc<dyn RdmaNamespaces>, PathBuf) {
        self.rdma
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// When the RDMA subsystem is in exclusive mode, moves the RDMA devices of `device`'s
    /// function from the namespace at `from` into the one at `to` (`None`: the host's), so
    /// they follow the netdev. Shared mode, or a host without RDMA core, needs nothing.
    async fn rdma_follow(
        &self,
        claim: &PreparedClaim,
        device: &str,
        from: Option<&Path>,
        to: Option<&Path>,
    ) -> Result<()> {
        let names: Vec<String> = claim
            .functions
            .iter()
            .filter(|f| f.device == device)
            .flat_map(|f| f.rdma.iter().map(|r| r.name.clone()))
            .collect();
        if names.is_empty() {
            return Ok(());
        }
        let (rdma, host) = self.rdma();
        let from = from.map_or_else(|| host.clone(), Path::to_path_buf);
        let to = to.map_or(host, Path::to_path_buf);
        tokio::task::spawn_blocking(move || {
            match rdma.mode() {
                Ok(NetnsMode::Exclusive) => {}
                Ok(NetnsMode::Shared) => return Ok(()),
                Err(e) if no_rdma_core(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
            names
                .iter()
                .try_for_each(|n| rdma.move_device(n, &from, &to))
        })
        .await
        .map_err(|e| Error::io("moving RDMA devices", std::io::Error::other(e)))?
    }

    fn publish_status(&self, claim: PreparedClaim, devices: Vec<DeviceStatus>) {
        let metadata = self
            .metadata
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(metadata) = metadata {
            let network: Vec<crate::cdi::metadata::NetworkData> = devices
                .iter()
                .filter(|d| d.ready && d.interface_name.is_some())
                .map(|d| crate::cdi::metadata::NetworkData {
                    device: d.device.clone(),
                    interface_name: d.interface_name.clone(),
                    ips: d.ips.clone(),
                    hardware_address: d.hardware_address.clone(),
                })
                .collect();
            if let Err(e) = metadata.update(&claim, &network) {
                tracing::warn!(claim = %claim.name, error = %e, "device metadata not updated");
            }
        }
        // A KNI attachment has no ResourceClaim to write to: its caller got the answer.
        if knic_proto::names::is_sandbox_claim_uid(&claim.uid) {
            return;
        }
        let sink = self.status.clone();
        // After the hook has answered: the runtime's 2 s budget is for the kernel work.
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(200);
            for attempt in 1..=5 {
                match tokio::time::timeout(Duration::from_secs(3), sink.write(&claim, &devices))
                    .await
                {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => {
                        tracing::warn!(claim = %claim.name, attempt, error = %e, "claim status write failed")
                    }
                    Err(_) => {
                        tracing::warn!(claim = %claim.name, attempt, "claim status write timed out")
                    }
                }
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        });
    }

    /// Brings one recorded device home from the pod (its RDMA device first).
    async fn detach_device(
        &self,
        claim: &PreparedClaim,
        a: &crate::claims::checkpoint::Attachment,
        restore: &crate::netns::Restore,
        netns: Option<&Ns>,
    ) -> Result<()> {
        let recorded = a.netns.clone().map(Ns::Pod);
        if let Err(e) = self
            .rdma_follow(claim, &a.plan.device, a.netns.as_deref(), None)
            .await
        {
            // The kernel returns it to the host when the pod's namespace goes away.
            tracing::warn!(claim = %claim.name, error = %e, "could not bring an RDMA device back to the host");
        }
        self.release_lease(claim, a).await;
        netns::detach(&self.kernel, &a.plan, netns.or(recorded.as_ref()), restore).await
    }

    /// Deletes each host VLAN of `names` (once, however many devices named it) unless a
    /// recorded attachment still uses it; a failure is logged and left to
    /// [`PodNetworks::sweep_uplinks`]. Called after devices went home and their records were
    /// forgotten (detach, an undone attach), so the last pod out deletes a shared VLAN.
    async fn release_uplinks<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let mut names: Vec<&str> = names.into_iter().collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let released = match self.claims.snapshot().await {
                Ok(now) => uplinks::release_if_unused(&self.kernel, &now, None, name).await,
                Err(e) => Err(e),
            };
            if let Err(e) = released {
                tracing::warn!(uplink = %name, error = %e,
                    "could not delete a host VLAN no pod uses; the next sweep retries");
            }
        }
    }

    /// Brings every recorded device of `claims` home, then forgets their records in one
    /// durable write. A crash in between leaves records of devices already home, which a
    /// retried detach puts back again (detach is idempotent), as a crash mid-device would.
    pub async fn detach_claims(
        &self,
        claims: Vec<PreparedClaim>,
        netns: Option<&Ns>,
    ) -> Result<()> {
        let uses_uplink = claims
            .iter()
            .flat_map(|c| &c.attachments)
            .any(|a| a.restore.is_some() && a.plan.mode.shared_host_link().is_some());
        // "Forget the record, then delete the host VLAN nobody records" must not interleave
        // with an attach recording a new user of it.
        let _uplinks = match uses_uplink {
            true => Some(self.uplinks.lock().await),
            false => None,
        };
        let mut errors = Vec::new();
        let mut home: Vec<Change> = Vec::new();
        let mut uplinks: Vec<&str> = Vec::new();
        for claim in &claims {
            for (i, a) in claim.attachments.iter().enumerate() {
                let Some(restore) = &a.restore else {
                    continue;
                };
                let started = std::time::Instant::now();
                let outcome = self.detach_device(claim, a, restore, netns).await;
                let m = metrics();
                m.detaches.inc([crate::metrics::result(&outcome)]);
                m.detach_duration.observe_since([], started);
                match outcome {
                    Ok(()) => {
                        home.push(forget_record(&claim.uid, i));
                        uplinks.extend(a.plan.mode.shared_host_link());
                    }
                    Err(e) => errors.push(Error::Claim {
                        namespace: claim.namespace.clone(),
                        name: claim.name.clone(),
                        reason: e.to_string(),
                    }),
                }
            }
        }
        // A claim unprepared meanwhile has no record left to forget: the store logs it, and
        // its devices are home either way.
        self.claims.update_each(home).await?;
        // The last pod out deletes the shared host VLAN. The devices are home and their
        // records gone, so a failure here is not the detach's: a retry would find nothing to
        // do, and the sweep deletes what is left.
        self.release_uplinks(uplinks).await;
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Several(errors)),
        }
    }

    /// The pod's prepared claims as the checkpoint has them: the CNI door finds the claim of
    /// the Network Multus asks for among them.
    pub async fn pod_claims(&self, pod_uid: &str) -> Result<Vec<PreparedClaim>> {
        self.claims.claims_for_pod(pod_uid).await
    }

    /// The interface `ifname` in the namespace at `netns` as the kernel has it now (MAC and
    /// addresses), or `None` when the namespace or the interface is gone: what a KNI query
    /// answers beside the checkpoint's record.
    pub async fn link_in(&self, netns: &Path, ifname: &str) -> Result<Option<netns::LinkState>> {
        let Some(mut session) = self.kernel.open(&Ns::Pod(netns.to_path_buf())).await? else {
            return Ok(None);
        };
        use crate::netns::Session as _;
        session.link(ifname).await
    }

    /// Puts back every device of the pod's claims.
    pub async fn detach_pod(&self, pod_uid: &str, netns: Option<PathBuf>) -> Result<()> {
        let netns = match netns {
            Some(p) => Some(p),
            None => self.netns.lock().await.get(pod_uid).cloned(),
        };
        let claims = self.claims.claims_for_pod(pod_uid).await?;
        self.detach_claims(claims, netns.map(Ns::Pod).as_ref())
            .await
    }
}

/// The change that forgets attachment `index` of claim `uid`: its device is home, so there is
/// nothing to put back and no namespace it is in. One definition for detach and for an undone
/// attach, which must leave the same record (a half-cleared one would send recovery after a
/// device that is not away).
fn forget_record(uid: &str, index: usize) -> Change {
    let change = move |c: &mut PreparedClaim| {
        if let Some(a) = c.attachments.get_mut(index) {
            a.restore = None;
            a.netns = None;
            a.attached = false;
            a.lease = None;
        }
    };
    (uid.to_owned(), Box::new(change))
}

/// Status entries of the claim's vfio-pci functions: bound at prepare, nothing to attach, so
/// the sandbox start is where their status is written, with what a VM or DPDK user needs.
pub fn vfio_statuses(claim: &PreparedClaim, pod_name: &str) -> Vec<DeviceStatus> {
    claim
        .functions
        .iter()
        .filter_map(|f| {
            let vfio = f.vfio.as_ref()?;
            let pool = claim
                .devices
                .iter()
                .find(|d| d.device == f.device)
                .map(|d| d.pool.clone())
                .unwrap_or_default();
            Some(DeviceStatus {
                updated: None,
                pool,
                device: f.device.clone(),
                ready: true,
                reason: "VfioBound".into(),
                message: format!(
                    "{} bound to vfio-pci (IOMMU group {}) for pod {pod_name}",
                    f.pci_address, vfio.group
                ),
                interface_name: None,
                ips: vec![],
                hardware_address: f.mac.clone(),
                data: Some(f.status_data()),
            })
        })
        .collect()
}

impl<K: Kernel> Release for PodNetworks<K> {
    fn release<'a>(
        &'a self,
        claim: &'a PreparedClaim,
        checkpoint: &'a Checkpoint,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            for (i, a) in claim.attachments.iter().enumerate() {
                if let Some(restore) = &a.restore {
                    if let Err(e) = self
                        .rdma_follow(claim, &a.plan.device, a.netns.as_deref(), None)
                        .await
                    {
                        tracing::warn!(claim = %claim.name, error = %e, "could not bring an RDMA device back to the host");
                    }
                    let ns = a.netns.clone().map(Ns::Pod);
                    // After a crash too: the checkpoint says a lease is held.
                    self.release_lease(claim, a).await;
                    netns::detach(&self.kernel, &a.plan, ns.as_ref(), restore).await?;
                    // The store is locked by the caller, so no attach can record a user of
                    // the uplink between this check and the delete; the claim is being
                    // forgotten, so its own records do not count.
                    if let Some(up) = a.plan.mode.shared_host_link() {
                        uplinks::release_if_unused(&self.kernel, checkpoint, Some(&claim.uid), up)
                            .await?;
                    }
                    tracing::info!(claim = %claim.name, index = i, "device returned to the host at unprepare");
                }
            }
            Ok(())
        })
    }
}

impl<K: Kernel> NriHandler for PodNetworks<K> {
    fn run_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let Some(path) = pod.netns.clone() else {
                let claims = self.claims.claims_for_pod(&pod.uid).await?;
                if claims.iter().any(|c| !c.attachments.is_empty()) {
                    let refusal = Error::NoNetworkNamespace {
                        namespace: pod.namespace.clone(),
                        name: pod.name.clone(),
                    };
                    for claim in claims.iter().filter(|c| !c.attachments.is_empty()) {
                        self.warn(
                            claim,
                            (&pod.name, &pod.uid),
                            "NoNetworkNamespace",
                            refusal.to_string(),
                        );
                    }
                    return Err(Error::NoNetworkNamespace {
                        namespace: pod.namespace,
                        name: pod.name,
                    });
                }
                return Ok(());
            };
            self.netns
                .lock()
                .await
                .insert(pod.uid.clone(), path.clone());
            let started = std::time::Instant::now();
            let result = self
                .attach_pod(&pod.uid, &format!("{}/{}", pod.namespace, pod.name), path)
                .await;
            tracing::debug!(pod = %pod.name, elapsed = ?started.elapsed(), ok = result.is_ok(), "RunPodSandbox handled");
            result
        })
    }

    fn stop_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move { self.detach_pod(&pod.uid, pod.netns.clone()).await })
    }

    fn remove_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let result = self.detach_pod(&pod.uid, pod.netns.clone()).await;
            self.netns.lock().await.remove(&pod.uid);
            result
        })
    }

    fn synchronize(&self, pods: Vec<PodSandbox>) -> BoxFuture<'_, ()> {
        Box::pin(self.synchronize_pods(pods))
    }
}

impl<K: Kernel> PodNetworks<K> {
    /// Rebuilds pod UID -> netns and converges every checkpointed pod with what runs.
    async fn synchronize_pods(&self, pods: Vec<PodSandbox>) {
        let running: HashMap<String, PodSandbox> = pods
            .into_iter()
            .filter(|p| p.netns.is_some())
            .map(|p| (p.uid.clone(), p))
            .collect();
        {
            let mut cache = self.netns.lock().await;
            for (uid, pod) in &running {
                if let Some(path) = &pod.netns {
                    cache.insert(uid.clone(), path.clone());
                }
            }
        }
        let Ok(checkpoint) = self.claims.snapshot().await else {
            return;
        };
        let mut pod_uids: Vec<String> = checkpoint
            .claims
            .values()
            .map(|c| c.pod_uid.clone())
            .collect();
        pod_uids.sort();
        pod_uids.dedup();
        for uid in pod_uids {
            // A KNI sandbox is no pod of the runtime's: its attachments stay until its caller
            // detaches them (the runtime's list never names it).
            if knic_proto::names::is_sandbox_claim_uid(&uid) {
                continue;
            }
            let away = checkpoint
                .claims
                .values()
                .any(|c| c.pod_uid == uid && c.attachments.iter().any(|a| a.restore.is_some()));
            let missing = checkpoint
                .claims
                .values()
                .any(|c| c.pod_uid == uid && c.attachments.iter().any(|a| !a.attached));
            match running.get(&uid) {
                // Running pod: make sure its devices are there. A crash mid-attach resumes; a
                // sandbox that started while knic was disconnected gets them now (its
                // containers were held back by the CDI check, see `crate::cdi`).
                Some(pod) if away || missing => {
                    if let Some(path) = pod.netns.clone()
                        && let Err(e) = self
                            .attach_pod(&uid, &format!("{}/{}", pod.namespace, pod.name), path)
                            .await
                    {
                        tracing::error!(pod = %pod.name, error = %e, "re-attaching after a restart failed");
                    }
                }
                Some(_) => self.resume_leases(&checkpoint, &uid),
                // Gone: put its devices back.
                None if away => {
                    if let Err(e) = self.detach_pod(&uid, None).await {
                        tracing::error!(pod_uid = %uid, error = %e, "returning devices of a gone pod failed");
                    }
                }
                None => {}
            }
        }
        self.sweep_uplinks().await;
    }

    /// Deletes shared host VLANs that no recorded attachment uses (a crash between a pod's
    /// detach and the release of its uplink leaves one).
    pub async fn sweep_uplinks(&self) {
        let _serialised = self.uplinks.lock().await;
        let swept = match self.claims.snapshot().await {
            Ok(now) => uplinks::sweep(&self.kernel, &now).await,
            Err(e) => Err(e),
        };
        match swept {
            Ok(deleted) if !deleted.is_empty() => {
                tracing::info!(?deleted, "deleted host VLANs no pod uses any more");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not sweep unused host VLANs"),
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod overlay_tests;
#[cfg(test)]
mod uplink_tests;

#[cfg(test)]
mod write_tests;

#[cfg(test)]
mod update_tests;
