//! `knic-driver demo`: knic's whole job on one machine, no cluster. A throwaway "pod" network
//! namespace and a veth pair playing a NIC (its far end in a "peer" namespace), discovery and
//! the ResourceSlice it would publish, a prepare through the real kubelet gRPC socket, an attach
//! through the real NRI protocol against a built-in runtime, the interface shown inside the pod
//! and a UDP echo through it, then detach and unprepare — with the time of each step.
//!
//! Nothing it creates can outlive it, however it ends: before the async runtime starts, the
//! process moves into a network and a mount namespace of its own ([`isolate`]). The veth pair
//! lives in that network namespace, the pod and peer namespaces are bind-mounted only in that
//! mount namespace, and its temp directory is a tmpfs mounted only there; the kernel destroys
//! all of it when the last thread exits, also after SIGKILL. SIGINT and SIGTERM are blocked
//! from the first instruction of the demo until their handlers are installed, so a Ctrl-C is
//! never lost: it always leads to the orderly clean-up (a second one exits at once).

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::TryStreamExt;
use k8s_openapi::api::resource::v1::ResourceClaim;
use knic_driver::claims::ClaimSource;
use knic_driver::claims::checkpoint::CheckpointStore;
use knic_driver::inventory::Filter;
use knic_driver::kubelet::{self, DraService, PluginPaths, Registration};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::netns::{Kernel, LinkChange, Ns, Session};
use knic_driver::nri::runtime::TestRuntime;
use knic_driver::nri::{self, NriSettings, PodSandbox};
use knic_driver::pods::LogStatus;
use knic_driver::slices::rescan::Discovery;
use knic_driver::slices::{self, PoolOwner};
use knic_driver::wiring::{self, Parts};
use knic_proto::dra::v1;
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::signal::{SigSet, Signal};
use serde_json::json;
use tokio::signal::unix::SignalKind;

/// `println!` that never panics: a closed pipe (`demo | head`) must not skip the clean-up.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

// The KNI step, after the kubelet's: the same device through the KNI socket.
mod kni;

const NODE: &str = "demo-node";
const POD_UID: &str = "d3m0d3m0-0000-4000-8000-000000000001";
const CLAIM_UID: &str = "d3m0d3m0-0000-4000-8000-0000000000c1";

/// Names of everything the demo creates, so clean-up can find it whatever happened.
struct Scratch {
    dir: tempfile::TempDir,
    host_if: String,
    peer_if: String,
}

impl Scratch {
    fn pod_ns(&self) -> PathBuf {
        self.dir.path().join("netns-pod")
    }
    fn peer_ns(&self) -> PathBuf {
        self.dir.path().join("netns-peer")
    }
}

/// Creates a network namespace kept alive by a bind mount at `path` (what `ip netns add` does),
/// as the KNI door's CreateNetwork does.
fn make_netns(path: &Path) -> anyhow::Result<()> {
    knic_driver::kni::pin::create(path)
        .with_context(|| format!("creating network namespace {}", path.display()))?;
    Ok(())
}

fn delete_netns(path: &Path) {
    let _ = knic_driver::kni::pin::delete(path);
}

fn in_netns<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    let file = std::fs::File::open(path)?;
    std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<T> {
            setns(&file, CloneFlags::CLONE_NEWNET)?;
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("namespace thread panicked"))?
    })
}

/// The claim the scheduler would have allocated: the veth device, our NetworkConfig.
struct DemoClaims(ResourceClaim);

impl ClaimSource for DemoClaims {
    fn get<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
    ) -> knic_driver::BoxFuture<'a, knic_driver::Result<Option<ResourceClaim>>> {
        Box::pin(async move { Ok(Some(self.0.clone())) })
    }
}

