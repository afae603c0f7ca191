//! Keeps the node's published devices current: rescans on link events (coalescing bursts), on
//! changes to the prepared set, and on a slow timer, and hands the result to the publisher.
//!
//! A device given to a pod vanishes from the host's view (its netdev is in the pod's network
//! namespace) but is still allocated: it stays published from the copy the checkpoint took at
//! prepare time until it comes back or the claim is unprepared.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::resource::v1::Device;
use tokio::sync::watch;

use crate::claims::ClaimStore;
use crate::inventory::filter::Filter;
use crate::inventory::netlink;
use crate::inventory::sources::Sources;
use crate::inventory::{self, Inventory};
use crate::sharing::Sharing;
use crate::slices;
use crate::slices::taints::{self, Gone};
use crate::sriov::{Held, Provisioner, Report};

/// How to discover: the sysfs root, the admin filter, and whether to ask netlink.
#[derive(Debug, Clone)]
pub struct Discovery {
    /// Root under which `sys/` (and `proc/net/` for default routes) are read.
    pub root: PathBuf,
    /// The admin's include/exclude filter.
    pub filter: Filter,
    /// Whether to add rtnetlink/ethtool/devlink facts (off: sysfs only).
    pub netlink: bool,
    /// The node's SR-IOV policy, applied before each scan ([`Discovery::provision`]).
    pub provisioner: Option<Arc<Provisioner>>,
    /// The node's share policy: which parents are published as shareable.
    pub sharing: Arc<Sharing>,
    /// The overlay offer (`--vtep-address`), if the node offers overlay networks.
    pub overlay: Option<crate::inventory::overlay::OverlayOffer>,
}

impl Discovery {
    /// Applies the SR-IOV policy, if any, so the scan that follows sees the VFs it asks for:
    /// VFs held by prepared claims are never taken away. The checkpoint lock is held from the
    /// snapshot of what claims hold until the writes are done, so a prepare (which records
    /// and binds under the same lock) can neither be missed by the snapshot nor see its
    /// function rebound or destroyed afterwards. A reconcile without changes reads sysfs only
    /// (milliseconds); one that changes a VF count holds the lock while the kernel creates
    /// the VFs, bounded per step by the wait. Blocking work runs off the async threads, and a
    /// reconcile stuck in a kernel write (a VF still open elsewhere) is left behind after
    /// [`Provisioner::deadline`]: rescans and prepares go on, and no other reconcile starts
    /// until it returns.
    pub async fn provision(&self, claims: &ClaimStore) -> Option<Report> {
        let provisioner = self.provisioner.clone()?;
        if provisioner.is_busy() {
            tracing::warn!("the previous SR-IOV reconcile is still blocked in the kernel; skipped");
            return None;
        }
        let mut locked = claims.lock().await;
        // Claims queued by prepares count too: they may be on disk before the kernel is done.
        let held = match locked.with_queued() {
            Ok(checkpoint) => Held::from_checkpoint(&checkpoint),
            Err(e) => {
                // Without the prepared set nothing is known safe to change.
                tracing::warn!(error = %e, "no checkpoint; SR-IOV policy not applied this time");
                return None;
            }
        };
        let root = self.root.clone();
        let deadline = provisioner.deadline();
        let run = tokio::task::spawn_blocking(move || {
            let routes = if provisioner.wants_count_change(&held) {
                crate::sriov::route_bound(&root, &netlink::default_route_interfaces(&root))
            } else {
                BTreeMap::new()
            };
            provisioner.reconcile(&held, &routes)
        });
        let outcome = tokio::time::timeout(deadline, run).await;
        drop(locked);
        match outcome {
            Ok(Ok(report)) => Some(report),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "SR-IOV provisioning panicked");
                None
            }
            Err(_) => {
                tracing::error!(
                    after = ?deadline,
                    "SR-IOV reconcile did not finish (a sysfs write is blocked in the kernel, e.g. \
                     by a VF still in use); going on without it"
                );
                None
            }
        }
    }

    /// The devices to publish for `inventory` (see [`slices::devices`]), shared parents in
    /// their capacity form (see [`Sharing::mark`]), tainted where their link or driver says
    /// they cannot work (see [`taints::apply`]).
    pub fn devices(&self, inventory: &Inventory, retained: &[Device]) -> Vec<Device> {
        let mut devices = slices::devices(inventory, retained);
        self.sharing.mark(&mut devices, inventory);
        taints::apply(&mut devices);
        devices
    }

    /// One full discovery. Never fails: unreadable facts are left out.
    pub async fn scan(&self) -> Inventory {
        let sources = if self.netlink {
            netlink::snapshot().await.into_sources()
        } else {
            Sources::sysfs_only()
        };
        let root = self.root.clone();
        let filter = self.filter.clone();
        let scan = tokio::task::spawn_blocking(move || {
            let routes = netlink::default_route_interfaces(&root);
            inventory::discover(&root, &sources, &routes, &filter)
        });
        match scan.await {
            Ok(mut inv) => {
                if let Some(provisioner) = &self.provisioner {
                    provisioner.label(&mut inv);
                }
                if let Some(offer) = &self.overlay {
                    inv.overlay = crate::inventory::overlay::find(offer).await;
                }
                inv
            }
            Err(e) => {
                tracing::error!(error = %e, "discovery panicked; publishing nothing new");
                Inventory::default()
            }
        }
    }
}

