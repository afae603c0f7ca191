//! The overlay watch: every NetworkAddress labelled `knic.dev/overlay=true` (the allocations of
//! overlay pods, wherever they run), as the endpoints [`crate::overlay::fdb`] computes each
//! node's forwarding entries from. One watch per node that offers the overlay; objects are small
//! and change only when overlay pods come and go.

use std::sync::Arc;

use futures::StreamExt;
use knic_proto::network::stable::HELD_LABEL;
use knic_proto::network::{NetworkAddress, OVERLAY_LABEL};
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::watch;

use crate::overlay::fdb::Endpoint;

/// The endpoint an overlay allocation announces; `None` for one without (or with unreadable)
/// overlay facts, which cannot be forwarded to.
pub fn endpoint(object: &NetworkAddress) -> Option<Endpoint> {
    let overlay = object.spec.overlay.as_ref()?;
    let mac = parse_mac(&overlay.mac)?;
    let vtep = overlay.vtep.parse().ok()?;
    let labels = object.metadata.labels.as_ref();
    Some(Endpoint {
        name: object.metadata.name.clone().unwrap_or_default(),
        network: object.spec.network.clone(),
        vni: overlay.vni,
        mac,
        vtep,
        since: object
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(i64::MAX, |t| t.0.as_second()),
        // A held allocation (kept for a returning identity) has no pod behind it.
        held: labels
            .and_then(|l| l.get(HELD_LABEL))
            .is_some_and(|v| v == "true"),
    })
}

fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let bytes: Vec<u8> = text
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    <[u8; 6]>::try_from(bytes).ok()
}

/// Watches the overlay allocations and sends the endpoints to `out` on every change (the
/// first time once the initial list is in, even when it is empty: until then `out` holds
/// `None`, and a node must not take "not listed yet" for "no pods anywhere"), until `out` has
/// no receiver.
pub async fn watch_endpoints(client: kube::Client, out: watch::Sender<Option<Arc<Vec<Endpoint>>>>) {
    let api: Api<NetworkAddress> = Api::all(client);
    let config = watcher::Config::default().labels(&format!("{OVERLAY_LABEL}=true"));
    let (store, writer) = reflector::store();
    let events = reflector(writer, watcher(api, config)).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut warned = false;
    loop {
        tokio::select! {
            event = events.next() => match event {
                None => return,
                Some(Err(e)) => {
                    if !warned {
                        tracing::warn!(error = %e, "watching overlay NetworkAddresses failed; \
                            this node's overlay forwarding entries are not updated until it works");
                        warned = true;
                    }
                }
                Some(Ok(watcher::Event::InitDone | watcher::Event::Apply(_)
                    | watcher::Event::Delete(_))) => {
                    warned = false;
                    let mut endpoints: Vec<Endpoint> =
                        store.state().iter().filter_map(|o| endpoint(o)).collect();
                    endpoints.sort_by(|a, b| a.name.cmp(&b.name));
                    out.send_if_modified(|current| {
                        let changed = current.as_deref().is_none_or(|c| *c != endpoints);
                        if changed {
                            *current = Some(Arc::new(std::mem::take(&mut endpoints)));
                        }
                        changed
                    });
                }
                Some(Ok(_)) => {}
            },
            () = out.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(mac: &str, labels: serde_json::Value) -> NetworkAddress {
        serde_json::from_value(json!({
            "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkAddress",
            "metadata": {"name": "ovl-10-42-0-17", "labels": labels,
                         "creationTimestamp": "2026-11-27T10:00:00Z"},
            "spec": {"network": "ovl", "address": "10.42.0.17/24", "node": "node-b",
                     "claim": {"namespace": "ns", "name": "c", "uid": "u"},
                     "overlay": {"vni": 4242, "mac": mac, "vtep": "10.99.0.2"}},
        }))
        .expect("object")
    }

    #[test]
    fn an_announcement_becomes_an_endpoint_and_a_hold_is_marked() {
        let e = endpoint(&object(
            "02:5e:1c:9a:33:07",
            json!({"knic.dev/overlay": "true"}),
        ))
        .expect("endpoint");
        assert_eq!(e.vni, 4242);
        assert_eq!(e.mac, [2, 0x5e, 0x1c, 0x9a, 0x33, 7]);
        assert_eq!(e.vtep.to_string(), "10.99.0.2");
        assert_eq!(e.since, 1_795_773_600);
        assert!(!e.held);
        let held = endpoint(&object(
            "02:5e:1c:9a:33:07",
            json!({"knic.dev/overlay": "true", "knic.dev/held": "true"}),
        ))
        .expect("endpoint");
        assert!(held.held);
        // Unreadable facts are not forwarded to.
        assert!(endpoint(&object("02:5e:1c", json!({}))).is_none());
        assert!(endpoint(&object("zz:5e:1c:9a:33:07", json!({}))).is_none());
    }
}
