//! vfio-pci and RDMA at prepare and unprepare, against the ConnectX-5 sysfs fixture with a
//! simulated kernel: refusals, bind and restore, a failed bind, a crash mid-bind, the CDI spec
//! and the claim status written at sandbox start.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{Device, ResourceClaim};
use serde_json::json;
use tokio::sync::watch;

use super::*;
use crate::claims::checkpoint::CheckpointStore;
use crate::inventory::Sysfs;
use crate::inventory::fixture::materialise;
use crate::pods::{DeviceStatus, PodNetworks, StatusSink};
use crate::sriov::fixture::FixtureKernel;
use crate::sriov::writes::SysfsWrites;

const CX5: &str = include_str!("../../tests/fixtures/sysfs/mellanox-cx5-pf-vfs-rdma.derived.txt");
const DRIVER: &str = "knic.dev";
const VF: &str = "0000:3b:00.2";

#[derive(Default)]
struct Claims(StdMutex<Option<ResourceClaim>>);

impl ClaimSource for Claims {
    fn get<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
    ) -> crate::BoxFuture<'a, Result<Option<ResourceClaim>>> {
        Box::pin(async move { Ok(self.0.lock().map(|c| c.clone()).unwrap_or_default()) })
    }
}

/// Writes through the fixture kernel until `allowed` writes have landed, then "dies": every
/// later write fails, as nothing more happens after a crash.
struct CrashAfter {
    kernel: Arc<FixtureKernel>,
    allowed: AtomicUsize,
}

impl SysfsWrites for CrashAfter {
    fn write(&self, sysfs: &Sysfs, rel: &std::path::Path, value: &str) -> std::io::Result<()> {
        let left = self.allowed.load(Ordering::SeqCst);
        if left == 0 {
            return Err(std::io::Error::other("the driver crashed"));
        }
        self.allowed.store(left - 1, Ordering::SeqCst);
        self.kernel.write(sysfs, rel, value)
    }
}

struct Node {
    _dir: tempfile::TempDir,
    kernel: Arc<FixtureKernel>,
    checkpoint: tempfile::TempDir,
    cdi: tempfile::TempDir,
    source: Arc<Claims>,
}

/// Published devices: the VF 0000:3b:00.2 (vfio candidate), the VF 0000:3b:00.3 with RDMA,
/// and a veth without a PCI address.
fn published() -> watch::Receiver<Vec<Device>> {
    let device = |name: &str, attributes: serde_json::Value| -> Device {
        serde_json::from_value(json!({"name": name, "attributes": attributes})).expect("device")
    };
    watch::channel(vec![
        device(
            "vf-3b-00-2",
            json!({"ifName": {"string": "enp59s0f0v0"}, "pciAddress": {"string": VF},
                   "mac": {"string": "02:00:00:cc:00:00"}}),
        ),
        device(
            "vf-3b-00-3",
            json!({"ifName": {"string": "enp59s0f0v1"}, "pciAddress": {"string": "0000:3b:00.3"}}),
        ),
        device("veth-x", json!({"ifName": {"string": "veth9"}})),
    ])
    .1
}

fn node(vfio_loaded: bool) -> Node {
    let dir = tempfile::tempdir().expect("tempdir");
    materialise(CX5, dir.path()).expect("fixture");
    let kernel = Arc::new(FixtureKernel::new(dir.path(), "mlx5_core").expect("kernel"));
    if vfio_loaded {
        kernel.load_vfio_pci().expect("modprobe");
    }
    Node {
        _dir: dir,
        kernel,
        checkpoint: tempfile::tempdir().expect("tempdir"),
        cdi: tempfile::tempdir().expect("tempdir"),
        source: Arc::new(Claims::default()),
    }
}

impl Node {
    fn store(&self) -> Arc<ClaimStore> {
        Arc::new(ClaimStore::open(CheckpointStore::new(
            self.checkpoint.path(),
        )))
    }

    fn preparer_with(&self, writes: Arc<dyn SysfsWrites>) -> Preparer {
        Preparer::new(DRIVER, self.source.clone(), self.store())
            .with_devices(published())
            .with_pool("node-a")
            .with_cdi(crate::cdi::CdiSpecs::new(self.cdi.path(), "/hook"))
            .with_pci(Vfio::new(self.kernel.root(), writes).with_wait(Duration::from_millis(50)))
    }

