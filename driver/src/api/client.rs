//! The driver's API client: kube's own, with every watch request paced by
//! [`knic_proto::backoff::RequestPacer`]. kube-runtime's watchers back off only after an error
//! they see; a watch the apiserver (or a proxy) ends at once, with an error event or none,
//! would otherwise be reopened in a tight loop. Pacing at the client covers every watcher of
//! the binary, the hand-written slice watch included. The controller has the same adapter over
//! the same pacer (no crate both share may link a kube client).

use std::sync::Arc;
use std::task::{Context, Poll};

use knic_proto::backoff::RequestPacer;
use kube::client::Body;

use crate::BoxFuture;

/// `client` with its watch requests paced.
pub fn paced(client: kube::Client) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let pacer = Arc::new(RequestPacer::new());
    kube::Client::new(Paced { client, pacer }, namespace)
}

#[derive(Clone)]
struct Paced {
    client: kube::Client,
    pacer: Arc<RequestPacer>,
}

impl tower::Service<http::Request<Body>> for Paced {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let (pause, track) = self
            .pacer
            .pause(request.uri().path(), request.uri().query());
        if !pause.is_zero() {
            tracing::debug!(
                ?track,
                ?pause,
                "the last watch ended early; pausing before the next"
            );
        }
        let client = self.client.clone();
        Box::pin(async move {
            tokio::time::sleep(pause).await;
            client.send(request).await
        })
    }
}
