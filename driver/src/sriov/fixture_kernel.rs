//! A simulated kernel for PCI driver binding in materialised sysfs fixture trees
//! ([`crate::inventory::fixture`]), so the vfio-pci sequence and its restore run against real
//! files and links without hardware.
//!
//! Every write first lands in the tree through the same bounded write the real kernel path
//! uses (so a missing attribute fails exactly as it would), then the fixture does what the
//! kernel would: `driver_override` reads back `(null)` once cleared, `drivers/<d>/unbind`
//! removes the `driver` link and `drivers/<d>/<bdf>`, and `drivers_probe` binds an unbound
//! function to its override, or else to the driver it had when the fixture started (the
//! kernel's id-table match).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::symlink;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use super::vfio::PciDrivers;
use crate::error::{Error, Result};

/// The simulated kernel of one fixture tree.
#[derive(Debug)]
pub struct FixtureKernel {
    root: PathBuf,
    /// The driver each function had at start: what an unforced probe binds it to.
    native: BTreeMap<String, String>,
    /// Drivers whose probe fails (the function stays unbound), for the error paths.
    refusing: Mutex<BTreeSet<String>>,
    /// Every write, as (root-relative path, value), in order.
    log: Mutex<Vec<(String, String)>>,
}

fn fixture_error(what: impl Into<String>, e: std::io::Error) -> Error {
    Error::io(what, e)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `to` relative to the directory `from` (both absolute, without `..`).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let a: Vec<Component<'_>> = from.components().collect();
    let b: Vec<Component<'_>> = to.components().collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..a.len() {
        out.push("..");
    }
    for c in &b[common..] {
        out.push(c);
    }
    out
}

impl FixtureKernel {
    /// Takes over the tree at `root`: records each function's driver and creates the write-only
    /// attributes a capture has no content for (`drivers/*/bind`, `drivers/*/unbind`,
    /// `drivers_probe`). The root is canonicalised so links are computed between real paths.
    pub fn new(root: &Path) -> Result<Self> {
        let root = root
            .canonicalize()
            .map_err(|e| fixture_error(format!("resolving {}", root.display()), e))?;
        let mut native = BTreeMap::new();
        let devices = root.join("sys/bus/pci/devices");
        if let Ok(entries) = std::fs::read_dir(&devices) {
            for entry in entries.flatten() {
                let address = entry.file_name().to_string_lossy().into_owned();
                if let Some(driver) = std::fs::read_link(entry.path().join("driver"))
                    .ok()
                    .and_then(|t| Some(t.file_name()?.to_string_lossy().into_owned()))
                {
                    native.insert(address, driver);
                }
            }
        }
        let kernel = FixtureKernel {
            root,
            native,
            refusing: Mutex::default(),
            log: Mutex::default(),
        };
        let drivers = kernel.root.join("sys/bus/pci/drivers");
        if let Ok(entries) = std::fs::read_dir(&drivers) {
            for entry in entries.flatten() {
                kernel.attributes(&entry.path())?;
            }
        }
        let probe = kernel.root.join("sys/bus/pci/drivers_probe");
        if !probe.exists() {
            std::fs::write(&probe, "")
                .map_err(|e| fixture_error(format!("creating {}", probe.display()), e))?;
        }
        Ok(kernel)
    }

    fn attributes(&self, driver_dir: &Path) -> Result<()> {
        for name in ["bind", "unbind"] {
            let path = driver_dir.join(name);
            if !path.exists() {
                std::fs::write(&path, "")
                    .map_err(|e| fixture_error(format!("creating {}", path.display()), e))?;
            }
        }
        Ok(())
    }

    /// The canonical root the kernel works under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `modprobe vfio-pci`: the driver directory appears with its attributes.
    pub fn load_vfio_pci(&self) -> Result<()> {
        let dir = self.root.join("sys/bus/pci/drivers/vfio-pci");
        std::fs::create_dir_all(&dir)
            .map_err(|e| fixture_error(format!("creating {}", dir.display()), e))?;
        self.attributes(&dir)
    }

