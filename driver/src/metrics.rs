//! The driver's metrics: one set per process, because a process has one `/metrics` and the
//! kubelet service, the NRI hooks, the publisher, IPAM and the checkpoint all count into it
//! from places that share no other state. The registry and its exposition are
//! [`knic_proto::metrics`]; [`crate::http`] serves it.

use std::sync::OnceLock;

use knic_proto::metrics::{Counter, Gauge, Histogram, LATENCY_BUCKETS, Registry};

/// `result` label values.
pub const SUCCESS: &str = "success";
/// `result` label value of a failed operation.
pub const ERROR: &str = "error";

/// The `result` label of an outcome.
pub fn result<T, E>(r: &Result<T, E>) -> &'static str {
    if r.is_ok() { SUCCESS } else { ERROR }
}

/// Every series the driver exports.
pub struct DriverMetrics {
    /// What `/metrics` renders.
    pub registry: Registry,
    /// kubelet DRA calls by method and result (`error` when any claim of the call failed).
    pub kubelet_requests: Counter<2>,
    /// kubelet DRA call latency by method.
    pub kubelet_duration: Histogram<1>,
    /// Claims prepared and unprepared, by operation and result.
    pub claims: Counter<2>,
    /// NRI hook calls by hook and result.
    pub nri_hooks: Counter<2>,
    /// NRI hook latency by hook.
    pub nri_duration: Histogram<1>,
    /// Devices moved into pods, by result.
    pub attaches: Counter<1>,
    /// Latency of one device's attach.
    pub attach_duration: Histogram<0>,
    /// Devices brought back from pods, by result.
    pub detaches: Counter<1>,
    /// Latency of one device's detach.
    pub detach_duration: Histogram<0>,
    /// Devices in the published slices, by kind.
    pub published_devices: Gauge<1>,
    /// ResourceSlice writes by operation and result.
    pub slice_writes: Counter<2>,
    /// Addresses allocated through IPAM, by result.
    pub ipam_allocations: Counter<1>,
    /// Addresses released, by result.
    pub ipam_releases: Counter<1>,
    /// Allocations refused because every subnet of a family was full.
    pub ipam_exhausted: Counter<0>,
    /// 1 while the NRI plugin is registered with the runtime.
    pub nri_connected: Gauge<0>,
    /// 1 once the kubelet acknowledged the plugin registration.
    pub kubelet_registered: Gauge<0>,
    /// Checkpoint file writes by result.
    pub checkpoint_writes: Counter<1>,
    /// Kubernetes Events by reason and outcome (`sent`, `suppressed` by the rate limit,
    /// `failed`).
    pub events: Counter<2>,
    /// Prepared claims the API says are gone, not yet unprepared (their devices withheld).
    pub orphaned_claims: Gauge<0>,
    /// Orphaned claims unprepared by knic itself, by result.
    pub orphans_unprepared: Counter<1>,
}

