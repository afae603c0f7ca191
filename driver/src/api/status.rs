//! Claim status: what attach did, written to `status.devices` by server-side apply.

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Patch, PatchParams};

use crate::BoxFuture;
use crate::claims::checkpoint::PreparedClaim;
use crate::error::Result;
use crate::pods::{DeviceStatus, StatusSink};

/// Writes `status.devices` with server-side apply, field manager `knic.dev`.
pub struct KubeStatus {
    client: kube::Client,
}

impl KubeStatus {
    /// Uses `client` for every write.
    pub fn new(client: kube::Client) -> Self {
        KubeStatus { client }
    }
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The apply body for one claim's entries: whole entries (driver, pool, device, conditions with
/// reason and lastTransitionTime, networkData), as the apiserver validates them.
pub fn status_patch(
    claim: &PreparedClaim,
    devices: &[DeviceStatus],
    now: &str,
) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = devices
        .iter()
        .map(|d| {
            let mut entry = serde_json::json!({
                "driver": knic_proto::DRIVER_NAME,
                "pool": d.pool,
                "device": d.device,
                "conditions": [{
                    "type": "Ready",
                    "status": if d.ready { "True" } else { "False" },
                    "reason": d.reason,
                    "message": d.message,
                    "lastTransitionTime": now,
                }],
            });
            if let Some(name) = &d.interface_name {
                let mut data = serde_json::json!({"interfaceName": name, "ips": d.ips});
                if let Some(mac) = &d.hardware_address {
                    data["hardwareAddress"] = mac.clone().into();
                }
                entry["networkData"] = data;
            } else if d.ready
                && let Some(mac) = &d.hardware_address
            {
                // A function without a netdev (vfio-pci): its MAC is all the network data.
                entry["networkData"] = serde_json::json!({"hardwareAddress": mac});
            }
            if let Some(data) = &d.data {
                entry["data"] = data.clone();
            }
            // A share of a device is its own list entry (shareID is a list-map key) and must
            // name the allocation it belongs to.
            if let Some(share) = claim
                .devices
                .iter()
                .find(|x| x.pool == d.pool && x.device == d.device)
                .and_then(|x| x.share_id.as_ref())
            {
                entry["shareID"] = share.clone().into();
            }
            entry
        })
        .collect();
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace},
        "status": {"devices": entries},
    })
}

impl StatusSink for KubeStatus {
    fn write<'a>(
        &'a self,
        claim: &'a PreparedClaim,
        devices: &'a [DeviceStatus],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let api: kube::Api<ResourceClaim> =
                kube::Api::namespaced(self.client.clone(), &claim.namespace);
            let body = status_patch(claim, devices, &now_rfc3339());
            let params = PatchParams::apply(knic_proto::DRIVER_NAME).force();
            api.patch_status(&claim.name, &params, &Patch::Apply(&body))
                .await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_patch_carries_whole_entries() {
        let claim = PreparedClaim {
            network_label: None,
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u".into(),
            pod_uid: "p".into(),
            pod_name: "pod".into(),
            devices: vec![],
            configs: vec![],
            prepared_at: 0,
            attachments: vec![],
            allocations: vec![],
            functions: vec![],
        };
        let ok = DeviceStatus {
            pool: "node-a".into(),
            device: "d0".into(),
            ready: true,
            reason: "InterfaceConfigured".into(),
            message: "net1 configured".into(),
            interface_name: Some("net1".into()),
            ips: vec!["192.0.2.10/24".into()],
            hardware_address: Some("02:00:00:00:00:10".into()),
            data: None,
        };
        let failed = DeviceStatus {
            ready: false,
            reason: "AttachFailed".into(),
            interface_name: None,
            ..ok.clone()
        };
        let patch = status_patch(&claim, &[ok, failed], "2026-11-22T00:00:00Z");
        assert_eq!(
            patch,
            serde_json::json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "c", "namespace": "ns"},
                "status": {"devices": [
                    {"driver": "knic.dev", "pool": "node-a", "device": "d0",
                     "conditions": [{"type": "Ready", "status": "True", "reason": "InterfaceConfigured",
                                     "message": "net1 configured", "lastTransitionTime": "2026-11-22T00:00:00Z"}],
                     "networkData": {"interfaceName": "net1", "ips": ["192.0.2.10/24"], "hardwareAddress": "02:00:00:00:00:10"}},
                    {"driver": "knic.dev", "pool": "node-a", "device": "d0",
                     "conditions": [{"type": "Ready", "status": "False", "reason": "AttachFailed",
                                     "message": "net1 configured", "lastTransitionTime": "2026-11-22T00:00:00Z"}]},
                ]},
            })
        );
        assert_eq!(now_rfc3339().len(), 20);
    }

    #[test]
    fn a_share_of_a_device_names_its_share_id() {
        let claim: PreparedClaim = serde_json::from_value(serde_json::json!({
            "namespace": "ns", "name": "c", "uid": "u", "podUid": "p", "podName": "pod",
            "devices": [{"request": "net", "pool": "node-a", "device": "ens1f0",
                         "shareId": "8e2f1b7a-0c43-4c1e-9a55-2f1d1c0b7e11"}],
            "configs": [], "preparedAt": 0,
        }))
        .expect("claim");
        let entry = DeviceStatus {
            pool: "node-a".into(),
            device: "ens1f0".into(),
            ready: true,
            reason: "InterfaceConfigured".into(),
            message: "net1 configured".into(),
            interface_name: Some("net1".into()),
            ips: vec![],
            hardware_address: None,
            data: None,
        };
        let patch = status_patch(&claim, &[entry], "2026-11-22T00:00:00Z");
        assert_eq!(
            patch["status"]["devices"][0]["shareID"],
            "8e2f1b7a-0c43-4c1e-9a55-2f1d1c0b7e11"
        );
    }

    #[test]
    fn a_vfio_entry_carries_its_data_and_mac_without_an_interface() {
        let claim: PreparedClaim = serde_json::from_value(serde_json::json!({
            "namespace": "ns", "name": "c", "uid": "u", "podUid": "p", "podName": "pod",
            "devices": [{"request": "dpdk", "pool": "node-a", "device": "vf-3b-00-2"}],
            "configs": [], "preparedAt": 0,
            "functions": [{"device": "vf-3b-00-2", "request": "dpdk", "pciAddress": "0000:3b:00.2",
                           "mode": "vfio-pci", "vfio": {"group": 200, "originalDriver": "mlx5_core"},
                           "mac": "02:00:00:cc:00:00"}],
        }))
        .expect("claim");
        let entries = crate::pods::vfio_statuses(&claim, "ns/pod");
        let patch = status_patch(&claim, &entries, "2026-11-22T00:00:00Z");
        assert_eq!(
            patch["status"]["devices"],
            serde_json::json!([{
                "driver": "knic.dev", "pool": "node-a", "device": "vf-3b-00-2",
                "conditions": [{"type": "Ready", "status": "True", "reason": "VfioBound",
                                "message": "0000:3b:00.2 bound to vfio-pci (IOMMU group 200) for pod ns/pod",
                                "lastTransitionTime": "2026-11-22T00:00:00Z"}],
                "networkData": {"hardwareAddress": "02:00:00:cc:00:00"},
                "data": {"pciAddress": "0000:3b:00.2", "deviceMode": "vfio-pci", "vfioGroup": 200},
            }])
        );
    }
}
