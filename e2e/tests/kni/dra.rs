//! The KNI socket of `knic-driver run` (the in-process fake API, a test kubelet and the NRI
//! test runtime): QueryNodeNetworks following the driver's real state (kubelet registration,
//! the NRI connection, a device going away) and a DRA-attached pod seen through
//! QueryPodNetwork, all through the client generated from the upstream .proto.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::DeviceClass;
use knic_driver::nri::PodSandbox;
use knic_driver::nri::runtime::TestRuntime;
use knic_e2e::cluster::Cluster;
use knic_e2e::driver::{DriverConfig, DriverProcess};
use knic_e2e::harness::{Netns, eventually, ip};
use knic_e2e::kni::KniClient;
use knic_e2e::kubelet::{self, ClaimId, DraVersion};
use knic_proto::network::Network;
use knic_proto::network::readiness::NodeNetworks;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// The reasons of QueryNodeNetworks (node-level) and of network `blue`, and whether it is ready.
async fn blue(kni: &mut KniClient) -> anyhow::Result<(String, bool, String)> {
    let answer = kni.ok("QueryNodeNetworks", json!({})).await?;
    let node = answer["extradata"]["reasons"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let blue = answer["networks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["name"] == "blue")
        .cloned()
        .unwrap_or(Value::Null);
    Ok((
        node,
        blue["ready"] == true,
        blue["extradata"]["reasons"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    ))
}

/// This node's NodeNetworks object until `want` holds for it (20 s).
async fn object_until(
    cluster: &Cluster,
    what: &str,
    want: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let api: Api<NodeNetworks> = Api::all(cluster.client.clone());
    let mut last = Value::Null;
    for _ in 0..200 {
        if let Some(object) = api.get_opt(&cluster.node).await? {
            last = serde_json::to_value(&object)?;
            if want(&last) {
                return Ok(last);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!(
        "NodeNetworks {}: {what} not within 20 s; last {last}",
        cluster.node
    )
}

/// Asks until `want` holds for [`blue`]'s answer (20 s), or fails with `what` and the last one.
async fn until(
    kni: &mut KniClient,
    what: &str,
    want: impl Fn(&str, bool, &str) -> bool,
) -> anyhow::Result<()> {
    let mut last = (String::new(), false, String::new());
    for _ in 0..200 {
        last = blue(kni).await?;
        if want(&last.0, last.1, &last.2) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("{what}: not within 20 s; last answer {last:?}")
}

pub(crate) async fn dra_pod_and_node_readiness(root: PathBuf) -> anyhow::Result<()> {
    let cluster = Cluster::fake("kni-dra").await?;
    cluster.ensure_node().await?;
    let peer = Netns::new("knt-dpeer")?;
    ip(&[
        "link", "add", "knt-d0", "type", "veth", "peer", "name", "knt-d1", "netns", &peer.0,
    ])?;
    ip(&["link", "set", "knt-d0", "up"])?;
    ip(&[
        "-n",
        &peer.0,
        "addr",
        "add",
        "192.0.2.1/24",
        "dev",
        "knt-d1",
    ])?;
    ip(&["-n", &peer.0, "link", "set", "knt-d1", "up"])?;
    let classes: Api<DeviceClass> = Api::all(cluster.client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": "knic.dev"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == \"knic.dev\""}}]},
            }))?,
        )
        .await?;
    let networks: Api<Network> = Api::all(cluster.client.clone());
    networks
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
                "metadata": {"name": "blue"},
                "spec": {"devices": {"deviceClassName": "knic.dev",
                            "selectors": ["device.attributes[\"knic.dev\"].ifName == \"knt-d0\""]},
                         "ipam": {"static": {}},
                         "namespaces": {"names": [cluster.namespace.clone()]}},
            }))?,
        )
        .await?;
    let nri_socket = cluster.tmp.path().join("nri.sock");
    let mut runtime = TestRuntime::listen(&nri_socket).await?;
    let config = DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig)
        .with_env("KNIC_SYSFS_ROOT", root.to_string_lossy())
        .with_env("KNIC_NETLINK", "true")
        .with_env("KNIC_INCLUDE", "name=knt-d0")
        .with_env("KNIC_NRI_SOCKET", nri_socket.to_string_lossy())
        .with_env("KNIC_RESCAN_SECONDS", "1")
        .with_env("KNIC_NODE_NETWORKS", "true")
        .without_stand_in_runtime();
    let socket = PathBuf::from(config.env_value("KNIC_KNI_SOCKET").context("KNI socket")?);
    let driver = DriverProcess::start(&config)?;
    let outcome = async {
        eventually("the KNI socket", Duration::from_secs(20), || async {
            Ok(socket.exists().then_some(()))
        })
        .await?;
        let mut kni = KniClient::connect(&socket).await?;

        // Neither registered with the kubelet nor connected to the runtime: not ready, and
        // the reasons say so, at the node and on the network.
        let (node, ready, reasons) = blue(&mut kni).await?;
        ensure!(!ready, "ready before registration: {reasons}");
        for missing in [
            "kubelet registration not acknowledged",
            "NRI plugin not connected",
        ] {
            ensure!(
                node.contains(missing) && reasons.contains(missing),
                "{node} / {reasons}"
            );
        }
        let setup = kni.refused("SetupNodeNetwork", json!({})).await?;
        ensure!(
            setup.code == "FAILED_PRECONDITION"
                && setup
                    .details
                    .starts_with(&format!("node {} lacks what knic needs: ", cluster.node))
                && setup
                    .details
                    .contains("kubelet registration not acknowledged"),
            "{setup}"
        );

        tokio::time::timeout(Duration::from_secs(20), runtime.accept(vec![]))
            .await
            .context("the driver never connected to the NRI runtime")??;
        let plugin = kubelet::register(&config.registry_dir).await?;
        until(&mut kni, "blue ready", |node, ready, reasons| {
            ready && node.is_empty() && reasons.is_empty()
        })
        .await?;
        kni.ok("SetupNodeNetwork", json!({})).await?;
        // The same facts in the API, on this node's NodeNetworks object.
        let object = object_until(&cluster, "ready with blue", |o| {
            o["status"]["ready"] == true
                && o["status"]["networks"][0]["name"] == "blue"
                && o["status"]["networks"][0]["ready"] == true
        })
        .await?;
        ensure!(
            object["spec"]["nodeName"] == cluster.node
                && object["status"]["networksSummary"] == "1/1"
                && object["status"]["readyNetworks"] == "blue"
                && object["metadata"]["ownerReferences"][0]["kind"] == "Node",
            "{object}"
        );

        // A pod gets knt-d0 through DRA; the KNI socket shows its interface.
        let claim = cluster
            .create_claim_with_config(
                "claim-k",
                Some(&[("knic.dev", "knt-d0")]),
                Some(
                    json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                            "addresses": ["192.0.2.10/24"]}),
                ),
            )
            .await?;
        let id = ClaimId {
            namespace: cluster.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        };
        let prepared = plugin
            .prepare(DraVersion::V1, std::slice::from_ref(&id))
            .await?;
        ensure!(
            prepared[&claim.uid].error.is_empty(),
            "{}",
            prepared[&claim.uid].error
        );
        let pod_ns = Netns::new("knt-dpod")?;
        let pod = PodSandbox {
            id: "sandbox-k".into(),
            name: "claim-k-pod".into(),
            uid: claim.pod_uid.clone(),
            namespace: cluster.namespace.clone(),
            netns: Some(pod_ns.path()),
            ips: vec![],
        };
        runtime
            .run_pod_sandbox(&pod)
            .await
            .map_err(anyhow::Error::msg)?;
        for who in [
            json!({"name": "claim-k-pod", "namespace": cluster.namespace}),
            json!({"id": claim.pod_uid}),
        ] {
            let answer = kni.ok("QueryPodNetwork", who.clone()).await?;
            let net1 = &answer["ipconfigs"]["net1"];
            ensure!(net1["ip"] == json!(["192.0.2.10/24"]), "{who}: {answer}");
            ensure!(
                net1["mac"].as_str().is_some_and(|m| m.len() == 17),
                "{answer}"
            );
            ensure!(
                net1["extradata"]["claim"] == format!("{}/claim-k", cluster.namespace)
                    && net1["extradata"]["present"] == "true",
                "{answer}"
            );
        }
        // The device is in use: the network is not ready for another pod, and says by whom.
        let (_, ready, reasons) = blue(&mut kni).await?;
        ensure!(!ready, "ready with its only device in a pod");
        ensure!(
            reasons.contains(&format!(
                "(in use: knt-d0 by {}/claim-k)",
                cluster.namespace
            )),
            "{reasons}"
        );
        runtime
            .stop_pod_sandbox(&pod)
            .await
            .map_err(anyhow::Error::msg)?;
        runtime
            .remove_pod_sandbox(&pod)
            .await
            .map_err(anyhow::Error::msg)?;
        let unprepared = plugin.unprepare(DraVersion::V1, &[id]).await?;
        ensure!(
            unprepared[&claim.uid].is_empty(),
            "{}",
            unprepared[&claim.uid]
        );
        until(&mut kni, "blue ready again", |_, ready, _| ready).await?;

        // The runtime goes away: not ready, as /readyz says, here and in the API.
        runtime.shutdown().await;
        until(&mut kni, "NRI down seen", |node, ready, _| {
            !ready && node.contains("NRI plugin not connected")
        })
        .await?;
        object_until(&cluster, "not ready without NRI", |o| {
            o["status"]["ready"] == false
                && o["status"]["reasons"][0] == "NRI plugin not connected to the container runtime"
                && o["status"]["networksSummary"] == "0/1"
        })
        .await?;
        tokio::time::timeout(Duration::from_secs(20), runtime.accept(vec![]))
            .await
            .context("the driver never reconnected")??;
        until(&mut kni, "NRI back", |_, ready, _| ready).await?;

        // The device goes away: no matching device is offered.
        ip(&["link", "del", "knt-d0"])?;
        until(&mut kni, "device gone seen", |_, ready, reasons| {
            !ready && reasons.starts_with("no device offered on this node matches spec.devices")
        })
        .await?;
        object_until(&cluster, "blue without a device", |o| {
            o["status"]["ready"] == true
                && o["status"]["networks"][0]["reasons"][0]
                    .as_str()
                    .is_some_and(|r| r.starts_with("no device offered on this node matches"))
        })
        .await?;
        drop(plugin);
        Ok(())
    }
    .await;
    let logs = driver.logs();
    drop(driver);
    let _ = ip(&["link", "del", "knt-d0"]);
    outcome.with_context(|| format!("driver log:\n{logs}"))
}
