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
}
