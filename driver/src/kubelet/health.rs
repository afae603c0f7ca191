//! The DRA resource health stream the kubelet watches (v1alpha1 for kubelets 1.34–1.36, v1 for
//! 1.37+), so a pod's status shows whether its network device is usable.
//!
//! Health is read from what the node publishes: a device whose link is up is healthy; one whose
//! link is down, has lost its lower layer or is not present is unhealthy, with the state in the
//! message, as is one tainted for a missing kernel driver or for having vanished (the taint's
//! reason is the message); one nobody set up (administratively down) is unknown; anything else (no netdev, e.g. a VF bound to vfio-pci) is unknown. A device given to
//! a pod is reported from its state when it was prepared (it is not visible from the host).
//! A full snapshot goes out at once, on every change, and every 10 s (well inside the kubelet's
//! 30 s per-device timeout), for as long as the kubelet keeps the stream open.

use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::resource::v1::Device;
use knic_proto::health::{v1, v1alpha1};
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status};

/// How often an unchanged snapshot is resent.
pub const RESEND: Duration = Duration::from_secs(10);
/// The per-device timeout announced to the kubelet.
pub const TIMEOUT_SECONDS: i64 = 30;

/// Health of one device, derived from its published attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Link up.
    Healthy,
    /// Link down, lower layer down, or not present.
    Unhealthy,
    /// No link state to judge by.
    Unknown,
}

/// Judges a device by its knic taint, if any (the same reason the slice publishes, see
/// [`crate::slices::taints`]), else by its `state` attribute (the link's operational state).
pub fn judge(device: &Device) -> (Health, String) {
    if let Some(message) = crate::slices::taints::message(device) {
        return (Health::Unhealthy, message);
    }
    if crate::slices::taints::is_admin_down(device) {
        return (
            Health::Unknown,
            "link is administratively down (set up when prepared)".into(),
        );
    }
    let state = device
        .attributes
        .as_ref()
        .and_then(|a| a.get("state"))
        .and_then(|s| s.string.clone());
    match state.as_deref() {
        Some("up") => (Health::Healthy, "link is up".into()),
        Some(s @ ("down" | "lowerlayerdown" | "notpresent")) => {
            (Health::Unhealthy, format!("link is {s}"))
        }
        Some(other) => (Health::Unknown, format!("link state {other}")),
        None => (
            Health::Unknown,
            "no link state (no network interface on the host)".into(),
        ),
    }
}

/// Serves both health API versions from the node's published devices.
#[derive(Clone)]
pub struct HealthService {
    pool: String,
    devices: watch::Receiver<Vec<Device>>,
}

impl HealthService {
    /// Health for the devices of `pool` as they are published.
    pub fn new(pool: impl Into<String>, devices: watch::Receiver<Vec<Device>>) -> Self {
        HealthService {
            pool: pool.into(),
            devices,
        }
    }

    /// Streams snapshots built by `snapshot` until the kubelet goes away.
    fn stream<T: Send + 'static>(
        &self,
        snapshot: fn(&str, &[Device], i64) -> T,
    ) -> Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>> {
        let (tx, rx) = mpsc::channel(4);
        let mut devices = self.devices.clone();
        let pool = self.pool.clone();
        tokio::spawn(async move {
            loop {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or(0);
                let message = snapshot(&pool, &devices.borrow_and_update(), now);
                if tx.send(Ok(message)).await.is_err() {
                    return;
                }
                tokio::select! {
                    changed = devices.changed() => if changed.is_err() { return },
                    () = tokio::time::sleep(RESEND) => {}
                    () = tx.closed() => return,
                }
            }
        });
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
    }
}

fn v1alpha1_snapshot(
    pool: &str,
    devices: &[Device],
    now: i64,
) -> v1alpha1::NodeWatchResourcesResponse {
    v1alpha1::NodeWatchResourcesResponse {
        devices: devices
            .iter()
            .map(|d| {
                let (health, message) = judge(d);
                v1alpha1::DeviceHealth {
                    device: Some(v1alpha1::DeviceIdentifier {
                        pool_name: pool.into(),
                        device_name: d.name.clone(),
                    }),
                    health: match health {
                        Health::Healthy => v1alpha1::HealthStatus::Healthy,
                        Health::Unhealthy => v1alpha1::HealthStatus::Unhealthy,
                        Health::Unknown => v1alpha1::HealthStatus::Unknown,
                    } as i32,
                    last_updated_time: now,
                    health_check_timeout_seconds: TIMEOUT_SECONDS,
                    message,
                }
            })
            .collect(),
    }
}

