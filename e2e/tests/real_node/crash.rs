//! `kill -9` of the driver with real pods: the driver aborts at a failpoint
//! (`KNIC_FAILPOINT`, as abrupt as `kill -9`) inside the real runtime's `RunPodSandbox` or
//! `StopPodSandbox` hook, is restarted without it, and the node must converge: the pod Running
//! with its interface after the kubelet's and the runtime's own retries, or, mid-detach, the
//! device home with its original name, MTU, MAC, state and addresses and nothing left in any
//! namespace; the checkpoint consistent with that; the IPAM allocation held exactly while the
//! claim is prepared, never leaked.
//!
//! No controller runs: an allocation left behind would not be collected, so a leak shows.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use knic_e2e::cluster::RealCluster;
use knic_e2e::harness::{host_link, ip, udp_echo, unpanicked};
use knic_e2e::real_node::{
    PodClaim, RealNode, link_in, links_in, namespaces_holding, processes_with, wait_for,
};
use knic_proto::network::{NETWORK_LABEL, Network, NetworkAddress};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

const GATEWAY: &str = "10.234.0.1";
/// A second address on the host end, which a detach must give back.
const HOST_ADDRESS: &str = "10.234.9.9/32";

/// The host end as it must come back: link state and global addresses.
fn host_state(nic: &str) -> anyhow::Result<(String, String)> {
    Ok((
        host_link(nic)?,
        ip(&["-o", "addr", "show", "dev", nic, "scope", "global"])?
            .split_whitespace()
            .filter(|w| w.contains('/'))
            .collect::<Vec<_>>()
            .join(" "),
    ))
}

struct Crash {
    node: RealNode,
    network: String,
    /// The host end's state before the first pod.
    before: (String, String),
    mac: String,
}

impl Crash {
    async fn allocations(&self) -> anyhow::Result<Vec<NetworkAddress>> {
        let api: Api<NetworkAddress> = Api::all(self.node.cluster.client.clone());
        Ok(api
            .list(&ListParams::default().labels(&format!("{NETWORK_LABEL}={}", self.network)))
            .await?
            .items)
    }

    /// Pod `pod` runs with its interface: one allocation naming its claim, the address on an
    /// up `net1` of MTU 1400 in its namespace (and nothing else knic added there), the claim
    /// status saying so, traffic through it, and the checkpoint recording the device in that
    /// namespace.
    async fn attached(&self, pod: &str) -> anyhow::Result<()> {
        let node = &self.node;
        let status = node.configured("nic").await?;
        let uid = node.claims().get("nic").await?.metadata.uid;
        let held = self.allocations().await?;
        ensure!(held.len() == 1, "allocations: {held:?}");
        let address = held[0].spec.address.clone();
        ensure!(
            held[0].spec.claim.name == "nic" && Some(&held[0].spec.claim.uid) == uid.as_ref(),
            "{held:?}"
        );
        ensure!(
            status["devices"][0]["networkData"]["ips"] == json!([address]),
            "{status}"
        );
        let netns = node.pod_netns(pod).await?;
        let net1 = link_in(&netns, "net1").context("net1 is not in the pod")?;
        ensure!(
            net1.contains(&format!("inet {address}")),
            "net1 in the pod: {net1}"
        );
        let links = links_in(&netns)?;
        let names: Vec<&str> = links
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(|n| n.trim().split('@').next().unwrap_or_default())
            .collect();
        ensure!(
            names == ["lo", "eth0", "net1"],
            "links in the pod: {names:?}"
        );
        ensure!(
            links.contains("net1") && links.contains("mtu 1400") && links.contains(",UP"),
            "{links}"
        );
        for (pid, ns) in processes_with(&node.marker(pod)) {
            ensure!(
                link_in(&ns, "net1").is_some_and(|l| l.contains(&address)),
                "app process {pid} has no net1"
            );
        }
        udp_echo(&netns, &node.nics[0].peer, GATEWAY)?;
        let checkpoint = node.checkpoint()?;
        let entry = checkpoint
            .values()
            .find(|c| c["name"] == json!("nic"))
            .context("the claim is not in the checkpoint")?;
        let attachment = &entry["attachments"][0];
        let recorded = attachment["netns"].as_str().unwrap_or_default();
        ensure!(
            attachment["restore"].is_object()
                && std::path::Path::new(recorded).file_name() == netns.file_name(),
            "checkpoint: {entry}"
        );
        println!("pod {pod}: {address} on net1 (mtu 1400), checkpoint records it in {recorded}");
        Ok(())
    }

