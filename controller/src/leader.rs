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
//! A replica that fails to renew within `duration` must stop: [`Elector::hold`] returns, and the
//! binary exits so that its pod restarts as a candidate.

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
        }
    }

    fn seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// One attempt: `true` when this replica holds the lease afterwards (acquired or renewed).
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
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

    /// Waits until this replica holds the lease, retrying every `duration / 3`.
    pub async fn acquire(&self) -> Result<()> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "trying to acquire the leader lease"),
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews the lease every `duration / 3` and returns once leadership is lost: taken over,
    /// or not renewed for a whole `duration` (the others may already have taken over).
    pub async fn hold(&self) -> Error {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.duration / 3).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => renewed = Instant::now(),
                Ok(false) => {
                    return Error::LeadershipLost(format!(
                        "lease {} is held by another replica",
                        self.name
                    ));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the leader lease");
                    if renewed.elapsed() >= self.duration {
                        return Error::LeadershipLost(format!(
                            "lease {} not renewed for {:?}: {e}",
                            self.name, self.duration
                        ));
                    }
                }
            }
        }
    }
}