    fn preparer(&self) -> Preparer {
        self.preparer_with(self.kernel.clone())
    }

    /// Claim `claim` (uid `u1`, pod `pu`) for `results`, with class config `class`.
    fn claim(&self, results: &[(&str, &str)], class: serde_json::Value) {
        let mut parameters = json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig"});
        parameters
            .as_object_mut()
            .expect("object")
            .extend(class.as_object().expect("object").clone());
        let results: Vec<_> = results
            .iter()
            .map(|(req, dev)| json!({"request": req, "driver": DRIVER, "pool": "node-a", "device": dev}))
            .collect();
        let claim = json!({
            "metadata": {"name": "claim", "namespace": "ns", "uid": "u1"},
            "spec": {},
            "status": {
                "allocation": {"devices": {"results": results, "config": [
                    {"source": "FromClass", "requests": ["dpdk"], "opaque": {"driver": DRIVER, "parameters": parameters}}
                ]}},
                "reservedFor": [{"resource": "pods", "name": "pod", "uid": "pu"}],
            },
        });
        *self.source.0.lock().expect("lock") = Some(serde_json::from_value(claim).expect("claim"));
    }

    fn driver_of(&self, address: &str) -> Option<String> {
        Vfio::new(self.kernel.root(), self.kernel.clone()).current_driver(address)
    }

    fn override_of(&self, address: &str) -> String {
        std::fs::read_to_string(
            self.kernel
                .root()
                .join("sys/bus/pci/devices")
                .join(address)
                .join("driver_override"),
        )
        .expect("driver_override")
    }
}

fn wanted() -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        name: "claim".into(),
        uid: "u1".into(),
    }
}

async fn prepare(preparer: &Preparer) -> Result<Vec<PreparedAnswer>> {
    preparer
        .prepare(&[wanted()])
        .await
        .remove("u1")
        .expect("an outcome")
}

async fn unprepare(preparer: &Preparer) -> Result<()> {
    preparer
        .unprepare(&[wanted()])
        .await
        .remove("u1")
        .expect("an outcome")
}

#[derive(Default)]
struct Recorder(StdMutex<Vec<Vec<DeviceStatus>>>);

impl StatusSink for Recorder {
    fn write<'a>(
        &'a self,
        _claim: &'a PreparedClaim,
        devices: &'a [DeviceStatus],
    ) -> crate::BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if let Ok(mut seen) = self.0.lock() {
                seen.push(devices.to_vec());
            }
            Ok(())
        })
    }
}

