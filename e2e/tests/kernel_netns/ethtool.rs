//! ethtool settings in the real kernel, on veths (which have changeable features and rx/tx
//! channels, and no rings or coalescing): applied in the pod before the link goes up, the
//! previous values recorded on the host first and put back on detach; refusals naming the
//! device, the setting and the kernel's text. Read back with knic's own ethtool netlink GET,
//! and with the `ethtool` CLI where it is installed (the host: e2e/run-tests.sh installs it;
//! the VM's initramfs has none, so there the GET alone reads back).

use anyhow::{Context, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{AttachMode, Kernel, Ns, Session, attach, capture, detach};
use knic_e2e::harness::{Netns, ip};
use knic_proto::netconfig::{Channels, EthtoolSettings, Rings};

use super::{Links, plan};

/// `ethtool <args>` in `netns`, if the CLI is installed.
fn ethtool_cli(netns: Option<&str>, args: &[&str]) -> anyhow::Result<Option<String>> {
    if !has_cli() {
        return Ok(None);
    }
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = std::process::Command::new("ip");
            c.args(["netns", "exec", ns, "ethtool"]);
            c
        }
        None => std::process::Command::new("ethtool"),
    };
    let out = match cmd.args(args).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    ensure!(
        out.status.success(),
        "ethtool {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()))
}

