//! Attach benchmark: attach + detach of one veth device with one IPv4 address, one IPv6 address
//! and one route, through knic's executor (what the driver's NRI hook runs) and, side by side
//! in the same run, through the CNI `host-device` plugin with `static` IPAM, exec'd exactly as
//! a container runtime does (CNI_* environment, network configuration on stdin).
//!
//! Both sides do the same work on the same device: move it into a pod namespace renamed to
//! `net1`, add 192.0.2.10/24, 2001:db8::10/64 and 203.0.113.0/24 via 192.0.2.1, bring it up;
//! then move it back to the host under its own name (down, as it started). knic's attach time
//! includes `capture` (the hook does it too); host-device's times are from spawn to exit of the
//! plugin (which itself execs `static`). A cycle is attach + detach.
//!
//! A third row, the kernel floor, times only the two namespace moves (one RTM_NEWLINK each way
//! through knic's rtnetlink session, sessions opened beforehand, no addresses): the kernel
//! waits for an RCU grace period (`rcu_barrier()` in `__dev_change_net_namespace`) on every
//! move, so neither side can go below it, and it bounds the ratio a machine can show.
//!
//! Method: 20 warm-up cycles per side, then the measured cycles INTERLEAVED — each iteration
//! runs one knic cycle, one host-device cycle and one kernel-floor cycle — so drift in machine
//! load hits every side alike. Each side is verified with `ip` on its first warm-up cycle and its last measured
//! cycle (attached: addresses and route in the pod; detached: the device back on the host
//! under its name, nothing left in the pod); every knic attach is also checked from the link
//! state it returns, every host-device ADD from its result. Verification is never timed.
//!
//! The process first enters private network and mount namespaces (its "host"), so nothing it
//! creates outlives it; it also deletes what it made. Needs root (skips otherwise).
//!
//! Run: `cargo bench -p knic-e2e --bench attach` (`KNIC_BENCH_CYCLES=N` to change the
//! number of measured cycles, default 1000; `KNIC_BENCH_CNI_PATH=DIR` for another plugin
//! directory than /usr/lib/cni or /opt/cni/bin). Without cargo bench's `--bench` argument (as
//! `cargo test --all-targets` runs it) it does a smoke run of 3 cycles after 1 warm-up: the
//! same setup and verification, figures printed but no verdict.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{
    AttachMode, AttachPlan, Kernel, LinkChange, Ns, Session, attach, capture, detach,
};
use knic_e2e::bench::{ms, stats};
use knic_e2e::harness::ip;
use knic_proto::netconfig::{Cidr, Route};

const DEFAULT_CYCLES: usize = 1000;
const WARMUP: usize = 20;
/// Cycles when run by `cargo test --all-targets` (no `--bench` argument): a correctness smoke
/// run, not a measurement.
const SMOKE_CYCLES: usize = 3;
const HOST_IF: &str = "knt-bench0";
const PEER_IF: &str = "knt-bench1";
const POD_NS: &str = "knt-bench-pod";
const PEER_NS: &str = "knt-bench-peer";
const POD_IF: &str = "net1";
const ADDR4: &str = "192.0.2.10/24";
const ADDR6: &str = "2001:db8::10/64";
const ROUTE_DST: &str = "203.0.113.0/24";
const ROUTE_GW: &str = "192.0.2.1";
const CNI_DIRS: [&str; 2] = ["/usr/lib/cni", "/opt/cni/bin"];
const ATTACH_P99_TARGET: Duration = Duration::from_millis(5);
const RATIO_TARGET: f64 = 25.0;

/// The pod and peer namespaces and the veth pair; deleted on drop.
struct Setup;

