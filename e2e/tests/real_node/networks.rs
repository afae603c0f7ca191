//! A Network on the real cluster, end to end: the real `knic-controller` generates the
//! template, the real scheduler allocates from the real driver's slices, the real kubelet and
//! containerd start the pods; a subnet with room for exactly one pod keeps the second pod
//! Pending (the scheduler finds no device, because every device lists the network as
//! exhausted) until the first pod's address is released.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use knic_e2e::cluster::RealCluster;
use knic_e2e::harness::{udp_echo, unpanicked};
use knic_e2e::real_node::{POLL, PodClaim, RealNode, link_in, wait_for};
use knic_proto::network::{
    CONDITION_EXHAUSTED, CONDITION_READY, NETWORK_LABEL, Network, NetworkAddress, exhaustion_token,
};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

/// The subnet: a /30 has two host addresses, and the gateway takes one, so exactly one pod fits.
const CIDR: &str = "10.231.0.0/30";
const GATEWAY: &str = "10.231.0.1";
/// The one address a pod can get.
const ADDRESS: &str = "10.231.0.2/30";

/// The real `knic-controller` binary, killed on drop.
pub struct Controller {
    _child: tokio::process::Child,
    log: PathBuf,
}

impl Controller {
    /// Starts it with the test's kubeconfig, its lease in the test's namespace, no webhook and
    /// no HTTP server (nothing to collide with), collecting orphaned addresses every 5 s.
    pub fn start(bin: &Path, node: &RealNode) -> anyhow::Result<Controller> {
        let log = node.cluster.tmp.path().join("controller.log");
        let file = std::fs::File::create(&log)?;
        let child = tokio::process::Command::new(bin)
            .env_clear()
            .env("KUBECONFIG", &node.real.kubeconfig)
            .env("POD_NAME", format!("knic-e2e-{}", node.cluster.namespace))
            .env("KNIC_LEADER_NAMESPACE", &node.cluster.namespace)
            .env("KNIC_HTTP_ADDRESS", "")
            .env("KNIC_WEBHOOK_ADDRESS", "")
            .env("KNIC_GC_SECONDS", "5")
            .env("KNIC_LOG_FORMAT", "json")
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .context("spawning knic-controller")?;
        Ok(Controller { _child: child, log })
    }

    /// Its log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The twin: see the module comment; every step's time is printed.
pub(crate) async fn network_template_and_exhaustion(
    real: RealCluster,
    controller: PathBuf,
) -> anyhow::Result<()> {
    let mut node = RealNode::start(
        &real,
        "real-network",
        "nw",
        &["10.231.0.1/30", "10.231.0.1/30"],
        &[],
    )
    .await?;
    let outcome = async {
        let controller = Controller::start(&controller, &node)?;
        let network = format!("{}-net", node.cluster.namespace);
        let result = unpanicked(scenario(&mut node, &network)).await;
        let removed = remove_network(&node, &network).await;
        match result {
            Ok(()) => removed,
            Err(e) => anyhow::bail!(
                "{e:#}\n--- network removal: {removed:?}\n--- controller log ---\n{}",
                controller.logs()
            ),
        }
    }
    .await;
    node.finish(outcome).await
}

fn networks(node: &RealNode) -> Api<Network> {
    Api::all(node.cluster.client.clone())
}

/// The Network's allocation objects.
async fn addresses(node: &RealNode, network: &str) -> anyhow::Result<Vec<NetworkAddress>> {
    let api: Api<NetworkAddress> = Api::all(node.cluster.client.clone());
    Ok(api
        .list(&ListParams::default().labels(&format!("{NETWORK_LABEL}={network}")))
        .await?
        .items)
}

/// Waits until the Network's status, for its current generation, satisfies `holds`.
async fn status_where(
    node: &RealNode,
    network: &str,
    what: &str,
    holds: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    wait_for(
        &format!("Network {network}: {what}"),
        Duration::from_secs(60),
        || async {
            let n = networks(node).get(network).await?;
            let status = serde_json::to_value(&n.status)?;
            let current = status["observedGeneration"] == json!(n.metadata.generation);
            ensure!(current && holds(&status), "status is {status}");
            Ok(Some(status))
        },
    )
    .await
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == json!(type_)))
        .unwrap_or(&Value::Null)
}

