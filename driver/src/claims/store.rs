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
//!
//! A write, once started, finishes on its own: it runs in a task that owns the store's lock,
//! makes the written state current and answers every caller it carries before the lock goes.
//! A writer whose caller is cancelled mid-write (a hook timing out) therefore never leaves the
//! disk ahead of memory, never lets a later write be computed from the older state, and never
//! tells the callers it carried that a change now on disk failed.
//!
//! A change names its claim by UID; a claim unprepared meanwhile has nothing to apply it to,
//! so the change is dropped, logged, and its UID handed back to the caller (a caller that
//! recorded a device's restore state must know it was not recorded).

use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::{Mutex, OwnedMutexGuard, oneshot, watch};

use crate::claims::checkpoint::{Checkpoint, CheckpointStore, PreparedClaim};
use crate::error::{Error, Result};

/// A change to one prepared claim, by UID.
pub type Change = (String, Box<dyn FnOnce(&mut PreparedClaim) + Send>);

/// What a durable change's caller is told: the write's outcome and, when it succeeded, the
/// UIDs of the caller's claims that were gone (their changes were dropped).
type Outcome = Result<Vec<String>>;

/// One caller's changes waiting for a durable write.
struct Waiting {
    id: u64,
    changes: Vec<Change>,
    /// A newly prepared claim to add (a change to the set of claims).
    insert: Option<PreparedClaim>,
    done: oneshot::Sender<Outcome>,
}

/// A carried caller's answer channel and the UIDs of its claims that were gone.
type Answer = (oneshot::Sender<Outcome>, Vec<String>);

/// Changes not yet in the state: notes (applied by the next lock holder) and durable changes
/// (applied and written by the next writer).
#[derive(Default)]
struct Queue {
    next_id: u64,
    notes: Vec<Change>,
    durable: Vec<Waiting>,
}

/// What [`ClaimStore::retire_if_empty`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retired<T> {
    /// Claims are prepared: the checkpoint and everything else were kept.
    Kept {
        /// How many.
        claims: usize,
    },
    /// Nothing was prepared: the checkpoint file is gone, and this is what `then` returned.
    Removed(T),
}

/// The prepared claims of this node, loaded from and saved to the checkpoint.
pub struct ClaimStore {
    /// What a write's task needs after its caller may have gone (see the module doc).
    core: Arc<Core>,
    /// A plain mutex, never held across an await: queuing must not wait for a write.
    queue: StdMutex<Queue>,
}

