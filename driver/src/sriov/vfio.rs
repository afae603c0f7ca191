//! Binding a PCI function to `vfio-pci` and back, through sysfs under a configurable root.
//!
//! The checks come first and are all refusals with the rule: a function without an IOMMU
//! group, or whose group holds other devices, cannot be given to a pod safely (VFIO hands out
//! whole groups, so the other devices' DMA would go with it), and without the `vfio-pci`
//! module loaded there is nothing to bind to. The bind itself is the kernel's documented
//! `driver_override` sequence; the restore clears the override and lets the kernel's normal
//! matching give the function back to its original driver, which the caller recorded in the
//! checkpoint before the first write (see [`crate::claims`]).
//!
//! Reads go to the tree directly; every write goes through [`SysfsWrites`] (paths resolved and
//! clamped under the root, as provisioning's are), so the fixture kernel
//! ([`super::fixture::FixtureKernel`]) can play the kernel's part in tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::is_pci_address;
use super::writes::SysfsWrites;
use crate::error::{Error, Result};
use crate::inventory::Sysfs;

/// The driver a vfio device is bound to.
pub const VFIO_DRIVER: &str = "vfio-pci";

/// How long a bind or restore waits for the `driver` link to name the expected driver. Probing
/// is synchronous in the kernel unless the driver probes asynchronously; a VF probe takes well
/// under a second.
pub const BIND_WAIT: Duration = Duration::from_secs(5);

/// The most IOMMU group members listed in an error (a group can hold a whole bridge).
const MAX_NAMED_MEMBERS: usize = 8;

/// What prepare records about a vfio-pci function before touching it, so unprepare (even
/// after a crash between the record and the bind) can give it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VfioBinding {
    /// The function's IOMMU group: the pod gets `/dev/vfio/<group>`.
    pub group: u32,
    /// The driver the function had before (`None`: it had none), to give it back to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_driver: Option<String>,
}

/// Binds and restores PCI functions under one sysfs root.
#[derive(Clone)]
pub struct Vfio {
    root: PathBuf,
    writes: Arc<dyn SysfsWrites>,
    wait: Duration,
}

