//! Both binaries' API client: kube's own, with every watch request paced by
//! [`crate::backoff::RequestPacer`] and every other request bounded in time and repeated as
//! [`crate::backoff::RetryPolicy`] says. Behind the `client` feature, which only the two
//! binaries enable: the shared core itself makes no API calls, but one adapter, not a copy per
//! binary, is what both must run.
//!
//! kube-runtime's watchers back off only after an error they see; a watch the apiserver (or a
//! proxy) ends at once, with an error event or none, would otherwise be reopened in a tight
//! loop. Pacing at the client covers every watcher of a binary, hand-written ones included.
//!
//! kube's client has no request timeout by default, so one request an apiserver (or a proxy, or
//! a half-open connection) never answers would hold a prepare, the slice publisher, an IPAM
//! release or a reconcile forever; and it repeats only 429/503/504, whatever the request (a
//! create answered 504 after it took effect would come back as `AlreadyExists`). Here every
//! attempt has a deadline, and what is repeated depends on the request: reads always, writes
//! without a precondition after a 409 `Conflict`, anything after a 429 (never before its
//! `Retry-After`), anything but a create after a 5xx or no answer. The callers' own loops (the
//! kubelet's prepare retries, the publisher's backoff, the reconciler's requeue) remain for what
//! the policy hands back.

use std::sync::Arc;
use std::task::{Context, Poll};

use crate::backoff::{Answer, RequestPacer, RetryPolicy, request_kind, retry_after, watch_track};
use kube::client::Body;

/// `client` with its watch requests paced and its requests bounded and repeated by the
/// default [`RetryPolicy`]. A client built by kube from a config also repeats 429/503/504
/// itself underneath; [`connect`] builds one that leaves that to the policy alone.
pub fn paced(client: kube::Client) -> kube::Client {
    with_policy(client, RetryPolicy::default())
}

/// `client` with its watch requests paced and its requests bounded and repeated by `policy`.
pub fn with_policy(client: kube::Client, policy: RetryPolicy) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let pacer = Arc::new(RequestPacer::new());
    kube::Client::new(
        Paced {
            client,
            pacer,
            policy: Arc::new(policy),
        },
        namespace,
    )
}

/// The client for `config`, with kube's own retries off so that `policy` alone decides what is
/// repeated (see the module docs), paced as [`with_policy`] says.
pub fn connect(mut config: kube::Config, policy: RetryPolicy) -> kube::Result<kube::Client> {
    config.default_retry = false;
    Ok(with_policy(kube::Client::try_from(config)?, policy))
}

#[derive(Clone)]
struct Paced {
    client: kube::Client,
    pacer: Arc<RequestPacer>,
    policy: Arc<RetryPolicy>,
}

impl tower::Service<http::Request<Body>> for Paced {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

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
        let watch = watch_track(
            request.uri().path(),
            request.uri().query().unwrap_or_default(),
        )
        .is_some();
        let client = self.client.clone();
        let policy = self.policy.clone();
        Box::pin(async move {
            tokio::time::sleep(pause).await;
            if watch {
                watch_headers(&client, request, &policy).await
            } else {
                send(&client, request, &policy).await
            }
        })
    }
}

/// A watch streams for minutes, so only its response headers have a deadline; kube-runtime's
/// watchers (and the slice watch) retry a watch that failed, paced.
async fn watch_headers(
    client: &kube::Client,
    request: http::Request<Body>,
    policy: &RetryPolicy,
) -> kube::Result<http::Response<Body>> {
    let what = format!("{} {}", request.method(), request.uri().path());
    match tokio::time::timeout(policy.timeout, client.send(request)).await {
        Ok(answer) => answer,
        Err(_) => Err(no_answer(&what, policy)),
    }
}

/// Sends `request` (whole answer within the policy's timeout) until it succeeds or the policy
/// hands the last answer back.
async fn send(
    client: &kube::Client,
    request: http::Request<Body>,
    policy: &RetryPolicy,
) -> kube::Result<http::Response<Body>> {
    let (parts, body) = request.into_parts();
    let body = body.collect_bytes().await?;
    let what = format!("{} {}", parts.method, parts.uri.path());
    let kind = request_kind(parts.method.as_str(), &body);
    let mut backoff = policy.backoff(seed());
    let mut attempt = 1;
    loop {
        let once = async {
            let response = client.send(copy(&parts, Body::from(body.clone()))).await?;
            let (head, body) = response.into_parts();
            let body = body.collect_bytes().await?;
            Ok::<_, kube::Error>((head, body))
        };
        let outcome = tokio::time::timeout(policy.timeout, once).await;
        let answer = match &outcome {
            Ok(Ok((head, _))) if head.status.is_success() => None,
            Ok(Ok((head, body))) => Some(Answer::Status {
                code: head.status.as_u16(),
                reason: status_reason(body),
                retry_after: retry_after(
                    head.headers
                        .get(http::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok()),
                ),
            }),
            Ok(Err(kube::Error::HyperError(_) | kube::Error::Service(_))) => Some(Answer::Failed),
            Ok(Err(_)) => None,
            Err(_) => Some(Answer::NoAnswer),
        };
        let pause = answer
            .as_ref()
            .and_then(|a| policy.retry(kind, a, attempt, &mut backoff));
        let Some(pause) = pause else {
            return match outcome {
                Ok(Ok((head, body))) => Ok(http::Response::from_parts(head, Body::from(body))),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(no_answer(&what, policy)),
            };
        };
        tracing::debug!(request = %what, attempt, ?answer, ?pause, "repeating an API request");
        tokio::time::sleep(pause).await;
        attempt += 1;
    }
}

/// A copy of the request for one more attempt (kube's requests carry their whole body).
fn copy(parts: &http::request::Parts, body: Body) -> http::Request<Body> {
    let mut request = http::Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    *request.extensions_mut() = parts.extensions.clone();
    request
}

/// `metav1.Status.reason` of an error answer ("" when the body is not a Status).
fn status_reason(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("reason")?.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn no_answer(what: &str, policy: &RetryPolicy) -> kube::Error {
    kube::Error::Service(
        format!(
            "{what}: no answer from the API server within {:?} (--api-timeout-seconds)",
            policy.timeout
        )
        .into(),
    )
}

/// Jitter seed: requests failing together (every node after an apiserver restart) must not
/// retry in step.
fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id())
}
