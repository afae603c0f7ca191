//! Keeps new pods of a full network from being scheduled onto this node's devices.
//!
//! A Network with no free address has `Exhausted=True` in its status (the controller decides
//! that). Every claim template the controller generates carries
//! [`knic_proto::network::exhaustion_selector`], which refuses a device whose
//! [`EXHAUSTED_ATTRIBUTE`] lists the network. This module is the driver's half: it watches
//! Networks and publishes the attribute on every device of the node while some network is full,
//! and removes it once none is. The scheduler retries pending pods whenever a slice changes, so
//! they are placed again as soon as an address is freed; allocated claims are never
//! re-evaluated, so running pods are not disturbed. See the README ("When a network is full")
//! for why this mechanism and not a DeviceTaintRule.
//!
//! The decision ([`attribute_value`]) and the marking ([`mark`]) are pure; the watch loop
//! ([`crate::api::networks`]) only feeds them.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use knic_proto::network::{
    CONDITION_EXHAUSTED, EXHAUSTED_ATTRIBUTE, Network, exhausted_attribute, exhaustion_token,
};
use kube::ResourceExt;
use tokio::sync::watch;

/// Kubernetes' limit on attributes plus capacities of one device.
const MAX_ENTRIES_PER_DEVICE: usize = 32;

/// The exhausted Networks, in the order they became exhausted (the condition's
/// `lastTransitionTime`, then name), so every node lists the same ones when more than
/// [`MAX_EXHAUSTED_LISTED`](knic_proto::network::MAX_EXHAUSTED_LISTED) are full at once, and a network that has been full longest is never
/// the one left out.
pub fn exhausted_names(networks: &[Network]) -> Vec<String> {
    let mut full: Vec<(Option<&Time>, String)> = networks
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .filter(|n| n.condition_is_true(CONDITION_EXHAUSTED))
        .map(|n| {
            let since = n
                .condition(CONDITION_EXHAUSTED)
                .map(|c| &c.last_transition_time);
            (since, n.name_any())
        })
        .collect();
    full.sort_by(|a, b| {
        let key = |x: &(Option<&Time>, String)| (x.0.map(|t| t.0), x.1.clone());
        key(a).cmp(&key(b))
    });
    full.into_iter().map(|(_, name)| name).collect()
}

/// The value of [`EXHAUSTED_ATTRIBUTE`] for these Networks, `None` when none is exhausted.
pub fn attribute_value(networks: &[Network]) -> Option<String> {
    let tokens: Vec<String> = exhausted_names(networks)
        .iter()
        .map(|name| exhaustion_token(name))
        .collect();
    exhausted_attribute(tokens.iter().map(String::as_str))
}

/// `devices` with [`EXHAUSTED_ATTRIBUTE`] set to `value` (or removed when `None`). A device
/// that already has 32 attributes and capacities is left unmarked (with a warning) rather than
/// made invalid, which would get the whole slice rejected.
pub fn mark(devices: &[Device], value: Option<&str>) -> Vec<Device> {
    devices
        .iter()
        .map(|device| {
            let mut device = device.clone();
            let mut attributes = device.attributes.take().unwrap_or_default();
            match value {
                None => {
                    attributes.remove(EXHAUSTED_ATTRIBUTE);
                }
                Some(value) => {
                    let entries = attributes.len()
                        + device.capacity.as_ref().map_or(0, BTreeMap::len)
                        + usize::from(!attributes.contains_key(EXHAUSTED_ATTRIBUTE));
                    if entries > MAX_ENTRIES_PER_DEVICE {
                        tracing::warn!(device = %device.name,
                            "no room for the exhausted-networks attribute; left unmarked");
                    } else {
                        attributes.insert(
                            EXHAUSTED_ATTRIBUTE.to_owned(),
                            DeviceAttribute {
                                string: Some(value.to_owned()),
                                ..DeviceAttribute::default()
                            },
                        );
                    }
                }
            }
            device.attributes = (!attributes.is_empty()).then_some(attributes);
            device
        })
        .collect()
}

