//! Overlay Networks across nodes (issue 26), end to end with the real `knic-driver` binary:
//! two "nodes" are network namespaces joined by a veth underlay (a bridge in the test's host
//! namespace, where the fake API listens), each running its own driver (`ip netns exec`, its
//! own directories, `--vtep-address`), its own test kubelet and NRI runtime. A pod on each node
//! gets an interface on one VXLAN Network; they exchange UDP across the nodes; each node's
//! forwarding entries follow the other's pods coming and going; both nodes are left as they
//! were. Runs as root in private namespaces; without root the trial reports itself ignored.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::ResourceSlice;
use knic_driver::nri::PodSandbox;
use knic_driver::nri::runtime::TestRuntime;
use knic_e2e::cluster::{Cluster, TestClaim};
use knic_e2e::driver::{DriverConfig, DriverProcess};
use knic_e2e::harness::{Netns, eventually, ip, isolate, trial, udp_echo, unisolate};
use knic_e2e::kubelet::{self, ClaimId, DraVersion, Plugin};
use knic_proto::network::{Network, NetworkAddress, OVERLAY_LABEL};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const NETWORK: &str = "ovl";
const VNI: u32 = 4242;

/// One namespaced node with its driver, kubelet plugin and runtime.
struct Node {
    name: String,
    vtep: String,
    /// Deleted (with everything in it) when the node is dropped.
    _netns: Netns,
    driver: DriverProcess,
    plugin: Arc<Plugin>,
    runtime: TestRuntime,
}

impl Node {
    fn links(&self) -> anyhow::Result<String> {
        ip(&["-n", &self.name, "-br", "link"])
    }

    /// knic's forwarding entries of the node's segment (`self`: the VXLAN device's own table),
    /// as `bridge fdb` shows them; the bridge's learned entries (`master`, aged out by the
    /// kernel) are not knic's.
    fn fdb(&self) -> String {
        std::process::Command::new("ip")
            .args(["netns", "exec", &self.name, "bridge", "fdb", "show", "dev"])
            .arg(format!("knx{VNI:06x}"))
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter(|l| l.contains(" self"))
                    .map(|l| format!("{l}\n"))
                    .collect()
            })
            .unwrap_or_default()
    }
}

struct Env {
    cluster: Cluster,
    nodes: Vec<Node>,
}

impl Env {
    fn id(&self, claim: &TestClaim) -> ClaimId {
        ClaimId {
            namespace: self.cluster.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        }
    }

    fn pod(&self, claim: &TestClaim, netns: &Netns) -> PodSandbox {
        PodSandbox {
            id: format!("sandbox-{}", claim.name),
            name: format!("{}-pod", claim.name),
            uid: claim.pod_uid.clone(),
            namespace: self.cluster.namespace.clone(),
            netns: Some(netns.path()),
            ips: vec![],
        }
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {} driver log ---\n{}", n.name, n.driver.logs()))
            .collect()
    }

    /// A claim on `node`'s overlay device for the Network, prepared there.
    async fn prepared_claim(&self, node: usize, name: &str) -> anyhow::Result<TestClaim> {
        let n = &self.nodes[node];
        let claim = self
            .cluster
            .create_claim_allocated(
                name,
                // A share of the node's overlay device, as the scheduler allocates one.
                Some(vec![json!({
                    "request": "nic", "driver": "knic.dev", "pool": n.name, "device": "overlay",
                    "shareID": share_id(name),
                    "consumedCapacity": {"children": "1"},
                })]),
                Some(
                    json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                            "ipam": {"network": NETWORK}}),
                ),
            )
            .await?;
        let out = n.plugin.prepare(DraVersion::V1, &[self.id(&claim)]).await?;
        ensure!(
            out[&claim.uid].error.is_empty(),
            "prepare {name} on {}: {}",
            n.name,
            out[&claim.uid].error
        );
        Ok(claim)
    }

    async fn announced(&self) -> anyhow::Result<Vec<NetworkAddress>> {
        let api: Api<NetworkAddress> = Api::all(self.cluster.client.clone());
        Ok(api
            .list(&ListParams::default().labels(&format!("{OVERLAY_LABEL}=true")))
            .await?
            .items)
    }
}

/// A share id per claim name, as the scheduler gives each allocation of a shared device.
fn share_id(claim: &str) -> String {
    let n = claim.bytes().fold(0u64, |h, b| h * 31 + u64::from(b));
    format!("00000000-0000-4000-8000-{:012x}", n & 0xffff_ffff_ffff)
}

/// The address the pod's `net1` got, as the pod sees it.
fn pod_address(pod: &Netns) -> anyhow::Result<String> {
    let out = ip(&["-n", &pod.0, "-4", "-o", "addr", "show", "dev", "net1"])?;
    out.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .map(str::to_owned)
        .with_context(|| format!("no IPv4 address on net1 in {}: {out}", pod.0))
}

