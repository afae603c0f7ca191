//! The pod's part of the twin: a claim for the veth, a pod that gets the interface, a driver
//! restart with the claim prepared, the device back on the host when the pod goes.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use knic_e2e::harness::{eventually, ip, udp_echo};
use kube::Api;
use kube::api::{DeleteParams, LogParams, PostParams};
use serde_json::{Value, json};

use super::{
    HOST_LINK, PEER_ADDR, PEER_NS, POD_ADDR, POD_IF, POD_MTU, Run, WAIT, node, registered, running,
};

/// A claim for the veth with `addresses`, the interface named `data0` with MTU 1400.
pub fn claim(name: &str, addresses: Value) -> anyhow::Result<ResourceClaim> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {
            "requests": [{"name": "nic", "exactly": {
                "deviceClassName": "knic.dev",
                "selectors": [{"cel": {"expression":
                    format!("device.attributes[\"knic.dev\"].ifName == \"{HOST_LINK}\"")}}],
            }}],
            "config": [{"requests": ["nic"], "opaque": {"driver": "knic.dev", "parameters": {
                "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                "interface": {"name": POD_IF, "mtu": POD_MTU},
                "addresses": addresses,
            }}}],
        }},
    }))?)
}

/// A pod with the claim gets the interface; deleting it puts the device back as it was.
pub async fn pod_gets_its_interface(run: &Run) -> anyhow::Result<()> {
    let host_before = node::link_state(HOST_LINK)?;
    let ns = run.ns().to_owned();
    let claims: Api<ResourceClaim> = Api::namespaced(run.cluster.client.clone(), &ns);
    let created = claims
        .create(&PostParams::default(), &claim("nic", json!([POD_ADDR]))?)
        .await?;
    let uid = created.metadata.uid.context("claim without uid")?;
    let pods: Api<Pod> = Api::namespaced(run.cluster.client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "with-nic"},
        "spec": {
            "resourceClaims": [{"name": "net", "resourceClaimName": "nic"}],
            "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "net"}]}}],
            "terminationGracePeriodSeconds": 1,
        },
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    eventually("the pod is Running", WAIT, || async {
        let phase = pods.get("with-nic").await?.status.and_then(|s| s.phase);
        Ok((phase.as_deref() == Some("Running")).then_some(()))
    })
    .await?;
    let status = eventually(
        "the claim's device status",
        Duration::from_secs(30),
        || async {
            let s = serde_json::to_value(claims.get("nic").await?.status)?;
            Ok(s["devices"][0]["networkData"]["interfaceName"]
                .is_string()
                .then_some(s))
        },
    )
    .await?;
    let data = &status["devices"][0]["networkData"];
    ensure!(
        data["interfaceName"] == POD_IF && data["ips"] == json!([POD_ADDR]),
        "claim status: {status}"
    );
    // The fail-closed hook's spec is there while the claim is prepared.
    let spec = Path::new(node::CDI_DIRS[0]).join(format!("knic.dev-{uid}.json"));
    ensure!(
        spec.is_file(),
        "no CDI spec {} for the prepared claim",
        spec.display()
    );
    ensure!(
        ip(&["-o", "link", "show", HOST_LINK]).is_err(),
        "{HOST_LINK} is still on the host"
    );
    let netns = pod_netns()?;
    let link = ip(&["-n", &netns, "-o", "link", "show", POD_IF])?;
    ensure!(
        link.contains(&format!("mtu {POD_MTU} ")) && (link.contains(",UP") || link.contains("<UP")),
        "in the pod: {link}"
    );
    let echo = || {
        udp_echo(
            &Path::new("/var/run/netns").join(&netns),
            &Path::new("/var/run/netns").join(PEER_NS),
            PEER_ADDR,
        )
        .context("UDP echo from the pod to the veth's peer")
    };
    echo()?;
    restart_keeps_the_claim(run, &uid, &spec).await?;
    echo().context("after the driver's restart")?;
    pods.delete("with-nic", &DeleteParams::default()).await?;
    eventually("the pod is gone", WAIT, || async {
        Ok(pods.get_opt("with-nic").await?.is_none().then_some(()))
    })
    .await?;
    eventually("the device is back on the host as it was", WAIT, || async {
        Ok(
            (node::link_state(HOST_LINK).ok().as_deref() == Some(host_before.as_str()))
                .then_some(()),
        )
    })
    .await?;
    eventually("the claim's CDI spec is removed", WAIT, || async {
        Ok((!spec.exists()).then_some(()))
    })
    .await?;
    claims.delete("nic", &DeleteParams::default()).await?;
    Ok(())
}

/// The log of pod `name`'s driver container, followed until the container exits.
pub fn follow_log(run: &Run, name: &str) -> tokio::task::JoinHandle<kube::Result<String>> {
    let pods: Api<Pod> = Api::namespaced(run.cluster.client.clone(), run.ns());
    let name = name.to_owned();
    tokio::spawn(async move {
        pods.logs(
            &name,
            &LogParams {
                follow: true,
                container: Some("driver".into()),
                ..LogParams::default()
            },
        )
        .await
    })
}

/// The followed log, once its container exited.
pub async fn ended(
    follow: tokio::task::JoinHandle<kube::Result<String>>,
) -> anyhow::Result<String> {
    Ok(tokio::time::timeout(WAIT, follow)
        .await
        .context("the driver's log did not end with its container")???)
}

/// What an upgrade or a rollout does to the driver, while a pod's claim is prepared: its pod
/// is deleted and the DaemonSet starts another. The stopping driver keeps the checkpoint, the
/// claim's CDI spec and the hook for the next one, which finds the claim.
async fn restart_keeps_the_claim(run: &Run, uid: &str, spec: &Path) -> anyhow::Result<()> {
    let old = running(run).await?;
    let follow = follow_log(run, &old);
    let pods: Api<Pod> = Api::namespaced(run.cluster.client.clone(), run.ns());
    pods.delete(&old, &DeleteParams::default()).await?;
    let log = ended(follow).await?;
    ensure!(
        log.contains(
            "claims are still prepared: the checkpoint, their CDI specs and the CDI hook stay"
        ),
        "the driver stopped with a claim prepared did not keep it; its last lines:\n{}",
        tail(&log, 15)
    );
    let new = eventually("the DaemonSet's next driver is Ready", WAIT, || async {
        Ok(running(run).await.ok().filter(|name| *name != old))
    })
    .await?;
    registered(run).await?;
    let checkpoint = std::fs::read_to_string(
        run.real
            .kubelet_dir
            .join("plugins/knic.dev/checkpoint.json"),
    )
    .context("the checkpoint did not survive the restart")?;
    ensure!(
        checkpoint.contains(uid),
        "the checkpoint lost the claim: {checkpoint}"
    );
    ensure!(
        spec.is_file(),
        "the claim's CDI spec did not survive the restart"
    );
    println!("helm_install: driver {old} replaced by {new} with the claim prepared: kept");
    Ok(())
}

/// The pod's network namespace: the one whose `data0` has the claim's address.
fn pod_netns() -> anyhow::Result<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/var/run/netns")? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if ip(&["-n", &name, "-o", "addr", "show", "dev", POD_IF])
            .is_ok_and(|o| o.contains(&format!("inet {POD_ADDR} ")))
        {
            found.push(name);
        }
    }
    let [netns] = found.as_slice() else {
        bail!(
            "{} network namespaces have {POD_IF} with {POD_ADDR}: {found:?}",
            found.len()
        );
    };
    Ok(netns.clone())
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
