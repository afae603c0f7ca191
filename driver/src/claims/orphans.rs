//! Prepared claims nobody will unprepare: the kubelet forgets a claim when its own DRA state is
//! lost (a node reinstalled, `/var/lib/kubelet` wiped under a running pod), and its
//! ResourceClaim is then deleted with the pod while knic's checkpoint still holds it. Found on
//! a real cluster: the device stayed "prepared" for the dead claim, the slice offered it as
//! free, the scheduler gave it to the next claim, and every prepare of that claim was refused
//! until the checkpoint was removed by hand.
//!
//! The [`Reaper`] decides, without I/O, which prepared claims to look up and what an answer
//! means; [`reap`] is its loop. A claim is looked up only once nothing of it has been in a pod
//! for [`OrphanSettings::idle`] (so a steady node with its pods running reads nothing), then
//! again with a growing pause while the API still has it. When the API answers that the claim
//! is gone (no such object, another UID, or no longer allocated any of the devices knic
//! prepared), its devices are withheld from the published slices at once and the claim is
//! unprepared through the kubelet's own path (devices home, addresses released, CDI spec
//! removed) once a second answer at least [`OrphanSettings::grace`] later still says so. An
//! error from the API is never taken for "gone": it only delays the decision.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::watch;

use crate::claims::checkpoint::{Checkpoint, PreparedClaim};
use crate::claims::{ClaimRef, ClaimSource, Preparer};
use crate::events::{EventSink, PodRef, Warning};

/// How eagerly prepared claims are checked against the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrphanSettings {
    /// Nothing of a claim in a pod for this long before it is first looked up: the kubelet's
    /// own unprepare normally follows the sandbox stop within seconds.
    pub idle: Duration,
    /// Between the first "gone" answer and the unprepare, confirmed by a second answer.
    pub grace: Duration,
    /// How often the checkpoint is looked at.
    pub period: Duration,
    /// The longest pause between two lookups of a claim the API still has (the pause doubles
    /// from `period` up to this).
    pub max_recheck: Duration,
}

impl Default for OrphanSettings {
    fn default() -> Self {
        OrphanSettings {
            idle: Duration::from_secs(10),
            grace: Duration::from_secs(30),
            period: Duration::from_secs(5),
            max_recheck: Duration::from_secs(600),
        }
    }
}

/// What the API answered about a prepared claim.
#[derive(Debug, Clone)]
pub enum Answer {
    /// No such object.
    Missing,
    /// The object.
    Found(Box<ResourceClaim>),
    /// The read failed; nothing can be concluded.
    Failed(String),
}

/// Why a claim the checkpoint holds is no longer the API's, or `None` while it still is.
pub fn gone_because(prepared: &PreparedClaim, answer: &Answer, driver: &str) -> Option<String> {
    let claim = match answer {
        Answer::Missing => return Some("its ResourceClaim no longer exists".into()),
        Answer::Failed(_) => return None,
        Answer::Found(claim) => claim,
    };
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if uid != prepared.uid {
        return Some(format!(
            "its ResourceClaim was deleted and re-created (uid {uid} now)"
        ));
    }
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let still_ours = prepared.devices.iter().any(|d| {
        results
            .iter()
            .any(|r| r.driver == driver && r.pool == d.pool && r.device == d.device)
    });
    (!still_ours && !prepared.devices.is_empty())
        .then(|| "its ResourceClaim is no longer allocated the devices knic prepared for it".into())
}

/// Whether a device of the claim may be in a pod now (recorded as away from the host).
pub fn in_pod(claim: &PreparedClaim) -> bool {
    claim.attachments.iter().any(|a| a.restore.is_some())
}

/// Per claim: since when it has been idle, when to look it up next, and since when the API
/// has said it is gone.
#[derive(Debug, Clone)]
struct Track {
    idle_since: Instant,
    next: Instant,
    live_answers: u32,
    gone_since: Option<(Instant, String)>,
}

