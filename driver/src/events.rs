//! Kubernetes Events about prepare and attach failures, on the claim and its pod: the port the
//! kubelet service and the pod networks report through, and the rate limit that keeps a
//! failing pod (the kubelet retries prepare every few seconds) from flooding the API.
//!
//! The adapter that writes them is `api::events`; without one ([`NoEvents`]) failures are only
//! logged, as before.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::claims::ClaimRef;

/// Same object and reason at most once per this window; the next Event carries the count.
pub const EVENT_WINDOW: Duration = Duration::from_secs(60);

/// The pod a failure concerns (in the claim's namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
}

/// One failure or refusal worth an Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The claim.
    pub claim: ClaimRef,
    /// The pod, when the caller knows it; otherwise the adapter finds the pods the claim is
    /// reserved for.
    pub pod: Option<PodRef>,
    /// What knic was doing (`PrepareResources`, `AttachInterfaces`).
    pub action: &'static str,
    /// CamelCase reason, the same as the claim condition's where there is one.
    pub reason: &'static str,
    /// The same text as the claim condition or the kubelet's error.
    pub message: String,
}

/// Where warnings go. `warn` must not block: adapters write in the background.
pub trait EventSink: Send + Sync + 'static {
    /// Reports one failure.
    fn warn(&self, warning: Warning);
}

/// Logs nothing more than the callers already do (the demo, tests).
pub struct NoEvents;

impl EventSink for NoEvents {
    fn warn(&self, _: Warning) {}
}

/// The reason of a prepare failure: the refusal while NRI is down gets its own (nothing is
/// wrong with the claim); everything else, an exhausted Network included (its error comes
/// wrapped with the claim and request it concerns), is `PrepareFailed` with the text saying
/// what.
pub fn prepare_reason(error: &crate::Error) -> &'static str {
    match error {
        crate::Error::RuntimeHooksDown { .. } => "RuntimeHooksDown",
        _ => "PrepareFailed",
    }
}

/// Per (object, reason): when the last Event went out and how many occurrences were held back
/// since.
#[derive(Debug, Default)]
pub struct Limiter {
    window: Duration,
    seen: HashMap<(String, String), (Instant, u32)>,
}

/// How many keys the limiter keeps before it forgets the quiet ones.
const MAX_KEYS: usize = 4096;

impl Limiter {
    /// At most one Event per object and reason per `window`.
    pub fn new(window: Duration) -> Limiter {
        Limiter {
            window,
            seen: HashMap::new(),
        }
    }

    /// Whether an occurrence at `now` is sent: `Some(count)` with the occurrences it stands
    /// for (this one plus those held back since the last Event), `None` when held back.
    pub fn admit(&mut self, object: &str, reason: &str, now: Instant) -> Option<u32> {
        if self.seen.len() >= MAX_KEYS {
            // Held counts wait for a later occurrence that never comes for a deleted claim or
            // pod: after ten windows they are dropped (the count is lost, the memory bounded),
            // and a map still full (a burst of distinct objects) starts afresh.
            let window = self.window;
            self.seen.retain(|_, (sent, held)| {
                let age = now.duration_since(*sent);
                age < window || (*held > 0 && age < window * 10)
            });
            if self.seen.len() >= MAX_KEYS {
                self.seen.clear();
            }
        }
        let key = (object.to_owned(), reason.to_owned());
        match self.seen.get_mut(&key) {
            Some((sent, held)) if now.duration_since(*sent) < self.window => {
                *held = held.saturating_add(1);
                None
            }
            Some((sent, held)) => {
                let count = held.saturating_add(1);
                *sent = now;
                *held = 0;
                Some(count)
            }
            None => {
                self.seen.insert(key, (now, 0));
                Some(1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_object_and_reason_per_window_with_the_count_held_back() {
        let mut limiter = Limiter::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(limiter.admit("claim-uid", "PrepareFailed", t0), Some(1));
        assert_eq!(
            limiter.admit("claim-uid", "PrepareFailed", t0 + Duration::from_secs(5)),
            None
        );
        assert_eq!(
            limiter.admit("claim-uid", "PrepareFailed", t0 + Duration::from_secs(59)),
            None
        );
        // Another reason or object is its own key.
        assert_eq!(
            limiter.admit("claim-uid", "RuntimeHooksDown", t0 + Duration::from_secs(6)),
            Some(1)
        );
        assert_eq!(
            limiter.admit("pod-uid", "PrepareFailed", t0 + Duration::from_secs(6)),
            Some(1)
        );
        // After the window: this one and the two held back.
        assert_eq!(
            limiter.admit("claim-uid", "PrepareFailed", t0 + Duration::from_secs(60)),
            Some(3)
        );
        assert_eq!(
            limiter.admit("claim-uid", "PrepareFailed", t0 + Duration::from_secs(121)),
            Some(1)
        );
    }

    #[test]
    fn quiet_keys_are_forgotten_when_the_map_is_full() {
        let mut limiter = Limiter::new(Duration::from_secs(60));
        let t0 = Instant::now();
        for i in 0..MAX_KEYS {
            limiter.admit(&format!("o{i}"), "R", t0);
        }
        limiter.admit("late", "R", t0 + Duration::from_secs(61));
        assert_eq!(limiter.seen.len(), 1);
    }

    #[test]
    fn held_counts_of_objects_that_never_come_back_do_not_pin_the_map() {
        let full = |t0: Instant| {
            let mut limiter = Limiter::new(Duration::from_secs(60));
            for i in 0..MAX_KEYS {
                limiter.admit(&format!("o{i}"), "R", t0);
            }
            // Half of them have an occurrence held back, waiting for a next one.
            for (i, (_, held)) in limiter.seen.values_mut().enumerate() {
                *held = u32::from(i % 2 == 0);
            }
            limiter
        };
        let t0 = Instant::now();
        let mut soon = full(t0);
        soon.admit("late", "R", t0 + Duration::from_secs(5 * 60));
        assert_eq!(
            soon.seen.len(),
            MAX_KEYS / 2 + 1,
            "held counts kept for ten windows"
        );
        let mut later = full(t0);
        later.admit("late", "R", t0 + Duration::from_secs(11 * 60));
        assert_eq!(later.seen.len(), 1, "then they go");
        // A full map of fresh keys starts afresh rather than growing.
        let mut burst = Limiter::new(Duration::from_secs(60));
        for i in 0..=MAX_KEYS {
            burst.admit(&format!("o{i}"), "R", t0);
        }
        assert!(burst.seen.len() <= MAX_KEYS);
    }

    #[test]
    fn refusals_have_their_own_reasons() {
        assert_eq!(
            prepare_reason(&crate::Error::RuntimeHooksDown {
                socket: "/nri.sock".into()
            }),
            "RuntimeHooksDown"
        );
        assert_eq!(
            prepare_reason(&crate::Error::Nri("x".into())),
            "PrepareFailed"
        );
    }
}
