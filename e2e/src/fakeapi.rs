//! An in-process fake Kubernetes API server for CI, where no cluster can run.
//!
//! It speaks the real REST paths and JSON over HTTP, so the real `knic-driver` binary talks to it
//! through an ordinary kubeconfig, exactly as it talks to a kube-apiserver. It stores objects as
//! JSON, assigns uid/resourceVersion/creationTimestamp, honours `generateName`, resourceVersion
//! conflicts, delete preconditions, the `status` subresource, label and field selectors, merge
//! patches and server-side apply (approximated as a merge patch that creates when missing; the
//! field manager is recorded so tests can assert who wrote). Every request is recorded.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

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
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let store = Arc::new(Store {
            events: Mutex::new(Vec::new()),
            feed: broadcast::channel(4096).0,
            objects: Mutex::default(),
            requests: Mutex::default(),
            resource_version: AtomicU64::new(0),
            uid_counter: AtomicU64::new(0),
        });
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

    /// Stored object by collection path, namespace ("" when cluster-scoped) and name.
    pub fn object(&self, collection: &str, namespace: &str, name: &str) -> Option<Value> {
        let objects = self.store.objects.lock().ok()?;
        objects
            .get(&(collection.into(), namespace.into(), name.into()))
            .cloned()
    }
}

/// A parsed API path.
struct Target {
    /// `api/v1` or `apis/<group>/<version>`.
    group_version: String,
    resource: String,
    namespace: String,
    name: Option<String>,
    subresource: Option<String>,
}

