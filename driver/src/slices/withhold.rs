//! Devices that must not be offered although they are on the node: those of a prepared claim
//! whose ResourceClaim is gone (see `claims::orphans`). While such a claim is still prepared
//! the scheduler would see its device as free and hand it to the next claim, whose every
//! prepare knic would then refuse.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::Device;
use tokio::sync::watch;

/// `devices` without those named in `withheld`.
pub fn without(devices: &[Device], withheld: &BTreeSet<String>) -> Vec<Device> {
    devices
        .iter()
        .filter(|d| !withheld.contains(&d.name))
        .cloned()
        .collect()
}

/// Sends `devices` minus `withheld` to `out` whenever either changes, until `devices`' sender
/// is dropped (a dropped `withheld` sender leaves its last value in force).
pub async fn apply(
    devices: watch::Receiver<Vec<Device>>,
    withheld: watch::Receiver<BTreeSet<String>>,
    out: watch::Sender<Vec<Device>>,
) {
    crate::watches::derive(devices, withheld, out, |d, w| without(d, w)).await;
}

/// Sends the union of every set in `inputs` to `out` whenever one changes, so several reasons
/// to withhold devices (orphaned claims, KNI attachments) feed one [`apply`]. A dropped sender
/// leaves its last set in force; returns once `out` has no receiver.
pub async fn union(
    mut inputs: Vec<watch::Receiver<BTreeSet<String>>>,
    out: watch::Sender<BTreeSet<String>>,
) {
    let mut live: Vec<bool> = vec![true; inputs.len()];
    loop {
        let all: BTreeSet<String> = inputs
            .iter_mut()
            .flat_map(|rx| rx.borrow_and_update().clone())
            .collect();
        out.send_if_modified(|current| {
            let changed = *current != all;
            if changed {
                *current = all;
            }
            changed
        });
        let waits = inputs
            .iter_mut()
            .zip(&live)
            .enumerate()
            .filter(|(_, (_, live))| **live)
            .map(|(i, (rx, _))| Box::pin(async move { (i, rx.changed().await.is_ok()) }));
        let waits: Vec<_> = waits.collect();
        if waits.is_empty() {
            out.closed().await;
            return;
        }
        tokio::select! {
            ((i, ok), _, _) = futures::future::select_all(waits) => {
                if !ok {
                    live[i] = false;
                }
            }
            () = out.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str) -> Device {
        Device {
            name: name.into(),
            ..Device::default()
        }
    }

    fn names(devices: &[Device]) -> Vec<&str> {
        devices.iter().map(|d| d.name.as_str()).collect()
    }

    #[tokio::test]
    async fn withheld_devices_leave_the_offer_and_come_back() {
        let (devices_tx, devices) = watch::channel(vec![device("a"), device("b")]);
        let (withheld_tx, withheld) = watch::channel(BTreeSet::new());
        let (out, mut offered) = watch::channel(Vec::new());
        let task = tokio::spawn(apply(devices, withheld, out));
        offered.wait_for(|d| names(d) == ["a", "b"]).await.unwrap();
        withheld_tx.send_replace(BTreeSet::from(["b".to_owned()]));
        offered.wait_for(|d| names(d) == ["a"]).await.unwrap();
        // A rescan that finds the device again does not bring it back while it is withheld.
        devices_tx.send_replace(vec![device("a"), device("b"), device("c")]);
        offered.wait_for(|d| names(d) == ["a", "c"]).await.unwrap();
        withheld_tx.send_replace(BTreeSet::new());
        offered
            .wait_for(|d| names(d) == ["a", "b", "c"])
            .await
            .unwrap();
        drop(devices_tx);
        task.await.unwrap();
    }

    #[tokio::test]
    async fn union_merges_every_reason_to_withhold() {
        let set = |names: &[&str]| {
            names
                .iter()
                .map(|n| (*n).to_owned())
                .collect::<BTreeSet<_>>()
        };
        let (orphans_tx, orphans) = watch::channel(set(&["a"]));
        let (kni_tx, kni) = watch::channel(BTreeSet::new());
        let (out, mut merged) = watch::channel(BTreeSet::new());
        let task = tokio::spawn(union(vec![orphans, kni], out));
        merged.wait_for(|s| *s == set(&["a"])).await.unwrap();
        kni_tx.send_replace(set(&["b", "a"]));
        merged.wait_for(|s| *s == set(&["a", "b"])).await.unwrap();
        orphans_tx.send_replace(BTreeSet::new());
        // "a" stays: the KNI side still withholds it.
        merged.wait_for(|s| *s == set(&["a", "b"])).await.unwrap();
        kni_tx.send_replace(set(&["b"]));
        merged.wait_for(|s| *s == set(&["b"])).await.unwrap();
        // A dropped input keeps its last set in force.
        drop(kni_tx);
        orphans_tx.send_replace(set(&["c"]));
        merged.wait_for(|s| *s == set(&["b", "c"])).await.unwrap();
        drop(merged);
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("union ends without a receiver")
            .unwrap();
    }
}
