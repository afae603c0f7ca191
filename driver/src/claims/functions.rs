//! The PCI functions of a prepared claim: which devices are handed over as vfio-pci functions
//! (no netdev, nothing for NRI to attach), which have RDMA devices, and what the pod and the
//! claim status learn about them.
//!
//! Prepare computes them once ([`functions`]), records them in the checkpoint, and only then
//! binds the vfio ones ([`bind_all`]); unprepare and a failed prepare give them back
//! ([`restore_all`]) from the record alone, so a crash at any point between the record and the
//! bind leaves enough to restore the original driver.

use std::sync::Arc;

use knic_proto::netconfig::DeviceMode;
use serde::{Deserialize, Serialize};

use crate::claims::checkpoint::{PreparedClaim, PreparedDevice};
use crate::claims::plan::DeviceConfigs;
use crate::error::{Error, Result};
use crate::sriov::rdma::{self, RdmaDevice};
use crate::sriov::vfio::{Vfio, VfioBinding};

/// One PCI function of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PciFunction {
    /// The device's name in the pool.
    pub device: String,
    /// The request it was allocated for.
    pub request: String,
    /// Its PCI address (`0000:3b:00.2`).
    pub pci_address: String,
    /// How it is handed to the pod.
    #[serde(default, skip_serializing_if = "DeviceMode::is_netdev")]
    pub mode: DeviceMode,
    /// For `vfio-pci`: its IOMMU group and the driver to give it back to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio: Option<VfioBinding>,
    /// Its RDMA devices with their verbs character devices (netdev mode only: a function on
    /// vfio-pci has none on the host).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rdma: Vec<RdmaDevice>,
    /// The MAC it was published with, for the status of a function that has no netdev.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

impl PciFunction {
    /// What a VM or DPDK user needs, for the claim status's `data`.
    pub fn status_data(&self) -> serde_json::Value {
        let mut data = serde_json::json!({
            "pciAddress": self.pci_address,
            "deviceMode": self.mode.as_str(),
        });
        if let Some(vfio) = &self.vfio {
            data["vfioGroup"] = vfio.group.into();
        }
        if !self.rdma.is_empty() {
            let names: Vec<&str> = self.rdma.iter().map(|r| r.name.as_str()).collect();
            data["rdmaDevices"] = names.into();
        }
        data
    }
}

/// A string attribute of the device as published.
fn published(device: &PreparedDevice, key: &str) -> Option<String> {
    device
        .published
        .as_ref()?
        .attributes
        .as_ref()?
        .get(key)?
        .string
        .clone()
}

/// The claim's PCI functions, checking every vfio-pci device against `vfio`'s sysfs; the error
/// names the device and the rule. Devices without a PCI address in netdev mode have none.
pub fn functions(
    claim: &PreparedClaim,
    configs: &DeviceConfigs,
    vfio: &Vfio,
) -> Result<Vec<PciFunction>> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (index, device) in claim.devices.iter().enumerate() {
        let mode = configs.device_mode(index);
        let address = published(device, "pciAddress");
        let mac = published(device, "mac");
        let Some(address) = address else {
            if mode == DeviceMode::VfioPci {
                problems.push(format!(
                    "device {}/{}: deviceMode \"vfio-pci\" needs a PCI function, and this device \
                     has no PCI address",
                    device.pool, device.device
                ));
            }
            continue;
        };
        let (binding, rdma) = match mode {
            DeviceMode::VfioPci => match vfio.check(&address) {
                Ok(binding) => (Some(binding), Vec::new()),
                Err(e) => {
                    problems.push(format!("device {}/{}: {e}", device.pool, device.device));
                    continue;
                }
            },
            DeviceMode::Netdev => (None, rdma::devices(vfio.root(), &address)),
        };
        out.push(PciFunction {
            device: device.device.clone(),
            request: device.request.clone(),
            pci_address: address,
            mode,
            vfio: binding,
            rdma,
            mac,
        });
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(Error::Functions(problems.join("; ")))
    }
}

/// Binds every vfio-pci function (blocking sysfs work, off the async threads).
pub async fn bind_all(vfio: &Vfio, functions: &[PciFunction]) -> Result<()> {
    let addresses: Vec<String> = functions
        .iter()
        .filter(|f| f.vfio.is_some())
        .map(|f| f.pci_address.clone())
        .collect();
    if addresses.is_empty() {
        return Ok(());
    }
    let vfio = Arc::new(vfio.clone());
    tokio::task::spawn_blocking(move || addresses.iter().try_for_each(|a| vfio.bind(a)))
        .await
        .map_err(|e| Error::io("binding to vfio-pci", std::io::Error::other(e)))?
}

/// Gives every vfio-pci function back to its original driver; tries them all and reports
/// every failure, so one stuck function does not keep the others on vfio-pci.
pub async fn restore_all(vfio: &Vfio, functions: &[PciFunction]) -> Result<()> {
    let wanted: Vec<(String, Option<String>)> = functions
        .iter()
        .filter_map(|f| Some((f.pci_address.clone(), f.vfio.clone()?.original_driver)))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let vfio = Arc::new(vfio.clone());
    let mut errors = tokio::task::spawn_blocking(move || {
        wanted
            .iter()
            .filter_map(|(a, original)| vfio.restore(a, original.as_deref()).err())
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| Error::io("restoring from vfio-pci", std::io::Error::other(e)))?;
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(Error::Several(errors)),
    }
}
