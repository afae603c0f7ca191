//! Leader election (`knic_controller::leader::Elector`) against the API: the in-process fake in
//! CI, a real cluster with `KNIC_E2E_KUBECONFIG`. Each scenario uses its own Lease in the
//! test's namespace, a short lease duration, and asserts what the Lease object read back says
//! (holder, transitions, times), not only what the electors return:
//!
//! * the API's Lease semantics the elector relies on: a second create of a name is 409
//!   `AlreadyExists`, an update carrying a stale resourceVersion is 409 `Conflict`;
//! * two candidates on a fresh lease (both may try to create it): exactly one holds it; the
//!   other never gets it while the holder renews; when the holder stops renewing, the other
//!   takes over after the duration (not before, and not much later); the former holder knows
//!   at once it does not lead, and a holder whose lease someone else writes steps down at its
//!   next renewal;
//! * a released lease is taken over at once, and a stale release leaves the new holder alone;
//! * many candidate pairs racing for expired leases: exactly one of each pair wins, and on the
//!   fake the write-write conflict (both updating the same resourceVersion) is seen to happen;
//! * a holder cut off from the apiserver (requests hang) steps down before the other replica
//!   can take over, so there is never a moment with two leaders;
//! * the real `knic-controller` binary (when built): SIGTERM stops a waiting replica without
//!   touching the lease, and makes the leader exit 0 after releasing it, so the other replica
//!   leads within one retry period.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use knic_controller::leader::Elector;
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::harness::{ScenarioEnv, eventually, scenario_trials, trial};
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::{Barrier, watch};
use tower::{Service, ServiceExt};

/// The lease duration of most scenarios: long enough for loaded CI machines to renew in time
/// (every 667 ms), short enough to keep the test quick.
const DURATION: Duration = Duration::from_secs(2);
/// What scheduling and HTTP may add to a deadline the elector itself keeps.
const SLACK: Duration = Duration::from_millis(700);

struct Env {
    cluster: Cluster,
}

impl Env {
    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.cluster.client.clone(), &self.cluster.namespace)
    }

    fn elector(&self, lease: &str, identity: &str, duration: Duration) -> Elector {
        self.elector_on(self.cluster.client.clone(), lease, identity, duration)
    }

    fn elector_on(
        &self,
        client: kube::Client,
        lease: &str,
        identity: &str,
        duration: Duration,
    ) -> Elector {
        Elector::new(client, &self.cluster.namespace, lease, identity, duration)
    }

    async fn lease(&self, name: &str) -> anyhow::Result<LeaseSpec> {
        self.leases()
            .get(name)
            .await
            .with_context(|| format!("reading Lease {name}"))?
            .spec
            .with_context(|| format!("Lease {name} has no spec"))
    }

    /// The requests the fake served for Lease `name` with `method`; `None` on a real cluster.
    fn lease_requests(&self, name: &str, method: &str) -> Option<usize> {
        let path = format!(
            "/apis/coordination.k8s.io/v1/namespaces/{}/leases/{name}",
            self.cluster.namespace
        );
        let fake = self.cluster.fake.as_ref()?;
        Some(
            fake.requests()
                .iter()
                .filter(|r| r.method == method && r.path == path)
                .count(),
        )
    }
}

fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

fn transitions(spec: &LeaseSpec) -> i32 {
    spec.lease_transitions.unwrap_or(0)
}

/// Microseconds since the epoch of a Lease time, to compare with [`now_us`].
fn micros(time: &Option<MicroTime>) -> i64 {
    time.as_ref().map_or(0, |t| t.0.as_microsecond())
}

fn now_us() -> i64 {
    Timestamp::now().as_microsecond()
}

fn ms(us: i64) -> String {
    format!("{:.3} s", us as f64 / 1e6)
}

/// The apiserver behaviour the elector's safety rests on.
async fn api_lease_semantics(env: &mut Env) -> anyhow::Result<()> {
    let api = env.leases();
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("semantics".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("x".into()),
            ..LeaseSpec::default()
        }),
    };
    let created = api.create(&PostParams::default(), &lease).await?;
    match api.create(&PostParams::default(), &lease).await {
        Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => {}
        other => bail!("a second create must be 409 AlreadyExists, got {other:?}"),
    }
    let mut fresh = created.clone();
    fresh
        .spec
        .get_or_insert_with(LeaseSpec::default)
        .holder_identity = Some("y".into());
    let updated = api
        .replace("semantics", &PostParams::default(), &fresh)
        .await?;
    ensure!(
        updated.metadata.resource_version != created.metadata.resource_version,
        "an update that changes the lease gets a new resourceVersion"
    );
    let mut stale = created.clone();
    stale
        .spec
        .get_or_insert_with(LeaseSpec::default)
        .holder_identity = Some("z".into());
    match api
        .replace("semantics", &PostParams::default(), &stale)
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "Conflict" => {}
        other => {
            bail!("an update with a stale resourceVersion must be 409 Conflict, got {other:?}")
        }
    }
    ensure!(holder(&env.lease("semantics").await?) == Some("y"));
    Ok(())
}

