//! The KNI network runtime API on a node-local unix socket: a second door into the node's
//! networks, beside the kubelet's, calling the same prepare and attach code (see [`door`]).
//!
//! Wire-compatible with the KNI project's beta API (`knic_proto::kni`). What each call means
//! for knic:
//! - `QueryNodeNetworks`: the knic Networks and whether each is usable on this node now
//!   ([`ready`]), reasons in `extradata`;
//! - `QueryPodNetwork`: every knic interface of a pod or sandbox (DRA-attached ones included),
//!   from the checkpoint, with the MAC the kernel shows;
//! - `AttachInterface`/`DetachInterface`: a knic Network (`extradata.network`) or an inline
//!   `NetworkConfig` (`extradata.config` on `extradata.device`) into the namespace at
//!   `isolation.path`, outside DRA; idempotent by sandbox id; a device taken this way is
//!   withheld from the published slices until it is detached ([`withheld`]);
//! - `CreateNetwork`/`DeleteNetwork`: a sandbox namespace pinned under one directory ([`pin`]);
//! - `SetupNodeNetwork`: what the node lacks for knic, as the refusal's text.
//!
//! The socket is root's only (0600), requests are bounded ([`MAX_REQUEST_BYTES`], and each
//! field by [`sandbox`]'s limits), and every refusal is a gRPC status naming the field and the
//! rule.

use std::collections::BTreeSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use knic_proto::kni::{self, kni_server};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::claims::ClaimStore;
use crate::error::{Error, Result};
use crate::netns::Kernel;

pub mod addresses;
pub mod catalog;
pub mod door;
pub mod pin;
pub mod ready;
pub mod sandbox;

pub use door::{Door, Query};

/// The largest request the socket decodes: an inline config is at most 64 KiB, and the maps
/// around it are bounded too; anything larger is refused before it is read into memory.
pub const MAX_REQUEST_BYTES: usize = 256 * 1024;
/// Calls served at once; more wait (KNI callers are a node's runtime or VM manager).
pub const MAX_CONCURRENT_CALLS: usize = 16;

/// What the service needs besides the door.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The one directory `CreateNetwork` pins namespaces in.
    pub netns_dir: PathBuf,
    /// The sysfs root discovery reads (a prerequisite `SetupNodeNetwork` checks).
    pub sysfs_root: PathBuf,
    /// This node's name (answered in `extradata`).
    pub node: String,
}

/// The KNI service.
pub struct KniService<K> {
    door: Arc<Door<K>>,
    settings: Settings,
}

impl<K: Kernel> KniService<K> {
    /// Serves `door` with `settings`.
    pub fn new(door: Arc<Door<K>>, settings: Settings) -> Self {
        KniService { door, settings }
    }

    /// What the node lacks for knic: each a sentence naming the fact and where it comes from.
    pub async fn missing(&self) -> Vec<String> {
        let mut out = Vec::new();
        let uid = nix::unistd::geteuid();
        if !uid.is_root() {
            out.push(format!(
                "the driver runs as uid {uid}: moving interfaces between namespaces needs root \
                 (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
            ));
        }
        if let Err(e) = self.door.claims.snapshot().await {
            out.push(format!("the checkpoint cannot be used: {e}"));
        }
        let net = self.settings.sysfs_root.join("sys/class/net");
        if !net.is_dir() {
            out.push(format!(
                "{} is not readable: devices are discovered there (--sysfs-root)",
                net.display()
            ));
        }
        let dir = &self.settings.netns_dir;
        let usable = dir.is_dir() || dir.parent().is_some_and(Path::is_dir);
        if !usable {
            out.push(format!(
                "{} (--kni-netns-dir) does not exist and cannot be made: CreateNetwork pins \
                 sandbox namespaces there",
                dir.display()
            ));
        }
        if self.door.offered.borrow().is_empty() {
            out.push(
                "no device is offered on this node (none found, all excluded by the filter, \
                 or all withheld); `knic-driver inventory` shows what discovery sees"
                    .to_owned(),
            );
        }
        if let Err(e) = self.door.catalog.networks().await {
            out.push(format!("the knic Networks cannot be read: {e}"));
        }
        out.extend(self.door.facts.borrow().missing());
        out
    }
}

fn answer_map(
    map: std::collections::BTreeMap<String, String>,
) -> std::collections::HashMap<String, String> {
    map.into_iter().collect()
}

#[tonic::async_trait]
impl<K: Kernel> kni_server::Kni for KniService<K> {
    async fn create_network(
        &self,
        request: Request<kni::CreateNetworkRequest>,
    ) -> std::result::Result<Response<kni::CreateNetworkResponse>, Status> {
        let r = request.into_inner();
        sandbox::check_map("labels", &r.labels)?;
        sandbox::check_map("annotations", &r.annotations)?;
        sandbox::check_map("extradata", &r.extradata)?;
        let id = if r.uid.is_empty() { &r.name } else { &r.uid };
        sandbox::check_id(if r.uid.is_empty() { "name" } else { "uid" }, id)?;
        let path = pin::path_for(&self.settings.netns_dir, &r.netns_path_prefix, id)?;
        let created = tokio::task::spawn_blocking({
            let path = path.clone();
            move || pin::create(&path)
        })
        .await
        .map_err(|e| Status::internal(format!("CreateNetwork: {e}")))?
        .map_err(|e| {
            Status::failed_precondition(format!(
                "CreateNetwork: pinning a network namespace at {}: {e}",
                path.display()
            ))
        })?;
        tracing::info!(netns = %path.display(), created, "KNI CreateNetwork");
        Ok(Response::new(kni::CreateNetworkResponse {
            netns_path: path.display().to_string(),
            extradata: answer_map([("created".to_owned(), created.to_string())].into()),
        }))
    }

