//! The driver's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the driver. Messages are for the operator reading
/// `kubectl logs` or a claim's status: they name the object, the field and the rule.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The checkpoint exists but cannot be trusted. The driver keeps the file untouched and
    /// refuses to prepare or unprepare until it is repaired or removed, because guessing would
    /// mean forgetting (and leaking) prepared claims.
    #[error(
        "checkpoint {path} is corrupt: {reason}; the file is left untouched and prepare/unprepare \
         are refused until it is repaired or removed"
    )]
    CheckpointCorrupt {
        /// The checkpoint file.
        path: PathBuf,
        /// What exactly is wrong with it.
        reason: String,
    },
    /// The checkpoint could not be read at start-up or since; carries that error's text, which
    /// every prepare and unprepare answers with until the file is repaired or removed.
    #[error("{0}")]
    CheckpointUnreadable(String),
    /// A filesystem operation failed; `context` says which file and what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What the driver was doing, with the path.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The Kubernetes API refused or failed a request.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Loading a kubeconfig failed.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// A ResourceClaim cannot be prepared; the reason names the field and the rule.
    #[error("ResourceClaim {namespace}/{name}: {reason}")]
    Claim {
        /// Claim namespace.
        namespace: String,
        /// Claim name.
        name: String,
        /// Why it cannot be prepared.
        reason: String,
    },
    /// A PCI function could not be (un)bound for vfio-pci, or does not qualify for it.
    #[error("PCI function {address}: {reason}")]
    Vfio {
        /// The function's PCI address (`0000:3b:00.2`), or the device name when it has none.
        address: String,
        /// The rule or the step that failed.
        reason: String,
    },
    /// A claim's `ipam: {network}` cannot be served: the Network is missing, static or
    /// invalid, or every subnet of a family is exhausted (with the controller's exact text and
    /// numbers, so the operator sizes the subnet from the claim's error alone).
    #[error("{0}")]
    Ipam(String),
    /// A gRPC server failed.
    #[error("gRPC server on {socket}: {source}")]
    Grpc {
        /// The socket the server listened on.
        socket: PathBuf,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The kernel refused an operation, or is not as the plan expects (a device gone, a name
    /// taken, a namespace missing). Written like the executor's own log lines: where, what
    /// knic was doing, why.
    #[error("{namespace}: {operation}: {reason}")]
    Kernel {
        /// The network namespace (`host` or the pod's namespace path).
        namespace: String,
        /// What knic was doing, e.g. `attaching net1`.
        operation: String,
        /// What went wrong.
        reason: String,
    },
    /// A pod that has knic claims cannot get them because the runtime gave it no network
    /// namespace; refusing fails the sandbox rather than starting the pod without interfaces.
    #[error(
        "pod {namespace}/{name} has knic claims but no network namespace (hostNetwork pods \
         cannot get interfaces)"
    )]
    NoNetworkNamespace {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
    },
    /// Several independent steps failed (e.g. returning the devices of several claims, where
    /// one failure must not stop the others); each keeps its own text.
    #[error("{}", join(.0))]
    Several(Vec<Error>),
    /// The NRI peer refused or failed a call: the plugin's error text as the runtime received
    /// it, or the runtime side's reason (the test runtime the demo and the e2e drive).
    #[error("{0}")]
    Nri(String),
    /// The interface carrying a prepared device's name is another device (renamed by an admin,
    /// or a different function): nothing is moved, and the claim's Ready condition says why.
    #[error(
        "interface {ifname} is {found}, but the device was prepared as {prepared}; refusing \
         to move it into the pod"
    )]
    DeviceMismatch {
        /// `pool/device` (callers name it in their own context, so the message does not).
        device: String,
        /// The host interface name in the plan.
        ifname: String,
        /// What the device was when prepared.
        prepared: String,
        /// What carries the name now.
        found: String,
    },
    /// The CDI hook's check at container creation: the pod's interface is not in place, so
    /// the container must not start (fail-closed); the runtime fails the creation and the
    /// kubelet retries it.
    #[error(
        "claim {claim}: interface {ifname} is not configured: {why}; the container must not \
         start without it (knic attaches it as soon as its NRI plugin is connected; the \
         kubelet retries)"
    )]
    InterfaceMissing {
        /// `namespace/name` of the claim.
        claim: String,
        /// The interface name in the pod.
        ifname: String,
        /// What the check found.
        why: String,
    },
    /// Prepare while knic is not registered with the runtime's NRI: a sandbox started now
    /// would not reach knic, so the pod must wait (the kubelet retries prepare).
    #[error(
        "knic is not connected to the container runtime's NRI socket {socket}: a pod started \
         now would run without its interfaces, so prepare is refused until it reconnects (the \
         kubelet retries)"
    )]
    RuntimeHooksDown {
        /// The NRI socket knic connects to.
        socket: String,
    },
    /// A claim's PCI functions cannot be prepared as its config asks (vfio-pci on a device
    /// without a PCI address, an IOMMU group shared with other devices, …): every problem,
    /// each naming its device, so one answer lists them all.
    #[error("{0}")]
    Functions(String),
    /// An SR-IOV PF the node policy names cannot be given its VFs: refused by a rule (not
    /// capable, over its total, carrying the default route, VFs prepared) or failed (a write,
    /// VFs that never appeared).
    #[error("SR-IOV PF {pf}: {reason}")]
    Sriov {
        /// The PF's interface name and PCI address.
        pf: String,
        /// The rule, or what failed and why.
        reason: String,
    },
    /// A start-up setting is invalid.
    #[error("invalid setting {setting}: {reason}")]
    Setting {
        /// The flag (and its environment twin).
        setting: &'static str,
        /// The rule it breaks.
        reason: String,
    },
}

impl Error {
    /// A kernel error in `namespace` while doing `operation`.
    pub fn kernel(
        namespace: impl std::fmt::Display,
        operation: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Error::Kernel {
            namespace: namespace.to_string(),
            operation: operation.into(),
            reason: reason.into(),
        }
    }

    /// The errno of an I/O error (a kernel refusal), for callers that answer one refusal
    /// differently.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Wraps an I/O error with what was being done, so the log line names the path.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

fn join(errors: &[Error]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Result alias over the driver's error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
