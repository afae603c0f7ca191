//! The one place prepared claims live: the checkpoint file, its lock and its change feed.
//!
//! Prepare/unprepare ([`super::Preparer`]) and attach/detach ([`crate::pods::PodNetworks`])
//! both change prepared claims; each takes this store, so neither reaches the other to record
//! what it did, and every change is durable before the caller goes on.

use tokio::sync::{Mutex, MutexGuard, watch};

use crate::claims::checkpoint::{Checkpoint, CheckpointStore, PreparedClaim};
use crate::error::{Error, Result};

/// The prepared claims of this node, loaded from and saved to the checkpoint.
pub struct ClaimStore {
    file: CheckpointStore,
    /// `Err` holds why the checkpoint could not be read; it is retried on every call so an
    /// operator's repair takes effect without a restart.
    state: Mutex<Result<Checkpoint>>,
    /// Bumped after every change to the prepared set, so the publisher re-merges retained
    /// devices.
    changes: watch::Sender<u64>,
}

impl ClaimStore {
    /// Loads the checkpoint. A corrupt one does not stop the driver: it is logged and every
    /// call answers with the error until the file is repaired or removed.
    pub fn open(file: CheckpointStore) -> Self {
        let checkpoint = file.load();
        if let Err(e) = &checkpoint {
            tracing::error!(error = %e, "cannot read the checkpoint");
        }
        if let Ok(cp) = &checkpoint {
            tracing::info!(path = %file.path().display(), claims = cp.claims.len(), "checkpoint loaded");
        }
        ClaimStore {
            file,
            state: Mutex::new(checkpoint),
            changes: watch::channel(0).0,
        }
    }

    /// Takes the store's lock for a read-check-write that must not interleave with others.
    pub async fn lock(&self) -> Locked<'_> {
        Locked {
            store: self,
            state: self.state.lock().await,
        }
    }

    /// The prepared claims of one pod (NRI events arrive keyed by pod UID).
    pub async fn claims_for_pod(&self, pod_uid: &str) -> Result<Vec<PreparedClaim>> {
        let mut locked = self.lock().await;
        Ok(locked
            .checkpoint()?
            .claims
            .values()
            .filter(|c| c.pod_uid == pod_uid)
            .cloned()
            .collect())
    }

    /// One prepared claim as the checkpoint has it now.
    pub async fn claim(&self, uid: &str) -> Result<Option<PreparedClaim>> {
        let mut locked = self.lock().await;
        Ok(locked.checkpoint()?.claims.get(uid).cloned())
    }

    /// A snapshot of every prepared claim.
    pub async fn snapshot(&self) -> Result<Checkpoint> {
        let mut locked = self.lock().await;
        Ok(locked.checkpoint()?.clone())
    }

    /// Changes one prepared claim durably (the checkpoint is written before this returns); a
    /// claim that is gone meanwhile is left alone, and a change that changes nothing writes
    /// nothing.
    pub async fn update(&self, uid: &str, change: impl FnOnce(&mut PreparedClaim)) -> Result<()> {
        let mut locked = self.lock().await;
        let checkpoint = locked.checkpoint()?;
        let Some(claim) = checkpoint.claims.get(uid) else {
            return Ok(());
        };
        let mut claim = claim.clone();
        change(&mut claim);
        if checkpoint.claims.get(uid) == Some(&claim) {
            return Ok(());
        }
        let mut next = checkpoint.clone();
        next.claims.insert(uid.to_string(), claim);
        locked.save(next, false).await
    }

    /// Fires after every change to the set of prepared claims (not to attachments).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

/// The store, locked.
pub struct Locked<'a> {
    store: &'a ClaimStore,
    state: MutexGuard<'a, Result<Checkpoint>>,
}

impl Locked<'_> {
    /// The checkpoint, re-read first if it could not be read before (the operator may have
    /// repaired or removed the file).
    pub fn checkpoint(&mut self) -> Result<&Checkpoint> {
        if self.state.is_err() {
            *self.state = self.store.file.load();
        }
        self.state
            .as_ref()
            .map_err(|e| Error::CheckpointUnreadable(e.to_string()))
    }

    /// Writes `next` durably and makes it current; `membership` says the set of claims changed
    /// (subscribers are told).
    pub async fn save(&mut self, next: Checkpoint, membership: bool) -> Result<()> {
        let file = self.store.file.clone();
        let written = next.clone();
        tokio::task::spawn_blocking(move || file.save(&written))
            .await
            .map_err(|e| Error::io("checkpoint writer", std::io::Error::other(e)))??;
        *self.state = Ok(next);
        if membership {
            self.store.changes.send_modify(|n| *n += 1);
        }
        Ok(())
    }
}
