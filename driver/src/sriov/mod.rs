//! SR-IOV VF pools from node policy: knic creates the VFs its policy asks for, binds them to the
//! driver the policy names, and never takes VFs away from a pod.
//!
//! Peers need an operator for this; knic does it in the driver because it already knows which
//! VFs are prepared for claims, which is exactly what makes re-provisioning safe or not. A
//! reconcile reads the PFs ([`pf`]), decides per PF ([`provision::decide`]: pure, every rule
//! there) and carries the changes out ([`apply`]). It runs before the first discovery (so the
//! first published slice has the VFs) and before every rescan (so a PF whose driver was
//! reloaded, which drops its VFs, gets them back).
//!
//! Per claim, beyond netdevs: binding a function to `vfio-pci` for DPDK/KubeVirt pods
//! ([`vfio`]) and the RDMA side of a function ([`rdma`]: its character devices and the RDMA
//! netlink messages that move an RDMA device between network namespaces).
//!
//! Provisioning and vfio-pci both change the kernel's state only through one port,
//! [`writes::SysfsWrites`] (paths clamped to the sysfs root, bounded single writes), so one
//! simulated kernel for fixture trees, [`fixture::FixtureKernel`], answers both the way a live
//! `/sys` would, in-process or for a driver process under test.

pub mod apply;
pub mod fixture;
pub mod pf;
pub mod policy;
pub mod provision;
pub mod rdma;
pub mod vfio;
pub mod writes;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::claims::checkpoint::Checkpoint;
use crate::error::Error;
use crate::inventory::{AttrValue, Inventory, Sysfs};
pub use policy::{SriovPolicy, VfDriver};
use writes::SysfsWrites;

/// Whether `text` is a PCI address in sysfs form (`0000:3b:00.2`, lowercase hex, function
/// 0-7): policies, claims and the fixture kernel all turn addresses into path components, so
/// anything else is refused before a path is built.
pub fn is_pci_address(text: &str) -> bool {
    let b = text.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    b.len() == 12
        && hex(0..4)
        && b[4] == b':'
        && hex(5..7)
        && b[7] == b':'
        && hex(8..10)
        && b[10] == b'.'
        && (b'0'..=b'7').contains(&b[11])
}

/// How long a reconcile waits for the kernel to create VFs or bind them, per step.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// What one reconcile did.
#[derive(Debug, Default)]
pub struct Report {
    /// PFs changed (labels).
    pub changed: Vec<String>,
    /// PCI addresses of the PFs changed: their VFs that vanish went on purpose (see
    /// [`crate::slices::taints::Gone::forget`]).
    pub changed_pfs: Vec<String>,
    /// PFs the policy names that were left alone, with the rule.
    pub refused: Vec<Error>,
    /// Changes that were tried and failed.
    pub failed: Vec<Error>,
    /// Entries matching no PF.
    pub unmatched: Vec<String>,
}

/// The attribute naming the policy entry a PF and its VFs belong to, so a DeviceClass can
/// select "VFs of pool fabric" without knowing PF names or addresses.
pub const ATTR_POOL: &str = "sriovPool";

/// Who holds which VFs: a PF's address → claims holding its VFs, and the held VFs' addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// PF PCI address → `namespace/name` of claims with it or one of its VFs prepared.
    pub by_pf: BTreeMap<String, BTreeSet<String>>,
    /// PCI addresses of prepared VFs.
    pub vfs: BTreeSet<String>,
}

impl Held {
    /// The VFs prepared claims hold, from the attributes their devices were published with.
    pub fn from_checkpoint(checkpoint: &Checkpoint) -> Held {
        let mut held = Held::default();
        for claim in checkpoint.claims.values() {
            for device in &claim.devices {
                let Some(attrs) = device
                    .published
                    .as_ref()
                    .and_then(|d| d.attributes.as_ref())
                else {
                    continue;
                };
                let text = |key: &str| attrs.get(key).and_then(|a| a.string.clone());
                // A VF holds its PF; a whole PF holds itself.
                let pf = match text("kind").as_deref() {
                    Some("pf") => text("pciAddress"),
                    _ => text("pfPciAddress"),
                };
                let Some(pf) = pf else {
                    continue;
                };
                held.by_pf
                    .entry(pf)
                    .or_default()
                    .insert(format!("{}/{}", claim.namespace, claim.name));
                if let Some(vf) = text("pciAddress") {
                    held.vfs.insert(vf);
                }
            }
        }
        held
    }
}

/// The PCI functions the node's default routes depend on, with why: discovery's own rule (the
/// interface carrying a route, its bond or bridge master, and those masters' slaves and lower
/// devices), so a PF enslaved to the default-route bond is as safe from provisioning as one
/// carrying the route itself. `routes` are the interfaces carrying the default routes.
pub fn route_bound(root: &std::path::Path, routes: &BTreeSet<String>) -> BTreeMap<String, String> {
    let inventory = crate::inventory::discover(
        root,
        &crate::inventory::Sources::sysfs_only(),
        routes,
        &crate::inventory::Filter::default(),
    );
    inventory
        .excluded
        .into_iter()
        .filter(|e| e.default_route)
        .filter_map(|e| Some((e.device.pci_address?, e.reason)))
        .collect()
}

