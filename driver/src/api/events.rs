//! Events (`events.k8s.io/v1`) on claims and pods, written in the background and rate-limited
//! per object and reason (see [`crate::events`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;

use crate::bounded;
use crate::events::{EVENT_WINDOW, EventSink, Limiter, Warning};
use crate::metrics::metrics;

/// `reportingController` of every driver Event (a qualified name, as the apiserver requires).
pub const REPORTING_CONTROLLER: &str = "knic.dev/driver";

/// The apiserver's limits (`pkg/apis/core/validation/events.go`).
const NOTE_LIMIT: usize = 1024;
const INSTANCE_LIMIT: usize = 128;
/// Room left in a 253-character name for `.` and the 16-digit suffix.
const NAME_PREFIX_LIMIT: usize = 253 - 17;

/// Writes Events through the API, at most one per object and reason per
/// [`EVENT_WINDOW`].
#[derive(Clone)]
pub struct KubeEvents {
    client: kube::Client,
    instance: String,
    limiter: Arc<Mutex<Limiter>>,
}

impl KubeEvents {
    /// Events reported as `knic-driver-<node>` (the `reportingInstance`).
    pub fn new(client: kube::Client, node: &str) -> Self {
        KubeEvents {
            client,
            instance: reporting_instance(node),
            limiter: Arc::new(Mutex::new(Limiter::new(EVENT_WINDOW))),
        }
    }

    fn admit(&self, uid: &str, reason: &str) -> Option<u32> {
        let admitted = self
            .limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(uid, reason, Instant::now());
        if admitted.is_none() {
            metrics().events.inc([reason, "suppressed"]);
        }
        admitted
    }

    async fn send(&self, warning: Warning) {
        let claim_ref = ObjectReference {
            api_version: Some("resource.k8s.io/v1".into()),
            kind: Some("ResourceClaim".into()),
            namespace: Some(warning.claim.namespace.clone()),
            name: Some(warning.claim.name.clone()),
            uid: Some(warning.claim.uid.clone()),
            ..Default::default()
        };
        // The claim first: while its Event is held back, the kubelet's retries do not each
        // read the claim again to find its pods.
        let claim_count = self.admit(&warning.claim.uid, warning.reason);
        let pods = match (&warning.pod, claim_count) {
            (Some(pod), _) => vec![(pod.name.clone(), pod.uid.clone())],
            (None, Some(_)) => self.reserved_pods(&warning).await,
            (None, None) => Vec::new(),
        };
        let mut regarding = Vec::new();
        if let Some(count) = claim_count {
            regarding.push((claim_ref.clone(), None, count));
        }
        for (name, uid) in pods {
            let pod = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(warning.claim.namespace.clone()),
                name: Some(name),
                uid: Some(uid),
                ..Default::default()
            };
            if let Some(count) = self.admit(&uid_of(&pod), warning.reason) {
                regarding.push((pod, Some(claim_ref.clone()), count));
            }
        }
        for (object, related, count) in regarding {
            let event = event(
                &object,
                related,
                &warning,
                count,
                Timestamp::now(),
                &self.instance,
            );
            let api: kube::Api<Event> =
                kube::Api::namespaced(self.client.clone(), &warning.claim.namespace);
            match api.create(&PostParams::default(), &event).await {
                Ok(_) => metrics().events.inc([warning.reason, "sent"]),
                Err(e) => {
                    metrics().events.inc([warning.reason, "failed"]);
                    tracing::warn!(reason = warning.reason, object = ?object.name, error = %e,
                        "could not write an Event");
                }
            }
        }
    }

    /// The pods the claim is reserved for (prepare happens for them), read from the API.
    async fn reserved_pods(&self, warning: &Warning) -> Vec<(String, String)> {
        let api: kube::Api<ResourceClaim> =
            kube::Api::namespaced(self.client.clone(), &warning.claim.namespace);
        let claim = match api.get_opt(&warning.claim.name).await {
            Ok(Some(claim)) => claim,
            Ok(None) => return Vec::new(),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the claim's pods for an Event");
                return Vec::new();
            }
        };
        claim
            .status
            .and_then(|s| s.reserved_for)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
            .map(|r| (r.name, r.uid))
            .collect()
    }
}

