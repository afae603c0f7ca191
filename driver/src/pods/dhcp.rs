//! `addressing: {mode: dhcp}` in the pod hooks: after the device is in the pod and up, the
//! lease is obtained (bounded), recorded durably with the attachment, and kept by a renewal
//! task until detach, which releases it from the pod's namespace; an unprepare that finds a
//! lease recorded (the driver crashed, or the detach never ran) releases it too.

use std::path::PathBuf;
use std::time::Duration;

use knic_proto::netconfig::{Addressing, Cidr};

use super::PodNetworks;
use crate::claims::checkpoint::{Attachment, PreparedClaim};
use crate::dhcp::attach::{DhcpStep, obtain, release};
use crate::dhcp::keeper::{self, Ended, Opener, WallClock};
use crate::dhcp::socket::UdpTransport;
use crate::dhcp::{Lease, MAX_TIMEOUT};
use crate::error::{Error, Result};
use crate::netns::{Kernel, LinkState, Ns, Session};

/// How long one renewal exchange may take before it is retried on the keeper's schedule.
const RENEW_ATTEMPT: Duration = Duration::from_secs(10);

/// The pod interface's port-68 socket, opened per exchange.
pub struct PodSocket {
    /// The pod's namespace.
    pub netns: PathBuf,
    /// The interface in it.
    pub ifname: String,
}

impl Opener for PodSocket {
    type T = UdpTransport;

    async fn open(&self) -> std::io::Result<UdpTransport> {
        UdpTransport::open(Some(&self.netns), &self.ifname).await
    }
}

/// Running renewal tasks, by claim UID and device.
pub type Keepers =
    std::sync::Mutex<std::collections::HashMap<(String, String), tokio::task::AbortHandle>>;

impl<K: Kernel> PodNetworks<K> {
    /// The addressing step of attachment `index` of `claim` (attached as `link` in `path`):
    /// for DHCP the lease, obtained and recorded; for SLAAC with a timeout, the wait for an
    /// autoconfigured address. Returns the addresses it brought, for the claim status. On
    /// error nothing is held.
    pub(super) async fn obtain_lease(
        &self,
        claim: &PreparedClaim,
        index: usize,
        a: &Attachment,
        path: &std::path::Path,
        link: &LinkState,
    ) -> Result<Vec<Cidr>> {
        if let Addressing::Slaac { timeout_seconds } = a.plan.addressing {
            return self.wait_for_slaac(a, path, link, timeout_seconds).await;
        }
        let Addressing::Dhcp {
            timeout_seconds,
            default_route,
            use_mtu,
        } = a.plan.addressing
        else {
            return Ok(Vec::new());
        };
        let ns = Ns::Pod(path.to_path_buf());
        let ifname = a.plan.pod_ifname.clone();
        let mac = link.mac.ok_or_else(|| {
            Error::kernel(
                &ns,
                format!("getting a DHCP lease for {ifname}"),
                "the interface has no MAC",
            )
        })?;
        let opener = PodSocket {
            netns: path.to_path_buf(),
            ifname: ifname.clone(),
        };
        // A lease recorded by an attach that was cut short is the one to keep.
        if let Some(lease) = &a.lease {
            self.keep_lease(claim, a, path, lease.clone());
            return Ok(vec![lease.cidr()]);
        }
        let step = DhcpStep {
            timeout: Duration::from_secs(u64::from(timeout_seconds)).min(MAX_TIMEOUT),
            default_route,
            use_mtu,
            fixed_mtu: a.plan.mtu,
            table: a.plan.routing.vrf.as_ref().map(|v| v.table),
        };
        let mut pod = crate::netns::open(&self.kernel, &ns).await?;
        pod.find_link(&ifname).await?;
        let lease = obtain(&mut pod, &opener, &ns, &ifname, mac, step).await?;
        drop(pod);
        let recorded = lease.clone();
        let change = move |c: &mut PreparedClaim| {
            if let Some(at) = c.attachments.get_mut(index) {
                at.lease = Some(recorded);
            }
        };
        if let Err(e) = self
            .claims
            .update_each(vec![(claim.uid.clone(), Box::new(change))])
            .await
        {
            // Unrecorded, it could leak past a crash: give it back now.
            if let Err(r) = release(&opener, &ns, &ifname, &lease).await {
                tracing::warn!(error = %r, "could not release an unrecorded DHCP lease");
            }
            return Err(e);
        }
        crate::failpoint::hit("attach:after-lease");
        self.keep_lease(claim, a, path, lease.clone());
        Ok(vec![lease.cidr()])
    }

