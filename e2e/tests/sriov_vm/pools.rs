//! VF pools from policy on a real PF: the real igb driver creates and destroys the VFs knic
//! asks for, and knic publishes what the kernel made.

use std::time::Duration;

use anyhow::ensure;
use knic_e2e::harness::eventually;

use super::rig::{IGB_ONLY, Machine, Rig, device_name, driver_of, log_values, prepared};

fn policy(pf: &str, num_vfs: u32) -> String {
    format!(
        "pools:\n  - name: fabric\n    pciIds: [\"{}\"]\n    pfNames: [\"{pf}\"]\n    numVfs: {num_vfs}\n",
        super::rig::IGB_PF
    )
}

/// The PF and its VFs as knic names them, VFs read from the kernel.
fn expected(m: &Machine) -> anyhow::Result<Vec<String>> {
    let pf = m.pool_pf();
    let mut want = vec![device_name(&pf.address)];
    want.extend(pf.vf_addresses()?.iter().map(|a| device_name(a)));
    Ok(want)
}

/// Found by PCI id and name; created from none, changed 2 → 3 (through 0, which the igb driver
/// demands: it answers EBUSY between two non-zero counts), then to 0; every change published
/// with the pool's name; a count over `sriov_totalvfs` refused with the rule before the kernel
/// is asked.
pub async fn pool_created_changed_and_removed(m: Machine) -> anyhow::Result<()> {
    let pf = m.pool_pf().clone();
    pf.set_num_vfs(0)?;
    let mut rig = Rig::new("vm-pool", IGB_ONLY).await?;
    let outcome = async {
        // The other PF is offered too, but not in the pool.
        let other = m.claim_pf().address.clone();
        for count in [2, 3, 0] {
            rig.start(Some(&policy(&pf.name, count))).await?;
            ensure!(
                pf.num_vfs()? == count,
                "sriov_numvfs {} after start",
                pf.num_vfs()?
            );
            let want = expected(&m)?;
            ensure!(want.len() == 1 + count as usize, "{want:?}");
            rig.published(&pf.address, &want).await?;
            for vf in pf.vf_addresses()? {
                ensure!(
                    driver_of(&vf).as_deref() == Some("igbvf"),
                    "{vf}: driver {:?}",
                    driver_of(&vf)
                );
            }
            for (name, attrs) in rig.devices().await? {
                let pool = attrs["sriovPool"]["string"].as_str();
                let theirs = attrs["pciAddress"]["string"] == other.as_str()
                    || attrs["pfPciAddress"]["string"] == other.as_str();
                let want = (!theirs).then_some("fabric");
                ensure!(pool == want, "{name}: sriovPool {pool:?}");
            }
            rig.stop().await?;
        }
        let changed: Vec<String> = rig
            .logs()
            .lines()
            .filter(|l| l.contains("SR-IOV VF count changed"))
            .map(str::to_owned)
            .collect();
        ensure!(changed.len() == 3, "three count changes: {changed:#?}");
        // Over the total: knic's own rule, before any write.
        let over = pf.total + 1;
        rig.start(Some(&policy(&pf.name, over))).await?;
        let refusal = format!(
            "SR-IOV PF {} ({}): numVfs {over} is over sriov_totalvfs {}, the most this PF \
             supports",
            pf.name, pf.address, pf.total
        );
        eventually("the refusal is logged", Duration::from_secs(30), || async {
            Ok(log_values(&rig.logs(), "error")
                .contains(&refusal)
                .then_some(()))
        })
        .await?;
        ensure!(pf.num_vfs()? == 0, "nothing may change");
        Ok(())
    }
    .await;
    rig.finish(outcome).await
}

