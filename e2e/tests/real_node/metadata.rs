//! KEP-5304 device metadata on the real runtime: containerd applies knic's CDI mount, and the
//! app container reads, at the path the KEP fixes, a `DeviceMetadata` object naming its device
//! and the interface as configured in its namespace; read-only; gone after unprepare.
//!
//! Two pods: one with a ResourceClaim by name (`resourceclaims/<claim>/…`), one whose claim
//! the real resourceclaim controller generates from a template (`resourceclaimtemplates/
//! <pod's claim name>/…`, from the annotation Kubernetes puts on the generated claim).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use knic_e2e::cluster::RealCluster;
use knic_e2e::harness::unpanicked;
use knic_e2e::real_node::{PodClaim, RealNode, processes_with, wait_for};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const PEER: &str = "10.236.0.1/24";
const DIRECT: &str = "10.236.0.10/24";
const TEMPLATED: &str = "10.236.0.11/24";
const ROOT: &str = "var/run/kubernetes.io/dra-device-attributes";

pub(crate) async fn device_metadata_in_the_container(real: RealCluster) -> anyhow::Result<()> {
    let mut node = RealNode::start(&real, "real-device-metadata", "dm", &[PEER, PEER], &[]).await?;
    let outcome = unpanicked(scenario(&mut node)).await;
    node.finish(outcome).await
}

/// The app container's view of `path` (below its root), through `/proc/<pid>/root`.
fn in_container(node: &RealNode, pod: &str, path: &str) -> anyhow::Result<PathBuf> {
    let (pid, _) = processes_with(&node.marker(pod))
        .into_iter()
        .next()
        .with_context(|| format!("no process of pod {pod}'s app container"))?;
    Ok(PathBuf::from(format!("/proc/{pid}/root/{path}")))
}

/// The MAC of `dev` in the namespace of pod `pod`'s app container.
fn mac_in(node: &RealNode, pod: &str, dev: &str) -> anyhow::Result<String> {
    let (_, netns) = processes_with(&node.marker(pod))
        .into_iter()
        .next()
        .with_context(|| format!("no process of pod {pod}'s app container"))?;
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["ip", "-j", "link", "show", "dev", dev])
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let links: Value = serde_json::from_slice(&out.stdout)?;
    links[0]["address"]
        .as_str()
        .map(str::to_owned)
        .context("no address")
}

/// Reads and checks the file the container sees; returns the device entry.
fn check_file(
    node: &RealNode,
    pod: &str,
    file: &str,
    claim: &str,
    pod_claim_name: Option<&str>,
    nic: &str,
    address: &str,
) -> anyhow::Result<Value> {
    let path = in_container(node, pod, &format!("{ROOT}/{file}"))?;
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let doc: Value = serde_json::from_slice(&bytes)?;
    println!(
        "pod {pod} reads /{ROOT}/{file}:\n{}",
        String::from_utf8_lossy(&bytes)
    );
    ensure!(
        doc["apiVersion"] == "metadata.resource.k8s.io/v1alpha1",
        "{doc}"
    );
    ensure!(doc["kind"] == "DeviceMetadata", "{doc}");
    ensure!(doc["metadata"]["name"] == claim, "{doc}");
    ensure!(
        doc["metadata"]["namespace"] == node.cluster.namespace.as_str(),
        "{doc}"
    );
    ensure!(doc["metadata"]["generation"].as_i64() >= Some(1), "{doc}");
    ensure!(
        doc.get("podClaimName").and_then(Value::as_str) == pod_claim_name,
        "{doc}"
    );
    ensure!(doc["requests"][0]["name"] == "nic", "{doc}");
    let devices = doc["requests"][0]["devices"]
        .as_array()
        .context("devices")?;
    ensure!(devices.len() == 1, "{doc}");
    let d = &devices[0];
    ensure!(
        d["driver"] == "knic.dev" && d["pool"] == node.real.node.as_str(),
        "{d}"
    );
    ensure!(
        d["name"] == nic && d["attributes"]["ifName"] == json!({"string": nic}),
        "{d}"
    );
    let mac = mac_in(node, pod, "net1")?;
    ensure!(
        d["networkData"]
            == json!({"interfaceName": "net1", "ips": [address], "hardwareAddress": mac}),
        "networkData is not what `ip` shows in the pod (net1, {address}, {mac}): {d}"
    );
    // Read-only for the container (a write through its mount namespace hits the ro bind).
    match std::fs::OpenOptions::new().write(true).open(&path) {
        Err(e) if e.raw_os_error() == Some(nix::libc::EROFS) => {}
        other => bail!("the metadata file is writable in the container: {other:?}"),
    }
    Ok(d.clone())
}

async fn scenario(node: &mut RealNode) -> anyhow::Result<()> {
    let nics: Vec<String> = node.nics.iter().map(|n| n.name.clone()).collect();
    let class = node
        .device_class("nic", &[nics[0].as_str(), nics[1].as_str()])
        .await?;
    node.claim("nic", &class, json!({"addresses": [DIRECT]}))
        .await?;
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "nic-template", "namespace": node.cluster.namespace},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "nic", "exactly": {"deviceClassName": class}}],
            "config": [{"requests": ["nic"], "opaque": {"driver": "knic.dev", "parameters": {
                "apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                "addresses": [TEMPLATED]}}}],
        }}},
    }))?;
    Api::<ResourceClaimTemplate>::namespaced(node.cluster.client.clone(), &node.cluster.namespace)
        .create(&PostParams::default(), &template)
        .await?;
    node.create_pod("direct", &PodClaim::Claim("nic".into()))
        .await?;
    node.create_pod("templated", &PodClaim::Template("nic-template".into()))
        .await?;
    node.running("direct", Duration::from_secs(120)).await?;
    node.running("templated", Duration::from_secs(120)).await?;
    // Which NIC each pod got is the scheduler's pick: the file must name the one it got.
    let generated = node.claim_of("templated").await?;
    let pick = |pod: &str, file: &str, claim: &str, pcn: Option<&str>, address: &str| {
        let mut last = None;
        for n in &nics {
            match check_file(node, pod, file, claim, pcn, n, address) {
                Ok(d) => return Ok(d),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no NIC")))
    };
    let direct = pick(
        "direct",
        "resourceclaims/nic/nic/knic.dev-metadata.json",
        "nic",
        None,
        DIRECT,
    )?;
    let templated = pick(
        "templated",
        "resourceclaimtemplates/net/nic/knic.dev-metadata.json",
        &generated,
        Some("net"),
        TEMPLATED,
    )?;
    ensure!(direct["name"] != templated["name"], "{direct} {templated}");
    node.mark("both containers read their device metadata");
    // Unprepared with the pods: the files go with the claims.
    let meta = node.config.plugin_dir.join("metadata");
    let uids: Vec<String> = std::fs::read_dir(&meta)
        .with_context(|| format!("listing {}", meta.display()))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    ensure!(uids.len() >= 2, "{uids:?}");
    node.delete_pods().await?;
    wait_for(
        "metadata files removed",
        Duration::from_secs(60),
        || async {
            Ok(uids
                .iter()
                .all(|u| !Path::new(&meta).join(u).exists())
                .then_some(()))
        },
    )
    .await?;
    Ok(())
}
