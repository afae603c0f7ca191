//! Leader election over a `coordination.k8s.io/v1` Lease, so two controller replicas never
//! reconcile at once (they would fight over which Network of a conflicting pair wins only in
//! timing, but they would double every write and every Event).
//!
//! The algorithm is client-go's: the holder renews `renewTime` every `duration / 3`; a candidate
//! takes the lease over when the record has not changed for a whole `duration` *as observed by
//! its own clock* (never by comparing the holder's timestamp with the local time, so clock skew
//! between nodes cannot make two replicas leaders). Every write is an update carrying the
//! resourceVersion it was decided on, so of two candidates racing for an expired lease exactly
//! one wins and the other gets a conflict.
//!
//! A replica that fails to renew within its renew deadline (`2 × duration / 3`, counted from the
//! moment its last successful renewal *started*, which is never later than the moment any other
//! replica saw that renewal) must stop: [`Elector::hold`] returns, and the binary exits so that
//! its pod restarts as a candidate. Each attempt is cut off at that deadline, because the
//! client has no read timeout and a request to a partitioned apiserver would otherwise hang
//! while another replica takes over.
//!
//! A replica that stops cleanly gives the lease up with [`Elector::release`] (client-go's
//! `ReleaseOnCancel`), so the next replica takes over at its next attempt instead of waiting a
//! whole duration.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::{Error, Result};

/// One replica's view of a Lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    /// The last record seen (holder and renewTime, as strings) and when this replica first saw
    /// it: the lease is expired once the same record has been seen for `duration`.
    observed: Mutex<Option<(String, Instant)>>,
    /// When the last write that made or kept this replica the holder started (before its read),
    /// so the renew deadline is counted from no later than any other replica's observation.
    renewed: Mutex<Option<Instant>>,
}

impl Elector {
    /// An elector for Lease `namespace/name`, competing as `identity` (e.g. the pod name).
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
            observed: Mutex::new(None),
            renewed: Mutex::new(None),
        }
    }

    fn seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// How long after the start of its last successful renewal the holder gives up: two thirds
    /// of the duration (client-go's 10 s of 15 s), so it stops well before any candidate, whose
    /// count starts no earlier, can take over.
    fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }

    /// The pause between attempts after a failed renewal: several retries fit in the deadline.
    fn retry_period(&self) -> Duration {
        (self.duration / 10).max(Duration::from_millis(10))
    }

    fn set_renewed(&self, at: Option<Instant>) {
        if let Ok(mut renewed) = self.renewed.lock() {
            *renewed = at;
        }
    }

    fn last_renewed(&self) -> Option<Instant> {
        self.renewed.lock().ok().and_then(|r| *r)
    }

    /// One attempt: `true` when this replica holds the lease afterwards (acquired or renewed).
    /// Not bounded in time (the client has no read timeout); [`Elector::acquire`] and
    /// [`Elector::hold`] bound it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let started = Instant::now();
        let held = self.attempt().await?;
        if held {
            self.set_renewed(Some(started));
        }
        Ok(held)
    }

    async fn attempt(&self) -> Result<bool> {
        let now = MicroTime(Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.seconds()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder != self.identity && !holder.is_empty() && !self.expired(spec) {
            return Ok(false);
        }
        if holder != self.identity {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(self.seconds());
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the record in `spec` has stayed unchanged for a whole lease duration on this
    /// replica's clock.
    fn expired(&self, spec: &LeaseSpec) -> bool {
        let record = format!(
            "{:?}/{:?}",
            spec.holder_identity,
            spec.renew_time.as_ref().map(|t| t.0)
        );
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.duration, Duration::from_secs);
        let Ok(mut observed) = self.observed.lock() else {
            return false;
        };
        match observed.as_ref() {
            Some((seen, since)) if *seen == record => since.elapsed() >= duration,
            _ => {
                *observed = Some((record, Instant::now()));
                false
            }
        }
    }

    /// Waits until this replica holds the lease, retrying every `duration / 3`. Each attempt is
    /// cut off after `duration`, so a hung request cannot stall the candidate for good.
    pub async fn acquire(&self) -> Result<()> {
        self.acquire_observed(&|_| {}).await
    }

    /// [`Elector::acquire`], telling `standby` after every attempt whether this replica is a
    /// healthy standby (the lease was read and is held by another) or not (the API failed).
    pub async fn acquire_observed(&self, standby: &(dyn Fn(bool) + Sync)) -> Result<()> {
        loop {
            match tokio::time::timeout(self.duration, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => return Ok(()),
                Ok(Ok(false)) => standby(true),
                Ok(Err(e)) => {
                    standby(false);
                    tracing::warn!(error = %e, "trying to acquire the leader lease");
                }
                Err(_) => {
                    standby(false);
                    let timeout = self.duration;
                    tracing::warn!(?timeout, "trying to acquire the leader lease timed out");
                }
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews the lease every `duration / 3` and returns once leadership is lost: taken over,
    /// or not renewed within the renew deadline (`2 × duration / 3` after the last successful
    /// renewal started; a renewal still in flight then is abandoned), so the caller has stopped
    /// before any other replica can have taken over.
    pub async fn hold(&self) -> Error {
        let deadline = self.renew_deadline();
        let mut wait = self.duration / 3;
        let mut last_error = String::from("no answer");
        loop {
            let renewed = self.last_renewed().unwrap_or_else(Instant::now);
            let until = renewed + deadline;
            tokio::time::sleep(wait.min(until.saturating_duration_since(Instant::now()))).await;
            let left = until.saturating_duration_since(Instant::now());
            let outcome = if left.is_zero() {
                None
            } else {
                tokio::time::timeout(left, self.try_acquire_or_renew())
                    .await
                    .ok()
            };
            match outcome {
                Some(Ok(true)) => wait = self.duration / 3,
                Some(Ok(false)) => {
                    return Error::LeadershipLost(format!(
                        "lease {} is held by another replica",
                        self.name
                    ));
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "renewing the leader lease");
                    last_error = e.to_string();
                    wait = self.retry_period();
                }
                None => {
                    return Error::LeadershipLost(format!(
                        "lease {} not renewed within the renew deadline of {deadline:?} (last \
                         error: {last_error})",
                        self.name
                    ));
                }
            }
        }
    }

    /// Gives the lease up if this replica still holds it, so another replica takes over at its
    /// next attempt instead of after a whole duration (client-go's `ReleaseOnCancel`): clears
    /// `holderIdentity`, sets the duration to one second and keeps `leaseTransitions`. The
    /// update carries the resourceVersion of the read that found this replica holding, so a
    /// lease taken over in between is left alone. `true` when it was released; call it only
    /// after the work the lease guards has stopped, and never while [`Elector::hold`] runs
    /// (which would take the free lease right back).
    pub async fn release(&self) -> Result<bool> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(false);
        }
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                self.set_renewed(None);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}
