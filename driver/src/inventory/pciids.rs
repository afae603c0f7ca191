//! Vendor and device names from the PCI ID database.
//!
//! Names are what a person recognises in `kubectl get resourceslice`, so the host's own
//! `pci.ids` (kept current by the distribution) wins, looked up under the same root as sysfs;
//! the copy embedded in the `pci-ids` crate fills the gaps. A missing database is never an error:
//! the name attributes are simply left out.

use crate::bounded::Links;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// pci.ids is about 1.4 MB today; 8 MiB leaves room and bounds a hostile file.
const MAX_PCI_IDS_BYTES: u64 = 8 << 20;

/// Where distributions install `pci.ids`, relative to the root: Debian first, then
/// Fedora/RHEL/Arch (Debian's `hwdata` links the second to the first).
pub const HOST_PCI_IDS: [&str; 2] = ["usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids"];

/// A parsed `pci.ids` file (vendors and their devices; subsystems and classes are skipped).
#[derive(Debug, Clone, Default)]
pub struct PciDb {
    vendors: HashMap<u16, VendorEntry>,
}

#[derive(Debug, Clone, Default)]
struct VendorEntry {
    name: String,
    devices: HashMap<u16, String>,
}

impl PciDb {
    /// Parses the `pci.ids` text format: `vvvv  Vendor` at column 0, `\tdddd  Device` below it,
    /// `\t\tssss ssss  Subsystem` (ignored), `#` comments, and a trailing `C xx  Class` section
    /// (ignored). Malformed lines are skipped: a damaged file should cost names, not discovery.
    pub fn parse(text: &str) -> PciDb {
        let mut db = PciDb::default();
        let mut vendor: Option<u16> = None;
        for line in text.lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(rest) = line.strip_prefix('\t') {
                if rest.starts_with('\t') {
                    continue; // subsystem or class prog-if
                }
                let (Some(v), Some((id, name))) = (vendor, split_id(rest)) else {
                    continue;
                };
                if let Some(entry) = db.vendors.get_mut(&v) {
                    entry.devices.insert(id, name.to_owned());
                }
                continue;
            }
            // Column 0: a vendor, or the start of the class section (or junk): either way the
            // device lines that follow belong to it only if it is a vendor.
            vendor = None;
            if let Some((id, name)) = split_id(line) {
                vendor = Some(id);
                db.vendors.insert(
                    id,
                    VendorEntry {
                        name: name.to_owned(),
                        devices: HashMap::new(),
                    },
                );
            }
        }
        db
    }

    /// The vendor's name, if listed.
    pub fn vendor_name(&self, vendor: u16) -> Option<&str> {
        Some(self.vendors.get(&vendor)?.name.as_str())
    }

    /// The device's name, if listed under its vendor.
    pub fn device_name(&self, vendor: u16, device: u16) -> Option<&str> {
        Some(self.vendors.get(&vendor)?.devices.get(&device)?.as_str())
    }

    /// Number of vendors parsed; lets callers tell an empty or foreign file from a real one.
    pub fn vendor_count(&self) -> usize {
        self.vendors.len()
    }
}

/// `"8086  Intel Corporation"` → `(0x8086, "Intel Corporation")`.
fn split_id(text: &str) -> Option<(u16, &str)> {
    let id = text.get(..4)?;
    let rest = text.get(4..)?;
    if !id.bytes().all(|b| b.is_ascii_hexdigit()) || !rest.starts_with([' ', '\t']) {
        return None;
    }
    let name = rest.trim();
    if name.is_empty() {
        return None;
    }
    Some((u16::from_str_radix(id, 16).ok()?, name))
}

/// Name lookups: the host database under the root first, then the embedded one.
#[derive(Debug, Clone, Default)]
pub struct PciNames {
    host: Option<Arc<PciDb>>,
    embedded: bool,
}

impl PciNames {
    /// Loads the first host `pci.ids` found under `root` ([`HOST_PCI_IDS`]) and enables the
    /// embedded fallback.
    ///
    /// Every rescan calls this, so a parsed file is kept and reused until its size or
    /// modification time changes: parsing the full database (over a megabyte) on each link
    /// event would put that cost on the rescan path.
    pub fn load(root: &Path) -> PciNames {
        type Parsed = HashMap<PathBuf, (u64, Option<SystemTime>, Arc<PciDb>)>;
        static PARSED: Mutex<Option<Parsed>> = Mutex::new(None);
        let host = HOST_PCI_IDS.iter().find_map(|rel| {
            let path = root.join(rel);
            let meta = std::fs::metadata(&path).ok()?;
            let stamp = (meta.len(), meta.modified().ok());
            let mut cache = PARSED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let cache = cache.get_or_insert_with(HashMap::new);
            if let Some((len, modified, db)) = cache.get(&path)
                && (*len, *modified) == stamp
            {
                return Some(db.clone());
            }
            // A FIFO or a huge file under the sysfs root must not hang or bloat discovery.
            let text =
                crate::bounded::read_regular(&path, MAX_PCI_IDS_BYTES, Links::Follow).ok()?;
            let db = Arc::new(PciDb::parse(&String::from_utf8_lossy(&text)));
            tracing::debug!(path = %path.display(), vendors = db.vendor_count(), "loaded pci.ids");
            cache.insert(path, (stamp.0, stamp.1, db.clone()));
            Some(db)
        });
        PciNames {
            host,
            embedded: true,
        }
    }

