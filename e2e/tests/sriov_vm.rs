//! SR-IOV, vfio-pci and RDMA against real kernel code, in the test VM: QEMU emulates two Intel
//! 82576 NICs (`-device igb`, SR-IOV with up to 7 VFs each, the igb/igbvf drivers of Debian's
//! kernel) behind an emulated IOMMU (`-device intel-iommu`, every VF in its own group, vfio-pci
//! loaded), and the kernel's soft-RoCE (`rdma_rxe`) gives a real RDMA device. The real
//! `knic-driver` runs on the real `/sys` and netlink, driven through the in-process fake API, a
//! test kubelet and an NRI test runtime, as the other e2e tests drive it.
//!
//! `e2e/vm/kernel-tests.sh` boots the VM with those devices (see `vm_options` there). On a
//! machine without them every trial is reported ignored with the reason; in the VM
//! (`KNIC_IN_VM=1`) a missing device or module fails the trial. The trials take turns: they
//! share the PFs (the first for pools, the second for claims) and leave them as they found
//! them.

use std::future::Future;

use knic_e2e::harness::{arguments, kernel_trial};
use libtest_mimic::Failed;

#[path = "sriov_vm/rig.rs"]
mod rig;
use rig::{Machine, Needs};

// VF pools from policy on a real PF.
#[path = "sriov_vm/pools.rs"]
mod pools;

// The fixture kernel against the real one.
#[path = "sriov_vm/differential.rs"]
mod differential;

// RDMA netlink against soft-RoCE.
#[path = "sriov_vm/rdma.rs"]
mod rdma;

// vfio-pci on a real IOMMU.
#[path = "sriov_vm/vfio.rs"]
mod vfio;

// Per-claim VF settings through a real PF.
#[path = "sriov_vm/settings.rs"]
mod settings;

// ethtool settings on a real NIC driver (issue 27).
#[path = "sriov_vm/ethtool.rs"]
mod ethtool;

/// Runs an async trial body on its own runtime.
fn run<F, Fut>(body: F) -> Result<(), Failed>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failed::from(e.to_string()))?;
    rt.block_on(body())
        .map_err(|e| Failed::from(format!("{e:#}")))
}

type Body = fn(Machine) -> std::pin::Pin<Box<dyn Future<Output = anyhow::Result<()>>>>;

fn main() {
    let mut args = arguments();
    // One machine, one set of PFs: the trials take turns.
    args.test_threads = Some(1);
    let machine = Machine::probe();
    let table: Vec<(&str, Needs, Body)> = vec![
        ("vm/pool_created_changed_and_removed", Needs::Sriov, |m| {
            Box::pin(pools::pool_created_changed_and_removed(m))
        }),
        ("vm/held_vfs_block_a_count_change", Needs::Sriov, |m| {
            Box::pin(pools::held_vfs_block_a_count_change(m))
        }),
        ("vm/provisioning_racing_a_prepare", Needs::Sriov, |m| {
            Box::pin(pools::provisioning_racing_a_prepare(m))
        }),
        (
            "vm/vf_settings_applied_read_back_and_restored",
            Needs::Sriov,
            |m| Box::pin(settings::vf_settings_applied_read_back_and_restored(m)),
        ),
        (
            "vm/vf_comes_home_despite_new_ifindex_and_permanent_mac",
            Needs::Sriov,
            |m| Box::pin(settings::vf_comes_home_despite_new_ifindex_and_permanent_mac(m)),
        ),
        (
            "vm/refused_vf_settings_fail_the_attach_naming_them",
            Needs::Sriov,
            |m| Box::pin(settings::refused_vf_settings_fail_the_attach_naming_them(m)),
        ),
        ("vm/vf_settings_restored_after_kill9", Needs::Sriov, |m| {
            Box::pin(settings::vf_settings_restored_after_kill9(m))
        }),
        ("vm/vfio_bind_cdi_and_restore", Needs::Vfio, |m| {
            Box::pin(vfio::vfio_bind_cdi_and_restore(m))
        }),
        ("vm/vfio_pool_binds_its_vfs", Needs::Vfio, |m| {
            Box::pin(vfio::vfio_pool_binds_its_vfs(m))
        }),
        (
            "vm/soft_roce_against_knics_rdma_netlink",
            Needs::Rdma,
            |m| Box::pin(rdma::soft_roce_against_knics_rdma_netlink(m)),
        ),
        ("vm/ethtool_on_a_moved_igb_port", Needs::Sriov, |m| {
            Box::pin(ethtool::ethtool_on_a_moved_igb_port(m))
        }),
        // Last: it unbinds and rebinds the pool PF's driver.
        ("vm/fixture_kernel_answers_like_igb", Needs::Vfio, |m| {
            Box::pin(differential::fixture_kernel_answers_like_igb(m))
        }),
    ];
    let mut trials = Vec::new();
    for (name, needs, body) in table {
        let missing = machine.missing(needs);
        if let Some(why) = &missing {
            eprintln!("skipped: {name}: {why}");
        }
        let m = machine.clone();
        trials.push(kernel_trial(name, missing, move || run(|| body(m))));
    }
    libtest_mimic::run(&args, trials).exit();
}
