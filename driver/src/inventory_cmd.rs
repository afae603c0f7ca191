//! `knic-driver inventory`: what this node (or a built-in sample tree) would publish, as a
//! table or as the ResourceSlice objects a first publish would create; no cluster needed.

use anyhow::bail;
use clap::ValueEnum;
use knic_driver::inventory::table::render_table;
use knic_driver::slices::{self, PoolOwner};

use super::DiscoveryArgs;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    /// A readable table.
    Table,
    /// The ResourceSlice objects, as JSON (a v1 List).
    Json,
    /// The ResourceSlice objects, as YAML documents.
    Yaml,
}

/// Sysfs trees built into the binary, so the inventory can be shown on any machine.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Sample {
    /// Intel E810 PF with 2 SR-IOV VFs (ice/iavf).
    E810Vfs,
    /// Two Mellanox ConnectX-5 PFs with VFs and RoCE (mlx5).
    Cx5Rdma,
    /// An active-backup bond over two X710 ports.
    Bond,
    /// A virtio-net VM NIC.
    Virtio,
}

impl Sample {
    fn text(self) -> &'static str {
        match self {
            Sample::E810Vfs => {
                include_str!("../tests/fixtures/sysfs/intel-e810-pf-with-vfs.derived.txt")
            }
            Sample::Cx5Rdma => {
                include_str!("../tests/fixtures/sysfs/mellanox-cx5-pf-vfs-rdma.derived.txt")
            }
            Sample::Bond => include_str!("../tests/fixtures/sysfs/bond-active-backup.derived.txt"),
            Sample::Virtio => include_str!("../tests/fixtures/sysfs/virtio-net.real.txt"),
        }
    }
}

/// `knic-driver inventory`'s flags.
#[derive(Debug, clap::Args)]
pub(crate) struct InventoryArgs {
    /// Discover a built-in sample tree instead of this host (sets --sysfs-root, no netlink).
    #[arg(long, env = "KNIC_SAMPLE", value_enum, conflicts_with = "sysfs_root")]
    sample: Option<Sample>,
    /// Node name used for the pool [default: this host's name].
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Output format.
    #[arg(short, long, env = "KNIC_OUTPUT", value_enum, default_value = "table")]
    output: Output,
    #[command(flatten)]
    discovery: DiscoveryArgs,
}

pub(crate) async fn run(args: InventoryArgs) -> anyhow::Result<()> {
    let node = args.node_name.unwrap_or_else(super::hostname);
    if let Err(reason) = knic_driver::check_dns_subdomain(&node) {
        bail!("invalid --node-name/NODE_NAME: {reason}");
    }
    let sample_dir = match args.sample {
        Some(sample) => {
            let dir = tempfile::Builder::new().prefix("knic-sample-").tempdir()?;
            knic_driver::inventory::fixture::materialise(sample.text(), dir.path())?;
            Some(dir)
        }
        None => None,
    };
    let mut discovery = args.discovery.discovery()?;
    if let Some(dir) = &sample_dir {
        discovery.root = dir.path().to_path_buf();
        discovery.netlink = false;
    }
    if !discovery.root.join("sys/class/net").is_dir() {
        bail!(
            "invalid --sysfs-root/KNIC_SYSFS_ROOT {}: there is no sys/class/net below it",
            discovery.root.display()
        );
    }
    let inventory = discovery.scan().await;
    if let Output::Table = args.output {
        return emit(&render_table(&inventory, &node));
    }
    // Exactly what a first publish would create; offline the Node's UID is unknown, so the
    // owner reference is left out rather than printed with an empty UID.
    let owner = PoolOwner {
        node_name: node.clone(),
        node_uid: String::new(),
    };
    let devices = discovery.devices(&inventory, &[]);
    drop(inventory);
    let plan = slices::plan_owned(
        knic_proto::DRIVER_NAME,
        &owner,
        &[],
        slices::layout_owned(devices, slices::Mode::Partitionable),
        &[],
    );
    let items: Vec<serde_json::Value> = plan
        .creates
        .into_iter()
        .map(|mut s| {
            s.metadata.owner_references = None;
            let mut v = serde_json::to_value(&s)?;
            v["apiVersion"] = "resource.k8s.io/v1".into();
            v["kind"] = "ResourceSlice".into();
            Ok(v)
        })
        .collect::<Result<_, serde_json::Error>>()?;
    let mut text = String::new();
    match args.output {
        Output::Json => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
            text = serde_json::to_string_pretty(&list)? + "\n";
        }
        Output::Yaml => {
            for item in items {
                text.push_str("---\n");
                text.push_str(&serde_yaml_ng::to_string(&item)?);
            }
        }
        Output::Table => {}
    }
    emit(&text)
}

/// Writes a command's output; a reader that went away (`knic-driver inventory | head`) ends
/// it quietly, as for any Unix filter, instead of the panic `print!` gives on EPIPE.
fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
