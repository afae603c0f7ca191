//! `knic-controller`: reconciles Networks into ResourceClaimTemplates and status, and collects
//! allocations whose claim is gone. Every flag has an environment twin so the chart can set it
//! without rewriting the command line. SIGTERM (the kubelet's stop) and SIGINT stop it cleanly:
//! running reconciles finish while the lease is still renewed, then the lease is released so the
//! other replica takes over at once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use knic_controller::leader::Elector;
use knic_controller::reconcile::{self, Config};
use knic_proto::logging::{self, LogFormat};
use knic_proto::metrics::Health;

/// How long the leader lease lasts without renewal (client-go's default).
const LEASE_DURATION: Duration = Duration::from_secs(15);
/// The readiness condition `/readyz` names while it does not hold.
const READY_LEASE: &str = "leader lease held or healthy standby";
/// `/healthz` fails when the runtime has not run the heartbeat task for this long.
const HEALTH_STALL: Duration = Duration::from_secs(30);
/// How long tasks still running at exit (watches, the webhook's caches) get to stop.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);
/// How long a stopping replica tries to release the lease before leaving it to expire.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Parser)]
#[command(
    version,
    about = "knic cluster controller: Networks, claim templates, IPAM collection"
)]
struct Args {
    /// Kubeconfig to use; in-cluster configuration when unset.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Seconds one API request may go unanswered before it is abandoned (and repeated when
    /// that is safe); a watch's stream is exempt.
    #[arg(long, env = "KNIC_API_TIMEOUT_SECONDS", default_value_t = 15,
        value_parser = clap::value_parser!(u64).range(1..=600))]
    api_timeout_seconds: u64,
    /// Log line format: text (one readable line per event; human is the same) or json (one
    /// object per line: timestamp, level, target, message and the event's fields). On stderr.
    #[arg(long, env = "KNIC_LOG_FORMAT", value_parser = LogFormat::parse, default_value = "text")]
    log_format: LogFormat,
    /// Log filter (tracing `EnvFilter` syntax, e.g. `info,knic_controller=debug`).
    #[arg(long, env = "KNIC_LOG_LEVEL", default_value = "info")]
    log_level: String,
    /// Seconds between full resyncs of every Network.
    #[arg(long, env = "KNIC_RESYNC_SECONDS", default_value_t = 300,
        value_parser = clap::value_parser!(u64).range(1..))]
    resync_seconds: u64,
    /// Seconds between sweeps for allocations whose claim is gone.
    #[arg(long, env = "KNIC_GC_SECONDS", default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..))]
    gc_seconds: u64,
    /// Read StatefulSets and KubeVirt VirtualMachines of held stable addresses, so a hold ends
    /// as soon as its identity cannot return (scaled down, deleted), not only at its grace
    /// period.
    #[arg(long, env = "KNIC_IDENTITY_READS", default_value_t = true, action = clap::ArgAction::Set)]
    identity_reads: bool,
    /// Elect a leader through a Lease so several replicas are safe; disable only when exactly
    /// one replica runs.
    #[arg(long, env = "KNIC_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Namespace of the leader Lease (the controller's own).
    #[arg(long, env = "KNIC_LEADER_NAMESPACE", default_value = "kube-system",
        value_parser = dns_label)]
    leader_namespace: String,
    /// This replica's identity in the Lease and in Events [default: host name and a random
    /// suffix, unique per process].
    #[arg(long, env = "POD_NAME", value_parser = replica_identity)]
    identity: Option<String>,
    /// Address of the validating admission webhook (HTTPS, path /validate), served by every
    /// replica; empty disables it, and so does leaving --webhook-cert and --webhook-key unset.
    #[arg(long, env = "KNIC_WEBHOOK_ADDRESS", default_value = "0.0.0.0:9443",
        value_parser = webhook_address)]
    webhook_address: OptionalAddress,
    /// The webhook's PEM certificate chain (mounted from a Secret; reloaded when it changes).
    #[arg(long, env = "KNIC_WEBHOOK_CERT", requires = "webhook_key")]
    webhook_cert: Option<PathBuf>,
    /// The webhook's PEM private key (mounted from a Secret; reloaded when it changes).
    #[arg(long, env = "KNIC_WEBHOOK_KEY", requires = "webhook_cert")]
    webhook_key: Option<PathBuf>,
    /// Seconds between reads of the certificate files for a renewed certificate.
    #[arg(long, env = "KNIC_WEBHOOK_RELOAD_SECONDS", default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=3600))]
    webhook_reload_seconds: u64,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (plain HTTP, `address:port`);
    /// the empty string disables the server.
    #[arg(long, env = "KNIC_HTTP_ADDRESS", default_value = "0.0.0.0:9462",
        value_parser = http_address)]
    http_address: String,
}

