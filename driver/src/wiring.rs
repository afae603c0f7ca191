//! How the driver's parts hold each other, in one place for `run` and `demo`: one claim
//! store, the pod networks (attach/detach) recording in it, and the preparer recording in it
//! and returning devices through the pod networks at unprepare. Nothing refers back, so no
//! part is wired in two phases.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::Device;
use tokio::sync::watch;

use crate::cdi::CdiSpecs;
use crate::claims::checkpoint::CheckpointStore;
use crate::claims::ipam::AddressBook;
use crate::claims::{ClaimSource, ClaimStore, Preparer};
use crate::netns::Kernel;
use crate::pods::{PodNetworks, StatusSink};

/// The parts that share the prepared claims.
pub struct Node<K> {
    /// The prepared claims (checkpoint).
    pub claims: Arc<ClaimStore>,
    /// Prepare and unprepare (the kubelet's calls).
    pub preparer: Arc<Preparer>,
    /// Attach and detach (the runtime's hooks).
    pub pods: Arc<PodNetworks<K>>,
    /// The KNI door's prepare and unprepare: the same preparer's rules, its claims read from
    /// `kni_pending` (no API object), without CDI specs or the NRI guard (a sandbox attached
    /// through KNI is attached at once, not by the runtime's hooks).
    pub kni_preparer: Arc<Preparer>,
    /// Where the KNI door puts the claim of an attachment for `kni_preparer` to read.
    pub kni_pending: Arc<crate::kni::sandbox::Pending>,
}

/// What a node's parts are made of.
pub struct Parts<K> {
    /// Where claims are read at prepare.
    pub source: Arc<dyn ClaimSource>,
    /// The checkpoint file.
    pub checkpoint: CheckpointStore,
    /// The node's current devices (their published form is kept while they are in a pod).
    pub devices: watch::Receiver<Vec<Device>>,
    /// The kernel the pods' interfaces are configured in.
    pub kernel: K,
    /// Where claim status goes.
    pub status: Arc<dyn StatusSink>,
    /// IPAM's address book and this node's name; `None` refuses `ipam` claims.
    pub address_book: Option<(Arc<dyn AddressBook>, String)>,
    /// This node's pool: allocation results in another pool are refused.
    pub pool: String,
    /// The sysfs root discovery reads: `vfio-pci` binding and RDMA lookups happen below it too,
    /// so fixture trees exercise them.
    pub sysfs_root: std::path::PathBuf,
    /// The fail-closed guards (see [`crate::cdi`]); `None` where no runtime runs containers
    /// (the demo's test runtime).
    pub fail_closed: Option<FailClosed>,
    /// The shared ports' policy: prepare keeps their bandwidth (see `claims::budget`).
    pub sharing: Option<Arc<crate::sharing::Sharing>>,
}

/// What keeps a pod's containers from starting without its interfaces.
pub struct FailClosed {
    /// Where the CDI specs of prepared claims go.
    pub cdi: CdiSpecs,
    /// Whether the NRI plugin is registered with the runtime.
    pub nri_connected: watch::Receiver<bool>,
    /// The runtime's NRI socket (named in the prepare refusal).
    pub nri_socket: String,
}

