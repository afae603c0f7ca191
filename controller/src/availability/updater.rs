//! The I/O half of availability: caches of the objects [`super::compute`] reads, and the
//! writes of `status.availableNodes` when a number changes.

use std::future::Future;

use futures::StreamExt;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::Api;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use super::{Settings, compute};
use crate::network::Network;

/// Keeps `status.availableNodes` of every Network current until `shutdown` completes.
pub async fn run(client: Client, settings: Settings, shutdown: impl Future<Output = ()>) {
    /// A cache of `K` and the stream that fills it (yielding once per event). A failing watch
    /// (RBAC, an API version not served) is logged once until it works again, because it
    /// leaves `availableNodes` unset and nothing else would say why.
    fn cache<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, impl futures::Stream<Item = ()>)
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        let (store, writer) = reflector::store();
        let mut failing = false;
        let events = reflector(writer, watcher(api, config))
            .default_backoff()
            .map(move |event| match event {
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(kind = %K::kind(&()), error = %e,
                            "watch failed; status.availableNodes is not updated until it works");
                }
                Err(_) => {}
                Ok(_) => failing = false,
            });
        (store, events)
    }
    let all = watcher::Config::default;
    let networks_api: Api<Network> = Api::all(client.clone());
    let (networks, a) = cache(networks_api.clone(), all());
    // Only knic's slices: other drivers' devices can never carry a knic network.
    let knic_slices = all().fields(&format!("spec.driver={}", knic_proto::DRIVER_NAME));
    let (slices, b) = cache(Api::<ResourceSlice>::all(client.clone()), knic_slices);
    let (claims, c) = cache(Api::<ResourceClaim>::all(client.clone()), all());
    let (classes, d) = cache(Api::<DeviceClass>::all(client.clone()), all());
    let mut changes = std::pin::pin!(futures::stream::select_all([
        a.boxed(),
        b.boxed(),
        c.boxed(),
        d.boxed()
    ]));
    let mut shutdown = std::pin::pin!(shutdown);
    let ready = async {
        let _ = networks.wait_until_ready().await;
        let _ = slices.wait_until_ready().await;
        let _ = claims.wait_until_ready().await;
        let _ = classes.wait_until_ready().await;
    };
    // The caches fill through the same stream, so it must be polled while waiting.
    let mut ready = std::pin::pin!(ready);
    loop {
        tokio::select! {
            () = &mut ready => break,
            Some(()) = changes.next() => {}
            () = &mut shutdown => return,
        }
    }
    loop {
        let all: Vec<Network> = networks.state().iter().map(|n| (**n).clone()).collect();
        let numbers = compute(&all, &slices.state(), &claims.state(), &classes.state());
        let mut failed = false;
        for network in &all {
            let name = network.name_any();
            let Some(number) = numbers.get(&name) else {
                continue;
            };
            let current = network.status.as_ref().and_then(|s| s.available_nodes);
            if current == *number {
                continue;
            }
            match crate::status::write_available_nodes(&networks_api, &name, *number).await {
                Ok(_) => tracing::debug!(network = %name, available = ?number, "available nodes"),
                Err(e) => {
                    tracing::warn!(network = %name, error = %e,
                        "writing status.availableNodes failed; retrying");
                    failed = true;
                }
            }
        }
        // Wait for a change (or, after a failed write, just the interval), then let the burst
        // settle for the interval.
        if !failed {
            tokio::select! {
                next = changes.next() => if next.is_none() { return },
                () = &mut shutdown => return,
            }
        }
        let settle = tokio::time::sleep(settings.interval);
        let mut settle = std::pin::pin!(settle);
        loop {
            tokio::select! {
                () = &mut settle => break,
                Some(()) = changes.next() => {}
                () = &mut shutdown => return,
            }
        }
    }
}
