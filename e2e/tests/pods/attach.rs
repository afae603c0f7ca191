//! Pods attach and detach through the NRI hooks: two pods with their interfaces configured,
//! traffic through them and the claims' status written, then the node restored; an attach the
//! pod refuses fails the sandbox and puts the device back.

use std::time::Duration;

use anyhow::{Context, ensure};
use knic_e2e::harness::{Netns, eventually, ip, udp_echo};
use knic_e2e::kubelet::DraVersion;
use serde_json::json;

use super::{Env, host_link, network_config};

pub(crate) async fn two_pods(env: &mut Env) -> anyhow::Result<()> {
    let before = (host_link(&env.dev(0))?, host_link(&env.dev(2))?);
    let a = env
        .cluster
        .create_claim_with_config(
            "claim-a",
            Some(&[("knic.dev", &env.dev(0))]),
            Some(network_config(json!({
                "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
                "routes": [{"destination": "203.0.113.0/24", "gateway": "192.0.2.1"}],
                "sysctls": {"ipv4.arp_ignore": "1"},
            }))),
        )
        .await?;
    let b = env
        .cluster
        .create_claim_with_config(
            "claim-b",
            Some(&[("knic.dev", &env.dev(2))]),
            Some(network_config(json!({
                "interface": {"name": "data0", "mtu": 1400, "hardwareAddress": "02:00:00:00:00:b0"},
                "addresses": ["198.51.100.10/24"],
            }))),
        )
        .await?;
    for claim in [&a, &b] {
        let out = env.plugin.prepare(DraVersion::V1, &[env.id(claim)]).await?;
        ensure!(
            out[&claim.uid].error.is_empty(),
            "prepare {}: {}",
            claim.name,
            out[&claim.uid].error
        );
    }
    let (ns_a, ns_b) = (
        Netns::new(&format!("knt-pa-{}", env.tag))?,
        Netns::new(&format!("knt-pb-{}", env.tag))?,
    );
    env.runtime
        .run_pod_sandbox(&env.pod(&a, Some(&ns_a)))
        .await
        .map_err(anyhow::Error::msg)?;
    env.runtime
        .run_pod_sandbox(&env.pod(&b, Some(&ns_b)))
        .await
        .map_err(anyhow::Error::msg)?;

    // Inside the pods, before any container would start.
    let net1 = ip(&["-n", &ns_a.0, "addr", "show", "net1"])?;
    ensure!(
        net1.contains("inet 192.0.2.10/24")
            && net1.contains("inet6 2001:db8::10/64")
            && net1.contains("UP"),
        "{net1}"
    );
    let routes = ip(&["-n", &ns_a.0, "route", "show", "203.0.113.0/24"])?;
    ensure!(routes.contains("via 192.0.2.1 dev net1"), "{routes}");
    udp_echo(&ns_a.path(), &env.peer.path(), "192.0.2.1").context("traffic through net1")?;
    let data0 = ip(&["-n", &ns_b.0, "link", "show", "data0"])?;
    ensure!(
        data0.contains("mtu 1400") && data0.contains("02:00:00:00:00:b0"),
        "{data0}"
    );
    udp_echo(&ns_b.path(), &env.peer.path(), "198.51.100.1").context("traffic through data0")?;
    ensure!(
        ip(&["link", "show", &env.dev(0)]).is_err(),
        "the device left the host"
    );

    // Status written by server-side apply, field manager knic.dev.
    let status = eventually("claim-a status", Duration::from_secs(10), || async {
        let s = env.claim_status("claim-a").await?;
        Ok(s["devices"][0]["networkData"]["interfaceName"]
            .is_string()
            .then_some(s))
    })
    .await?;
    let entry = &status["devices"][0];
    ensure!(
        entry["driver"] == "knic.dev"
            && entry["device"] == json!(env.dev(0))
            && entry["pool"] == json!(env.cluster.node),
        "{entry}"
    );
    ensure!(entry["networkData"]["interfaceName"] == "net1", "{entry}");
    ensure!(
        entry["networkData"]["ips"] == json!(["192.0.2.10/24", "2001:db8::10/64"]),
        "{entry}"
    );
    ensure!(
        entry["networkData"]["hardwareAddress"]
            .as_str()
            .is_some_and(|m| m.len() == 17),
        "{entry}"
    );
    let ready = &entry["conditions"][0];
    ensure!(
        ready["type"] == "Ready"
            && ready["status"] == "True"
            && ready["reason"] == "InterfaceConfigured",
        "{ready}"
    );
    ensure!(ready["lastTransitionTime"].is_string());
    let requests = env.cluster.fake.as_ref().map(|f| f.requests());
    ensure!(
        requests.is_none_or(|log| log.iter().any(|r| r.method == "PATCH"
            && r.path.ends_with("/resourceclaims/claim-a/status")
            && r.field_manager.as_deref() == Some("knic.dev"))),
        "no server-side apply by knic.dev"
    );
    let status_b = eventually("claim-b status", Duration::from_secs(10), || async {
        let s = env.claim_status("claim-b").await?;
        Ok(s["devices"][0]["networkData"]["interfaceName"]
            .is_string()
            .then_some(s))
    })
    .await?;
    ensure!(
        status_b["devices"][0]["networkData"]["hardwareAddress"] == "02:00:00:00:00:b0",
        "{status_b}"
    );

    // Pods go away: stop, remove, unprepare; the node is exactly as before.
    for (claim, ns) in [(&a, &ns_a), (&b, &ns_b)] {
        env.runtime
            .stop_pod_sandbox(&env.pod(claim, Some(ns)))
            .await
            .map_err(anyhow::Error::msg)?;
        env.runtime
            .remove_pod_sandbox(&env.pod(claim, None))
            .await
            .map_err(anyhow::Error::msg)?;
        let out = env
            .plugin
            .unprepare(DraVersion::V1, &[env.id(claim)])
            .await?;
        ensure!(out[&claim.uid].is_empty(), "unprepare: {}", out[&claim.uid]);
    }
    ensure!(
        (host_link(&env.dev(0))?, host_link(&env.dev(2))?) == before,
        "host links differ after detach"
    );
    ensure!(
        ip(&["-n", &ns_a.0, "link", "show", "net1"]).is_err(),
        "net1 left in the pod"
    );
    let checkpoint = std::fs::read_to_string(env.config.plugin_dir.join("checkpoint.json"))?;
    ensure!(
        checkpoint.contains("\"claims\":{}"),
        "checkpoint not empty: {checkpoint}"
    );
    Ok(())
}

