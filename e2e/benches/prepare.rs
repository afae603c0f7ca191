//! Prepare benchmark: NodePrepareResources latency as the kubelet sees it, through the real
//! `knic-driver` binary's gRPC socket, with the claims read from the fake API server (the same
//! set-up as the `kubelet` e2e suite: a synthetic SR-IOV tree, no kernel changes, a stand-in
//! NRI runtime so the driver accepts prepares).
//!
//! Each prepare reads the claim from the API, plans the devices, writes the CDI spec and
//! records the claim in the checkpoint with one fsync'd write (group-committed: concurrent
//! prepares share writes). Two loads, interleaved per round so drift in machine load hits
//! both alike:
//!
//! - `1 claim`: one NodePrepareResources for one claim at a time;
//! - `16 concurrent`: 16 NodePrepareResources calls at once, one claim each (a node starting
//!   many pods); every call's own latency is a sample.
//!
//! Each claim is unprepared after its round (timed too, not part of the goal). Goal: p99 of
//! `1 claim` prepare <= 5 ms.
//!
//! Needs the driver binary: `KNIC_DRIVER_BIN`, or `knic-driver` next to this bench's target
//! directory (`cargo build --release -p knic-driver` for `cargo bench`); skips with the reason
//! otherwise.
//!
//! Run: `cargo bench -p knic-e2e --bench prepare` (`KNIC_BENCH_CYCLES=N` measured rounds,
//! default 200). Without cargo bench's `--bench` argument (as `cargo test --all-targets` runs
//! it) it does a smoke run of 3 rounds after 1 warm-up: every answer checked, no verdict.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use knic_e2e::bench::{Plan, met, ms, row, stats};
use knic_e2e::cluster::{Cluster, TestClaim};
use knic_e2e::driver::{DriverConfig, DriverProcess, vf_device};
use knic_e2e::kubelet::{self, ClaimId, DraVersion, Plugin};

const DEFAULT_ROUNDS: usize = 200;
const WARMUP: usize = 5;
const CONCURRENT: usize = 16;
const P99_TARGET: Duration = Duration::from_millis(5);

fn main() -> anyhow::Result<()> {
    let run = Plan::from_env(DEFAULT_ROUNDS, WARMUP)?;
    if let Err(e) = knic_e2e::driver::binary() {
        println!("skipped: prepare benchmark needs the driver binary: {e:#}");
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(run))
}

struct Env {
    cluster: Cluster,
    driver: DriverProcess,
    plugin: Arc<Plugin>,
    claims: Vec<TestClaim>,
}

impl Env {
    fn id(&self, claim: &TestClaim) -> ClaimId {
        ClaimId {
            namespace: self.cluster.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        }
    }
}

/// Prepares `claim` and checks the answer names its device; returns the call's latency.
async fn prepare(plugin: &Plugin, id: ClaimId, device: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let out = plugin
        .prepare(DraVersion::V1, std::slice::from_ref(&id))
        .await?;
    let elapsed = started.elapsed();
    let got = out.get(&id.uid).context("no answer for the claim")?;
    ensure!(got.error.is_empty(), "prepare {}: {}", id.name, got.error);
    ensure!(
        got.devices.len() == 1 && got.devices[0].device == device,
        "prepare {}: {:?}",
        id.name,
        got.devices
    );
    Ok(elapsed)
}

async fn unprepare(plugin: &Plugin, id: ClaimId) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let out = plugin
        .unprepare(DraVersion::V1, std::slice::from_ref(&id))
        .await?;
    let elapsed = started.elapsed();
    let error = out.get(&id.uid).context("no answer for the claim")?;
    ensure!(error.is_empty(), "unprepare {}: {error}", id.name);
    Ok(elapsed)
}

#[derive(Default)]
struct Figures {
    prepare: Vec<Duration>,
    unprepare: Vec<Duration>,
}

/// One claim prepared, then unprepared.
async fn one(env: &Env, into: &mut Figures) -> anyhow::Result<()> {
    let id = env.id(&env.claims[0]);
    into.prepare
        .push(prepare(&env.plugin, id.clone(), &vf_device(0)).await?);
    into.unprepare.push(unprepare(&env.plugin, id).await?);
    Ok(())
}