impl std::fmt::Debug for Vfio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vfio")
            .field("root", &self.root)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl Vfio {
    /// Functions under `root` (the parent of `sys/`), writing through `writes`.
    pub fn new(root: impl Into<PathBuf>, writes: Arc<dyn SysfsWrites>) -> Self {
        Vfio {
            root: root.into(),
            writes,
            wait: BIND_WAIT,
        }
    }

    /// Waits at most `wait` for a (re)bind to show (tests use a short one).
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The sysfs root (parent of `sys/`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn refuse(address: &str, reason: impl Into<String>) -> Error {
        Error::Vfio {
            address: address.to_owned(),
            reason: reason.into(),
        }
    }

    /// Root-relative, as writes take them.
    fn device_rel(address: &str) -> PathBuf {
        Path::new("sys/bus/pci/devices").join(address)
    }

    /// Root-relative, as writes take them.
    fn driver_rel(driver: &str) -> PathBuf {
        Path::new("sys/bus/pci/drivers").join(driver)
    }

    fn device_dir(&self, address: &str) -> PathBuf {
        self.root.join(Self::device_rel(address))
    }

    fn driver_dir(&self, driver: &str) -> PathBuf {
        self.root.join(Self::driver_rel(driver))
    }

    /// The last component of a symlink's target (sysfs links are relative, kernel style).
    fn link_name(path: &Path) -> Option<String> {
        let target = std::fs::read_link(path).ok()?;
        let name = target.file_name()?.to_str()?.to_owned();
        (!name.is_empty() && name != "..").then_some(name)
    }

    /// The driver the function is bound to now, if any.
    pub fn current_driver(&self, address: &str) -> Option<String> {
        Self::link_name(&self.device_dir(address).join("driver"))
    }

    /// Checks that `address` can be given to a pod through vfio-pci and returns what must be
    /// recorded before binding it. Every refusal names the rule.
    pub fn check(&self, address: &str) -> Result<VfioBinding> {
        if !is_pci_address(address) {
            return Err(Self::refuse(
                address,
                "is not a PCI address of the form 0000:3b:00.2",
            ));
        }
        let device = self.device_dir(address);
        if std::fs::symlink_metadata(&device).is_err() {
            return Err(Self::refuse(
                address,
                format!(
                    "not found at {}: the function is gone from this node",
                    device.display()
                ),
            ));
        }
        let vfs = std::fs::read_to_string(device.join("sriov_numvfs"))
            .ok()
            .and_then(|n| n.trim().parse::<u32>().ok())
            .unwrap_or(0);
        if vfs > 0 {
            // Unbinding a PF's driver disables SR-IOV: every VF, prepared for other claims or
            // not, would vanish with it.
            return Err(Self::refuse(
                address,
                format!(
                    "is an SR-IOV PF with {vfs} VFs: binding it to vfio-pci would unbind its \
                     driver and destroy them; set its VF count to 0 first"
                ),
            ));
        }
        let Some(group_text) = Self::link_name(&device.join("iommu_group")) else {
            return Err(Self::refuse(
                address,
                "has no IOMMU group: vfio-pci needs the IOMMU enabled (intel_iommu=on or \
                 amd_iommu=on on the kernel command line)",
            ));
        };
        let group: u32 = group_text.parse().map_err(|_| {
            Self::refuse(
                address,
                format!(
                    "IOMMU group link names {}, not a group number",
                    crate::bounded::quote(&group_text, 32)
                ),
            )
        })?;
        let members_dir = self
            .root
            .join(format!("sys/kernel/iommu_groups/{group}/devices"));
        let mut others: Vec<String> = std::fs::read_dir(&members_dir)
            .map_err(|e| {
                Self::refuse(
                    address,
                    format!(
                        "cannot list IOMMU group {group} ({}): {e}",
                        members_dir.display()
                    ),
                )
            })?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name != address)
            .take(1024)
            .collect();
        if !others.is_empty() {
            others.sort();
            let count = others.len();
            let mut named = others
                .iter()
                .take(MAX_NAMED_MEMBERS)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ");
            if count > MAX_NAMED_MEMBERS {
                named.push_str(&format!(" and {} more", count - MAX_NAMED_MEMBERS));
            }
            return Err(Self::refuse(
                address,
                format!(
                    "IOMMU group {group} also holds {named}: vfio-pci gives a pod the whole \
                     group, so only a function alone in its group can be given"
                ),
            ));
        }
        if !self.driver_dir(VFIO_DRIVER).is_dir() {
            return Err(Self::refuse(
                address,
                "vfio-pci driver not loaded (modprobe vfio-pci)",
            ));
        }
        Ok(VfioBinding {
            group,
            original_driver: self.current_driver(address),
        })
    }

    fn write(&self, rel: PathBuf, value: &str) -> Result<()> {
        self.writes
            .write(&Sysfs::new(&self.root), &rel, value)
            .map_err(|e| Error::io("writing a sysfs attribute", e))
    }

    /// Waits until the function's driver is `want` (`None`: no driver), or says what it is.
    fn wait_for(&self, address: &str, want: Option<&str>) -> Result<()> {
        let deadline = Instant::now() + self.wait;
        loop {
            let now = self.current_driver(address);
            if now.as_deref() == want {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let want = want.unwrap_or("no driver");
                let now = now.unwrap_or_else(|| "no driver".to_owned());
                return Err(Self::refuse(
                    address,
                    format!(
                        "expected {want} after probing, but after {} ms it has {now} (see the \
                         kernel log for the probe error)",
                        self.wait.as_millis()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Binds the function to vfio-pci: `driver_override` first (so nothing that probes in
    /// between can hand it back to its old driver), unbind from the current driver, probe,
    /// then checks the `driver` link. Idempotent: a function already on vfio-pci is left alone.
    pub fn bind(&self, address: &str) -> Result<()> {
        if !is_pci_address(address) {
            return Err(Self::refuse(
                address,
                "is not a PCI address of the form 0000:3b:00.2",
            ));
        }
        if self.current_driver(address).as_deref() == Some(VFIO_DRIVER) {
            return Ok(());
        }
        self.write(
            Self::device_rel(address).join("driver_override"),
            VFIO_DRIVER,
        )?;
        if let Some(current) = self.current_driver(address) {
            self.write(Self::driver_rel(&current).join("unbind"), address)?;
        }
        self.write(PathBuf::from("sys/bus/pci/drivers_probe"), address)?;
        self.wait_for(address, Some(VFIO_DRIVER))
    }

    /// Gives the function back to `original` (or leaves it driverless when it had none):
    /// clears `driver_override` (keeps it when `original` is vfio-pci itself), unbinds
    /// whatever holds it now, probes, and checks.
    /// Idempotent, so a retried unprepare, or one after a crash mid-bind, converges.
    pub fn restore(&self, address: &str, original: Option<&str>) -> Result<()> {
        if !is_pci_address(address) {
            return Err(Self::refuse(
                address,
                "is not a PCI address of the form 0000:3b:00.2",
            ));
        }
        // A function that was on vfio-pci before (an SR-IOV pool bound it) keeps the pool's
        // override, so the pool still recognises it as its own; any other loses knic's.
        let over = if original == Some(VFIO_DRIVER) {
            VFIO_DRIVER
        } else {
            "\n"
        };
        self.write(Self::device_rel(address).join("driver_override"), over)?;
        let current = self.current_driver(address);
        if current.as_deref() == original {
            return Ok(());
        }
        if let Some(current) = current {
            self.write(Self::driver_rel(&current).join("unbind"), address)?;
        }
        if original.is_some() {
            self.write(PathBuf::from("sys/bus/pci/drivers_probe"), address)?;
        }
        self.wait_for(address, original)
    }
}

#[cfg(test)]
mod tests;
