//! Overlay networks across nodes (issue 26): which forwarding entries each of this node's VXLAN
//! segments must hold, computed from what the cluster knows of every overlay pod (its VNI, MAC
//! and node's tunnel endpoint). Pure, so the rules are tested without a kernel or an API; the
//! sync loop applies the difference.

pub mod fdb;
pub mod sync;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::netns::Kernel;

/// How often a node rewrites its segments' entries without a change announced: what puts
/// back an entry someone removed, or a write that failed.
pub const SYNC_PERIOD: Duration = Duration::from_secs(30);

/// Starts the node's overlay: the watch of the announced endpoints and the sync loop keeping
/// the segments of `kernel` in step with them and with `networks` (the driver's Networks watch;
/// `joined`: see `PodNetworks::overlay_joined`).
pub fn start<K: Kernel>(
    client: kube::Client,
    kernel: K,
    local_vtep: IpAddr,
    networks: tokio::sync::watch::Receiver<Arc<Vec<knic_proto::network::Network>>>,
    joined: Arc<Notify>,
) {
    let (tx, rx) = tokio::sync::watch::channel(None);
    tokio::spawn(crate::api::overlay::watch_endpoints(client, tx));
    tokio::spawn(sync::run(
        kernel,
        local_vtep,
        rx,
        networks,
        joined,
        SYNC_PERIOD,
    ));
}
