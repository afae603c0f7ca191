//! Parallel attach benchmark: 16 pods, each in its own network namespace with its own veth
//! playing a NIC, started at once through knic's NRI handler — the `PodNetworks` the driver
//! registers with the runtime — so the wall time includes what the real hook does besides the
//! kernel work: the claim lookup and the durable checkpoint writes (fsync'd, in a temporary
//! directory on the machine's disk): at most one per pod's attach, before its first kernel
//! change, and one per pod's detach, group-committed so pods at once share writes. Three ways
//! in:
//!
//! - `NRI per-pod`: through the real NRI transport. knic's plugin (`nri::run`, as the driver
//!   runs it) is connected over a Unix socket to the test runtime, which sends the 16
//!   RunPodSandbox calls at once and orders only each pod's own events
//!   (`CallLocking::PerPod`, the per-pod locking proposed for NRI's adaptation). This is the
//!   row the goal applies to: what knic adds when pods start together.
//! - `NRI global`: the same, but the runtime lets one call through at a time node-wide, as
//!   containerd and CRI-O do today (a mutex around every NRI hook, `CallLocking::Global`): what a
//!   real node gets now, whatever knic does. Its ratio is about 16 x one pod's attach over 16
//!   bare moves.
//! - `in-process`: the hooks called directly (`run_pod_sandbox` per pod, all at once), no
//!   ttrpc: the transport's share is the difference to `NRI per-pod`.
//!
//! Detach is StopPodSandbox + RemovePodSandbox per pod, all pods at once, the same way in.
//!
//! Each device moves in as `net1` with 10.<i>.0.10/24, 2001:db8:<i>::10/64 and a route. The
//! reference is the bare moves: the same 16 devices moved into the same 16 namespaces at once,
//! one RTM_NEWLINK each through knic's rtnetlink sessions opened beforehand, nothing else. A
//! move waits for an RCU grace period under RTNL, so the kernel runs 16 moves one after the
//! other whoever asks; the ratio of the two wall times shows what knic adds (goal: at most
//! 1.2x).
//!
//! Method: 3 warm-up rounds, then the measured rounds, each running every way's 16 attaches
//! (wall time from the first request to the last answer) and 16 detaches, then the 16 bare
//! moves in and the 16 back, so drift in machine load hits all alike. Every hook must succeed;
//! the first warm-up round and the last measured round are verified with `ip` (every pod has
//! `net1` with its address, the host none of the devices; after detach the reverse).
//! Verification is never timed.
//!
//! The process first enters private network and mount namespaces (its "host"), so nothing it
//! creates outlives it; it also deletes what it made. Needs root (skips otherwise).
//!
//! Run: `cargo bench -p knic-e2e --bench parallel` (`KNIC_BENCH_CYCLES=N` measured rounds,
//! default 100; `KNIC_BENCH_PODS=N` pods, default 16). Without cargo bench's `--bench`
//! argument (as `cargo test --all-targets` runs it) it does a smoke run of 3 rounds after 1
//! warm-up: the same setup and verification, figures printed but no verdict.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use knic_driver::claims::ClaimStore;
use knic_driver::claims::checkpoint::{Attachment, CheckpointStore, PreparedClaim};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{AttachMode, AttachPlan, Kernel, LinkChange, Ns, Session};
use knic_driver::nri::runtime::{CallLocking, TestRuntime};
use knic_driver::nri::{self, NriHandler, NriSettings, PodSandbox};
use knic_driver::pods::{LogStatus, PodNetworks};
use knic_e2e::bench::timed::{self, Breakdown, Timed};
use knic_e2e::bench::{Plan, Samples, met, ms, ratio, stats};
use knic_e2e::harness::ip;
use knic_proto::netconfig::{Cidr, Route};

const DEFAULT_ROUNDS: usize = 100;
const DEFAULT_PODS: usize = 16;
const WARMUP: usize = 3;
const PEER_NS: &str = "knt-par-peer";
const POD_IF: &str = "net1";
const RATIO_TARGET: f64 = 1.2;
const BARE: &str = "bare moves";
const IN_PROCESS: &str = "in-process";
const PER_POD: &str = "NRI per-pod";
const GLOBAL: &str = "NRI global";

fn host_if(i: usize) -> String {
    format!("knt-par{i}")
}

fn peer_if(i: usize) -> String {
    format!("knt-parp{i}")
}

fn pod_ns(i: usize) -> String {
    format!("knt-par-pod{i}")
}

