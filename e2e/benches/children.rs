//! Children benchmark: a macvlan child (bridge mode) of a host device, created directly in a
//! pod namespace with one IPv4 address, one IPv6 address and one route, then deleted — through
//! knic's executor (what the driver's NRI hook runs) and, side by side in the same run, through
//! the CNI `macvlan` plugin with `static` IPAM, exec'd exactly as a container runtime does
//! (CNI_* environment, network configuration on stdin).
//!
//! The host device is a veth `knt-chl0` playing a NIC (up, its peer in another namespace holds
//! the gateway 192.0.2.1). Both sides do the same work: a macvlan of it in bridge mode, named
//! `net1` in the pod, with 192.0.2.10/24, 2001:db8::10/64 and 203.0.113.0/24 via 192.0.2.1, up;
//! then the child is deleted and the parent stays as it was. knic's attach time includes
//! `capture` (the hook does it too); the plugin's times are from spawn to exit (it execs
//! `static` itself). A cycle is attach + detach (ADD + DEL for the plugin; DEL carries the ADD
//! result as `prevResult`, as libcni sends it from its cache).
//!
//! A third row, the kernel floor, times only the creation in the pod (one RTM_NEWLINK, no
//! addresses) and the deletion (one RTM_DELLINK), sessions opened beforehand: what any
//! implementation pays at least.
//!
//! Method: 20 warm-up cycles per side, then the measured cycles INTERLEAVED — each iteration
//! runs one knic cycle, one plugin cycle and one kernel-floor cycle — so drift in machine load
//! hits every side alike. Each side is verified with `ip` on its first warm-up cycle and its
//! last measured cycle (attached: a macvlan in bridge mode in the pod with the addresses and
//! the route, the parent still on the host; detached: nothing left in the pod, the parent
//! untouched); every knic attach is also checked from the link state it returns, every ADD
//! from its result. Verification is never timed.
//!
//! The process first enters private network and mount namespaces (its "host"), so nothing it
//! creates outlives it; it also deletes what it made. Needs root (skips otherwise).
//!
//! Run: `cargo bench -p knic-e2e --bench children` (`KNIC_BENCH_CYCLES=N` to change the
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
    AttachMode, AttachPlan, Kernel, LinkChange, NewChild, Ns, Session, attach, capture, detach,
};
use knic_e2e::bench::cni::{Plugin, Target, result_ips};
use knic_e2e::bench::timed::{self, Breakdown, Timed};
use knic_e2e::bench::{Plan, Samples, met, ms, ratio, stats};
use knic_e2e::harness::ip;
use knic_proto::netconfig::{ChildKind, Cidr, Route};