/// The `exhaustedNetworks` attribute of every device the node publishes.
async fn exhausted_attributes(node: &RealNode) -> anyhow::Result<Vec<Option<String>>> {
    Ok(node
        .cluster
        .slices()
        .await?
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| {
            let d = serde_json::to_value(d).unwrap_or_default();
            d["attributes"]["exhaustedNetworks"]["string"]
                .as_str()
                .map(str::to_owned)
        })
        .collect())
}

/// Checks that pod `pod` runs with the network's one address on `net1` (claim status, the
/// allocation object, the kernel) and that it carries traffic to the gateway.
async fn has_the_address(node: &RealNode, network: &str, pod: &str) -> anyhow::Result<()> {
    let claim = node.claim_of(pod).await?;
    let status = node.configured(&claim).await?;
    let data = &status["devices"][0]["networkData"];
    ensure!(
        data["ips"] == json!([ADDRESS]) && data["interfaceName"] == json!("net1"),
        "claim {claim}: {status}"
    );
    let device = status["devices"][0]["device"]
        .as_str()
        .context("device")?
        .to_owned();
    let netns = node.pod_netns(pod).await?;
    let net1 = link_in(&netns, "net1").context("net1 is not in the pod")?;
    ensure!(net1.contains(&format!("inet {ADDRESS}")), "{net1}");
    let nic = node
        .nics
        .iter()
        .find(|n| n.name == device)
        .with_context(|| format!("claim {claim} got {device}, not one of the test's NICs"))?;
    udp_echo(&netns, &nic.peer, GATEWAY)?;
    let uid = node.claims().get(&claim).await?.metadata.uid;
    let held = addresses(node, network).await?;
    let held: Vec<Value> = held
        .iter()
        .map(|a| json!([a.spec.address, a.spec.claim.name, a.spec.claim.uid]))
        .collect();
    ensure!(
        held == vec![json!([ADDRESS, claim, uid])],
        "allocations of {network}: {held:?}"
    );
    println!("pod {pod}: claim {claim} on {device}, {ADDRESS} on net1, UDP echo via {GATEWAY}");
    Ok(())
}

