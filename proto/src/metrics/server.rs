//! The one plain-HTTP server both binaries run for `/metrics`, `/healthz` and `/readyz`
//! (feature `server`): what each path answers is [`super::answer`]; this is only the socket,
//! with bounded connections, so a slow or idle client cannot hold one forever.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// Connections served at once: far above what scrapers and probes open, and a bound on what
/// anyone on the node's network can make the driver hold (it runs with the host network).
pub const MAX_CONNECTIONS: usize = 64;

use super::{Health, Registry, answer};

/// How often the heartbeat behind `/healthz` is renewed.
pub const HEARTBEAT_PERIOD: Duration = Duration::from_secs(1);

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
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
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
        // Over the bound the connection is closed at once, unanswered.
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let health = health.clone();
        tokio::spawn(async move {
            let _permit = permit;
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

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    async fn get(address: std::net::SocketAddr) -> std::io::Result<String> {
        let mut s = TcpStream::connect(address).await?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    /// Idle connections hold their slots; one over the bound is closed unanswered, and a
    /// freed slot serves again.
    #[tokio::test]
    async fn connections_over_the_bound_are_closed_unanswered() {
        let registry: &'static Registry = Box::leak(Box::new(Registry::new()));
        let health = Arc::new(Health::new(&[], Duration::from_secs(30)));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (_stop_tx, stop) = watch::channel(false);
        tokio::spawn(serve(listener, registry, health, stop));
        assert!(
            get(address)
                .await
                .expect("served")
                .starts_with("HTTP/1.1 200")
        );
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(TcpStream::connect(address).await.expect("connect"));
        }
        // Let the server accept them all before the next one.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let over = get(address).await.unwrap_or_default();
        assert_eq!(over, "", "the connection over the bound got an answer");
        idle.pop();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            get(address)
                .await
                .expect("served")
                .starts_with("HTTP/1.1 200")
        );
    }
}
