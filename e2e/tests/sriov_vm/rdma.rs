//! RDMA against the real RDMA subsystem, with the kernel's soft-RoCE (`rdma_rxe`, which needs
//! the `crc32` crypto module: without it `rdma link add` fails with ENOENT). knic's RDMA
//! netlink (the namespace mode, the device dump, the namespace move) is run against it.
//!
//! What the real kernel showed, and this trial keeps true: a soft-RoCE device cannot follow its
//! netdev into a pod on this kernel. Its namespace move is refused (EOPNOTSUPP: rxe has no
//! `disassociate_ucontext`, which the move requires), and moving its netdev unregisters it. So
//! it is not found under a PCI function, knic gives it to no pod (no uverbs node that would
//! vanish under the container), and the exclusive-mode move of a real (mlx5) device runs on
//! fixtures and message tests only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use knic_driver::sriov::rdma::{KernelRdma, NetnsMode, RdmaNamespaces};
use knic_e2e::harness::{Netns, eventually, ip};

use super::rig::{Links, Machine, netdev_of};

/// `rdma …` (iproute2's tool); its stderr becomes the error.
fn rdma(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("rdma").args(args).output()?;
    ensure!(
        out.status.success(),
        "rdma {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Sets the subsystem's namespace mode; the kernel refuses a change (EBUSY) while any network
/// namespace but the initial one exists, and earlier trials' namespaces die asynchronously.
async fn set_mode(mode: &str) -> anyhow::Result<()> {
    eventually(
        &format!("rdma system set netns {mode}"),
        Duration::from_secs(60),
        || async { Ok(rdma(&["system", "set", "netns", mode]).ok().map(drop)) },
    )
    .await
}

/// The verbs character devices of the RDMA device `name`, from the real `infiniband_verbs`
/// class.
fn uverbs_of(name: &str) -> Vec<String> {
    std::fs::read_dir("/sys/class/infiniband_verbs")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| std::fs::read_to_string(e.path().join("ibdev")).is_ok_and(|d| d.trim() == name))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

/// Removes the soft-RoCE link, if any.
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = rdma(&["link", "delete", "rxe0"]);
    }
}

pub async fn soft_roce_against_knics_rdma_netlink(m: Machine) -> anyhow::Result<()> {
    let _links = Links(vec!["knt-r0"]);
    let _cleanup = Cleanup;
    ip(&[
        "link", "add", "knt-r0", "type", "veth", "peer", "name", "knt-r1",
    ])?;
    ip(&["link", "set", "knt-r0", "up"])?;
    ip(&["link", "set", "knt-r1", "up"])?;
    rdma(&["link", "add", "rxe0", "type", "rxe", "netdev", "knt-r0"])?;
    ensure!(
        Path::new("/sys/class/infiniband/rxe0").exists(),
        "no /sys/class/infiniband/rxe0"
    );
    let uverbs = uverbs_of("rxe0");
    ensure!(uverbs.len() == 1, "rxe0's verbs devices: {uverbs:?}");
    ensure!(
        Path::new("/dev/infiniband").join(&uverbs[0]).exists()
            && Path::new(knic_driver::sriov::rdma::RDMA_CM).exists(),
        "the character devices a pod would get: {:?}",
        std::fs::read_dir("/dev/infiniband").map(|d| d.count())
    );
    let parent = std::fs::read_to_string("/sys/class/infiniband/rxe0/parent")?;
    ensure!(parent.trim() == "knt-r0", "rxe0's parent {parent:?}");
    // A soft device on a VF hangs off no PCI function: knic finds none for the VF, so a pod
    // never gets a verbs node that the move of the VF's netdev would unregister.
    let pf = m.claim_pf();
    pf.set_num_vfs(0)?;
    pf.set_num_vfs(1)?;
    let vf = pf.vf_address(0)?;
    let netdev = netdev_of(&vf).context("the VF has no netdev")?;
    ip(&["link", "set", &netdev, "up"])?;
    rdma(&["link", "add", "rxe1", "type", "rxe", "netdev", &netdev])?;
    let found = knic_driver::sriov::rdma::devices(Path::new("/"), &vf);
    let _ = rdma(&["link", "delete", "rxe1"]);
    ensure!(found.is_empty(), "RDMA devices of {vf}: {found:?}");

    let kernel = KernelRdma;
    ensure!(
        kernel.mode()? == NetnsMode::Shared,
        "the kernel's default mode is shared"
    );
    set_mode("exclusive").await?;
    let outcome = exclusive(&kernel).await;
    let _ = ip(&["netns", "del", "knt-rdma"]);
    set_mode("shared").await?;
    outcome?;
    ensure!(kernel.mode()? == NetnsMode::Shared);
    Ok(())
}

async fn exclusive(kernel: &KernelRdma) -> anyhow::Result<()> {
    ensure!(
        kernel.mode()? == NetnsMode::Exclusive,
        "mode after the switch"
    );
    let pod = Netns::new("knt-rdma")?;
    let host = PathBuf::from(knic_driver::pods::HOST_NETNS);
    // The dump finds rxe0 and its index; the kernel refuses the move itself.
    let err = kernel
        .move_device("rxe0", &host, &pod.path())
        .err()
        .context("the kernel moved a soft-RoCE device")?
        .to_string();
    ensure!(
        err.contains("moving RDMA device rxe0 to /run/netns/knt-rdma")
            && err.contains("Operation not supported"),
        "{err}"
    );
    // Exclusive mode shows a device in its namespace only: seen from the pod, rxe0 is not
    // there but is where a move back would put it, which is success (a resumed detach).
    kernel
        .move_device("rxe0", &pod.path(), &host)
        .context("a device already home")?;
    let err = kernel
        .move_device("knt-nosuch", &host, &pod.path())
        .err()
        .context("moved a device that does not exist")?
        .to_string();
    ensure!(
        err.contains("no such RDMA device in /proc/self/ns/net"),
        "{err}"
    );
    // Its netdev leaving the host namespace unregisters the soft device.
    ip(&["link", "set", "knt-r0", "netns", &pod.0])?;
    eventually("rxe0 unregistered", Duration::from_secs(20), || async {
        Ok((!Path::new("/sys/class/infiniband/rxe0").exists()).then_some(()))
    })
    .await?;
    ip(&["-n", &pod.0, "link", "del", "knt-r0"])?;
    drop(pod);
    Ok(())
}
