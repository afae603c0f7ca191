//! The binary's start-up contract: bad settings fail fast with a message naming the flag (and
//! its environment twin) and the rule, and nothing is left behind.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_knic-driver");

fn kubeconfig(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:9\n\
         users:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
         current-context: x\n",
    )
    .unwrap();
    path
}

fn run(dir: &Path, envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("run")
        .env_clear()
        .env("KUBECONFIG", kubeconfig(dir))
        .env("KNIC_REGISTRY_DIR", dir.join("registry"))
        .env("KNIC_PLUGIN_DIR", dir.join("plugin"))
        .env("KNIC_HTTP_ADDRESS", "");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Like [`run`], but the process is killed after `limit`: a setting wrongly accepted starts the
/// driver, which must fail the test rather than hang it.
fn run_bounded(dir: &Path, envs: &[(&str, &str)], limit: Duration) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("run")
        .env_clear()
        .env("KUBECONFIG", kubeconfig(dir))
        .env("KNIC_REGISTRY_DIR", dir.join("registry"))
        .env("KNIC_PLUGIN_DIR", dir.join("plugin"))
        .env("KNIC_HTTP_ADDRESS", "")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn node_name_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("--node-name <NODE_NAME>"), "{err}");
}

#[test]
fn node_name_must_be_a_dns_subdomain() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &[("NODE_NAME", "Worker_1")]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("invalid --node-name/NODE_NAME: \"Worker_1\" is not a DNS subdomain"),
        "{err}"
    );
    assert!(
        !dir.path().join("registry").exists(),
        "nothing may be created on bad input"
    );
}

#[test]
fn log_level_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &[("NODE_NAME", "n1"), ("KNIC_LOG_LEVEL", "debug[")],
    );
    assert_eq!(out.status.code(), Some(2));
    // The controller's text (knic_proto::logging), word for word.
    assert_eq!(
        stderr(&out),
        "knic-driver: invalid --log-level/KNIC_LOG_LEVEL \"debug[\": invalid filter directive \
         (want a tracing filter: a level such as info, or comma-separated target=level \
         directives such as info,knic_driver=debug)\n"
    );
}

#[test]
fn log_format_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &[("NODE_NAME", "n1"), ("KNIC_LOG_FORMAT", "xml")],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(
            "invalid value 'xml' for '--log-format <LOG_FORMAT>': \"xml\" is not a log format: \
             use text (one readable line per event; human is the same) or json (one object per \
             line)"
        ),
        "{err}"
    );
    // Both spellings of text, the driver's old one and the controller's, get past the check
    // (and fail later, on the node name).
    for text in ["human", "text"] {
        let out = run(
            dir.path(),
            &[("NODE_NAME", "Bad_Name"), ("KNIC_LOG_FORMAT", text)],
        );
        let err = stderr(&out);
        assert!(
            err.starts_with("knic-driver: invalid --node-name/NODE_NAME"),
            "{text}: {err}"
        );
    }
}

#[test]
fn missing_kubeconfig_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &[
            ("NODE_NAME", "n1"),
            ("KUBECONFIG", "/nonexistent/kubeconfig"),
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("reading kubeconfig /nonexistent/kubeconfig"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_regular_file_at_the_socket_path_is_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("plugin")).unwrap();
    std::fs::write(dir.path().join("plugin/dra.sock"), b"precious").unwrap();
    let out = run(dir.path(), &[("NODE_NAME", "n1")]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("dra.sock exists and is not a socket; refusing to replace it"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("plugin/dra.sock")).unwrap(),
        b"precious"
    );
}

#[test]
fn a_live_driver_on_the_same_sockets_is_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Command::new(BIN)
        .arg("run")
        .env_clear()
        .env("NODE_NAME", "n1")
        .env("KUBECONFIG", kubeconfig(dir.path()))
        .env("KNIC_REGISTRY_DIR", dir.path().join("registry"))
        .env("KNIC_PLUGIN_DIR", dir.path().join("plugin"))
        .env("KNIC_HTTP_ADDRESS", "")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let reg = dir.path().join("registry/knic.dev-reg.sock");
    for _ in 0..200 {
        if reg.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(reg.exists(), "first driver never registered");
    let out = run(dir.path(), &[("NODE_NAME", "n1")]);
    let _ = first.kill();
    let _ = first.wait();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("dra.sock is served by another running process"),
        "{err}"
    );
}