/// A VF prepared for a claim is never destroyed: the count change waits, refused with the
/// claim's name, and happens at the first rescan after the claim is released.
pub async fn held_vfs_block_a_count_change(m: Machine) -> anyhow::Result<()> {
    let pf = m.pool_pf().clone();
    pf.set_num_vfs(2)?;
    let mut rig = Rig::new("vm-held", IGB_ONLY).await?;
    let outcome = async {
        rig.start(Some(&policy(&pf.name, 2))).await?;
        let vf1 = device_name(&pf.vf_address(1)?);
        rig.published(&pf.address, &expected(&m)?).await?;
        let claim = rig.claim("held", &vf1, None).await?;
        prepared(&claim, &rig.prepare(&claim).await?)?;
        rig.stop().await?;
        rig.start(Some(&policy(&pf.name, 1))).await?;
        let refusal = format!(
            "SR-IOV PF {} ({}): numVfs 1 wanted, but it or its VFs are prepared for claims {}/{}",
            pf.name, pf.address, rig.cluster.namespace, claim.name
        );
        eventually("the refusal is logged", Duration::from_secs(30), || async {
            Ok(log_values(&rig.logs(), "error")
                .iter()
                .any(|e| e.starts_with(&refusal))
                .then_some(()))
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        ensure!(pf.num_vfs()? == 2, "a prepared VF was destroyed");
        let error = rig.unprepare(&claim).await?;
        ensure!(error.is_empty(), "unprepare: {error}");
        eventually(
            "the count follows the policy",
            Duration::from_secs(60),
            || async { Ok((pf.num_vfs()? == 1).then_some(())) },
        )
        .await?;
        rig.published(&pf.address, &expected(&m)?).await?;
        Ok(())
    }
    .await;
    rig.finish(outcome).await
}

/// Provisioning racing a prepare: the PF loses its VFs (a PF reset: written 0 behind knic's
/// back), the next rescan re-creates them, which the real igb driver takes seconds for under
/// emulation, and a prepare for one of those VFs arrives while it does. Provisioning holds the
/// checkpoint lock from its snapshot to its last write, so the prepare commits only after the
/// count is whole again, and the count never changes under the prepared claim.
pub async fn provisioning_racing_a_prepare(m: Machine) -> anyhow::Result<()> {
    let pf = m.pool_pf().clone();
    pf.set_num_vfs(2)?;
    let mut rig = Rig::new("vm-race", IGB_ONLY).await?;
    let outcome = async {
        rig.start(Some(&policy(&pf.name, 2))).await?;
        rig.published(&pf.address, &expected(&m)?).await?;
        let vf0 = pf.vf_address(0)?;
        let claim = rig.claim("racer", &device_name(&vf0), None).await?;
        let virtfn = |n: u32| pf.dir().join(format!("virtfn{n}")).exists();
        let mut caught = false;
        for _ in 0..4 {
            std::fs::write(pf.dir().join("sriov_numvfs"), "0")?;
            // The re-creation has started: VF 0 is there, VF 1 not yet. igb adds the second VF
            // ~25 ms after the first, so a 50 ms poll missed it three times in a row in CI; this
            // looks every millisecond, on a thread of its own (the driver's next pass re-creates
            // them within ~2 s of the reset).
            let dir = pf.dir();
            let started = tokio::task::spawn_blocking(move || {
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                while std::time::Instant::now() < deadline {
                    if dir.join("virtfn0").exists() && !dir.join("virtfn1").exists() {
                        return true;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                false
            })
            .await?;
            if !started {
                // Both VFs came within one poll: try again.
                eventually("the count is whole", Duration::from_secs(30), || async {
                    Ok((pf.num_vfs()? == 2 && virtfn(1)).then_some(()))
                })
                .await?;
                continue;
            }
            let out = rig.prepare(&claim).await?;
            // The prepare answered only after provisioning's last write: VF 1 exists by now,
            // and the driver logged the count change before the claim.
            ensure!(
                virtfn(1),
                "the prepare committed while the VFs were being created"
            );
            prepared(&claim, &out)?;
            let logs = rig.logs();
            let at = |message: &str| {
                logs.lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .filter(|v| v["message"] == message)
                    .filter_map(|v| v["timestamp"].as_str().map(str::to_owned))
                    .next_back()
            };
            let (changed, committed) = (at("SR-IOV VF count changed"), at("claim prepared"));
            ensure!(
                changed.is_some() && committed.is_some() && changed < committed,
                "the count changed at {changed:?}, the claim was prepared at {committed:?}"
            );
            caught = true;
            break;
        }
        ensure!(
            caught,
            "the re-creation of the VFs was never caught in progress"
        );
        ensure!(pf.num_vfs()? == 2, "sriov_numvfs {}", pf.num_vfs()?);
        ensure!(pf.vf_address(0)? == vf0, "VF 0 moved");
        // Held now: the count is left alone, and the claim's VF stays.
        tokio::time::sleep(Duration::from_secs(3)).await;
        ensure!(
            pf.num_vfs()? == 2 && driver_of(&vf0).as_deref() == Some("igbvf"),
            "the prepared VF changed"
        );
        let error = rig.unprepare(&claim).await?;
        ensure!(error.is_empty(), "unprepare: {error}");
        Ok(())
    }
    .await;
    rig.finish(outcome).await
}
