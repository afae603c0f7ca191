//! Inventory benchmark: discovery plus ResourceSlice building over a synthetic sysfs tree of
//! 4 PFs × 256 VFs (1028 devices), and the same at 1/4 and 1/2 the size to show the cost grows
//! linearly, against issue 14's goals: 1,024 devices in at most 50 ms, and a `run`-like
//! discovery of them in at most 20 MiB peak RSS.
//!
//! The parent writes each tree; a child process discovers it, so the child's peak RSS (VmHWM)
//! is discovery's own, not the tree writer's. The RSS figure comes from a second child that
//! does what `knic-driver run` does on its first publish (a tokio runtime, [`Discovery::scan`],
//! the slice layout and plan, the objects serialised), in a process holding nothing else.
//!
//! Run: `cargo bench -p knic-driver --bench inventory`. To profile one child on its own, write
//! a tree with `--write-tree DIR 4 256`, then run `--measure DIR` under `strace -f -c` or perf.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use knic_driver::inventory::{self, Filter, Sources, fixture};
use knic_driver::sharing::{SharePolicy, Sharing};
use knic_driver::slices::rescan::Discovery;
use knic_driver::slices::{self, PoolOwner};

const RUNS: usize = 15;
/// Issue 14: discovery of 1,024 devices in at most this many milliseconds.
const GOAL_MS_PER_1024: f64 = 50.0;
/// Issue 14: peak RSS of `run` with 1,024 devices at most this many MiB.
const GOAL_RSS_MIB: f64 = 20.0;

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time (user + system) of this process so far, its finished threads included, in µs.
fn cpu_us() -> u64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else {
        return 0;
    };
    let us = |t: nix::sys::time::TimeVal| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec()).unwrap_or(0)
    };
    us(usage.user_time()) + us(usage.system_time())
}

/// The 1, 5 and 15 minute load averages: wall times on a shared VM mean little without them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Child: discover the tree at `root` RUNS times; print `devices median_us p95_us rss_kib
/// slices cpu_us_per_pass`.
fn measure(root: &Path) -> anyhow::Result<()> {
    let sources = Sources::sysfs_only();
    let routes = BTreeSet::new();
    let filter = Filter::default();
    let mut times = Vec::with_capacity(RUNS);
    let mut devices = 0;
    let mut slice_count = 0;
    let cpu_start = cpu_us();
    for _ in 0..RUNS {
        let start = Instant::now();
        let inv = inventory::discover(root, &sources, &routes, &filter);
        let desired = slices::desired(&inv);
        times.push(start.elapsed());
        devices = inv.devices.len();
        slice_count = desired.len();
    }
    let cpu_per_pass = (cpu_us() - cpu_start) / RUNS as u64;
    times.sort();
    let median = times[RUNS / 2];
    let p95 = times[(RUNS * 95 / 100).min(RUNS - 1)];
    println!(
        "{devices} {} {} {} {slice_count} {cpu_per_pass}",
        median.as_micros(),
        p95.as_micros(),
        peak_rss_kib()
    );
    Ok(())
}

/// Child: one first publish as `run` makes it, sysfs only (no API server: the objects are
/// serialised instead of sent); print `devices rss_kib`.
fn run_like(root: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let (devices, bytes) = runtime.block_on(async {
        let discovery = Discovery {
            root: root.to_path_buf(),
            filter: Filter::default(),
            netlink: false,
            provisioner: None,
            sharing: Arc::new(Sharing::new(SharePolicy::default())),
            overlay: None,
        };
        let inventory = discovery.scan().await;
        let owner = PoolOwner {
            node_name: "bench-node".to_owned(),
            node_uid: "00000000-0000-0000-0000-000000000000".to_owned(),
        };
        let count = inventory.devices.len();
        let devices = discovery.devices(&inventory, &[]);
        // As `run` does: the inventory is dropped once its devices are in API form.
        drop(inventory);
        let layout = slices::layout_owned(devices, slices::Mode::Partitionable);
        let plan = slices::plan_owned(knic_proto::DRIVER_NAME, &owner, &[], layout, &[]);
        let bytes = serde_json::to_vec(&plan.creates)?;
        anyhow::Ok((count, bytes.len()))
    })?;
    anyhow::ensure!(bytes > 0, "nothing serialised");
    println!("{devices} {}", peak_rss_kib());
    Ok(())
}