fn inventory(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("inventory")
        .args(args)
        .env_clear()
        .env("NODE_NAME", "node-a")
        .output()
        .unwrap()
}

/// `knic-driver inventory -o yaml | head` once panicked ("failed printing to stdout: Broken
/// pipe"): a reader that is gone must end the output quietly, as for any filter.
#[test]
fn inventory_into_a_closed_pipe_ends_quietly() {
    for format in ["table", "yaml", "json"] {
        let (reader, writer) = std::io::pipe().unwrap();
        // The reading end is closed before the driver writes: every write is EPIPE.
        drop(reader);
        let out = Command::new(BIN)
            .args(["inventory", "--sample", "e810-vfs", "-o", format])
            .env_clear()
            .env("NODE_NAME", "node-a")
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = stderr(&out);
        assert!(out.status.success(), "-o {format}: {:?} {err}", out.status);
        assert!(!err.contains("panicked"), "-o {format}: {err}");
    }
}

#[test]
fn inventory_of_a_sample_prints_the_table_and_the_exact_slices() {
    let out = inventory(&["--sample", "e810-vfs"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.starts_with("Node node-a: 3 device(s) offered\n"),
        "{table}"
    );
    assert!(
        table.contains("pci-0000-a2-01-1  vf    enp162s0f0v1   0000:a2:01.1"),
        "{table}"
    );

    let out = inventory(&["--sample", "e810-vfs", "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let slice = &list["items"][0];
    assert_eq!(slice["kind"], "ResourceSlice");
    assert_eq!(slice["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(slice["metadata"]["generateName"], "00000-knic.dev-node-a-");
    // The devices, then the PF's VF budget as a counter-only slice.
    assert_eq!(
        slice["spec"]["pool"],
        serde_json::json!({"name": "node-a", "generation": 1, "resourceSliceCount": 2})
    );
    let counters = &list["items"][1];
    assert_eq!(
        counters["metadata"]["generateName"],
        "00001-knic.dev-node-a-"
    );
    assert_eq!(counters["spec"].get("devices"), None);
    assert_eq!(
        counters["spec"]["sharedCounters"],
        serde_json::json!([{"name": "pf-0000-a2-00-0", "counters": {"vfs": {"value": "2"}}}])
    );
    assert_eq!(
        slice["spec"]["devices"][1]["consumesCounters"],
        serde_json::json!([{"counterSet": "pf-0000-a2-00-0", "counters": {"vfs": {"value": "1"}}}])
    );
    let names: Vec<_> = slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["pci-0000-a2-00-0", "pci-0000-a2-01-0", "pci-0000-a2-01-1"]
    );
    assert_eq!(
        slice["spec"]["devices"][2]["attributes"]["vfIndex"],
        serde_json::json!({"int": 1})
    );

    let out = inventory(&["--sample", "e810-vfs", "-o", "yaml"]);
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(
        yaml.starts_with("---\napiVersion: resource.k8s.io/v1\nkind: ResourceSlice\n"),
        "{yaml}"
    );
}

#[test]
fn inventory_rejects_a_bad_filter_entry() {
    let out = inventory(&["--sample", "e810-vfs", "--include", "kind=vf,pci=8086:zz"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("invalid setting filter: include[1] \"pci=8086:zz\""),
        "{}",
        stderr(&out)
    );
}

#[test]
fn inventory_rejects_a_root_without_sysfs() {
    let dir = tempfile::tempdir().unwrap();
    let out = inventory(&["--sysfs-root", dir.path().to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("there is no sys/class/net below it"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn inventory_filter_excludes_by_kind() {
    let out = inventory(&["--sample", "e810-vfs", "--exclude", "kind=vf"]);
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.starts_with("Node node-a: 1 device(s) offered\n"),
        "{table}"
    );
    assert!(table.contains("Not offered: 2 device(s)"), "{table}");
}

#[test]
fn a_zero_rescan_period_is_refused_not_clamped() {
    let dir = tempfile::tempdir().unwrap();
    for value in ["0", "soon", "-5"] {
        let out = run_bounded(
            dir.path(),
            &[("NODE_NAME", "n1"), ("KNIC_RESCAN_SECONDS", value)],
            Duration::from_secs(10),
        );
        assert!(!out.status.success(), "{value} was accepted");
        let err = stderr(&out);
        assert!(
            err.contains(&format!(
                "invalid value '{value}' for '--rescan-seconds <RESCAN_SECONDS>'"
            )),
            "{err}"
        );
    }
    let out = run_bounded(
        dir.path(),
        &[("NODE_NAME", "n1"), ("KNIC_RESCAN_SECONDS", "0")],
        Duration::from_secs(10),
    );
    assert!(
        stderr(&out).contains("0 is not in 1..18446744073709551615"),
        "{}",
        stderr(&out)
    );
    assert!(
        !dir.path().join("registry").exists(),
        "nothing may be created on bad input"
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
    let dir = tempfile::tempdir().unwrap();
    let enoent = "No such file or directory (os error 2)";

    let out = run(
        dir.path(),
        &[
            ("NODE_NAME", "n1"),
            ("KUBECONFIG", "/nonexistent/kubeconfig"),
        ],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.starts_with("knic-driver: reading kubeconfig /nonexistent/kubeconfig: "),
        "{err}"
    );
    once(&err, enoent);

    // No kubeconfig and not in a cluster: kube's inference error embeds its causes too.
    let out = Command::new(BIN)
        .args(["run", "--node-name", "n1"])
        .env_clear()
        .env("HOME", dir.path())
        .env("KNIC_REGISTRY_DIR", dir.path().join("registry"))
        .env("KNIC_PLUGIN_DIR", dir.path().join("plugin"))
        .env("KNIC_HTTP_ADDRESS", "")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("no kubeconfig given and not in a cluster"),
        "{err}"
    );
    once(&err, enoent);

    let missing = dir.path().join("no-filter.yaml");
    let out = inventory(&[
        "--sample",
        "e810-vfs",
        "--filter-config",
        missing.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("reading filter config {}", missing.display())),
        "{err}"
    );
    once(&err, enoent);
}

#[test]
fn the_demo_refuses_a_temp_dir_of_slash() {
    // It mounts a private tmpfs over the temp directory; over `/` that would hide everything.
    // As root, inside throwaway namespaces: a demo that wrongly accepted it must not run here.
    let isolated = nix::unistd::geteuid().is_root()
        && Command::new("unshare").arg("--version").output().is_ok();
    let mut cmd = if isolated {
        let mut cmd = Command::new("unshare");
        cmd.args(["--net", "--mount", "--", BIN]);
        cmd
    } else {
        Command::new(BIN)
    };
    let out = cmd
        .arg("demo")
        .env_clear()
        .env("TMPDIR", "/")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("knic-driver: invalid TMPDIR /: the demo mounts a private tmpfs over it"),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_bad_http_address_is_refused_naming_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &[("NODE_NAME", "n1"), ("KNIC_HTTP_ADDRESS", "localhost:9461")],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(
            "invalid value 'localhost:9461' for '--http-address <HTTP_ADDRESS>': \
             \"localhost:9461\" is not an address:port to listen on (such as 0.0.0.0:9461 or \
             [::]:9461); the empty string disables the server"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_taken_http_port_fails_the_start_naming_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let out = run(
        dir.path(),
        &[("NODE_NAME", "n1"), ("KNIC_HTTP_ADDRESS", &address)],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!(
            "invalid setting --http-address/KNIC_HTTP_ADDRESS: cannot listen on {address}: \
             Address already in use (os error 98)"
        )),
        "{}",
        stderr(&out)
    );
}
