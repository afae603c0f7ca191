//! The runtime's end of NRI, for tests and demos without containerd.
//!
//! [`TestRuntime`] behaves like containerd's NRI adaptation where knic can tell the difference:
//! it listens on a Unix socket, waits for RegisterPlugin (validating name and index the same
//! way), sends Configure and a chunked Synchronize (checking the plugin acknowledges every
//! non-final chunk with `more = true`), delivers pod events through the dedicated RPCs with a
//! fallback to StateChange on Unimplemented, only for subscribed events, each under a request
//! timeout after which the plugin connection is closed. Like containerd and CRI-O, it delivers
//! one event at a time node-wide, however many callers ask at once ([`CallLocking::Global`]);
//! [`CallLocking::PerPod`] models a runtime that only orders each pod's own events.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use knic_proto::nri as api;
use knic_proto::ttrpc::Status;
use prost::Message;
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::mux::{Mux, MuxWriter, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use super::ttrpc::{self, CallError, Client};
use super::{NRI_VERSION, PLUGIN_SERVICE, PodSandbox, RUNTIME_SERVICE};
use crate::error::{Error, Result};

/// containerd's default NRI request timeout.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// containerd's default NRI registration timeout.
pub const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);

/// How the runtime lets concurrent pod events reach the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallLocking {
    /// One event at a time node-wide, whatever the pod: containerd and CRI-O today (a mutex
    /// around every NRI hook in their `internal/nri`, and the `containerd/nri` adaptation's own
    /// around every plugin call). The request timeout starts once the lock is held, as there.
    #[default]
    Global,
    /// One event at a time per pod UID, pods in parallel: the per-pod locker proposed for the
    /// adaptation (containerd/nri#165), not in a released runtime.
    PerPod,
}

/// What a plugin registered as, and what it subscribed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// RegisterPluginRequest.plugin_name.
    pub name: String,
    /// RegisterPluginRequest.plugin_idx.
    pub index: String,
    /// ConfigureResponse.events, the subscription bitmask.
    pub events: u32,
    /// RegisterPluginRequest.NRI_version.
    pub nri_version: String,
}

struct Connection {
    client: Client,
    writer: MuxWriter,
    // Kept so dropping the connection stops the demultiplexer.
    _mux: Mux,
    server: JoinHandle<()>,
    events: u32,
}

impl Connection {
    async fn close(&self) {
        let _ = self.writer.shutdown().await;
        self.server.abort();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// An NRI runtime that listens on a unix socket path like containerd does.
pub struct TestRuntime {
    socket: PathBuf,
    listener: Option<UnixListener>,
    conn: Option<Connection>,
    state_change: bool,
    request_timeout: Duration,
    registration_timeout: Duration,
    sync_chunk: usize,
    sync_messages: usize,
    last_delivery: Mutex<Option<String>>,
    locking: Mutex<CallLocking>,
    global: tokio::sync::Mutex<()>,
    pod_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for TestRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestRuntime")
            .field("socket", &self.socket)
            .field("connected", &self.conn.is_some())
            .field("state_change", &self.state_change)
            .finish()
    }
}

impl TestRuntime {
    /// Binds `socket`, replacing a stale socket file as containerd does at start-up (a runtime
    /// restart leaves the old one behind).
    pub async fn listen(socket: &Path) -> Result<TestRuntime> {
        let listener = bind(socket)?;
        Ok(TestRuntime {
            socket: socket.to_owned(),
            listener: Some(listener),
            conn: None,
            state_change: false,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            registration_timeout: DEFAULT_REGISTRATION_TIMEOUT,
            sync_chunk: usize::MAX,
            sync_messages: 0,
            last_delivery: Mutex::new(None),
            locking: Mutex::new(CallLocking::Global),
            global: tokio::sync::Mutex::new(()),
            pod_locks: Mutex::new(HashMap::new()),
        })
    }

    /// Behave like NRI <= 0.11: deliver events via StateChange.
    pub fn use_state_change(&mut self, yes: bool) {
        self.state_change = yes;
    }

