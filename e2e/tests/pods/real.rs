//! The fully real path, run only against a real cluster (`KNIC_E2E_KUBECONFIG`).

use std::time::Duration;

use anyhow::{Context, ensure};
use knic_e2e::cluster::RealCluster;
use knic_e2e::harness::{host_link, udp_echo, unpanicked};
use knic_e2e::real_node::{PodClaim, RealNode, link_in, wait_for};
use serde_json::json;

/// The fully real path: knic-driver registered with the node's real kubelet and connected to
/// its real runtime's NRI socket; a real pod with a real claim is scheduled, the kubelet
/// prepares, the runtime calls the hook, and the interface is checked inside the pod's network
/// namespace; deleting the pod puts the device back, and the pod is gone only once the kubelet
/// unprepared its claim (which leaves nothing in the checkpoint).
pub(crate) async fn real_kubelet_and_runtime(real: RealCluster) -> anyhow::Result<()> {
    let mut node = RealNode::start(&real, "real-pod", "r", &["192.0.2.1/24"], &[]).await?;
    let outcome = unpanicked(scenario(&mut node)).await;
    node.finish(outcome).await
}

async fn scenario(node: &mut RealNode) -> anyhow::Result<()> {
    let nic = node.nics[0].clone();
    let class = node.device_class("nic", &[&nic.name]).await?;
    node.claim("nic", &class, json!({"addresses": ["192.0.2.10/24"]}))
        .await?;
    node.create_pod("with-nic", &PodClaim::Claim("nic".into()))
        .await?;
    node.running("with-nic", Duration::from_secs(180)).await?;
    let status = node.configured("nic").await?;
    ensure!(
        status["devices"][0]["networkData"]["ips"] == json!(["192.0.2.10/24"]),
        "{status}"
    );
    let netns = node.pod_netns("with-nic").await?;
    let net1 = link_in(&netns, "net1").context("net1 is not in the pod")?;
    ensure!(net1.contains("192.0.2.10/24"), "{net1}");
    udp_echo(&netns, &nic.peer, "192.0.2.1")?;
    node.delete_pod("with-nic", Duration::from_secs(120))
        .await?;
    wait_for(
        "the device is back on the host",
        Duration::from_secs(10),
        || async {
            Ok((host_link(&nic.name).ok().as_deref() == Some(nic.before.as_str())).then_some(()))
        },
    )
    .await?;
    let left = node.checkpoint()?;
    ensure!(left.is_empty(), "claims left in the checkpoint: {left:?}");
    Ok(())
}
