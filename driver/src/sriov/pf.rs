//! What provisioning needs to know about the node's PFs, read from sysfs under the root.

use std::path::{Path, PathBuf};

use crate::inventory::Sysfs;

/// One VF as its PF's `virtfnN` link shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfFacts {
    /// N of `virtfnN`.
    pub index: u32,
    /// The VF's PCI address.
    pub pci_address: String,
    /// The driver it is bound to, if any.
    pub driver: Option<String>,
    /// Its `driver_override`, if set.
    pub driver_override: Option<String>,
}

/// One PCI network function that is not a VF: a PF candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PfFacts {
    /// The PCI address.
    pub pci_address: String,
    /// The function's root-relative real directory.
    pub real: PathBuf,
    /// Its netdev names (`net/`), sorted.
    pub names: Vec<String>,
    /// Vendor and device id.
    pub pci_id: Option<(u16, u16)>,
    /// `sriov_totalvfs`; `None` when the function is not SR-IOV capable.
    pub total_vfs: Option<u32>,
    /// `sriov_numvfs`.
    pub num_vfs: Option<u32>,
    /// The VFs that exist now, by index.
    pub vfs: Vec<VfFacts>,
}

impl PfFacts {
    /// How messages name the PF: its interface and its address, since either may be what the
    /// admin knows it by.
    pub fn label(&self) -> String {
        match self.names.first() {
            Some(name) => format!("{name} ({})", self.pci_address),
            None => self.pci_address.clone(),
        }
    }

    /// The root-relative path of one of its attribute files.
    pub fn file(&self, name: &str) -> PathBuf {
        self.real.join(name)
    }
}

/// Every PCI network function (class 0x02) that is not itself a VF, with its VFs.
pub fn read(sysfs: &Sysfs) -> Vec<PfFacts> {
    let bus = Path::new("sys/bus/pci/devices");
    let mut out = Vec::new();
    for bdf in sysfs.list(bus) {
        let real = sysfs.resolve(&bus.join(&bdf));
        let class = sysfs.read_hex(&real.join("class"));
        if class.is_none_or(|c| c >> 16 != 0x02) {
            continue;
        }
        if sysfs.exists(&real.join("physfn")) {
            continue;
        }
        out.push(read_one(sysfs, bdf, real));
    }
    out
}

/// Reads one function's facts (again, after a change).
pub fn read_one(sysfs: &Sysfs, pci_address: String, real: PathBuf) -> PfFacts {
    let hex16 = |file: &str| {
        sysfs
            .read_hex(&real.join(file))
            .and_then(|v| u16::try_from(v).ok())
    };
    let count = |file: &str| {
        sysfs
            .read_i64(&real.join(file))
            .and_then(|v| u32::try_from(v).ok())
    };
    let mut vfs = Vec::new();
    for entry in sysfs.list(&real) {
        let Some(index) = entry
            .strip_prefix("virtfn")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let link = real.join(&entry);
        let Some(vf_address) = sysfs.link_name(&link) else {
            continue;
        };
        let vf_real = sysfs.resolve(&link);
        vfs.push(VfFacts {
            index,
            pci_address: vf_address,
            driver: sysfs.link_name(&vf_real.join("driver")),
            driver_override: sysfs
                .read(&vf_real.join("driver_override"))
                .filter(|o| o != "(null)"),
        });
    }
    vfs.sort_by_key(|v| v.index);
    PfFacts {
        names: sysfs.list(&real.join("net")),
        pci_id: hex16("vendor").zip(hex16("device")),
        total_vfs: count("sriov_totalvfs").filter(|n| *n > 0),
        num_vfs: count("sriov_numvfs"),
        vfs,
        pci_address,
        real,
    }
}