async fn scenario(node: &mut RealNode, network: &str) -> anyhow::Result<()> {
    let ns = node.cluster.namespace.clone();
    let nics: Vec<String> = node.nics.iter().map(|n| n.name.clone()).collect();
    let class = node.device_class("nics", &[&nics[0], &nics[1]]).await?;
    let spec = serde_json::from_value(json!({
        "devices": {"deviceClassName": class},
        "mtu": 1450,
        "ipam": {"subnets": [{"cidr": CIDR, "gateway": GATEWAY}]},
        "namespaces": {"names": [ns]},
    }))?;
    networks(node)
        .create(&PostParams::default(), &Network::new(network, spec))
        .await?;
    let status = status_where(node, network, "Ready, 1/1 free, one node", |s| {
        condition(s, CONDITION_READY)["status"] == json!("True")
            && s["addressSummary"] == json!("1/1")
            && s["availableNodes"] == json!(1)
    })
    .await?;
    let exhausted = condition(&status, CONDITION_EXHAUSTED);
    ensure!(
        (
            exhausted["status"].clone(),
            exhausted["reason"].clone(),
            exhausted["message"].clone()
        ) == (
            json!("False"),
            json!("AddressesFree"),
            json!("1 of 1 addresses free")
        ),
        "{status}"
    );
    ensure!(
        status["templates"] == json!([{"namespace": ns, "name": network}]),
        "{status}"
    );
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(node.cluster.client.clone(), &ns);
    ensure!(
        templates.get_opt(network).await?.is_some(),
        "no template in {ns}"
    );

    // Pod A takes the only address.
    node.create_pod("a", &PodClaim::Template(network.into()))
        .await?;
    node.running("a", Duration::from_secs(180)).await?;
    has_the_address(node, network, "a").await?;
    live_update(node, network, "a").await?;
    let full = status_where(node, network, "Exhausted, 0/1 free, no node", |s| {
        condition(s, CONDITION_EXHAUSTED)["status"] == json!("True")
            && s["addressSummary"] == json!("0/1")
            && s["availableNodes"] == json!(0)
    })
    .await?;
    let exhausted = condition(&full, CONDITION_EXHAUSTED);
    ensure!(
        exhausted["reason"] == json!("NoFreeAddress")
            && exhausted["message"]
                == json!(format!(
                    "all 1 allocatable IPv4 addresses of {CIDR} are in use; new pods of this \
                     network stay Pending (unschedulable) until an address is released or a \
                     subnet is added, running pods keep theirs"
                )),
        "{full}"
    );
    let token = format!(",{},", exhaustion_token(network));
    wait_for(
        "every device lists the network as exhausted",
        Duration::from_secs(30),
        || async {
            let attributes = exhausted_attributes(node).await?;
            Ok((attributes.len() == 2
                && attributes
                    .iter()
                    .all(|a| a.as_deref().is_some_and(|a| a.contains(&token))))
            .then_some(()))
        },
    )
    .await?;
    node.mark("exhaustion published on both devices");

    // Pod B: a device is free, but the scheduler finds none its claim accepts.
    node.create_pod("b", &PodClaim::Template(network.into()))
        .await?;
    let pods = node.pods();
    let scheduled = wait_for(
        "pod b reported unschedulable",
        Duration::from_secs(60),
        || async {
            let p = pods.get("b").await?;
            let condition = p
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False");
            Ok(condition)
        },
    )
    .await?;
    let message = scheduled.message.clone().unwrap_or_default();
    println!(
        "pod b: PodScheduled=False {:?}: {message}",
        scheduled.reason
    );
    ensure!(
        scheduled.reason.as_deref() == Some("Unschedulable")
            && message.contains("cannot allocate all claims"),
        "{scheduled:?}"
    );
    let b_claim = node.claim_of("b").await?;
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(10) {
        let p = pods.get("b").await?;
        let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
        let bound = p.spec.and_then(|s| s.node_name);
        let allocated = node.claim_status(&b_claim).await?["allocation"].clone();
        ensure!(
            phase == "Pending" && bound.is_none() && allocated.is_null(),
            "pod b left Pending while the network is full: phase {phase}, node {bound:?}, \
             allocation {allocated}"
        );
        tokio::time::sleep(POLL).await;
    }
    node.mark("pod b stayed Pending, unbound and unallocated, for 10 s");

    // Pod A goes: its address is released, the attribute cleared, and pod B gets the address.
    let released = Instant::now();
    node.delete_pod("a", Duration::from_secs(120)).await?;
    node.running("b", Duration::from_secs(180)).await?;
    println!(
        "pod b Running {:.1}s after pod a's deletion began",
        released.elapsed().as_secs_f64()
    );
    has_the_address(node, network, "b").await?;
    status_where(node, network, "Exhausted again with pod b", |s| {
        condition(s, CONDITION_EXHAUSTED)["status"] == json!("True")
            && s["addressSummary"] == json!("0/1")
    })
    .await?;
    // The controller said so in Events on both transitions (cluster-scoped objects' Events
    // live in `default`).
    let events: Api<Event> = Api::namespaced(node.cluster.client.clone(), "default");
    let reasons: Vec<(String, String)> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(network))
        .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default()))
        .collect();
    for want in [("Warning", "NoFreeAddress"), ("Normal", "AddressesFree")] {
        ensure!(
            reasons
                .iter()
                .any(|(t, r)| (t.as_str(), r.as_str()) == want),
            "no {want:?} Event for {network}: {reasons:?}"
        );
    }
    // Pod B goes too: the address is free, and no device lists the network any more.
    node.delete_pod("b", Duration::from_secs(120)).await?;
    let left = addresses(node, network).await?;
    ensure!(left.is_empty(), "allocations left: {left:?}");
    status_where(node, network, "free again, one node", |s| {
        condition(s, CONDITION_EXHAUSTED)["status"] == json!("False")
            && s["addressSummary"] == json!("1/1")
            && s["availableNodes"] == json!(1)
    })
    .await?;
    wait_for(
        "no device lists the network as exhausted",
        Duration::from_secs(30),
        || async {
            let attributes = exhausted_attributes(node).await?;
            Ok((attributes.len() == 2 && attributes.iter().all(Option::is_none)).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// `ip route` of `dev` inside the namespace at `netns`.
fn routes_in(netns: &Path, dev: &str) -> anyhow::Result<String> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["ip", "route", "show", "dev", dev])
        .output()?;
    ensure!(out.status.success(), "ip route: {out:?}");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Issue 26 part 4 on the real cluster: the Network's MTU and a subnet route change while pod
/// `pod` runs; the real driver applies them in the pod's namespace (read back with `ip`), the
/// claim status carries `NetworkUpdated` with the summary, and the pod a Normal Event saying it.
async fn live_update(node: &RealNode, network: &str, pod: &str) -> anyhow::Result<()> {
    let netns = node.pod_netns(pod).await?;
    let mtu_of = || {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args(["ip", "-o", "link", "show", "dev", "net1"])
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    ensure!(mtu_of().contains("mtu 1450"), "before: {}", mtu_of());
    let patched = networks(node)
        .patch(
            network,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"mtu": 1400, "ipam": {"subnets": [
                {"cidr": CIDR, "gateway": GATEWAY, "routes": [{"destination": "203.0.113.0/24"}]}
            ]}}})),
        )
        .await?;
    let generation = patched.metadata.generation.unwrap_or_default();
    let started = Instant::now();
    wait_for(
        "the pod's net1 has MTU 1400 and the new route",
        Duration::from_secs(30),
        || async {
            let routes = routes_in(&netns, "net1")?;
            Ok((mtu_of().contains("mtu 1400")
                && routes.contains(&format!("203.0.113.0/24 via {GATEWAY}")))
            .then_some(()))
        },
    )
    .await?;
    let in_kernel = started.elapsed();
    let claim = node.claim_of(pod).await?;
    let want = format!(
        "MTU 1450→1400, routes +203.0.113.0/24 (Network {network} generation {generation})"
    );
    let updated = wait_for(
        "the claim's NetworkUpdated condition",
        Duration::from_secs(30),
        || async {
            let status = node.claim_status(&claim).await?;
            let conditions = status["devices"][0]["conditions"].clone();
            Ok(conditions.as_array().and_then(|c| {
                c.iter()
                    .find(|c| c["type"] == json!("NetworkUpdated"))
                    .cloned()
            }))
        },
    )
    .await?;
    ensure!(
        updated["status"] == json!("True")
            && updated["reason"] == json!("Applied")
            && updated["message"] == json!(want),
        "{updated}"
    );
    let status = node.claim_status(&claim).await?;
    ensure!(
        condition(&status["devices"][0], "Ready")["status"] == json!("True"),
        "Ready kept: {status}"
    );
    let events: Api<Event> = Api::namespaced(node.cluster.client.clone(), &node.cluster.namespace);
    let event = wait_for(
        "a Normal NetworkUpdated Event on the pod",
        Duration::from_secs(30),
        || async {
            Ok(events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("NetworkUpdated")
                        && e.involved_object.name.as_deref() == Some(pod)
                }))
        },
    )
    .await?;
    ensure!(
        event.type_.as_deref() == Some("Normal") && event.message.as_deref() == Some(want.as_str()),
        "{event:?}"
    );
    println!(
        "live update: pod {pod} had MTU 1400 and 203.0.113.0/24 {:.1}s after the patch; \
         claim condition NetworkUpdated=True {want:?}",
        in_kernel.as_secs_f64()
    );
    Ok(())
}

/// Deletes the Network while the controller still runs to remove its finalizer (and with it
/// the template), then any allocation object left.
async fn remove_network(node: &RealNode, network: &str) -> anyhow::Result<()> {
    for pod in ["a", "b"] {
        node.delete_pod(pod, Duration::from_secs(120)).await?;
    }
    match networks(node)
        .delete(network, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    wait_for(
        &format!("Network {network} deleted"),
        Duration::from_secs(60),
        || async {
            Ok(networks(node)
                .get_opt(network)
                .await?
                .is_none()
                .then_some(()))
        },
    )
    .await?;
    let api: Api<NetworkAddress> = Api::all(node.cluster.client.clone());
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(&format!("{NETWORK_LABEL}={network}")),
    )
    .await?;
    Ok(())
}
