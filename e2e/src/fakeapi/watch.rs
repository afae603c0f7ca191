//! Watches: the backlog after a resourceVersion, then live events until the timeout, as the
//! apiserver streams them; and the ways a real watch misbehaves, on demand.

use std::convert::Infallible;
use std::sync::atomic::Ordering;

use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::{Body, Event, Store, Target, query_param, selector_matches, status};

/// How a watch misbehaves, as real apiservers (and proxies in front of them) do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFault {
    /// HTTP 200, then one ERROR event (a 500 Status), then the stream ends.
    ErrorEvent,
    /// HTTP 200, then the ERROR event of an expired resourceVersion (410 `Expired`), as the
    /// apiserver answers a watch from a compacted version; then the stream ends.
    Expired,
    /// HTTP 200 and a stream that ends at once without any event.
    Closed,
}

/// Streams watch events: everything after `resourceVersion` (all current objects as ADDED when
/// it is absent or "0"), then live changes, until `timeoutSeconds`.
pub(super) fn watch(store: &Store, target: Target, query: &str) -> Response<Body> {
    let fault = store
        .watch_faults
        .lock()
        .ok()
        .and_then(|f| f.get(&target.resource).copied());
    if let Some(fault) = fault {
        let rv = store.resource_version.load(Ordering::SeqCst);
        let asked = query_param(query, "resourceVersion").unwrap_or_default();
        let event = match fault {
            WatchFault::ErrorEvent => Some(json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500}})),
            WatchFault::Expired => Some(json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {asked} ({rv})"),
                "reason": "Expired", "code": 410}})),
            WatchFault::Closed => None,
        };
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = event
            .into_iter()
            .map(|v| Ok(Frame::data(Bytes::from(format!("{v}\n")))))
            .collect();
        let body = StreamBody::new(tokio_stream::iter(frames));
        let mut resp = Response::new(BodyExt::boxed(body));
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        return resp;
    }
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
