//! An in-process fake Kubernetes API server for CI, where no cluster can run.
//!
//! It speaks the real REST paths and JSON over HTTP, so the real `knic-driver` binary talks to it
//! through an ordinary kubeconfig, exactly as it talks to a kube-apiserver. It stores objects as
//! JSON, assigns uid/resourceVersion/creationTimestamp, honours `generateName`, resourceVersion
//! conflicts, delete preconditions, the `status` subresource, label and field selectors, merge
//! patches and server-side apply (approximated as a merge patch that creates when missing; the
//! field manager is recorded so tests can assert who wrote). Every request is recorded, with
//! when it came; any request can be made to fail as a real apiserver fails
//! ([`FakeApi::fault_requests`]).
//!
//! Like the real apiserver it also keeps objects with finalizers after a DELETE (setting
//! `metadata.deletionTimestamp`) until an update removes the last finalizer, honours a
//! `metadata.resourceVersion` sent in a patch as a precondition, bumps `metadata.generation`
//! only when something outside metadata and status changes, and turns a write that changes
//! nothing into a no-op (no new resourceVersion, no watch event), which controllers rely on to
//! settle instead of waking themselves up forever.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

pub use rest::merge_patch;
use rest::{
    Target, field, now_rfc3339, parse_path, query_param, respond, selector_matches, stale, status,
};

/// One request the fake served, for assertions like "a repeated prepare did not re-read".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// Path without query.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// `fieldManager` query parameter, for apply/patch.
    pub field_manager: Option<String>,
    /// When the request arrived (e.g. to check a retry waited its `Retry-After`).
    pub at: std::time::Instant,
    /// The fault it was answered with, if one was armed for it.
    pub fault: Option<RequestFault>,
}

type Body = BoxBody<Bytes, Infallible>;

/// One change, as a watch stream reports it.
#[derive(Debug, Clone)]
struct Event {
    rv: u64,
    collection: String,
    namespace: String,
    kind: &'static str,
    object: Value,
}

struct Store {
    events: Mutex<Vec<Event>>,
    feed: broadcast::Sender<Event>,
    /// Key: (collection path such as `apis/resource.k8s.io/v1/resourceclaims`, namespace, name).
    objects: Mutex<BTreeMap<(String, String, String), Value>>,
    requests: Mutex<Vec<Recorded>>,
    resource_version: AtomicU64,
    uid_counter: AtomicU64,
    /// Watches of these resources (plural, e.g. `resourceslices`) misbehave.
    watch_faults: Mutex<BTreeMap<String, WatchFault>>,
    /// Requests that fail, in the order they were armed.
    request_faults: Mutex<Vec<faults::Armed>>,
    /// Whether `DRAPartitionableDevices` is on (off: counter fields are dropped on write).
    partitionable: AtomicBool,
    /// Whether `DRAConsumableCapacity` is on (off: `allowMultipleAllocations` and capacity
    /// request policies are dropped on write).
    consumable: AtomicBool,
    /// Whether `DRADeviceTaints` is on (off: device taints are dropped on write).
    device_taints: AtomicBool,
}

