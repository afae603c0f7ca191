use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::inventory::fixture::materialise;
use crate::sriov::fixture::FixtureKernel;

const CX5: &str =
    include_str!("../../../tests/fixtures/sysfs/mellanox-cx5-pf-vfs-rdma.derived.txt");
const VF: &str = "0000:3b:00.2";

/// The ConnectX-5 tree with a simulated kernel; `vfio` loads the vfio-pci module.
fn tree(vfio: bool) -> (tempfile::TempDir, Arc<FixtureKernel>, Vfio) {
    let dir = tempfile::tempdir().expect("tempdir");
    materialise(CX5, dir.path()).expect("fixture");
    let kernel = Arc::new(FixtureKernel::new(dir.path(), "mlx5_core").expect("kernel"));
    if vfio {
        kernel.load_vfio_pci().expect("modprobe");
    }
    let binder = Vfio::new(kernel.root(), kernel.clone()).with_wait(Duration::from_millis(50));
    (dir, kernel, binder)
}

fn link_target(path: &Path) -> String {
    std::fs::read_link(path)
        .map(|t| t.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "(none)".into())
}

#[test]
fn pci_addresses_are_checked_before_any_path_is_built() {
    assert!(is_pci_address("0000:3b:00.2"));
    for bad in [
        "0000:3b:00.8",
        "../../etc/x",
        "0000:3B:00.2",
        "0000:3b:00",
        "",
    ] {
        assert!(!is_pci_address(bad), "{bad}");
    }
    let (_dir, _kernel, vfio) = tree(true);
    assert_eq!(
        vfio.check("../x").expect_err("refused").to_string(),
        "PCI function ../x: is not a PCI address of the form 0000:3b:00.2"
    );
    assert_eq!(
        vfio.check("0000:3b:00.7").expect_err("refused").to_string(),
        format!(
            "PCI function 0000:3b:00.7: not found at {}/sys/bus/pci/devices/0000:3b:00.7: the \
             function is gone from this node",
            vfio.root.display()
        )
    );
}

#[test]
fn a_function_alone_in_its_group_binds_and_comes_back_to_its_driver() {
    let (_dir, kernel, vfio) = tree(true);
    let root = kernel.root().to_owned();
    let record = vfio.check(VF).expect("qualifies");
    assert_eq!(
        record,
        VfioBinding {
            group: 200,
            original_driver: Some("mlx5_core".into())
        }
    );
    vfio.bind(VF).expect("binds");
    assert_eq!(vfio.current_driver(VF).as_deref(), Some("vfio-pci"));
    let device = root.join("sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.2");
    assert_eq!(
        link_target(&device.join("driver")),
        "../../../../bus/pci/drivers/vfio-pci"
    );
    assert!(
        root.join("sys/bus/pci/drivers/vfio-pci/0000:3b:00.2")
            .exists()
    );
    assert!(
        !root
            .join("sys/bus/pci/drivers/mlx5_core/0000:3b:00.2")
            .exists()
    );
    assert_eq!(
        kernel.writes(),
        [
            (
                PathBuf::from("sys/bus/pci/devices/0000:3b:00.2/driver_override"),
                "vfio-pci".to_owned()
            ),
            (
                PathBuf::from("sys/bus/pci/drivers/mlx5_core/unbind"),
                VF.to_owned()
            ),
            (PathBuf::from("sys/bus/pci/drivers_probe"), VF.to_owned()),
        ]
    );
    // A second bind (a retried prepare) writes nothing.
    vfio.bind(VF).expect("idempotent");
    assert_eq!(kernel.writes().len(), 3);

    vfio.restore(VF, Some("mlx5_core")).expect("restores");
    assert_eq!(vfio.current_driver(VF).as_deref(), Some("mlx5_core"));
    assert_eq!(
        link_target(&device.join("driver")),
        "../../../../bus/pci/drivers/mlx5_core"
    );
    assert_eq!(
        std::fs::read_to_string(device.join("driver_override")).expect("override"),
        "(null)\n"
    );
    assert!(
        !root
            .join("sys/bus/pci/drivers/vfio-pci/0000:3b:00.2")
            .exists()
    );
    assert_eq!(
        kernel.writes()[3..],
        [
            (
                PathBuf::from("sys/bus/pci/devices/0000:3b:00.2/driver_override"),
                "\n".to_owned()
            ),
            (
                PathBuf::from("sys/bus/pci/drivers/vfio-pci/unbind"),
                VF.to_owned()
            ),
            (PathBuf::from("sys/bus/pci/drivers_probe"), VF.to_owned()),
        ]
    );
    // Restoring again (a retried unprepare) only clears the override.
    vfio.restore(VF, Some("mlx5_core")).expect("idempotent");
    assert_eq!(kernel.writes().len(), 7);
}

