// Group commit: concurrent changes share durable writes, every caller returns only once its
// change is on disk, a failed write reaches every caller it carried, notes ride along.

use std::sync::Arc;
use std::sync::mpsc;

use super::*;

/// A file write held until the test releases it: the write says it started, then waits.
pub(super) struct Hold {
    started: mpsc::Sender<()>,
    release: mpsc::Receiver<()>,
}

impl Hold {
    /// Runs on the blocking thread of the write, before the file is touched.
    pub(super) fn wait(self) {
        let _ = self.started.send(());
        let _ = self.release.recv();
    }
}

/// Holds `store`'s next file write: returns when it started, and the sender that releases it.
fn hold_next_write(store: &ClaimStore) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (started, started_rx) = mpsc::channel();
    let (release_tx, release) = mpsc::channel();
    *store.core.hold.lock().expect("hold") = Some(Hold { started, release });
    (started_rx, release_tx)
}

fn claim(uid: &str) -> PreparedClaim {
    PreparedClaim {
        network_label: None,
        namespace: "ns".into(),
        name: uid.into(),
        uid: uid.into(),
        pod_uid: "pod".into(),
        pod_name: "pod".into(),
        devices: vec![],
        configs: vec![],
        prepared_at: 0,
        attachments: vec![],
        allocations: vec![],
        functions: vec![],
    }
}

/// A store over `dir` holding claims `c0`..`c{n-1}`.
async fn store(dir: &std::path::Path, n: usize) -> ClaimStore {
    let store = ClaimStore::open(CheckpointStore::new(dir));
    let mut locked = store.lock().await;
    let mut next = locked.checkpoint().expect("checkpoint").clone();
    for i in 0..n {
        next.claims.insert(format!("c{i}"), claim(&format!("c{i}")));
    }
    locked.save(next, true).await.expect("save");
    drop(locked);
    store
}

fn on_disk(dir: &std::path::Path) -> Checkpoint {
    CheckpointStore::new(dir).load().expect("load")
}

#[tokio::test]
async fn concurrent_updates_share_writes_and_each_returns_once_its_change_is_durable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(store(dir.path(), 16).await);
    let before = store.writes();
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let (store, path) = (store.clone(), dir.path().to_owned());
        tasks.push(tokio::spawn(async move {
            let uid = format!("c{i}");
            store
                .update(&uid, move |c| c.prepared_at = i + 1)
                .await
                .expect("update");
            // Returned: the file must already have it.
            on_disk(&path).claims[&uid].prepared_at
        }));
    }
    for (i, task) in (0..16u64).zip(tasks) {
        assert_eq!(
            task.await.expect("task"),
            i + 1,
            "c{i} not durable on return"
        );
    }
    // The first caller writes alone; everyone who queued meanwhile shares the second write.
    let writes = store.writes() - before;
    assert!(writes <= 2, "16 concurrent updates took {writes} writes");
    let disk = on_disk(dir.path());
    assert!((0..16u64).all(|i| disk.claims[&format!("c{i}")].prepared_at == i + 1));
}

#[tokio::test]
async fn several_claims_change_in_one_write_and_no_change_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path(), 3).await;
    let before = store.writes();
    let changes: Vec<Change> = (0..3u64)
        .map(|i| {
            let change = move |c: &mut PreparedClaim| c.prepared_at = 10 + i;
            (format!("c{i}"), Box::new(change) as _)
        })
        .collect();
    store.update_each(changes).await.expect("update_each");
    assert_eq!(store.writes() - before, 1);
    let disk = on_disk(dir.path());
    assert_eq!(disk.claims["c2"].prepared_at, 12);
    // The same values again, and a claim that is gone: nothing to write.
    assert!(
        store
            .update("c2", |c| c.prepared_at = 12)
            .await
            .expect("same")
    );
    assert!(
        !store
            .update("gone", |c| c.prepared_at = 1)
            .await
            .expect("gone"),
        "a change to a claim that is gone is reported as not made"
    );
    assert_eq!(store.writes() - before, 1);
}

#[tokio::test]
async fn a_change_to_a_claim_that_is_gone_is_dropped_and_named_and_the_others_are_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path(), 1).await;
    let changes: Vec<Change> = ["gone", "c0", "gone"]
        .into_iter()
        .map(|uid| {
            let change = |c: &mut PreparedClaim| c.prepared_at = 4;
            (uid.to_owned(), Box::new(change) as _)
        })
        .collect();
    let gone = store.update_each(changes).await.expect("update_each");
    assert_eq!(gone, ["gone"]);
    let disk = on_disk(dir.path());
    assert_eq!(disk.claims["c0"].prepared_at, 4);
    assert!(
        !disk.claims.contains_key("gone"),
        "nothing is created for it"
    );
}

