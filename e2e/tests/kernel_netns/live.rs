//! Live update of a Network's routes and MTU in a real pod namespace (issue 26 part 4): the
//! driver's own hooks attach a veth as prepare planned it, then `update_network` with the
//! Network's next generation changes the MTU and replaces the subnet route in place, as `ip`
//! reads them back; a second run of the same generation changes nothing.

use std::sync::Arc;

use anyhow::{Context, ensure};
use knic_driver::claims::ClaimStore;
use knic_driver::claims::checkpoint::{
    Attachment, CheckpointStore, OpaqueConfig, PreparedClaim, PreparedDevice,
};
use knic_driver::claims::ipam::Allocation;
use knic_driver::netns::AttachMode;
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::nri::{NriHandler, PodSandbox};
use knic_driver::pods::update::RateLimit;
use knic_driver::pods::{LogStatus, PodNetworks};
use knic_e2e::harness::{Netns, ip};
use knic_proto::netconfig::Route;
use knic_proto::network::Network;
use serde_json::json;

use super::{Links, cidr, plan};

fn network(generation: i64, mtu: u32, route: &str) -> anyhow::Result<Network> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": "blue", "generation": generation},
        "spec": {
            "devices": {"kind": "vf"}, "mtu": mtu,
            "ipam": {"subnets": [{"cidr": "192.0.2.0/24", "gateway": "192.0.2.1",
                                  "routes": [{"destination": route}]}]},
            "namespaces": {"names": ["ns"]}
        }
    }))?)
}

pub async fn routes_and_mtu_change_in_place(_: &Rtnl) -> anyhow::Result<()> {
    let host = "knt-lv0";
    let _links = Links(vec![host]);
    let pod = Netns::new("knt-pod-live")?;
    let peer = Netns::new("knt-peer-live")?;
    ip(&[
        "link",
        "add",
        host,
        "type",
        "veth",
        "peer",
        "name",
        "knt-lv1",
        "netns",
        "knt-peer-live",
    ])?;
    ip(&["-n", "knt-peer-live", "link", "set", "knt-lv1", "up"])?;

    // As prepare plans a claim of Network blue generation 6 (template: MTU 1450, route
    // 198.51.100.0/24 via the gateway).
    let mut p = plan(host, AttachMode::Move);
    p.request = "network".into();
    p.mtu = Some(1450);
    p.addresses = vec![cidr("192.0.2.10/24")];
    p.routes = vec![Route {
        destination: cidr("198.51.100.0/24"),
        gateway: Some("192.0.2.1".parse()?),
        source: None,
        metric: None,
        table: None,
    }];
    p.sysctls.clear();
    p.network = Some("blue".into());
    p.from_template = true;
    let claim = PreparedClaim {
        network_label: Some("blue".into()),
        namespace: "ns".into(),
        name: "c".into(),
        uid: "claim-live".into(),
        pod_uid: "pod-live".into(),
        pod_name: pod.0.clone(),
        devices: vec![PreparedDevice {
            request: "network".into(),
            pool: "node".into(),
            device: host.into(),
            share_id: None,
            consumed: Default::default(),
            published: Some(serde_json::from_value(
                json!({"name": host, "attributes": {"ifName": {"string": host}}}),
            )?),
        }],
        configs: vec![OpaqueConfig {
            source: "FromClaim".into(),
            requests: vec!["network".into()],
            parameters: json!({"apiVersion": "knic.dev/v1alpha1", "kind": "NetworkConfig",
                "interface": {"mtu": 1450}, "ipam": {"network": "blue"}}),
        }],
        prepared_at: 0,
        attachments: vec![Attachment::planned(p)],
        allocations: vec![Allocation {
            network: "blue".into(),
            name: "blue-192-0-2-10".into(),
            uid: "a".into(),
            address: cidr("192.0.2.10/24"),
            identity: None,
        }],
        functions: vec![],
    };
    let dir = tempfile::tempdir()?;
    let store = Arc::new(ClaimStore::open(CheckpointStore::new(dir.path())));
    {
        let mut locked = store.lock().await;
        let mut next = locked.checkpoint()?.clone();
        next.claims.insert(claim.uid.clone(), claim);
        locked.save(next, true).await?;
    }
    let hooks = PodNetworks::new(Rtnl::new(None), store.clone(), Arc::new(LogStatus));
    let sandbox = PodSandbox {
        id: "sandbox-live".into(),
        name: pod.0.clone(),
        uid: "pod-live".into(),
        namespace: "ns".into(),
        netns: Some(pod.path()),
        ips: vec![],
    };
    hooks.run_pod_sandbox(sandbox.clone()).await?;
    let show = || ip(&["-n", "knt-pod-live", "-o", "link", "show", "net1"]);
    let routes = || ip(&["-n", "knt-pod-live", "route", "show", "dev", "net1"]);
    ensure!(show()?.contains("mtu 1450"), "{}", show()?);
    ensure!(
        routes()?.contains("198.51.100.0/24 via 192.0.2.1"),
        "{}",
        routes()?
    );

    let next = network(7, 1400, "203.0.113.0/24")?;
    let started = std::time::Instant::now();
    ensure!(hooks.update_network(&next, &RateLimit::new(10)).await == 1);
    let took = started.elapsed();
    ensure!(show()?.contains("mtu 1400"), "{}", show()?);
    let now = routes()?;
    ensure!(
        now.contains("203.0.113.0/24 via 192.0.2.1") && !now.contains("198.51.100.0/24"),
        "routes after the update: {now}"
    );
    let record = store
        .claim("claim-live")
        .await?
        .context("claim")?
        .attachments[0]
        .live
        .clone()
        .context("recorded")?;
    ensure!(!record.pending && record.failed.is_none(), "{record:?}");
    ensure!(
        record.summary
            == "MTU 1450→1400, routes +203.0.113.0/24 −198.51.100.0/24 (Network blue generation 7)",
        "{}",
        record.summary
    );
    eprintln!("live update applied in {took:?}");
    // The same generation again: nothing to do; the kernel state stays.
    ensure!(hooks.update_network(&next, &RateLimit::new(10)).await == 0);
    ensure!(routes()? == now);

    // A route the pod cannot reach (gateway off its subnet) is refused before the kernel.
    let bad: Network = serde_json::from_value(json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": "blue", "generation": 8},
        "spec": {"devices": {"kind": "vf"}, "mtu": 1400,
            "ipam": {"subnets": [{"cidr": "192.0.2.0/24", "gateway": "192.0.2.1",
                "routes": [{"destination": "10.9.0.0/16", "gateway": "10.0.0.1"}]}]},
            "namespaces": {"names": ["ns"]}}
    }))?;
    ensure!(hooks.update_network(&bad, &RateLimit::new(10)).await == 1);
    ensure!(routes()? == now, "a refused update changed the pod");

    hooks.stop_pod_sandbox(sandbox).await?;
    drop(peer);
    Ok(())
}
