//! The `admission.k8s.io/v1` AdmissionReview envelope: the request read, the verdict of
//! [`super::rules`] written back with the request's `uid`.
//!
//! Own types rather than kube's `admission` feature, which would bring `json-patch` into the
//! lockfile for the mutating half knic does not use.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::rules::{Cluster, Kind, check};

/// The only review version knic answers (the webhook configuration asks for it alone).
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";
/// The review's kind.
pub const REVIEW_KIND: &str = "AdmissionReview";

/// The HTTP answer to one POST: a review, or a plain-text refusal of a body that is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// 200 with a review; 400 for a body the apiserver would never send.
    pub status: http::StatusCode,
    /// `application/json` for a review, `text/plain` otherwise.
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
}

impl Reply {
    fn bad_request(message: String) -> Reply {
        Reply {
            status: http::StatusCode::BAD_REQUEST,
            content_type: "text/plain; charset=utf-8",
            body: message.into_bytes(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    /// Read only once the version is known to be v1, so a review of another version is
    /// refused for its version and not for a field it lacks.
    request: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    #[serde(default)]
    uid: String,
    kind: GroupVersionKind,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    object: Option<Value>,
    #[serde(default)]
    old_object: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct GroupVersionKind {
    #[serde(default)]
    group: String,
    version: String,
    kind: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut {
    api_version: &'static str,
    kind: &'static str,
    response: Response,
}

#[derive(Debug, Serialize)]
struct Response {
    uid: String,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Status>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

/// The `metav1.Status` of a refusal: 422 and `Invalid`, as the apiserver's own validation
/// answers, so clients treat it as a bad object and not as a failure to retry.
#[derive(Debug, Serialize)]
struct Status {
    code: u16,
    reason: &'static str,
    message: String,
}

/// Answers one request body.
///
/// A body that is not an `admission.k8s.io/v1` AdmissionReview with a request and a `uid` is
/// refused with 400 and a plain-text reason: the apiserver never sends one, so answering with
/// a review would only hide a misconfigured caller. Everything else gets a review with the
/// `uid` echoed: deletes and connects are allowed (knic checks content, not removal), kinds the
/// webhook does not know are allowed with a warning that says so, and the known kinds get the
/// verdict of [`check`].
pub fn answer(body: &[u8], cluster: &dyn Cluster) -> Reply {
    let review: Review = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return Reply::bad_request(format!("malformed AdmissionReview: {e}")),
    };
    if review.api_version != REVIEW_API_VERSION || review.kind != REVIEW_KIND {
        return Reply::bad_request(format!(
            "expected an {REVIEW_API_VERSION} {REVIEW_KIND}, got {:?} {:?}",
            review.api_version, review.kind
        ));
    }
    let Some(request) = review.request else {
        return Reply::bad_request("AdmissionReview has no request".to_owned());
    };
    let request: Request = match serde_json::from_value(request) {
        Ok(r) => r,
        Err(e) => return Reply::bad_request(format!("malformed AdmissionReview request: {e}")),
    };
    if request.uid.is_empty() {
        return Reply::bad_request("AdmissionReview request has no uid".to_owned());
    }
    let gvk = &request.kind;
    let mut response = Response {
        uid: request.uid.clone(),
        allowed: true,
        status: None,
        warnings: Vec::new(),
    };
    match (
        Kind::of(&gvk.group, &gvk.version, &gvk.kind),
        &request.object,
    ) {
        _ if !matches!(request.operation.as_str(), "CREATE" | "UPDATE") => {}
        (None, _) => response.warnings.push(format!(
            "knic does not validate {}/{} {}; allowed unchecked",
            gvk.group, gvk.version, gvk.kind
        )),
        (Some(_), None) => {
            return Reply::bad_request(format!(
                "AdmissionReview request of a {} has no object",
                request.operation
            ));
        }
        (Some(kind), Some(object)) => {
            let verdict = check(kind, object, request.old_object.as_ref(), cluster);
            if let Some(message) = verdict.denial() {
                response.allowed = false;
                response.status = Some(Status {
                    code: 422,
                    reason: "Invalid",
                    message,
                });
            }
            response.warnings = verdict.warnings;
        }
    }
    let out = ReviewOut {
        api_version: REVIEW_API_VERSION,
        kind: REVIEW_KIND,
        response,
    };
    match serde_json::to_vec(&out) {
        Ok(body) => Reply {
            status: http::StatusCode::OK,
            content_type: "application/json",
            body,
        },
        // Strings and booleans always serialize; kept as an answer rather than a panic.
        Err(e) => Reply {
            status: http::StatusCode::INTERNAL_SERVER_ERROR,
            content_type: "text/plain; charset=utf-8",
            body: format!("encoding the AdmissionReview: {e}").into_bytes(),
        },
    }
}
