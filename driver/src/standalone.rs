//! `knic-driver kni --standalone`: the KNI network runtime API with no cluster (the KNI
//! slides' standalone architecture). Networks and DeviceClasses come from local files, devices
//! from this node's sysfs (the same discovery and filter as `run`), addresses from a directory
//! of `NetworkAddress` files; attachments are prepared, recorded in the checkpoint, attached
//! and undone by the same code as in a cluster. Nothing is published and no kubelet or
//! runtime hook is involved: the caller (a VM manager, a runtime, a test) asks for everything
//! through the socket.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use knic_driver::claims::checkpoint::CheckpointStore;
use knic_driver::kni::addresses::FileAddressBook;
use knic_driver::kni::catalog::{Catalog, FileCatalog};
use knic_driver::kni::ready::NodeFacts;
use knic_driver::kni::{self, sandbox::Pending};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::pods::LogStatus;
use knic_driver::sharing::{self, ShareMode};
use knic_driver::slices::rescan::{self, RescanSettings};
use knic_driver::wiring::{self, Parts};

/// `knic-driver kni`'s flags.
#[derive(Debug, clap::Args)]
pub struct KniArgs {
    /// Serve without a cluster: Networks and DeviceClasses from --networks, devices from this
    /// node's sysfs, addresses and the checkpoint under --state-dir. (In a cluster,
    /// `knic-driver run --kni-socket PATH` serves the API beside the kubelet's door.)
    #[arg(long)]
    standalone: bool,
    /// This node's name (the pool the devices are named in) [default: the host name].
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// YAML or JSON files of knic Networks (and DeviceClasses beyond the built-in ones); comma
    /// separated in the environment. None: only inline configs can be attached.
    #[arg(long = "networks", env = "KNIC_NETWORKS", value_delimiter = ',')]
    networks: Vec<PathBuf>,
    /// The KNI socket (root only, 0600).
    #[arg(
        long,
        env = "KNIC_KNI_SOCKET",
        default_value = "/var/run/knic/kni.sock"
    )]
    kni_socket: PathBuf,
    /// Where the checkpoint and the address files are kept.
    #[arg(long, env = "KNIC_STATE_DIR", default_value = "/var/lib/knic")]
    state_dir: PathBuf,
    /// The one directory CreateNetwork pins sandbox network namespaces in.
    #[arg(long, env = "KNIC_KNI_NETNS_DIR", default_value = "/var/run/netns")]
    kni_netns_dir: PathBuf,
    /// Where the host's `/proc/sys/net` is (per-interface sysctls are written there).
    #[arg(long, env = "KNIC_SYSCTL_DIR", default_value = knic_driver::netns::rtnl::DEFAULT_SYSCTL_ROOT)]
    sysctl_dir: PathBuf,
    /// Rescan at least this often, in seconds (link events rescan at once).
    #[arg(long, env = "KNIC_RESCAN_SECONDS", default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..))]
    rescan_seconds: u64,
    #[command(flatten)]
    discovery: super::DiscoveryArgs,
}

/// Serves until `shutdown`.
pub async fn run(args: KniArgs, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    if !args.standalone {
        bail!(
            "knic-driver kni serves the KNI API without a cluster and needs --standalone; in a \
             cluster, `knic-driver run --kni-socket PATH` serves it beside the kubelet's door"
        );
    }
    let node = args.node_name.clone().unwrap_or_else(super::hostname);
    if let Err(reason) = knic_driver::check_dns_subdomain(&node) {
        bail!("invalid --node-name/NODE_NAME: {reason}");
    }
    let files = FileCatalog::new(args.networks.clone());
    let (networks, _) = files.load()?;
    let catalog: Arc<dyn Catalog> = Arc::new(files);
    let discovery = args.discovery.discovery()?;
    let (devices_tx, devices_rx) = tokio::sync::watch::channel(Vec::new());
    let (_share_mode, share_mode_rx) = tokio::sync::watch::channel(ShareMode::Capacity);
    let (view_tx, view_rx) = tokio::sync::watch::channel(Vec::new());
    tokio::spawn(sharing::follow(devices_rx.clone(), share_mode_rx, view_tx));
    let wired = wiring::node(Parts {
        source: Arc::new(Pending::default()),
        checkpoint: CheckpointStore::new(&args.state_dir),
        devices: view_rx.clone(),
        kernel: Rtnl::new(None).with_sysctl_root(&args.sysctl_dir),
        status: Arc::new(LogStatus),
        address_book: Some((
            Arc::new(FileAddressBook::new(
                args.state_dir.join("addresses"),
                catalog.clone(),
            )),
            node.clone(),
        )),
        pool: node.clone(),
        sysfs_root: discovery.root.clone(),
        fail_closed: None,
        sharing: Some(discovery.sharing.clone()),
    });
    let first = discovery.scan().await;
    let retained = rescan::retained(&wired.claims, &node).await;
    let devices = discovery.devices(&first, &retained);
    drop(first);
    let offered = devices.len();
    devices_tx.send_replace(devices);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let rescans = tokio::spawn(rescan::keep_current(
        discovery,
        node.clone(),
        wired.claims.clone(),
        devices_tx,
        RescanSettings {
            period: std::time::Duration::from_secs(args.rescan_seconds),
            ..Default::default()
        },
        stop_rx,
    ));
    // No kubelet, no runtime hooks, nothing published: none of those facts applies.
    let (_facts_tx, facts) = tokio::sync::watch::channel(NodeFacts::default());
    let door = Arc::new(kni::Door {
        pool: node.clone(),
        catalog,
        offered: view_rx,
        facts,
        claims: wired.claims.clone(),
        preparer: wired.kni_preparer.clone(),
        pending: wired.kni_pending.clone(),
        pods: wired.pods.clone(),
        serial: tokio::sync::Mutex::new(()),
    });
    let service = kni::KniService::new(
        door,
        kni::Settings {
            netns_dir: args.kni_netns_dir.clone(),
            sysfs_root: args.discovery.sysfs_root.clone(),
            node: node.clone(),
        },
    );
    let listener = kni::bind(&args.kni_socket).context("--kni-socket/KNIC_KNI_SOCKET")?;
    tracing::info!(node = %node, socket = %args.kni_socket.display(), devices = offered,
        networks = networks.len(), state = %args.state_dir.display(),
        "knic-driver kni --standalone serving");
    let served = kni::serve(listener, &args.kni_socket, service, shutdown).await;
    let _ = stop_tx.send(true);
    let _ = rescans.await;
    if let Err(e) = wired.claims.flush().await {
        tracing::warn!(error = %e, "could not write the last attach marks; the next start re-checks those devices");
    }
    served?;
    tracing::info!("knic-driver kni stopped");
    Ok(())
}
