//! The real-cluster twin of `fake/dra_pod_and_node_readiness`: the real `knic-driver` of the
//! real node (`knic_e2e::real_node::RealNode`: the node's unmodified kubelet and containerd
//! with NRI, a veth pair playing the NIC) with `--node-networks true`, asked through its KNI
//! socket by the client generated from the upstream .proto: a Network ready on the node (the
//! answer and the node's `NodeNetworks` object), a pod given the NIC by DRA seen through
//! QueryPodNetwork (by name and by UID, MAC and address as the pod's kernel shows them), the
//! Network not ready while its only device is in the pod, and ready again once the pod is gone.
//!
//! The test binary runs isolated in private network and mount namespaces (the standalone and
//! fake trials need that); this trial needs the host's (the kubelet's directories, containerd's
//! `/var/run/netns`, the apiserver's address), so it runs on a thread of its own that enters
//! the namespaces the process had before [`knic_e2e::harness::isolate`].

use std::fs::File;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use knic_e2e::cluster::RealCluster;
use knic_e2e::harness::{udp_echo, unpanicked};
use knic_e2e::kni::KniClient;
use knic_e2e::real_node::{POLL, PodClaim, RealNode, links_in, wait_for};
use knic_proto::network::Network;
use knic_proto::network::readiness::NodeNetworks;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use libtest_mimic::{Failed, Trial};
use nix::sched::{CloneFlags, setns, unshare};
use serde_json::{Value, json};

/// The trial's name.
pub(crate) const NAME: &str = "real/dra_pod_through_the_kni_socket";

/// The peer end's address (the NIC's far side) and the pod's static address on `net1`.
const PEER: &str = "10.236.0.1/24";
const PEER_IP: &str = "10.236.0.1";
const ADDRESS: &str = "10.236.0.2/24";
/// The pod and its claim.
const POD: &str = "app";
const CLAIM: &str = "nic";

/// How long a change the driver watches (its readiness facts, the devices, the prepared claims,
/// any Network) may take to reach the NodeNetworks object: the driver writes within a second
/// of it. Below the driver's 30 s rewrite period on purpose: a Network created 3 s after the
/// last write reaches the object within it only because the driver watches Networks (before
/// it did, this twin measured 29.9–30.1 s).
const WATCHED: Duration = Duration::from_secs(20);

/// The process's network and mount namespaces before it isolated itself.
pub(crate) struct HostNamespaces {
    net: File,
    mnt: File,
}

impl HostNamespaces {
    /// Must be called before [`knic_e2e::harness::isolate`].
    pub(crate) fn open() -> anyhow::Result<HostNamespaces> {
        Ok(HostNamespaces {
            net: File::open("/proc/self/ns/net").context("/proc/self/ns/net")?,
            mnt: File::open("/proc/self/ns/mnt").context("/proc/self/ns/mnt")?,
        })
    }

    /// Moves the calling thread (which must be one no other thread shares its filesystem
    /// attributes with: a fresh one) into the host's namespaces; threads and processes it
    /// starts afterwards are there too.
    fn enter(&self) -> anyhow::Result<()> {
        // setns(CLONE_NEWNS) refuses a thread sharing its root and cwd with others.
        unshare(CloneFlags::CLONE_FS).context("unshare(CLONE_FS)")?;
        setns(&self.mnt, CloneFlags::CLONE_NEWNS).context("entering the host's mount namespace")?;
        setns(&self.net, CloneFlags::CLONE_NEWNET)
            .context("entering the host's network namespace")?;
        Ok(())
    }
}

/// Why the twin cannot run here, if it cannot (`Some("")`: `real_cluster` said why).
pub(crate) fn missing(
    real: &Option<RealCluster>,
    host: &anyhow::Result<HostNamespaces>,
) -> Option<String> {
    if real.is_none() {
        return Some(String::new());
    }
    if !nix::unistd::geteuid().is_root() {
        return Some(
            "the real twin needs root (links, namespaces, the kubelet's directories)".into(),
        );
    }
    if let Err(e) = host {
        return Some(format!("the host's namespaces: {e:#}"));
    }
    knic_e2e::driver::binary().err().map(|e| format!("{e:#}"))
}

