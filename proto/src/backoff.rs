//! How both binaries pace what they retry against the apiserver: jittered, bounded exponential
//! backoff, the pacing of watch requests, and which failed requests are repeated
//! ([`RetryPolicy`]).
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

/// Whether sending a request twice can do more than sending it once, which decides what may
/// be repeated after an answer that says nothing about whether it took effect (a 500, a
/// timeout, a dropped connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// GET and HEAD: nothing changes, so any failure may be repeated.
    Read,
    /// A write without a precondition (apply, merge patch, update or delete without
    /// resourceVersion or uid): the second copy finds the first's result and changes nothing.
    Unconditional,
    /// A write guarded by a resourceVersion or uid: a repeat after it took effect comes back
    /// 409 or 404, which its caller reads (re-read, or "already gone"); a 409 of its own is the
    /// answer, never repeated.
    Conditional,
    /// A POST: a repeat after it took effect is a 409 `AlreadyExists` the caller would take for
    /// someone else's object, so only an answer that says "not processed" is repeated.
    Create,
}

/// The [`RequestKind`] of a request from its method and body (JSON; a body that is not JSON
/// counts as conditional, the cautious reading).
pub fn request_kind(method: &str, body: &[u8]) -> RequestKind {
    match method {
        "GET" | "HEAD" | "OPTIONS" => return RequestKind::Read,
        "POST" => return RequestKind::Create,
        _ => {}
    }
    if body.is_empty() {
        return RequestKind::Unconditional;
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return RequestKind::Conditional;
    };
    let guarded =
        |v: Option<&serde_json::Value>| v.is_some_and(|v| !v.is_null() && v.as_str() != Some(""));
    let preconditions = value.get("preconditions");
    if guarded(value.pointer("/metadata/resourceVersion"))
        || guarded(preconditions.and_then(|p| p.get("uid")))
        || guarded(preconditions.and_then(|p| p.get("resourceVersion")))
    {
        RequestKind::Conditional
    } else {
        RequestKind::Unconditional
    }
}

/// What one attempt of a request came back with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// An HTTP answer: its code, the `reason` of its Status body ("" when none) and its
    /// `Retry-After`, if any.
    Status {
        /// HTTP status code.
        code: u16,
        /// `metav1.Status.reason`, e.g. `Conflict`, `AlreadyExists`, `TooManyRequests`.
        reason: String,
        /// The `Retry-After` header, in whole seconds as the apiserver sends it.
        retry_after: Option<Duration>,
    },
    /// No answer within the request timeout.
    NoAnswer,
    /// The connection failed (refused, reset) before an answer.
    Failed,
}

/// The `Retry-After` header as the apiserver writes it (whole seconds); an HTTP date or
/// anything else is ignored, so the ordinary backoff applies.
pub fn retry_after(header: Option<&str>) -> Option<Duration> {
    header?.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// First pause before repeating an API request.
pub const API_MIN_BACKOFF: Duration = Duration::from_millis(200);
/// Longest pause between two attempts of one API request.
pub const API_MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Attempts of one API request, the first included. Three attempts of a request the apiserver
/// never answers take about 45 s at the default timeout, the kubelet's whole budget for one
/// prepare; after a request gives up, its caller's own loop goes on (the kubelet's prepare
/// retries, the slice publisher's backoff, the reconciler's requeue).
pub const API_ATTEMPTS: u32 = 3;
/// The longest `Retry-After` honoured in place; a server asking for more gets its answer
/// handed to the caller, whose own loop waits, instead of a request held that long.
pub const API_MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
/// How long one attempt of a request (not a watch's stream) may wait for its whole answer:
/// the apiserver answers in milliseconds, and ends its own slow requests at 60 s.
pub const API_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// When an API request is repeated, shared by both binaries' clients: bounded attempts,
/// jittered exponential backoff, `Retry-After` honoured (never earlier than the server said),
/// and only what [`RequestKind`] says is safe to repeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1: never repeat).
    pub attempts: u32,
    /// First backoff, doubling per attempt up to `max_backoff`.
    pub min_backoff: Duration,
    /// Largest backoff.
    pub max_backoff: Duration,
    /// Largest `Retry-After` waited for in place (see [`API_MAX_RETRY_AFTER`]).
    pub max_retry_after: Duration,
    /// Per-attempt timeout of a request; a watch's is the time to its response headers.
    pub timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: API_ATTEMPTS,
            min_backoff: API_MIN_BACKOFF,
            max_backoff: API_MAX_BACKOFF,
            max_retry_after: API_MAX_RETRY_AFTER,
            timeout: API_REQUEST_TIMEOUT,
        }
    }
}

impl RetryPolicy {
    /// The default policy with another per-attempt timeout (the binaries' `--api-timeout-seconds`).
    pub fn with_timeout(timeout: Duration) -> Self {
        RetryPolicy {
            timeout,
            ..RetryPolicy::default()
        }
    }

    /// A fresh backoff for one request's attempts.
    pub fn backoff(&self, seed: u64) -> Backoff {
        Backoff::new(self.min_backoff, self.max_backoff, seed)
    }