impl Target {
    fn collection(&self) -> String {
        format!("{}/{}", self.group_version, self.resource)
    }
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group_version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => (format!("api/{v}"), rest),
        ["apis", g, v, rest @ ..] => (format!("apis/{g}/{v}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (ns.to_string(), rest),
        _ => (String::new(), rest),
    };
    let (resource, name, sub) = match rest {
        [r] => (r, None, None),
        [r, n] => (r, Some(n.to_string()), None),
        [r, n, s] => (r, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    Some(Target {
        group_version,
        resource: resource.to_string(),
        namespace,
        name,
        subresource: sub,
    })
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Streams watch events: everything after `resourceVersion` (all current objects as ADDED when
/// it is absent or "0"), then live changes, until `timeoutSeconds`.
fn watch(store: &Store, target: Target, query: &str) -> Response<Body> {
    let collection = target.collection();
    let namespace = target.namespace.clone();
    let matches = {
        let query = query.to_string();
        move |e: &Event| {
            e.collection == collection
                && (namespace.is_empty() || e.namespace == namespace)
                && selector_matches(&e.object, &query)
        }
    };
    let mut live = store.feed.subscribe();
    let since: u64 = query_param(query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Writers hold the objects lock while they bump the resourceVersion and emit, so reading
    // both under it gives a consistent cut between backlog and live events.
    let Ok(guard) = store.objects.lock() else {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "store poisoned".into(),
        );
    };
    let mut last = store.resource_version.load(Ordering::SeqCst).max(since);
    let backlog: Vec<Value> = if since == 0 {
        guard
            .iter()
            .filter(|((c, ns, _), _)| {
                *c == target.collection()
                    && (target.namespace.is_empty() || *ns == target.namespace)
            })
            .map(|(_, v)| v)
            .filter(|v| selector_matches(v, query))
            .map(|v| json!({"type": "ADDED", "object": v}))
            .collect()
    } else {
        let log = store.events.lock().map(|l| l.clone()).unwrap_or_default();
        log.iter()
            .filter(|e| e.rv > since && matches(e))
            .map(|e| json!({"type": e.kind, "object": e.object}))
            .collect()
    };
    drop(guard);
    let timeout = query_param(query, "timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(300u64);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    tokio::spawn(async move {
        let line = |v: &Value| Ok(Frame::data(Bytes::from(format!("{v}\n"))));
        for v in &backlog {
            if tx.send(line(v)).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(std::time::Duration::from_secs(timeout));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => return,
                event = live.recv() => match event {
                    Ok(e) if e.rv > last && matches(&e) => {
                        last = e.rv;
                        if tx.send(line(&json!({"type": e.kind, "object": e.object}))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut resp = Response::new(BodyExt::boxed(body));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

fn status(code: StatusCode, reason: &str, message: String) -> Response<Body> {
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

/// The apiserver's answer to a write decided on an older resourceVersion.
fn stale(resource: &str, name: &str) -> Response<Body> {
    status(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {resource} \"{name}\": the object has been \
             modified; please apply your changes to the latest version and try again"
        ),
    )
}

fn respond(code: StatusCode, body: &Value) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// Looks up a dotted path such as `spec.nodeName` in an object.
fn field<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(obj, |v, k| v.get(k))
}

fn selector_matches(obj: &Value, query: &str) -> bool {
    let fields_ok = query_param(query, "fieldSelector").is_none_or(|sel| {
        sel.split(',').filter(|t| !t.is_empty()).all(|term| {
            let (k, v) = term.split_once('=').unwrap_or((term, ""));
            let v = v.trim_start_matches('=');
            let actual = match k {
                "metadata.name" | "metadata.namespace" | "spec.nodeName" | "spec.driver" => {
                    field(obj, k).and_then(Value::as_str).unwrap_or_default()
                }
                _ => field(obj, k).and_then(Value::as_str).unwrap_or_default(),
            };
            actual == v
        })
    });
    let labels_ok = query_param(query, "labelSelector").is_none_or(|sel| {
        sel.split(',')
            .filter(|t| !t.is_empty())
            .all(|term| match term.split_once('=') {
                Some((k, v)) => {
                    field(obj, "metadata.labels")
                        .and_then(|l| l.get(k))
                        .and_then(Value::as_str)
                        == Some(v.trim_start_matches('='))
                }
                None => field(obj, "metadata.labels")
                    .and_then(|l| l.get(term))
                    .is_some(),
            })
    });
    fields_ok && labels_ok
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Civil-from-days (Howard Hinnant), to avoid a date crate in a test helper.
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl Store {
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

/// Copies the metadata fields a client may write (labels, annotations, finalizers, owner
/// references) from `from` into `obj`, whose other metadata stays the server's.
fn take_writable_metadata(obj: &mut Value, from: &Value) {
    for key in ["labels", "annotations", "finalizers", "ownerReferences"] {
        match from.get(key) {
            Some(v) if !v.is_null() => obj["metadata"][key] = v.clone(),
            _ => {
                if let Some(m) = obj["metadata"].as_object_mut() {
                    m.remove(key);
                }
            }
        }
    }
}

fn has_finalizers(obj: &Value) -> bool {
    field(obj, "metadata.finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

/// Finishes an update of the object at `key` whose state before was `before`: a no-op stays one
/// (same resourceVersion, no event); otherwise the generation moves when anything outside
/// metadata and status changed, a deleting object whose last finalizer went is removed
/// (DELETED), and anything else is MODIFIED.
fn commit(
    store: &Store,
    objects: &mut Objects,
    key: &(String, String, String),
    target: &Target,
    before: &Value,
) -> Response<Body> {
    let Some(obj) = objects.get_mut(key) else {
        return status(StatusCode::NOT_FOUND, "NotFound", "vanished".into());
    };
    if obj == before {
        return respond(StatusCode::OK, obj);
    }
    // Like the real apiserver: a claim's and a claim template's spec never change.
    if matches!(
        target.resource.as_str(),
        "resourceclaims" | "resourceclaimtemplates"
    ) && target.subresource.is_none()
        && obj.get("spec") != before.get("spec")
    {
        let name = field(before, "metadata.name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        *obj = before.clone();
        let kind = if target.resource == "resourceclaims" {
            "ResourceClaim"
        } else {
            "ResourceClaimTemplate"
        };
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!(
                "{kind}.resource.k8s.io \"{name}\" is invalid: spec: Invalid value: field is immutable"
            ),
        );
    }
    let body = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            m.remove("status");
        }
        v
    };
    if body(obj) != body(before) {
        let generation = field(obj, "metadata.generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        obj["metadata"]["generation"] = json!(generation + 1);
    }
    obj["metadata"]["resourceVersion"] = json!(store.next_rv());
    if field(obj, "metadata.deletionTimestamp").is_some() && !has_finalizers(obj) {
        let removed = objects.remove(key).unwrap_or(Value::Null);
        store.emit(target, "DELETED", &removed);
        return respond(StatusCode::OK, &removed);
    }
    store.emit(target, "MODIFIED", obj);
    respond(StatusCode::OK, obj)
}

/// Deletes the object at `key`, or, when it has finalizers, marks it deleting (once) and keeps
/// it until they are removed. Returns the object as the response shows it.
fn delete_or_mark(
    store: &Store,
    objects: &mut Objects,
    key: &(String, String, String),
    target: &Target,
) -> Option<Value> {
    let obj = objects.get_mut(key)?;
    if has_finalizers(obj) {
        if field(obj, "metadata.deletionTimestamp").is_none() {
            obj["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            let generation = field(obj, "metadata.generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            obj["metadata"]["generation"] = json!(generation + 1);
            obj["metadata"]["resourceVersion"] = json!(store.next_rv());
            store.emit(target, "MODIFIED", obj);
        }
        return Some(obj.clone());
    }
    let mut removed = objects.remove(key)?;
    removed["metadata"]["resourceVersion"] = json!(store.next_rv());
    store.emit(target, "DELETED", &removed);
    Some(removed)
}

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
    if let Ok(mut log) = store.requests.lock() {
        log.push(Recorded {
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
            field_manager: query_param(&query, "fieldManager"),
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_namespaced_cluster_and_subresources() {
        let t =
            parse_path("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status").unwrap();
        assert_eq!(
            (t.collection().as_str(), t.namespace.as_str()),
            ("apis/resource.k8s.io/v1/resourceclaims", "ns")
        );
        assert_eq!(
            (t.name.as_deref(), t.subresource.as_deref()),
            (Some("c"), Some("status"))
        );
        let t = parse_path("/api/v1/namespaces/ns").unwrap();
        assert_eq!(
            (t.resource.as_str(), t.name.as_deref(), t.namespace.as_str()),
            ("namespaces", Some("ns"), "")
        );
        let t = parse_path("/apis/resource.k8s.io/v1/resourceslices").unwrap();
        assert_eq!((t.resource.as_str(), t.name), ("resourceslices", None));
    }

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut v = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        merge_patch(&mut v, &json!({"a": {"b": null, "d": 3}, "l": [3]}));
        assert_eq!(v, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
    }

    #[test]
    fn selectors_and_dates() {
        let obj = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": "n1", "driver": "knic.dev"}});
        assert!(selector_matches(
            &obj,
            "fieldSelector=spec.nodeName%3Dn1%2Cspec.driver%3Dknic.dev"
        ));
        assert!(!selector_matches(&obj, "fieldSelector=spec.nodeName%3Dn2"));
        assert!(selector_matches(&obj, "labelSelector=app%3Dx"));
        assert_eq!(now_rfc3339().len(), 20);
    }
}
