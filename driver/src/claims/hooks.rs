//! Fail-closed before the sandbox exists: a claim is prepared only while knic is registered
//! with the runtime's NRI, because a sandbox started while it is not would never reach knic's
//! hook (see [`crate::cdi`] for the guard after prepare). Losing the registration for a moment
//! — the runtime restarting, knic reconnecting — is waited out rather than refused: a refusal
//! costs the pod far more than the wait.

use std::time::Duration;

use tokio::sync::watch;

use super::ClaimRef;

/// How long one prepare call waits for knic to be registered with the runtime's NRI before it
/// refuses its claims. The real kubelet (v1.36) retries a failed NodePrepareResources only at
/// its next sync of the pod, 60–90 s later (the e2e twin
/// `real/fail_closed_prepare_refused_without_nri` measured 85 s), while knic registers again
/// within 0.2–5 s of a runtime's socket coming back. Ten seconds bridge a runtime restart and
/// stay far inside the kubelet's 45 s deadline for the call.
pub const RUNTIME_HOOKS_WAIT: Duration = Duration::from_secs(10);

/// Whether knic is registered with the runtime's NRI, where, and how long a prepare waits for
/// it.
pub(super) struct RuntimeHooks {
    connected: watch::Receiver<bool>,
    /// The runtime's NRI socket, named in the refusal.
    pub(super) socket: String,
    /// How long one prepare call waits.
    pub(super) wait: Duration,
}

impl RuntimeHooks {
    /// Follows `connected`, waiting [`RUNTIME_HOOKS_WAIT`].
    pub(super) fn new(connected: watch::Receiver<bool>, socket: impl Into<String>) -> Self {
        RuntimeHooks {
            connected,
            socket: socket.into(),
            wait: RUNTIME_HOOKS_WAIT,
        }
    }

    /// Whether knic is registered with the runtime, waiting for it until `deadline`.
    pub(super) async fn registered(
        &self,
        claim: &ClaimRef,
        deadline: tokio::time::Instant,
    ) -> bool {
        if *self.connected.borrow() {
            return true;
        }
        tracing::info!(claim = %claim.name, namespace = %claim.namespace, socket = %self.socket,
            "prepare waits for knic's registration with the runtime's NRI");
        let mut connected = self.connected.clone();
        let registered = tokio::time::timeout_at(deadline, connected.wait_for(|c| *c)).await;
        matches!(registered, Ok(Ok(_)))
    }
}