fn claim(device: &str) -> anyhow::Result<ResourceClaim> {
    let parameters = json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
        "interface": {"name": "net1", "mtu": 1400},
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
        "routes": [{"destination": "203.0.113.0/24", "gateway": "192.0.2.1"}],
    });
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "demo-claim", "namespace": "default", "uid": CLAIM_UID},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "knic.dev"}}]}},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "nic", "driver": "knic.dev", "pool": NODE, "device": device}],
                "config": [{"source": "FromClaim", "requests": ["nic"], "opaque": {"driver": "knic.dev", "parameters": parameters}}],
            }},
            "reservedFor": [{"resource": "pods", "name": "demo-pod", "uid": POD_UID}],
        },
    }))?)
}

struct Steps(Vec<(String, Duration)>);

impl Steps {
    fn record(&mut self, name: &str, started: Instant) {
        let took = started.elapsed();
        say!("  ✓ {name} ({})", fmt(took));
        self.0.push((name.into(), took));
    }
}

fn fmt(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.2} ms", d.as_secs_f64() * 1000.0)
    } else {
        format!("{:.0} ms", d.as_secs_f64() * 1000.0)
    }
}

async fn setup_links(scratch: &Scratch) -> anyhow::Result<()> {
    make_netns(&scratch.pod_ns())?;
    make_netns(&scratch.peer_ns())?;
    let (connection, handle, _) = rtnetlink::new_connection()?;
    let task = tokio::spawn(connection);
    handle
        .link()
        .add(rtnetlink::LinkVeth::new(&scratch.host_if, &scratch.peer_if).build())
        .execute()
        .await
        .context("creating the veth pair (is the veth module available?)")?;
    task.abort();
    let kernel = Rtnl::new(None);
    let mut host = kernel.open(&Ns::Host).await?.context("host namespace")?;
    host.set_link(
        &scratch.host_if,
        &LinkChange {
            up: Some(true),
            ..Default::default()
        },
    )
    .await?;
    let peer_ns = Ns::Pod(scratch.peer_ns());
    host.move_link(&scratch.peer_if, &peer_ns, &LinkChange::default())
        .await?;
    let mut peer = kernel.open(&peer_ns).await?.context("peer namespace")?;
    peer.add_addresses(
        &scratch.peer_if,
        &["192.0.2.1/24".parse()?, "2001:db8::1/64".parse()?],
    )
    .await?;
    peer.set_link(
        &scratch.peer_if,
        &LinkChange {
            up: Some(true),
            ..Default::default()
        },
    )
    .await?;
    Ok(())
}

async fn cleanup(scratch: &Scratch) {
    kni::cleanup(scratch);
    // Deleting the peer namespace destroys the veth pair wherever its other end is.
    delete_netns(&scratch.peer_ns());
    delete_netns(&scratch.pod_ns());
    if let Ok((connection, handle, _)) = rtnetlink::new_connection() {
        let task = tokio::spawn(connection);
        let mut links = handle
            .link()
            .get()
            .match_name(scratch.host_if.clone())
            .execute();
        if let Ok(Some(link)) = links.try_next().await {
            let _ = handle.link().del(link.header.index).execute().await;
        }
        task.abort();
    }
}

fn udp_echo(pod_ns: &Path, peer_ns: &Path) -> anyhow::Result<Duration> {
    let server = in_netns(peer_ns, || UdpSocket::bind("192.0.2.1:7007"))??;
    let client = in_netns(pod_ns, || UdpSocket::bind("192.0.2.10:0"))??;
    client.set_read_timeout(Some(Duration::from_secs(2)))?;
    server.set_read_timeout(Some(Duration::from_secs(2)))?;
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let (n, from) = server.recv_from(&mut buf)?;
        server.send_to(&buf[..n], from)
    });
    let started = Instant::now();
    client.send_to(b"knic demo", "192.0.2.1:7007")?;
    let mut buf = [0u8; 64];
    let (n, _) = client
        .recv_from(&mut buf)
        .context("no echo from 192.0.2.1 through net1")?;
    let rtt = started.elapsed();
    echo.join()
        .map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
    anyhow::ensure!(&buf[..n] == b"knic demo");
    Ok(rtt)
}

