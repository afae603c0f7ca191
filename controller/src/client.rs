//! The controller's API client: kube's own, with every watch request paced by the shared
//! [`knic_proto::backoff::WatchPacer`], because kube-runtime's watchers (the reconciler's and
//! the availability caches') reopen a watch the apiserver ends without an error at once, in a
//! tight loop. The driver paces its client the same way; the policy lives once in knic-proto,
//! this is only the adapter to kube's client.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use knic_proto::backoff::{WatchPacer, watch_track};
use kube::client::Body;

/// `client` with its watch requests paced.
pub fn paced(client: kube::Client) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id());
    let pacer = Arc::new(Mutex::new(WatchPacer::new(seed)));
    kube::Client::new(PacedWatches { client, pacer }, namespace)
}

#[derive(Clone)]
struct PacedWatches {
    client: kube::Client,
    pacer: Arc<Mutex<WatchPacer>>,
}

impl tower::Service<http::Request<Body>> for PacedWatches {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let (path, query) = (request.uri().path(), request.uri().query());
        let pause =
            watch_track(path, query.unwrap_or_default()).map_or_else(Default::default, |t| {
                let mut pacer = self.pacer.lock().unwrap_or_else(|e| e.into_inner());
                pacer.before_watch(&t, std::time::Instant::now())
            });
        let client = self.client.clone();
        Box::pin(async move {
            tokio::time::sleep(pause).await;
            client.send(request).await
        })
    }
}
