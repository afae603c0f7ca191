//! One JSON log shape for both binaries (knic_proto::logging): the real `knic-driver` and
//! `knic-controller`, started with `KNIC_LOG_FORMAT=json` against the fake API, run until they
//! have logged and are stopped with SIGTERM, and started once more with a kubeconfig that does
//! not exist, so they stop on an error. Every line either writes is on stderr (stdout stays
//! empty), is one JSON object, has `timestamp`, `level`, `target` and `message`, carries the
//! event's fields as top-level keys (no `fields` object) and no span keys.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use knic_e2e::cluster::Cluster;
use knic_e2e::driver::DriverConfig;
use knic_e2e::harness::{eventually, trial};
use serde_json::{Map, Value};

/// The keys every line has, in both binaries.
const FIXED: [&str; 4] = ["timestamp", "level", "target", "message"];
/// Keys the shape must not have: nested fields, spans, or what only one binary once printed.
const FORBIDDEN: [&str; 7] = [
    "fields",
    "span",
    "spans",
    "threadName",
    "threadId",
    "filename",
    "line_number",
];

/// What one process wrote, each stream in a file of its own.
struct Output {
    what: String,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Output {
    fn new(dir: &Path, what: &str) -> Output {
        Output {
            what: what.to_owned(),
            stdout: dir.join(format!("{what}.stdout")),
            stderr: dir.join(format!("{what}.stderr")),
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn command(&self, bin: &Path) -> anyhow::Result<tokio::process::Command> {
        let mut command = tokio::process::Command::new(bin);
        command
            .env_clear()
            .env("KNIC_LOG_FORMAT", "json")
            .env("KNIC_LOG_LEVEL", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&self.stdout)?)
            .stderr(std::fs::File::create(&self.stderr)?)
            .kill_on_drop(true);
        Ok(command)
    }

    /// Every stderr line as a JSON object of the one shape (stdout empty); the objects.
    fn lines(&self) -> anyhow::Result<Vec<Map<String, Value>>> {
        let stdout = std::fs::read_to_string(&self.stdout)?;
        ensure!(
            stdout.is_empty(),
            "{}: logs belong on stderr, stdout has:\n{stdout}",
            self.what
        );
        let stderr = self.stderr();
        let mut out = Vec::new();
        for line in stderr.lines() {
            let object = match serde_json::from_str(line) {
                Ok(Value::Object(object)) => object,
                _ => bail!(
                    "{}: a stderr line that is no JSON object: {line}",
                    self.what
                ),
            };
            shape(&object).with_context(|| format!("{}: {line}", self.what))?;
            out.push(object);
        }
        ensure!(!out.is_empty(), "{}: nothing logged", self.what);
        Ok(out)
    }
}

/// The one shape: the fixed keys with their types, none of the forbidden ones.
fn shape(line: &Map<String, Value>) -> anyhow::Result<()> {
    for key in FIXED {
        ensure!(
            line.get(key).is_some_and(Value::is_string),
            "no string {key:?}"
        );
    }
    let timestamp = line["timestamp"].as_str().unwrap_or_default();
    ensure!(
        timestamp.get(10..11) == Some("T") && timestamp.ends_with('Z'),
        "timestamp {timestamp:?} is not RFC 3339 in UTC"
    );
    let level = line["level"].as_str().unwrap_or_default();
    ensure!(
        ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&level),
        "level {level:?}"
    );
    for key in FORBIDDEN {
        ensure!(!line.contains_key(key), "key {key:?}");
    }
    // Everything else is one of the event's fields, flat: a field's value is never an object.
    for (key, value) in line {
        ensure!(
            !value.is_object() && !value.is_array(),
            "{key:?} is nested: {value}"
        );
    }
    Ok(())
}

/// The line whose message is `message`, or an error showing what was logged.
fn find<'a>(
    lines: &'a [Map<String, Value>],
    message: &str,
    what: &str,
) -> anyhow::Result<&'a Map<String, Value>> {
    lines
        .iter()
        .find(|l| l["message"] == message)
        .with_context(|| format!("{what}: no line {message:?} in {lines:?}"))
}