async fn setup() -> anyhow::Result<Env> {
    // The underlay: a bridge here (where the fake API listens) and a veth to each node.
    ip(&["link", "add", "knt-ul", "type", "bridge"])?;
    ip(&["addr", "add", "10.99.0.254/24", "dev", "knt-ul"])?;
    ip(&["link", "set", "knt-ul", "up"])?;
    let api_address: IpAddr = "10.99.0.254".parse()?;
    let cluster = Cluster::fake_on("overlay", api_address).await?;
    let networks: Api<Network> = Api::all(cluster.client.clone());
    let network: Network = serde_json::from_value(json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "Network", "metadata": {"name": NETWORK},
        "spec": {"vxlan": {"vni": VNI},
                 "ipam": {"subnets": [{"cidr": "10.42.0.0/24", "gateway": "10.42.0.1"}]},
                 "namespaces": {"names": [cluster.namespace]}},
    }))?;
    networks.create(&PostParams::default(), &network).await?;
    let mut nodes = Vec::new();
    for (name, vtep) in [("knt-ovn-a", "10.99.0.1"), ("knt-ovn-b", "10.99.0.2")] {
        let netns = Netns::new(name)?;
        let (here, there) = (format!("{name}h"), format!("{name}u"));
        ip(&[
            "link", "add", &here, "type", "veth", "peer", "name", &there, "netns", name,
        ])?;
        ip(&["link", "set", &here, "master", "knt-ul", "up"])?;
        ip(&[
            "-n",
            name,
            "addr",
            "add",
            &format!("{vtep}/24"),
            "dev",
            &there,
        ])?;
        ip(&["-n", name, "link", "set", &there, "up"])?;
        let dir = cluster.tmp.path().join(name);
        std::fs::create_dir_all(&dir)?;
        let nri_socket = dir.join("nri.sock");
        let mut runtime = TestRuntime::listen(&nri_socket).await?;
        let mut config = DriverConfig::under(&dir, name, &cluster.kubeconfig)
            .with_env("KNIC_VTEP_ADDRESS", vtep)
            .with_env("KNIC_NRI_SOCKET", nri_socket.to_string_lossy())
            .without_stand_in_runtime();
        config.netns = Some(name.to_owned());
        let node_object: k8s_openapi::api::core::v1::Node = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
        )?;
        Api::<k8s_openapi::api::core::v1::Node>::all(cluster.client.clone())
            .create(&PostParams::default(), &node_object)
            .await?;
        let driver = DriverProcess::start(&config)?;
        tokio::time::timeout(Duration::from_secs(20), runtime.accept(vec![]))
            .await
            .with_context(|| format!("{name}'s driver never connected: {}", driver.logs()))??;
        let plugin = match kubelet::register(&config.registry_dir).await {
            Ok(p) => Arc::new(p),
            Err(e) => anyhow::bail!("{e:#}\ndriver log:\n{}", driver.logs()),
        };
        nodes.push(Node {
            name: name.into(),
            vtep: vtep.into(),
            _netns: netns,
            driver,
            plugin,
            runtime,
        });
    }
    let env = Env { cluster, nodes };
    // Each node offers its overlay device, with its VTEP and the MTU its underlay carries.
    for node in &env.nodes {
        eventually(
            &format!("{} publishes its overlay device", node.name),
            WAIT,
            || async {
                let api: Api<ResourceSlice> = Api::all(env.cluster.client.clone());
                let slices = api.list(&ListParams::default()).await?.items;
                let found = slices
                    .iter()
                    .filter(|s| s.spec.node_name.as_deref() == Some(node.name.as_str()))
                    .flat_map(|s| s.spec.devices.iter().flatten())
                    .find(|d| d.name == "overlay")
                    .cloned();
                Ok(found)
            },
        )
        .await
        .with_context(|| env.logs())
        .and_then(|d| {
            let a = d.attributes.unwrap_or_default();
            ensure!(
                a["vtep"].string.as_deref() == Some(node.vtep.as_str()),
                "{a:?}"
            );
            ensure!(a["mtu"].int == Some(1450), "{a:?}");
            Ok(())
        })?;
    }
    Ok(env)
}