/// The trial: ignored (with the reason printed) unless a real cluster, root and the driver
/// binary are there.
pub(crate) fn trial(real: Option<RealCluster>, host: anyhow::Result<HostNamespaces>) -> Trial {
    let missing = missing(&real, &host);
    if let Some(reason) = missing.as_deref().filter(|r| !r.is_empty()) {
        eprintln!("skipped: {NAME}: {reason}");
    }
    let ignored = missing.is_some();
    Trial::test(NAME, move || {
        let (Some(real), Ok(host)) = (real, host) else {
            return Err(Failed::from(
                "no real cluster (the trial should be ignored)",
            ));
        };
        let thread = std::thread::Builder::new()
            .name("real-twin".into())
            .spawn(move || -> anyhow::Result<()> {
                host.enter()?;
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()?;
                rt.block_on(dra_pod_through_the_kni_socket(real))
            })
            .map_err(|e| Failed::from(e.to_string()))?;
        match thread.join() {
            Ok(outcome) => outcome.map_err(|e| Failed::from(format!("{e:#}"))),
            Err(_) => Err(Failed::from("the twin's thread panicked")),
        }
    })
    .with_ignored_flag(ignored)
}

/// What QueryNodeNetworks says about the node and the test's Network.
#[derive(Debug)]
struct Answer {
    /// The node's `extradata.reasons`.
    node: String,
    /// The Network's `ready` (false when the Network is not listed).
    ready: bool,
    /// The Network's `extradata`.
    extradata: Value,
    /// The whole answer, for messages.
    raw: Value,
}

impl Answer {
    fn reasons(&self) -> &str {
        self.extradata["reasons"].as_str().unwrap_or_default()
    }
}

