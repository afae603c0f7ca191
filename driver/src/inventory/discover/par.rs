//! Order-keeping parallel map for the discovery pass.

/// Below this many items a second thread costs more than it saves.
const PARALLEL_MIN_ITEMS: usize = 64;
/// Discovery waits on the kernel's sysfs code, which scales with cores; more threads than the
/// node gives would only queue.
const MAX_THREADS: usize = 4;

/// `items.iter().map(f).collect()`, on up to [`MAX_THREADS`] threads when there are enough
/// items, in the order of `items`. The reads behind `f` are independent system calls, so on a
/// node with two cores two threads nearly halve a large pass; a panic in one is re-raised.
pub(crate) fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(MAX_THREADS)
        .min(items.len() / PARALLEL_MIN_ITEMS);
    if threads < 2 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|scope| {
        let mut chunks = items.chunks(chunk);
        let first = chunks.next().unwrap_or_default();
        let others: Vec<_> = chunks
            .map(|part| scope.spawn(move || part.iter().map(f).collect::<Vec<R>>()))
            .collect();
        let mut out: Vec<R> = first.iter().map(f).collect();
        for handle in others {
            match handle.join() {
                Ok(part) => out.extend(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inventory_par_map_keeps_the_order_of_its_items() {
        for n in [
            0,
            1,
            PARALLEL_MIN_ITEMS * 2 - 1,
            PARALLEL_MIN_ITEMS * 2,
            1001,
        ] {
            let items: Vec<usize> = (0..n).collect();
            let threads = std::sync::Mutex::new(std::collections::HashSet::new());
            let out = par_map(&items, |i| {
                threads.lock().unwrap().insert(std::thread::current().id());
                i * 3
            });
            assert_eq!(out, items.iter().map(|i| i * 3).collect::<Vec<_>>(), "{n}");
            let used = threads.into_inner().unwrap().len();
            let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
            if n < PARALLEL_MIN_ITEMS * 2 || cores < 2 {
                assert_eq!(used, usize::from(n > 0), "{n} items on one thread");
            } else {
                assert_eq!(used, cores.min(MAX_THREADS).min(n / PARALLEL_MIN_ITEMS));
            }
        }
    }
}
