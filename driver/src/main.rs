//! `knic-driver`: the per-node DaemonSet binary.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use knic_driver::checkpoint::CheckpointStore;
use knic_driver::claims::{KubeClaims, Preparer};
use knic_driver::kubelet::{self, DraService, PluginPaths, Registration};
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;

/// knic: network interfaces as Kubernetes DRA devices.
#[derive(Debug, Parser)]
#[command(name = "knic-driver", version, about)]
struct Cli {
    /// Log line format.
    #[arg(
        long,
        env = "KNIC_LOG_FORMAT",
        value_enum,
        default_value = "human",
        global = true
    )]
    log_format: LogFormat,
    /// Log filter, e.g. `info` or `knic_driver=debug,info`.
    #[arg(long, env = "KNIC_LOG_LEVEL", default_value = "info", global = true)]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    /// One readable line per event.
    Human,
    /// One JSON object per line, for log pipelines.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node driver: serve the kubelet's DRA plugin sockets.
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// This node's name (pool name, slice owner); usually from the downward API.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Kubeconfig file; without it the in-cluster service account is used.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
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
}

fn init_logging(format: LogFormat, level: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(level)
        .with_context(|| format!("invalid --log-level/KNIC_LOG_LEVEL {level:?}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}

async fn kube_client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
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
    Ok(kube::Client::try_from(config)?)
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

async fn run(args: RunArgs) -> anyhow::Result<()> {
    if let Err(reason) = knic_driver::check_dns_subdomain(&args.node_name) {
        bail!("invalid --node-name/NODE_NAME: {reason}");
    }
    let defaults = PluginPaths::under_kubelet_root(&args.kubelet_root_dir);
    let paths = PluginPaths {
        registry_dir: args.registry_dir.unwrap_or(defaults.registry_dir),
        plugin_dir: args.plugin_dir.unwrap_or(defaults.plugin_dir),
    };
    let client = kube_client(args.kubeconfig.as_ref()).await?;
    tracing::info!(node = %args.node_name, plugin_dir = %paths.plugin_dir.display(),
        registry_dir = %paths.registry_dir.display(), "knic-driver starting");
    let preparer = Preparer::new(
        knic_proto::DRIVER_NAME,
        KubeClaims::new(client),
        CheckpointStore::new(&paths.plugin_dir),
    );
    let (registration, _) = tokio::sync::watch::channel(Registration::Pending);
    kubelet::serve(
        &paths,
        DraService::new(preparer),
        registration,
        shutdown_signal(),
    )
    .await?;
    tracing::info!("knic-driver stopped");
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(cli.log_format, &cli.log_level) {
        eprintln!("knic-driver: {e:#}");
        return std::process::ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Run(args) => run(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("knic-driver: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
