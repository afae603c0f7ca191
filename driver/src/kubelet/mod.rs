//! The kubelet plugin: the registration socket the kubelet's plugin watcher finds, and the DRA
//! socket it then calls for prepare/unprepare.
//!
//! Both sockets accept every `:authority` real clients send (see [`authority`]).
//!
//! Every per-claim error leaves through [`DraService`], the one place bounds are enforced: a
//! claim's namespace and name must be DNS names before any API request is built from them, and
//! each claim's error text is cut to [`MAX_CLAIM_ERROR_BYTES`] (all of a response's errors to
//! about [`MAX_RESPONSE_ERROR_BYTES`]), so one claim with a huge invalid config is that claim's
//! error, never a response over the kubelet's 4 MiB gRPC message limit that fails the whole
//! call.
//!
//! Order matters and is the Go helper's: the DRA service listens first, registration second,
//! because the kubelet may call prepare right after `GetInfo`. On shutdown the registration
//! socket goes first (the kubelet deregisters the plugin) and the DRA socket last.

use std::collections::HashMap;
use std::future::Future;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use knic_proto::dra::{v1, v1beta1};
use knic_proto::pluginregistration as reg;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use self::authority::AuthorityShim;
use crate::bounded;
use crate::claims::{ClaimRef, PreparedAnswer, Preparer};
use crate::error::{Error, Result};
use crate::events::{EventSink, NoEvents, Warning};
use crate::metrics::metrics;

pub mod authority;
pub mod health;
pub mod hpack;

/// The gRPC services advertised in `GetInfo`, most preferred first: kubelets ≥ 1.34 take the
/// first DRAPlugin entry they support, so v1 must lead; the health services follow (1.37+
/// kubelets start the health stream only when it is advertised).
pub const SUPPORTED_VERSIONS: [&str; 4] = [
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
];
/// Plugin type the kubelet's plugin watcher routes to its DRA handler.
pub const PLUGIN_TYPE: &str = "DRAPlugin";

/// How much of a refused namespace or name an error quotes (a valid one is at most 253 bytes).
const MAX_ECHOED_BYTES: usize = 256;

/// The most bytes of one claim's error text in a prepare or unprepare answer: room for hundreds
/// of field errors, so the first problems are always readable, at 1/256 of the kubelet's 4 MiB
/// message limit.
pub const MAX_CLAIM_ERROR_BYTES: usize = 16 * 1024;
/// The error bytes one answer carries before later claims' errors (in uid order) are cut to
/// [`MIN_CLAIM_ERROR_BYTES`] each: a pod has few claims, but the kubelet batches whatever it
/// has, and the answer as a whole must stay far below 4 MiB (this budget, one claim's error
/// crossing it, and the floor per further claim).
pub const MAX_RESPONSE_ERROR_BYTES: usize = 1024 * 1024;
/// What a claim's error keeps once the answer's budget is spent: the start of its first
/// problem and the cut marker.
pub const MIN_CLAIM_ERROR_BYTES: usize = 512;

/// Where the two sockets live. Both are parameters because the kubelet root differs between
/// distributions and tests use temporary directories.
#[derive(Debug, Clone)]
pub struct PluginPaths {
    /// The kubelet's plugin watcher directory (`<kubelet root>/plugins_registry`).
    pub registry_dir: PathBuf,
    /// The driver's own directory (`<kubelet root>/plugins/knic.dev`): DRA socket, checkpoint.
    pub plugin_dir: PathBuf,
}

impl PluginPaths {
    /// Both directories under one kubelet root directory, with the helper's default names.
    pub fn under_kubelet_root(root: &Path) -> Self {
        PluginPaths {
            registry_dir: root.join("plugins_registry"),
            plugin_dir: root.join("plugins").join(knic_proto::DRIVER_NAME),
        }
    }

    /// The DRA service socket; its absolute path is what `GetInfo` returns.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join("dra.sock")
    }

    /// The registration socket the plugin watcher discovers.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir
            .join(format!("{}-reg.sock", knic_proto::DRIVER_NAME))
    }
}