/// An address, or none (a newtype: clap reads a bare `Option` as "flag may be absent").
#[derive(Debug, Clone, Copy)]
struct OptionalAddress(Option<SocketAddr>);

/// An address, or empty for "no webhook".
fn webhook_address(value: &str) -> Result<OptionalAddress, String> {
    if value.is_empty() {
        return Ok(OptionalAddress(None));
    }
    value
        .parse()
        .map(|a| OptionalAddress(Some(a)))
        .map_err(|e| {
            format!("{value:?} is not an address:port like 0.0.0.0:9443 (or empty to disable): {e}")
        })
}

/// `--http-address`: an address to listen on, or empty for none (checked when parsed).
fn http_address(value: &str) -> Result<String, String> {
    knic_proto::metrics::listen_address(value)
        .map(|_| value.to_owned())
        .map_err(|e| e.to_string())
}

/// The lease treats an empty holder as "nobody": two replicas both named "" would each take
/// the lease as free and lead at once, so an identity that is (or looks) empty is refused.
fn replica_identity(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        return Err(format!(
            "{value:?} is not a replica identity (it must not be empty or only whitespace: \
             the lease would look free and two replicas would lead)"
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(format!(
            "{value:?} is not a replica identity (it must not contain control characters)"
        ));
    }
    Ok(value.to_owned())
}

/// What a replica calls itself without `--identity`: unique per process, which the pid alone
/// is not (every container's first process is pid 1, so two replicas would share a name and
/// both believe they hold the lease). client-go does the same: host name plus a random part.
fn default_identity() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let suffix = hasher.finish();
    if host.is_empty() {
        format!("knic-controller_{suffix:016x}")
    } else {
        format!("{host}_{suffix:016x}")
    }
}

/// The error and its causes, each once (see `knic_proto::error::chain_text`).
fn error_text(error: &anyhow::Error) -> String {
    knic_proto::error::chain_text(error.as_ref())
}

/// A namespace name is a DNS label; checked at start-up so a typo in the chart fails the pod
/// at once instead of every lease request later.
fn dns_label(value: &str) -> Result<String, String> {
    if knic_proto::netconfig::is_dns_label(value) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a namespace name (a DNS label: at most 63 lowercase letters, \
             digits and '-', starting and ending with a letter or digit)"
        ))
    }
}

