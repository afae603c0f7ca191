//! The controller's metrics, one set per process (a process has one `/metrics`; the reconciler
//! and the leader election count into it). The registry and exposition are
//! [`knic_proto::metrics`]; [`crate::http`] serves them.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use knic_proto::metrics::{Counter, Gauge, Histogram, LATENCY_BUCKETS, Registry};

use crate::network::NetworkStatus;

/// Every series the controller exports.
pub struct ControllerMetrics {
    /// What `/metrics` renders.
    pub registry: Registry,
    /// Network reconciles by result.
    pub reconciles: Counter<1>,
    /// Reconcile latency.
    pub reconcile_duration: Histogram<0>,
    /// Networks by condition type and status.
    pub networks: Gauge<2>,
    /// Free addresses per Network (IPAM subnets only).
    pub free_addresses: Gauge<1>,
    /// Allocatable addresses per Network.
    pub allocatable_addresses: Gauge<1>,
    /// 1 while this replica holds the leader lease (or runs without election).
    pub leader: Gauge<0>,
    /// Per Network, its last status' conditions and addresses, to recompute the gauges.
    seen: Mutex<BTreeMap<String, Seen>>,
}

#[derive(Debug, Clone, Default)]
struct Seen {
    conditions: Vec<(String, String)>,
    addresses: Option<(u128, u128)>,
}

impl ControllerMetrics {
    /// Registers every family; fails only on a name breaking Prometheus' rules.
    pub fn new() -> knic_proto::Result<ControllerMetrics> {
        let r = Registry::new();
        let m = ControllerMetrics {
            reconciles: r.counter(
                "knic_controller_reconciles_total",
                "Network reconciles by result; error reconciles are retried.",
                ["result"],
            )?,
            reconcile_duration: r.histogram(
                "knic_controller_reconcile_duration_seconds",
                "Latency of one Network reconcile.",
                [],
                LATENCY_BUCKETS,
            )?,
            networks: r.gauge(
                "knic_controller_networks",
                "Networks by condition type and status, as last written to their status.",
                ["condition", "status"],
            )?,
            free_addresses: r.gauge(
                "knic_controller_network_free_addresses",
                "Addresses a Network's IPAM subnets can still allocate.",
                ["network"],
            )?,
            allocatable_addresses: r.gauge(
                "knic_controller_network_allocatable_addresses",
                "Allocatable addresses of a Network's IPAM subnets (gateways and exclusions removed).",
                ["network"],
            )?,
            leader: r.gauge(
                "knic_controller_leader",
                "1 while this replica holds the leader lease (or runs without leader election).",
                [],
            )?,
            registry: r,
            seen: Mutex::default(),
        };
        for result in ["success", "error"] {
            m.reconciles.touch([result]);
        }
        Ok(m)
    }

    /// Records a Network's status as the reconciler computed it.
    pub fn network_status(&self, name: &str, status: &NetworkStatus) {
        let seen = Seen {
            conditions: status
                .conditions
                .iter()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect(),
            addresses: status.addresses.map(|a| (a.free, a.total)),
        };
        let mut all = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        all.insert(name.to_owned(), seen);
        self.export(&all);
    }

    /// Forgets a deleted Network.
    pub fn network_gone(&self, name: &str) {
        let mut all = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if all.remove(name).is_some() {
            self.export(&all);
        }
    }

    fn export(&self, all: &BTreeMap<String, Seen>) {
        let mut by_condition: BTreeMap<(String, String), f64> = BTreeMap::new();
        for seen in all.values() {
            for (type_, status) in &seen.conditions {
                *by_condition
                    .entry((type_.clone(), status.clone()))
                    .or_default() += 1.0;
            }
        }
        self.networks.replace_all(
            by_condition
                .into_iter()
                .map(|((type_, status), n)| ([type_, status], n)),
        );
        // Addresses are u128 for IPv6; a gauge is a float, exact up to 2^53.
        let counted = || {
            all.iter()
                .filter_map(|(name, s)| s.addresses.map(|a| (name.clone(), a)))
        };
        self.free_addresses
            .replace_all(counted().map(|(name, (free, _))| ([name], free as f64)));
        self.allocatable_addresses
            .replace_all(counted().map(|(name, (_, total))| ([name], total as f64)));
    }
}

/// The process's metrics.
pub fn metrics() -> &'static ControllerMetrics {
    static METRICS: OnceLock<ControllerMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        // The names are constants checked by `every_family_registers`.
        ControllerMetrics::new().expect("the controller's metric names follow Prometheus' rules")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::AddressCount;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn condition(type_: &str, status: &str) -> Condition {
        serde_json::from_value(serde_json::json!({
            "type": type_, "status": status, "reason": "R", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }))
        .expect("condition")
    }

    #[test]
    fn networks_are_counted_by_condition_with_their_addresses() {
        let m = ControllerMetrics::new().expect("valid names");
        let ready = NetworkStatus {
            conditions: vec![condition("Ready", "True"), condition("Exhausted", "False")],
            addresses: Some(AddressCount {
                free: 250,
                total: 253,
                held: 0,
            }),
            ..Default::default()
        };
        let invalid = NetworkStatus {
            conditions: vec![condition("Ready", "False"), condition("Invalid", "True")],
            ..Default::default()
        };
        m.network_status("a", &ready);
        m.network_status("b", &ready);
        m.network_status("c", &invalid);
        m.network_gone("b");
        let text = m.registry.render();
        for line in [
            "knic_controller_networks{condition=\"Exhausted\",status=\"False\"} 1\n",
            "knic_controller_networks{condition=\"Invalid\",status=\"True\"} 1\n",
            "knic_controller_networks{condition=\"Ready\",status=\"False\"} 1\n",
            "knic_controller_networks{condition=\"Ready\",status=\"True\"} 1\n",
            "knic_controller_network_free_addresses{network=\"a\"} 250\n",
            "knic_controller_network_allocatable_addresses{network=\"a\"} 253\n",
            "knic_controller_reconciles_total{result=\"error\"} 0\n",
            "knic_controller_leader 0\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(!text.contains("network=\"b\""), "{text}");
        assert!(!text.contains("network=\"c\""), "{text}");
    }
}