/// What to do with one claim after an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing (still the API's, or nothing can be concluded yet).
    Keep,
    /// Gone: withhold its devices; unprepare after the grace.
    Withhold(String),
    /// Gone twice, `grace` apart: unprepare it now.
    Unprepare(String),
}

/// The decisions, without I/O: which claims to look up, and what an answer means.
#[derive(Debug)]
pub struct Reaper {
    settings: OrphanSettings,
    driver: String,
    tracks: HashMap<String, Track>,
}

impl Reaper {
    /// A reaper for `driver`'s claims.
    pub fn new(driver: impl Into<String>, settings: OrphanSettings) -> Self {
        Reaper {
            settings,
            driver: driver.into(),
            tracks: HashMap::new(),
        }
    }

    /// The claims to look up now. Claims with a device in a pod are not tracked (their pod
    /// still uses them); claims no longer in the checkpoint are forgotten.
    pub fn due(&mut self, checkpoint: &Checkpoint, now: Instant) -> Vec<ClaimRef> {
        self.tracks
            .retain(|uid, _| checkpoint.claims.get(uid).is_some_and(|c| !in_pod(c)));
        let mut due = Vec::new();
        for (uid, claim) in &checkpoint.claims {
            // A KNI attachment has no ResourceClaim to look up: its caller detaches it.
            if in_pod(claim) || knic_proto::names::is_sandbox_claim_uid(uid) {
                continue;
            }
            let track = self.tracks.entry(uid.clone()).or_insert_with(|| Track {
                idle_since: now,
                next: now + self.settings.idle,
                live_answers: 0,
                gone_since: None,
            });
            if now >= track.next {
                due.push(ClaimRef {
                    namespace: claim.namespace.clone(),
                    name: claim.name.clone(),
                    uid: uid.clone(),
                });
            }
        }
        due
    }

    /// Takes the API's answer about `claim`.
    pub fn answer(&mut self, claim: &PreparedClaim, answer: &Answer, now: Instant) -> Action {
        let Some(track) = self.tracks.get_mut(&claim.uid) else {
            return Action::Keep;
        };
        if let Answer::Failed(e) = answer {
            tracing::debug!(claim = %claim.name, error = %e,
                "could not look up a prepared claim; it is not taken for gone");
            track.next = now + self.settings.period;
            return Action::Keep;
        }
        match gone_because(claim, answer, &self.driver) {
            None => {
                track.gone_since = None;
                track.live_answers = track.live_answers.saturating_add(1);
                let pause = self
                    .settings
                    .period
                    .saturating_mul(1 << (track.live_answers - 1).min(16))
                    .min(self.settings.max_recheck);
                track.next = now + pause;
                Action::Keep
            }
            Some(why) => match &track.gone_since {
                Some((since, _)) if now.duration_since(*since) >= self.settings.grace => {
                    track.next = now + self.settings.period;
                    Action::Unprepare(why)
                }
                Some((since, _)) => {
                    track.next = *since + self.settings.grace;
                    Action::Withhold(why)
                }
                None => {
                    track.gone_since = Some((now, why.clone()));
                    track.next = now + self.settings.grace;
                    Action::Withhold(why)
                }
            },
        }
    }

    /// The exclusive devices (by name) of every claim the API has said is gone: they must not
    /// be offered while the claim is still prepared. Shares are left published, since other
    /// shares of the same port are not affected.
    pub fn withheld(&self, checkpoint: &Checkpoint) -> BTreeSet<String> {
        self.tracks
            .iter()
            .filter(|(_, t)| t.gone_since.is_some())
            .filter_map(|(uid, _)| checkpoint.claims.get(uid))
            .flat_map(|c| c.devices.iter())
            .filter(|d| d.share_id.is_none())
            .map(|d| d.device.clone())
            .collect()
    }

    /// How many claims the API has said are gone, still prepared.
    pub fn suspects(&self) -> usize {
        self.tracks
            .values()
            .filter(|t| t.gone_since.is_some())
            .count()
    }

    /// When the claim became idle (tests and logs).
    pub fn idle_since(&self, uid: &str) -> Option<Instant> {
        self.tracks.get(uid).map(|t| t.idle_since)
    }
}

