//! The bits every e2e test binary shares: one tokio runtime per trial, errors as failures,
//! real-cluster twins reported as ignored (with the reason printed once) when no cluster is
//! configured, and a polling helper for "eventually" assertions.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use libtest_mimic::{Failed, Trial};

use crate::cluster::{ENV_KUBECONFIG, RealCluster};
use crate::gates::Needs;

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

/// Set to `1` by the test VM's `/init` (`e2e/vm/run-in-vm.sh`), whose Debian kernel is picked to
/// have every module kernel tests use.
pub const ENV_IN_VM: &str = "KNIC_IN_VM";

/// Whether this test process runs in the test VM, where a kernel feature a trial needs must be
/// there: lacking it is a failure, not a reason to skip.
pub fn in_vm() -> bool {
    std::env::var(ENV_IN_VM).is_ok_and(|v| v == "1")
}

/// A kernel trial needing something the running kernel may lack (`missing` says what, when it
/// does). On a host's own kernel it is reported ignored (the caller prints the reason); in the
/// test VM the lack fails it with the reason, so CI cannot pass a VLAN or ipvlan test by
/// skipping it.
pub fn kernel_trial(
    name: &str,
    missing: Option<String>,
    run: impl FnOnce() -> Result<(), Failed> + Send + 'static,
) -> Trial {
    kernel_trial_where(in_vm(), name, missing, run)
}

/// What a kernel trial does with a missing feature: run (nothing missing), be ignored (on a
/// host's own kernel) or fail (in the VM, whose kernel must have it).
#[derive(Debug, PartialEq, Eq)]
enum KernelVerdict {
    Run,
    Ignore,
    Fail(String),
}

fn kernel_verdict(in_vm: bool, missing: Option<&str>) -> KernelVerdict {
    match missing {
        None => KernelVerdict::Run,
        Some(reason) if in_vm => KernelVerdict::Fail(missing_in_vm(reason)),
        Some(_) => KernelVerdict::Ignore,
    }
}

fn kernel_trial_where(
    in_vm: bool,
    name: &str,
    missing: Option<String>,
    run: impl FnOnce() -> Result<(), Failed> + Send + 'static,
) -> Trial {
    match kernel_verdict(in_vm, missing.as_deref()) {
        KernelVerdict::Fail(why) => Trial::test(name, move || Err(why.into())),
        KernelVerdict::Ignore => Trial::test(name, run).with_ignored_flag(true),
        KernelVerdict::Run => Trial::test(name, run),
    }
}

