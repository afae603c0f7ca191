//! `knic-driver`: the per-node DaemonSet binary.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

mod cluster_kni;
mod cni_bin;
mod demo;
mod discovery_args;
mod inventory_cmd;
mod standalone;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use knic_driver::api::events::KubeEvents;
use knic_driver::api::slices::{Publisher, PublisherSettings};
use knic_driver::api::{KubeAddressBook, KubeClaims, KubeStatus};
use knic_driver::cdi::CdiSpecs;
use knic_driver::claims::checkpoint::CheckpointStore;
use knic_driver::claims::orphans::{self, OrphanSettings};
use knic_driver::http;
use knic_driver::kni;
use knic_driver::kubelet::health::HealthService;
use knic_driver::kubelet::{self, DraService, PluginPaths, Registration};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::nri::{self, NriSettings};
use knic_driver::sharing::{self, ShareMode};
use knic_driver::slices;
use knic_driver::slices::exhaustion;
use knic_driver::slices::rescan::{self, RescanSettings};
use knic_driver::sriov::writes::LiveWrites;
use knic_driver::sriov::{Provisioner, SriovPolicy};
use knic_driver::wiring::{self, FailClosed, Parts};
use knic_proto::logging::{self, LogFormat};
use knic_proto::metrics::Health;
use tokio::signal::unix::{SignalKind, signal};

use discovery_args::DiscoveryArgs;

