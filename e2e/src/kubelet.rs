//! A test kubelet: does what the real kubelet's plugin watcher and DRA manager do, over the real
//! gRPC on the real unix sockets, so the driver binary is exercised exactly as on a node.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use knic_proto::dra::{v1, v1beta1};
use knic_proto::pluginregistration as reg;
use tonic::transport::Channel;

/// Which DRA API version a call goes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraVersion {
    /// `k8s.io.kubelet.pkg.apis.dra.v1` (kubelet ≥ 1.34).
    V1,
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1` (kubelet 1.32/1.33).
    V1beta1,
}

/// A claim as the kubelet names it.
#[derive(Debug, Clone)]
pub struct ClaimId {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// One device in a prepare answer, version-independent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// Request names.
    pub request_names: Vec<String>,
    /// CDI devices the runtime must inject into every container using the claim.
    pub cdi_device_ids: Vec<String>,
    /// The consumable-capacity share the device serves (DRA v1 only; v1beta1 has none).
    pub share_id: Option<String>,
}

/// A per-claim prepare outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// Devices (empty on error).
    pub devices: Vec<Device>,
    /// Error text; empty on success.
    pub error: String,
}

/// Dials a unix socket the way the kubelet does (plain HTTP/2, no TLS): the driver's own dialer.
pub async fn dial(path: &Path) -> anyhow::Result<Channel> {
    Ok(knic_driver::kubelet::dial(path).await?)
}

/// Dials a unix socket sending exactly `authority` in every request, as grpc-go does: the
/// kubelet's plugin watcher dials the registration socket by its bare path, so its requests
/// carry the percent-encoded path ([`crate::grpcwire::grpc_go_authority`]), which HTTP/2
/// servers built on `h2` refuse unless knic's shim repairs it.
pub async fn dial_with_authority(path: &Path, authority: String) -> anyhow::Result<Channel> {
    let path = path.to_path_buf();
    Ok(tonic::transport::Endpoint::try_from("http://[::]:50051")?
        .connect_timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            let authority = authority.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    crate::grpcwire::SendsAuthority::new(stream, &authority),
                ))
            }
        }))
        .await?)
}

/// Waits for a registration socket to appear in `registry_dir`, ignoring dot files as the
/// plugin watcher does.
pub async fn discover(registry_dir: &Path, timeout: Duration) -> anyhow::Result<PathBuf> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(entries) = std::fs::read_dir(registry_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !name.starts_with('.') && name.ends_with("-reg.sock") {
                    return Ok(entry.path());
                }
            }
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "no registration socket appeared in {} within {timeout:?}",
                registry_dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A plugin the test kubelet has registered: its info and clients for both DRA versions.
pub struct Plugin {
    /// What `GetInfo` returned.
    pub info: reg::PluginInfo,
    /// The registration socket it came from.
    pub registration_socket: PathBuf,
    v1: v1::dra_plugin_client::DraPluginClient<Channel>,
    v1beta1: v1beta1::dra_plugin_client::DraPluginClient<Channel>,
    reg: reg::registration_client::RegistrationClient<Channel>,
    channel: Channel,
}

/// Runs the kubelet's registration sequence: GetInfo (1 s timeout), validate, dial the endpoint,
/// NotifyRegistrationStatus(true). Like the kubelet, it retries from the start while the socket
/// refuses connections (a stale file from a killed driver is replaced moments later).
pub async fn register(registry_dir: &Path) -> anyhow::Result<Plugin> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match register_once(registry_dir).await {
            Ok(plugin) => return Ok(plugin),
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn register_once(registry_dir: &Path) -> anyhow::Result<Plugin> {
    let socket = discover(registry_dir, Duration::from_secs(20)).await?;
    // As the real kubelet: the registration socket by its bare path (grpc-go's percent-encoded
    // authority), the DRA endpoint as a `unix:` target (grpc-go sends "localhost").
    let authority = crate::grpcwire::grpc_go_authority(&socket);
    let mut reg = reg::registration_client::RegistrationClient::new(
        dial_with_authority(&socket, authority).await?,
    );
    let mut request = tonic::Request::new(reg::InfoRequest {});
    request.set_timeout(Duration::from_secs(1));
    let info = reg.get_info(request).await.context("GetInfo")?.into_inner();
    if info.r#type != "DRAPlugin" {
        bail!("plugin type {:?} is not DRAPlugin", info.r#type);
    }
    if !Path::new(&info.endpoint).is_absolute() {
        bail!("endpoint {:?} is not absolute", info.endpoint);
    }
    if info.supported_versions.first().map(String::as_str) != Some("v1.DRAPlugin") {
        // kubelets ≥ 1.34 take the first DRAPlugin entry they support.
        bail!(
            "supported_versions {:?} must lead with v1.DRAPlugin",
            info.supported_versions
        );
    }
    let channel = dial_with_authority(Path::new(&info.endpoint), "localhost".into()).await?;
    reg.notify_registration_status(reg::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .context("NotifyRegistrationStatus")?;
    Ok(Plugin {
        info,
        registration_socket: socket,
        v1: v1::dra_plugin_client::DraPluginClient::new(channel.clone()),
        v1beta1: v1beta1::dra_plugin_client::DraPluginClient::new(channel.clone()),
        reg,
        channel,
    })
}

impl Plugin {
    /// Tells the plugin the kubelet rejected it, as a kubelet does on a validation failure.
    pub async fn reject(&mut self, error: &str) -> Result<(), tonic::Status> {
        self.reg
            .notify_registration_status(reg::RegistrationStatus {
                plugin_registered: false,
                error: error.into(),
            })
            .await
            .map(|_| ())
    }

    /// The first snapshot of the health stream, as `(device, health, message)`: `v1` selects
    /// the 1.37 service, otherwise v1alpha1 (kubelets 1.34–1.36).
    pub async fn health(&self, v1: bool) -> anyhow::Result<Vec<(String, i32, String)>> {
        use knic_proto::health;
        /// One body for both versions' generated types.
        macro_rules! first_snapshot {
            ($api:ident) => {{
                let mut client =
                    health::$api::dra_resource_health_client::DraResourceHealthClient::new(
                        self.channel.clone(),
                    );
                let mut request = tonic::Request::new(health::$api::NodeWatchResourcesRequest {});
                request.set_timeout(Duration::from_secs(10));
                let mut stream = client.node_watch_resources(request).await?.into_inner();
                let first = stream.message().await?.context("health stream ended")?;
                first
                    .devices
                    .into_iter()
                    .map(|d| {
                        let device = d.device.map(|i| i.device_name).unwrap_or_default();
                        (device, d.health, d.message)
                    })
                    .collect()
            }};
        }
        Ok(if v1 {
            first_snapshot!(v1)
        } else {
            first_snapshot!(v1alpha1)
        })
    }

    /// NodePrepareResources over the chosen version; fails only on a gRPC error.
    pub async fn prepare(
        &self,
        version: DraVersion,
        claims: &[ClaimId],
    ) -> anyhow::Result<HashMap<String, Prepared>> {
        /// `share_id` exists in v1 only (kubelet 1.35+).
        macro_rules! share_id {
            (v1, $d:expr) => {
                $d.share_id.clone()
            };
            (v1beta1, $d:expr) => {
                None
            };
        }
        /// The versions' messages are alike but distinct generated types: one body for both.
        macro_rules! prepare {
            ($api:ident, $client:expr) => {{
                let claims = claims.iter().map(|c| $api::Claim {
                    namespace: c.namespace.clone(),
                    uid: c.uid.clone(),
                    name: c.name.clone(),
                });
                let request = $api::NodePrepareResourcesRequest {
                    claims: claims.collect(),
                };
                let mut client = $client.clone();
                let response = client
                    .node_prepare_resources(with_timeout(request))
                    .await?
                    .into_inner();
                response
                    .claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let devices = r
                            .devices
                            .into_iter()
                            .map(|d| Device {
                                share_id: share_id!($api, d),
                                pool: d.pool_name,
                                device: d.device_name,
                                request_names: d.request_names,
                                cdi_device_ids: d.cdi_device_ids,
                            })
                            .collect();
                        let error = r.error;
                        (uid, Prepared { devices, error })
                    })
                    .collect()
            }};
        }
        Ok(match version {
            DraVersion::V1 => prepare!(v1, self.v1),
            DraVersion::V1beta1 => prepare!(v1beta1, self.v1beta1),
        })
    }

    /// NodeUnprepareResources; returns each claim's error text (empty = success).
    pub async fn unprepare(
        &self,
        version: DraVersion,
        claims: &[ClaimId],
    ) -> anyhow::Result<HashMap<String, String>> {
        /// As in [`Plugin::prepare`]: one body for both versions' generated types.
        macro_rules! unprepare {
            ($api:ident, $client:expr) => {{
                let claims = claims.iter().map(|c| $api::Claim {
                    namespace: c.namespace.clone(),
                    uid: c.uid.clone(),
                    name: c.name.clone(),
                });
                let request = $api::NodeUnprepareResourcesRequest {
                    claims: claims.collect(),
                };
                let mut client = $client.clone();
                client
                    .node_unprepare_resources(with_timeout(request))
                    .await?
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|(uid, r)| (uid, r.error))
                    .collect()
            }};
        }
        Ok(match version {
            DraVersion::V1 => unprepare!(v1, self.v1),
            DraVersion::V1beta1 => unprepare!(v1beta1, self.v1beta1),
        })
    }
}

/// The kubelet's 45 s default deadline on every DRA call.
fn with_timeout<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(Duration::from_secs(45));
    request
}
