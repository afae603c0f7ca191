//! The driver's one plain-HTTP server: `/metrics`, `/healthz`, `/readyz` on `--http-address`
//! (the DaemonSet runs with the host network, so the port is the node's). What each path
//! answers is [`knic_proto::metrics::answer`] and the server is
//! [`knic_proto::metrics::server::serve`] (re-exported here); this binds the socket.

use std::sync::Arc;

use knic_proto::metrics::{Gauge, Health};
use tokio::net::TcpListener;

pub use knic_proto::metrics::server::{HEARTBEAT_PERIOD, serve};
use tokio::sync::watch;

use crate::{Error, Result};

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
