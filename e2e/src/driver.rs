//! Runs the real `knic-driver` binary as a child process, the way a DaemonSet would.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// Finds the driver binary: `KNIC_DRIVER_BIN`, else next to the test executable's target dir
/// (`target/<profile>/knic-driver`), which `cargo test --workspace` builds.
pub fn binary() -> anyhow::Result<PathBuf> {
    if let Ok(bin) = std::env::var("KNIC_DRIVER_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test-binary> → target/<profile>/knic-driver
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("test executable has no target directory")?;
    let bin = profile_dir.join("knic-driver");
    if !bin.exists() {
        bail!(
            "{} not found: build it with `cargo build -p knic-driver` (cargo test --workspace does) \
             or set KNIC_DRIVER_BIN",
            bin.display()
        );
    }
    Ok(bin)
}

/// Materialises the sysfs fixture `name` of `driver/tests/fixtures/sysfs/` below `root`, for a
/// driver started with `KNIC_SYSFS_ROOT=root`.
pub fn fixture_tree(name: &str, root: &Path) -> anyhow::Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../driver/tests/fixtures/sysfs")
        .join(name);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    knic_driver::inventory::fixture::materialise(&text, root)?;
    Ok(())
}

/// VFs in the default synthetic tree.
pub const VFS: usize = 32;

/// The device name of VF `n` of the default synthetic tree (`pci-0000-10-01-0` for VF 0).
pub fn vf_device(n: usize) -> String {
    let rid = (0x10 << 8) + 8 + n;
    format!(
        "pci-0000-{:02x}-{:02x}-{}",
        rid >> 8,
        (rid & 0xff) >> 3,
        rid & 7
    )
}

/// Everything the driver needs to know, as the environment a DaemonSet would give it.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// NODE_NAME.
    pub node_name: String,
    /// KUBECONFIG.
    pub kubeconfig: PathBuf,
    /// KNIC_REGISTRY_DIR.
    pub registry_dir: PathBuf,
    /// KNIC_PLUGIN_DIR.
    pub plugin_dir: PathBuf,
    /// Where the driver's stderr goes.
    pub log_file: PathBuf,
    /// More environment, e.g. `KNIC_SYSFS_ROOT`, `KNIC_NETLINK`, `KNIC_INCLUDE`.
    pub env: Vec<(String, String)>,
    /// Whether [`DriverProcess::start`] serves the NRI socket with a test runtime that accepts
    /// the plugin (and again after every reconnect): the driver refuses prepare while no
    /// runtime has it registered (fail-closed), so a test of the kubelet plugin alone still
    /// needs a runtime on the other end. Off for tests that drive their own runtime.
    pub stand_in_runtime: bool,
    /// The network namespace (`ip netns` name) the driver runs in: a namespaced "node" of its
    /// own; `None` runs it in the test's.
    pub netns: Option<String>,
}

impl DriverConfig {
    /// A driver for `node` with every directory under `dir`, discovering a synthetic sysfs tree
    /// of one SR-IOV PF with 32 VFs (named by [`vf_device`]), so the host's own devices never
    /// leak into a test, unless `env` says otherwise.
    pub fn under(dir: &Path, node: &str, kubeconfig: &Path) -> DriverConfig {
        let sysfs = dir.join("synthetic-root");
        let _ = knic_driver::inventory::fixture::materialise(
            &knic_driver::inventory::fixture::synthetic_sriov(1, VFS),
            &sysfs,
        );
        DriverConfig {
            node_name: node.into(),
            kubeconfig: kubeconfig.into(),
            registry_dir: dir.join("plugins_registry"),
            plugin_dir: dir.join("plugins/knic.dev"),
            log_file: dir.join("driver.log"),
            env: vec![
                (
                    "KNIC_SYSFS_ROOT".into(),
                    sysfs.to_string_lossy().into_owned(),
                ),
                ("KNIC_NETLINK".into(), "false".into()),
                // No runtime unless a test starts one: never the host's real NRI socket.
                (
                    "KNIC_NRI_SOCKET".into(),
                    dir.join("nri.sock").to_string_lossy().into_owned(),
                ),
                // Never the host's CDI directory.
                (
                    "KNIC_CDI_DIR".into(),
                    dir.join("cdi").to_string_lossy().into_owned(),
                ),
                // Parallel drivers would fight over the default port; tests that scrape it
                // set a free one ([`DriverConfig::with_http`]).
                ("KNIC_HTTP_ADDRESS".into(), String::new()),
                // The KNI socket of this driver only, never a host path.
                (
                    "KNIC_KNI_SOCKET".into(),
                    dir.join("kni.sock").to_string_lossy().into_owned(),
                ),
                (
                    "KNIC_KNI_NETNS_DIR".into(),
                    dir.join("netns").to_string_lossy().into_owned(),
                ),
            ],
            stand_in_runtime: true,
            netns: None,
        }
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on a free loopback port; returns its base URL.
    pub fn with_http(self) -> anyhow::Result<(DriverConfig, String)> {
        let address = free_loopback_address()?;
        Ok((
            self.with_env("KNIC_HTTP_ADDRESS", address.clone()),
            format!("http://{address}"),
        ))
    }

    /// The test brings its own runtime on the NRI socket.
    pub fn without_stand_in_runtime(mut self) -> Self {
        self.stand_in_runtime = false;
        self
    }

    /// The value of `key` in the driver's environment.
    pub fn env_value(&self, key: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Sets (or replaces) one environment variable.
    pub fn with_env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
        self
    }
}

/// When a driver registered with the node's real kubelet last went away. The kubelet wipes the
/// node's ResourceSlices of a driver 30 s after its plugin deregisters unless it registers
/// again meanwhile: a test binary that ends sooner leaves that wipe to hit the next binary's
/// freshly published slices (CI: `real/gate_off_publishes_child_slots` saw its slices deleted
/// and re-created 29 s after `real_node`'s last driver stopped).
static REAL_PLUGIN_LEFT: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);