async fn demo(scratch: &Scratch) -> anyhow::Result<Steps> {
    // `isolate` mounted a sysfs of the demo's own network namespace on /sys.
    let sysfs_root = Path::new("/");
    let mut steps = Steps(Vec::new());
    let t = Instant::now();
    setup_links(scratch).await?;
    steps.record(
        &format!(
            "pod namespace, and veth {} playing a NIC (peer 192.0.2.1)",
            scratch.host_if
        ),
        t,
    );

    // Discovery: the veth is virtual, so the admin includes it by name.
    let t = Instant::now();
    let discovery = Discovery {
        root: sysfs_root.to_path_buf(),
        filter: Filter::parse_lists(&format!("name={}", scratch.host_if), "")?,
        netlink: true,
        provisioner: None,
        sharing: Default::default(),
        overlay: None,
    };
    let inventory = discovery.scan().await;
    let devices = slices::devices(&inventory, &[]);
    let device = devices
        .first()
        .context("the veth was not discovered")?
        .name
        .clone();
    steps.record("discovery", t);
    let owner = PoolOwner {
        node_name: NODE.into(),
        node_uid: String::new(),
    };
    let plan = slices::plan(
        knic_proto::DRIVER_NAME,
        &owner,
        &[],
        &slices::layout(&devices, slices::Mode::Partitionable),
        &[],
    );
    for mut slice in plan.creates {
        slice.metadata.owner_references = None;
        let mut v = serde_json::to_value(&slice)?;
        v["apiVersion"] = "resource.k8s.io/v1".into();
        v["kind"] = "ResourceSlice".into();
        say!(
            "\n{}",
            serde_yaml_ng::to_string(&v)?
                .lines()
                .map(|l| format!("    {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    // The kubelet plugin, on real unix sockets, and a kubelet's prepare over gRPC.
    let t = Instant::now();
    let paths = PluginPaths::under_kubelet_root(&scratch.dir.path().join("kubelet"));
    let (devices_tx, devices_rx) = tokio::sync::watch::channel(devices.clone());
    let catalog = kni::catalog(scratch)?;
    let wired = wiring::node(Parts {
        source: Arc::new(DemoClaims(claim(&device)?)),
        checkpoint: CheckpointStore::new(&paths.plugin_dir),
        devices: devices_rx,
        kernel: Rtnl::new(None),
        status: Arc::new(LogStatus),
        // Addresses of the KNI step's Network, as files of NetworkAddress objects.
        address_book: Some((
            Arc::new(knic_driver::kni::addresses::FileAddressBook::new(
                scratch.dir.path().join("addresses"),
                catalog.clone(),
            )),
            NODE.into(),
        )),
        pool: NODE.into(),
        sysfs_root: sysfs_root.to_path_buf(),
        fail_closed: None,
        sharing: None,
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let service = DraService::new(wired.preparer.clone());
    let health = knic_driver::kubelet::health::HealthService::new(NODE, devices_tx.subscribe());
    let serve_paths = paths.clone();
    let mut stop_serve = stop_rx.clone();
    let server = tokio::spawn(async move {
        let (registration, _) = tokio::sync::watch::channel(Registration::Pending);
        let stop = async move {
            let _ = stop_serve.wait_for(|s| *s).await;
        };
        kubelet::serve(&serve_paths, service, health, registration, stop).await
    });
    let dra = loop {
        if let Ok(channel) = kubelet::dial(&paths.dra_socket()).await {
            break v1::dra_plugin_client::DraPluginClient::new(channel);
        }
        if t.elapsed() > Duration::from_secs(5) {
            bail!("the DRA socket never came up");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    steps.record("kubelet plugin sockets up", t);
    let t = Instant::now();
    let claim_ref = v1::Claim {
        namespace: "default".into(),
        uid: CLAIM_UID.into(),
        name: "demo-claim".into(),
    };
    let answer = dra
        .clone()
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref.clone()],
        })
        .await?
        .into_inner();
    let entry = answer
        .claims
        .get(CLAIM_UID)
        .context("no answer for the claim")?;
    if !entry.error.is_empty() {
        bail!("prepare failed: {}", entry.error);
    }
    steps.record(
        &format!("NodePrepareResources over gRPC → device {device}"),
        t,
    );

    // The runtime: the real NRI protocol against a built-in runtime.
    let t = Instant::now();
    let socket = scratch.dir.path().join("nri.sock");
    let mut runtime = TestRuntime::listen(&socket).await?;
    let pods = wired.pods.clone();
    let settings = NriSettings {
        socket: socket.clone(),
        ..NriSettings::default()
    };
    let hooks = tokio::spawn(nri::run(settings, pods, stop_rx.clone()));
    let registered =
        tokio::time::timeout(Duration::from_secs(10), runtime.accept(vec![])).await??;
    steps.record(
        &format!(
            "NRI plugin {} (index {}) registered",
            registered.name, registered.index
        ),
        t,
    );

    let pod = PodSandbox {
        id: "demo-sandbox".into(),
        name: "demo-pod".into(),
        uid: POD_UID.into(),
        namespace: "default".into(),
        netns: Some(scratch.pod_ns()),
        ips: vec![],
    };
    let t = Instant::now();
    runtime
        .run_pod_sandbox(&pod)
        .await
        .map_err(anyhow::Error::msg)?;
    steps.record("RunPodSandbox → attach", t);

    let kernel = Rtnl::new(None);
    let mut inside = kernel
        .open(&Ns::Pod(scratch.pod_ns()))
        .await?
        .context("pod namespace")?;
    let link = inside
        .link("net1")
        .await?
        .context("net1 is not in the pod")?;
    let mac: Vec<String> = link
        .mac
        .unwrap_or_default()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    say!(
        "\n    inside the pod: {} mtu {} mac {} {}",
        link.name,
        link.mtu,
        mac.join(":"),
        if link.up { "UP" } else { "DOWN" }
    );
    for address in &link.addresses {
        say!(
            "      inet{} {address}",
            if address.addr.is_ipv6() { "6" } else { "" }
        );
    }
    say!("      route 203.0.113.0/24 via 192.0.2.1 dev net1\n");
    drop(inside);
    let t = Instant::now();
    // Off the runtime: its blocking reads must not delay a Ctrl-C.
    let (pod_ns, peer_ns) = (scratch.pod_ns(), scratch.peer_ns());
    let rtt = tokio::task::spawn_blocking(move || udp_echo(&pod_ns, &peer_ns)).await??;
    steps.record(
        &format!(
            "UDP echo 192.0.2.10 → 192.0.2.1 through net1, round trip {}",
            fmt(rtt)
        ),
        t,
    );

    let t = Instant::now();
    runtime
        .stop_pod_sandbox(&pod)
        .await
        .map_err(anyhow::Error::msg)?;
    runtime
        .remove_pod_sandbox(&PodSandbox {
            netns: None,
            ..pod.clone()
        })
        .await
        .map_err(anyhow::Error::msg)?;
    steps.record("StopPodSandbox/RemovePodSandbox → detach", t);
    let mut host = kernel.open(&Ns::Host).await?.context("host")?;
    let back = host
        .link(&scratch.host_if)
        .await?
        .context("the device did not come back")?;
    say!("    back on the host: {} mtu {}", back.name, back.mtu);

    let t = Instant::now();
    let out = dra
        .clone()
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![claim_ref],
        })
        .await?
        .into_inner();
    let error = out
        .claims
        .get(CLAIM_UID)
        .map(|e| e.error.clone())
        .unwrap_or_default();
    if !error.is_empty() {
        bail!("unprepare failed: {error}");
    }
    steps.record("NodeUnprepareResources over gRPC", t);

    kni::step(&mut steps, scratch, &wired, catalog, devices_tx.subscribe()).await?;

    let _ = stop_tx.send(true);
    drop(devices_tx);
    let _ = server.await;
    let _ = hooks.await;
    runtime.shutdown().await;
    Ok(steps)
}

/// The demo stopped by a signal; the process exits with the shell's status for it (128 + n).
#[derive(Debug)]
pub struct Interrupted(Signal);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted by {}", self.0.as_str())
    }
}

impl std::error::Error for Interrupted {}

impl Interrupted {
    pub fn exit_code(&self) -> std::process::ExitCode {
        // Signal numbers are small positive integers (SIGINT 2, SIGTERM 15).
        std::process::ExitCode::from(128u8.saturating_add(self.0 as u8))
    }
}

/// Proof that [`isolate`] ran: only then may [`run`] create anything.
pub struct Isolated(());

fn stop_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set
}

