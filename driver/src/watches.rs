//! The one way the driver derives a watched value from two others (the published devices from
//! the discovered ones and the full networks, the preparer's view from the share mode, the
//! offered devices from the withheld ones), so each stage is a pure function.

use tokio::sync::watch;

/// Replaces `out`'s value with `value` and wakes its receivers only when they differ.
pub fn send_if_changed<T: PartialEq>(out: &watch::Sender<T>, value: T) -> bool {
    out.send_if_modified(|current| {
        let changed = *current != value;
        if changed {
            *current = value;
        }
        changed
    })
}

/// Sends `derive(a, b)` to `out` now and whenever `a` or `b` changes, until `a`'s sender is
/// dropped; once `b`'s sender is gone its last value stays in force.
pub async fn derive<A, B, T: PartialEq>(
    mut a: watch::Receiver<A>,
    mut b: watch::Receiver<B>,
    out: watch::Sender<T>,
    derive: impl Fn(&A, &B) -> T,
) {
    let mut following = true;
    loop {
        let value = derive(&a.borrow_and_update(), &b.borrow_and_update());
        send_if_changed(&out, value);
        tokio::select! {
            changed = a.changed() => if changed.is_err() { return },
            changed = b.changed(), if following => following = changed.is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn derived_values_follow_both_inputs_and_stop_with_the_first() {
        let (a_tx, a) = watch::channel(1);
        let (b_tx, b) = watch::channel(10);
        let (out, mut seen) = watch::channel(0);
        let task = tokio::spawn(derive(a, b, out, |a, b| a + b));
        seen.wait_for(|v| *v == 11).await.unwrap();
        b_tx.send_replace(20);
        seen.wait_for(|v| *v == 21).await.unwrap();
        // Without b's sender its last value stays in force.
        drop(b_tx);
        a_tx.send_replace(2);
        seen.wait_for(|v| *v == 22).await.unwrap();
        // The same value again wakes nobody.
        let version = seen.borrow_and_update().to_owned();
        assert_eq!(version, 22);
        drop(a_tx);
        task.await.unwrap();
        assert!(!seen.has_changed().unwrap_or(false));
    }
}
