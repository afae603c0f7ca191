//! Soak benchmark: many attach/detach cycles of several pods at once through knic's real
//! kernel executor, to show that nothing accumulates. A driver lives for months and attaches
//! on every pod start, so one leaked fd, link, namespace or a few KiB per cycle is an outage
//! in waiting that no short test notices.
//!
//! Each of `KNIC_SOAK_PODS` pods (default 4) has its own veth (peer in a shared peer namespace)
//! and its own pod namespace, and runs its share of the cycles in its own task, all at once on
//! one multi-threaded runtime sharing one `Rtnl`: capture + attach (renamed `net1`, an IPv4 and
//! an IPv6 address, a route) then detach, as the NRI hook does. Open fds (`/proc/self/fd`,
//! handles of the process's own network namespace counted apart), RSS and threads (`/proc/self/status`), links in
//! the host namespace and named network namespaces are printed after a warm-up and after each
//! fifth of the cycles; fds and threads must not grow, namespace handles must not outnumber
//! threads (each thread keeps at most one, of its own namespace), links and namespaces must be
//! unchanged (the run fails otherwise); RSS is printed as a series, so a leak shows as a trend
//! and allocator warm-up as a plateau. Per-cycle median/p99 are
//! printed too, but this is not a timed test: the pods contend for the same rtnl lock, so a
//! cycle here is slower than in the attach benchmark.
//!
//! The process first enters private network and mount namespaces (`harness::isolate`), so
//! nothing it creates outlives it; it also deletes what it made. Needs root (skips otherwise).
//!
//! Run: `cargo bench -p knic-e2e --bench soak` (10,000 cycles in all; `KNIC_SOAK_CYCLES=N`
//! to change). Without cargo bench's `--bench` argument (as `cargo test --all-targets` runs it)
//! it does a smoke run of a few cycles per pod with the same checks.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{AttachMode, AttachPlan, Ns, attach, capture, detach};
use knic_e2e::bench::{ms, stats};
use knic_e2e::harness::ip;
use knic_proto::netconfig::{Cidr, Route};

const DEFAULT_CYCLES: usize = 10_000;
const DEFAULT_PODS: usize = 4;
/// Cycles per pod under `cargo test`: enough to run every path twice, not a measurement.
const SMOKE_CYCLES_PER_POD: usize = 3;
/// Cycles per pod before the baseline is taken, so lazily created state (runtime threads,
/// allocator arenas, cached sessions) is already there.
const WARMUP_PER_POD: usize = 5;
/// Resource snapshots taken during the measured cycles.
const SEGMENTS: usize = 5;
const PEER_NS: &str = "knt-soak-peer";
const POD_IF: &str = "net1";

fn host_if(i: usize) -> String {
    format!("knt-soak{i}")
}

fn peer_if(i: usize) -> String {
    format!("knt-soakp{i}")
}

fn pod_ns(i: usize) -> String {
    format!("knt-soak-pod{i}")
}

/// The namespaces and veth pairs; deleted on drop.
struct Setup {
    pods: usize,
}

impl Setup {
    fn new(pods: usize) -> anyhow::Result<Setup> {
        // Built first so a failure half-way still cleans up.
        let setup = Setup { pods };
        ip(&["netns", "add", PEER_NS])?;
        for i in 0..pods {
            let ns = pod_ns(i);
            ip(&["netns", "add", &ns])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&[
                "link",
                "add",
                &host_if(i),
                "type",
                "veth",
                "peer",
                "name",
                &peer_if(i),
                "netns",
                PEER_NS,
            ])?;
            ip(&["-n", PEER_NS, "link", "set", &peer_if(i), "up"])?;
        }
        Ok(setup)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        for i in 0..self.pods {
            let _ = ip(&["link", "del", &host_if(i)]);
            let _ = ip(&["-n", &pod_ns(i), "link", "del", POD_IF]);
            let _ = ip(&["netns", "del", &pod_ns(i)]);
        }
        let _ = ip(&["netns", "del", PEER_NS]);
    }
}