/// Not `#[tokio::main]`: the runtime is shut down before the error that stopped the
/// controller is reported, so no background task's log line can follow it: the reason is the
/// last line.
fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(e) = logging::init(args.log_format, &args.log_level) {
        eprintln!("knic-controller: {e}");
        return std::process::ExitCode::from(2);
    }
    let format = args.log_format;
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
        .and_then(|runtime| {
            let result = runtime.block_on(run(args));
            runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
            result
        });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            logging::fatal(format, "knic-controller", &error_text(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    let policy = knic_proto::backoff::RetryPolicy::with_timeout(Duration::from_secs(
        args.api_timeout_seconds,
    ));
    let client = knic_controller::client::connect(config, policy)?;
    let listener =
        knic_controller::http::bind(knic_proto::metrics::listen_address(&args.http_address)?)
            .await
            .with_context(|| {
                format!(
                    "--http-address/KNIC_HTTP_ADDRESS: cannot listen on {:?}",
                    args.http_address
                )
            })?;
    let metrics = knic_controller::metrics::metrics();
    let health = Arc::new(Health::new(&[READY_LEASE], HEALTH_STALL));
    let (http_stop, http_stopped) = tokio::sync::watch::channel(false);
    let serving = listener.map(|l| {
        tokio::spawn(knic_controller::http::serve(
            l,
            &metrics.registry,
            health.clone(),
            http_stopped,
        ))
    });
    let result = lead_or_stand_by(args, client, &health).await;
    let _ = http_stop.send(true);
    if let Some(serving) = serving {
        let _ = serving.await;
    }
    result
}

/// Runs the reconciler, behind the leader lease unless election is off; `health` says whether
/// this replica leads or is a healthy standby.
async fn lead_or_stand_by(args: Args, client: kube::Client, health: &Health) -> anyhow::Result<()> {
    let metrics = knic_controller::metrics::metrics();
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let reconciler = Config {
        resync: Duration::from_secs(args.resync_seconds),
        gc_interval: Duration::from_secs(args.gc_seconds),
        identity_reads: args.identity_reads,
        instance: Some(identity.clone()),
        ..Config::default()
    };
    let stopping = stop_signal()?;
    let _webhook = start_webhook(&args, &client).await?;
    let shutdown = {
        let stopping = stopping.clone();
        async move { stopped(stopping).await }
    };
    if !args.leader_elect {
        tracing::info!("running without leader election");
        health.readiness.set(READY_LEASE, true);
        metrics.leader.set([], 1.0);
        reconcile::run(client, reconciler, shutdown).await;
        return Ok(());
    }
    let elector = Elector::new(
        client.clone(),
        &args.leader_namespace,
        "knic-controller",
        &identity,
        LEASE_DURATION,
    );
    let standby = |healthy: bool| health.readiness.set(READY_LEASE, healthy);
    tokio::select! {
        acquired = elector.acquire_observed(&standby) => acquired?,
        () = shutdown => {
            // An acquire cut short may have written the lease a moment ago; the release only
            // clears a lease this replica holds.
            release(&elector).await;
            return Ok(());
        }
    }
    tracing::info!(%identity, "leader lease acquired");
    health.readiness.set(READY_LEASE, true);
    metrics.leader.set([], 1.0);
    let (stop, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let mut run = tokio::spawn(reconcile::run(client, reconciler, async {
        let _ = stopped_rx.await;
    }));
    let mut hold = std::pin::pin!(elector.hold());
    tokio::select! {
        lost = &mut hold => {
            // Another replica may already reconcile: stop at once rather than finish a round.
            anyhow::bail!("{lost}");
        }
        ended = &mut run => {
            anyhow::bail!(
                "the reconciler stopped on its own ({ended:?}); exiting so the pod restarts"
            );
        }
        () = stopped(stopping) => {}
    }
    tracing::info!("stopping: letting running reconciles finish, then releasing the lease");
    let _ = stop.send(());
    // Keep renewing while in-flight reconciles finish, so no other replica starts meanwhile.
    tokio::select! {
        lost = &mut hold => anyhow::bail!("{lost}"),
        _ = &mut run => {}
    }
    release(&elector).await;
    Ok(())
}

/// Starts the admission webhook (with its own caches) when it has an address and a
/// certificate. It serves on every replica, leader or not, until the process exits: not just
/// until the stop signal, because the apiserver keeps calling a stopping pod until its
/// endpoint is removed, and the lease release that follows the signal gives it that time.
async fn start_webhook(
    args: &Args,
    client: &kube::Client,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    use knic_controller::webhook;
    let (Some(address), Some(cert), Some(key)) = (
        args.webhook_address.0,
        &args.webhook_cert,
        &args.webhook_key,
    ) else {
        tracing::info!(
            "admission webhook disabled (no address, or no --webhook-cert/--webhook-key)"
        );
        return Ok(None);
    };
    let (caches, fill) = webhook::Caches::start(client.clone());
    tokio::spawn(fill);
    let settings = webhook::Settings {
        address,
        cert: cert.clone(),
        key: key.clone(),
        reload_interval: Duration::from_secs(args.webhook_reload_seconds),
    };
    let served = webhook::start(settings, Arc::new(caches), std::future::pending())
        .await
        .context("starting the admission webhook")?;
    Ok(Some(served))
}

/// Gives the lease up on a clean stop so the other replica takes over at its next attempt
/// rather than after a whole lease duration; bounded, because a pod being stopped must not
/// hang on an unreachable apiserver (the lease then simply expires).
async fn release(elector: &Elector) {
    match tokio::time::timeout(RELEASE_TIMEOUT, elector.release()).await {
        Ok(Ok(true)) => tracing::info!("leader lease released"),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "releasing the leader lease; it will expire"),
        Err(_) => tracing::warn!("releasing the leader lease timed out; it will expire"),
    }
}

/// Flips to `true` on SIGTERM (what the kubelet sends a pod being stopped) or SIGINT (Ctrl-C).
/// A watch channel rather than one future, because the stop is awaited at several points
/// (while waiting for the lease, while leading, or by the reconciler itself without election).
fn stop_signal() -> anyhow::Result<tokio::sync::watch::Receiver<bool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "stop requested");
        let _ = tx.send(true);
    });
    Ok(rx)
}

/// Completes once a stop was requested.
async fn stopped(mut stopping: tokio::sync::watch::Receiver<bool>) {
    // An error means the sender is gone, which only happens after it sent `true`.
    let _ = stopping.wait_for(|stop| *stop).await;
}
