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
//! knic's own cost, "above the moves": each knic cycle runs on a kernel wrapper that times
//! every request the executor makes, per operation (the executor itself is unchanged), and the
//! figure is the cycle minus the time spent inside its `move_link` requests — what knic adds
//! on top of the two moves (capture, session set-up, addresses, route, link reads, detach's
//! checks). host-device's moves happen inside the plugin process where they cannot be timed,
//! so its figure uses the SAME iteration's kernel-floor cycle as the estimate of its moves:
//! host-device cycle minus that iteration's floor cycle. The output says so next to the
//! figures, and lists knic's requests per cycle (calls, mean time) to show where the rest goes.
//!
//! Method: 20 warm-up cycles per side, then the measured cycles INTERLEAVED — each iteration
//! runs one knic cycle, one host-device cycle and one kernel-floor cycle — so drift in machine
//! load hits every side alike. Each side is verified with `ip` on its first warm-up cycle and
//! its last measured cycle (attached: addresses and route in the pod; detached: the device
//! back on the host under its name, nothing left in the pod); every knic attach is also checked
//! from the link state it returns, every host-device ADD from its result. Verification is never
//! timed.
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
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{
    AttachMode, AttachPlan, Kernel, LinkChange, Ns, Session, attach, capture, detach,
};
use knic_e2e::bench::cni::{Plugin, Target, result_ips};
use knic_e2e::bench::timed::{self, Breakdown, Timed, spent_in};
use knic_e2e::bench::{Plan, Samples, met, ms, ratio, row, stats};
use knic_e2e::harness::ip;
use knic_proto::netconfig::{Cidr, Route};

const DEFAULT_CYCLES: usize = 1000;
const WARMUP: usize = 20;
const HOST_IF: &str = "knt-bench0";
const PEER_IF: &str = "knt-bench1";
const POD_NS: &str = "knt-bench-pod";
const PEER_NS: &str = "knt-bench-peer";
const POD_IF: &str = "net1";
const ADDR4: &str = "192.0.2.10/24";
const ADDR6: &str = "2001:db8::10/64";
const ROUTE_DST: &str = "203.0.113.0/24";
const ROUTE_GW: &str = "192.0.2.1";
const ATTACH_P99_TARGET: Duration = Duration::from_millis(5);
const RATIO_TARGET: f64 = 25.0;
/// Goal for knic's cost above the moves, per cycle (p50).
const ABOVE_MOVES_TARGET: Duration = Duration::from_micros(500);
/// Goal for host-device's cost above the moves over knic's (p50 / p50).
const ABOVE_MOVES_RATIO_TARGET: f64 = 20.0;

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
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
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
        ethtool: None,
        link: Default::default(),
    }
}

