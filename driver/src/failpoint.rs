//! Crash injection for the crash-safety tests: with `KNIC_FAILPOINT=<name>` in its environment
//! the driver aborts (no destructors, no clean-up: the same as `kill -9`) the moment it reaches
//! that point. Without the variable every point is a single relaxed load.

use std::sync::OnceLock;

static ARMED: OnceLock<Option<String>> = OnceLock::new();

/// Aborts the process if `name` is the armed failpoint.
pub fn hit(name: &str) {
    let armed = ARMED.get_or_init(|| {
        std::env::var("KNIC_FAILPOINT")
            .ok()
            .filter(|v| !v.is_empty())
    });
    if armed.as_deref() == Some(name) {
        tracing::error!(failpoint = name, "failpoint reached: aborting as if killed");
        std::process::abort();
    }
}