impl EventSink for KubeEvents {
    fn warn(&self, warning: Warning) {
        let this = self.clone();
        tokio::spawn(async move { this.send(warning).await });
    }
}

fn uid_of(object: &ObjectReference) -> String {
    object.uid.clone().unwrap_or_default()
}

/// `knic-driver-<node>`, cut to the apiserver's 128 characters.
pub fn reporting_instance(node: &str) -> String {
    bounded_prefix(&format!("knic-driver-{node}"), INSTANCE_LIMIT)
}

/// The longest prefix of `text` within `max` bytes, cut at a character boundary.
fn bounded_prefix(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// The Event for one object, as the apiserver's `events.k8s.io/v1` validation wants it:
/// `eventTime`, `reportingController`/`reportingInstance`, `action`, `reason`, a note within
/// 1024 bytes, and a `series` (count at least 2) when it stands for occurrences held back.
pub fn event(
    regarding: &ObjectReference,
    related: Option<ObjectReference>,
    warning: &Warning,
    count: u32,
    now: Timestamp,
    instance: &str,
) -> Event {
    let object = regarding.name.as_deref().unwrap_or("knic");
    // A subdomain cut short may end in '-' or '.', which must not precede the suffix.
    let prefix = bounded_prefix(object, NAME_PREFIX_LIMIT);
    let prefix = prefix.trim_end_matches(['-', '.']);
    let nanos = u64::try_from(now.as_nanosecond()).unwrap_or(0);
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{prefix}.{nanos:016x}")),
            namespace: regarding.namespace.clone(),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        // An applied live update is news, not trouble; every other reason is a failure.
        type_: Some(
            if warning.reason == crate::pods::update::EVENT_UPDATED {
                "Normal"
            } else {
                "Warning"
            }
            .into(),
        ),
        action: Some(warning.action.into()),
        reason: Some(warning.reason.into()),
        note: Some(bounded::cap_text(&warning.message, NOTE_LIMIT).into_owned()),
        regarding: Some(regarding.clone()),
        related,
        reporting_controller: Some(REPORTING_CONTROLLER.into()),
        reporting_instance: Some(instance.into()),
        series: (count > 1).then(|| EventSeries {
            count: i32::try_from(count).unwrap_or(i32::MAX),
            last_observed_time: MicroTime(now),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::ClaimRef;

    fn warning(message: String) -> Warning {
        Warning {
            claim: ClaimRef {
                namespace: "ns".into(),
                name: "c".into(),
                uid: "claim-uid".into(),
            },
            pod: None,
            action: "PrepareResources",
            reason: "PrepareFailed",
            message,
        }
    }

    #[test]
    fn events_fit_the_apiserver_limits() {
        let long_name = format!("{}-x", "a".repeat(300));
        let regarding = ObjectReference {
            name: Some(long_name),
            namespace: Some("ns".into()),
            ..Default::default()
        };
        let now = Timestamp::UNIX_EPOCH;
        let e = event(
            &regarding,
            None,
            &warning("m".repeat(5000)),
            3,
            now,
            &reporting_instance(&"n".repeat(253)),
        );
        let name = e.metadata.name.clone().unwrap_or_default();
        assert!(name.len() <= 253, "{}", name.len());
        assert!(
            knic_proto::names::check_dns_subdomain(&name).is_ok(),
            "{name}"
        );
        assert!(e.note.as_deref().unwrap_or_default().len() <= 1024);
        assert_eq!(e.reporting_instance.as_deref().map(str::len), Some(128));
        assert_eq!(e.series.as_ref().map(|s| s.count), Some(3));
        let single = event(&regarding, None, &warning("m".into()), 1, now, "i");
        assert!(single.series.is_none());
        assert_eq!(single.note.as_deref(), Some("m"));
        assert_eq!(single.type_.as_deref(), Some("Warning"));
        // An applied live update is the one Normal Event.
        let mut applied = warning("MTU 1450→1400".into());
        applied.reason = crate::pods::update::EVENT_UPDATED;
        let normal = event(&regarding, None, &applied, 1, now, "i");
        assert_eq!(normal.type_.as_deref(), Some("Normal"));
        assert_eq!(
            single.reporting_controller.as_deref(),
            Some("knic.dev/driver")
        );
    }
}