    /// Nothing of the claim is left: the device home exactly as before, in no namespace, no
    /// allocation, no checkpoint entry, no CDI spec.
    async fn released(&self, claim_uid: &str) -> anyhow::Result<()> {
        let nic = &self.node.nics[0].name;
        wait_for(
            "the device home as it was",
            Duration::from_secs(10),
            || async { Ok((host_state(nic)? == self.before).then_some(())) },
        )
        .await
        .with_context(|| format!("before {:?}, now {:?}", self.before, host_state(nic)))?;
        let holding = namespaces_holding(&self.mac)?;
        ensure!(holding.is_empty(), "{} is still in {holding:?}", self.mac);
        let held = self.allocations().await?;
        ensure!(held.is_empty(), "allocations leaked: {held:?}");
        let left = self.node.checkpoint()?;
        ensure!(left.is_empty(), "left in the checkpoint: {left:?}");
        let spec = format!("/var/run/cdi/knic.dev-{claim_uid}.json");
        ensure!(
            !std::path::Path::new(&spec).exists(),
            "{spec} left after unprepare"
        );
        Ok(())
    }

    async fn claim_uid(&self) -> anyhow::Result<String> {
        self.node
            .claims()
            .get("nic")
            .await?
            .metadata
            .uid
            .context("claim without uid")
    }
}

async fn setup(real: &RealCluster, test: &str, tag: &str) -> anyhow::Result<Crash> {
    let mut node = RealNode::start(real, test, tag, &["10.234.0.1/24"], &[]).await?;
    let network = format!("{}-net", node.cluster.namespace);
    let prepared = async {
        let nic = node.nics[0].name.clone();
        ip(&["addr", "add", HOST_ADDRESS, "dev", &nic])?;
        ip(&["link", "set", &nic, "mtu", "1480", "up"])?;
        let class = node.device_class("nic", &[&nic]).await?;
        let spec = serde_json::from_value(json!({
            "devices": {"deviceClassName": class},
            "ipam": {"subnets": [{"cidr": "10.234.0.0/24", "gateway": GATEWAY}]},
            "namespaces": {"names": [node.cluster.namespace]},
        }))?;
        Api::<Network>::all(node.cluster.client.clone())
            .create(&PostParams::default(), &Network::new(&network, spec))
            .await?;
        node.claim(
            "nic",
            &class,
            json!({"ipam": {"network": network}, "interface": {"mtu": 1400}}),
        )
        .await?;
        let before = host_state(&nic)?;
        let mac = before
            .0
            .split_whitespace()
            .skip_while(|w| *w != "mac")
            .nth(1)
            .context("no MAC")?
            .to_owned();
        anyhow::Ok((before, mac))
    }
    .await;
    match prepared {
        Ok((before, mac)) => Ok(Crash {
            node,
            network,
            before,
            mac,
        }),
        Err(e) => {
            let removed = remove_network(&node, &network).await;
            match node.finish(Err(e)).await {
                Err(e) => Err(e.context(format!("network removal: {removed:?}"))),
                Ok(()) => anyhow::bail!("setting up the network failed"),
            }
        }
    }
}

async fn remove_network(node: &RealNode, network: &str) -> anyhow::Result<()> {
    let networks: Api<Network> = Api::all(node.cluster.client.clone());
    match networks.delete(network, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    let api: Api<NetworkAddress> = Api::all(node.cluster.client.clone());
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(&format!("{NETWORK_LABEL}={network}")),
    )
    .await?;
    Ok(())
}

/// Runs `scenario` on a fresh node and always cleans up: pods (through a running driver),
/// then the Network and its allocations, then the node.
async fn run(
    real: RealCluster,
    test: &str,
    tag: &str,
    scenario: impl AsyncFnOnce(&mut Crash) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut crash = setup(&real, test, tag).await?;
    let outcome = unpanicked(scenario(&mut crash)).await;
    let Crash {
        mut node, network, ..
    } = crash;
    // Pods first, so the kubelet unprepares (and releases the address) through the driver.
    let pods = node.delete_pods().await;
    let removed = remove_network(&node, &network).await;
    let outcome = outcome.and(pods).and(removed);
    node.finish(outcome).await
}