impl Setup {
    fn new() -> anyhow::Result<Setup> {
        // Built first so a failure half-way still cleans up.
        let setup = Setup;
        for ns in [POD_NS, PEER_NS] {
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        ip(&[
            "link", "add", HOST_IF, "type", "veth", "peer", "name", PEER_IF, "netns", PEER_NS,
        ])?;
        ip(&["-n", PEER_NS, "addr", "add", "192.0.2.1/24", "dev", PEER_IF])?;
        ip(&["-n", PEER_NS, "link", "set", PEER_IF, "up"])?;
        // The device stays down on the host: host-device always returns it down, so knic
        // (which restores the captured state) has exactly the same work to do.
        Ok(setup)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", HOST_IF]);
        let _ = ip(&["-n", POD_NS, "link", "del", POD_IF]);
        for ns in [POD_NS, PEER_NS] {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

fn pod_path() -> PathBuf {
    PathBuf::from(format!("/run/netns/{POD_NS}"))
}

/// Checks with `ip` that the pod has `net1` with both addresses and the route.
fn verify_attached(side: &str) -> anyhow::Result<()> {
    let addrs = ip(&["-n", POD_NS, "addr", "show", POD_IF])?;
    ensure!(
        addrs.contains(ADDR4) && addrs.contains(ADDR6),
        "{side}: addresses in the pod after attach:\n{addrs}"
    );
    let routes = ip(&["-n", POD_NS, "route", "show", ROUTE_DST])?;
    ensure!(
        routes.contains(&format!("via {ROUTE_GW} dev {POD_IF}")),
        "{side}: route in the pod after attach: {routes:?}"
    );
    ensure!(
        ip(&["link", "show", HOST_IF]).is_err(),
        "{side}: {HOST_IF} still on the host after attach"
    );
    Ok(())
}

/// Checks with `ip` that the device is back on the host under its name and gone from the pod.
fn verify_detached(side: &str) -> anyhow::Result<()> {
    ip(&["link", "show", HOST_IF]).with_context(|| format!("{side}: {HOST_IF} not back"))?;
    ensure!(
        ip(&["-n", POD_NS, "link", "show", POD_IF]).is_err(),
        "{side}: {POD_IF} still in the pod after detach"
    );
    Ok(())
}

fn knic_plan() -> AttachPlan {
    let cidr = |s: &str| -> Cidr { s.parse().unwrap() };
    AttachPlan {
        pool: "bench".into(),
        device: HOST_IF.into(),
        request: "nic".into(),
        host_ifname: HOST_IF.into(),
        mode: AttachMode::Move,
        pod_ifname: POD_IF.into(),
        mtu: None,
        mac: None,
        addresses: vec![cidr(ADDR4), cidr(ADDR6)],
        routes: vec![Route {
            destination: cidr(ROUTE_DST),
            gateway: Some(ROUTE_GW.parse().unwrap()),
            source: None,
            metric: None,
            table: None,
        }],
        sysctls: BTreeMap::new(),
        identity: None,
        vf: None,
        bandwidth: None,
    }
}

/// One knic cycle: (capture + attach, detach).
async fn knic_cycle(
    k: &Rtnl,
    plan: &AttachPlan,
    pod: &Ns,
    verify: bool,
) -> anyhow::Result<(Duration, Duration)> {
    let start = Instant::now();
    let restore = capture(k, plan).await?;
    // `resume = false`: a fresh attach, as the hook does for a new pod.
    let link = attach(k, plan, pod, &restore, false).await?;
    let attach_time = start.elapsed();
    ensure!(
        link.name == POD_IF && link.up && plan.addresses.iter().all(|a| link.addresses.contains(a)),
        "knic: attached link {link:?}"
    );
    if verify {
        verify_attached("knic")?;
    }
    let start = Instant::now();
    detach(k, plan, Some(pod), &restore).await?;
    let detach_time = start.elapsed();
    if verify {
        verify_detached("knic")?;
    }
    Ok((attach_time, detach_time))
}

/// The kernel's own cost of one cycle: the two namespace moves (in as `net1`, back under the
/// host name) as single RTM_NEWLINKs, sessions opened beforehand, no addresses or routes. Any
/// attach/detach of a moved device pays at least this; it bounds the achievable ratio.
async fn floor_cycle(k: &Rtnl, pod: &Ns) -> anyhow::Result<(Duration, Duration)> {
    let mut host = k.open(&Ns::Host).await?.context("host session")?;
    let mut in_pod = k.open(pod).await?.context("pod session")?;
    let rename = |name: &str| LinkChange {
        name: Some(name.into()),
        ..Default::default()
    };
    let start = Instant::now();
    host.move_link(HOST_IF, pod, &rename(POD_IF)).await?;
    let move_in = start.elapsed();
    let start = Instant::now();
    in_pod
        .move_link(POD_IF, &Ns::Host, &rename(HOST_IF))
        .await?;
    let move_out = start.elapsed();
    Ok((move_in, move_out))
}

/// The CNI host-device plugin, exec'd the way libcni does.
struct HostDevice {
    plugin: PathBuf,
    dir: PathBuf,
}

impl HostDevice {
    fn find() -> Result<HostDevice, Vec<PathBuf>> {
        let dirs: Vec<PathBuf> = match std::env::var_os("KNIC_BENCH_CNI_PATH") {
            Some(d) => vec![PathBuf::from(d)],
            None => CNI_DIRS.iter().map(PathBuf::from).collect(),
        };
        dirs.iter()
            .find(|d| d.join("host-device").is_file() && d.join("static").is_file())
            .map(|d| HostDevice {
                plugin: d.join("host-device"),
                dir: d.clone(),
            })
            .ok_or_else(|| dirs.iter().map(|d| d.join("host-device")).collect())
    }

    /// The network configuration; DEL carries the ADD result as `prevResult`, as libcni does
    /// from its cache.
    fn config(prev_result: Option<&serde_json::Value>) -> Vec<u8> {
        let mut conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "bench",
            "type": "host-device",
            "device": HOST_IF,
            "ipam": {
                "type": "static",
                "addresses": [{"address": ADDR4}, {"address": ADDR6}],
                "routes": [{"dst": ROUTE_DST, "gw": ROUTE_GW}],
            },
        });
        if let Some(prev) = prev_result {
            conf["prevResult"] = prev.clone();
        }
        serde_json::to_vec(&conf).unwrap()
    }

    /// Runs the plugin with `command` and `stdin`; returns its stdout.
    fn run(&self, command: &str, stdin: &[u8]) -> anyhow::Result<Vec<u8>> {
        let mut child = Command::new(&self.plugin)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", "knt-bench")
            .env("CNI_NETNS", pod_path())
            .env("CNI_IFNAME", POD_IF)
            .env("CNI_PATH", &self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", self.plugin.display()))?;
        child.stdin.take().unwrap().write_all(stdin)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "host-device {command}: {}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out.stdout)
    }

    /// The plugin's own version line (printed to stderr when run without CNI_COMMAND) and,
    /// when it comes from a Debian package, that package's version.
    fn about(&self) -> String {
        let own = Command::new(&self.plugin)
            .output()
            .ok()
            .and_then(|o| {
                let text = String::from_utf8_lossy(&o.stderr).into_owned();
                text.lines().next().map(|l| l.trim().to_string())
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "version unknown".into());
        let package = Command::new("dpkg")
            .arg("-S")
            .arg(&self.plugin)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                let text = String::from_utf8_lossy(&o.stdout).into_owned();
                let name = text.split(':').next()?.trim().to_string();
                let version = Command::new("dpkg-query")
                    .args(["-W", "-f=${Version}", &name])
                    .output()
                    .ok()?;
                Some(format!(
                    "{name} {}",
                    String::from_utf8_lossy(&version.stdout).trim()
                ))
            });
        match package {
            Some(p) => format!("{own}; Debian {p}"),
            None => own,
        }
    }

    /// One host-device cycle: (ADD, DEL).
    fn cycle(&self, add_conf: &[u8], verify: bool) -> anyhow::Result<(Duration, Duration)> {
        let start = Instant::now();
        let out = self.run("ADD", add_conf)?;
        let add_time = start.elapsed();
        let result: serde_json::Value =
            serde_json::from_slice(&out).context("host-device ADD result")?;
        let ips: Vec<&str> = result["ips"]
            .as_array()
            .map(|a| a.iter().filter_map(|i| i["address"].as_str()).collect())
            .unwrap_or_default();
        ensure!(
            ips.contains(&ADDR4) && ips.contains(&ADDR6),
            "host-device: ADD result {result}"
        );
        if verify {
            verify_attached("host-device")?;
        }
        let del_conf = Self::config(Some(&result));
        let start = Instant::now();
        self.run("DEL", &del_conf)?;
        let del_time = start.elapsed();
        if verify {
            verify_detached("host-device")?;
        }
        Ok((add_time, del_time))
    }
}

/// Attach, detach and cycle times of one side.
#[derive(Default)]
struct Samples {
    attach: Vec<Duration>,
    detach: Vec<Duration>,
    cycle: Vec<Duration>,
}

impl Samples {
    fn push(&mut self, (a, d): (Duration, Duration)) {
        self.attach.push(a);
        self.detach.push(d);
        self.cycle.push(a + d);
    }
}

fn print_side(name: &str, s: &Samples) {
    for (phase, v) in [
        ("attach", &s.attach),
        ("detach", &s.detach),
        ("cycle", &s.cycle),
    ] {
        let (median, p99) = stats(v);
        println!("{name:<13} {phase:<7} {:>12} {:>12}", ms(median), ms(p99));
    }
}

fn met(ok: bool) -> &'static str {
    if ok { "MET" } else { "NOT MET" }
}

fn main() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: attach benchmark needs root (network namespaces)");
        return Ok(());
    }
    // Before any thread exists.
    let _isolated = knic_e2e::harness::Isolation::enter().map_err(|e| anyhow::anyhow!(e))?;

    let bench = std::env::args().any(|a| a == "--bench");
    let (cycles, warmup, smoke) = match std::env::var("KNIC_BENCH_CYCLES") {
        Ok(v) => (
            v.parse()
                .ok()
                .filter(|&n| n > 0)
                .with_context(|| format!("KNIC_BENCH_CYCLES={v}: not a positive integer"))?,
            WARMUP,
            false,
        ),
        Err(_) if bench => (DEFAULT_CYCLES, WARMUP, false),
        Err(_) => (SMOKE_CYCLES, 1, true),
    };
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let host_device = HostDevice::find();

    println!(
        "attach benchmark: move one veth into a pod netns as {POD_IF} + {ADDR4} + {ADDR6} + \
         route {ROUTE_DST} via {ROUTE_GW}, then back"
    );
    println!(
        "machine: kernel {kernel}, {cpus} CPUs; {cycles} measured cycles per side after \
         {warmup} warm-up, interleaved (each iteration: one knic cycle, one host-device cycle, \
         one kernel-floor cycle)"
    );
    match &host_device {
        Ok(hd) => println!(
            "host-device: {} ({}), static IPAM, CNI_PATH={}",
            hd.plugin.display(),
            hd.about(),
            hd.dir.display()
        ),
        Err(tried) => println!(
            "host-device not found at {}; install Debian's containernetworking-plugins \
             (measuring knic only)",
            tried
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }

    let _setup = Setup::new()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let k = Rtnl::new(None);
    let plan = knic_plan();
    let pod = Ns::Pod(pod_path());
    let add_conf = HostDevice::config(None);
    let mut knic = Samples::default();
    let mut hd = Samples::default();
    let mut floor = Samples::default();

    runtime.block_on(async {
        for i in 0..warmup {
            knic_cycle(&k, &plan, &pod, i == 0).await?;
            if let Ok(h) = &host_device {
                h.cycle(&add_conf, i == 0)?;
            }
            floor_cycle(&k, &pod).await?;
        }
        for i in 0..cycles {
            let last = i + 1 == cycles;
            knic.push(knic_cycle(&k, &plan, &pod, last).await?);
            if let Ok(h) = &host_device {
                hd.push(h.cycle(&add_conf, last)?);
            }
            floor.push(floor_cycle(&k, &pod).await?);
        }
        verify_detached("kernel floor")?;
        anyhow::Ok(())
    })?;

    println!();
    println!(
        "{:<13} {:<7} {:>12} {:>12}",
        "side", "phase", "median", "p99"
    );
    print_side("knic", &knic);
    if host_device.is_ok() {
        print_side("host-device", &hd);
    }
    print_side("kernel floor", &floor);
    println!();
    if smoke {
        println!(
            "smoke run (no --bench argument, e.g. cargo test): attach/detach verified on every \
             side; figures not meaningful, no verdict; run cargo bench for the measurement"
        );
        return Ok(());
    }
    let (knic_cycle_median, _) = stats(&knic.cycle);
    let (floor_cycle_median, _) = stats(&floor.cycle);
    println!(
        "kernel floor = the two namespace moves alone (one RTM_NEWLINK each way, no addresses, \
         sessions already open); knic's median cycle is {} above it",
        ms(knic_cycle_median.saturating_sub(floor_cycle_median))
    );
    let (_, knic_attach_p99) = stats(&knic.attach);
    if host_device.is_ok() {
        let (hd_cycle_median, _) = stats(&hd.cycle);
        let ratio = hd_cycle_median.as_secs_f64() / knic_cycle_median.as_secs_f64();
        println!("ratio (host-device median cycle / knic median cycle): {ratio:.1}x");
        println!(
            "best ratio this kernel allows (host-device median cycle / kernel floor median \
             cycle): {:.1}x",
            hd_cycle_median.as_secs_f64() / floor_cycle_median.as_secs_f64()
        );
        println!(
            "target knic median cycle >= {RATIO_TARGET}x faster than host-device: {} ({ratio:.1}x)",
            met(ratio >= RATIO_TARGET)
        );
    } else {
        println!(
            "target knic median cycle >= {RATIO_TARGET}x faster than host-device: NOT EVALUATED \
             (host-device not installed)"
        );
    }
    println!(
        "target knic attach p99 < {}: {} ({})",
        ms(ATTACH_P99_TARGET),
        met(knic_attach_p99 < ATTACH_P99_TARGET),
        ms(knic_attach_p99)
    );
    Ok(())
}
