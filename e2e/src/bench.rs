//! Figures the benchmarks print, computed one way for all of them, and the pieces the
//! benchmarks share: the CNI plugins they compare against ([`cni`]) and a kernel wrapper that
//! times the namespace moves ([`timed`]).

pub mod cni;
pub mod timed;

use std::time::Duration;

/// Median and nearest-rank p99 of `samples` (zero for none).
pub fn stats(samples: &[Duration]) -> (Duration, Duration) {
    if samples.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    let mut s = samples.to_vec();
    s.sort();
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2
    };
    let p99 = s[(n * 99).div_ceil(100).max(1) - 1];
    (median, p99)
}

/// Arithmetic mean of `samples` (zero for none); shown next to the median so a long tail that
/// the median hides still shows.
pub fn mean(samples: &[Duration]) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let total: u128 = samples.iter().map(Duration::as_nanos).sum();
    let nanos = total / samples.len() as u128;
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Milliseconds with three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// `MET` / `NOT MET`, the word every verdict line ends with.
pub fn met(ok: bool) -> &'static str {
    if ok { "MET" } else { "NOT MET" }
}

/// Attach, detach and cycle times of one side of a benchmark.
#[derive(Debug, Default)]
pub struct Samples {
    /// Attach (or CNI ADD) times.
    pub attach: Vec<Duration>,
    /// Detach (or CNI DEL) times.
    pub detach: Vec<Duration>,
    /// Attach + detach of the same iteration.
    pub cycle: Vec<Duration>,
}

impl Samples {
    /// Records one cycle.
    pub fn push(&mut self, (attach, detach): (Duration, Duration)) {
        self.attach.push(attach);
        self.detach.push(detach);
        self.cycle.push(attach + detach);
    }

    /// The header line for [`Samples::rows`].
    pub fn header() -> String {
        format!(
            "{:<13} {:<7} {:>12} {:>12} {:>12}",
            "side", "phase", "p50", "p99", "mean"
        )
    }

    /// One table line per phase: p50, p99 and mean.
    pub fn rows(&self, side: &str) -> Vec<String> {
        [
            ("attach", &self.attach),
            ("detach", &self.detach),
            ("cycle", &self.cycle),
        ]
        .into_iter()
        .map(|(phase, v)| row(side, phase, v))
        .collect()
    }
}

/// One table line: `side`, `phase`, then p50, p99 and mean of `v`.
pub fn row(side: &str, phase: &str, v: &[Duration]) -> String {
    let (median, p99) = stats(v);
    format!(
        "{side:<13} {phase:<7} {:>12} {:>12} {:>12}",
        ms(median),
        ms(p99),
        ms(mean(v))
    )
}

/// Ratio of two medians (`slow / fast`); infinite when `fast` is zero.
pub fn ratio(slow: &[Duration], fast: &[Duration]) -> f64 {
    stats(slow).0.as_secs_f64() / stats(fast).0.as_secs_f64()
}

/// Which cycle counts a benchmark runs: `KNIC_BENCH_CYCLES` when set, `default_cycles` under
/// `cargo bench` (its `--bench` argument), else a smoke run of 3 cycles after 1 warm-up (as
/// `cargo test --all-targets` runs benches), which verifies but gives no verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Measured cycles.
    pub cycles: usize,
    /// Warm-up cycles (not measured).
    pub warmup: usize,
    /// A smoke run: figures printed, no verdict.
    pub smoke: bool,
}

/// Cycles of a smoke run: a correctness check, not a measurement.
pub const SMOKE_CYCLES: usize = 3;

impl Plan {
    /// From `KNIC_BENCH_CYCLES` (`env`) and whether `--bench` was given.
    pub fn new(
        env: Option<&str>,
        bench: bool,
        default_cycles: usize,
        warmup: usize,
    ) -> anyhow::Result<Plan> {
        Ok(match env {
            Some(v) => Plan {
                cycles: v.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                    anyhow::anyhow!("KNIC_BENCH_CYCLES={v}: not a positive integer")
                })?,
                warmup,
                smoke: false,
            },
            None if bench => Plan {
                cycles: default_cycles,
                warmup,
                smoke: false,
            },
            None => Plan {
                cycles: SMOKE_CYCLES,
                warmup: 1,
                smoke: true,
            },
        })
    }

    /// From this process's environment and arguments.
    pub fn from_env(default_cycles: usize, warmup: usize) -> anyhow::Result<Plan> {
        let env = std::env::var("KNIC_BENCH_CYCLES").ok();
        let bench = std::env::args().any(|a| a == "--bench");
        Plan::new(env.as_deref(), bench, default_cycles, warmup)
    }
}

/// The machine line every benchmark prints: kernel release, CPU count and load average at
/// the start (a shared machine's load moves every figure; the interleaving keeps the ratios
/// fair, not the absolute times).
pub fn machine() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into())
    };
    let kernel = read("/proc/sys/kernel/osrelease");
    let load: Vec<String> = read("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .map(str::to_string)
        .collect();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "kernel {kernel}, {cpus} CPUs, load average {}",
        load.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_nearest_rank_p99() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(
            stats(&samples),
            (Duration::from_micros(50_500), Duration::from_millis(99))
        );
        assert_eq!(stats(&[]), (Duration::ZERO, Duration::ZERO));
        assert_eq!(ms(Duration::from_micros(1500)), "1.500 ms");
    }

    #[test]
    fn mean_and_ratio_of_medians() {
        let samples: Vec<Duration> = [1, 2, 3, 10].map(Duration::from_millis).to_vec();
        assert_eq!(mean(&samples), Duration::from_millis(4));
        assert_eq!(mean(&[]), Duration::ZERO);
        let fast = [Duration::from_micros(500)];
        let slow = [Duration::from_millis(10)];
        assert!((ratio(&slow, &fast) - 20.0).abs() < 1e-9);
    }

    #[test]
    fn samples_keep_cycle_as_the_sum_and_print_three_figures() {
        let mut s = Samples::default();
        s.push((Duration::from_millis(1), Duration::from_millis(2)));
        s.push((Duration::from_millis(3), Duration::from_millis(4)));
        assert_eq!(
            s.cycle,
            vec![Duration::from_millis(3), Duration::from_millis(7)]
        );
        let rows = s.rows("knic");
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows[2],
            "knic          cycle       5.000 ms     7.000 ms     5.000 ms"
        );
    }

    #[test]
    fn cycle_counts_from_the_environment_and_the_bench_flag() {
        assert_eq!(
            Plan::new(None, false, 1000, 20).unwrap(),
            Plan {
                cycles: 3,
                warmup: 1,
                smoke: true
            }
        );
        assert_eq!(
            Plan::new(None, true, 1000, 20).unwrap(),
            Plan {
                cycles: 1000,
                warmup: 20,
                smoke: false
            }
        );
        assert_eq!(Plan::new(Some("50"), false, 1000, 20).unwrap().cycles, 50);
        for bad in ["0", "-1", "many"] {
            let err = Plan::new(Some(bad), true, 1000, 20)
                .unwrap_err()
                .to_string();
            assert_eq!(
                err,
                format!("KNIC_BENCH_CYCLES={bad}: not a positive integer")
            );
        }
    }
}
