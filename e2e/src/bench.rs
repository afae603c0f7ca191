//! Figures the benchmarks print, computed one way for all of them.

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

/// Milliseconds with three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
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
}
