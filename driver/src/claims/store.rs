//! The one place prepared claims live: the checkpoint file, its lock and its change feed.
//!
//! Prepare/unprepare ([`super::Preparer`]) and attach/detach ([`crate::pods::PodNetworks`])
//! both change prepared claims; each takes this store, so neither reaches the other to record
//! what it did, and every durable change is on disk before the caller goes on.
//!
//! Writes are group-committed: each fsync'd write costs milliseconds, and pods attached at
//! once would otherwise queue one write each behind the lock. A change is queued; whoever gets
//! the lock next writes every queued change in one file replacement and tells each caller,
//! so N concurrent callers share about two writes instead of paying for N. The in-memory
//! state is replaced only after its write succeeded, so a failed write leaves nothing that
//! is not on disk except [`ClaimStore::note`]s, which are in-memory by design.

use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::{Mutex, MutexGuard, oneshot, watch};

use crate::claims::checkpoint::{Checkpoint, CheckpointStore, PreparedClaim};
use crate::error::{Error, Result};

/// A change to one prepared claim, by UID.
pub type Change = (String, Box<dyn FnOnce(&mut PreparedClaim) + Send>);

/// One caller's changes waiting for a durable write.
struct Waiting {
    id: u64,
    changes: Vec<Change>,
    /// A newly prepared claim to add (a change to the set of claims).
    insert: Option<PreparedClaim>,
    done: oneshot::Sender<Result<()>>,
}

/// Changes not yet in the state: notes (applied by the next lock holder) and durable changes
/// (applied and written by the next writer).
#[derive(Default)]
struct Queue {
    next_id: u64,
    notes: Vec<Change>,
    durable: Vec<Waiting>,
}

/// The prepared claims of this node, loaded from and saved to the checkpoint.
pub struct ClaimStore {
    file: CheckpointStore,
    /// `Err` holds why the checkpoint could not be read; it is retried on every call so an
    /// operator's repair takes effect without a restart.
    state: Mutex<Result<Checkpoint>>,
    /// A plain mutex, never held across an await: queuing must not wait for a write.
    queue: StdMutex<Queue>,
    /// Checkpoint files written by this store, for tests and benchmarks.
    writes: AtomicU64,
    /// Notes applied to the state since the last write: the file lags behind memory.
    noted: AtomicBool,
    /// Order of writes, taken under the state lock: a write's generation.
    generation: AtomicU64,
    /// The generation on disk, held while a file is written. A writer cancelled while its
    /// blocking save runs releases the state lock with the save still going; without this a
    /// later, newer write could finish first and the orphan's rename land over it.
    on_disk: std::sync::Arc<StdMutex<u64>>,
    /// Bumped after every change to the prepared set, so the publisher re-merges retained
    /// devices.
    changes: watch::Sender<u64>,
}

/// Takes a queued durable change back out if its caller gives up before a writer took it, so
/// a cancelled call does not change the checkpoint later.
struct Unqueue<'a> {
    store: &'a ClaimStore,
    id: u64,
    armed: bool,
}

impl Drop for Unqueue<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.store.queue().durable.retain(|w| w.id != self.id);
        }
    }
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
            queue: StdMutex::default(),
            writes: AtomicU64::new(0),
            noted: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            on_disk: std::sync::Arc::default(),
            changes: watch::channel(0).0,
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes the store's lock for a read-check-write that must not interleave with others.
    /// Queued notes are applied first, so every reader sees them.
    pub async fn lock(&self) -> Locked<'_> {
        let mut locked = Locked {
            store: self,
            state: self.state.lock().await,
        };
        let notes = std::mem::take(&mut self.queue().notes);
        if let Ok(checkpoint) = locked.state.as_mut()
            && !notes.is_empty()
        {
            apply(checkpoint, notes);
            self.noted.store(true, Ordering::Relaxed);
        }
        locked
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
    pub async fn update(
        &self,
        uid: &str,
        change: impl FnOnce(&mut PreparedClaim) + Send + 'static,
    ) -> Result<()> {
        self.update_each(vec![(uid.to_owned(), Box::new(change))])
            .await
    }

    /// Changes several prepared claims in one durable write, shared with whatever other
    /// callers queued meanwhile. Returns once the changes are on disk (or their write failed:
    /// then none of them is in the state either).
    pub async fn update_each(&self, changes: Vec<Change>) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        self.queue_and_write(changes, None).await
    }

    /// Queues a durable change and waits for the write that carries it: the caller's own,
    /// or an earlier writer's that took it along.
    async fn queue_and_write(
        &self,
        changes: Vec<Change>,
        insert: Option<PreparedClaim>,
    ) -> Result<()> {
        let (id, outcome) = self.enqueue(changes, insert);
        self.written(id, outcome).await
    }

    fn enqueue(
        &self,
        changes: Vec<Change>,
        insert: Option<PreparedClaim>,
    ) -> (u64, oneshot::Receiver<Result<()>>) {
        let (done, outcome) = oneshot::channel();
        let mut queue = self.queue();
        let id = queue.next_id;
        queue.next_id += 1;
        queue.durable.push(Waiting {
            id,
            changes,
            insert,
            done,
        });
        (id, outcome)
    }

    /// Waits until queued change `id` is written (or its write failed), writing it if no
    /// earlier writer took it along.
    async fn written(&self, id: u64, mut outcome: oneshot::Receiver<Result<()>>) -> Result<()> {
        let mut unqueue = Unqueue {
            store: self,
            id,
            armed: true,
        };
        // Fair lock: whoever holds it now is writing; when it is ours, either an earlier
        // writer took our changes (the outcome is there) or we write everything queued.
        let mut locked = self.lock().await;
        unqueue.armed = false;
        match outcome.try_recv() {
            Ok(result) => return result,
            Err(oneshot::error::TryRecvError::Closed) => return Err(abandoned()),
            Err(oneshot::error::TryRecvError::Empty) => {}
        }
        let next = match locked.checkpoint() {
            Ok(now) => now.clone(),
            Err(e) => {
                self.queue().durable.retain(|w| w.id != id);
                return Err(e);
            }
        };
        locked.commit(next, false).await?;
        outcome.await.unwrap_or_else(|_| Err(abandoned()))
    }

    /// Changes one prepared claim in memory only: the change is seen by every later reader
    /// and reaches the disk with the next durable write. For facts a crash may lose because
    /// recovery finds them again (an attach's "done" mark: recovery checks the kernel).
    pub fn note(&self, uid: &str, change: impl FnOnce(&mut PreparedClaim) + Send + 'static) {
        let mut queue = self.queue();
        queue.notes.push((uid.to_owned(), Box::new(change)));
    }

    /// Writes the notes no durable write has carried yet (at a clean shutdown, so a restart
    /// trusts them instead of re-checking the kernel); nothing when there are none.
    pub async fn flush(&self) -> Result<()> {
        let mut locked = self.lock().await;
        if !self.noted.load(Ordering::Relaxed) {
            return Ok(());
        }
        let next = locked.checkpoint()?.clone();
        locked.write(next, false).await
    }

    /// How many checkpoint files this store has written since it was opened.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Fires after every change to the set of prepared claims (not to attachments).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