/// Blocks SIGINT and SIGTERM on this thread (and on every thread it starts later), so that one
/// sent before [`run`] installs its handlers waits, pending, instead of killing the demo
/// half-way or being lost.
///
/// That holds even for a process that inherited them *ignored* (a shell without job control
/// starts `cmd &` with SIGINT ignored, and exec keeps it so): Linux never discards a blocked
/// signal as ignored, since its action may change before it is unblocked, and [`run`]
/// installs tokio's handlers before unblocking. Only a signal sent before this call, while the
/// process is still starting, meets the inherited action: the default kills a demo that has
/// created nothing yet, an inherited "ignore" discards it.
pub fn hold_stop_signals() -> anyhow::Result<()> {
    stop_signals()
        .thread_block()
        .context("blocking SIGINT and SIGTERM until their handlers are installed")
}

/// Holds SIGINT and SIGTERM ([`hold_stop_signals`]: they stay pending until [`run`] can handle
/// them), then moves
/// the process into a network and a mount namespace of its own, with a sysfs that shows that
/// network namespace on /sys and a private tmpfs on the temp directory. Must run before any
/// other thread exists: namespaces and signal masks are per thread, and threads started later
/// (the runtime's) inherit them from this one.
pub fn isolate() -> anyhow::Result<Isolated> {
    hold_stop_signals()?;
    let tmp = std::env::temp_dir();
    if tmp.canonicalize().is_ok_and(|t| t == Path::new("/")) {
        bail!(
            "invalid TMPDIR {}: the demo mounts a private tmpfs over it, which must not hide /",
            tmp.display()
        );
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("knic-driver demo needs root: it creates network namespaces and a veth pair");
    }
    unshare(CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWNS)
        .context("moving into a network and a mount namespace of the demo's own")?;
    // Nothing mounted from here on may propagate to the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("making the demo's mounts private")?;
    // A sysfs shows the network namespace of whoever mounts it; the host's would not show the
    // demo's veth.
    mount(
        Some("sysfs"),
        "/sys",
        Some("sysfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .context("mounting a sysfs of the demo's network namespace on /sys")?;
    mount(
        Some("tmpfs"),
        &tmp,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0700"),
    )
    .with_context(|| format!("mounting a private tmpfs on {}", tmp.display()))?;
    Ok(Isolated(()))
}

/// SIGINT and SIGTERM as streams; created while both are still blocked, then unblocked, so
/// one that arrived earlier is delivered now rather than lost or fatal.
struct StopSignals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> anyhow::Result<StopSignals> {
        let int = tokio::signal::unix::signal(SignalKind::interrupt())
            .context("installing the SIGINT handler")?;
        let term = tokio::signal::unix::signal(SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        // Only this thread (the one `block_on` runs on) takes them; the runtime's threads
        // keep them blocked, which is fine: a process-directed signal goes to a thread that
        // does not block it.
        stop_signals()
            .thread_unblock()
            .context("unblocking SIGINT and SIGTERM")?;
        Ok(StopSignals { int, term })
    }

    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
        }
    }
}

