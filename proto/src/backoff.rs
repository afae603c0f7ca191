//! How both binaries pace what they retry against the apiserver: jittered, bounded exponential
//! backoff, and the pacing of watch requests.
//!
//! Pure (the clock and the randomness come in as values), so the policy is tested without
//! time passing; each binary's API layer applies it to its requests.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Exponential backoff: `min`, doubling per consecutive failure up to `max`, each delay
/// jittered down to between half and all of it, so clients that failed together (every node
/// after an apiserver restart) do not retry together.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    failures: u32,
    rng: u64,
}

impl Backoff {
    /// A backoff from `min` to `max`; `seed` drives the jitter (any value, e.g. from the clock).
    pub fn new(min: Duration, max: Duration, seed: u64) -> Self {
        Backoff {
            min,
            max: max.max(min),
            failures: 0,
            // Scrambled (splitmix64) so nearby seeds jitter differently from the first retry
            // on; xorshift must not start at zero.
            rng: splitmix64(seed) | 1,
        }
    }

    /// The delay before the next attempt, after one more failure.
    pub fn fail(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let doublings = (self.failures - 1).min(30);
        let full = self.min.saturating_mul(1u32 << doublings).min(self.max);
        // xorshift64: enough to spread retries, no dependency.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let fraction = 0.5 + (self.rng >> 11) as f64 / (1u64 << 53) as f64 / 2.0;
        full.mul_f64(fraction)
    }

    /// An attempt worked: the next failure starts from `min` again.
    pub fn succeed(&mut self) {
        self.failures = 0;
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A watch that lasted at least this long was healthy: the apiserver ends healthy watches
/// after minutes (`timeoutSeconds`), never within seconds.
pub const HEALTHY_WATCH: Duration = Duration::from_secs(10);
/// The first pause after a watch that ended early.
pub const WATCH_MIN_BACKOFF: Duration = Duration::from_millis(500);
/// The longest pause between two watches of one resource.
pub const WATCH_MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Watches tracked at most; a client has a handful, so this only bounds a misuse.
const MAX_TRACKED: usize = 256;

/// Paces watch requests, one track per watched collection and selector: a watch request that
/// follows the previous one of the same track within [`HEALTHY_WATCH`] means that watch ended
/// early (an error event, a 410, a stream the server closed, a refused request) and waits a
/// growing, jittered pause first; one that follows a long-lived watch goes at once. Knowing
/// only when watches start is enough, because a watcher opens the next watch only after the
/// previous one ended.
#[derive(Debug)]
pub struct WatchPacer {
    tracks: HashMap<String, Track>,
    seed: u64,
}

#[derive(Debug)]
struct Track {
    /// When the last watch was (or will be) sent; `None` before the first.
    started: Option<Instant>,
    backoff: Backoff,
}

impl WatchPacer {
    /// An empty pacer; `seed` drives the jitter.
    pub fn new(seed: u64) -> Self {
        WatchPacer {
            tracks: HashMap::new(),
            seed,
        }
    }

    /// How long to wait before sending the watch request of `track` at `now`.
    pub fn before_watch(&mut self, track: &str, now: Instant) -> Duration {
        if self.tracks.len() >= MAX_TRACKED && !self.tracks.contains_key(track) {
            self.tracks.clear();
        }
        self.seed = self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let seed = self.seed;
        let entry = self
            .tracks
            .entry(track.to_owned())
            .or_insert_with(|| Track {
                started: None,
                backoff: Backoff::new(WATCH_MIN_BACKOFF, WATCH_MAX_BACKOFF, seed),
            });
        let ended_early = entry
            .started
            .is_some_and(|started| now.saturating_duration_since(started) < HEALTHY_WATCH);
        let delay = if ended_early {
            entry.backoff.fail()
        } else {
            // The first watch, or one after a watch that lived: go at once.
            entry.backoff.succeed();
            Duration::ZERO
        };
        entry.started = Some(now + delay);
        delay
    }
}

/// A [`WatchPacer`] both binaries' API clients share across their watchers: seeded from the
/// clock and the process id (so replicas restarting together do not retry in step), and asked
/// per request, so each client adapter is only the plumbing into its HTTP stack.
#[derive(Debug)]
pub struct RequestPacer(std::sync::Mutex<WatchPacer>);

impl RequestPacer {
    /// A pacer with a per-process seed.
    pub fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id());
        RequestPacer(std::sync::Mutex::new(WatchPacer::new(seed)))
    }

    /// How long to hold the request for `path` and `query` before sending it (zero for
    /// anything but a watch that follows an early-ended one), and its track for logging.
    pub fn pause(&self, path: &str, query: Option<&str>) -> (Duration, Option<String>) {
        let Some(track) = watch_track(path, query.unwrap_or_default()) else {
            return (Duration::ZERO, None);
        };
        let pause = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .before_watch(&track, Instant::now());
        (pause, Some(track))
    }
}

impl Default for RequestPacer {
    fn default() -> Self {
        Self::new()
    }
}