#[tokio::test]
async fn a_vfio_function_is_bound_at_prepare_given_to_the_pod_and_restored_at_unprepare() {
    let node = node(true);
    node.claim(
        &[("dpdk", "vf-3b-00-2"), ("rdma", "vf-3b-00-3")],
        json!({"deviceMode": "vfio-pci"}),
    );
    let preparer = node.preparer();
    let answer = prepare(&preparer).await.expect("prepared");
    assert_eq!(node.driver_of(VF).as_deref(), Some("vfio-pci"));
    assert_eq!(node.override_of(VF), "vfio-pci");
    assert_eq!(
        answer[0].cdi_device_ids,
        ["knic.dev/interface=u1-vfio-0"],
        "the vfio function's CDI device"
    );
    assert_eq!(answer[1].cdi_device_ids, ["knic.dev/interface=u1-0"]);

    let recorded = preparer
        .claims()
        .claim("u1")
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(recorded.attachments.len(), 1, "only the netdev is attached");
    assert_eq!(recorded.attachments[0].plan.device, "vf-3b-00-3");
    assert_eq!(
        serde_json::to_value(&recorded.functions).unwrap(),
        json!([
            {"device": "vf-3b-00-2", "request": "dpdk", "pciAddress": VF, "mode": "vfio-pci",
             "vfio": {"group": 200, "originalDriver": "mlx5_core"}, "mac": "02:00:00:cc:00:00"},
            {"device": "vf-3b-00-3", "request": "rdma", "pciAddress": "0000:3b:00.3",
             "rdma": [{"name": "mlx5_3", "uverbs": ["uverbs3"]}]},
        ])
    );

    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(node.cdi.path().join("knic.dev-u1.json")).expect("spec"),
    )
    .expect("json");
    crate::cdi::pci_tests::assert_valid_cdi(&spec);
    assert_eq!(
        spec["devices"][1]["containerEdits"]["deviceNodes"],
        json!([{"path": "/dev/vfio/200"}, {"path": "/dev/vfio/vfio"}])
    );
    assert_eq!(
        spec["devices"][0]["containerEdits"]["deviceNodes"],
        json!([{"path": "/dev/infiniband/uverbs3"}, {"path": "/dev/infiniband/rdma_cm"}])
    );

    // The sandbox starts: the netdev is attached, and both devices get their status, the
    // vfio function's written although there is nothing to attach.
    let kernel = crate::netns::fake::FakeKernel::new();
    kernel.add_link(
        &crate::netns::Ns::Host,
        "enp59s0f0v1",
        1500,
        [2, 0, 0, 0xcc, 0, 1],
        None,
        &[],
    );
    let netns = std::path::PathBuf::from("/var/run/netns/pod");
    kernel.add_namespace(&crate::netns::Ns::Pod(netns.clone()));
    let status = Arc::new(Recorder::default());
    let pods = PodNetworks::new(kernel, preparer.claims().clone(), status.clone());
    // Not this host's RDMA subsystem: the test must not depend on it.
    pods.set_rdma(
        Arc::new(FakeRdma {
            mode: crate::sriov::rdma::NetnsMode::Shared,
            fail: false,
            moves: StdMutex::default(),
        }),
        "/proc/self/ns/net".into(),
    );
    pods.attach_pod("pu", "ns/pod", netns)
        .await
        .expect("attached");
    let mut written = Vec::new();
    for _ in 0..200 {
        written = status.0.lock().map(|s| s.clone()).unwrap_or_default();
        if !written.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let entries = written.first().expect("a status write");
    assert_eq!(entries.len(), 2);
    assert_eq!(
        entries[0].data,
        Some(
            json!({"pciAddress": "0000:3b:00.3", "deviceMode": "netdev", "rdmaDevices": ["mlx5_3"]})
        )
    );
    assert_eq!(entries[1].device, "vf-3b-00-2");
    assert_eq!(entries[1].reason, "VfioBound");
    assert_eq!(
        entries[1].data,
        Some(json!({"pciAddress": VF, "deviceMode": "vfio-pci", "vfioGroup": 200}))
    );
    assert_eq!(
        entries[1].hardware_address.as_deref(),
        Some("02:00:00:cc:00:00")
    );
    pods.detach_pod("pu", None).await.expect("detached");

    unprepare(&preparer).await.expect("unprepared");
    assert_eq!(node.driver_of(VF).as_deref(), Some("mlx5_core"));
    assert_eq!(node.override_of(VF), "(null)\n");
    assert!(preparer.claims().claim("u1").await.unwrap().is_none());
    assert!(!node.cdi.path().join("knic.dev-u1.json").exists());
}

#[tokio::test]
async fn every_vfio_refusal_names_the_device_and_the_rule() {
    let node = node(false);
    let preparer = node.preparer();
    let refused = |reason: &str| format!("ResourceClaim ns/claim: {reason}");

    node.claim(&[("dpdk", "veth-x")], json!({"deviceMode": "vfio-pci"}));
    assert_eq!(
        prepare(&preparer).await.expect_err("no PCI").to_string(),
        refused(
            "device node-a/veth-x: deviceMode \"vfio-pci\" needs a PCI function, and this device \
             has no PCI address"
        )
    );

    node.claim(&[("dpdk", "vf-3b-00-2")], json!({"deviceMode": "vfio-pci"}));
    assert_eq!(
        prepare(&preparer).await.expect_err("no module").to_string(),
        refused(
            "device node-a/vf-3b-00-2: PCI function 0000:3b:00.2: vfio-pci driver not loaded \
             (modprobe vfio-pci)"
        )
    );

    node.kernel.load_vfio_pci().expect("modprobe");
    let root = node.kernel.root().to_owned();
    std::os::unix::fs::symlink(
        "../../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.3",
        root.join("sys/kernel/iommu_groups/200/devices/0000:3b:00.3"),
    )
    .expect("link");
    assert_eq!(
        prepare(&preparer)
            .await
            .expect_err("shared group")
            .to_string(),
        refused(
            "device node-a/vf-3b-00-2: PCI function 0000:3b:00.2: IOMMU group 200 also holds \
             0000:3b:00.3: vfio-pci gives a pod the whole group, so only a function alone in its \
             group can be given"
        )
    );

    std::fs::remove_file(root.join("sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.2/iommu_group"))
        .expect("unlink");
    assert_eq!(
        prepare(&preparer).await.expect_err("no group").to_string(),
        refused(
            "device node-a/vf-3b-00-2: PCI function 0000:3b:00.2: has no IOMMU group: vfio-pci \
             needs the IOMMU enabled (intel_iommu=on or amd_iommu=on on the kernel command line)"
        )
    );

    node.claim(
        &[("dpdk", "vf-3b-00-2")],
        json!({"deviceMode": "vfio-pci", "interface": {"mtu": 9000}}),
    );
    assert_eq!(
        prepare(&preparer)
            .await
            .expect_err("netdev setting")
            .to_string(),
        refused(
            "request dpdk: interface.mtu: cannot be set with deviceMode: \"vfio-pci\": the device \
             is bound to vfio-pci and has no network interface to configure"
        )
    );
    assert!(node.kernel.writes().is_empty(), "no refusal touched sysfs");
    assert_eq!(node.driver_of(VF).as_deref(), Some("mlx5_core"));
    assert!(preparer.claims().claim("u1").await.unwrap().is_none());
}

