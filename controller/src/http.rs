//! The controller's one plain-HTTP server: `/metrics`, `/healthz`, `/readyz` on
//! `--http-address`. What each path answers is [`knic_proto::metrics::answer`], and the server
//! is the one both binaries run ([`knic_proto::metrics::server::serve`]); this binds the socket.

use tokio::net::TcpListener;

pub use knic_proto::metrics::server::{HEARTBEAT_PERIOD, serve};

/// Binds `address` (checked by [`knic_proto::metrics::listen_address`]); `None` stays
/// disabled.
pub async fn bind(address: Option<std::net::SocketAddr>) -> std::io::Result<Option<TcpListener>> {
    match address {
        Some(address) => Ok(Some(TcpListener::bind(address).await?)),
        None => Ok(None),
    }
}