    /// Sets how concurrent pod events are let through (default [`CallLocking::Global`], as
    /// containerd). Takes `&self` so a runtime shared between tasks can switch between rounds.
    pub fn set_call_locking(&self, locking: CallLocking) {
        *lock(&self.locking) = locking;
    }

    /// Sets how long each plugin call may take (default 2 s, containerd's); an overrun closes
    /// the plugin connection, as containerd does.
    pub fn set_request_timeout(&mut self, timeout: Duration) {
        self.request_timeout = timeout;
    }

    /// Sets the most pods per Synchronize message (default: all in one, split further only when
    /// a message would exceed ttrpc's 4 MiB), so tests can force several chunks.
    pub fn set_sync_chunk_size(&mut self, pods_per_message: usize) {
        self.sync_chunk = pods_per_message.max(1);
    }

    /// The RPC that delivered the last pod event (`RunPodSandbox`, `StateChange`, ...), so tests
    /// can tell the dedicated RPCs from the StateChange fallback.
    pub fn last_delivery(&self) -> Option<String> {
        lock(&self.last_delivery).clone()
    }

    /// How many Synchronize messages the last [`TestRuntime::accept`] needed.
    pub fn sync_messages(&self) -> usize {
        self.sync_messages
    }

    /// Whether a plugin connection is open.
    pub fn is_connected(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| !c.client.is_closed())
    }

    /// Accepts the plugin, handles RegisterPlugin, sends Configure and Synchronize (with `pods`,
    /// split into chunks when large), returns what the plugin registered as. A previous plugin
    /// connection is closed first; after [`TestRuntime::shutdown`] the socket is bound again.
    pub async fn accept(&mut self, pods: Vec<PodSandbox>) -> Result<Registered> {
        if let Some(old) = self.conn.take() {
            old.close().await;
        }
        let listener = match self.listener.take() {
            Some(listener) => listener,
            None => bind(&self.socket)?,
        };
        let accepted = listener.accept().await;
        self.listener = Some(listener);
        let (stream, _) = accepted
            .map_err(|e| Error::io(format!("accepting on {}", self.socket.display()), e))?;

        let mut mux = Mux::new(stream, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
        let (Some(plugin_conn), Some(runtime_conn)) = (
            mux.open(PLUGIN_SERVICE_CONN),
            mux.open(RUNTIME_SERVICE_CONN),
        ) else {
            return Err(fail("NRI multiplexer", "logical connections unavailable"));
        };
        let (reg_tx, mut reg_rx) = mpsc::unbounded_channel();
        let server = tokio::spawn(async move {
            let service = Arc::new(RuntimeService {
                registrations: reg_tx,
            });
            if let Err(e) = ttrpc::serve(runtime_conn, RUNTIME_SERVICE, service).await {
                tracing::debug!(error = %e, "test runtime: Runtime service ended");
            }
        });
        let writer = mux.writer();
        let mut conn = Connection {
            client: Client::new(plugin_conn),
            writer,
            _mux: mux,
            server,
            events: 0,
        };

        let registration = tokio::time::timeout(self.registration_timeout, reg_rx.recv()).await;
        let (name, index, nri_version) = match registration {
            Ok(Some(Ok(reg))) => reg,
            Ok(Some(Err(reason))) => {
                conn.close().await;
                return Err(fail("plugin registration", &reason.to_string()));
            }
            Ok(None) => return Err(fail("plugin registration", "connection closed")),
            Err(_) => {
                conn.close().await;
                return Err(fail("plugin registration", "timed out"));
            }
        };

        let configure = api::ConfigureRequest {
            config: String::new(),
            runtime_name: "knic-test-runtime".to_owned(),
            runtime_version: env!("CARGO_PKG_VERSION").to_owned(),
            registration_timeout: millis(self.registration_timeout),
            request_timeout: millis(self.request_timeout),
            nri_version: NRI_VERSION.to_owned(),
        };
        let reply = conn
            .client
            .call(
                PLUGIN_SERVICE,
                "Configure",
                configure.encode_to_vec(),
                self.request_timeout,
            )
            .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                conn.close().await;
                return Err(fail("Configure", &e.to_string()));
            }
        };
        let events = api::ConfigureResponse::decode(reply.as_slice())
            .map_err(|e| fail("Configure response", &e.to_string()))?
            .events as u32;
        // containerd: no subscription at all means "every event".
        conn.events = if events == 0 { u32::MAX } else { events };

