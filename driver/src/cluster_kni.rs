//! `run`'s KNI door: the socket (`--kni-socket`) and this node's `NodeNetworks` object
//! (`--node-networks`), both answered from one [`kni::Door`] over the node's claim store, pod
//! networks and the devices as published, with the driver's `/readyz` facts.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use k8s_openapi::api::resource::v1::Device;
use knic_driver::kni;
use knic_driver::kubelet::Registration;
use knic_driver::netns::rtnl::Rtnl;
use knic_driver::pods::PodNetworks;
use knic_driver::wiring::Node;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the door is made of.
pub struct Start {
    pub socket: PathBuf,
    pub netns_dir: PathBuf,
    pub sysfs_root: PathBuf,
    pub node: String,
    pub node_networks: bool,
    /// Counts changes of any Network (the driver's Networks watch).
    pub networks_changed: watch::Receiver<u64>,
    pub client: kube::Client,
    pub offered: watch::Receiver<Vec<Device>>,
    pub published: watch::Receiver<bool>,
    pub registration: watch::Receiver<Registration>,
    pub nri: watch::Receiver<bool>,
    pub pods: Arc<PodNetworks<Rtnl>>,
    pub stop: watch::Receiver<bool>,
}

/// Starts what is configured; the socket's task, when served, ends after `stop`.
pub fn start(
    wired: &Node<Rtnl>,
    s: Start,
) -> anyhow::Result<Option<JoinHandle<knic_driver::Result<()>>>> {
    let serve = !s.socket.as_os_str().is_empty();
    if !serve && !s.node_networks {
        return Ok(None);
    }
    let (facts_tx, facts) = watch::channel(kni::ready::NodeFacts::default());
    tokio::spawn(kni::follow_facts(
        s.published,
        s.registration,
        s.nri,
        facts_tx,
    ));
    let door = Arc::new(kni::Door {
        pool: s.node.clone(),
        catalog: Arc::new(knic_driver::api::catalog::KubeCatalog::new(
            s.client.clone(),
        )),
        offered: s.offered,
        facts,
        claims: wired.claims.clone(),
        preparer: wired.kni_preparer.clone(),
        pending: wired.kni_pending.clone(),
        pods: s.pods,
        serial: tokio::sync::Mutex::new(()),
    });
    if s.node_networks {
        tokio::spawn(knic_driver::api::nodenetworks::publish(
            s.client,
            s.node.clone(),
            door.clone(),
            s.networks_changed,
            std::time::Duration::from_secs(30),
            s.stop.clone(),
        ));
    }
    if !serve {
        return Ok(None);
    }
    let service = kni::KniService::new(
        door,
        kni::Settings {
            netns_dir: s.netns_dir,
            sysfs_root: s.sysfs_root,
            node: s.node,
        },
    );
    let listener = kni::bind(&s.socket).context("--kni-socket/KNIC_KNI_SOCKET")?;
    let mut stop = s.stop;
    let socket = s.socket;
    Ok(Some(tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        kni::serve(listener, &socket, service, stopped).await
    })))
}