async fn pods_on_two_nodes_share_one_segment(env: &mut Env) -> anyhow::Result<()> {
    let a = env.prepared_claim(0, "claim-a").await?;
    let b = env.prepared_claim(1, "claim-b").await?;
    let announced = env.announced().await?;
    ensure!(announced.len() == 2, "announced: {announced:?}");
    for (claim, vtep) in [(&a, "10.99.0.1"), (&b, "10.99.0.2")] {
        let object = announced
            .iter()
            .find(|o| o.spec.claim.uid == claim.uid)
            .context("no announcement")?;
        let overlay = object.spec.overlay.as_ref().context("no overlay facts")?;
        ensure!(overlay.vni == VNI && overlay.vtep == vtep, "{overlay:?}");
    }
    let (pa, pb) = (Netns::new("knt-ovp-a")?, Netns::new("knt-ovp-b")?);
    env.nodes[0]
        .runtime
        .run_pod_sandbox(&env.pod(&a, &pa))
        .await
        .map_err(anyhow::Error::msg)?;
    env.nodes[1]
        .runtime
        .run_pod_sandbox(&env.pod(&b, &pb))
        .await
        .map_err(anyhow::Error::msg)?;
    let (addr_a, addr_b) = (pod_address(&pa)?, pod_address(&pb)?);
    let net1 = ip(&["-n", "knt-ovp-a", "-d", "link", "show", "net1"])?;
    ensure!(net1.contains("mtu 1450") && net1.contains("veth"), "{net1}");

    // Each node learns the other's pod from its announcement: UDP crosses the overlay both ways.
    let cross = |from: PathBuf, to: PathBuf, addr: String| async move {
        Ok(udp_echo(&from, &to, &addr).ok())
    };
    eventually("UDP a → b across the overlay", WAIT, || {
        cross(pa.path(), pb.path(), addr_b.clone())
    })
    .await
    .with_context(|| {
        format!(
            "fdb a: {}\nfdb b: {}\n{}",
            env.nodes[0].fdb(),
            env.nodes[1].fdb(),
            env.logs()
        )
    })?;
    udp_echo(&pb.path(), &pa.path(), &addr_a).context("UDP b → a")?;
    let fdb_a = env.nodes[0].fdb();
    ensure!(
        fdb_a.contains("00:00:00:00:00:00 dst 10.99.0.2 self permanent"),
        "a's flood list: {fdb_a}"
    );
    ensure!(
        !fdb_a.contains("dst 10.99.0.1 "),
        "a forwards nothing to itself: {fdb_a}"
    );

    // A third pod on b: a learns its MAC; then it leaves and a forgets it.
    let c = env.prepared_claim(1, "claim-c").await?;
    let pc = Netns::new("knt-ovp-c")?;
    env.nodes[1]
        .runtime
        .run_pod_sandbox(&env.pod(&c, &pc))
        .await
        .map_err(anyhow::Error::msg)?;
    let mac_c = ip(&["-n", "knt-ovp-c", "-br", "link", "show", "net1"])?
        .split_whitespace()
        .nth(2)
        .context("mac of c")?
        .to_owned();
    eventually("a holds c's MAC", WAIT, || async {
        Ok(env.nodes[0]
            .fdb()
            .contains(&format!("{mac_c} dst 10.99.0.2"))
            .then_some(()))
    })
    .await?;
    env.nodes[1]
        .runtime
        .stop_pod_sandbox(&env.pod(&c, &pc))
        .await
        .map_err(anyhow::Error::msg)?;
    env.nodes[1]
        .plugin
        .unprepare(DraVersion::V1, &[env.id(&c)])
        .await?;
    drop(pc);
    let forgot = eventually("a forgets c's MAC", WAIT, || async {
        Ok((!env.nodes[0].fdb().contains(&mac_c)).then_some(()))
    })
    .await;
    if let Err(e) = forgot {
        let names: Vec<String> = env
            .announced()
            .await?
            .iter()
            .map(|o| format!("{:?} {:?}", o.metadata.name, o.spec.overlay))
            .collect();
        anyhow::bail!("{e:#}\nannounced: {names:?}\nfdb a: {}", env.nodes[0].fdb());
    }
    udp_echo(&pa.path(), &pb.path(), &addr_b).context("a ↔ b unaffected by c")?;

    // Both pods leave: every node is as it was, and nothing is announced any more.
    for (node, claim, pod) in [(0, &a, &pa), (1, &b, &pb)] {
        env.nodes[node]
            .runtime
            .stop_pod_sandbox(&env.pod(claim, pod))
            .await
            .map_err(anyhow::Error::msg)?;
        env.nodes[node]
            .plugin
            .unprepare(DraVersion::V1, &[env.id(claim)])
            .await?;
    }
    ensure!(env.announced().await?.is_empty(), "announcements left");
    for node in &env.nodes {
        let links = node.links()?;
        ensure!(
            !links.contains("knb") && !links.contains("knx") && !links.contains("knh"),
            "{} kept overlay links: {links}",
            node.name
        );
    }
    Ok(())
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let isolated = isolate();
    if let Err(reason) = &isolated {
        eprintln!("skipped: overlay e2e tests: {reason}");
    }
    let trials = vec![trial(
        "fake/pods_on_two_nodes_share_one_segment".into(),
        isolated.is_err(),
        || async {
            let mut env = setup().await?;
            let outcome = pods_on_two_nodes_share_one_segment(&mut env).await;
            let logs = env.logs();
            for node in &mut env.nodes {
                let _ = node.driver.terminate().await;
            }
            let _ = ip(&["link", "del", "knt-ul"]);
            outcome.map_err(|e| anyhow::anyhow!("{e:#}\n{logs}"))
        },
    )];
    let conclusion = libtest_mimic::run(&args, trials);
    if let Ok(root) = &isolated {
        unisolate(root);
    }
    conclusion.exit();
}