#[tokio::test]
async fn a_bind_that_does_not_take_gives_the_function_back_and_forgets_the_claim() {
    let node = node(true);
    node.kernel.refuse_probes_by("vfio-pci");
    node.claim(&[("dpdk", "vf-3b-00-2")], json!({"deviceMode": "vfio-pci"}));
    let preparer = node.preparer();
    assert_eq!(
        prepare(&preparer)
            .await
            .expect_err("bind failed")
            .to_string(),
        "ResourceClaim ns/claim: PCI function 0000:3b:00.2: expected vfio-pci after probing, but \
         after 50 ms it has no driver (see the kernel log for the probe error)"
    );
    assert_eq!(node.driver_of(VF).as_deref(), Some("mlx5_core"));
    assert_eq!(node.override_of(VF), "(null)\n");
    assert!(preparer.claims().claim("u1").await.unwrap().is_none());
    assert!(!node.cdi.path().join("knic.dev-u1.json").exists());
}

/// Prepares until the crash: the override and the unbind land, the probe never happens.
async fn crash_mid_bind(node: &Node) {
    node.claim(&[("dpdk", "vf-3b-00-2")], json!({"deviceMode": "vfio-pci"}));
    let crashing = node.preparer_with(Arc::new(CrashAfter {
        kernel: node.kernel.clone(),
        allowed: AtomicUsize::new(2),
    }));
    let err = prepare(&crashing).await.expect_err("crashed").to_string();
    assert!(
        err.contains("the claim stays recorded for unprepare to retry"),
        "{err}"
    );
    drop(crashing);
    assert_eq!(node.driver_of(VF), None, "unbound, not yet probed");
    assert_eq!(node.override_of(VF), "vfio-pci");
}

#[tokio::test]
async fn after_a_crash_mid_bind_unprepare_restores_the_original_driver() {
    let node = node(true);
    crash_mid_bind(&node).await;
    // A restarted driver: the record comes from the checkpoint on disk.
    let restarted = node.preparer();
    let recorded = restarted
        .claims()
        .claim("u1")
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(
        recorded.functions[0]
            .vfio
            .as_ref()
            .and_then(|v| v.original_driver.as_deref()),
        Some("mlx5_core")
    );
    unprepare(&restarted).await.expect("unprepared");
    assert_eq!(node.driver_of(VF).as_deref(), Some("mlx5_core"));
    assert_eq!(node.override_of(VF), "(null)\n");
    assert!(restarted.claims().claim("u1").await.unwrap().is_none());
}

#[tokio::test]
async fn after_a_crash_mid_bind_the_retried_prepare_finishes_the_bind() {
    let node = node(true);
    crash_mid_bind(&node).await;
    let restarted = node.preparer();
    let answer = prepare(&restarted).await.expect("prepared");
    assert_eq!(answer[0].cdi_device_ids, ["knic.dev/interface=u1-vfio-0"]);
    assert_eq!(node.driver_of(VF).as_deref(), Some("vfio-pci"));
    unprepare(&restarted).await.expect("unprepared");
    assert_eq!(node.driver_of(VF).as_deref(), Some("mlx5_core"));
}