/// One holder at a time; renewals keep it; a silent holder is replaced after the duration.
async fn takeover_after_the_duration(env: &mut Env) -> anyhow::Result<()> {
    let name = "takeover";
    let a = Arc::new(env.elector(name, "replica-a", DURATION));
    let b = Arc::new(env.elector(name, "replica-b", DURATION));

    // Both go for a lease that does not exist yet: both create, one gets AlreadyExists.
    let (got_a, got_b) = tokio::join!(a.try_acquire_or_renew(), b.try_acquire_or_renew());
    let (got_a, got_b) = (got_a?, got_b?);
    ensure!(got_a != got_b, "exactly one acquires: a={got_a} b={got_b}");
    let (holder_e, other_e, holder_id, other_id) = if got_a {
        (a, b, "replica-a", "replica-b")
    } else {
        (b, a, "replica-b", "replica-a")
    };
    let first = env.lease(name).await?;
    ensure!(
        holder(&first) == Some(holder_id),
        "holder {:?}",
        first.holder_identity
    );
    ensure!(transitions(&first) == 0 && first.lease_duration_seconds == Some(2));

    // While the holder renews, the other waits in vain for three durations.
    let renewing = tokio::spawn({
        let holder_e = holder_e.clone();
        async move { holder_e.hold().await }
    });
    let waited = tokio::time::timeout(DURATION * 3, other_e.acquire()).await;
    ensure!(
        waited.is_err(),
        "{other_id} acquired a lease that was being renewed"
    );
    ensure!(!renewing.is_finished(), "the holder stopped holding");
    let renewed = env.lease(name).await?;
    ensure!(holder(&renewed) == Some(holder_id));
    ensure!(transitions(&renewed) == 0);
    let advanced = micros(&renewed.renew_time) - micros(&first.renew_time);
    ensure!(
        advanced >= 2 * DURATION.as_micros() as i64,
        "renewTime advanced {} in three durations",
        ms(advanced)
    );

    // The holder goes silent (a crash: no release). Let a renewal in flight land, then the
    // last renewTime is final.
    renewing.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let last = env.lease(name).await?;
    ensure!(holder(&last) == Some(holder_id));
    let last_renew = micros(&last.renew_time);
    tokio::time::timeout(DURATION * 3, other_e.acquire())
        .await
        .context("the silent holder's lease was never taken over")??;
    let took_over = now_us();
    let after = took_over - last_renew;
    ensure!(
        after >= DURATION.as_micros() as i64,
        "taken over {} after the last renewal, before the lease duration",
        ms(after)
    );
    // At worst: seen one retry period after the renewal, expired a duration later, noticed at
    // the next retry.
    let latest = DURATION + DURATION * 2 / 3 + SLACK;
    ensure!(
        after <= latest.as_micros() as i64,
        "taken over only {} after the last renewal",
        ms(after)
    );
    let now = env.lease(name).await?;
    ensure!(
        holder(&now) == Some(other_id),
        "holder {:?}",
        now.holder_identity
    );
    ensure!(
        transitions(&now) == 1,
        "leaseTransitions {:?}",
        now.lease_transitions
    );
    ensure!(micros(&now.acquire_time) - last_renew >= DURATION.as_micros() as i64);

    // The former holder, back: its last renewal is older than its renew deadline, so it
    // knows at once that it does not lead, and the lease is not its to take.
    let started = Instant::now();
    let lost = tokio::time::timeout(SLACK, holder_e.hold())
        .await
        .context("the former holder did not see at once that it no longer leads")?;
    ensure!(
        lost.to_string()
            .contains("not renewed within the renew deadline"),
        "former holder: {lost}"
    );
    ensure!(started.elapsed() <= SLACK);
    ensure!(!holder_e.try_acquire_or_renew().await?);
    ensure!(holder(&env.lease(name).await?) == Some(other_id));

    // Someone else writes the lease while the new holder renews (an admin, a replica with
    // another lease client): the holder sees it at its next renewal and steps down.
    let renewing = tokio::spawn({
        let other_e = other_e.clone();
        async move { other_e.hold().await }
    });
    tokio::time::sleep(DURATION / 2).await;
    let mut lease = env.leases().get(name).await?;
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some("intruder".into());
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    env.leases()
        .replace(name, &PostParams::default(), &lease)
        .await?;
    let written = Instant::now();
    let lost = tokio::time::timeout(DURATION / 3 + SLACK, renewing)
        .await
        .context("the holder kept holding a lease someone else wrote")??;
    ensure!(
        lost.to_string().contains("held by another replica"),
        "holder: {lost}"
    );
    ensure!(written.elapsed() <= DURATION / 3 + SLACK);
    ensure!(holder(&env.lease(name).await?) == Some("intruder"));
    Ok(())
}

