//! A PCI function's identity (class, vendor and device IDs) from its `uevent`, in one read.
//!
//! The kernel writes all of it into a PCI device's `uevent` (`PCI_CLASS=20000`,
//! `PCI_ID=8086:1889`, `PCI_SUBSYS_ID=8086:0000`, from the same `struct pci_dev` fields the
//! `class`, `vendor`, `device`, `subsystem_*` files print), so one open, read and close stands
//! in for five: a fifth of a VF's system calls in a pass over a thousand functions. A field the
//! file lacks or cannot be parsed is read from its own file instead, so a tree without
//! `uevent` (the fixtures, an odd kernel) is read exactly as before.

use crate::inventory::sysfs::Dir;

/// The identity fields of one PCI function; `None` where neither source had a value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct PciIdentity {
    pub class: Option<u32>,
    pub vendor: Option<u16>,
    pub device: Option<u16>,
    pub sub_vendor: Option<u16>,
    pub sub_device: Option<u16>,
}

impl PciIdentity {
    /// The function open as `dir`: `uevent` first, the single files for what it lacks.
    pub(super) fn read(dir: &Dir<'_>) -> PciIdentity {
        let from_uevent = dir
            .read("uevent")
            .map(|text| PciIdentity::parse(&text))
            .unwrap_or_default();
        let hex16 = |file: &str| dir.read_hex(file).and_then(|v| u16::try_from(v).ok());
        PciIdentity {
            class: from_uevent.class.or_else(|| dir.read_hex("class")),
            vendor: from_uevent.vendor.or_else(|| hex16("vendor")),
            device: from_uevent.device.or_else(|| hex16("device")),
            sub_vendor: from_uevent.sub_vendor.or_else(|| hex16("subsystem_vendor")),
            sub_device: from_uevent.sub_device.or_else(|| hex16("subsystem_device")),
        }
    }

    /// The fields of a `uevent` text; lines it does not know, or cannot parse, count as absent.
    pub(super) fn parse(text: &str) -> PciIdentity {
        let mut out = PciIdentity::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            match key {
                "PCI_CLASS" => out.class = hex(value).filter(|c| *c <= 0xff_ffff),
                "PCI_ID" => (out.vendor, out.device) = pair(value),
                "PCI_SUBSYS_ID" => (out.sub_vendor, out.sub_device) = pair(value),
                _ => {}
            }
        }
        out
    }
}

/// A hex number as the kernel prints it in `uevent` (`%04X`, no `0x`).
fn hex(value: &str) -> Option<u32> {
    if value.is_empty() || value.len() > 8 || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(value, 16).ok()
}

/// `VVVV:DDDD`, both or neither.
fn pair(value: &str) -> (Option<u16>, Option<u16>) {
    let parsed = value.split_once(':').and_then(|(a, b)| {
        let a = u16::try_from(hex(a)?).ok()?;
        let b = u16::try_from(hex(b)?).ok()?;
        Some((a, b))
    });
    match parsed {
        Some((a, b)) => (Some(a), Some(b)),
        None => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A VF's `uevent` as Linux writes it (`pci_uevent` after the driver's line).
    const IAVF: &str = "DRIVER=iavf\nPCI_CLASS=20000\nPCI_ID=8086:1889\n\
        PCI_SUBSYS_ID=8086:0000\nPCI_SLOT_NAME=0000:10:01.0\n\
        MODALIAS=pci:v00008086d00001889sv00008086sd00000000bc02sc00i00\n";

    #[test]
    fn inventory_uevent_gives_class_and_ids() {
        assert_eq!(
            PciIdentity::parse(IAVF),
            PciIdentity {
                class: Some(0x02_0000),
                vendor: Some(0x8086),
                device: Some(0x1889),
                sub_vendor: Some(0x8086),
                sub_device: Some(0),
            }
        );
    }

    /// What cannot be read is absent (and then read from its own file), never a wrong value.
    #[test]
    fn inventory_uevent_garbage_is_absent() {
        for text in [
            "",
            "PCI_CLASS=\nPCI_ID=8086\nPCI_SUBSYS_ID=:\n",
            "PCI_CLASS=zz\nPCI_ID=8086:1889:1\nPCI_SUBSYS_ID=18086:0000\n",
            "PCI_CLASS=1000000\nPCI_ID=-1:2\nPCI_SUBSYS_ID=8086:+1\n",
            "PCI_CLASS 20000\nPCI_ID\n=\n\u{0}",
        ] {
            assert_eq!(PciIdentity::parse(text), PciIdentity::default(), "{text:?}");
        }
        // One good field among bad ones is kept.
        let mixed = PciIdentity::parse("PCI_ID=nope\nPCI_CLASS=20000\n");
        assert_eq!(
            mixed,
            PciIdentity {
                class: Some(0x02_0000),
                ..PciIdentity::default()
            }
        );
    }
}