/// What the kubelet told us in `NotifyRegistrationStatus`; observable for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// No notification yet.
    Pending,
    /// The kubelet accepted the plugin.
    Registered,
    /// The kubelet rejected the plugin with this text.
    Rejected(String),
}

struct RegistrationService {
    endpoint: String,
    status: watch::Sender<Registration>,
}

#[cfg(test)]
impl RegistrationService {
    fn for_tests() -> Self {
        RegistrationService {
            endpoint: "/dra.sock".into(),
            status: watch::channel(Registration::Pending).0,
        }
    }
}

#[tonic::async_trait]
impl reg::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> std::result::Result<Response<reg::PluginInfo>, Status> {
        tracing::debug!("kubelet called GetInfo");
        Ok(Response::new(reg::PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: knic_proto::DRIVER_NAME.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> std::result::Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(endpoint = %self.endpoint, "kubelet registered the plugin");
            self.status.send_replace(Registration::Registered);
            Ok(Response::new(reg::RegistrationStatusResponse {}))
        } else {
            tracing::error!(error = %status.error, "kubelet rejected the plugin registration");
            self.status
                .send_replace(Registration::Rejected(status.error.clone()));
            Err(Status::failed_precondition(format!(
                "plugin registration rejected by the kubelet: {}",
                status.error
            )))
        }
    }
}

/// Serves both DRA API versions from one [`Preparer`].
#[derive(Clone)]
pub struct DraService {
    preparer: Arc<Preparer>,
    events: Arc<dyn EventSink>,
}

impl DraService {
    /// One handler for every API version.
    pub fn new(preparer: Arc<Preparer>) -> Self {
        DraService {
            preparer,
            events: Arc::new(NoEvents),
        }
    }

    /// Reports every failed prepare as an Event on the claim and its pods.
    pub fn with_events(mut self, events: Arc<dyn EventSink>) -> Self {
        self.events = events;
        self
    }

    /// The version-independent prepare: v1 types are the superset, v1beta1 converts.
    pub async fn prepare(&self, claims: Vec<v1::Claim>) -> v1::NodePrepareResourcesResponse {
        let started = std::time::Instant::now();
        let (refs, mut out) = check_claims(&claims, |error| v1::NodePrepareResourceResponse {
            devices: vec![],
            error,
        });
        let mut failed = !out.is_empty();
        for (uid, outcome) in self.preparer.prepare(&refs).await {
            let m = metrics();
            m.claims.inc(["prepare", crate::metrics::result(&outcome)]);
            let entry = match outcome {
                Ok(devices) => v1::NodePrepareResourceResponse {
                    devices: devices.into_iter().map(to_v1_device).collect(),
                    error: String::new(),
                },
                Err(e) => {
                    failed = true;
                    let error = e.to_string();
                    let error = bounded::cap_text(&error, MAX_CLAIM_ERROR_BYTES);
                    tracing::warn!(claim_uid = %uid, error = %error, "prepare failed");
                    if let Some(claim) = refs.iter().find(|r| r.uid == uid) {
                        self.events.warn(Warning {
                            claim: claim.clone(),
                            pod: None,
                            action: "PrepareResources",
                            reason: crate::events::prepare_reason(&e),
                            message: error.to_string(),
                        });
                    }
                    v1::NodePrepareResourceResponse {
                        devices: vec![],
                        error: error.into_owned(),
                    }
                }
            };
            out.insert(uid, entry);
        }
        cap_errors(&mut out, |r| &mut r.error);
        record_call("NodePrepareResources", failed, started);
        v1::NodePrepareResourcesResponse { claims: out }
    }

