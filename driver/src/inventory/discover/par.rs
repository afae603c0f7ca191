//! Order-keeping parallel map for the discovery pass.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Below this many items a second thread costs more than it saves.
const PARALLEL_MIN_ITEMS: usize = 64;
/// Discovery waits on the kernel's sysfs code, which scales with cores; more threads than the
/// node gives would only queue.
const MAX_THREADS: usize = 4;

/// Items a thread takes at a time: small enough that the threads finish together (a PF, with
/// its hundreds of `virtfnN` links, costs as much as dozens of VFs), large enough that taking
/// them costs nothing next to their system calls.
const BATCH: usize = 8;

/// `items.iter().map(f).collect()`, on up to [`MAX_THREADS`] threads when there are enough
/// items, in the order of `items`. The reads behind `f` are independent system calls, so on a
/// node with two cores two threads nearly halve a large pass. Threads take the next items as
/// they finish (not a fixed share each), so one slow item or one preempted thread does not
/// leave the other idle; a panic in one is re-raised.
pub(crate) fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = cores()
        .min(MAX_THREADS)
        .min(items.len() / PARALLEL_MIN_ITEMS);
    if threads < 2 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done: Vec<(usize, Vec<R>)> = Vec::new();
        loop {
            let start = next.fetch_add(BATCH, Ordering::Relaxed);
            if start >= items.len() {
                return done;
            }
            let part = &items[start..(start + BATCH).min(items.len())];
            done.push((start, part.iter().map(&f).collect()));
        }
    };
    let mut parts = std::thread::scope(|scope| {
        let others: Vec<_> = (1..threads).map(|_| scope.spawn(work)).collect();
        let mut parts = work();
        for handle in others {
            match handle.join() {
                Ok(more) => parts.extend(more),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        parts
    });
    parts.sort_unstable_by_key(|(start, _)| *start);
    parts.into_iter().flat_map(|(_, part)| part).collect()
}

/// The cores this process may use, asked once: `available_parallelism` reads cgroup files on
/// every call, and a pass maps several times.
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES
        .get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inventory_par_map_keeps_the_order_of_its_items() {
        let cores = cores();
        for n in [
            0,
            1,
            PARALLEL_MIN_ITEMS * 2 - 1,
            PARALLEL_MIN_ITEMS * 2,
            1001,
        ] {
            let items: Vec<usize> = (0..n).collect();
            let threads = std::sync::Mutex::new(std::collections::HashSet::new());
            let parallel = n >= PARALLEL_MIN_ITEMS * 2 && cores >= 2;
            let out = par_map(&items, |i| {
                threads.lock().unwrap().insert(std::thread::current().id());
                // The first item waits until another thread has taken some: proves the work
                // is shared, whatever the scheduler does.
                if *i == 0 && parallel {
                    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
                    while threads.lock().unwrap().len() < 2 && std::time::Instant::now() < until {
                        std::thread::yield_now();
                    }
                }
                i * 3
            });
            assert_eq!(out, items.iter().map(|i| i * 3).collect::<Vec<_>>(), "{n}");
            let used = threads.into_inner().unwrap().len();
            if parallel {
                let most = cores.min(MAX_THREADS).min(n / PARALLEL_MIN_ITEMS);
                assert!((2..=most).contains(&used), "{n} items on {used} threads");
            } else {
                assert_eq!(used, usize::from(n > 0), "{n} items on one thread");
            }
        }
    }
}