        match self.synchronize(&conn, &pods).await {
            Ok(messages) => self.sync_messages = messages,
            Err(reason) => {
                conn.close().await;
                return Err(fail("Synchronize", &reason.to_string()));
            }
        }
        self.conn = Some(conn);
        Ok(Registered {
            name,
            index,
            events,
            nri_version,
        })
    }

    async fn synchronize(&self, conn: &Connection, pods: &[PodSandbox]) -> Result<usize> {
        let pods: Vec<api::PodSandbox> = pods.iter().map(PodSandbox::to_proto).collect();
        let mut rest = pods.as_slice();
        let mut per_message = self.sync_chunk.min(rest.len()).max(1);
        let mut sent = 0;
        loop {
            let take = per_message.min(rest.len());
            let req = api::SynchronizeRequest {
                pods: rest[..take].to_vec(),
                containers: Vec::new(),
                more: rest.len() > take,
            };
            let reply = conn
                .client
                .call(
                    PLUGIN_SERVICE,
                    "Synchronize",
                    req.encode_to_vec(),
                    self.request_timeout,
                )
                .await;
            match reply {
                Ok(reply) => {
                    sent += 1;
                    if !req.more {
                        return Ok(sent);
                    }
                    let reply = api::SynchronizeResponse::decode(reply.as_slice())
                        .map_err(|e| Error::Nri(format!("Synchronize reply: {e}")))?;
                    if !reply.more {
                        return Err(Error::Nri(
                            "plugin does not handle split sync requests".to_owned(),
                        ));
                    }
                    rest = &rest[take..];
                }
                // Like containerd: too large for one ttrpc message, retry with smaller chunks.
                Err(CallError::TooLarge(_)) if per_message > 1 => per_message /= 2,
                Err(e) => return Err(Error::Nri(e.to_string())),
            }
        }
    }

    /// Delivers RunPodSandbox; `Err` carries the plugin's error text.
    pub async fn run_pod_sandbox(&self, pod: &PodSandbox) -> Result<()> {
        let req = api::RunPodSandboxRequest {
            pod: Some(pod.to_proto()),
        };
        self.deliver(api::Event::RunPodSandbox, req.encode_to_vec(), pod)
            .await
    }

    /// Delivers StopPodSandbox; `Err` carries the plugin's error text.
    pub async fn stop_pod_sandbox(&self, pod: &PodSandbox) -> Result<()> {
        let req = api::StopPodSandboxRequest {
            pod: Some(pod.to_proto()),
        };
        self.deliver(api::Event::StopPodSandbox, req.encode_to_vec(), pod)
            .await
    }

    /// Delivers RemovePodSandbox; `Err` carries the plugin's error text.
    pub async fn remove_pod_sandbox(&self, pod: &PodSandbox) -> Result<()> {
        let req = api::RemovePodSandboxRequest {
            pod: Some(pod.to_proto()),
        };
        self.deliver(api::Event::RemovePodSandbox, req.encode_to_vec(), pod)
            .await
    }

    async fn deliver(
        &self,
        event: api::Event,
        dedicated_payload: Vec<u8>,
        pod: &PodSandbox,
    ) -> Result<()> {
        let conn = self
            .conn
            .as_ref()
            .ok_or_else(|| Error::Nri("no NRI plugin connected".to_owned()))?;
        let bit = 1u32 << (event as i32 - 1);
        if conn.events & bit == 0 {
            return Ok(());
        }
        let locking = *lock(&self.locking);
        // Held for the whole event, whichever the locking chose.
        let _global = match locking {
            CallLocking::Global => Some(self.global.lock().await),
            CallLocking::PerPod => None,
        };
        let _pod = match locking {
            CallLocking::PerPod => {
                let pod_lock = lock(&self.pod_locks)
                    .entry(pod.uid.clone())
                    .or_default()
                    .clone();
                Some(pod_lock.lock_owned().await)
            }
            CallLocking::Global => None,
        };
        let delivered = self
            .deliver_locked(conn, event, dedicated_payload, pod)
            .await;
        if event == api::Event::RemovePodSandbox && locking == CallLocking::PerPod {
            // The adaptation's proposed CleanupPod: a removed pod's lock is dropped.
            lock(&self.pod_locks).remove(&pod.uid);
        }
        delivered
    }

    async fn deliver_locked(
        &self,
        conn: &Connection,
        event: api::Event,
        dedicated_payload: Vec<u8>,
        pod: &PodSandbox,
    ) -> Result<()> {
        let method = dedicated_method(event);
        if !self.state_change {
            match self.call(conn, method, dedicated_payload).await {
                Err(CallError::Status { code, .. }) if code == ttrpc::code::UNIMPLEMENTED => {
                    tracing::warn!(method, "plugin lacks the dedicated RPC, using StateChange");
                }
                other => return self.outcome(conn, method, other).await,
            }
        }
        let event_msg = api::StateChangeEvent {
            event: event as i32,
            pod: Some(pod.to_proto()),
            container: None,
        };
        let result = self
            .call(conn, "StateChange", event_msg.encode_to_vec())
            .await;
        self.outcome(conn, "StateChange", result).await
    }

    async fn call(
        &self,
        conn: &Connection,
        method: &str,
        payload: Vec<u8>,
    ) -> std::result::Result<Vec<u8>, CallError> {
        *lock(&self.last_delivery) = Some(method.to_owned());
        conn.client
            .call(PLUGIN_SERVICE, method, payload, self.request_timeout)
            .await
    }

    async fn outcome(
        &self,
        conn: &Connection,
        method: &str,
        result: std::result::Result<Vec<u8>, CallError>,
    ) -> Result<()> {
        match result {
            Ok(_) => Ok(()),
            Err(CallError::Status { message, .. }) => Err(Error::Nri(message)),
            Err(e) => {
                // Fatal for the plugin, as in containerd (which then lets the pod continue
                // without it; a test wants to see the failure instead).
                conn.close().await;
                Err(Error::Nri(format!(
                    "{method}: {e}; the plugin connection was closed"
                )))
            }
        }
    }

    /// Sends Shutdown, drops the connection and stops listening (simulates a runtime restart: a
    /// new `listen` + `accept` on the same path sees the plugin reconnect).
    pub async fn shutdown(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = conn
                .client
                .call(
                    PLUGIN_SERVICE,
                    "Shutdown",
                    api::Empty {}.encode_to_vec(),
                    Duration::from_millis(500),
                )
                .await;
            conn.close().await;
        }
        self.listener = None;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn dedicated_method(event: api::Event) -> &'static str {
    match event {
        api::Event::RunPodSandbox => "RunPodSandbox",
        api::Event::StopPodSandbox => "StopPodSandbox",
        _ => "RemovePodSandbox",
    }
}