    async fn delete_network(
        &self,
        request: Request<kni::DeleteNetworkRequest>,
    ) -> std::result::Result<Response<kni::DeleteNetworkResponse>, Status> {
        let r = request.into_inner();
        sandbox::check_map("extradata", &r.extradata)?;
        let path = if r.netns_path.is_empty() {
            sandbox::check_id("id", &r.id)?;
            self.settings.netns_dir.join(&r.id)
        } else {
            pin::check_owned(&self.settings.netns_dir, &r.netns_path)?
        };
        let users = self.door.users_of(&path).await?;
        if !users.is_empty() {
            return Err(Status::failed_precondition(format!(
                "DeleteNetwork: {} still holds knic interfaces ({}); detach them first \
                 (DetachInterface), so their devices come home",
                path.display(),
                users.join(", ")
            )));
        }
        let removed = tokio::task::spawn_blocking({
            let path = path.clone();
            move || pin::delete(&path)
        })
        .await
        .map_err(|e| Status::internal(format!("DeleteNetwork: {e}")))?
        .map_err(|e| {
            Status::failed_precondition(format!(
                "DeleteNetwork: removing the namespace at {}: {e}",
                path.display()
            ))
        })?;
        tracing::info!(netns = %path.display(), removed, "KNI DeleteNetwork");
        Ok(Response::new(kni::DeleteNetworkResponse {}))
    }