    /// Whether to repeat a request of `kind` after attempt number `attempt` (1 for the first)
    /// came back with `answer`, and after how long; `None` hands the answer to the caller.
    pub fn retry(
        &self,
        kind: RequestKind,
        answer: &Answer,
        attempt: u32,
        backoff: &mut Backoff,
    ) -> Option<Duration> {
        if attempt >= self.attempts {
            return None;
        }
        let (repeat, asked) = match answer {
            Answer::Status {
                code,
                reason,
                retry_after,
            } => {
                let repeat = match code {
                    // Refused before processing (priority and fairness, shutting down).
                    429 => true,
                    // The server asked to come back: it did not process the request.
                    500..=599 if retry_after.is_some() => true,
                    500 | 502 | 503 | 504 => kind != RequestKind::Create,
                    // A storage conflict of a write that does not depend on what it read
                    // (the apiserver retries those internally first); a conditional write's
                    // or a create's 409 is its answer.
                    409 => {
                        reason == "Conflict"
                            && matches!(kind, RequestKind::Read | RequestKind::Unconditional)
                    }
                    _ => false,
                };
                (repeat, *retry_after)
            }
            Answer::NoAnswer | Answer::Failed => (kind != RequestKind::Create, None),
        };
        if !repeat {
            return None;
        }
        let pause = backoff.fail();
        match asked {
            Some(asked) if asked > self.max_retry_after => None,
            Some(asked) => Some(asked.max(pause)),
            None => Some(pause),
        }
    }
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

    fn status(code: u16, reason: &str, retry_after: Option<u64>) -> Answer {
        Answer::Status {
            code,
            reason: reason.into(),
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    #[test]
    fn request_kinds_follow_method_and_preconditions() {
        assert_eq!(request_kind("GET", b""), RequestKind::Read);
        assert_eq!(request_kind("POST", b"{}"), RequestKind::Create);
        assert_eq!(
            request_kind("PATCH", br#"{"status":{"devices":[]}}"#),
            RequestKind::Unconditional
        );
        assert_eq!(
            request_kind(
                "PATCH",
                br#"{"metadata":{"finalizers":[],"resourceVersion":"7"}}"#
            ),
            RequestKind::Conditional
        );
        assert_eq!(
            request_kind("PUT", br#"{"metadata":{"name":"s","resourceVersion":"3"}}"#),
            RequestKind::Conditional
        );
        assert_eq!(
            request_kind("DELETE", br#"{"preconditions":{"uid":"u"}}"#),
            RequestKind::Conditional
        );
        assert_eq!(
            request_kind("DELETE", br#"{"preconditions":{"uid":null}}"#),
            RequestKind::Unconditional
        );
        assert_eq!(request_kind("DELETE", b""), RequestKind::Unconditional);
        assert_eq!(request_kind("PATCH", b"a: yaml"), RequestKind::Conditional);
    }

    #[test]
    fn what_is_repeated_depends_on_the_answer_and_the_kind() {
        let p = RetryPolicy::default();
        let mut b = p.backoff(1);
        use RequestKind::*;
        let repeats = |kind, answer: Answer| p.clone().retry(kind, &answer, 1, &mut b.clone());
        // 429: never processed, whatever the request.
        for kind in [Read, Unconditional, Conditional, Create] {
            assert!(repeats(kind, status(429, "TooManyRequests", Some(1))).is_some());
        }
        // 500 and no answer: repeated unless a repeat could create twice.
        for answer in [
            status(500, "InternalError", None),
            Answer::NoAnswer,
            Answer::Failed,
        ] {
            assert!(repeats(Read, answer.clone()).is_some());
            assert!(repeats(Conditional, answer.clone()).is_some());
            assert_eq!(repeats(Create, answer), None);
        }
        // ... unless the server said to come back.
        assert!(repeats(Create, status(503, "ServiceUnavailable", Some(1))).is_some());
        // 409: a storage conflict of an unconditional write is repeated; a conditional
        // write's, a create's and AlreadyExists are answers.
        assert!(repeats(Unconditional, status(409, "Conflict", None)).is_some());
        assert!(repeats(Read, status(409, "Conflict", None)).is_some());
        assert_eq!(repeats(Conditional, status(409, "Conflict", None)), None);
        assert_eq!(repeats(Create, status(409, "Conflict", None)), None);
        assert_eq!(
            repeats(Unconditional, status(409, "AlreadyExists", None)),
            None
        );
        // Client errors are answers.
        for code in [400, 401, 403, 404, 410, 422] {
            assert_eq!(repeats(Read, status(code, "", None)), None, "{code}");
        }
        let _ = b.fail();
    }

    #[test]
    fn retry_after_is_never_undercut_and_bounded() {
        let p = RetryPolicy::default();
        let mut b = p.backoff(5);
        for attempt in 1..p.attempts {
            let d = p
                .retry(
                    RequestKind::Create,
                    &status(429, "TooManyRequests", Some(2)),
                    attempt,
                    &mut b,
                )
                .expect("repeated");
            assert!(d >= Duration::from_secs(2), "attempt {attempt}: {d:?}");
        }
        // A server asking for longer than the policy waits in place gets its answer back.
        let mut b = p.backoff(5);
        assert_eq!(
            p.retry(
                RequestKind::Read,
                &status(429, "TooManyRequests", Some(600)),
                1,
                &mut b
            ),
            None
        );
        assert_eq!(retry_after(Some(" 3 ")), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT")), None);
        assert_eq!(retry_after(None), None);
    }

    #[test]
    fn attempts_are_bounded_and_backoff_grows_jittered() {
        let p = RetryPolicy::default();
        let mut b = p.backoff(11);
        let mut pauses = Vec::new();
        let mut attempt = 1;
        while let Some(d) = p.retry(RequestKind::Read, &Answer::NoAnswer, attempt, &mut b) {
            pauses.push(d);
            attempt += 1;
        }
        assert_eq!(attempt, p.attempts, "{pauses:?}");
        assert_eq!(pauses.len() as u32, p.attempts - 1);
        for (i, d) in pauses.iter().enumerate() {
            let full = (API_MIN_BACKOFF * 2u32.pow(i as u32)).min(API_MAX_BACKOFF);
            assert!(*d >= full / 2 && *d <= full, "pause {i}: {d:?}");
        }
        let never = RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        };
        assert_eq!(
            never.retry(RequestKind::Read, &Answer::NoAnswer, 1, &mut b),
            None
        );
    }
}