/// Records RDMA moves in the mode it is given; `fail` makes every move fail.
struct FakeRdma {
    mode: crate::sriov::rdma::NetnsMode,
    fail: bool,
    moves: StdMutex<Vec<(String, std::path::PathBuf, std::path::PathBuf)>>,
}

impl crate::sriov::rdma::RdmaNamespaces for FakeRdma {
    fn mode(&self) -> Result<crate::sriov::rdma::NetnsMode> {
        Ok(self.mode)
    }
    fn move_device(&self, name: &str, from: &std::path::Path, to: &std::path::Path) -> Result<()> {
        if self.fail {
            return Err(Error::io(
                format!("moving RDMA device {name}"),
                std::io::Error::from_raw_os_error(nix::libc::EBUSY),
            ));
        }
        self.moves
            .lock()
            .expect("lock")
            .push((name.to_owned(), from.to_owned(), to.to_owned()));
        Ok(())
    }
}

/// Prepares the RDMA VF 0000:3b:00.3 in netdev mode and attaches it through `rdma`.
async fn attach_rdma(
    rdma: Arc<FakeRdma>,
) -> (
    Node,
    Arc<PodNetworks<crate::netns::fake::FakeKernel>>,
    Result<()>,
    crate::netns::fake::FakeKernel,
) {
    let node = node(true);
    node.claim(&[("rdma", "vf-3b-00-3")], json!({}));
    let preparer = node.preparer();
    prepare(&preparer).await.expect("prepared");
    let kernel = crate::netns::fake::FakeKernel::new();
    kernel.add_link(
        &crate::netns::Ns::Host,
        "enp59s0f0v1",
        1500,
        [2, 0, 0, 0xcc, 0, 1],
        None,
        &[],
    );
    let netns = std::path::PathBuf::from("/var/run/netns/pod");
    kernel.add_namespace(&crate::netns::Ns::Pod(netns.clone()));
    let pods = PodNetworks::new(
        kernel.clone(),
        preparer.claims().clone(),
        Arc::new(Recorder::default()),
    );
    pods.set_rdma(rdma, "/proc/self/ns/net".into());
    let outcome = pods.attach_pod("pu", "ns/pod", netns).await;
    (node, pods, outcome, kernel)
}

#[tokio::test]
async fn in_exclusive_mode_the_rdma_device_follows_the_netdev_into_the_pod_and_back() {
    let rdma = Arc::new(FakeRdma {
        mode: crate::sriov::rdma::NetnsMode::Exclusive,
        fail: false,
        moves: StdMutex::default(),
    });
    let (_node, pods, outcome, _kernel) = attach_rdma(rdma.clone()).await;
    outcome.expect("attached");
    pods.detach_pod("pu", None).await.expect("detached");
    assert_eq!(
        *rdma.moves.lock().expect("lock"),
        [
            (
                "mlx5_3".to_owned(),
                "/proc/self/ns/net".into(),
                "/var/run/netns/pod".into()
            ),
            // Back from the pod's namespace, where an exclusive-mode kernel shows it.
            (
                "mlx5_3".to_owned(),
                "/var/run/netns/pod".into(),
                "/proc/self/ns/net".into()
            ),
        ]
    );

    let shared = Arc::new(FakeRdma {
        mode: crate::sriov::rdma::NetnsMode::Shared,
        fail: false,
        moves: StdMutex::default(),
    });
    let (_node, _pods, outcome, _kernel) = attach_rdma(shared.clone()).await;
    outcome.expect("attached");
    assert!(
        shared.moves.lock().expect("lock").is_empty(),
        "shared mode moves nothing"
    );
}

#[tokio::test]
async fn an_rdma_device_that_cannot_follow_fails_the_attach_and_the_netdev_comes_back() {
    let rdma = Arc::new(FakeRdma {
        mode: crate::sriov::rdma::NetnsMode::Exclusive,
        fail: true,
        moves: StdMutex::default(),
    });
    let (_node, _pods, outcome, kernel) = attach_rdma(rdma).await;
    let err = outcome.expect_err("attach refused").to_string();
    assert_eq!(
        err,
        "ResourceClaim ns/claim: device node-a/vf-3b-00-3: moving RDMA device mlx5_3: Device or \
         resource busy (os error 16)"
    );
    let host: Vec<String> = kernel
        .links(&crate::netns::Ns::Host)
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert!(host.contains(&"enp59s0f0v1".to_owned()), "{host:?}");
}
