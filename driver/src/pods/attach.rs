//! Attach: a pod's devices recorded in ONE durable checkpoint write, then moved.
//!
//! Every device's restore record (host state, target namespace) is written in a single
//! fsync'd write before the first kernel change, so a crash at any later step knows what to
//! put back. The per-device "attached" mark is only noted in memory and reaches the disk with
//! the next durable write: a crash may lose it, and recovery treats a recorded, unmarked
//! device as "possibly attached" — [`netns::attach`] with `resume` checks the kernel and
//! finishes or redoes the work idempotently — so losing the mark loses nothing.

use std::path::{Path, PathBuf};

use crate::claims::Change;
use crate::claims::checkpoint::{Attachment, PreparedClaim};
use crate::error::{Error, Result};
use crate::metrics::metrics;
use crate::netns::{self, Kernel, LinkState, Ns, Restore};

use super::{DeviceStatus, PodNetworks, attached_data, forget_record, vfio_statuses};

/// One device of the pod, ready to be moved.
struct Step {
    /// Index into the pod's claims.
    claim: usize,
    /// Index into the claim's attachments.
    index: usize,
    restore: Restore,
    /// An earlier attach into this namespace was cut short (recorded, not marked attached).
    resume: bool,
    /// The device may be in the pod already (recorded for this namespace before this call),
    /// so a failed attach of another device must not forget its record unless it undid it.
    was_away: bool,
}

impl<K: Kernel> PodNetworks<K> {
    /// Attaches every device of the pod's claims into `netns`; all or nothing.
    pub async fn attach_pod(&self, pod_uid: &str, pod_name: &str, netns: PathBuf) -> Result<()> {
        let claims = self.claims.claims_for_pod(pod_uid).await?;
        for (claim, entries) in self.attach_claims(claims, pod_uid, pod_name, netns).await? {
            if !entries.is_empty() {
                self.publish_status(claim, entries);
            }
        }
        Ok(())
    }