/// Publishes `devices` marked with the latest `exhausted` value to `out`, re-marking whenever
/// either changes, until `devices`' sender is dropped. Kept apart from discovery so the
/// preparer, the checkpoint and health see devices as discovered, and only the slices carry
/// the cluster's state.
pub async fn apply(
    devices: watch::Receiver<Vec<Device>>,
    exhausted: watch::Receiver<Option<String>>,
    out: watch::Sender<Vec<Device>>,
) {
    // Once the Network watch is gone, the last value it sent stays in force.
    crate::watches::derive(devices, exhausted, out, |d, e| mark(d, e.as_deref())).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use k8s_openapi::jiff::Timestamp;
    use knic_proto::network::{NetworkSpec, NetworkStatus};

    fn network(name: &str, exhausted_since: Option<i64>) -> Network {
        let mut n = Network::new(name, NetworkSpec::default());
        n.metadata.generation = Some(1);
        n.status = Some(NetworkStatus {
            conditions: vec![Condition {
                type_: CONDITION_EXHAUSTED.into(),
                status: if exhausted_since.is_some() {
                    "True"
                } else {
                    "False"
                }
                .into(),
                reason: String::new(),
                message: String::new(),
                observed_generation: Some(1),
                last_transition_time: Time(
                    Timestamp::from_second(exhausted_since.unwrap_or(0)).unwrap(),
                ),
            }],
            ..NetworkStatus::default()
        });
        n
    }

    fn device(name: &str, attributes: usize) -> Device {
        Device {
            name: name.into(),
            attributes: (attributes > 0).then(|| {
                (0..attributes)
                    .map(|i| (format!("a{i}"), DeviceAttribute::default()))
                    .collect()
            }),
            ..Device::default()
        }
    }

    #[test]
    fn only_currently_exhausted_networks_are_listed_oldest_first() {
        assert_eq!(attribute_value(&[]), None);
        let mut stale = network("stale", Some(5));
        stale.metadata.generation = Some(2); // the condition describes an older spec
        let mut deleting = network("deleting", Some(5));
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let networks = [
            network("free", None),
            network("blue", Some(200)),
            network("red", Some(100)),
            stale,
            deleting,
        ];
        assert_eq!(
            attribute_value(&networks).as_deref(),
            Some(format!(",{},{},", exhaustion_token("red"), exhaustion_token("blue")).as_str())
        );
    }

    #[test]
    fn beyond_seven_the_most_recently_exhausted_are_left_out() {
        let networks: Vec<Network> = (0..9)
            .map(|i| network(&format!("n{i}"), Some(1000 + i)))
            .collect();
        let value = attribute_value(&networks).unwrap();
        assert!(value.len() <= 64);
        for (i, n) in networks.iter().enumerate() {
            let listed = value.contains(&format!(",{},", exhaustion_token(&n.name_any())));
            // n8 and n7 became exhausted last.
            assert_eq!(listed, i < 7, "{} in {value}", n.name_any());
        }
    }

    #[test]
    fn marking_sets_replaces_and_removes_the_attribute() {
        let devices = [device("a", 2), device("b", 0)];
        let marked = mark(&devices, Some(",aaaaaaaa,"));
        for d in &marked {
            let attribute = &d.attributes.as_ref().unwrap()[EXHAUSTED_ATTRIBUTE];
            assert_eq!(attribute.string.as_deref(), Some(",aaaaaaaa,"));
        }
        assert_eq!(marked[0].attributes.as_ref().unwrap().len(), 3);
        let again = mark(&marked, Some(",bbbbbbbb,"));
        assert_eq!(
            again[1].attributes.as_ref().unwrap()[EXHAUSTED_ATTRIBUTE]
                .string
                .as_deref(),
            Some(",bbbbbbbb,")
        );
        assert_eq!(
            mark(&again, None),
            devices.to_vec(),
            "unmarking restores them exactly"
        );
    }

    #[test]
    fn a_device_without_room_is_left_unmarked_not_made_invalid() {
        let full = device("full", 32);
        let marked = mark(std::slice::from_ref(&full), Some(",aaaaaaaa,"));
        assert_eq!(marked[0], full);
        let almost = device("almost", 31);
        let marked = mark(std::slice::from_ref(&almost), Some(",aaaaaaaa,"));
        assert_eq!(marked[0].attributes.as_ref().unwrap().len(), 32);
    }

    #[tokio::test]
    async fn apply_follows_both_inputs_and_outlives_the_network_watch() {
        let (devices_tx, devices_rx) = watch::channel(vec![device("a", 1)]);
        let (exhausted_tx, exhausted_rx) = watch::channel(None);
        let (out_tx, mut out) = watch::channel(Vec::new());
        let task = tokio::spawn(apply(devices_rx, exhausted_rx, out_tx));
        let value = |out: &watch::Receiver<Vec<Device>>| {
            out.borrow()
                .iter()
                .map(|d| {
                    let v = d
                        .attributes
                        .as_ref()
                        .and_then(|a| a.get(EXHAUSTED_ATTRIBUTE));
                    (d.name.clone(), v.and_then(|v| v.string.clone()))
                })
                .collect::<Vec<_>>()
        };
        out.wait_for(|d| d.len() == 1).await.unwrap();
        assert_eq!(value(&out), [("a".to_string(), None)]);
        exhausted_tx.send_replace(Some(",x,".into()));
        out.wait_for(|d| d[0].attributes.as_ref().unwrap().len() == 2)
            .await
            .unwrap();
        drop(exhausted_tx);
        devices_tx.send_replace(vec![device("a", 1), device("b", 0)]);
        out.wait_for(|d| d.len() == 2).await.unwrap();
        assert_eq!(
            value(&out),
            [
                ("a".to_string(), Some(",x,".into())),
                ("b".to_string(), Some(",x,".into()))
            ]
        );
        drop(devices_tx);
        task.await.unwrap();
    }
}