#[test]
fn a_shared_iommu_group_is_refused_naming_the_other_devices() {
    let (_dir, kernel, vfio) = tree(true);
    let root = kernel.root();
    std::os::unix::fs::symlink(
        "../../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.3",
        root.join("sys/kernel/iommu_groups/200/devices/0000:3b:00.3"),
    )
    .expect("link");
    std::os::unix::fs::symlink(
        "../../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.1",
        root.join("sys/kernel/iommu_groups/200/devices/0000:3b:00.1"),
    )
    .expect("link");
    assert_eq!(
        vfio.check(VF).expect_err("shared").to_string(),
        "PCI function 0000:3b:00.2: IOMMU group 200 also holds 0000:3b:00.1, 0000:3b:00.3: \
         vfio-pci gives a pod the whole group, so only a function alone in its group can be given"
    );
    assert!(kernel.writes().is_empty(), "nothing was touched");
}

#[test]
fn no_iommu_group_and_no_vfio_module_are_refused_with_the_fix() {
    let (_dir, kernel, vfio) = tree(false);
    assert_eq!(
        vfio.check(VF).expect_err("no module").to_string(),
        "PCI function 0000:3b:00.2: vfio-pci driver not loaded (modprobe vfio-pci)"
    );
    std::fs::remove_file(
        kernel
            .root()
            .join("sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.2/iommu_group"),
    )
    .expect("unlink");
    assert_eq!(
        vfio.check(VF).expect_err("no group").to_string(),
        "PCI function 0000:3b:00.2: has no IOMMU group: vfio-pci needs the IOMMU enabled \
         (intel_iommu=on or amd_iommu=on on the kernel command line)"
    );
}

#[test]
fn a_probe_that_does_not_bind_is_an_error_with_what_the_function_has() {
    let (_dir, kernel, vfio) = tree(true);
    kernel.refuse_probes_by("vfio-pci");
    assert_eq!(
        vfio.bind(VF).expect_err("probe failed").to_string(),
        "PCI function 0000:3b:00.2: expected vfio-pci after probing, but after 50 ms it has no \
         driver (see the kernel log for the probe error)"
    );
    // The restore still gives it back.
    vfio.restore(VF, Some("mlx5_core")).expect("restores");
    assert_eq!(vfio.current_driver(VF).as_deref(), Some("mlx5_core"));
}

#[test]
fn a_missing_attribute_fails_the_write_with_its_path() {
    let (_dir, kernel, vfio) = tree(true);
    let probe = kernel.root().join("sys/bus/pci/drivers_probe");
    std::fs::remove_file(&probe).expect("rm");
    let err = vfio.bind(VF).expect_err("no drivers_probe");
    assert!(
        err.to_string().starts_with(&format!(
            "writing a sysfs attribute: writing {}: the attribute must exist (",
            probe.display()
        )),
        "{err}"
    );
    assert!(!probe.exists(), "never created");
}

#[test]
fn a_pf_with_vfs_is_refused_before_its_driver_is_touched() {
    let (_dir, kernel, vfio) = tree(true);
    assert_eq!(
        vfio.check("0000:3b:00.0")
            .expect_err("a PF with VFs")
            .to_string(),
        "PCI function 0000:3b:00.0: is an SR-IOV PF with 2 VFs: binding it to vfio-pci would \
         unbind its driver and destroy them; set its VF count to 0 first"
    );
    assert!(kernel.writes().is_empty());
}

#[test]
fn a_function_a_pool_had_on_vfio_pci_keeps_the_pools_override() {
    let (_dir, kernel, vfio) = tree(true);
    let device = kernel
        .root()
        .join("sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.2");
    // The SR-IOV pool bound it: override vfio-pci, driver vfio-pci.
    vfio.bind(VF).expect("pool bind");
    let record = vfio.check(VF).expect("qualifies");
    assert_eq!(record.original_driver.as_deref(), Some("vfio-pci"));
    // A claim takes it (nothing to do) and gives it back: the pool's mark stays, so the pool
    // still owns it (and a switch of the pool to netdev rebinds it).
    vfio.bind(VF).expect("claim bind");
    vfio.restore(VF, record.original_driver.as_deref())
        .expect("restore");
    assert_eq!(vfio.current_driver(VF).as_deref(), Some("vfio-pci"));
    assert_eq!(
        std::fs::read_to_string(device.join("driver_override"))
            .expect("override")
            .trim(),
        "vfio-pci"
    );
}