/// A released lease goes to the waiting replica at once; releasing what one no longer holds
/// changes nothing.
async fn release_hands_over_at_once(env: &mut Env) -> anyhow::Result<()> {
    let name = "release";
    let a = env.elector(name, "replica-a", DURATION);
    let b = env.elector(name, "replica-b", DURATION);
    ensure!(
        !b.release().await?,
        "nothing to release before the lease exists"
    );
    ensure!(a.try_acquire_or_renew().await?);
    ensure!(!b.try_acquire_or_renew().await?);
    ensure!(!b.release().await?, "b does not hold the lease");
    ensure!(holder(&env.lease(name).await?) == Some("replica-a"));

    ensure!(a.release().await?, "the holder releases");
    let released = env.lease(name).await?;
    ensure!(
        holder(&released).is_none(),
        "holder {:?}",
        released.holder_identity
    );
    ensure!(transitions(&released) == 0 && released.lease_duration_seconds == Some(1));

    let started = Instant::now();
    tokio::time::timeout(DURATION, b.acquire())
        .await
        .context("a released lease was not taken over within its duration")??;
    ensure!(
        started.elapsed() < DURATION / 2,
        "took {:?} to take a released lease",
        started.elapsed()
    );
    let taken = env.lease(name).await?;
    ensure!(holder(&taken) == Some("replica-b"));
    ensure!(
        transitions(&taken) == 1,
        "leaseTransitions {:?}",
        taken.lease_transitions
    );

    let version = env.leases().get(name).await?.metadata.resource_version;
    ensure!(
        !a.release().await?,
        "a release after the takeover releases nothing"
    );
    ensure!(env.leases().get(name).await?.metadata.resource_version == version);
    ensure!(holder(&env.lease(name).await?) == Some("replica-b"));
    Ok(())
}

/// Pairs of candidates race for leases whose holder died; each race has exactly one winner.
async fn race_for_expired_leases(env: &mut Env) -> anyhow::Result<()> {
    const ROUNDS: usize = 3;
    const PAIRS: usize = 32;
    // The shortest duration a Lease can say (whole seconds).
    let duration = Duration::from_secs(1);
    let mut conflicts = Vec::new();
    for round in 0..ROUNDS {
        let mut races = Vec::new();
        for pair in 0..PAIRS {
            let name = format!("race-{round}-{pair}");
            let dead = env.elector(&name, "dead", duration);
            ensure!(
                dead.try_acquire_or_renew().await?,
                "{name}: the first holder"
            );
            let a = env.elector(&name, "replica-a", duration);
            let b = env.elector(&name, "replica-b", duration);
            // Each candidate starts its own clock on the dead holder's record.
            ensure!(!a.try_acquire_or_renew().await? && !b.try_acquire_or_renew().await?);
            races.push((name, Arc::new(a), Arc::new(b)));
        }
        tokio::time::sleep(duration + Duration::from_millis(100)).await;
        let puts_before: Vec<Option<usize>> = races
            .iter()
            .map(|(name, _, _)| env.lease_requests(name, "PUT"))
            .collect();
        // Each pair on its own tasks, released together, so the two reads usually both come
        // before either update.
        let mut outcomes = Vec::new();
        for (_, a, b) in &races {
            let start = Arc::new(Barrier::new(2));
            let contender = |elector: &Arc<Elector>| {
                let (elector, start) = (elector.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    elector.try_acquire_or_renew().await
                })
            };
            outcomes.push((contender(a), contender(b)));
        }
        let mut results = Vec::new();
        for (ta, tb) in outcomes {
            results.push((ta.await?, tb.await?));
        }
        for (((name, _, _), (ra, rb)), before) in races.iter().zip(results).zip(puts_before) {
            let (ra, rb) = (ra?, rb?);
            ensure!(ra != rb, "{name}: exactly one wins, got a={ra} b={rb}");
            let winner = if ra { "replica-a" } else { "replica-b" };
            let lease = env.lease(name).await?;
            ensure!(
                holder(&lease) == Some(winner),
                "{name}: holder {:?}",
                lease.holder_identity
            );
            ensure!(
                transitions(&lease) == 1,
                "{name}: leaseTransitions {:?}",
                lease.lease_transitions
            );
            if let (Some(before), Some(after)) = (before, env.lease_requests(name, "PUT")) {
                // Two updates and one winner: the second carried a stale resourceVersion.
                conflicts.push(after - before == 2);
            }
        }
    }
    if env.cluster.fake.is_some() {
        let seen = conflicts.iter().filter(|c| **c).count();
        eprintln!(
            "leader race: {seen} of {} races had both candidates update (one conflict each)",
            conflicts.len()
        );
        ensure!(
            seen > 0,
            "no race had both candidates update the same resourceVersion, so the conflict path \
             was never exercised"
        );
    }
    Ok(())
}