fn abandoned() -> Error {
    Error::io(
        "writing the checkpoint",
        std::io::Error::other("the write carrying this change was abandoned"),
    )
}

/// Applies changes to the claims they name; a claim that is gone is left alone.
fn apply(checkpoint: &mut Checkpoint, changes: Vec<Change>) {
    for (uid, change) in changes {
        if let Some(claim) = checkpoint.claims.get_mut(&uid) {
            change(claim);
        }
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

    /// The checkpoint plus the claims queued to be added by the next write ([`Locked::add`]):
    /// what a prepare checks a new claim against, since any of them may be on disk soon.
    /// Borrowed unless a claim is queued: every prepare and rescan asks, and a copy of the
    /// whole checkpoint is paid only when there is something to add to it.
    pub fn with_queued(&mut self) -> Result<std::borrow::Cow<'_, Checkpoint>> {
        let queued: Vec<PreparedClaim> = self
            .store
            .queue()
            .durable
            .iter()
            .filter_map(|waiting| waiting.insert.clone())
            .collect();
        let checkpoint = self.checkpoint()?;
        if queued.is_empty() {
            return Ok(std::borrow::Cow::Borrowed(checkpoint));
        }
        let mut view = checkpoint.clone();
        for claim in queued {
            view.claims.insert(claim.uid.clone(), claim);
        }
        Ok(std::borrow::Cow::Owned(view))
    }

    /// Adds a newly prepared claim durably, giving up the lock while the write is pending,
    /// so prepares at once share writes; returns once the claim is on disk. Until then only
    /// [`Locked::with_queued`] sees it; if the write fails it is not added at all.
    pub async fn add(self, claim: PreparedClaim) -> Result<()> {
        let store = self.store;
        // Queued before the lock goes, so the next holder's checks see the claim.
        let (id, outcome) = store.enqueue(Vec::new(), Some(claim));
        drop(self);
        store.written(id, outcome).await
    }

    /// Writes `next` durably and makes it current; `membership` says the set of claims changed
    /// (subscribers are told). Durable changes other callers queued ride along.
    pub async fn save(&mut self, next: Checkpoint, membership: bool) -> Result<()> {
        self.commit(next, membership).await
    }

    /// Writes `next` with every queued durable change applied, unless that changes nothing
    /// on disk's behalf (the state already equals it), and answers each queued caller.
    async fn commit(&mut self, mut next: Checkpoint, membership: bool) -> Result<()> {
        let batch = std::mem::take(&mut self.store.queue().durable);
        let mut answers = Vec::with_capacity(batch.len());
        let mut membership = membership;
        for waiting in batch {
            apply(&mut next, waiting.changes);
            if let Some(claim) = waiting.insert {
                next.claims.insert(claim.uid.clone(), claim);
                membership = true;
            }
            answers.push(waiting.done);
        }
        let unchanged = matches!(&*self.state, Ok(now) if *now == next);
        let result = if unchanged {
            Ok(())
        } else {
            self.write(next, membership).await
        };
        for done in answers {
            let answer = match &result {
                Ok(()) => Ok(()),
                // Error is not Clone: every caller gets the same text.
                Err(e) => Err(Error::io(
                    "writing the checkpoint",
                    std::io::Error::other(e.to_string()),
                )),
            };
            // A caller that went away needs no answer.
            let _ = done.send(answer);
        }
        result
    }

    async fn write(&mut self, next: Checkpoint, membership: bool) -> Result<()> {
        let file = self.store.file.clone();
        let written = next.clone();
        let generation = self.store.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let on_disk = std::sync::Arc::clone(&self.store.on_disk);
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut last = on_disk
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *last > generation {
                // An orphan of a cancelled writer: a newer state is already on disk.
                return Ok(());
            }
            file.save(&written)?;
            *last = generation;
            Ok(())
        })
        .await
        .map_err(|e| Error::io("checkpoint writer", std::io::Error::other(e)))??;
        self.store.writes.fetch_add(1, Ordering::Relaxed);
        // The state written includes every note applied so far (under this lock).
        self.store.noted.store(false, Ordering::Relaxed);
        *self.state = Ok(next);
        if membership {
            self.store.changes.send_modify(|n| *n += 1);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
