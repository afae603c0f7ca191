//! The Networks watch: which networks are full, for [`crate::slices::exhaustion`] to mark the
//! node's devices with.

use futures::{FutureExt, StreamExt};
use knic_proto::network::{MAX_EXHAUSTED_LISTED, Network};
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::watch;

use crate::slices::exhaustion::{attribute_value, exhausted_names};

/// Watches every Network and sends [`attribute_value`] to `out` whenever it changes, counts
/// every change of any Network in `changed` (this node's `NodeNetworks` object is recomputed
/// on it: without it a new Network reached the object only at its 30 s period, as a real
/// cluster showed), and signals `synced` once the first full list is in, so slices are not published before the
/// full networks are known (a restarting driver would otherwise briefly offer them). Runs until
/// `out` has no receiver. A cluster without the Network CRD (the driver deployed alone) only
/// costs a retried watch and one warning. Every Network, as the store holds it after each
/// change, goes to `all` (live updates of routes and MTU read it: no second watch).
pub async fn watch_networks(
    client: kube::Client,
    out: watch::Sender<Option<String>>,
    changed: watch::Sender<u64>,
    synced: tokio::sync::oneshot::Sender<()>,
    all: watch::Sender<std::sync::Arc<Vec<Network>>>,
) {
    let mut synced = Some(synced);
    let api: Api<Network> = Api::all(client);
    let (store, writer) = reflector::store();
    let events = reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut warned = false;
    loop {
        tokio::select! {
            event = events.next() => match event {
                None => return,
                Some(Err(e)) => {
                    if !warned {
                        tracing::warn!(error = %e, "watching Networks failed (is the knic CRD \
                            installed?); full networks are refused at prepare only until it works");
                        warned = true;
                    }
                }
                Some(Ok(watcher::Event::InitDone | watcher::Event::Apply(_)
                    | watcher::Event::Delete(_))) => {
                    warned = false;
                    changed.send_modify(|n| *n = n.wrapping_add(1));
                    let networks: Vec<Network> =
                        store.state().iter().map(|n| n.as_ref().clone()).collect();
                    let value = attribute_value(&networks);
                    // Only a spec change (a new generation) or a Network coming or going
                    // wakes the live updater: the controller rewrites a busy Network's status
                    // far more often than its 2 s quiet period, which would never end.
                    all.send_if_modified(|current| {
                        let key = |v: &[Network]| -> Vec<(Option<String>, Option<i64>)> {
                            v.iter()
                                .map(|n| (n.metadata.name.clone(), n.metadata.generation))
                                .collect()
                        };
                        let changed = key(current) != key(&networks);
                        if changed {
                            *current = std::sync::Arc::new(networks.clone());
                        }
                        changed
                    });
                    out.send_if_modified(|current| {
                        let changed = *current != value;
                        if changed {
                            let names = exhausted_names(&networks);
                            tracing::info!(exhausted = ?names, "exhausted networks changed");
                            if names.len() > MAX_EXHAUSTED_LISTED {
                                tracing::warn!(left_out = ?&names[MAX_EXHAUSTED_LISTED..],
                                    "more networks are exhausted than one device attribute can \
                                     list; pods of the others are kept out by a prepare error \
                                     instead of by the scheduler");
                            }
                            current.clone_from(&value);
                        }
                        changed
                    });
                    if store.wait_until_ready().now_or_never().is_some()
                        && let Some(synced) = synced.take()
                    {
                        let _ = synced.send(());
                    }
                }
                Some(Ok(_)) => {}
            },
            () = out.closed() => return,
        }
    }
}