/// The state and the file, shared with the task of a write in progress.
struct Core {
    file: CheckpointStore,
    /// `Err` holds why the checkpoint could not be read; it is retried on every call so an
    /// operator's repair takes effect without a restart. Owned guards, so a write's task can
    /// hold it past its caller.
    state: Arc<Mutex<Result<Checkpoint>>>,
    /// Checkpoint files written by this store, for tests and benchmarks.
    writes: AtomicU64,
    /// Notes applied to the state since the last write: the file lags behind memory.
    noted: AtomicBool,
    /// Bumped after every change to the prepared set, so the publisher re-merges retained
    /// devices.
    changes: watch::Sender<u64>,
    /// Tests hold the next file write here, to cancel its caller while it runs.
    #[cfg(test)]
    hold: StdMutex<Option<tests::Hold>>,
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
            core: Arc::new(Core {
                file,
                state: Arc::new(Mutex::new(checkpoint)),
                writes: AtomicU64::new(0),
                noted: AtomicBool::new(false),
                changes: watch::channel(0).0,
                #[cfg(test)]
                hold: StdMutex::default(),
            }),
            queue: StdMutex::default(),
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
        let mut state = Arc::clone(&self.core.state).lock_owned().await;
        let notes = std::mem::take(&mut self.queue().notes);
        if let Ok(checkpoint) = state.as_mut()
            && !notes.is_empty()
        {
            // A note for a claim that is gone is only logged: nothing waits for it.
            let _gone = apply(checkpoint, notes);
            self.core.noted.store(true, Ordering::Relaxed);
        }
        Locked {
            store: self,
            state: Some(state),
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
    /// change that changes nothing writes nothing. Returns false when the claim was gone
    /// (unprepared meanwhile): nothing was changed.
    pub async fn update(
        &self,
        uid: &str,
        change: impl FnOnce(&mut PreparedClaim) + Send + 'static,
    ) -> Result<bool> {
        let gone = self
            .update_each(vec![(uid.to_owned(), Box::new(change))])
            .await?;
        Ok(gone.is_empty())
    }

    /// Changes several prepared claims in one durable write, shared with whatever other
    /// callers queued meanwhile. Returns once the changes are on disk (or their write failed:
    /// then none of them is in the state either), with the UIDs of the claims that were gone
    /// (unprepared meanwhile), whose changes were dropped; the others are written.
    pub async fn update_each(&self, changes: Vec<Change>) -> Result<Vec<String>> {
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        let (id, outcome) = self.enqueue(changes, None);
        self.written(id, outcome).await
    }

    fn enqueue(
        &self,
        changes: Vec<Change>,
        insert: Option<PreparedClaim>,
    ) -> (u64, oneshot::Receiver<Outcome>) {
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
    async fn written(&self, id: u64, mut outcome: oneshot::Receiver<Outcome>) -> Outcome {
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
        if !self.core.noted.load(Ordering::Relaxed) {
            return Ok(());
        }
        let next = locked.checkpoint()?.clone();
        locked.write(next, false, Vec::new()).await
    }

    /// At a graceful stop: when no claim is prepared (none on disk, none queued to be added),
    /// removes the checkpoint file and then runs `then` (removing what only prepared claims
    /// need, e.g. the CDI hook), all under the store's lock, so no prepare slips in between.
    /// A missing file is read as the empty checkpoint, so the next start sees exactly what the
    /// file said, and an uninstall leaves no file behind. With claims prepared nothing is
    /// touched and their number is returned: a restart or an upgrade must find them. An
    /// unreadable checkpoint is an error and nothing is removed either: it may hold claims.
    pub async fn retire_if_empty<T>(&self, then: impl FnOnce() -> Result<T>) -> Result<Retired<T>> {
        let mut locked = self.lock().await;
        let prepared = locked.with_queued()?.claims.len();
        if prepared > 0 {
            return Ok(Retired::Kept { claims: prepared });
        }
        // Not fsync'd: a removal a crash undoes brings back a file that says the same.
        let path = self.core.file.path();
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(format!("removing {}", path.display()), e));
            }
            _ => {}
        }
        Ok(Retired::Removed(then()?))
    }

    /// How many checkpoint files this store has written since it was opened.
    pub fn writes(&self) -> u64 {
        self.core.writes.load(Ordering::Relaxed)
    }

    /// Fires after every change to the set of prepared claims (not to attachments).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.core.changes.subscribe()
    }
}

impl Core {
    /// Writes `next` to the file and makes it the state; `state` is the lock's guard, held by
    /// the write's task, so this runs to the end whatever happens to the caller.
    async fn save(
        &self,
        state: &mut Result<Checkpoint>,
        next: Checkpoint,
        membership: bool,
    ) -> Result<()> {
        let file = self.file.clone();
        #[cfg(test)]
        let hold = self
            .hold
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let next = tokio::task::spawn_blocking(move || -> Result<Checkpoint> {
            #[cfg(test)]
            if let Some(hold) = hold {
                hold.wait();
            }
            file.save(&next)?;
            Ok(next)
        })
        .await
        .map_err(|e| Error::io("checkpoint writer", std::io::Error::other(e)))??;
        self.writes.fetch_add(1, Ordering::Relaxed);
        // The state written includes every note applied so far (under this lock).
        self.noted.store(false, Ordering::Relaxed);
        *state = Ok(next);
        if membership {
            self.changes.send_modify(|n| *n += 1);
        }
        Ok(())
    }
}

fn abandoned() -> Error {
    Error::io(
        "writing the checkpoint",
        std::io::Error::other("the write carrying this change was abandoned"),
    )
}