/// Enters private network and mount namespaces for a kernel test binary: a fresh sysfs mounted
/// at `<tmp>/knt-sysfs-<pid>/sys` (returned root), a private `/run/netns`, loopback up.
/// Everything the test creates dies with the process. Must run before any other thread exists.
pub fn isolate() -> Result<std::path::PathBuf, String> {
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, unshare};
    if !nix::unistd::geteuid().is_root() {
        return Err("kernel tests need root (network namespaces, sysfs mounts)".into());
    }
    unshare(CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("unshare: {e}"))?;
    // Nothing mounted from here on may propagate to the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("making mounts private: {e}"))?;
    let root = std::env::temp_dir().join(format!("knt-sysfs-{}", std::process::id()));
    std::fs::create_dir_all(root.join("sys")).map_err(|e| e.to_string())?;
    mount(
        Some("sysfs"),
        &root.join("sys"),
        Some("sysfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| format!("mounting sysfs: {e}"))?;
    std::fs::create_dir_all("/run/netns").map_err(|e| e.to_string())?;
    mount(
        Some("tmpfs"),
        "/run/netns",
        Some("tmpfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| format!("mounting a private /run/netns: {e}"))?;
    ip(&["link", "set", "lo", "up"]).map_err(|e| e.to_string())?;
    Ok(root)
}

/// [`isolate`]'s temp directory, removed on drop, so every return path (and a panic) cleans up.
pub struct Isolation(std::path::PathBuf);

impl Isolation {
    /// [`isolate`], undone when the guard drops.
    pub fn enter() -> Result<Isolation, String> {
        isolate().map(Isolation)
    }
}

impl Drop for Isolation {
    fn drop(&mut self) {
        unisolate(&self.0);
    }
}

/// Undoes [`isolate`]'s temp directory (the mounts die with the process's mount namespace).
pub fn unisolate(root: &std::path::Path) {
    let _ = nix::mount::umount(&root.join("sys"));
    let _ = std::fs::remove_dir_all(root);
}

/// Runs `ip` with `args`; its stderr becomes the error.
pub fn ip(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("ip").args(args).output()?;
    if !out.status.success() {
        anyhow::bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Host state of a link as `ip -o link` prints it (name, mtu, mac, state): what a detach must
/// give back.
pub fn host_link(name: &str) -> anyhow::Result<String> {
    let out = ip(&["-o", "link", "show", name])?;
    let fields: Vec<&str> = out.split_whitespace().collect();
    let value = |key: &str| {
        fields
            .iter()
            .position(|f| *f == key)
            .map(|i| fields[i + 1])
            .unwrap_or_default()
    };
    let up = out.contains(",UP") || out.contains("<UP");
    Ok(format!(
        "{name} mtu {} mac {} up {up}",
        value("mtu"),
        value("link/ether")
    ))
}

/// Runs `f` on a fresh thread inside the network namespace at `path` (sockets it creates stay
/// in that namespace).
pub fn in_netns<T: Send>(
    path: &std::path::Path,
    f: impl FnOnce() -> T + Send,
) -> anyhow::Result<T> {
    let file = std::fs::File::open(path)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)?;
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("namespace thread panicked"))?
    })
}

/// A UDP echo round trip from a socket in `from` to `to_addr:7007` answered by a socket in
/// `responder`: proof that an interface carries traffic, without needing `ping`.
pub fn udp_echo(
    from: &std::path::Path,
    responder: &std::path::Path,
    to_addr: &str,
) -> anyhow::Result<()> {
    use std::net::UdpSocket;
    let server = in_netns(responder, || UdpSocket::bind(format!("{to_addr}:7007")))??;
    let client = in_netns(from, || UdpSocket::bind("0.0.0.0:0"))??;
    client.set_read_timeout(Some(Duration::from_secs(3)))?;
    server.set_read_timeout(Some(Duration::from_secs(3)))?;
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let (n, peer) = server.recv_from(&mut buf)?;
        server.send_to(&buf[..n], peer)
    });
    client.send_to(b"knic", format!("{to_addr}:7007"))?;
    let mut buf = [0u8; 64];
    let (n, _) = client.recv_from(&mut buf)?;
    echo.join()
        .map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
    anyhow::ensure!(&buf[..n] == b"knic", "echo returned {:?}", &buf[..n]);
    Ok(())
}

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct Netns(pub String);

impl Netns {
    /// Creates it with loopback up.
    pub fn new(name: &str) -> anyhow::Result<Netns> {
        ip(&["netns", "add", name])?;
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(Netns(name.into()))
    }

    /// Its bind-mount path, as a runtime passes it in NRI events.
    pub fn path(&self) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/run/netns/{}", self.0))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

/// The test binary's arguments; against a real cluster trials run one at a time, because every
/// driver they start publishes the same node's pool and would fight over its slices.
pub fn arguments() -> libtest_mimic::Arguments {
    let mut args = libtest_mimic::Arguments::from_args();
    if std::env::var_os(ENV_KUBECONFIG).is_some() {
        args.test_threads = Some(1);
    }
    args
}

/// A scenario over a test binary's environment type `E`, as a plain function pointer so the
/// scenario tables stay `Copy`.
pub type Scenario<E> = for<'a> fn(
    &'a mut E,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = anyhow::Result<()>> + 'a>,
>;

/// A test binary's environment, built fresh for every trial and torn down after it, so the
/// registration of its scenarios is one call ([`scenario_trials`]).
pub trait ScenarioEnv: Sized + 'static {
    /// The environment for the trial named `test`, against `cluster` (`None`: the fake API).
    fn setup(
        cluster: Option<RealCluster>,
        test: String,
    ) -> impl Future<Output = anyhow::Result<Self>>;
    /// Tears the environment down after the scenario ended with `outcome`; a failed scenario's
    /// error may be decorated with what the environment logged.
    fn finish(self, outcome: anyhow::Result<()>) -> impl Future<Output = anyhow::Result<()>>;
}

/// The fake and real twins of every scenario of `E`, each run in a fresh environment. A real
/// twin whose needs the cluster cannot meet is reported ignored with the reason (printed once);
/// one the harness kit can meet first switches the apiserver's gates.
pub fn scenario_trials<E: ScenarioEnv>(scenarios: &[(&str, Scenario<E>, Needs)]) -> Vec<Trial> {
    let real = real_cluster();
    let mut trials = Vec::new();
    for backend in ["fake", "real"] {
        for &(name, scenario, needs) in scenarios {
            let test = format!("{backend}/{name}");
            let (cluster, ignored) = match (backend, &real) {
                ("fake", _) => (None, false),
                (_, None) => (None, true),
                (_, Some(r)) => match r.refusal(needs) {
                    Some(why) => {
                        eprintln!("skipped: {test}: {why}");
                        (None, true)
                    }
                    None => (Some(r.clone()), false),
                },
            };
            let label = test.clone();
            trials.push(trial(test, ignored, move || async move {
                let harness = cluster.as_ref().and_then(|r| r.harness.as_ref());
                if let (Some(harness), Some(off)) = (harness, needs.off_at_start()) {
                    harness.switch(&off)?;
                }
                let mut env = E::setup(cluster, label).await?;
                let outcome = unpanicked(scenario(&mut env)).await;
                env.finish(outcome).await
            }));
        }
    }
    trials
}