/// A running fake API server bound to 127.0.0.1 on a free port; stops when dropped.
pub struct FakeApi {
    addr: SocketAddr,
    store: Arc<Store>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeApi {
    /// Starts serving on a free loopback port.
    pub async fn start() -> anyhow::Result<FakeApi> {
        FakeApi::start_on("127.0.0.1".parse()?).await
    }

    /// Starts serving on a free port of `address`: drivers in other network namespaces (the
    /// namespaced "nodes" of the overlay tests) reach it over their underlay.
    pub async fn start_on(address: std::net::IpAddr) -> anyhow::Result<FakeApi> {
        let listener = TcpListener::bind((address, 0)).await?;
        let addr = listener.local_addr()?;
        let store = Arc::new(Store::new());
        let served = store.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let store = served.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let store = store.clone();
                        async move { Ok::<_, Infallible>(handle(&store, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(FakeApi { addr, store, task })
    }

    /// Base URL for clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig pointing at this server, for the driver binary.
    pub fn write_kubeconfig(&self, path: &Path) -> anyhow::Result<()> {
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             users:\n- name: fake\n  user:\n    token: fake\ncontexts:\n- name: fake\n  context:\n    \
             cluster: fake\n    user: fake\ncurrent-context: fake\n",
            self.url()
        );
        std::fs::write(path, config)?;
        Ok(())
    }

    /// A client for the test itself.
    pub fn client(&self) -> anyhow::Result<kube::Client> {
        let config = kube::Config::new(self.url().parse()?);
        Ok(kube::Client::try_from(config)?)
    }

    /// Every request served so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.store
            .requests
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Stores `obj` as an older apiserver would have accepted it, bypassing today's
    /// validation (e.g. a selector a v1.36 apiserver refuses): the state an upgrade starts from.
    /// `path` is the object's API path, e.g.
    /// `/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates/name`.
    pub fn seed(&self, path: &str, mut obj: Value) -> anyhow::Result<()> {
        let target = parse_path(path).context("not an object path")?;
        let name = target.name.clone().context("no name in the path")?;
        self.store.stamp_new(&mut obj, &target, &name);
        let mut objects = self
            .store
            .objects
            .lock()
            .map_err(|_| anyhow::anyhow!("store poisoned"))?;
        objects.insert(
            (target.collection(), target.namespace.clone(), name),
            obj.clone(),
        );
        self.store.emit(&target, "ADDED", &obj);
        Ok(())
    }

    /// Makes every watch of `resource` (plural, e.g. `resourceslices`) misbehave as `fault`
    /// says, or behave again with `None`.
    pub fn fault_watches(&self, resource: &str, fault: Option<WatchFault>) {
        if let Ok(mut faults) = self.store.watch_faults.lock() {
            match fault {
                Some(f) => faults.insert(resource.to_owned(), f),
                None => faults.remove(resource),
            };
        }
    }

    /// Fails the next `count` requests that `matcher` selects with `fault`: `"METHOD
    /// path-substring"`, e.g. `"PATCH /resourceclaims/c/status"` or `"POST /networkaddresses"`
    /// (`*` for any method). Faults armed earlier are matched first.
    pub fn fault_requests(
        &self,
        matcher: &str,
        fault: RequestFault,
        count: usize,
    ) -> anyhow::Result<()> {
        let armed = faults::Armed::new(matcher, fault, count)?;
        self.store
            .request_faults
            .lock()
            .map_err(|_| anyhow::anyhow!("store poisoned"))?
            .push(armed);
        Ok(())
    }

    /// Turns the `DRAPartitionableDevices` gate on (the default, as in 1.36) or off: off, the
    /// fake drops `sharedCounters`, `consumesCounters` and `perDeviceNodeSelection` from every
    /// ResourceSlice written, as an older or reconfigured apiserver does.
    pub fn set_partitionable_devices(&self, enabled: bool) {
        self.store.partitionable.store(enabled, Ordering::SeqCst);
    }

    /// Turns the `DRAConsumableCapacity` gate on (the default, as in 1.36) or off: off, the
    /// fake drops `allowMultipleAllocations` and every capacity's `requestPolicy` from every
    /// ResourceSlice written, as a 1.34/1.35 apiserver does by default.
    pub fn set_consumable_capacity(&self, enabled: bool) {
        self.store.consumable.store(enabled, Ordering::SeqCst);
    }

    /// Disarms every request fault not yet served.
    pub fn clear_request_faults(&self) {
        if let Ok(mut armed) = self.store.request_faults.lock() {
            armed.clear();
        }
    }

    /// Stored object by collection path, namespace ("" when cluster-scoped) and name.
    pub fn object(&self, collection: &str, namespace: &str, name: &str) -> Option<Value> {
        let objects = self.store.objects.lock().ok()?;
        objects
            .get(&(collection.into(), namespace.into(), name.into()))
            .cloned()
    }
}

impl Store {
    fn new() -> Store {
        Store {
            events: Mutex::new(Vec::new()),
            feed: broadcast::channel(4096).0,
            objects: Mutex::default(),
            requests: Mutex::default(),
            resource_version: AtomicU64::new(0),
            uid_counter: AtomicU64::new(0),
            watch_faults: Mutex::default(),
            request_faults: Mutex::default(),
            partitionable: AtomicBool::new(true),
            consumable: AtomicBool::new(true),
            device_taints: AtomicBool::new(true),
        }
    }

    /// What the apiserver's admission and validation make of a write of `obj` (to be named
    /// `name`) to `resource`: fields of disabled gates dropped, then the refusal, if any.
    fn admit(&self, target: &Target, name: &str, obj: &mut Value) -> Option<String> {
        let resource = target.resource.as_str();
        if resource == "events" {
            return events::refusal(&target.group_version, &target.namespace, name, obj);
        }
        if resource == "resourceclaimtemplates"
            && let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut)
        {
            // As a real apiserver stores it: the claim template's ObjectMeta is a struct, not a
            // pointer, so it comes back as `{}` when the writer sent none.
            spec.entry("metadata").or_insert_with(|| json!({}));
        }
        if resource != "resourceslices" {
            return crate::admission::refusal(resource, obj);
        }
        self.drop_disabled_fields(obj);
        slices::refusal(name, obj)
    }

    /// Drops a slice's fields whose feature gates are off, as the apiserver's strategy does,
    /// and (gate on) sets the time of new device taints, as it also does.
    fn drop_disabled_fields(&self, obj: &mut Value) {
        taints::prepare(obj, self.device_taints.load(Ordering::SeqCst));
        if !self.partitionable.load(Ordering::SeqCst) {
            slices::drop_partitionable_fields(obj);
        }
        if !self.consumable.load(Ordering::SeqCst) {
            capacity::drop_consumable_fields(obj);
        }
    }

    /// Records a change for watchers; `obj` already carries its new resourceVersion.
    fn emit(&self, target: &Target, kind: &'static str, obj: &Value) {
        let rv = field(obj, "metadata.resourceVersion")
            .and_then(Value::as_str)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let event = Event {
            rv,
            collection: target.collection(),
            namespace: target.namespace.clone(),
            kind,
            object: obj.clone(),
        };
        if let Ok(mut log) = self.events.lock() {
            log.push(event.clone());
        }
        let _ = self.feed.send(event);
    }

    fn next_rv(&self) -> String {
        (self.resource_version.fetch_add(1, Ordering::SeqCst) + 1).to_string()
    }

    fn new_uid(&self) -> String {
        let n = self.uid_counter.fetch_add(1, Ordering::SeqCst) + 1;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        format!("{:08x}-{:04x}-4000-8000-{:012x}", nanos, n & 0xffff, n)
    }

    fn stamp_new(&self, obj: &mut Value, target: &Target, name: &str) {
        let meta = &mut obj["metadata"];
        meta["name"] = json!(name);
        if !target.namespace.is_empty() {
            meta["namespace"] = json!(target.namespace);
        }
        meta["uid"] = json!(self.new_uid());
        meta["resourceVersion"] = json!(self.next_rv());
        meta["creationTimestamp"] = json!(now_rfc3339());
        meta["generation"] = json!(1);
        if let Some(m) = meta.as_object_mut() {
            m.remove("generateName");
        }
    }
}

type Objects = BTreeMap<(String, String, String), Value>;

async fn handle(store: &Store, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let fault = store.take_fault(&method, &path);
    if let Ok(mut log) = store.requests.lock() {
        log.push(Recorded {
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
            field_manager: query_param(&query, "fieldManager"),
            at: std::time::Instant::now(),
            fault,
        });
    }
    if let Some(fault) = fault {
        return faults::answer(fault, &path).await;
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let Some(target) = parse_path(&path) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no route for {path}"),
        );
    };
    let parsed: Option<Value> = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => Some(v),
            Err(e) => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("body is not JSON: {e}"),
                );
            }
        }
    };
    let Ok(mut objects) = store.objects.lock() else {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "store poisoned".into(),
        );
    };
    let collection = target.collection();
    let key = |name: &str| {
        (
            collection.clone(),
            target.namespace.clone(),
            name.to_string(),
        )
    };
    let not_found = |name: &str| {
        status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", target.resource),
        )
    };

    match (method, target.name.clone()) {
        (Method::GET, None)
            if matches!(query_param(&query, "watch").as_deref(), Some("1" | "true")) =>
        {
            drop(objects);
            watch(store, target, &query)
        }
        (Method::DELETE, None) => {
            let doomed: Vec<_> = objects
                .iter()
                .filter(|((c, ns, _), v)| {
                    *c == collection
                        && (target.namespace.is_empty() || *ns == target.namespace)
                        && selector_matches(v, &query)
                })
                .map(|(k, _)| k.clone())
                .collect();
            let mut items = Vec::new();
            for k in doomed {
                if let Some(obj) = delete_or_mark(store, &mut objects, &k, &target) {
                    items.push(obj);
                }
            }
            respond(
                StatusCode::OK,
                &json!({"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}),
            )
        }
        (Method::GET, None) => {
            let items: Vec<Value> = objects
                .iter()
                .filter(|((c, ns, _), _)| {
                    *c == collection && (target.namespace.is_empty() || *ns == target.namespace)
                })
                .map(|(_, v)| v)
                .filter(|v| selector_matches(v, &query))
                .cloned()
                .collect();
            let rv = store.resource_version.load(Ordering::SeqCst).to_string();
            respond(
                StatusCode::OK,
                &json!({"apiVersion": target.group_version.trim_start_matches("api/").trim_start_matches("apis/"),
                        "kind": "List", "metadata": {"resourceVersion": rv}, "items": items}),
            )
        }
        (Method::GET, Some(name)) => match objects.get(&key(&name)) {
            Some(obj) => respond(StatusCode::OK, obj),
            None => not_found(&name),
        },
        (Method::POST, None) => {
            let Some(mut obj) = parsed else {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "create needs a body".into(),
                );
            };
            let name = match (
                field(&obj, "metadata.name").and_then(Value::as_str),
                field(&obj, "metadata.generateName").and_then(Value::as_str),
            ) {
                (Some(n), _) if !n.is_empty() => n.to_string(),
                (_, Some(prefix)) => format!("{prefix}{}", &store.new_uid()[..5]),
                _ => {
                    return status(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "Invalid",
                        "metadata.name: Required value: name or generateName is required".into(),
                    );
                }
            };
            if objects.contains_key(&key(&name)) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    format!("{} \"{name}\" already exists", target.resource),
                );
            }
            if let Some(message) = store.admit(&target, &name, &mut obj) {
                return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message);
            }
            store.stamp_new(&mut obj, &target, &name);
            objects.insert(key(&name), obj.clone());
            store.emit(&target, "ADDED", &obj);
            respond(StatusCode::CREATED, &obj)
        }
        (Method::PUT, Some(name)) => {
            let Some(new) = parsed else {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "update needs a body".into(),
                );
            };
            let Some(existing) = objects.get_mut(&key(&name)) else {
                return not_found(&name);
            };
            let sent_rv = field(&new, "metadata.resourceVersion").and_then(Value::as_str);
            let have_rv = field(existing, "metadata.resourceVersion").and_then(Value::as_str);
            if sent_rv.is_some_and(|rv| Some(rv) != have_rv) {
                return stale(&target.resource, &name);
            }
            let before = existing.clone();
            let meta = existing["metadata"].clone();
            if target.subresource.as_deref() == Some("status") {
                existing["status"] = new.get("status").cloned().unwrap_or(Value::Null);
            } else {
                let status_before = existing.get("status").cloned();
                let new_meta = new.get("metadata").cloned().unwrap_or(Value::Null);
                *existing = new;
                existing["metadata"] = meta;
                take_writable_metadata(existing, &new_meta);
                if let Some(s) = status_before {
                    existing["status"] = s;
                }
            }
            commit(store, &mut objects, &key(&name), &target, &before)
        }
        (Method::PATCH, Some(name)) => {
            let Some(patch) = parsed else {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "patch needs a body".into(),
                );
            };
            let apply = content_type.starts_with("application/apply-patch");
            if !(apply
                || content_type.starts_with("application/merge-patch+json")
                || content_type.starts_with("application/strategic-merge-patch+json"))
            {
                return status(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    format!("the fake API does not implement patch type {content_type}"),
                );
            }
            if apply && query_param(&query, "fieldManager").is_none() {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "PATCH with apply requires fieldManager".into(),
                );
            }
            let existing = match objects.entry(key(&name)) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    if !apply || target.subresource.is_some() {
                        return not_found(&name);
                    }
                    let mut obj = patch.clone();
                    if let Some(message) = store.admit(&target, &name, &mut obj) {
                        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message);
                    }
                    store.stamp_new(&mut obj, &target, &name);
                    e.insert(obj.clone());
                    store.emit(&target, "ADDED", &obj);
                    return respond(StatusCode::CREATED, &obj);
                }
            };
            if let Some(want) = field(&patch, "metadata.resourceVersion").and_then(Value::as_str)
                && field(existing, "metadata.resourceVersion").and_then(Value::as_str) != Some(want)
            {
                return stale(&target.resource, &name);
            }
            let before = existing.clone();
            let meta = existing["metadata"].clone();
            let mut patch = patch;
            if target.subresource.as_deref() == Some("status") {
                patch = json!({"status": patch.get("status").cloned().unwrap_or(Value::Null)});
            } else if let Some(p) = patch.as_object_mut() {
                p.remove("status");
            }
            merge_patch(existing, &patch);
            let merged = existing["metadata"].clone();
            existing["metadata"] = meta;
            take_writable_metadata(existing, &merged);
            commit(store, &mut objects, &key(&name), &target, &before)
        }
        (Method::DELETE, Some(name)) => {
            let Some(existing) = objects.get(&key(&name)) else {
                return not_found(&name);
            };
            if let Some(pre) = parsed.as_ref().and_then(|b| b.get("preconditions")) {
                for (k, path) in [
                    ("uid", "metadata.uid"),
                    ("resourceVersion", "metadata.resourceVersion"),
                ] {
                    if let Some(want) = pre.get(k).and_then(Value::as_str)
                        && field(existing, path).and_then(Value::as_str) != Some(want)
                    {
                        return status(
                            StatusCode::CONFLICT,
                            "Conflict",
                            format!(
                                "Precondition failed: {k} in precondition: {want}, {k} in object meta: {}",
                                field(existing, path)
                                    .and_then(Value::as_str)
                                    .unwrap_or_default()
                            ),
                        );
                    }
                }
            }
            match delete_or_mark(store, &mut objects, &key(&name), &target) {
                Some(obj) => respond(StatusCode::OK, &obj),
                None => not_found(&name),
            }
        }
        (m, _) => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{m} is not supported on {path}"),
        ),
    }
}

mod capacity;
pub mod events;
mod faults;
mod objects;
mod rest;
mod slices;
mod taints;
mod watch;

pub use faults::{RequestFault, path_matches};
use objects::{commit, delete_or_mark, take_writable_metadata};
pub use watch::WatchFault;
use watch::watch;

#[cfg(test)]
mod tests;