impl DriverMetrics {
    /// Registers every family; fails only on a name breaking Prometheus' rules.
    pub fn new() -> knic_proto::Result<DriverMetrics> {
        let r = Registry::new();
        let m = DriverMetrics {
            kubelet_requests: r.counter(
                "knic_driver_kubelet_requests_total",
                "kubelet DRA calls (NodePrepareResources, NodeUnprepareResources) by result; error when any claim of the call failed.",
                ["method", "result"],
            )?,
            kubelet_duration: r.histogram(
                "knic_driver_kubelet_request_duration_seconds",
                "Latency of kubelet DRA calls.",
                ["method"],
                LATENCY_BUCKETS,
            )?,
            claims: r.counter(
                "knic_driver_claims_total",
                "Claims prepared or unprepared, by result.",
                ["operation", "result"],
            )?,
            nri_hooks: r.counter(
                "knic_driver_nri_hooks_total",
                "NRI hook calls from the container runtime, by result.",
                ["hook", "result"],
            )?,
            nri_duration: r.histogram(
                "knic_driver_nri_hook_duration_seconds",
                "Latency of NRI hook calls.",
                ["hook"],
                LATENCY_BUCKETS,
            )?,
            attaches: r.counter(
                "knic_driver_attaches_total",
                "Devices moved into a pod and configured, by result.",
                ["result"],
            )?,
            attach_duration: r.histogram(
                "knic_driver_attach_duration_seconds",
                "Latency of attaching one device to a pod.",
                [],
                LATENCY_BUCKETS,
            )?,
            detaches: r.counter(
                "knic_driver_detaches_total",
                "Devices brought back from a pod, by result.",
                ["result"],
            )?,
            detach_duration: r.histogram(
                "knic_driver_detach_duration_seconds",
                "Latency of detaching one device from a pod.",
                [],
                LATENCY_BUCKETS,
            )?,
            published_devices: r.gauge(
                "knic_driver_published_devices",
                "Devices in this node's published ResourceSlices, by kind attribute.",
                ["kind"],
            )?,
            slice_writes: r.counter(
                "knic_driver_resourceslice_writes_total",
                "ResourceSlice writes by operation (create, update, delete) and result.",
                ["operation", "result"],
            )?,
            ipam_allocations: r.counter(
                "knic_driver_ipam_allocations_total",
                "Address allocations for claims with ipam, by result (success counts addresses, error counts failed interface allocations).",
                ["result"],
            )?,
            ipam_releases: r.counter(
                "knic_driver_ipam_releases_total",
                "Addresses released, by result.",
                ["result"],
            )?,
            ipam_exhausted: r.counter(
                "knic_driver_ipam_exhausted_total",
                "Allocations refused because every subnet of an address family was full.",
                [],
            )?,
            nri_connected: r.gauge(
                "knic_driver_nri_connected",
                "1 while the NRI plugin is registered with the container runtime.",
                [],
            )?,
            kubelet_registered: r.gauge(
                "knic_driver_kubelet_registered",
                "1 once the kubelet acknowledged the plugin registration.",
                [],
            )?,
            checkpoint_writes: r.counter(
                "knic_driver_checkpoint_writes_total",
                "Checkpoint file writes, by result.",
                ["result"],
            )?,
            events: r.counter(
                "knic_driver_events_total",
                "Kubernetes Events about claims and pods, by reason and outcome (sent, suppressed, failed).",
                ["reason", "outcome"],
            )?,
            orphaned_claims: r.gauge(
                "knic_driver_orphaned_claims",
                "Prepared claims whose ResourceClaim the API says is gone (deleted, re-created or deallocated) and that no pod uses, not yet unprepared; their devices are withheld from the slices.",
                [],
            )?,
            orphans_unprepared: r.counter(
                "knic_driver_orphaned_claims_unprepared_total",
                "Orphaned claims knic unprepared itself because the kubelet never did, by result.",
                ["result"],
            )?,
            registry: r,
        };
        for method in ["NodePrepareResources", "NodeUnprepareResources"] {
            for result in [SUCCESS, ERROR] {
                m.kubelet_requests.touch([method, result]);
            }
        }
        for result in [SUCCESS, ERROR] {
            m.attaches.touch([result]);
            m.detaches.touch([result]);
            m.checkpoint_writes.touch([result]);
            m.orphans_unprepared.touch([result]);
        }
        Ok(m)
    }
}

/// The process's metrics.
pub fn metrics() -> &'static DriverMetrics {
    static METRICS: OnceLock<DriverMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        // The names are constants checked by `every_family_registers`.
        DriverMetrics::new().expect("the driver's metric names follow Prometheus' rules")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_registers() {
        let m = DriverMetrics::new().expect("valid names");
        let text = m.registry.render();
        assert!(text.contains(
            "knic_driver_kubelet_requests_total{method=\"NodePrepareResources\",result=\"error\"} 0\n"
        ));
        assert!(text.contains("# TYPE knic_driver_attach_duration_seconds histogram\n"));
        assert!(text.contains("knic_driver_nri_connected 0\n"));
    }
}