    /// Only the given database, without the embedded fallback (tests, or an operator-supplied
    /// file that must be authoritative).
    pub fn from_db(db: Option<PciDb>) -> PciNames {
        PciNames {
            host: db.map(Arc::new),
            embedded: false,
        }
    }

    /// The vendor's name.
    pub fn vendor(&self, vendor: u16) -> Option<String> {
        if let Some(name) = self.host.as_ref().and_then(|db| db.vendor_name(vendor)) {
            return Some(name.to_owned());
        }
        if !self.embedded {
            return None;
        }
        use pci_ids::FromId;
        pci_ids::Vendor::from_id(vendor).map(|v| v.name().to_owned())
    }

    /// The device's name.
    pub fn device(&self, vendor: u16, device: u16) -> Option<String> {
        if let Some(name) = self
            .host
            .as_ref()
            .and_then(|db| db.device_name(vendor, device))
        {
            return Some(name.to_owned());
        }
        if !self.embedded {
            return None;
        }
        pci_ids::Device::from_vid_pid(vendor, device).map(|d| d.name().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
#\tList of PCI ID's
#
# Syntax:
# vendor  vendor_name
#\tdevice  device_name\t\t\t\t<-- single tab
#\t\tsubvendor subdevice  subsystem_name\t<-- two tabs

0001  SafeNet (wrong ID)
8086  Intel Corporation
\t1521  I350 Gigabit Network Connection
\t\t8086 00a3  Ethernet Network Adapter I350-T4 for OCP NIC 3.0
\t159b  Ethernet Controller E810-XXV for SFP
\t\t8086 0003  Ethernet Network Adapter E810-XXV-2
\tzzzz  not hex
15b3  Mellanox Technologies
\t1017  MT27800 Family [ConnectX-5]
bogus line
\t1234  orphan device after a bad vendor line

# List of known device classes, subclasses and programming interfaces
C 02  Network controller
\t00  Ethernet controller
\t07  Infiniband controller
";

    #[test]
    fn inventory_pciids_parser() {
        let db = PciDb::parse(SAMPLE);
        assert_eq!(db.vendor_count(), 3);
        assert_eq!(db.vendor_name(0x8086), Some("Intel Corporation"));
        assert_eq!(db.vendor_name(0x15b3), Some("Mellanox Technologies"));
        assert_eq!(
            db.device_name(0x8086, 0x1521),
            Some("I350 Gigabit Network Connection")
        );
        assert_eq!(
            db.device_name(0x8086, 0x159b),
            Some("Ethernet Controller E810-XXV for SFP")
        );
        assert_eq!(
            db.device_name(0x15b3, 0x1017),
            Some("MT27800 Family [ConnectX-5]")
        );
        // Subsystems and class lines are not devices.
        assert_eq!(db.device_name(0x8086, 0x8086), None);
        assert_eq!(db.device_name(0x15b3, 0x1234), None);
        assert_eq!(db.device_name(0x15b3, 0x0000), None);
        assert_eq!(db.vendor_name(0x0002), None);
        assert_eq!(PciDb::parse("").vendor_count(), 0);
    }

    #[test]
    fn inventory_pciids_host_file_wins_then_embedded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usr/share/hwdata/pci.ids");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "8086  Host Intel\n\t159b  Host E810\n").unwrap();
        let names = PciNames::load(dir.path());
        assert_eq!(names.vendor(0x8086).as_deref(), Some("Host Intel"));
        assert_eq!(names.device(0x8086, 0x159b).as_deref(), Some("Host E810"));
        // Not in the host file: the embedded database answers.
        assert_eq!(
            names.vendor(0x15b3).as_deref(),
            Some("Mellanox Technologies")
        );
        assert_eq!(
            names.device(0x8086, 0x1889).as_deref(),
            Some("Ethernet Adaptive Virtual Function")
        );
        // Debian's location is preferred over hwdata's.
        let debian = dir.path().join("usr/share/misc/pci.ids");
        std::fs::create_dir_all(debian.parent().unwrap()).unwrap();
        std::fs::write(&debian, "8086  Debian Intel\n").unwrap();
        assert_eq!(
            PciNames::load(dir.path()).vendor(0x8086).as_deref(),
            Some("Debian Intel")
        );
        let none = PciNames::from_db(None);
        assert_eq!(none.vendor(0x8086), None);
        assert_eq!(none.device(0x8086, 0x159b), None);
    }
}