/// The driver's readiness conditions, as `/readyz` names them when they do not hold.
const READY_SLICES: &str = "ResourceSlices published";
const READY_REGISTERED: &str = "kubelet registration acknowledged";
const READY_NRI: &str = "NRI plugin connected";
/// `/healthz` fails when the runtime has not run the heartbeat task for this long.
const HEALTH_STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// How long the first ResourceSlice publish waits for the list of Networks.
const NETWORKS_SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// knic: network interfaces as Kubernetes DRA devices.
#[derive(Debug, Parser)]
#[command(name = "knic-driver", version, about)]
struct Cli {
    /// Log line format: text (one readable line per event; human is the same) or json (one
    /// object per line: timestamp, level, target, message and the event's fields). On stderr.
    #[arg(
        long,
        env = "KNIC_LOG_FORMAT",
        value_parser = LogFormat::parse,
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
    /// Log filter, e.g. `info` or `knic_driver=debug,info` [default: info; warn for demo].
    #[arg(long, env = "KNIC_LOG_LEVEL", global = true)]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node driver: discover and publish devices, serve the kubelet's DRA plugin.
    Run(Box<RunArgs>),
    /// Print what this node would publish (no cluster needed).
    Inventory(inventory_cmd::InventoryArgs),
    /// Show knic's whole job on this machine, no cluster needed (root): a throwaway pod
    /// namespace gets a veth "NIC" through the real gRPC and NRI protocols, then it is undone.
    /// It runs in network and mount namespaces of its own, so nothing it creates can outlive
    /// it, whatever stops it.
    Demo,
    /// Serve the KNI network runtime API without a cluster (`--standalone`): Networks from
    /// files, devices from this node, attachments through the same prepare and attach code.
    Kni(Box<standalone::KniArgs>),
    /// The CDI hook the runtime runs at container creation (OCI state on stdin): fails unless
    /// the claim's interface is in the container's network namespace and up.
    CheckInterface(CheckArgs),
    /// Copy this binary to DIR/knic, the CNI plugin Multus runs for a Network's
    /// NetworkAttachmentDefinition (the chart's init container, with driver.cni.enabled): the
    /// image has no shell or cp. Written beside and renamed, so a runtime never runs half a file.
    InstallCni(cni_bin::InstallCniArgs),
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// The claim, `namespace/name` (for the error text).
    #[arg(long)]
    claim: String,
    /// The interface name in the pod.
    #[arg(long)]
    interface: String,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// This node's name (pool name, slice owner); usually from the downward API.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Kubeconfig file; without it the in-cluster service account is used.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Seconds one API request may go unanswered before it is abandoned (and repeated when
    /// that is safe); a watch's stream is exempt.
    #[arg(long, env = "KNIC_API_TIMEOUT_SECONDS", default_value_t = 15,
        value_parser = clap::value_parser!(u64).range(1..=600))]
    api_timeout_seconds: u64,
    /// The kubelet's root directory; the two directories below default under it.
    #[arg(
        long,
        env = "KNIC_KUBELET_ROOT_DIR",
        default_value = "/var/lib/kubelet"
    )]
    kubelet_root_dir: PathBuf,
    /// Directory the kubelet's plugin watcher scans [default: <kubelet-root-dir>/plugins_registry].
    #[arg(long, env = "KNIC_REGISTRY_DIR")]
    registry_dir: Option<PathBuf>,
    /// The driver's directory for its DRA socket and checkpoint
    /// [default: <kubelet-root-dir>/plugins/knic.dev].
    #[arg(long, env = "KNIC_PLUGIN_DIR")]
    plugin_dir: Option<PathBuf>,
    /// The container runtime's NRI socket (the plugin dials it).
    #[arg(long, env = "KNIC_NRI_SOCKET", default_value = "/var/run/nri/nri.sock")]
    nri_socket: PathBuf,
    /// NRI plugin index: two digits; plugins run in ascending order.
    #[arg(long, env = "KNIC_NRI_INDEX", default_value = "10")]
    nri_index: String,
    /// Where the container runtime reads CDI specs: every prepared device gets one whose hook
    /// keeps containers from starting without their interface.
    #[arg(long, env = "KNIC_CDI_DIR", default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// Give containers a KEP-5304 device metadata file per claim request (PCI address, VFIO
    /// group, interface name, MAC, addresses) at
    /// /var/run/kubernetes.io/dra-device-attributes/…, bind-mounted through CDI from
    /// <plugin-dir>/metadata.
    #[arg(long, env = "KNIC_DEVICE_METADATA", default_value_t = true, action = clap::ArgAction::Set)]
    device_metadata: bool,
    /// Where the host's `/proc/sys/net` is: per-interface sysctls are written there (the chart
    /// mounts it elsewhere, because an unprivileged container's own `/proc/sys` is read-only).
    #[arg(long, env = "KNIC_SYSCTL_DIR", default_value = knic_driver::netns::rtnl::DEFAULT_SYSCTL_ROOT)]
    sysctl_dir: PathBuf,
    /// Rescan at least this often, in seconds (link events trigger rescans too); at least 1.
    #[arg(long, env = "KNIC_RESCAN_SECONDS", default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..))]
    rescan_seconds: u64,
    /// Seconds nothing of a prepared claim may be in a pod before knic asks the API whether
    /// its ResourceClaim still exists (the kubelet's own unprepare normally comes first).
    #[arg(long, env = "KNIC_ORPHAN_IDLE_SECONDS", default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=3600))]
    orphan_idle_seconds: u64,
    /// Seconds between the API's first "gone" answer about a prepared claim (its devices are
    /// withheld from then on) and knic unpreparing it itself, after a second such answer.
    #[arg(long, env = "KNIC_ORPHAN_GRACE_SECONDS", default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=3600))]
    orphan_grace_seconds: u64,
    /// The node's SR-IOV policy, YAML or JSON (`pools:` entries selecting PFs by `pfNames`,
    /// `pciAddresses` or `pciIds`, each with `numVfs` and optionally `vfDriver`); knic creates
    /// and binds the VFs it asks for before every scan. Unset: VFs are left as they are.
    #[arg(long, env = "KNIC_SRIOV_POLICY")]
    sriov_policy: Option<PathBuf>,
    /// Where `sys/` is writable for the SR-IOV policy and vfio-pci binds [default:
    /// --sysfs-root]; the chart mounts the host's /sys there, because a container's own /sys is
    /// read-only.
    #[arg(long, env = "KNIC_SRIOV_SYSFS_ROOT")]
    sriov_sysfs_root: Option<PathBuf>,
    /// Seconds to wait for the kernel to create or bind a PF's VFs, per step.
    #[arg(long, env = "KNIC_SRIOV_WAIT_SECONDS", default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=300))]
    sriov_wait_seconds: u64,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (plain HTTP, `address:port`);
    /// the empty string disables the server. The DaemonSet uses the host network, so this is a
    /// port on the node.
    #[arg(long, env = "KNIC_HTTP_ADDRESS", default_value = "0.0.0.0:9461",
        value_parser = http_address)]
    http_address: String,
    /// Read a claim's pod for its labels, for Networks with `stableAddresses.by: label`. Needs
    /// `get` on pods cluster-wide, which RBAC grants as whole objects (spec and env values
    /// included) for every pod; the chart grants it only with `driver.podLabelReads`. Off:
    /// no pod is ever read and such claims fail prepare saying why.
    #[arg(long, env = "KNIC_POD_LABEL_READS", default_value_t = false,
        action = clap::ArgAction::Set)]
    pod_label_reads: bool,
    /// The KNI network runtime API's unix socket (root only, 0600): a runtime, a VM manager or
    /// a test attaches knic networks to sandboxes through it. Empty: not served.
    // A `String`, not a `PathBuf`: clap refuses an empty path value, and empty means off.
    #[arg(long, env = "KNIC_KNI_SOCKET", default_value = "")]
    kni_socket: String,
    /// The CNI door's unix socket (root only, 0600): the `knic` CNI plugin (this binary run
    /// as `/opt/cni/bin/knic`, e.g. by Multus) asks through it to attach a pod's claim of a
    /// Network into the netns the runtime made. Empty: not served. The plugin finds it at
    /// `KNIC_CNI_SOCKET`, else /var/run/knic/cni.sock.
    #[arg(long, env = "KNIC_CNI_SOCKET", default_value = "")]
    cni_socket: String,
    /// The one directory KNI CreateNetwork pins sandbox network namespaces in.
    #[arg(long, env = "KNIC_KNI_NETNS_DIR", default_value = "/var/run/netns")]
    kni_netns_dir: PathBuf,
    /// Keep this node's NodeNetworks object (knic.dev) current: the driver's readiness and
    /// the Networks usable here, for `kubectl get nodenetworks`.
    #[arg(long, env = "KNIC_NODE_NETWORKS", default_value_t = false,
        action = clap::ArgAction::Set)]
    node_networks: bool,
    /// Pods per second a change of a Network's routes or MTU is applied to on this node
    /// (a token bucket: a Network with many pods here is updated over several seconds).
    #[arg(long, env = "KNIC_LIVE_UPDATE_RATE", default_value_t = 10,
        value_parser = clap::value_parser!(u32).range(1..=10_000))]
    live_update_rate: u32,
    #[command(flatten)]
    discovery: DiscoveryArgs,
}

