//! vfio-pci on a real IOMMU: a VF of QEMU's igb behind QEMU's intel-iommu, each VF in its own
//! IOMMU group. knic binds it through `driver_override` at prepare, names the real
//! `/dev/vfio/<group>` in the CDI spec, and gives it back to igbvf at unprepare, also after
//! `kill -9`; a pool with `vfDriver: vfio-pci` binds all its VFs and a netdev pool takes them
//! back.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use knic_e2e::harness::eventually;
use serde_json::json;

use super::rig::{
    IGB_ONLY, Machine, Rig, device_name, driver_of, iommu_group, kernel_log_since, kernel_mark,
    netdev_of, prepared,
};

/// The claim PF with `n` fresh VFs, the rig offering them, and the driver started.
async fn rig(m: &Machine, test: &str, n: u32) -> anyhow::Result<Rig> {
    let pf = m.claim_pf();
    pf.set_num_vfs(0)?;
    pf.set_num_vfs(n)?;
    let mut rig = Rig::new(test, IGB_ONLY).await?;
    rig.start(None).await?;
    let mut want = vec![device_name(&pf.address)];
    want.extend(pf.vf_addresses()?.iter().map(|a| device_name(a)));
    rig.published(&pf.address, &want).await?;
    Ok(rig)
}

/// Checks the claim's CDI spec hands the pod exactly the VF's group and the VFIO container.
fn cdi_names_the_group(
    rig: &Rig,
    claim: &knic_e2e::cluster::TestClaim,
    vf: &str,
    group: u32,
) -> anyhow::Result<()> {
    let spec = rig.cdi_spec(claim)?;
    let device = spec["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"].as_str().is_some_and(|n| n.contains("-vfio-")))
        .with_context(|| format!("no vfio device in the CDI spec: {spec}"))?;
    let nodes: Vec<&str> = device["containerEdits"]["deviceNodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["path"].as_str())
        .collect();
    let group_node = format!("/dev/vfio/{group}");
    ensure!(
        nodes == [group_node.as_str(), "/dev/vfio/vfio"],
        "CDI device nodes {nodes:?}"
    );
    for node in &nodes {
        ensure!(
            Path::new(node).exists(),
            "{node} does not exist on the node"
        );
    }
    let env: Vec<&str> = device["containerEdits"]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str())
        .collect();
    ensure!(
        env.contains(&format!("KNIC_PCI_ADDRESS_NIC={vf}").as_str())
            && env.contains(&format!("PCIDEVICE_KNIC_DEV={vf}").as_str()),
        "CDI env {env:?}"
    );
    Ok(())
}

pub async fn vfio_bind_cdi_and_restore(m: Machine) -> anyhow::Result<()> {
    let mut rig = rig(&m, "vm-vfio", 2).await?;
    let outcome = async {
        let pf = m.claim_pf().clone();
        let vf = pf.vf_address(1)?;
        let group = iommu_group(&vf).context("the VF has no IOMMU group")?;
        let members =
            std::fs::read_dir(format!("/sys/kernel/iommu_groups/{group}/devices"))?.count();
        ensure!(members == 1, "IOMMU group {group} holds {members} devices");
        ensure!(
            !Path::new(&format!("/dev/vfio/{group}")).exists(),
            "/dev/vfio/{group} before any bind"
        );
        let claim = rig
            .claim(
                "dpdk",
                &device_name(&vf),
                Some(json!({"deviceMode": "vfio-pci"})),
            )
            .await?;
        prepared(&claim, &rig.prepare(&claim).await?)?;
        ensure!(
            driver_of(&vf).as_deref() == Some("vfio-pci"),
            "after prepare the VF is on {:?}",
            driver_of(&vf)
        );
        ensure!(netdev_of(&vf).is_none(), "a VF on vfio-pci has no netdev");
        cdi_names_the_group(&rig, &claim, &vf, group)?;
        // A crash with the VF bound: the restarted driver still gives it back.
        rig.kill9().await?;
        rig.start(None).await?;
        let error = rig.unprepare(&claim).await?;
        ensure!(error.is_empty(), "unprepare: {error}");
        ensure!(
            driver_of(&vf).as_deref() == Some("igbvf"),
            "after unprepare the VF is on {:?}",
            driver_of(&vf)
        );
        let over = std::fs::read_to_string(format!("/sys/bus/pci/devices/{vf}/driver_override"))?;
        ensure!(over.trim() == "(null)", "driver_override left at {over:?}");
        eventually(
            "the VF's netdev is back",
            Duration::from_secs(30),
            || async { Ok(netdev_of(&vf).map(|_| ())) },
        )
        .await?;
        ensure!(
            rig.cdi_spec(&claim).is_err(),
            "the CDI spec outlived the claim"
        );
        Ok(())
    }
    .await;
    rig.finish(outcome).await
}

/// A pool of the pool PF with `vfDriver: vfio-pci`: its VFs are created with autoprobe off
/// (never flashing up as igbvf netdevs) and bound to vfio-pci; the PF's autoprobe is back on
/// afterwards; a netdev pool of the same count gives them back to igbvf.
pub async fn vfio_pool_binds_its_vfs(m: Machine) -> anyhow::Result<()> {
    let pf = m.pool_pf().clone();
    pf.set_num_vfs(0)?;
    let mut rig = Rig::new("vm-vfio-pool", IGB_ONLY).await?;
    let outcome = async {
        kernel_mark("vfio pool")?;
        let policy = |driver: &str| {
            format!(
                "pools: [{{name: dpdk, pciAddresses: [\"{}\"], numVfs: 2, vfDriver: {driver}}}]",
                pf.address
            )
        };
        rig.start(Some(&policy("vfio-pci"))).await?;
        ensure!(pf.num_vfs()? == 2, "sriov_numvfs {}", pf.num_vfs()?);
        for vf in pf.vf_addresses()? {
            ensure!(
                driver_of(&vf).as_deref() == Some("vfio-pci"),
                "{vf} on {:?}",
                driver_of(&vf)
            );
            let group = iommu_group(&vf).context("no IOMMU group")?;
            ensure!(Path::new(&format!("/dev/vfio/{group}")).exists());
        }
        let autoprobe = std::fs::read_to_string(pf.dir().join("sriov_drivers_autoprobe"))?;
        ensure!(autoprobe.trim() == "1", "autoprobe left at {autoprobe:?}");
        let log = kernel_log_since("vfio pool");
        ensure!(
            !log.contains("igbvf 0000:"),
            "igbvf probed the pool's VFs:{log}"
        );
        rig.stop().await?;
        rig.start(Some(&policy("netdev"))).await?;
        for vf in pf.vf_addresses()? {
            ensure!(
                driver_of(&vf).as_deref() == Some("igbvf"),
                "{vf} on {:?}",
                driver_of(&vf)
            );
        }
        rig.stop().await?;
        pf.set_num_vfs(0)?;
        Ok(())
    }
    .await;
    rig.finish(outcome).await
}
