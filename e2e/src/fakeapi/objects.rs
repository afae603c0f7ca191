//! How the apiserver stores a write: writable metadata only, spec immutability of claims and
//! templates, admission of selectors, generations, resourceVersions, finalizers, watch events.

use serde_json::{Value, json};

use super::{Body, Objects, Store, Target, field, now_rfc3339, respond, status};
use http::{Response, StatusCode};

/// Copies the metadata fields a client may write (labels, annotations, finalizers, owner
/// references) from `from` into `obj`, whose other metadata stays the server's.
pub(super) fn take_writable_metadata(obj: &mut Value, from: &Value) {
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
pub(super) fn commit(
    store: &Store,
    objects: &mut Objects,
    key: &(String, String, String),
    target: &Target,
    before: &Value,
) -> Response<Body> {
    let Some(obj) = objects.get_mut(key) else {
        return status(StatusCode::NOT_FOUND, "NotFound", "vanished".into());
    };
    // Fields of disabled gates are dropped before anything is compared, as the apiserver's
    // strategy does, so a write of only such fields stays a no-op.
    if target.resource == "resourceslices" && target.subresource.is_none() {
        store.drop_disabled_fields(obj);
    }
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
    let name = field(before, "metadata.name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if target.subresource.is_none()
        && let Some(message) = store.admit(target, &name, obj)
    {
        *obj = before.clone();
        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message);
    }
    if target.resource == "resourceclaims"
        && target.subresource.as_deref() == Some("status")
        && let Some(message) = crate::admission::claim_status_refusal(obj)
    {
        *obj = before.clone();
        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message);
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
pub(super) fn delete_or_mark(
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

impl super::FakeApi {
    /// Every stored object of a collection path in a namespace ("" when cluster-scoped).
    pub fn objects(&self, collection: &str, namespace: &str) -> Vec<Value> {
        let Ok(objects) = self.store.objects.lock() else {
            return Vec::new();
        };
        objects
            .iter()
            .filter(|((c, ns, _), _)| c == collection && ns == namespace)
            .map(|(_, v)| v.clone())
            .collect()
    }
}
