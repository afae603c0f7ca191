//! The validating admission webhook: knic's configs and Networks checked when they are
//! written, with the rules (and the words) the driver and the reconciler use later, so a typo
//! fails `kubectl apply` instead of a pod's start or a Network's status.
//!
//! * [`rules`]: the verdict on one object (pure; the cluster read through [`Cluster`]);
//! * [`review`]: the `admission.k8s.io/v1` AdmissionReview in and out;
//! * [`tls`]: the serving certificate from a mounted Secret, reloaded when it changes;
//! * [`server`]: HTTPS on `--webhook-address`, path [`server::PATH`], with bounded bodies.
//!
//! Every replica serves it, leader or not, so the webhook stays up while the lease moves;
//! each replica keeps its own caches of DeviceClasses and Networks ([`Caches`]).

pub mod review;
pub mod rules;
pub mod server;
pub mod tls;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};

pub use rules::{Cluster, Kind, Snapshot, Verdict};
pub use server::{Limits, Server};
pub use tls::Certificates;

use crate::network::Network;
use crate::{Error, Result};

/// Where and how the webhook serves.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The listening address (`--webhook-address`).
    pub address: std::net::SocketAddr,
    /// PEM certificate chain (`--webhook-cert`).
    pub cert: PathBuf,
    /// PEM private key (`--webhook-key`).
    pub key: PathBuf,
    /// How often the two files are read again for a renewed certificate.
    pub reload_interval: Duration,
}

/// The cluster as the webhook reads it: reflector caches of DeviceClasses and Networks.
#[derive(Clone)]
pub struct Caches {
    classes: Store<DeviceClass>,
    networks: Store<Network>,
    /// Whether the first list of Networks has completed.
    networks_ready: Arc<AtomicBool>,
}

impl Cluster for Caches {
    fn device_class(&self, name: &str) -> Option<Arc<DeviceClass>> {
        self.classes.get(&ObjectRef::new(name))
    }
    fn networks(&self) -> Option<Vec<Arc<Network>>> {
        // Before the first list completes the store is empty, which would pass every Network
        // as conflict-free; "not known" makes the verdict say so instead.
        self.networks_ready
            .load(Ordering::Acquire)
            .then(|| self.networks.state())
    }
}

impl Caches {
    /// The caches and the future that fills them (it runs until dropped). Watch failures are
    /// logged once until the watch works again: the webhook still answers meanwhile, from
    /// what it has.
    pub fn start(client: kube::Client) -> (Caches, impl Future<Output = ()>) {
        fn cache<K>(api: Api<K>) -> (Store<K>, impl futures::Stream<Item = ()>)
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
            let events = reflector(writer, watcher(api, watcher::Config::default()))
                .default_backoff()
                .map(move |event| match event {
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(kind = %K::kind(&()), error = %e,
                            "webhook watch failed; answering from the cache as it is");
                    }
                    Err(_) => {}
                    Ok(_) => failing = false,
                });
            (store, events)
        }
        let (classes, a) = cache(Api::<DeviceClass>::all(client.clone()));
        let (networks, b) = cache(Api::<Network>::all(client));
        let networks_ready = Arc::new(AtomicBool::new(false));
        let (ready, store) = (networks_ready.clone(), networks.clone());
        let run = async move {
            let drain = async {
                let mut events = std::pin::pin!(futures::stream::select(a, b));
                while events.next().await.is_some() {}
            };
            let mark = async {
                if store.wait_until_ready().await.is_ok() {
                    ready.store(true, Ordering::Release);
                }
            };
            futures::join!(drain, mark);
        };
        let caches = Caches {
            classes,
            networks,
            networks_ready,
        };
        (caches, run)
    }
}

/// Loads the certificate and binds the address, then serves (and reloads the certificate) on
/// a task of its own until `shutdown` completes. Errors before serving (no certificate, address
/// in use) are returned, so the controller fails to start rather than run without its webhook.
pub async fn start(
    settings: Settings,
    cluster: Arc<dyn Cluster>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>> {
    let certificates = {
        let (cert, key) = (settings.cert.clone(), settings.key.clone());
        tokio::task::spawn_blocking(move || Certificates::load(&cert, &key))
            .await
            .map_err(|e| Error::Webhook(std::io::Error::other(e)))??
    };
    let listener = tokio::net::TcpListener::bind(settings.address)
        .await
        .map_err(Error::Webhook)?;
    let local = listener.local_addr().map_err(Error::Webhook)?;
    let server = Server::new(listener, certificates.clone(), cluster, Limits::default())?;
    tracing::info!(address = %local, path = server::PATH, "webhook serving");
    Ok(tokio::spawn(async move {
        let (stop_watch, stopped) = tokio::sync::oneshot::channel::<()>();
        let watch = tokio::spawn(certificates.watch(settings.reload_interval, async {
            let _ = stopped.await;
        }));
        server.serve(shutdown).await;
        let _ = stop_watch.send(());
        let _ = watch.await;
    }))
}
