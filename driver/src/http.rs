//! The driver's one plain-HTTP server: `/metrics`, `/healthz`, `/readyz` on `--http-address`
//! (the DaemonSet runs with the host network, so the port is the node's). What each path
//! answers is [`knic_proto::metrics::answer`]; this is only the socket.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use knic_proto::metrics::{Gauge, Health, Registry, answer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::{Error, Result};

/// How often the heartbeat behind `/healthz` is renewed.
pub const HEARTBEAT_PERIOD: Duration = Duration::from_secs(1);

/// Binds `address` (checked by [`knic_proto::metrics::listen_address`]); `None` stays
/// disabled.
pub async fn bind(
    setting: &'static str,
    address: Option<std::net::SocketAddr>,
) -> Result<Option<TcpListener>> {
    let Some(address) = address else {
        return Ok(None);
    };
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| Error::Setting {
            setting,
            reason: format!("cannot listen on {address}: {e}"),
        })?;
    Ok(Some(listener))
}

/// Serves until `stop` turns true, and renews `health`'s heartbeat meanwhile.
pub async fn serve(
    listener: TcpListener,
    registry: &'static Registry,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) {
    let ticker = {
        let health = health.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(HEARTBEAT_PERIOD);
            loop {
                tick.tick().await;
                health.heartbeat.beat();
            }
        })
    };
    if let Ok(local) = listener.local_addr() {
        tracing::info!(address = %local, "HTTP server listening (/metrics, /healthz, /readyz)");
    }
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "HTTP accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let health = health.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let a = answer(req.method().as_str(), req.uri().path(), registry, &health);
                let head = req.method() == http::Method::HEAD;
                async move {
                    let mut resp = http::Response::new(if head { String::new() } else { a.body });
                    *resp.status_mut() = http::StatusCode::from_u16(a.status)
                        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
                    resp.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static(a.content_type),
                    );
                    Ok::<_, Infallible>(resp)
                }
            });
            // A scrape is small: a slow or idle client must not hold a connection forever.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(Duration::from_secs(60), conn).await;
        });
    }
    ticker.abort();
}

/// Keeps `condition` of `health` (and `gauge`, as 0 or 1) equal to `holds` of every value
/// `rx` sees, until its sender is dropped.
pub fn mirror<T: Send + Sync + 'static>(
    health: Arc<Health>,
    condition: &'static str,
    mut rx: watch::Receiver<T>,
    holds: impl Fn(&T) -> bool + Send + 'static,
    gauge: Option<Gauge<0>>,
) {
    tokio::spawn(async move {
        loop {
            let now = holds(&rx.borrow_and_update());
            health.readiness.set(condition, now);
            if let Some(g) = &gauge {
                g.set([], if now { 1.0 } else { 0.0 });
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
}
