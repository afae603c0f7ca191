//! `NodeNetworks` (`knic.dev/v1alpha1`, cluster-scoped, one per node, named after it): each
//! node's knic readiness and the Networks usable there now, written by that node's driver and
//! read with `kubectl get nodenetworks` (KEP-4410's network readiness in the API). The facts
//! are the ones KNI `QueryNodeNetworks` answers with; the chart's admission policy lets a
//! driver write only its own node's object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which node the object describes (its name is the node's too).
// Every `printcolumn(...)` repeats `type_ = "string"`, which clippy reads as a duplicated
// attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(
    CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "knic.dev",
    version = "v1alpha1",
    kind = "NodeNetworks",
    plural = "nodenetworks",
    singular = "nodenetworks",
    shortname = "nodenet",
    status = "NodeNetworksStatus",
    derive = "PartialEq",
    doc = "One node's knic readiness and the knic Networks usable on it now, written by that \
           node's driver (named after the node, owned by its Node object). Cluster-scoped, like \
           Nodes: it describes the node, not a tenant's object.",
    printcolumn(
        name = "Ready",
        type_ = "boolean",
        json_path = ".status.ready",
        description = "Whether the node's driver is ready (slices published, kubelet registration, NRI)"
    ),
    printcolumn(
        name = "Networks",
        type_ = "string",
        json_path = ".status.networksSummary",
        description = "Networks ready on this node, of all"
    ),
    printcolumn(
        name = "Ready-Networks",
        type_ = "string",
        json_path = ".status.readyNetworks",
        description = "The Networks a new pod can get on this node now",
        priority = "1"
    ),
    printcolumn(name = "Updated", type_ = "date", json_path = ".status.updated")
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.nodeName == oldSelf.nodeName",
    "message": "spec.nodeName is immutable"
}]))]
pub struct NodeNetworksSpec {
    /// The node (the same as metadata.name).
    pub node_name: String,
}

/// What the node's driver found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeNetworksStatus {
    /// The driver is ready: its ResourceSlices are published, the kubelet acknowledged its
    /// registration and its NRI plugin is connected (`/readyz`'s conditions).
    #[serde(default)]
    pub ready: bool,
    /// Why the driver is not ready, one sentence each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// Every knic Network, and whether a new pod can get it on this node now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub networks: Vec<NodeNetwork>,
    /// `READY/ALL` Networks, for the `NETWORKS` column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks_summary: Option<String>,
    /// The ready Networks' names, comma separated, for `kubectl get -o wide`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_networks: Option<String>,
    /// When the driver last wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<Time>,
}

/// One Network on the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeNetwork {
    /// The Network's name.
    pub name: String,
    /// A new pod (or KNI sandbox) of it can be served on this node now.
    pub ready: bool,
    /// Why not, each naming the field or fact.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// The free devices its selectors accept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub free_devices: Vec<String>,
}

impl NodeNetworksStatus {
    /// Fills the two summary columns from `networks`.
    pub fn summarise(&mut self) {
        let ready: Vec<&str> = self
            .networks
            .iter()
            .filter(|n| n.ready)
            .map(|n| n.name.as_str())
            .collect();
        self.networks_summary = Some(format!("{}/{}", ready.len(), self.networks.len()));
        self.ready_networks = (!ready.is_empty()).then(|| ready.join(","));
    }
}