    async fn attach_interface(
        &self,
        request: Request<kni::AttachInterfaceRequest>,
    ) -> std::result::Result<Response<kni::AttachInterfaceResponse>, Status> {
        let r = request.into_inner();
        let sandbox = sandbox::sandbox(&r.id, &r.name, &r.namespace)?;
        sandbox::check_map("labels", &r.labels)?;
        sandbox::check_map("annotations", &r.annotations)?;
        if !r.port_mappings.is_empty() {
            return Err(Status::invalid_argument(format!(
                "port_mappings: knic forwards no host ports (it gives the sandbox interfaces of \
                 its own); got {}",
                r.port_mappings.len()
            )));
        }
        let (wanted, ignored) = sandbox::wanted(&r.extradata)?;
        let isolation = r.isolation.unwrap_or_default();
        let netns = sandbox::check_netns("isolation.path", &isolation.path, &isolation.r#type)?;
        let (ipconfigs, mut extradata) = self.door.attach(&sandbox, &wanted, netns).await?;
        if !ignored.is_empty() {
            extradata.insert("ignoredExtradata".to_owned(), ignored.join(","));
        }
        Ok(Response::new(kni::AttachInterfaceResponse {
            ipconfigs: ipconfigs.into_iter().collect(),
            extradata: answer_map(extradata),
        }))
    }

    async fn detach_interface(
        &self,
        request: Request<kni::DetachInterfaceRequest>,
    ) -> std::result::Result<Response<kni::DetachInterfaceResponse>, Status> {
        let r = request.into_inner();
        sandbox::check_id("id", &r.id)?;
        sandbox::check_map("extradata", &r.extradata)?;
        // Only one of the sandbox's attachments when extradata names it; all of them otherwise.
        let only = if r.extradata.contains_key("network") || r.extradata.contains_key("config") {
            Some(sandbox::wanted(&r.extradata)?.0)
        } else {
            r.extradata
                .get("device")
                .map(|device| sandbox::Wanted::Inline {
                    device: device.clone(),
                    config: serde_json::Value::Null,
                })
        };
        self.door.detach(&r.id, only.as_ref()).await?;
        Ok(Response::new(kni::DetachInterfaceResponse {}))
    }

    async fn query_pod_network(
        &self,
        request: Request<kni::QueryPodNetworkRequest>,
    ) -> std::result::Result<Response<kni::QueryPodNetworkResponse>, Status> {
        let r = request.into_inner();
        if r.id.is_empty() && r.name.is_empty() {
            return Err(Status::invalid_argument(
                "id or name: one is required (the sandbox id or pod UID, or the pod's name)",
            ));
        }
        if !r.id.is_empty() {
            sandbox::check_id("id", &r.id)?;
        }
        let pod = if r.name.is_empty() {
            None
        } else {
            Some(sandbox::pod(&r.name, &r.namespace)?)
        };
        let query = Query {
            name: pod.as_ref().map(|(name, _)| name.clone()),
            id: (!r.id.is_empty()).then(|| r.id.clone()),
            namespace: pod.map_or_else(|| "default".to_owned(), |(_, ns)| ns),
        };
        let (ipconfigs, extradata) = self.door.query(&query).await?;
        Ok(Response::new(kni::QueryPodNetworkResponse {
            ipconfigs: ipconfigs.into_iter().collect(),
            extradata: answer_map(extradata),
        }))
    }

    async fn setup_node_network(
        &self,
        _: Request<kni::SetupNodeNetworkRequest>,
    ) -> std::result::Result<Response<kni::SetupNodeNetworkResponse>, Status> {
        let missing = self.missing().await;
        if missing.is_empty() {
            return Ok(Response::new(kni::SetupNodeNetworkResponse {}));
        }
        Err(Status::failed_precondition(format!(
            "node {} lacks what knic needs: {}",
            self.settings.node,
            missing.join("; ")
        )))
    }

    async fn query_node_networks(
        &self,
        _: Request<kni::QueryNodeNetworksRequest>,
    ) -> std::result::Result<Response<kni::QueryNodeNetworksResponse>, Status> {
        let readiness = self.door.readiness().await?;
        let networks = readiness
            .networks
            .iter()
            .map(|n| kni::Network {
                name: n.name.clone(),
                ready: n.ready,
                extradata: [
                    ("reasons".to_owned(), n.reasons.join("; ")),
                    ("freeDevices".to_owned(), n.free.join(",")),
                    ("matchingDevices".to_owned(), n.matching.join(",")),
                    ("interfacesPerPod".to_owned(), n.needed.to_string()),
                ]
                .into_iter()
                .collect(),
            })
            .collect();
        Ok(Response::new(kni::QueryNodeNetworksResponse {
            networks,
            extradata: [
                ("node".to_owned(), self.settings.node.clone()),
                ("ready".to_owned(), readiness.ready.to_string()),
                ("reasons".to_owned(), readiness.reasons.join("; ")),
            ]
            .into_iter()
            .collect(),
        }))
    }
}

/// Binds the KNI socket at `path`: root only (0600); a stale socket file is replaced, a live
/// one (another driver serving it) or a file that is no socket is an error, at start-up.
pub fn bind(path: &Path) -> Result<tokio::net::UnixListener> {
    crate::kubelet::bind_socket(path)
}

/// Serves `service` on `listener` (bound at `path` by [`bind`]) until `shutdown`, then removes
/// the socket.
pub async fn serve<K: Kernel>(
    listener: tokio::net::UnixListener,
    path: &Path,
    service: KniService<K>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    tracing::info!(socket = %path.display(), "KNI service listening");
    let server = kni_server::KniServer::new(service)
        .max_decoding_message_size(MAX_REQUEST_BYTES)
        .max_encoding_message_size(4 * 1024 * 1024);
    let served = tonic::transport::Server::builder()
        .concurrency_limit_per_connection(MAX_CONCURRENT_CALLS)
        .add_service(server)
        .serve_with_incoming_shutdown(crate::kubelet::incoming(listener), shutdown)
        .await;
    crate::kubelet::remove_socket(path);
    served.map_err(|source| Error::Grpc {
        socket: path.to_path_buf(),
        source,
    })
}

/// Keeps `out` equal to the driver's readiness facts (slices published, kubelet registration
/// acknowledged, NRI connected) as they change, until every input's sender is gone.
pub async fn follow_facts(
    mut published: watch::Receiver<bool>,
    mut registered: watch::Receiver<crate::kubelet::Registration>,
    mut nri: watch::Receiver<bool>,
    out: watch::Sender<ready::NodeFacts>,
) {
    loop {
        let now = ready::NodeFacts {
            published: Some(*published.borrow_and_update()),
            registered: Some(
                *registered.borrow_and_update() == crate::kubelet::Registration::Registered,
            ),
            nri: Some(*nri.borrow_and_update()),
        };
        out.send_if_modified(|current| {
            let changed = *current != now;
            if changed {
                *current = now;
            }
            changed
        });
        tokio::select! {
            changed = published.changed() => if changed.is_err() { return },
            changed = registered.changed() => if changed.is_err() { return },
            changed = nri.changed() => if changed.is_err() { return },
            () = out.closed() => return,
        }
    }
}

/// The devices of KNI attachments held whole, sent to `out` whenever the prepared claims change:
/// the slices' withhold set (`crate::slices::withhold`), so the scheduler never hands out a
/// device a sandbox has. Runs until `out` has no receiver or the store goes away.
pub async fn withheld(claims: Arc<ClaimStore>, out: watch::Sender<BTreeSet<String>>) {
    let mut changes = claims.subscribe();
    loop {
        match claims.snapshot().await {
            Ok(checkpoint) => {
                let now: BTreeSet<String> = checkpoint
                    .claims
                    .values()
                    .filter(|c| knic_proto::names::is_sandbox_claim_uid(&c.uid))
                    .flat_map(|c| c.devices.iter())
                    .filter(|d| d.share_id.is_none())
                    .map(|d| d.device.clone())
                    .collect();
                out.send_if_modified(|current| {
                    let changed = *current != now;
                    if changed {
                        *current = now;
                    }
                    changed
                });
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the checkpoint for KNI devices"),
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            () = out.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests;