/// `--http-address`: an address to listen on, or empty for none (checked when parsed).
fn http_address(value: &str) -> Result<String, String> {
    knic_proto::metrics::listen_address(value)
        .map(|_| value.to_owned())
        .map_err(|e| e.to_string())
}

async fn kube_client(
    kubeconfig: Option<&PathBuf>,
    timeout: std::time::Duration,
) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig given and not in a cluster")?,
    };
    let policy = knic_proto::backoff::RetryPolicy::with_timeout(timeout);
    Ok(knic_driver::api::client::connect(config, policy)?)
}

async fn shutdown_signal() {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the driver with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_ascii_lowercase())
        .unwrap_or_else(|_| "localhost".into())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    if let Err(reason) = knic_driver::check_dns_subdomain(&args.node_name) {
        bail!("invalid --node-name/NODE_NAME: {reason}");
    }
    let mut discovery = args.discovery.discovery()?;
    if let Some(path) = &args.sriov_policy {
        let policy = SriovPolicy::from_file(path)?;
        if !policy.is_empty() {
            let root = args
                .sriov_sysfs_root
                .clone()
                .unwrap_or_else(|| discovery.root.clone());
            let sys = root.join("sys");
            if nix::sys::statvfs::statvfs(&sys)
                .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
            {
                bail!(
                    "invalid setting --sriov-sysfs-root/KNIC_SRIOV_SYSFS_ROOT: the SR-IOV policy has \
                     pools, but {} is read-only (a container's own /sys is): point it at a \
                     writable mount of the host's /sys (the chart's driver.sriov.writableSysfs \
                     mounts it at /host/sys)",
                    sys.display()
                );
            }
            tracing::info!(policy = %path.display(), pools = policy.pools.len(),
                root = %root.display(), "SR-IOV policy loaded");
            discovery.provisioner = Some(Arc::new(
                Provisioner::new(root, policy, Arc::new(LiveWrites))
                    .with_wait(std::time::Duration::from_secs(args.sriov_wait_seconds)),
            ));
        }
    }
    let nri_settings = NriSettings {
        socket: args.nri_socket.clone(),
        plugin_index: args.nri_index.clone(),
        ..NriSettings::default()
    };
    nri_settings.validate()?;
    let defaults = PluginPaths::under_kubelet_root(&args.kubelet_root_dir);
    let paths = PluginPaths {
        registry_dir: args.registry_dir.unwrap_or(defaults.registry_dir),
        plugin_dir: args.plugin_dir.unwrap_or(defaults.plugin_dir),
    };
    let client = kube_client(
        args.kubeconfig.as_ref(),
        std::time::Duration::from_secs(args.api_timeout_seconds),
    )
    .await?;
    let http = http::bind(
        "--http-address/KNIC_HTTP_ADDRESS",
        knic_proto::metrics::listen_address(&args.http_address)?,
    )
    .await?;
    let health = Arc::new(Health::new(
        &[READY_SLICES, READY_REGISTERED, READY_NRI],
        HEALTH_STALL,
    ));
    let metrics = knic_driver::metrics::metrics();
    // Served from here on, so probes answer during a long first discovery (VF creation).
    let (http_stop, http_stop_rx) = tokio::sync::watch::channel(false);
    let serving = http.map(|listener| {
        tokio::spawn(http::serve(
            listener,
            &metrics.registry,
            health.clone(),
            http_stop_rx,
        ))
    });
    tracing::info!(node = %args.node_name, plugin_dir = %paths.plugin_dir.display(),
        registry_dir = %paths.registry_dir.display(), pod_label_reads = args.pod_label_reads,
        "knic-driver starting");
    let (devices_tx, devices_rx) = tokio::sync::watch::channel(Vec::new());
    // The preparer and health see the devices as published: shared parents as child slots
    // once the publisher has found the apiserver without consumable capacity.
    let (share_mode_tx, share_mode_rx) = tokio::sync::watch::channel(ShareMode::Capacity);
    let (view_tx, view_rx) = tokio::sync::watch::channel(Vec::new());
    tokio::spawn(sharing::follow(devices_rx.clone(), share_mode_rx, view_tx));
    // The CDI hook runs the driver's own binary from the host's mount namespace.
    let hook = paths.plugin_dir.join("bin").join("knic-driver");
    knic_driver::cdi::install_hook(&hook)?;
    let mut cdi = CdiSpecs::new(&args.cdi_dir, &hook);
    if args.device_metadata {
        cdi = cdi.with_metadata(knic_driver::cdi::metadata::Metadata::new(
            paths.plugin_dir.join("metadata"),
        ));
    }
    let (nri_connected_tx, nri_connected) = tokio::sync::watch::channel(false);
    http::mirror(
        health.clone(),
        READY_NRI,
        nri_connected.clone(),
        |c| *c,
        Some(metrics.nri_connected.clone()),
    );
    let events = Arc::new(KubeEvents::new(client.clone(), &args.node_name));
    // `ipam: {network}` claims get their addresses from this node, through the API.
    let wired = wiring::node(Parts {
        source: Arc::new(KubeClaims::new(client.clone())),
        checkpoint: CheckpointStore::new(&paths.plugin_dir),
        devices: view_rx.clone(),
        kernel: Rtnl::new(None).with_sysctl_root(&args.sysctl_dir),
        status: Arc::new(KubeStatus::new(client.clone())),
        address_book: Some((
            Arc::new(
                KubeAddressBook::new(client.clone())
                    .with_pod_label_reads(args.pod_label_reads)
                    .with_events(events.clone()),
            ),
            args.node_name.clone(),
        )),
        pool: args.node_name.clone(),
        // vfio-pci binds write sysfs too: where the SR-IOV policy writes.
        sysfs_root: args
            .sriov_sysfs_root
            .clone()
            .unwrap_or_else(|| discovery.root.clone()),
        fail_closed: Some(FailClosed {
            cdi: cdi.clone(),
            nri_connected,
            nri_socket: args.nri_socket.display().to_string(),
        }),
        sharing: Some(discovery.sharing.clone()),
    });

    wired.pods.set_events(events.clone());
    // Before the kubelet can call: files of claims the checkpoint no longer has (a crash
    // between unprepare's record and the files' removal) go.
    // An unreadable checkpoint sweeps nothing: prepare is refused until it is repaired.
    if let (Some(metadata), Ok(prepared)) = (cdi.metadata(), wired.claims.snapshot().await) {
        match metadata.sweep(&|uid| prepared.claims.contains_key(uid)) {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!(claims = ?removed, "removed device metadata of unprepared claims")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "device metadata sweep failed"),
        }
    }

    // Provision and discover before anything is published or served, so the first slice is
    // the real one.
    if let Some(report) = discovery.provision(&wired.claims).await {
        tracing::info!(
            changed = report.changed.len(),
            refused = report.refused.len(),
            failed = report.failed.len(),
            unmatched = ?report.unmatched,
            "SR-IOV policy applied"
        );
    }
    let first = discovery.scan().await;
    let retained = rescan::retained(&wired.claims, &args.node_name).await;
    let (offered, not_offered) = (first.devices.len(), first.excluded.len());
    let devices = discovery.devices(&first, &retained);
    // The inventory's copy of the devices is not needed once they are in API form: freed
    // before the publish makes its own, so two full copies are never alive at once.
    drop(first);
    devices_tx.send_replace(devices);
    tracing::info!(
        offered,
        not_offered,
        retained = retained.len(),
        "initial discovery finished"
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Slices carry the devices plus the list of full networks (see `exhaustion`); the preparer,
    // the checkpoint and health keep seeing devices as discovered.
    let (exhausted_tx, exhausted_rx) = tokio::sync::watch::channel(None);
    // The devices of prepared claims the API says are gone are not offered (see
    // `claims::orphans`), until knic has unprepared them.
    let (withheld_tx, withheld_rx) = tokio::sync::watch::channel(BTreeSet::new());
    // Nor are the devices sandboxes hold through the KNI socket, until they are detached.
    let (kni_held_tx, kni_held_rx) = tokio::sync::watch::channel(BTreeSet::new());
    tokio::spawn(kni::withheld(wired.claims.clone(), kni_held_tx));
    let (all_withheld_tx, all_withheld_rx) = tokio::sync::watch::channel(BTreeSet::new());
    tokio::spawn(slices::withhold::union(
        vec![withheld_rx, kni_held_rx],
        all_withheld_tx,
    ));
    let (offered_tx, offered_rx) = tokio::sync::watch::channel(devices_rx.borrow().clone());
    tokio::spawn(slices::withhold::apply(
        devices_rx.clone(),
        all_withheld_rx,
        offered_tx,
    ));
    tokio::spawn(orphans::reap(
        wired.preparer.clone(),
        Arc::new(KubeClaims::new(client.clone())),
        events.clone(),
        OrphanSettings {
            idle: std::time::Duration::from_secs(args.orphan_idle_seconds),
            grace: std::time::Duration::from_secs(args.orphan_grace_seconds),
            ..OrphanSettings::default()
        },
        withheld_tx,
        stop_rx.clone(),
    ));
    let first_published = exhaustion::mark(&offered_rx.borrow(), None);
    let (published_tx, published_rx) = tokio::sync::watch::channel(first_published);
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
    let (networks_changed_tx, networks_changed) = tokio::sync::watch::channel(0u64);
    let (networks_tx, networks_rx) = tokio::sync::watch::channel(Arc::new(Vec::new()));
    tokio::spawn(knic_driver::api::networks::watch_networks(
        client.clone(),
        exhausted_tx,
        networks_changed_tx,
        synced_tx,
        networks_tx,
    ));
    tokio::spawn(knic_driver::pods::update::follow(
        wired.pods.clone(),
        networks_rx.clone(),
        args.live_update_rate,
        knic_driver::pods::update::DEBOUNCE,
    ));
    tokio::spawn(exhaustion::apply(offered_rx, exhausted_rx, published_tx));
    if let Some(offer) = &discovery.overlay {
        let kernel = Rtnl::new(None).with_sysctl_root(&args.sysctl_dir);
        let joined = wired.pods.overlay_joined();
        knic_driver::overlay::start(client.clone(), kernel, offer.vtep, networks_rx, joined);
    }
    let publisher = Publisher::new(client.clone(), knic_proto::DRIVER_NAME, &args.node_name)
        .with_share_mode(share_mode_tx);
    let (slices_published_tx, slices_published) = tokio::sync::watch::channel(false);
    let published_fact = slices_published.clone();
    http::mirror(health.clone(), READY_SLICES, slices_published, |p| *p, None);
    let publishing = tokio::spawn(async move {
        // First publish once the full networks are known (a restart must not briefly offer
        // them), bounded for a cluster without the Network CRD; registration and prepare do
        // not wait for it.
        let _ = tokio::time::timeout(NETWORKS_SYNC_WAIT, synced_rx).await;
        publisher
            .run_reporting(
                published_rx,
                PublisherSettings::default(),
                slices_published_tx,
            )
            .await;
    });
    let rescan = RescanSettings {
        period: std::time::Duration::from_secs(args.rescan_seconds),
        ..Default::default()
    };
    let rescans = tokio::spawn(rescan::keep_current(
        discovery,
        args.node_name.clone(),
        wired.claims.clone(),
        devices_tx,
        rescan,
        stop_rx.clone(),
    ));

    let nri_fact = nri_connected_tx.subscribe();
    let kni_pods = wired.pods.clone();
    // Runtime hooks: attach when the sandbox exists, detach when it stops.
    let hooks = tokio::spawn(nri::run_reporting(
        nri_settings,
        wired.pods.clone(),
        stop_rx.clone(),
        nri_connected_tx,
    ));

    let cni_served = match args.cni_socket.as_str() {
        "" => None,
        socket => Some(knic_driver::cni::door::serve(
            std::path::Path::new(socket),
            wired.pods.clone(),
            stop_rx.clone(),
        )?),
    };
    let (registration, registration_rx) = tokio::sync::watch::channel(Registration::Pending);
    // The KNI door beside the kubelet's: same store, same pod networks, its own preparer.
    let kni_served = cluster_kni::start(
        &wired,
        cluster_kni::Start {
            socket: PathBuf::from(&args.kni_socket),
            netns_dir: args.kni_netns_dir.clone(),
            sysfs_root: args.discovery.sysfs_root.clone(),
            node: args.node_name.clone(),
            node_networks: args.node_networks,
            networks_changed,
            client: client.clone(),
            offered: view_rx.clone(),
            published: published_fact,
            registration: registration_rx.clone(),
            nri: nri_fact,
            pods: kni_pods,
            stop: stop_rx.clone(),
        },
    )?;
    http::mirror(
        health.clone(),
        READY_REGISTERED,
        registration_rx,
        |r| *r == Registration::Registered,
        Some(metrics.kubelet_registered.clone()),
    );
    let service = DraService::new(wired.preparer.clone()).with_events(events);
    let health = HealthService::new(args.node_name.clone(), view_rx.clone());
    let served = kubelet::serve(&paths, service, health, registration, shutdown_signal()).await;
    let _ = stop_tx.send(true);
    let _ = rescans.await;
    let _ = hooks.await;
    if let Some(cni_served) = cni_served {
        let _ = cni_served.await;
    }
    if let Some(kni_served) = kni_served
        && let Ok(Err(e)) = kni_served.await
    {
        tracing::error!(error = %e, "the KNI socket failed");
    }
    // Attach marks kept in memory reach the disk, so the next start need not re-check them.
    if let Err(e) = wired.claims.flush().await {
        tracing::warn!(error = %e, "could not write the last attach marks; the next start re-checks those devices");
    }
    // Nothing changes claims any more: what no prepared claim needs goes (an uninstall
    // leaves the node as it was), the rest stays for the next start. Only after a clean stop:
    // a server that failed (a live socket of another driver on these directories) says the
    // files may not be this process's alone.
    if served.is_ok() {
        knic_driver::tidy::report(&knic_driver::tidy::on_stop(&wired.claims, Some(&cdi)).await);
    }
    let _ = http_stop.send(true);
    if let Some(serving) = serving {
        let _ = serving.await;
    }
    publishing.abort();
    served?;
    tracing::info!("knic-driver stopped");
    Ok(())
}

