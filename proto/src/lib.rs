//! knic's wire contracts.
//!
//! The kubelet and the container runtime decide the shape of these messages, not knic: the
//! `.proto` files under `proto/` are written from the wire facts (package names, method names
//! and field numbers) and compiled at build time, so a drift from the kubelet's contract shows up
//! as a compile error or a failing wire test rather than as a silent mismatch in production.

/// Kubelet plugin registration (`pluginregistration.Registration`): how the kubelet learns that
/// knic exists and where its DRA socket is.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// The DRA kubelet plugin services. The kubelet (1.34+) prefers v1 and older kubelets speak
/// v1beta1; knic serves both from one handler.
pub mod dra {
    /// `k8s.io.kubelet.pkg.apis.dra.v1`: the service a 1.34+ kubelet calls.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1`: wire-identical to v1 minus `share_id`; kept so
    /// kubelets 1.32/1.33 (and 1.34+ if v1 is refused) still work.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
}

/// DRA resource health streams; the kubelet polls these to put device health into pod status.
pub mod health {
    /// Package `v1alpha1`, used by kubelets 1.34–1.36.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1alpha1 {
        tonic::include_proto!("v1alpha1");
    }
    /// Package `v1`, preferred by 1.37+ kubelets.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}

/// NRI (`nri.pkg.api.v1alpha1`): the container runtime's plugin API, through which knic learns
/// that a pod's network namespace exists (RunPodSandbox) and is going away (Stop/Remove). Only
/// the messages and fields knic uses; see `proto/nri/api.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod nri {
    tonic::include_proto!("nri.pkg.api.v1alpha1");
}

/// The KNI network runtime API (package `kni`, service `KNI`): a node-local door beside the
/// kubelet's through which a runtime, a VM manager or a test attaches knic networks to a
/// sandbox. Wire-compatible with the KNI project's beta API (see `proto/kni/api.proto`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod kni {
    tonic::include_proto!("kni");
}

/// ttrpc's request/response envelope: NRI runs ttrpc, not gRPC, over its multiplexed socket.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod ttrpc {
    tonic::include_proto!("ttrpc");
}

/// The DRA driver name, API group and attribute domain: one string everywhere so a typo can't
/// make the kubelet, the scheduler and the driver disagree about who owns a device.
pub const DRIVER_NAME: &str = "knic.dev";

pub mod backoff;
pub mod cel;
#[cfg(feature = "client")]
pub mod client;
pub mod error;
pub mod ipam;
#[cfg(feature = "logging")]
pub mod logging;
pub mod metrics;
pub mod names;
pub mod netconfig;
pub mod network;
pub mod quantity;

pub use error::{Error, Result};
