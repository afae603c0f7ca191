//! Fail-closed on the real runtime: the driver frozen with SIGSTOP (a process that keeps its
//! sockets and answers nothing) at the two moments that matter, with a real pod on the way.
//!
//! * Between prepare and the sandbox's NRI hook: the runtime cannot reach knic when the
//!   sandbox starts, so knic never hears of it; the CDI `createRuntime` hook
//!   (`knic-driver check-interface`) must keep the app container from starting without `net1`.
//!   Once knic runs again it reconnects, the runtime's Synchronize lists the sandbox, knic
//!   attaches, and the kubelet's next try starts the container.
//! * Before prepare: the kubelet's NodePrepareResources goes unanswered; the pod must wait (no
//!   sandbox, no container) and come up once knic answers.
//!
//! And knic running without the runtime's NRI socket: it refuses prepare (the other guard), the
//! kubelet retries, and the pod comes up once the socket is back.
//!
//! Meanwhile every process of the app container (found by its command line) is checked to be in
//! a namespace where `net1` is up with its address, and the container states the kubelet
//! reports are followed; what the kubelet and containerd did is printed.

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use knic_e2e::cluster::RealCluster;
use knic_e2e::harness::{udp_echo, unpanicked};
use knic_e2e::real_node::{POLL, PodClaim, RealNode, link_in, processes_with, wait_for};
use serde_json::json;

use super::gate::SandboxGate;

const PEER: &str = "10.233.0.1/24";
const GATEWAY: &str = "10.233.0.1";
/// The first three octets every pod address here starts with.
const SUBNET: &str = "10.233.0.";
/// Claim `nic`'s address.
const ADDRESS: &str = "10.233.0.10/24";
/// How long knic stays frozen while the pod is watched.
const FROZEN: Duration = Duration::from_secs(25);

/// What was seen of the pod while knic could not attach.
#[derive(Debug, Default)]
struct Watched {
    /// Distinct `("waiting|terminated <reason>", message)` of the app container's state, in
    /// order seen.
    states: Vec<(String, String)>,
    /// Events of the test's namespace, as [`RealNode::events`] words them, in order seen.
    events: Vec<String>,
    /// Checks made.
    checks: usize,
}