    /// The version-independent unprepare.
    pub async fn unprepare(&self, claims: Vec<v1::Claim>) -> v1::NodeUnprepareResourcesResponse {
        let started = std::time::Instant::now();
        let (refs, mut out) =
            check_claims(&claims, |error| v1::NodeUnprepareResourceResponse { error });
        let mut failed = !out.is_empty();
        for (uid, outcome) in self.preparer.unprepare(&refs).await {
            metrics()
                .claims
                .inc(["unprepare", crate::metrics::result(&outcome)]);
            failed |= outcome.is_err();
            let error = match outcome {
                Ok(()) => String::new(),
                Err(e) => {
                    let error = e.to_string();
                    let error = bounded::cap_text(&error, MAX_CLAIM_ERROR_BYTES);
                    tracing::warn!(claim_uid = %uid, error = %error, "unprepare failed");
                    error.into_owned()
                }
            };
            out.insert(uid, v1::NodeUnprepareResourceResponse { error });
        }
        cap_errors(&mut out, |r| &mut r.error);
        record_call("NodeUnprepareResources", failed, started);
        v1::NodeUnprepareResourcesResponse { claims: out }
    }
}

/// Counts one kubelet call: an error when any claim of it failed.
fn record_call(method: &str, failed: bool, started: std::time::Instant) {
    let m = metrics();
    let result = if failed {
        crate::metrics::ERROR
    } else {
        crate::metrics::SUCCESS
    };
    m.kubelet_requests.inc([method, result]);
    m.kubelet_duration.observe_since([method], started);
}

/// Holds every error of one answer to [`MAX_CLAIM_ERROR_BYTES`] and, in uid order, to the
/// answer's [`MAX_RESPONSE_ERROR_BYTES`], cutting the errors past it to
/// [`MIN_CLAIM_ERROR_BYTES`].
fn cap_errors<T>(out: &mut HashMap<String, T>, error: impl Fn(&mut T) -> &mut String) {
    let mut uids: Vec<String> = out.keys().cloned().collect();
    uids.sort();
    let mut spent = 0usize;
    for uid in uids {
        let Some(entry) = out.get_mut(&uid) else {
            continue;
        };
        let text = error(entry);
        let room = MAX_CLAIM_ERROR_BYTES
            .min(MAX_RESPONSE_ERROR_BYTES.saturating_sub(spent))
            .max(MIN_CLAIM_ERROR_BYTES);
        if text.len() > room {
            *text = bounded::cap_text(text, room).into_owned();
        }
        spent += text.len();
    }
}

/// Splits the request into well-formed claims and ready-made error entries for the rest, so
/// every UID the kubelet sent gets an entry. Namespace and name become path segments of an API
/// URL, so they must be what Kubernetes allows there (a DNS label and a DNS subdomain); a
/// claim breaking that is refused here, before anything reads the API.
fn check_claims<T>(
    claims: &[v1::Claim],
    error: impl Fn(String) -> T,
) -> (Vec<ClaimRef>, HashMap<String, T>) {
    let mut refs = Vec::new();
    let mut errors = HashMap::new();
    for (i, c) in claims.iter().enumerate() {
        let missing: Vec<&str> = [
            ("uid", &c.uid),
            ("namespace", &c.namespace),
            ("name", &c.name),
        ]
        .into_iter()
        .filter(|(_, v)| v.is_empty())
        .map(|(k, _)| k)
        .collect();
        if !missing.is_empty() {
            errors.insert(
                c.uid.clone(),
                error(format!(
                    "claims[{i}]: {} must not be empty",
                    missing.join(", ")
                )),
            );
            continue;
        }
        let mut problems = Vec::new();
        if !knic_proto::names::is_dns_label(&c.namespace) {
            problems.push(format!(
                "namespace {}: must be a DNS label (RFC 1123): 1 to 63 lower-case letters, \
                 digits and '-', starting and ending with a letter or digit",
                bounded::quote(&c.namespace, MAX_ECHOED_BYTES)
            ));
        }
        if let Err(e) = knic_proto::names::check_dns_subdomain(&c.name) {
            problems.push(format!(
                "name {}: must be a DNS subdomain (RFC 1123): {e}",
                bounded::quote(&c.name, MAX_ECHOED_BYTES)
            ));
        }
        if problems.is_empty() {
            refs.push(ClaimRef {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                uid: c.uid.clone(),
            });
        } else {
            tracing::warn!(claim_uid = %c.uid, problems = %problems.join("; "),
                "kubelet sent a claim reference that is not a valid name; refused");
            errors.insert(
                c.uid.clone(),
                error(format!("claims[{i}]: {}", problems.join("; "))),
            );
        }
    }
    (refs, errors)
}