fn plan(i: usize) -> AttachPlan {
    let cidr = |s: String| -> Cidr { s.parse().unwrap() };
    AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        pool: "soak".into(),
        device: host_if(i),
        request: "nic".into(),
        host_ifname: host_if(i),
        mode: AttachMode::Move,
        pod_ifname: POD_IF.into(),
        mtu: None,
        mac: None,
        addresses: vec![
            cidr(format!("10.{i}.0.10/24")),
            cidr(format!("2001:db8:{i:x}::10/64")),
        ],
        routes: vec![Route {
            destination: cidr(format!("203.0.{i}.0/24")),
            gateway: Some(format!("10.{i}.0.1").parse().unwrap()),
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

/// What must stay flat across the run.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Resources {
    /// Open fds but the namespace handles below.
    fds: usize,
    /// Open handles of the process's own network namespace: each thread that ever ran a pod
    /// session keeps one, to return to (`Rtnl`), for its life. Bounded by the threads, not
    /// by the cycles: the runtime replaces a worker that blocks in a move, so which threads
    /// hold one changes over a run.
    netns_fds: usize,
    rss_kib: u64,
    threads: u64,
    host_links: usize,
    namespaces: usize,
}

fn status_field(name: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("{name} in /proc/self/status"))
}

fn resources() -> anyhow::Result<Resources> {
    // Only handles of the process's own namespace are the executor's way home; one of a pod's
    // namespace left open would keep a deleted pod's namespace (and its devices) alive, so it
    // counts with the other fds, which must not grow.
    let own = std::fs::read_link("/proc/self/ns/net")?;
    let mut fds = 0;
    let mut netns_fds = 0;
    for fd in std::fs::read_dir("/proc/self/fd")? {
        let target = std::fs::read_link(fd?.path()).unwrap_or_default();
        if target == own {
            netns_fds += 1;
        } else {
            fds += 1;
        }
    }
    Ok(Resources {
        fds,
        netns_fds,
        rss_kib: status_field("VmRSS:")?,
        threads: status_field("Threads:")?,
        host_links: ip(&["-o", "link", "show"])?.lines().count(),
        namespaces: ip(&["netns", "list"])?.lines().count(),
    })
}

/// One pod's cycles: capture + attach, then detach; returns each cycle's time.
async fn pod_cycles(k: Arc<Rtnl>, i: usize, cycles: usize) -> anyhow::Result<Vec<Duration>> {
    let plan = plan(i);
    let pod = Ns::Pod(PathBuf::from(format!("/run/netns/{}", pod_ns(i))));
    let mut times = Vec::with_capacity(cycles);
    for n in 0..cycles {
        let start = Instant::now();
        let restore = capture(&*k, &plan)
            .await
            .with_context(|| format!("pod {i} cycle {n}: capture"))?;
        let link = attach(&*k, &plan, &pod, &restore, false)
            .await
            .with_context(|| format!("pod {i} cycle {n}: attach"))?;
        ensure!(
            link.name == POD_IF && plan.addresses.iter().all(|a| link.addresses.contains(a)),
            "pod {i} cycle {n}: attached link {link:?}"
        );
        detach(&*k, &plan, Some(&pod), &restore)
            .await
            .with_context(|| format!("pod {i} cycle {n}: detach"))?;
        times.push(start.elapsed());
    }
    Ok(times)
}

/// Runs `per_pod` cycles on every pod at once.
async fn all_pods(k: &Arc<Rtnl>, pods: usize, per_pod: usize) -> anyhow::Result<Vec<Duration>> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..pods {
        tasks.spawn(pod_cycles(k.clone(), i, per_pod));
    }
    let mut all = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        all.extend(joined.context("pod task")??);
    }
    Ok(all)
}

fn positive(name: &str) -> anyhow::Result<Option<usize>> {
    match std::env::var(name) {
        Ok(v) => {
            Ok(Some(v.parse().ok().filter(|&n| n > 0).with_context(
                || format!("{name}={v}: not a positive integer"),
            )?))
        }
        Err(_) => Ok(None),
    }
}

