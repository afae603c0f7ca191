//! The bits every e2e test binary shares: one tokio runtime per trial, errors as failures,
//! real-cluster twins reported as ignored (with the reason printed once) when no cluster is
//! configured, and a polling helper for "eventually" assertions.

use std::future::Future;
use std::time::Duration;

use libtest_mimic::{Failed, Trial};

use crate::cluster::{ENV_KUBECONFIG, RealCluster};

/// Reads the real-cluster settings; prints why real-cluster trials are skipped when unset, and
/// exits with status 2 when they are set but incomplete.
pub fn real_cluster() -> Option<RealCluster> {
    match RealCluster::from_env() {
        Ok(Some(real)) => Some(real),
        Ok(None) => {
            eprintln!("skipped: real-cluster runs (real/*): {ENV_KUBECONFIG} is not set");
            None
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    }
}

/// A trial whose body runs on its own multi-threaded runtime.
pub fn trial<F, Fut>(name: String, ignored: bool, body: F) -> Trial
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>>,
{
    Trial::test(name, move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Failed::from(e.to_string()))?;
        rt.block_on(body())
            .map_err(|e| Failed::from(format!("{e:#}")))
    })
    .with_ignored_flag(ignored)
}

/// Polls `check` every 50 ms until it returns `Ok(Some(_))`, or fails with the last error or
/// `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::from("condition never held");
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("{what}: not reached within {timeout:?} ({last})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