/// Timing of the rescan loop.
#[derive(Debug, Clone)]
pub struct RescanSettings {
    /// Wait this long after a trigger to absorb a burst of link events.
    pub coalesce: Duration,
    /// Rescan at least this often.
    pub period: Duration,
    /// Keep a vanished device published (tainted) this long.
    pub gone_grace: Duration,
}

impl Default for RescanSettings {
    fn default() -> Self {
        RescanSettings {
            coalesce: Duration::from_millis(250),
            period: Duration::from_secs(60),
            gone_grace: taints::GONE_GRACE,
        }
    }
}

/// Devices of this node's pool that prepared claims hold, as published at prepare time.
pub async fn retained(claims: &ClaimStore, node: &str) -> Vec<Device> {
    let Ok(checkpoint) = claims.snapshot().await else {
        return Vec::new();
    };
    checkpoint
        .claims
        .values()
        .flat_map(|c| c.devices.iter())
        .filter(|d| d.pool == node)
        .filter_map(|d| d.published.clone())
        .collect()
}

/// Rescans until `shutdown` turns true, sending the node's devices to `out` whenever they change.
pub async fn keep_current(
    discovery: Discovery,
    node: String,
    claims: Arc<ClaimStore>,
    out: watch::Sender<Vec<Device>>,
    settings: RescanSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut events = match netlink::link_events() {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "no rtnetlink link events; relying on periodic rescans");
            None
        }
    };
    let mut prepared = claims.subscribe();
    let mut scans: u64 = 0;
    // What was published before, so a device that vanishes stays published, tainted.
    let mut gone = Gone::default();
    let mut published = out.borrow().clone();
    gone.update(
        &mut published,
        &retained(&claims, &node).await,
        std::time::SystemTime::now(),
        settings.gone_grace,
    );
    loop {
        if let Some(report) = discovery.provision(&claims).await {
            gone.forget(&report.changed_pfs);
        }
        let inventory = discovery.scan().await;
        let held = retained(&claims, &node).await;
        let mut devices = discovery.devices(&inventory, &held);
        gone.update(
            &mut devices,
            &held,
            std::time::SystemTime::now(),
            settings.gone_grace,
        );
        scans += 1;
        let changed = crate::watches::send_if_changed(&out, devices);
        tracing::debug!(
            scans,
            changed,
            devices = out.borrow().len(),
            "rescan finished"
        );

        let link_event = async {
            match events.as_mut() {
                Some(e) => e.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = link_event => {}
            _ = prepared.changed() => {}
            () = tokio::time::sleep(settings.period) => {}
        }
        // Coalesce: let the burst finish, then drop whatever else queued up meanwhile.
        tokio::time::sleep(settings.coalesce).await;
        if let Some(e) = events.as_mut() {
            while let Some(Some(())) = e.next().now_or_never() {}
        }
    }
}