fn main() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: soak benchmark needs root (network namespaces)");
        return Ok(());
    }
    // Before any thread exists.
    let _isolated = knic_e2e::harness::Isolation::enter().map_err(|e| anyhow::anyhow!(e))?;
    soak()
}

fn soak() -> anyhow::Result<()> {
    let bench = std::env::args().any(|a| a == "--bench");
    let pods = positive("KNIC_SOAK_PODS")?.unwrap_or(DEFAULT_PODS);
    let (per_pod, smoke) = match positive("KNIC_SOAK_CYCLES")? {
        Some(total) => (total.div_ceil(pods), false),
        None if bench => (DEFAULT_CYCLES.div_ceil(pods), false),
        None => (SMOKE_CYCLES_PER_POD, true),
    };
    println!(
        "soak: {pods} pods in parallel, {per_pod} attach/detach cycles each ({} in all) after \
         {WARMUP_PER_POD} warm-up cycles each; each cycle moves a veth into its pod namespace \
         as {POD_IF} with an IPv4 and an IPv6 address and a route, then back",
        per_pod * pods
    );

    let setup = Setup::new(pods)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(pods.min(4))
        .enable_all()
        .build()?;
    let k = Arc::new(Rtnl::new(None));
    let started = resources()?;
    runtime.block_on(all_pods(&k, pods, WARMUP_PER_POD))?;
    let before = resources()?;
    println!();
    println!(
        "{:<16} {:>8} {:>10} {:>10} {:>8} {:>11} {:>12}",
        "", "open fds", "netns fds", "RSS (KiB)", "threads", "host links", "named netns"
    );
    let row = |name: &str, r: &Resources| {
        println!(
            "{name:<16} {:>8} {:>10} {:>10} {:>8} {:>11} {:>12}",
            r.fds, r.netns_fds, r.rss_kib, r.threads, r.host_links, r.namespaces
        );
    };
    row("start", &started);
    row("after warm-up", &before);
    // The measured cycles in segments, so growth shows as a trend (a leak) or a plateau (the
    // allocator settling) rather than as one difference.
    let segments = SEGMENTS.min(per_pod);
    let mut times = Vec::with_capacity(per_pod * pods);
    let mut done = 0;
    let wall = Instant::now();
    let mut after = before.clone();
    for s in 0..segments {
        let n = per_pod * (s + 1) / segments - per_pod * s / segments;
        times.extend(runtime.block_on(all_pods(&k, pods, n))?);
        done += n * pods;
        after = resources()?;
        row(&format!("after {done}"), &after);
    }
    let wall = wall.elapsed();
    for i in 0..pods {
        ip(&["link", "show", &host_if(i)])
            .with_context(|| format!("{} not back on the host", host_if(i)))?;
        ensure!(
            ip(&["-n", &pod_ns(i), "link", "show", POD_IF]).is_err(),
            "{POD_IF} left in {}",
            pod_ns(i)
        );
    }

    let (median, p99) = stats(&times);
    println!();
    println!(
        "{} cycles in {:.1} s ({:.0} cycles/s); per cycle: median {}, p99 {}",
        times.len(),
        wall.as_secs_f64(),
        times.len() as f64 / wall.as_secs_f64(),
        ms(median),
        ms(p99)
    );
    println!(
        "RSS after warm-up to end: {:+} KiB",
        after.rss_kib as i64 - before.rss_kib as i64
    );
    drop(setup);
    // Fewer fds or threads than at the baseline is fine (an idle runtime worker or a cached
    // socket may close); more is what a leak looks like. Namespace handles are at most one
    // per live thread. Links and namespaces are exact.
    let flat = after.fds <= before.fds
        && after.netns_fds as u64 <= after.threads
        && after.threads <= before.threads
        && after.host_links == before.host_links
        && after.namespaces == before.namespaces;
    ensure!(
        flat,
        "resources grew over the run: after warm-up {before:?}, at the end {after:?}"
    );
    println!(
        "fds, threads, links and namespaces: flat{}",
        if smoke {
            " (smoke run without --bench: figures not meaningful)"
        } else {
            ""
        }
    );
    Ok(())
}
