//! knic's cluster controller.
//!
//! This crate holds the Kubernetes-free core of networks as a service, so the rules can be
//! tested exhaustively without an apiserver and called from both the reconciler and the driver:
//!
//! * [`network`]: the `Network` resource's spec, its validation (one network alone, and against
//!   every other network), and the compilation of its device choice into DRA selectors;
//! * [`ipam`]: address arithmetic over IPv4 and IPv6 subnets without enumerating them,
//!   candidate choice for allocators racing on one subnet, stable addresses, and the names of
//!   allocation objects whose create-if-absent makes an address unique;
//! * [`cel`]: the subset of CEL device selectors knic generates and ships, evaluated against
//!   published devices to count the nodes a Network can use.
//!
//! On top of them, [`reconcile`] does the I/O: the kube-runtime reconciler that turns Networks
//! into ResourceClaimTemplates and status, and the collector of allocations whose claim is
//! gone; [`leader`] keeps two replicas from reconciling at once.

use knic_proto::netconfig::Cidr;

pub mod availability;
pub mod cel;
pub mod ipam;
pub mod leader;
pub mod network;
pub mod reconcile;

/// Everything that can go wrong in the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Network or generated object that breaks a rule; the message names field and rule.
    #[error("{0}")]
    Invalid(String),
    /// Every usable address of a subnet is allocated. A variant of its own, because callers
    /// react differently (report it in the Network's status and keep new pods from scheduling)
    /// than to an invalid Network, and the operator needs the numbers to size the subnet.
    #[error("network {network}: subnet {subnet} has no free address ({in_use} in use of {size})")]
    Exhausted {
        /// The Network's name.
        network: String,
        /// The subnet that ran out.
        subnet: Cidr,
        /// Addresses found taken while looking for a free one.
        in_use: u128,
        /// Usable addresses of the subnet (gateway and exclusions already removed).
        size: u128,
    },
    /// A call to the Kubernetes API failed; the reconciler retries after a delay.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An object could not be turned into JSON (a bug, but not one worth a panic in a
    /// long-running controller).
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The leader lease was taken over or could not be renewed in time; the replica must stop
    /// reconciling because another one may have started.
    #[error("leadership lost: {0}")]
    LeadershipLost(String),
}

/// Result alias so every fallible function names the crate's one error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The field manager the controller's server-side applies use, so its fields never fight the
/// driver's.
pub const FIELD_MANAGER: &str = "knic-controller";