/// Mid-attach: the driver aborts at `failpoint` inside the runtime's RunPodSandbox hook.
pub(crate) async fn mid_attach(real: RealCluster, failpoint: &'static str) -> anyhow::Result<()> {
    let tag = if failpoint == "attach:after-move" {
        "km"
    } else {
        "kc"
    };
    let test = format!("real-kill-{}", failpoint.replace(':', "-"));
    run(real, &test, tag, async |c: &mut Crash| {
        c.node.restart_driver(Some(failpoint)).await?;
        c.node
            .create_pod("app", &PodClaim::Claim("nic".into()))
            .await?;
        c.node.driver_exited(Duration::from_secs(120)).await?;
        // Down: containerd closed the plugin ("ttrpc: closed") and started the sandbox without
        // knic; the CDI hook must keep the app container out, with knic's reason for the state
        // the device was left in.
        let why = match failpoint {
            "attach:after-move" => "it is in the pod but down",
            _ => "it is not in the pod's network namespace",
        };
        let refusal = format!(
            "claim {}/nic: interface net1 is not configured: {why}",
            c.node.cluster.namespace
        );
        let marker = c.node.marker("app");
        let refused = wait_for(
            "the CDI hook refused the app container while knic is down",
            Duration::from_secs(60),
            || async {
                for (pid, ns) in processes_with(&marker) {
                    let net1 = link_in(&ns, "net1").unwrap_or_default();
                    ensure!(
                        net1.contains("inet 10.234.0.") && net1.contains("UP"),
                        "app process {pid} runs without its interface while knic is down: \
                         {net1:?}"
                    );
                }
                let running = c.node.running_containers("app").await?;
                ensure!(
                    running.is_empty(),
                    "containers {running:?} run while knic is down"
                );
                let events = c.node.events().await?;
                Ok(events
                    .iter()
                    .any(|e| e.contains(&refusal))
                    .then_some(events))
            },
        )
        .await?;
        for e in refused {
            println!("while down: event {e}");
        }
        // The checkpoint holds what recovery needs: the device's host state, recorded before
        // the first change, the sandbox's namespace, and the allocation the API holds.
        let checkpoint = c.node.checkpoint()?;
        let entry = checkpoint
            .values()
            .find(|e| e["name"] == json!("nic"))
            .context("the claim is not in the checkpoint")?;
        let attachment = &entry["attachments"][0];
        let host = &attachment["restore"]["host"];
        let held = c.allocations().await?;
        ensure!(
            host["name"] == json!(c.node.nics[0].name)
                && host["mtu"] == json!(1480)
                && host["up"] == json!(true)
                && host["addresses"] == json!([HOST_ADDRESS])
                && attachment["netns"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("/var/run/netns/cni-"))
                && held.len() == 1
                && entry["allocations"][0]["name"] == json!(held[0].metadata.name)
                && entry["allocations"][0]["address"] == json!(held[0].spec.address),
            "checkpoint while down: {entry}\nallocations: {held:?}"
        );
        c.node.restart_driver(None).await?;
        let restarted = Instant::now();
        c.node.running("app", Duration::from_secs(180)).await?;
        println!(
            "pod Running {:.1}s after the restart",
            restarted.elapsed().as_secs_f64()
        );
        c.attached("app").await?;
        for e in c.node.events().await? {
            println!("event {e}");
        }
        let uid = c.claim_uid().await?;
        c.node.delete_pod("app", Duration::from_secs(120)).await?;
        c.released(&uid).await
    })
    .await
}

/// Mid-detach: the driver aborts after moving the device out of the pod, inside the runtime's
/// StopPodSandbox hook, before restoring its host state.
pub(crate) async fn mid_detach(real: RealCluster) -> anyhow::Result<()> {
    run(
        real,
        "real-kill-detach-after-move",
        "kd",
        async |c: &mut Crash| {
            c.node
                .create_pod("app", &PodClaim::Claim("nic".into()))
                .await?;
            c.node.running("app", Duration::from_secs(180)).await?;
            c.attached("app").await?;
            let uid = c.claim_uid().await?;
            c.node.restart_driver(Some("detach:after-move")).await?;
            c.node
                .pods()
                .delete("app", &DeleteParams::default())
                .await?;
            c.node.mark("pod app deleted");
            c.node.driver_exited(Duration::from_secs(120)).await?;
            let nic = c.node.nics[0].name.clone();
            println!("host end after the abort: {:?}", host_state(&nic));
            // The kubelet cannot unprepare while knic is down: the pod waits for it.
            tokio::time::sleep(Duration::from_secs(5)).await;
            ensure!(
                c.node.pods().get_opt("app").await?.is_some(),
                "the pod went before its claim was unprepared"
            );
            ensure!(
                c.allocations().await?.len() == 1,
                "the allocation went before unprepare"
            );
            for e in c.node.events().await? {
                println!("while down: event {e}");
            }
            c.node.restart_driver(None).await?;
            wait_for("pod app gone", Duration::from_secs(120), || async {
                Ok(c.node.pods().get_opt("app").await?.is_none().then_some(()))
            })
            .await?;
            c.node.mark("pod app gone after the restart");
            c.released(&uid).await
        },
    )
    .await
}
