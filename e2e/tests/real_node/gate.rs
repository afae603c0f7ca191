//! A gate on the real runtime's sandbox start: a second NRI plugin, registered with the node's
//! containerd at index 05 so the runtime calls it before knic (index 10), that holds the first
//! `RunPodSandbox` of a pod in the test's namespace until the test let it go. The runtime calls
//! it only after the kubelet prepared the pod's claims and the sandbox's network namespace
//! exists, so "the gate was reached" is the exact instant between prepare and knic's hook, and
//! the test can freeze knic there deterministically instead of racing the kubelet. The gate
//! changes nothing (it answers every event with success) and holds for at most
//! [`HOLD`], well inside the runtime's 2 s per-plugin timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use knic_driver::BoxFuture;
use knic_driver::nri::{NriHandler, NriSettings, PodSandbox};
use tokio::sync::{Notify, mpsc, watch};

/// The longest the gate holds a sandbox start.
const HOLD: Duration = Duration::from_millis(1500);

struct Gate {
    namespace: String,
    armed: AtomicBool,
    arrived: mpsc::UnboundedSender<PodSandbox>,
    release: Notify,
}

impl NriHandler for Gate {
    fn run_pod_sandbox(&self, pod: PodSandbox) -> BoxFuture<'_, knic_driver::Result<()>> {
        Box::pin(async move {
            if pod.namespace == self.namespace && self.armed.swap(false, Ordering::SeqCst) {
                let _ = self.arrived.send(pod);
                let _ = tokio::time::timeout(HOLD, self.release.notified()).await;
            }
            Ok(())
        })
    }

    fn stop_pod_sandbox(&self, _: PodSandbox) -> BoxFuture<'_, knic_driver::Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn remove_pod_sandbox(&self, _: PodSandbox) -> BoxFuture<'_, knic_driver::Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn synchronize(&self, _: Vec<PodSandbox>) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// The registered gate; unregisters (closes its connection) when dropped.
pub struct SandboxGate {
    gate: Arc<Gate>,
    arrivals: mpsc::UnboundedReceiver<PodSandbox>,
    _stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SandboxGate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SandboxGate {
    /// Registers with the runtime at `socket`, armed for the first sandbox of `namespace`.
    pub async fn register(socket: &std::path::Path, namespace: &str) -> anyhow::Result<Self> {
        let (arrived, arrivals) = mpsc::unbounded_channel();
        let gate = Arc::new(Gate {
            namespace: namespace.to_owned(),
            armed: AtomicBool::new(true),
            arrived,
            release: Notify::new(),
        });
        let settings = NriSettings {
            socket: socket.to_owned(),
            plugin_name: "knic-e2e-gate".into(),
            plugin_index: "05".into(),
            ..NriSettings::default()
        };
        let (stop, stopped) = watch::channel(false);
        let (connected, mut registered) = watch::channel(false);
        let task = tokio::spawn(knic_driver::nri::run_reporting(
            settings,
            gate.clone(),
            stopped,
            connected,
        ));
        tokio::time::timeout(Duration::from_secs(20), registered.wait_for(|c| *c))
            .await
            .context("the runtime did not register the gate plugin within 20 s")??;
        Ok(SandboxGate {
            gate,
            arrivals,
            _stop: stop,
            task,
        })
    }

    /// Waits until the runtime starts the armed sandbox (it is then held) and returns it.
    pub async fn reached(&mut self, timeout: Duration) -> anyhow::Result<PodSandbox> {
        tokio::time::timeout(timeout, self.arrivals.recv())
            .await
            .with_context(|| format!("no sandbox reached the gate within {timeout:?}"))?
            .context("the gate plugin stopped")
    }

    /// Lets the held sandbox start go on to the next plugin (knic).
    pub fn open(&self) {
        self.gate.release.notify_one();
    }
}