/// Applies a policy to the PFs below a sysfs root.
pub struct Provisioner {
    root: PathBuf,
    policy: SriovPolicy,
    writes: Arc<dyn SysfsWrites>,
    wait: Duration,
    /// The last refusal or failure text per PF, so a standing one is logged once, not per
    /// rescan.
    reported: Mutex<BTreeMap<String, String>>,
    /// PF address → pool, from the last reconcile, for [`Provisioner::label`].
    pools: Mutex<BTreeMap<String, String>>,
    /// A reconcile is running (possibly stuck in a kernel write).
    busy: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Provisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provisioner")
            .field("root", &self.root)
            .field("pools", &self.policy.pools.len())
            .finish_non_exhaustive()
    }
}

impl Provisioner {
    /// Provisioning under `root` (where `sys/` is writable) through `writes`.
    pub fn new(
        root: impl Into<PathBuf>,
        policy: SriovPolicy,
        writes: Arc<dyn SysfsWrites>,
    ) -> Self {
        Provisioner {
            root: root.into(),
            policy,
            writes,
            wait: DEFAULT_WAIT,
            reported: Mutex::new(BTreeMap::new()),
            pools: Mutex::new(BTreeMap::new()),
            busy: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Waits at most `wait` per step for the kernel.
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// One reconcile: blocking (sysfs writes and bounded waits), so async callers run it on a
    /// blocking thread. `routes` are the PFs the node's default routes depend on, with why
    /// ([`route_bound`]).
    pub fn reconcile(&self, held: &Held, routes: &BTreeMap<String, String>) -> Report {
        use std::sync::atomic::Ordering;
        struct Busy<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Busy<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        if self.busy.swap(true, Ordering::AcqRel) {
            return Report::default();
        }
        let _busy = Busy(&self.busy);
        self.reconcile_now(held, routes)
    }

    /// Whether a reconcile is running (or stuck in the kernel).
    pub fn is_busy(&self) -> bool {
        self.busy.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How long a caller waits for one reconcile before going on without it: every step's
    /// wait (count to 0, count up, a bind per VF) is bounded, so this only passes when a
    /// kernel write itself blocks.
    pub fn deadline(&self) -> Duration {
        self.wait * 4 + Duration::from_secs(30)
    }

    /// Whether some PF's VF count differs from the policy's, the only case where the default
    /// routes matter ([`route_bound`] runs a whole discovery, which a rescan that changes
    /// nothing should not pay for).
    pub fn wants_count_change(&self, held: &Held) -> bool {
        let pfs = pf::read(&Sysfs::new(&self.root));
        provision::decide(&self.policy, &pfs, &held.by_pf, &BTreeMap::new())
            .plans
            .iter()
            .any(|p| p.num_vfs.is_some())
    }

    fn reconcile_now(&self, held: &Held, routes: &BTreeMap<String, String>) -> Report {
        let sysfs = Sysfs::new(&self.root);
        let pfs = pf::read(&sysfs);
        let decision = provision::decide(&self.policy, &pfs, &held.by_pf, routes);
        if let Ok(mut pools) = self.pools.lock() {
            pools.clone_from(&decision.pools);
        }
        let mut report = Report {
            refused: decision.refused,
            unmatched: decision.unmatched,
            ..Report::default()
        };
        for plan in &decision.plans {
            let before = plan.pf.clone();
            match apply::apply(&sysfs, self.writes.as_ref(), plan, &held.vfs, self.wait) {
                Ok(after) if after != before => {
                    report.changed.push(plan.pf.label());
                    report.changed_pfs.push(plan.pf.pci_address.clone());
                }
                Ok(_) => {}
                Err(e) => report.failed.push(e),
            }
        }
        self.log(&report, &decision.plans);
        report
    }

    /// Marks the PFs the policy selects, and their VFs, with the pool's name ([`ATTR_POOL`]).
    pub fn label(&self, inventory: &mut Inventory) {
        let Ok(pools) = self.pools.lock() else {
            return;
        };
        if pools.is_empty() {
            return;
        }
        let devices = inventory
            .devices
            .iter_mut()
            .chain(inventory.excluded.iter_mut().map(|e| &mut e.device));
        for device in devices {
            let pf = device
                .attr("pfPciAddress")
                .and_then(AttrValue::as_str)
                .or(device.pci_address.as_deref());
            if let Some(pool) = pf.and_then(|pf| pools.get(pf)) {
                device
                    .attributes
                    .insert(ATTR_POOL.to_owned(), AttrValue::Str(pool.clone()));
            }
        }
    }

    fn log(&self, report: &Report, plans: &[provision::PfPlan]) {
        let Ok(mut reported) = self.reported.lock() else {
            return;
        };
        let mut now = BTreeMap::new();
        for e in report.refused.iter().chain(&report.failed) {
            if let Error::Sriov { pf, reason } = e {
                if reported.get(pf) != Some(reason) {
                    tracing::warn!(error = %e, "SR-IOV policy not applied to a PF");
                }
                now.insert(pf.clone(), reason.clone());
            }
        }
        for plan in plans {
            let label = plan.pf.label();
            if reported.contains_key(&label) && !now.contains_key(&label) {
                tracing::info!(pf = %label, "SR-IOV policy applies to the PF again");
            }
        }
        *reported = now;
    }
}