fn to_v1_device(d: PreparedAnswer) -> v1::Device {
    v1::Device {
        request_names: d.request_names,
        pool_name: d.pool,
        device_name: d.device,
        cdi_device_ids: d.cdi_device_ids,
        share_id: d.share_id,
    }
}

fn claims_from_v1beta1(claims: Vec<v1beta1::Claim>) -> Vec<v1::Claim> {
    claims
        .into_iter()
        .map(|c| v1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> std::result::Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        Ok(Response::new(
            self.prepare(request.into_inner().claims).await,
        ))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> std::result::Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        Ok(Response::new(
            self.unprepare(request.into_inner().claims).await,
        ))
    }
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> std::result::Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let answer = self
            .prepare(claims_from_v1beta1(request.into_inner().claims))
            .await;
        let claims = answer
            .claims
            .into_iter()
            .map(|(uid, r)| {
                let devices = r
                    .devices
                    .into_iter()
                    // v1beta1 has no share_id: a shared device cannot be described to an old
                    // kubelet, which also cannot have allocated one.
                    .map(|d| v1beta1::Device {
                        request_names: d.request_names,
                        pool_name: d.pool_name,
                        device_name: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                    })
                    .collect();
                (
                    uid,
                    v1beta1::NodePrepareResourceResponse {
                        devices,
                        error: r.error,
                    },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> std::result::Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let answer = self
            .unprepare(claims_from_v1beta1(request.into_inner().claims))
            .await;
        let claims = answer
            .claims
            .into_iter()
            .map(|(uid, r)| {
                (
                    uid,
                    v1beta1::NodeUnprepareResourceResponse { error: r.error },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

/// Dials a plugin socket the way the kubelet does: plain HTTP/2 over a unix socket, no TLS.
pub async fn dial(path: &Path) -> Result<tonic::transport::Channel> {
    let path = path.to_path_buf();
    let target = path.clone();
    tonic::transport::Endpoint::try_from("http://[::]:50051")
        .map_err(|e| Error::Grpc {
            socket: target.clone(),
            source: e,
        })?
        .connect_timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .map_err(|e| Error::Grpc {
            socket: target,
            source: e,
        })
}

/// Binds a root-only unix socket, removing a stale file first but never a live socket: a second
/// driver instance on the same path is an error, not something to silently take over.
pub(crate) fn bind_socket(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(Error::Setting {
                    setting: "socket",
                    reason: format!("{} is served by another running process", path.display()),
                });
            }
            std::fs::remove_file(path)
                .map_err(|e| Error::io(format!("removing stale socket {}", path.display()), e))?;
            tracing::info!(socket = %path.display(), "removed stale socket");
        }
        Ok(_) => {
            return Err(Error::Setting {
                setting: "socket",
                reason: format!(
                    "{} exists and is not a socket; refusing to replace it",
                    path.display()
                ),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("inspecting {}", path.display()), e)),
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| Error::io(format!("binding {}", path.display()), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io(format!("restricting {} to root", path.display()), e))?;
    Ok(listener)
}

/// The connections a listener accepts, each behind the authority shim.
pub(crate) fn incoming(
    listener: UnixListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<AuthorityShim<UnixStream>>> {
    UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityShim::new))
}

pub(crate) fn remove_socket(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(socket = %path.display(), "socket removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(socket = %path.display(), error = %e, "cannot remove socket"),
    }
}

/// Serves the DRA and registration sockets until `shutdown` completes, then deregisters and
/// removes both sockets. `registration` reports what the kubelet said.
pub async fn serve(
    paths: &PluginPaths,
    service: DraService,
    health: crate::kubelet::health::HealthService,
    registration: watch::Sender<Registration>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let dra_path = paths.dra_socket();
    let reg_path = paths.registration_socket();
    let endpoint = std::path::absolute(&dra_path)
        .map_err(|e| Error::io(format!("resolving {}", dra_path.display()), e))?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };

    let dra_listener = bind_socket(&dra_path)?;
    let dra_server = tonic::transport::Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::new(service.clone()))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(service))
        .add_service(
            knic_proto::health::v1::dra_resource_health_server::DraResourceHealthServer::new(
                health.clone(),
            ),
        )
        .add_service(
            knic_proto::health::v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                health,
            ),
        )
        .serve_with_incoming_shutdown(incoming(dra_listener), stopped(stop_rx.clone()));
    let mut dra_task = tokio::spawn(dra_server);
    tracing::info!(socket = %dra_path.display(), "DRA service listening (v1, v1beta1)");

    let reg_listener = match bind_socket(&reg_path) {
        Ok(l) => l,
        Err(e) => {
            let _ = stop_tx.send(true);
            let _ = dra_task.await;
            remove_socket(&dra_path);
            return Err(e);
        }
    };
    let reg_service = RegistrationService {
        endpoint: endpoint.to_string_lossy().into_owned(),
        status: registration,
    };
    let reg_server = tonic::transport::Server::builder()
        .add_service(reg::registration_server::RegistrationServer::new(
            reg_service,
        ))
        .serve_with_incoming_shutdown(incoming(reg_listener), stopped(stop_rx));
    let mut reg_task = tokio::spawn(reg_server);
    tracing::info!(socket = %reg_path.display(), "registration socket listening");

    let failure = tokio::select! {
        () = shutdown => None,
        r = &mut dra_task => Some((dra_path.clone(), r)),
        r = &mut reg_task => Some((reg_path.clone(), r)),
    };
    // Deregister first: the kubelet stops routing calls once the registration socket is gone.
    remove_socket(&reg_path);
    let _ = stop_tx.send(true);
    let grace = Duration::from_secs(5);
    if !reg_task.is_finished() {
        let _ = tokio::time::timeout(grace, &mut reg_task).await;
    }
    if !dra_task.is_finished() {
        let _ = tokio::time::timeout(grace, &mut dra_task).await;
    }
    remove_socket(&dra_path);
    match failure {
        None => Ok(()),
        Some((socket, Ok(Err(source)))) => Err(Error::Grpc { socket, source }),
        Some((socket, Ok(Ok(())))) => Err(Error::Setting {
            setting: "socket",
            reason: format!("server on {} stopped unexpectedly", socket.display()),
        }),
        Some((socket, Err(join))) => Err(Error::io(
            format!("server on {}", socket.display()),
            std::io::Error::other(join),
        )),
    }
}

#[cfg(test)]
mod bounds_tests {
    use super::*;

    const KUBELET_LIMIT: usize = 4 * 1024 * 1024;

    #[test]
    fn cap_errors_holds_each_claim_and_the_whole_answer_to_its_bound() {
        let huge = "field: bad value; ".repeat(10_000);
        let mut out: HashMap<String, String> = (0..200)
            .map(|i| (format!("uid-{i:03}"), huge.clone()))
            .collect();
        out.insert("uid-ok".into(), String::new());
        out.insert("uid-short".into(), "short".into());
        cap_errors(&mut out, |e| e);
        let total: usize = out.values().map(String::len).sum();
        // The budget, plus the claim that crossed it, plus the floor for each claim after it.
        assert!(
            total <= MAX_RESPONSE_ERROR_BYTES + MAX_CLAIM_ERROR_BYTES + 200 * MIN_CLAIM_ERROR_BYTES,
            "{total} bytes"
        );
        assert!(total < KUBELET_LIMIT / 3, "{total} bytes");
        assert!(out["uid-000"].len() <= MAX_CLAIM_ERROR_BYTES);
        assert!(out["uid-000"].len() > MAX_CLAIM_ERROR_BYTES / 2);
        // Past the budget, errors keep their start and the marker.
        assert!(out["uid-199"].len() <= MIN_CLAIM_ERROR_BYTES);
        assert!(out["uid-199"].starts_with("field: bad value"));
        assert!(out["uid-199"].ends_with(" more bytes cut)"));
        assert_eq!(out["uid-ok"], "");
        assert_eq!(out["uid-short"], "short");
    }
}