async fn query(kni: &mut KniClient, network: &str) -> anyhow::Result<Answer> {
    let raw = kni.ok("QueryNodeNetworks", json!({})).await?;
    let entry = raw["networks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["name"] == network)
        .cloned()
        .unwrap_or(Value::Null);
    Ok(Answer {
        node: raw["extradata"]["reasons"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        ready: entry["ready"] == true,
        extradata: entry["extradata"].clone(),
        raw,
    })
}

/// Asks QueryNodeNetworks until `want` holds (20 s), printing how long it took; fails naming
/// `what` and the last answer.
async fn answer_until(
    kni: &mut KniClient,
    network: &str,
    what: &str,
    want: impl Fn(&Answer) -> bool,
) -> anyhow::Result<Answer> {
    let started = Instant::now();
    loop {
        let answer = query(kni, network).await?;
        if want(&answer) {
            println!(
                "[{:>6.1}s] QueryNodeNetworks: {what}: {}",
                started.elapsed().as_secs_f64(),
                answer.raw
            );
            return Ok(answer);
        }
        if started.elapsed() > Duration::from_secs(20) {
            bail!(
                "QueryNodeNetworks: expected {what} within 20 s; last answer {}",
                answer.raw
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The test's Network in a NodeNetworks object's status.
fn entry<'a>(object: &'a Value, network: &str) -> &'a Value {
    object["status"]["networks"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["name"] == network))
        .unwrap_or(&Value::Null)
}

/// The node's NodeNetworks object once `want` holds for it (within `timeout`), printing how
/// long it took; fails naming `what` and the last object.
async fn object_until(
    node: &RealNode,
    what: &str,
    timeout: Duration,
    want: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let api: Api<NodeNetworks> = Api::all(node.cluster.client.clone());
    let name = node.real.node.clone();
    let api = &api;
    let name = &name;
    let want = &want;
    wait_for(
        &format!("NodeNetworks {name}: {what}"),
        timeout,
        || async move {
            let object = match api.get_opt(name).await? {
                Some(o) => serde_json::to_value(o)?,
                None => bail!("expected {what}; the object does not exist"),
            };
            ensure!(want(&object), "expected {what}; last object {object}");
            Ok(Some(object))
        },
    )
    .await
}

/// The twin: see the module comment.
pub(crate) async fn dra_pod_through_the_kni_socket(real: RealCluster) -> anyhow::Result<()> {
    // The node's NodeNetworks object is left as it was found: deleted at the end only when
    // this twin's driver made it (someone's driver may keep it otherwise).
    let client = {
        let file = kube::config::Kubeconfig::read_from(&real.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default()).await?;
        kube::Client::try_from(config)?
    };
    let objects: Api<NodeNetworks> = Api::all(client.clone());
    let found = match objects.get_opt(&real.node).await {
        Ok(found) => found.is_some(),
        // The CRD is not applied yet (`Cluster::real` applies it): no object either.
        Err(kube::Error::Api(s)) if s.code == 404 => false,
        Err(e) => return Err(e).context("reading the node's NodeNetworks before the twin"),
    };
    let mut node = RealNode::start(
        &real,
        "real-kni",
        "kn",
        &[PEER],
        &[("KNIC_NODE_NETWORKS", "true")],
    )
    .await?;
    let network = format!("{}-net", node.cluster.namespace);
    let outcome = async {
        let result = unpanicked(scenario(&mut node, &network)).await;
        let removed = remove_network(&node, &network).await;
        match result {
            Ok(()) => removed,
            Err(e) => Err(e.context(format!("network removal: {removed:?}"))),
        }
    }
    .await;
    let finished = node.finish(outcome).await;
    // Only now: the driver (stopped by `finish`) would have written it again.
    let forgotten = if found {
        Ok(())
    } else {
        match objects.delete(&real.node, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e).context("deleting the node's NodeNetworks the twin's driver made"),
        }
    };
    finished.and(forgotten)
}

async fn remove_network(node: &RealNode, network: &str) -> anyhow::Result<()> {
    // The pod first, so the driver unprepares it while it runs (`finish` would too).
    node.delete_pod(POD, Duration::from_secs(120)).await?;
    let api: Api<Network> = Api::all(node.cluster.client.clone());
    match api.delete(network, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("deleting Network {network}")),
    }
}

async fn scenario(node: &mut RealNode, network: &str) -> anyhow::Result<()> {
    let ns = node.cluster.namespace.clone();
    let nic = node.nics[0].clone();
    let node_name = node.real.node.clone();

    // The driver serves its own KNI socket (`DriverConfig::under`) and keeps NodeNetworks.
    let socket = PathBuf::from(
        node.config
            .env_value("KNIC_KNI_SOCKET")
            .context("the driver is given no KNI socket")?,
    );
    ensure!(
        node.config.env_value("KNIC_NODE_NETWORKS") == Some("true"),
        "expected the driver to run with KNIC_NODE_NETWORKS=true, got {:?}",
        node.config.env_value("KNIC_NODE_NETWORKS")
    );
    wait_for(
        &format!("the driver serves its KNI socket {}", socket.display()),
        Duration::from_secs(20),
        || async { Ok(socket.exists().then_some(())) },
    )
    .await?;
    let mut kni = KniClient::connect(&socket).await?;
    println!(
        "KNI client: stubs from the upstream api.proto, grpcio {}",
        kni.grpcio
    );

    // 1. A Network whose selector matches the NIC, made while the driver runs, once its
    // start-up writes of the object are done (so the object's lag is the driver's steady
    // state, not a start-up write that happens to come after the Network).
    let class = node.device_class("nic", &[&nic.name]).await?;
    let settled = object_until(
        node,
        "the node ready (the driver's start-up)",
        WATCHED,
        |o| o["status"]["ready"] == true,
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let api: Api<NodeNetworks> = Api::all(node.cluster.client.clone());
    let now = serde_json::to_value(api.get(&node_name).await?)?;
    ensure!(
        now["status"]["ready"] == true,
        "expected NodeNetworks {node_name} to stay ready, got {now}"
    );
    println!(
        "NodeNetworks {node_name} before the Network: updated {} (then {})",
        now["status"]["updated"], settled["status"]["updated"]
    );
    let networks: Api<Network> = Api::all(node.cluster.client.clone());
    networks
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
                "metadata": {"name": network},
                "spec": {"devices": {"deviceClassName": class,
                            "selectors": [format!("device.attributes[\"knic.dev\"].ifName == \"{}\"", nic.name)]},
                         "ipam": {"static": {}},
                         "namespaces": {"names": [ns]}},
            }))?,
        )
        .await?;
    node.mark(&format!("Network {network} created"));
    let created = Instant::now();
    let answer = answer_until(
        &mut kni,
        network,
        "the Network ready, no reasons (node or Network)",
        |a| a.ready && a.node.is_empty() && a.reasons().is_empty(),
    )
    .await?;
    let expected = json!({"reasons": "", "freeDevices": nic.name, "matchingDevices": nic.name,
                          "interfacesPerPod": "1"});
    ensure!(
        answer.extradata == expected
            && answer.raw["extradata"]["node"] == node_name
            && answer.raw["extradata"]["ready"] == "true",
        "expected the Network's extradata {expected} on node {node_name} (ready \"true\"), got {}",
        answer.raw
    );
    kni.ok("SetupNodeNetwork", json!({}))
        .await
        .context("expected SetupNodeNetwork OK on a ready node")?;
    let object = object_until(node, "the node ready and the Network ready", WATCHED, |o| {
        o["status"]["ready"] == true
            && entry(o, network)["ready"] == true
            && entry(o, network)["reasons"].is_null()
    })
    .await?;
    let lag = created.elapsed().as_secs_f64();
    println!(
        "NodeNetworks {node_name} showed Network {network} ready {lag:.1} s after its creation"
    );
    ensure!(
        object["spec"]["nodeName"] == node_name
            && object["metadata"]["ownerReferences"][0]["kind"] == "Node"
            && object["metadata"]["ownerReferences"][0]["name"] == node_name
            && entry(&object, network)["freeDevices"] == json!([nic.name])
            && object["status"]["readyNetworks"]
                .as_str()
                .is_some_and(|r| r.split(',').any(|n| n == network)),
        "expected NodeNetworks {node_name} (spec.nodeName, owned by the Node) listing {network} \
         ready with free device {}, got {object}",
        nic.name
    );

    // 2. A pod gets the NIC through DRA (the real scheduler, kubelet and containerd).
    node.claim(CLAIM, &class, json!({"addresses": [ADDRESS]}))
        .await?;
    node.create_pod(POD, &PodClaim::Claim(CLAIM.into())).await?;
    let pod = node.running(POD, Duration::from_secs(120)).await?;
    let pod_uid = pod.metadata.uid.clone().context("the pod has no UID")?;
    let netns = node.pod_netns(POD).await?;
    let links = links_in(&netns)?;
    let mac = links
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("net1:") || l.contains(" net1@"))
        .and_then(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let i = words.iter().position(|w| *w == "link/ether")?;
            words.get(i + 1).map(|m| (*m).to_owned())
        })
        .with_context(|| {
            format!("expected net1 with a MAC in the pod's netns; ip -o link:\n{links}")
        })?;
    udp_echo(&netns, &nic.peer, PEER_IP)
        .with_context(|| format!("expected a UDP echo from the pod's net1 to {PEER_IP}"))?;
    let status = node.configured(CLAIM).await?;
    println!(
        "pod {POD} (uid {pod_uid}) in {}: net1 {mac}; claim status {}",
        netns.display(),
        status["devices"][0]["networkData"]
    );
    for who in [
        json!({"name": POD, "namespace": ns}),
        json!({"id": pod_uid}),
    ] {
        let answer = kni.ok("QueryPodNetwork", who.clone()).await?;
        println!("QueryPodNetwork {who}: {answer}");
        let configs = answer["ipconfigs"].as_object().cloned().unwrap_or_default();
        let names: Vec<&String> = configs.keys().collect();
        ensure!(
            names == ["net1"],
            "QueryPodNetwork {who}: expected exactly net1 (knic's interface), got {answer}"
        );
        let net1 = &answer["ipconfigs"]["net1"];
        ensure!(
            net1["ip"] == json!([ADDRESS])
                && net1["mac"].as_str().map(str::to_lowercase) == Some(mac.to_lowercase()),
            "QueryPodNetwork {who}: expected net1 {ADDRESS} with the MAC the pod's kernel shows \
             ({mac}), got {answer}"
        );
        let data = &net1["extradata"];
        let in_ns = data["netns"]
            .as_str()
            .and_then(|p| PathBuf::from(p).file_name().map(|f| f.to_owned()));
        ensure!(
            data["claim"] == format!("{ns}/{CLAIM}")
                && data["present"] == "true"
                && data["device"]
                    .as_str()
                    .is_some_and(|d| d.ends_with(&format!("/{}", nic.name)))
                && in_ns.as_deref() == netns.file_name(),
            "QueryPodNetwork {who}: expected claim {ns}/{CLAIM}, present, device …/{}, netns \
             {}, got {data}",
            nic.name,
            netns.display()
        );
        // The kubelet's door published the same interface on the claim.
        let published = &status["devices"][0]["networkData"];
        ensure!(
            published["ips"] == net1["ip"]
                && published["hardwareAddress"]
                    .as_str()
                    .is_none_or(|m| m.eq_ignore_ascii_case(&mac)),
            "expected the claim's networkData to agree with QueryPodNetwork ({net1}), got \
             {published}"
        );
    }

    // 3. The only matching device is in the pod: not ready, and the reason says by whom.
    let in_use = format!("(in use: {} by {ns}/{CLAIM})", nic.name);
    let answer = answer_until(
        &mut kni,
        network,
        &format!("the Network not ready, reason naming {in_use}"),
        |a| !a.ready && a.reasons().contains(&in_use),
    )
    .await?;
    ensure!(
        answer.extradata["freeDevices"] == ""
            && answer.extradata["matchingDevices"] == nic.name
            && answer.node.is_empty(),
        "expected no free device, {} matching, the node itself ready, got {}",
        nic.name,
        answer.raw
    );
    object_until(
        node,
        &format!("the Network not ready, reason naming {in_use}"),
        WATCHED,
        |o| {
            o["status"]["ready"] == true
                && entry(o, network)["ready"] == false
                && entry(o, network)["reasons"][0]
                    .as_str()
                    .is_some_and(|r| r.contains(&in_use))
        },
    )
    .await?;

    // 4. The pod goes (the kubelet unprepares): ready again, answer and object.
    node.delete_pod(POD, Duration::from_secs(120)).await?;
    let gone = Instant::now();
    answer_until(&mut kni, network, "the Network ready again", |a| {
        a.ready && a.reasons().is_empty() && a.extradata["freeDevices"] == nic.name
    })
    .await?;
    object_until(node, "the Network ready again", WATCHED, |o| {
        o["status"]["ready"] == true
            && entry(o, network)["ready"] == true
            && entry(o, network)["freeDevices"] == json!([nic.name])
    })
    .await?;
    println!(
        "NodeNetworks {node_name} ready again {:.1} s after the pod was gone",
        gone.elapsed().as_secs_f64()
    );
    Ok(())
}
