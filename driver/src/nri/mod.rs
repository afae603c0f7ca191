//! knic as an NRI plugin: how the driver learns when a pod's network namespace exists (so the
//! claimed interface can be moved into it) and when it goes away.
//!
//! The kubelet's DRA calls (NodePrepareResources) happen before the pod sandbox exists, so they
//! cannot touch the pod's netns. The container runtime, through NRI, calls knic right after CNI
//! set up the sandbox's network (RunPodSandbox) and again when it stops and removes it. Every
//! connection follows the same script (spec section 5): dial the runtime's socket, multiplex it
//! ([`mux`]), speak ttrpc on both logical connections ([`ttrpc`]), RegisterPlugin, answer
//! Configure with the events knic wants, collect the (possibly chunked) Synchronize, then serve
//! pod events until the runtime goes away; [`run`] then reconnects forever.
//!
//! [`runtime::TestRuntime`] is the other end, for tests and demos without containerd.

pub mod mux;
pub mod runtime;
pub mod ttrpc;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use knic_proto::nri as api;
use knic_proto::ttrpc::Status;
use prost::Message;
use tokio::net::UnixStream;
use tokio::sync::watch;

use crate::BoxFuture;
use crate::error::{Error, Result};
use mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};

/// The ttrpc service the runtime serves (knic calls RegisterPlugin on it).
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
/// The ttrpc service knic serves (the runtime calls Configure, Synchronize and pod events).
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The NRI API version knic implements, sent at registration: v0.12 is the first with the
/// dedicated RunPodSandbox/StopPodSandbox/RemovePodSandbox RPCs, which knic serves (older runtimes
/// still get StateChange answered).
pub const NRI_VERSION: &str = "v0.12.0";
/// How long knic waits for the runtime to accept its registration; NRI's default registration
/// timeout, so a runtime that accepted the socket but never answers is given up on as quickly as
/// the runtime itself would give up on knic.
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);

/// The events knic subscribes to, as ConfigureResponse.events: bit (event - 1) per event, so
/// RunPodSandbox | StopPodSandbox | RemovePodSandbox = 0b111 = 7. Nothing else: every further
/// subscription is one more call per container on the runtime's critical path.
pub const SUBSCRIBED_EVENTS: i32 = event_bit(api::Event::RunPodSandbox)
    | event_bit(api::Event::StopPodSandbox)
    | event_bit(api::Event::RemovePodSandbox);

const fn event_bit(event: api::Event) -> i32 {
    1 << (event as i32 - 1)
}

/// What knic needs to know about a pod sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSandbox {
    /// The runtime's sandbox id; the same pod gets a new one each time its sandbox is recreated.
    pub id: String,
    /// Pod name, for log lines.
    pub name: String,
    /// Kubernetes pod UID: the key that connects NRI events to the prepared claims.
    pub uid: String,
    /// Pod namespace.
    pub namespace: String,
    /// The sandbox's network namespace, `None` for host-network pods and for sandboxes the
    /// runtime has already torn down (Synchronize lists stopped ones without it, and
    /// RemovePodSandbox does not carry it).
    pub netns: Option<PathBuf>,
    /// Pod IPs from the primary CNI (NRI >= v0.8), for status reporting.
    pub ips: Vec<String>,
}

impl PodSandbox {
    /// Extracts knic's view from the runtime's message; the netns is the `network` entry of
    /// `linux.namespaces`, ignored when its path is empty.
    pub fn from_proto(pod: &api::PodSandbox) -> PodSandbox {
        let netns = pod
            .linux
            .as_ref()
            .and_then(|linux| {
                linux
                    .namespaces
                    .iter()
                    .find(|ns| ns.r#type == "network" && !ns.path.is_empty())
            })
            .map(|ns| PathBuf::from(&ns.path));
        PodSandbox {
            id: pod.id.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            netns,
            ips: pod.ips.clone(),
        }
    }

    /// The runtime's message for this pod, as [`runtime::TestRuntime`] sends it: the netns (if
    /// any) becomes the `network` namespace entry.
    pub fn to_proto(&self) -> api::PodSandbox {
        let linux = self.netns.as_ref().map(|path| api::LinuxPodSandbox {
            namespaces: vec![api::LinuxNamespace {
                r#type: "network".to_owned(),
                path: path.to_string_lossy().into_owned(),
            }],
        });
        api::PodSandbox {
            id: self.id.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            namespace: self.namespace.clone(),
            linux,
            ips: self.ips.clone(),
        }
    }
}

/// The driver's reactions to pod lifecycle events.
///
/// One pod's calls (same pod UID) arrive one at a time, in the runtime's order; calls for
/// different pods may run at the same time (see [`ttrpc::serve`]; today's containerd and CRI-O
/// send one at a time anyway); `synchronize` never overlaps a pod call. The runtime waits for
/// each call (its request timeout, 2 s by default, is logged at Configure): a call that overruns
/// makes the runtime drop the connection and let the pod run without knic, so keep them short.
pub trait NriHandler: Send + Sync + 'static {
    /// Sandbox created, network namespace exists: attach. An Err fails the sandbox (the runtime
    /// tears it down, the kubelet retries); its text is what the runtime reports.
    fn run_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, Result<()>>;
    /// Sandbox stopping: detach (the netns may be missing in the event; the handler caches it).
    fn stop_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, Result<()>>;
    /// Sandbox removed: forget it. Its netns is gone by now (the event carries none), so only
    /// bookkeeping and host-side clean-up are possible.
    fn remove_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, Result<()>>;
    /// All pods the runtime knows (after every (re)connect), to rebuild pod UID -> netns and
    /// reconcile.
    fn synchronize(&self, pods: Vec<PodSandbox>) -> BoxFuture<'_, ()>;
}