fn has_cli() -> bool {
    std::process::Command::new("ethtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A veth pair `a` (here) / `b` (in `peer`) with two RX and two TX queues, both in use.
fn veth(a: &str, b: &str, peer: &str) -> anyhow::Result<()> {
    ip(&[
        "link",
        "add",
        a,
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
        "type",
        "veth",
        "peer",
        "name",
        b,
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
        "netns",
        peer,
    ])?;
    Ok(())
}

fn asked() -> EthtoolSettings {
    EthtoolSettings {
        features: [
            ("rx-gro".to_owned(), true),
            ("tcp-segmentation-offload".to_owned(), false),
        ]
        .into(),
        channels: Some(Channels {
            rx: Some(1),
            tx: Some(1),
            ..Channels::default()
        }),
        ..EthtoolSettings::default()
    }
}

/// What knic's GET says of `name` in `ns`: (rx-gro, tx-tcp-segmentation, rx, tx channels).
async fn read_back(k: &Rtnl, ns: &Ns, name: &str) -> anyhow::Result<(bool, bool, u32, u32)> {
    let mut s = k.open(ns).await?.context("namespace")?;
    let state = s.ethtool_state(name, &asked()).await?;
    let f = state.features.context("features")?;
    let c = state.channels.context("channels")?;
    Ok((
        f.active.contains("rx-gro"),
        f.active.contains("tx-tcp-segmentation"),
        c.rx.unwrap_or(0),
        c.tx.unwrap_or(0),
    ))
}

pub(crate) async fn ethtool_on_a_moved_veth(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-e")?;
    let _peer = Netns::new("knt-peer-e")?;
    let _links = Links(vec!["knt-e0"]);
    veth("knt-e0", "knt-e1", "knt-peer-e")?;
    let p = knic_driver::netns::AttachPlan {
        ethtool: Some(asked()),
        ..plan("knt-e0", AttachMode::Move)
    };
    let before = read_back(k, &Ns::Host, "knt-e0").await?;
    ensure!(before == (false, true, 2, 2), "a fresh veth: {before:?}");

    let requests = k.requests();
    let restore = capture(k, &p).await?;
    let capture_requests = k.requests() - requests;
    let previous = restore.ethtool.clone().context("nothing recorded")?;
    ensure!(
        previous.features.get("rx-gro") == Some(&false)
            && previous.features.get("tx-tcp-segmentation") == Some(&true)
            && previous.features.get("tx-tcp6-segmentation") == Some(&true),
        "recorded {previous:?}"
    );
    ensure!(
        previous.channels
            == Some(Channels {
                rx: Some(2),
                tx: Some(2),
                ..Channels::default()
            }),
        "recorded {previous:?}"
    );

    let requests = k.requests();
    let started = std::time::Instant::now();
    attach(k, &p, &Ns::Pod(pod.path()), &restore, false).await?;
    let attach_time = started.elapsed();
    let attach_requests = k.requests() - requests;
    let now = read_back(k, &Ns::Pod(pod.path()), "net1").await?;
    ensure!(now == (true, false, 1, 1), "in the pod: {now:?}");
    if let Some(features) = ethtool_cli(Some("knt-pod-e"), &["-k", "net1"])? {
        ensure!(
            features.contains("generic-receive-offload: on")
                && features.contains("tcp-segmentation-offload: off"),
            "ethtool -k net1:\n{features}"
        );
        let channels = ethtool_cli(Some("knt-pod-e"), &["-l", "net1"])?.unwrap_or_default();
        let current = channels
            .split("Current hardware settings:")
            .nth(1)
            .unwrap_or_default();
        ensure!(
            current.contains("RX:\t\t1") && current.contains("TX:\t\t1"),
            "ethtool -l net1:\n{channels}"
        );
    }

    detach(k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
    let back = read_back(k, &Ns::Host, "knt-e0").await?;
    ensure!(back == before, "home: {back:?}, before {before:?}");
    if let Some(features) = ethtool_cli(None, &["-k", "knt-e0"])? {
        ensure!(
            features.contains("generic-receive-offload: off")
                && features.contains("tcp-segmentation-offload: on"),
            "ethtool -k knt-e0:\n{features}"
        );
    }
    eprintln!(
        "ethtool on a moved veth: capture {capture_requests} requests, attach {attach_requests} \
         requests in {attach_time:?} (cli cross-check: {})",
        has_cli()
    );
    Ok(())
}

pub(crate) async fn ethtool_refusals_name_device_setting_and_kernel_text(
    k: &Rtnl,
) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-f")?;
    let _peer = Netns::new("knt-peer-f")?;
    let _links = Links(vec!["knt-f0"]);
    veth("knt-f0", "knt-f1", "knt-peer-f")?;
    let with = |settings: EthtoolSettings| knic_driver::netns::AttachPlan {
        ethtool: Some(settings),
        ..plan("knt-f0", AttachMode::Move)
    };
    let fixed = with(EthtoolSettings {
        features: [("rx-vlan-filter".to_owned(), true)].into(),
        ..EthtoolSettings::default()
    });
    let e = capture(k, &fixed).await.err().context("fixed")?.to_string();
    ensure!(
        e == "host: setting ethtool features of knt-f0: rx-vlan-filter cannot be turned on: the \
              device has it fixed off",
        "{e}"
    );
    let rings = with(EthtoolSettings {
        rings: Some(Rings {
            rx: Some(512),
            ..Rings::default()
        }),
        ..EthtoolSettings::default()
    });
    let e = capture(k, &rings).await.err().context("rings")?.to_string();
    ensure!(
        e == "host: reading ethtool rings of knt-f0: the device's driver does not support \
              ethtool rings (Operation not supported (os error 95))",
        "{e}"
    );
    let too_many = with(EthtoolSettings {
        channels: Some(Channels {
            rx: Some(64),
            ..Channels::default()
        }),
        ..EthtoolSettings::default()
    });
    let restore = capture(k, &too_many).await?;
    let e = attach(k, &too_many, &Ns::Pod(pod.path()), &restore, false)
        .await
        .err()
        .context("too many channels")?
        .to_string();
    let expected = format!(
        "{}: setting ethtool channels of net1 (rx 64): Invalid argument (os error 22): requested \
         channel count exceeds maximum; the device's maxima: rx 2 tx 2",
        pod.path().display()
    );
    ensure!(e == expected, "{e}\n!=\n{expected}");
    let mut host = k.open(&Ns::Host).await?.context("host")?;
    ensure!(
        host.find_link("knt-f0").await?.is_some(),
        "the failed attach is undone"
    );
    Ok(())
}