/// Runs a test binary's trials and exits with their verdict; on the shared cluster the
/// apiserver's gates are put back as they were before the first trial switched them.
pub fn run_trials(args: &libtest_mimic::Arguments, trials: Vec<Trial>) -> ! {
    let harness = RealCluster::from_env()
        .ok()
        .flatten()
        .and_then(|r| r.harness);
    let before = harness.as_ref().and_then(|h| h.gates().ok());
    let conclusion = libtest_mimic::run(args, trials);
    crate::driver::wait_for_the_kubelets_wipe();
    if let (Some(harness), Some(before)) = (&harness, before)
        && let Err(e) = harness.restore(&before)
    {
        eprintln!("error: putting the cluster's feature gates back: {e:#}");
        std::process::exit(1);
    }
    conclusion.exit()
}

/// The scenario's outcome with a panic (a failed `assert!`) turned into an error, so the
/// environment's teardown still runs: on a real cluster a panicking twin otherwise left its
/// namespaces and a Network behind, and the next run's Network overlapped the leftover and was
/// refused.
pub async fn unpanicked<F: Future<Output = anyhow::Result<()>>>(scenario: F) -> anyhow::Result<()> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(scenario).catch_unwind().await {
        Ok(outcome) => outcome,
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic without a message");
            Err(anyhow::anyhow!("the scenario panicked: {text}"))
        }
    }
}

/// `[(name, scenario, needs)]` for async scenario functions `async fn name(&mut Env) ->
/// Result<()>`, named after the function; `name => needs` says what a real cluster must offer
/// ([`crate::gates::Needs`], default `On`).
#[macro_export]
macro_rules! scenarios {
    ($($name:ident $(=> $needs:expr)?),* $(,)?) => {
        [$({
            let scenario: $crate::harness::Scenario<_> = |e| Box::pin($name(e));
            (stringify!($name), scenario, $crate::scenarios!(@needs $($needs)?))
        }),*]
    };
    (@needs) => { $crate::gates::Needs::On };
    (@needs $needs:expr) => { $needs };
}

fn missing_in_vm(reason: &str) -> String {
    format!("{reason}, but this runs in the test VM ({ENV_IN_VM}=1), whose kernel must have it")
}

/// The `knic-controller` binary: `KNIC_CONTROLLER_BIN`, else next to the test executable's
/// target directory (`cargo build -p knic-controller` puts it there).
pub fn controller_binary() -> Result<PathBuf, String> {
    if let Ok(bin) = std::env::var("KNIC_CONTROLLER_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("knic-controller"))
        .ok_or("the test executable has no target directory")?;
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} not found: build it with `cargo build -p knic-controller` or set \
             KNIC_CONTROLLER_BIN",
            bin.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Decided without running a nested test harness: its "test result: FAILED" line would
    // read as a failure of this suite in CI's summary.
    #[test]
    fn missing_kernel_feature_skips_on_a_host_and_fails_in_the_vm() {
        let missing = Some("kernel has no 8021q");
        assert_eq!(kernel_verdict(false, missing), KernelVerdict::Ignore);
        assert_eq!(
            kernel_verdict(true, missing),
            KernelVerdict::Fail(missing_in_vm("kernel has no 8021q"))
        );
        assert_eq!(kernel_verdict(true, None), KernelVerdict::Run);
        assert_eq!(kernel_verdict(false, None), KernelVerdict::Run);
        let ignored = kernel_trial_where(false, "kernel/t", missing.map(String::from), || Ok(()));
        assert!(ignored.has_ignored_flag());
        let runs = kernel_trial_where(true, "kernel/t", None, || Ok(()));
        assert!(!runs.has_ignored_flag());
    }

    #[test]
    fn the_vm_failure_names_what_is_missing_and_why_it_fails() {
        assert_eq!(
            missing_in_vm("kernel has no 8021q"),
            "kernel has no 8021q, but this runs in the test VM (KNIC_IN_VM=1), whose kernel \
             must have it"
        );
    }
}
