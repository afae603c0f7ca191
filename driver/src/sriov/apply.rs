//! Carrying out a [`PfPlan`]: the writes to sysfs, and the waits for the kernel's answer.
//!
//! Every write goes through [`SysfsWrites`], so the same code drives a live `/sys` and a fixture
//! tree whose [`super::fixture::FixtureKernel`] answers like the kernel. The kernel refuses to
//! change a non-zero `sriov_numvfs` to another non-zero count (EBUSY), so a change goes through
//! 0; VFs appear while the write runs on most drivers, but their netdevs and driver bindings may
//! follow later, so each step waits, bounded, for what it needs and says what is missing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::pf::{self, PfFacts};
use super::policy::VfDriver;
use super::provision::{PfPlan, VFIO_PCI};
use super::writes::SysfsWrites;
use crate::error::{Error, Result};
use crate::inventory::Sysfs;

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(20);

/// Applies `plan` to its PF: the VF count (through 0 when changing a non-zero count), then the
/// VFs' driver bindings. `held_vfs` are VF addresses claims hold, whose binding is theirs.
pub fn apply(
    sysfs: &Sysfs,
    writes: &dyn SysfsWrites,
    plan: &PfPlan,
    held_vfs: &std::collections::BTreeSet<String>,
    wait: Duration,
) -> Result<PfFacts> {
    let label = plan.pf.label();
    let fail = |reason: String| Error::Sriov {
        pf: label.clone(),
        reason,
    };
    if plan.vf_driver == VfDriver::VfioPci
        && !sysfs.is_dir(Path::new("sys/bus/pci/drivers/vfio-pci"))
    {
        // Checked before anything changes: VFs made for vfio-pci without it would be left
        // with no driver at all.
        return Err(fail(
            "vfDriver vfio-pci: the vfio-pci driver is not loaded (modprobe vfio-pci); nothing \
             was changed"
                .to_owned(),
        ));
    }
    let numvfs = plan.pf.file("sriov_numvfs");
    let result = change_count(sysfs, writes, plan, &numvfs, held_vfs, wait, &fail);
    let autoprobe = plan.pf.file("sriov_drivers_autoprobe");
    if sysfs.read(&autoprobe).as_deref() == Some("0") {
        // Back to the kernel default whatever happened, also for a netdev pool after a crash
        // in the middle of a vfio change: with autoprobe off, the kernel probes no VF without
        // an override, so VFs made later (by knic or anyone) would stay driverless.
        write(sysfs, writes, &autoprobe, "1").map_err(&fail)?;
    }
    result
}

fn change_count(
    sysfs: &Sysfs,
    writes: &dyn SysfsWrites,
    plan: &PfPlan,
    numvfs: &Path,
    held_vfs: &std::collections::BTreeSet<String>,
    wait: Duration,
    fail: &dyn Fn(String) -> Error,
) -> Result<PfFacts> {
    let label = plan.pf.label();
    if let Some(change) = plan.num_vfs {
        if plan.vf_driver == VfDriver::VfioPci && change.to > 0 {
            // New VFs should not be probed by their netdev driver first only to be unbound
            // again: that would flash netdevs (and udev events) on the node for nothing.
            let autoprobe = plan.pf.file("sriov_drivers_autoprobe");
            if sysfs.exists(&autoprobe) {
                write(sysfs, writes, &autoprobe, "0").map_err(fail)?;
            }
        }
        if change.from != 0 {
            write(sysfs, writes, numvfs, "0").map_err(fail)?;
            wait_for(wait, || current(sysfs, &plan.pf).vfs.is_empty()).map_err(|waited| {
                fail(format!(
                    "wrote 0 to sriov_numvfs to change {} VFs to {}, but VFs remain after {} ms",
                    change.from,
                    change.to,
                    waited.as_millis()
                ))
            })?;
        }
        if change.to != 0 {
            write(sysfs, writes, numvfs, &change.to.to_string()).map_err(fail)?;
            let want = change.to as usize;
            let seen = wait_for(wait, || current(sysfs, &plan.pf).vfs.len() >= want);
            if let Err(waited) = seen {
                let now = current(sysfs, &plan.pf);
                let missing: Vec<String> = (0..change.to)
                    .filter(|i| !now.vfs.iter().any(|v| v.index == *i))
                    .take(8)
                    .map(|i| format!("virtfn{i}"))
                    .collect();
                return Err(fail(format!(
                    "{} VFs requested, {} appeared within {} ms (missing {}); the PF's \
                     driver may have refused them (see the kernel log)",
                    change.to,
                    now.vfs.len(),
                    waited.as_millis(),
                    missing.join(", ")
                )));
            }
        }
        tracing::info!(pf = %label, from = change.from, to = change.to, entry = %plan.entry,
            "SR-IOV VF count changed");
    }
    let now = current(sysfs, &plan.pf);
    let again = PfPlan {
        pf: now,
        ..plan.clone()
    };
    let rebind = super::provision::rebind(&again, held_vfs);
    if !rebind.is_empty() {
        bind(sysfs, writes, &again, &rebind, wait).map_err(fail)?;
    }
    Ok(current(sysfs, &plan.pf))
}

/// Binds each VF in `vfs` to what the policy wants: vfio-pci through `driver_override`, or
/// back to its own driver by clearing an override a vfio policy set.
fn bind(
    sysfs: &Sysfs,
    writes: &dyn SysfsWrites,
    plan: &PfPlan,
    vfs: &[String],
    wait: Duration,
) -> std::result::Result<(), String> {
    let vfio = plan.vf_driver == VfDriver::VfioPci;
    for address in vfs {
        let dir = PathBuf::from("sys/bus/pci/devices").join(address);
        let over = if vfio { VFIO_PCI } else { "\n" };
        write(sysfs, writes, &dir.join("driver_override"), over)?;
        if sysfs.exists(&dir.join("driver")) {
            write(sysfs, writes, &dir.join("driver/unbind"), address)?;
        }
        write(
            sysfs,
            writes,
            Path::new("sys/bus/pci/drivers_probe"),
            address,
        )?;
        let bound = || sysfs.link_name(&dir.join("driver"));
        wait_for(wait, || match vfio {
            true => bound().as_deref() == Some(VFIO_PCI),
            false => bound().is_some_and(|d| d != VFIO_PCI),
        })
        .map_err(|waited| {
            format!(
                "VF {address}: not bound to {} within {} ms (now: {})",
                if vfio { VFIO_PCI } else { "its own driver" },
                waited.as_millis(),
                bound().unwrap_or_else(|| "no driver".to_owned())
            )
        })?;
    }
    tracing::info!(pf = %plan.pf.label(), vfs = vfs.len(), driver = plan.vf_driver.as_str(),
        "SR-IOV VFs bound");
    Ok(())
}

fn current(sysfs: &Sysfs, pf: &PfFacts) -> PfFacts {
    pf::read_one(sysfs, pf.pci_address.clone(), pf.real.clone())
}

fn write(
    sysfs: &Sysfs,
    writes: &dyn SysfsWrites,
    rel: &Path,
    value: &str,
) -> std::result::Result<(), String> {
    writes
        .write(sysfs, rel, value)
        .map_err(|e| format!("{:?} not taken: {e}", value.trim_end()))
}

/// Polls `done` until it holds or `limit` passes; the error is the limit.
fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> std::result::Result<(), Duration> {
    let start = Instant::now();
    loop {
        if done() {
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(limit);
        }
        std::thread::sleep(POLL);
    }
}