/// Waits until `output`'s stderr has a line with `message`, then stops the process with
/// SIGTERM and waits for its exit.
async fn run_until(
    mut child: tokio::process::Child,
    output: &Output,
    message: &str,
) -> anyhow::Result<()> {
    let quoted = format!("\"message\":\"{message}\"");
    eventually(
        &format!("{}: {message:?} logged", output.what),
        Duration::from_secs(20),
        || async { Ok(output.stderr().contains(&quoted).then_some(())) },
    )
    .await
    .with_context(|| output.stderr())?;
    let pid = child.id().context("exited early")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid)?),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .with_context(|| format!("{}: no exit after SIGTERM", output.what))??;
    Ok(())
}

async fn both_binaries_log_one_json_shape(
    driver_bin: PathBuf,
    controller_bin: PathBuf,
) -> anyhow::Result<()> {
    let cluster = Cluster::fake("logs").await?;
    cluster.ensure_node().await?;
    let dir = cluster.tmp.path().to_path_buf();

    // The driver runs as a DaemonSet would, on a synthetic sysfs tree, until it has
    // discovered and published.
    let config = DriverConfig::under(&dir.join("node"), &cluster.node, &cluster.kubeconfig);
    let driver = Output::new(&dir, "driver");
    let child = driver
        .command(&driver_bin)?
        .arg("run")
        .env("NODE_NAME", &config.node_name)
        .env("KUBECONFIG", &config.kubeconfig)
        .env("KNIC_REGISTRY_DIR", &config.registry_dir)
        .env("KNIC_PLUGIN_DIR", &config.plugin_dir)
        .envs(config.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .spawn()?;
    run_until(child, &driver, "initial discovery finished").await?;

    let controller = Output::new(&dir, "controller");
    let child = controller
        .command(&controller_bin)?
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("KNIC_LEADER_ELECT", "false")
        .env("KNIC_HTTP_ADDRESS", "")
        .env("KNIC_WEBHOOK_ADDRESS", "")
        .spawn()?;
    run_until(child, &controller, "running without leader election").await?;

    let driver_lines = driver.lines()?;
    let controller_lines = controller.lines()?;
    // Fields at the top, in both: the driver's node, the controller's signal.
    let starting = find(&driver_lines, "knic-driver starting", "driver")?;
    ensure!(
        starting.get("node") == Some(&Value::from(cluster.node.as_str())),
        "driver: the node field is not top-level: {starting:?}"
    );
    let stop = find(&controller_lines, "stop requested", "controller")?;
    ensure!(
        stop.get("signal") == Some(&Value::from("SIGTERM")),
        "controller: the signal field is not top-level: {stop:?}"
    );

    // Stopped by an error: the same event, with the error as a top-level field.
    let mut fatal_lines = Vec::new();
    for (what, bin, args) in [
        (
            "driver-fatal",
            &driver_bin,
            &["run", "--node-name", "n1"][..],
        ),
        ("controller-fatal", &controller_bin, &[][..]),
    ] {
        let output = Output::new(&dir, what);
        let status = output
            .command(bin)?
            .args(args)
            .env("KUBECONFIG", "/nonexistent/knt-kubeconfig")
            .env("KNIC_HTTP_ADDRESS", "")
            .status()
            .await?;
        ensure!(
            !status.success(),
            "{what}: a missing kubeconfig was accepted"
        );
        let lines = output.lines()?;
        let fatal = find(&lines, "stopped by an error", what)?;
        let error = fatal
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or_default();
        ensure!(
            fatal["level"] == "ERROR"
                && error.starts_with("reading kubeconfig /nonexistent/knt-kubeconfig"),
            "{what}: {fatal:?}"
        );
        fatal_lines.extend(lines);
    }

    // Both binaries' lines passed the one `shape` (Output::lines); both sets have lines.
    ensure!(!fatal_lines.is_empty());
    cluster.cleanup().await
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let binaries = knic_e2e::driver::binary()
        .map_err(|e| format!("{e:#}"))
        .and_then(|d| Ok((d, knic_e2e::harness::controller_binary()?)));
    if let Err(reason) = &binaries {
        eprintln!("skipped: logs/both_binaries_log_one_json_shape: {reason}");
    }
    let trials = vec![trial(
        "logs/both_binaries_log_one_json_shape".into(),
        binaries.is_err(),
        move || async move {
            let (driver, controller) = binaries.map_err(anyhow::Error::msg)?;
            both_binaries_log_one_json_shape(driver, controller).await
        },
    )];
    libtest_mimic::run(&args, trials).exit();
}