/// Follows pod `pod` for `how_long` while knic cannot attach (frozen, or without the runtime):
/// fails at once if a frozen driver runs again, if the API reports the app container running,
/// or if any process of the app container runs in a namespace without `net1` up with one of
/// the test's addresses. Stops early once `enough` holds for what was seen.
async fn watch_pod(
    node: &mut RealNode,
    pod: &str,
    how_long: Duration,
    enough: impl Fn(&Watched) -> bool,
) -> anyhow::Result<Watched> {
    let started = Instant::now();
    let marker = node.marker(pod);
    let mut seen = Watched::default();
    while started.elapsed() < how_long {
        if node.frozen() {
            ensure!(node.driver_stopped()?, "the frozen driver runs");
        }
        for (pid, netns) in processes_with(&marker) {
            let net1 = link_in(&netns, "net1").unwrap_or_default();
            ensure!(
                net1.contains(&format!("inet {SUBNET}")) && net1.contains("UP"),
                "process {pid} of pod {pod}'s app container runs without its interface \
                 (net1 in its namespace: {net1:?})"
            );
        }
        // The phase says little here: with restartPolicy Always a pod whose only container
        // failed to start is reported Running ("restarting"). The containers' states do not lie.
        let p = node.pods().get(pod).await?;
        for c in p
            .status
            .unwrap_or_default()
            .container_statuses
            .iter()
            .flatten()
        {
            let state = c.state.clone().unwrap_or_default();
            ensure!(
                state.running.is_none(),
                "container {} of pod {pod} is running while knic cannot attach",
                c.name
            );
            let waiting = state.waiting.map(|w| (w.reason, w.message));
            let terminated = state.terminated.map(|t| (t.reason, t.message));
            for (kind, (reason, message)) in [("waiting", waiting), ("terminated", terminated)]
                .into_iter()
                .filter_map(|(k, s)| Some((k, s?)))
            {
                let entry = (
                    format!("{kind} {}", reason.unwrap_or_default()),
                    message.unwrap_or_default(),
                );
                if !seen.states.contains(&entry) {
                    println!(
                        "[{:>5.1}s] container {}: {}: {}",
                        started.elapsed().as_secs_f64(),
                        c.name,
                        entry.0,
                        entry.1
                    );
                    seen.states.push(entry);
                }
            }
        }
        for e in node.events().await? {
            if !seen.events.contains(&e) {
                println!("[{:>5.1}s] event {e}", started.elapsed().as_secs_f64());
                seen.events.push(e);
            }
        }
        seen.checks += 1;
        if enough(&seen) {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    println!(
        "watched {:.1}s: {} checks, no container ran without net1",
        started.elapsed().as_secs_f64(),
        seen.checks
    );
    Ok(seen)
}

/// After knic is back: pod `pod` runs, `net1` has `address` in its namespace (and in the app
/// container's), claim `claim` reports it, and it carries traffic to the peer of the device
/// the claim got.
async fn comes_up(
    node: &mut RealNode,
    pod: &str,
    (claim, address): (&str, &str),
    (since, what): (Instant, &str),
) -> anyhow::Result<()> {
    node.running(pod, Duration::from_secs(180)).await?;
    println!(
        "pod {pod} Running {:.1}s after {what}",
        since.elapsed().as_secs_f64()
    );
    let status = node.configured(claim).await?;
    ensure!(
        status["devices"][0]["networkData"]["ips"] == json!([address]),
        "{status}"
    );
    let device = status["devices"][0]["device"].as_str().unwrap_or_default();
    let nic = node
        .nics
        .iter()
        .find(|n| n.name == device)
        .with_context(|| format!("claim {claim} got {device:?}"))?;
    let netns = node.pod_netns(pod).await?;
    let net1 = link_in(&netns, "net1").context("net1 is not in the pod")?;
    ensure!(net1.contains(&format!("inet {address}")), "{net1}");
    let app = processes_with(&node.marker(pod));
    ensure!(!app.is_empty(), "no process of the app container found");
    for (pid, ns) in app {
        let net1 = link_in(&ns, "net1").unwrap_or_default();
        ensure!(net1.contains(address), "app process {pid} sees {net1:?}");
    }
    udp_echo(&netns, &nic.peer, GATEWAY)?;
    for e in node.events().await? {
        println!("event {e}");
    }
    Ok(())
}

/// A node with one NIC per entry of `claims`, a class selecting them all, and one claim
/// `(name, address)` each.
async fn setup(
    real: &RealCluster,
    test: &str,
    tag: &str,
    env: &[(&str, &str)],
    claims: &[(&str, &str)],
) -> anyhow::Result<RealNode> {
    let peers = vec![PEER; claims.len()];
    let mut node = RealNode::start(real, test, tag, &peers, env).await?;
    let outcome = async {
        let nics: Vec<String> = node.nics.iter().map(|n| n.name.clone()).collect();
        let nics: Vec<&str> = nics.iter().map(String::as_str).collect();
        let class = node.device_class("nic", &nics).await?;
        for (claim, address) in claims {
            node.claim(claim, &class, json!({"addresses": [address]}))
                .await?;
        }
        anyhow::Ok(())
    }
    .await;
    match outcome {
        Ok(()) => Ok(node),
        Err(e) => match node.finish(Err(e)).await {
            Err(e) => Err(e),
            Ok(()) => bail!("setting up the claim failed"),
        },
    }
}

/// Frozen between prepare and the sandbox's NRI hook.
pub(crate) async fn frozen_at_sandbox_start(real: RealCluster) -> anyhow::Result<()> {
    let mut node = setup(
        &real,
        "real-frozen-at-sandbox",
        "fs",
        &[],
        &[("nic", ADDRESS)],
    )
    .await?;
    let outcome = unpanicked(at_sandbox_start(&mut node)).await;
    node.finish(outcome).await
}

async fn at_sandbox_start(node: &mut RealNode) -> anyhow::Result<()> {
    let mut gate = SandboxGate::register(&node.real.nri_socket, &node.cluster.namespace).await?;
    node.create_pod("app", &PodClaim::Claim("nic".into()))
        .await?;
    let sandbox = gate.reached(Duration::from_secs(120)).await?;
    node.freeze().await?;
    gate.open();
    node.mark(&format!(
        "sandbox {} of pod {} held before knic's hook (netns {:?}); knic frozen, gate opened",
        sandbox.id, sandbox.name, sandbox.netns
    ));
    // The kubelet prepared before it asked for the sandbox.
    let prepared = node.checkpoint()?;
    ensure!(
        prepared.values().any(|c| c["name"] == json!("nic")),
        "the claim is not prepared: {prepared:?}"
    );
    let seen = watch_pod(node, "app", FROZEN, |_| false).await?;
    // containerd gave up on knic's hook after its 2 s timeout, closed the plugin and started
    // the sandbox anyway; the CDI hook then refused the app container, which the kubelet
    // reports with knic's message as a Warning event (and the container's state).
    let refusal = format!(
        "claim {}/nic: interface net1 is not configured: it is not in the pod's network \
         namespace; the container must not start without it",
        node.cluster.namespace
    );
    let refused = seen.events.iter().any(|e| {
        e.contains("Pod/app Failed: Error: failed to create containerd task")
            && e.contains("error running hook #0")
            && e.contains(&refusal)
    });
    ensure!(
        refused,
        "the CDI hook never refused the app container while knic was frozen; events: {:#?}",
        seen.events
    );
    node.thaw()?;
    node.mark("knic continued (SIGCONT)");
    comes_up(node, "app", ("nic", ADDRESS), (Instant::now(), "SIGCONT")).await
}

/// Frozen before the kubelet's prepare.
pub(crate) async fn frozen_before_prepare(real: RealCluster) -> anyhow::Result<()> {
    let mut node = setup(
        &real,
        "real-frozen-before-prepare",
        "fp",
        &[],
        &[("nic", ADDRESS)],
    )
    .await?;
    let outcome = unpanicked(before_prepare(&mut node)).await;
    node.finish(outcome).await
}

async fn before_prepare(node: &mut RealNode) -> anyhow::Result<()> {
    node.freeze().await?;
    node.mark("knic frozen (SIGSTOP) before the pod exists");
    node.create_pod("app", &PodClaim::Claim("nic".into()))
        .await?;
    // Held until the kubelet gave up on one prepare call, so its timeout and its event show.
    let failed_prepare = |w: &Watched| {
        w.events
            .iter()
            .any(|e| e.contains("FailedPrepareDynamicResources"))
    };
    let seen = watch_pod(node, "app", Duration::from_secs(150), failed_prepare).await?;
    ensure!(
        failed_prepare(&seen),
        "the kubelet reported no failed prepare within 150 s of knic being frozen"
    );
    node.mark("the kubelet's prepare failed while knic was frozen");
    let prepared = node.checkpoint()?;
    ensure!(
        prepared.is_empty(),
        "a frozen driver prepared something: {prepared:?}"
    );
    node.thaw()?;
    node.mark("knic continued (SIGCONT)");
    comes_up(node, "app", ("nic", ADDRESS), (Instant::now(), "SIGCONT")).await
}

/// The runtime's NRI socket gone while knic runs (a runtime restarting, or NRI not up yet).
/// Pod `late`: knic waits [`knic_driver::claims::RUNTIME_HOOKS_WAIT`] for the runtime, then
/// refuses prepare; the kubelet reports knic's refusal and no sandbox is made. Pod `quick`,
/// created while knic is still without the runtime: its prepare waits, the socket comes back
/// meanwhile, and the pod runs at once, without a refusal. Pod `late` runs once the kubelet
/// retries (at its next sync of the pod, a minute or more later: the cost the wait avoids).
pub(crate) async fn prepare_refused_without_nri(real: RealCluster) -> anyhow::Result<()> {
    // knic is given a path where no runtime listens; linking it to the runtime's socket later
    // is the runtime coming back, with the same driver process reconnecting by itself.
    let dir = tempfile::Builder::new().prefix("knic-e2e-nri-").tempdir()?;
    let socket = dir.path().join("nri.sock");
    let path = socket.to_string_lossy().into_owned();
    let mut node = setup(
        &real,
        "real-prepare-without-nri",
        "fn",
        &[("KNIC_NRI_SOCKET", &path)],
        &[("late", ADDRESS), ("quick", "10.233.0.11/24")],
    )
    .await?;
    let outcome = unpanicked(without_nri(&mut node, &socket)).await;
    node.finish(outcome).await
}

async fn without_nri(node: &mut RealNode, socket: &std::path::Path) -> anyhow::Result<()> {
    node.create_pod("late", &PodClaim::Claim("late".into()))
        .await?;
    let refusal = format!(
        "knic is not connected to the container runtime's NRI socket {}: a pod started now \
         would run without its interfaces, so prepare is refused until it reconnects (the \
         kubelet retries)",
        socket.display()
    );
    let refused = |w: &Watched| {
        w.events.iter().any(|e| {
            e.starts_with("Pod/late FailedPrepareDynamicResources:") && e.contains(&refusal)
        })
    };
    let seen = watch_pod(node, "late", Duration::from_secs(120), refused).await?;
    ensure!(
        refused(&seen),
        "the kubelet never reported knic's refusal; events: {:#?}",
        seen.events
    );
    let pod = node.pods().get("late").await?;
    let ip = pod.status.and_then(|s| s.pod_ip);
    ensure!(
        ip.is_none(),
        "a sandbox was made for a refused claim (pod IP {ip:?})"
    );
    let prepared = node.checkpoint()?;
    ensure!(prepared.is_empty(), "prepared without NRI: {prepared:?}");

    node.create_pod("quick", &PodClaim::Claim("quick".into()))
        .await?;
    wait_for(
        "knic's prepare of claim quick waits for the runtime",
        Duration::from_secs(60),
        || async {
            Ok(node
                .logs()
                .lines()
                .any(|l| {
                    l.contains("prepare waits for knic's registration with the runtime's NRI")
                        && l.contains("\"claim\":\"quick\"")
                })
                .then_some(()))
        },
    )
    .await?;
    let from = node.logs().len();
    let back = Instant::now();
    std::os::unix::fs::symlink(&node.real.nri_socket, socket)?;
    node.mark("the runtime's NRI socket is back");
    node.nri_registered(from).await?;
    node.running("quick", Duration::from_secs(30)).await?;
    println!(
        "pod quick Running {:.1}s after the socket came back, its prepare having waited",
        back.elapsed().as_secs_f64()
    );
    let events = node.events().await?;
    ensure!(
        !events
            .iter()
            .any(|e| e.starts_with("Pod/quick FailedPrepareDynamicResources")),
        "pod quick's prepare was refused: {events:#?}"
    );
    let came_back = (back, "the socket came back");
    comes_up(node, "quick", ("quick", "10.233.0.11/24"), came_back).await?;
    comes_up(node, "late", ("late", ADDRESS), came_back).await
}