/// Runs this benchmark as a child with `args`, and `env` set on top of ours.
fn child(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Vec<u64>> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(args)
        .envs(env.iter().copied())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?)
}

fn verdict(met: bool) -> &'static str {
    if met { "MET" } else { "NOT MET" }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    // `--write-tree DIR PFS VFS`: only write a tree, to profile `--measure DIR` on its own
    // (strace -f -c, perf).
    if let [_, flag, dir, pfs, vfs] = args.as_slice()
        && flag == "--write-tree"
    {
        fixture::materialise(
            &fixture::synthetic_sriov(pfs.parse()?, vfs.parse()?),
            Path::new(dir),
        )?;
        return Ok(());
    }
    for (flag, f) in [
        ("--measure", measure as fn(&Path) -> anyhow::Result<()>),
        ("--run-like", run_like),
    ] {
        if let Some(pos) = args.iter().position(|a| a == flag) {
            let root = args.get(pos + 1).map(Path::new);
            return f(root.ok_or_else(|| anyhow::anyhow!("{flag} needs a directory"))?);
        }
    }
    println!("inventory benchmark: discovery + slice build, sysfs-only sources, {RUNS} runs each");
    println!(
        "load average at start: {} ({} CPUs)",
        load_average(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "{:>10} {:>8} {:>7} {:>12} {:>12} {:>14} {:>12} {:>10}",
        "tree", "devices", "slices", "median", "p95", "per device", "CPU/pass", "peak RSS"
    );
    let mut per_device = Vec::new();
    let mut run_rss = None;
    for (pfs, vfs) in [(4, 64), (4, 128), (4, 256)] {
        let dir = tempfile::tempdir()?;
        fixture::materialise(&fixture::synthetic_sriov(pfs, vfs), dir.path())?;
        let root = dir.path().to_string_lossy().into_owned();
        let f = child(&["--measure", &root], &[])?;
        anyhow::ensure!(f.len() == 6, "unexpected child output {f:?}");
        let (devices, median, p95, rss, slice_count, cpu) = (f[0], f[1], f[2], f[3], f[4], f[5]);
        let each = median as f64 / devices as f64;
        per_device.push(each);
        println!(
            "{:>10} {devices:>8} {slice_count:>7} {:>10.2}ms {:>10.2}ms {:>12.1}µs {:>10.1}ms {:>8.1}MiB",
            format!("{pfs}x{vfs}"),
            median as f64 / 1000.0,
            p95 as f64 / 1000.0,
            each,
            cpu as f64 / 1000.0,
            rss as f64 / 1024.0
        );
        if vfs == 256 {
            // Once as the process starts by default, once with the arena limit the chart's
            // DaemonSet sets (glibc reads it at start, so only the environment can set it).
            let mut rss = Vec::new();
            for env in [&[][..], &[("MALLOC_ARENA_MAX", "1")][..]] {
                let r = child(&["--run-like", &root], env)?;
                anyhow::ensure!(r.len() == 2, "unexpected child output {r:?}");
                rss.push((r[0], r[1] as f64 / 1024.0));
            }
            run_rss = Some(rss);
        }
    }
    let growth = per_device[2] / per_device[0];
    println!(
        "cost per device at 4x256 vs 4x64: {growth:.2}x (1.00 = perfectly linear in the device count)"
    );
    let total = per_device[2] * 1024.0 / 1000.0;
    println!(
        "discovery: {:.1}µs per device, {total:.1}ms for 1,024 devices; goal ≤ {GOAL_MS_PER_1024:.0}ms: {}",
        per_device[2],
        verdict(total <= GOAL_MS_PER_1024)
    );
    for (label, (devices, rss)) in [
        "default malloc",
        "MALLOC_ARENA_MAX=1 (as the chart runs it)",
    ]
    .iter()
    .zip(run_rss.into_iter().flatten())
    {
        println!(
            "run-like first publish of {devices} devices, {label}: peak RSS {rss:.1}MiB; goal ≤ {GOAL_RSS_MIB:.0}MiB: {}",
            verdict(rss <= GOAL_RSS_MIB)
        );
    }
    println!("load average at end: {}", load_average());
    Ok(())
}
