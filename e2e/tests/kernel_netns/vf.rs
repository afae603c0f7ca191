//! VF settings through the PF against the real kernel: what a device without SR-IOV answers,
//! and, on real hardware named by `KNIC_TEST_SRIOV_PF`, a trust flip read back and put back.

use anyhow::{Context, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{Kernel, Ns, Session, VfState};
use knic_e2e::harness::ip;

use super::Links;

/// The real kernel takes the VF-table query (`RTEXT_FILTER_VF`) for any link and answers
/// without a table when there are no VFs, and refuses a VF change on a device without SR-IOV
/// with EOPNOTSUPP, which must reach the operator naming the setting.
pub(crate) async fn vf_requests_on_a_device_without_vfs(k: &Rtnl) -> anyhow::Result<()> {
    let _links = Links(vec!["knt-f0"]);
    ip(&[
        "link", "add", "knt-f0", "type", "veth", "peer", "name", "knt-f1",
    ])?;
    let mut host = k.open(&Ns::Host).await?.context("host")?;
    let state = host.vf_state("knt-f0", 0).await?;
    ensure!(state.is_none(), "a veth has no VF 0: {state:?}");
    let trust = VfState {
        trust: Some(true),
        ..VfState::default()
    };
    let err = host
        .set_vf("knt-f0", 0, &trust)
        .await
        .err()
        .context("a veth has no VFs to set")?
        .to_string();
    ensure!(
        err == "host: setting VF 0 of knt-f0: vf.trust (trust on): the PF's driver does not \
                support this setting: Operation not supported (os error 95)",
        "{err}"
    );
    let missing = host
        .vf_state("knt-nope", 0)
        .await
        .err()
        .context("no such PF")?
        .to_string();
    ensure!(
        missing.contains("interface knt-nope does not exist"),
        "{missing}"
    );
    Ok(())
}

/// The PF named by `KNIC_TEST_SRIOV_PF` (which must have VF 0), for the hardware trial.
pub(crate) fn sriov_pf() -> Option<String> {
    std::env::var("KNIC_TEST_SRIOV_PF")
        .ok()
        .filter(|v| !v.is_empty())
}

/// On real SR-IOV hardware: flip VF 0's trust through the PF, read it back, put it back.
pub(crate) async fn vf_settings_on_sriov_hardware(k: &Rtnl) -> anyhow::Result<()> {
    let pf = sriov_pf().context("KNIC_TEST_SRIOV_PF is not set")?;
    let mut host = k.open(&Ns::Host).await?.context("host")?;
    let before = host.vf_state(&pf, 0).await?.context("the PF has no VF 0")?;
    let flipped = VfState {
        trust: Some(!before.trust.unwrap_or(false)),
        ..VfState::default()
    };
    host.set_vf(&pf, 0, &flipped).await?;
    let after = host.vf_state(&pf, 0).await?.context("VF 0 vanished")?;
    let back = VfState {
        trust: before.trust.or(Some(false)),
        ..VfState::default()
    };
    host.set_vf(&pf, 0, &back).await?;
    ensure!(after.trust == flipped.trust, "{after:?}");
    let restored = host.vf_state(&pf, 0).await?.context("VF 0 vanished")?;
    ensure!(restored == before, "{restored:?} != {before:?}");
    Ok(())
}
