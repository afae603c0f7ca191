//! This node's `NodeNetworks` object: the driver's readiness and the Networks usable here, as
//! the KNI door computes them (`crate::kni::ready`), kept current in the API so `kubectl get
//! nodenetworks` shows every node's (KEP-4410's network readiness). Written by server-side
//! apply (field manager `knic.dev`): the object with the node's name, owned by the Node (it
//! goes with it), then its status. The chart's admission policy lets a driver write only the
//! object of the node its token is bound to.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use knic_proto::network::readiness::{NodeNetwork, NodeNetworks, NodeNetworksStatus};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;

use crate::kni::Door;
use crate::kni::ready::NodeReadiness;
use crate::netns::Kernel;

/// The field manager of every write.
const MANAGER: &str = "knic.dev";

/// The status for `readiness` (without the time it is written at).
pub fn status(readiness: &NodeReadiness) -> NodeNetworksStatus {
    let mut status = NodeNetworksStatus {
        ready: readiness.ready,
        reasons: readiness.reasons.clone(),
        networks: readiness
            .networks
            .iter()
            .map(|n| NodeNetwork {
                name: n.name.clone(),
                ready: n.ready,
                reasons: n.reasons.clone(),
                free_devices: n.free.clone(),
            })
            .collect(),
        ..NodeNetworksStatus::default()
    };
    status.summarise();
    status
}

/// Keeps the object of `node` current: at start, whenever the driver's facts, the offered
/// devices, the prepared claims or any Network (`networks`) change (at most once a second),
/// and every `period` (DeviceClasses, which nothing here watches, are read then), until `stop` turns true. A failed write is logged and retried at
/// the next change or period; a cluster without the CRD costs a warning.
pub async fn publish<K: Kernel>(
    client: kube::Client,
    node: String,
    door: Arc<Door<K>>,
    mut networks: watch::Receiver<u64>,
    period: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<NodeNetworks> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client);
    let mut facts = door.facts.clone();
    let mut offered = door.offered.clone();
    let mut prepared = door.claims.subscribe();
    let mut written: Option<NodeNetworksStatus> = None;
    let mut failing = false;
    // The Networks watch ends only with the driver; until then its changes wake this loop.
    let mut networks_open = true;
    loop {
        match door.readiness().await {
            Ok(readiness) => {
                let now = status(&readiness);
                if written.as_ref() != Some(&now) {
                    match write(&api, &nodes, &node, &now).await {
                        Ok(()) => {
                            if failing {
                                tracing::info!(node = %node, "NodeNetworks written again");
                            }
                            failing = false;
                            written = Some(now);
                        }
                        Err(e) => {
                            if !failing {
                                tracing::warn!(node = %node, error = %e,
                                    "cannot write this node's NodeNetworks (is the CRD installed?); retrying");
                            }
                            failing = true;
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "node readiness not computed"),
        }
        tokio::select! {
            _ = facts.changed() => {}
            _ = offered.changed() => {}
            _ = prepared.changed() => {}
            changed = networks.changed(), if networks_open => networks_open = changed.is_ok(),
            () = tokio::time::sleep(period) => {}
            _ = stop.changed() => return,
        }
        // Changes come in bursts (a rescan, a pod's claims): one write for the burst.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One write of `status` as `node`'s object (object, then status), through `api`.
pub async fn write(
    api: &Api<NodeNetworks>,
    nodes: &Api<Node>,
    node: &str,
    status: &NodeNetworksStatus,
) -> crate::Result<()> {
    let owner = nodes.get(node).await?;
    let object = json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "NodeNetworks",
        "metadata": {"name": node, "ownerReferences": [{
            "apiVersion": "v1", "kind": "Node", "name": node,
            "uid": owner.metadata.uid.unwrap_or_default(),
        }]},
        "spec": {"nodeName": node},
    });
    let apply = PatchParams::apply(MANAGER).force();
    api.patch(node, &apply, &Patch::Apply(&object)).await?;
    let mut stamped = status.clone();
    stamped.updated = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    let status = json!({
        "apiVersion": "knic.dev/v1alpha1", "kind": "NodeNetworks",
        "metadata": {"name": node},
        "status": stamped,
    });
    api.patch_status(node, &apply, &Patch::Apply(&status))
        .await?;
    Ok(())
}