#[tokio::test]
async fn a_write_whose_caller_is_cancelled_finishes_and_memory_agrees_with_the_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(store(dir.path(), 2).await);
    // Two callers queue behind a held lock: the first to lock writes both in one file write.
    let held = store.lock().await;
    let writer = {
        let store = store.clone();
        tokio::spawn(async move { store.update("c0", |c| c.prepared_at = 9).await })
    };
    while store.queue().durable.is_empty() {
        tokio::task::yield_now().await;
    }
    let carried = {
        let store = store.clone();
        tokio::spawn(async move { store.update("c1", |c| c.prepared_at = 5).await })
    };
    while store.queue().durable.len() < 2 {
        tokio::task::yield_now().await;
    }
    let (started, release) = hold_next_write(&store);
    drop(held);
    tokio::task::spawn_blocking(move || started.recv())
        .await
        .expect("join")
        .expect("the write started");
    // The writer's caller gives up while its file write runs.
    writer.abort();
    let cancelled = writer.await.expect_err("the writer was cancelled");
    assert!(cancelled.is_cancelled(), "{cancelled}");
    // A reader now waits for the write, not for a state the disk is about to leave behind.
    let reader = {
        let store = store.clone();
        tokio::spawn(async move { store.snapshot().await })
    };
    release.send(()).expect("release");
    assert!(
        carried
            .await
            .expect("task")
            .expect("the carried change is written"),
        "c1 was prepared"
    );
    let memory = reader.await.expect("task").expect("snapshot");
    let disk = on_disk(dir.path());
    assert_eq!(
        (
            memory.claims["c0"].prepared_at,
            memory.claims["c1"].prepared_at
        ),
        (9, 5),
        "the finished write is the state"
    );
    assert_eq!(memory, disk, "memory and disk agree");
    // A later write is made from that state: the cancelled caller's change is not undone.
    store
        .update("c1", |c| c.prepared_at = 6)
        .await
        .expect("update");
    let disk = on_disk(dir.path());
    assert_eq!(
        (disk.claims["c0"].prepared_at, disk.claims["c1"].prepared_at),
        (9, 6)
    );
}

#[tokio::test]
async fn a_note_is_read_at_once_and_reaches_the_disk_with_the_next_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path(), 2).await;
    let before = store.writes();
    store.note("c0", |c| c.prepared_at = 5);
    let seen = store.claim("c0").await.expect("store").expect("claim");
    assert_eq!(seen.prepared_at, 5);
    assert_eq!(store.writes(), before, "a note writes nothing");
    assert_eq!(on_disk(dir.path()).claims["c0"].prepared_at, 0);
    store
        .update("c1", |c| c.prepared_at = 6)
        .await
        .expect("update");
    let disk = on_disk(dir.path());
    assert_eq!(
        (disk.claims["c0"].prepared_at, disk.claims["c1"].prepared_at),
        (5, 6)
    );
}

#[tokio::test]
async fn flush_writes_pending_notes_once_and_nothing_without_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path(), 1).await;
    let before = store.writes();
    store.flush().await.expect("flush");
    assert_eq!(store.writes(), before, "nothing noted, nothing written");
    store.note("c0", |c| c.prepared_at = 3);
    store.flush().await.expect("flush");
    assert_eq!(store.writes() - before, 1);
    assert_eq!(on_disk(dir.path()).claims["c0"].prepared_at, 3);
    store.flush().await.expect("again");
    assert_eq!(store.writes() - before, 1, "already on disk");
}

#[tokio::test]
async fn a_failed_write_fails_every_caller_it_carried_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    drop(store(dir.path(), 2).await);
    let size = std::fs::metadata(dir.path().join("checkpoint.json"))
        .map(|m| m.len())
        .unwrap_or(4096);
    // Room to read the file back, none for a claim grown by 64 KiB.
    let store = Arc::new(ClaimStore::open(
        CheckpointStore::new(dir.path()).with_limit(size + 1024),
    ));
    let held = store.lock().await;
    let small = {
        let store = store.clone();
        tokio::spawn(async move { store.update("c0", |c| c.prepared_at = 1).await })
    };
    let big = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .update("c1", |c| c.pod_name = "x".repeat(65_536))
                .await
        })
    };
    // Both queue behind the held lock, so one write carries both.
    while store.queue().durable.len() < 2 {
        tokio::task::yield_now().await;
    }
    drop(held);
    for task in [small, big] {
        let err = task
            .await
            .expect("task")
            .expect_err("the write fails")
            .to_string();
        assert!(err.contains("over the") && err.contains("limit"), "{err}");
    }
    let now = store.snapshot().await.expect("snapshot");
    assert_eq!(
        now.claims["c0"].prepared_at, 0,
        "a failed write leaves no trace"
    );
    assert_eq!(now.claims["c1"].pod_name, "pod");
}

#[tokio::test]
async fn a_caller_that_gives_up_before_its_write_changes_nothing_later() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(store(dir.path(), 2).await);
    let held = store.lock().await;
    let abandoned = {
        let store = store.clone();
        tokio::spawn(async move { store.update("c0", |c| c.prepared_at = 9).await })
    };
    while store.queue().durable.is_empty() {
        tokio::task::yield_now().await;
    }
    abandoned.abort();
    let _ = abandoned.await;
    drop(held);
    store
        .update("c1", |c| c.prepared_at = 1)
        .await
        .expect("update");
    let disk = on_disk(dir.path());
    assert_eq!(disk.claims["c0"].prepared_at, 0);
    assert_eq!(disk.claims["c1"].prepared_at, 1);
}

#[tokio::test]
async fn added_claims_share_writes_and_the_next_lock_holder_sees_them_queued() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(store(dir.path(), 0).await);
    let before = store.writes();
    let held = store.lock().await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut locked = store.lock().await;
            let seen = locked.with_queued().expect("view").claims.len();
            locked.add(claim(&format!("n{i}"))).await.expect("add");
            seen
        }));
    }
    // Everyone waits behind the held lock; then each checks and queues in turn.
    tokio::task::yield_now().await;
    drop(held);
    let mut seen = Vec::new();
    for task in tasks {
        seen.push(task.await.expect("task"));
    }
    seen.sort_unstable();
    // Each prepare's checks saw every claim queued or written before it.
    assert_eq!(seen, (0..8).collect::<Vec<_>>());
    let writes = store.writes() - before;
    assert!(writes < 8, "8 adds took {writes} writes");
    assert_eq!(on_disk(dir.path()).claims.len(), 8);
    assert_eq!(store.snapshot().await.expect("snapshot").claims.len(), 8);
}
