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
        .env("KUBECONFIG", "/nonexistent/knt-kubeconfig")
        .env("KNIC_HTTP_ADDRESS", "");
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
    // The driver's texts (knic_proto::logging), word for word.
    fails_with(
        &["--log-format", "xml"],
        &[],
        "invalid value 'xml' for '--log-format <LOG_FORMAT>': \"xml\" is not a log format: use \
         text (one readable line per event; human is the same) or json (one object per line)",
    );
    let out = run(&["--log-level", "info,["], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "knic-controller: invalid --log-level/KNIC_LOG_LEVEL \"info,[\": invalid filter \
         directive (want a tracing filter: a level such as info, or comma-separated \
         target=level directives such as info,knic_driver=debug)\n"
    );
    // The driver's old spelling of text is accepted (the run fails later, on the kubeconfig).
    fails_with(
        &["--log-format", "human"],
        &[],
        "knic-controller: reading kubeconfig /nonexistent/knt-kubeconfig",
    );
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

#[test]
fn an_empty_identity_is_refused() {
    // The lease reads an empty holder as "free": two replicas named "" would both lead.
    for bad in ["", " ", "\t\n"] {
        let flag = format!("--identity={bad}");
        fails_with(
            &[&flag],
            &[],
            &format!(
                "invalid value '{bad}' for '--identity <IDENTITY>': {bad:?} is not a replica \
                 identity (it must not be empty or only whitespace"
            ),
        );
        fails_with(
            &[],
            &[("POD_NAME", bad)],
            &format!("invalid value '{bad}' for '--identity <IDENTITY>'"),
        );
    }
    fails_with(
        &["--identity", "knic\u{1b}[2J"],
        &[],
        "is not a replica identity (it must not contain control characters)",
    );
    // A good identity gets past the check (and fails later, on the missing kubeconfig).
    fails_with(
        &["--identity", "knic-controller-0"],
        &[],
        "reading kubeconfig /nonexistent/knt-kubeconfig",
    );
}

/// Asserts `cause` occurs exactly once in `err` (an error that embeds its source and also
/// reports it as its cause would print it twice).
fn once(err: &str, cause: &str) {
    assert_eq!(
        err.matches(cause).count(),
        1,
        "{cause:?} not exactly once in: {err}"
    );
}

#[test]
fn error_texts_name_their_cause_once() {
    let enoent = "No such file or directory (os error 2)";
    let out = run(&[], &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.starts_with("knic-controller: reading kubeconfig /nonexistent/knt-kubeconfig: "),
        "{err}"
    );
    once(&err, enoent);

    // No kubeconfig and not in a cluster: kube's inference error embeds its causes too.
    let out = Command::new(BIN)
        .env_clear()
        .env("HOME", "/nonexistent/knt-home")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("failed to infer config"), "{err}");
    once(&err, enoent);

    let out = run(&["--log-level", "info,["], &[]);
    let err = stderr(&out);
    once(&err, "invalid filter directive");
}

#[test]
fn webhook_settings_are_checked_at_start() {
    fails_with(
        &["--webhook-address", "nope"],
        &[],
        "invalid value 'nope' for '--webhook-address <WEBHOOK_ADDRESS>': \"nope\" is not an \
         address:port like 0.0.0.0:9443 (or empty to disable): invalid socket address syntax",
    );
    fails_with(
        &[],
        &[("KNIC_WEBHOOK_CERT", "/nonexistent/knt-tls.crt")],
        "the following required arguments were not provided:\n  --webhook-key <WEBHOOK_KEY>",
    );
    fails_with(
        &["--webhook-reload-seconds", "0"],
        &[],
        "invalid value '0' for '--webhook-reload-seconds <WEBHOOK_RELOAD_SECONDS>': 0 is not in \
         1..=3600",
    );
    // A certificate that cannot be read stops the controller before it serves anything (the
    // kubeconfig names a server that is never contacted before this point).
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters: [{name: t, cluster: \
         {server: 'https://127.0.0.1:1'}}]\ncontexts: [{name: t, context: {cluster: t, user: \
         t}}]\nusers: [{name: t, user: {token: x}}]\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .env_clear()
        .env("KUBECONFIG", &kubeconfig)
        .env("KNIC_WEBHOOK_ADDRESS", "127.0.0.1:0")
        .env("KNIC_WEBHOOK_CERT", "/nonexistent/knt-tls.crt")
        .env("KNIC_WEBHOOK_KEY", "/nonexistent/knt-tls.key")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(
        stderr(&out).lines().last(),
        Some(
            "knic-controller: starting the admission webhook: webhook certificate \
             /nonexistent/knt-tls.crt: No such file or directory (os error 2)"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_bad_http_address_is_refused_naming_the_rule() {
    fails_with(
        &["--http-address", "9462"],
        &[],
        "invalid value '9462' for '--http-address <HTTP_ADDRESS>': \"9462\" is not an \
         address:port to listen on (such as 0.0.0.0:9461 or [::]:9461); the empty string \
         disables the server",
    );
}
