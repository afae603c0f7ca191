//! What `/metrics`, `/healthz` and `/readyz` answer, decided without I/O so both binaries'
//! HTTP servers (each in its own crate, over hyper) answer alike and tests need no socket.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{CONTENT_TYPE, Readiness, Registry};

/// A timestamp a ticker task renews: `/healthz` fails when it stops, because then the async
/// runtime no longer runs the process's tasks even if the HTTP server still answers.
#[derive(Debug)]
pub struct Heartbeat {
    start: Instant,
    last_ms: AtomicU64,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat::new()
    }
}

impl Heartbeat {
    /// A heartbeat that just beat.
    pub fn new() -> Heartbeat {
        Heartbeat {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    /// Records a beat now.
    pub fn beat(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Time since the last beat.
    pub fn age(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// What the liveness and readiness endpoints look at.
#[derive(Debug)]
pub struct Health {
    /// The conditions `/readyz` needs.
    pub readiness: Readiness,
    /// Renewed by the process's ticker.
    pub heartbeat: Heartbeat,
    /// A heartbeat older than this fails `/healthz`.
    pub stall_after: Duration,
}

impl Health {
    /// Health with these readiness conditions, all unmet, and a fresh heartbeat.
    pub fn new(conditions: &[&str], stall_after: Duration) -> Health {
        Health {
            readiness: Readiness::new(conditions),
            heartbeat: Heartbeat::new(),
            stall_after,
        }
    }
}

/// Checks an `--http-address` value: an `address:port` to listen on, or the empty string,
/// which disables the server (`None`).
pub fn listen_address(value: &str) -> crate::Result<Option<std::net::SocketAddr>> {
    if value.is_empty() {
        return Ok(None);
    }
    value.parse().map(Some).map_err(|_| {
        crate::Error::Rule(format!(
            "{value:?} is not an address:port to listen on (such as 0.0.0.0:9461 or \
             [::]:9461); the empty string disables the server"
        ))
    })
}

/// One HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: String,
}

const TEXT: &str = "text/plain; charset=utf-8";

fn text(status: u16, body: impl Into<String>) -> Answer {
    Answer {
        status,
        content_type: TEXT,
        body: body.into(),
    }
}

/// The answer to `method path`: `/metrics` (the exposition), `/healthz` (200 while the
/// heartbeat is fresh), `/readyz` (200 when every condition holds, else 503 naming the missing
/// ones); HEAD answers like GET, other methods 405, other paths 404.
pub fn answer(method: &str, path: &str, registry: &Registry, health: &Health) -> Answer {
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return text(
            404,
            format!("not found: {path} (try /metrics, /healthz, /readyz)\n"),
        );
    }
    if !matches!(method, "GET" | "HEAD") {
        return text(405, format!("method {method} not allowed: use GET\n"));
    }
    match path {
        "/metrics" => Answer {
            status: 200,
            content_type: CONTENT_TYPE,
            body: registry.render(),
        },
        "/healthz" => {
            let age = health.heartbeat.age();
            if age > health.stall_after {
                text(
                    503,
                    format!(
                        "event loop stalled: no heartbeat for {}s (limit {}s)\n",
                        age.as_secs(),
                        health.stall_after.as_secs()
                    ),
                )
            } else {
                text(200, "ok\n")
            }
        }
        _ => {
            let (ready, body) = health.readiness.report();
            text(if ready { 200 } else { 503 }, body)
        }
    }
}
