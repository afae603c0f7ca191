//! The CNI door end to end, as Multus would use it: the test kubelet prepares a claim of a
//! Network over the DRA socket, then the real `knic-driver` binary, run as the CNI plugin
//! `knic` (argv[0]) with the CNI environment and the generated NAD's config on stdin, moves
//! the claim's device (a veth playing a NIC) into the pod's netns under `CNI_IFNAME` and
//! prints a CNI result that matches what `ip` sees; the NRI hook that runs afterwards changes
//! nothing; a pod without the claim gets the CNI error naming the missing `resourceClaims`
//! entry. Root, private namespaces (fake API); Multus itself is not installable here.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, ensure};
use knic_driver::cni::no_claim_message;
use knic_driver::nri::PodSandbox;
use knic_driver::nri::runtime::TestRuntime;
use knic_e2e::cluster::{Cluster, TestClaim};
use knic_e2e::driver::{DriverConfig, DriverProcess};
use knic_e2e::harness::{Netns, eventually, ip, isolate, trial, unisolate};
use knic_e2e::kubelet::{self, ClaimId, DraVersion};
use knic_proto::network::Network;
use knic_proto::network::nad::nad_config;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const DEV: &str = "knt-cni0";
const PEER: &str = "knt-cni1";

/// Runs the plugin binary as Multus does: `knic` from the CNI bin dir, CNI_* in the
/// environment, the network configuration on stdin. Returns (exit ok, stdout as JSON or Null).
fn plugin(
    bin: &Path,
    socket: &Path,
    env: &[(&str, String)],
    config: &str,
) -> anyhow::Result<(bool, String)> {
    let mut child = std::process::Command::new(bin)
        .env_clear()
        .env("KNIC_CNI_SOCKET", socket)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(config.as_bytes())?;
    let out = child.wait_with_output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    ))
}

fn cni_env(
    command: &str,
    netns: &Path,
    ifname: &str,
    pod: &str,
    uid: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_COMMAND", command.to_owned()),
        ("CNI_CONTAINERID", "sandbox-cni".to_owned()),
        ("CNI_NETNS", netns.to_string_lossy().into_owned()),
        ("CNI_IFNAME", ifname.to_owned()),
        (
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID=sandbox-cni;K8S_POD_UID={uid}"
            ),
        ),
        ("CNI_PATH", "/opt/cni/bin".to_owned()),
    ]
}

async fn multus_add_then_nri(root: PathBuf) -> anyhow::Result<()> {
    let cluster = Cluster::fake("cni").await?;
    cluster.ensure_node().await?;
    ip(&["link", "add", DEV, "type", "veth", "peer", "name", PEER])?;
    ip(&["link", "set", DEV, "up"])?;
    let outcome = scenario(&root, &cluster).await;
    let _ = ip(&["link", "del", DEV]);
    let cleanup = cluster.cleanup().await;
    outcome.and(cleanup)
}