/// `CONCURRENT` claims prepared at once, then unprepared at once.
async fn many(env: &Env, into: &mut Figures) -> anyhow::Result<()> {
    let calls = env.claims.iter().enumerate().map(|(i, c)| {
        let (plugin, id) = (env.plugin.clone(), env.id(c));
        tokio::spawn(async move { prepare(&plugin, id, &vf_device(i)).await })
    });
    for task in calls.collect::<Vec<_>>() {
        into.prepare.push(task.await??);
    }
    let calls = env.claims.iter().map(|c| {
        let (plugin, id) = (env.plugin.clone(), env.id(c));
        tokio::spawn(async move { unprepare(&plugin, id).await })
    });
    for task in calls.collect::<Vec<_>>() {
        into.unprepare.push(task.await??);
    }
    Ok(())
}

async fn start() -> anyhow::Result<Env> {
    let cluster = Cluster::fake("bench-prepare").await?;
    let config = DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig);
    let driver = DriverProcess::start(&config)?;
    let plugin = match kubelet::register(&config.registry_dir).await {
        Ok(p) => Arc::new(p),
        Err(e) => bail!("{e:#}\ndriver log:\n{}", driver.logs()),
    };
    let mut claims = Vec::new();
    for i in 0..CONCURRENT {
        let device = vf_device(i);
        claims.push(
            cluster
                .create_claim(&format!("bench-{i:02}"), Some(&[("knic.dev", &device)]))
                .await?,
        );
    }
    let env = Env {
        cluster,
        driver,
        plugin,
        claims,
    };
    // The driver refuses prepares until the (stand-in) runtime has accepted its NRI plugin.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let id = env.id(&env.claims[0]);
        match prepare(&env.plugin, id.clone(), &vf_device(0)).await {
            Ok(_) => {
                unprepare(&env.plugin, id).await?;
                return Ok(env);
            }
            Err(e) if Instant::now() > deadline => {
                bail!("the driver never prepared: {e:#}\n{}", env.driver.logs())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn bench(run: Plan) -> anyhow::Result<()> {
    println!(
        "prepare benchmark: NodePrepareResources through the real driver's gRPC socket, claims \
         from the fake API server; 1 claim at a time, and {CONCURRENT} calls at once"
    );
    println!(
        "machine: {}; {} measured rounds after {} warm-up; checkpoint on the machine's disk \
         (fsync'd)",
        knic_e2e::bench::machine(),
        run.cycles,
        run.warmup
    );
    let env = start().await?;
    let outcome = async {
        let (mut single, mut concurrent) = (Figures::default(), Figures::default());
        for _ in 0..run.warmup {
            one(&env, &mut Figures::default()).await?;
            many(&env, &mut Figures::default()).await?;
        }
        for _ in 0..run.cycles {
            one(&env, &mut single).await?;
            many(&env, &mut concurrent).await?;
        }
        anyhow::Ok((single, concurrent))
    }
    .await;
    let cleanup = env.cluster.cleanup().await;
    let (single, concurrent) = match outcome {
        Ok(f) => f,
        Err(e) => bail!("{e:#}\n--- driver log ---\n{}", env.driver.logs()),
    };
    cleanup?;
    println!();
    println!(
        "{:<13} {:<7} {:>12} {:>12} {:>12}",
        "load", "call", "p50", "p99", "mean"
    );
    for (load, f) in [("1 claim", &single), ("16 at once", &concurrent)] {
        println!("{}", row(load, "prepare", &f.prepare));
        println!("{}", row(load, "unprepare", &f.unprepare));
    }
    if run.smoke {
        println!(
            "smoke run (no --bench argument, e.g. cargo test): every answer checked; figures \
             not meaningful, no verdict; run cargo bench for the measurement"
        );
        return Ok(());
    }
    let (_, p99) = stats(&single.prepare);
    let (_, p99_many) = stats(&concurrent.prepare);
    println!(
        "goal NodePrepareResources p99 <= {} (1 claim at a time): {} (p99 {}; {CONCURRENT} at \
         once: p99 {})",
        ms(P99_TARGET),
        met(p99 <= P99_TARGET),
        ms(p99),
        ms(p99_many)
    );
    Ok(())
}
