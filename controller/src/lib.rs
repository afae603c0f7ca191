//! knic's cluster controller.
//!
//! This crate holds the controller half of networks as a service; what the driver must compute
//! identically (IPAM arithmetic, names, the exhaustion selector) lives in `knic-proto`:
//!
//! * [`network`] (from `knic-proto`): the `Network` resource's spec, its validation (one network
//!   alone, and against every other network), and the compilation of its device choice into
//!   DRA selectors;
//! * [`ipam`] (from `knic-proto`, shared with the driver, which allocates at prepare time):
//!   address arithmetic over IPv4 and IPv6 subnets without enumerating them, candidate choice,
//!   stable addresses, and the names of allocation objects;
//! * [`cel`]: the subset of CEL device selectors knic generates and ships, evaluated against
//!   published devices to count the nodes a Network can use (the tokenizer and the syntax and
//!   cost checks Network validation applies are `knic_proto::cel`).
//!
//! On top of them, [`reconcile`] does the I/O: the kube-runtime reconciler that turns Networks
//! into ResourceClaimTemplates and status, and the collector of allocations whose claim is
//! gone; [`leader`] keeps two replicas from reconciling at once; [`webhook`] checks configs and
//! Networks when they are written, with the same rules and words.

pub mod availability;
pub mod cel;
pub mod client;
pub mod gc;
pub mod http;
pub use knic_proto::ipam;
pub mod leader;
pub mod metrics;
pub mod nad;
pub use knic_proto::network;
pub mod plan;
pub mod reconcile;
pub mod status;
pub mod webhook;

/// Everything that can go wrong in the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Network that breaks a rule, or a subnet with no free address (the shared domain's
    /// error, passed through unchanged so both binaries word it the same).
    #[error(transparent)]
    Domain(#[from] knic_proto::Error),
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
    /// A device selector could not be compiled or evaluated. Kept as the CEL error, not its
    /// text, so a caller can tell CEL knic does not evaluate from a selector that fails on one
    /// device.
    #[error(transparent)]
    Cel(#[from] knic_proto::cel::CelError),
    /// How many nodes offer a Network cannot be known (an Invalid Network, a missing
    /// DeviceClass, a selector outside knic's CEL subset); the message says why. A variant of
    /// its own because it is no failure to retry: the availability loop leaves the number
    /// unset rather than guess one.
    #[error("{0}")]
    Uncountable(String),
    /// The webhook's certificate or key cannot be served (unreadable, not PEM, not a pair):
    /// fatal at start, and at a reload the previous pair stays served.
    #[error("webhook certificate {path}: {reason}")]
    Certificate {
        /// The file at fault.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The webhook's socket failed (the address in use, or not bindable).
    #[error("webhook: {0}")]
    Webhook(#[source] std::io::Error),
}

/// Result alias so every fallible function names the crate's one error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The field manager the controller's server-side applies use, so its fields never fight the
/// driver's.
pub const FIELD_MANAGER: &str = "knic-controller";
