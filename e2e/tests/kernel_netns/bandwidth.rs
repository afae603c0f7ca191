//! Egress limits in the real kernel: a TBF root qdisc on the pod's interface, read back with
//! `tc -j`, a short TCP transfer through it, and the host left as it was.

use anyhow::{Context, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{AttachMode, Ns, attach, capture, detach};
use knic_e2e::harness::{Netns, in_netns, ip};
use knic_proto::netconfig::{Bandwidth, ChildKind};

use super::{Links, host_link, plan};

/// Whether `tc` is there to read qdiscs back (sch_tbf itself is often built in, with no
/// `/sys/module` entry: a kernel without it fails the trial with "no tbf qdisc").
pub(crate) fn has_tc() -> bool {
    std::process::Command::new("tc")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `tc -j qdisc show dev <dev>` in `netns` (`None`: the test's host), as JSON.
fn qdiscs(netns: Option<&str>, dev: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut args = Vec::new();
    if let Some(ns) = netns {
        args.extend(["-n", ns]);
    }
    args.extend(["-j", "qdisc", "show", "dev", dev]);
    let out = std::process::Command::new("tc").args(&args).output()?;
    ensure!(
        out.status.success(),
        "tc {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).with_context(|| format!("tc -j said {text}"))
}

/// The root TBF of `dev`, if it has one.
fn root_tbf(netns: Option<&str>, dev: &str) -> anyhow::Result<Option<serde_json::Value>> {
    Ok(qdiscs(netns, dev)?
        .into_iter()
        .find(|q| q["kind"] == "tbf" && q["root"] == true))
}

/// Bytes a TCP stream from `from` to `to_addr:7008` (a listener in `responder`) delivers in
/// about a second, and the seconds it took: what the egress limit lets through.
fn tcp_throughput(
    from: &std::path::Path,
    responder: &std::path::Path,
    to_addr: &str,
) -> anyhow::Result<(u64, f64)> {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};
    let listener = in_netns(responder, || TcpListener::bind(format!("{to_addr}:7008")))??;
    let receiver = std::thread::spawn(move || -> std::io::Result<(u64, f64)> {
        let (mut stream, _) = listener.accept()?;
        stream.set_read_timeout(Some(Duration::from_secs(3)))?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0u64;
        let mut start = None;
        loop {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                break;
            }
            let started = *start.get_or_insert_with(Instant::now);
            total += n as u64;
            if started.elapsed() >= Duration::from_secs(1) {
                break;
            }
        }
        let seconds = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
        Ok((total, seconds))
    });
    let mut client = in_netns(from, || TcpStream::connect(format!("{to_addr}:7008")))??;
    client.set_write_timeout(Some(Duration::from_millis(200)))?;
    let chunk = vec![0x5au8; 64 * 1024];
    let deadline = Instant::now() + Duration::from_secs(4);
    // Until the receiver has its second and hangs up (a write error), or the deadline.
    while Instant::now() < deadline && !receiver.is_finished() {
        if let Err(e) = client.write(&chunk)
            && !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )
        {
            break;
        }
    }
    drop(client);
    receiver
        .join()
        .map_err(|_| anyhow::anyhow!("receiver thread panicked"))?
        .map_err(Into::into)
}

/// A macvlan child with `bandwidth.egress` gets a TBF root qdisc in the pod at that rate
/// before it comes up; a repeated (resumed) hook changes the same qdisc in place, with a new
/// rate too; traffic leaves at about the rate; and detach leaves the parent on the host as
/// it was, without any qdisc of knic's.
pub(crate) async fn egress_limit_on_a_macvlan_child(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-bw")?;
    let peer = Netns::new("knt-peer-bw")?;
    let _links = Links(vec!["knt-bw0"]);
    ip(&[
        "link",
        "add",
        "knt-bw0",
        "type",
        "veth",
        "peer",
        "name",
        "knt-bw1",
        "netns",
        "knt-peer-bw",
    ])?;
    ip(&["link", "set", "knt-bw0", "up"])?;
    ip(&[
        "-n",
        "knt-peer-bw",
        "addr",
        "add",
        "192.0.2.1/24",
        "dev",
        "knt-bw1",
    ])?;
    ip(&["-n", "knt-peer-bw", "link", "set", "knt-bw1", "up"])?;
    let host_before = qdiscs(None, "knt-bw0")?;

    let mut p = plan(
        "knt-bw0",
        AttachMode::Child {
            child: ChildKind::Macvlan("bridge".into()),
            uplink: None,
        },
    );
    // 16 Mbit/s: 2 MB/s, slow enough to tell from an unlimited veth, fast enough for a
    // one-second measurement.
    p.bandwidth = Some(Bandwidth {
        egress: 16_000_000,
        burst: None,
    });
    let restore = capture(k, &p).await?;
    attach(k, &p, &Ns::Pod(pod.path()), &restore, false).await?;
    let tbf = root_tbf(Some("knt-pod-bw"), "net1")?.context("no root tbf on net1")?;
    ensure!(tbf["options"]["rate"] == 2_000_000, "{tbf}");
    let handle = tbf["handle"].clone();

    // A resumed hook with another rate: the same qdisc, changed.
    p.bandwidth = Some(Bandwidth {
        egress: 8_000_000,
        burst: Some(32 * 1024),
    });
    attach(k, &p, &Ns::Pod(pod.path()), &restore, true).await?;
    let tbf = root_tbf(Some("knt-pod-bw"), "net1")?.context("no root tbf on net1")?;
    ensure!(
        tbf["options"]["rate"] == 1_000_000 && tbf["handle"] == handle,
        "replaced in place: {tbf}"
    );
    let burst = tbf["options"]["burst"].as_u64().context("burst")?;
    ensure!(burst.abs_diff(32 * 1024) <= 64, "burst {burst}: {tbf}");
    ensure!(
        qdiscs(Some("knt-pod-bw"), "net1")?.len() == 1,
        "one qdisc, no leftovers"
    );

    let (bytes, seconds) = tcp_throughput(&pod.path(), &peer.path(), "192.0.2.1")?;
    let rate = 1_000_000.0; // bytes/s
    let measured = bytes as f64 / seconds;
    eprintln!(
        "kernel/egress_limit_on_a_macvlan_child: {bytes} bytes in {seconds:.2} s = {:.2} Mbit/s through an 8 Mbit/s limit",
        measured * 8.0 / 1e6
    );
    ensure!(
        (bytes as f64) <= rate * seconds * 1.2 + 32.0 * 1024.0 + 64.0 * 1024.0,
        "{bytes} bytes in {seconds:.2} s is more than the limit lets through"
    );
    ensure!(
        measured >= rate * 0.25,
        "{bytes} bytes in {seconds:.2} s: far below the limit"
    );

    detach(k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
    ensure!(
        ip(&["-n", "knt-pod-bw", "-br", "link"])?
            .lines()
            .all(|l| !l.starts_with("net1")),
        "the child is gone"
    );
    ensure!(host_link(k, "knt-bw0").await? == Some(restore.host.clone()));
    ensure!(
        qdiscs(None, "knt-bw0")? == host_before,
        "the parent's qdiscs changed"
    );
    Ok(())
}

/// A moved device is limited in the pod, and comes home without knic's qdisc (removed in the
/// pod before the move back), otherwise exactly as it was.
pub(crate) async fn egress_limit_on_a_moved_veth(k: &Rtnl) -> anyhow::Result<()> {
    let pod = Netns::new("knt-pod-bm")?;
    let _links = Links(vec!["knt-bm0"]);
    ip(&[
        "link", "add", "knt-bm0", "type", "veth", "peer", "name", "knt-bm1",
    ])?;
    ip(&["link", "set", "knt-bm0", "up"])?;
    let host_before = qdiscs(None, "knt-bm0")?;
    let mut p = plan("knt-bm0", AttachMode::Move);
    p.bandwidth = Some(Bandwidth {
        egress: 2_000_000_000,
        burst: Some(256 * 1024),
    });
    let restore = capture(k, &p).await?;
    attach(k, &p, &Ns::Pod(pod.path()), &restore, false).await?;
    let tbf = root_tbf(Some("knt-pod-bm"), "net1")?.context("no root tbf on net1")?;
    ensure!(tbf["options"]["rate"] == 250_000_000, "{tbf}");
    detach(k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
    ensure!(host_link(k, "knt-bm0").await? == Some(restore.host.clone()));
    ensure!(root_tbf(None, "knt-bm0")?.is_none(), "knic's tbf came home");
    ensure!(
        qdiscs(None, "knt-bm0")? == host_before,
        "{:?} != {host_before:?}",
        qdiscs(None, "knt-bm0")?
    );
    // Detach again: nothing left to remove, nothing fails.
    detach(k, &p, Some(&Ns::Pod(pod.path())), &restore).await?;
    Ok(())
}
