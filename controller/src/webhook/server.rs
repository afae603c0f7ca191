//! The HTTPS server: TLS from [`super::tls`], HTTP/1.1 from hyper, one route (`POST
//! /validate`), and bounds on everything a caller controls (connections, handshake time, header
//! time, body size), since the port is reachable by any pod unless a NetworkPolicy says
//! otherwise.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::review::answer;
use super::rules::Cluster;
use super::tls::Certificates;
use crate::{Error, Result};

/// The route the webhook configuration names.
pub const PATH: &str = "/validate";

/// Bounds on one server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The largest request body answered; larger ones get 413 (read on at most 1 MiB past the
    /// bound, so the client sees the reason). An AdmissionReview carries the object and, on
    /// update, the stored one, each within the apiserver's own request limit (3 MiB), so
    /// 8 MiB never refuses a real review.
    pub max_body: usize,
    /// Connections served at once; further ones are closed at once.
    pub max_connections: usize,
    /// How long a TLS handshake, and then a request's headers, may take.
    pub handshake_timeout: Duration,
    /// How long a request's body may take to arrive: a client trickling bytes would otherwise
    /// hold a connection slot for ever.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body: 8 << 20,
            max_connections: 256,
            handshake_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// A bound, configured server, ready to serve.
pub struct Server {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    cluster: Arc<dyn Cluster>,
    limits: Limits,
}

impl Server {
    /// Builds the TLS configuration now, so a failure is the caller's to report at start.
    pub fn new(
        listener: TcpListener,
        certificates: Arc<Certificates>,
        cluster: Arc<dyn Cluster>,
        limits: Limits,
    ) -> Result<Server> {
        Ok(Server {
            listener,
            acceptor: TlsAcceptor::from(Arc::new(certificates.server_config()?)),
            cluster,
            limits,
        })
    }

    /// Serves reviews until `shutdown` completes. Connections already accepted are left to
    /// finish on their own (each ends with its client or its timeouts).
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let Server {
            listener,
            acceptor,
            cluster,
            limits,
        } = self;
        let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, usually: pause rather than spin.
                    tracing::warn!(error = %Error::Webhook(e), "accepting a webhook connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "webhook connection refused: too many open");
                continue;
            };
            let acceptor = acceptor.clone();
            let cluster = cluster.clone();
            let limits = limits.clone();
            tokio::spawn(async move {
                let _slot = slot;
                connection(tcp, peer, acceptor, cluster, limits).await;
            });
        }
    }
}

/// One connection: the handshake (bounded), then HTTP/1.1 requests until the client closes.
async fn connection(
    tcp: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    acceptor: TlsAcceptor,
    cluster: Arc<dyn Cluster>,
    limits: Limits,
) {
    let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "webhook TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "webhook TLS handshake timed out");
            return;
        }
    };
    let (max_body, body_timeout) = (limits.max_body, limits.body_timeout);
    let service = hyper::service::service_fn(move |request| {
        let cluster = cluster.clone();
        async move {
            Ok::<_, Infallible>(handle(request, cluster.as_ref(), max_body, body_timeout).await)
        }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.handshake_timeout)
        .serve_connection(TokioIo::new(tls), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "webhook connection ended with an error");
    }
}

fn plain(status: StatusCode, message: impl Into<String>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(message.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// How much of a body past the bound is still read (and dropped) before the 413 goes out: a
/// server that closes a socket with unread data makes the kernel reset the connection, and the
/// client would see the reset instead of the reason. Larger bodies are cut off at once.
const DRAIN_BYTES: usize = 1 << 20;

/// The body if it is at most `max_body` bytes, `None` if it is larger (read on up to
/// [`DRAIN_BYTES`] past the bound, dropping it, so the refusal reaches the client).
async fn read_body(mut body: Incoming, max_body: usize) -> hyper::Result<Option<Bytes>> {
    let mut kept = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        seen = seen.saturating_add(data.len());
        if seen <= max_body {
            kept.extend_from_slice(&data);
        } else if seen > max_body + DRAIN_BYTES {
            return Ok(None);
        }
    }
    Ok((seen <= max_body).then(|| Bytes::from(kept)))
}

/// One request: the route and method, the size bound (from `Content-Length` before reading,
/// and while reading for a chunked body), then [`answer`].
async fn handle(
    request: Request<Incoming>,
    cluster: &dyn Cluster,
    max_body: usize,
    body_timeout: Duration,
) -> Response<Full<Bytes>> {
    if request.uri().path() != PATH {
        return plain(StatusCode::NOT_FOUND, format!("only {PATH} is served\n"));
    }
    if request.method() != Method::POST {
        let mut response = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{PATH} takes POST\n"),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return response;
    }
    let too_large = || {
        plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("an AdmissionReview is at most {max_body} bytes\n"),
        )
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > (max_body + DRAIN_BYTES) as u64) {
        return too_large();
    }
    let read = tokio::time::timeout(body_timeout, read_body(request.into_body(), max_body));
    let body = match read.await {
        Err(_) => {
            let mut response = plain(
                StatusCode::REQUEST_TIMEOUT,
                format!("the body did not arrive within {body_timeout:?}\n"),
            );
            response.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            return response;
        }
        Ok(Ok(Some(body))) => body,
        Ok(Ok(None)) => return too_large(),
        Ok(Err(e)) => {
            return plain(StatusCode::BAD_REQUEST, format!("reading the body: {e}\n"));
        }
    };
    let reply = answer(&body, cluster);
    let mut response = Response::new(Full::new(Bytes::from(reply.body)));
    *response.status_mut() = reply.status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(reply.content_type),
    );
    response
}