    /// Waits (bounded) for the kernel to autoconfigure a global IPv6 address on the pod's
    /// interface from a router advertisement; `timeout_seconds` 0 does not wait.
    async fn wait_for_slaac(
        &self,
        a: &Attachment,
        path: &std::path::Path,
        link: &LinkState,
        timeout_seconds: u32,
    ) -> Result<Vec<Cidr>> {
        if timeout_seconds == 0 {
            return Ok(Vec::new());
        }
        let ns = Ns::Pod(path.to_path_buf());
        let deadline = tokio::time::Instant::now()
            + Duration::from_secs(u64::from(timeout_seconds)).min(MAX_TIMEOUT);
        loop {
            // A session per look: none is held across the wait (see `Session`).
            let mut pod = crate::netns::open(&self.kernel, &ns).await?;
            let autoconf: Vec<Cidr> = pod
                .addresses(link.index)
                .await?
                .into_iter()
                .filter(|c| c.is_ipv6() && !a.plan.addresses.contains(c))
                .collect();
            drop(pod);
            if !autoconf.is_empty() {
                return Ok(autoconf);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::kernel(
                    &ns,
                    format!("waiting for SLAAC on {}", a.plan.pod_ifname),
                    format!(
                        "no IPv6 address was autoconfigured within {timeout_seconds} s (no router \
                         advertisement with an autonomous prefix arrived)"
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts renewing `lease` in the background; every renewal is noted in the checkpoint.
    fn keep_lease(
        &self,
        claim: &PreparedClaim,
        a: &Attachment,
        path: &std::path::Path,
        lease: Lease,
    ) {
        let (uid, device) = (claim.uid.clone(), a.plan.device.clone());
        let opener = PodSocket {
            netns: path.to_path_buf(),
            ifname: a.plan.pod_ifname.clone(),
        };
        let claims = self.claims.clone();
        let key = (uid.clone(), device.clone());
        let task = tokio::spawn(async move {
            let device_for_note = device.clone();
            let ended = keeper::keep(lease, &WallClock, &opener, RENEW_ATTEMPT, |l| {
                let l = l.clone();
                let device = device_for_note.clone();
                claims.note(&uid, move |c| {
                    if let Some(at) = c.attachments.iter_mut().find(|at| at.plan.device == device) {
                        at.lease = Some(l);
                    }
                });
            })
            .await;
            match ended {
                Ended::Expired(l) => tracing::error!(%device, address = %l.address,
                    "the DHCP lease ran out: no server renewed it"),
                Ended::Refused(l, f) => tracing::error!(%device, address = %l.address, error = %f,
                    "the DHCP server refused to renew the lease"),
            }
        });
        let mut keepers = self
            .leases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(old) = keepers.insert(key, task.abort_handle()) {
            old.abort();
        }
    }

    /// Stops renewing and releases the recorded lease of `a`, if any, from its pod namespace.
    /// Never fails the detach: a namespace already gone cannot send it (logged; the lease then
    /// runs out on the server).
    pub(super) async fn release_lease(&self, claim: &PreparedClaim, a: &Attachment) {
        if let Some(task) = self
            .leases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&(claim.uid.clone(), a.plan.device.clone()))
        {
            task.abort();
        }
        let (Some(lease), Some(netns)) = (&a.lease, &a.netns) else {
            return;
        };
        let opener = PodSocket {
            netns: netns.clone(),
            ifname: a.plan.pod_ifname.clone(),
        };
        let ns = Ns::Pod(netns.clone());
        if let Err(e) = release(&opener, &ns, &a.plan.pod_ifname, lease).await {
            tracing::warn!(claim = %claim.name, device = %a.plan.device, error = %e,
                "could not release the DHCP lease; it runs out on the server");
        }
    }
}

impl<K: Kernel> PodNetworks<K> {
    /// After a driver restart, a running pod's recorded leases are renewed again on their
    /// schedule (an overdue one at once); leases already kept are left alone.
    pub(super) fn resume_leases(
        &self,
        checkpoint: &crate::claims::checkpoint::Checkpoint,
        pod_uid: &str,
    ) {
        for claim in checkpoint.claims.values().filter(|c| c.pod_uid == pod_uid) {
            for a in &claim.attachments {
                let (Some(lease), Some(netns)) = (&a.lease, &a.netns) else {
                    continue;
                };
                let kept = self
                    .leases
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .contains_key(&(claim.uid.clone(), a.plan.device.clone()));
                if !kept {
                    tracing::info!(claim = %claim.name, device = %a.plan.device, address = %lease.address,
                        "renewing a recorded DHCP lease after a restart");
                    self.keep_lease(claim, a, netns, lease.clone());
                }
            }
        }
    }
}
