//! Inventory benchmark: discovery plus ResourceSlice building over a synthetic sysfs tree of
//! 4 PFs × 256 VFs (1028 devices), and the same at 1/4 and 1/2 the size to show the cost grows
//! linearly. Each size runs in a child process so its peak RSS (VmHWM) is its own.
//!
//! Run: `cargo bench -p knic-driver --bench inventory`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use knic_driver::inventory::{self, Filter, Sources, fixture};
use knic_driver::slices;

const RUNS: usize = 15;

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

/// Child: measure one size and print `devices median_us p95_us rss_kib`.
fn measure(pfs: usize, vfs: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    fixture::materialise(&fixture::synthetic_sriov(pfs, vfs), dir.path())?;
    let sources = Sources::sysfs_only();
    let routes = BTreeSet::new();
    let filter = Filter::default();
    let mut times = Vec::with_capacity(RUNS);
    let mut devices = 0;
    let mut slice_count = 0;
    for _ in 0..RUNS {
        let start = Instant::now();
        let inv = inventory::discover(dir.path(), &sources, &routes, &filter);
        let desired = slices::desired(&inv);
        times.push(start.elapsed());
        devices = inv.devices.len();
        slice_count = desired.len();
    }
    times.sort();
    let median = times[RUNS / 2];
    let p95 = times[(RUNS * 95 / 100).min(RUNS - 1)];
    println!(
        "{devices} {} {} {} {slice_count}",
        median.as_micros(),
        p95.as_micros(),
        peak_rss_kib()
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(pos) = args.iter().position(|a| a == "--measure") {
        let pfs = args[pos + 1].parse()?;
        let vfs = args[pos + 2].parse()?;
        return measure(pfs, vfs);
    }
    let exe = std::env::current_exe()?;
    println!("inventory benchmark: discovery + slice build, sysfs-only sources, {RUNS} runs each");
    println!(
        "{:>10} {:>8} {:>7} {:>12} {:>12} {:>14} {:>10}",
        "tree", "devices", "slices", "median", "p95", "per device", "peak RSS"
    );
    let mut per_device = Vec::new();
    for (pfs, vfs) in [(4, 64), (4, 128), (4, 256)] {
        let out = std::process::Command::new(&exe)
            .args(["--measure", &pfs.to_string(), &vfs.to_string()])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout)?;
        let f: Vec<u64> = text
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let (devices, median, p95, rss, slice_count) = (f[0], f[1], f[2], f[3], f[4]);
        let each = Duration::from_micros(median).as_secs_f64() * 1e6 / devices as f64;
        per_device.push(each);
        println!(
            "{:>10} {devices:>8} {slice_count:>7} {:>10.2}ms {:>10.2}ms {:>12.1}µs {:>8.1}MiB",
            format!("{pfs}x{vfs}"),
            median as f64 / 1000.0,
            p95 as f64 / 1000.0,
            each,
            rss as f64 / 1024.0
        );
    }
    let growth = per_device[2] / per_device[0];
    println!(
        "cost per device at 4x256 vs 4x64: {growth:.2}x (1.00 = perfectly linear in the device count)"
    );
    Ok(())
}
