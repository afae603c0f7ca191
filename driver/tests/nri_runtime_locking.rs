//! The test runtime lets concurrent pod events through the way real runtimes do: one at a time
//! node-wide by default (containerd and CRI-O hold a mutex around every NRI hook), or one at a
//! time per pod when asked to (the per-pod locking proposed for the NRI adaptation). Against
//! knic's real plugin over a Unix socket, with a handler that holds one pod's RunPodSandbox.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use knic_driver::BoxFuture;
use knic_driver::nri::runtime::{CallLocking, TestRuntime};
use knic_driver::nri::{self, NriHandler, NriSettings, PodSandbox};
use tokio::sync::{Semaphore, watch};

const STEP: Duration = Duration::from_secs(5);

/// `held-*` pods wait in RunPodSandbox for a permit of `gate`; every call is logged.
struct Gated {
    log: Mutex<Vec<String>>,
    gate: Semaphore,
}

impl Gated {
    fn note(&self, line: String) {
        self.log.lock().unwrap().push(line);
    }
    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl NriHandler for Gated {
    fn run_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, knic_driver::Result<()>> {
        Box::pin(async move {
            self.note(format!("start run {}", pod.uid));
            if pod.uid.starts_with("held-") {
                self.gate.acquire().await.unwrap().forget();
            }
            self.note(format!("end run {}", pod.uid));
            Ok(())
        })
    }
    fn stop_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, knic_driver::Result<()>> {
        Box::pin(async move {
            self.note(format!("stop {}", pod.uid));
            Ok(())
        })
    }
    fn remove_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, knic_driver::Result<()>> {
        Box::pin(async move {
            self.note(format!("remove {}", pod.uid));
            Ok(())
        })
    }
    fn synchronize(&self, _: Vec<PodSandbox>) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

fn pod(uid: &str) -> PodSandbox {
    PodSandbox {
        id: format!("sandbox-{uid}"),
        name: uid.to_owned(),
        uid: uid.to_owned(),
        namespace: "default".into(),
        netns: Some(PathBuf::from(format!("/var/run/netns/{uid}"))),
        ips: Vec::new(),
    }
}

/// A connected plugin and a runtime shared by tasks.
async fn connect(socket: &Path) -> (Arc<TestRuntime>, Arc<Gated>, watch::Sender<bool>) {
    let mut rt = TestRuntime::listen(socket).await.unwrap();
    let handler = Arc::new(Gated {
        log: Mutex::new(Vec::new()),
        gate: Semaphore::new(0),
    });
    let (stop, rx) = watch::channel(false);
    let settings = NriSettings {
        socket: socket.to_owned(),
        min_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(100),
        ..NriSettings::default()
    };
    tokio::spawn(nri::run(settings, handler.clone(), rx));
    tokio::time::timeout(STEP, rt.accept(Vec::new()))
        .await
        .unwrap()
        .unwrap();
    (Arc::new(rt), handler, stop)
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// Waits until the handler has logged `line`.
async fn logged(handler: &Gated, line: &str) {
    let deadline = tokio::time::Instant::now() + STEP;
    while !handler.log().iter().any(|l| l == line) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never logged {line:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nri_test_runtime_delivers_one_event_at_a_time_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, handler, stop) = connect(&dir.path().join("nri.sock")).await;
    let held = tokio::spawn({
        let rt = rt.clone();
        async move { rt.run_pod_sandbox(&pod("held-1")).await }
    });
    logged(&handler, "start run held-1").await;
    let other = tokio::spawn({
        let rt = rt.clone();
        async move { rt.run_pod_sandbox(&pod("b-2")).await }
    });
    settle().await;
    // Like containerd: b-2 is another pod, but it waits for the runtime's lock.
    assert_eq!(handler.log(), ["start run held-1"]);
    assert!(!other.is_finished());
    handler.gate.add_permits(1);
    held.await.unwrap().unwrap();
    tokio::time::timeout(STEP, other)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        handler.log(),
        [
            "start run held-1",
            "end run held-1",
            "start run b-2",
            "end run b-2"
        ]
    );
    stop.send(true).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nri_test_runtime_with_per_pod_locking_lets_other_pods_through() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, handler, stop) = connect(&dir.path().join("nri.sock")).await;
    rt.set_call_locking(CallLocking::PerPod);
    let held = tokio::spawn({
        let rt = rt.clone();
        async move { rt.run_pod_sandbox(&pod("held-1")).await }
    });
    logged(&handler, "start run held-1").await;
    // The same pod's Stop waits in the runtime behind its Run; another pod goes through.
    let stop_held = tokio::spawn({
        let rt = rt.clone();
        async move { rt.stop_pod_sandbox(&pod("held-1")).await }
    });
    tokio::time::timeout(STEP, rt.run_pod_sandbox(&pod("b-2")))
        .await
        .unwrap()
        .unwrap();
    rt.remove_pod_sandbox(&pod("b-2")).await.unwrap();
    settle().await;
    assert_eq!(
        handler.log(),
        [
            "start run held-1",
            "start run b-2",
            "end run b-2",
            "remove b-2"
        ]
    );
    assert!(!held.is_finished() && !stop_held.is_finished());
    handler.gate.add_permits(1);
    held.await.unwrap().unwrap();
    stop_held.await.unwrap().unwrap();
    assert_eq!(
        handler.log()[4..],
        ["end run held-1".to_owned(), "stop held-1".to_owned()]
    );
    stop.send(true).unwrap();
}