    /// From now on probes by `driver` fail, leaving the function unbound.
    pub fn refuse_probes_by(&self, driver: &str) {
        lock(&self.refusing).insert(driver.to_owned());
    }

    /// Every write so far, as (root-relative path, value).
    pub fn writes(&self) -> Vec<(String, String)> {
        lock(&self.log).clone()
    }

    fn device(&self, address: &str) -> Result<PathBuf> {
        let link = self.root.join("sys/bus/pci/devices").join(address);
        link.canonicalize()
            .map_err(|e| fixture_error(format!("no PCI device {address}"), e))
    }

    fn driver_of(&self, address: &str) -> Option<String> {
        let device = self.device(address).ok()?;
        let target = std::fs::read_link(device.join("driver")).ok()?;
        Some(target.file_name()?.to_string_lossy().into_owned())
    }

    fn unbind(&self, driver: &str, address: &str) -> Result<()> {
        if self.driver_of(address).as_deref() != Some(driver) {
            return Err(fixture_error(
                format!("unbinding {address} from {driver}"),
                std::io::Error::from_raw_os_error(nix::libc::ENODEV),
            ));
        }
        let device = self.device(address)?;
        let gone = |p: PathBuf| {
            std::fs::remove_file(&p)
                .map_err(|e| fixture_error(format!("removing {}", p.display()), e))
        };
        gone(device.join("driver"))?;
        gone(
            self.root
                .join("sys/bus/pci/drivers")
                .join(driver)
                .join(address),
        )
    }

    fn bind(&self, driver: &str, address: &str) -> Result<()> {
        let driver_dir = self.root.join("sys/bus/pci/drivers").join(driver);
        if !driver_dir.is_dir() || lock(&self.refusing).contains(driver) {
            // The probe failed: the function stays unbound, as with a real probe error.
            return Ok(());
        }
        let device = self.device(address)?;
        let link = |target: PathBuf, at: PathBuf| {
            symlink(&target, &at).map_err(|e| fixture_error(format!("linking {}", at.display()), e))
        };
        link(relative(&device, &driver_dir), device.join("driver"))?;
        link(relative(&driver_dir, &device), driver_dir.join(address))
    }

    fn probe(&self, address: &str) -> Result<()> {
        if self.driver_of(address).is_some() {
            return Ok(());
        }
        let device = self.device(address)?;
        let override_text = std::fs::read_to_string(device.join("driver_override"))
            .unwrap_or_default()
            .trim()
            .to_owned();
        let target = if override_text.is_empty() || override_text == "(null)" {
            self.native.get(address).cloned()
        } else {
            Some(override_text)
        };
        match target {
            Some(driver) => self.bind(&driver, address),
            None => Ok(()),
        }
    }
}

impl PciDrivers for FixtureKernel {
    fn write(&self, path: &Path, value: &[u8]) -> Result<()> {
        crate::bounded::write_attribute(path, value)
            .map_err(|e| Error::io("writing a sysfs attribute", e))?;
        let text = String::from_utf8_lossy(value).trim().to_owned();
        let rel = path
            .strip_prefix(&self.root)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| path.to_string_lossy().into_owned());
        lock(&self.log).push((rel.clone(), String::from_utf8_lossy(value).into_owned()));
        let parts: Vec<&str> = rel.split('/').collect();
        match parts.as_slice() {
            ["sys", "bus", "pci", "devices", _, "driver_override"] if text.is_empty() => {
                std::fs::write(path, "(null)\n")
                    .map_err(|e| fixture_error(format!("writing {}", path.display()), e))
            }
            ["sys", "bus", "pci", "drivers", driver, "unbind"] => self.unbind(driver, &text),
            ["sys", "bus", "pci", "drivers", driver, "bind"] => self.bind(driver, &text),
            ["sys", "bus", "pci", "drivers_probe"] => self.probe(&text),
            _ => Ok(()),
        }
    }
}
