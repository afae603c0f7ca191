//! Requests that fail on demand, with the answers a real kube-apiserver gives: an optimistic
//! lock conflict, priority-and-fairness throttling with `Retry-After`, an internal error (etcd
//! timing out), and a request that is never answered (a stuck apiserver or proxy, a half-open
//! connection). Each is armed for the next N requests a matcher selects, so a test proves what
//! happens after the fault as well as during it.

use http::{Method, Response, StatusCode};
use serde_json::json;

use super::{Body, Store, parse_path, respond};

/// How a request fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFault {
    /// 409 `Conflict`, "the object has been modified", as for a write decided on an older
    /// resourceVersion (or a storage race the apiserver gave up on).
    Conflict,
    /// 429 `TooManyRequests` with a `Retry-After` header and `details.retryAfterSeconds`, as
    /// API priority and fairness rejects a request it will not queue.
    TooManyRequests {
        /// Seconds the client must wait before trying again.
        retry_after_secs: u64,
    },
    /// 500 `InternalError`, as when etcd times out.
    Internal,
    /// No answer at all, ever: the client's own timeout must end the request.
    Hang,
    /// 404 `NotFound` with "the server could not find the requested resource", as the
    /// apiserver answers for a resource whose CRD is not installed.
    NoSuchResource,
}

/// A fault armed for the next `left` requests matching `method` and `path`.
#[derive(Debug, Clone)]
pub(super) struct Armed {
    /// `None`: any method.
    method: Option<String>,
    /// Whole path segments of the request's path ([`path_matches`]).
    path: String,
    fault: RequestFault,
    left: usize,
}

impl Armed {
    /// Parses `matcher`: `"METHOD path-substring"` (e.g. `"PATCH /resourceclaims/c/status"`),
    /// `"* substring"` for any method.
    pub(super) fn new(matcher: &str, fault: RequestFault, count: usize) -> anyhow::Result<Armed> {
        let (method, path) = matcher.trim().split_once(' ').ok_or_else(|| {
            anyhow::anyhow!("request matcher {matcher:?}: want \"METHOD path-substring\"")
        })?;
        let method = match method {
            "*" => None,
            m => Some(
                m.parse::<Method>()
                    .map_err(|_| anyhow::anyhow!("request matcher {matcher:?}: bad method"))?
                    .to_string(),
            ),
        };
        Ok(Armed {
            method,
            path: path.trim().to_owned(),
            fault,
            left: count,
        })
    }
}

/// Whether `pattern` occurs in `path` ending at a segment boundary, so a matcher for
/// `/networkaddresses/a-17` does not also select `/networkaddresses/a-172` (a flake once).
pub fn path_matches(path: &str, pattern: &str) -> bool {
    path.match_indices(pattern)
        .any(|(at, _)| matches!(path.as_bytes().get(at + pattern.len()), None | Some(b'/')))
}

impl Store {
    /// The fault the request gets, if one is armed for it; counts it down.
    pub(super) fn take_fault(&self, method: &Method, path: &str) -> Option<RequestFault> {
        let mut armed = self.request_faults.lock().ok()?;
        let i = armed.iter().position(|a| {
            a.left > 0
                && a.method.as_deref().is_none_or(|m| m == method.as_str())
                && path_matches(path, &a.path)
        })?;
        armed[i].left -= 1;
        let fault = armed[i].fault;
        if armed[i].left == 0 {
            armed.remove(i);
        }
        Some(fault)
    }
}

/// The apiserver's answer for `fault` to a request for `path`; never returns for
/// [`RequestFault::Hang`].
pub(super) async fn answer(fault: RequestFault, path: &str) -> Response<Body> {
    let target = parse_path(path);
    let (resource, name) = target
        .as_ref()
        .map(|t| (t.resource.clone(), t.name.clone().unwrap_or_default()))
        .unwrap_or_default();
    let group = target
        .as_ref()
        .map(|t| {
            t.group_version
                .strip_prefix("apis/")
                .and_then(|gv| gv.split_once('/'))
                .map(|(g, _)| g.to_owned())
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let qualified = if group.is_empty() {
        resource.clone()
    } else {
        format!("{resource}.{group}")
    };
    match fault {
        RequestFault::Conflict => respond(
            StatusCode::CONFLICT,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("Operation cannot be fulfilled on {qualified} \"{name}\": the \
                    object has been modified; please apply your changes to the latest version and \
                    try again"),
                "reason": "Conflict",
                "details": {"name": name, "group": group, "kind": resource},
                "code": 409}),
        ),
        RequestFault::TooManyRequests { retry_after_secs } => {
            let mut resp = respond(
                StatusCode::TOO_MANY_REQUESTS,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "message": "Too many requests, please try again later.",
                    "reason": "TooManyRequests",
                    "details": {"retryAfterSeconds": retry_after_secs}, "code": 429}),
            );
            if let Ok(v) = http::HeaderValue::from_str(&retry_after_secs.to_string()) {
                resp.headers_mut().insert(http::header::RETRY_AFTER, v);
            }
            resp
        }
        RequestFault::Internal => respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Internal error occurred: etcdserver: request timed out",
                "reason": "InternalError",
                "details": {"causes": [{"message": "etcdserver: request timed out"}]},
                "code": 500}),
        ),
        RequestFault::Hang => std::future::pending().await,
        RequestFault::NoSuchResource => respond(
            StatusCode::NOT_FOUND,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "the server could not find the requested resource",
                "reason": "NotFound", "details": {}, "code": 404}),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::path_matches;

    #[test]
    fn a_matcher_selects_whole_segments_only() {
        let p = "/apis/knic.dev/v1alpha1/networkaddresses/af-1-192-0-2-172";
        assert!(path_matches(p, "/networkaddresses/af-1-192-0-2-172"));
        assert!(path_matches(p, "/networkaddresses"));
        assert!(!path_matches(p, "/networkaddresses/af-1-192-0-2-17"));
        assert!(path_matches("/apis/x/networks/n/status", "/networks/n"));
        assert!(!path_matches(
            "/apis/x/networks/n/status",
            "/networks/n/stat"
        ));
    }
}