/// The pacing track of a request, `None` unless it is a watch (`watch=true` or `watch=1`):
/// its path and the query parameters that select what is watched, without those that change
/// from one watch of the same thing to the next (resourceVersion, timeouts, bookmarks).
pub fn watch_track(path: &str, query: &str) -> Option<String> {
    let mut watch = false;
    let mut kept: Vec<&str> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "watch" => watch = value == "true" || value == "1",
            "resourceVersion"
            | "resourceVersionMatch"
            | "timeoutSeconds"
            | "allowWatchBookmarks"
            | "sendInitialEvents" => {}
            _ => kept.push(pair),
        }
    }
    if !watch {
        return None;
    }
    kept.sort_unstable();
    Some(format!("{path}?{}", kept.join("&")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn backoff_doubles_to_the_cap_jittered_between_half_and_all() {
        let mut b = Backoff::new(100 * MS, 1600 * MS, 7);
        let mut previous_full = Duration::ZERO;
        for n in 1..=12u32 {
            let full = (100 * MS * 2u32.pow((n - 1).min(4))).min(1600 * MS);
            let d = b.fail();
            assert!(
                d >= full / 2 && d <= full,
                "failure {n}: {d:?} outside [{:?}, {full:?}]",
                full / 2
            );
            assert!(full >= previous_full);
            previous_full = full;
        }
        assert_eq!(b.failures(), 12);
        b.succeed();
        let d = b.fail();
        assert!(d >= 50 * MS && d <= 100 * MS, "{d:?}");
    }

    #[test]
    fn jitter_spreads_clients_that_failed_together() {
        let delays: std::collections::BTreeSet<Duration> = (0..50u64)
            .map(|seed| Backoff::new(Duration::from_secs(1), Duration::from_secs(30), seed).fail())
            .collect();
        assert!(delays.len() > 40, "only {} distinct delays", delays.len());
    }

    #[test]
    fn a_huge_number_of_failures_stays_at_the_cap() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30), 1);
        for _ in 0..100_000 {
            assert!(b.fail() <= Duration::from_secs(30));
        }
    }

    #[test]
    fn watches_that_end_early_are_paced_and_healthy_ones_are_not() {
        let mut p = WatchPacer::new(3);
        let t0 = Instant::now();
        assert_eq!(
            p.before_watch("slices", t0),
            Duration::ZERO,
            "the first watch goes at once"
        );
        // It ended at once (an error event): the next waits, and longer each time.
        let d1 = p.before_watch("slices", t0 + MS);
        assert!(
            d1 >= WATCH_MIN_BACKOFF / 2 && d1 <= WATCH_MIN_BACKOFF,
            "{d1:?}"
        );
        let t2 = t0 + MS + d1 + MS;
        let d2 = p.before_watch("slices", t2);
        assert!(
            d2 >= WATCH_MIN_BACKOFF && d2 <= 2 * WATCH_MIN_BACKOFF,
            "{d2:?}"
        );
        // Another track is independent.
        assert_eq!(p.before_watch("networks", t2), Duration::ZERO);
        // A watch that lived for minutes was healthy: the next goes at once, and the backoff
        // starts over.
        let t3 = t2 + d2 + Duration::from_secs(290);
        assert_eq!(p.before_watch("slices", t3), Duration::ZERO);
        let d4 = p.before_watch("slices", t3 + MS);
        assert!(d4 <= WATCH_MIN_BACKOFF, "{d4:?}");
    }

    #[test]
    fn a_watch_that_keeps_failing_is_bounded_to_the_cap() {
        let mut p = WatchPacer::new(9);
        let mut now = Instant::now();
        let mut sent = 0;
        let end = now + Duration::from_secs(600);
        while now < end {
            now += p.before_watch("x", now) + MS;
            sent += 1;
        }
        // Unpaced this would be 600,000 requests; paced it is about one per 15-30 s.
        assert!(sent < 60, "{sent} watch requests in 10 minutes");
    }

    #[test]
    fn tracks_name_the_watched_thing_not_the_resume_point() {
        assert_eq!(watch_track("/apis/x/v1/things", "limit=500"), None);
        assert_eq!(watch_track("/apis/x/v1/things", "watch=false"), None);
        let a = watch_track(
            "/apis/resource.k8s.io/v1/resourceslices",
            "fieldSelector=spec.nodeName%3Dn&watch=true&resourceVersion=5&timeoutSeconds=290&allowWatchBookmarks=true",
        );
        let b = watch_track(
            "/apis/resource.k8s.io/v1/resourceslices",
            "watch=1&timeoutSeconds=10&resourceVersion=77&fieldSelector=spec.nodeName%3Dn",
        );
        assert_eq!(
            a.as_deref(),
            Some("/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dn")
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            watch_track(
                "/apis/resource.k8s.io/v1/resourceslices",
                "watch=true&fieldSelector=spec.nodeName%3Dm"
            )
        );
    }
}