fn pod_path(i: usize) -> PathBuf {
    PathBuf::from(format!("/run/netns/{}", pod_ns(i)))
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

fn address4(i: usize) -> String {
    format!("10.{i}.0.10/24")
}

fn plan(i: usize) -> AttachPlan {
    let cidr = |s: String| -> Cidr { s.parse().unwrap() };
    AttachPlan {
        routing: Default::default(),
        network: None,
        from_template: false,
        addressing: Default::default(),
        pool: "parallel".into(),
        device: host_if(i),
        request: "nic".into(),
        host_ifname: host_if(i),
        mode: AttachMode::Move,
        pod_ifname: POD_IF.into(),
        mtu: None,
        mac: None,
        addresses: vec![cidr(address4(i)), cidr(format!("2001:db8:{i:x}::10/64"))],
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

/// One prepared claim per pod, as prepare leaves them in the checkpoint.
async fn prepare(claims: &ClaimStore, pods: usize) -> anyhow::Result<()> {
    let mut locked = claims.lock().await;
    let mut next = locked.checkpoint()?.clone();
    for i in 0..pods {
        let claim = PreparedClaim {
            network_label: None,
            namespace: "bench".into(),
            name: format!("claim-{i}"),
            uid: format!("claim-uid-{i}"),
            pod_uid: format!("pod-uid-{i}"),
            pod_name: format!("pod-{i}"),
            devices: vec![],
            configs: vec![],
            prepared_at: 0,
            attachments: vec![Attachment::planned(plan(i))],
            allocations: vec![],
            functions: vec![],
        };
        next.claims.insert(claim.uid.clone(), claim);
    }
    locked.save(next, true).await?;
    Ok(())
}

fn sandbox(i: usize, netns: bool) -> PodSandbox {
    PodSandbox {
        id: format!("sandbox-{i}"),
        name: format!("pod-{i}"),
        uid: format!("pod-uid-{i}"),
        namespace: "bench".into(),
        netns: netns.then(|| pod_path(i)),
        ips: vec![],
    }
}

/// Checks with `ip` that every pod has `net1` (with its address unless `side` is the bare
/// moves, which add none) and the host none of the devices (`attached`), or the reverse.
fn verify(pods: usize, attached: bool, side: &str) -> anyhow::Result<()> {
    for i in 0..pods {
        let in_pod = ip(&["-n", &pod_ns(i), "addr", "show", POD_IF]);
        let on_host = ip(&["link", "show", &host_if(i)]).is_ok();
        if attached {
            let addrs = in_pod.with_context(|| format!("{side}: pod {i} has no {POD_IF}"))?;
            ensure!(
                side == BARE || addrs.contains(&address4(i)),
                "{side}: pod {i}: {POD_IF} lacks {}:\n{addrs}",
                address4(i)
            );
            ensure!(!on_host, "{side}: {} still on the host", host_if(i));
        } else {
            ensure!(in_pod.is_err(), "{side}: pod {i} still has {POD_IF}");
            ensure!(on_host, "{side}: {} not back on the host", host_if(i));
        }
    }
    Ok(())
}

/// Runs every future (one per pod) at once; the wall time from the first start to the last
/// answer. The futures are built beforehand and do nothing until spawned.
async fn all_at_once<Fut>(futures: Vec<Fut>) -> anyhow::Result<Duration>
where
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let mut tasks = tokio::task::JoinSet::new();
    let start = Instant::now();
    for f in futures {
        tasks.spawn(f);
    }
    while let Some(joined) = tasks.join_next().await {
        joined.context("pod task")??;
    }
    Ok(start.elapsed())
}

/// The in-process round: every pod's RunPodSandbox at once, then every pod's Stop + Remove at
/// once, calling the hooks directly.
async fn knic_round(
    hooks: &Arc<PodNetworks<Timed<Rtnl>>>,
    pods: usize,
    check: bool,
) -> anyhow::Result<(Duration, Duration)> {
    let run: Vec<_> = (0..pods)
        .map(|i| {
            let hooks = Arc::clone(hooks);
            async move {
                hooks
                    .run_pod_sandbox(sandbox(i, true))
                    .await
                    .with_context(|| format!("RunPodSandbox of pod {i}"))
            }
        })
        .collect();
    let attach = all_at_once(run).await?;
    if check {
        verify(pods, true, IN_PROCESS)?;
    }
    let stop: Vec<_> = (0..pods)
        .map(|i| {
            let hooks = Arc::clone(hooks);
            async move {
                hooks
                    .stop_pod_sandbox(sandbox(i, true))
                    .await
                    .with_context(|| format!("StopPodSandbox of pod {i}"))?;
                hooks
                    .remove_pod_sandbox(sandbox(i, false))
                    .await
                    .with_context(|| format!("RemovePodSandbox of pod {i}"))
            }
        })
        .collect();
    let detach = all_at_once(stop).await?;
    if check {
        verify(pods, false, IN_PROCESS)?;
    }
    Ok((attach, detach))
}

/// The NRI round: the test runtime sends every pod's RunPodSandbox at once over the socket to
/// knic's plugin (letting them through as `locking` says), then every pod's Stop + Remove.
async fn nri_round(
    runtime: &Arc<TestRuntime>,
    locking: CallLocking,
    pods: usize,
    check: bool,
) -> anyhow::Result<(Duration, Duration)> {
    let side = match locking {
        CallLocking::PerPod => PER_POD,
        CallLocking::Global => GLOBAL,
    };
    runtime.set_call_locking(locking);
    let run: Vec<_> = (0..pods)
        .map(|i| {
            let runtime = Arc::clone(runtime);
            async move {
                runtime
                    .run_pod_sandbox(&sandbox(i, true))
                    .await
                    .with_context(|| format!("{side}: RunPodSandbox of pod {i}"))
            }
        })
        .collect();
    let attach = all_at_once(run).await?;
    if check {
        verify(pods, true, side)?;
    }
    let stop: Vec<_> = (0..pods)
        .map(|i| {
            let runtime = Arc::clone(runtime);
            async move {
                runtime
                    .stop_pod_sandbox(&sandbox(i, true))
                    .await
                    .with_context(|| format!("{side}: StopPodSandbox of pod {i}"))?;
                runtime
                    .remove_pod_sandbox(&sandbox(i, false))
                    .await
                    .with_context(|| format!("{side}: RemovePodSandbox of pod {i}"))
            }
        })
        .collect();
    let detach = all_at_once(stop).await?;
    if check {
        verify(pods, false, side)?;
    }
    Ok((attach, detach))
}

/// knic's NRI plugin, as the driver runs it, registered with a test runtime on a socket in
/// `dir`; the plugin stops when the returned sender is dropped.
async fn connect_plugin(
    dir: &std::path::Path,
    hooks: &Arc<PodNetworks<Timed<Rtnl>>>,
) -> anyhow::Result<(Arc<TestRuntime>, tokio::sync::watch::Sender<bool>)> {
    let socket = dir.join("nri.sock");
    let mut runtime = TestRuntime::listen(&socket).await?;
    // An overrun would close the plugin connection and fail the run; a loaded machine may
    // stretch a round, and this measures time, it does not test containerd's 2 s limit.
    runtime.set_request_timeout(Duration::from_secs(30));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let settings = NriSettings {
        socket,
        ..NriSettings::default()
    };
    tokio::spawn(nri::run(settings, Arc::clone(hooks), stopped));
    tokio::time::timeout(Duration::from_secs(10), runtime.accept(Vec::new()))
        .await
        .context("knic's NRI plugin did not register within 10 s")??;
    Ok((Arc::new(runtime), stop))
}

/// The bare moves: every device into its pod as `net1` at once, then every one back, one
/// RTM_NEWLINK each, sessions opened beforehand.
async fn moves_round(k: &Rtnl, pods: usize, check: bool) -> anyhow::Result<(Duration, Duration)> {
    let rename = |name: String| LinkChange {
        name: Some(name),
        ..Default::default()
    };
    let mut moves = Vec::with_capacity(pods);
    for i in 0..pods {
        let mut host = k.open(&Ns::Host).await?.context("host session")?;
        let change = rename(POD_IF.into());
        moves.push(async move {
            host.move_link(&host_if(i), &Ns::Pod(pod_path(i)), &change)
                .await?;
            anyhow::Ok(())
        });
    }
    let move_in = all_at_once(moves).await?;
    if check {
        verify(pods, true, BARE)?;
    }
    let mut moves = Vec::with_capacity(pods);
    for i in 0..pods {
        let mut pod = k
            .open(&Ns::Pod(pod_path(i)))
            .await?
            .context("pod session")?;
        let change = rename(host_if(i));
        moves.push(async move {
            pod.move_link(POD_IF, &Ns::Host, &change).await?;
            anyhow::Ok(())
        });
    }
    let move_out = all_at_once(moves).await?;
    if check {
        verify(pods, false, BARE)?;
    }
    Ok((move_in, move_out))
}

fn main() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: parallel attach benchmark needs root (network namespaces)");
        return Ok(());
    }
    // Before any thread exists.
    let _isolated = knic_e2e::harness::Isolation::enter().map_err(|e| anyhow::anyhow!(e))?;
    let run = Plan::from_env(DEFAULT_ROUNDS, WARMUP)?;
    let pods = match std::env::var("KNIC_BENCH_PODS") {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|&n: &usize| (1..=200).contains(&n))
            .with_context(|| format!("KNIC_BENCH_PODS={v}: not an integer from 1 to 200"))?,
        Err(_) => DEFAULT_PODS,
    };
    let dir = tempfile::tempdir()?;
    let sockets = tempfile::tempdir()?;
    println!(
        "parallel attach benchmark: {pods} pods started at once through knic's NRI plugin \
         (over the NRI socket from a test runtime, and in-process), each moving its own veth in \
         as {POD_IF} + an IPv4 and an IPv6 address + a route; reference: the same {pods} bare \
         moves at once"
    );
    println!(
        "machine: {}; {} measured rounds after {} warm-up; checkpoint in {} (fsync'd)",
        knic_e2e::bench::machine(),
        run.cycles,
        run.warmup,
        dir.path().display()
    );

    let _setup = Setup::new(pods)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let k = Rtnl::new(None);
    let kernel = Timed::new(k.clone());
    let mut socket = Samples::default();
    let mut global = Samples::default();
    let mut direct = Samples::default();
    let mut bare = Samples::default();
    let mut requests = Breakdown::new();
    let mut writes = 0u64;

    runtime.block_on(async {
        let claims = Arc::new(ClaimStore::open(CheckpointStore::new(dir.path())));
        prepare(&claims, pods).await?;
        let hooks = PodNetworks::new(kernel.clone(), claims.clone(), Arc::new(LogStatus));
        let (nri_runtime, _stop_plugin) = connect_plugin(sockets.path(), &hooks).await?;
        for i in 0..run.warmup {
            let check = i == 0;
            nri_round(&nri_runtime, CallLocking::PerPod, pods, check).await?;
            nri_round(&nri_runtime, CallLocking::Global, pods, check).await?;
            knic_round(&hooks, pods, check).await?;
            moves_round(&k, pods, check).await?;
        }
        for i in 0..run.cycles {
            let last = i + 1 == run.cycles;
            kernel.take();
            let written = claims.writes();
            socket.push(nri_round(&nri_runtime, CallLocking::PerPod, pods, last).await?);
            writes += claims.writes() - written;
            timed::add(&mut requests, &kernel.take());
            global.push(nri_round(&nri_runtime, CallLocking::Global, pods, last).await?);
            direct.push(knic_round(&hooks, pods, last).await?);
            bare.push(moves_round(&k, pods, last).await?);
        }
        anyhow::Ok(())
    })?;

    println!();
    println!("wall time of {pods} at once (attach = all in, detach = all back):");
    println!("{}", Samples::header());
    let rows = [
        (PER_POD, &socket),
        (GLOBAL, &global),
        (IN_PROCESS, &direct),
        (BARE, &bare),
    ];
    for (side, samples) in rows {
        for row in samples.rows(side) {
            println!("{row}");
        }
    }
    println!();
    let per_pod = |v: &[Duration]| stats(v).0 / u32::try_from(pods).unwrap_or(u32::MAX);
    println!(
        "per pod (p50 wall / {pods}): knic attach through NRI {} (runtime one call at a time: \
         {}), in-process {}, bare move in {}",
        ms(per_pod(&socket.attach)),
        ms(per_pod(&global.attach)),
        ms(per_pod(&direct.attach)),
        ms(per_pod(&bare.attach))
    );
    println!(
        "knic's kernel requests per {PER_POD} round ({pods} attaches + {pods} detaches), summed \
         over the pods; they run at once, so the times overlap and include waiting for RTNL:"
    );
    for line in timed::per_round(&requests, run.cycles) {
        println!("  {line}");
    }
    println!(
        "besides them the hooks wrote the checkpoint {:.1} times per {PER_POD} round (fsync'd; \
         at most one per pod's attach and one per pod's detach, {} in all, fewer when pods \
         share a group-committed write)",
        writes as f64 / run.cycles.max(1) as f64,
        2 * pods
    );
    if run.smoke {
        println!(
            "smoke run (no --bench argument, e.g. cargo test): attach/detach verified; figures \
             not meaningful, no verdict; run cargo bench for the measurement"
        );
        return Ok(());
    }
    println!("ratios to the bare moves (wall p50 / bare moves wall p50):");
    for (side, samples) in &rows[..3] {
        println!(
            "  {side:<12} attach {:.2}x, cycle {:.2}x",
            ratio(&samples.attach, &bare.attach),
            ratio(&samples.cycle, &bare.cycle)
        );
    }
    let r = ratio(&socket.attach, &bare.attach);
    println!(
        "goal {pods} pods attached at once through the NRI socket in <= {RATIO_TARGET}x the wall \
         time of their bare moves: {} ({r:.2}x, {PER_POD}; with a runtime that serialises every \
         NRI call, as containerd and CRI-O do today, {:.2}x)",
        met(r <= RATIO_TARGET),
        ratio(&global.attach, &bare.attach)
    );
    Ok(())
}