    /// Attaches every device of `claims` (all of one pod, or of one KNI sandbox attachment)
    /// into `netns`, all or nothing, and returns each claim's status entries for the caller to
    /// publish (the kubelet's door writes them to the claim, the KNI door answers with them).
    pub async fn attach_claims(
        &self,
        claims: Vec<PreparedClaim>,
        pod_uid: &str,
        pod_name: &str,
        netns: PathBuf,
    ) -> Result<Vec<(PreparedClaim, Vec<DeviceStatus>)>> {
        // Held from the record to the last move when a device uses a shared host VLAN: no
        // detach may see "nobody records it" and delete it in between (see `uplinks`).
        let uses_uplink = claims
            .iter()
            .flat_map(|c| &c.attachments)
            .any(|a| a.plan.mode.shared_host_link().is_some());
        let _uplinks = match uses_uplink {
            true => Some(self.uplinks.lock().await),
            false => None,
        };
        let mut steps = Vec::new();
        for (c, claim) in claims.iter().enumerate() {
            for (index, a) in claim.attachments.iter().enumerate() {
                match self.ready(a, &netns).await {
                    Ok(step) => steps.push(Step {
                        claim: c,
                        index,
                        ..step
                    }),
                    Err(e) => {
                        metrics().attaches.inc([crate::metrics::ERROR]);
                        return Err(self.attach_failed(claim, a, pod_name, pod_uid, e));
                    }
                }
            }
        }
        // Durable before the first change: a crash from here on knows what to put back.
        let record: Vec<Change> = steps
            .iter()
            .map(|s| {
                let (index, restore, path) = (s.index, s.restore.clone(), netns.clone());
                let fresh = !s.was_away;
                let change = move |c: &mut PreparedClaim| {
                    if let Some(a) = c.attachments.get_mut(index) {
                        a.restore = Some(restore);
                        a.netns = Some(path);
                        // Home now (never attached, or brought back from an old sandbox).
                        if fresh {
                            a.attached = false;
                        }
                    }
                };
                (claims[s.claim].uid.clone(), Box::new(change) as _)
            })
            .collect();
        let gone = self.claims.update_each(record).await?;
        if let Some(claim) = claims.iter().find(|c| gone.contains(&c.uid)) {
            // Unprepared since it was read: moving its devices now would leave them in the pod
            // with no record to bring them back by. Nothing has moved; the records written for
            // the pod's other claims are of devices still home, which detach (or recovery)
            // finds home and forgets, as after a crash right after this write.
            metrics().attaches.inc([crate::metrics::ERROR]);
            return Err(Error::Claim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                reason: "it was unprepared while its pod was being attached; none of the pod's \
                         devices was moved"
                    .into(),
            });
        }
        if !steps.is_empty() {
            crate::failpoint::hit("attach:after-checkpoint");
        }
        let mut entries: Vec<Vec<DeviceStatus>> = vec![Vec::new(); claims.len()];
        for (k, s) in steps.iter().enumerate() {
            let claim = &claims[s.claim];
            let a = &claim.attachments[s.index];
            let started = std::time::Instant::now();
            let outcome = self
                .attach_device(claim, a, &netns, &s.restore, s.resume)
                .await;
            // `addressing`: a DHCP lease or SLAAC's address, once the interface is up in the pod.
            let outcome = match outcome {
                Ok(link) => self
                    .obtain_lease(claim, s.index, a, &netns, &link)
                    .await
                    .map(|extra| (link, extra)),
                Err(e) => Err(e),
            };
            let m = metrics();
            m.attaches.inc([crate::metrics::result(&outcome)]);
            m.attach_duration.observe_since([], started);
            match outcome {
                Ok((link, extra)) => entries[s.claim].push(DeviceStatus {
                    updated: None,
                    pool: a.plan.pool.clone(),
                    device: a.plan.device.clone(),
                    ready: true,
                    reason: "InterfaceConfigured".into(),
                    message: format!("{} configured in pod {pod_name}", a.plan.pod_ifname),
                    interface_name: Some(a.plan.pod_ifname.clone()),
                    ips: a
                        .plan
                        .addresses
                        .iter()
                        .copied()
                        .chain(extra)
                        .map(|c| c.to_string())
                        .collect(),
                    hardware_address: link.mac.as_ref().map(netns::mac_text),
                    data: attached_data(claim, &a.plan),
                }),
                Err(e) => {
                    tracing::error!(pod = %pod_name, device = %a.plan.device, error = %e,
                        "attach failed; undoing this pod's devices");
                    self.undo(&claims, &steps, k, &netns).await;
                    return Err(self.attach_failed(claim, a, pod_name, pod_uid, e));
                }
            }
        }
        if steps.iter().any(|s| {
            matches!(
                claims[s.claim].attachments[s.index].plan.mode,
                crate::netns::AttachMode::Overlay { .. }
            )
        }) {
            self.overlay_joined.notify_one();
        }
        // In memory only: a crash before the next durable write leaves these devices recorded
        // and unmarked, which recovery resumes (checks the kernel) instead of trusting.
        for s in &steps {
            let index = s.index;
            self.claims.note(&claims[s.claim].uid, move |c| {
                if let Some(a) = c.attachments.get_mut(index) {
                    a.attached = true;
                }
            });
        }
        Ok(claims
            .into_iter()
            .zip(entries)
            .map(|(claim, mut entries)| {
                entries.extend(vfio_statuses(&claim, pod_name));
                (claim, entries)
            })
            .collect())
    }

    /// What attaching `a` into `path` needs: a sandbox recreated with a new namespace first
    /// gets the device back from the old one; a device not recorded yet has its host state
    /// captured.
    async fn ready(&self, a: &Attachment, path: &PathBuf) -> Result<Step> {
        let moved = match (&a.restore, &a.netns) {
            (Some(restore), Some(old)) if old != path => {
                netns::detach(&self.kernel, &a.plan, Some(&Ns::Pod(old.clone())), restore).await?;
                true
            }
            _ => false,
        };
        let restore = match &a.restore {
            Some(r) => r.clone(),
            None => netns::capture(&self.kernel, &a.plan).await?,
        };
        Ok(Step {
            claim: 0,
            index: 0,
            restore,
            resume: a.restore.is_some() && !a.attached,
            was_away: a.restore.is_some() && !moved,
        })
    }

    /// Moves one recorded device into the pod; in exclusive RDMA mode its RDMA device
    /// follows, or the attach is undone. On error the device is home again.
    async fn attach_device(
        &self,
        claim: &PreparedClaim,
        a: &Attachment,
        path: &Path,
        restore: &Restore,
        resume: bool,
    ) -> Result<LinkState> {
        let target = Ns::Pod(path.to_path_buf());
        let link = netns::attach(&self.kernel, &a.plan, &target, restore, resume).await?;
        if let Err(e) = self
            .rdma_follow(claim, &a.plan.device, None, Some(path))
            .await
        {
            if let Err(undo) = netns::detach(&self.kernel, &a.plan, Some(&target), restore).await {
                tracing::error!(error = %undo, "undoing an attach whose RDMA device could not follow failed");
            }
            return Err(e);
        }
        Ok(link)
    }

    /// A device of the pod failed at `steps[failed]` (it undid itself): the ones attached
    /// before it go home, and one durable write forgets every record that no longer stands
    /// for a device away from the host. Host VLANs nobody records any more go too.
    async fn undo(&self, claims: &[PreparedClaim], steps: &[Step], failed: usize, path: &Path) {
        let target = Ns::Pod(path.to_path_buf());
        let mut forget: Vec<&Step> = Vec::new();
        // The failed device undid itself, but an undo can fail too (a refused move home, an
        // unreadable pod): its record goes only once a detach, which finds a device already
        // home and restores nothing twice, says it is on the host.
        let f = &steps[failed];
        let a = &claims[f.claim].attachments[f.index];
        match netns::detach(&self.kernel, &a.plan, Some(&target), &f.restore).await {
            Ok(()) => forget.push(f),
            Err(e) => {
                tracing::error!(device = %a.plan.device, error = %e, "the failed device is not back on the host; the record stays for detach to retry");
            }
        }
        for s in steps[..failed].iter().rev() {
            let claim = &claims[s.claim];
            let a = &claim.attachments[s.index];
            // A lease an earlier device got is in the store's record, not in this copy: it is
            // given back (and its renewal stopped) before the device leaves the pod.
            if let Ok(Some(current)) = self.claims.claim(&claim.uid).await
                && let Some(recorded) = current.attachments.get(s.index)
                && recorded.lease.is_some()
            {
                self.release_lease(&current, recorded).await;
            }
            if let Err(e) = self
                .rdma_follow(claim, &a.plan.device, Some(path), None)
                .await
            {
                tracing::warn!(claim = %claim.name, error = %e, "could not bring an RDMA device back to the host");
            }
            match netns::detach(&self.kernel, &a.plan, Some(&target), &s.restore).await {
                Ok(()) => forget.push(s),
                Err(e) => {
                    tracing::error!(device = %a.plan.device, error = %e, "undo after failed attach failed; the record stays for detach to retry");
                }
            }
        }
        forget.extend(steps[failed + 1..].iter().filter(|s| !s.was_away));
        let changes: Vec<Change> = forget
            .iter()
            .map(|s| forget_record(&claims[s.claim].uid, s.index))
            .collect();
        // A claim unprepared meanwhile has no record left to forget (its unprepare brought
        // the devices home): the store logs it, and nothing else is owed.
        if let Err(e) = self.claims.update_each(changes).await {
            tracing::error!(error = %e, "could not forget the records of an undone attach; detach finds the devices home");
        }
        let uplinks = forget.iter().filter_map(|s| {
            claims[s.claim].attachments[s.index]
                .plan
                .mode
                .shared_host_link()
        });
        self.release_uplinks(uplinks).await;
    }

    /// The error a failed attach answers with, after an Event and a failed status for it.
    fn attach_failed(
        &self,
        claim: &PreparedClaim,
        a: &Attachment,
        pod_name: &str,
        pod_uid: &str,
        e: Error,
    ) -> Error {
        let reason = match &e {
            Error::DeviceMismatch { .. } => "DeviceMismatch",
            _ => "AttachFailed",
        };
        let short_name = pod_name.rsplit_once('/').map_or(pod_name, |(_, n)| n);
        self.warn(claim, (short_name, pod_uid), reason, e.to_string());
        let failed = DeviceStatus {
            updated: None,
            pool: a.plan.pool.clone(),
            device: a.plan.device.clone(),
            ready: false,
            reason: reason.into(),
            message: e.to_string(),
            interface_name: None,
            ips: vec![],
            hardware_address: None,
            data: None,
        };
        self.publish_status(claim.clone(), vec![failed]);
        Error::Claim {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            reason: format!("device {}/{}: {e}", a.plan.pool, a.plan.device),
        }
    }
}