fn v1_snapshot(pool: &str, devices: &[Device], now: i64) -> v1::NodeWatchResourcesResponse {
    v1::NodeWatchResourcesResponse {
        devices: devices
            .iter()
            .map(|d| {
                let (health, message) = judge(d);
                v1::DeviceHealth {
                    device: Some(v1::DeviceIdentifier {
                        pool_name: pool.into(),
                        device_name: d.name.clone(),
                    }),
                    health: match health {
                        Health::Healthy => v1::HealthStatus::Healthy,
                        Health::Unhealthy => v1::HealthStatus::Unhealthy,
                        Health::Unknown => v1::HealthStatus::Unknown,
                    } as i32,
                    last_updated_time: now,
                    health_check_timeout_seconds: TIMEOUT_SECONDS,
                    message,
                }
            })
            .collect(),
    }
}

type Snapshots<T> = Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl v1alpha1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = Snapshots<v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        tracing::debug!("kubelet watches device health (v1alpha1)");
        Ok(Response::new(self.stream(v1alpha1_snapshot)))
    }
}

#[tonic::async_trait]
impl v1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = Snapshots<v1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        tracing::debug!("kubelet watches device health (v1)");
        Ok(Response::new(self.stream(v1_snapshot)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, state: Option<&str>) -> Device {
        let attrs = state
            .map(|s| serde_json::json!({"state": {"string": s}}))
            .unwrap_or(serde_json::json!({}));
        serde_json::from_value(serde_json::json!({"name": name, "attributes": attrs})).unwrap()
    }

    #[test]
    fn link_state_decides_health() {
        assert_eq!(judge(&device("a", Some("up"))).0, Health::Healthy);
        assert_eq!(
            judge(&device("b", Some("lowerlayerdown"))),
            (Health::Unhealthy, "link is lowerlayerdown".into())
        );
        assert_eq!(judge(&device("c", Some("dormant"))).0, Health::Unknown);
        assert_eq!(judge(&device("d", None)).0, Health::Unknown);
    }

    #[test]
    fn knic_taints_decide_health_with_their_reason() {
        use crate::slices::taints::{self, Gone};
        let mut unbound: Device = serde_json::from_value(serde_json::json!({
            "name": "pci-0000-a2-01-1",
            "attributes": {"kind": {"string": "vf"}, "pciAddress": {"string": "0000:a2:01.1"},
                "state": {"string": "up"}}
        }))
        .unwrap();
        taints::apply(std::slice::from_mut(&mut unbound));
        assert_eq!(
            judge(&unbound),
            (
                Health::Unhealthy,
                "no kernel driver is bound to the PCI function".into()
            )
        );
        let mut up = device("a", Some("up"));
        let mut gone = Gone::default();
        let t0 = std::time::SystemTime::UNIX_EPOCH;
        gone.update(&mut vec![up.clone()], &[], t0, Duration::from_secs(60));
        let mut now = Vec::new();
        gone.update(&mut now, &[], t0, Duration::from_secs(60));
        assert_eq!(
            judge(&now[0]),
            (
                Health::Unhealthy,
                "the device vanished from the node".into()
            )
        );
        taints::apply(std::slice::from_mut(&mut up));
        assert_eq!(judge(&up), (Health::Healthy, "link is up".into()));
        let mut down = device("b", Some("down"));
        taints::apply(std::slice::from_mut(&mut down));
        assert_eq!(judge(&down), (Health::Unhealthy, "link is down".into()));
    }

    #[tokio::test]
    async fn stream_sends_a_snapshot_at_once_and_on_change() {
        use futures::StreamExt;
        let (tx, rx) = watch::channel(vec![device("a", Some("up"))]);
        let service = HealthService::new("node-a", rx);
        let mut stream = service.stream(v1_snapshot);
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 1);
        assert_eq!(first.devices[0].health, v1::HealthStatus::Healthy as i32);
        assert_eq!(
            first.devices[0].device.as_ref().unwrap().pool_name,
            "node-a"
        );
        assert_eq!(first.devices[0].health_check_timeout_seconds, 30);
        tx.send_replace(vec![device("a", Some("down"))]);
        let second = tokio::time::timeout(Duration::from_secs(2), stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(second.devices[0].health, v1::HealthStatus::Unhealthy as i32);
        assert_eq!(second.devices[0].message, "link is down");
    }
}
