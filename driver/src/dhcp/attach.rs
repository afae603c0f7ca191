//! The DHCP step of an attach and of a detach, against the executor's [`Session`]: get a lease
//! for the pod's interface (bounded by the claim's `timeoutSeconds`), put its address, MTU and
//! default route on through the same rtnetlink session as every other setting, and give it
//! back. A step that fails after the lease was granted releases it before failing, so a
//! failed attach leaves neither a half-configured interface (the attach's own undo takes the
//! device out of the pod, which flushes what was added) nor a lease on the server.

use std::time::Duration;

use knic_proto::netconfig::{Cidr, Route};

use super::client::{self, Transport};
use super::keeper::Opener;
use super::{Lease, MAX_TIMEOUT, now_unix};
use crate::error::{Error, Result};
use crate::netns::{LinkChange, Ns, Session};

/// What `addressing: {mode: dhcp}` asks of the attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DhcpStep {
    /// How long the lease may take.
    pub timeout: Duration,
    /// Install the router option as the default route.
    pub default_route: bool,
    /// Apply the interface-MTU option (ignored when the claim fixes the MTU).
    pub use_mtu: bool,
    /// The claim's own `interface.mtu`, which wins over the server's.
    pub fixed_mtu: Option<u32>,
    /// The routing table of the interface's VRF, where its default route goes; `None`: main.
    pub table: Option<u32>,
}

/// The metric of a lease's default route in main: a pod has its cluster interface's default
/// route there already (metric 0), and a second one with the same key would be refused (and,
/// since a repeated add must succeed, silently not installed). Beside it, it carries what the
/// cluster route does not reach only once that one is gone; a workload that needs the DHCP
/// router for its own traffic binds to the interface or uses a VRF (where the route is the
/// table's only default, with no metric).
pub const DEFAULT_ROUTE_METRIC: u32 = 1024;

/// The default route a lease's router gives, in `table` (a VRF's) or main at
/// [`DEFAULT_ROUTE_METRIC`].
pub fn default_route(lease: &Lease, table: Option<u32>) -> Option<Route> {
    Some(Route {
        destination: Cidr {
            addr: std::net::Ipv4Addr::UNSPECIFIED.into(),
            prefix_len: 0,
        },
        gateway: Some(lease.router?.into()),
        source: None,
        metric: table.is_none().then_some(DEFAULT_ROUTE_METRIC),
        table,
    })
}

/// Gets a lease for `ifname` (already up in the pod) and configures it. The error names the
/// interface and what the server did: no offer, a NAK with its message, an unusable ACK.
pub async fn obtain<S: Session, O: Opener>(
    pod: &mut S,
    opener: &O,
    netns: &Ns,
    ifname: &str,
    mac: [u8; 6],
    step: DhcpStep,
) -> Result<Lease> {
    let what = format!("getting a DHCP lease for {ifname}");
    let timeout = step.timeout.min(MAX_TIMEOUT);
    let started = std::time::Instant::now();
    let mut transport = opener
        .open()
        .await
        .map_err(|e| Error::kernel(netns, &what, e.to_string()))?;
    let lease = client::acquire(&mut transport, mac, timeout, now_unix())
        .await
        .map_err(|f| Error::kernel(netns, &what, format!("{f} within {} s", timeout.as_secs())))?;
    tracing::info!(%netns, ifname, address = %lease.cidr(), server = %lease.server,
        lease_seconds = lease.lease_seconds, took_ms = started.elapsed().as_millis() as u64,
        "DHCP lease obtained");
    if let Err(e) = configure(pod, ifname, &lease, step).await {
        give_back(&mut transport, netns, ifname, &lease).await;
        return Err(e);
    }
    Ok(lease)
}

async fn configure<S: Session>(
    pod: &mut S,
    ifname: &str,
    lease: &Lease,
    step: DhcpStep,
) -> Result<()> {
    if step.use_mtu
        && step.fixed_mtu.is_none()
        && let Some(mtu) = lease.mtu.filter(|m| *m >= 68)
    {
        let change = LinkChange {
            mtu: Some(u32::from(mtu)),
            ..LinkChange::default()
        };
        pod.set_link(ifname, &change).await?;
    }
    pod.add_addresses(ifname, &[lease.cidr()]).await?;
    if step.default_route
        && let Some(route) = default_route(lease, step.table)
    {
        pod.add_routes(ifname, &[route]).await?;
    }
    Ok(())
}

async fn give_back<T: Transport>(transport: &mut T, netns: &Ns, ifname: &str, lease: &Lease) {
    if let Err(f) = client::release(transport, lease).await {
        tracing::warn!(%netns, ifname, address = %lease.address, error = %f,
            "could not release the DHCP lease of a failed attach; it runs out on the server");
    }
}

/// Releases `lease` from the pod's interface (detach, or unprepare after a crash). A pod
/// namespace or interface that is gone cannot send it: that is reported, not retried forever.
pub async fn release<O: Opener>(opener: &O, netns: &Ns, ifname: &str, lease: &Lease) -> Result<()> {
    let what = format!("releasing the DHCP lease {} of {ifname}", lease.address);
    let mut transport = opener
        .open()
        .await
        .map_err(|e| Error::kernel(netns, &what, e.to_string()))?;
    client::release(&mut transport, lease)
        .await
        .map_err(|f| Error::kernel(netns, &what, f.to_string()))?;
    tracing::info!(%netns, ifname, address = %lease.address, server = %lease.server, "DHCP lease released");
    Ok(())
}
