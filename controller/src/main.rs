//! `knic-controller`: reconciles Networks into ResourceClaimTemplates and status, and collects
//! allocations whose claim is gone. Every flag has an environment twin so the chart can set it
//! without rewriting the command line.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use knic_controller::leader::Elector;
use knic_controller::reconcile::{self, Config};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Parser)]
#[command(
    version,
    about = "knic cluster controller: Networks, claim templates, IPAM collection"
)]
struct Args {
    /// Kubeconfig to use; in-cluster configuration when unset.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Log line format.
    #[arg(long, env = "KNIC_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Log filter (tracing `EnvFilter` syntax, e.g. `info,knic_controller=debug`).
    #[arg(long, env = "KNIC_LOG_LEVEL", default_value = "info")]
    log_level: String,
    /// Seconds between full resyncs of every Network.
    #[arg(long, env = "KNIC_RESYNC_SECONDS", default_value_t = 300)]
    resync_seconds: u64,
    /// Seconds between sweeps for allocations whose claim is gone.
    #[arg(long, env = "KNIC_GC_SECONDS", default_value_t = 60)]
    gc_seconds: u64,
    /// Elect a leader through a Lease so several replicas are safe; disable only when exactly
    /// one replica runs.
    #[arg(long, env = "KNIC_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Namespace of the leader Lease (the controller's own).
    #[arg(long, env = "KNIC_LEADER_NAMESPACE", default_value = "kube-system")]
    leader_namespace: String,
    /// This replica's identity in the Lease and in Events.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .with_context(|| format!("--log-level {:?}", args.log_level))?;
    match args.log_format {
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init(),
    }
    let config = match &args.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    let client = kube::Client::try_from(config)?;
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("knic-controller-{}", std::process::id()));
    let reconciler = Config {
        resync: Duration::from_secs(args.resync_seconds.max(1)),
        gc_interval: Duration::from_secs(args.gc_seconds.max(1)),
        instance: Some(identity.clone()),
        ..Config::default()
    };
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if !args.leader_elect {
        tracing::info!("running without leader election");
        reconcile::run(client, reconciler, shutdown).await;
        return Ok(());
    }
    let elector = Elector::new(
        client.clone(),
        &args.leader_namespace,
        "knic-controller",
        &identity,
        Duration::from_secs(15),
    );
    tokio::select! {
        acquired = elector.acquire() => acquired?,
        () = shutdown => return Ok(()),
    }
    tracing::info!(%identity, "leader lease acquired");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(reconcile::run(client, reconciler, async {
        let _ = stopped.await;
    }));
    tokio::select! {
        lost = elector.hold() => {
            // Another replica may already reconcile: stop at once rather than finish a round.
            anyhow::bail!("{lost}");
        }
        () = async { let _ = tokio::signal::ctrl_c().await; } => {
            let _ = stop.send(());
            let _ = run.await;
        }
    }
    Ok(())
}