/// Builds the parts and connects them.
pub fn node<K: Kernel>(parts: Parts<K>) -> Node<K> {
    let claims = Arc::new(ClaimStore::open(parts.checkpoint));
    let pods = PodNetworks::new(parts.kernel, claims.clone(), parts.status);
    let kni_pending = Arc::new(crate::kni::sandbox::Pending::default());
    let mut kni_preparer =
        Preparer::new(knic_proto::DRIVER_NAME, kni_pending.clone(), claims.clone())
            .with_devices(parts.devices.clone())
            .with_pool(parts.pool.clone())
            .with_pci(crate::sriov::vfio::Vfio::new(
                parts.sysfs_root.clone(),
                Arc::new(crate::sriov::writes::LiveWrites),
            ))
            .with_release(pods.clone());
    if let Some((book, node)) = &parts.address_book {
        kni_preparer = kni_preparer.with_address_book(book.clone(), node.clone());
    }
    if let Some(sharing) = &parts.sharing {
        kni_preparer = kni_preparer.with_sharing(sharing.clone());
    }
    let mut preparer = Preparer::new(knic_proto::DRIVER_NAME, parts.source, claims.clone())
        .with_devices(parts.devices)
        .with_pool(parts.pool)
        .with_pci(crate::sriov::vfio::Vfio::new(
            parts.sysfs_root,
            Arc::new(crate::sriov::writes::LiveWrites),
        ))
        .with_release(pods.clone());
    if let Some(guards) = parts.fail_closed {
        if let Some(metadata) = guards.cdi.metadata() {
            pods.set_metadata(metadata.clone());
        }
        preparer = preparer
            .with_cdi(guards.cdi)
            .with_runtime_hooks(guards.nri_connected, guards.nri_socket);
    }
    if let Some((book, node)) = parts.address_book {
        preparer = preparer.with_address_book(book, node);
    }
    if let Some(sharing) = parts.sharing {
        preparer = preparer.with_sharing(sharing);
    }
    Node {
        claims,
        preparer: Arc::new(preparer),
        pods,
        kni_preparer: Arc::new(kni_preparer),
        kni_pending,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::resource::v1::ResourceClaim;
    use serde_json::json;

    use super::*;
    use crate::claims::ClaimRef;
    use crate::netns::Ns;
    use crate::netns::fake::FakeKernel;
    use crate::nri::{NriHandler, PodSandbox};
    use crate::pods::LogStatus;

    struct OneClaim(ResourceClaim);

    impl ClaimSource for OneClaim {
        fn get<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> crate::BoxFuture<'a, crate::Result<Option<ResourceClaim>>> {
            Box::pin(async move { Ok(Some(self.0.clone())) })
        }
    }

    /// Unprepare of a claim whose device is still in the pod (the sandbox stop never came)
    /// returns the device through the pod networks while the store is locked: the wiring must
    /// not deadlock and must put the node back.
    #[tokio::test]
    async fn unprepare_returns_a_device_still_in_the_pod() {
        let kernel = FakeKernel::new();
        kernel.add_link(
            &Ns::Host,
            "ens1f0v0",
            1500,
            [0xaa, 0, 0, 0, 0, 1],
            None,
            &[],
        );
        let netns = std::path::PathBuf::from("/var/run/netns/cni-1");
        kernel.add_namespace(&Ns::Pod(netns.clone()));
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "claim-uid"},
            "spec": {},
            "status": {
                "allocation": {"devices": {"results": [
                    {"request": "nic", "driver": "knic.dev", "pool": "node-a", "device": "dev-a"}]}},
                "reservedFor": [{"resource": "pods", "name": "pod", "uid": "pod-uid"}],
            },
        }))
        .expect("claim");
        let device: Device = serde_json::from_value(
            json!({"name": "dev-a", "attributes": {"ifName": {"string": "ens1f0v0"}}}),
        )
        .expect("device");
        let dir = tempfile::tempdir().expect("tempdir");
        let node = node(Parts {
            source: Arc::new(OneClaim(claim)),
            checkpoint: CheckpointStore::new(dir.path()),
            devices: watch::channel(vec![device]).1,
            kernel: kernel.clone(),
            status: Arc::new(LogStatus),
            address_book: None,
            pool: "node-a".into(),
            sysfs_root: dir.path().into(),
            fail_closed: None,
            sharing: None,
        });
        let wanted = ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "claim-uid".into(),
        };
        let prepared = node.preparer.prepare(std::slice::from_ref(&wanted)).await;
        assert!(prepared["claim-uid"].is_ok(), "{prepared:?}");
        node.pods
            .run_pod_sandbox(PodSandbox {
                id: "s".into(),
                name: "pod".into(),
                uid: "pod-uid".into(),
                namespace: "ns".into(),
                netns: Some(netns.clone()),
                ips: vec![],
            })
            .await
            .expect("attach");
        assert!(kernel.links(&Ns::Host).iter().all(|l| l.name != "ens1f0v0"));

        let unprepared = tokio::time::timeout(
            Duration::from_secs(5),
            node.preparer.unprepare(std::slice::from_ref(&wanted)),
        )
        .await
        .expect("unprepare must not deadlock");
        assert!(unprepared["claim-uid"].is_ok(), "{unprepared:?}");
        assert!(kernel.links(&Ns::Host).iter().any(|l| l.name == "ens1f0v0"));
        assert!(kernel.links(&Ns::Pod(netns)).is_empty());
        assert!(
            node.claims
                .snapshot()
                .await
                .expect("store")
                .claims
                .is_empty()
        );
    }
}
