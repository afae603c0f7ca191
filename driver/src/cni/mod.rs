//! The CNI door: the driver binary run as the CNI plugin `knic` (what a Network's
//! NetworkAttachmentDefinition names), so Multus, and KubeVirt VMs through Multus, get the
//! interface a pod's DRA claim of that Network holds.
//!
//! The plugin itself does no kernel work and reads no Kubernetes object: it turns the CNI
//! call (environment and stdin, [`plugin`]) into one [`DoorRequest`] to the running driver
//! over its unix socket, and the driver's answer into the CNI result of the version the
//! runtime asked for ([`result`]). The driver holds the checkpoint and the claims, so the
//! interface is moved by the same code the NRI hook uses, and the hook that runs after it
//! finds the pod attached.
//!
//! Why not wait for NRI: Multus runs inside the runtime's sandbox set-up, before NRI's
//! RunPodSandbox, so waiting for the hook would deadlock.

pub mod door;
pub mod plugin;
pub mod result;

use serde::{Deserialize, Serialize};

/// CNI versions the plugin answers (the ones Multus and current runtimes speak).
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// Well-known CNI error codes (CNI spec, "Error"), the whole table so the codes knic answers
/// are read against the ones it does not (a few are not used yet).
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in the network configuration.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Container unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid necessary environment variables.
    pub const INVALID_ENVIRONMENT: u32 = 4;
    /// I/O failure.
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content.
    pub const DECODING_FAILURE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_CONFIG: u32 = 7;
    /// Try again later: the claim is not prepared yet.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// The plugin is not available (STATUS: the driver does not answer).
    pub const NOT_AVAILABLE: u32 = 50;
}

/// A CNI error as the plugin prints it on stdout (non-zero exit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniError {
    /// The CNI spec version of the answer.
    #[serde(default)]
    pub cni_version: String,
    /// One of [`code`].
    pub code: u32,
    /// Short message.
    pub msg: String,
    /// What to do about it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    /// An error with `code`; the version is filled in when printed.
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
        CniError {
            cni_version: String::new(),
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }
}

/// The CNI operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Command {
    /// Attach the interface.
    Add,
    /// Detach: a success without work (NRI's StopPodSandbox detaches the claim's devices).
    Del,
    /// Is the interface still there.
    Check,
    /// Is the plugin ready (1.1.0).
    Status,
    /// Clean up stale attachments (1.1.0): the driver's own sweeps do that.
    Gc,
    /// Which versions the plugin speaks.
    Version,
}

/// What the plugin asks the driver, one JSON line over the socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DoorRequest {
    /// ADD or CHECK (the others are answered by the plugin alone, or only probe the socket).
    pub command: Command,
    /// The pod's UID (`K8S_POD_UID` in `CNI_ARGS`).
    pub pod_uid: String,
    /// `namespace/name` of the pod, for messages.
    pub pod: String,
    /// The pod's network namespace path (`CNI_NETNS`).
    pub netns: String,
    /// The interface name wanted in the pod (`CNI_IFNAME`).
    pub ifname: String,
    /// The knic Network (the config's `network`, else its `name`).
    pub network: String,
}

/// What the driver answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DoorAnswer {
    /// The interface is in the pod.
    Attached(result::Attached),
    /// It is not, and why.
    Failed(CniError),
}

/// The error text when the pod has no prepared claim of the Network, naming the
/// `resourceClaims` entry the pod lacks.
pub fn no_claim_message(pod: &str, network: &str) -> String {
    format!(
        "pod {pod} has no prepared knic claim of Network {network:?}: add resourceClaims: \
         [{{name: {network}, resourceClaimTemplateName: {network}}}] to the pod"
    )
}
