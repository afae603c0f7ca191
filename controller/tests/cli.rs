//! The controller binary's start-up contract: a bad setting fails at once, before any API call,
//! with a message naming the flag (or its environment twin) and the rule.
//!
//! Also the reason cargo builds `knic-controller` for `cargo test --workspace`: the e2e test that
//! sends SIGTERM to two real controller processes finds the binary next to the test executables.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_knic-controller");

/// Runs the binary with a clean environment plus `envs`, and a kubeconfig path that does not
/// exist, so a run that got past flag checking fails on that instead of reaching a cluster.
fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_clear()
        .env("KUBECONFIG", "/nonexistent/knt-kubeconfig");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn fails_with(args: &[&str], envs: &[(&str, &str)], wanted: &str) {
    let out = run(args, envs);
    assert!(!out.status.success(), "{args:?} {envs:?} succeeded");
    let err = stderr(&out);
    assert!(err.contains(wanted), "{args:?} {envs:?}: {err}");
}

#[test]
fn zero_intervals_are_refused_not_clamped() {
    fails_with(
        &["--resync-seconds", "0"],
        &[],
        "invalid value '0' for '--resync-seconds <RESYNC_SECONDS>': 0 is not in 1..18446744073709551615",
    );
    fails_with(
        &[],
        &[("KNIC_GC_SECONDS", "0")],
        "invalid value '0' for '--gc-seconds <GC_SECONDS>': 0 is not in 1..18446744073709551615",
    );
    fails_with(
        &["--gc-seconds", "soon"],
        &[],
        "invalid value 'soon' for '--gc-seconds <GC_SECONDS>': invalid digit found in string",
    );
}

#[test]
fn leader_namespace_must_be_a_namespace_name() {
    for bad in ["Kube_System", "-knic", "a.b", ""] {
        let flag = format!("--leader-namespace={bad}");
        fails_with(
            &[&flag],
            &[],
            &format!(
                "invalid value '{bad}' for '--leader-namespace <LEADER_NAMESPACE>': {bad:?} is \
                 not a namespace name (a DNS label"
            ),
        );
    }
    fails_with(
        &[],
        &[("KNIC_LEADER_NAMESPACE", "Knic")],
        "invalid value 'Knic' for '--leader-namespace <LEADER_NAMESPACE>'",
    );
}

#[test]
fn log_settings_and_booleans_are_checked() {
    fails_with(
        &["--log-format", "xml"],
        &[],
        "invalid value 'xml' for '--log-format <LOG_FORMAT>'",
    );
    fails_with(&["--log-level", "info,["], &[], "--log-level \"info,[\"");
    fails_with(
        &["--leader-elect", "maybe"],
        &[],
        "invalid value 'maybe' for '--leader-elect <LEADER_ELECT>'",
    );
}

#[test]
fn a_missing_kubeconfig_is_named() {
    let out = run(&["--leader-elect", "false"], &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("reading kubeconfig /nonexistent/knt-kubeconfig"),
        "{err}"
    );
}
