//! `helm install` and `helm uninstall` of the chart against a real cluster, by Helm v4's own
//! engine (helm-python-sdk's `Config.install`/`Config.uninstall`, e2e/python/helm_chart.py):
//! the same code the helm CLI runs, so CRDs, hooks, the kind order, `lookup` (the webhook's
//! self-signed certificate) and the release records behave as they do for a user.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::{RELEASE_NAME, call, chart_dir};

/// Helm's answer to an install or uninstall: the release summary, or Helm's refusal.
pub type Outcome = Result<Value, String>;

fn answer(answer: Value) -> anyhow::Result<Outcome> {
    if let Some(refusal) = answer.get("refused").and_then(Value::as_str) {
        return Ok(Err(refusal.to_owned()));
    }
    Ok(Ok(answer.get("release").cloned().unwrap_or(Value::Null)))
}

/// `helm install knic charts/knic -n NAMESPACE --wait --timeout T [--skip-crds]` with
/// `values` (over values.yaml), into an existing namespace of the cluster of `kubeconfig`.
/// Helm v4 server-side applies the chart's CRDs: where they exist already, applied by another
/// field manager with other content, that is a conflict, and `skip_crds` leaves them be.
pub fn install(
    kubeconfig: &Path,
    namespace: &str,
    values: &Value,
    timeout: Duration,
    skip_crds: bool,
) -> anyhow::Result<Outcome> {
    answer(call(json!({
        "op": "install",
        "chart": chart_dir(),
        "values": values,
        "name": RELEASE_NAME,
        "namespace": namespace,
        "kubeconfig": kubeconfig,
        "timeout": timeout.as_secs(),
        "skip_crds": skip_crds,
    }))?)
}

/// `helm uninstall knic -n NAMESPACE --wait --ignore-not-found --timeout T`.
pub fn uninstall(kubeconfig: &Path, namespace: &str, timeout: Duration) -> anyhow::Result<Outcome> {
    answer(call(json!({
        "op": "uninstall",
        "name": RELEASE_NAME,
        "namespace": namespace,
        "kubeconfig": kubeconfig,
        "timeout": timeout.as_secs(),
    }))?)
}
