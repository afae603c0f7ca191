//! The fully real path, run only against a real cluster (`KNIC_E2E_KUBECONFIG`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::ResourceClaim;
use knic_e2e::cluster::{Cluster, RealCluster};
use knic_e2e::driver::{DriverConfig, DriverProcess};
use knic_e2e::harness::{Netns, eventually, ip, udp_echo};
use serde_json::json;

use super::{host_link, network_config};

/// The fully real path: knic-driver registered with the node's real kubelet and connected to
/// its real runtime's NRI socket; a real pod with a real claim is scheduled, the kubelet
/// prepares, the runtime calls the hook, and the interface is checked inside the pod's network
/// namespace; deleting the pod puts the device back.
pub(crate) async fn real_kubelet_and_runtime(real: RealCluster) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::resource::v1::DeviceClass;
    use kube::Api;
    use kube::api::{DeleteParams, PostParams};

    let cluster = Cluster::real(&real, "real-pod").await?;
    let peer = Netns::new("knt-peer-r")?;
    ip(&[
        "link", "add", "knt-r0", "type", "veth", "peer", "name", "knt-r1", "netns", &peer.0,
    ])?;
    struct Veth;
    impl Drop for Veth {
        fn drop(&mut self) {
            let _ = ip(&["link", "del", "knt-r0"]);
        }
    }
    let _veth = Veth;
    ip(&[
        "-n",
        &peer.0,
        "addr",
        "add",
        "192.0.2.1/24",
        "dev",
        "knt-r1",
    ])?;
    ip(&["-n", &peer.0, "link", "set", "knt-r1", "up"])?;
    let before = host_link("knt-r0")?;

    let config = DriverConfig::under(cluster.tmp.path(), &real.node, &real.kubeconfig)
        .with_env("KNIC_SYSFS_ROOT", "/")
        .with_env("KNIC_NETLINK", "true")
        .with_env("KNIC_INCLUDE", "name=knt-r0")
        .with_env("KNIC_KUBELET_ROOT_DIR", real.kubelet_dir.to_string_lossy())
        .with_env(
            "KNIC_REGISTRY_DIR",
            real.kubelet_dir.join("plugins_registry").to_string_lossy(),
        )
        .with_env(
            "KNIC_PLUGIN_DIR",
            real.kubelet_dir.join("plugins/knic.dev").to_string_lossy(),
        )
        .with_env("KNIC_NRI_SOCKET", real.nri_socket.to_string_lossy())
        // The real runtime reads CDI specs there and runs their hooks.
        .with_env("KNIC_CDI_DIR", "/var/run/cdi")
        .without_stand_in_runtime();
    let mut driver = DriverProcess::start(&config)?;

    let classes: Api<DeviceClass> = Api::all(cluster.client.clone());
    let class_name = format!("{}.knic.dev", cluster.namespace);
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": class_name},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == \"knic.dev\" && device.attributes[\"knic.dev\"].ifName == \"knt-r0\""}}]},
    }))?;
    classes.create(&PostParams::default(), &class).await?;
    let result = async {
        let claims: Api<ResourceClaim> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "nic", "namespace": cluster.namespace},
            "spec": {"devices": {
                "requests": [{"name": "nic", "exactly": {"deviceClassName": class_name}}],
                "config": [{"requests": ["nic"], "opaque": {"driver": "knic.dev", "parameters": network_config(json!({
                    "addresses": ["192.0.2.10/24"],
                }))}}],
            }},
        }))?;
        claims.create(&PostParams::default(), &claim).await?;
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "with-nic", "namespace": cluster.namespace},
            "spec": {
                "nodeName": null,
                "resourceClaims": [{"name": "net", "resourceClaimName": "nic"}],
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "net"}]}}],
                "terminationGracePeriodSeconds": 1,
            },
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        eventually("the pod is Running", Duration::from_secs(180), || async {
            let p = pods.get("with-nic").await?;
            let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
            Ok((phase == "Running").then_some(()))
        })
        .await?;
        let status = eventually("claim status", Duration::from_secs(30), || async {
            let c = claims.get("nic").await?;
            let s = serde_json::to_value(c.status)?;
            Ok(s["devices"][0]["networkData"]["interfaceName"].is_string().then_some(s))
        })
        .await?;
        ensure!(status["devices"][0]["networkData"]["ips"] == json!(["192.0.2.10/24"]), "{status}");
        // Find the pod's namespace: the one whose net1 carries the address.
        let mut found = None;
        for entry in std::fs::read_dir("/var/run/netns")? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if ip(&["-n", &name, "addr", "show", "net1"]).is_ok_and(|o| o.contains("192.0.2.10/24")) {
                found = Some(name);
            }
        }
        let netns = found.context("no pod network namespace has net1 with 192.0.2.10/24")?;
        udp_echo(&PathBuf::from(format!("/var/run/netns/{netns}")), &peer.path(), "192.0.2.1")?;
        pods.delete("with-nic", &DeleteParams::default()).await?;
        eventually("the device is back on the host", Duration::from_secs(120), || async {
            Ok((host_link("knt-r0").ok().as_deref() == Some(before.as_str())).then_some(()))
        })
        .await?;
        anyhow::Ok(())
    }
    .await;
    let _ = classes.delete(&class_name, &DeleteParams::default()).await;
    let cleanup = cluster.cleanup().await;
    let _ = driver.terminate().await;
    match result {
        Ok(()) => cleanup,
        Err(e) => anyhow::bail!("{e:#}\n--- driver log ---\n{}", driver.logs()),
    }
}
