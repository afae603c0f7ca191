//! The demo's KNI step: the same veth, now without a kubelet, through the KNI socket as a VM
//! manager would use it — a sandbox namespace created, a knic Network attached (its address
//! from the Network's subnet), traffic through it, the sandbox queried, then detached and
//! removed. The door's code is the kubelet's: the same prepare, checkpoint and attach.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::resource::v1::Device;
use knic_driver::kni::catalog::{Catalog, FileCatalog};
use knic_driver::kni::{self, KniService, Settings};
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::wiring::Node;
use knic_proto::kni::kni_client::KniClient;
use knic_proto::kni::{self as wire, Isolation};

use super::{NODE, Scratch, Steps, fmt, udp_echo};

/// The sandbox's id (and the name its namespace is pinned under).
const SANDBOX: &str = "demo-vm";

impl Scratch {
    /// Where KNI CreateNetwork pins the sandbox's namespace.
    pub(super) fn kni_netns_dir(&self) -> PathBuf {
        self.dir.path().join("kni-netns")
    }
}

/// The Networks file of the demo: one Network on the veth whose subnet leaves one address,
/// 192.0.2.10, so the echo's source is known.
pub(super) fn catalog(scratch: &Scratch) -> anyhow::Result<Arc<dyn Catalog>> {
    let path = scratch.dir.path().join("networks.yaml");
    std::fs::write(
        &path,
        format!(
            r#"apiVersion: knic.dev/v1alpha1
kind: Network
metadata: {{name: demo-net}}
spec:
  devices:
    deviceClassName: knic.dev
    selectors: ['device.attributes["knic.dev"].ifName == "{}"']
  mtu: 1400
  ipam:
    subnets:
      - cidr: 192.0.2.0/24
        gateway: 192.0.2.1
        exclude: ["192.0.2.2-192.0.2.9", "192.0.2.11-192.0.2.254"]
  namespaces: {{names: [default]}}
"#,
            scratch.host_if
        ),
    )?;
    let files = FileCatalog::new(vec![path]);
    files.load()?;
    Ok(Arc::new(files))
}

/// Serves the KNI socket over the demo's node and walks a sandbox through it.
pub(super) async fn step(
    steps: &mut Steps,
    scratch: &Scratch,
    node: &Node<Rtnl>,
    catalog: Arc<dyn Catalog>,
    devices: tokio::sync::watch::Receiver<Vec<Device>>,
) -> anyhow::Result<()> {
    let t = Instant::now();
    let socket = scratch.dir.path().join("kni.sock");
    let (_facts, facts) = tokio::sync::watch::channel(kni::ready::NodeFacts::default());
    let door = Arc::new(kni::Door {
        pool: NODE.into(),
        catalog,
        offered: devices,
        facts,
        claims: node.claims.clone(),
        preparer: node.kni_preparer.clone(),
        pending: node.kni_pending.clone(),
        pods: node.pods.clone(),
        serial: tokio::sync::Mutex::new(()),
    });
    let service = KniService::new(
        door,
        Settings {
            netns_dir: scratch.kni_netns_dir(),
            sysfs_root: "/".into(),
            node: NODE.into(),
        },
    );
    let listener = kni::bind(&socket)?;
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let served_socket = socket.clone();
    let server = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        kni::serve(listener, &served_socket, service, shutdown).await
    });
    let mut kni = KniClient::new(knic_driver::kubelet::dial(&socket).await?);
    let networks = kni
        .query_node_networks(wire::QueryNodeNetworksRequest {})
        .await?
        .into_inner();
    let ready: Vec<String> = networks
        .networks
        .iter()
        .map(|n| format!("{} ready={}", n.name, n.ready))
        .collect();
    steps.record(
        &format!("KNI socket up, QueryNodeNetworks: {}", ready.join(", ")),
        t,
    );

    let t = Instant::now();
    let created = kni
        .create_network(wire::CreateNetworkRequest {
            name: SANDBOX.into(),
            uid: SANDBOX.into(),
            namespace: "default".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let netns = PathBuf::from(&created.netns_path);
    let answer = kni
        .attach_interface(wire::AttachInterfaceRequest {
            name: SANDBOX.into(),
            id: SANDBOX.into(),
            namespace: "default".into(),
            isolation: Some(Isolation {
                path: created.netns_path.clone(),
                r#type: "netns".into(),
                ..Default::default()
            }),
            extradata: [("network".to_owned(), "demo-net".to_owned())].into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let Some(net1) = answer.ipconfigs.get("net1") else {
        bail!("AttachInterface answered no net1: {answer:?}");
    };
    steps.record(
        &format!(
            "KNI CreateNetwork + AttachInterface (Network demo-net) → net1 {} mac {} in sandbox {SANDBOX}",
            net1.ip.join(","),
            net1.mac
        ),
        t,
    );
    let t = Instant::now();
    let peer_ns = scratch.peer_ns();
    let from = netns.clone();
    let rtt = tokio::task::spawn_blocking(move || udp_echo(&from, &peer_ns)).await??;
    steps.record(
        &format!(
            "UDP echo from the KNI sandbox through net1, round trip {}",
            fmt(rtt)
        ),
        t,
    );
    let query = kni
        .query_pod_network(wire::QueryPodNetworkRequest {
            id: SANDBOX.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut interfaces: Vec<&String> = query.ipconfigs.keys().collect();
    interfaces.sort();
    say!("    QueryPodNetwork {SANDBOX}: {interfaces:?}");

    let t = Instant::now();
    kni.detach_interface(wire::DetachInterfaceRequest {
        name: SANDBOX.into(),
        id: SANDBOX.into(),
        namespace: "default".into(),
        ..Default::default()
    })
    .await?;
    kni.delete_network(wire::DeleteNetworkRequest {
        id: SANDBOX.into(),
        netns_path: created.netns_path.clone(),
        ..Default::default()
    })
    .await?;
    if netns.exists() {
        bail!("the sandbox namespace {} stayed", netns.display());
    }
    steps.record(
        "KNI DetachInterface + DeleteNetwork → device home, sandbox gone",
        t,
    );
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .context("the KNI socket did not stop")???;
    Ok(())
}

/// Unpins the KNI sandbox's namespace if a stop came before the demo removed it.
pub(super) fn cleanup(scratch: &Scratch) {
    let path: &Path = &scratch.kni_netns_dir().join(SANDBOX);
    let _ = knic_driver::kni::pin::delete(path);
}