/// Applies changes to the claims they name. A claim that is gone (unprepared meanwhile) has
/// nothing to apply its change to: the change is dropped, logged, and its UID returned (once).
fn apply(checkpoint: &mut Checkpoint, changes: Vec<Change>) -> Vec<String> {
    let mut gone = Vec::new();
    for (uid, change) in changes {
        match checkpoint.claims.get_mut(&uid) {
            Some(claim) => change(claim),
            None => {
                tracing::warn!(claim_uid = %uid, "a change to a claim that is no longer prepared was dropped");
                if !gone.contains(&uid) {
                    gone.push(uid);
                }
            }
        }
    }
    gone
}

/// Every carried caller's answer: the write's outcome, with its own gone claims on success.
fn answer(answers: Vec<Answer>, result: &Result<()>) {
    for (done, gone) in answers {
        let outcome = match result {
            Ok(()) => Ok(gone),
            // Error is not Clone: every caller gets the same text.
            Err(e) => Err(Error::io(
                "writing the checkpoint",
                std::io::Error::other(e.to_string()),
            )),
        };
        // A caller that went away needs no answer.
        let _ = done.send(outcome);
    }
}

/// The store, locked.
pub struct Locked<'a> {
    store: &'a ClaimStore,
    /// `None` only once a write this handle started was cancelled: its task holds the lock
    /// until the write is done, and this handle no longer does.
    state: Option<OwnedMutexGuard<Result<Checkpoint>>>,
}

impl Locked<'_> {
    /// The locked state, or why this handle lost it.
    fn state(&mut self) -> Result<&mut OwnedMutexGuard<Result<Checkpoint>>> {
        self.state.as_mut().ok_or_else(|| {
            Error::io(
                "writing the checkpoint",
                std::io::Error::other("the store's lock went with a cancelled write"),
            )
        })
    }

    /// The checkpoint, re-read first if it could not be read before (the operator may have
    /// repaired or removed the file).
    pub fn checkpoint(&mut self) -> Result<&Checkpoint> {
        let file = &self.store.core.file;
        let state = self.state()?;
        if state.is_err() {
            **state = file.load();
        }
        state
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
        store.written(id, outcome).await.map(drop)
    }

    /// Writes `next` durably and makes it current; `membership` says the set of claims changed
    /// (subscribers are told). Durable changes other callers queued ride along.
    pub async fn save(&mut self, next: Checkpoint, membership: bool) -> Result<()> {
        self.commit(next, membership).await
    }

    /// Writes `next` with every queued durable change applied, unless that changes nothing
    /// on disk's behalf (the state already equals it), and answers each queued caller.
    async fn commit(&mut self, mut next: Checkpoint, membership: bool) -> Result<()> {
        // Before the batch is taken: a handle without the lock must leave it queued.
        self.state()?;
        let batch = std::mem::take(&mut self.store.queue().durable);
        let mut answers: Vec<Answer> = Vec::with_capacity(batch.len());
        let mut membership = membership;
        for waiting in batch {
            let gone = apply(&mut next, waiting.changes);
            if let Some(claim) = waiting.insert {
                next.claims.insert(claim.uid.clone(), claim);
                membership = true;
            }
            answers.push((waiting.done, gone));
        }
        let unchanged = matches!(&**self.state()?, Ok(now) if *now == next);
        if unchanged {
            answer(answers, &Ok(()));
            return Ok(());
        }
        self.write(next, membership, answers).await
    }

    /// Writes `next` and makes it current in a task that takes this handle's lock along and
    /// answers `answers` itself: cancelling the caller cannot cut the write off between the
    /// file and the state, nor lose the answers (see the module doc). The lock comes back
    /// once both are done.
    async fn write(
        &mut self,
        next: Checkpoint,
        membership: bool,
        answers: Vec<Answer>,
    ) -> Result<()> {
        let mut state = match self.state.take() {
            Some(state) => state,
            None => {
                let lost = self.state().map(drop);
                answer(answers, &lost);
                return lost;
            }
        };
        let core = Arc::clone(&self.store.core);
        let task = tokio::spawn(async move {
            let result = core.save(&mut state, next, membership).await;
            answer(answers, &result);
            (state, result)
        });
        let (state, result) = task
            .await
            .map_err(|e| Error::io("checkpoint writer", std::io::Error::other(e)))?;
        self.state = Some(state);
        result
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