/// The kubelet's delay before it wipes a deregistered driver's slices, and a margin.
const KUBELET_WIPE_DELAY: Duration = Duration::from_secs(32);

/// Called at the end of a test binary: waits out the real kubelet's delayed slice wipe after
/// the last driver registered with it went away, so the wipe finds nothing of the next binary.
/// Returns at once when no driver of this process registered with a real kubelet.
pub fn wait_for_the_kubelets_wipe() {
    let left = *REAL_PLUGIN_LEFT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(left) = left else { return };
    let rest = KUBELET_WIPE_DELAY.saturating_sub(left.elapsed());
    if !rest.is_zero() {
        eprintln!(
            "waiting {:.0} s for the real kubelet's delayed wipe of this binary's slices",
            rest.as_secs_f64()
        );
        std::thread::sleep(rest);
    }
}

/// A running driver; killed when dropped (with its stand-in runtime, if any).
pub struct DriverProcess {
    child: Child,
    config: DriverConfig,
    runtime: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for DriverProcess {
    fn drop(&mut self) {
        self.note_if_real_kubelet();
        if let Some(runtime) = &self.runtime {
            runtime.abort();
        }
    }
}

/// Accepts the plugin on `socket` whenever it (re)connects, as a node's runtime would.
async fn stand_in_runtime(socket: PathBuf) {
    let Ok(mut runtime) = knic_driver::nri::runtime::TestRuntime::listen(&socket).await else {
        return;
    };
    loop {
        if runtime.accept(Vec::new()).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        while runtime.is_connected() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl DriverProcess {
    /// Starts `knic-driver run` with JSON logs appended to the log file.
    pub fn start(config: &DriverConfig) -> anyhow::Result<DriverProcess> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&config.log_file)?;
        let mut command = match &config.netns {
            // `ip netns exec` execs the driver (same pid) with that namespace's /sys mounted.
            Some(ns) => {
                // The environment is cleared below: name `ip` by its path.
                let ip = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
                    .into_iter()
                    .find(|p| Path::new(p).exists())
                    .context("no ip(8) to start the driver in a namespace")?;
                let mut c = Command::new(ip);
                c.args(["netns", "exec", ns]).arg(binary()?);
                c
            }
            None => Command::new(binary()?),
        };
        let child = command
            .arg("run")
            .env_clear()
            .env("NODE_NAME", &config.node_name)
            .env("KUBECONFIG", &config.kubeconfig)
            .env("KNIC_REGISTRY_DIR", &config.registry_dir)
            .env("KNIC_PLUGIN_DIR", &config.plugin_dir)
            .env("KNIC_LOG_FORMAT", "json")
            .env("KNIC_LOG_LEVEL", "info,knic_driver=debug")
            .envs(config.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("spawning knic-driver")?;
        let runtime = match (config.stand_in_runtime, config.env_value("KNIC_NRI_SOCKET")) {
            (true, Some(socket)) => Some(tokio::spawn(stand_in_runtime(PathBuf::from(socket)))),
            _ => None,
        };
        Ok(DriverProcess {
            child,
            config: config.clone(),
            runtime,
        })
    }

    /// The driver's log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.config.log_file).unwrap_or_default()
    }

    /// Notes the time when this driver registers with the node's real kubelet (its
    /// registration directory is below `KNIC_E2E_KUBELET_DIR`), for
    /// [`wait_for_the_kubelets_wipe`].
    fn note_if_real_kubelet(&self) {
        let real = std::env::var_os(crate::cluster::ENV_KUBELET_DIR)
            .is_some_and(|dir| self.config.registry_dir.starts_with(dir));
        if real {
            *REAL_PLUGIN_LEFT
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some(std::time::Instant::now());
        }
    }

    /// `kill -9`: no chance to clean up, exactly like an OOM kill or node crash.
    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        self.note_if_real_kubelet();
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }

    /// SIGTERM, as the kubelet sends on pod deletion; waits for the exit.
    pub async fn terminate(&mut self) -> anyhow::Result<ExitStatus> {
        self.note_if_real_kubelet();
        let pid = self.child.id().context("driver already exited")?;
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .await?;
        if !status.success() {
            bail!("kill -TERM {pid} failed");
        }
        Ok(tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await??)
    }

    /// The process id, while it runs.
    pub fn pid(&mut self) -> Option<u32> {
        if self.is_running() {
            self.child.id()
        } else {
            None
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// A loopback `address:port` nothing listens on right now (the kernel's choice, released for
/// the child to bind).
pub fn free_loopback_address() -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

/// GETs `url` (`http://host:port/path`) as a scraper or a kubelet probe does: one HTTP/1.1
/// request on a fresh connection; returns the status and the body.
pub async fn http_get(url: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").context("only http:// URLs")?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = tokio::net::TcpStream::connect(authority).await?;
    stream
        .write_all(
            format!("GET /{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .context("no answer within 10s")??;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("answer without a header end")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("answer without a status")?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body
            .split_once("\r\n")
            .context("chunk without a size line")?;
        let size = usize::from_str_radix(size.trim(), 16)?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..size).context("chunk shorter than its size")?);
        body = rest.get(size + 2..).context("chunk without its line end")?;
    }
}
