//! IPAM benchmark: allocations per second and memory with 50,000 live allocations in a /16.
//!
//! The apiserver is replaced by a `HashSet<u128>` of allocated addresses (the stand-in for the
//! allocation objects, whose create-if-absent is `insert`), so the figures are the pure cost
//! of knic's side of an allocation: hashing the claim into a hint ([`stable_offset`]), probing
//! with [`choose`], and building the object name ([`allocation_name`]). A real allocation adds
//! one API round trip, which dominates.
//!
//! Phases, each timed separately:
//! 1. fill: 0 → 50,000 live allocations in 10.0.0.0/16 (gateway 10.0.0.1, 65,533 usable);
//! 2. steady state at 50,000 live (76% full): release a random allocation, allocate a new one;
//! 3. near exhaustion: the same churn at 65,000 live (99.2% full), the worst case for probing;
//! 4. the same 50,000-live churn in an IPv6 /64, to show the subnet size does not matter.
//!
//! Memory is the process's peak resident set (`VmHWM` from `/proc/self/status`) before any
//! allocation and at the end; the pool itself is a few dozen bytes plus its exclusions.
//!
//! Run: `cargo bench -p knic-proto --bench ipam`. Without cargo bench's `--bench`
//! argument (as `cargo test --all-targets` runs it) it does a small smoke run instead.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Instant;

use knic_proto::ipam::{Pool, allocation_name, choose, stable_offset};

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// `/proc/self/status` field in KiB, or 0 where there is no procfs.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// SplitMix64, for picking which allocation to release.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The allocator under test plus its stand-in apiserver.
struct Bench<'a> {
    network: &'a str,
    pool: &'a Pool,
    /// Allocated addresses: the stand-in for the allocation objects.
    live: HashSet<u128>,
    /// The same addresses in a vector, so a random one can be released in O(1).
    order: Vec<u128>,
    claims: u64,
    probes: u64,
    max_probes: u64,
    name_bytes: usize,
}

impl<'a> Bench<'a> {
    fn new(network: &'a str, pool: &'a Pool, capacity: usize) -> Self {
        Bench {
            network,
            pool,
            live: HashSet::with_capacity(capacity),
            order: Vec::with_capacity(capacity),
            claims: 0,
            probes: 0,
            max_probes: 0,
            name_bytes: 0,
        }
    }

    /// One allocation as an allocator does it: hint from the claim, choose, name, create.
    fn allocate(&mut self) {
        self.claims += 1;
        let claim = format!("5f0c6b8e-0000-4000-8000-{:012x}", self.claims);
        let hint = stable_offset(self.network, &claim, self.pool);
        let mut probes = 0u64;
        let live = &self.live;
        let ip = choose(
            self.pool,
            |ip| {
                probes += 1;
                live.contains(&to_u128(ip))
            },
            hint,
        )
        .expect("the benchmark never exhausts the pool");
        let name = allocation_name(self.network, ip);
        self.name_bytes += name.len();
        assert!(self.live.insert(to_u128(ip)), "create-if-absent lost");
        self.order.push(to_u128(ip));
        self.probes += probes;
        self.max_probes = self.max_probes.max(probes);
    }

    fn release_random(&mut self, rng: &mut Rng) {
        let i = (rng.next() % self.order.len() as u64) as usize;
        let addr = self.order.swap_remove(i);
        self.live.remove(&addr);
    }

    fn reset_stats(&mut self) {
        self.probes = 0;
        self.max_probes = 0;
    }
}

fn report(label: &str, n: u64, seconds: f64, bench: &Bench<'_>) {
    println!(
        "{label:<44} {n:>8} allocations in {:>8.2} ms = {:>10.0} alloc/s  (probes: mean {:.2}, max {})",
        seconds * 1e3,
        n as f64 / seconds,
        bench.probes as f64 / n as f64,
        bench.max_probes
    );
}

fn run(subnet: &str, gateway: &str, live: usize, churn: u64, near_full: Option<usize>) {
    let pool = Pool::new(
        subnet.parse().expect("subnet"),
        Some(gateway.parse().expect("gateway")),
        &[],
    )
    .expect("pool");
    println!(
        "\n{subnet} (gateway {gateway}): {} usable addresses",
        pool.size()
    );
    let mut rng = Rng(1);
    let mut bench = Bench::new("bench", &pool, near_full.unwrap_or(live));

    let start = Instant::now();
    for _ in 0..live {
        bench.allocate();
    }
    report(
        &format!("fill 0 -> {live} live"),
        live as u64,
        start.elapsed().as_secs_f64(),
        &bench,
    );

    bench.reset_stats();
    let start = Instant::now();
    for _ in 0..churn {
        bench.release_random(&mut rng);
        bench.allocate();
    }
    report(
        &format!("steady state at {live} live (release+allocate)"),
        churn,
        start.elapsed().as_secs_f64(),
        &bench,
    );
    assert_eq!(bench.live.len(), live);

    if let Some(full) = near_full {
        while bench.live.len() < full {
            bench.allocate();
        }
        bench.reset_stats();
        let start = Instant::now();
        for _ in 0..churn {
            bench.release_random(&mut rng);
            bench.allocate();
        }
        report(
            &format!("near exhaustion at {full} live"),
            churn,
            start.elapsed().as_secs_f64(),
            &bench,
        );
    }
    // Keep the names' work observable so it is not optimised away.
    assert!(bench.name_bytes > 0);
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let (live, churn, near_full) = if measuring {
        (50_000, 200_000, 65_000)
    } else {
        (2_000, 2_000, 2_500)
    };
    let hwm_before = status_kib("VmHWM:");
    println!(
        "knic IPAM benchmark ({}): {live} live allocations, allocated set held as HashSet<u128>",
        if measuring {
            "measurement"
        } else {
            "smoke run"
        }
    );
    println!("VmHWM before allocating: {hwm_before} KiB");
    run("10.0.0.0/16", "10.0.0.1", live, churn, Some(near_full));
    let hwm_v4 = status_kib("VmHWM:");
    run("2001:db8::/64", "2001:db8::1", live, churn, None);
    let hwm_end = status_kib("VmHWM:");
    println!(
        "\nmemory: VmHWM {hwm_before} KiB before, {hwm_v4} KiB after the /16 ({} KiB for up to {near_full} live), {hwm_end} KiB at the end; pool struct {} bytes",
        hwm_v4.saturating_sub(hwm_before),
        std::mem::size_of::<Pool>()
    );
}