/// A client whose requests wait while the gate is closed: an apiserver that stops answering.
#[derive(Clone)]
struct Gate<S> {
    inner: Arc<tokio::sync::Mutex<S>>,
    open: watch::Receiver<bool>,
}

impl<S, R> Service<R> for Gate<S>
where
    S: Service<R> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        let inner = self.inner.clone();
        let mut open = self.open.clone();
        Box::pin(async move {
            let _ = open.wait_for(|open| *open).await;
            let call = {
                let mut service = inner.lock().await;
                service.ready().await?.call(request)
            };
            call.await
        })
    }
}

async fn gated_client(env: &Env) -> anyhow::Result<(kube::Client, watch::Sender<bool>)> {
    let file = kube::config::Kubeconfig::read_from(&env.cluster.kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default()).await?;
    let (gate, open) = watch::channel(true);
    let layer = tower::layer::layer_fn(move |inner| Gate {
        inner: Arc::new(tokio::sync::Mutex::new(inner)),
        open: open.clone(),
    });
    let client = kube::client::ClientBuilder::try_from(config)?
        .with_layer(&layer)
        .build();
    Ok((client, gate))
}

/// The holder loses the apiserver (its requests hang): it gives up at its renew deadline,
/// before the other replica can take the lease over.
async fn cut_off_holder_steps_down_first(env: &mut Env) -> anyhow::Result<()> {
    let name = "cut-off";
    let (client, gate) = gated_client(env).await?;
    let a = Arc::new(env.elector_on(client, name, "replica-a", DURATION));
    let b = Arc::new(env.elector(name, "replica-b", DURATION));
    ensure!(a.try_acquire_or_renew().await?);
    let holding = tokio::spawn({
        let a = a.clone();
        async move {
            let lost = a.hold().await;
            (lost, Instant::now())
        }
    });
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            let acquired = b.acquire().await;
            (acquired, Instant::now())
        }
    });
    // Renewing normally for a while.
    tokio::time::sleep(DURATION).await;
    ensure!(!holding.is_finished() && !waiting.is_finished());
    ensure!(holder(&env.lease(name).await?) == Some("replica-a"));

    let cut = Instant::now();
    gate.send_replace(false);
    let (lost, lost_at) = tokio::time::timeout(DURATION * 2, holding)
        .await
        .context("the cut-off holder never stepped down")??;
    ensure!(
        lost.to_string()
            .contains("not renewed within the renew deadline"),
        "holder: {lost}"
    );
    // Its last renewal started at most a renew period before the cut.
    ensure!(
        lost_at.duration_since(cut) <= DURATION * 2 / 3 + SLACK,
        "stepped down {:?} after the cut",
        lost_at.duration_since(cut)
    );
    let (acquired, acquired_at) = tokio::time::timeout(DURATION * 3, waiting)
        .await
        .context("the lease of the cut-off holder was never taken over")??;
    acquired?;
    ensure!(
        lost_at < acquired_at,
        "the other replica took over {:?} before the holder stepped down",
        lost_at.duration_since(acquired_at)
    );
    let now = env.lease(name).await?;
    ensure!(holder(&now) == Some("replica-b"));
    ensure!(transitions(&now) == 1);
    gate.send_replace(true);
    Ok(())
}

