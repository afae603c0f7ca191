//! Many allocators on one subnet, create-by-unique-name the only arbiter.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};

use super::*;

/// Stand-in for the apiserver: `create` succeeds for exactly one caller per name.
#[derive(Default)]
struct FakeApi {
    objects: Mutex<HashSet<String>>,
}

impl FakeApi {
    fn exists(&self, name: &str) -> bool {
        self.objects.lock().expect("lock").contains(name)
    }

    fn create(&self, name: String) -> bool {
        self.objects.lock().expect("lock").insert(name)
    }
}

/// What one race produced: the addresses each allocator won, and how many creates lost.
struct Race {
    won: Vec<Vec<IpAddr>>,
    conflicts: usize,
}

/// Runs 64 allocators on one /24, released together by a barrier, until each sees the subnet
/// exhausted. With `same_hint` every allocator starts at the same address (the worst case, to
/// force lost creates); otherwise each claim's hint is its own, as in production.
fn race(p: &Pool, repetition: usize, same_hint: bool) -> Race {
    let api = FakeApi::default();
    let start = Barrier::new(64);
    let conflicts = AtomicUsize::new(0);
    let won = std::thread::scope(|s| {
        let handles: Vec<_> = (0..64)
            .map(|t| {
                let (api, start, conflicts) = (&api, &start, &conflicts);
                s.spawn(move || {
                    start.wait();
                    let mut won = Vec::new();
                    for n in 0.. {
                        let claim = format!("claim-{repetition}-{t}-{n}");
                        let hint = if same_hint {
                            0
                        } else {
                            stable_offset("blue", &claim, p)
                        };
                        let got = loop {
                            // Check-then-create is racy on purpose: only the create decides.
                            let candidate =
                                choose(p, |a| api.exists(&allocation_name("blue", a)), hint);
                            let Some(candidate) = candidate else {
                                break None;
                            };
                            if api.create(allocation_name("blue", candidate)) {
                                break Some(candidate);
                            }
                            conflicts.fetch_add(1, Ordering::Relaxed);
                        };
                        match got {
                            Some(a) => won.push(a),
                            None => break,
                        }
                        // A real allocator spends an API round trip per allocation; yielding
                        // lets the others interleave on a machine with few cores.
                        std::thread::yield_now();
                    }
                    won
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("allocator thread"))
            .collect()
    });
    Race {
        won,
        conflicts: conflicts.into_inner(),
    }
}

fn check_race(p: &Pool, expected: usize) {
    let mut conflicts = 0;
    let mut shared = 0;
    for repetition in 0..100 {
        let race = race(p, repetition, repetition % 2 == 1);
        conflicts += race.conflicts;
        let all: Vec<IpAddr> = race.won.iter().flatten().copied().collect();
        let unique: HashSet<IpAddr> = all.iter().copied().collect();
        assert_eq!(
            all.len(),
            expected,
            "repetition {repetition}: duplicates or losses"
        );
        assert_eq!(unique.len(), expected, "repetition {repetition}");
        assert!(all.iter().all(|a| p.contains_usable(*a)));
        if race.won.iter().filter(|w| !w.is_empty()).count() > 1 {
            shared += 1;
        }
        // Clean exhaustion once everything is out.
        let err = allocate("blue", p, |a| unique.contains(&a), 0).expect_err("exhausted");
        assert_eq!(
            err.to_string(),
            format!(
                "network blue: subnet 192.0.2.0/24 has no free address ({expected} in use of {expected})"
            )
        );
    }
    // The race was real: allocators interleaved, and some creates lost and were retried.
    assert!(
        shared > 50,
        "only {shared} of 100 repetitions had more than one winner"
    );
    assert!(conflicts > 0, "no allocator ever lost a create");
}

/// The concurrency requirement: 64 allocators on one /24, create-by-unique-name as
/// the only arbiter, 100 repetitions: exactly 253 unique addresses with a gateway (it is never
/// handed out), then a clean exhaustion error.
#[test]
fn ipam_concurrent_allocators_with_gateway_get_253_unique() {
    check_race(&pool("192.0.2.0/24", Some("192.0.2.1"), &[]), 253);
}

/// Without a gateway, all 254 host addresses are handed out.
#[test]
fn ipam_concurrent_allocators_without_gateway_get_254_unique() {
    check_race(&pool("192.0.2.0/24", None, &[]), 254);
}