/// The loop: looks the due claims up, withholds the devices of gone ones (sent to `withheld`,
/// which the publisher's pipeline filters by) and unprepares them after the grace, with an
/// Event on the claim and its pod, until `stop` turns true.
pub async fn reap(
    preparer: Arc<Preparer>,
    source: Arc<dyn ClaimSource>,
    events: Arc<dyn EventSink>,
    settings: OrphanSettings,
    withheld: watch::Sender<BTreeSet<String>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut reaper = Reaper::new(knic_proto::DRIVER_NAME, settings);
    let claims = preparer.claims().clone();
    let metrics = crate::metrics::metrics();
    loop {
        match claims.snapshot().await {
            Ok(checkpoint) => {
                let now = Instant::now();
                for due in reaper.due(&checkpoint, now) {
                    let Some(prepared) = checkpoint.claims.get(&due.uid) else {
                        continue;
                    };
                    let answer = match source.get(&due.namespace, &due.name).await {
                        Ok(None) => Answer::Missing,
                        Ok(Some(claim)) => Answer::Found(Box::new(claim)),
                        Err(e) => Answer::Failed(e.to_string()),
                    };
                    match reaper.answer(prepared, &answer, Instant::now()) {
                        Action::Keep => {}
                        Action::Withhold(why) => {
                            tracing::warn!(claim = %due.name, namespace = %due.namespace,
                                uid = %due.uid, reason = %why, grace = ?settings.grace,
                                "a prepared claim is gone from the API; its devices are withheld and it is unprepared after the grace unless it comes back");
                        }
                        Action::Unprepare(why) => {
                            unprepare(&preparer, events.as_ref(), prepared, &due, &why).await;
                        }
                    }
                }
                let after = claims.snapshot().await.unwrap_or(checkpoint);
                let _ = reaper.due(&after, Instant::now());
                let hold = reaper.withheld(&after);
                crate::watches::send_if_changed(&withheld, hold);
                metrics.orphaned_claims.set([], reaper.suspects() as f64);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the checkpoint to look for orphaned claims");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(settings.period) => {}
            _ = stop.changed() => return,
        }
    }
}

async fn unprepare(
    preparer: &Preparer,
    events: &dyn EventSink,
    prepared: &PreparedClaim,
    claim: &ClaimRef,
    why: &str,
) {
    let metrics = crate::metrics::metrics();
    let outcome = preparer
        .unprepare(std::slice::from_ref(claim))
        .await
        .remove(&claim.uid)
        .unwrap_or(Ok(()));
    let message = match &outcome {
        Ok(()) => format!(
            "knic unprepared claim {}/{} (uid {}) itself: {why}, and the kubelet never \
             unprepared it (its DRA state was lost?); its devices are back on the node",
            claim.namespace, claim.name, claim.uid
        ),
        Err(e) => format!(
            "knic could not unprepare claim {}/{} (uid {}), which is orphaned ({why}); its \
             devices stay withheld and it is retried: {e}",
            claim.namespace, claim.name, claim.uid
        ),
    };
    metrics
        .orphans_unprepared
        .inc([crate::metrics::result(&outcome)]);
    match &outcome {
        Ok(()) => tracing::warn!(claim = %claim.name, namespace = %claim.namespace,
            uid = %claim.uid, reason = %why, "orphaned claim unprepared"),
        Err(e) => tracing::error!(claim = %claim.name, namespace = %claim.namespace,
            uid = %claim.uid, reason = %why, error = %e, "could not unprepare an orphaned claim"),
    }
    events.warn(Warning {
        claim: claim.clone(),
        pod: Some(PodRef {
            name: prepared.pod_name.clone(),
            uid: prepared.pod_uid.clone(),
        }),
        action: "UnprepareResources",
        reason: if outcome.is_ok() {
            "OrphanedClaimUnprepared"
        } else {
            "OrphanedClaimUnprepareFailed"
        },
        message,
    });
}

#[cfg(test)]
#[path = "orphans_tests.rs"]
mod tests;