/// A `knic-controller` process as a Deployment replica runs it; killed when dropped.
struct Replica {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Replica {
    fn start(bin: &Path, cluster: &Cluster, identity: &str) -> anyhow::Result<Replica> {
        let log = cluster.tmp.path().join(format!("{identity}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = tokio::process::Command::new(bin)
            .env_clear()
            .env("KUBECONFIG", &cluster.kubeconfig)
            // Replicas would fight over the default port (tests/metrics.rs scrapes it).
            .env("KNIC_HTTP_ADDRESS", "")
            .env("POD_NAME", identity)
            .env("KNIC_LEADER_NAMESPACE", &cluster.namespace)
            .env("KNIC_LOG_LEVEL", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .context("spawning knic-controller")?;
        Ok(Replica { child, log })
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, as the kubelet sends; the exit status, which must come within `within`.
    async fn terminate(&mut self, within: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let pid = self.child.id().context("already exited")?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        tokio::time::timeout(within, self.child.wait())
            .await
            .with_context(|| format!("no exit {within:?} after SIGTERM; log:\n{}", self.logs()))?
            .map_err(Into::into)
    }
}

/// The real binary, twice, as the Deployment's two replicas: SIGTERM stops a waiting replica
/// at once without touching the lease, and makes the leader exit cleanly and release the lease,
/// so the other replica leads within one retry period (5 s) instead of the lease duration
/// (15 s) plus that.
async fn sigterm_releases_the_lease(bin: PathBuf) -> anyhow::Result<()> {
    const NAME: &str = "knic-controller";
    let cluster = Cluster::fake("leader-sigterm").await?;
    let env = Env { cluster };
    let mut a = Replica::start(&bin, &env.cluster, "replica-a")?;
    eventually("replica-a leads", Duration::from_secs(10), || async {
        let lease = env.leases().get_opt(NAME).await?;
        Ok(lease
            .and_then(|l| l.spec)
            .filter(|s| holder(s) == Some("replica-a"))
            .map(|_| ()))
    })
    .await
    .with_context(|| a.logs())?;

    // A replica still waiting for the lease stops at once and leaves it alone.
    let mut b = Replica::start(&bin, &env.cluster, "replica-b")?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = b.terminate(Duration::from_secs(3)).await?;
    ensure!(
        status.success(),
        "waiting replica exited with {status}:\n{}",
        b.logs()
    );
    ensure!(holder(&env.lease(NAME).await?) == Some("replica-a"));

    let mut b = Replica::start(&bin, &env.cluster, "replica-b")?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = a.terminate(Duration::from_secs(10)).await?;
    let exited = Instant::now();
    ensure!(
        status.success(),
        "leader exited with {status}:\n{}",
        a.logs()
    );
    ensure!(
        a.logs().contains("leader lease released"),
        "the leader did not release:\n{}",
        a.logs()
    );
    let lease = env.lease(NAME).await?;
    ensure!(
        holder(&lease).is_none() || holder(&lease) == Some("replica-b"),
        "after the leader's exit the lease says {:?}",
        lease.holder_identity
    );
    eventually("replica-b leads", Duration::from_secs(7), || async {
        let spec = env.lease(NAME).await?;
        Ok((holder(&spec) == Some("replica-b")).then_some(spec))
    })
    .await
    .with_context(|| b.logs())?;
    ensure!(
        exited.elapsed() < Duration::from_secs(7),
        "replica-b took {:?} to lead after the release",
        exited.elapsed()
    );
    ensure!(transitions(&env.lease(NAME).await?) == 1);

    let status = b.terminate(Duration::from_secs(10)).await?;
    ensure!(
        status.success(),
        "leader exited with {status}:\n{}",
        b.logs()
    );
    ensure!(holder(&env.lease(NAME).await?).is_none());
    env.cluster.cleanup().await
}

impl ScenarioEnv for Env {
    async fn setup(real: Option<RealCluster>, test: String) -> anyhow::Result<Env> {
        let cluster = match &real {
            Some(r) => Cluster::real(r, &test).await?,
            None => Cluster::fake(&test).await?,
        };
        Ok(Env { cluster })
    }

    async fn finish(self, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
        let cleanup = self.cluster.cleanup().await;
        outcome.and(cleanup)
    }
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let mut trials = scenario_trials::<Env>(&knic_e2e::scenarios![
        api_lease_semantics,
        takeover_after_the_duration,
        release_hands_over_at_once,
        race_for_expired_leases,
        cut_off_holder_steps_down_first,
    ]);
    let binary = knic_e2e::harness::controller_binary();
    if let Err(reason) = &binary {
        eprintln!("skipped: process/sigterm_releases_the_lease: {reason}");
    }
    trials.push(trial(
        "process/sigterm_releases_the_lease".into(),
        binary.is_err(),
        move || sigterm_releases_the_lease(binary.unwrap_or_default()),
    ));
    libtest_mimic::run(&args, trials).exit();
}
