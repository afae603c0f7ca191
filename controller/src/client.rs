//! The controller's API client: kube's own, with every watch request paced by the shared
//! [`knic_proto::backoff::RequestPacer`], because kube-runtime's watchers (the reconciler's and
//! the availability caches') reopen a watch the apiserver ends without an error at once, in a
//! tight loop. The driver paces its client the same way; the policy lives once in knic-proto,
//! this is only the adapter to kube's client.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use knic_proto::backoff::RequestPacer;
use kube::client::Body;

/// `client` with its watch requests paced.
pub fn paced(client: kube::Client) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let pacer = Arc::new(RequestPacer::new());
    kube::Client::new(PacedWatches { client, pacer }, namespace)
}

#[derive(Clone)]
struct PacedWatches {
    client: kube::Client,
    pacer: Arc<RequestPacer>,
}

impl tower::Service<http::Request<Body>> for PacedWatches {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let (pause, _) = self
            .pacer
            .pause(request.uri().path(), request.uri().query());
        let client = self.client.clone();
        Box::pin(async move {
            tokio::time::sleep(pause).await;
            client.send(request).await
        })
    }
}