async fn scenario(root: &Path, cluster: &Cluster) -> anyhow::Result<()> {
    let network = "blue";
    let spec = serde_json::from_value(json!({
        "devices": {"deviceClassName": "knic.dev"},
        "ipam": {"subnets": [{"cidr": "192.0.2.0/24", "gateway": "192.0.2.1",
                               "routes": [{"destination": "0.0.0.0/0", "gateway": "192.0.2.1"}]}]},
        "namespaces": {"names": [cluster.namespace]},
        "networkAttachmentDefinition": {},
    }))?;
    Api::<Network>::all(cluster.client.clone())
        .create(&PostParams::default(), &Network::new(network, spec))
        .await?;
    let nri_socket = cluster.tmp.path().join("nri.sock");
    let cni_socket = cluster.tmp.path().join("cni.sock");
    let mut runtime = TestRuntime::listen(&nri_socket).await?;
    let config = DriverConfig::under(cluster.tmp.path(), &cluster.node, &cluster.kubeconfig)
        .with_env("KNIC_SYSFS_ROOT", root.to_string_lossy())
        .with_env("KNIC_NETLINK", "true")
        .with_env("KNIC_INCLUDE", format!("name={DEV}"))
        .with_env("KNIC_NRI_SOCKET", nri_socket.to_string_lossy())
        .with_env("KNIC_CNI_SOCKET", cni_socket.to_string_lossy())
        .without_stand_in_runtime();
    let driver = DriverProcess::start(&config)?;
    let outcome = async {
        tokio::time::timeout(Duration::from_secs(20), runtime.accept(vec![]))
            .await
            .context("the driver never connected to the NRI runtime")??;
        let kubelet = kubelet::register(&config.registry_dir).await?;
        eventually("the CNI socket", Duration::from_secs(20), || async {
            Ok(cni_socket.exists().then_some(()))
        })
        .await?;
        let mode = std::fs::metadata(&cni_socket)?.permissions();
        use std::os::unix::fs::PermissionsExt;
        ensure!(mode.mode() & 0o777 == 0o600, "socket mode {:o}", mode.mode());
        eventually("the device published", Duration::from_secs(20), || async {
            let slices = cluster.slices().await?;
            Ok(slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .any(|d| d.name == DEV)
                .then_some(()))
        })
        .await?;
        let claim: TestClaim = cluster
            .create_claim_with_config(
                "blue",
                Some(&[("knic.dev", DEV)]),
                Some(json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                            "ipam": {"network": network}})),
            )
            .await?;
        let id = ClaimId {
            namespace: cluster.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        };
        let out = kubelet.prepare(DraVersion::V1, std::slice::from_ref(&id)).await?;
        ensure!(out[&claim.uid].error.is_empty(), "prepare: {}", out[&claim.uid].error);

        // The plugin as Multus runs it: /opt/cni/bin/knic is the driver binary.
        let bin_dir = cluster.tmp.path().join("cni-bin");
        std::fs::create_dir_all(&bin_dir)?;
        // Installed as the chart's init container does it.
        let installed = std::process::Command::new(knic_e2e::driver::binary()?)
            .args(["install-cni", "--dir"])
            .arg(&bin_dir)
            .output()?;
        ensure!(installed.status.success(), "install-cni: {}", String::from_utf8_lossy(&installed.stderr));
        let bin = bin_dir.join("knic");
        ensure!(std::fs::metadata(&bin)?.permissions().mode() & 0o777 == 0o755, "plugin mode");
        let pod_ns = Netns::new("knt-cni-pod")?;
        let config = nad_config(network);

        // A pod without the claim: code 11 and the entry to add.
        let (ok, out) = plugin(&bin, &cni_socket, &cni_env("ADD", &pod_ns.path(), "net1", "other", "no-such-uid"), &config)?;
        ensure!(!ok, "ADD of a pod without the claim succeeded: {out}");
        let err: Value = serde_json::from_str(&out).context(out.clone())?;
        assert_eq!(
            err,
            json!({"cniVersion": "1.0.0", "code": 11, "msg": no_claim_message("team-a/other", network),
                   "details": "the kubelet prepares a pod's claims before its sandbox starts"})
        );
        // The wrong interface name: refused before anything moves.
        let (ok, out) = plugin(&bin, &cni_socket, &cni_env("ADD", &pod_ns.path(), "eth1", "app-1", &claim.pod_uid), &config)?;
        ensure!(!ok && out.contains("\"code\":100") && out.contains("the runtime asked for \\\"eth1\\\""), "{out}");
        ensure!(ip(&["link", "show", DEV]).is_ok(), "the device left the host on a refusal");

        let (ok, out) = plugin(&bin, &cni_socket, &cni_env("ADD", &pod_ns.path(), "net1", "app-1", &claim.pod_uid), &config)?;
        ensure!(ok, "ADD failed: {out}\n{}", driver.logs());
        let result: Value = serde_json::from_str(&out).context(out.clone())?;
        let seen = ip(&["-n", &pod_ns.0, "-j", "addr", "show", "net1"])?;
        let seen: Value = serde_json::from_str(&seen)?;
        let link = &seen[0];
        let v4 = link["addr_info"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["family"] == "inet")
            .context("no IPv4 address on net1")?;
        let address = format!("{}/{}", v4["local"].as_str().unwrap_or_default(), v4["prefixlen"]);
        assert_eq!(
            result,
            json!({"cniVersion": "1.0.0",
                   "interfaces": [{"name": "net1", "mac": link["address"], "sandbox": pod_ns.path()}],
                   "ips": [{"interface": 0, "address": address, "gateway": "192.0.2.1"}],
                   "routes": [{"dst": "0.0.0.0/0", "gw": "192.0.2.1"}], "dns": {}})
        );
        let routes = ip(&["-n", &pod_ns.0, "route", "show", "default"])?;
        ensure!(routes.contains("default via 192.0.2.1 dev net1"), "{routes}");
        ensure!(address.starts_with("192.0.2."), "{address}");
        ensure!(ip(&["link", "show", DEV]).is_err(), "the device is still on the host");
        let before = ip(&["-n", &pod_ns.0, "-d", "addr", "show", "net1"])?;

        // CHECK: present. The second ADD (a retried sandbox set-up) is idempotent.
        let (ok, out) = plugin(&bin, &cni_socket, &cni_env("CHECK", &pod_ns.path(), "net1", "app-1", &claim.pod_uid), &config)?;
        ensure!(ok && out.is_empty(), "CHECK: {out}");

        // The runtime's NRI hook after the sandbox set-up: nothing changes.
        let pod = PodSandbox {
            id: "sandbox-cni".into(),
            name: "app-1".into(),
            uid: claim.pod_uid.clone(),
            namespace: cluster.namespace.clone(),
            netns: Some(pod_ns.path()),
            ips: vec!["10.244.0.5".into()],
        };
        runtime.run_pod_sandbox(&pod).await.map_err(anyhow::Error::msg)?;
        let after = ip(&["-n", &pod_ns.0, "-d", "addr", "show", "net1"])?;
        assert_eq!(before, after, "the NRI hook changed the interface");

        // DEL is a success; the interface leaves with the sandbox's NRI stop.
        let (ok, out) = plugin(&bin, &cni_socket, &cni_env("DEL", &pod_ns.path(), "net1", "app-1", &claim.pod_uid), &config)?;
        ensure!(ok && out.is_empty(), "DEL: {out}");
        runtime.stop_pod_sandbox(&pod).await.map_err(anyhow::Error::msg)?;
        eventually("the device is back on the host", Duration::from_secs(10), || async {
            Ok(ip(&["link", "show", DEV]).is_ok().then_some(()))
        })
        .await?;
        let out = kubelet.unprepare(DraVersion::V1, &[id]).await?;
        ensure!(out.values().all(String::is_empty), "unprepare: {out:?}");
        Ok(())
    }
    .await;
    match outcome {
        Ok(()) => Ok(()),
        Err(e) => anyhow::bail!("{e:#}\n--- driver log ---\n{}", driver.logs()),
    }
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let isolated = isolate();
    if let Err(reason) = &isolated {
        eprintln!("skipped: CNI e2e: {reason}");
    }
    let root = isolated.clone().unwrap_or_default();
    let trials = vec![trial(
        "fake/multus_add_then_nri_changes_nothing".into(),
        isolated.is_err(),
        move || multus_add_then_nri(root),
    )];
    let conclusion = libtest_mimic::run(&args, trials);
    if let Ok(root) = &isolated {
        unisolate(root);
    }
    conclusion.exit();
}