/// One knic cycle: (capture + attach, detach), and the calls and time of the cycle's kernel
/// requests per operation.
async fn knic_cycle(
    k: &Timed<Rtnl>,
    plan: &AttachPlan,
    pod: &Ns,
    verify: bool,
) -> anyhow::Result<((Duration, Duration), Breakdown)> {
    // Whatever an earlier, failed cycle left does not count against this one.
    k.take();
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
    let requests = k.take();
    if verify {
        verify_detached("knic")?;
    }
    Ok(((attach_time, detach_time), requests))
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

/// The host-device network configuration; DEL carries the ADD result as `prevResult`, as
/// libcni does from its cache.
fn host_device_config(prev_result: Option<&serde_json::Value>) -> Vec<u8> {
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

/// One host-device cycle: (ADD, DEL).
fn host_device_cycle(
    plugin: &Plugin,
    add_conf: &[u8],
    verify: bool,
) -> anyhow::Result<(Duration, Duration)> {
    let netns = pod_path();
    let target = Target {
        netns: &netns,
        ifname: POD_IF,
        container_id: "knt-bench",
    };
    let start = Instant::now();
    let out = plugin.run("ADD", target, add_conf)?;
    let add_time = start.elapsed();
    let result: serde_json::Value =
        serde_json::from_slice(&out).context("host-device ADD result")?;
    let ips = result_ips(&result);
    ensure!(
        ips.contains(&ADDR4) && ips.contains(&ADDR6),
        "host-device: ADD result {result}"
    );
    if verify {
        verify_attached("host-device")?;
    }
    let del_conf = host_device_config(Some(&result));
    let start = Instant::now();
    plugin.run("DEL", target, &del_conf)?;
    let del_time = start.elapsed();
    if verify {
        verify_detached("host-device")?;
    }
    Ok((add_time, del_time))
}

/// Per-iteration cost above the namespace moves, per side.
#[derive(Default)]
struct AboveMoves {
    /// knic cycle minus the time inside its own `move_link` requests.
    knic: Vec<Duration>,
    /// host-device cycle minus the same iteration's kernel-floor cycle (its moves happen
    /// inside the plugin process; the floor is the estimate of them).
    host_device: Vec<Duration>,
    /// CPU time (user + system, all threads) of the plugin processes of one host-device
    /// cycle (ADD, DEL and their IPAM plugin), from the reaped children's rusage. A task
    /// waiting in `rcu_barrier()` sleeps, so no grace-period phase distorts it, whereas the
    /// floor-difference estimate swings with how many RCU callbacks the previous side left
    /// queued. Not a wall time: the plugin's threads may overlap each other and the wait.
    host_device_cpu: Vec<Duration>,
    /// The same for knic: CPU time of this process (all threads) during its cycle, the
    /// executor's own work plus the kernel's for its requests.
    knic_cpu: Vec<Duration>,
    /// The same for the same iteration's kernel-floor cycle (the two moves alone, sessions
    /// open): the moves' own kernel work, which both sides pay. Subtracted from each side's
    /// CPU it leaves the CPU above the moves, the CPU twin of the wall figure above, without
    /// its grace-period noise.
    floor_cpu: Vec<Duration>,
}

/// `a[i] - b[i]` per iteration (zero where b is larger).
fn minus(a: &[Duration], b: &[Duration]) -> Vec<Duration> {
    a.iter().zip(b).map(|(a, b)| a.saturating_sub(*b)).collect()
}

/// CPU time of this process so far (all threads).
fn self_cpu() -> Duration {
    rusage_cpu(nix::sys::resource::UsageWho::RUSAGE_SELF)
}

/// CPU time of every child process reaped so far (their own children included, as they
/// waited for them).
fn children_cpu() -> Duration {
    rusage_cpu(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
}

fn rusage_cpu(who: nix::sys::resource::UsageWho) -> Duration {
    match nix::sys::resource::getrusage(who) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(t.tv_sec().max(0) as u64)
                    + Duration::from_micros(t.tv_usec().max(0) as u64)
            };
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// Prints the above-the-moves table, the ratio and the verdict (no verdict in a smoke run).
fn report_above_moves(above: &AboveMoves, with_host_device: bool, smoke: bool) {
    println!();
    println!("cost above the namespace moves, per cycle:");
    println!("{}", Samples::header());
    println!("{}", row("knic", "above", &above.knic));
    if with_host_device {
        println!("{}", row("host-device", "above", &above.host_device));
    }
    println!();
    println!(
        "CPU time per cycle (user + system, all threads; the moves' kernel work included, \
         their grace-period wait not):"
    );
    println!("{}", Samples::header());
    println!("{}", row("knic", "CPU", &above.knic_cpu));
    if with_host_device {
        println!("{}", row("host-device", "CPU", &above.host_device_cpu));
    }
    println!("{}", row("kernel floor", "CPU", &above.floor_cpu));
    let knic_cpu_above = minus(&above.knic_cpu, &above.floor_cpu);
    let hd_cpu_above = minus(&above.host_device_cpu, &above.floor_cpu);
    println!("{}", row("knic", "CPU above", &knic_cpu_above));
    if with_host_device {
        println!("{}", row("host-device", "CPU above", &hd_cpu_above));
    }
    println!(
        "knic: cycle minus the time measured inside its own move_link requests (a wrapper \
         around the kernel; the executor is unchanged)"
    );
    if with_host_device {
        println!(
            "host-device: cycle minus the SAME iteration's kernel-floor cycle, an ESTIMATE of \
             its moves (they happen inside the plugin process and cannot be timed from here)"
        );
        println!(
            "host-device CPU: the plugin processes of the cycle (ADD, DEL, IPAM), from the \
             reaped children's rusage; knic CPU: this process during its cycle"
        );
    }
    if smoke {
        return;
    }
    let (knic_p50, _) = stats(&above.knic);
    let knic_ok = knic_p50 <= ABOVE_MOVES_TARGET;
    if with_host_device {
        let r = ratio(&above.host_device, &above.knic);
        println!("ratio above the moves (host-device p50 / knic p50): {r:.1}x");
        let cpu = ratio(&above.host_device_cpu, &above.knic_cpu);
        println!("ratio of CPU per cycle (host-device p50 / knic p50): {cpu:.1}x");
        let cpu_above = ratio(&hd_cpu_above, &knic_cpu_above);
        println!(
            "ratio of CPU above the moves (host-device p50 / knic p50, each minus the same \
             iteration's floor CPU): {cpu_above:.1}x"
        );
        println!(
            "goal knic <= {} per cycle above the moves and >= {ABOVE_MOVES_RATIO_TARGET}x \
             below host-device: {} (knic p50 {}: {}; wall ratio {r:.1}x (estimate): {}; CPU \
             above the moves {cpu_above:.1}x: {})",
            ms(ABOVE_MOVES_TARGET),
            met(knic_ok && (r >= ABOVE_MOVES_RATIO_TARGET || cpu_above >= ABOVE_MOVES_RATIO_TARGET)),
            ms(knic_p50),
            met(knic_ok),
            met(r >= ABOVE_MOVES_RATIO_TARGET),
            met(cpu_above >= ABOVE_MOVES_RATIO_TARGET)
        );
    } else {
        println!(
            "goal knic <= {} per cycle above the moves and >= {ABOVE_MOVES_RATIO_TARGET}x \
             below host-device: NOT EVALUATED (host-device not installed; knic p50 {}: {})",
            ms(ABOVE_MOVES_TARGET),
            ms(knic_p50),
            met(knic_ok)
        );
    }
}

fn main() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: attach benchmark needs root (network namespaces)");
        return Ok(());
    }
    // Before any thread exists.
    let _isolated = knic_e2e::harness::Isolation::enter().map_err(|e| anyhow::anyhow!(e))?;
    let run = Plan::from_env(DEFAULT_CYCLES, WARMUP)?;
    let host_device = Plugin::find("host-device", &["static"]);

    println!(
        "attach benchmark: move one veth into a pod netns as {POD_IF} + {ADDR4} + {ADDR6} + \
         route {ROUTE_DST} via {ROUTE_GW}, then back"
    );
    println!(
        "machine: {}; {} measured cycles per side after {} warm-up, interleaved (each \
         iteration: one knic cycle, one host-device cycle, one kernel-floor cycle)",
        knic_e2e::bench::machine(),
        run.cycles,
        run.warmup
    );
    println!("{}", Plugin::describe(&host_device, "host-device"));

    let _setup = Setup::new()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let raw = Rtnl::new(None);
    let timed = Timed::new(raw.clone());
    let plan = knic_plan();
    let pod = Ns::Pod(pod_path());
    let add_conf = host_device_config(None);
    let mut knic = Samples::default();
    let mut hd = Samples::default();
    let mut floor = Samples::default();
    let mut above = AboveMoves::default();
    let mut requests = Breakdown::new();
    // Netlink requests knic sent in the measured cycles (the floor's moves not included).
    let mut netlink_requests = 0u64;

    runtime.block_on(async {
        for i in 0..run.warmup {
            knic_cycle(&timed, &plan, &pod, i == 0).await?;
            if let Ok(p) = &host_device {
                host_device_cycle(p, &add_conf, i == 0)?;
            }
            floor_cycle(&raw, &pod).await?;
        }
        for i in 0..run.cycles {
            let last = i + 1 == run.cycles;
            let sent_before = timed.inner().requests();
            let knic_cpu_before = self_cpu();
            let (k, made) = knic_cycle(&timed, &plan, &pod, last).await?;
            above
                .knic_cpu
                .push(self_cpu().saturating_sub(knic_cpu_before));
            netlink_requests += timed.inner().requests() - sent_before;
            above
                .knic
                .push((k.0 + k.1).saturating_sub(spent_in(&made, "move_link")));
            timed::add(&mut requests, &made);
            knic.push(k);
            let cpu_before = children_cpu();
            let h = match &host_device {
                Ok(p) => Some(host_device_cycle(p, &add_conf, last)?),
                Err(_) => None,
            };
            let plugin_cpu = children_cpu().saturating_sub(cpu_before);
            let floor_cpu_before = self_cpu();
            let f = floor_cycle(&raw, &pod).await?;
            above
                .floor_cpu
                .push(self_cpu().saturating_sub(floor_cpu_before));
            if let Some(h) = h {
                above
                    .host_device
                    .push((h.0 + h.1).saturating_sub(f.0 + f.1));
                above.host_device_cpu.push(plugin_cpu);
                hd.push(h);
            }
            floor.push(f);
        }
        verify_detached("kernel floor")?;
        anyhow::Ok(())
    })?;

    println!();
    println!("{}", Samples::header());
    let mut rows = knic.rows("knic");
    if host_device.is_ok() {
        rows.extend(hd.rows("host-device"));
    }
    rows.extend(floor.rows("kernel floor"));
    for row in rows {
        println!("{row}");
    }
    report_above_moves(&above, host_device.is_ok(), run.smoke);
    println!();
    println!("knic's kernel requests per cycle (mean over the measured cycles):");
    for line in timed::per_round(&requests, run.cycles) {
        println!("  {line}");
    }
    println!(
        "knic's netlink requests per cycle: {:.1} (a lookup or dump counts one, a change one \
         per object; capture + attach + detach)",
        netlink_requests as f64 / run.cycles.max(1) as f64
    );
    println!();
    if run.smoke {
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
        let r = ratio(&hd.cycle, &knic.cycle);
        println!("ratio (host-device median cycle / knic median cycle): {r:.1}x");
        println!(
            "best ratio this kernel allows (host-device median cycle / kernel floor median \
             cycle): {:.1}x",
            ratio(&hd.cycle, &floor.cycle)
        );
        println!(
            "target knic median cycle >= {RATIO_TARGET}x faster than host-device: {} ({r:.1}x)",
            met(r >= RATIO_TARGET)
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