/// The error and its causes, each once (see `knic_proto::error::chain_text`).
fn error_text(error: &anyhow::Error) -> String {
    knic_proto::error::chain_text(error.as_ref())
}

fn report(format: LogFormat, error: &anyhow::Error) {
    logging::fatal(format, "knic-driver", &error_text(error));
}

/// Not `#[tokio::main]`: the demo moves into namespaces of its own before the runtime starts,
/// because namespaces belong to threads and every runtime thread must inherit the demo's.
fn main() -> std::process::ExitCode {
    let invoked_as = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    if invoked_as.as_deref() == Some(knic_proto::network::nad::CNI_TYPE) {
        return cni_bin::plugin();
    }
    let cli = Cli::parse();
    // The demo prints its own narrative; routine log lines would drown it.
    let default_level = if matches!(cli.command, Command::Demo) {
        "warn"
    } else {
        "info"
    };
    let level = cli
        .log_level
        .clone()
        .unwrap_or_else(|| default_level.to_string());
    if let Err(e) = logging::init(cli.log_format, &level) {
        eprintln!("knic-driver: {e}");
        return std::process::ExitCode::from(2);
    }
    let isolated = match cli.command {
        Command::Demo => match demo::isolate() {
            Ok(isolated) => Some(isolated),
            Err(e) => {
                report(cli.log_format, &e);
                return std::process::ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            report(
                cli.log_format,
                &anyhow::Error::new(e).context("starting the runtime"),
            );
            return std::process::ExitCode::FAILURE;
        }
    };
    let is_demo = isolated.is_some();
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run(*args).await,
            Command::Inventory(args) => inventory_cmd::run(args).await,
            Command::Kni(args) => standalone::run(*args, shutdown_signal()).await,
            Command::Demo => demo::run(isolated.context("the demo did not isolate itself")?).await,
            Command::InstallCni(args) => cni_bin::install(&args.dir),
            Command::CheckInterface(args) => {
                use std::io::Read;
                // The OCI state is a few hundred bytes; a runtime never sends more than 1 MiB.
                let mut state = String::new();
                std::io::stdin()
                    .take(1 << 20)
                    .read_to_string(&mut state)
                    .context("reading the OCI state on stdin")?;
                Ok(knic_driver::cdi::run_check(&args.claim, &args.interface, &state).await?)
            }
        }
    });
    if is_demo {
        // The demo's blocking helpers (a UDP echo waiting for its timeout) must not hold up
        // the exit after an interrupt; everything they use dies with the process anyway.
        runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    } else {
        drop(runtime);
    }
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            report(cli.log_format, &e);
            match e.downcast_ref::<demo::Interrupted>() {
                Some(interrupted) => interrupted.exit_code(),
                None => std::process::ExitCode::FAILURE,
            }
        }
    }
}