/// Where and as whom to connect to the runtime, and how eagerly to reconnect.
#[derive(Debug, Clone)]
pub struct NriSettings {
    /// The runtime's NRI socket (containerd `socket_path`, CRI-O `nri_listen`).
    pub socket: PathBuf,
    /// Name knic registers as; shows up in runtime logs.
    pub plugin_name: String,
    /// Two digits; the runtime calls plugins in ascending index order.
    pub plugin_index: String,
    /// First reconnect delay, and the delay after a connection that did register.
    pub min_backoff: Duration,
    /// Upper bound of the doubling reconnect delay.
    pub max_backoff: Duration,
}

impl Default for NriSettings {
    /// `/var/run/nri/nri.sock` (containerd's and CRI-O's default), name `knic`, index `10`: early,
    /// so the pod has its interface before plugins that inspect the network run, yet leaving
    /// 00-09 for anything that must come first. Backoff 200 ms doubling to 5 s: a pod sandbox
    /// created while knic is disconnected starts without its interface, so reconnect fast after a
    /// runtime restart.
    fn default() -> Self {
        NriSettings {
            socket: PathBuf::from("/var/run/nri/nri.sock"),
            plugin_name: "knic".to_owned(),
            plugin_index: "10".to_owned(),
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl NriSettings {
    /// Checks the rules the runtime would enforce at registration, so a bad value fails at start-up
    /// with the setting's name instead of as an endless reconnect loop.
    pub fn validate(&self) -> Result<()> {
        let idx = &self.plugin_index;
        if idx.len() != 2 || !idx.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::Setting {
                setting: "nri-plugin-index",
                reason: format!("must be exactly two digits (00-99), got {idx:?}"),
            });
        }
        let name = &self.plugin_name;
        let name_ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.+-".contains(&b));
        if !name_ok {
            return Err(Error::Setting {
                setting: "nri-plugin-name",
                reason: format!(
                    "must be one or more of the characters [a-zA-Z0-9_.+-], got {name:?}"
                ),
            });
        }
        if self.min_backoff.is_zero() || self.min_backoff > self.max_backoff {
            return Err(Error::Setting {
                setting: "nri-backoff",
                reason: format!(
                    "min_backoff ({:?}) must be above zero and at most max_backoff ({:?})",
                    self.min_backoff, self.max_backoff
                ),
            });
        }
        Ok(())
    }
}

/// Connects, registers, serves events; on any connection loss or runtime restart reconnects with
/// exponential backoff, forever, until `shutdown` becomes true.
///
/// The runtime does not retry plugins and does not wait for them: while knic is disconnected,
/// new sandboxes start without their interfaces, hence "forever" and a short first delay. The
/// delay resets after every connection that registered. Invalid settings are logged and end
/// `run` at once (call [`NriSettings::validate`] at start-up to fail the process instead); a
/// dropped `shutdown` sender counts as shutdown, so the task cannot outlive its owner.
pub async fn run<H: NriHandler>(
    settings: NriSettings,
    handler: Arc<H>,
    shutdown: watch::Receiver<bool>,
) {
    run_reporting(settings, handler, shutdown, watch::channel(false).0).await;
}

/// [`run`], keeping `connected` true exactly while knic is registered with the runtime: while it
/// is false, a sandbox started now would not reach knic, so prepare refuses (fail-closed).
pub async fn run_reporting<H: NriHandler>(
    settings: NriSettings,
    handler: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
    connected: watch::Sender<bool>,
) {
    if let Err(e) = settings.validate() {
        tracing::error!(error = %e, "NRI plugin not started");
        return;
    }
    let mut backoff = settings.min_backoff;
    loop {
        if *shutdown.borrow_and_update() {
            return;
        }
        let registered = AtomicBool::new(false);
        let result = tokio::select! {
            result = serve_connection(&settings, &handler, &registered, &connected) => result,
            _ = shutdown.wait_for(|stop| *stop) => {
                connected.send_replace(false);
                return;
            }
        };
        connected.send_replace(false);
        match result {
            Ok(()) => tracing::info!(socket = %settings.socket.display(), "NRI connection closed"),
            Err(e) => tracing::warn!(error = %e, "NRI connection failed"),
        }
        if registered.load(Ordering::Relaxed) {
            backoff = settings.min_backoff;
        }
        let delay = backoff;
        backoff = (backoff * 2).min(settings.max_backoff);
        tracing::debug!(?delay, "reconnecting to NRI");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// One connection's lifetime (used by run and by tests): returns when the connection ends.
///
/// `Ok` when the runtime closed the connection or sent Shutdown; `Err` for invalid settings, a
/// failed connect, a refused or unanswered registration, or a broken stream.
pub async fn serve_once<H: NriHandler>(settings: &NriSettings, handler: &Arc<H>) -> Result<()> {
    let connected = watch::channel(false).0;
    serve_connection(settings, handler, &AtomicBool::new(false), &connected).await
}

async fn serve_connection<H: NriHandler>(
    settings: &NriSettings,
    handler: &Arc<H>,
    registered: &AtomicBool,
    connected: &watch::Sender<bool>,
) -> Result<()> {
    settings.validate()?;
    let socket = settings.socket.display().to_string();
    let stream = UnixStream::connect(&settings.socket)
        .await
        .map_err(|e| Error::io(format!("connecting to the NRI socket {socket}"), e))?;
    let mut mux = Mux::new(stream, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
    let (Some(plugin_conn), Some(runtime_conn)) = (
        mux.open(PLUGIN_SERVICE_CONN),
        mux.open(RUNTIME_SERVICE_CONN),
    ) else {
        return Err(Error::io(
            "NRI multiplexer",
            std::io::Error::other("logical connections unavailable"),
        ));
    };
    let client = ttrpc::Client::new(runtime_conn);
    let service = Arc::new(PluginService::new(handler.clone()));
    // Serve the Plugin side from the start: the runtime may send Configure before its
    // RegisterPlugin reply reaches us.
    let serving = ttrpc::serve(plugin_conn, PLUGIN_SERVICE, service);
    tokio::pin!(serving);
    let register = client.call(
        RUNTIME_SERVICE,
        "RegisterPlugin",
        register_request(&settings.plugin_name, &settings.plugin_index).encode_to_vec(),
        REGISTRATION_TIMEOUT,
    );
    let registration = tokio::select! {
        reply = register => reply,
        ended = &mut serving => {
            let closed = mux.close().await;
            return match ended.and(closed) {
                Ok(()) => Err(Error::io(
                    format!("registering with the NRI runtime at {socket}"),
                    std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "the runtime closed the connection before answering",
                    ),
                )),
                Err(e) => Err(Error::io(format!("NRI connection to {socket}"), e)),
            };
        }
    };
    if let Err(e) = registration {
        let _ = mux.close().await;
        return Err(Error::io(
            format!("registering with the NRI runtime at {socket}"),
            std::io::Error::other(e.to_string()),
        ));
    }
    registered.store(true, Ordering::Relaxed);
    connected.send_replace(true);
    tracing::info!(
        socket = %socket,
        name = %settings.plugin_name,
        index = %settings.plugin_index,
        "registered as an NRI plugin"
    );
    let served = serving.await;
    let closed = mux.close().await;
    served
        .and(closed)
        .map_err(|e| Error::io(format!("NRI connection to {socket}"), e))
}

/// The RegisterPlugin request knic sends (exposed so tests can compare its encoding with the
/// transcript of a real plugin's).
pub fn register_request(name: &str, index: &str) -> api::RegisterPluginRequest {
    api::RegisterPluginRequest {
        plugin_name: name.to_owned(),
        plugin_idx: index.to_owned(),
        nri_version: NRI_VERSION.to_owned(),
    }
}

/// The Plugin service on one connection: forwards pod events to the handler and keeps the
/// partial Synchronize until its last chunk.
struct PluginService<H> {
    handler: Arc<H>,
    sync_pods: Mutex<Vec<PodSandbox>>,
    shutdown: AtomicBool,
}

impl<H> PluginService<H> {
    fn new(handler: Arc<H>) -> Self {
        PluginService {
            handler,
            sync_pods: Mutex::new(Vec::new()),
            shutdown: AtomicBool::new(false),
        }
    }
}

/// The key that orders one pod's events: its UID (what the handler keys its state by, and the
/// same across sandbox re-creations), else the sandbox id, so an event without a UID is still
/// ordered with its sandbox's others.
fn pod_key(pod: Option<&api::PodSandbox>) -> ttrpc::Order {
    let (uid, id) = pod.map_or(("", ""), |p| (p.uid.as_str(), p.id.as_str()));
    if uid.is_empty() {
        ttrpc::Order::Keyed(format!("sandbox {id}"))
    } else {
        ttrpc::Order::Keyed(format!("pod {uid}"))
    }
}

/// Container and update hooks: knic never subscribes to them, but a runtime that calls one anyway
/// gets the empty ("no change") answer rather than an error that could fail a container.
const IGNORED_METHODS: &[&str] = &[
    "UpdatePodSandbox",
    "PostUpdatePodSandbox",
    "CreateContainer",
    "PostCreateContainer",
    "StartContainer",
    "PostStartContainer",
    "UpdateContainer",
    "PostUpdateContainer",
    "StopContainer",
    "RemoveContainer",
    "ValidateContainerAdjustment",
];

fn decode<M: Message + Default>(method: &str, payload: &[u8]) -> std::result::Result<M, Status> {
    M::decode(payload).map_err(|e| {
        ttrpc::status(
            ttrpc::code::INVALID_ARGUMENT,
            format!("{method}: undecodable request: {e}"),
        )
    })
}

fn handler_error(event: &str, pod: &PodSandbox, error: &Error) -> Status {
    let message = error.to_string();
    tracing::warn!(
        event,
        pod = %format!("{}/{}", pod.namespace, pod.name),
        uid = %pod.uid,
        error = %message,
        "NRI event failed"
    );
    // Go's ttrpc reports a handler's plain error as Unknown with its text; the runtime shows the
    // text in the CRI error, so it reaches the kubelet's pod events.
    ttrpc::status(ttrpc::code::UNKNOWN, message)
}

impl<H: NriHandler> PluginService<H> {
    async fn pod_event(
        &self,
        event: api::Event,
        pod: Option<&api::PodSandbox>,
    ) -> std::result::Result<(), Status> {
        let pod = pod.map(PodSandbox::from_proto).unwrap_or_default();
        let name = event.as_str_name();
        tracing::debug!(event = name, uid = %pod.uid, netns = ?pod.netns, "NRI pod event");
        let started = std::time::Instant::now();
        // The hook label is the ttrpc method's name, whichever message carried the event.
        let (hook, result) = match event {
            api::Event::RunPodSandbox => (
                "RunPodSandbox",
                self.handler.run_pod_sandbox(pod.clone()).await,
            ),
            api::Event::StopPodSandbox => (
                "StopPodSandbox",
                self.handler.stop_pod_sandbox(pod.clone()).await,
            ),
            api::Event::RemovePodSandbox => (
                "RemovePodSandbox",
                self.handler.remove_pod_sandbox(pod.clone()).await,
            ),
            _ => return Ok(()),
        };
        let m = crate::metrics::metrics();
        m.nri_hooks.inc([hook, crate::metrics::result(&result)]);
        m.nri_duration.observe_since([hook], started);
        result.map_err(|error| handler_error(name, &pod, &error))
    }
}

impl<H: NriHandler> ttrpc::Service for PluginService<H> {
    /// Configure, Synchronize (every chunk) and Shutdown run alone: Synchronize rebuilds the
    /// handler's view of all pods, so no pod event may overlap it, and pod events read after it
    /// see its result. Pod events are ordered per pod; everything else only acknowledges.
    fn order(&self, method: &str, payload: &[u8]) -> ttrpc::Order {
        match method {
            "RunPodSandbox" => api::RunPodSandboxRequest::decode(payload)
                .map_or(ttrpc::Order::Free, |r| pod_key(r.pod.as_ref())),
            "StopPodSandbox" => api::StopPodSandboxRequest::decode(payload)
                .map_or(ttrpc::Order::Free, |r| pod_key(r.pod.as_ref())),
            "RemovePodSandbox" => api::RemovePodSandboxRequest::decode(payload)
                .map_or(ttrpc::Order::Free, |r| pod_key(r.pod.as_ref())),
            "StateChange" => match api::StateChangeEvent::decode(payload) {
                Ok(event)
                    if [
                        api::Event::RunPodSandbox as i32,
                        api::Event::StopPodSandbox as i32,
                        api::Event::RemovePodSandbox as i32,
                    ]
                    .contains(&event.event) =>
                {
                    pod_key(event.pod.as_ref())
                }
                _ => ttrpc::Order::Free,
            },
            "Configure" | "Synchronize" | "Shutdown" => ttrpc::Order::Exclusive,
            _ => ttrpc::Order::Free,
        }
    }

    async fn call(&self, method: &str, payload: &[u8]) -> std::result::Result<Vec<u8>, Status> {
        let empty = Vec::new();
        match method {
            "Configure" => {
                let req: api::ConfigureRequest = decode(method, payload)?;
                tracing::info!(
                    runtime = %req.runtime_name,
                    version = %req.runtime_version,
                    nri = %req.nri_version,
                    request_timeout_ms = req.request_timeout,
                    registration_timeout_ms = req.registration_timeout,
                    "NRI runtime configured knic; each pod event must finish within the request \
                     timeout"
                );
                Ok(api::ConfigureResponse {
                    events: SUBSCRIBED_EVENTS,
                }
                .encode_to_vec())
            }
            "Synchronize" => {
                let req: api::SynchronizeRequest = decode(method, payload)?;
                let pods = {
                    let mut pending = self
                        .sync_pods
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    pending.extend(req.pods.iter().map(PodSandbox::from_proto));
                    if req.more {
                        None
                    } else {
                        Some(std::mem::take(&mut *pending))
                    }
                };
                match pods {
                    // Not the last chunk: acknowledge with more=true and no updates, which is how
                    // the runtime knows knic understands chunking.
                    None => Ok(api::SynchronizeResponse { more: true }.encode_to_vec()),
                    Some(pods) => {
                        tracing::info!(pods = pods.len(), "NRI synchronize");
                        let started = std::time::Instant::now();
                        self.handler.synchronize(pods).await;
                        let m = crate::metrics::metrics();
                        m.nri_hooks.inc(["Synchronize", crate::metrics::SUCCESS]);
                        m.nri_duration.observe_since(["Synchronize"], started);
                        Ok(empty)
                    }
                }
            }
            "Shutdown" => {
                tracing::info!("NRI runtime is shutting down");
                self.shutdown.store(true, Ordering::Relaxed);
                Ok(empty)
            }
            "RunPodSandbox" => {
                let req: api::RunPodSandboxRequest = decode(method, payload)?;
                self.pod_event(api::Event::RunPodSandbox, req.pod.as_ref())
                    .await?;
                Ok(empty)
            }
            "StopPodSandbox" => {
                let req: api::StopPodSandboxRequest = decode(method, payload)?;
                self.pod_event(api::Event::StopPodSandbox, req.pod.as_ref())
                    .await?;
                Ok(empty)
            }
            "RemovePodSandbox" => {
                let req: api::RemovePodSandboxRequest = decode(method, payload)?;
                self.pod_event(api::Event::RemovePodSandbox, req.pod.as_ref())
                    .await?;
                Ok(empty)
            }
            "StateChange" => {
                let req: api::StateChangeEvent = decode(method, payload)?;
                let event = api::Event::try_from(req.event).unwrap_or(api::Event::Unknown);
                self.pod_event(event, req.pod.as_ref()).await?;
                Ok(empty)
            }
            m if IGNORED_METHODS.contains(&m) => {
                tracing::debug!(method = m, "ignoring unsubscribed NRI call");
                Ok(empty)
            }
            m => Err(ttrpc::status(
                ttrpc::code::UNIMPLEMENTED,
                format!("method {m}"),
            )),
        }
    }

    fn finished(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod concurrency_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribed_events_are_run_stop_remove() {
        assert_eq!(SUBSCRIBED_EVENTS, 7);
    }

    #[test]
    fn netns_comes_from_the_network_namespace_entry() {
        let mut proto = PodSandbox {
            id: "s".into(),
            name: "p".into(),
            uid: "u".into(),
            namespace: "ns".into(),
            netns: Some(PathBuf::from("/var/run/netns/cni-1")),
            ips: vec!["192.0.2.2".into()],
        }
        .to_proto();
        assert_eq!(
            PodSandbox::from_proto(&proto).netns,
            Some(PathBuf::from("/var/run/netns/cni-1"))
        );
        if let Some(linux) = proto.linux.as_mut() {
            linux.namespaces[0].path.clear();
        }
        assert_eq!(PodSandbox::from_proto(&proto).netns, None);
    }
}