fn bind(socket: &Path) -> Result<UnixListener> {
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Error::io(
                format!("removing stale socket {}", socket.display()),
                e,
            ));
        }
    }
    UnixListener::bind(socket).map_err(|e| Error::io(format!("binding {}", socket.display()), e))
}

fn fail(context: &str, reason: &str) -> Error {
    Error::io(
        format!("test NRI runtime: {context}"),
        std::io::Error::other(reason.to_owned()),
    )
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

type Registration = Result<(String, String, String)>;

/// The Runtime service: accepts RegisterPlugin with containerd's checks.
struct RuntimeService {
    registrations: mpsc::UnboundedSender<Registration>,
}

impl ttrpc::Service for RuntimeService {
    async fn call(&self, method: &str, payload: &[u8]) -> std::result::Result<Vec<u8>, Status> {
        if method != "RegisterPlugin" {
            return Err(ttrpc::status(
                ttrpc::code::UNIMPLEMENTED,
                format!("method {method}"),
            ));
        }
        let req = api::RegisterPluginRequest::decode(payload)
            .map_err(|e| ttrpc::status(ttrpc::code::INVALID_ARGUMENT, e.to_string()))?;
        let idx = &req.plugin_idx;
        let problem = if req.plugin_name.is_empty() {
            Some("invalid (empty) plugin name".to_owned())
        } else if idx.len() != 2 || !idx.bytes().all(|b| b.is_ascii_digit()) {
            Some(format!("invalid plugin index: {idx:?}"))
        } else {
            None
        };
        if let Some(problem) = problem {
            let _ = self.registrations.send(Err(Error::Nri(problem.clone())));
            return Err(ttrpc::status(ttrpc::code::UNKNOWN, problem));
        }
        let _ = self
            .registrations
            .send(Ok((req.plugin_name, req.plugin_idx, req.nri_version)));
        Ok(Vec::new())
    }
}

/// Creates a container that uses `cdi_devices` the way containerd with CDI does, as far as
/// knic's devices go: each ID is resolved from the spec files in `cdi_dirs` (an ID no spec
/// declares fails the creation), and each device's `createRuntime` hooks run with the OCI state
/// on stdin (`pid`: the container's process, in the pod's network namespace). A hook that
/// exits non-zero or overruns its timeout fails the creation with runc's wording.
pub async fn create_container(
    cdi_dirs: &[PathBuf],
    cdi_devices: &[String],
    container_id: &str,
    pid: u32,
) -> Result<()> {
    let mut hooks = Vec::new();
    for id in cdi_devices {
        let (kind, name) = id
            .split_once('=')
            .ok_or_else(|| Error::Nri(format!("invalid CDI device {id:?}")))?;
        let device = cdi_dirs
            .iter()
            .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
            .filter(|entry| entry.path().extension().is_some_and(|e| e == "json"))
            .filter_map(|entry| std::fs::read(entry.path()).ok())
            .filter_map(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .filter(|spec| spec["kind"] == kind)
            .flat_map(|spec| spec["devices"].as_array().cloned().unwrap_or_default())
            .find(|d| d["name"] == name)
            .ok_or_else(|| {
                Error::Nri(format!(
                    "failed to inject CDI devices: unresolvable CDI devices {id}"
                ))
            })?;
        for hook in device["containerEdits"]["hooks"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if hook["hookName"] == "createRuntime" {
                hooks.push(hook.clone());
            }
        }
    }
    let state = serde_json::json!({
        "ociVersion": "1.2.0",
        "id": container_id,
        "status": "creating",
        "pid": pid,
        "bundle": "/",
    })
    .to_string();
    for (n, hook) in hooks.iter().enumerate() {
        run_hook(n, hook, &state).await?;
    }
    Ok(())
}

async fn run_hook(n: usize, hook: &serde_json::Value, state: &str) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let failed = |what: String| {
        Error::Nri(format!(
            "OCI runtime create failed: error running createRuntime hook #{n}: {what}"
        ))
    };
    let path = hook["path"].as_str().unwrap_or_default();
    let args: Vec<String> = hook["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    let timeout = Duration::from_secs(hook["timeout"].as_u64().unwrap_or(30));
    let mut command = tokio::process::Command::new(path);
    command
        .args(args.iter().skip(1))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(arg0) = args.first() {
        command.arg0(arg0);
    }
    let mut child = command
        .spawn()
        .map_err(|e| failed(format!("{path}: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(state.as_bytes()).await;
    }
    let output = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| failed(format!("timeout after {} seconds", timeout.as_secs())))?
        .map_err(|e| failed(e.to_string()))?;
    if output.status.success() {
        return Ok(());
    }
    Err(failed(format!(
        "{}, stdout: {}, stderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout).trim(),
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}