const DEFAULT_CYCLES: usize = 1000;
const WARMUP: usize = 20;
const PARENT: &str = "knt-chl0";
const PEER_IF: &str = "knt-chl1";
const POD_NS: &str = "knt-chl-pod";
const PEER_NS: &str = "knt-chl-peer";
const POD_IF: &str = "net1";
const MODE: &str = "bridge";
const ADDR4: &str = "192.0.2.10/24";
const ADDR6: &str = "2001:db8::10/64";
const ROUTE_DST: &str = "203.0.113.0/24";
const ROUTE_GW: &str = "192.0.2.1";
const ATTACH_P50_TARGET: Duration = Duration::from_millis(1);
const RATIO_TARGET: f64 = 10.0;

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
            "link", "add", PARENT, "type", "veth", "peer", "name", PEER_IF, "netns", PEER_NS,
        ])?;
        ip(&["-n", PEER_NS, "addr", "add", "192.0.2.1/24", "dev", PEER_IF])?;
        ip(&["-n", PEER_NS, "link", "set", PEER_IF, "up"])?;
        // Up, as a NIC in use: its children carry traffic at once.
        ip(&["link", "set", PARENT, "up"])?;
        Ok(setup)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = ip(&["-n", POD_NS, "link", "del", POD_IF]);
        let _ = ip(&["link", "del", PARENT]);
        for ns in [POD_NS, PEER_NS] {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

fn pod_path() -> PathBuf {
    PathBuf::from(format!("/run/netns/{POD_NS}"))
}

/// Checks with `ip` that the pod has `net1`, a bridge-mode macvlan, with both addresses and
/// the route, and that the parent is still on the host, up.
fn verify_attached(side: &str) -> anyhow::Result<()> {
    let link = ip(&["-d", "-n", POD_NS, "link", "show", POD_IF])?;
    ensure!(
        link.contains(&format!("macvlan mode {MODE}")),
        "{side}: {POD_IF} in the pod is not a {MODE}-mode macvlan:\n{link}"
    );
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
    verify_parent(side)
}

/// Checks with `ip` that the child is gone from the pod and the parent untouched.
fn verify_detached(side: &str) -> anyhow::Result<()> {
    ensure!(
        ip(&["-n", POD_NS, "link", "show", POD_IF]).is_err(),
        "{side}: {POD_IF} still in the pod after detach"
    );
    verify_parent(side)
}

fn verify_parent(side: &str) -> anyhow::Result<()> {
    let parent = ip(&["link", "show", PARENT]).with_context(|| format!("{side}: {PARENT} gone"))?;
    ensure!(
        parent.contains(",UP"),
        "{side}: {PARENT} no longer up:\n{parent}"
    );
    Ok(())
}

fn kind() -> ChildKind {
    ChildKind::Macvlan(MODE.into())
}

fn knic_plan() -> AttachPlan {
    let cidr = |s: &str| -> Cidr { s.parse().unwrap() };
    AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        pool: "bench".into(),
        device: PARENT.into(),
        request: "nic".into(),
        host_ifname: PARENT.into(),
        mode: AttachMode::Child {
            child: kind(),
            uplink: None,
        },
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

/// Kernel requests of knic's attaches and detaches, summed over the measured cycles.
#[derive(Default)]
struct Requests {
    attach: Breakdown,
    detach: Breakdown,
}

/// One knic cycle: (capture + attach, detach); its kernel requests are added to `requests`.
async fn knic_cycle(
    k: &Timed<Rtnl>,
    plan: &AttachPlan,
    pod: &Ns,
    verify: bool,
    requests: &mut Requests,
) -> anyhow::Result<(Duration, Duration)> {
    // Whatever an earlier, failed cycle left does not count against this one.
    k.take();
    let start = Instant::now();
    let restore = capture(k, plan).await?;
    // `resume = false`: a fresh attach, as the hook does for a new pod.
    let link = attach(k, plan, pod, &restore, false).await?;
    let attach_time = start.elapsed();
    timed::add(&mut requests.attach, &k.take());
    ensure!(
        link.name == POD_IF
            && link.up
            && link.kind.as_deref() == Some("macvlan")
            && plan.addresses.iter().all(|a| link.addresses.contains(a)),
        "knic: attached link {link:?}"
    );
    if verify {
        verify_attached("knic")?;
    }
    let start = Instant::now();
    detach(k, plan, Some(pod), &restore).await?;
    let detach_time = start.elapsed();
    timed::add(&mut requests.detach, &k.take());
    if verify {
        verify_detached("knic")?;
    }
    Ok((attach_time, detach_time))
}

/// The kernel's own cost of one cycle: the creation in the pod as one RTM_NEWLINK and the
/// deletion as one RTM_DELLINK, sessions opened beforehand, no addresses or routes.
async fn floor_cycle(k: &Rtnl, pod: &Ns) -> anyhow::Result<(Duration, Duration)> {
    let mut host = k.open(&Ns::Host).await?.context("host session")?;
    let mut in_pod = k.open(pod).await?.context("pod session")?;
    let kind = kind();
    let named = LinkChange {
        name: Some(POD_IF.into()),
        ..Default::default()
    };
    let start = Instant::now();
    host.add_child(PARENT, NewChild::Of(&kind), pod, &named)
        .await?;
    let create = start.elapsed();
    let start = Instant::now();
    in_pod.del_link(POD_IF).await?;
    let delete = start.elapsed();
    Ok((create, delete))
}

/// The CNI network configuration; DEL carries the ADD result as `prevResult`.
fn cni_config(prev_result: Option<&serde_json::Value>) -> Vec<u8> {
    let mut conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "bench",
        "type": "macvlan",
        "master": PARENT,
        "mode": MODE,
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

/// One plugin cycle: (ADD, DEL).
fn cni_cycle(
    plugin: &Plugin,
    add_conf: &[u8],
    verify: bool,
) -> anyhow::Result<(Duration, Duration)> {
    let netns = pod_path();
    let target = Target {
        netns: &netns,
        ifname: POD_IF,
        container_id: "knt-chl",
    };
    let start = Instant::now();
    let out = plugin.run("ADD", target, add_conf)?;
    let add_time = start.elapsed();
    let result: serde_json::Value = serde_json::from_slice(&out).context("macvlan ADD result")?;
    let ips = result_ips(&result);
    ensure!(
        ips.contains(&ADDR4) && ips.contains(&ADDR6),
        "macvlan: ADD result {result}"
    );
    if verify {
        verify_attached("macvlan")?;
    }
    let del_conf = cni_config(Some(&result));
    let start = Instant::now();
    plugin.run("DEL", target, &del_conf)?;
    let del_time = start.elapsed();
    if verify {
        verify_detached("macvlan")?;
    }
    Ok((add_time, del_time))
}

fn main() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: children benchmark needs root (network namespaces)");
        return Ok(());
    }
    // Before any thread exists.
    let _isolated = knic_e2e::harness::Isolation::enter().map_err(|e| anyhow::anyhow!(e))?;
    let run = Plan::from_env(DEFAULT_CYCLES, WARMUP)?;
    let plugin = Plugin::find("macvlan", &["static"]);

    println!(
        "children benchmark: a {MODE}-mode macvlan of {PARENT} created in a pod netns as \
         {POD_IF} + {ADDR4} + {ADDR6} + route {ROUTE_DST} via {ROUTE_GW}, then deleted"
    );
    println!(
        "machine: {}; {} measured cycles per side after {} warm-up, interleaved (each \
         iteration: one knic cycle, one CNI macvlan cycle, one kernel-floor cycle)",
        knic_e2e::bench::machine(),
        run.cycles,
        run.warmup
    );
    println!("{}", Plugin::describe(&plugin, "macvlan"));

    let _setup = Setup::new()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let k = Rtnl::new(None);
    let timed = Timed::new(k.clone());
    let plan = knic_plan();
    let pod = Ns::Pod(pod_path());
    let add_conf = cni_config(None);
    let mut knic = Samples::default();
    let mut cni = Samples::default();
    let mut floor = Samples::default();
    let mut requests = Requests::default();

    runtime.block_on(async {
        for i in 0..run.warmup {
            knic_cycle(&timed, &plan, &pod, i == 0, &mut Requests::default()).await?;
            if let Ok(p) = &plugin {
                cni_cycle(p, &add_conf, i == 0)?;
            }
            floor_cycle(&k, &pod).await?;
        }
        for i in 0..run.cycles {
            let last = i + 1 == run.cycles;
            knic.push(knic_cycle(&timed, &plan, &pod, last, &mut requests).await?);
            if let Ok(p) = &plugin {
                cni.push(cni_cycle(p, &add_conf, last)?);
            }
            floor.push(floor_cycle(&k, &pod).await?);
        }
        verify_detached("kernel floor")?;
        anyhow::Ok(())
    })?;

    println!();
    println!("{}", Samples::header());
    let mut rows = knic.rows("knic");
    if plugin.is_ok() {
        rows.extend(cni.rows("CNI macvlan"));
    }
    rows.extend(floor.rows("kernel floor"));
    for row in rows {
        println!("{row}");
    }
    println!();
    println!(
        "kernel floor = one RTM_NEWLINK creating the child in the pod + one RTM_DELLINK, no \
         addresses, sessions already open"
    );
    for (phase, made) in [("attach", &requests.attach), ("detach", &requests.detach)] {
        println!("knic's kernel requests per {phase} (mean over the measured cycles):");
        for line in timed::per_round(made, run.cycles) {
            println!("  {line}");
        }
    }
    if run.smoke {
        println!(
            "smoke run (no --bench argument, e.g. cargo test): attach/detach verified on every \
             side; figures not meaningful, no verdict; run cargo bench for the measurement"
        );
        return Ok(());
    }
    let (knic_attach_p50, _) = stats(&knic.attach);
    let attach_ok = knic_attach_p50 <= ATTACH_P50_TARGET;
    if plugin.is_ok() {
        let add_ratio = ratio(&cni.attach, &knic.attach);
        let cycle_ratio = ratio(&cni.cycle, &knic.cycle);
        println!("ratio (CNI macvlan ADD p50 / knic attach p50): {add_ratio:.1}x");
        println!("ratio (CNI macvlan cycle p50 / knic cycle p50): {cycle_ratio:.1}x");
        println!(
            "goal knic attach p50 <= {} and >= {RATIO_TARGET}x faster than the plugin's ADD: \
             {} (attach p50 {}: {}; ADD ratio {add_ratio:.1}x: {})",
            ms(ATTACH_P50_TARGET),
            met(attach_ok && add_ratio >= RATIO_TARGET),
            ms(knic_attach_p50),
            met(attach_ok),
            met(add_ratio >= RATIO_TARGET)
        );
    } else {
        println!(
            "goal knic attach p50 <= {} and >= {RATIO_TARGET}x faster than the plugin's ADD: \
             NOT EVALUATED (CNI macvlan not installed; attach p50 {}: {})",
            ms(ATTACH_P50_TARGET),
            ms(knic_attach_p50),
            met(attach_ok)
        );
    }
    Ok(())
}
