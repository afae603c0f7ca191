//! knic's DHCPv4 client against a real server on the real kernel: Debian's `dnsmasq` serves
//! leases in one throwaway namespace, over a veth into another playing the pod. The client
//! runs as the driver runs it (a socket created inside the pod's namespace, bound to the
//! interface), the address goes on through knic's rtnetlink session, the lease is renewed at
//! the server's T1, and after the release dnsmasq's lease file no longer holds it. Without
//! root or without `dnsmasq` the trials are reported ignored with the reason.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use knic_driver::dhcp::client;
use knic_driver::dhcp::keeper::{self, Opener, WallClock};
use knic_driver::dhcp::socket::UdpTransport;
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{Kernel, Ns, Session};
use knic_e2e::harness::{Netns, ip, isolate, kernel_trial};
use libtest_mimic::Failed;

/// dnsmasq serving 10.77.0.50-60 on `knt-dsrv`, killed on drop.
struct Dnsmasq {
    child: Child,
    leases: PathBuf,
    log: PathBuf,
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dnsmasq {
    fn start(ns: &str, dir: &Path) -> anyhow::Result<Dnsmasq> {
        let leases = dir.join("leases");
        let log = dir.join("dnsmasq.log");
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "dnsmasq", "--no-daemon", "--port=0"])
            .args([
                "--interface=knt-dsrv",
                "--bind-interfaces",
                "--dhcp-authoritative",
            ])
            .arg("--dhcp-range=10.77.0.50,10.77.0.60,255.255.255.0,2m")
            // T1 and T2 short, so the test sees a renewal (dnsmasq's shortest lease is 2 min).
            .args(["--dhcp-option=option:T1,6", "--dhcp-option=option:T2,9"])
            .args(["--dhcp-option=option:mtu,1400", "--log-dhcp"])
            .arg(format!("--dhcp-leasefile={}", leases.display()))
            .arg(format!("--log-facility={}", log.display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting dnsmasq")?;
        Ok(Dnsmasq { child, leases, log })
    }

    fn leases(&self) -> String {
        std::fs::read_to_string(&self.leases).unwrap_or_default()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A server namespace and a pod namespace joined by a veth (`knt-dsrv` 10.77.0.1/24 on the
/// server side, `net1` without an address in the pod).
struct Segment {
    server: Netns,
    pod: Netns,
}

fn segment(tag: &str) -> anyhow::Result<Segment> {
    let server = Netns::new(&format!("knt-dhcp-srv-{tag}"))?;
    let pod = Netns::new(&format!("knt-dhcp-pod-{tag}"))?;
    ip(&[
        "link", "add", "knt-dsrv", "type", "veth", "peer", "name", "knt-dpod",
    ])?;
    ip(&["link", "set", "knt-dsrv", "netns", &server.0])?;
    ip(&["link", "set", "knt-dpod", "netns", &pod.0, "name", "net1"])?;
    ip(&[
        "-n",
        &server.0,
        "addr",
        "add",
        "10.77.0.1/24",
        "dev",
        "knt-dsrv",
    ])?;
    ip(&["-n", &server.0, "link", "set", "knt-dsrv", "up"])?;
    ip(&["-n", &pod.0, "link", "set", "net1", "up"])?;
    Ok(Segment { server, pod })
}

fn mac_of(ns: &str, ifname: &str) -> anyhow::Result<[u8; 6]> {
    let out = ip(&["-n", ns, "-o", "link", "show", ifname])?;
    let text = out
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .context("no MAC")?;
    let mut mac = [0u8; 6];
    for (o, p) in mac.iter_mut().zip(text.split(':')) {
        *o = u8::from_str_radix(p, 16)?;
    }
    Ok(mac)
}

struct PodSocket(PathBuf);

impl Opener for PodSocket {
    type T = UdpTransport;
    async fn open(&self) -> std::io::Result<UdpTransport> {
        UdpTransport::open(Some(&self.0), "net1").await
    }
}

async fn lease_renew_release() -> anyhow::Result<()> {
    let seg = segment("a")?;
    let dir = tempfile::tempdir()?;
    let server = Dnsmasq::start(&seg.server.0, dir.path())?;
    let mac = mac_of(&seg.pod.0, "net1")?;
    let pod_path = seg.pod.path();

    // Acquire, as attach does: bounded by the claim's timeout.
    let started = Instant::now();
    let mut t = UdpTransport::open(Some(&pod_path), "net1").await?;
    let lease = client::acquire(
        &mut t,
        mac,
        Duration::from_secs(10),
        knic_driver::dhcp::now_unix(),
    )
    .await
    .map_err(|f| anyhow::anyhow!("{f}; dnsmasq log:\n{}", server.log()))?;
    drop(t);
    let took = started.elapsed();
    eprintln!(
        "lease {} from {} in {took:?} (lease {} s, T1 {} s, T2 {} s, mtu {:?})",
        lease.cidr(),
        lease.server,
        lease.lease_seconds,
        lease.renew_seconds,
        lease.rebind_seconds,
        lease.mtu
    );
    ensure!(lease.prefix_len == 24 && lease.server.to_string() == "10.77.0.1");
    ensure!(lease.router.map(|r| r.to_string()).as_deref() == Some("10.77.0.1"));
    ensure!(lease.mtu == Some(1400), "mtu option {:?}", lease.mtu);
    ensure!(
        (
            lease.renew_seconds,
            lease.rebind_seconds,
            lease.lease_seconds
        ) == (6, 9, 120)
    );

    // The address goes on through knic's own session, and `ip addr` shows it.
    let kernel = Rtnl::new(None);
    let mut pod = kernel
        .open(&Ns::Pod(pod_path.clone()))
        .await?
        .context("pod ns")?;
    pod.find_link("net1").await?.context("net1")?;
    pod.add_addresses("net1", &[lease.cidr()]).await?;
    let shown = ip(&["-n", &seg.pod.0, "-o", "-4", "addr", "show", "net1"])?;
    ensure!(
        shown.contains(&lease.cidr().to_string()),
        "ip addr: {shown}"
    );
    drop(pod);
    let held = server.leases();
    ensure!(
        held.contains(&lease.address.to_string()),
        "lease file: {held:?}"
    );
    let expiry_before: u64 = held.split_whitespace().next().unwrap_or("0").parse()?;

    // Renewal at T1: unicast from the leased address; the lease file's expiry moves.
    let mut renewed = Vec::new();
    let opener = PodSocket(pod_path.clone());
    let keeping = keeper::keep(
        lease.clone(),
        &WallClock,
        &opener,
        Duration::from_secs(3),
        |l| renewed.push(l.clone()),
    );
    let _ = tokio::time::timeout(Duration::from_secs(9), keeping).await;
    ensure!(
        !renewed.is_empty(),
        "no renewal within 9 s; dnsmasq log:\n{}",
        server.log()
    );
    let first = &renewed[0];
    ensure!(first.address == lease.address);
    ensure!(
        first.acquired_unix >= lease.acquired_unix + 6,
        "renewed before T1: {first:?} vs {lease:?}"
    );
    let log = server.log();
    ensure!(
        log.matches("DHCPACK(knt-dsrv) 10.77.0.").count() >= 2,
        "dnsmasq log:\n{log}"
    );
    let expiry_after: u64 = server
        .leases()
        .split_whitespace()
        .next()
        .unwrap_or("0")
        .parse()?;
    ensure!(
        expiry_after > expiry_before,
        "expiry {expiry_before} -> {expiry_after}"
    );
    eprintln!(
        "renewed {} time(s); lease-file expiry {expiry_before} -> {expiry_after}",
        renewed.len()
    );

    // Release: dnsmasq drops the lease from its file.
    let mut t = UdpTransport::open(Some(&pod_path), "net1").await?;
    client::release(&mut t, first)
        .await
        .map_err(|f| anyhow::anyhow!("{f}"))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.leases().contains(&lease.address.to_string()) {
        ensure!(
            Instant::now() < deadline,
            "lease still held after release: {:?}\n{}",
            server.leases(),
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(
        server.log().contains("DHCPRELEASE(knt-dsrv)"),
        "{}",
        server.log()
    );
    Ok(())
}

/// The attach step itself: lease, address, server MTU and default route through knic's
/// rtnetlink session, then the detach step's release.
async fn attach_step_configures_and_releases() -> anyhow::Result<()> {
    use knic_driver::dhcp::attach::{DhcpStep, obtain, release};
    let seg = segment("c")?;
    let dir = tempfile::tempdir()?;
    let server = Dnsmasq::start(&seg.server.0, dir.path())?;
    let mac = mac_of(&seg.pod.0, "net1")?;
    let ns = Ns::Pod(seg.pod.path());
    let kernel = Rtnl::new(None);
    let mut pod = kernel.open(&ns).await?.context("pod ns")?;
    pod.find_link("net1").await?.context("net1")?;
    let opener = PodSocket(seg.pod.path());
    let step = DhcpStep {
        timeout: Duration::from_secs(10),
        default_route: true,
        use_mtu: true,
        fixed_mtu: None,
        table: None,
    };
    // The pod's cluster interface has the default route already (metric 0): the lease's must
    // be installed beside it, not silently dropped as "already there".
    ip(&["-n", &seg.pod.0, "link", "set", "lo", "up"])?;
    ip(&["-n", &seg.pod.0, "route", "add", "default", "dev", "lo"])?;
    let started = Instant::now();
    let lease = obtain(&mut pod, &opener, &ns, "net1", mac, step)
        .await
        .map_err(|e| anyhow::anyhow!("{e}; dnsmasq log:\n{}", server.log()))?;
    eprintln!("attach step: {} in {:?}", lease.cidr(), started.elapsed());
    drop(pod);
    let addr = ip(&["-n", &seg.pod.0, "-o", "-4", "addr", "show", "net1"])?;
    ensure!(addr.contains(&lease.cidr().to_string()), "ip addr: {addr}");
    let route = ip(&["-n", &seg.pod.0, "route", "show", "default"])?;
    ensure!(
        route
            .lines()
            .any(|l| l.starts_with("default via 10.77.0.1 dev net1") && l.contains(" metric 1024"))
            && route.contains("default dev lo"),
        "ip route: {route}"
    );
    let link = ip(&["-n", &seg.pod.0, "-o", "link", "show", "net1"])?;
    ensure!(link.contains("mtu 1400"), "ip link: {link}");
    ensure!(server.leases().contains(&lease.address.to_string()));
    // A crash: only the checkpoint's JSON of the lease survives; the restarted driver's
    // unprepare releases from that record.
    let record = serde_json::to_string(&lease)?;
    let restored: knic_driver::dhcp::Lease = serde_json::from_str(&record)?;
    ensure!(
        restored == lease,
        "checkpoint form lost something: {record}"
    );
    let lease = restored;
    release(&opener, &ns, "net1", &lease).await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.leases().contains(&lease.address.to_string()) {
        ensure!(
            Instant::now() < deadline,
            "lease still held: {:?}",
            server.leases()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn no_server_fails_within_the_bound() -> anyhow::Result<()> {
    let seg = segment("b")?;
    let mac = mac_of(&seg.pod.0, "net1")?;
    let started = Instant::now();
    let mut t = UdpTransport::open(Some(&seg.pod.path()), "net1").await?;
    let e = client::acquire(&mut t, mac, Duration::from_secs(2), 0)
        .await
        .unwrap_err();
    let took = started.elapsed();
    eprintln!("no server: {e} after {took:?}");
    ensure!(
        e.to_string() == "no DHCPOFFER (sent DHCPDISCOVER 2 times)",
        "{e}"
    );
    ensure!(
        took >= Duration::from_secs(2) && took < Duration::from_millis(2500),
        "{took:?}"
    );
    Ok(())
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let isolated = isolate();
    let mut missing = isolated.as_ref().err().cloned();
    if missing.is_none() && Command::new("dnsmasq").arg("--version").output().is_err() {
        missing = Some("dnsmasq is not installed (Debian: dnsmasq-base)".into());
    }
    if let Some(why) = &missing {
        eprintln!("kernel_dhcp trials ignored: {why}");
    }
    type Case = fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>>>>;
    let cases: [(&str, Case); 3] = [
        ("kernel/dhcp_attach_step_configures_and_releases", || {
            Box::pin(attach_step_configures_and_releases())
        }),
        ("kernel/dhcp_lease_renew_release_with_dnsmasq", || {
            Box::pin(lease_renew_release())
        }),
        ("kernel/dhcp_no_server_fails_within_the_bound", || {
            Box::pin(no_server_fails_within_the_bound())
        }),
    ];
    let trials = cases
        .into_iter()
        .map(|(name, case)| {
            kernel_trial(name, missing.clone(), move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| Failed::from(e.to_string()))?;
                rt.block_on(case())
                    .map_err(|e| Failed::from(format!("{e:#}")))
            })
        })
        .collect();
    // One at a time: both segments use the veth names knt-dsrv/knt-dpod in this process's
    // private host namespace.
    let mut args = args;
    args.test_threads = Some(1);
    let conclusion = libtest_mimic::run(&args, trials);
    if let Ok(root) = &isolated {
        knic_e2e::harness::unisolate(root);
    }
    conclusion.exit();
}
