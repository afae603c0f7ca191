//! The driver's API client: kube's own, with every watch request paced by
//! [`knic_proto::backoff::WatchPacer`]. kube-runtime's watchers back off only after an error
//! they see; a watch the apiserver (or a proxy) ends at once, with an error event or none,
//! would otherwise be reopened in a tight loop. Pacing at the client covers every watcher of
//! the binary, the hand-written slice watch included.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use knic_proto::backoff::{WatchPacer, watch_track};
use kube::client::Body;

use crate::BoxFuture;

/// `client` with its watch requests paced.
pub fn paced(client: kube::Client) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id());
    let pacer = Arc::new(Mutex::new(WatchPacer::new(seed)));
    kube::Client::new(Paced { client, pacer }, namespace)
}

#[derive(Clone)]
struct Paced {
    client: kube::Client,
    pacer: Arc<Mutex<WatchPacer>>,
}

impl tower::Service<http::Request<Body>> for Paced {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let uri = request.uri();
        let delay = watch_track(uri.path(), uri.query().unwrap_or_default())
            .map(|track| {
                let pause = self
                    .pacer
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .before_watch(&track, Instant::now());
                if !pause.is_zero() {
                    tracing::debug!(%track, ?pause, "the last watch ended early; pausing before the next");
                }
                pause
            })
            .unwrap_or_default();
        let client = self.client.clone();
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            client.send(request).await
        })
    }
}
