//! Per-claim VF settings through a real PF: applied by the igb driver before the VF's netdev
//! moves into the pod, read back from the kernel (with `ip` and with knic's own reader), put
//! back on detach and after `kill -9`; a setting igb does not support fails the attach with
//! the setting named, and what was already set is undone.

use anyhow::{Context, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{Kernel, Ns, Session, VfState};
use knic_e2e::harness::{Netns, ip};
use knic_proto::netconfig::VfVlanProtocol;
use serde_json::json;

use super::rig::{IGB_ONLY, Machine, Rig, device_name, netdev_of, prepared, vf_line};

/// The claim PF up (rates need its link speed) with `n` VFs, and the rig offering it.
async fn rig_with_vfs(m: &Machine, test: &str, n: u32) -> anyhow::Result<Rig> {
    let pf = m.claim_pf();
    // Fresh VFs: whatever an earlier trial did to them (a permanent MAC) goes with them.
    pf.set_num_vfs(0)?;
    pf.set_num_vfs(n)?;
    ip(&["link", "set", &pf.name, "up"])?;
    let mut rig = Rig::new(test, IGB_ONLY).await?;
    rig.start_with_runtime(vec![]).await?;
    let mut want = vec![device_name(&pf.address)];
    want.extend(pf.vf_addresses()?.iter().map(|a| device_name(a)));
    rig.published(&pf.address, &want).await?;
    Ok(rig)
}

/// VF `n` of `pf` as knic's own reader parses the kernel's answer.
async fn knic_reads(pf: &str, n: u32) -> anyhow::Result<VfState> {
    let kernel = Rtnl::new(None);
    let mut host = kernel
        .open(&Ns::Host)
        .await?
        .context("the host namespace")?;
    host.vf_state(pf, n)
        .await?
        .context("the PF reports no such VF")
}

/// `ip -o link show` of a host link without its index (which may legitimately change on a
/// round trip) and without `permaddr` (igbvf takes the MAC the PF assigned as its permanent
/// address whenever the VF resets, and keeps it after the PF's assignment is removed: the
/// kernel's doing, which nothing but reloading the VF driver undoes), and that `permaddr`.
fn link_line(name: &str) -> anyhow::Result<(String, Option<String>)> {
    let out = ip(&["-o", "link", "show", "dev", name])?;
    let rest = out
        .split_once(": ")
        .map(|(_, rest)| rest.trim().to_owned())
        .unwrap_or(out);
    Ok(match rest.split_once(" permaddr ") {
        Some((line, perm)) => (line.to_owned(), Some(perm.trim().to_owned())),
        None => (rest, None),
    })
}

pub async fn vf_settings_applied_read_back_and_restored(m: Machine) -> anyhow::Result<()> {
    let rig = rig_with_vfs(&m, "vm-vf-settings", 2).await?;
    let outcome = async {
        let pf = m.claim_pf().clone();
        let vf = pf.vf_address(0)?;
        let netdev = netdev_of(&vf).context("VF 0 has no netdev")?;
        let (table_before, link_before) = (vf_line(&pf.name, 0)?, link_line(&netdev)?);
        let claim = rig
            .claim(
                "tenant",
                &device_name(&vf),
                Some(json!({
                    "addresses": ["192.0.2.10/24"],
                    "vf": {"mac": "02:00:00:00:10:01", "vlan": 100, "qos": 3,
                           "spoofChk": false, "trust": true, "maxTxRate": 100},
                })),
            )
            .await?;
        prepared(&claim, &rig.prepare(&claim).await?)?;
        let ns = Netns::new("knt-vfpod")?;
        rig.runtime()?
            .run_pod_sandbox(&rig.pod(&claim, Some(&ns)))
            .await
            .map_err(anyhow::Error::msg)
            .context("attach")?;
        // The PF holds what the claim asked for.
        let table = vf_line(&pf.name, 0)?;
        for want in [
            "link/ether 02:00:00:00:10:01",
            "vlan 100, qos 3",
            "max_tx_rate 100Mbps",
            "spoof checking off",
            "trust on",
        ] {
            ensure!(
                table.contains(want),
                "no {want:?} in the PF's table: {table}"
            );
        }
        let read = knic_reads(&pf.name, 0).await?;
        ensure!(
            read.mac == Some([2, 0, 0, 0, 0x10, 1])
                && read.vlan.is_some_and(|v| v.id == 100
                    && v.qos == 3
                    && v.protocol == VfVlanProtocol::Dot1Q)
                && read.rate == Some((0, 100))
                && read.spoof_chk == Some(false)
                && read.trust == Some(true),
            "knic reads the kernel's VF table as {read:?}"
        );
        // The VF's netdev is in the pod with the claim's MAC.
        let net1 = ip(&["-n", &ns.0, "addr", "show", "dev", "net1"])?;
        ensure!(
            net1.contains("02:00:00:00:10:01") && net1.contains("192.0.2.10/24"),
            "in the pod: {net1}"
        );
        ensure!(
            netdev_of(&vf).is_none(),
            "the VF's netdev is still on the host"
        );
        // Detach and unprepare: the PF's table and the host link are as before.
        rig.runtime()?
            .stop_pod_sandbox(&rig.pod(&claim, Some(&ns)))
            .await
            .map_err(anyhow::Error::msg)
            .context("detach")?;
        rig.runtime()?
            .remove_pod_sandbox(&rig.pod(&claim, None))
            .await
            .map_err(anyhow::Error::msg)?;
        let error = rig.unprepare(&claim).await?;
        ensure!(error.is_empty(), "unprepare: {error}");
        let back = netdev_of(&vf).context("the VF's netdev did not come back")?;
        ensure!(back == netdev, "the VF came back as {back}, not {netdev}");
        // The PF's assignment is cleared; igb then reports the MAC the VF registered for its
        // netdev (its own, put back), where it reported none before the VF had registered one.
        ensure!(
            table_as_before(&pf.name, &netdev)? == table_before,
            "the PF's table was not put back: {} (before: {table_before})",
            vf_line(&pf.name, 0)?
        );
        let (line, perm) = link_line(&netdev)?;
        ensure!(
            line == link_before.0,
            "the VF's host link differs: {line} (before: {})",
            link_before.0
        );
        ensure!(
            perm.as_deref() == Some("02:00:00:00:10:01"),
            "igbvf's permanent MAC after a reset under the PF's assignment: {perm:?}"
        );
        Ok(())
    }
    .await;
    rig.finish(outcome).await
}

/// One attach and detach of `device` with the VF MAC `mac`, the VF's netdev taking another
/// ifindex in the pod (a link there holds its own), and, with `host_blocker`, another on the
/// way back (a host link took its index meanwhile). The VF must come home under its name.
async fn round_trip(
    rig: &Rig,
    name: &str,
    vf: &str,
    mac: &str,
    host_blocker: bool,
) -> anyhow::Result<()> {
    let netdev = netdev_of(vf).context("the VF has no netdev on the host")?;
    let index = std::fs::read_to_string(format!("/sys/class/net/{netdev}/ifindex"))?
        .trim()
        .to_owned();
    // A VF that just came home from the previous round is published with its netdev at the
    // next rescan (link events are coalesced); the scheduler would only hand it out then, so
    // the trial waits for that too instead of racing it (once seen in CI: prepare 30 ms
    // before the rescan, "has no network interface on the host").
    let device = device_name(vf);
    knic_e2e::harness::eventually(
        "the VF published with its netdev",
        std::time::Duration::from_secs(20),
        || async {
            let slices = rig.cluster.slices().await?;
            let published = slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .any(|d| {
                    d.name == device
                        && d.attributes
                            .as_ref()
                            .and_then(|a| a.get("ifName"))
                            .is_some()
                });
            Ok(published.then_some(()))
        },
    )
    .await?;
    let claim = rig
        .claim(name, &device, Some(json!({"vf": {"mac": mac}})))
        .await?;
    prepared(&claim, &rig.prepare(&claim).await?)?;
    let ns = Netns::new(&format!("knt-{name}"))?;
    ip(&[
        "-n",
        &ns.0,
        "link",
        "add",
        "knt-taken",
        "index",
        &index,
        "type",
        "dummy",
    ])?;
    rig.runtime()?
        .run_pod_sandbox(&rig.pod(&claim, Some(&ns)))
        .await
        .map_err(anyhow::Error::msg)
        .context("attach")?;
    let net1 = ip(&["-n", &ns.0, "-o", "link", "show", "dev", "net1"])?;
    let pod_index = net1.split(':').next().unwrap_or_default().trim().to_owned();
    ensure!(
        pod_index != index && net1.contains(mac),
        "the VF in the pod: {net1} (host index {index})"
    );
    let _blocker = if host_blocker {
        ip(&[
            "link",
            "add",
            "knt-hostblk",
            "index",
            &index,
            "type",
            "dummy",
        ])?;
        Some(super::rig::Links(vec!["knt-hostblk"]))
    } else {
        None
    };
    rig.runtime()?
        .stop_pod_sandbox(&rig.pod(&claim, Some(&ns)))
        .await
        .map_err(anyhow::Error::msg)
        .context("detach")?;
    rig.runtime()?
        .remove_pod_sandbox(&rig.pod(&claim, None))
        .await
        .map_err(anyhow::Error::msg)?;
    let error = rig.unprepare(&claim).await?;
    ensure!(error.is_empty(), "unprepare: {error}");
    let home = netdev_of(vf);
    ensure!(
        home.as_deref() == Some(netdev.as_str()),
        "the VF came home as {home:?}, not {netdev} (pod now: {})",
        ip(&["-n", &ns.0, "-o", "link"]).unwrap_or_default()
    );
    let line = ip(&["-o", "link", "show", "dev", &netdev])?;
    // igbvf took the assigned MAC as its permanent one when it reset in the pod: the next
    // claim meets a permanent MAC that is not the one the previous capture recorded.
    ensure!(
        line.contains(&format!("permaddr {mac}")),
        "the VF's permanent MAC after the round trip: {line}"
    );
    let home_index = line.split(':').next().unwrap_or_default().trim().to_owned();
    ensure!(
        (home_index != index) == host_blocker,
        "host index {home_index}, before {index}, host blocker {host_blocker}"
    );
    Ok(())
}

/// Identity checks on a real VF whose ifindex changes (a link in the pod holds it; later a
/// host link takes it while the VF is away) and whose permanent MAC changes: igbvf takes the
/// MAC the PF assigned as its permanent address when the VF resets in the pod, so the second
/// claim finds a permanent MAC the first one gave it, and leaves another.
pub async fn vf_comes_home_despite_new_ifindex_and_permanent_mac(m: Machine) -> anyhow::Result<()> {
    let rig = rig_with_vfs(&m, "vm-vf-identity", 1).await?;
    let outcome = async {
        let vf = m.claim_pf().vf_address(0)?;
        round_trip(&rig, "first", &vf, "02:00:00:00:20:01", false).await?;
        round_trip(&rig, "second", &vf, "02:00:00:00:20:02", true).await?;
        let checkpoint = std::fs::read_to_string(rig.config.plugin_dir.join("checkpoint.json"))?;
        ensure!(
            checkpoint.contains("\"claims\":{}"),
            "checkpoint not empty: {checkpoint}"
        );
        Ok(())
    }
    .await;
    rig.finish(outcome).await
}

/// What igb refuses fails the attach with the field named, and what was set before it is
/// undone: the PF's table and the VF are as before every try.
pub async fn refused_vf_settings_fail_the_attach_naming_them(m: Machine) -> anyhow::Result<()> {
    let rig = rig_with_vfs(&m, "vm-vf-refused", 1).await?;
    let outcome = async {
        let pf = m.claim_pf().clone();
        let vf = pf.vf_address(0)?;
        let netdev = netdev_of(&vf).context("VF 0 has no netdev")?;
        let table_before = vf_line(&pf.name, 0)?;
        let cases = [
            (
                json!({"vlan": 300, "trust": true, "linkState": "enable"}),
                "vf.linkState (state enable): the PF's driver does not support this setting: \
                 Operation not supported",
            ),
            (
                json!({"vlan": 300, "minTxRate": 10}),
                "vf.minTxRate/vf.maxTxRate (min_tx_rate 10 max_tx_rate 0): the PF's driver \
                 refused the rate",
            ),
            (
                json!({"vlan": 300, "vlanProtocol": "802.1ad"}),
                "vf.vlanProtocol (vlan 300 qos 0 proto 802.1ad): the PF's driver does not \
                 support this VLAN protocol: Protocol not supported",
            ),
        ];
        for (n, (vf_config, want)) in cases.into_iter().enumerate() {
            let name = format!("refused-{n}");
            let claim = rig
                .claim(&name, &device_name(&vf), Some(json!({"vf": vf_config})))
                .await?;
            prepared(&claim, &rig.prepare(&claim).await?)?;
            let ns = Netns::new(&format!("knt-{name}"))?;
            let err = rig
                .runtime()?
                .run_pod_sandbox(&rig.pod(&claim, Some(&ns)))
                .await
                .err()
                .context("igb must refuse")?
                .to_string();
            let want = format!("setting VF 0 of {}: {want}", pf.name);
            ensure!(err.contains(&want), "{err}\nwant: {want}");
            ensure!(
                table_as_before(&pf.name, &netdev)? == table_before,
                "not undone: {} (before: {table_before})",
                vf_line(&pf.name, 0)?
            );
            ensure!(
                netdev_of(&vf).as_deref() == Some(netdev.as_str()),
                "the VF left"
            );
            let error = rig.unprepare(&claim).await?;
            ensure!(error.is_empty(), "unprepare: {error}");
        }
        Ok(())
    }
    .await;
    rig.finish(outcome).await
}

/// `kill -9` right after the PF took the settings (before the move): the restarted driver puts
/// them back (the sandbox failed, so the runtime no longer lists it). Then an attach and a
/// `kill -9` with the VF in the pod: the restarted driver detaches it at the pod's stop and
/// puts the PF's table back.
pub async fn vf_settings_restored_after_kill9(m: Machine) -> anyhow::Result<()> {
    let mut rig = rig_with_vfs(&m, "vm-vf-kill9", 1).await?;
    let outcome = async {
        let pf = m.claim_pf().clone();
        let vf = pf.vf_address(0)?;
        let netdev = netdev_of(&vf).context("VF 0 has no netdev")?;
        let table_before = vf_line(&pf.name, 0)?;
        let claim = rig
            .claim(
                "crash",
                &device_name(&vf),
                Some(json!({"vf": {"vlan": 200, "qos": 1, "spoofChk": false}})),
            )
            .await?;
        prepared(&claim, &rig.prepare(&claim).await?)?;
        let ns = Netns::new("knt-crash")?;
        let pod = rig.pod(&claim, Some(&ns));
        // Crash after the PF took the settings.
        rig.stop().await?;
        rig.config = rig
            .config
            .clone()
            .with_env("KNIC_FAILPOINT", "attach:after-set-vf");
        rig.start_with_runtime(vec![]).await?;
        ensure!(
            rig.runtime()?.run_pod_sandbox(&pod).await.is_err(),
            "the attach must die at the failpoint"
        );
        let table = vf_line(&pf.name, 0)?;
        ensure!(
            table.contains("vlan 200, qos 1"),
            "the PF took nothing: {table}"
        );
        rig.config = rig.config.clone().with_env("KNIC_FAILPOINT", "");
        rig.start_with_runtime(vec![]).await?;
        eventually_table(&pf.name, &netdev, &table_before).await?;
        ensure!(
            netdev_of(&vf).as_deref() == Some(netdev.as_str()),
            "the VF left"
        );
        // The kubelet retries the sandbox; then the driver dies with the VF in the pod.
        rig.runtime()?
            .run_pod_sandbox(&pod)
            .await
            .map_err(anyhow::Error::msg)
            .context("attach")?;
        ensure!(vf_line(&pf.name, 0)?.contains("vlan 200, qos 1"));
        rig.kill9().await?;
        rig.start_with_runtime(vec![pod.clone()]).await?;
        rig.runtime()?
            .stop_pod_sandbox(&pod)
            .await
            .map_err(anyhow::Error::msg)
            .context("detach")?;
        rig.runtime()?
            .remove_pod_sandbox(&rig.pod(&claim, None))
            .await
            .map_err(anyhow::Error::msg)?;
        let error = rig.unprepare(&claim).await?;
        ensure!(error.is_empty(), "unprepare: {error}");
        eventually_table(&pf.name, &netdev, &table_before).await?;
        ensure!(
            netdev_of(&vf).as_deref() == Some(netdev.as_str()),
            "the VF did not come home as {netdev}"
        );
        Ok(())
    }
    .await;
    rig.finish(outcome).await
}

/// The PF's line for VF 0 with the MAC the VF registered for `netdev` (its own) read as
/// none: igb reports a VF's own MAC once the VF has registered it (when its netdev first opens
/// after the PF is up), where it reported none before.
fn table_as_before(pf: &str, netdev: &str) -> anyhow::Result<String> {
    let own = std::fs::read_to_string(format!("/sys/class/net/{netdev}/address"))?;
    Ok(vf_line(pf, 0)?.replace(
        &format!("link/ether {}", own.trim()),
        "link/ether 00:00:00:00:00:00",
    ))
}

/// Waits until the PF reports VF 0 (of `netdev`) as `want`.
async fn eventually_table(pf: &str, netdev: &str, want: &str) -> anyhow::Result<()> {
    knic_e2e::harness::eventually(
        "the PF's VF table is put back",
        std::time::Duration::from_secs(30),
        || async { Ok((table_as_before(pf, netdev)? == want).then_some(())) },
    )
    .await
    .with_context(|| format!("now: {:?}", vf_line(pf, 0)))
}