/// How long the clean-up may take before the demo leaves it to the kernel.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the demo; clean-up happens whatever the outcome, including SIGINT and SIGTERM.
pub async fn run(_isolated: Isolated) -> anyhow::Result<()> {
    let mut signals = StopSignals::install()?;
    // The names only have to be unique in the demo's own network namespace.
    let id = std::process::id() % 100_000;
    let scratch = Scratch {
        dir: tempfile::Builder::new().prefix("knic-demo-").tempdir()?,
        host_if: format!("knd{id}a"),
        peer_if: format!("knd{id}b"),
    };
    say!("knic demo: a pod gets a NIC, no cluster needed\n");
    let started = Instant::now();
    let outcome = tokio::select! {
        r = demo(&scratch) => r,
        signal = signals.next() => Err(Interrupted(signal).into()),
    };
    let t = Instant::now();
    tokio::select! {
        done = tokio::time::timeout(CLEANUP_TIMEOUT, cleanup(&scratch)) => match done {
            Ok(()) => say!(
                "  ✓ clean-up: namespaces and veth pair removed ({})",
                fmt(t.elapsed())
            ),
            Err(_) => say!(
                "  ✗ clean-up took over {}; the kernel removes the rest with the process",
                fmt(CLEANUP_TIMEOUT)
            ),
        },
        signal = signals.next() => {
            say!("  ✗ clean-up cut short by {}; the kernel removes the rest with the process",
                signal.as_str());
            return Err(Interrupted(signal).into());
        }
    }
    let steps = outcome?;
    let attach = steps
        .0
        .iter()
        .find(|(n, _)| n.starts_with("RunPodSandbox"))
        .map(|(_, d)| *d);
    say!(
        "\ndone in {} (attach {}); nothing left behind",
        fmt(started.elapsed()),
        attach.map(fmt).unwrap_or_default()
    );
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Set in the re-executed test binary: that process is the child the test observes.
    const CHILD: &str = "KNIC_TEST_HOLD_CHILD";
    const TEST: &str = "demo::tests::a_held_signal_waits_even_when_inherited_ignored";

    /// The bit of `signal` in a `/proc/*/status` signal mask line (`SigIgn:`, `SigPnd:`).
    fn in_mask(status: &str, line: &str, signal: Signal) -> bool {
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix(line))
            .map(str::trim)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            .unwrap();
        mask & (1 << (signal as u32 - 1)) != 0
    }

    /// The child: started with SIGINT ignored, it holds the stop signals and raises SIGINT,
    /// which must then be pending on its thread rather than discarded.
    fn child() {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        assert!(
            in_mask(&status, "SigIgn:", Signal::SIGINT),
            "the child was meant to start with SIGINT ignored"
        );
        hold_stop_signals().unwrap();
        nix::sys::signal::raise(Signal::SIGINT).unwrap();
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        assert!(
            in_mask(&status, "SigPnd:", Signal::SIGINT),
            "SIGINT was discarded:\n{status}"
        );
        println!("knic-test: SIGINT pending");
    }

    /// The demo is often started by scripts (`knic-driver demo &`) that leave SIGINT ignored;
    /// once the signals are held, a Ctrl-C sent before the handlers exist must still wait for
    /// them. Observed in a re-executed copy of this test binary started through
    /// `env --ignore-signal`, as such a shell starts it.
    #[test]
    fn a_held_signal_waits_even_when_inherited_ignored() {
        if std::env::var_os(CHILD).is_some() {
            return child();
        }
        let probe = std::process::Command::new("env")
            .args(["--ignore-signal=INT", "true"])
            .status();
        if !probe.is_ok_and(|s| s.success()) {
            eprintln!("skipped: needs coreutils' `env --ignore-signal` (coreutils 8.31 or later)");
            return;
        }
        let out = std::process::Command::new("env")
            .arg("--ignore-signal=INT,TERM")
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("knic-test: SIGINT pending"),
            "{}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