pub(crate) async fn failed_attach_fails_the_sandbox(env: &mut Env) -> anyhow::Result<()> {
    let before = host_link(&env.dev(0))?;
    // `lo` exists in every pod: the clash is only visible at attach time.
    let c = env
        .cluster
        .create_claim_with_config(
            "clash",
            Some(&[("knic.dev", &env.dev(0))]),
            Some(network_config(json!({
                "interface": {"name": "lo"}, "addresses": ["192.0.2.20/24"],
            }))),
        )
        .await?;
    let out = env
        .plugin
        .prepare(DraVersion::V1beta1, &[env.id(&c)])
        .await?;
    ensure!(out[&c.uid].error.is_empty(), "{}", out[&c.uid].error);
    let ns = Netns::new(&format!("knt-pc-{}", env.tag))?;
    let err = env
        .runtime
        .run_pod_sandbox(&env.pod(&c, Some(&ns)))
        .await
        .err()
        .context("attach must fail")?
        .to_string();
    ensure!(
        err.contains("interface lo already exists in the pod"),
        "{err}"
    );
    ensure!(
        host_link(&env.dev(0))? == before,
        "the device must be back on the host unchanged"
    );
    let status = eventually("Ready=False", Duration::from_secs(10), || async {
        let s = env.claim_status("clash").await?;
        Ok((s["devices"][0]["conditions"][0]["status"] == "False").then_some(s))
    })
    .await?;
    ensure!(
        status["devices"][0]["conditions"][0]["reason"] == "AttachFailed",
        "{status}"
    );
    // The kubelet gives up on the pod: unprepare leaves nothing behind.
    let out = env
        .plugin
        .unprepare(DraVersion::V1beta1, &[env.id(&c)])
        .await?;
    ensure!(out[&c.uid].is_empty());
    Ok(())
}
